//! rustkvm-test: arch=aarch64 machine=virtualization=on compare=off needs=el2
//! rustkvm-expect-skip: tcg/default el2.filtering
//! rustkvm-expect-skip: tcg/mttcg-smp2 el2.filtering
//! rustkvm-expect-skip: tcg/rr-smp2 el2.filtering
//! rustkvm-expect-skip: tcg tpm.el0-allowed-traps-to-el2,hpmn.el2-counter-traps-to-el2
//! rustkvm-expect-skip: tcg/icount el2.counts,hpmn.counts
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
//! alone. MDCR_EL2.TPM traps EL1's PMU accesses to EL2 and EL0's, those
//! PMUSERENR_EL0 allows too (stock TCG lets those through: skipped
//! there). MDCR_EL2.HPMN keeps the counters from it up for EL2: PMCR_EL0.N
//! reads HPMN below EL2, an EL1 access to one of them traps to EL2 (stock
//! TCG lets it through: skipped there), HPME enables them and PMCR_EL0.E
//! the others, HPMD keeps the others from counting at EL2. What KVM/arm64 expects of the PMU it runs on: `pmu-emul.c`
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

    /// MDCR_EL2 := `v`; its value before.
    pub extern "C" fn mdcr(v: u64) -> u64 {
        let old = guest::read_sysreg!("mdcr_el2");
        guest::write_sysreg!("mdcr_el2", v);
        old
    }

    /// MDCR_EL2.
    pub extern "C" fn mdcr_read(_: u64) -> u64 {
        guest::read_sysreg!("mdcr_el2")
    }

    /// PMCR_EL0 read at EL2.
    pub extern "C" fn pmcr(_: u64) -> u64 {
        guest::read_sysreg!("pmcr_el0")
    }

    /// Event counter `arg & 0x1f` := 0 with event type `arg >> 8`, enabled
    /// in PMCNTENSET (what only EL2 reaches of EL2's counters).
    pub extern "C" fn counter_setup(arg: u64) -> u64 {
        guest::write_sysreg!("pmselr_el0", arg & 0x1f);
        guest::write_sysreg!("pmxevtyper_el0", arg >> 8);
        guest::write_sysreg!("pmxevcntr_el0", 0);
        guest::write_sysreg!("pmcntenset_el0", 1 << (arg & 0x1f));
        0
    }

    /// Event counter `n`'s value.
    pub extern "C" fn counter(n: u64) -> u64 {
        guest::write_sysreg!("pmselr_el0", n);
        guest::read_sysreg!("pmxevcntr_el0")
    }
}

/// What runs at EL0 (through `guest::arch::run_el0`).
#[cfg(target_arch = "aarch64")]
mod el0 {
    pub extern "C" fn pmccntr(_: u64) -> u64 {
        guest::read_sysreg!("pmccntr_el0")
    }
}

/// The registers' bits and the guest's constants.
#[cfg(target_arch = "aarch64")]
mod bits {
    /// PMEVTYPER<n>_EL0 / PMCCFILTR_EL0: P (not at EL1), U (not at EL0),
    /// NSH (at EL2); INST_RETIRED.
    pub const P: u64 = 1 << 31;
    pub const U: u64 = 1 << 30;
    pub const NSH: u64 = 1 << 27;
    pub const INST_RETIRED: u64 = 0x08;
    pub const PMCR_E: u64 = 1;
    /// PMUSERENR_EL0.CR: EL0 may read the cycle counter.
    pub const PMUSERENR_CR: u64 = 1 << 2;
    /// MDCR_EL2.TPM: trap EL0's and EL1's PMU accesses to EL2.
    pub const MDCR_TPM: u64 = 1 << 6;
    /// ESR_ELx.EC of a trapped MSR/MRS.
    pub const EC_SYSREG: u8 = 0x18;
    /// Why stock TCG's counts around exception level changes are not checked.
    pub const STOCK_TCG: &str = "stock TCG splits instructions between ELs a block at a time";
}
#[cfg(target_arch = "aarch64")]
use bits::*;

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{run_el0, run_el2, spin};
    use guest::{read_sysreg, write_sysreg, Backend, Tolerance};
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

    // MDCR_EL2.TPM traps EL1's PMU accesses to EL2, and EL0's, those that
    // PMUSERENR_EL0 allows too (KVM on a vCPU with EL2 relies on it: it
    // allows everything in PMUSERENR_EL0 while its guest runs and emulates
    // the guest's EL0 accesses at EL2).
    let trapped = || guest::arch::take_el2_trap().map(|f| f.ec());
    write_sysreg!("pmuserenr_el0", PMUSERENR_CR);
    let _ = trapped();
    let mdcr = run_el2(el2::mdcr_read, 0).unwrap_or(0);
    let _ = run_el2(el2::mdcr, mdcr | MDCR_TPM);
    let _ = read_sysreg!("pmccntr_el0");
    t.eq("tpm.el1-traps-to-el2", trapped(), Some(EC_SYSREG));
    let r = run_el0(el0::pmccntr, 0);
    t.check("tpm.el0-runs", r.is_ok(), format_args!("{r:?}"));
    if guest::backend() == Some(Backend::Tcg) {
        t.skip(
            "tpm.el0-allowed-traps-to-el2",
            "stock TCG lets an EL0 access PMUSERENR_EL0 allows past MDCR_EL2.TPM (pmreg_access_ccntr)",
        );
    } else {
        t.eq("tpm.el0-allowed-traps-to-el2", trapped(), Some(EC_SYSREG));
    }
    let _ = run_el2(el2::mdcr, mdcr);
    let r = run_el0(el0::pmccntr, 0);
    t.check(
        "tpm.clear.el0-allowed",
        r.is_ok() && trapped().is_none(),
        format_args!("{r:?}"),
    );
    write_sysreg!("pmuserenr_el0", 0);

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
    // Stock TCG's PMU (with -icount) takes a block's instructions as the
    // block starts, so it splits them between exception levels a block at
    // a time (measured: 2 off around an exception return): not exact.
    let stock_tcg = guest::backend() == Some(Backend::Tcg);
    if stock_tcg {
        t.skip("el2.counts", STOCK_TCG);
    } else {
        el_counts(t, &counted, count);
    }
    write_sysreg!("pmcntenclr_el0", u64::MAX);
    hpmn(t, count, stock_tcg);
}

/// The EL2 and EL1 loops' counts on counters 0 (NSH clear), 1 (EL2 only)
/// and 2 (every level), from `counted(n, at_el2)`.
#[cfg(target_arch = "aarch64")]
fn el_counts(t: &mut Test, counted: &dyn Fn(u64, bool) -> [u64; 3], count: guest::Tolerance) {
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

/// MDCR_EL2.HPMN, HPME and HPMD (the counts skipped on stock TCG).
#[cfg(target_arch = "aarch64")]
fn hpmn(t: &mut Test, count: guest::Tolerance, stock_tcg: bool) {
    use guest::arch::{run_el2, spin};
    use guest::{read_sysreg, write_sysreg};
    let trapped = || guest::arch::take_el2_trap().map(|f| f.ec());
    // MDCR_EL2.HPMN: counters from HPMN up are EL2's. Below EL2, PMCR_EL0.N
    // reads HPMN and an access to one of them traps to EL2; HPME enables
    // them, PMCR_EL0.E the others; HPMD keeps the others from counting at
    // EL2 (Arm ARM D24.2 MDCR_EL2; KVM's nested PMU).
    let n = (run_el2(el2::pmcr, 0).unwrap_or(0) >> 11) & 0x1f;
    if n < 2 {
        t.skip("hpmn", "fewer than 2 event counters");
        return;
    }
    let h = n - 1;
    let _ = run_el2(el2::mdcr, h);
    t.eq(
        "hpmn.pmcr-n-below-el2",
        (read_sysreg!("pmcr_el0") >> 11) & 0x1f,
        h,
    );
    t.eq(
        "hpmn.pmcr-n-at-el2",
        run_el2(el2::pmcr, 0).map(|v| (v >> 11) & 0x1f),
        Some(n),
    );
    let _ = trapped();
    write_sysreg!("pmselr_el0", h - 1);
    let _ = read_sysreg!("pmxevcntr_el0");
    t.eq("hpmn.el1-counter-reached", trapped(), None);
    write_sysreg!("pmselr_el0", h);
    let _ = read_sysreg!("pmxevcntr_el0");
    if stock_tcg {
        let _ = trapped();
        t.skip(
            "hpmn.el2-counter-traps-to-el2",
            "stock TCG lets EL1 reach the counters MDCR_EL2.HPMN keeps for EL2",
        );
    } else {
        t.eq("hpmn.el2-counter-traps-to-el2", trapped(), Some(EC_SYSREG));
    }
    // Counter 0 (EL1's) and counter h (EL2's), both on `filter`: what
    // each counts over spin(n) at EL1 or at EL2, with PMCR_EL0 `pmcr` and
    // MDCR_EL2 `mdcr`.
    let split = |filter: u64, pmcr: u64, mdcr: u64, n: u64, at_el2: bool| {
        write_sysreg!("pmcr_el0", 0);
        let _ = run_el2(el2::mdcr, h);
        write_sysreg!("pmevtyper0_el0", filter | INST_RETIRED);
        write_sysreg!("pmevcntr0_el0", 0);
        write_sysreg!("pmcntenset_el0", 1);
        let _ = run_el2(el2::counter_setup, (filter | INST_RETIRED) << 8 | h);
        let _ = run_el2(el2::mdcr, mdcr);
        write_sysreg!("pmcr_el0", pmcr);
        if at_el2 {
            let _ = run_el2(el2::spin, n);
        } else {
            spin(n);
        }
        write_sysreg!("pmcr_el0", 0);
        let _ = run_el2(el2::mdcr, h);
        [
            read_sysreg!("pmevcntr0_el0"),
            run_el2(el2::counter, h).unwrap_or(0),
        ]
    };
    if stock_tcg {
        t.skip("hpmn.counts", STOCK_TCG);
        let _ = run_el2(el2::mdcr, n);
        return;
    }
    const HPME: u64 = 1 << 7;
    const HPMD: u64 = 1 << 17;
    let delta = |filter, pmcr, mdcr, at_el2| {
        let a = split(filter, pmcr, mdcr, 1, at_el2);
        let b = split(filter, pmcr, mdcr, 1001, at_el2);
        [b[0].wrapping_sub(a[0]), b[1].wrapping_sub(a[1])]
    };
    let d = delta(0, 0, h | HPME, false);
    t.count("hpme.el2-counter-counts", d[1], 2000, count);
    t.count("hpme.el1-counter-needs-pmcr-e", d[0], 0, count);
    let d = delta(0, PMCR_E, h, false);
    t.count("pmcr-e.el1-counter-counts", d[0], 2000, count);
    t.count("pmcr-e.el2-counter-needs-hpme", d[1], 0, count);
    let d = delta(P | U | NSH, PMCR_E, h | HPME | HPMD, true);
    t.count("hpmd.el1-counter-not-at-el2", d[0], 0, count);
    t.count("hpmd.el2-counter-at-el2", d[1], 2000, count);
    let _ = run_el2(el2::mdcr, n);
}
