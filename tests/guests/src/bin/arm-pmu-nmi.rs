//! rustkvm-test: arch=aarch64 machine=gic-version=3 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (as arm-pmu-irq)
//!
//! The PMU overflow interrupt as a pseudo-NMI (Linux's arm_pmu with GICv3
//! priority masking, `irqchip.gicv3_pseudo_nmi=1`): with ICC_PMR_EL1
//! masking normal interrupts ("IRQs off"), the PMU's PPI 23 at NMI priority
//! still gets through while a pending virtual-timer interrupt (PPI 27, normal
//! priority) does not, until the mask is lowered. SKIPs without an
//! INST_RETIRED event (stock TCG without -icount).
//! Spec: Arm IHI 0069 (GICv3 priority masking); Linux
//! drivers/irqchip/irq-gic-v3.c, drivers/perf/arm_pmu.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-nmi", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::gic::v3 as gic;
    use guest::{read_sysreg, write_sysreg};
    const PMU_PPI: u32 = 23;
    const VTIMER_PPI: u32 = 27;
    const INST_RETIRED: u64 = 0x08;
    const E: u64 = 1;
    /// Linux's priorities: NMIs 0x20, normal interrupts 0xa0; PMR 0x80
    /// masks the normal ones (its "IRQs off" under pseudo-NMI).
    const NMI_PRIO: u8 = 0x20;
    const IRQ_PRIO: u8 = 0xa0;
    const PMR_IRQS_OFF: u8 = 0x80;
    const PMR_ALL: u8 = 0xf0;

    if let Some(why) = guest::arch::pmu_overflow_irq_unavailable() {
        t.skip("arm-pmu-nmi", why);
        return;
    }
    gic::init(PMR_IRQS_OFF);
    gic::enable_at(PMU_PPI, NMI_PRIO);
    gic::enable_at(VTIMER_PPI, IRQ_PRIO);
    // The virtual timer fires now: pending, but masked by priority.
    write_sysreg!("cntv_cval_el0", read_sysreg!("cntvct_el0"));
    write_sysreg!("cntv_ctl_el0", 1);
    t.eq("normal-irq-masked", gic::ack(), gic::SPURIOUS);

    write_sysreg!("pmcntenclr_el0", u64::MAX);
    write_sysreg!("pmovsclr_el0", u64::MAX);
    write_sysreg!("pmcr_el0", E);
    write_sysreg!("pmevtyper0_el0", INST_RETIRED);
    write_sysreg!("pmevcntr0_el0", 0xffff_ff00);
    write_sysreg!("pmintenset_el1", 1);
    write_sysreg!("pmcntenset_el0", 1);
    let mut id = gic::SPURIOUS;
    for _ in 0..10_000 {
        id = gic::ack();
        if id != gic::SPURIOUS {
            break;
        }
    }
    t.eq("pmu-irq-through-the-mask", id, PMU_PPI);
    if id != gic::SPURIOUS {
        gic::eoi(id);
    }
    write_sysreg!("pmovsclr_el0", 1);
    write_sysreg!("pmcntenclr_el0", 1);
    t.eq("timer-still-masked", gic::ack(), gic::SPURIOUS);

    // "IRQs on": the timer's interrupt was pending all along.
    write_sysreg!("S3_0_C4_C6_0", u64::from(PMR_ALL));
    let id = gic::ack();
    t.eq("timer-after-unmask", id, VTIMER_PPI);
    if id != gic::SPURIOUS {
        write_sysreg!("cntv_ctl_el0", 0);
        gic::eoi(id);
    }
    gic::disable(PMU_PPI);
    gic::disable(VTIMER_PPI);
}
