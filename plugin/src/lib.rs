//! rustkvm's TCG plugin for stock QEMU 10.0 (plugin API version 4).
//!
//! `-plugin librustkvm_plugin.so[,arg=value...]` counts, per vCPU and in
//! total, instructions (exactly as QEMU's contrib `insn` plugin does, with one
//! inline add per group of instructions instead of per instruction: see
//! [`classify`]), branches, memory accesses (loads, stores), instruction
//! classes, and the hottest blocks, and writes them as JSON or CSV
//! (docs/plugin.md has the schema and the arguments).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod args;
pub mod classify;
pub mod hot;
mod qemu;
pub mod report;

/// QEMU plugin API version this plugin speaks (QEMU 10.0 speaks version 4).
pub const PLUGIN_API_VERSION: u32 = 4;
