//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off
//!
//! The TSC across a move between QEMUs, whatever runs either side (the host
//! test moves a stock-TCG VM to rustkvm): prints "ready", then until the TSC
//! has advanced by 2·10^9 ticks checks that it never goes backwards.
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
    use guest::arch::{self, rdtsc};
    use guest::println;

    println!("ready");
    let start = rdtsc();
    let mut last = start;
    let mut bad = None;
    while last.wrapping_sub(start) < 2_000_000_000 {
        let now = rdtsc();
        if now < last {
            bad = Some((last, now));
            break;
        }
        last = now;
        // Leave translated code now and then, so the move can happen.
        arch::outb(0x80, 0);
    }
    t.check(
        "tsc-never-backwards",
        bad.is_none(),
        format_args!("{bad:?}"),
    );
}
