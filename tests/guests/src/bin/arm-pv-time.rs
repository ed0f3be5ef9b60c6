//! rustkvm-test: arch=aarch64 smp=2 compare=off vary=cpu0.stolen-permille,cpu1.st-base,alone.stolen-ns,alone.elapsed-ns,alone.own-ns,alone.clean,shared.stolen-ns,shared.elapsed-ns,shared.own-ns,shared.clean,shared.cpu1-insns
//! rustkvm-expect: tcg=skip
//!   (stock TCG answers SMCCC 1.0: no PV time)
//!
//! SMCCC 1.1 and PV stolen time as KVM answers them, in the order Linux
//! probes them (`arch/arm64/kernel/paravirt.c`; the KVM selftest
//! `steal_time.c`'s arm64 path): PSCI_FEATURES(SMCCC_VERSION), SMCCC_VERSION,
//! SMCCC_ARCH_FEATURES(PV_TIME_FEATURES), PV_TIME_FEATURES(PV_TIME_ST), then
//! PV_TIME_ST per vCPU; unknown IDs and the 32-bit variants of the 64-bit
//! calls answer NOT_SUPPORTED; the structure is zeroed (revision and
//! attributes 0) and each vCPU has its own. PV time must be on unless the
//! host declares it off (fw_cfg `opt/rustkvm/pv-time` = `off`, beside
//! `-cpu max,kvm-steal-time=off`): a board that stopped mapping it fails. Then vCPU 0 measures its stolen
//! time over a window of 2·10⁸ loop instructions (`guest::steal`), first
//! alone, then while vCPU 1 counts the instructions it executes: the host
//! test (tests/tests/guests.rs) checks under `-icount` that the stolen time
//! is exactly what vCPU 1 executed meanwhile (0 alone), and, as a host
//! statistic (scripts/soak-guests.sh), about half of the window when both
//! share one host thread and about none alone. SKIPs where SMCCC is 1.0
//! (plain TCG).
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
    use core::sync::atomic::{AtomicU64, Ordering};
    use guest::arch::{self, hvc};
    use guest::steal::{self, Window};

    /// SMCCC_ARCH_FEATURES.
    pub const ARCH_FEATURES: u32 = 0x8000_0001;
    /// PSCI_FEATURES.
    pub const PSCI_FEATURES: u32 = 0x8400_000a;
    /// ARM_SMCCC_HV_PV_TIME_FEATURES.
    pub const PV_TIME_FEATURES: u32 = 0xc500_0020;
    /// ARM_SMCCC_HV_PV_TIME_ST.
    pub const PV_TIME_ST: u32 = 0xc500_0021;
    /// ARM_SMCCC_VENDOR_HYP_CALL_UID_FUNC_ID.
    pub const VENDOR_HYP_CALL_UID: u32 = 0x8600_ff01;
    /// KVM's UID in x0..x3 (ARM_SMCCC_VENDOR_HYP_UID_KVM_REG_0..3).
    pub const KVM_UID: [u64; 4] = [0xb66f_b428, 0xe911_c52e, 0x564b_caa9, 0x743a_004d];
    /// SMCCC_RET_NOT_SUPPORTED.
    pub const NOT_SUPPORTED: u64 = u64::MAX;
    /// A window's loop: 2·10⁸ instructions (200 ms of VM time under
    /// `-icount shift=0`).
    pub const WINDOW_N: u64 = 100_000_000;
    /// Windows tried until one is clean (`guest::steal`).
    pub const TRIES: u32 = 4;

    /// vCPU 1's structure address, 0 until it called PV_TIME_ST.
    pub static CPU1_BASE: AtomicU64 = AtomicU64::new(0);
    /// vCPU 1's progress (`guest::steal::count_progress`).
    pub static PROGRESS: AtomicU64 = AtomicU64::new(0);
    /// Set by vCPU 0 when vCPU 1 may stop counting.
    pub static DONE: AtomicU64 = AtomicU64::new(0);

    /// One SMCCC call, x0 only.
    pub fn call(func: u32, arg: u64) -> u64 {
        hvc(func, [arg, 0, 0])[0]
    }

    /// Second vCPU: its own PV_TIME_ST, then count until told to stop.
    pub fn secondary() {
        CPU1_BASE.store(call(PV_TIME_ST, 0), Ordering::Release);
        steal::count_progress(&PROGRESS, &DONE);
    }

    /// A clean window of vCPU 0 (structure at `base`).
    pub fn window(base: u64) -> Window {
        // SAFETY: `stolen_time` of the 64-byte structure PV_TIME_ST handed
        // us (RAM, identity-mapped: the MMU is off).
        unsafe { steal::clean_window(WINDOW_N, (base + 8) as *const u64, &PROGRESS, TRIES) }
    }

    /// Nanoseconds of `ticks` of the counter.
    pub fn ns(ticks: u64) -> u64 {
        (u128::from(ticks) * 1_000_000_000 / u128::from(arch::cntfrq().max(1))) as u64
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
    // bitmap) but no vCPU has a structure. PV time is on by default, as
    // under KVM: the host says when it turned it off (fw_cfg
    // opt/rustkvm/pv-time = "off"), and anything else is a failure.
    let mut said = [0u8; 8];
    let off_expected =
        guest::fw_cfg_file("opt/rustkvm/pv-time", &mut said).is_some_and(|n| &said[..n] == b"off");
    if call(PV_TIME_FEATURES, PV_TIME_ST.into()) == NOT_SUPPORTED {
        t.measure("pv-time", format_args!("off"));
        t.check(
            "pv-time-as-declared",
            off_expected,
            format_args!("PV_TIME_ST is NOT_SUPPORTED, but the host did not turn PV time off"),
        );
        t.eq("st-not-supported", call(PV_TIME_ST, 0), NOT_SUPPORTED);
        return;
    }
    t.measure("pv-time", format_args!("on"));
    t.check(
        "pv-time-as-declared",
        !off_expected,
        format_args!("the host turned PV time off, but PV_TIME_ST is supported"),
    );
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
    let before = arch::cntvct();
    t.eq("st-again-same-base", call(PV_TIME_ST, 0), base);
    // SAFETY: as above.
    let head = unsafe { [words.read_volatile(), words.add(1).read_volatile()] };
    let since = ns(arch::cntvct().wrapping_sub(before));
    t.eq("revision-attributes-zeroed", head[0], 0);
    // Emulation: nothing stolen yet. KVM counts from the call on
    // (`kvm_init_stolen_time`), and a host that preempts the vCPU thread in
    // between (a loaded nested L1: measured 0.4 ms) has stolen time to add
    // at its next load: no more than has passed.
    let most = if guest::backend() == Some(guest::Backend::Kvm) {
        since
    } else {
        0
    };
    t.check(
        "stolen-counted-from-the-call",
        head[1] <= most,
        format_args!("{} ns stolen {since} ns after the call", head[1]),
    );

    // Alone: vCPU 1 is not on yet.
    let first = window(base);
    report(
        t,
        [
            "alone.stolen-ns",
            "alone.elapsed-ns",
            "alone.own-ns",
            "alone.clean",
        ],
        &first,
    );
    let alone = arch::cpu_on(1, secondary) != 0;
    t.measure("alone", format_args!("{}", u8::from(alone)));
    let mut last = first;
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
        // vCPU 1 is counting before the window starts.
        let counting = (0..1_000_000_000u64).any(|_| PROGRESS.load(Ordering::Relaxed) != 0);
        t.check("cpu1-counts", counting, format_args!("no progress"));
        last = window(base);
        report(
            t,
            [
                "shared.stolen-ns",
                "shared.elapsed-ns",
                "shared.own-ns",
                "shared.clean",
            ],
            &last,
        );
        t.measure(
            "shared.cpu1-insns",
            format_args!("{}", last.progress() * guest::steal::PROGRESS_INSNS),
        );
    }
    DONE.store(1, Ordering::Release);
    let seen = [
        first.stolen_before,
        first.stolen_after,
        last.stolen_before,
        last.stolen_after,
    ];
    let seen = if alone { &seen[..2] } else { &seen[..] };
    t.check(
        "stolen-time-monotonic",
        seen.windows(2).all(|w| w[0] <= w[1]),
        format_args!("{seen:?}"),
    );
    t.measure(
        "cpu0.stolen-permille",
        format_args!("{}", last.stolen() * 1000 / ns(last.ticks()).max(1)),
    );
}

/// Measures of one window (`guest::steal`): its stolen time, elapsed
/// time, own time (elapsed minus stolen) in ns, and whether it is clean,
/// under the four `keys`.
#[cfg(target_arch = "aarch64")]
fn report(t: &mut Test, keys: [&str; 4], w: &guest::steal::Window) {
    let elapsed = pv::ns(w.ticks());
    t.measure(keys[0], format_args!("{}", w.stolen()));
    t.measure(keys[1], format_args!("{elapsed}"));
    t.measure(
        keys[2],
        format_args!("{}", elapsed.wrapping_sub(w.stolen()) as i64),
    );
    t.measure(keys[3], format_args!("{}", u8::from(w.clean())));
}
