//! rustkvm-test: arch=x86_64 compare=off matrix=off
//!
//! Steal time across savevm/loadvm or migration: enables MSR_KVM_STEAL_TIME,
//! prints "ready", then for about 3 s of guest time keeps checking that the
//! MSR reads back and the structure keeps being updated. The host test
//! (tests/tests/guests.rs) migrates the VM to a file and resumes it in a new
//! QEMU in the middle; without the MSR in the migration stream the
//! destination reads it as 0. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-steal-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
static mut ST: guest::arch::KvmStealTime = guest::arch::KvmStealTime::new();

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::arch::{self, MSR_KVM_STEAL_TIME};
    use guest::println;
    /// Guest TSC ticks to keep checking for (about 3 s at 2–4 GHz).
    const SPAN: u64 = 9_000_000_000;

    let value = addr_of!(ST) as u64 | 1;
    t.eq("enable", arch::wrmsr(MSR_KVM_STEAL_TIME, value), Ok(()));
    println!("ready");
    let start = arch::rdtsc();
    let mut bad = None;
    let mut checks = 0u64;
    while arch::rdtsc().wrapping_sub(start) < SPAN {
        let got = arch::rdmsr(MSR_KVM_STEAL_TIME);
        checks += 1;
        if got != Ok(value) {
            bad = Some(got);
            break;
        }
        // Leave the CPU loop now and then (port I/O), so entries happen.
        arch::outb(0x80, 0);
    }
    t.check(
        "msr-kept-its-value",
        bad.is_none(),
        format_args!("{bad:?} after {checks} reads"),
    );
    // SAFETY: volatile read of memory the host writes.
    let version = unsafe { addr_of!(ST.version).read_volatile() };
    t.measure("version", format_args!("{version}"));
}
