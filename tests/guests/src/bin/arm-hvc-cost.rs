//! rustkvm-test: arch=aarch64 compare=off vary=ns.smccc-version,ns.psci-version
//!
//! The cost of an HVC round trip: counter nanoseconds per SMCCC_VERSION
//! (answered by rustkvm's SMCCC handler; plain TCG's PSCI code answers
//! NOT_SUPPORTED) and per PSCI_VERSION (QEMU's PSCI code under both, behind
//! rustkvm's routing point under rustkvm), interleaved in one run, best of
//! 5 rounds. scripts/bench-hvc.sh compares rustkvm's with stock tcg's.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-hvc-cost", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{self, hvc, PSCI_VERSION, SMCCC_VERSION};

    const ROUNDS: u64 = 5;
    const N: u64 = 20_000;

    let frq = arch::cntfrq();
    let per_call_ns = |func: u32| {
        let c0 = arch::cntvct();
        for _ in 0..N {
            core::hint::black_box(hvc(func, [0; 3]));
        }
        (arch::cntvct() - c0) * 1_000_000_000 / frq / N
    };
    let (mut smccc, mut psci) = (u64::MAX, u64::MAX);
    for _ in 0..ROUNDS {
        smccc = smccc.min(per_call_ns(SMCCC_VERSION));
        psci = psci.min(per_call_ns(PSCI_VERSION));
    }
    t.measure("ns.smccc-version", format_args!("{smccc}"));
    t.measure("ns.psci-version", format_args!("{psci}"));
    t.check(
        "measured",
        smccc > 0 && psci > 0,
        format_args!("{smccc} {psci}"),
    );
}
