//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on compare=off needs=pmu,lbr matrix=off
//!
//! LBR across savevm/loadvm or migration: records taken before the move
//! (a near jump, call and return, with Jcc suppressed by LBR_SELECT) and
//! recording still on while the guest waits for the host's "go on" (a
//! loop of Jcc only, which LBR_SELECT drops); after the move one more jump
//! must land on top of them, and IA32_DEBUGCTL, LBR_SELECT, TOS and every
//! record must be what the source had. Not part of the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-lbr-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch::{self, rdmsr, wrmsr};
    use guest::println;
    use guest::x86_pmu::{
        lbr_format, DEBUGCTL, DEBUGCTL_LBR as LBR, FREEZE_LBRS_ON_PMI, LBR_FROM, LBR_SELECT,
        LBR_TO, LBR_TOS,
    };

    /// LBR_SELECT: suppress Jcc.
    const SEL_JCC: u64 = 1 << 2;
    /// COM1's line status register; bit 0: a byte arrived.
    const COM1_LSR: u32 = 0x3fd;

    if lbr_format() == 0 {
        t.skip("x86-lbr-migrate", "no PERF_CAPABILITIES.LBR_FMT");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("LBR MSR");
    let r = |i| rdmsr(i).expect("LBR MSR");
    w(DEBUGCTL, 0);
    w(LBR_SELECT, SEL_JCC);
    w(LBR_TOS, 0);
    for i in 0..32 {
        w(LBR_FROM + i, 0);
        w(LBR_TO + i, 0);
    }

    // Before the move: jump, call, return, jump (labels 20-24), then recording
    // off (DEBUGCTL keeps FREEZE_LBRS_ON_PMI) for the "ready" line.
    let mut at = [0u64; 5];
    // SAFETY: WRMSRs of DEBUGCTL; branches within the block; the CALL
    // uses the stack.
    unsafe {
        asm!(
            "lea rax, [rip + 20f]",
            "mov [rdi], rax",
            "lea rax, [rip + 21f]",
            "mov [rdi + 8], rax",
            "lea rax, [rip + 22f]",
            "mov [rdi + 16], rax",
            "lea rax, [rip + 23f]",
            "mov [rdi + 24], rax",
            "lea rax, [rip + 24f]",
            "mov [rdi + 32], rax",
            "mov ecx, 0x1d9",
            "mov eax, {on:e}",
            "xor edx, edx",
            "wrmsr",
            "20:",
            "jmp 21f",
            "21:",
            "call 23f",
            "22:",
            "jmp 24f",
            "23:",
            "ret",
            "24:",
            "mov eax, {off:e}",
            "wrmsr",
            on = in(reg) (LBR | FREEZE_LBRS_ON_PMI) as u32,
            off = in(reg) FREEZE_LBRS_ON_PMI as u32,
            in("rdi") at.as_mut_ptr(),
            out("rax") _, out("rcx") _, out("rdx") _,
        );
    }
    t.eq("before.tos", r(LBR_TOS), 4);
    println!("ready");

    // Recording during the move: the wait loop's Jcc is suppressed; the
    // jump after it (label 30 to 31) is the destination's record.
    let (from, to): (u64, u64);
    // SAFETY: WRMSRs of DEBUGCTL, a read of COM1's status port.
    unsafe {
        asm!(
            "lea {from}, [rip + 30f]",
            "lea {to}, [rip + 31f]",
            "mov ecx, 0x1d9",
            "mov eax, {on:e}",
            "xor edx, edx",
            "wrmsr",
            "mov edx, {lsr:e}",
            "2:",
            "in al, dx",
            "test al, 1",
            "jz 2b",
            "30:",
            "jmp 31f",
            "31:",
            "mov eax, {off:e}",
            "xor edx, edx",
            "wrmsr",
            on = in(reg) (LBR | FREEZE_LBRS_ON_PMI) as u32,
            off = in(reg) FREEZE_LBRS_ON_PMI as u32,
            lsr = in(reg) COM1_LSR,
            from = out(reg) from,
            to = out(reg) to,
            out("rax") _, out("rcx") _, out("rdx") _,
            options(nostack),
        );
    }
    // The host's byte.
    let _ = arch::getc();
    t.eq("after.debugctl", r(DEBUGCTL), FREEZE_LBRS_ON_PMI);
    t.eq("after.select", r(LBR_SELECT), SEL_JCC);
    t.eq("after.tos", r(LBR_TOS), 5);
    let rec = |i: u32| (r(LBR_FROM + i), r(LBR_TO + i));
    // TOS was 0: records 1-4 before the move, 5 after it.
    t.eq("after.record.jmp", rec(1), (at[0], at[1]));
    t.eq("after.record.call", rec(2), (at[1], at[3]));
    t.eq("after.record.ret", rec(3), (at[3], at[2]));
    t.eq("after.record.jmp-before-ready", rec(4), (at[2], at[4]));
    t.eq("after.record.on-the-destination", rec(5), (from, to));
}
