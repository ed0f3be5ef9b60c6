//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on matrix=off timeout=120 needs=pmu
//!
//! scripts/bench-pmu.sh's counting case: the same workload as
//! plugin-workload (`guest::workload`) with the PMU counting throughout, at
//! every CPL. Intel: 2 GP counters (instructions and branches retired) and
//! the 3 fixed counters. AMD (`-cpu max,pmu=on`): 3 counters, instructions
//! (C0H), branches (C2H) and cycles (76H), enabled through PerfMonV2's
//! global control when the model has it. Prints the checksum and the
//! counts. SKIPs without a PMU. Not part of the matrix.
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
    let w = |i, v| wrmsr(i, v).expect("PMU MSR");
    let r = |i| rdmsr(i).expect("PMU MSR");
    let v = arch::cpuid(0, 0);
    let amd = &arch::cpuid_string([v[1], v[3], v[2]]) == b"AuthenticAMD";
    if amd {
        // PerfCtrExtCore's interleaved MSRs; PerfMonV2's global control.
        const CTL0: u32 = 0xc001_0200;
        const GLOBAL_CTL: u32 = 0xc000_0301;
        let ext = arch::cpuid(0x8000_0001, 0)[2] & (1 << 23) != 0;
        let v2 = arch::cpuid(0x8000_0000, 0)[0] >= 0x8000_0022
            && arch::cpuid(0x8000_0022, 0)[0] & 1 != 0;
        if !ext || wrmsr(CTL0, 0x76).is_err() || r(CTL0) != 0x76 {
            t.skip("x86-pmu-workload", "no AMD PMU with PerfCtrExtCore");
            return;
        }
        if v2 {
            w(GLOBAL_CTL, 0);
        }
        for (i, event) in [0xc0u64, 0xc2, 0x76].iter().enumerate() {
            w(CTL0 + 2 * i as u32 + 1, 0);
            w(CTL0 + 2 * i as u32, SEL | event);
        }
        if v2 {
            w(GLOBAL_CTL, 0b111);
        }
        let sum = guest::workload::run(10_000);
        if v2 {
            w(GLOBAL_CTL, 0);
        }
        for i in 0..3 {
            w(CTL0 + 2 * i, 0);
        }
        t.measure("checksum", format_args!("{sum:#x}"));
        t.measure("instructions", format_args!("{}", r(CTL0 + 1)));
        t.measure("branches", format_args!("{}", r(CTL0 + 3)));
        t.measure("cycles", format_args!("{}", r(CTL0 + 5)));
        t.check("counted", r(CTL0 + 1) > r(CTL0 + 3), format_args!(""));
        return;
    }
    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-pmu-workload", "CPUID 0xA: no architectural PMU");
        return;
    }
    w(0x38f, 0); // GLOBAL_CTRL (the GP enables are set at reset)
    w(0x186, SEL | 0xc0); // PERFEVTSEL0: instructions retired
    w(0x187, SEL | 0xc4); // PERFEVTSEL1: branches retired
    w(0x38d, 0x333); // FIXED_CTR_CTRL: all three, OS and USR
    w(0x38f, 0b11 | 0b111 << 32); // GLOBAL_CTRL
    let sum = guest::workload::run(10_000);
    w(0x38f, 0);
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
