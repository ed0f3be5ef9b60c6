//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu matrix=off
//!
//! The PMU across savevm/loadvm or migration: PMC0 counts instructions,
//! PMC1 branches and FIXED_CTR0 instructions, from values that are not 0
//! (so a restart from 0 shows); the guest prints "ready" and then, with the
//! counters running, runs chunks of a known loop for 3 s of TSC time, each
//! chunk of known length. The host test migrates the VM to a file and
//! resumes it in a new QEMU meanwhile. Afterwards every counter must hold
//! its start value plus exactly what the chunks retired. Not part of the
//! matrix.
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
    use guest::arch::{self, rdmsr, rdtsc, wrmsr};
    use guest::println;

    const PMC0: u32 = 0xc1;
    const EVTSEL0: u32 = 0x186;
    const FIXED_CTR0: u32 = 0x309;
    const FIXED_CTR_CTRL: u32 = 0x38d;
    const GLOBAL_CTRL: u32 = 0x38f;
    /// EN | OS | USR; instructions (C0H) and branches (C4H) retired.
    const SEL: u64 = 1 << 22 | 1 << 17 | 1 << 16;
    const ALL: u64 = 0b11 | 1 << 32;
    /// Loop iterations per chunk.
    const M: u64 = 10_000;
    /// Start values: the legacy PMC writes sign-extend bit 31.
    const START: [u64; 3] = [0x1234_5678, 0x0765_4321, 0x9_8765_4321];

    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-pmu-migrate", "CPUID 0xA: no architectural PMU");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("PMU MSR");
    w(GLOBAL_CTRL, 0);
    w(EVTSEL0, SEL | 0xc0);
    w(EVTSEL0 + 1, SEL | 0xc4);
    w(FIXED_CTR_CTRL, 0b11);
    w(PMC0, START[0]);
    w(PMC0 + 1, START[1]);
    w(FIXED_CTR0, START[2]);
    // 3 s at the TSC's rate (kvmclock's 2 GHz default under rustkvm; the
    // exact rate does not matter, only that migration falls inside).
    let deadline = rdtsc() + 6_000_000_000;
    println!("ready");
    let chunks: u64;
    // SAFETY: WRMSR of GLOBAL_CTRL, RDTSC and register arithmetic.
    // Counted: the enabling WRMSR (1); per chunk `mov`, M x (dec, jnz),
    // rdtsc, shl, or, inc, cmp, jb (7 + 2M instructions, M + 1 branches);
    // before the disabling WRMSR, mov, xor, xor (3).
    unsafe {
        asm!(
            "wrmsr",
            "2:",
            "mov r8, {m}",
            "3:",
            "dec r8",
            "jnz 3b",
            "rdtsc",
            "shl rdx, 32",
            "or rax, rdx",
            "inc {chunks}",
            "cmp rax, {deadline}",
            "jb 2b",
            "mov ecx, 0x38f",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            m = in(reg) M,
            deadline = in(reg) deadline,
            chunks = inout(reg) 0u64 => chunks,
            inout("ecx") GLOBAL_CTRL => _,
            inout("eax") ALL as u32 => _,
            inout("edx") (ALL >> 32) as u32 => _,
            out("r8") _,
            options(nostack),
        );
    }
    let insns = 1 + chunks * (7 + 2 * M) + 3;
    let branches = chunks * (M + 1);
    let r = |i| rdmsr(i).expect("PMU MSR");
    t.measure("chunks", format_args!("{chunks}"));
    t.eq("pmc0.instructions", r(PMC0), START[0] + insns);
    t.eq("pmc1.branches", r(PMC0 + 1), START[1] + branches);
    t.eq("fixed0.instructions", r(FIXED_CTR0), START[2] + insns);
    t.eq("global-ctrl", r(GLOBAL_CTRL), 0);
}
