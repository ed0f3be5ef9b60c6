//! arm64: KVM's SMCCC services (SMCCC 1.1, PV stolen time, the KVM vendor
//! hypervisor UID) and the generic-timer counter offset.

pub mod pmu;
pub mod pvtime;
pub mod smccc;
pub mod timer;
