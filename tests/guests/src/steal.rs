//! Steal time against the guest's own arithmetic: a measuring window whose
//! every instruction is known, and a second vCPU that counts what it
//! executes.
//!
//! [`count_progress`] (on the other vCPU) adds 1 to a progress cell every
//! [`PROGRESS_INSNS`] instructions until told to stop. [`window`] (on the
//! vCPU whose stolen time is watched) reads its stolen time, the clock
//! (x86: RDTSC; arm64: CNTVCT_EL0) and the progress cell around a loop of
//! `2n` instructions, all in hand-written assembly:
//!
//! ```text
//! stolen_before, counter_start, progress_start, stolen_start,
//! loop (2n instructions),
//! stolen_end, progress_end, counter_end, stolen_after
//! ```
//!
//! The window is *clean* when `stolen_before == stolen_start` and
//! `stolen_end == stolen_after`: the vCPU did not wait (or waited while
//! nothing ran) just outside the loop, so the stolen time it saw grow,
//! `stolen_end - stolen_start`, is what it waited between the two counter
//! reads and between the two progress reads.
//!
//! Under `-icount shift=0` with both vCPUs on one thread (one instruction =
//! 1 ns of VM time, and only one vCPU executes at a time) steal time is VM
//! time (docs/steal-time.md), so in a clean window, exactly:
//!
//! - stolen = what the other vCPU executed while this one waited, which its
//!   progress cell counts to within one iteration:
//!   `|stolen - PROGRESS_INSNS * progress| < PROGRESS_INSNS`;
//! - elapsed VM time = stolen + the window's own instructions, which do not
//!   depend on the other vCPU: `elapsed - stolen` is the same in a window
//!   taken alone (where stolen is 0).
//!
//! Outside icount these are host time and only statistics.

use core::arch::global_asm;
use core::sync::atomic::AtomicU64;

/// Instructions per iteration of [`count_progress`]'s loop (each adds 1 to
/// the progress cell): load, add, store, load of the stop flag, branch.
pub const PROGRESS_INSNS: u64 = 5;

#[cfg(target_arch = "x86_64")]
global_asm!(
    ".section .text.steal_count_progress, \"ax\"",
    ".global steal_count_progress",
    "steal_count_progress:",
    "2:  mov rax, qword ptr [rdi]",
    "    add rax, 1",
    "    mov qword ptr [rdi], rax",
    "    cmp qword ptr [rsi], 0",
    "    je 2b",
    "    ret",
    // rdi = n, rsi = stolen, rdx = progress, rcx = out[8].
    ".section .text.steal_window, \"ax\"",
    ".global steal_window",
    "steal_window:",
    "    mov r8, rdx",
    "    mov r9, qword ptr [rsi]",
    "    rdtsc",
    "    shl rdx, 32",
    "    or rax, rdx",
    "    mov r10, rax",
    "    mov r11, qword ptr [r8]",
    "    mov rax, qword ptr [rsi]",
    "3:  dec rdi",
    "    jnz 3b",
    "    mov qword ptr [rcx], r9",
    "    mov qword ptr [rcx + 8], r10",
    "    mov qword ptr [rcx + 16], r11",
    "    mov qword ptr [rcx + 24], rax",
    "    mov r9, qword ptr [rsi]",
    "    mov r11, qword ptr [r8]",
    "    rdtsc",
    "    shl rdx, 32",
    "    or rax, rdx",
    "    mov r10, qword ptr [rsi]",
    "    mov qword ptr [rcx + 32], r9",
    "    mov qword ptr [rcx + 40], r11",
    "    mov qword ptr [rcx + 48], rax",
    "    mov qword ptr [rcx + 56], r10",
    "    ret",
);

#[cfg(target_arch = "aarch64")]
global_asm!(
    ".section .text.steal_count_progress, \"ax\"",
    ".global steal_count_progress",
    "steal_count_progress:",
    "2:  ldr x2, [x0]",
    "    add x2, x2, #1",
    "    str x2, [x0]",
    "    ldr x3, [x1]",
    "    cbz x3, 2b",
    "    ret",
    // x0 = n, x1 = stolen, x2 = progress, x3 = out[8].
    ".section .text.steal_window, \"ax\"",
    ".global steal_window",
    "steal_window:",
    "    ldr x4, [x1]",
    "    mrs x5, cntvct_el0",
    "    ldr x6, [x2]",
    "    ldr x7, [x1]",
    "3:  subs x0, x0, #1",
    "    b.ne 3b",
    "    ldr x8, [x1]",
    "    ldr x9, [x2]",
    "    mrs x10, cntvct_el0",
    "    ldr x11, [x1]",
    "    stp x4, x5, [x3]",
    "    stp x6, x7, [x3, #16]",
    "    stp x8, x9, [x3, #32]",
    "    stp x10, x11, [x3, #48]",
    "    ret",
);

extern "C" {
    fn steal_count_progress(progress: *mut u64, stop: *const u64);
    fn steal_window(n: u64, stolen: *const u64, progress: *const u64, out: *mut [u64; 8]);
}

/// Count: add 1 to `progress` every [`PROGRESS_INSNS`] instructions until
/// `stop` is nonzero (checked once per iteration).
pub fn count_progress(progress: &AtomicU64, stop: &AtomicU64) {
    // SAFETY: the loop reads `stop` and reads/writes `progress` (valid,
    // aligned u64s; only this CPU writes `progress` meanwhile) and clobbers
    // only caller-saved registers (rax / x2, x3), as the C ABI allows.
    unsafe { steal_count_progress(progress.as_ptr(), stop.as_ptr()) };
}

/// What one [`window`] read (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Stolen time just before the window.
    pub stolen_before: u64,
    /// Clock at its start (TSC ticks / counter ticks).
    pub counter_start: u64,
    /// The other vCPU's progress at its start.
    pub progress_start: u64,
    /// Stolen time at its start.
    pub stolen_start: u64,
    /// Stolen time at its end.
    pub stolen_end: u64,
    /// The other vCPU's progress at its end.
    pub progress_end: u64,
    /// Clock at its end.
    pub counter_end: u64,
    /// Stolen time just after it.
    pub stolen_after: u64,
}

impl Window {
    /// No stolen time grew just outside the loop (see the module docs).
    pub fn clean(&self) -> bool {
        self.stolen_before == self.stolen_start && self.stolen_end == self.stolen_after
    }

    /// Stolen time (ns) that grew over the window.
    pub fn stolen(&self) -> u64 {
        self.stolen_end.wrapping_sub(self.stolen_start)
    }

    /// Iterations the other vCPU completed during the window.
    pub fn progress(&self) -> u64 {
        self.progress_end.wrapping_sub(self.progress_start)
    }

    /// Clock ticks the window took.
    pub fn ticks(&self) -> u64 {
        self.counter_end.wrapping_sub(self.counter_start)
    }
}

/// Run a window of `2n` loop instructions (n ≥ 1), reading the stolen time
/// at `stolen` (a u64 the hypervisor updates) and the progress cell.
///
/// # Safety
///
/// `stolen` must point at a readable, aligned u64 (the stolen-time field of
/// this vCPU's structure, identity-mapped).
pub unsafe fn window(n: u64, stolen: *const u64, progress: &AtomicU64) -> Window {
    assert!(n >= 1, "steal::window: n = 0 would loop 2^64 times");
    let mut out = [0u64; 8];
    // SAFETY: `stolen` is readable (the caller's promise), `progress` is a
    // valid u64, `out` is ours; the function clobbers only caller-saved
    // registers.
    unsafe { steal_window(n, stolen, progress.as_ptr(), &mut out) };
    let [stolen_before, counter_start, progress_start, stolen_start, stolen_end, progress_end, counter_end, stolen_after] =
        out;
    Window {
        stolen_before,
        counter_start,
        progress_start,
        stolen_start,
        stolen_end,
        progress_end,
        counter_end,
        stolen_after,
    }
}

/// Run windows of `2n` instructions until one is clean, at most `tries`
/// (≥ 1) times; the clean one, or the last.
///
/// # Safety
///
/// As [`window`].
pub unsafe fn clean_window(n: u64, stolen: *const u64, progress: &AtomicU64, tries: u32) -> Window {
    // SAFETY: the caller's promise, passed on.
    let mut w = unsafe { window(n, stolen, progress) };
    for _ in 1..tries {
        if w.clean() {
            break;
        }
        // SAFETY: as above.
        w = unsafe { window(n, stolen, progress) };
    }
    w
}
