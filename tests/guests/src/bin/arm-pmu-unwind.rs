//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PMU has no INST_RETIRED without -icount, and its
//!   interrupt is not KVM's)
//!
//! PMU accounting where a counting block does not run to its end (issue
//! 17.3), against the guest's own arithmetic: INST_RETIRED sampled with the
//! overflow interrupt while the block the counter wraps in first takes a
//! data abort. The counter is preset to wrap at the last instruction of that
//! block as translated (the budget is exactly the block's length at its
//! first entry); the load at its head faults, the handler (15 instructions
//! with the vector's branch) makes the page valid, the load runs again. The
//! true wrap is then the 63rd retired instruction: the enabling MSR, 15
//! handler instructions, the load, 46 NOPs. The interrupt must come right
//! after that NOP (zero skid), once, with the counter wrapped: 2 by the
//! handler's first read.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-unwind", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    arm::main(t);
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use core::arch::global_asm;

    use guest::gic::any as gic;
    use guest::paging::{self, Table, FAULT_WINDOW};
    use guest::{read_sysreg, write_sysreg, Test};

    /// The PMU's PPI on the virt board.
    const PMU_PPI: u32 = 23;
    /// INST_RETIRED.
    const INST_RETIRED: u64 = 0x08;
    /// The abort handler's instructions, the vector's branch included
    /// (count them in `unwind_sync`).
    const ABORT_HANDLER_INSNS: u64 = 15;
    /// The NOPs after the faulting load in `unwind_block`.
    const NOPS: u64 = 60;
    /// Where the counter wraps: the enabling MSR plus the block's length
    /// (the load, the NOPs, the branch).
    const WRAP_AFTER: u64 = 1 + 1 + NOPS + 1;
    /// The interrupt handler's instructions before its counter read: the
    /// vector's branch and the STP.
    const IRQ_HANDLER_BEFORE_READ: u64 = 2;

    global_asm!(
        r#"
    .section .text.arm_pmu_unwind, "ax"
    .p2align 12
    /* unwind_run(): unmask IRQs, MSR PMCNTENSET (counts itself), then the
       block: a load that faults the first time, NOPs, a branch. */
    .global unwind_run
unwind_run:
    mov x11, #{fault_va}
    mov x9, #1
    b 1f
    /* (the alignment's padding is skipped, not counted) */
    .p2align 8
1:
    msr daifclr, #2
    isb
    msr pmcntenset_el0, x9
    .global unwind_block
unwind_block:
    ldr x10, [x11]
    .global unwind_nops
unwind_nops:
    .rept {nops}
    nop
    .endr
    b 2f
2:
    msr daifset, #2
    mov x9, #1
    msr pmcntenclr_el0, x9
    ret

    /* Synchronous exception (a data abort): make the page valid, return to
       the load. 15 instructions with the vector's branch. */
unwind_sync:
    stp x9, x10, [sp, #-16]!
    adrp x9, unwind_pte_addr
    ldr x9, [x9, :lo12:unwind_pte_addr]
    adrp x10, unwind_pte_val
    ldr x10, [x10, :lo12:unwind_pte_val]
    str x10, [x9]
    dsb ish
    isb
    adrp x9, unwind_faults
    ldr x10, [x9, :lo12:unwind_faults]
    add x10, x10, #1
    str x10, [x9, :lo12:unwind_faults]
    ldp x9, x10, [sp], #16
    eret

    /* IRQ (the PMU's): the counter and the interrupted PC, then counting
       stops, the overflow is cleared, the interrupt acknowledged. */
unwind_irq:
    stp x9, x10, [sp, #-16]!
    mrs x9, pmevcntr0_el0
    adrp x10, unwind_irq_count
    str x9, [x10, :lo12:unwind_irq_count]
    mrs x9, elr_el1
    adrp x10, unwind_irq_pc
    str x9, [x10, :lo12:unwind_irq_pc]
    adrp x10, unwind_irqs
    ldr x9, [x10, :lo12:unwind_irqs]
    add x9, x9, #1
    str x9, [x10, :lo12:unwind_irqs]
    mov x9, #1
    msr pmcntenclr_el0, x9
    msr pmovsclr_el0, x9
    movz x9, #0x000c
    movk x9, #0x0801, lsl #16
    ldr w10, [x9]
    str w10, [x9, #4]
    ldp x9, x10, [sp], #16
    eret

unwind_unexpected:
    b unwind_unexpected

    .p2align 11
    .global unwind_vectors
unwind_vectors:
    .rept 4
    .p2align 7
    b unwind_unexpected
    .endr
    .p2align 7
    b unwind_sync
    .p2align 7
    b unwind_irq
    .rept 10
    .p2align 7
    b unwind_unexpected
    .endr

    .section .data
    .p2align 3
    .global unwind_pte_addr, unwind_pte_val, unwind_faults
    .global unwind_irq_count, unwind_irq_pc, unwind_irqs
unwind_pte_addr:  .quad 0
unwind_pte_val:   .quad 0
unwind_faults:    .quad 0
unwind_irq_count: .quad 0
unwind_irq_pc:    .quad 0
unwind_irqs:      .quad 0

    .section .bss
    .p2align 12
    .global unwind_l1, unwind_l2, unwind_l3, unwind_backing
unwind_l1: .skip 4096
unwind_l2: .skip 4096
unwind_l3: .skip 4096
unwind_backing: .skip 4096
"#,
        fault_va = const FAULT_WINDOW,
        nops = const NOPS,
    );

    extern "C" {
        fn unwind_run();
        static unwind_nops: u8;
        static unwind_vectors: u8;
        static mut unwind_pte_addr: u64;
        static mut unwind_pte_val: u64;
        static unwind_faults: u64;
        static unwind_irq_count: u64;
        static unwind_irq_pc: u64;
        static unwind_irqs: u64;
        static mut unwind_l1: [u64; 512];
        static mut unwind_l2: [u64; 512];
        static mut unwind_l3: [u64; 512];
        static unwind_backing: [u8; 4096];
    }

    /// A word the guest's handlers wrote.
    fn read(p: *const u64) -> u64 {
        // SAFETY: an aligned static of ours.
        unsafe { p.read_volatile() }
    }

    pub fn main(t: &mut Test) {
        /// Level-3 page descriptor: valid page, access flag, inner
        /// shareable, attribute index 1 (normal memory).
        const PAGE: u64 = 0x707;
        if let Some(why) = guest::arch::pmu_overflow_irq_unavailable() {
            t.skip("arm-pmu-unwind", why);
            return;
        }
        let l3 = (&raw mut unwind_l3).cast::<Table>();
        // SAFETY: the tables are this guest's statics (4 KiB aligned in its
        // .bss), live for the whole run; the handler's words are its own.
        unsafe {
            paging::mmu_on(
                (&raw mut unwind_l1).cast::<Table>(),
                (&raw mut unwind_l2).cast::<Table>(),
                l3,
            );
            (&raw mut unwind_pte_addr).write_volatile(l3 as u64);
            (&raw mut unwind_pte_val).write_volatile(&raw const unwind_backing as u64 | PAGE);
        }
        gic::enable(PMU_PPI);
        guest::arch::pmu_clear();
        write_sysreg!("pmcr_el0", 1); // E
        write_sysreg!("pmevtyper0_el0", INST_RETIRED); // EL1 and EL0
        write_sysreg!("pmevcntr0_el0", (WRAP_AFTER as u32).wrapping_neg().into());
        write_sysreg!("pmintenset_el1", 1);
        let old_vbar = read_sysreg!("vbar_el1");
        write_sysreg!("vbar_el1", (&raw const unwind_vectors) as u64);
        // SAFETY: its vectors are installed, its page table live; it uses
        // only caller-saved registers (x9-x11).
        unsafe { unwind_run() };
        write_sysreg!("vbar_el1", old_vbar);
        gic::disable(PMU_PPI);

        let wrap_at = WRAP_AFTER - 1 - ABORT_HANDLER_INSNS - 1;
        let want_pc = &raw const unwind_nops as u64 + 4 * wrap_at;
        t.eq("pmi-after-fault.faults", read(&raw const unwind_faults), 1);
        t.eq(
            "pmi-after-fault.interrupts",
            read(&raw const unwind_irqs),
            1,
        );
        // Hardware (the kvm backend) has skid: KVM's interrupt comes
        // through the host's perf overflow handler, some instructions late
        // (measured nested: 1).
        let skid = guest::Tolerance { hardware: 16 }.here();
        let (pc, count) = (
            read(&raw const unwind_irq_pc),
            read(&raw const unwind_irq_count) as u32,
        );
        t.check(
            "pmi-after-fault.pc",
            pc >= want_pc && (pc - want_pc) / 4 <= skid,
            format_args!("got {pc:#x}, want {want_pc:#x} + at most {skid} instructions"),
        );
        // Wrapped at 32 bits (PMCR_EL0.LP clear); with PMUv3p5 the counter
        // is 64 bits wide and counts on past bit 31, as under KVM
        // (kvm_pmc_is_64bit). The handler's first read: its instructions
        // before it, and the skid.
        let want = IRQ_HANDLER_BEFORE_READ as u32;
        t.check(
            "pmi-after-fault.counter-wrapped",
            count >= want && u64::from(count - want) <= skid,
            format_args!("got {count}, want {want} + at most {skid}"),
        );
    }
}
