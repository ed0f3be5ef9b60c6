//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG has no INST_RETIRED (icount: its PMU interrupt is not KVM's))
//!
//! The PMU overflow interrupt on the virt board's PPI 23, as KVM raises it
//! (`kvm_pmu_overflow_status`): level = PMCR_EL0.E && (PMOVSSET &
//! PMINTENSET) != 0. Older KVM also required PMCNTENSET (the issue quotes
//! that rule); KVM dropped the term ("KVM: arm64: PMU: Don't use the
//! PMCNTENSET in overflow status", for the SBSA ACS), so a disabled counter's
//! pending overflow keeps the line up. An instruction counter wraps while
//! the guest polls the GICv2 CPU interface: the interrupt is pending at the
//! wrap (zero skid: the counter has moved on by at most one poll), stays
//! asserted while the overflow is pending, and follows each term of the
//! rule; a period-1 storm gets every interrupt. SKIPs without an INST_RETIRED event (stock TCG without -icount)
//! and under stock TCG.
//! Spec: Arm ARM D13 (PMUv3); Linux arch/arm64/kvm/pmu-emul.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-irq", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::gic::any as gic;
    use guest::{read_sysreg, write_sysreg};
    /// The PMU's PPI on the virt board (KVM's default too).
    const PMU_PPI: u32 = 23;
    /// INST_RETIRED.
    const INST_RETIRED: u64 = 0x08;
    /// PMCR_EL0.E and .P (reset event counters).
    const E: u64 = 1;
    const P: u64 = 1 << 1;

    if let Some(why) = guest::arch::pmu_overflow_irq_unavailable() {
        t.skip("arm-pmu-irq", why);
        return;
    }
    gic::enable(PMU_PPI);
    guest::arch::pmu_clear();
    write_sysreg!("pmcr_el0", E | P);
    write_sysreg!("pmevtyper0_el0", INST_RETIRED);
    write_sysreg!("pmevcntr0_el0", 0xffff_ff00);
    write_sysreg!("pmintenset_el1", 1);
    t.eq("quiet-before-counting", gic::ack(), gic::SPURIOUS);

    write_sysreg!("pmcntenset_el0", 1);
    let mut at = None;
    for _ in 0..10_000 {
        if gic::ack() == PMU_PPI {
            at = Some(read_sysreg!("pmevcntr0_el0"));
            break;
        }
    }
    t.check(
        "irq-on-overflow",
        at.is_some(),
        format_args!("PPI 23 never pending"),
    );
    // PMUv3p5's event counters are 64 bits wide and overflow at 32 bits
    // (PMCR_EL0.LP clear): look at the low half. One poll is a handful of
    // instructions: pending right at the wrap.
    let after = at.unwrap_or(u64::MAX) & 0xffff_ffff;
    t.check(
        "irq-at-the-wrap",
        after < 64,
        format_args!("counter low half {after:#x} when first seen"),
    );
    t.eq("pmovsset", read_sysreg!("pmovsset_el0") & 1, 1);
    gic::eoi(PMU_PPI);

    // Level-sensitive: asserted while the overflow stays pending...
    let level = |t: &mut Test, name: &str, want: bool| {
        let id = gic::ack();
        if id == PMU_PPI {
            gic::eoi(id);
        }
        t.eq(name, id == PMU_PPI, want);
    };
    level(t, "level-while-pending", true);
    // ... and each term of KVM's rule drops it.
    write_sysreg!("pmcntenclr_el0", 1);
    level(t, "pmcntenclr-keeps-it", true);
    write_sysreg!("pmcntenset_el0", 1);
    write_sysreg!("pmintenclr_el1", 1);
    level(t, "pmintenclr-drops-it", false);
    write_sysreg!("pmintenset_el1", 1);
    level(t, "pmintenset-raises-it", true);
    write_sysreg!("pmcr_el0", 0);
    level(t, "pmcr-e-clear-drops-it", false);
    write_sysreg!("pmcr_el0", E);
    level(t, "pmcr-e-set-raises-it", true);
    write_sysreg!("pmovsclr_el0", 1);
    level(t, "pmovsclr-drops-it", false);

    // A storm (hostile guest): the counter re-armed one instruction before
    // its wrap at every interrupt, a period of 1. Every round gets its
    // interrupt and the guest keeps making progress. On real KVM nested in
    // a rustkvm L1 a round takes 0.6 ms to 1.4 s (measured 2026-12-07: 2,000
    // rounds took 26 s to more than the 125 s limit; an open finding,
    // docs/nested.md): 200 rounds there.
    let rounds: u32 = if guest::backend() == Some(guest::Backend::Kvm) {
        200
    } else {
        2000
    };
    let mut taken = 0u32;
    for _ in 0..rounds {
        write_sysreg!("pmovsclr_el0", 1);
        write_sysreg!("pmevcntr0_el0", 0xffff_ffff);
        for _ in 0..100 {
            let id = gic::ack();
            if id == gic::SPURIOUS {
                continue;
            }
            gic::eoi(id);
            if id == PMU_PPI {
                taken += 1;
                break;
            }
        }
    }
    t.eq("storm-every-round-interrupted", taken, rounds);

    write_sysreg!("pmcntenclr_el0", u64::MAX);
    write_sysreg!("pmintenclr_el1", u64::MAX);
    gic::disable(PMU_PPI);
}
