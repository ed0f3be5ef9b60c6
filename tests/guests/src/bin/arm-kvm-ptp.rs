//! rustkvm-test: arch=aarch64 compare=off vary=ptp-real-ns
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PSCI answers the KVM vendor calls with NOT_SUPPORTED)
//!
//! KVM's PTP call as Linux's ptp_kvm uses it (drivers/ptp/ptp_kvm_arm.c):
//! the KVM vendor feature bitmap offers it (ARM_SMCCC_KVM_FUNC_PTP), and
//! ARM_SMCCC_VENDOR_HYP_KVM_PTP_FUNC_ID returns the host's real time and
//! the guest's virtual (x1 = 0) or physical (x1 = 1) counter read together,
//! each as two 32-bit halves; any other counter is NOT_SUPPORTED. The
//! oracle is the guest's own counter: the value returned lies between the
//! guest's reads of CNTVCT_EL0 (CNTPCT_EL0) just before and after the
//! call, and real time does not go back.
//! Spec: Linux arch/arm64/kvm/hypercalls.c (`kvm_ptp_get_time`),
//! include/linux/arm-smccc.h.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-kvm-ptp", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{cntpct, cntvct, hvc};

    const FEATURES: u32 = 0x8600_0000;
    const PTP: u32 = 0x8600_0001;
    const FUNC_PTP: u64 = 1 << 1;
    const NOT_SUPPORTED: u64 = -1i64 as u64;
    // 2020-01-01 and 2100-01-01 in ns since the Unix epoch: the host's real
    // time lies between.
    const Y2020: u64 = 1_577_836_800_000_000_000;
    const Y2100: u64 = 4_102_444_800_000_000_000;

    let f = hvc(FEATURES, [0; 3]);
    if f[0] == NOT_SUPPORTED {
        t.skip("ptp", "the KVM vendor features call: NOT_SUPPORTED");
        return;
    }
    t.check("features.ptp", f[0] & FUNC_PTP != 0, format_args!("{f:x?}"));

    let join = |hi: u64, lo: u64| hi << 32 | lo;
    let mut last_real = 0;
    for (names, counter, read) in [
        (
            [
                "virtual.halves",
                "virtual.counter-between-reads",
                "virtual.real-time",
            ],
            0u64,
            cntvct as fn() -> u64,
        ),
        (
            [
                "physical.halves",
                "physical.counter-between-reads",
                "physical.real-time",
            ],
            1,
            cntpct,
        ),
    ] {
        let before = read();
        let r = hvc(PTP, [counter, 0, 0]);
        let after = read();
        let (real, cycles) = (join(r[0], r[1]), join(r[2], r[3]));
        t.check(
            names[0],
            r.iter().all(|w| w >> 32 == 0),
            format_args!("{r:x?}"),
        );
        t.check(
            names[1],
            before <= cycles && cycles <= after,
            format_args!("{before} <= {cycles} <= {after}"),
        );
        t.check(
            names[2],
            (Y2020..Y2100).contains(&real) && real >= last_real,
            format_args!("{real} ns (previous {last_real})"),
        );
        last_real = real;
    }
    // The host test holds it to the host's own clock around the run.
    t.measure("ptp-real-ns", format_args!("{last_real}"));
    t.eq(
        "unknown-counter",
        hvc(PTP, [2, 0, 0]),
        [NOT_SUPPORTED, 0, 0, 0],
    );
    t.eq(
        "w1-upper-half-ignored",
        hvc(PTP, [0xffff_ffff_0000_0002, 0, 0])[0],
        NOT_SUPPORTED,
    );
}
