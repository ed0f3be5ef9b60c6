//! Errors of the accelerator layer.

use thiserror::Error;

/// What can go wrong setting up the machine or its vCPUs.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AccelError {
    /// QEMU passed an architecture number rustkvm does not know.
    #[error("unknown target architecture {0} (rustkvm supports x86_64 and aarch64)")]
    UnknownArch(u32),
    /// The machine asked for no vCPUs or more than rustkvm supports.
    #[error("invalid vCPU count {0} (1..={max})", max = crate::vm::MAX_VCPUS)]
    InvalidCpuCount(u32),
    /// `rustkvm_machine_init` was called twice in one process.
    #[error("a rustkvm machine already exists in this process")]
    MachineExists,
    /// No machine exists (vCPU created before machine init, or after exit).
    #[error("no rustkvm machine has been initialised")]
    NoMachine,
    /// A vCPU index outside `0..max_cpus`.
    #[error("vCPU index {index} out of range (max_cpus = {max_cpus})")]
    VcpuIndexOutOfRange {
        /// The index QEMU asked for.
        index: u32,
        /// The machine's vCPU limit.
        max_cpus: u32,
    },
    /// An `-accel rustkvm` option the guest architecture does not have.
    #[error("option {option} is not available for {arch} guests")]
    OptionNotForArch {
        /// The property name.
        option: &'static str,
        /// The architecture's name.
        arch: &'static str,
    },
    /// `pmu-counters` outside what KVM offers.
    #[error("pmu-counters={0}: the PMU has 1 to {max} general-purpose counters", max = crate::x86::pmu::MAX_GP)]
    InvalidPmuCounters(u32),
    /// Two live vCPUs with one index.
    #[error("vCPU {0} already exists")]
    VcpuExists(u32),
    /// The test hook `RUSTKVM_FAIL_VCPU_CREATE` names this vCPU index.
    #[error("vCPU {0} refused (RUSTKVM_FAIL_VCPU_CREATE)")]
    VcpuRefused(u32),
}
