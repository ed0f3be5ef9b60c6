//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel compare=off vary=tsc-khz
//! rustkvm-expect: tcg=skip kvm=skip
//!   (stock TCG's max model has basic level 0xd and no 0x40000010; QEMU
//!   fills no CPUID 0x15 under KVM)
//!
//! The TSC rate in CPUID, as a guest without kvmclock reads it: Intel's
//! leaves 0x15 (TSC/crystal ratio EBX/EAX, crystal Hz in ECX) and 0x16
//! (MHz), which Linux's `native_calibrate_tsc` and perf's
//! `#system_tsc_freq` read (SDM vol. 2A, CPUID leaves 15H/16H), and
//! 0x40000010 (TSC and APIC bus kHz), which QEMU adds under KVM with
//! `vmware-cpuid-freq` where the TSC is invariant or its rate given
//! (`kvm_arch_init_vcpu`). The oracle is the local APIC timer (QEMU's C
//! model, counting the 1 GHz APIC bus that 0x15 calls the crystal): the
//! TSC ticks over a stretch of APIC-timer counts equal the counts times
//! 0x15's ratio, the stretch's ends bracketed by TSC reads on either side
//! of each TMCCT read, so no host stall can fake or spoil the match.
//! SKIPs without the leaves (stock TCG, KVM). An AMD model (`-cpu max`)
//! has no 0x15/0x16 and is checked on 0x40000010 alone.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-tsc-leaves", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, lapic_reg, rdtsc, set_lapic_reg};
    const LVT_TIMER: u32 = 0x320;
    const TMICT: u32 = 0x380;
    const TMCCT: u32 = 0x390;
    const TDCR: u32 = 0x3e0;
    /// LVT mask bit: the timer counts without interrupting.
    const LVT_MASKED: u32 = 1 << 16;
    /// TDCR divide-by-1: one count per APIC bus cycle.
    const DIVIDE_BY_1: u32 = 0xb;
    /// APIC-timer counts the measured stretch lasts at least (10 ms).
    const STRETCH: u64 = 10_000_000;

    let level = arch::cpuid(0, 0)[0];
    let vendor = arch::cpuid_string([
        arch::cpuid(0, 0)[1],
        arch::cpuid(0, 0)[3],
        arch::cpuid(0, 0)[2],
    ]);
    let intel = &vendor == b"GenuineIntel";
    let hv_max = arch::cpuid(0x4000_0000, 0)[0];
    let has_hv_leaf = arch::has_kvm_signature() && hv_max >= 0x4000_0010;
    let leaf15 = arch::cpuid(0x15, 0);
    if intel && (level < 0x15 || leaf15[0] == 0 || leaf15[1] == 0) {
        t.skip(
            "x86-tsc-leaves",
            "no TSC/crystal ratio in CPUID 0x15 on an Intel model",
        );
        return;
    }
    if !intel && !has_hv_leaf {
        t.skip("x86-tsc-leaves", "no CPUID 0x40000010 on an AMD model");
        return;
    }

    // The APIC timer, masked, one-shot, counting down from 2^32 - 1.
    set_lapic_reg(LVT_TIMER, LVT_MASKED);
    set_lapic_reg(TDCR, DIVIDE_BY_1);
    set_lapic_reg(TMICT, u32::MAX);
    // One TMCCT read between two TSC reads; the narrowest of a few tries.
    let sample = || {
        let mut best = (0u64, 0u64, u64::MAX);
        for _ in 0..16 {
            let a = rdtsc();
            let c = u64::from(lapic_reg(TMCCT));
            let b = rdtsc();
            if b - a < best.2 - best.0 {
                best = (a, c, b);
            }
        }
        best
    };
    let (a0, c0, b0) = sample();
    let (mut a1, mut c1, mut b1) = sample();
    while c0 - c1 < STRETCH {
        core::hint::spin_loop();
        (a1, c1, b1) = sample();
    }
    set_lapic_reg(TMICT, 0);
    let counts = c0 - c1;
    // The TSC moved at least a1 - b0 and at most b1 - a0 over `counts`.
    let (lo, hi) = (a1 - b0, b1 - a0);
    let within = |name: &str, t: &mut Test, num: u64, den: u64| {
        // counts * num / den, give or take the ticks of one APIC count
        // and a tick of rounding at each end.
        let want = (u128::from(counts) * u128::from(num) / u128::from(den)) as u64;
        let slack = num.div_ceil(den) + 2;
        t.check(
            name,
            lo <= want + slack && want <= hi + slack,
            format_args!(
                "{counts} APIC counts * {num}/{den} = {want} TSC ticks, \
                 measured between {lo} and {hi}"
            ),
        );
    };

    let mut khz = None;
    if intel {
        t.check(
            "level-holds-the-tsc-leaves",
            level >= 0x16,
            format_args!("CPUID.0:EAX {level:#x}"),
        );
        let [den, num, crystal, edx] = leaf15;
        t.eq("crystal-is-the-apic-bus", crystal, 1_000_000_000);
        t.eq("leaf-15-edx-reserved", edx, 0);
        // TSC ticks per APIC count = crystal Hz * num / den / 10^9.
        within(
            "tsc-runs-at-0x15s-ratio",
            t,
            u64::from(crystal) * u64::from(num),
            u64::from(den) * 1_000_000_000,
        );
        let k = u64::from(crystal) / 1000 * u64::from(num) / u64::from(den);
        let [base, max, bus, edx16] = arch::cpuid(0x16, 0);
        t.eq("leaf-16-base-mhz", u64::from(base & 0xffff), k / 1000);
        t.eq("leaf-16-max-mhz", u64::from(max & 0xffff), k / 1000);
        t.eq("leaf-16-bus-mhz", bus & 0xffff, 1000);
        t.eq("leaf-16-edx-reserved", edx16, 0);
        khz = Some(k);
    } else {
        t.eq("no-leaf-15-on-amd", level < 0x15, true);
    }
    if has_hv_leaf {
        let [tsc_khz, bus_khz, ecx, edx] = arch::cpuid(0x4000_0010, 0);
        t.eq("hv-leaf-apic-bus-khz", bus_khz, 1_000_000);
        t.eq("hv-leaf-ecx-edx-reserved", (ecx, edx), (0, 0));
        within(
            "tsc-runs-at-0x40000010s-rate",
            t,
            u64::from(tsc_khz),
            u64::from(bus_khz),
        );
        if let Some(k) = khz {
            t.eq("hv-leaf-agrees-with-0x15", u64::from(tsc_khz), k);
        }
        khz = Some(u64::from(tsc_khz));
    } else {
        // QEMU offers the leaf with an invariant TSC (or a rate given).
        let invtsc = arch::cpuid(0x8000_0007, 0)[3] & (1 << 8) != 0;
        t.check(
            "hv-leaf-offered-with-invtsc",
            !invtsc,
            format_args!("CPUID 0x40000000 EAX {hv_max:#x} with invtsc"),
        );
    }
    if let Some(k) = khz {
        t.measure("tsc-khz", format_args!("{k}"));
    }
}
