//! rustkvm-test: arch=x86_64,aarch64 matrix=off timeout=120
//!
//! A CPU-bound workload (`guest::workload`) for scripts/bench-plugin.sh and,
//! as the guest that leaves its PMU alone, scripts/bench-pmu.sh. Prints a
//! checksum so the work cannot be optimised away. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

fn main(t: &mut Test) {
    let sum = guest::workload::run(10_000);
    t.measure("checksum", format_args!("{sum:#x}"));
    t.check("ran", true, format_args!(""));
}
