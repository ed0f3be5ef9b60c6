//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on matrix=off timeout=120 needs=pmu,lbr
//!
//! scripts/bench-pmu.sh's LBR case: the same workload as plugin-workload
//! (`guest::workload`) with LBR recording every taken branch throughout
//! (IA32_DEBUGCTL.LBR, LBR_SELECT 0). Prints the checksum and the stack's
//! TOS. SKIPs without LBR. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-lbr-workload", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, rdmsr, wrmsr};

    const DEBUGCTL: u32 = 0x1d9;
    const LBR_SELECT: u32 = 0x1c8;
    const LBR_TOS: u32 = 0x1c9;
    const LBR_FROM: u32 = 0x680;
    let pdcm = arch::cpuid(1, 0)[2] & 1 << 15 != 0;
    if !pdcm || rdmsr(0x345).unwrap_or(0) & 0x3f == 0 {
        t.skip("x86-lbr-workload", "no PERF_CAPABILITIES.LBR_FMT");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("LBR MSR");
    w(LBR_SELECT, 0);
    w(LBR_FROM, 0);
    w(LBR_TOS, 0);
    w(DEBUGCTL, 1);
    let sum = guest::workload::run(10_000);
    w(DEBUGCTL, 0);
    t.measure("checksum", format_args!("{sum:#x}"));
    let tos = rdmsr(LBR_TOS).expect("LBR MSR");
    t.measure("tos", format_args!("{tos}"));
    t.check(
        "recorded",
        rdmsr(LBR_FROM + tos as u32).is_ok_and(|f| f != 0),
        format_args!("TOS {tos}: no record"),
    );
}
