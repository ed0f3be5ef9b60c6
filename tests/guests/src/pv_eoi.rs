//! PV EOI (KVM_FEATURE_PV_EOI) from the guest's side, for `x86-pv-eoi`
//! and `x86-pv-eoi-migrate`: the word, interrupt stubs for three vectors
//! and a handler that ends each interrupt as Linux's
//! `kvm_guest_apic_eoi_write` does (one test-and-clear of the word's bit
//! 0, else an EOI write), counting which way it went.

use crate::arch::{lapic_reg, self_ipi, set_lapic_reg};
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering::SeqCst};

/// The PV EOI word (4-byte aligned, identity-mapped: its address is
/// its GPA).
pub static WORD: AtomicU32 = AtomicU32::new(0);
/// Per vector: the word's bit 0 when its handler started (last time).
pub static SEEN: [AtomicU8; 256] = [const { AtomicU8::new(0xff) }; 256];
/// Per vector: handler runs.
pub static COUNT: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];
/// Interrupts ended in memory.
pub static PV_EOIS: AtomicU32 = AtomicU32::new(0);
/// Interrupts ended by an EOI write.
pub static APIC_EOIS: AtomicU32 = AtomicU32::new(0);
/// Vectors in handler order.
pub static ORDER: [AtomicU8; 8] = [const { AtomicU8::new(0) }; 8];
static ORDER_AT: AtomicU32 = AtomicU32::new(0);
/// What the OUTER vector's handler does besides ending it: [`PLAIN`],
/// [`NEST`] or [`END_THEN_WAIT`].
pub static MODE: AtomicU8 = AtomicU8::new(PLAIN);
/// Nothing else.
pub const PLAIN: u8 = 0;
/// Nest INNER in itself (interrupts on, a self-IPI) before it ends.
pub const NEST: u8 = 1;
/// Print `ready`, end it in memory and wait for the host's "go on"
/// (tests/src/migrate.rs) before returning: the VM moves with an EOI
/// made in memory that the APIC has not seen yet.
pub const END_THEN_WAIT: u8 = 2;
/// Whether END_THEN_WAIT's test-and-clear found the bit set.
pub static ENDED_IN_MEMORY: AtomicU8 = AtomicU8::new(0xff);
/// In the nesting 0x40 handler, after 0x80 returned: ISR bits 0x40 and
/// 0x80 (bits 0, 1) and the word's bit 0 (bit 2).
pub static AFTER_INNER: AtomicU8 = AtomicU8::new(0xff);

pub const OUTER: u8 = 0x40;
pub const SAME_CLASS: u8 = 0x41;
pub const INNER: u8 = 0x80;

/// Whether `vector` is in service (ISR; SDM Table 11-1).
pub fn in_service(vector: u8) -> bool {
    let v = u32::from(vector);
    lapic_reg(0x100 + (v / 32) * 0x10) & (1 << (v % 32)) != 0
}

pub fn record_order(reset: bool) {
    if reset {
        ORDER_AT.store(0, SeqCst);
        for o in &ORDER {
            o.store(0, SeqCst);
        }
    }
}

/// Called by the stubs below with interrupts off.
#[no_mangle]
extern "C" fn pv_eoi_handler(vector: u64) {
    let v = vector as usize & 0xff;
    SEEN[v].store((WORD.load(SeqCst) & 1) as u8, SeqCst);
    COUNT[v].fetch_add(1, SeqCst);
    let at = ORDER_AT.fetch_add(1, SeqCst) as usize;
    if let Some(o) = ORDER.get(at) {
        o.store(v as u8, SeqCst);
    }
    let mode = if v == usize::from(OUTER) {
        MODE.load(SeqCst)
    } else {
        PLAIN
    };
    if mode == NEST {
        let before = COUNT[usize::from(INNER)].load(SeqCst);
        // SAFETY: the inner vector's handler is this one again, which
        // only counts and ends it.
        unsafe { core::arch::asm!("sti", options(nostack)) };
        self_ipi(INNER);
        let mut spins = 0u64;
        while COUNT[usize::from(INNER)].load(SeqCst) == before && spins < 100_000_000 {
            spins += 1;
            core::hint::spin_loop();
        }
        // SAFETY: back to the handler's interrupts-off state.
        unsafe { core::arch::asm!("cli", options(nostack)) };
        let bits = u8::from(in_service(OUTER))
            | u8::from(in_service(INNER)) << 1
            | ((WORD.load(SeqCst) & 1) as u8) << 2;
        AFTER_INNER.store(bits, SeqCst);
    }
    if mode == END_THEN_WAIT {
        // "ready" first: writing the UART settles PV EOI (its interrupt
        // line's update reaches the local APIC on this vCPU's thread), and
        // nothing after the clear may, or the source would take the EOI.
        // Polling the UART's status for the host's byte settles nothing.
        crate::println!("ready");
        ENDED_IN_MEMORY.store(u8::from(test_and_clear()), SeqCst);
        while !crate::host_said_go() {
            core::hint::spin_loop();
        }
        return;
    }
    // Linux's kvm_guest_apic_eoi_write: one test-and-clear, else EOI.
    if test_and_clear() {
        PV_EOIS.fetch_add(1, SeqCst);
    } else {
        set_lapic_reg(0xb0, 0);
        APIC_EOIS.fetch_add(1, SeqCst);
    }
}

/// The word's bit 0, tested and cleared in one instruction (Linux's
/// `__test_and_clear_bit`): true if it was set.
fn test_and_clear() -> bool {
    let cleared: u8;
    // SAFETY: a bit test-and-reset of the word the host may also write
    // between (never during) this vCPU's instructions.
    unsafe {
        core::arch::asm!(
            "btr dword ptr [{w}], 0",
            "setc {c}",
            w = in(reg) WORD.as_ptr(),
            c = out(reg_byte) cleared,
            options(nostack)
        );
    }
    cleared != 0
}

// The three vectors' stubs: save the caller-saved registers (nine
// pushes keep the stack 16-byte aligned at the call), pass the vector.
core::arch::global_asm!(
    ".macro PV_EOI_STUB n",
    ".global pv_eoi_stub_\\n",
    "pv_eoi_stub_\\n:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "mov edi, \\n",
    "call pv_eoi_handler",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "iretq",
    ".endm",
    "PV_EOI_STUB 64",
    "PV_EOI_STUB 65",
    "PV_EOI_STUB 128",
);

extern "C" {
    static pv_eoi_stub_64: u8;
    static pv_eoi_stub_65: u8;
    static pv_eoi_stub_128: u8;
}

/// Enable the local APIC and point OUTER, SAME_CLASS and INNER at the
/// stubs.
pub fn install() {
    set_lapic_reg(crate::arch::LAPIC_SVR, 0x1ff);
    for (vector, stub) in [
        (OUTER, (&raw const pv_eoi_stub_64) as u64),
        (SAME_CLASS, (&raw const pv_eoi_stub_65) as u64),
        (INNER, (&raw const pv_eoi_stub_128) as u64),
    ] {
        crate::arch::set_interrupt_gate(vector, stub);
    }
}

/// Open a window for the pending interrupt(s) (`sti; nop; nop; cli`).
pub fn take() {
    // SAFETY: the handlers above run in it; interrupts are off after.
    unsafe { core::arch::asm!("sti", "nop", "nop", "cli", options(nostack)) }
}

/// Nothing in service and the processor priority 0 (the ISR and PPR
/// reads, which settle PV EOI first, are the oracle).
pub fn nothing_in_service() -> bool {
    [OUTER, SAME_CLASS, INNER].iter().all(|&v| !in_service(v)) && lapic_reg(0xa0) == 0
}
