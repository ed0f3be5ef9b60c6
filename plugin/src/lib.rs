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
pub mod blocks;
pub mod classify;
pub mod hot;
mod qemu;
pub mod report;
pub mod resets;
pub mod trace;

/// QEMU plugin API version this plugin speaks (QEMU 10.0 speaks version 4).
pub const PLUGIN_API_VERSION: u32 = 4;

/// QEMU's exit status when `limit=` stopped the run (after the report was
/// written): not 0 (the guest ran to its end), not 1 (QEMU's error status),
/// and even, so never an x86 `isa-debug-exit` status (`(v << 1) | 1`).
pub const LIMIT_EXIT_STATUS: i32 = 100;
