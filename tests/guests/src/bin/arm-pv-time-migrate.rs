//! rustkvm-test: arch=aarch64 smp=2 compare=off matrix=off
//!
//! PV stolen time across savevm/loadvm or migration: both vCPUs spin on one
//! host thread (the host test boots it with `-icount`: VM time, so each
//! window surely holds the other vCPU's turns, whatever the host's load),
//! vCPU 0 calls PV_TIME_ST, prints "ready", then checks that its
//! `stolen_time` grows in every 500 ms window until the host says "go on"
//! (tests/src/migrate.rs: only the destination of the move does), and in
//! two windows after that. Without the `cpu/rustkvm-pvtime` subsection the
//! destination stops updating the structure. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pv-time-migrate", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn spin() {
    loop {
        core::hint::spin_loop();
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{self, hvc, PV_TIME_ST};
    use guest::println;

    let base = hvc(PV_TIME_ST, [0; 3])[0];
    t.check("st", base.is_multiple_of(64), format_args!("{base:#x}"));
    if !base.is_multiple_of(64) {
        return;
    }
    t.eq("cpu-on", arch::cpu_on(1, spin), 0);
    let stolen = || arch::stolen_time(base);
    println!("ready");
    let frq = arch::cntfrq();
    let mut stalled = None;
    // Windows until the host's byte, then two more.
    let (mut window, mut after) = (0u32, None);
    while after.is_none_or(|a| window < a + 2) {
        let (s0, c0) = (stolen(), arch::cntvct());
        while arch::cntvct().wrapping_sub(c0) < frq / 2 {
            if after.is_none() && guest::host_said_go() {
                after = Some(window + 1);
            }
            core::hint::spin_loop();
        }
        if stolen() == s0 {
            stalled = Some(window);
        }
        window += 1;
    }
    t.measure("windows", format_args!("{window}"));
    t.check(
        "stolen-time-kept-growing",
        stalled.is_none(),
        format_args!("no growth in 500 ms window {stalled:?}"),
    );
}
