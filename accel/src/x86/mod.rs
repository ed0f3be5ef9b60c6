//! x86: KVM's paravirtual interface (CPUID leaves, hypercalls, steal time).

pub mod clock;
pub mod cpuid;
pub mod hypercall;
pub mod pmu;
pub mod steal;
pub mod vcpu;

use thiserror::Error;

/// Why an x86 access is refused (the guest gets #GP(0), as from KVM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum X86Error {
    /// A WRMSR set bits KVM reserves.
    #[error("MSR {msr:#x}: reserved bits set in {value:#x}")]
    ReservedBits {
        /// The MSR.
        msr: u32,
        /// The value written.
        value: u64,
    },
}
