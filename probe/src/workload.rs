//! The probe's workload: a hand-written loop whose user-mode instruction and
//! branch counts are known exactly.
//!
//! `spin(n)` runs `n` iterations of two instructions, a decrement and a
//! conditional branch back (x86_64: `dec; jnz`, aarch64: `subs; b.ne`): `2n`
//! instructions and `n` branches. What surrounds the loop (the call, the
//! perf ioctls) is the same for every `n`, so the difference between two runs
//! with `n1` and `n2` iterations is exactly `2 (n2 - n1)` instructions and
//! `n2 - n1` branches, whatever the measuring overhead.

/// Instructions per loop iteration.
pub const INSNS_PER_ITER: u64 = 2;
/// Branches per loop iteration.
pub const BRANCHES_PER_ITER: u64 = 1;

/// Run the loop `n` times (`n` = 0 is treated as 1, as the loop is
/// do-while shaped).
#[inline(never)]
pub fn spin(n: u64) {
    let n = n.max(1);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: register-only loop; touches no memory and no stack.
    unsafe {
        core::arch::asm!("2:", "dec {n}", "jnz 2b", n = inout(reg) n => _, options(nomem, nostack));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: register-only loop; touches no memory and no stack.
    unsafe {
        core::arch::asm!("2:", "subs {n}, {n}, #1", "b.ne 2b", n = inout(reg) n => _, options(nomem, nostack));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    compile_error!("rustkvm-probe supports x86_64 and aarch64");
}

/// Expected (instructions, branches) difference between `spin(n2)` and
/// `spin(n1)`.
pub fn expected_delta(n1: u64, n2: u64) -> (u64, u64) {
    let d = n2.max(1) - n1.max(1);
    (INSNS_PER_ITER * d, BRANCHES_PER_ITER * d)
}
