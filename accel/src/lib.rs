//! rustkvm's accelerator library.
//!
//! Pure Rust models of what a KVM guest sees (PMU, steal time, pvclock,
//! timers, hypercalls) live in modules that know nothing of QEMU and are
//! unit-tested alone; [`ffi`] is the thin C ABI that QEMU's `-accel rustkvm`
//! glue calls (declared for C in `include/rustkvm.h`).
//!
//! Layering:
//! - [`vm`]: the machine ([`vm::Vm`]): its configuration, its vCPUs'
//!   creation and removal, the steal-time sampler.
//! - [`machine`]: what the vCPUs share ([`machine::Shared`]), with the
//!   registry of vCPUs.
//! - [`vcpu`]: one vCPU's core (steal accounting, exit requests, route
//!   counts); its architecture's state and routing points are
//!   [`x86::vcpu`] and [`arm::vcpu`].
//! - [`ffi`]: `extern "C"` entry points; no panic crosses them.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod arm;
pub mod error;
pub mod ffi;
pub mod host;
pub mod info;
pub mod inject;
pub mod machine;
pub mod memory;
#[cfg(test)]
mod proptests;
pub mod steal;
pub mod vcpu;
pub mod vm;
pub mod x86;

pub use error::AccelError;
pub use vcpu::{Route, RouteCounts, Vcpu};
pub use vm::{Arch, Vm, VmConfig};
