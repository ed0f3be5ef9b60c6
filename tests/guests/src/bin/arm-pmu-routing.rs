//! rustkvm-test: arch=aarch64 vary=pmcr.imp_idcode
//!
//! Touches the AArch64 PMU system registers rustkvm routes into Rust
//! (PMCR, PMSELR/PMXEVTYPER/PMXEVCNTR, PMEVTYPER0/PMEVCNTR0, PMCNTENSET/CLR,
//! PMINTENSET/CLR, PMOVSSET/CLR, PMUSERENR, PMCCFILTR, PMCCNTR) and records
//! what each read returns. With no rustkvm feature enabled every answer must
//! be TCG's (the runner compares rustkvm with tcg line for line).
//! Register encodings: Arm ARM D24.5 (PMU registers).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-routing", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::{read_sysreg, write_sysreg};

    /// PMCR_EL0.N, number of event counters, bits [15:11].
    const PMCR_N_SHIFT: u64 = 11;
    /// PMCR_EL0.E, enable.
    const PMCR_E: u64 = 1 << 0;
    /// PMCR_EL0.C, cycle counter reset.
    const PMCR_C: u64 = 1 << 2;
    /// PMCNTENSET bit of the cycle counter.
    const CYCLE_COUNTER: u64 = 1 << 31;
    /// Event SW_INCR (Arm ARM D17.11 common events), used as a harmless type.
    const EVENT_SW_INCR: u64 = 0x00;
    /// Event INST_RETIRED.
    const EVENT_INST_RETIRED: u64 = 0x08;

    let pmcr = read_sysreg!("pmcr_el0");
    let n = (pmcr >> PMCR_N_SHIFT) & 0x1f;
    t.measure("pmcr.n", format_args!("{n}"));
    t.measure("pmcr.imp_idcode", format_args!("{:#x}", pmcr >> 16));
    t.check(
        "pmu-has-counters",
        n >= 1,
        format_args!("PMCR_EL0 = {pmcr:#x}"),
    );

    write_sysreg!("pmselr_el0", 0);
    write_sysreg!("pmxevtyper_el0", EVENT_INST_RETIRED);
    let via_sel = read_sysreg!("pmxevtyper_el0") & 0xffff;
    let direct = read_sysreg!("pmevtyper0_el0") & 0xffff;
    t.eq("pmxevtyper-is-pmevtyper0", via_sel, direct);
    t.measure("pmevtyper0.event", format_args!("{direct:#x}"));
    write_sysreg!("pmevtyper0_el0", EVENT_SW_INCR);
    t.eq(
        "pmevtyper0-write",
        read_sysreg!("pmevtyper0_el0") & 0xffff,
        EVENT_SW_INCR,
    );

    write_sysreg!("pmevcntr0_el0", 0x1234);
    t.eq(
        "pmevcntr0-write-read",
        read_sysreg!("pmevcntr0_el0"),
        0x1234,
    );
    write_sysreg!("pmxevcntr_el0", 7);
    t.eq("pmxevcntr-is-pmevcntr0", read_sysreg!("pmevcntr0_el0"), 7);

    write_sysreg!("pmintenset_el1", 1);
    t.eq("pmintenset", read_sysreg!("pmintenset_el1") & 1, 1);
    write_sysreg!("pmintenclr_el1", 1);
    t.eq("pmintenclr", read_sysreg!("pmintenset_el1") & 1, 0);

    write_sysreg!("pmovsset_el0", 1);
    t.eq("pmovsset", read_sysreg!("pmovsclr_el0") & 1, 1);
    write_sysreg!("pmovsclr_el0", 1);
    t.eq("pmovsclr", read_sysreg!("pmovsclr_el0") & 1, 0);

    write_sysreg!("pmuserenr_el0", 1);
    t.eq("pmuserenr", read_sysreg!("pmuserenr_el0") & 1, 1);
    write_sysreg!("pmuserenr_el0", 0);

    write_sysreg!("pmccfiltr_el0", 0);
    write_sysreg!("pmcntenset_el0", CYCLE_COUNTER);
    t.eq(
        "pmcntenset-cycle",
        read_sysreg!("pmcntenset_el0") & CYCLE_COUNTER,
        CYCLE_COUNTER,
    );
    write_sysreg!("pmcr_el0", pmcr | PMCR_E | PMCR_C);
    let c0 = read_sysreg!("pmccntr_el0");
    let mut x = 0u64;
    for i in 0..10_000u64 {
        x = x.wrapping_add(i);
    }
    core::hint::black_box(x);
    let c1 = read_sysreg!("pmccntr_el0");
    t.check(
        "cycle-counter-advances",
        c1 > c0,
        format_args!("{c0} then {c1}"),
    );
    // kvm-unit-tests' pmu-cycle-counter: back-to-back reads strictly
    // increase, and a handful of instructions between PMCR writes (C
    // resetting the counter) take a nonzero, 32-bit number of cycles.
    let mut increasing = true;
    for _ in 0..10 {
        let (a, b) = (read_sysreg!("pmccntr_el0"), read_sysreg!("pmccntr_el0"));
        increasing &= a < b;
    }
    t.eq("cycle-counter-back-to-back-increases", increasing, true);
    write_sysreg!("pmcr_el0", pmcr & !PMCR_E);
    write_sysreg!("pmccntr_el0", 0);
    // SAFETY: PMCR writes at EL1 around register arithmetic.
    unsafe {
        core::arch::asm!(
            "msr pmcr_el0, {on}",
            "isb",
            "mov {i}, #1",
            "2:",
            "subs {i}, {i}, #1",
            "b.ne 2b",
            "msr pmcr_el0, {off}",
            "isb",
            on = in(reg) pmcr | PMCR_E | PMCR_C,
            off = in(reg) pmcr & !PMCR_E,
            i = out(reg) _,
            options(nostack),
        );
    }
    let few = read_sysreg!("pmccntr_el0");
    t.check(
        "cycle-counter-counts-a-few-instructions",
        few != 0 && few >> 32 == 0,
        format_args!("{few} cycles"),
    );
    write_sysreg!("pmcr_el0", pmcr & !PMCR_E);
    write_sysreg!("pmcntenclr_el0", CYCLE_COUNTER);
    t.eq(
        "pmcntenclr-cycle",
        read_sysreg!("pmcntenset_el0") & CYCLE_COUNTER,
        0,
    );
}
