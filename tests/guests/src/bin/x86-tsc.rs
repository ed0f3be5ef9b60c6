//! rustkvm-test: arch=x86_64 cpu=max compare=off
//! rustkvm-expect: tcg=skip
//!   (stock TCG's max model has no IA32_TSC_ADJUST)
//! rustkvm-kvm-pvm-skip: guest writes to IA32_TSC and IA32_TSC_ADJUST do not move the TSC there (measured)
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
    use guest::arch::{self, rdmsr, rdtsc, wrmsr};
    const TSC: u32 = 0x10;
    const TSC_ADJUST: u32 = 0x3b;
    /// Ticks a few instructions may take, with room (10 ms at 2 GHz).
    const SLACK: u64 = 20_000_000;

    if arch::cpuid(7, 0)[1] & (1 << 1) == 0 {
        t.skip("tsc", "CPUID.7.0:EBX[1] clear: no IA32_TSC_ADJUST");
        return;
    }
    let within = |v: u64, lo: u64| v.wrapping_sub(lo) < SLACK;
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
    let before = rdtsc();
    t.eq("write-tsc", wrmsr(TSC, 1 << 40), Ok(()));
    let after = rdtsc();
    t.check(
        "tsc-jumped",
        within(after, 1 << 40),
        format_args!("{after:#x}"),
    );
    let adj = rdmsr(TSC_ADJUST).unwrap_or(0);
    t.check(
        "adjust-moved-by-the-jump",
        within((1u64 << 40).wrapping_sub(before), adj),
        format_args!("adjust {adj:#x}, jump {:#x}", (1u64 << 40) - before),
    );
    // Adjust back to 0: the TSC is back on the original timeline.
    t.eq("write-adjust-0", wrmsr(TSC_ADJUST, 0), Ok(()));
    let back = rdtsc();
    t.check(
        "adjust-moves-the-tsc",
        back > before && back < 1 << 40 && within(back, before),
        format_args!("{before} -> {back}"),
    );
    t.eq("adjust-reads-back", rdmsr(TSC_ADJUST), Ok(0));
    // Backwards to 0: counts up again from there; ADJUST is negative.
    t.eq("write-tsc-0", wrmsr(TSC, 0), Ok(()));
    let low = rdtsc();
    let low2 = rdtsc();
    t.check(
        "tsc-near-0-and-counting",
        low < SLACK && low2 >= low,
        format_args!("{low} {low2}"),
    );
    let adj = rdmsr(TSC_ADJUST).unwrap_or(0) as i64;
    t.check("adjust-negative", adj < 0, format_args!("{adj}"));
    // An ADJUST write moves the TSC by the difference.
    let x = rdtsc();
    t.eq(
        "adjust-plus-1e9",
        wrmsr(TSC_ADJUST, (adj + 1_000_000_000) as u64),
        Ok(()),
    );
    let y = rdtsc();
    t.check(
        "tsc-moved-by-1e9",
        within(y, x + 1_000_000_000),
        format_args!("{x} -> {y}"),
    );
}
