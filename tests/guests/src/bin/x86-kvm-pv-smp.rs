//! rustkvm-test: arch=x86_64 smp=2 cpu=max compare=off vary=ap.preempted-seen,ap.steal-ns,ap.preempted-permille
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//! rustkvm-kvm-probe: hypercall hypercalls never complete on this host's KVM (measured: VMCALL and VMMCALL leave the vCPU on the instruction)
//!
//! The two-vCPU half of KVM's PV interface: KVM_HC_KICK_CPU wakes a vCPU
//! halted with interrupts off (pv-unhalt), and one vCPU can read the other's
//! `preempted` flag in its steal-time structure while it is descheduled. The
//! application processor is started with INIT-SIPI-SIPI. SKIPs without the
//! KVM signature. `ap.preempted-seen` is 1 when vCPUs take turns on one host
//! thread (`thread=single`): the host runner checks that per variant.
//! `ap.preempted-permille` is how often, sampled every 50 µs over 300 ms
//! while this vCPU runs and the AP spins, the AP's flag was set: 1000
//! under `thread=single` and `-icount` (the host runner checks that); when
//! both MTTCG vCPU threads share one host CPU the AP is off it whenever we
//! read, so the figure says how timely the MTTCG sampler's hint is
//! (docs/steal-time.md): a host statistic, scripts/soak-guests.sh.
//! Spec: Documentation/virt/kvm/x86/hypercalls.rst (KVM_HC_KICK_CPU),
//! msr.rst (MSR_KVM_STEAL_TIME, preempted).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvm-pv-smp", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod smp {
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch::{self, KvmStealTime, MSR_KVM_STEAL_TIME};

    pub static mut AP_ST: KvmStealTime = KvmStealTime::new();
    pub static mut AP_STAGE: u64 = 0;
    pub static mut AP_COUNTER: u64 = 0;
    pub static mut STOP: u64 = 0;

    pub fn get(p: *const u64) -> u64 {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.read_volatile() }
    }
    pub fn set(p: *mut u64, v: u64) {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.write_volatile(v) }
    }

    /// Stages the AP reports: 1 steal time on, 2 about to halt, 3 woken.
    pub fn ap_work() {
        let gpa = addr_of!(AP_ST) as u64;
        let ok = arch::wrmsr(MSR_KVM_STEAL_TIME, gpa | 1).is_ok();
        set(addr_of_mut!(AP_STAGE), if ok { 1 } else { 99 });
        while get(addr_of!(STOP)) == 0 {
            set(addr_of_mut!(AP_COUNTER), get(addr_of!(AP_COUNTER)) + 1);
        }
        set(addr_of_mut!(AP_STAGE), 2);
        // Interrupts off: only a KVM_HC_KICK_CPU (pv-unhalt) ends this.
        // SAFETY: halting this vCPU.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) };
        set(addr_of_mut!(AP_STAGE), 3);
    }

    /// Wait (bounded) until `cond` holds; false on timeout.
    pub fn wait(mut cond: impl FnMut() -> bool) -> bool {
        for _ in 0..2_000_000_000u64 {
            if cond() {
                return true;
            }
        }
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::arch;
    use smp::*;

    const KVM_HC_KICK_CPU: u64 = 5;

    if !arch::has_kvm_signature() {
        t.skip("kvm-pv-smp", "no KVM signature at CPUID 0x40000000");
        return;
    }
    arch::start_ap(1, ap_work);
    let up = wait(|| get(addr_of!(AP_STAGE)) != 0);
    t.check(
        "ap-started-and-enabled-steal-time",
        up && get(addr_of!(AP_STAGE)) == 1,
        format_args!("stage {}", get(addr_of!(AP_STAGE))),
    );
    if !up {
        return;
    }

    // Watch the AP's preempted byte while it is busy and we run.
    let mut seen = 0u8;
    let start = get(addr_of!(AP_COUNTER));
    for _ in 0..300_000_000u64 {
        // SAFETY: volatile read of memory the host writes.
        let p = unsafe { addr_of!(AP_ST.preempted).read_volatile() };
        seen |= p;
        if seen != 0 && get(addr_of!(AP_COUNTER)) != start {
            break;
        }
    }
    t.measure("ap.preempted-seen", format_args!("{seen}"));
    // However long the host keeps the AP's thread off its CPU (the wait is
    // a hang guard).
    let ran = wait(|| get(addr_of!(AP_COUNTER)) != start);
    t.check("ap-ran", ran, format_args!(""));
    // Read as a guest reads the structure (a seqlock): the host may be
    // writing the AP's structure as we read it from here, so retry while
    // the version is odd or moved (bounded).
    let (mut version, mut steal) = (0, 0);
    for _ in 0..10_000 {
        // SAFETY: volatile reads of memory the host writes.
        let (v1, s, v2) = unsafe {
            (
                addr_of!(AP_ST.version).read_volatile(),
                addr_of!(AP_ST.steal).read_volatile(),
                addr_of!(AP_ST.version).read_volatile(),
            )
        };
        (version, steal) = (v1, s);
        if v1 == v2 && v1 % 2 == 0 {
            break;
        }
    }
    t.check(
        "ap-steal-version-even",
        version >= 2 && version % 2 == 0,
        format_args!("{version}"),
    );
    t.measure("ap.steal-ns", format_args!("{steal}"));

    // How often the flag is set while we run (TSC ticks: 2 GHz under
    // rustkvm; only the ratio matters).
    let (mut samples, mut set) = (0u64, 0u64);
    let t0 = arch::rdtsc();
    let mut next = t0;
    while arch::rdtsc().wrapping_sub(t0) < 600_000_000 {
        let now = arch::rdtsc();
        if now.wrapping_sub(next) < u64::MAX / 2 {
            // SAFETY: volatile read of memory the host writes.
            let p = unsafe { addr_of!(AP_ST.preempted).read_volatile() };
            samples += 1;
            set += u64::from(p & 1);
            next = now + 100_000;
        }
        // PAUSE, as every spin-wait Linux consults the flag in does
        // (cpu_relax in osq_lock, mutex and rwsem owner spinning).
        core::hint::spin_loop();
    }
    t.measure(
        "ap.preempted-permille",
        format_args!("{}", set * 1000 / samples.max(1)),
    );

    // KICK_CPU wakes the AP out of a halt with interrupts off.
    smp::set(core::ptr::addr_of_mut!(STOP), 1);
    let halting = wait(|| get(addr_of!(AP_STAGE)) >= 2);
    t.check(
        "ap-reached-halt",
        halting,
        format_args!("stage {}", get(addr_of!(AP_STAGE))),
    );
    // Give it time to execute the HLT (a kick before it is fine too: KVM
    // keeps pv_unhalted pending until the next halt).
    for _ in 0..20_000_000u64 {
        core::hint::black_box(0);
    }
    t.eq(
        "kick-returns-0",
        arch::vmcall(KVM_HC_KICK_CPU, [0, 1, 0, 0]),
        Ok(0),
    );
    let woke = wait(|| get(addr_of!(AP_STAGE)) == 3);
    t.check(
        "kick-woke-the-halted-ap",
        woke,
        format_args!("stage {}", get(addr_of!(AP_STAGE))),
    );
}
