//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU)
//! rustkvm-kvm-probe: hypercall VMCALL never completes on this host's KVM (measured)
//!
//! PMU accounting where a counting block does not run to its end (issue
//! 17.3), against the guest's own arithmetic:
//!
//! - `pmi-after-fault`: instructions retired sampled with a PMI while the
//!   block the counter wraps in first takes a page fault. The counter is
//!   preset to wrap at the last instruction of that block as translated (the
//!   budget is exactly the block's length at its first entry); the load at
//!   its head faults, the #PF handler (10 instructions) maps the page, the
//!   load runs again. The true wrap is then the 63rd retired instruction:
//!   the enabling WRMSR, 10 handler instructions, the load, 51 NOPs. The PMI
//!   must come right after that NOP (zero skid), once, with the counter
//!   wrapped: 4 by the handler's RDPMC.
//! - `count-across-yield`: instructions retired over a region with a
//!   KVM_HC_SCHED_YIELD VMCALL in the middle of a block: exactly the region's
//!   27 instructions, whatever the yield does to the block.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-unwind", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    x86::main(t);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::global_asm;

    use guest::arch::{self, set_lapic_reg};
    use guest::paging;
    use guest::x86_pmu::{rd, wr, EN, EVTSEL0, GLOBAL_CTRL, GLOBAL_STATUS, INT, OS, PMC0, USR};
    use guest::Test;

    /// An unmapped page: PDPT entry 5 (5 GiB), which the boot code leaves
    /// empty.
    const FAULT_VA: u64 = 0x1_4000_0000;
    /// The PMI's vector (LVTPC, fixed delivery).
    const PMI_VECTOR: u8 = 0xe1;
    /// Instructions retired (event C0H).
    const INSNS: u64 = 0xc0;
    /// The #PF handler's instructions (count them in `unwind_pf`).
    const PF_HANDLER_INSNS: u64 = 10;
    /// The NOPs after the faulting load in `unwind_block`.
    const NOPS: u64 = 60;
    /// Where the counter wraps: the enabling WRMSR plus the block's length
    /// (the load, the NOPs, the JMP) — the budget at the block's first
    /// entry is exactly its length.
    const WRAP_AFTER: u64 = 1 + 1 + NOPS + 1;
    /// The PMI handler's instructions before its RDPMC.
    const PMI_HANDLER_BEFORE_RDPMC: u64 = 4;

    global_asm!(
        r#"
    .section .text.x86_pmu_unwind, "ax"
    .p2align 12
    /* unwind_pmi_run(): STI, WRMSR GLOBAL_CTRL = 1 (counts itself), then
       the block: a load that faults the first time, NOPs, a JMP. */
    .global unwind_pmi_run
unwind_pmi_run:
    push rbx
    mov rsi, {fault_va}
    mov ecx, 0x38f
    mov eax, 1
    xor edx, edx
    jmp 1f
    /* (the alignment's padding NOPs are skipped, not counted) */
    .p2align 8
1:
    sti
    nop
    wrmsr
    .global unwind_block
unwind_block:
    mov rax, qword ptr [rsi]
    .global unwind_nops
unwind_nops:
    .rept {nops}
    nop
    .endr
    jmp 2f
2:
    cli
    xor eax, eax
    xor edx, edx
    mov ecx, 0x38f
    wrmsr
    pop rbx
    ret

    /* #PF: make the page present, return to the load. 10 instructions. */
    .global unwind_pf
unwind_pf:
    push rax
    push rdx
    mov rdx, qword ptr [rip + unwind_pte_addr]
    mov rax, qword ptr [rip + unwind_pte_val]
    mov qword ptr [rdx], rax
    inc qword ptr [rip + unwind_faults]
    pop rdx
    pop rax
    add rsp, 8
    iretq

    /* PMI: the counter and the interrupted RIP, then counting stops. */
    .global unwind_pmi
unwind_pmi:
    push rax
    push rcx
    push rdx
    xor ecx, ecx
    rdpmc
    mov dword ptr [rip + unwind_pmi_count], eax
    mov dword ptr [rip + unwind_pmi_count + 4], edx
    mov rax, qword ptr [rsp + 24]
    mov qword ptr [rip + unwind_pmi_rip], rax
    inc qword ptr [rip + unwind_pmis]
    mov ecx, 0x38f
    xor eax, eax
    xor edx, edx
    wrmsr
    mov eax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rdx
    pop rcx
    pop rax
    iretq

    /* unwind_yield_run(apic_id = rdi): 27 counted instructions with a
       SCHED_YIELD VMCALL in the middle of one block. */
    .global unwind_yield_run
unwind_yield_run:
    push rbx
    mov r8, rdi
    mov ecx, 0x38f
    mov eax, 1
    xor edx, edx
    wrmsr
    mov rbx, r8
    mov eax, 11
    vmcall
    .rept 20
    nop
    .endr
    mov ecx, 0x38f
    xor eax, eax
    xor edx, edx
    wrmsr
    pop rbx
    ret

    .section .data
    .p2align 3
    .global unwind_pte_addr, unwind_pte_val, unwind_faults
    .global unwind_pmi_count, unwind_pmi_rip, unwind_pmis
unwind_pte_addr:  .quad 0
unwind_pte_val:   .quad 0
unwind_faults:    .quad 0
unwind_pmi_count: .quad 0
unwind_pmi_rip:   .quad 0
unwind_pmis:      .quad 0

    .section .bss
    .p2align 12
    .global unwind_pd, unwind_pt, unwind_backing
unwind_pd: .skip 4096
unwind_pt: .skip 4096
unwind_backing: .skip 4096
"#,
        fault_va = const FAULT_VA,
        nops = const NOPS,
    );

    extern "C" {
        fn unwind_pmi_run();
        fn unwind_yield_run(apic_id: u64);
        static unwind_block: u8;
        static unwind_nops: u8;
        static unwind_pf: u8;
        static unwind_pmi: u8;
        static mut unwind_pte_addr: u64;
        static mut unwind_pte_val: u64;
        static unwind_faults: u64;
        static unwind_pmi_count: u64;
        static unwind_pmi_rip: u64;
        static unwind_pmis: u64;
        static mut unwind_pd: [u64; 512];
        static mut unwind_pt: [u64; 512];
        static unwind_backing: [u8; 4096];
    }

    /// A word the guest's handlers wrote.
    fn read(p: *const u64) -> u64 {
        // SAFETY: an aligned static of ours.
        unsafe { p.read_volatile() }
    }

    /// Map `FAULT_VA`'s page table (PDPT entry 5, its PTEs not present)
    /// into the boot page tables, and tell the #PF handler which PTE makes
    /// the page present.
    fn add_fault_window() {
        let pt = (&raw mut unwind_pt).cast::<paging::Table>();
        // SAFETY: the tables are this guest's own statics (4 KiB aligned in
        // its .bss); PDPT entry 5 is unused; the words are the handler's.
        unsafe {
            paging::add_fault_window(5, (&raw mut unwind_pd).cast::<paging::Table>(), pt);
            (&raw mut unwind_pte_addr).write_volatile(pt as u64);
            (&raw mut unwind_pte_val).write_volatile(&raw const unwind_backing as u64 | 3);
        }
    }

    pub fn main(t: &mut Test) {
        const PF_VECTOR: u8 = 14;
        const LVTPC: u32 = 0x340;
        const SVR: u32 = 0xf0;
        const LVT_LINT0: u32 = 0x350;
        const MASKED: u32 = 1 << 16;

        let a = arch::cpuid(0xa, 0)[0];
        if a & 0xff < 2 {
            t.skip("x86-pmu-unwind", "CPUID 0xA: no architectural PMU");
            return;
        }
        add_fault_window();
        // SAFETY: the handlers are this guest's, for these vectors.
        let (old_pf, old_pmi) = unsafe {
            (
                paging::set_gate(PF_VECTOR, &raw const unwind_pf as u64),
                paging::set_gate(PMI_VECTOR, &raw const unwind_pmi as u64),
            )
        };
        // Only the PMI interrupts (the runtime masked the 8259s; LINT0 too).
        set_lapic_reg(SVR, 0x1ff);
        set_lapic_reg(LVT_LINT0, MASKED);
        set_lapic_reg(LVTPC, u32::from(PMI_VECTOR));

        // pmi-after-fault: PMC0 wraps WRAP_AFTER instructions after the
        // enabling WRMSR (a legacy write sign-extends from bit 31).
        wr(GLOBAL_CTRL, 0);
        wr(EVTSEL0, INSNS | USR | OS | INT | EN);
        wr(PMC0, (WRAP_AFTER as u32).wrapping_neg().into());
        // SAFETY: the routine saves what it uses; its handlers are in the
        // IDT, its page table mapped.
        unsafe { unwind_pmi_run() };
        let status = rd(GLOBAL_STATUS);
        let wrap_at = WRAP_AFTER - 1 - PF_HANDLER_INSNS - 1;
        let want_rip = &raw const unwind_nops as u64 + wrap_at;
        t.eq("pmi-after-fault.faults", read(&raw const unwind_faults), 1);
        t.eq("pmi-after-fault.pmis", read(&raw const unwind_pmis), 1);
        t.eq(
            "pmi-after-fault.rip",
            read(&raw const unwind_pmi_rip),
            want_rip,
        );
        t.eq(
            "pmi-after-fault.counter-wrapped",
            read(&raw const unwind_pmi_count),
            PMI_HANDLER_BEFORE_RDPMC,
        );
        t.eq("pmi-after-fault.overflow-status", status & 1, 1);
        t.measure(
            "pmi-after-fault.block",
            format_args!("{:#x}", &raw const unwind_block as u64),
        );

        // count-across-yield: no PMI, the counter from 0.
        set_lapic_reg(LVTPC, MASKED | u32::from(PMI_VECTOR));
        wr(GLOBAL_CTRL, 0);
        wr(0x390, status);
        wr(EVTSEL0, INSNS | USR | OS | EN);
        wr(PMC0, 0);
        let apic_id = u64::from(arch::cpuid(1, 0)[1] >> 24);
        // SAFETY: the routine saves what it uses; the VMCALL is a KVM
        // hypercall under rustkvm.
        unsafe { unwind_yield_run(apic_id) };
        // The enabling WRMSR, MOV, MOV, VMCALL, 20 NOPs, MOV, XOR, XOR.
        t.eq("count-across-yield", rd(PMC0), 27);

        paging::restore_gate(PF_VECTOR, old_pf);
        paging::restore_gate(PMI_VECTOR, old_pmi);
    }
}
