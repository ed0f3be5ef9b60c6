//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on matrix=off timeout=120
//!
//! scripts/bench-pmu.sh's counting case: the same workload as
//! plugin-workload (`guest::workload`) with the PMU counting throughout —
//! 2 GP counters (instructions and branches retired) and the 3 fixed
//! counters, at every CPL. Prints the checksum and the counts. SKIPs
//! without a PMU. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-workload", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, rdmsr, wrmsr};

    /// EN | OS | USR.
    const SEL: u64 = 1 << 22 | 1 << 17 | 1 << 16;
    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-pmu-workload", "CPUID 0xA: no architectural PMU");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("PMU MSR");
    w(0x38f, 0); // GLOBAL_CTRL (the GP enables are set at reset)
    w(0x186, SEL | 0xc0); // PERFEVTSEL0: instructions retired
    w(0x187, SEL | 0xc4); // PERFEVTSEL1: branches retired
    w(0x38d, 0x333); // FIXED_CTR_CTRL: all three, OS and USR
    w(0x38f, 0b11 | 0b111 << 32); // GLOBAL_CTRL
    let sum = guest::workload::run(10_000);
    w(0x38f, 0);
    let r = |i| rdmsr(i).expect("PMU MSR");
    t.measure("checksum", format_args!("{sum:#x}"));
    t.measure("instructions", format_args!("{}", r(0xc1)));
    t.measure("branches", format_args!("{}", r(0xc2)));
    t.measure("cycles", format_args!("{}", r(0x30a)));
    t.check(
        "counted",
        r(0xc1) > 0 && r(0xc1) == r(0x309),
        format_args!("{} {}", r(0xc1), r(0x309)),
    );
}
