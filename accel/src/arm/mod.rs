//! arm64: KVM's SMCCC services (SMCCC 1.1, PV stolen time, the KVM vendor
//! hypervisor UID) and the PMUv3. (The generic-timer counter offset is a
//! VM setting, `vm::VmConfig::counter_offset`, applied by QEMU's timer code.)

pub mod pmu;
pub mod pvtime;
pub mod smccc;
pub mod vcpu;
