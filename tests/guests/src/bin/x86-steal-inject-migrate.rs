//! rustkvm-test: arch=x86_64 cpu=max,tsc-frequency=1000000000 compare=off matrix=off
//!
//! Injected steal across savevm/loadvm or migration (tests/tests/migration.rs
//! `injected_steal_is_done_once_across_a_move`): both sides run under
//! `-icount shift=0,sleep=off` with `inject-steal=0:10ms:1ms/0:100s:3ms:2ms`
//! (one vCPU; the TSC runs at 1 GHz, so it counts VM ns). The 1 ms at 10 ms
//! lands on the source, before the guest prints "ready"; the move comes
//! while the guest waits for the host's "go on", long before 100 s of VM
//! time. Then the guest halts until a TSC-deadline timer at 100.005 s: with
//! every vCPU idle `-icount` warps VM time there, through the injection's
//! hold (100 s to 100.002 s). Its steal must then have grown by exactly the
//! 3 ms of the second injection: the destination took the schedule from
//! the stream, neither repeating the first injection nor losing the second.
//! Only steal the injections add is counted here (one vCPU, no turns).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-steal-inject-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
static mut ST: guest::arch::KvmStealTime = guest::arch::KvmStealTime::new();

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::arch::{self, irqs, rdtsc, set_lapic_reg, wrmsr, MSR_KVM_STEAL_TIME};
    use guest::arch::{LAPIC_LVT_TIMER, LAPIC_SVR, LVT_TIMER_TSC_DEADLINE, MSR_TSC_DEADLINE};
    use guest::{host_said_go, println};
    /// The wake-up timer's vector.
    const VECTOR: u8 = 0x44;
    /// Where the timer wakes the guest: VM ns (= TSC ticks at 1 GHz).
    const WAKE_AT: u64 = 100_005_000_000;

    let steal = || {
        // SAFETY: our static structure, identity-mapped; the host updates it.
        unsafe { addr_of!(ST.steal).read_volatile() }
    };
    t.eq(
        "steal-time-on",
        wrmsr(MSR_KVM_STEAL_TIME, addr_of!(ST) as u64 | 1),
        Ok(()),
    );
    // Past the first injection (10 ms), then a few port writes: exits.
    while rdtsc() < 20_000_000 {
        core::hint::spin_loop();
    }
    for _ in 0..4 {
        arch::outb(0x80, 0);
    }
    let before = steal();
    t.eq("first-injection-on-the-source", before, 1_000_000);
    println!("ready");
    while !host_said_go() {}
    let moved_at = rdtsc();
    t.check(
        "moved-before-the-second",
        moved_at < 100_000_000_000,
        format_args!("TSC {moved_at}"),
    );

    // Halt until 100.005 s; -icount warps there.
    set_lapic_reg(LAPIC_SVR, 0x1ff);
    set_lapic_reg(LAPIC_LVT_TIMER, LVT_TIMER_TSC_DEADLINE | u32::from(VECTOR));
    let taken = irqs(VECTOR);
    t.eq("arm", wrmsr(MSR_TSC_DEADLINE, WAKE_AT), Ok(()));
    while irqs(VECTOR) == taken {
        // SAFETY: the vector's stub counts it and EOIs; interrupts off after.
        unsafe { core::arch::asm!("sti", "hlt", "cli", options(nostack)) }
    }
    let woke = rdtsc();
    t.check(
        "woke-at-the-timer",
        woke >= WAKE_AT,
        format_args!("TSC {woke}"),
    );
    t.eq(
        "second-injection-once-on-the-destination",
        steal() - before,
        3_000_000,
    );
}
