//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu matrix=off
//!
//! The PMU across savevm/loadvm or migration, with a PMI pending and with
//! counters running:
//! - before the move, PMC2 overflows with its PMI on LVTPC's fixed vector;
//!   interrupts are off, so the PMI waits in the IRR, with GLOBAL_STATUS
//!   bit 2 set and LVTPC masked (KVM's delivery). All three must hold on
//!   the destination, and `sti` there must take exactly one PMI;
//! - PMC0 counts instructions, PMC1 branches and FIXED_CTR0 instructions,
//!   from values that are not 0 (so a restart from 0 shows); the guest
//!   prints "ready" and runs chunks of a known loop, each ending with a
//!   poll of the UART, until the host says "go on" (tests/src/migrate.rs:
//!   only the destination does). Afterwards every counter must hold its
//!   start value plus exactly what the chunks retired.
//!
//! Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch::{self, irqs, lapic_irr, lapic_reg, rdmsr, set_lapic_reg, wrmsr};
    use guest::println;
    use guest::x86_pmu::{
        EVTSEL0, FIXED_CTR0, FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_STATUS, INT, LVTPC, LVT_MASKED,
        PMC0, SVR,
    };

    /// EN | OS | USR; instructions (C0H) and branches (C4H) retired.
    const SEL: u64 = 1 << 22 | 1 << 17 | 1 << 16;
    const ALL: u64 = 0b11 | 1 << 32;
    /// Loop iterations per chunk.
    const M: u64 = 10_000;
    /// Start values: the legacy PMC writes sign-extend bit 31.
    const START: [u64; 3] = [0x1234_5678, 0x0765_4321, 0x9_8765_4321];
    /// LVTPC's vector (fixed delivery) for PMC2's PMI.
    const PMI: u8 = 0x42;
    /// COM1's line status register; bit 0: a byte arrived.
    const COM1_LSR: u32 = 0x3fd;

    let eax = arch::cpuid(0xa, 0)[0];
    if eax & 0xff == 0 || (eax >> 8) & 0xff < 3 {
        t.skip("x86-pmu-migrate", "CPUID 0xA: fewer than 3 GP counters");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("PMU MSR");
    let r = |i| rdmsr(i).expect("PMU MSR");

    // PMC2 overflows 16 instructions after it starts: its PMI waits in the
    // IRR (interrupts are off in these guests).
    set_lapic_reg(SVR, 0x1ff);
    set_lapic_reg(LVTPC, u32::from(PMI));
    w(GLOBAL_CTRL, 0);
    w(EVTSEL0 + 2, SEL | INT | 0xc0);
    w(PMC0 + 2, 0xffff_fff0);
    w(GLOBAL_CTRL, 1 << 2);
    for i in 0..100 {
        core::hint::black_box(i);
    }
    w(GLOBAL_CTRL, 0);
    let pmc2 = r(PMC0 + 2);
    // Check names per side of the move (no allocation in the guest).
    let pending = |t: &mut Test, names: [&str; 3]| {
        t.check(
            names[0],
            lapic_irr(PMI) && irqs(PMI) == 0,
            format_args!("IRR {}, taken {}", lapic_irr(PMI), irqs(PMI)),
        );
        t.eq(names[1], r(GLOBAL_STATUS) & 0b111, 1 << 2);
        t.check(
            names[2],
            lapic_reg(LVTPC) & LVT_MASKED != 0,
            format_args!("LVTPC {:#x}", lapic_reg(LVTPC)),
        );
    };
    pending(
        t,
        [
            "before.pmi-in-irr",
            "before.global-status",
            "before.lvtpc-masked",
        ],
    );

    w(EVTSEL0, SEL | 0xc0);
    w(EVTSEL0 + 1, SEL | 0xc4);
    w(FIXED_CTR_CTRL, 0b11);
    w(PMC0, START[0]);
    w(PMC0 + 1, START[1]);
    w(FIXED_CTR0, START[2]);
    println!("ready");
    let chunks: u64;
    // SAFETY: WRMSR of GLOBAL_CTRL, a read of COM1's status port and
    // register arithmetic. Counted: the enabling WRMSR and `mov edx` (2);
    // per chunk `mov`, M x (dec, jnz), in, inc, test, jz (2M + 5
    // instructions, M + 1 branches); before the disabling WRMSR, mov, xor,
    // xor (3).
    unsafe {
        asm!(
            "wrmsr",
            "mov edx, {lsr:e}",
            "2:",
            "mov r8, {m}",
            "3:",
            "dec r8",
            "jnz 3b",
            "in al, dx",
            "inc {chunks}",
            "test al, 1",
            "jz 2b",
            "mov ecx, 0x38f",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            m = in(reg) M,
            lsr = in(reg) COM1_LSR,
            chunks = inout(reg) 0u64 => chunks,
            inout("ecx") GLOBAL_CTRL => _,
            inout("eax") ALL as u32 => _,
            inout("edx") (ALL >> 32) as u32 => _,
            out("r8") _,
            options(nostack),
        );
    }
    // The host's byte.
    let _ = arch::getc();
    let insns = 2 + chunks * (5 + 2 * M) + 3;
    let branches = chunks * (M + 1);
    t.measure("chunks", format_args!("{chunks}"));
    t.eq("pmc0.instructions", r(PMC0), START[0] + insns);
    t.eq("pmc1.branches", r(PMC0 + 1), START[1] + branches);
    t.eq("fixed0.instructions", r(FIXED_CTR0), START[2] + insns);
    t.eq("global-ctrl", r(GLOBAL_CTRL), 0);

    pending(
        t,
        [
            "after.pmi-in-irr",
            "after.global-status",
            "after.lvtpc-masked",
        ],
    );
    t.eq("after.pmc2", r(PMC0 + 2), pmc2);
    // SAFETY: the PMI's stub counts it and EOIs; interrupts off again.
    unsafe { asm!("sti", "nop", "nop", "cli", options(nostack)) };
    t.eq("after.one-pmi-taken", irqs(PMI), 1);
}
