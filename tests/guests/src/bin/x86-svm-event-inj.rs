//! rustkvm-test: arch=x86_64 cpu=max,pmu=on compare=off
//! rustkvm-expect: kvm=skip kvm-nested=pass
//!   (kvm: this host's KVM gives its guests no SVM; kvm-nested: kvm_amd's
//!   nested SVM runs this hypervisor, a third level, and is the oracle)
//! rustkvm-expect-skip: tcg exit-in-guest
//!   (stock TCG has no x86 PMU to end a block inside the nested guest)
//!
//! An interrupt a hypervisor injects with VMRUN (EVENTINJ, AMD APM vol. 2
//! §15.20) is delivered once. This guest is the hypervisor: it runs a
//! nested guest (same page tables, GDT and IDT, RFLAGS.IF clear) with
//! vector 0x40 in EVENTINJ, VMMCALL intercepted. The nested guest counts
//! down a loop and leaves with VMMCALL. Meanwhile a PMU counter (retired
//! instructions, INT set, LVTPC masked) overflows inside it, which makes
//! the vCPU leave its translated code there without an exception.
//!
//! Checks: the exit is VMMCALL's (0x81), the nested guest's loop ran to its
//! end, and vector 0x40 was taken exactly once. QEMU's VMRUN left the
//! injected vector in `exception_index` after delivering it, and the next
//! exit of the vCPU loop that set none of its own (rustkvm makes them: a
//! PMU sync, steal time's preempted mark) delivered it a second time, as an
//! exception, whatever RFLAGS.IF said. That was nested Linux stalling on a
//! rustkvm L1 (an hrtimer interrupt inside a section holding the hrtimer
//! lock with interrupts off) and the nested SeaBIOS hang (docs/nested.md).
//!
//! SKIPs without SVM (CPUID 0x80000001 ECX bit 2).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-svm-event-inj", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod svm {
    use core::arch::{asm, global_asm};
    use guest::arch::{self, lapic_reg, set_lapic_reg};
    use guest::x86_pmu::{rd, wr, EN, INT, LVTPC, LVT_MASKED, OS, USR};
    use guest::Test;

    /// EFER (AMD APM vol. 2 §3.1.7) and its SVME bit (12).
    const EFER: u32 = 0xc000_0080;
    const EFER_SVME: u64 = 1 << 12;
    /// VM_HSAVE_PA: where VMRUN saves the host's state (§15.30.4).
    const VM_HSAVE_PA: u32 = 0xc001_0117;
    /// The legacy PMU MSRs of counter 0 (§13.2.1).
    const K7_EVNTSEL0: u32 = 0xc001_0000;
    const K7_PERFCTR0: u32 = 0xc001_0004;
    /// Retired instructions (PPR event C0h).
    const INSNS: u64 = 0xc0;
    /// The counter overflows this many instructions after it starts: well
    /// inside the nested guest's loop.
    const OVERFLOW_AFTER: u64 = 2000;
    /// The nested guest's loop (two instructions an iteration).
    const LOOP: u64 = 20_000;
    /// The vector injected.
    const VECTOR: u8 = 0x40;

    /// VMCB control area offsets (§15.5.1, appendix B table B-1).
    const VMCB_INTERCEPT: usize = 0x0c;
    const VMCB_ASID: usize = 0x58;
    const VMCB_EXIT_CODE: usize = 0x70;
    const VMCB_EVENT_INJ: usize = 0xa8;
    /// Intercept bits of the 64-bit word at 0x0c: VMRUN (must be set) and
    /// VMMCALL (vector 4, bits 0 and 1).
    const INTERCEPT_VMRUN: u64 = 1 << 32;
    const INTERCEPT_VMMCALL: u64 = 1 << 33;
    /// EVENTINJ: valid (31), type external interrupt (bits 10:8 = 0).
    const EVENTINJ_VALID: u64 = 1 << 31;
    /// #VMEXIT code of VMMCALL.
    const EXIT_VMMCALL: u64 = 0x81;
    /// VMCB state save area offsets (appendix B table B-2).
    const SAVE_ES: usize = 0x400;
    const SAVE_CS: usize = 0x410;
    const SAVE_SS: usize = 0x420;
    const SAVE_DS: usize = 0x430;
    const SAVE_GDTR: usize = 0x460;
    const SAVE_IDTR: usize = 0x480;
    const SAVE_EFER: usize = 0x4d0;
    const SAVE_CR4: usize = 0x548;
    const SAVE_CR3: usize = 0x550;
    const SAVE_CR0: usize = 0x558;
    const SAVE_DR7: usize = 0x560;
    const SAVE_DR6: usize = 0x568;
    const SAVE_RFLAGS: usize = 0x570;
    const SAVE_RIP: usize = 0x578;
    const SAVE_RSP: usize = 0x5d8;
    const SAVE_G_PAT: usize = 0x668;
    /// Segment attributes in the VMCB's packed form (descriptor bits 47:40
    /// and 55:52): the framework's 64-bit code and flat data segments.
    const ATTR_CODE64: u16 = 0xa9b;
    const ATTR_DATA: u16 = 0xc93;

    #[repr(C, align(4096))]
    struct Page([u8; 4096]);

    static mut VMCB: Page = Page([0; 4096]);
    static mut HSAVE: Page = Page([0; 4096]);
    static mut NESTED_STACK: [Page; 2] = [Page([0; 4096]), Page([0; 4096])];

    /// What the nested guest's loop left: RCX at its VMMCALL.
    static mut NESTED_RCX: u64 = u64::MAX;
    /// Vector 0x40 taken so far (`svm_vector_handler`).
    #[no_mangle]
    static mut SVM_VECTOR_TAKEN: u64 = 0;

    global_asm!(
        // The injected vector's handler: a count, no EOI. (The counting
        // stubs' EOI is an MMIO write, whose I/O recompile leaves the
        // translated code before the counter can, and clears what QEMU
        // left pending.)
        ".global svm_vector_handler",
        "svm_vector_handler:",
        "    lock inc qword ptr [rip + SVM_VECTOR_TAKEN]",
        "    iretq",
        ".global svm_nested_entry",
        "svm_nested_entry:",
        "    mov rcx, {n}",
        "2:  dec rcx",
        "    jnz 2b",
        "    vmmcall",
        "    ud2",
        n = const LOOP,
    );

    extern "C" {
        fn svm_nested_entry();
        fn svm_vector_handler();
    }

    fn taken() -> u64 {
        // SAFETY: a plain read of the word the handler increments.
        unsafe { (&raw const SVM_VECTOR_TAKEN).read_volatile() }
    }

    fn put<T: Copy>(off: usize, value: T) {
        // SAFETY: `off` is inside the VMCB page (the constants above), the
        // page is this CPU's alone, and no VMRUN is running.
        unsafe {
            let base = (&raw mut VMCB).cast::<u8>();
            base.add(off).cast::<T>().write_unaligned(value);
        }
    }

    fn get(off: usize) -> u64 {
        // SAFETY: as `put`: a plain read inside the VMCB page.
        unsafe {
            (&raw const VMCB)
                .cast::<u8>()
                .add(off)
                .cast::<u64>()
                .read_unaligned()
        }
    }

    fn seg(off: usize, selector: u16, attrib: u16, limit: u32, base: u64) {
        put(off, selector);
        put(off + 2, attrib);
        put(off + 4, limit);
        put(off + 8, base);
    }

    /// (limit, base) of the GDT and the IDT.
    fn tables() -> ((u16, u64), (u16, u64)) {
        let mut g = [0u8; 10];
        let mut i = [0u8; 10];
        // SAFETY: SGDT/SIDT store 10 bytes each into the buffers.
        unsafe {
            asm!("sgdt [{}]", in(reg) g.as_mut_ptr(), options(nostack));
            asm!("sidt [{}]", in(reg) i.as_mut_ptr(), options(nostack));
        }
        let split = |b: [u8; 10]| {
            let limit = u16::from_le_bytes([b[0], b[1]]);
            let mut base = [0u8; 8];
            base.copy_from_slice(&b[2..]);
            (limit, u64::from_le_bytes(base))
        };
        (split(g), split(i))
    }

    fn control_regs() -> (u64, u64, u64) {
        let (cr0, cr3, cr4): (u64, u64, u64);
        // SAFETY: reading control registers at CPL 0 has no side effects.
        unsafe {
            asm!("mov {}, cr0", out(reg) cr0, options(nomem, nostack));
            asm!("mov {}, cr3", out(reg) cr3, options(nomem, nostack));
            asm!("mov {}, cr4", out(reg) cr4, options(nomem, nostack));
        }
        (cr0, cr3, cr4)
    }

    /// VMRUN the VMCB, then STGI (the #VMEXIT cleared GIF). The nested
    /// guest shares every register but RAX, RSP and RIP with this code: the
    /// callee-saved ones are kept on the stack around it.
    fn vmrun() {
        let vmcb = (&raw const VMCB) as u64;
        // SAFETY: the VMCB describes a nested guest that runs only
        // `svm_nested_entry` on its own stack, in this address space, and
        // leaves through the intercepted VMMCALL; its RCX comes back here.
        unsafe {
            asm!(
                "push rbx",
                "push rbp",
                "push r12",
                "push r13",
                "push r14",
                "push r15",
                "vmrun rax",
                "stgi",
                "pop r15",
                "pop r14",
                "pop r13",
                "pop r12",
                "pop rbp",
                "pop rbx",
                "mov [{rcx_out}], rcx",
                rcx_out = in(reg) &raw mut NESTED_RCX,
                inout("rax") vmcb => _,
                out("rcx") _, out("rdx") _, out("rsi") _, out("rdi") _,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            );
        }
    }

    pub fn main(t: &mut Test) {
        if arch::cpuid(0x8000_0001, 0)[2] & (1 << 2) == 0 {
            t.skip("x86-svm-event-inj", "no SVM (CPUID 0x80000001 ECX bit 2)");
            return;
        }
        let efer = arch::rdmsr(EFER).unwrap_or(0);
        if arch::wrmsr(EFER, efer | EFER_SVME).is_err() {
            t.skip("x86-svm-event-inj", "EFER.SVME cannot be set");
            return;
        }
        wr(VM_HSAVE_PA, (&raw const HSAVE) as u64);

        let ((glimit, gbase), (ilimit, ibase)) = tables();
        let (cr0, cr3, cr4) = control_regs();
        put(VMCB_INTERCEPT, INTERCEPT_VMRUN | INTERCEPT_VMMCALL);
        put(VMCB_ASID, 1u32);
        put(VMCB_EVENT_INJ, (EVENTINJ_VALID | u64::from(VECTOR)) as u32);
        seg(SAVE_CS, 0x08, ATTR_CODE64, 0xffff_ffff, 0);
        for off in [SAVE_ES, SAVE_SS, SAVE_DS] {
            seg(off, 0x10, ATTR_DATA, 0xffff_ffff, 0);
        }
        seg(SAVE_GDTR, 0, 0, u32::from(glimit), gbase);
        seg(SAVE_IDTR, 0, 0, u32::from(ilimit), ibase);
        put(SAVE_EFER, efer | EFER_SVME);
        put(SAVE_CR0, cr0);
        put(SAVE_CR3, cr3);
        put(SAVE_CR4, cr4);
        put(SAVE_DR7, 0x400u64);
        put(SAVE_DR6, 0xffff_0ff0u64);
        // IF clear: only the injection may deliver the vector.
        put(SAVE_RFLAGS, 0x2u64);
        put(SAVE_RIP, svm_nested_entry as *const () as u64);
        put(SAVE_RSP, (&raw const NESTED_STACK) as u64 + 2 * 4096);
        put(SAVE_G_PAT, 0x0007_0406_0007_0406u64);

        // A counter that overflows inside the nested guest, its PMI masked:
        // the vCPU leaves its translated code there, with no exception.
        let pmu = arch::wrmsr(K7_EVNTSEL0, 0).is_ok()
            && arch::wrmsr(K7_EVNTSEL0, INSNS).is_ok()
            && rd(K7_EVNTSEL0) == INSNS;
        let lvtpc = lapic_reg(LVTPC);
        if pmu {
            set_lapic_reg(LVTPC, lvtpc | LVT_MASKED);
            wr(K7_PERFCTR0, (1u64 << 48) - OVERFLOW_AFTER);
            wr(K7_EVNTSEL0, EN | INT | OS | USR | INSNS);
        } else {
            t.skip(
                "exit-in-guest",
                "no PMU: no counter overflows in the nested guest",
            );
        }

        arch::set_interrupt_gate(VECTOR, svm_vector_handler as *const () as u64);
        vmrun();
        let taken = taken();

        if pmu {
            wr(K7_EVNTSEL0, 0);
            let ctr = rd(K7_PERFCTR0);
            set_lapic_reg(LVTPC, lvtpc);
            // It wrapped: the counter is past 0, not still below 2^48.
            t.check(
                "exit-in-guest",
                ctr < (1u64 << 47),
                format_args!("the counter did not overflow: {ctr:#x}"),
            );
        }
        // SAFETY: a plain read of the word vmrun() wrote.
        let rcx = unsafe { (&raw const NESTED_RCX).read_volatile() };
        t.eq("exit-code", get(VMCB_EXIT_CODE), EXIT_VMMCALL);
        t.eq("nested-loop-done", rcx, 0);
        t.eq("injected-once", taken, 1);
        let _ = arch::wrmsr(EFER, efer);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    svm::main(t);
}
