//! rustkvm-test: arch=aarch64 matrix=off timeout=120 needs=pmu
//!
//! scripts/bench-arm-pmu.sh's counting case: the same workload as
//! plugin-workload (`guest::workload`) with PMUv3 counting throughout at
//! EL0 and EL1: instructions and branches on event counters 0 and 1 and
//! the cycle counter (what `perf stat` counts by default; counter 2 is
//! programmed for memory accesses but left disabled). Prints the checksum
//! and the counts.
//! SKIPs where PMCEID does not advertise the events. Not part of the
//! matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-workload", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::{read_sysreg, write_sysreg};

    let ceid0 = read_sysreg!("pmceid0_el0");
    let ceid1 = read_sysreg!("pmceid1_el0");
    // INST_RETIRED (0x08), MEM_ACCESS (0x13), BR_RETIRED (0x21).
    if ceid0 & (1 << 0x08 | 1 << 0x13) != (1 << 0x08 | 1 << 0x13) || ceid1 & 2 == 0 {
        t.skip("arm-pmu-workload", "PMCEID: the events are not counted");
        return;
    }
    guest::arch::pmu_clear();
    write_sysreg!("pmevtyper0_el0", 0x08);
    write_sysreg!("pmevtyper1_el0", 0x21);
    write_sysreg!("pmevtyper2_el0", 0x13);
    write_sysreg!("pmccfiltr_el0", 0);
    write_sysreg!("pmcr_el0", 1 | 1 << 1 | 1 << 2); // E, reset all counters
    write_sysreg!("pmcntenset_el0", 0b11 | 1 << 31);
    let sum = guest::workload::run(10_000);
    write_sysreg!("pmcntenclr_el0", u64::MAX);
    t.measure("checksum", format_args!("{sum:#x}"));
    t.measure(
        "instructions",
        format_args!("{}", read_sysreg!("pmevcntr0_el0")),
    );
    t.measure(
        "branches",
        format_args!("{}", read_sysreg!("pmevcntr1_el0")),
    );
    t.measure(
        "mem-accesses",
        format_args!("{}", read_sysreg!("pmevcntr2_el0")),
    );
    t.measure("cycles", format_args!("{}", read_sysreg!("pmccntr_el0")));
    t.check(
        "counted",
        read_sysreg!("pmevcntr0_el0") > read_sysreg!("pmevcntr1_el0"),
        format_args!(""),
    );
}
