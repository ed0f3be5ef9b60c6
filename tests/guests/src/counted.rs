//! A loop whose every executed instruction is known: the oracle the TCG
//! plugin's counters are checked against (tests/tests/plugin.rs counts only
//! the symbol `plugin_counted_loop`, with the plugin's `symbol=`).
//!
//! One call of `plugin_counted_loop(n, cell)` (n ≥ 1) executes, on both
//! architectures, `5n + 2` instructions: one register move, n iterations of
//! load, add, store, decrement, conditional branch, and the return. So:
//!
//! | counter | per call |
//! |---|---|
//! | instructions | 5n + 2 |
//! | branches, `class_branch` | n + 1 (n conditional branches, the return) |
//! | `class_alu` | 2n + 1 (the move, each add and decrement) |
//! | `class_load_store` | 2n |
//! | `class_fp_simd`, `class_system`, `class_other` | 0 |
//! | `mem_loads` | x86_64: n + 1 (the return pops), aarch64: n |
//! | `mem_stores` | n |
//!
//! and `*cell` grows by n + (n - 1) + ... + 1 = n(n + 1) / 2.

use core::arch::global_asm;
use core::sync::atomic::AtomicU64;

#[cfg(target_arch = "x86_64")]
global_asm!(
    ".section .text.plugin_counted_loop, \"ax\"",
    ".global plugin_counted_loop",
    ".type plugin_counted_loop, @function",
    "plugin_counted_loop:",
    "    mov rcx, rdi",
    "2:  mov rdx, qword ptr [rsi]",
    "    add rdx, rcx",
    "    mov qword ptr [rsi], rdx",
    "    dec rcx",
    "    jnz 2b",
    "    ret",
    ".size plugin_counted_loop, . - plugin_counted_loop",
);

#[cfg(target_arch = "aarch64")]
global_asm!(
    ".section .text.plugin_counted_loop, \"ax\"",
    ".global plugin_counted_loop",
    ".type plugin_counted_loop, %function",
    "plugin_counted_loop:",
    "    mov x2, x0",
    "2:  ldr x3, [x1]",
    "    add x3, x3, x2",
    "    str x3, [x1]",
    "    subs x2, x2, #1",
    "    b.ne 2b",
    "    ret",
    ".size plugin_counted_loop, . - plugin_counted_loop",
);

extern "C" {
    fn plugin_counted_loop(n: u64, cell: *mut u64);
}

/// Run the counted loop `n` times (n ≥ 1) on `cell` (see the module
/// documentation for what it executes), which no other CPU may access
/// meanwhile.
pub fn run(n: u64, cell: &AtomicU64) {
    assert!(n >= 1, "counted::run: n = 0 would loop 2^64 times");
    // SAFETY: the loop reads and writes `*cell` only (a valid, aligned u64
    // no other CPU touches during the call) and clobbers only caller-saved
    // registers (rcx, rdx / x2, x3), as the C ABI allows.
    unsafe { plugin_counted_loop(n, cell.as_ptr()) };
}

/// What one call with `n` adds to `*cell`.
pub const fn cell_sum(n: u64) -> u64 {
    n * (n + 1) / 2
}
