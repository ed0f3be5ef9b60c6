//! rustkvm-test: arch=aarch64 smp=2
//!
//! Starts the second vCPU with PSCI CPU_ON (an HVC, so it crosses rustkvm's
//! SMCCC routing point), has it write a value the first vCPU waits for, and
//! checks both ran: the same under tcg, rustkvm, MTTCG and icount.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("smp", "this guest brings up CPUs with PSCI (aarch64 only)");
}

#[cfg(target_arch = "aarch64")]
use core::ptr::{addr_of, addr_of_mut};

#[cfg(target_arch = "aarch64")]
use guest::arch;

#[cfg(target_arch = "aarch64")]
static mut SEEN_MPIDR: u64 = u64::MAX;

#[cfg(target_arch = "aarch64")]
fn secondary() {
    // SAFETY: the primary only reads this after it changes.
    unsafe { addr_of_mut!(SEEN_MPIDR).write_volatile(arch::mpidr()) };
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    let status = arch::cpu_on(1, secondary);
    t.eq("psci-cpu-on", status, 0);
    let mut seen = u64::MAX;
    for _ in 0..200_000_000u64 {
        // SAFETY: written once by the secondary.
        seen = unsafe { addr_of!(SEEN_MPIDR).read_volatile() };
        if seen != u64::MAX {
            break;
        }
        core::hint::spin_loop();
    }
    t.eq("secondary-ran-with-mpidr-1", seen, 1);
    t.measure("secondary.mpidr", format_args!("{seen:#x}"));
}
