//! rustkvm-test: arch=aarch64 compare=off
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PSCI answers TRNG_VERSION with NOT_SUPPORTED)
//!
//! SMCCC TRNG 1.0 as KVM offers it by default (Linux seeds early entropy
//! from it): TRNG_VERSION 1.0, TRNG_FEATURES of its five functions SUCCESS
//! and of others NOT_SUPPORTED, KVM's UUID, RND64 and RND32 with KVM's
//! argument checks (at most 192/96 bits, else INVALID_PARAMETER with
//! x1..x3 zero; bits above the count asked for are zero; the upper half of
//! x1 is ignored) and output that does not repeat.
//! Spec: Arm DEN0098; Linux arch/arm64/kvm/trng.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-smccc-trng", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::hvc;

    const VERSION: u32 = 0x8400_0050;
    const FEATURES: u32 = 0x8400_0051;
    const GET_UUID: u32 = 0x8400_0052;
    const RND32: u32 = 0x8400_0053;
    const RND64: u32 = 0xc400_0053;
    const NOT_SUPPORTED: u64 = -1i64 as u64;
    const INVALID_PARAMETER: u64 = -2i64 as u64;

    let v = hvc(VERSION, [0; 3])[0];
    if v == NOT_SUPPORTED {
        t.skip("trng", "TRNG_VERSION: NOT_SUPPORTED");
        return;
    }
    t.eq("version-1.0", v, 0x1_0000);
    for (name, f) in [
        ("features.version", VERSION),
        ("features.features", FEATURES),
        ("features.uuid", GET_UUID),
        ("features.rnd32", RND32),
        ("features.rnd64", RND64),
    ] {
        t.eq(name, hvc(FEATURES, [u64::from(f), 0, 0])[0], 0);
    }
    t.eq(
        "features.unknown",
        hvc(FEATURES, [0x8400_0054, 0, 0])[0],
        NOT_SUPPORTED,
    );
    // 0d21e000-4384-11eb-8070-5244554e5a4c as four little-endian words.
    t.eq(
        "uuid",
        hvc(GET_UUID, [0; 3]),
        [0x00e0_210d, 0xeb11_8443, 0x4452_7080, 0x4c5a_4e55],
    );

    let a = hvc(RND64, [192, 0, 0]);
    let b = hvc(RND64, [192, 0, 0]);
    t.eq("rnd64.success", (a[0], b[0]), (0, 0));
    t.check(
        "rnd64.does-not-repeat",
        a[1..] != b[1..] && a[1..] != [0; 3],
        format_args!("{a:x?} then {b:x?}"),
    );
    let c = hvc(RND64, [65, 0, 0]);
    t.check(
        "rnd64.65-bits",
        c[0] == 0 && c[1] == 0 && c[2] <= 1,
        format_args!("{c:x?}"),
    );
    t.eq(
        "rnd64.193-bits-invalid",
        hvc(RND64, [193, 0, 0]),
        [INVALID_PARAMETER, 0, 0, 0],
    );
    let d = hvc(RND64, [0xffff_ffff_0000_0010, 0, 0]);
    t.check(
        "rnd64.w1-only",
        d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] <= 0xffff,
        format_args!("{d:x?}"),
    );
    let e = hvc(RND32, [96, 0, 0]);
    t.check(
        "rnd32.96-bits-in-w1-w3",
        e[0] == 0 && e[1..].iter().all(|w| *w <= 0xffff_ffff),
        format_args!("{e:x?}"),
    );
    let f = hvc(RND32, [40, 0, 0]);
    t.check(
        "rnd32.40-bits",
        f[0] == 0 && f[1] == 0 && f[2] <= 0xff,
        format_args!("{f:x?}"),
    );
    t.eq(
        "rnd32.97-bits-invalid",
        hvc(RND32, [97, 0, 0]),
        [INVALID_PARAMETER, 0, 0, 0],
    );
}
