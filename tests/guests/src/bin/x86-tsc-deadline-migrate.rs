//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off
//!
//! An armed TSC-deadline timer across savevm/loadvm or migration
//! (tests/tests/migration.rs). The guest arms the LAPIC timer in
//! TSC-deadline mode, prints "ready" and keeps the deadline at least half a
//! second of TSC ahead until the host says "go on" (tests/src/migrate.rs:
//! only the destination of the move does), so the timer is armed when the
//! VM moves whatever the host's speed. On the destination the timer must
//! read back its deadline until it fires, fire at or after it, never before,
//! and then read 0, with exactly one interrupt taken. Interrupts stay off
//! (the vector waits in the IRR), as in x86-tsc-deadline.
//! Spec: SDM §11.5.4.1; Linux arch/x86/kvm/lapic.c (kvm_set_lapic_tscdeadline_msr,
//! the timer's save in kvm_apic_get_state / restart in kvm_apic_set_state).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-tsc-deadline-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, irqs, lapic_irr, rdmsr, rdtsc, set_lapic_reg, wrmsr};
    use guest::{host_said_go, println};

    use guest::arch::{
        LAPIC_LVT_TIMER as LVT_TIMER, LAPIC_SVR as SVR,
        LVT_TIMER_TSC_DEADLINE as TSC_DEADLINE_MODE, MSR_TSC_DEADLINE,
    };
    /// The timer's vector.
    const VECTOR: u8 = 0x43;
    /// How far ahead the deadline is kept on the source (TSC ticks; about
    /// 1 s at rustkvm's 2 GHz).
    const AHEAD: u64 = 2_000_000_000;
    /// Hang guard for the wait on the destination.
    const FIRE_WITHIN: u64 = 20 * AHEAD;

    if !arch::has_tsc_deadline() {
        t.skip(
            "tsc-deadline",
            "CPUID.1:ECX[24] clear: no TSC-deadline mode",
        );
        return;
    }
    set_lapic_reg(SVR, 0x1ff);
    set_lapic_reg(LVT_TIMER, TSC_DEADLINE_MODE | u32::from(VECTOR));
    // Take whatever is pending, so the IRR shows only what fires later.
    let take = || {
        // SAFETY: the vector's stub counts it and EOIs; interrupts off again.
        unsafe { core::arch::asm!("sti", "nop", "nop", "cli", options(nostack)) }
    };
    let mut deadline = rdtsc() + AHEAD;
    t.eq("arm", wrmsr(MSR_TSC_DEADLINE, deadline), Ok(()));
    println!("ready");
    // Keep it ahead. (A source vCPU stalled past the deadline sees it fire:
    // take that and arm again, so the timer is armed at the move.)
    let (mut rearmed, mut early) = (0u32, None);
    while !host_said_go() {
        if lapic_irr(VECTOR) {
            let now = rdtsc();
            if now < deadline {
                early = Some((now, deadline));
            }
            take();
        }
        if rdtsc() + AHEAD / 2 > deadline {
            deadline = rdtsc() + AHEAD;
            let _ = wrmsr(MSR_TSC_DEADLINE, deadline);
            rearmed += 1;
        }
    }
    let taken_before = irqs(VECTOR);
    t.measure("rearmed", format_args!("{rearmed}"));
    t.check(
        "never-before-its-deadline-while-kept-ahead",
        early.is_none(),
        format_args!("(pending at, deadline) {early:?}"),
    );

    // On the destination: armed (reads back its deadline, nothing pending)
    // or already fired after its deadline (the move took that long).
    let back = rdmsr(MSR_TSC_DEADLINE);
    let pending = lapic_irr(VECTOR);
    let now = rdtsc();
    let fired_already = back == Ok(0) && pending && now >= deadline;
    t.check(
        "armed-after-the-move",
        (back == Ok(deadline) && !pending) || fired_already,
        format_args!("reads {back:?}, IRR {pending} at {now}, deadline {deadline}"),
    );
    t.measure(
        "state-after-the-move",
        format_args!("{}", if fired_already { "fired" } else { "armed" }),
    );
    // It fires on the destination: pending at or after the deadline (the
    // TSC read after the IRR showed it), then the MSR reads 0.
    let start = rdtsc();
    let at = loop {
        let pending = lapic_irr(VECTOR);
        let now = rdtsc();
        if pending || now.wrapping_sub(start) > FIRE_WITHIN {
            break pending.then_some(now);
        }
    };
    t.check(
        "fires-after-the-move",
        at.is_some(),
        format_args!("not pending {FIRE_WITHIN} ticks after the move"),
    );
    t.check(
        "not-before-its-deadline",
        at.is_none_or(|at| at >= deadline),
        format_args!("pending at {at:?}, deadline {deadline}"),
    );
    t.eq("reads-0-once-fired", rdmsr(MSR_TSC_DEADLINE), Ok(0));
    take();
    t.eq("one-interrupt", irqs(VECTOR) - taken_before, 1);
}
