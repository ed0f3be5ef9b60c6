//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-test: kvm-vary=stalls,stall-events-count-no-stalls
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PMU advertises no INST_RETIRED/BR_RETIRED/MEM_ACCESS)
//!
//! KVM's PMUv3 for an AArch64 guest (Arm ARM D12; Linux
//! `arch/arm64/kvm/pmu-emul.c`, `sys_regs.c`), counted exactly without
//! -icount: PMCR_EL0.N and PMCEID advertising INST_RETIRED, BR_RETIRED,
//! MEM_ACCESS, SW_INCR and CHAIN; a known loop's instructions, branches and
//! memory accesses counted exactly at EL1 (the MSR that starts counting
//! counts, the one that stops it does not, as KVM counts what retires while
//! a counter counts); the EL filter (PMEVTYPER.P); SW_INCR into a CHAIN
//! pair; a 32-bit overflow setting PMOVSSET; PMCR_EL0.P resetting the event
//! counters. SKIPs where PMCEID does not advertise those events (TCG's PMU
//! without -icount).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::{read_sysreg, write_sysreg, Tolerance};
    /// What hardware (the `kvm` backend) may add to a count around the
    /// measured code; emulation counts exactly.
    const COUNT: Tolerance = Tolerance { hardware: 16 };

    /// PMCR_EL0: E, P, N (bits 15:11).
    const E: u64 = 1 << 0;
    const P: u64 = 1 << 1;
    /// PMEVTYPER: P excludes EL1.
    const EXCL_EL1: u64 = 1 << 31;
    /// Common events.
    const SW_INCR: u64 = 0x00;
    const INST_RETIRED: u64 = 0x08;
    const MEM_ACCESS: u64 = 0x13;
    const CHAIN: u64 = 0x1e;
    const BR_RETIRED: u64 = 0x21;
    const CPU_CYCLES: u64 = 0x11;
    const INST_SPEC: u64 = 0x1b;
    const STALL_FRONTEND: u64 = 0x23;
    const STALL_BACKEND: u64 = 0x24;

    let ceid0 = read_sysreg!("pmceid0_el0");
    let ceid1 = read_sysreg!("pmceid1_el0");
    let has = |e: u64| if e < 32 { ceid0 >> e & 1 } else { ceid1 >> (e - 32) & 1 } == 1;
    if !(has(INST_RETIRED) && has(BR_RETIRED) && has(MEM_ACCESS)) {
        t.skip(
            "arm-pmu",
            "PMCEID: no INST_RETIRED, BR_RETIRED and MEM_ACCESS",
        );
        return;
    }
    t.check(
        "pmceid.sw-incr-and-chain",
        has(SW_INCR) && has(CHAIN),
        format_args!("{ceid0:#x}"),
    );
    // kvm-unit-tests' pmu-event-introspection: the events PMUv3 requires,
    // and from PMUv3p1 (ID_AA64DFR0_EL1.PMUVer >= 4, not IMPDEF) the stall
    // events too.
    let pmuver = read_sysreg!("id_aa64dfr0_el1") >> 8 & 0xf;
    let v3p1 = (4..0xf).contains(&pmuver);
    t.check(
        "pmceid.required-events",
        has(SW_INCR)
            && has(CPU_CYCLES)
            && (has(INST_RETIRED) || has(INST_SPEC))
            && (!v3p1 || (has(STALL_FRONTEND) && has(STALL_BACKEND))),
        format_args!("PMUVer {pmuver}, PMCEID {ceid0:#x} {ceid1:#x}"),
    );
    let pmcr = read_sysreg!("pmcr_el0");
    t.eq("pmcr.n", (pmcr >> 11) & 0x1f, 6);
    t.eq("pmcr.imp-idcode", pmcr >> 16, 0);

    // Clean state: nothing enabled, no overflow, no interrupt.
    guest::arch::pmu_clear();
    write_sysreg!("pmcr_el0", E);

    // Counters 0..2: instructions, branches, memory accesses at EL1.
    write_sysreg!("pmevtyper0_el0", INST_RETIRED);
    write_sysreg!("pmevtyper1_el0", BR_RETIRED);
    write_sysreg!("pmevtyper2_el0", MEM_ACCESS);
    let mut slot = 0u64;
    for n in [1u64, 1000, 100_000] {
        write_sysreg!("pmevcntr0_el0", 0);
        write_sysreg!("pmevcntr1_el0", 0);
        write_sysreg!("pmevcntr2_el0", 0);
        // SAFETY: PMU enables at EL1, loads from a local.
        unsafe {
            asm!(
                "msr pmcntenset_el0, {mask}",   // starts counting: counts
                "mov {i}, {n}",
                "2:",
                "ldr {tmp}, [{addr}]",
                "subs {i}, {i}, #1",
                "b.ne 2b",
                "msr pmcntenclr_el0, {mask}",   // stops: does not count
                mask = in(reg) 0b111u64,
                n = in(reg) n,
                addr = in(reg) &raw mut slot,
                i = out(reg) _,
                tmp = out(reg) _,
                options(nostack),
            );
        }
        let (insns, branches, mem) = (
            read_sysreg!("pmevcntr0_el0"),
            read_sysreg!("pmevcntr1_el0"),
            read_sysreg!("pmevcntr2_el0"),
        );
        t.count("loop.instructions", insns, 3 * n + 2, COUNT);
        t.count("loop.branches", branches, n, COUNT);
        t.count("loop.mem-access", mem, n, COUNT);
    }

    // P excludes EL1: a counter filtered out of EL1 counts nothing here.
    write_sysreg!("pmevtyper3_el0", EXCL_EL1 | INST_RETIRED);
    write_sysreg!("pmevcntr3_el0", 0);
    write_sysreg!("pmcntenset_el0", 1 << 3);
    let mut x = 0u64;
    for i in 0..1000u64 {
        x = x.wrapping_add(i);
    }
    core::hint::black_box(x);
    write_sysreg!("pmcntenclr_el0", 1 << 3);
    t.eq("filter.el1-excluded", read_sysreg!("pmevcntr3_el0"), 0);

    // SW_INCR on counter 4 overflowing (32 bits) into counter 5 (CHAIN).
    write_sysreg!("pmevtyper4_el0", SW_INCR);
    write_sysreg!("pmevtyper5_el0", CHAIN);
    write_sysreg!("pmevcntr4_el0", 0xffff_fffe);
    write_sysreg!("pmevcntr5_el0", 0);
    write_sysreg!("pmcntenset_el0", 0b11 << 4);
    write_sysreg!("pmswinc_el0", 1 << 4);
    write_sysreg!("pmswinc_el0", 1 << 4);
    write_sysreg!("pmcntenclr_el0", 0b11 << 4);
    t.eq(
        "sw-incr.value",
        read_sysreg!("pmevcntr4_el0"),
        0x1_0000_0000,
    );
    t.eq("chain.took-the-overflow", read_sysreg!("pmevcntr5_el0"), 1);
    t.eq("pmovsset.counter4", read_sysreg!("pmovsset_el0"), 1 << 4);
    write_sysreg!("pmovsclr_el0", u64::MAX);

    // An instruction counter overflowing at 32 bits sets PMOVSSET (and,
    // PMUv3p5 counters being 64-bit, counts on past 2^32): 2 + 2 x 1000.
    write_sysreg!("pmevcntr0_el0", 0xffff_ff00);
    guest::arch::pmu_counted_loop(1, 1000);
    t.eq("overflow.pmovsset", read_sysreg!("pmovsset_el0") & 1, 1);
    t.eq(
        "overflow.counts-on",
        read_sysreg!("pmevcntr0_el0"),
        0xffff_ff00 + 2 + 2 * 1000,
    );
    // The stall events count: no stalls in emulation (hardware has some).
    write_sysreg!("pmevtyper3_el0", STALL_FRONTEND);
    write_sysreg!("pmevtyper4_el0", STALL_BACKEND);
    write_sysreg!("pmevcntr3_el0", 0);
    write_sysreg!("pmevcntr4_el0", 0);
    guest::arch::pmu_counted_loop(0b11000, 1000);
    let stalls = (read_sysreg!("pmevcntr3_el0"), read_sysreg!("pmevcntr4_el0"));
    t.measure("stalls", format_args!("{stalls:?}"));
    if guest::backend() != Some(guest::Backend::Kvm) {
        t.eq("stall-events-count-no-stalls", stalls, (0, 0));
    }
    // PMCR_EL0.P zeroes the event counters.
    write_sysreg!("pmcr_el0", E | P);
    t.eq("pmcr.p-resets", read_sysreg!("pmevcntr0_el0"), 0);
    t.eq("pmcr.p-reads-0", read_sysreg!("pmcr_el0") & P, 0);
    write_sysreg!("pmovsclr_el0", u64::MAX);
    write_sysreg!("pmcr_el0", 0);
}
