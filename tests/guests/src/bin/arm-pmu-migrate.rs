//! rustkvm-test: arch=aarch64 compare=off needs=pmu matrix=off
//!
//! The arm64 PMU across savevm/loadvm or migration: event counter 0 counts
//! instructions and counter 1 branches, from values that are not 0 (so a
//! restart from 0 shows); the guest prints "ready" and then, counting,
//! runs chunks of a known loop, each ending with a poll of the UART, until
//! the host says "go on" (tests/src/migrate.rs: only the destination of the
//! move does). Afterwards each counter must hold its start value plus
//! exactly what the chunks retired. Not part of the matrix.
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
    /// PL011 flag register on the virt machine; bit 4 (RXFE): nothing
    /// received.
    const UART_FR: u64 = 0x0900_0018;
    println!("ready");
    let chunks: u64;
    // SAFETY: PMU enables at EL1, reads of the PL011's flag register (MMIO,
    // identity-mapped) and register arithmetic. Counted: the enabling MSR
    // (1); per chunk mov, M x (subs, b.ne), ldr, add, tst, b.ne (2M + 5
    // instructions, M + 1 branches).
    unsafe {
        asm!(
            "msr pmcntenset_el0, {mask}",
            "2:",
            "mov {i}, {m}",
            "3:",
            "subs {i}, {i}, #1",
            "b.ne 3b",
            "ldr {fr:w}, [{fr_addr}]",
            "add {chunks}, {chunks}, #1",
            "tst {fr:w}, #0x10",
            "b.ne 2b",
            "msr pmcntenclr_el0, {mask}",
            mask = in(reg) 0b11u64,
            m = in(reg) M,
            fr_addr = in(reg) UART_FR,
            chunks = inout(reg) 0u64 => chunks,
            i = out(reg) _,
            fr = out(reg) _,
            options(nostack),
        );
    }
    // The host's byte.
    let _ = guest::arch::getc();
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
