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
    use guest::arch::{rdmsr, wrmsr};
    use guest::x86_pmu::{lbr_format, DEBUGCTL, DEBUGCTL_LBR, LBR_FROM, LBR_SELECT, LBR_TOS};

    if lbr_format() == 0 {
        t.skip("x86-lbr-workload", "no PERF_CAPABILITIES.LBR_FMT");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("LBR MSR");
    w(LBR_SELECT, 0);
    w(LBR_FROM, 0);
    w(LBR_TOS, 0);
    w(DEBUGCTL, DEBUGCTL_LBR);
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
