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
    // What each function answers, asked once before the timed loops: every
    // timed call must give the same answer (a call that went elsewhere, or
    // an answer that changed, would time something else).
    let want = [hvc(SMCCC_VERSION, [0; 3])[0], hvc(PSCI_VERSION, [0; 3])[0]];
    let mut wrong = [0u64; 2];
    let mut per_call_ns = |which: usize, func: u32| {
        let c0 = arch::cntvct();
        for _ in 0..N {
            let got = core::hint::black_box(hvc(func, [0; 3]))[0];
            wrong[which] += u64::from(got != want[which]);
        }
        (arch::cntvct() - c0) * 1_000_000_000 / frq / N
    };
    let (mut smccc, mut psci) = (u64::MAX, u64::MAX);
    for _ in 0..ROUNDS {
        smccc = smccc.min(per_call_ns(0, SMCCC_VERSION));
        psci = psci.min(per_call_ns(1, PSCI_VERSION));
    }
    t.measure("ns.smccc-version", format_args!("{smccc}"));
    t.measure("ns.psci-version", format_args!("{psci}"));
    t.eq("smccc-version-answers-alike", wrong[0], 0);
    t.eq("psci-version-answers-alike", wrong[1], 0);
    // PSCI 1.x under every backend (QEMU's PSCI code answers it).
    t.check(
        "psci-1.x",
        want[1] >> 16 == 1,
        format_args!("PSCI_VERSION = {:#x}", want[1]),
    );
    // SMCCC 1.1 is rustkvm's (and KVM's) answer; stock TCG's PSCI code
    // answers NOT_SUPPORTED (SMCCC 1.0): that is what the loop timed there.
    match guest::backend() {
        Some(guest::Backend::Tcg) => t.eq("smccc-not-supported", want[0] as i32, -1),
        _ => t.eq("smccc-1.1", want[0], 0x1_0001),
    }
}
