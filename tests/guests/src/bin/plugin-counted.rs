//! rustkvm-test: arch=x86_64,aarch64 smp=2 matrix=off timeout=120
//!
//! The TCG plugin's oracle (tests/tests/plugin.rs): both vCPUs run
//! `guest::counted`'s loop, whose executed instructions, branches, classes
//! and memory accesses are known from the iteration counts alone. vCPU 0
//! runs `WARMUP` then `n` iterations, vCPU 1 `WARMUP` then `2n` (two calls
//! each), `n` from the fw_cfg file `opt/rustkvm/plugin-iterations`
//! (decimal; 100000 without it). Each vCPU finishes its warm-up call before
//! either starts its long one, so both are inside the loop from then on
//! (the plugin's `limit=` test stops them there). Not part of the matrix.
#![no_std]
#![no_main]

use core::sync::atomic::{AtomicU64, Ordering};

use guest::{arch, counted, Test};

guest::entry!(main);

/// Iterations of each vCPU's first call.
const WARMUP: u64 = 1000;
/// Bound on every wait for the other vCPU (a vCPU that never comes must
/// not hang the guest).
const WAIT: u64 = 2_000_000_000;

static N: AtomicU64 = AtomicU64::new(0);
static CELL0: AtomicU64 = AtomicU64::new(0);
static CELL1: AtomicU64 = AtomicU64::new(0);
/// Set by vCPU 1 after its warm-up call.
static READY1: AtomicU64 = AtomicU64::new(0);
/// Set by vCPU 0 after its warm-up call.
static READY0: AtomicU64 = AtomicU64::new(0);
/// Set by vCPU 1 when it is done.
static DONE1: AtomicU64 = AtomicU64::new(0);

/// Wait (bounded) until `flag` is set; whether it was.
fn wait(flag: &AtomicU64) -> bool {
    for _ in 0..WAIT {
        if flag.load(Ordering::Acquire) != 0 {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// `opt/rustkvm/plugin-iterations`, or 100000.
fn iterations() -> u64 {
    let mut buf = [0u8; 20];
    let Some(len) = guest::fw_cfg_file("opt/rustkvm/plugin-iterations", &mut buf) else {
        return 100_000;
    };
    buf[..len]
        .iter()
        .try_fold(0u64, |v, b| {
            b.is_ascii_digit()
                .then(|| v.checked_mul(10)?.checked_add(u64::from(b - b'0')))
                .flatten()
        })
        .filter(|n| *n >= 1)
        .unwrap_or(100_000)
}

/// vCPU 1.
fn secondary() {
    counted::run(WARMUP, &CELL1);
    READY1.store(1, Ordering::Release);
    if wait(&READY0) {
        counted::run(2 * N.load(Ordering::Relaxed), &CELL1);
    }
    DONE1.store(1, Ordering::Release);
}

fn main(t: &mut Test) {
    let n = iterations();
    N.store(n, Ordering::Relaxed);
    #[cfg(target_arch = "x86_64")]
    arch::start_ap(1, secondary);
    #[cfg(target_arch = "aarch64")]
    t.eq("psci-cpu-on", arch::cpu_on(1, secondary), 0);
    t.check(
        "vcpu1-warmed-up",
        wait(&READY1),
        format_args!("vCPU 1 never finished its warm-up call"),
    );
    counted::run(WARMUP, &CELL0);
    READY0.store(1, Ordering::Release);
    counted::run(n, &CELL0);
    t.check(
        "vcpu1-done",
        wait(&DONE1),
        format_args!("vCPU 1 never finished"),
    );
    let sum = counted::cell_sum;
    t.eq(
        "vcpu0-cell",
        CELL0.load(Ordering::Acquire),
        sum(WARMUP) + sum(n),
    );
    t.eq(
        "vcpu1-cell",
        CELL1.load(Ordering::Acquire),
        sum(WARMUP) + sum(2 * n),
    );
    t.measure("iterations", format_args!("{n}"));
}
