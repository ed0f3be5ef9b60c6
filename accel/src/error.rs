//! Errors of the accelerator layer (a leaf: it names no other module).

use thiserror::Error;

/// What can go wrong setting up the machine or its vCPUs.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AccelError {
    /// QEMU passed an architecture number rustkvm does not know.
    #[error("unknown target architecture {0} (rustkvm supports x86_64 and aarch64)")]
    UnknownArch(u32),
    /// The machine asked for no vCPUs or more than rustkvm supports.
    #[error("invalid vCPU count {count} (1..={max})")]
    InvalidCpuCount {
        /// The count asked for.
        count: u32,
        /// The most rustkvm supports.
        max: u32,
    },
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
    #[error("pmu-counters={count}: the PMU has 1 to {max} general-purpose counters")]
    InvalidPmuCounters {
        /// The count asked for.
        count: u32,
        /// The most the PMU offers.
        max: u32,
    },
    /// Two live vCPUs with one index.
    #[error("vCPU {0} already exists")]
    VcpuExists(u32),
    /// The test hook `RUSTKVM_FAIL_VCPU_CREATE` names this vCPU index.
    #[error("vCPU {0} refused (RUSTKVM_FAIL_VCPU_CREATE)")]
    VcpuRefused(u32),
}
