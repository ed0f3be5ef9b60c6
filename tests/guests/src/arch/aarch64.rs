//! aarch64 guests on QEMU's `virt` machine: entered at EL1 with the MMU off
//! (`-kernel guest.elf`), PL011 console at 0x0900_0000, exceptions caught
//! through VBAR_EL1, exit through semihosting (`-semihosting-config
//! enable=on,target=native`), PSCI through HVC (the virt machine's conduit
//! without EL2/EL3).
//!
//! With `-M virt,virtualization=on` QEMU enters at EL2 (and its PSCI conduit
//! is SMC): the runtime sets EL2 up for an AArch64 EL1 (HCR_EL2.RW, the EL1
//! physical counter and timer, FP/SIMD and the GICv3 system registers
//! untrapped, a stub at VBAR_EL2) and drops to EL1, so every guest runs as
//! without EL2. The stub forwards `hvc #0` (PSCI, SMCCC) as `smc #0`, runs
//! [`run_el2`]'s function at EL2 for `hvc #1`, and notes and skips a system
//! register access trapped to EL2 ([`take_el2_trap`]).

use core::arch::{asm, global_asm};

/// PL011 UART data register on the virt machine.
const UART_DR: *mut u32 = 0x0900_0000 as *mut u32;
/// PL011 flag register; bit 5 = transmit FIFO full.
const UART_FR: *const u32 = 0x0900_0018 as *const u32;
/// Semihosting SYS_EXIT.
const SYS_EXIT: u64 = 0x18;
/// ADP_Stopped_ApplicationExit, the SYS_EXIT reason carrying a status.
const ADP_STOPPED_APPLICATION_EXIT: u64 = 0x20026;
/// ESR value meaning "no exception" in the bookkeeping below.
const NO_FAULT: u64 = u64::MAX;

/// PSCI 0.2 PSCI_VERSION (Arm DEN0022).
pub const PSCI_VERSION: u32 = 0x8400_0000;
/// PSCI 0.2 CPU_OFF.
pub const PSCI_CPU_OFF: u32 = 0x8400_0002;
/// PSCI 0.2 CPU_ON, SMC64 calling convention.
pub const PSCI_CPU_ON_64: u32 = 0xc400_0003;
/// SMCCC_VERSION (Arm DEN0028).
pub const SMCCC_VERSION: u32 = 0x8000_0000;

global_asm!(
    r#"
    .section .text.boot, "ax"
    .global _start
_start:
    bl guest_el2_to_el1
    ldr x0, =__stack_top
    mov sp, x0
    bl guest_cpu_setup
    ldr x0, =__bss_start
    ldr x1, =__bss_end
1:  cmp x0, x1
    b.hs 2f
    str xzr, [x0], #8
    b 1b
2:  bl guest_main
3:  wfi
    b 3b

    /* PSCI CPU_ON entry for secondaries: x0 = context id = stack top */
    .global guest_secondary_entry
guest_secondary_entry:
    bl guest_el2_to_el1
    mov sp, x0
    bl guest_cpu_setup
    bl guest_secondary_main
4:  wfi
    b 4b

    /* Entered at EL2: set EL2 up for an AArch64 EL1 (HCR_EL2.RW; CNTHCTL_EL2
       EL1PCTEN | EL1PCEN; CNTVOFF_EL2 0; CPTR_EL2 its RES1 bits, TFP and
       TZ clear; ICC_SRE_EL2 SRE | Enable with a GICv3 CPU interface;
       MDCR_EL2 as reset: HPMN = PMCR_EL0.N, no traps), install the stub
       vectors and this CPU's EL2 stack (by MPIDR Aff0), note it, and
       return to the caller at EL1h, DAIF masked. At EL1: return. Keeps
       x0; uses x9, x10 and no stack. */
guest_el2_to_el1:
    mrs x9, CurrentEL
    cmp x9, #(2 << 2)
    b.ne 1f
    mrs x9, mpidr_el1
    and x9, x9, #7
    add x9, x9, #1
    ldr x10, =guest_el2_stacks
    add x10, x10, x9, lsl #12
    mov sp, x10
    ldr x9, =guest_el2_vectors
    msr vbar_el2, x9
    mov x9, #(1 << 31)
    msr hcr_el2, x9
    mov x9, #3
    msr cnthctl_el2, x9
    msr cntvoff_el2, xzr
    mov x9, #0x32ff
    msr cptr_el2, x9
    mrs x9, id_aa64pfr0_el1
    ubfx x9, x9, #24, #4
    cbz x9, 2f
    mov x9, #0xf
    msr icc_sre_el2, x9
2:  mov x9, #1
    adrp x10, guest_el2_present
    str x9, [x10, :lo12:guest_el2_present]
    msr elr_el2, x30
    mov x9, #0x3c5
    msr spsr_el2, x9
    isb
    eret
1:  ret

    /* EL2's vectors: only a lower EL's HVC (AArch64) is expected. */
    .p2align 11
guest_el2_vectors:
    .rept 8
    .p2align 7
    b guest_el2_unexpected
    .endr
    .p2align 7
    b guest_el2_sync
    .rept 7
    .p2align 7
    b guest_el2_unexpected
    .endr

    /* hvc #0: forward as smc #0 (x0-x17 as the caller left them);
       hvc #1: x0 = x0(x1) at EL2 (guest_run_el2, the caller-saved
       registers clobbered); a trapped system register access (EC 0x18):
       note ESR_EL2 in guest_el2_trap_esr and skip the instruction. */
guest_el2_sync:
    stp x9, x10, [sp, #-16]!
    mrs x9, esr_el2
    lsr x10, x9, #26
    cmp x10, #0x18
    b.ne 2f
    adrp x10, guest_el2_trap_esr
    str x9, [x10, :lo12:guest_el2_trap_esr]
    mrs x9, elr_el2
    add x9, x9, #4
    msr elr_el2, x9
    ldp x9, x10, [sp], #16
    eret
2:  cmp x10, #0x16
    b.ne guest_el2_unexpected
    and x9, x9, #0xffff
    cbnz x9, 1f
    ldp x9, x10, [sp], #16
    smc #0
    eret
1:  cmp x9, #1
    b.ne guest_el2_unexpected
    stp x29, x30, [sp, #-32]!
    mrs x9, elr_el2
    mrs x10, spsr_el2
    stp x9, x10, [sp, #16]
    mov x9, x0
    mov x0, x1
    blr x9
    ldp x9, x10, [sp, #16]
    msr elr_el2, x9
    msr spsr_el2, x10
    ldp x29, x30, [sp], #32
    ldp x9, x10, [sp], #16
    eret

    /* anything else at EL2: exit with 0x80 + ESR_EL2.EC */
guest_el2_unexpected:
    mrs x0, esr_el2
    lsr x0, x0, #26
    add x0, x0, #0x80
    b guest_exit_status

    /* FP/SIMD on (CPACR_EL1.FPEN = 0b11), exception vectors installed */
guest_cpu_setup:
    mov x9, #(3 << 20)
    msr cpacr_el1, x9
    ldr x9, =guest_vectors
    msr vbar_el1, x9
    isb
    ret

    .p2align 11
guest_vectors:
    .rept 8
    .p2align 7
    b guest_exception
    .endr
    /* lower EL, AArch64, synchronous: EL0 code (run_el0) ended */
    .p2align 7
    b guest_lower_sync
    .rept 7
    .p2align 7
    b guest_exception
    .endr

    /* Back from EL0: record ESR_EL1 and x0, resume guest_run_el0's caller
       at EL1 with its stack (EL1h, DAIF masked). */
guest_lower_sync:
    mrs x9, esr_el1
    adrp x10, guest_el0_esr
    str x9, [x10, :lo12:guest_el0_esr]
    adrp x10, guest_el0_x0
    str x0, [x10, :lo12:guest_el0_x0]
    adrp x10, guest_el1_sp
    ldr x9, [x10, :lo12:guest_el1_sp]
    mov sp, x9
    adr x9, 7f
    msr elr_el1, x9
    mov x9, #0x3c5
    msr spsr_el1, x9
    eret

    /* guest_run_el0(f = x0, arg = x1, sp_el0 = x2) -> x0: f(arg) at EL0 */
    .global guest_run_el0
guest_run_el0:
    stp x29, x30, [sp, #-160]!
    stp x19, x20, [sp, #16]
    stp x21, x22, [sp, #32]
    stp x23, x24, [sp, #48]
    stp x25, x26, [sp, #64]
    stp x27, x28, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x9, sp
    adrp x10, guest_el1_sp
    str x9, [x10, :lo12:guest_el1_sp]
    msr sp_el0, x2
    ldr x9, =guest_el0_trampoline
    msr elr_el1, x9
    mov x9, #0x3c0
    msr spsr_el1, x9
    mov x9, x0
    mov x0, x1
    mov x1, x9
    eret
7:  adrp x10, guest_el0_x0
    ldr x0, [x10, :lo12:guest_el0_x0]
    ldp x19, x20, [sp, #16]
    ldp x21, x22, [sp, #32]
    ldp x23, x24, [sp, #48]
    ldp x25, x26, [sp, #64]
    ldp x27, x28, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    ldp x29, x30, [sp], #160
    ret

    /* At EL0: x0 = arg, x1 = f; SVC back to EL1 with f's result */
guest_el0_trampoline:
    blr x1
    svc #0
8:  b 8b

guest_exception:
    sub sp, sp, #16
    stp x0, x1, [sp]
    mrs x0, esr_el1
    adrp x1, guest_fault_esr
    str x0, [x1, :lo12:guest_fault_esr]
    adrp x1, guest_recover_pc
    ldr x0, [x1, :lo12:guest_recover_pc]
    cbz x0, 5f
    msr elr_el1, x0
    str xzr, [x1, :lo12:guest_recover_pc]
    ldp x0, x1, [sp]
    add sp, sp, #16
    eret
5:  /* unexpected exception: guest_unexpected reports it and exits with
       0x40 + ESR.EC */
    mrs x0, esr_el1
    mrs x1, elr_el1
    mrs x2, far_el1
    bl guest_unexpected
7:  b 7b
    /* semihosting SYS_EXIT with status x0 */
guest_exit_status:
    adrp x1, guest_exit_block
    add x1, x1, :lo12:guest_exit_block
    str x0, [x1, #8]
    mov x0, #0x18
    hlt #0xf000
6:  b 6b

    .section .data
    .p2align 3
    .global guest_recover_pc, guest_fault_esr
guest_recover_pc: .quad 0
guest_fault_esr:  .quad 0xffffffffffffffff
guest_exit_block: .quad 0x20026, 0
    .global guest_el0_esr
guest_el0_esr:    .quad 0
guest_el0_x0:     .quad 0
guest_el1_sp:     .quad 0
    .global guest_el2_present, guest_el2_trap_esr
guest_el2_present: .quad 0
guest_el2_trap_esr: .quad 0xffffffffffffffff

    .section .bss
    .p2align 4
    .skip 64 * 1024
__stack_top:
    /* EL2 stacks, 4 KiB per CPU (MPIDR Aff0 0-7), each below its top */
    .p2align 4
guest_el2_stacks:
    .skip 8 * 4096
    "#
);

extern "C" {
    static mut guest_fault_esr: u64;
    static guest_el0_esr: u64;
    static guest_el2_present: u64;
    static mut guest_el2_trap_esr: u64;
    fn guest_secondary_entry();
    fn guest_run_el0(f: extern "C" fn(u64) -> u64, arg: u64, sp_el0: u64) -> u64;
}

/// ESR_EL1.EC of an SVC from AArch64 (how EL0 code returns).
const EC_SVC64: u8 = 0x15;

/// The stack EL0 code runs on.
#[repr(C, align(16))]
struct El0Stack([u8; 16 * 1024]);

static mut EL0_STACK: El0Stack = El0Stack([0; 16 * 1024]);

/// Run `f(arg)` at EL0 (EL0t, interrupts masked, MMU off as at EL1) and
/// come back: its result, or the exception that ended it (e.g. an
/// UNDEFINED system register access: EC 0). Not reentrant; vCPU 0 only.
pub fn run_el0(f: extern "C" fn(u64) -> u64, arg: u64) -> Result<u64, Fault> {
    let top = (&raw const EL0_STACK) as u64 + core::mem::size_of::<El0Stack>() as u64;
    // SAFETY: guest_run_el0 saves the callee-saved registers and EL1 stack,
    // ERETs to `f` at EL0 on its own stack, and returns here when EL0 takes
    // any synchronous exception (its SVC or a fault).
    let x0 = unsafe { guest_run_el0(f, arg, top) };
    // SAFETY: written by the lower-EL vector before it returned.
    let esr = unsafe { (&raw const guest_el0_esr).read_volatile() };
    if (esr >> 26) as u8 == EC_SVC64 {
        Ok(x0)
    } else {
        Err(Fault { esr })
    }
}

/// Whether QEMU entered the guest at EL2 (`-M virt,virtualization=on`):
/// the runtime then runs at EL1 with EL2's stub beneath (module docs).
pub fn has_el2() -> bool {
    // SAFETY: written once at entry, before any Rust code ran.
    unsafe { (&raw const guest_el2_present).read_volatile() != 0 }
}

/// Run `f(arg)` at EL2 through the runtime's stub (`hvc #1`) and come back
/// with its result; None without EL2 ([`has_el2`]). `f` runs with the MMU
/// off, interrupts masked, on this CPU's 4 KiB EL2 stack, and must take no
/// exception.
pub fn run_el2(f: extern "C" fn(u64) -> u64, arg: u64) -> Option<u64> {
    if !has_el2() {
        return None;
    }
    let r;
    // SAFETY: the EL2 stub calls `f` (an extern "C" function) with `arg`
    // and ERETs back after this HVC; what it clobbers is what a C call may.
    unsafe {
        asm!(
            "hvc #1",
            inout("x0") f as usize as u64 => r,
            in("x1") arg,
            clobber_abi("C"),
        );
    }
    Some(r)
}

/// The last system register access trapped to EL2's stub (ESR_EL2.EC
/// 0x18: the stub skipped the instruction, which read nothing) since the
/// previous call, and forget it.
pub fn take_el2_trap() -> Option<Fault> {
    // SAFETY: the stub writes this only while a trapped access is taken.
    unsafe {
        let esr = (&raw const guest_el2_trap_esr).read_volatile();
        (&raw mut guest_el2_trap_esr).write_volatile(NO_FAULT);
        (esr != NO_FAULT).then_some(Fault { esr })
    }
}

/// An exception caught while executing an instruction under [`catch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// ESR_EL1 of the exception.
    pub esr: u64,
}

impl Fault {
    /// The exception class, ESR_EL1[31:26] (0x00 = unknown/UNDEFINED).
    pub fn ec(&self) -> u8 {
        (self.esr >> 26) as u8
    }
}

fn take_fault() -> Option<Fault> {
    // SAFETY: the handler writes this only while a caught instruction runs.
    unsafe {
        let esr = (&raw const guest_fault_esr).read_volatile();
        (&raw mut guest_fault_esr).write_volatile(NO_FAULT);
        (esr != NO_FAULT).then_some(Fault { esr })
    }
}

/// Run `$insn` so that an exception it raises resumes after it; evaluates
/// to `Option<Fault>`.
#[allow(unused_macros)]
macro_rules! catch {
    ($insn:literal $(, $($ops:tt)*)?) => {{
        // SAFETY: the vector resumes at label 2 when the instruction traps.
        unsafe {
            asm!(
                "adr {tmp}, 2f",
                "adrp {tmp2}, guest_recover_pc",
                "str {tmp}, [{tmp2}, :lo12:guest_recover_pc]",
                $insn,
                "2:",
                "adrp {tmp2}, guest_recover_pc",
                "str xzr, [{tmp2}, :lo12:guest_recover_pc]",
                tmp = out(reg) _,
                tmp2 = out(reg) _,
                $($($ops)*)?
            );
        }
        take_fault()
    }};
}

/// Execute BRK #0 at EL1 and catch it: the exception, if it was taken.
pub fn brk() -> Option<Fault> {
    catch!("brk #0")
}

/// Quiesce the PMU: every counter disabled, its overflow interrupt
/// disabled and its overflow flag cleared (PMCNTENCLR, PMINTENCLR,
/// PMOVSCLR, in that order: no interrupt level rises in between).
pub fn pmu_clear() {
    // SAFETY: PMU control registers at EL1; no memory effects.
    unsafe {
        core::arch::asm!(
            "msr pmcntenclr_el0, {all}",
            "msr pmintenclr_el1, {all}",
            "msr pmovsclr_el0, {all}",
            all = in(reg) u64::MAX,
            options(nostack),
        );
    }
}

/// Why a test of the PMU's overflow interrupt on INST_RETIRED cannot run
/// here, if it cannot: PMCEID0 does not advertise INST_RETIRED, or this is
/// stock TCG, which counts instructions (with -icount) but raises its
/// overflow interrupt only at its next counter sync (measured: it never
/// came within a poll loop), not as KVM does.
pub fn pmu_overflow_irq_unavailable() -> Option<&'static str> {
    /// INST_RETIRED.
    const INST_RETIRED: u64 = 0x08;
    if crate::read_sysreg!("pmceid0_el0") & (1 << INST_RETIRED) == 0 {
        Some("PMCEID0: no INST_RETIRED")
    } else if crate::backend() == Some(crate::Backend::Tcg) {
        Some("stock TCG's PMU interrupt is not KVM's")
    } else {
        None
    }
}

/// With the PMU counters in `mask` enabled, run a register-only loop of
/// `iterations` (≥ 1): the counters see 2 + 2 × `iterations` instructions
/// (the enabling `msr`, the `mov` that loads the count, each iteration's
/// `subs` and `b.ne`; the disabling `msr` is not counted), `iterations`
/// branches and no memory access. EL1 only (PMCNTEN writes).
pub fn pmu_counted_loop(mask: u64, iterations: u64) {
    // SAFETY: PMU enables at EL1 around register arithmetic.
    unsafe {
        core::arch::asm!(
            "msr pmcntenset_el0, {mask}",
            "mov {i}, {n}",
            "2:",
            "subs {i}, {i}, #1",
            "b.ne 2b",
            "msr pmcntenclr_el0, {mask}",
            mask = in(reg) mask,
            n = in(reg) iterations,
            i = out(reg) _,
            options(nostack),
        );
    }
}

/// 2 × `n` instructions (n ≥ 1) of register-only loop, at whatever EL
/// calls it: `subs` and `b.ne` each iteration.
#[inline(always)]
pub fn spin(n: u64) {
    // SAFETY: a register-only loop.
    unsafe {
        asm!(
            "1: subs {n}, {n}, #1",
            "b.ne 1b",
            n = inout(reg) n => _,
            options(nomem, nostack)
        );
    }
}

/// Read PMCR_EL0, catching UNDEFINED.
pub fn read_pmcr() -> Result<u64, Fault> {
    let v: u64;
    match catch!("mrs {v}, pmcr_el0", v = lateout(reg) v) {
        None => Ok(v),
        Some(f) => Err(f),
    }
}

/// MMIO accessors, single plain LDR/STR without writeback (as Linux's
/// `readl`/`writel`): KVM emulates a device access from the syndrome the
/// data abort reports, which an access with writeback or a pair does not
/// have (ESR_EL2.ISV 0: KVM injects an external abort instead; measured
/// nested, a GICv3 redistributor write the compiler gave writeback).
pub mod mmio {
    use core::arch::asm;

    /// 32-bit store of `v` to device address `addr`.
    ///
    /// # Safety
    /// `addr` is a device register (or RAM) this guest may write.
    pub unsafe fn write32(addr: usize, v: u32) {
        // SAFETY: the caller's contract; one STR, no writeback.
        unsafe { asm!("str {v:w}, [{a}]", a = in(reg) addr, v = in(reg) v, options(nostack)) }
    }

    /// 16-bit store.
    ///
    /// # Safety
    /// As [`write32`].
    pub unsafe fn write16(addr: usize, v: u16) {
        // SAFETY: as above; STRH.
        unsafe {
            asm!("strh {v:w}, [{a}]", a = in(reg) addr, v = in(reg) u32::from(v), options(nostack))
        }
    }

    /// 8-bit store.
    ///
    /// # Safety
    /// As [`write32`].
    pub unsafe fn write8(addr: usize, v: u8) {
        // SAFETY: as above; STRB.
        unsafe {
            asm!("strb {v:w}, [{a}]", a = in(reg) addr, v = in(reg) u32::from(v), options(nostack))
        }
    }

    /// 32-bit load from device address `addr`.
    ///
    /// # Safety
    /// `addr` is a device register (or RAM) this guest may read.
    pub unsafe fn read32(addr: usize) -> u32 {
        let v: u32;
        // SAFETY: the caller's contract; one LDR, no writeback.
        unsafe { asm!("ldr {v:w}, [{a}]", a = in(reg) addr, v = out(reg) v, options(nostack)) };
        v
    }

    /// 8-bit load.
    ///
    /// # Safety
    /// As [`read32`].
    pub unsafe fn read8(addr: usize) -> u8 {
        let v: u32;
        // SAFETY: as above; LDRB.
        unsafe { asm!("ldrb {v:w}, [{a}]", a = in(reg) addr, v = out(reg) v, options(nostack)) };
        v as u8
    }
}

/// Send one byte to the PL011.
pub fn putc(b: u8) {
    // SAFETY: the virt machine's PL011 is at this address; MMIO is volatile.
    unsafe {
        while mmio::read32(UART_FR as usize) & (1 << 5) != 0 {}
        mmio::write32(UART_DR as usize, u32::from(b));
    }
}

/// A byte from the PL011 if one arrived (UARTFR.RXFE clear), else None.
pub fn getc() -> Option<u8> {
    // SAFETY: the virt machine's PL011 is at these addresses; MMIO is volatile.
    unsafe {
        if mmio::read32(UART_FR as usize) & (1 << 4) != 0 {
            None
        } else {
            Some(mmio::read32(UART_DR as usize) as u8)
        }
    }
}

/// The virt machine's fw_cfg: data register (8-bit reads).
const FW_CFG_DATA: *const u8 = 0x0902_0000 as *const u8;
/// Its selector register (16-bit, big-endian).
const FW_CFG_SELECTOR: *mut u16 = 0x0902_0008 as *mut u16;

/// Select fw_cfg item `key`.
pub fn fw_cfg_select(key: u16) {
    // SAFETY: the virt machine's fw_cfg is at this address; MMIO is volatile.
    unsafe { mmio::write16(FW_CFG_SELECTOR as usize, key.to_be()) }
}

/// Next byte of the selected fw_cfg item.
pub fn fw_cfg_read() -> u8 {
    // SAFETY: as above.
    unsafe { mmio::read8(FW_CFG_DATA as usize) }
}

/// PSCI SYSTEM_OFF (SMC32), PSCI 1.1 (DEN0022) §5.10.
const PSCI_SYSTEM_OFF: u32 = 0x8400_0008;

/// End the guest with `status`: through semihosting SYS_EXIT; on the kvm
/// backend, which has no semihosting (HLT is UNDEFINED at EL1 under KVM),
/// as an `exit N` console line, then PSCI SYSTEM_OFF (the runner reads the
/// line: tests/src/run.rs `judge`).
pub fn exit(status: u32) -> ! {
    if crate::backend() == Some(crate::Backend::Kvm) {
        crate::println!("exit {status}");
        hvc(PSCI_SYSTEM_OFF, [0; 3]);
    }
    let block = [ADP_STOPPED_APPLICATION_EXIT, u64::from(status)];
    // SAFETY: semihosting call; QEMU reads the parameter block and exits.
    unsafe {
        asm!("hlt #0xf000", in("x0") SYS_EXIT, in("x1") block.as_ptr(), options(nostack));
    }
    loop {
        // SAFETY: waiting for an interrupt that never comes.
        unsafe { asm!("wfi", options(nomem, nostack)) }
    }
}

/// An SMCCC/PSCI call through HVC: x0 = function id, x1..x3 = arguments;
/// returns x0..x3.
pub fn hvc(func: u32, args: [u64; 3]) -> [u64; 4] {
    let (r0, r1, r2, r3);
    // SAFETY: HVC on the PSCI conduit is answered by the hypervisor (QEMU);
    // SMCCC 1.1 preserves x4-x17.
    unsafe {
        asm!(
            "hvc #0",
            inout("x0") u64::from(func) => r0,
            inout("x1") args[0] => r1,
            inout("x2") args[1] => r2,
            inout("x3") args[2] => r3,
            options(nostack)
        );
    }
    [r0, r1, r2, r3]
}

/// MPIDR_EL1 affinity bits (Aff0..Aff2).
pub fn mpidr() -> u64 {
    let v: u64;
    // SAFETY: reading MPIDR_EL1 at EL1 has no side effects.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) v, options(nomem, nostack)) };
    v & 0xff_ffff
}

/// MIDR_EL1.
pub fn midr() -> u64 {
    let v: u64;
    // SAFETY: reading MIDR_EL1 at EL1 has no side effects.
    unsafe { asm!("mrs {}, midr_el1", out(reg) v, options(nomem, nostack)) };
    v
}

/// CNTVCT_EL0, the virtual counter.
pub fn cntvct() -> u64 {
    let v: u64;
    // SAFETY: reading the virtual counter has no side effects.
    unsafe { asm!("isb; mrs {}, cntvct_el0", out(reg) v, options(nomem, nostack)) };
    v
}

/// CNTPCT_EL0, the physical counter.
pub fn cntpct() -> u64 {
    let v: u64;
    // SAFETY: reading the physical counter at EL1 has no side effects.
    unsafe { asm!("isb; mrs {}, cntpct_el0", out(reg) v, options(nomem, nostack)) };
    v
}

/// CNTFRQ_EL0, the counter frequency in Hz.
pub fn cntfrq() -> u64 {
    let v: u64;
    // SAFETY: reading CNTFRQ_EL0 has no side effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) v, options(nomem, nostack)) };
    v
}

/// Secondary CPUs [`cpu_on`] can run at once: Aff0 1..=7 (the virt
/// machine numbers its first 8 CPUs by Aff0).
pub const MAX_SECONDARIES: usize = 7;

/// What each secondary CPU runs after PSCI CPU_ON (set by [`cpu_on`]),
/// by Aff0.
static mut SECONDARY_WORK: [Option<fn()>; MAX_SECONDARIES + 1] = [None; MAX_SECONDARIES + 1];

/// One stack per secondary CPU, by Aff0 (slot 0 unused: CPU 0 has the
/// boot stack).
static mut SECONDARY_STACKS: [[u128; 1024]; MAX_SECONDARIES + 1] = [[0; 1024]; MAX_SECONDARIES + 1];

/// The [`SECONDARY_WORK`]/[`SECONDARY_STACKS`] slot of CPU `mpidr`.
fn secondary_slot(mpidr: u64) -> usize {
    (mpidr & 0xff) as usize % (MAX_SECONDARIES + 1)
}

/// An exception at EL1 nothing expected (no [`catch`] armed): say what
/// it was and exit with 0x40 + its EC, through [`exit`] (semihosting, or
/// on KVM, which has none, the console and PSCI).
#[no_mangle]
extern "C" fn guest_unexpected(esr: u64, elr: u64, far: u64) -> ! {
    crate::println!(
        "unexpected exception: ESR_EL1 {esr:#x} (EC {:#x}) ELR_EL1 {elr:#x} FAR_EL1 {far:#x}",
        esr >> 26
    );
    exit(0x40 + (esr >> 26) as u32)
}

#[no_mangle]
extern "C" fn guest_secondary_main() -> ! {
    // SAFETY: written by `cpu_on` before CPU_ON, read-only afterwards.
    let work = unsafe { (&raw const SECONDARY_WORK[secondary_slot(mpidr())]).read_volatile() };
    if let Some(work) = work {
        work();
    }
    hvc(PSCI_CPU_OFF, [0; 3]);
    loop {
        // SAFETY: CPU_OFF does not return; park if it ever did.
        unsafe { asm!("wfi", options(nomem, nostack)) }
    }
}

/// Start the CPU with affinity `mpidr` (Aff0 1..=[`MAX_SECONDARIES`])
/// running `work` on a stack of its own, then CPU_OFF. Several may run at
/// once. Returns PSCI's status (0 = SUCCESS).
pub fn cpu_on(mpidr: u64, work: fn()) -> i64 {
    let slot = secondary_slot(mpidr);
    assert!(slot != 0, "cpu_on: CPU 0 has no secondary slot");
    // SAFETY: the slot is this CPU's; it reads them after CPU_ON.
    let stack_top = unsafe {
        (&raw mut SECONDARY_WORK[slot]).write_volatile(Some(work));
        (&raw mut SECONDARY_STACKS[slot])
            .cast::<u8>()
            .add(core::mem::size_of::<[u128; 1024]>()) as u64
    };
    let entry = guest_secondary_entry as *const () as u64;
    hvc(PSCI_CPU_ON_64, [mpidr, entry, stack_top])[0] as i64
}

/// ARM_SMCCC_HV_PV_TIME_FEATURES (Arm DEN0057A).
pub const PV_TIME_FEATURES: u32 = 0xc500_0020;
/// ARM_SMCCC_HV_PV_TIME_ST: this vCPU's stolen-time structure's address.
pub const PV_TIME_ST: u32 = 0xc500_0021;

/// This vCPU's PV stolen-time structure (PV_TIME_ST), if the hypervisor
/// gives one (SMCCC_RET_NOT_SUPPORTED, -1, otherwise).
pub fn pv_time_st() -> Option<u64> {
    let base = hvc(PV_TIME_ST, [0; 3])[0];
    (base != u64::MAX).then_some(base)
}

/// `stolen_time` of the PV time structure at `base` (one 64-bit field the
/// hypervisor stores at once: no version protocol).
pub fn stolen_time(base: u64) -> u64 {
    // SAFETY: the 64-byte structure PV_TIME_ST handed us, identity-mapped
    // (MMU off) or mapped by the caller; the host updates it.
    unsafe { ((base + 8) as *const u64).read_volatile() }
}

/// Read a system register by name: `read_sysreg!("pmcr_el0")`.
#[macro_export]
macro_rules! read_sysreg {
    ($name:literal) => {{
        let v: u64;
        // SAFETY: reading a system register the guest is allowed to read;
        // an UNDEFINED one ends the guest with the unexpected-exception status.
        unsafe { core::arch::asm!(concat!("mrs {}, ", $name), out(reg) v, options(nostack)) };
        v
    }};
}

/// Write a system register by name: `write_sysreg!("pmselr_el0", 0)`.
#[macro_export]
macro_rules! write_sysreg {
    ($name:literal, $v:expr) => {{
        let v: u64 = $v;
        // SAFETY: as for read_sysreg!; followed by an ISB so the write is
        // visible to the next instruction.
        unsafe { core::arch::asm!(concat!("msr ", $name, ", {}"), "isb", in(reg) v, options(nostack)) };
    }};
}
