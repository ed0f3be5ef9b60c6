//! kvmclock as a Linux guest reads it (x86): the per-vCPU
//! `pvclock_vcpu_time_info` the hypervisor keeps up to date, and the read
//! `pvclock_clocksource_read` does (Linux `arch/x86/include/asm/pvclock.h`,
//! `pvclock-abi.h`, `arch/x86/kernel/pvclock.c`; KVM
//! `Documentation/virt/kvm/x86/msr.rst`).

use core::sync::atomic::{fence, Ordering};

use crate::arch;

/// MSR_KVM_WALL_CLOCK_NEW.
pub const MSR_WALL_CLOCK: u32 = 0x4b56_4d00;
/// MSR_KVM_SYSTEM_TIME_NEW: bit 0 enables the structure at the address.
pub const MSR_SYSTEM_TIME: u32 = 0x4b56_4d01;
/// MSR_KVM_SYSTEM_TIME, the legacy one.
pub const MSR_SYSTEM_TIME_OLD: u32 = 0x12;
/// CPUID 0x40000001 EAX: KVM_FEATURE_CLOCKSOURCE2 (the new MSRs).
pub const FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// `flags`: PVCLOCK_TSC_STABLE_BIT.
pub const TSC_STABLE_BIT: u8 = 1;

/// `struct pvclock_vcpu_time_info` (32 bytes; 64-byte aligned here so one
/// never crosses a page).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Pvti {
    /// Odd while the hypervisor writes the structure.
    pub version: u32,
    /// Padding.
    pub pad0: u32,
    /// The TSC at `system_time`.
    pub tsc_timestamp: u64,
    /// Nanoseconds at `tsc_timestamp`.
    pub system_time: u64,
    /// TSC → ns multiplier (32.32 fixed point, after the shift).
    pub mul: u32,
    /// Power-of-two shift applied to the TSC delta first.
    pub shift: i8,
    /// PVCLOCK_TSC_STABLE_BIT, PVCLOCK_GUEST_STOPPED.
    pub flags: u8,
    /// Padding.
    pub pad: [u8; 2],
}

impl Pvti {
    /// A zeroed structure.
    pub const fn new() -> Self {
        Pvti {
            version: 0,
            pad0: 0,
            tsc_timestamp: 0,
            system_time: 0,
            mul: 0,
            shift: 0,
            flags: 0,
            pad: [0; 2],
        }
    }
}

impl Default for Pvti {
    fn default() -> Self {
        Self::new()
    }
}

/// Read the clock of the structure at `p` as `pvclock_clocksource_read`
/// does, without the shortcut for an unstable clock (its global
/// last-value clamp): retry while the version is odd or changes. Returns
/// (nanoseconds, flags).
///
/// # Safety
///
/// `p` points to a `Pvti` in memory this guest may read (a static the
/// hypervisor updates, or anything else readable and aligned).
pub unsafe fn read(p: *const Pvti) -> (u64, u8) {
    loop {
        // SAFETY: the caller's promise; volatile reads of aligned fields
        // the hypervisor may be writing.
        unsafe {
            let v0 = (&raw const (*p).version).read_volatile();
            fence(Ordering::Acquire);
            let ts = (&raw const (*p).tsc_timestamp).read_volatile();
            let sys = (&raw const (*p).system_time).read_volatile();
            let mul = (&raw const (*p).mul).read_volatile();
            let shift = (&raw const (*p).shift).read_volatile();
            let flags = (&raw const (*p).flags).read_volatile();
            let tsc = arch::rdtsc();
            fence(Ordering::Acquire);
            let v1 = (&raw const (*p).version).read_volatile();
            if v0 & 1 == 0 && v0 == v1 {
                return (
                    sys.wrapping_add(scale(tsc.wrapping_sub(ts), mul, shift)),
                    flags,
                );
            }
        }
    }
}

/// `pvclock_scale_delta`: a TSC delta in nanoseconds.
pub fn scale(delta: u64, mul: u32, shift: i8) -> u64 {
    let d = if shift < 0 {
        delta >> u32::from(shift.unsigned_abs())
    } else {
        delta << shift as u32
    };
    ((u128::from(d) * u128::from(mul)) >> 32) as u64
}
