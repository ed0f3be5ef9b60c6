//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on compare=off needs=pmu,pebs
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU, so no PEBS)
//!
//! PEBS record format 4 with the baseline, as KVM 5.18–6.8 gave it to a
//! guest on an Ice Lake server host (`arch/x86/kvm/vmx/pmu_intel.c`; SDM
//! vol. 3B 20.9 and 20.6.2.4), checked against the guest's own code and
//! kvm-unit-tests `pmu_pebs`'s rules: PERF_CAPABILITIES (format 4,
//! baseline), DS and DTES64; the MSRs' reserved bits; a GP counter's
//! overflow writes one basic record (size 32, no groups) whose IP is the
//! very instruction that overflowed it, naming that counter, sets
//! GLOBAL_STATUS bit 62 (not the counter's bit), and reloads the counter
//! from the DS area; an adaptive counter's record carries DATA_CFG's
//! groups (memory info, registers with the next IP and the guest's own
//! values, XMM, LBR entries) in format_size's low bits and size; a fixed
//! counter's PEBS bit is bit 32 + i; a record has the state its
//! instruction left, before a fault of the next instruction or an
//! interrupt due at the same boundary is taken; a DS area that is not
//! mapped gets no record and no status bit. Every instruction runs at CPL 0, LVTPC stays
//! masked (the PMI is checked through GLOBAL_STATUS, as pmu_pebs does).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pebs", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod pebs {
    use core::arch::asm;
    use guest::arch::{self, set_lapic_reg};
    use guest::x86_pmu::PebsPage::{Buffer, Ds};
    use guest::x86_pmu::{
        popf_sti, rd, wr, DATA_CFG, DS_AREA, EN, EVTSEL0, EVTSEL_ADAPTIVE, FIXED_CTR0,
        FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS, GLOBAL_STATUS_BUFFER_OVF,
        LVTPC, LVT_MASKED, OS, PEBS_BASELINE, PEBS_ENABLE, PEBS_FMT, PERF_CAPABILITIES, PMC0,
        PMC0_FULL, SVR,
    };
    use guest::{Backend, Test};

    /// PERF_CAPABILITIES: PEBS_TRAP, PEBS_ARCH_REG, format (11:8), baseline.
    const PEBS_CAPS: u64 = 1 << 6 | 1 << 7 | PEBS_FMT | PEBS_BASELINE;
    /// Instructions retired.
    const INSNS: u64 = 0xc0;
    /// 48-bit counters.
    const MASK: u64 = (1 << 48) - 1;

    /// An empty buffer with the interrupt threshold `threshold` bytes in,
    /// every reset value `reset`, DS_AREA pointing at the DS page.
    fn reset(threshold: u64, reset: u64) {
        wr(GLOBAL_CTRL, 0);
        wr(PEBS_ENABLE, 0);
        Ds.clear();
        Buffer.clear();
        let base = Buffer.addr();
        Ds.set(4, base); // pebs_buffer_base
        Ds.set(5, base); // pebs_index
        Ds.set(6, base + 4096); // pebs_absolute_maximum
        Ds.set(7, base + threshold); // pebs_interrupt_threshold
        for i in 0..16 {
            Ds.set(8 + i, reset); // pebs_event_reset[]
        }
        wr(DS_AREA, Ds.addr());
        wr(GLOBAL_OVF_CTRL, rd(GLOBAL_STATUS));
    }

    /// The bytes written so far.
    fn written() -> u64 {
        Ds.word(5) - Buffer.addr()
    }

    /// asm!: store the address of local label `$label` (defined later) at
    /// `[rdi + $offset]`: each sled reports where its instructions are.
    macro_rules! label_at {
        ($label:literal, $offset:literal) => {
            concat!(
                "lea rax, [rip + ",
                $label,
                "f]\nmov [rdi + ",
                $offset,
                "], rax"
            )
        };
    }

    /// asm!: IA32_PERF_GLOBAL_CTRL := rsi, the WRMSR that starts each
    /// sled's counting (it counts: the 1st instruction).
    macro_rules! global_ctrl_from_rsi {
        () => {
            concat!(
                "mov ecx, 0x38f\n",
                "mov rax, rsi\n",
                "mov rdx, rsi\n",
                "shr rdx, 32\n",
                "wrmsr",
            )
        };
    }

    /// Enable counting with GLOBAL_CTRL = `enable` (that WRMSR counts: 1st
    /// instruction), then `nop` at labels 20, 21, 22, 23 (2nd to 5th), then
    /// `mov ecx`, `xor eax`, `xor edx` and the disabling WRMSR (which does
    /// not count). r8-r15 hold 0x1008..0x100f meanwhile. The labels'
    /// addresses.
    fn sled(enable: u64) -> [u64; 4] {
        let mut at = [0u64; 4];
        // SAFETY: WRMSRs of GLOBAL_CTRL around NOPs; r8-r15 are clobbered.
        unsafe {
            asm!(
                label_at!(20, 0),
                label_at!(21, 8),
                label_at!(22, 16),
                label_at!(23, 24),
                "mov r8, 0x1008",
                "mov r9, 0x1009",
                "mov r10, 0x100a",
                "mov r11, 0x100b",
                "mov r12, 0x100c",
                "mov r13, 0x100d",
                "mov r14, 0x100e",
                "mov r15, 0x100f",
                global_ctrl_from_rsi!(),
                "20:",
                "nop",
                "21:",
                "nop",
                "22:",
                "nop",
                "23:",
                "nop",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                in("rdi") at.as_mut_ptr(),
                in("rsi") enable,
                out("rax") _, out("rcx") _, out("rdx") _,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                out("r12") _, out("r13") _, out("r14") _, out("r15") _,
                options(nostack),
            );
        }
        at
    }

    /// Enable counting with GLOBAL_CTRL = `enable` (1st instruction), a
    /// NOP at label 30 (2nd), UD2 at label 31 (#UD: resumes after it, at
    /// the disabling WRMSR, which does not count). The labels' addresses.
    fn sled_ud2(enable: u64) -> [u64; 2] {
        let mut at = [0u64; 2];
        // SAFETY: as `sled`; the #UD stub resumes at label 32
        // (guest_recover_rip), which clears the recovery address.
        unsafe {
            asm!(
                label_at!(30, 0),
                label_at!(31, 8),
                "lea rax, [rip + 32f]",
                "mov [rip + guest_recover_rip], rax",
                global_ctrl_from_rsi!(),
                "30:",
                "nop",
                "31:",
                "ud2",
                "32:",
                "mov qword ptr [rip + guest_recover_rip], 0",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                in("rdi") at.as_mut_ptr(),
                in("rsi") enable,
                out("rax") _, out("rcx") _, out("rdx") _,
                options(nostack),
            );
        }
        at
    }

    /// GLOBAL_CTRL := `enable`, then `mov ecx, 0x1b` and RDMSR of
    /// IA32_APIC_BASE (the 3rd instruction counted, at label 40; label 41
    /// after it), then GLOBAL_CTRL := 0. Returns the labels' addresses and
    /// the EDX:EAX the RDMSR read.
    fn sled_rdmsr(enable: u64) -> ([u64; 2], u64) {
        let mut at = [0u64; 2];
        let (lo, hi): (u64, u64);
        // SAFETY: WRMSRs of GLOBAL_CTRL around a RDMSR of IA32_APIC_BASE,
        // which every x86 vCPU has.
        unsafe {
            asm!(
                label_at!(40, 0),
                label_at!(41, 8),
                global_ctrl_from_rsi!(),
                "mov ecx, 0x1b",
                "40:",
                "rdmsr",
                "41:",
                "mov r8, rax",
                "mov r9, rdx",
                "mov ecx, 0x38f",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                in("rdi") at.as_mut_ptr(),
                in("rsi") enable,
                out("rax") _, out("rcx") _, out("rdx") _,
                out("r8") lo, out("r9") hi,
                options(nostack),
            );
        }
        (at, hi << 32 | lo)
    }

    /// GLOBAL_CTRL := `enable`, then `mov ecx, 0x187`, `xor eax, eax`,
    /// `xor edx, edx` and a WRMSR of IA32_PERFEVTSEL1 := 0 (the 5th
    /// instruction counted, at label 50; label 51 after it), then
    /// GLOBAL_CTRL := 0.
    fn sled_wrmsr(enable: u64) -> [u64; 2] {
        let mut at = [0u64; 2];
        // SAFETY: WRMSRs of GLOBAL_CTRL around a WRMSR of EVTSEL1 := 0
        // (the guest does not use counter 1 here).
        unsafe {
            asm!(
                label_at!(50, 0),
                label_at!(51, 8),
                global_ctrl_from_rsi!(),
                "mov ecx, 0x187",
                "xor eax, eax",
                "xor edx, edx",
                "50:",
                "wrmsr",
                "51:",
                "mov ecx, 0x38f",
                "wrmsr",
                in("rdi") at.as_mut_ptr(),
                in("rsi") enable,
                out("rax") _, out("rcx") _, out("rdx") _,
                options(nostack),
            );
        }
        at
    }

    fn faults(r: Result<(), arch::Fault>) -> bool {
        matches!(r, Err(f) if f.vector == arch::GP_VECTOR)
    }

    pub fn main(t: &mut Test) {
        let leaf1 = arch::cpuid(1, 0);
        let pdcm = leaf1[2] & 1 << 15 != 0;
        let caps = if pdcm {
            arch::rdmsr(PERF_CAPABILITIES).unwrap_or(0)
        } else {
            0
        };
        if caps & PEBS_FMT == 0 {
            t.skip("x86-pebs", "no PERF_CAPABILITIES.PEBS_FORMAT");
            return;
        }
        let emulated = guest::backend() != Some(Backend::Kvm);
        t.measure("perf-capabilities", format_args!("{caps:#x}"));
        t.eq("pebs-format", (caps >> 8) & 0xf, 4);
        t.check(
            "baseline",
            caps & PEBS_BASELINE != 0,
            format_args!("{caps:#x}"),
        );
        if emulated {
            t.eq("pebs-caps", caps & PEBS_CAPS, 0x44c0);
        }
        t.check(
            "cpuid.ds-dtes64",
            leaf1[3] & 1 << 21 != 0 && leaf1[2] & 1 << 2 != 0,
            format_args!("{leaf1:x?}"),
        );

        // KVM's reserved bits (intel_pmu_refresh with the baseline).
        let gp = (arch::cpuid(0xa, 0)[0] >> 8) & 0xff;
        t.check(
            "pebs-enable.gp-beyond",
            faults(arch::wrmsr(PEBS_ENABLE, 1 << gp)),
            format_args!(""),
        );
        t.check(
            "pebs-enable.pt",
            faults(arch::wrmsr(PEBS_ENABLE, 1 << 60)),
            format_args!(""),
        );
        t.check(
            "data-cfg.reserved",
            faults(arch::wrmsr(DATA_CFG, 1 << 4)),
            format_args!(""),
        );
        t.check(
            "ds-area.noncanonical",
            faults(arch::wrmsr(DS_AREA, 1 << 47)),
            format_args!(""),
        );
        t.eq(
            "data-cfg.valid",
            arch::wrmsr(DATA_CFG, 0xff00_000f).is_ok(),
            true,
        );
        wr(DATA_CFG, 0);
        set_lapic_reg(LVTPC, LVT_MASKED);

        // A basic record: PMC0 (instructions, no INT, not adaptive) 3 from
        // its wrap overflows on the 3rd instruction, the NOP at label 21.
        reset(32, 0);
        wr(EVTSEL0, EN | OS | INSNS);
        wr(PMC0_FULL, MASK + 1 - 3);
        wr(PEBS_ENABLE, 1);
        let at = sled(1);
        t.eq("basic.written", written(), 32);
        t.eq("basic.format-size", Buffer.word(0), 32 << 48);
        if emulated {
            t.eq("basic.eventing-ip", Buffer.word(1), at[1]);
        }
        t.eq("basic.applicable", Buffer.word(2), 1);
        t.check("basic.tsc", Buffer.word(3) != 0, format_args!("0"));
        let status = rd(GLOBAL_STATUS);
        t.eq(
            "basic.status",
            status & (GLOBAL_STATUS_BUFFER_OVF | 1),
            GLOBAL_STATUS_BUFFER_OVF,
        );
        if emulated {
            // Reloaded from 0 at the boundary after label 21: labels 22 and
            // 23, mov, xor, xor.
            t.eq("basic.reloaded", rd(PMC0), 5);
        }

        // An adaptive record: memory info, registers, XMM and 2 LBR entries.
        reset(32, 0);
        wr(DATA_CFG, 0xf | 1 << 24);
        wr(EVTSEL0, EN | OS | EVTSEL_ADAPTIVE | INSNS);
        wr(PMC0_FULL, MASK + 1 - 3);
        wr(PEBS_ENABLE, 1);
        let at = sled(1);
        let size = 32 + 32 + 144 + 256 + 2 * 24;
        t.eq("adaptive.written", written(), size);
        t.eq(
            "adaptive.format-size",
            Buffer.word(0),
            size << 48 | 0xf | 1 << 24,
        );
        // Registers group: flags, ip, ax, cx, dx, bx, sp, bp, si, di, r8-r15
        // at words 8..26 (after the basic and memory-info groups).
        if emulated {
            t.eq("adaptive.eventing-ip", Buffer.word(1), at[1]);
            t.eq("adaptive.next-ip", Buffer.word(9), at[2]);
        }
        let r8_15: [u64; 8] = core::array::from_fn(|i| Buffer.word(18 + i));
        t.eq(
            "adaptive.r8-r15",
            r8_15,
            core::array::from_fn(|i| 0x1008 + i as u64),
        );
        t.eq(
            "adaptive.lbr-zero",
            (Buffer.word(58), Buffer.word(59)),
            (0, 0),
        );

        // The record is made when its instruction retires, before the
        // vCPU takes anything else: (1) PMC0 wraps on a NOP followed by
        // UD2: the EventingIP is the NOP, the next IP the UD2 (not the #UD
        // handler); (2) PMC0 wraps on a POPFQ that sets IF while vector
        // 0xe0 is pending: the next IP is the instruction after the POPFQ
        // and the flags have IF (not the 0xe0 handler's).
        reset(4096, 0);
        wr(DATA_CFG, 0x2);
        wr(EVTSEL0, EN | OS | EVTSEL_ADAPTIVE | INSNS);
        wr(PMC0_FULL, MASK + 1 - 2);
        wr(PEBS_ENABLE, 1);
        let at = sled_ud2(1);
        t.eq(
            "before-fault.ud",
            arch::take_fault().map(|f| f.vector),
            Some(arch::UD_VECTOR),
        );
        t.eq("before-fault.written", written(), 32 + 144);
        if emulated {
            t.eq("before-fault.eventing-ip", Buffer.word(1), at[0]);
            t.eq("before-fault.next-ip", Buffer.word(5), at[1]);
        }
        reset(4096, 0);
        wr(DATA_CFG, 0x2);
        wr(EVTSEL0, EN | OS | EVTSEL_ADAPTIVE | INSNS);
        wr(PMC0_FULL, MASK + 1 - 2);
        wr(PEBS_ENABLE, 1);
        set_lapic_reg(SVR, 0x1ff);
        let irqs = arch::irqs(0xe0);
        arch::self_ipi(0xe0);
        let after = popf_sti((GLOBAL_CTRL, 1), GLOBAL_CTRL);
        t.eq("before-interrupt.taken", arch::irqs(0xe0) - irqs, 1);
        t.eq("before-interrupt.written", written(), 32 + 144);
        if emulated {
            t.eq("before-interrupt.next-ip", Buffer.word(5), after);
            t.check(
                "before-interrupt.flags-if",
                Buffer.word(4) & 0x200 != 0,
                format_args!("{:#x}", Buffer.word(4)),
            );
        }

        // An instruction that retires inside its helper (RDMSR, WRMSR):
        // the record has the state after it, as for any other (next IP past
        // it; RDMSR's EDX:EAX loaded), and it as its EventingIP.
        reset(4096, 0);
        wr(DATA_CFG, 0x2);
        wr(EVTSEL0, EN | OS | EVTSEL_ADAPTIVE | INSNS);
        wr(PMC0_FULL, MASK + 1 - 3);
        wr(PEBS_ENABLE, 1);
        let (at, apic_base) = sled_rdmsr(1);
        t.eq("on-rdmsr.written", written(), 32 + 144);
        if emulated {
            t.eq("on-rdmsr.eventing-ip", Buffer.word(1), at[0]);
            t.eq("on-rdmsr.next-ip", Buffer.word(5), at[1]);
            t.eq(
                "on-rdmsr.edx-eax",
                (Buffer.word(8), Buffer.word(6)),
                (apic_base >> 32, apic_base & 0xffff_ffff),
            );
        }
        reset(4096, 0);
        wr(DATA_CFG, 0x2);
        wr(EVTSEL0, EN | OS | EVTSEL_ADAPTIVE | INSNS);
        wr(PMC0_FULL, MASK + 1 - 5);
        wr(PEBS_ENABLE, 1);
        let at = sled_wrmsr(1);
        t.eq("on-wrmsr.written", written(), 32 + 144);
        if emulated {
            t.eq("on-wrmsr.eventing-ip", Buffer.word(1), at[0]);
            t.eq("on-wrmsr.next-ip", Buffer.word(5), at[1]);
        }

        // A fixed counter: FIXED_CTR0 (OS), PEBS bit 32.
        reset(32, 0);
        wr(DATA_CFG, 0);
        wr(EVTSEL0, 0);
        wr(FIXED_CTR_CTRL, 0x1);
        wr(FIXED_CTR0, MASK + 1 - 3);
        wr(PEBS_ENABLE, 1 << 32);
        let at = sled(1 << 32);
        t.eq("fixed.written", written(), 32);
        t.eq("fixed.applicable", Buffer.word(2), 1 << 32);
        if emulated {
            t.eq("fixed.eventing-ip", Buffer.word(1), at[1]);
        }
        wr(FIXED_CTR_CTRL, 0);

        // Hostile: a DS area outside the guest's mappings (and RAM) gets no
        // record and no status bit; nothing breaks.
        reset(32, 0);
        wr(DS_AREA, 0x7fff_ffff_0000);
        wr(EVTSEL0, EN | OS | INSNS);
        wr(PMC0_FULL, MASK + 1 - 3);
        wr(PEBS_ENABLE, 1);
        sled(1);
        t.eq(
            "unmapped.no-status",
            rd(GLOBAL_STATUS) & GLOBAL_STATUS_BUFFER_OVF,
            0,
        );
        t.eq(
            "unmapped.nothing-written",
            (written(), Buffer.word(0)),
            (0, 0),
        );
        wr(PEBS_ENABLE, 0);
        wr(EVTSEL0, 0);
        wr(DS_AREA, 0);
        wr(GLOBAL_OVF_CTRL, rd(GLOBAL_STATUS));
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    pebs::main(t);
}
