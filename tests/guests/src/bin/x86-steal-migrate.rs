//! rustkvm-test: arch=x86_64 compare=off matrix=off
//!
//! Steal time across savevm/loadvm or migration: enables MSR_KVM_STEAL_TIME,
//! prints "ready", then until the host says "go on" (on the destination of
//! the move, tests/tests/migration.rs) keeps checking that the MSR reads
//! back. Afterwards the destination must go on updating the structure, as
//! KVM does after KVM_SET_MSRS restores the MSR. Without the MSR in the
//! stream the destination reads it as 0. MSR_KVM_POLL_CONTROL, set to 0
//! (its reset value is 1), must keep its value too. Not part of the matrix.
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
    use guest::{host_said_go, println};
    /// Guest TSC ticks to wait for an update after the move (a hang guard:
    /// the first entries after the restore update the structure).
    const UPDATE_WITHIN: u64 = 10_000_000_000;

    // SAFETY: volatile read of memory the host writes.
    let version = || unsafe { addr_of!(ST.version).read_volatile() };
    let value = addr_of!(ST) as u64 | 1;
    const MSR_KVM_POLL_CONTROL: u32 = 0x4b56_4d05;
    t.eq("enable", arch::wrmsr(MSR_KVM_STEAL_TIME, value), Ok(()));
    t.eq(
        "poll-control-off",
        arch::wrmsr(MSR_KVM_POLL_CONTROL, 0),
        Ok(()),
    );
    println!("ready");
    let mut bad = None;
    let mut checks = 0u64;
    // (Polling the UART leaves the CPU loop, so entries and the move happen.)
    while !host_said_go() {
        let got = arch::rdmsr(MSR_KVM_STEAL_TIME);
        checks += 1;
        if got != Ok(value) {
            bad = Some(got);
            break;
        }
    }
    t.check(
        "msr-kept-its-value",
        bad.is_none(),
        format_args!("{bad:?} after {checks} reads"),
    );
    t.eq(
        "poll-control-kept-its-value",
        arch::rdmsr(MSR_KVM_POLL_CONTROL),
        Ok(0),
    );
    let (moved_at, start) = (version(), arch::rdtsc());
    while version() == moved_at && arch::rdtsc().wrapping_sub(start) < UPDATE_WITHIN {
        arch::outb(0x80, 0);
    }
    let now = version();
    t.check(
        "updated-after-the-move",
        now != moved_at,
        format_args!("version {now} (at the move {moved_at})"),
    );
}
