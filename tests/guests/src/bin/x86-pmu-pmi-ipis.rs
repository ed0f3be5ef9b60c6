//! rustkvm-test: arch=x86_64 smp=2 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu timeout=120 vary=ipis-sent
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU)
//!
//! A PMI has zero skid however busy the local APIC is: while the
//! application processor keeps sending this vCPU fixed IPIs (held in its
//! IRR below its task priority, interrupts off), the bootstrap processor overflows an instruction
//! counter 50 000 times on a NOP sled, and every NMI must interrupt the
//! 10th NOP, as in `x86-pmu`. Under MTTCG each IPI from the other thread
//! asks QEMU's vCPU loop to poll the APIC (CPU_INTERRUPT_POLL), which it
//! takes before an NMI, one interrupt per look; an NMI behind a poll must
//! still come before the next instruction (found as a flake of `x86-pmu`
//! under load: the PMI came 39 NOPs late, at the disabling WRMSR). Under
//! `thread=single` the vCPUs take turns and no poll is asked for; the
//! checks hold all the same. SKIPs without a PMU.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-pmi-ipis", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod flood {
    use core::sync::atomic::{AtomicU64, Ordering};
    use guest::arch::{lapic_reg, set_lapic_reg};

    /// Set by the BSP when its PMIs are done.
    pub static STOP: AtomicU64 = AtomicU64::new(0);
    /// IPIs the AP sent.
    pub static SENT: AtomicU64 = AtomicU64::new(0);
    /// The vector sent: it stays pending in the BSP's IRR.
    const VECTOR: u32 = 0x41;
    const ICR_LO: u32 = 0x300;
    const ICR_HI: u32 = 0x310;

    /// The AP: fixed IPIs to APIC ID 0 until told to stop.
    pub fn work() {
        while STOP.load(Ordering::Acquire) == 0 {
            set_lapic_reg(ICR_HI, 0);
            set_lapic_reg(ICR_LO, 0x0000_4000 | VECTOR); // fixed, assert, physical
            while lapic_reg(ICR_LO) & (1 << 12) != 0 {}
            SENT.fetch_add(1, Ordering::Relaxed);
            // PAUSE leaves QEMU's CPU loop: under thread=single the BSP
            // gets its turn (not only at the 100 ms round-robin kick).
            core::hint::spin_loop();
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use guest::arch::{self, nmis, set_lapic_reg};
    use guest::x86_pmu::{
        nop_sled, wr, EN, EVTSEL0, GLOBAL_CTRL, GLOBAL_OVF_CTRL, INT, LVTPC, LVT_NMI, OS, PMC0,
        SVR, USR,
    };
    use guest::Tolerance;

    /// How far past the overflowing instruction a PMI may land on hardware
    /// (skid, SDM vol. 3 §20.5.3: bytes of NOPs); none in emulation.
    const SKID: Tolerance = Tolerance { hardware: 64 };
    const ROUNDS: u64 = 50_000;
    const INSNS: u64 = 0xc0;
    /// Local APIC task-priority register (SDM §11.8.3.1).
    const TPR: u32 = 0x80;

    if arch::cpuid(0, 0)[0] < 0xa || arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-pmu-pmi-ipis", "CPUID 0xA: no architectural PMU");
        return;
    }
    set_lapic_reg(SVR, 0x1ff);
    // TPR 0xf0 holds the IPIs back: a poll then finds nothing to deliver
    // (it would otherwise raise CPU_INTERRUPT_HARD, which looks again).
    set_lapic_reg(TPR, 0xf0);
    arch::start_ap(1, flood::work);
    let slack = SKID.here();
    let (mut missed, mut late, mut early, mut worst) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..ROUNDS {
        // PMC0 (instructions, INT) wraps on the enabling WRMSR's 10th
        // instruction: the NMI interrupts the 10th NOP (x86-pmu).
        wr(GLOBAL_CTRL, 0);
        wr(GLOBAL_OVF_CTRL, 1);
        wr(EVTSEL0, EN | OS | USR | INT | INSNS);
        wr(PMC0, 10u64.wrapping_neg() & 0xffff_ffff);
        set_lapic_reg(LVTPC, LVT_NMI);
        let (n0, _) = nmis();
        let sled = nop_sled((GLOBAL_CTRL, 1), GLOBAL_CTRL);
        let (n1, rip) = nmis();
        let skid = rip.wrapping_sub(sled).wrapping_sub(9);
        if n1 - n0 != 1 {
            missed += 1;
        } else if rip < sled + 9 {
            early += 1;
        } else if skid > slack {
            late += 1;
            worst = worst.max(skid);
        }
    }
    flood::STOP.store(1, Ordering::Release);
    wr(GLOBAL_OVF_CTRL, 1);
    t.eq("pmi.one-nmi-each", missed, 0);
    t.eq("pmi.never-early", early, 0);
    t.check(
        "pmi.zero-skid-beside-ipis",
        late == 0,
        format_args!("{late} of {ROUNDS} PMIs late, the worst by {worst} NOPs"),
    );
    let sent = flood::SENT.load(Ordering::Relaxed);
    t.measure("ipis-sent", format_args!("{sent}"));
    // The AP ran beside the PMIs: it sent IPIs while they came.
    t.check("ap.sent-ipis", sent > 0, format_args!("{sent}"));
}
