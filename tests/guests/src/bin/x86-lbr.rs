//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on compare=off needs=pmu,lbr
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU, so no LBR)
//!
//! Intel's legacy last branch records as KVM gives them to a guest with an
//! Intel vPMU on an Ice Lake-class host (Linux `arch/x86/kvm/vmx/pmu_intel.c`,
//! `vmx.c`; SDM vol. 3B 18.4 and 18.9), checked against the addresses of
//! the guest's own code: kvm-unit-tests' `pmu_lbr` (PERF_CAPABILITIES.LBR_FMT,
//! the CORE LBR MSRs #GP, the depth, non-zero FROM/TO after a loop), then
//! exactness: one sequence of every near branch kind, a software interrupt
//! and its IRETQ gives exactly its ten taken branches, in order, with their
//! true sources and targets (a branch not taken gives none); LBR_SELECT
//! suppresses by kind and by CPL; call-stack mode keeps just the calls still
//! open; IA32_DEBUGCTL drops BTF and #GPs on other bits; a PMI with
//! FREEZE_LBRS_ON_PMI stops recording right after the instruction that
//! overflowed (exactly under emulation). Every branch runs at CPL 0.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-lbr", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod lbr {
    use core::arch::{asm, global_asm};
    use guest::arch::{self, nmis, set_lapic_reg};
    use guest::x86_pmu::{
        lbr_format, rd, wr, DEBUGCTL, DEBUGCTL_LBR, EN, EVTSEL0, FREEZE_LBRS_ON_PMI, GLOBAL_CTRL,
        GLOBAL_OVF_CTRL, GLOBAL_STATUS, INT, LBR_FROM, LBR_INFO, LBR_SELECT, LBR_TO, LBR_TOS,
        LVTPC, LVT_NMI, OS, PMC0, SVR,
    };
    use guest::{Backend, Test};

    /// IA32_DEBUGCTL's BTF and TR bits.
    const DEBUGCTL_BTF: u64 = 1 << 1;
    const DEBUGCTL_TR: u64 = 1 << 6;
    /// The Core 2 LBR address a newer model lacks.
    const LBR_CORE_FROM: u32 = 0x40;
    /// LBR_SELECT: suppress CPL 0, CPL > 0, Jcc, near indirect jumps, near
    /// relative jumps, far branches; call-stack mode.
    const SEL_CPL_EQ_0: u64 = 1 << 0;
    const SEL_CPL_NEQ_0: u64 = 1 << 1;
    const SEL_JCC: u64 = 1 << 2;
    const SEL_NEAR_IND_JMP: u64 = 1 << 6;
    const SEL_NEAR_REL_JMP: u64 = 1 << 7;
    const SEL_FAR: u64 = 1 << 8;
    const SEL_CALLSTACK: u64 = 1 << 9;
    /// The vector of the sequence's software interrupt.
    const INT_VECTOR: u8 = 0x80;
    /// The emulated stack's depth (KVM on Ice Lake: 32).
    const DEPTH: u32 = 32;

    // An interrupt gate that returns at once: INT 0x80's target.
    global_asm!(".global lbr_int_gate", "lbr_int_gate:", "iretq");
    extern "C" {
        fn lbr_int_gate();
    }

    /// The records from the newest back, `n` of them: (from, to).
    fn newest(n: u32) -> [(u64, u64); 12] {
        let tos = rd(LBR_TOS) as u32;
        let mut out = [(0, 0); 12];
        for (i, o) in out.iter_mut().enumerate().take(n as usize) {
            let k = tos.wrapping_sub(i as u32) % DEPTH;
            *o = (rd(LBR_FROM + k), rd(LBR_TO + k));
        }
        out
    }

    /// An empty stack with TOS 0 and filter `select`.
    fn clear(select: u64) {
        wr(DEBUGCTL, 0);
        wr(LBR_SELECT, select);
        wr(LBR_TOS, 0);
        for i in 0..DEPTH {
            wr(LBR_FROM + i, 0);
            wr(LBR_TO + i, 0);
        }
    }

    /// Set DEBUGCTL.LBR, take ten branches (labels 20-32), clear
    /// DEBUGCTL, all in one block of code: `at[i]` is label `20 + i`.
    fn sequence() -> [u64; 13] {
        let mut at = [0u64; 13];
        // SAFETY: WRMSRs of DEBUGCTL, branches within this block, CALLs
        // onto the stack (not nostack), and INT 0x80, whose gate only
        // returns.
        unsafe {
            asm!(
                "lea rax, [rip + 20f]", "mov [rdi + 0], rax",
                "lea rax, [rip + 21f]", "mov [rdi + 8], rax",
                "lea rax, [rip + 22f]", "mov [rdi + 16], rax",
                "lea rax, [rip + 23f]", "mov [rdi + 24], rax",
                "lea rax, [rip + 24f]", "mov [rdi + 32], rax",
                "lea rax, [rip + 25f]", "mov [rdi + 40], rax",
                "lea rax, [rip + 26f]", "mov [rdi + 48], rax",
                "lea rax, [rip + 27f]", "mov [rdi + 56], rax",
                "lea rax, [rip + 28f]", "mov [rdi + 64], rax",
                "lea rax, [rip + 29f]", "mov [rdi + 72], rax",
                "lea rax, [rip + 30f]", "mov [rdi + 80], rax",
                "lea rax, [rip + 31f]", "mov [rdi + 88], rax",
                "lea rax, [rip + 32f]", "mov [rdi + 96], rax",
                "mov ecx, 0x1d9",
                "mov eax, 1",
                "xor edx, edx",
                "wrmsr",
                "20:", "jmp 21f",        // 1: near relative jump
                "ud2",
                "21:", "call 23f",       // 2: near relative call
                "22:", "jmp 24f",        // 4: near relative jump
                "23:", "ret",            // 3: near return to 22
                "24:", "lea rax, [rip + 26f]",
                "25:", "jmp rax",        // 5: near indirect jump
                "ud2",
                "26:", "xor r9d, r9d",
                "test r9d, r9d",
                "jnz 28f",               // not taken: no record
                "27:", "jz 28f",         // 6: Jcc
                "ud2",
                "28:", "lea rax, [rip + 32f]",
                "29:", "call rax",       // 7: near indirect call
                "30:", "int 0x80",       // 9: far (the interrupt)
                "31:",                   // 10: far (IRETQ) to here
                "mov ecx, 0x1d9",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                "jmp 33f",
                "32:", "ret",            // 8: near return to 30
                "33:",
                in("rdi") at.as_mut_ptr(),
                out("rax") _, out("rcx") _, out("rdx") _, out("r9") _,
            );
        }
        at
    }

    /// The sequence's records, oldest first, as the labels say.
    fn expected(at: &[u64; 13], gate: u64) -> [(u64, u64); 10] {
        let l = |n: usize| at[n - 20];
        [
            (l(20), l(21)),
            (l(21), l(23)),
            (l(23), l(22)),
            (l(22), l(24)),
            (l(25), l(26)),
            (l(27), l(28)),
            (l(29), l(32)),
            (l(32), l(30)),
            (l(30), gate),
            (gate, l(31)),
        ]
    }

    /// Call-stack mode: main calls a, a calls b (which returns), a calls
    /// c, and c stops recording. `at[i]` is label `40 + i`.
    fn call_chain() -> [u64; 7] {
        let mut at = [0u64; 7];
        // SAFETY: as in `sequence`.
        unsafe {
            asm!(
                "lea rax, [rip + 40f]", "mov [rdi + 0], rax",
                "lea rax, [rip + 41f]", "mov [rdi + 8], rax",
                "lea rax, [rip + 42f]", "mov [rdi + 16], rax",
                "lea rax, [rip + 43f]", "mov [rdi + 24], rax",
                "lea rax, [rip + 44f]", "mov [rdi + 32], rax",
                "lea rax, [rip + 45f]", "mov [rdi + 40], rax",
                "lea rax, [rip + 46f]", "mov [rdi + 48], rax",
                "mov ecx, 0x1d9",
                "mov eax, 1",
                "xor edx, edx",
                "wrmsr",
                "40:", "call 42f",       // main -> a
                "41:", "jmp 47f",
                "42:", "call 45f",       // a -> b
                "43:", "call 46f",       // a -> c
                "44:", "ret",
                "45:", "ret",            // b returns
                "46:",                   // c: stop recording, return
                "mov ecx, 0x1d9",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                "ret",
                "47:",
                in("rdi") at.as_mut_ptr(),
                out("rax") _, out("rcx") _, out("rdx") _,
            );
        }
        at
    }

    /// With DEBUGCTL = LBR | FREEZE_LBRS_ON_PMI: enable PMC0 (its WRMSR is
    /// the 1st instruction counted), `mov r8, 20` (2nd), then `dec r8`
    /// (3rd, 5th, ...) and `jnz` (4th, ...): with 5 to go the PMI comes
    /// right after the second `dec`, one taken `jnz` (label 51 to 50)
    /// into the loop. Returns (label 50, label 51).
    fn freeze_loop() -> (u64, u64) {
        let (top, jnz): (u64, u64);
        // SAFETY: WRMSRs of DEBUGCTL and GLOBAL_CTRL, a register loop.
        unsafe {
            asm!(
                "lea {top}, [rip + 50f]",
                "lea {jnz}, [rip + 51f]",
                "mov ecx, 0x1d9",
                "mov eax, {debugctl:e}",
                "xor edx, edx",
                "wrmsr",
                "mov ecx, 0x38f",
                "mov eax, 1",
                "wrmsr",
                "mov r8, 20",
                "50:", "dec r8",
                "51:", "jnz 50b",
                "xor eax, eax",
                "wrmsr",
                debugctl = in(reg) (DEBUGCTL_LBR | FREEZE_LBRS_ON_PMI) as u32,
                top = out(reg) top,
                jnz = out(reg) jnz,
                out("rax") _, out("rcx") _, out("rdx") _, out("r8") _,
                options(nostack),
            );
        }
        (top, jnz)
    }

    fn faults(r: Result<impl Sized, arch::Fault>) -> bool {
        matches!(r, Err(f) if f.vector == arch::GP_VECTOR)
    }

    pub fn main(t: &mut Test) {
        let fmt = lbr_format();
        if arch::cpuid(0xa, 0)[0] & 0xff == 0 || fmt == 0 {
            t.skip("x86-lbr", "no PMU with PERF_CAPABILITIES.LBR_FMT");
            return;
        }
        let emulated = guest::backend() != Some(Backend::Kvm);
        t.measure("lbr-fmt", format_args!("{fmt}"));
        if emulated {
            t.eq("perf-capabilities.lbr-fmt", fmt, 5);
        }

        // kvm-unit-tests pmu_lbr: the CORE addresses #GP, so the NHM ones
        // are used; the depth is the first index whose FROM write #GPs.
        t.check(
            "core-lbr-msrs.gp",
            faults(arch::wrmsr(LBR_CORE_FROM, 0)),
            format_args!("MSR_LBR_CORE_FROM write did not #GP"),
        );
        clear(0);
        // (pmu_lbr's loop stops at 32: TO + 32 is IA32_TSC_DEADLINE.)
        let depth = (0..DEPTH)
            .find(|&i| faults(arch::wrmsr(LBR_FROM + i, 0)) || faults(arch::wrmsr(LBR_TO + i, 0)))
            .unwrap_or(DEPTH);
        t.measure("lbr-depth", format_args!("{depth}"));
        t.check("depth.nonzero", depth > 0, format_args!("{depth}"));
        if emulated {
            t.eq("depth", depth, DEPTH);
            t.check(
                "info-msrs",
                (0..DEPTH).all(|i| arch::wrmsr(LBR_INFO + i, 0).is_ok()),
                format_args!("an MSR_LBR_INFO_n write #GPs"),
            );
        }

        // IA32_DEBUGCTL: BTF dropped, TR #GPs (KVM's vmx_set_msr).
        t.eq(
            "debugctl.btf-dropped",
            arch::wrmsr(DEBUGCTL, DEBUGCTL_LBR | DEBUGCTL_BTF).is_ok(),
            true,
        );
        t.eq("debugctl.reads", rd(DEBUGCTL), DEBUGCTL_LBR);
        t.check(
            "debugctl.tr.gp",
            faults(arch::wrmsr(DEBUGCTL, DEBUGCTL_TR)),
            format_args!("no #GP"),
        );
        wr(DEBUGCTL, 0);

        // Exact records of one sequence of every kind.
        let gate = lbr_int_gate as *const () as u64;
        arch::set_interrupt_gate(INT_VECTOR, gate);
        clear(0);
        let at = sequence();
        let want = expected(&at, gate);
        t.eq("sequence.tos", rd(LBR_TOS), 10);
        let got = newest(10);
        for (i, w) in want.iter().rev().enumerate() {
            t.check(
                "sequence.record",
                got[i] == *w,
                format_args!("newest-{i}: got {:x?}, want {:x?}", got[i], w),
            );
        }
        // kvm-unit-tests: no FROM/TO of the used records is 0.
        t.check(
            "pmu_lbr.from-to-nonzero",
            got[..10].iter().all(|&(f, to)| f != 0 && to != 0),
            format_args!("{got:x?}"),
        );

        // LBR_SELECT: Jcc suppressed; then everything at CPL 0.
        clear(SEL_JCC);
        let at = sequence();
        let mut want_nojcc = [(0, 0); 9];
        let all = expected(&at, gate);
        let mut k = 0;
        for (i, w) in all.iter().enumerate() {
            if i != 5 {
                want_nojcc[k] = *w;
                k += 1;
            }
        }
        t.eq("select.jcc.tos", rd(LBR_TOS), 9);
        let got = newest(9);
        for (i, w) in want_nojcc.iter().rev().enumerate() {
            t.check(
                "select.jcc.record",
                got[i] == *w,
                format_args!("newest-{i}: got {:x?}, want {:x?}", got[i], w),
            );
        }
        clear(SEL_CPL_EQ_0);
        sequence();
        t.eq("select.cpl0.tos", rd(LBR_TOS), 0);
        t.eq("select.cpl0.from", rd(LBR_FROM + 1), 0);

        // Call-stack mode (Linux's request for kernel call chains): the
        // returns pop, so a->c and main->a remain.
        clear(
            SEL_CALLSTACK | SEL_CPL_NEQ_0 | SEL_JCC | SEL_NEAR_IND_JMP | SEL_NEAR_REL_JMP | SEL_FAR,
        );
        let at = call_chain();
        t.eq("callstack.tos", rd(LBR_TOS), 2);
        let got = newest(2);
        t.eq("callstack.newest", got[0], (at[3], at[6]));
        t.eq("callstack.oldest", got[1], (at[0], at[2]));

        // A PMI freezes the records (KVM's version-2 PMU:
        // intel_pmu_legacy_freezing_lbrs_on_pmi clears DEBUGCTL.LBR).
        clear(0);
        set_lapic_reg(SVR, 0x1ff);
        wr(GLOBAL_CTRL, 0);
        wr(GLOBAL_OVF_CTRL, 1);
        wr(EVTSEL0, EN | OS | INT | 0xc0);
        wr(PMC0, 5u64.wrapping_neg() & 0xffff_ffff);
        set_lapic_reg(LVTPC, LVT_NMI);
        let (n0, _) = nmis();
        let (top, jnz) = freeze_loop();
        t.eq("freeze.one-pmi", nmis().0 - n0, 1);
        t.eq("freeze.status", rd(GLOBAL_STATUS) & 1, 1);
        t.eq("freeze.debugctl", rd(DEBUGCTL), FREEZE_LBRS_ON_PMI);
        let tos = rd(LBR_TOS);
        if emulated {
            t.eq("freeze.tos", tos, 1);
            t.eq("freeze.record", newest(1)[0], (jnz, top));
        } else {
            t.check("freeze.tos", tos < 20, format_args!("{tos}: not frozen"));
        }
        wr(GLOBAL_OVF_CTRL, 1);
        wr(EVTSEL0, 0);
        wr(DEBUGCTL, 0);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    lbr::main(t);
}
