//! rustkvm-test: arch=x86_64 cpu=max compare=off
//! rustkvm-expect: tcg=skip
//!   (stock TCG's max model has no IA32_TSC_ADJUST)
//! rustkvm-kvm-probe: tsc-write guest writes to IA32_TSC and IA32_TSC_ADJUST do not move the TSC on this host's KVM (measured)
//!
//! A writable TSC and IA32_TSC_ADJUST with KVM's semantics (Intel SDM vol. 3
//! §18.17.3, Linux arch/x86/kvm/x86.c `kvm_set_msr_common`): RDMSR IA32_TSC
//! agrees with RDTSC; writing IA32_TSC moves the TSC there and IA32_TSC_ADJUST
//! by the same amount; writing IA32_TSC_ADJUST moves the TSC by the change;
//! backwards writes are just that (the TSC keeps counting from the new
//! value). SKIPs where CPUID.7.0:EBX[1] (TSC_ADJUST) is clear (plain TCG).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-tsc", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, lapic_reg, rdmsr, rdtsc, set_lapic_reg, wrmsr};
    const TSC: u32 = 0x10;
    const TSC_ADJUST: u32 = 0x3b;
    const LVT_TIMER: u32 = 0x320;
    const TMICT: u32 = 0x380;
    const TMCCT: u32 = 0x390;
    const TDCR: u32 = 0x3e0;
    /// APIC timer divide-by-128: a count is 128 ns of the 1 GHz APIC bus
    /// (QEMU's and KVM's), 2^32 counts are 9 minutes.
    const NS_PER_COUNT: u64 = 128;
    /// At most this many TSC ticks per ns (8 GHz): rustkvm's TSC runs at 2.
    const MAX_TICKS_PER_NS: u64 = 8;

    if arch::cpuid(7, 0)[1] & (1 << 1) == 0 {
        t.skip("tsc", "CPUID.7.0:EBX[1] clear: no IA32_TSC_ADJUST");
        return;
    }
    // How far the TSC may move between two points is measured on another
    // clock, the local APIC timer counting down (masked, one-shot), not
    // assumed: a vCPU descheduled between two instructions sees the TSC
    // move by as long as the host kept it off, however long that was.
    set_lapic_reg(TDCR, 0xa);
    set_lapic_reg(LVT_TIMER, 1 << 16);
    set_lapic_reg(TMICT, u32::MAX);
    let apic = || lapic_reg(TMCCT);
    // The most the TSC can have advanced between APIC counts `c0` and
    // `c1` (read before and after), in ticks.
    let most = |c0: u32, c1: u32| (u64::from(c0 - c1) + 2) * NS_PER_COUNT * MAX_TICKS_PER_NS;
    // `v` is at most that much past `lo`.
    let within = |v: u64, lo: u64, c0: u32, c1: u32| v.wrapping_sub(lo) <= most(c0, c1);
    let a = rdtsc();
    let m = rdmsr(TSC).unwrap_or(0);
    let b = rdtsc();
    t.check(
        "rdmsr-agrees-with-rdtsc",
        a <= m && m <= b,
        format_args!("{a} {m} {b}"),
    );
    t.eq("adjust-starts-at-0", rdmsr(TSC_ADJUST), Ok(0));

    // Forward jump.
    let c0 = apic();
    let before = rdtsc();
    let wrote = wrmsr(TSC, 1 << 40);
    let after = rdtsc();
    let c1 = apic();
    t.eq("write-tsc", wrote, Ok(()));
    t.check(
        "tsc-jumped",
        within(after, 1 << 40, c0, c1),
        format_args!("{after:#x}, {} APIC counts", c0 - c1),
    );
    let adj = rdmsr(TSC_ADJUST).unwrap_or(0);
    t.check(
        "adjust-moved-by-the-jump",
        within((1u64 << 40).wrapping_sub(before), adj, c0, c1),
        format_args!(
            "adjust {adj:#x}, jump {:#x}, {} APIC counts",
            (1u64 << 40) - before,
            c0 - c1
        ),
    );
    // Adjust back to 0: the TSC is back on the original timeline.
    let wrote = wrmsr(TSC_ADJUST, 0);
    let back = rdtsc();
    let c2 = apic();
    t.eq("write-adjust-0", wrote, Ok(()));
    t.check(
        "adjust-moves-the-tsc",
        back > before && back < 1 << 40 && within(back, before, c0, c2),
        format_args!("{before} -> {back}, {} APIC counts", c0 - c2),
    );
    t.eq("adjust-reads-back", rdmsr(TSC_ADJUST), Ok(0));
    // Backwards to 0: counts up again from there; ADJUST is negative.
    let c0 = apic();
    let wrote = wrmsr(TSC, 0);
    let low = rdtsc();
    let low2 = rdtsc();
    let c1 = apic();
    t.eq("write-tsc-0", wrote, Ok(()));
    t.check(
        "tsc-near-0-and-counting",
        within(low, 0, c0, c1) && low2 >= low,
        format_args!("{low} {low2}, {} APIC counts", c0 - c1),
    );
    let adj = rdmsr(TSC_ADJUST).unwrap_or(0) as i64;
    t.check("adjust-negative", adj < 0, format_args!("{adj}"));
    // An ADJUST write moves the TSC by the difference.
    let c0 = apic();
    let x = rdtsc();
    let wrote = wrmsr(TSC_ADJUST, (adj + 1_000_000_000) as u64);
    let y = rdtsc();
    let c1 = apic();
    t.eq("adjust-plus-1e9", wrote, Ok(()));
    t.check(
        "tsc-moved-by-1e9",
        within(y, x + 1_000_000_000, c0, c1),
        format_args!("{x} -> {y}, {} APIC counts", c0 - c1),
    );
    set_lapic_reg(TMICT, 0);
}
