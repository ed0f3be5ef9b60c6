//! x86_64 guests: PVH boot (32-bit entry from QEMU's `-kernel` loader),
//! switch to long mode with the low 4 GiB identity-mapped, an IDT whose
//! handlers can resume after an expected fault, COM1 and `isa-debug-exit`.
//!
//! QEMU command line the runner uses: `-kernel guest.elf -serial stdio
//! -device isa-debug-exit,iobase=0xf4,iosize=4`. Writing `v` to port 0xf4 ends
//! QEMU with status `(v << 1) | 1`.

use core::arch::{asm, global_asm};

/// COM1 data port.
const COM1: u16 = 0x3f8;
/// COM1 line status register; bit 5 = transmit holding register empty.
const COM1_LSR: u16 = COM1 + 5;
/// `isa-debug-exit` I/O port (as configured by the runner).
const DEBUG_EXIT_PORT: u16 = 0xf4;
/// Vector value meaning "no fault happened" in [`Fault`] bookkeeping.
const NO_FAULT: u64 = 0xff;

/// #UD, invalid opcode.
pub const UD_VECTOR: u8 = 6;
/// #GP, general protection.
pub const GP_VECTOR: u8 = 13;

global_asm!(
    r#"
    .section .note.Xen, "a"
    .p2align 2
    .long 4                 /* namesz */
    .long 8                 /* descsz */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .quad _start32

    .section .text.boot, "ax"
    .code32
    .global _start32
_start32:
    cli
    /* zero .bss (page tables and stack live there) */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    cld
    rep stosb
    mov $__stack_top, %esp

    /* PML4[0] -> PDPT; PDPT[0..4] -> PD0..PD3; PDs: 2048 x 2 MiB pages = 4 GiB */
    mov $guest_pdpt, %eax
    or $7, %eax             /* present, writable, user */
    mov %eax, guest_pml4
    mov $guest_pdpt, %edi
    mov $guest_pd, %eax
    or $7, %eax
    mov $4, %ecx
1:  mov %eax, (%edi)
    add $4096, %eax
    add $8, %edi
    loop 1b
    mov $guest_pd, %edi
    mov $0x87, %eax         /* 2 MiB, present, writable, user (ring-3 tests) */
    mov $2048, %ecx
2:  mov %eax, (%edi)
    add $0x200000, %eax
    add $8, %edi
    loop 2b

    mov %cr4, %eax
    or $0x20, %eax          /* CR4.PAE */
    mov %eax, %cr4
    mov $guest_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx   /* IA32_EFER */
    rdmsr
    or $0x100, %eax         /* EFER.LME */
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax    /* CR0.PG | CR0.PE */
    mov %eax, %cr0
    lgdt guest_gdt_ptr
    ljmp $0x08, $start64

    .code64
start64:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %ax, %fs
    mov %ax, %gs
    mov $__stack_top, %rsp
    /*
     * Mask both 8259 PICs. Left as firmware-less reset leaves them, their
     * IRQs (the PIT's IRQ 0 first, whenever enough virtual time passes)
     * reach the CPU through LINT0's virtual wire at vectors 8-15, which
     * are exceptions: a guest that enables interrupts took a "double
     * fault" when the host was slow. Guests use the local APIC.
     */
    mov $0xff, %al
    outb %al, $0x21
    outb %al, $0xa1
    call guest_init_idt
    call guest_main
3:  hlt
    jmp 3b

    /*
     * Application processor start-up (INIT-SIPI-SIPI with vector 0x08): this
     * block is copied to physical 0x8000 and entered in real mode with
     * CS = 0x0800, IP = 0. It loads the GDT, enters protected mode, enables
     * the BSP's page tables and long mode, and jumps to guest_ap_start64.
     */
    .global guest_ap_tramp_start, guest_ap_tramp_end
    .code16
guest_ap_tramp_start:
    cli
    mov %cs, %ax
    mov %ax, %ds
    lgdtl (guest_ap_gdt_ptr - guest_ap_tramp_start)
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $0x18, $(0x8000 + guest_ap_pm32 - guest_ap_tramp_start)
    .code32
guest_ap_pm32:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %ss
    mov %cr4, %eax
    or $0x20, %eax
    mov %eax, %cr4
    mov $guest_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx
    rdmsr
    or $0x100, %eax
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax
    mov %eax, %cr0
    ljmp $0x08, $guest_ap_start64
    .p2align 2
guest_ap_gdt_ptr:
    .word guest_gdt_end - guest_gdt - 1
    .long guest_gdt
guest_ap_tramp_end:

    .code64
guest_ap_start64:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %ax, %fs
    mov %ax, %gs
    mov guest_ap_stack_top(%rip), %rsp
    call guest_ap_main
6:  cli
    hlt
    jmp 6b

    /* exception stubs: push (dummy) error code and vector, then common */
    .macro ISR n, has_err
guest_isr\n:
    .if \has_err == 0
    push $0
    .endif
    push $\n
    jmp guest_isr_common
    .endm
    ISR 0,0; ISR 1,0; ISR 2,0; ISR 3,0; ISR 4,0; ISR 5,0; ISR 6,0; ISR 7,0
    ISR 8,1; ISR 9,0; ISR 10,1; ISR 11,1; ISR 12,1; ISR 13,1; ISR 14,1; ISR 15,0
    ISR 16,0; ISR 17,1; ISR 18,0; ISR 19,0; ISR 20,0; ISR 21,1; ISR 22,0; ISR 23,0
    ISR 24,0; ISR 25,0; ISR 26,0; ISR 27,0; ISR 28,0; ISR 29,1; ISR 30,1; ISR 31,0

    /*
     * NMI (vector 2): count it and remember where it interrupted, then
     * return there (PMU tests deliver their PMI as an NMI).
     */
guest_nmi:
    incq guest_nmi_count(%rip)
    push %rax
    mov 8(%rsp), %rax
    mov %rax, guest_nmi_rip(%rip)
    pop %rax
    iretq

    /*
     * External interrupts, vectors 32-255: count them per vector, EOI the
     * local APIC (xAPIC MMIO at 0xfee000b0), return.
     */
    .irp n, 32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117,118,119,120,121,122,123,124,125,126,127,128,129,130,131,132,133,134,135,136,137,138,139,140,141,142,143,144,145,146,147,148,149,150,151,152,153,154,155,156,157,158,159,160,161,162,163,164,165,166,167,168,169,170,171,172,173,174,175,176,177,178,179,180,181,182,183,184,185,186,187,188,189,190,191,192,193,194,195,196,197,198,199,200,201,202,203,204,205,206,207,208,209,210,211,212,213,214,215,216,217,218,219,220,221,222,223,224,225,226,227,228,229,230,231,232,233,234,235,236,237,238,239,240,241,242,243,244,245,246,247,248,249,250,251,252,253,254,255
guest_irq\n:
    lock incq guest_irq_count + 8 * (\n - 32)(%rip)
    push %rax
    mov $0xfee000b0, %eax
    movl $0, (%rax)
    pop %rax
    iretq
    .endr

guest_isr_common:
    /* stack: rax, vector, error code, rip, cs, rflags, rsp, ss */
    push %rax
    mov 8(%rsp), %rax
    mov %rax, guest_fault_vector(%rip)
    mov 16(%rsp), %rax
    mov %rax, guest_fault_error(%rip)
    mov guest_recover_rip(%rip), %rax
    test %rax, %rax
    jz 4f
    mov %rax, 24(%rsp)
    movq $0, guest_recover_rip(%rip)
    pop %rax
    add $16, %rsp
    iretq
4:  /* unexpected exception: exit with status 0x40 + vector */
    mov 8(%rsp), %rax
    add $0x40, %eax
    mov $0xf4, %dx
    out %eax, %dx
5:  hlt
    jmp 5b

    .section .rodata
    .p2align 3
    .global guest_isr_table
guest_isr_table:
    .quad guest_isr0, guest_isr1, guest_nmi
    .irp n, 3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad guest_isr\n
    .endr
    .irp n, 32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117,118,119,120,121,122,123,124,125,126,127,128,129,130,131,132,133,134,135,136,137,138,139,140,141,142,143,144,145,146,147,148,149,150,151,152,153,154,155,156,157,158,159,160,161,162,163,164,165,166,167,168,169,170,171,172,173,174,175,176,177,178,179,180,181,182,183,184,185,186,187,188,189,190,191,192,193,194,195,196,197,198,199,200,201,202,203,204,205,206,207,208,209,210,211,212,213,214,215,216,217,218,219,220,221,222,223,224,225,226,227,228,229,230,231,232,233,234,235,236,237,238,239,240,241,242,243,244,245,246,247,248,249,250,251,252,253,254,255
    .quad guest_irq\n
    .endr
guest_gdt_ptr:
    .word guest_gdt_end - guest_gdt - 1
    .quad guest_gdt

    /*
     * Ring 3 for a call (guest_call_user): enter with IRETQ on the user
     * stack, come back with SYSCALL (LSTAR = guest_syscall_entry), which
     * returns from guest_call_user on the saved kernel stack.
     */
    .text
    .global guest_call_user
guest_call_user:
    push %rbp
    push %rbx
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, guest_user_ret_rsp(%rip)
    lea guest_user_stack_top(%rip), %rax
    pushq $0x23             /* SS: user data */
    push %rax               /* RSP */
    pushfq
    pushq $0x2b             /* CS: user 64-bit code */
    lea guest_user_entry(%rip), %rax
    push %rax
    iretq
guest_user_entry:
    call *%rdi
    syscall
    .global guest_syscall_entry
guest_syscall_entry:
    mov guest_user_ret_rsp(%rip), %rsp
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbx
    pop %rbp
    ret

    .section .data
    .p2align 3
guest_gdt:
    .quad 0
    .quad 0x00af9a000000ffff    /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff    /* 0x10: data */
    .quad 0x00cf9a000000ffff    /* 0x18: 32-bit code (AP start-up) */
    .quad 0x00cff2000000ffff    /* 0x20: user data (DPL 3) */
    .quad 0x00affa000000ffff    /* 0x28: user 64-bit code (DPL 3) */
    .quad 0, 0                  /* 0x30: the BSP's TSS (guest_init_idt) */
guest_gdt_end:
    .global guest_gdt
guest_user_ret_rsp: .quad 0

    .section .data
    .p2align 3
    .global guest_recover_rip, guest_fault_vector, guest_fault_error
guest_recover_rip:  .quad 0
    .global guest_ap_stack_top
guest_ap_stack_top: .quad 0
guest_fault_vector: .quad 0xff
guest_fault_error:  .quad 0
    .global guest_nmi_count, guest_nmi_rip
guest_nmi_count:    .quad 0
guest_nmi_rip:      .quad 0
    .global guest_irq_count
guest_irq_count:    .skip 224 * 8

    .section .bss
    .p2align 12
guest_pml4: .skip 4096
guest_pdpt: .skip 4096
guest_pd:   .skip 4 * 4096
guest_idt:  .skip 256 * 16
    .p2align 4
    .global guest_tss
guest_tss:  .skip 104
    .p2align 4
    .skip 16 * 1024
    .global guest_tss_stack_top
guest_tss_stack_top:
    .skip 16 * 1024
    .global guest_user_stack_top
guest_user_stack_top:
    .p2align 4
    .skip 64 * 1024
__stack_top:
    .global guest_idt
    "#,
    options(att_syntax)
);

extern "C" {
    static guest_ap_tramp_start: u8;
    static guest_ap_tramp_end: u8;
    static mut guest_ap_stack_top: u64;
    static guest_isr_table: [u64; 256];
    static mut guest_idt: [u64; 512];
    static guest_irq_count: [u64; 224];
    static mut guest_fault_vector: u64;
    static mut guest_fault_error: u64;
    static mut guest_nmi_count: u64;
    static mut guest_nmi_rip: u64;
    static mut guest_gdt: [u64; 8];
    static mut guest_tss: [u8; 104];
    static guest_tss_stack_top: u8;
    static guest_syscall_entry: u8;
    fn guest_call_user(f: extern "C" fn());
}

/// Run `f` at CPL 3 (on its own stack; it may use `catch!`-style helpers,
/// whose faults come back to it) and return to CPL 0 when it returns.
/// Only on the boot CPU (the only one with a TSS).
pub fn call_user(f: extern "C" fn()) {
    /// IA32_EFER, IA32_STAR, IA32_LSTAR, IA32_FMASK (SDM vol. 3 §5.8.8).
    const EFER: u32 = 0xc000_0080;
    const STAR: u32 = 0xc000_0081;
    const LSTAR: u32 = 0xc000_0082;
    const FMASK: u32 = 0xc000_0084;
    let efer = rdmsr(EFER).unwrap_or(0);
    let _ = wrmsr(EFER, efer | 1); // SCE
    let _ = wrmsr(STAR, 0x08 << 32); // SYSCALL: CS 0x08, SS 0x10
    let _ = wrmsr(LSTAR, (&raw const guest_syscall_entry) as u64);
    let _ = wrmsr(FMASK, 0);
    // SAFETY: the routine saves the callee-saved registers, runs `f` at CPL 3
    // on the user stack and comes back through SYSCALL to the saved stack.
    unsafe { guest_call_user(f) }
}

/// The boot CPU's TSS: RSP0 for interrupts and exceptions from CPL 3.
fn load_tss() {
    // SAFETY: boot CPU, once, before anything runs at CPL 3; the GDT slot
    // 0x30 is reserved for this descriptor.
    unsafe {
        let tss = (&raw mut guest_tss).cast::<u8>();
        let rsp0 = (&raw const guest_tss_stack_top) as u64;
        core::ptr::write_unaligned(tss.add(4).cast::<u64>(), rsp0);
        core::ptr::write_unaligned(tss.add(102).cast::<u16>(), 104); // no I/O bitmap
        let base = tss as u64;
        let limit = 103u64;
        let low = (limit & 0xffff)
            | (base & 0xff_ffff) << 16
            | 0x89 << 40 // present, available 64-bit TSS
            | ((limit >> 16) & 0xf) << 48
            | ((base >> 24) & 0xff) << 56;
        let gdt = &raw mut guest_gdt;
        (*gdt)[6] = low;
        (*gdt)[7] = base >> 32;
        asm!("ltr {0:x}", in(reg) 0x30u16, options(nostack));
    }
}

/// Interrupts taken so far on `vector` (32-255; 0 for an exception
/// vector): their stubs count them and EOI the local APIC.
pub fn irqs(vector: u8) -> u64 {
    let Some(i) = usize::from(vector).checked_sub(32) else {
        return 0;
    };
    // SAFETY: a plain read of a word the interrupt stubs increment.
    unsafe { (&raw const guest_irq_count[i]).read_volatile() }
}

/// NMIs taken so far, and the RIP the last one interrupted.
pub fn nmis() -> (u64, u64) {
    // SAFETY: plain reads of words the NMI stub writes.
    unsafe {
        (
            (&raw const guest_nmi_count).read_volatile(),
            (&raw const guest_nmi_rip).read_volatile(),
        )
    }
}

/// Point IDT entry `vector` (32-255) at `handler`, a 64-bit interrupt
/// gate at DPL 0, instead of the counting stub; `handler` ends in IRETQ.
pub fn set_interrupt_gate(vector: u8, handler: u64) {
    assert!(vector >= 32, "exception vectors keep their stubs");
    let v = usize::from(vector);
    let low = (handler & 0xffff) | (0x08 << 16) | (0x8e00 << 32) | ((handler >> 16) & 0xffff) << 48;
    // SAFETY: one CPU writes the entry while that vector cannot arrive
    // (the caller has not sent it yet); the IDT is loaded from memory.
    unsafe {
        let idt = &raw mut guest_idt;
        (&raw mut (*idt)[2 * v + 1]).write_volatile(handler >> 32);
        (&raw mut (*idt)[2 * v]).write_volatile(low);
    }
}

/// Send `vector` to this CPU (xAPIC ICR, fixed delivery, the "self"
/// shorthand) and wait until the APIC has taken it.
pub fn self_ipi(vector: u8) {
    lapic_write(LAPIC_ICR_HI, 0);
    lapic_write(LAPIC_ICR_LO, 0x0004_4000 | u32::from(vector)); // self, assert, fixed
    while !lapic_icr_idle() {}
}

/// Load the (already filled) IDT on this CPU.
fn load_idt() {
    // SAFETY: the IDT is filled by guest_init_idt before any AP starts.
    unsafe {
        let base = (&raw const guest_idt) as u64;
        let ptr: [u16; 5] = [
            (256 * 16 - 1) as u16,
            base as u16,
            (base >> 16) as u16,
            (base >> 32) as u16,
            (base >> 48) as u16,
        ];
        asm!("lidt [{}]", in(reg) ptr.as_ptr(), options(readonly, nostack));
    }
}

/// Fill the IDT with the 32 exception stubs and the interrupt counters
/// (vectors 32-255) and load it.
#[no_mangle]
extern "C" fn guest_init_idt() {
    // SAFETY: runs once on the boot CPU before anything else touches the IDT;
    // the table and the stubs are defined in the boot assembly above.
    unsafe {
        let idt = &raw mut guest_idt;
        let table = &raw const guest_isr_table;
        for v in 0..256 {
            let handler = (*table)[v];
            // 64-bit interrupt gate: selector 0x08, present, DPL 0, type 0xE.
            let low = (handler & 0xffff)
                | (0x08 << 16)
                | (0x8e00 << 32)
                | ((handler >> 16) & 0xffff) << 48;
            let high = handler >> 32;
            (*idt)[2 * v] = low;
            (*idt)[2 * v + 1] = high;
        }
    }
    load_idt();
    load_tss();
}

/// An exception caught while executing an instruction under [`catch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Exception vector (6 = #UD, 13 = #GP, ...).
    pub vector: u8,
    /// Error code pushed by the CPU (0 when the vector has none).
    pub error: u64,
}

/// Read (and forget) the fault the last [`catch`]-style instruction, or
/// a guest's own `guest_recover_rip` stretch, raised, if any.
pub fn take_fault() -> Option<Fault> {
    // SAFETY: single-threaded guest; the handler writes these only while the
    // caught instruction runs.
    unsafe {
        let vector = (&raw const guest_fault_vector).read_volatile();
        let error = (&raw const guest_fault_error).read_volatile();
        (&raw mut guest_fault_vector).write_volatile(NO_FAULT);
        (vector != NO_FAULT).then_some(Fault {
            vector: vector as u8,
            error,
        })
    }
}

/// Run one instruction `$insn` (with the given asm operands) so that an
/// exception it raises resumes after it; evaluates to `Option<Fault>`.
macro_rules! catch {
    ($insn:literal $(, $($ops:tt)*)?) => {{
        // SAFETY: the stub in the IDT resumes at label 2 when the instruction
        // faults; nothing else is touched.
        unsafe {
            asm!(
                "lea {tmp}, [rip + 2f]",
                "mov [rip + guest_recover_rip], {tmp}",
                $insn,
                "2:",
                "mov qword ptr [rip + guest_recover_rip], 0",
                tmp = out(reg) _,
                $($($ops)*)?
            );
        }
        take_fault()
    }};
}

/// Write a byte to an I/O port.
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack)) }
}

/// Read a byte from an I/O port.
pub fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe { asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack)) }
    value
}

/// Write a 16-bit value to an I/O port.
pub fn outw(port: u16, value: u16) {
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe { asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack)) }
}

/// Select fw_cfg item `key` (selector port 0x510, little-endian on x86).
pub fn fw_cfg_select(key: u16) {
    outw(0x510, key);
}

/// Next byte of the selected fw_cfg item (data port 0x511).
pub fn fw_cfg_read() -> u8 {
    inb(0x511)
}

/// Write a 32-bit value to an I/O port.
pub fn outl(port: u16, value: u32) {
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack)) }
}

/// Send one byte to COM1.
pub fn putc(b: u8) {
    while inb(COM1_LSR) & 0x20 == 0 {}
    outb(COM1, b);
}

/// A byte from COM1 if one arrived (LSR bit 0: data ready), else None.
pub fn getc() -> Option<u8> {
    (inb(COM1_LSR) & 1 != 0).then(|| inb(COM1))
}

/// End the guest: QEMU exits with `(status << 1) | 1`.
pub fn exit(status: u32) -> ! {
    outl(DEBUG_EXIT_PORT, status);
    loop {
        // SAFETY: halting with interrupts off just stops this CPU.
        unsafe { asm!("cli; hlt", options(nomem, nostack)) }
    }
}

/// CPUID `leaf`/`subleaf` → (EAX, EBX, ECX, EDX).
pub fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// The 12-byte vendor/signature string in EBX, ECX, EDX of a CPUID leaf
/// (leaf 0 order: EBX, EDX, ECX; hypervisor leaf order: EBX, ECX, EDX).
pub fn cpuid_string(regs: [u32; 3]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (i, r) in regs.iter().enumerate() {
        s[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
    }
    s
}

/// RDMSR, catching #GP.
pub fn rdmsr(index: u32) -> Result<u64, Fault> {
    let (lo, hi): (u32, u32);
    match catch!("rdmsr", in("ecx") index, lateout("eax") lo, lateout("edx") hi) {
        None => Ok(u64::from(hi) << 32 | u64::from(lo)),
        Some(f) => Err(f),
    }
}

/// WRMSR, catching #GP.
pub fn wrmsr(index: u32, value: u64) -> Result<(), Fault> {
    match catch!("wrmsr", in("ecx") index, in("eax") value as u32, in("edx") (value >> 32) as u32) {
        None => Ok(()),
        Some(f) => Err(f),
    }
}

/// RDPMC, catching #UD/#GP.
pub fn rdpmc(ecx: u32) -> Result<u64, Fault> {
    let (lo, hi): (u32, u32);
    match catch!("rdpmc", in("ecx") ecx, lateout("eax") lo, lateout("edx") hi) {
        None => Ok(u64::from(hi) << 32 | u64::from(lo)),
        Some(f) => Err(f),
    }
}

/// RDTSC.
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Issue a hypercall instruction (`vmcall` or `vmmcall`) with KVM's ABI (nr
/// in RAX, args RBX, RCX, RDX, RSI, result in RAX), catching #UD.
macro_rules! hypercall {
    ($insn:literal, $nr:expr, $args:expr) => {{
        let args: [u64; 4] = $args;
        let ret: u64;
        // SAFETY: RBX (reserved by LLVM) is saved and restored around the
        // call, after the recovery label so a fault restores it too.
        unsafe {
            asm!(
                "mov {save}, rbx",
                "mov rbx, {a0}",
                "lea {tmp}, [rip + 2f]",
                "mov [rip + guest_recover_rip], {tmp}",
                $insn,
                "2:",
                "mov qword ptr [rip + guest_recover_rip], 0",
                "mov rbx, {save}",
                save = out(reg) _,
                tmp = out(reg) _,
                a0 = in(reg) args[0],
                inout("rax") $nr => ret,
                in("rcx") args[1],
                in("rdx") args[2],
                in("rsi") args[3],
            );
        }
        match take_fault() {
            None => Ok(ret),
            Some(f) => Err(f),
        }
    }};
}

/// VMCALL (Intel's hypercall instruction) with KVM's ABI, catching #UD.
pub fn vmcall(nr: u64, args: [u64; 4]) -> Result<u64, Fault> {
    hypercall!("vmcall", nr, args)
}

/// VMMCALL (AMD's hypercall instruction) with KVM's ABI, catching #UD.
pub fn vmmcall(nr: u64, args: [u64; 4]) -> Result<u64, Fault> {
    hypercall!("vmmcall", nr, args)
}

/// VMCALL with KVM's ABI and no fault catching: for measuring its cost
/// against CPUID (which `__cpuid` also wraps in an RBX save/restore).
pub fn vmcall_raw(nr: u64, a0: u64) -> u64 {
    let ret: u64;
    // SAFETY: RBX (reserved by LLVM) is swapped in and out around VMCALL;
    // the caller knows VMCALL does not fault here (KVM signature seen).
    unsafe {
        asm!(
            "xchg {a0}, rbx",
            "vmcall",
            "xchg {a0}, rbx",
            a0 = inout(reg) a0 => _,
            inout("rax") nr => ret,
            options(nostack)
        );
    }
    ret
}

global_asm!(
    r#"
    /*
     * u64 guest_vmcall_compat(u64 rax, u64 rbx): VMCALL from compatibility
     * mode (CS = 0x18: L = 0, D = 1) with RAX/RBX as given, back to 64-bit
     * mode; returns RAX. The return address travels in ESI (this code sits
     * below 4 GiB), which VMCALL does not change.
     */
    .section .text
    .code64
    .global guest_vmcall_compat
guest_vmcall_compat:
    push %rbx
    push %rsi
    mov %rdi, %rax
    mov %rsi, %rbx
    lea 2f(%rip), %rsi
    pushq $0x18
    lea 1f(%rip), %rcx
    push %rcx
    lretq
    .code32
1:  vmcall
    pushl $0x08
    pushl %esi
    lretl
    .code64
2:  pop %rsi
    pop %rbx
    ret
"#,
    options(att_syntax)
);

extern "C" {
    fn guest_vmcall_compat(rax: u64, rbx: u64) -> u64;
}

/// VMCALL from compatibility mode (a 32-bit code segment under long mode),
/// where KVM's ABI uses 32-bit operands: `rax`/`rbx` go in whole (their
/// upper halves must be ignored); returns the whole RAX afterwards.
/// The caller knows VMCALL does not fault (KVM signature seen).
pub fn vmcall_compat(rax: u64, rbx: u64) -> u64 {
    // SAFETY: the routine switches to the GDT's 32-bit code segment and
    // back, preserving every register but RAX and RCX.
    unsafe { guest_vmcall_compat(rax, rbx) }
}

/// The local APIC (xAPIC MMIO, identity-mapped).
const LAPIC: u64 = 0xfee0_0000;
/// Interrupt command register, low and high halves.
const LAPIC_ICR_LO: u64 = LAPIC + 0x300;
const LAPIC_ICR_HI: u64 = LAPIC + 0x310;
/// Where the AP start-up code is copied (SIPI vector 0x08).
const AP_TRAMPOLINE: u64 = 0x8000;

/// What the application processor runs (set by [`start_ap`]).
static mut AP_WORK: Option<fn()> = None;
/// Most application processors [`start_ap`] can start (one stack each).
pub const MAX_APS: usize = 7;
/// The APs' stacks, one per AP started, 32 KiB each.
static mut AP_STACKS: [[u128; 2048]; MAX_APS] = [[0; 2048]; MAX_APS];
/// APs that reached Rust code (the next start_ap may reuse the globals).
static mut AP_STARTED: u64 = 0;

#[no_mangle]
extern "C" fn guest_ap_main() -> ! {
    load_idt();
    // SAFETY: written by start_ap before the SIPI.
    let work = unsafe { (&raw const AP_WORK).read_volatile() };
    // SAFETY: start_ap waits for this before it starts another AP.
    unsafe {
        let n = (&raw const AP_STARTED).read_volatile();
        (&raw mut AP_STARTED).write_volatile(n + 1);
    }
    if let Some(work) = work {
        work();
    }
    loop {
        // SAFETY: parking the AP for good.
        unsafe { asm!("cli; hlt", options(nomem, nostack)) }
    }
}

fn lapic_write(addr: u64, value: u32) {
    // SAFETY: the local APIC page is identity-mapped MMIO.
    unsafe { (addr as *mut u32).write_volatile(value) }
}

/// Read local APIC register at `offset` (xAPIC MMIO; SDM Table 11-1).
pub fn lapic_reg(offset: u32) -> u32 {
    // SAFETY: the local APIC page is identity-mapped MMIO.
    unsafe { ((LAPIC + u64::from(offset)) as *const u32).read_volatile() }
}

/// Write local APIC register at `offset`.
pub fn set_lapic_reg(offset: u32, value: u32) {
    lapic_write(LAPIC + u64::from(offset), value);
}

/// Whether `vector` is pending in the local APIC's IRR (interrupts stay
/// disabled in these guests, so a delivered interrupt stays there).
pub fn lapic_irr(vector: u8) -> bool {
    let v = u32::from(vector);
    lapic_reg(0x200 + (v / 32) * 0x10) & (1 << (v % 32)) != 0
}

fn lapic_icr_idle() -> bool {
    // SAFETY: as lapic_write; bit 12 = delivery status (send pending).
    unsafe { (LAPIC_ICR_LO as *const u32).read_volatile() & (1 << 12) == 0 }
}

/// Start the application processor with APIC ID `apic_id` (INIT, SIPI,
/// SIPI as the MP specification describes) running `work`, then halting;
/// returns once it runs Rust code. Up to [`MAX_APS`] APs, one at a time.
pub fn start_ap(apic_id: u8, work: fn()) {
    let started = prepare_ap(work);
    let dest = u32::from(apic_id) << 24;
    lapic_write(LAPIC_ICR_HI, dest);
    lapic_write(LAPIC_ICR_LO, 0x0000_4500); // INIT, assert
    while !lapic_icr_idle() {}
    for _ in 0..2 {
        lapic_write(LAPIC_ICR_HI, dest);
        lapic_write(LAPIC_ICR_LO, 0x0000_4600 | (AP_TRAMPOLINE >> 12) as u32); // SIPI
        while !lapic_icr_idle() {}
    }
    wait_for_ap(started);
}

/// IA32_TSC_DEADLINE (SDM §11.5.4.1).
pub const MSR_TSC_DEADLINE: u32 = 0x6e0;
/// Local APIC spurious-interrupt vector register; bit 8 software-enables
/// the APIC.
pub const LAPIC_SVR: u32 = 0xf0;
/// Local APIC LVT timer register.
pub const LAPIC_LVT_TIMER: u32 = 0x320;
/// LVT timer mode TSC-deadline (bits 18:17 = 10b).
pub const LVT_TIMER_TSC_DEADLINE: u32 = 2 << 17;

/// Whether CPUID.1:ECX[24] advertises the TSC-deadline timer mode.
pub fn has_tsc_deadline() -> bool {
    cpuid(1, 0)[2] & (1 << 24) != 0
}

/// IA32_APIC_BASE.
pub const MSR_IA32_APIC_BASE: u32 = 0x1b;
/// IA32_APIC_BASE bit 10: x2APIC mode (EXTD).
pub const APIC_BASE_EXTD: u64 = 1 << 10;
/// The x2APIC MSR of xAPIC register `offset` (SDM §11.12.1.2: 0x800 +
/// offset / 16).
pub const fn x2apic_msr(offset: u32) -> u32 {
    0x800 + offset / 16
}

/// Put this CPU's local APIC in x2APIC mode (it must be enabled, as at
/// reset) and software-enable it (SVR bit 8, spurious vector 0xff).
pub fn enable_x2apic() {
    let base = rdmsr(MSR_IA32_APIC_BASE).unwrap_or(0);
    let _ = wrmsr(MSR_IA32_APIC_BASE, base | APIC_BASE_EXTD);
    let _ = wrmsr(x2apic_msr(0xf0), 0x1ff);
}

/// Whether `vector` is pending in this CPU's IRR, in x2APIC mode.
pub fn x2apic_irr(vector: u8) -> bool {
    let v = u32::from(vector);
    rdmsr(x2apic_msr(0x200 + (v / 32) * 0x10)).unwrap_or(0) & (1 << (v % 32)) != 0
}

/// [`start_ap`] from a CPU in x2APIC mode ([`enable_x2apic`]): the ICR is
/// one MSR with a 32-bit destination, so any APIC ID can be reached.
pub fn start_ap_x2apic(apic_id: u32, work: fn()) {
    let started = prepare_ap(work);
    let dest = u64::from(apic_id) << 32;
    let icr = x2apic_msr(0x300);
    let _ = wrmsr(icr, dest | 0x4500); // INIT, assert
    for _ in 0..2 {
        let _ = wrmsr(icr, dest | 0x4600 | (AP_TRAMPOLINE >> 12)); // SIPI
    }
    wait_for_ap(started);
}

/// The IRR watcher's progress: 1 in x2APIC mode, 2 saw its vector.
static WATCHER_STAGE: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
/// The IRR watcher's x2APIC ID as it reads it.
static WATCHER_ID: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(u32::MAX);
/// The vector the IRR watcher waits for.
static WATCHER_VECTOR: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// The IRR watcher's work: x2APIC mode, then, interrupts off (a delivered
/// vector waits in the IRR), its vector in the IRR within 10 s of a 2 GHz
/// TSC.
fn irr_watcher() {
    use core::sync::atomic::Ordering;
    enable_x2apic();
    let id = rdmsr(x2apic_msr(0x20)).unwrap_or(u64::MAX);
    WATCHER_ID.store(id as u32, Ordering::Release);
    WATCHER_STAGE.store(1, Ordering::Release);
    let vector = WATCHER_VECTOR.load(Ordering::Acquire) as u8;
    let t0 = rdtsc();
    while rdtsc().wrapping_sub(t0) < 20_000_000_000 {
        if x2apic_irr(vector) {
            WATCHER_STAGE.store(2, Ordering::Release);
            return;
        }
        core::hint::spin_loop();
    }
}

/// Wait up to 2 s of a 2 GHz TSC for the IRR watcher to reach `stage`.
fn irr_watcher_reached(stage: u32) -> bool {
    use core::sync::atomic::Ordering;
    let t0 = rdtsc();
    while WATCHER_STAGE.load(Ordering::Acquire) < stage && rdtsc().wrapping_sub(t0) < 4_000_000_000
    {
        core::hint::spin_loop();
    }
    WATCHER_STAGE.load(Ordering::Acquire) >= stage
}

/// From a CPU in x2APIC mode ([`enable_x2apic`]), start the AP `apic_id`
/// as an IRR watcher: it switches to x2APIC mode and, interrupts off,
/// waits for `vector` in its IRR ([`x2apic_irr_watcher_saw`]). Its x2APIC
/// ID as it reads it once in x2APIC mode; None if it did not get there.
pub fn start_x2apic_irr_watcher(apic_id: u32, vector: u8) -> Option<u32> {
    use core::sync::atomic::Ordering;
    WATCHER_VECTOR.store(u32::from(vector), Ordering::Release);
    start_ap_x2apic(apic_id, irr_watcher);
    irr_watcher_reached(1).then(|| WATCHER_ID.load(Ordering::Acquire))
}

/// Whether the IRR watcher saw its vector (waiting for it up to 2 s).
pub fn x2apic_irr_watcher_saw() -> bool {
    irr_watcher_reached(2)
}

/// Copy the start-up code and set the next AP's work and stack; returns how
/// many APs had started before.
fn prepare_ap(work: fn()) -> u64 {
    // SAFETY: reading the counter only the APs write, once each.
    let started = unsafe { (&raw const AP_STARTED).read_volatile() };
    assert!((started as usize) < MAX_APS, "start_ap: out of AP stacks");
    // SAFETY: copying our own start-up code below 1 MiB (free RAM after the
    // firmware handed over), setting globals the AP reads once it runs (no
    // other AP is starting: the previous one reached guest_ap_main).
    unsafe {
        let start = &raw const guest_ap_tramp_start;
        let len = (&raw const guest_ap_tramp_end) as usize - start as usize;
        core::ptr::copy_nonoverlapping(start, AP_TRAMPOLINE as *mut u8, len);
        (&raw mut AP_WORK).write_volatile(Some(work));
        let stack = (&raw mut AP_STACKS)
            .cast::<[u128; 2048]>()
            .add(started as usize);
        let top = stack as u64 + core::mem::size_of::<[u128; 2048]>() as u64;
        (&raw mut guest_ap_stack_top).write_volatile(top);
    }
    started
}

/// Wait (bounded: an AP that never starts must not hang the test) until
/// the AP after `started` left the start-up code and its stack global.
fn wait_for_ap(started: u64) {
    for _ in 0..1_000_000_000u64 {
        // SAFETY: a counter the APs increment.
        if unsafe { (&raw const AP_STARTED).read_volatile() } > started {
            break;
        }
        core::hint::spin_loop();
    }
}

/// Whether CPUID 0x40000000 carries KVM's signature ("KVMKVMKVM\0\0\0").
pub fn has_kvm_signature() -> bool {
    let h = cpuid(0x4000_0000, 0);
    &cpuid_string([h[1], h[2], h[3]]) == b"KVMKVMKVM\0\0\0"
}

/// MSR_KVM_STEAL_TIME (Documentation/virt/kvm/x86/msr.rst).
pub const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;

/// `struct kvm_steal_time` (arch/x86/include/uapi/asm/kvm_para.h), 64-byte
/// aligned as the MSR requires.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct KvmStealTime {
    /// Nanoseconds stolen.
    pub steal: u64,
    /// Odd while the host writes.
    pub version: u32,
    /// Flags.
    pub flags: u32,
    /// Bit 0: the vCPU is preempted.
    pub preempted: u8,
    /// Padding to 64 bytes.
    pub pad: [u8; 47],
}

impl KvmStealTime {
    /// A zeroed structure.
    pub const fn new() -> Self {
        KvmStealTime {
            steal: 0,
            version: 0,
            flags: 0,
            preempted: 0,
            pad: [0; 47],
        }
    }
}

impl KvmStealTime {
    /// `steal` of the structure at `p`, read as Linux's `kvm_steal_clock`
    /// does: again while the version is odd or changed meanwhile.
    ///
    /// # Safety
    ///
    /// `p` points to a `KvmStealTime` this guest may read (a static the
    /// hypervisor updates).
    pub unsafe fn read_steal(p: *const Self) -> u64 {
        loop {
            // SAFETY: the caller's promise; volatile reads of aligned
            // fields the hypervisor may be writing.
            unsafe {
                let v0 = (&raw const (*p).version).read_volatile();
                core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
                let steal = (&raw const (*p).steal).read_volatile();
                core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
                let v1 = (&raw const (*p).version).read_volatile();
                if v0 & 1 == 0 && v0 == v1 {
                    return steal;
                }
            }
        }
    }
}

impl Default for KvmStealTime {
    fn default() -> Self {
        Self::new()
    }
}
