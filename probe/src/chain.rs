//! A known call chain for branch-record and call-graph tools (`perf record
//! -b`, `--call-graph lbr`): `rustkvm_chain_a` calls `rustkvm_chain_b`
//! over and over, which calls `rustkvm_chain_c`, which loops a few times
//! (fewer taken branches than an LBR stack holds, so a branch stack shows
//! the calls and returns around it). Each is its own symbol (not inlined,
//! not mangled), so the tools can name them; the test checks that the
//! chain they report is this one.

use std::hint::black_box;

/// The leaf's rounds per call.
pub const LEAF_ROUNDS: u64 = 8;

/// The leaf: `n` rounds of a little arithmetic.
#[no_mangle]
#[inline(never)]
pub extern "C" fn rustkvm_chain_c(n: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x = black_box(x.wrapping_add(i) ^ 0x5a);
    }
    x
}

/// The middle.
#[no_mangle]
#[inline(never)]
pub extern "C" fn rustkvm_chain_b(n: u64) -> u64 {
    black_box(rustkvm_chain_c(black_box(n))).wrapping_add(1)
}

/// The root: `calls` calls of the middle.
#[no_mangle]
#[inline(never)]
pub extern "C" fn rustkvm_chain_a(calls: u64) -> u64 {
    let mut x = 0u64;
    for _ in 0..calls {
        x = x.wrapping_add(black_box(rustkvm_chain_b(black_box(LEAF_ROUNDS))));
    }
    x
}

/// A loop of three instructions, `rounds` times (`add`, `dec`, `jnz`), for
/// precise sampling: returns the three instructions' addresses. With a
/// sampling period of 1 modulo 3, exact samples walk them in order.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn three_instruction_loop(rounds: u64) -> [u64; 3] {
    let (a, b, c): (u64, u64, u64);
    // SAFETY: register arithmetic only.
    unsafe {
        std::arch::asm!(
            "lea {a}, [rip + 2f]",
            "lea {b}, [rip + 3f]",
            "lea {c}, [rip + 4f]",
            "2:",
            "add {x}, 1",
            "3:",
            "dec {n}",
            "4:",
            "jnz 2b",
            a = out(reg) a,
            b = out(reg) b,
            c = out(reg) c,
            x = inout(reg) 0u64 => _,
            n = inout(reg) rounds.max(1) => _,
            options(nostack, nomem),
        );
    }
    [a, b, c]
}
