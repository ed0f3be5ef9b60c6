//! x86: KVM's paravirtual interface (CPUID leaves, hypercalls, steal time).

pub mod clock;
pub mod cpuid;
pub mod hypercall;
pub mod lbr;
pub mod msi;
pub mod pebs;
pub mod pmu;
pub mod poll_control;
pub mod pv_eoi;
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
    /// An MSR this vCPU does not have (KVM's `KVM_MSR_RET_UNSUPPORTED`).
    #[error("MSR {msr:#x} not present on this vCPU")]
    Unsupported {
        /// The MSR.
        msr: u32,
    },
}

/// What kind of reset a vCPU goes through (rustkvm.h `RUSTKVM_RESET_*`):
/// the `init_event` of KVM's `kvm_vcpu_reset(vcpu, init_event)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    /// RESET: power-on, system reset, `cpu_reset()` (KVM: vCPU creation and
    /// QEMU writing the reset state back). Every guest-visible register goes
    /// back to its reset value.
    Cold,
    /// x86 INIT (an INIT IPI, INIT-SIPI-SIPI): KVM's `init_event = true`.
    /// Steal time, kvmclock, async PF and the LAPIC timer are reset as on a
    /// RESET; the PMU, the TSC, IA32_TSC_ADJUST and MSR_KVM_POLL_CONTROL
    /// are kept (SDM vol. 3
    /// table 10-1 "INIT: unchanged"; KVM never resets its PMU on INIT). On
    /// arm64 there is none: it is taken as [`ResetKind::Cold`].
    Init,
}

/// The x86 MSRs QEMU saves for rustkvm (see `RustkvmX86Msrs`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SavedMsrs {
    /// MSR_KVM_STEAL_TIME.
    pub steal_time: u64,
    /// IA32_TSC.
    pub tsc: u64,
    /// IA32_TSC_ADJUST.
    pub tsc_adjust: u64,
    /// IA32_TSC_DEADLINE.
    pub tsc_deadline: u64,
    /// MSR_KVM_SYSTEM_TIME(_NEW).
    pub system_time: u64,
    /// MSR_KVM_WALL_CLOCK(_NEW).
    pub wall_clock: u64,
    /// MSR_KVM_POLL_CONTROL.
    pub poll_control: u64,
    /// MSR_KVM_PV_EOI_EN.
    pub pv_eoi: u64,
    /// The PV EOI protocol's state ([`pv_eoi::PvEoiState::code`]).
    pub pv_eoi_state: u8,
    /// The PMU's registers.
    pub pmu: pmu::PmuRegs,
    /// The LBR registers.
    pub lbr: lbr::LbrRegs,
    /// The PEBS registers.
    pub pebs: pebs::PebsRegs,
}
