//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off
//!
//! The TSC across a move between QEMUs, whatever runs either side (the host
//! test moves a stock-TCG VM to rustkvm): prints "ready", then until the host
//! says "go on" (on the destination) checks that it never goes backwards.
//! Nothing rustkvm-specific, so it runs under stock TCG too.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-tsc-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::rdtsc;
    use guest::{host_said_go, println};

    println!("ready");
    let mut last = rdtsc();
    let mut bad = None;
    // (Polling the UART leaves translated code, so the move can happen.)
    while !host_said_go() {
        let now = rdtsc();
        if now < last {
            bad = Some((last, now));
            break;
        }
        last = now;
    }
    t.check(
        "tsc-never-backwards",
        bad.is_none(),
        format_args!("{bad:?}"),
    );
}
