//! rustkvm-test: arch=aarch64 machine=virtualization=on compare=off needs=el2
//! rustkvm-expect-skip: tcg/default el2.filtering
//! rustkvm-expect-skip: tcg/mttcg-smp2 el2.filtering
//! rustkvm-expect-skip: tcg/rr-smp2 el2.filtering
//!
//! The PMU and EL2 (`-M virt,virtualization=on`: QEMU enters at EL2, the
//! runtime drops to EL1 over a stub that runs code at EL2 for it): with EL2
//! implemented PMEVTYPER<n>_EL0.NSH and PMCCFILTR_EL0.NSH exist, and NSH
//! alone decides whether a counter counts at EL2 (P and U filter EL1 and
//! EL0, never EL2). A loop run at EL2 counts exactly on an EL2-only counter
//! (P, U and NSH set) and an every-level counter (NSH set), and not at all
//! on a counter with NSH clear; a loop run at EL1 does not reach the
//! EL2-only counter. The cycle counter with PMCCFILTR P, U and NSH clear
//! counts nowhere and stays frozen; with only NSH set it counts at EL2
//! alone. What KVM/arm64 expects of the PMU it runs on: `pmu-emul.c`
//! programs guest events with `exclude_hv` from NSH, and its host perf
//! events exclude EL2 (`ARMV8_PMU_INCLUDE_EL2`). SKIPs without INST_RETIRED
//! (stock TCG without -icount). The kvm column needs KVM to give the guest
//! EL2 (KVM_CAP_ARM_EL2, Linux 6.16 and later).
//! Spec: Arm ARM D24.5 (PMEVTYPER<n>_EL0, PMCCFILTR_EL0), D12.6 (filtering
//! by exception level); Linux arch/arm64/kvm/pmu-emul.c, drivers/perf/
//! arm_pmuv3.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-el2", "aarch64 only");
}

/// What runs at EL2 (through `guest::arch::run_el2`).
#[cfg(target_arch = "aarch64")]
mod el2 {
    /// 2n instructions of loop (n ≥ 1).
    pub extern "C" fn spin(n: u64) -> u64 {
        guest::arch::spin(n);
        0
    }

    /// CurrentEL.EL.
    pub extern "C" fn current_el(_: u64) -> u64 {
        guest::read_sysreg!("CurrentEL") >> 2
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{run_el2, spin};
    use guest::{read_sysreg, write_sysreg, Tolerance};
    /// PMEVTYPER<n>_EL0 / PMCCFILTR_EL0: P (not at EL1), U (not at EL0),
    /// NSH (at EL2); INST_RETIRED.
    const P: u64 = 1 << 31;
    const U: u64 = 1 << 30;
    const NSH: u64 = 1 << 27;
    const INST_RETIRED: u64 = 0x08;
    const PMCR_E: u64 = 1;
    /// PMCNTENSET bit of the cycle counter.
    const CYCLES: u64 = 1 << 31;

    if !guest::arch::has_el2() {
        t.check("el2.present", false, format_args!("entered at EL1: no EL2"));
        return;
    }
    t.eq("el2.runs-at-el2", run_el2(el2::current_el, 0), Some(2));
    t.eq("el1.runs-at-el1", read_sysreg!("CurrentEL") >> 2, 1);
    if guest::arch::read_pmcr().is_err() {
        t.skip("arm-pmu-el2", "no PMU");
        return;
    }
    guest::arch::pmu_clear();
    write_sysreg!("pmcr_el0", PMCR_E);

    // NSH exists with EL2: it reads back (from EL1 too).
    write_sysreg!("pmevtyper0_el0", P | U | NSH | INST_RETIRED);
    t.eq(
        "nsh.pmevtyper-kept",
        read_sysreg!("pmevtyper0_el0"),
        P | U | NSH | INST_RETIRED,
    );
    write_sysreg!("pmccfiltr_el0", NSH);
    t.eq("nsh.pmccfiltr-kept", read_sysreg!("pmccfiltr_el0"), NSH);

    // The cycle counter filtered from every level is frozen across code at
    // EL1 and at EL2; filtered to EL2 alone, frozen across code at EL1.
    let cycles_over = |filter: u64, at_el2: bool| {
        write_sysreg!("pmcntenclr_el0", CYCLES);
        write_sysreg!("pmccfiltr_el0", filter);
        write_sysreg!("pmccntr_el0", 0);
        write_sysreg!("pmcntenset_el0", CYCLES);
        if at_el2 {
            let _ = run_el2(el2::spin, 10_000);
        } else {
            spin(10_000);
        }
        write_sysreg!("pmcntenclr_el0", CYCLES);
        read_sysreg!("pmccntr_el0")
    };
    t.eq("cycles.nowhere.el1-frozen", cycles_over(P | U, false), 0);
    t.eq("cycles.nowhere.el2-frozen", cycles_over(P | U, true), 0);
    t.eq(
        "cycles.el2-only.el1-frozen",
        cycles_over(P | U | NSH, false),
        0,
    );
    let at_el2 = cycles_over(P | U | NSH, true);
    t.check(
        "cycles.el2-only.el2-counts",
        at_el2 > 0,
        format_args!("{at_el2} cycles for 20000 instructions at EL2"),
    );

    if read_sysreg!("pmceid0_el0") & (1 << INST_RETIRED) == 0 {
        t.skip("el2.filtering", "PMCEID0: no INST_RETIRED");
        return;
    }
    // Counter 0: EL0 and EL1 (NSH clear); 1: EL2 alone; 2: every level.
    // What each counts over a run of `spin(n)` at EL2 (or at EL1).
    let counted = |n: u64, at_el2: bool| {
        write_sysreg!("pmcntenclr_el0", 0b111);
        write_sysreg!("pmevtyper0_el0", INST_RETIRED);
        write_sysreg!("pmevtyper1_el0", P | U | NSH | INST_RETIRED);
        write_sysreg!("pmevtyper2_el0", NSH | INST_RETIRED);
        write_sysreg!("pmevcntr0_el0", 0);
        write_sysreg!("pmevcntr1_el0", 0);
        write_sysreg!("pmevcntr2_el0", 0);
        write_sysreg!("pmcntenset_el0", 0b111);
        if at_el2 {
            let _ = run_el2(el2::spin, n);
        } else {
            spin(n);
        }
        write_sysreg!("pmcntenclr_el0", 0b111);
        [
            read_sysreg!("pmevcntr0_el0"),
            read_sysreg!("pmevcntr1_el0"),
            read_sysreg!("pmevcntr2_el0"),
        ]
    };
    let count = Tolerance { hardware: 16 };
    let (a, b) = (counted(1, true), counted(1001, true));
    let d = |k: usize| b[k].wrapping_sub(a[k]);
    t.count("el2.loop.nsh-clear-not-counted", d(0), 0, count);
    t.count("el2.loop.el2-only-counted", d(1), 2000, count);
    t.count("el2.loop.every-level-counted", d(2), 2000, count);
    t.check(
        "el2.loop.stub-counted-at-el2",
        a[1] > 2,
        format_args!("{} instructions at EL2 around spin(1)", a[1]),
    );
    let (a, b) = (counted(1, false), counted(1001, false));
    let d = |k: usize| b[k].wrapping_sub(a[k]);
    t.count("el1.loop.nsh-clear-counted", d(0), 2000, count);
    t.count("el1.loop.el2-only-not-counted", d(1), 0, count);
    t.eq("el1.loop.el2-only-zero", b[1], 0);
    t.count("el1.loop.every-level-counted", d(2), 2000, count);
}
