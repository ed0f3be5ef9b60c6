//! rustkvm-test: arch=x86_64 compare=off matrix=off timeout=5
//!
//! A probe of the host, not a test of rustkvm: does a guest write to
//! IA32_TSC move the TSC on this host's KVM? The runner boots it on the
//! kvm backend, with a short bound, for the guests that declare
//! `rustkvm-kvm-probe: tsc-write` (tests/src/run.rs `kvm_skip`): they run
//! where it passes and SKIP with their declared reason where it does not.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("kvm-probe-tsc-write", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;
    /// IA32_TIME_STAMP_COUNTER (SDM Vol. 4).
    const IA32_TSC: u32 = 0x10;
    /// Where the write puts it: far beyond anything a boot reaches.
    const AHEAD: u64 = 1 << 50;
    let wrote = arch::wrmsr(IA32_TSC, AHEAD).is_ok();
    let now = arch::rdtsc();
    t.check(
        "tsc-write-moves-the-tsc",
        wrote && now >= AHEAD,
        format_args!("wrote {AHEAD:#x}: {wrote}, read {now:#x}"),
    );
}
