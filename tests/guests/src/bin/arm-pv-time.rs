//! rustkvm-test: arch=aarch64 smp=2 compare=off vary=cpu0.stolen-permille,cpu1.st-base
//! rustkvm-expect: tcg=skip
//!   (stock TCG answers SMCCC 1.0: no PV time)
//!
//! SMCCC 1.1 and PV stolen time as KVM answers them, in the order Linux
//! probes them (`arch/arm64/kernel/paravirt.c`; the KVM selftest
//! `steal_time.c`'s arm64 path): PSCI_FEATURES(SMCCC_VERSION), SMCCC_VERSION,
//! SMCCC_ARCH_FEATURES(PV_TIME_FEATURES), PV_TIME_FEATURES(PV_TIME_ST), then
//! PV_TIME_ST per vCPU; unknown IDs and the 32-bit variants of the 64-bit
//! calls answer NOT_SUPPORTED; the structure is zeroed (revision and
//! attributes 0) and each vCPU has its own. Then both vCPUs spin for 500 ms
//! of counter time and vCPU 0 reports how much of it was stolen (the host
//! test expects about half when they share one host thread, about none
//! alone). SKIPs where SMCCC is 1.0 (plain TCG).
//! Spec: Arm DEN0028, DEN0057A; Linux Documentation/virt/kvm/arm/pvtime.rst,
//! arch/arm64/kvm/hypercalls.c, arch/arm64/kvm/pvtime.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pv-time", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
mod pv {
    use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use guest::arch::{self, hvc};
    pub use guest::arch::{stolen_time as stolen, PV_TIME_FEATURES, PV_TIME_ST};

    /// SMCCC_ARCH_FEATURES.
    pub const ARCH_FEATURES: u32 = 0x8000_0001;
    /// PSCI_FEATURES.
    pub const PSCI_FEATURES: u32 = 0x8400_000a;
    /// ARM_SMCCC_VENDOR_HYP_CALL_UID_FUNC_ID.
    pub const VENDOR_HYP_CALL_UID: u32 = 0x8600_ff01;
    /// KVM's UID in x0..x3 (ARM_SMCCC_VENDOR_HYP_UID_KVM_REG_0..3).
    pub const KVM_UID: [u64; 4] = [0xb66f_b428, 0xe911_c52e, 0x564b_caa9, 0x743a_004d];
    /// SMCCC_RET_NOT_SUPPORTED.
    pub const NOT_SUPPORTED: u64 = u64::MAX;

    /// vCPU 1's structure address, 0 until it called PV_TIME_ST.
    pub static CPU1_BASE: AtomicU64 = AtomicU64::new(0);
    /// Set by vCPU 0 when vCPU 1 may stop spinning.
    pub static DONE: AtomicBool = AtomicBool::new(false);

    /// One SMCCC call, x0 only.
    pub fn call(func: u32, arg: u64) -> u64 {
        hvc(func, [arg, 0, 0])[0]
    }

    /// Second vCPU: its own PV_TIME_ST, then spin until told to stop.
    pub fn secondary() {
        CPU1_BASE.store(call(PV_TIME_ST, 0), Ordering::Release);
        while !DONE.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
    }

    /// Spin for `ms` milliseconds of counter time; returns the ns elapsed.
    pub fn spin_ms(ms: u64) -> u64 {
        let (frq, c0) = (arch::cntfrq(), arch::cntvct());
        let ticks = frq * ms / 1000;
        let mut c = c0;
        while c.wrapping_sub(c0) < ticks {
            c = arch::cntvct();
        }
        c.wrapping_sub(c0) * 1_000_000_000 / frq
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use guest::arch::{self, hvc, SMCCC_VERSION};
    use pv::*;

    let version = call(SMCCC_VERSION, 0);
    if version != 0x1_0001 {
        t.skip("pv-time", "SMCCC is not 1.1 (plain TCG: 1.0, no PV time)");
        return;
    }
    t.eq(
        "psci-features-lists-smccc-version",
        call(PSCI_FEATURES, SMCCC_VERSION.into()),
        0,
    );
    t.eq(
        "arch-features-pv-time",
        call(ARCH_FEATURES, PV_TIME_FEATURES.into()),
        0,
    );
    t.eq(
        "arch-features-unknown",
        call(ARCH_FEATURES, 0x8000_1234),
        NOT_SUPPORTED,
    );
    // -cpu ...,kvm-steal-time=off: discovery stays (KVM's default firmware
    // bitmap) but no vCPU has a structure.
    if call(PV_TIME_FEATURES, PV_TIME_ST.into()) == NOT_SUPPORTED {
        t.measure("pv-time", format_args!("off"));
        t.eq("st-not-supported", call(PV_TIME_ST, 0), NOT_SUPPORTED);
        return;
    }
    t.measure("pv-time", format_args!("on"));
    t.eq(
        "pv-time-features-unknown",
        call(PV_TIME_FEATURES, 0xc500_0022),
        NOT_SUPPORTED,
    );
    t.eq("unknown-call", call(0xc500_0022, 0), NOT_SUPPORTED);
    t.eq(
        "pv-time-st-smc32-variant",
        call(PV_TIME_ST & !(1 << 30), 0),
        NOT_SUPPORTED,
    );
    t.eq("kvm-vendor-uid", hvc(VENDOR_HYP_CALL_UID, [0; 3]), KVM_UID);

    let base = call(PV_TIME_ST, 0);
    t.check(
        "st-base-64-byte-aligned",
        base != NOT_SUPPORTED && base.is_multiple_of(64),
        format_args!("{base:#x}"),
    );
    t.measure("cpu0.st-base", format_args!("{base:#x}"));
    if base == NOT_SUPPORTED {
        return;
    }
    // PV_TIME_ST (re)initialises the structure: junk is zeroed.
    let words = base as *mut u64;
    for i in 0..8 {
        // SAFETY: the 64-byte structure PV_TIME_ST handed us (MMU off).
        unsafe { words.add(i).write_volatile(u64::MAX) };
    }
    t.eq("st-again-same-base", call(PV_TIME_ST, 0), base);
    // SAFETY: as above.
    let head = unsafe { [words.read_volatile(), words.add(1).read_volatile()] };
    t.eq("revision-attributes-stolen-zeroed", head, [0, 0]);

    let alone = arch::cpu_on(1, secondary) != 0;
    t.measure("alone", format_args!("{}", u8::from(alone)));
    if !alone {
        let mut b1 = 0;
        for _ in 0..100_000_000u64 {
            b1 = CPU1_BASE.load(Ordering::Acquire);
            if b1 != 0 {
                break;
            }
            core::hint::spin_loop();
        }
        t.eq("cpu1-has-the-next-structure", b1, base + 64);
        t.measure("cpu1.st-base", format_args!("{b1:#x}"));
    }
    let s0 = stolen(base);
    let ns = spin_ms(500);
    let s1 = stolen(base);
    DONE.store(true, Ordering::Release);
    t.check(
        "stolen-time-monotonic",
        s1 >= s0,
        format_args!("{s0} -> {s1}"),
    );
    t.measure(
        "cpu0.stolen-permille",
        format_args!("{}", s1.saturating_sub(s0) * 1000 / ns.max(1)),
    );
}
