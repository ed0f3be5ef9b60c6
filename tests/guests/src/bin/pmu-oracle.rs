//! rustkvm-test: arch=x86_64,aarch64 compare=off matrix=off needs=pmu timeout=60
//!
//! The guest half of the PMU oracle (`tests/tests/pmu_oracle.rs`, issue 18
//! point 6): the guest PMU counts instructions and branches retired (x86:
//! FIXED_CTR0, PMC0 = C0H and PMC1 = C4H, USR+OS; arm64: PMEVTYPER
//! INST_RETIRED 0x08 and BR_RETIRED 0x21, EL0+EL1) over one code region,
//! `[oracle_region_start, oracle_region_end)` in section
//! `.text.pmu_oracle`, while the host runs rustkvm's TCG plugin with
//! `filter=` on the same region in the same QEMU process and compares.
//!
//! Everything that executes while the counters count is in the region: the
//! workload, and the exception and interrupt handlers it installs for the
//! time of the run (x86: IDT gates 3, 6, 14 and 0xE0; arm64: a VBAR_EL1
//! table inside the region), so the plugin's filter and the PMU see the
//! same instructions. Counting starts with the instruction right before
//! the region (x86 WRMSR to GLOBAL_CTRL, arm64 MSR PMCNTENSET_EL0: it
//! counts itself, as under KVM) and stops with the region's first
//! instruction past its end (which does not count). Each of `ROUNDS`
//! rounds:
//!
//! - loads from `PAGES` pages that are not mapped (x86: PTE not present in
//!   a page table the guest adds at 4 GiB; arm64: the MMU is turned on
//!   with an identity map and an invalid level-3 table at 2 GiB): each load
//!   faults (#PF / data abort), the handler maps the page and returns, and
//!   the load runs again and retires;
//! - x86: a `REP STOSB` of 8192 bytes over two more unmapped pages, which
//!   faults at its first byte and again half-way;
//! - a #UD (`UD2`) / UNDEFINED (`UDF`) that the handler skips (it never
//!   retires);
//! - a trap that retires: x86 `INT3`, arm64 `SVC`;
//! - a call and a return; then it unmaps the pages again (INVLPG / TLBI).
//!
//! then waits (HLT / WFI) until `TICKS` timer interrupts have been taken
//! (x86 LAPIC timer, periodic; arm64 virtual timer through the GICv2),
//! which also land wherever the workload happens to be.
//!
//! The guest checks its own bookkeeping (every fault taken as designed,
//! the two instruction counters equal) and prints the counts as `measure`
//! lines; the exact comparison with the plugin is the host's (see
//! docs/testing.md, "The PMU oracle"). The symbols the host filters on:
//! `oracle_region_start`/`_end`; `oracle_fault_marks`/`_end` (one
//! instruction executed per fault of a load or a #UD/UNDEFINED, whose
//! instruction does not retire); `oracle_rep`/`_end` (x86: the `REP
//! STOSB`, whose starts that do not retire — its faults, and its
//! re-entries, one per iteration under `-icount` — are its starts minus
//! the starts of the `UD2` after it); and `oracle_extra_branch`/`_end`
//! (the one instruction that the PMU counts as a branch and capstone does
//! not: x86 `INT3`, arm64 `ERET`).
//! SKIPs without the PMU (stock TCG).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

/// Rounds of the workload.
const ROUNDS: u64 = 4;
/// Pages loaded from per round (each faults once per round).
const PAGES: u64 = 8;
/// Timer interrupts to wait for.
const TICKS: u64 = 4;

extern "C" {
    static oracle_region_start: u8;
    static oracle_region_end: u8;
    static oracle_pf_count: u64;
    static oracle_ud_count: u64;
    static oracle_trap_count: u64;
    static oracle_ticks: u64;
}

/// A counter the region's handlers increment.
///
/// # Safety
/// `counter` is one of the asm's counter words.
unsafe fn read(counter: *const u64) -> u64 {
    // SAFETY: a plain read of a word the handlers wrote before the run ended.
    unsafe { counter.read_volatile() }
}

/// Print the region and the handlers' bookkeeping, and check it: `pf`
/// page faults expected.
fn bookkeeping(t: &mut Test, pf: u64) {
    // SAFETY: addresses of the asm labels and reads of the handlers' words.
    let (start, end, faults, uds, traps, ticks) = unsafe {
        (
            &raw const oracle_region_start as u64,
            &raw const oracle_region_end as u64,
            read(&raw const oracle_pf_count),
            read(&raw const oracle_ud_count),
            read(&raw const oracle_trap_count),
            read(&raw const oracle_ticks),
        )
    };
    t.measure("region.start", format_args!("{start:#x}"));
    t.measure("region.end", format_args!("{end:#x}"));
    t.measure("oracle.page-faults", format_args!("{faults}"));
    t.measure("oracle.undefined", format_args!("{uds}"));
    t.measure("oracle.traps", format_args!("{traps}"));
    t.measure("oracle.ticks", format_args!("{ticks}"));
    t.eq("oracle.page-faults", faults, pf);
    t.eq("oracle.undefined", uds, ROUNDS);
    t.eq("oracle.traps", traps, ROUNDS);
    t.check(
        "oracle.ticks",
        ticks >= TICKS,
        format_args!("{ticks} timer interrupts, want at least {TICKS}"),
    );
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::global_asm;

    use guest::arch::{self, set_lapic_reg};
    use guest::paging;
    use guest::x86_pmu::{
        rd, wr, EN, EVTSEL0, FIXED_CTR0, FIXED_CTR_CTRL, GLOBAL_CTRL, OS, PMC0, USR,
    };
    use guest::Test;

    use super::{PAGES, ROUNDS, TICKS};

    /// Where the unmapped pages are: PDPT entry 4 (4 GiB), which the boot
    /// code leaves empty.
    const FAULT_VA: u64 = 0x1_0000_0000;
    /// The timer's vector.
    const TIMER_VECTOR: u8 = 0xe0;
    /// LAPIC timer period in bus ticks (divide by 1).
    const TIMER_COUNT: u32 = 100_000;

    global_asm!(
        r#"
    .section .text.pmu_oracle, "ax"
    .p2align 12
    /* oracle_run(global_ctrl = rdi): WRMSR GLOBAL_CTRL (counts itself),
       the region, WRMSR 0 to it (does not count). */
    .global oracle_run
oracle_run:
    push rbx
    push r12
    mov rax, rdi
    mov rdx, rdi
    shr rdx, 32
    mov ecx, 0x38f
    wrmsr
    .global oracle_region_start
oracle_region_start:
    sti
    mov r12d, {rounds}
2:
    mov rsi, {fault_va}
    mov ecx, {pages}
3:
    add rbx, 1
    mov rax, qword ptr [rsi]
    mov qword ptr [rsi + 8], rax
    add rsi, 4096
    dec ecx
    jnz 3b
    mov rdi, rsi
    mov ecx, 8192
    xor eax, eax
    cld
    .global oracle_rep
oracle_rep:
    rep stosb
    .global oracle_rep_end
oracle_rep_end:
    ud2
    .global oracle_extra_branch
oracle_extra_branch:
    int3
    .global oracle_extra_branch_end
oracle_extra_branch_end:
    call 7f
    lea rdi, [rip + oracle_pt]
    mov rsi, {fault_va}
    mov ecx, {pages} + 2
4:
    mov qword ptr [rdi], 0
    invlpg [rsi]
    add rdi, 8
    add rsi, 4096
    dec ecx
    jnz 4b
    dec r12d
    jnz 2b
5:
    cmp qword ptr [rip + oracle_ticks], {ticks}
    jae 6f
    hlt
    jmp 5b
6:
    cli
    mov ecx, 0x38f
    xor eax, eax
    xor edx, edx
    jmp oracle_region_end
7:
    ret

    /* #PF: map the page CR2 names (PTE = its backing page, present,
       writable), return to the faulting instruction. A load's fault goes
       through the fault marks, the REP STOSB's does not (the host counts
       the REP's starts that did not retire on the REP itself). */
    .global oracle_pf
oracle_pf:
    push rax
    push rcx
    push rdx
    mov rax, cr2
    mov rcx, {fault_va}
    sub rax, rcx
    shr rax, 12
    cmp rax, {pages}
    jb oracle_pf_load_mark
    inc qword ptr [rip + oracle_rep_fault_count]
oracle_pf_map:
    mov rcx, rax
    shl rcx, 12
    lea rdx, [rip + oracle_backing]
    add rcx, rdx
    or rcx, 3
    lea rdx, [rip + oracle_pt]
    mov qword ptr [rdx + rax * 8], rcx
    pop rdx
    pop rcx
    pop rax
    add rsp, 8
    iretq
oracle_pf_load:
    inc qword ptr [rip + oracle_pf_count]
    jmp oracle_pf_map
    /* #UD: skip the UD2. */
oracle_ud:
    add qword ptr [rsp], 2
    inc qword ptr [rip + oracle_ud_count]
    iretq
    .global oracle_bp
oracle_bp:
    inc qword ptr [rip + oracle_trap_count]
    iretq
    .global oracle_tick
oracle_tick:
    push rax
    inc qword ptr [rip + oracle_ticks]
    mov eax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rax
    iretq
    /* The fault gates enter here: one instruction per fault. */
    .global oracle_fault_marks, oracle_ud_entry
oracle_fault_marks:
oracle_pf_load_mark:
    jmp oracle_pf_load
oracle_ud_entry:
    jmp oracle_ud
    .global oracle_fault_marks_end
oracle_fault_marks_end:
    .global oracle_region_end
oracle_region_end:
    wrmsr
    pop r12
    pop rbx
    ret

    .section .data
    .p2align 3
    .global oracle_pf_count, oracle_ud_count, oracle_trap_count, oracle_ticks
    .global oracle_rep_fault_count
oracle_pf_count:   .quad 0
oracle_rep_fault_count: .quad 0
oracle_ud_count:   .quad 0
oracle_trap_count: .quad 0
oracle_ticks:      .quad 0

    .section .bss
    .p2align 12
    .global oracle_pd, oracle_pt
oracle_pd: .skip 4096
oracle_pt: .skip 4096
oracle_backing: .skip 4096 * ({pages} + 2)
"#,
        rounds = const ROUNDS,
        pages = const PAGES,
        ticks = const TICKS,
        fault_va = const FAULT_VA,
    );

    extern "C" {
        fn oracle_run(global_ctrl: u64);
        static mut oracle_pd: [u64; 512];
        static mut oracle_pt: [u64; 512];
        static oracle_pf: u8;
        static oracle_rep_fault_count: u64;
        static oracle_ud_entry: u8;
        static oracle_bp: u8;
        static oracle_tick: u8;
    }

    /// Map the page tables for `FAULT_VA` (PDPT entry 4, every PTE not
    /// present) into the boot page tables.
    fn add_fault_window() {
        // SAFETY: the tables are this guest's own statics (4 KiB aligned in
        // its .bss); PDPT entry 4 is unused.
        unsafe {
            paging::add_fault_window(
                4,
                (&raw mut oracle_pd).cast::<paging::Table>(),
                (&raw mut oracle_pt).cast::<paging::Table>(),
            )
        };
    }

    pub fn main(t: &mut Test) {
        const PF_VECTOR: u8 = 14;
        const BP_VECTOR: u8 = 3;
        /// LAPIC: spurious vector, timer divide, LVT timer and LINT0,
        /// timer initial count.
        const SVR: u32 = 0xf0;
        const TDCR: u32 = 0x3e0;
        const LVT_TIMER: u32 = 0x320;
        const LVT_LINT0: u32 = 0x350;
        const TMICT: u32 = 0x380;
        const PERIODIC: u32 = 1 << 17;
        const MASKED: u32 = 1 << 16;
        /// Instructions (C0H) and branches (C4H) retired.
        const INSNS: u64 = 0xc0;
        const BRANCHES: u64 = 0xc4;

        let leaf0 = arch::cpuid(0, 0);
        let vendor = arch::cpuid_string([leaf0[1], leaf0[3], leaf0[2]]);
        let a = arch::cpuid(0xa, 0)[0];
        if &vendor != b"GenuineIntel" || a & 0xff < 2 || (a >> 8) & 0xff < 2 {
            t.skip(
                "pmu-oracle",
                "no Intel architectural PMU v2 with 2 GP counters",
            );
            return;
        }
        add_fault_window();
        let gates = [
            (PF_VECTOR, &raw const oracle_pf as u64),
            (arch::UD_VECTOR, &raw const oracle_ud_entry as u64),
            (BP_VECTOR, &raw const oracle_bp as u64),
            (TIMER_VECTOR, &raw const oracle_tick as u64),
        ];
        // SAFETY: each handler is this guest's, for that vector.
        let saved = gates.map(|(v, h)| (v, unsafe { paging::set_gate(v, h) }));

        wr(GLOBAL_CTRL, 0);
        wr(FIXED_CTR_CTRL, 0b11); // fixed counter 0: OS and USR
        wr(FIXED_CTR0, 0);
        wr(PMC0, 0);
        wr(PMC0 + 1, 0);
        wr(EVTSEL0, INSNS | USR | OS | EN);
        wr(EVTSEL0 + 1, BRANCHES | USR | OS | EN);

        // Only the LAPIC timer interrupts: LINT0 masked (the runtime masked
        // the 8259s, whose IRQ 0 would arrive as vector 8 through it).
        set_lapic_reg(SVR, 0x1ff);
        set_lapic_reg(LVT_LINT0, MASKED);
        set_lapic_reg(TDCR, 0xb);
        set_lapic_reg(LVT_TIMER, PERIODIC | u32::from(TIMER_VECTOR));
        set_lapic_reg(TMICT, TIMER_COUNT);
        // SAFETY: the routine saves what it uses; its handlers are in the
        // IDT, its page tables mapped.
        unsafe { oracle_run(0b11 | 1 << 32) };
        set_lapic_reg(LVT_TIMER, MASKED);
        set_lapic_reg(TMICT, 0);
        for (v, old) in saved {
            paging::restore_gate(v, old);
        }

        let insns = rd(PMC0);
        let fixed = rd(FIXED_CTR0);
        let branches = rd(PMC0 + 1);
        t.measure("oracle.pmu.instructions", format_args!("{insns}"));
        t.measure("oracle.pmu.branches", format_args!("{branches}"));
        t.eq("oracle.fixed-ctr0-equals-pmc0", fixed, insns);
        // SAFETY: a word the #PF handler wrote before the run ended.
        let rep_faults = unsafe { super::read(&raw const oracle_rep_fault_count) };
        t.measure("oracle.rep-faults", format_args!("{rep_faults}"));
        t.eq("oracle.rep-faults", rep_faults, 2 * ROUNDS);
        super::bookkeeping(t, ROUNDS * PAGES);
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use core::arch::global_asm;

    use guest::{gic, read_sysreg, write_sysreg, Test};

    use super::{PAGES, ROUNDS, TICKS};

    /// Where the unmapped pages are: level-1 entry 2 (2 GiB), not RAM.
    const FAULT_VA: u64 = guest::paging::FAULT_WINDOW;
    /// The virtual timer's PPI.
    const VTIMER_PPI: u32 = 27;

    global_asm!(
        r#"
    .section .text.pmu_oracle, "ax"
    .p2align 12
    /* oracle_run(mask = x0): MSR PMCNTENSET (counts itself), the region,
       MSR PMCNTENCLR (does not count). */
    .global oracle_run
oracle_run:
    stp x19, x20, [sp, #-48]!
    stp x21, x22, [sp, #16]
    stp x23, x30, [sp, #32]
    mov x23, x0
    msr pmcntenset_el0, x23
    .global oracle_region_start
oracle_region_start:
    msr daifclr, #2
    mov x19, #{rounds}
1:
    mov x20, #{fault_va}
    mov x21, #{pages}
2:
    add x22, x22, #1
    ldr x9, [x20]
    str x9, [x20, #8]
    add x20, x20, #4096
    subs x21, x21, #1
    b.ne 2b
    udf #0
    svc #0
    bl 7f
    adrp x20, oracle_l3
    add x20, x20, :lo12:oracle_l3
    mov x21, #{fault_va}
    mov x9, #{pages}
3:
    str xzr, [x20], #8
    dsb ishst
    lsr x10, x21, #12
    tlbi vae1, x10
    add x21, x21, #4096
    subs x9, x9, #1
    b.ne 3b
    dsb ish
    isb
    subs x19, x19, #1
    b.ne 1b
4:
    adrp x9, oracle_ticks
    ldr x9, [x9, :lo12:oracle_ticks]
    cmp x9, #{ticks}
    b.hs 5f
    wfi
    b 4b
5:
    msr daifset, #2
    b oracle_region_end
7:
    ret

oracle_sync:
    stp x9, x10, [sp, #-32]!
    stp x11, x12, [sp, #16]
    mrs x9, esr_el1
    lsr x9, x9, #26
    cmp x9, #0x25
    b.eq oracle_abort_entry
    cbz x9, oracle_udf_entry
    cmp x9, #0x15
    b.eq oracle_svc
    b oracle_unexpected
    /* One instruction per fault that does not retire. */
    .global oracle_fault_marks, oracle_fault_marks_end
oracle_fault_marks:
oracle_abort_entry:
    b oracle_abort
oracle_udf_entry:
    b oracle_udf
oracle_fault_marks_end:
    /* Data abort: map the page FAR names, return to the load. */
oracle_abort:
    mrs x9, far_el1
    mov x10, #{fault_va}
    sub x9, x9, x10
    lsr x9, x9, #12
    adrp x10, oracle_backing
    add x10, x10, :lo12:oracle_backing
    add x10, x10, x9, lsl #12
    mov x11, #0x707
    orr x10, x10, x11
    adrp x11, oracle_l3
    add x11, x11, :lo12:oracle_l3
    str x10, [x11, x9, lsl #3]
    dsb ish
    isb
    adrp x9, oracle_pf_count
    ldr x10, [x9, :lo12:oracle_pf_count]
    add x10, x10, #1
    str x10, [x9, :lo12:oracle_pf_count]
    b oracle_return
    /* UNDEFINED: skip the UDF. */
oracle_udf:
    mrs x9, elr_el1
    add x9, x9, #4
    msr elr_el1, x9
    adrp x9, oracle_ud_count
    ldr x10, [x9, :lo12:oracle_ud_count]
    add x10, x10, #1
    str x10, [x9, :lo12:oracle_ud_count]
    b oracle_return
oracle_svc:
    adrp x9, oracle_trap_count
    ldr x10, [x9, :lo12:oracle_trap_count]
    add x10, x10, #1
    str x10, [x9, :lo12:oracle_trap_count]
    b oracle_return
    /* Virtual timer: acknowledge (GICC_IAR), re-arm, EOI. */
oracle_irq:
    stp x9, x10, [sp, #-32]!
    stp x11, x12, [sp, #16]
    movz x9, #0x000c
    movk x9, #0x0801, lsl #16
    ldr w10, [x9]
    adrp x11, oracle_tick_period
    ldr x11, [x11, :lo12:oracle_tick_period]
    msr cntv_tval_el0, x11
    isb
    str w10, [x9, #4]
    adrp x9, oracle_ticks
    ldr x10, [x9, :lo12:oracle_ticks]
    add x10, x10, #1
    str x10, [x9, :lo12:oracle_ticks]
oracle_return:
    ldp x11, x12, [sp, #16]
    ldp x9, x10, [sp], #32
    /* Every handler returns through this ERET. */
    .global oracle_extra_branch, oracle_extra_branch_end
oracle_extra_branch:
    eret
oracle_extra_branch_end:
oracle_unexpected:
    mrs x0, esr_el1
    lsr x0, x0, #26
    add x0, x0, #0x40
    adrp x1, oracle_exit_block
    add x1, x1, :lo12:oracle_exit_block
    str x0, [x1, #8]
    mov x0, #0x18
    hlt #0xf000
    b oracle_unexpected

    .p2align 11
    .global oracle_vectors
oracle_vectors:
    .rept 4
    .p2align 7
    b oracle_unexpected
    .endr
    .p2align 7
    b oracle_sync
    .p2align 7
    b oracle_irq
    .rept 10
    .p2align 7
    b oracle_unexpected
    .endr
    .p2align 7
    .global oracle_region_end
oracle_region_end:
    msr pmcntenclr_el0, x23
    ldp x23, x30, [sp, #32]
    ldp x21, x22, [sp, #16]
    ldp x19, x20, [sp], #48
    ret

    .section .data
    .p2align 3
    .global oracle_pf_count, oracle_ud_count, oracle_trap_count, oracle_ticks
    .global oracle_tick_period
oracle_pf_count:    .quad 0
oracle_ud_count:    .quad 0
oracle_trap_count:  .quad 0
oracle_ticks:       .quad 0
oracle_tick_period: .quad 0
oracle_exit_block:  .quad 0x20026, 0

    .section .bss
    .p2align 12
    .global oracle_l1, oracle_l2, oracle_l3
oracle_l1: .skip 4096
oracle_l2: .skip 4096
oracle_l3: .skip 4096
oracle_backing: .skip 4096 * {pages}
"#,
        rounds = const ROUNDS,
        pages = const PAGES,
        ticks = const TICKS,
        fault_va = const FAULT_VA,
    );

    extern "C" {
        fn oracle_run(mask: u64);
        static mut oracle_l1: [u64; 512];
        static mut oracle_l2: [u64; 512];
        static mut oracle_l3: [u64; 512];
        static mut oracle_tick_period: u64;
        static oracle_vectors: u8;
    }

    /// Turn the MMU on with the not-present window at `FAULT_VA`.
    fn mmu_on() {
        // SAFETY: the tables are this guest's own statics (4 KiB aligned in
        // its .bss), live for the whole run; the guest stays below 2 GiB.
        unsafe {
            guest::paging::mmu_on(
                (&raw mut oracle_l1).cast::<guest::paging::Table>(),
                (&raw mut oracle_l2).cast::<guest::paging::Table>(),
                (&raw mut oracle_l3).cast::<guest::paging::Table>(),
            )
        };
    }

    pub fn main(t: &mut Test) {
        const INST_RETIRED: u64 = 0x08;
        const BR_RETIRED: u64 = 0x21;
        if read_sysreg!("pmceid0_el0") & 1 << INST_RETIRED == 0
            || read_sysreg!("pmceid1_el0") & 1 << (BR_RETIRED - 32) == 0
        {
            t.skip("pmu-oracle", "PMCEID: no INST_RETIRED or BR_RETIRED");
            return;
        }
        mmu_on();
        guest::arch::pmu_clear();
        write_sysreg!("pmcr_el0", 0b11); // E, and P: event counters to 0
        write_sysreg!("pmevtyper0_el0", INST_RETIRED); // P = U = 0: EL1 and EL0
        write_sysreg!("pmevtyper1_el0", BR_RETIRED);

        let old_vbar = read_sysreg!("vbar_el1");
        // SAFETY: the handlers read the period; nothing runs concurrently.
        unsafe {
            (&raw mut oracle_tick_period).write_volatile(read_sysreg!("cntfrq_el0") / 10_000)
        };
        write_sysreg!("vbar_el1", (&raw const oracle_vectors) as u64);
        gic::v2::enable(VTIMER_PPI);
        write_sysreg!("cntv_tval_el0", read_sysreg!("cntfrq_el0") / 10_000);
        write_sysreg!("cntv_ctl_el0", 1);
        // SAFETY: the routine saves what it uses; its vectors are installed,
        // its page tables live.
        unsafe { oracle_run(0b11) };
        write_sysreg!("cntv_ctl_el0", 0);
        gic::v2::disable(VTIMER_PPI);
        write_sysreg!("vbar_el1", old_vbar);

        let insns = read_sysreg!("pmevcntr0_el0");
        let branches = read_sysreg!("pmevcntr1_el0");
        t.measure("oracle.pmu.instructions", format_args!("{insns}"));
        t.measure("oracle.pmu.branches", format_args!("{branches}"));
        super::bookkeeping(t, ROUNDS * PAGES);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    x86::main(t);
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    arm::main(t);
}
