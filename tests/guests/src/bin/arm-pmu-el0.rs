//! rustkvm-test: arch=aarch64 compare=off
//! rustkvm-expect-skip: tcg/default el0.filtering
//! rustkvm-expect-skip: tcg/mttcg-smp2 el0.filtering
//! rustkvm-expect-skip: tcg/rr-smp2 el0.filtering
//!
//! The PMU from EL0: PMUSERENR_EL0 decides what EL0 may touch (EN all, SW
//! PMSWINC writes, CR the cycle counter, ER the event counters and
//! PMSELR), PMINTENSET_EL1 is never EL0's, and a denied access is UNDEFINED
//! (ESR_EL1.EC 0) as KVM makes it (`check_pmu_access_disabled` injects
//! UNDEF) — bare hardware and stock TCG trap to EL1 instead (EC 0x18).
//! Then PMEVTYPER's P and U bits: a loop run at EL0 counts with P set and
//! not with U set, exactly (skipped where INST_RETIRED is not counted).
//! Spec: Arm ARM D13 (PMUSERENR_EL0, PMEVTYPER<n>_EL0); Linux
//! arch/arm64/kvm/sys_regs.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-el0", "aarch64 only");
}

/// EL0 probes: each touches one register and returns what it read.
#[cfg(target_arch = "aarch64")]
mod el0 {
    use guest::{read_sysreg, write_sysreg};

    pub extern "C" fn pmccntr(_: u64) -> u64 {
        read_sysreg!("pmccntr_el0")
    }
    pub extern "C" fn pmevcntr0(_: u64) -> u64 {
        read_sysreg!("pmevcntr0_el0")
    }
    pub extern "C" fn pmselr(v: u64) -> u64 {
        write_sysreg!("pmselr_el0", v);
        read_sysreg!("pmselr_el0")
    }
    pub extern "C" fn pmswinc(_: u64) -> u64 {
        write_sysreg!("pmswinc_el0", 1);
        0
    }
    pub extern "C" fn pmcr(_: u64) -> u64 {
        read_sysreg!("pmcr_el0")
    }
    pub extern "C" fn pmintenset(_: u64) -> u64 {
        read_sysreg!("pmintenset_el1")
    }
    pub extern "C" fn pmuserenr(_: u64) -> u64 {
        read_sysreg!("pmuserenr_el0")
    }
    /// 2n instructions of loop.
    pub extern "C" fn spin(n: u64) -> u64 {
        guest::arch::spin(n);
        0
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::run_el0;
    use guest::{read_sysreg, write_sysreg, Backend, Tolerance};
    /// PMUSERENR_EL0 bits.
    const EN: u64 = 1;
    const SW: u64 = 1 << 1;
    const CR: u64 = 1 << 2;
    const ER: u64 = 1 << 3;
    /// PMEVTYPER: P (not at EL1), U (not at EL0); INST_RETIRED.
    const P: u64 = 1 << 31;
    const U: u64 = 1 << 30;
    const INST_RETIRED: u64 = 0x08;
    const PMCR_E: u64 = 1;
    /// What hardware may add around a counted loop.
    const COUNT: Tolerance = Tolerance { hardware: 16 };

    if guest::arch::read_pmcr().is_err() {
        t.skip("arm-pmu-el0", "no PMU");
        return;
    }
    // KVM (and rustkvm) UNDEF; stock TCG traps to EL1 like bare hardware.
    let denied_ec = if guest::backend() == Some(Backend::Tcg) {
        0x18
    } else {
        0x00
    };
    type Probe = extern "C" fn(u64) -> u64;
    let access = |t: &mut Test, name: &str, userenr: u64, f: Probe, arg: u64, ok: bool| {
        write_sysreg!("pmuserenr_el0", userenr);
        let r = run_el0(f, arg);
        match (ok, r) {
            (true, r) => t.check(name, r.is_ok(), format_args!("{r:?}")),
            (false, Err(f)) => t.eq(name, f.ec(), denied_ec),
            (false, Ok(v)) => t.check(name, false, format_args!("allowed, read {v:#x}")),
        }
    };
    access(t, "el0.pmccntr.denied", 0, el0::pmccntr, 0, false);
    access(t, "el0.pmevcntr.denied", 0, el0::pmevcntr0, 0, false);
    access(t, "el0.pmswinc.denied", 0, el0::pmswinc, 0, false);
    access(t, "el0.pmcr.denied", 0, el0::pmcr, 0, false);
    access(t, "el0.pmccntr.cr", CR, el0::pmccntr, 0, true);
    access(t, "el0.pmevcntr.cr-is-not-er", CR, el0::pmevcntr0, 0, false);
    access(t, "el0.pmevcntr.er", ER, el0::pmevcntr0, 0, true);
    access(t, "el0.pmselr.er", ER, el0::pmselr, 0, true);
    access(t, "el0.pmccntr.er-is-not-cr", ER, el0::pmccntr, 0, false);
    access(t, "el0.pmswinc.sw", SW, el0::pmswinc, 0, true);
    access(t, "el0.pmcr.en", EN, el0::pmcr, 0, true);
    // An EL1 register: UNDEFINED at EL0 everywhere (EC 0).
    write_sysreg!("pmuserenr_el0", EN);
    let r = run_el0(el0::pmintenset, 0);
    t.eq("el0.pmintenset.never", r.map_err(|f| f.ec()), Err(0));
    access(t, "el0.pmuserenr.readable", 0, el0::pmuserenr, 0, true);
    write_sysreg!("pmuserenr_el0", CR);
    t.eq(
        "el0.pmuserenr.value",
        run_el0(el0::pmuserenr, 0).ok(),
        Some(CR),
    );
    write_sysreg!("pmuserenr_el0", 0);

    if read_sysreg!("pmceid0_el0") & (1 << INST_RETIRED) == 0 {
        t.skip("el0.filtering", "PMCEID0: no INST_RETIRED");
        return;
    }
    // Instructions counted around a run of spin(n) at EL0 with `filter`.
    let counted = |filter: u64, n: u64| {
        write_sysreg!("pmcntenclr_el0", 1);
        write_sysreg!("pmevtyper0_el0", filter | INST_RETIRED);
        write_sysreg!("pmevcntr0_el0", 0);
        write_sysreg!("pmcr_el0", PMCR_E);
        write_sysreg!("pmcntenset_el0", 1);
        let _ = run_el0(el0::spin, n);
        write_sysreg!("pmcntenclr_el0", 1);
        read_sysreg!("pmevcntr0_el0")
    };
    let (a, b) = (counted(P, 1), counted(P, 1001));
    t.count("p.el0-loop-counted", b.wrapping_sub(a), 2000, COUNT);
    let (a, b) = (counted(U, 1), counted(U, 1001));
    t.count("u.el0-loop-not-counted", b.wrapping_sub(a), 0, COUNT);
    let (a, b) = (counted(0, 1), counted(0, 1001));
    t.count("both.el0-loop-counted", b.wrapping_sub(a), 2000, COUNT);
}
