//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU)
//! rustkvm-expect-skip: kvm pmi.before-interrupt.rip
//!   (a hardware PMI has skid: the interrupt it should precede may come first)
//!
//! The Intel architectural PMU (version 2) a KVM guest gets with `pmu=on`
//! (Intel SDM vol. 3 ch. 20; Linux `arch/x86/kvm/pmu.c`,
//! `vmx/pmu_intel.c`), counted exactly: CPUID 0xA; instructions and
//! branches retired of known code on GP and fixed counters; GLOBAL_CTRL and
//! the USR/OS filters gate counting; RDPMC and RDMSR read the count before
//! themselves; the WRMSR that enables counting counts (KVM counts the
//! instructions it emulates), the one that disables it does not; an
//! instruction that faults does not retire (nor does the rest of its
//! block); a REP string instruction retires once, however many iterations;
//! a counter that overflows with INT set raises exactly one PMI through
//! LVTPC (here an NMI), right after the instruction that wrapped it (zero
//! skid), sets GLOBAL_STATUS and masks LVTPC. Every guest instruction runs
//! at CPL 0. SKIPs where CPUID 0xA reports no PMU (plain TCG).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod pmu {
    use core::arch::asm;
    use guest::arch::{self, lapic_reg, nmis, set_lapic_reg};
    use guest::x86_pmu::{
        branch_loop, counted_loop, nop_sled, popf_sti, rd, wr, EN, EVTSEL0, FIXED_CTR0,
        FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS, INT, LVTPC, LVT_MASKED,
        LVT_NMI, OS, PMC0, PMC0_FULL, SVR, USR,
    };
    use guest::{Test, Tolerance};
    /// What hardware (the `kvm` backend) may add to a count around the
    /// measured code; emulation counts exactly.
    const COUNT: Tolerance = Tolerance { hardware: 16 };
    /// How far past the overflowing instruction a PMI may land on hardware
    /// (skid, SDM vol. 3 §20.5.3; bytes of NOPs / loop); none in emulation.
    const SKID: Tolerance = Tolerance { hardware: 64 };

    /// Start and stop counting through GLOBAL_CTRL.
    fn global(enable: u64) -> (u32, u64) {
        (GLOBAL_CTRL, enable)
    }

    /// Architectural events: instructions retired, branches retired.
    const INSNS: u64 = 0xc0;
    const BRANCHES: u64 = 0xc4;
    /// GLOBAL_CTRL: GP counters 0 and 1, fixed counter 0.
    const ALL: u64 = 0b11 | 1 << 32;
    /// A non-canonical address: loading from it raises #GP.
    const NON_CANONICAL: u64 = 0x8000_0000_0000_0000;

    /// Everything stopped and zero; PMC0 counts instructions, PMC1
    /// branches (`sel` adds bits to both), FIXED_CTR0 instructions.
    fn program(sel: u64) {
        wr(GLOBAL_CTRL, 0);
        wr(EVTSEL0, EN | sel | INSNS);
        wr(EVTSEL0 + 1, EN | sel | BRANCHES);
        wr(FIXED_CTR_CTRL, 0b11);
        for c in [PMC0, PMC0 + 1, FIXED_CTR0] {
            wr(c, 0);
        }
    }

    /// (PMC0, PMC1, FIXED_CTR0).
    fn counts() -> (u64, u64, u64) {
        (rd(PMC0), rd(PMC0 + 1), rd(FIXED_CTR0))
    }

    /// Enable, then RDPMC `ecx` right after one more instruction.
    fn rdpmc_in_flight(ecx: u32) -> u64 {
        let (lo, hi): (u32, u32);
        // SAFETY: WRMSR of GLOBAL_CTRL and RDPMC at CPL 0.
        unsafe {
            asm!(
                "wrmsr",
                "mov ecx, {sel:e}",
                "rdpmc",
                "mov {lo:e}, eax",
                "mov {hi:e}, edx",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                sel = in(reg) ecx,
                lo = out(reg) lo,
                hi = out(reg) hi,
                inout("ecx") GLOBAL_CTRL => _,
                inout("eax") ALL as u32 => _,
                inout("edx") (ALL >> 32) as u32 => _,
                options(nostack),
            );
        }
        u64::from(hi) << 32 | u64::from(lo)
    }

    /// Enable, load from `addr` (a fault resumes after the load), jump
    /// (the block's branch), disable. The load and the jump share a block.
    fn load_then_jump(addr: u64) {
        // SAFETY: the IDT stub resumes at label 3 if the load faults; the
        // rest is WRMSR of GLOBAL_CTRL.
        unsafe {
            asm!(
                "lea {tmp}, [rip + 3f]",
                "mov [rip + guest_recover_rip], {tmp}",
                "wrmsr",
                "mov {tmp}, [{addr}]",
                "3:",
                "jmp 4f",
                "4:",
                "mov qword ptr [rip + guest_recover_rip], 0",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                addr = in(reg) addr,
                tmp = out(reg) _,
                inout("ecx") GLOBAL_CTRL => _,
                inout("eax") ALL as u32 => _,
                inout("edx") (ALL >> 32) as u32 => _,
                options(nostack),
            );
        }
        // The stub recorded the fault; consume it so later catches are clean.
        let _ = arch::rdmsr(GLOBAL_STATUS);
    }

    static mut BUF: [u8; 80_000] = [0; 80_000];

    /// What the CPL-3 code below saw.
    static mut USER_RDPMC: Result<u64, arch::Fault> = Ok(0);

    /// At CPL 3: RDPMC of GP counter 0.
    extern "C" fn user_rdpmc() {
        let r = arch::rdpmc(0);
        // SAFETY: one vCPU; read after call_user returns.
        unsafe { (&raw mut USER_RDPMC).write_volatile(r) };
    }

    /// At CPL 3: `dec r8; jnz` 10 000 times.
    extern "C" fn user_loop() {
        // SAFETY: register arithmetic.
        unsafe {
            asm!(
                "mov r8, 10000",
                "2:",
                "dec r8",
                "jnz 2b",
                out("r8") _,
                options(nostack, nomem),
            );
        }
    }

    fn set_cr4_pce(on: bool) {
        // SAFETY: CR4.PCE (bit 8) only gates RDPMC at CPL > 0.
        unsafe {
            let mut cr4: u64;
            asm!("mov {}, cr4", out(reg) cr4, options(nostack, nomem));
            cr4 = if on { cr4 | 1 << 8 } else { cr4 & !(1 << 8) };
            asm!("mov cr4, {}", in(reg) cr4, options(nostack, nomem));
        }
    }

    /// Enable, `rep stosb` of `len` bytes, disable: 6 instructions counted.
    fn rep_stosb(len: u64) {
        // SAFETY: stores stay inside BUF (len <= its size).
        unsafe {
            asm!(
                "wrmsr",
                "mov rcx, r9",
                "rep stosb",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                inout("rdi") (&raw mut BUF) as u64 => _,
                in("r9") len.min(80_000),
                inout("ecx") GLOBAL_CTRL => _,
                inout("eax") ALL as u32 => _,
                inout("edx") (ALL >> 32) as u32 => _,
                options(nostack),
            );
        }
    }

    /// Arm a PMI: counter `c` (GP) counts `event` with INT and overflows
    /// on the `period`-th event (legacy PMC writes sign-extend bit 31).
    fn arm_pmi(c: u32, event: u64, period: u64) {
        wr(GLOBAL_CTRL, 0);
        wr(GLOBAL_OVF_CTRL, ALL);
        wr(EVTSEL0, 0);
        wr(EVTSEL0 + 1, 0);
        wr(FIXED_CTR_CTRL, 0);
        wr(EVTSEL0 + c, EN | OS | USR | INT | event);
        wr(PMC0 + c, period.wrapping_neg() & 0xffff_ffff);
        set_lapic_reg(LVTPC, LVT_NMI);
    }

    pub fn main(t: &mut Test) {
        let leaf = arch::cpuid(0xa, 0);
        let version = leaf[0] & 0xff;
        if arch::cpuid(0, 0)[0] < 0xa || version == 0 {
            t.skip("x86-pmu", "CPUID 0xA: no architectural PMU");
            return;
        }
        t.eq("cpuid.0xa.version", version, 2);
        // 4 unless -accel rustkvm,pmu-counters=N (the host test checks).
        let gp = (leaf[0] >> 8) & 0xff;
        t.measure("cpuid.0xa.gp-counters", format_args!("{gp}"));
        t.check(
            "gp-counters.range",
            (2..=8).contains(&gp),
            format_args!("{gp}"),
        );
        t.eq("cpuid.0xa.gp-width", (leaf[0] >> 16) & 0xff, 48);
        t.eq("cpuid.0xa.fixed-counters", leaf[3] & 0x1f, 3);
        t.eq("cpuid.0xa.fixed-width", (leaf[3] >> 5) & 0xff, 48);
        t.eq("global-ctrl.reset", rd(GLOBAL_CTRL), (1 << gp) - 1);
        // The counters and selects beyond the PMU's #GP (KVM).
        if gp < 8 {
            let beyond = [PMC0 + gp, EVTSEL0 + gp];
            for msr in beyond {
                t.check(
                    "beyond-gp-counters.gp",
                    matches!(arch::rdmsr(msr), Err(f) if f.vector == arch::GP_VECTOR),
                    format_args!("MSR {msr:#x}"),
                );
            }
        }

        // RDPMC's ECX[31:16] is the counter type, GP (0) or fixed
        // (0x4000): "fast" reads (bit 31) and other types #GP (KVM since
        // Linux 6.9; kvm-unit-tests reports the fast reads as SKIP then).
        for ecx in [1u32 << 31, 3 << 30, 1 << 16] {
            t.check(
                "rdpmc.other-types-gp",
                matches!(arch::rdpmc(ecx), Err(f) if f.vector == arch::GP_VECTOR),
                format_args!("ECX {ecx:#x}"),
            );
        }
        // With PDCM the full-width aliases take 48 bits and #GP on wider
        // values, the legacy MSRs sign-extend bit 31 (kvm-unit-tests'
        // check_gp_counters_write_width).
        let pdcm = arch::cpuid(1, 0)[2] & (1 << 15) != 0;
        t.measure("pdcm", format_args!("{}", u8::from(pdcm)));
        if pdcm {
            t.eq(
                "full-width.48-bits",
                arch::wrmsr(PMC0_FULL, (1 << 48) - 1),
                Ok(()),
            );
            t.eq("full-width.reads-back", rd(PMC0), (1 << 48) - 1);
            t.check(
                "full-width.wider-gp",
                matches!(arch::wrmsr(PMC0_FULL, 0xffff_ff01_2345_6789), Err(f) if f.vector == arch::GP_VECTOR),
                format_args!(""),
            );
            t.eq("full-width.unchanged", rd(PMC0_FULL), (1 << 48) - 1);
            t.eq(
                "legacy.sign-extends",
                arch::wrmsr(PMC0, 0x8000_0000),
                Ok(()),
            );
            t.eq("legacy.sign-extended", rd(PMC0_FULL), 0xffff_8000_0000);
            let _ = arch::wrmsr(PMC0, 0);
        }

        for n in [1u64, 1000, 100_000] {
            program(OS | USR);
            counted_loop(global(ALL), GLOBAL_CTRL, n);
            let (insns, branches, fixed) = counts();
            t.count("loop.instructions", insns, 2 * n + 5, COUNT);
            t.count("loop.branches", branches, n, COUNT);
            t.count("loop.fixed-instructions", fixed, 2 * n + 5, COUNT);
        }

        // GLOBAL_CTRL gates each counter; USR-only counts nothing at CPL 0.
        program(OS | USR);
        counted_loop(global(1 << 32), GLOBAL_CTRL, 100);
        t.eq("global-ctrl.gates", counts(), (0, 0, 205));
        program(USR);
        counted_loop(global(ALL), GLOBAL_CTRL, 100);
        t.eq("usr-only.at-cpl0", counts(), (0, 0, 205));
        program(OS);
        counted_loop(global(ALL), GLOBAL_CTRL, 100);
        t.eq("os-only.at-cpl0", counts(), (205, 100, 205));

        // RDPMC reads the count before itself (the enabling WRMSR and the
        // mov): GP counter 0 and fixed counter 0 (ECX bit 30).
        program(OS | USR);
        t.eq("rdpmc.gp.in-flight", rdpmc_in_flight(0), 2);
        program(OS | USR);
        t.eq("rdpmc.fixed.in-flight", rdpmc_in_flight(1 << 30), 2);

        // A load that faults does not retire, and neither does the branch
        // after it in its block until it really runs; the #GP stub's 15
        // instructions (3 branches: jmp, jz, iretq) do.
        program(OS | USR);
        let word = 0u64;
        load_then_jump(&raw const word as u64);
        let (ok_insns, ok_branches, _) = counts();
        program(OS | USR);
        load_then_jump(NON_CANONICAL);
        let (gp_insns, gp_branches, _) = counts();
        t.eq("fault.instructions", (ok_insns, gp_insns), (7, 7 - 1 + 15));
        t.eq("fault.branches", (ok_branches, gp_branches), (1, 1 + 3));

        // REP STOSB retires once: 0 bytes, 4 KiB, and more than QEMU's
        // 65535 iterations per block run.
        for len in [0u64, 4096, 70_000] {
            program(OS | USR);
            rep_stosb(len);
            t.eq("rep-stosb.instructions", (len, counts().0), (len, 6));
        }

        // Overflow: PMC0 (instructions, INT) wraps on the 10th instruction
        // after enabling; that is the enabling WRMSR and 9 NOPs, so the NMI
        // interrupts the 10th NOP. The 40 NOPs, 3 more instructions and
        // the NMI stub's 6 then count on from 0.
        set_lapic_reg(SVR, 0x1ff);
        let (n0, _) = nmis();
        arm_pmi(0, INSNS, 10);
        let sled = nop_sled(global(1), GLOBAL_CTRL);
        let (n1, rip) = nmis();
        t.eq("pmi.instructions.count", n1 - n0, 1);
        t.count(
            "pmi.instructions.zero-skid",
            rip.wrapping_sub(sled),
            9,
            SKID,
        );
        t.eq("pmi.instructions.status", rd(GLOBAL_STATUS), 1);
        t.eq(
            "pmi.instructions.counter-after",
            rd(PMC0),
            1 + 40 + 3 + 6 - 10,
        );
        t.check(
            "pmi.lvtpc-masked",
            lapic_reg(LVTPC) & LVT_MASKED != 0,
            format_args!("LVTPC {:#x}", lapic_reg(LVTPC)),
        );
        wr(GLOBAL_OVF_CTRL, 1);
        t.eq("global-ovf-ctrl.clears", rd(GLOBAL_STATUS), 0);

        // The PMI comes before a maskable interrupt due at the same
        // boundary (SDM vol. 3 §6.9: NMI before INTR): PMC0 wraps on the
        // POPFQ that sets IF while vector 0xe0 is pending, and the NMI
        // interrupts the instruction after the POPFQ, not the 0xe0 handler;
        // the interrupt follows the NMI's IRETQ.
        let (n0, _) = nmis();
        let i0 = arch::irqs(0xe0);
        arch::self_ipi(0xe0);
        arm_pmi(0, INSNS, 2);
        let after = popf_sti(global(1), GLOBAL_CTRL);
        let (n1, rip) = nmis();
        t.eq(
            "pmi.before-interrupt.taken",
            (n1 - n0, arch::irqs(0xe0) - i0),
            (1, 1),
        );
        if guest::backend() == Some(guest::Backend::Kvm) {
            t.skip(
                "pmi.before-interrupt.rip",
                "a hardware PMI has skid: the interrupt may come first",
            );
        } else {
            t.eq("pmi.before-interrupt.rip", rip.wrapping_sub(after), 0);
        }
        wr(GLOBAL_OVF_CTRL, 1);

        // PMC1 (branches, INT) wraps on the 5th JNZ: the NMI comes back to
        // the loop head right after it.
        let (n0, _) = nmis();
        arm_pmi(1, BRANCHES, 5);
        let head = branch_loop(global(2), GLOBAL_CTRL, 20);
        let (n1, rip) = nmis();
        t.eq("pmi.branches.count", n1 - n0, 1);
        t.count("pmi.branches.zero-skid", rip, head, SKID);
        t.eq("pmi.branches.status", rd(GLOBAL_STATUS), 2);
        // (15 JNZ after the overflow, then the stub's IRETQ)
        t.eq("pmi.branches.counter-after", rd(PMC0 + 1), 16);

        // A cycle counter's PMI (FIXED_CTR1, PMI bit) comes from a timer:
        // after its 2 000 000 cycles (1 ms of guest TSC), not before, and
        // once. The guest spins, and reads the TSC once it has seen the
        // NMI: a TSC read before it may be stale by however long the host
        // kept this vCPU off its CPU in between, which unhalted cycles count
        // (a loaded host made that check fail: seen after 0.36 ms of TSC,
        // counted 6.7 ms of cycles).
        const PERIOD: u64 = 2_000_000;
        let (n0, _) = nmis();
        arm_pmi(0, INSNS, 1 << 40); // nothing else with a PMI
        wr(EVTSEL0, 0);
        wr(FIXED_CTR_CTRL, 0xb << 4);
        wr(FIXED_CTR0 + 1, (1u64 << 48) - PERIOD);
        set_lapic_reg(LVTPC, LVT_NMI);
        let t0 = arch::rdtsc();
        wr(GLOBAL_CTRL, 1 << 33);
        let seen = loop {
            let seen_nmi = nmis().0 != n0;
            let now = arch::rdtsc();
            // (10 s: a hang guard; how soon the host runs the PMI's timer
            // is its load.)
            if seen_nmi || now - t0 > 10_000 * PERIOD {
                break now - t0;
            }
        };
        wr(GLOBAL_CTRL, 0);
        t.eq("pmi.cycles.count", nmis().0 - n0, 1);
        t.check(
            "pmi.cycles.not-early",
            seen >= PERIOD,
            format_args!("seen after {seen} TSC ticks"),
        );
        t.eq("pmi.cycles.status", rd(GLOBAL_STATUS), 1 << 33);
        wr(FIXED_CTR_CTRL, 0);
        wr(GLOBAL_OVF_CTRL, 1 << 33);

        // Masked LVTPC: the overflow sets the status bit, no NMI.
        let (n0, _) = nmis();
        arm_pmi(0, INSNS, 10);
        set_lapic_reg(LVTPC, LVT_NMI | LVT_MASKED);
        nop_sled(global(1), GLOBAL_CTRL);
        t.eq("pmi.masked.count", nmis().0 - n0, 0);
        t.eq("pmi.masked.status", rd(GLOBAL_STATUS), 1);
        wr(GLOBAL_CTRL, 0);

        // CPL 3. USR counts the user loop's 20 000 instructions and only a
        // few around it (the call, the return, SYSCALL); OS counts the
        // kernel side of the round trip (MSR setup, IRETQ: about 100) but
        // none of the loop.
        program(USR);
        wr(EVTSEL0 + 1, EN | OS | INSNS);
        wr(GLOBAL_CTRL, 0b11);
        arch::call_user(user_loop);
        wr(GLOBAL_CTRL, 0);
        let (usr, os) = (rd(PMC0), rd(PMC0 + 1));
        t.check(
            "cpl3.usr-counts-the-user-loop",
            (20_000..20_010).contains(&usr),
            format_args!("USR {usr}"),
        );
        t.check("cpl3.os-does-not", os < 1000, format_args!("OS {os}"));
        // RDPMC at CPL 3: #GP unless CR4.PCE (SDM; KVM the same).
        set_cr4_pce(false);
        arch::call_user(user_rdpmc);
        // SAFETY: written by user_rdpmc, which has returned.
        let r = unsafe { (&raw const USER_RDPMC).read_volatile() };
        t.check(
            "cpl3.rdpmc-without-pce-gp",
            matches!(r, Err(f) if f.vector == arch::GP_VECTOR),
            format_args!("{r:?}"),
        );
        set_cr4_pce(true);
        arch::call_user(user_rdpmc);
        // SAFETY: as above.
        let r = unsafe { (&raw const USER_RDPMC).read_volatile() };
        t.eq("cpl3.rdpmc-with-pce", r, Ok(usr));
        set_cr4_pce(false);

        // Hostile: a period of 1 on an instruction and a branch counter at
        // once (every instruction could overflow something). The first PMI
        // masks LVTPC, so exactly one NMI arrives, and nothing hangs.
        let (n0, _) = nmis();
        arm_pmi(0, INSNS, 1);
        wr(EVTSEL0 + 1, EN | OS | USR | INT | BRANCHES);
        wr(PMC0 + 1, 1u64.wrapping_neg() & 0xffff_ffff);
        set_lapic_reg(LVTPC, LVT_NMI);
        branch_loop(global(0b11), GLOBAL_CTRL, 1000);
        t.eq("storm.one-nmi", nmis().0 - n0, 1);
        t.eq("storm.status", rd(GLOBAL_STATUS), 0b11);
        wr(GLOBAL_OVF_CTRL, 0b11);
        wr(EVTSEL0, 0);
        wr(EVTSEL0 + 1, 0);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    pmu::main(t);
}
