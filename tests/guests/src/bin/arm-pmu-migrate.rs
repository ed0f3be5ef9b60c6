//! rustkvm-test: arch=aarch64 compare=off needs=pmu matrix=off
//!
//! The arm64 PMU across savevm/loadvm or migration: event counter 0 counts
//! instructions and counter 1 branches, from values that are not 0 (so a
//! restart from 0 shows); the guest prints "ready" and then, counting,
//! runs chunks of a known loop for 3 s of virtual-counter time. The host
//! test migrates the VM to a file and resumes it in a new QEMU meanwhile.
//! Afterwards each counter must hold its start value plus exactly what the
//! chunks retired. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-migrate", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::println;
    use guest::{read_sysreg, write_sysreg};

    /// Loop iterations per chunk.
    const M: u64 = 10_000;
    /// Start values (64-bit event counters with PMUv3p5).
    const START: [u64; 2] = [0x1_2345_6789, 0x765_4321];

    let ceid0 = read_sysreg!("pmceid0_el0");
    let ceid1 = read_sysreg!("pmceid1_el0");
    if ceid0 & 1 << 0x08 == 0 || ceid1 & 1 << 1 == 0 {
        t.skip("arm-pmu-migrate", "PMCEID: no INST_RETIRED/BR_RETIRED");
        return;
    }
    guest::arch::pmu_clear();
    write_sysreg!("pmevtyper0_el0", 0x08);
    write_sysreg!("pmevtyper1_el0", 0x21);
    write_sysreg!("pmevcntr0_el0", START[0]);
    write_sysreg!("pmevcntr1_el0", START[1]);
    write_sysreg!("pmcr_el0", 1 | 1 << 7); // E, LP (64-bit overflow)
    let deadline = read_sysreg!("cntvct_el0") + 3 * read_sysreg!("cntfrq_el0");
    println!("ready");
    let chunks: u64;
    // SAFETY: PMU enables at EL1, counter reads and register arithmetic.
    // Counted: the enabling MSR (1); per chunk mov, M x (subs, b.ne), mrs,
    // add, cmp, b.lo (2M + 5 instructions, M + 1 branches).
    unsafe {
        asm!(
            "msr pmcntenset_el0, {mask}",
            "2:",
            "mov {i}, {m}",
            "3:",
            "subs {i}, {i}, #1",
            "b.ne 3b",
            "mrs {now}, cntvct_el0",
            "add {chunks}, {chunks}, #1",
            "cmp {now}, {deadline}",
            "b.lo 2b",
            "msr pmcntenclr_el0, {mask}",
            mask = in(reg) 0b11u64,
            m = in(reg) M,
            deadline = in(reg) deadline,
            chunks = inout(reg) 0u64 => chunks,
            i = out(reg) _,
            now = out(reg) _,
            options(nostack),
        );
    }
    t.measure("chunks", format_args!("{chunks}"));
    t.eq(
        "pmevcntr0.instructions",
        read_sysreg!("pmevcntr0_el0"),
        START[0] + 1 + chunks * (2 * M + 5),
    );
    t.eq(
        "pmevcntr1.branches",
        read_sysreg!("pmevcntr1_el0"),
        START[1] + chunks * (M + 1),
    );
    t.eq("pmcr.e", read_sysreg!("pmcr_el0") & 1, 1);
}
