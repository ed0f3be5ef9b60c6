//! rustkvm-test: arch=aarch64 smp=2 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PMU interrupt is not KVM's)
//!
//! A vCPU that PSCI CPU_ON resets starts with its PMU reset, its overflow
//! interrupt line included: KVM resets the PMU in `kvm_reset_vcpu`
//! (`kvm_pmu_vcpu_reset`; PMCR_EL0.E 0) and drives the line from the
//! reset state at the next entry (`kvm_pmu_update_state`). The secondary
//! makes INST_RETIRED overflow with its interrupt enabled, sees PPI 23
//! pending at its GIC (GICv2's banked distributor registers, GICv3's own
//! redistributor: KVM on a GICv3 host gives a GICv3), leaves the overflow
//! pending and goes off (CPU_OFF); started again, its PMCR_EL0.E is 0 and
//! PPI 23 is not pending. SKIPs without an INST_RETIRED overflow interrupt
//! (stock TCG).
//! Spec: Arm DEN0022 (PSCI CPU_ON), Linux arch/arm64/kvm/reset.c,
//! arch/arm64/kvm/pmu-emul.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-cpu-on", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
mod sec {
    use core::sync::atomic::{AtomicU64, Ordering};
    use guest::gic::any as gic;
    use guest::write_sysreg;

    /// The PMU's PPI on the virt board.
    pub const PMU_PPI: u32 = 23;
    /// INST_RETIRED; PMCR_EL0.E and .P.
    const INST_RETIRED: u64 = 0x08;
    pub const E: u64 = 1;
    const P: u64 = 1 << 1;

    /// What the secondary saw: after its first start, PPI 23 pending (1 +
    /// pending); after its second, PMCR_EL0 and PPI 23 pending.
    pub static FIRST: AtomicU64 = AtomicU64::new(0);
    pub static SECOND_PMCR: AtomicU64 = AtomicU64::new(u64::MAX);
    pub static SECOND_PENDING: AtomicU64 = AtomicU64::new(u64::MAX);

    fn ppi_pending() -> bool {
        gic::pending(PMU_PPI)
    }

    /// First start: an overflow with its interrupt enabled, left pending.
    pub fn first() {
        gic::enable(PMU_PPI);
        guest::arch::pmu_clear();
        write_sysreg!("pmcr_el0", E | P);
        write_sysreg!("pmevtyper0_el0", INST_RETIRED);
        write_sysreg!("pmevcntr0_el0", 0xffff_fff0);
        write_sysreg!("pmintenset_el1", 1);
        write_sysreg!("pmcntenset_el0", 1);
        // Up to a second of polling (each poll is a trap into the
        // hypervisor on KVM: bounded by time, not by a count).
        let mut pending = false;
        let t0 = guest::arch::cntvct();
        while guest::arch::cntvct().wrapping_sub(t0) < guest::arch::cntfrq() {
            if ppi_pending() {
                pending = true;
                break;
            }
        }
        // Stop counting; the overflow (PMOVSSET) and its enable stay.
        write_sysreg!("pmcntenclr_el0", 1);
        FIRST.store(1 + u64::from(pending), Ordering::Release);
    }

    /// After CPU_ON reset it: what is left.
    pub fn second() {
        // The GIC first: a PMU register access brings the line in line.
        let pending = ppi_pending();
        SECOND_PMCR.store(guest::read_sysreg!("pmcr_el0"), Ordering::Relaxed);
        SECOND_PENDING.store(u64::from(pending), Ordering::Release);
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use guest::arch::{self, hvc};
    use sec::*;

    /// PSCI AFFINITY_INFO (64-bit): 1 when the CPU is off.
    const PSCI_AFFINITY_INFO: u32 = 0xc400_0004;
    /// Wait (bounded: 10 s of the generic counter) until `cond`.
    fn wait(mut cond: impl FnMut() -> bool) -> bool {
        let t0 = arch::cntvct();
        while arch::cntvct().wrapping_sub(t0) < 10 * arch::cntfrq() {
            if cond() {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }
    let off = || hvc(PSCI_AFFINITY_INFO, [1, 0, 0])[0] == 1;

    if let Some(why) = arch::pmu_overflow_irq_unavailable() {
        t.skip("arm-pmu-cpu-on", why);
        return;
    }
    let on = arch::cpu_on(1, first);
    let ran = on == 0 && wait(|| FIRST.load(Ordering::Acquire) != 0) && wait(off);
    t.check(
        "secondary-ran-and-went-off",
        ran,
        format_args!("CPU_ON {on}, stage {}", FIRST.load(Ordering::Acquire)),
    );
    if !ran {
        return;
    }
    t.eq(
        "overflow-interrupt-pending-before-cpu-off",
        FIRST.load(Ordering::Acquire),
        2,
    );
    let on = arch::cpu_on(1, second);
    let ran = on == 0 && wait(|| SECOND_PENDING.load(Ordering::Acquire) != u64::MAX);
    t.check("secondary-started-again", ran, format_args!("CPU_ON {on}"));
    if !ran {
        return;
    }
    t.eq(
        "pmcr-e-reset-by-cpu-on",
        SECOND_PMCR.load(Ordering::Relaxed) & E,
        0,
    );
    t.eq(
        "no-pmu-interrupt-after-the-reset",
        SECOND_PENDING.load(Ordering::Acquire),
        0,
    );
}
