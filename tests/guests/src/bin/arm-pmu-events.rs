//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG counts no LD_RETIRED/ST_RETIRED/EXC_TAKEN)
//!
//! The rest of the exactly counted events: LD_RETIRED (0x06),
//! ST_RETIRED (0x07) and EXC_TAKEN (0x09), advertised in PMCEID0. A loop
//! of n iterations with one load, one store, one atomic add (both) and one
//! load pair counts exactly 3n loads, 2n stores and 4n memory accesses; a
//! run of EL0 code is one exception (its SVC) taken from EL0, a caught BRK
//! one taken from EL1, filtered by PMEVTYPER's P and U bits. SKIPs where
//! the events are not counted (stock TCG).
//! Spec: Arm ARM D13 (common events), K3 (PMU event descriptions).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-events", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
extern "C" fn nothing(x: u64) -> u64 {
    x
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch::run_el0;
    use guest::{read_sysreg, write_sysreg, Tolerance};
    const LD_RETIRED: u64 = 0x06;
    const ST_RETIRED: u64 = 0x07;
    const EXC_TAKEN: u64 = 0x09;
    const MEM_ACCESS: u64 = 0x13;
    /// PMEVTYPER: P (not at EL1), U (not at EL0).
    const P: u64 = 1 << 31;
    const U: u64 = 1 << 30;
    const E: u64 = 1;
    /// What hardware may add around the measured code.
    const COUNT: Tolerance = Tolerance { hardware: 16 };

    let ceid = read_sysreg!("pmceid0_el0");
    let wanted = (1 << LD_RETIRED) | (1 << ST_RETIRED) | (1 << EXC_TAKEN);
    if ceid & wanted != wanted {
        t.skip(
            "arm-pmu-events",
            "PMCEID0: no LD_RETIRED, ST_RETIRED, EXC_TAKEN",
        );
        return;
    }
    guest::arch::pmu_clear();
    write_sysreg!("pmcr_el0", E);
    write_sysreg!("pmevtyper0_el0", LD_RETIRED);
    write_sysreg!("pmevtyper1_el0", ST_RETIRED);
    write_sysreg!("pmevtyper2_el0", MEM_ACCESS);

    let mut slots = [0u64; 4];
    let mut counts = |n: u64| {
        for i in 0..3 {
            // PMEVCNTRn by PMSELR (the registers are not indexable).
            write_sysreg!("pmselr_el0", i);
            write_sysreg!("pmxevcntr_el0", 0);
        }
        // SAFETY: loads and stores to a local array; PMU enables at EL1.
        unsafe {
            asm!(
                "msr pmcntenset_el0, {mask}",
                "mov {i}, {n}",
                "2:",
                "ldr {a}, [{p}]",           // load
                "str {a}, [{p}, #8]",       // store
                ".arch_extension lse",
                "ldadd {one}, {b}, [{q}]",  // atomic: load and store
                "ldp {a}, {b}, [{p}]",      // load (one instruction)
                "subs {i}, {i}, #1",
                "b.ne 2b",
                "msr pmcntenclr_el0, {mask}",
                mask = in(reg) 0b111u64,
                n = in(reg) n,
                p = in(reg) slots.as_mut_ptr(),
                q = in(reg) slots.as_mut_ptr().wrapping_add(2),
                one = in(reg) 1u64,
                i = out(reg) _,
                a = out(reg) _,
                b = out(reg) _,
                options(nostack),
            );
        }
        (
            read_sysreg!("pmevcntr0_el0"),
            read_sysreg!("pmevcntr1_el0"),
            read_sysreg!("pmevcntr2_el0"),
        )
    };
    for n in [1u64, 1000, 100_000] {
        let (loads, stores, mem) = counts(n);
        t.count("loop.loads", loads, 3 * n, COUNT);
        t.count("loop.stores", stores, 2 * n, COUNT);
        t.count("loop.mem-access", mem, 4 * n, COUNT);
    }

    // Exceptions: counter 3 any EL, counter 4 only from EL0 (P), counter 5
    // only from EL1 (U).
    write_sysreg!("pmevtyper3_el0", EXC_TAKEN);
    write_sysreg!("pmevtyper4_el0", P | EXC_TAKEN);
    write_sysreg!("pmevtyper5_el0", U | EXC_TAKEN);
    write_sysreg!("pmevcntr3_el0", 0);
    write_sysreg!("pmevcntr4_el0", 0);
    write_sysreg!("pmevcntr5_el0", 0);
    write_sysreg!("pmcntenset_el0", 0b111000);
    for i in 0..5 {
        let r = run_el0(nothing, i);
        t.eq("el0-run", r.ok(), Some(i));
    }
    for _ in 0..3 {
        let f = guest::arch::brk();
        t.check("brk-caught", f.is_some(), format_args!("BRK did not trap"));
    }
    write_sysreg!("pmcntenclr_el0", 0b111000);
    t.count(
        "exc.all",
        read_sysreg!("pmevcntr3_el0"),
        8,
        Tolerance::EXACT,
    );
    t.count(
        "exc.from-el0",
        read_sysreg!("pmevcntr4_el0"),
        5,
        Tolerance::EXACT,
    );
    t.count(
        "exc.from-el1",
        read_sysreg!("pmevcntr5_el0"),
        3,
        Tolerance::EXACT,
    );
}
