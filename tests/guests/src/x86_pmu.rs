//! x86 PMU test helpers shared by the PMU guests: the MSRs, and code
//! sequences whose retired instructions and branches are known exactly.
//!
//! Each sequence starts counting with one WRMSR (`start`: which MSR, what
//! value; it counts, as KVM counts the instructions it emulates once a
//! counter counts), runs its body, then executes three instructions (`mov
//! ecx`, `xor eax`, `xor edx`) and a WRMSR that writes 0 to `stop` (which
//! does not count: nothing counts when it retires).

use core::arch::asm;

use crate::arch;

/// Intel IA32_PMC0 (GP counter 0; PMC1 follows).
pub const PMC0: u32 = 0xc1;
/// Intel IA32_PERFEVTSEL0.
pub const EVTSEL0: u32 = 0x186;
/// Intel IA32_FIXED_CTR0 (instructions retired).
pub const FIXED_CTR0: u32 = 0x309;
/// Intel IA32_FIXED_CTR_CTRL.
pub const FIXED_CTR_CTRL: u32 = 0x38d;
/// Intel IA32_PERF_GLOBAL_STATUS.
pub const GLOBAL_STATUS: u32 = 0x38e;
/// Intel IA32_PERF_GLOBAL_CTRL.
pub const GLOBAL_CTRL: u32 = 0x38f;
/// Intel IA32_PERF_GLOBAL_OVF_CTRL.
pub const GLOBAL_OVF_CTRL: u32 = 0x390;
/// Event select bits (Intel and AMD): count at CPL > 0, at CPL 0, PMI on
/// overflow, enable.
pub const USR: u64 = 1 << 16;
/// See [`USR`].
pub const OS: u64 = 1 << 17;
/// See [`USR`].
pub const INT: u64 = 1 << 20;
/// See [`USR`].
pub const EN: u64 = 1 << 22;
/// Local APIC: spurious-interrupt vector register, LVT performance counter
/// register, its NMI delivery mode (100b in bits 10:8) and mask bit.
pub const SVR: u32 = 0xf0;
/// See [`SVR`].
pub const LVTPC: u32 = 0x340;
/// See [`SVR`].
pub const LVT_NMI: u32 = 4 << 8;
/// See [`SVR`].
pub const LVT_MASKED: u32 = 1 << 16;

/// WRMSR that must succeed.
pub fn wr(index: u32, value: u64) {
    arch::wrmsr(index, value).expect("PMU MSR write");
}

/// RDMSR that must succeed.
pub fn rd(index: u32) -> u64 {
    arch::rdmsr(index).expect("PMU MSR read")
}

/// `mov r8, n` and `dec r8; jnz` n times: 2n + 5 instructions counted with
/// the start and stop; n branches.
pub fn counted_loop(start: (u32, u64), stop: u32, n: u64) {
    branch_loop(start, stop, n);
}

/// 40 NOPs; returns the first NOP's address.
pub fn nop_sled(start: (u32, u64), stop: u32) -> u64 {
    let sled: u64;
    // SAFETY: as counted_loop.
    unsafe {
        asm!(
            "lea {sled}, [rip + 5f]",
            "wrmsr",
            "5:",
            ".rept 40",
            "nop",
            ".endr",
            "mov ecx, {stop:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            sled = out(reg) sled,
            stop = in(reg) stop,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            options(nostack),
        );
    }
    sled
}

/// Start counting, then POPFQ a copy of RFLAGS with IF set (the 2nd
/// instruction counted), 8 NOPs, stop counting and CLI; returns the address
/// right after the POPFQ, where an interrupt that POPFQ unmasked, or a PMI
/// on its overflow, is taken.
pub fn popf_sti(start: (u32, u64), stop: u32) -> u64 {
    let after: u64;
    // SAFETY: as counted_loop; the PUSHFQ/POPFQ pair is balanced, and
    // interrupts are off again at the end.
    unsafe {
        asm!(
            "lea {after}, [rip + 7f]",
            "pushfq",
            "or qword ptr [rsp], 0x200",
            "wrmsr",
            "popfq",
            "7:",
            ".rept 8",
            "nop",
            ".endr",
            "mov ecx, {stop:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            "cli",
            after = out(reg) after,
            stop = in(reg) stop,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
        );
    }
    after
}

/// [`counted_loop`], returning the loop head's address (where an interrupt
/// right after a taken JNZ comes back to; the `lea` is before the start).
pub fn branch_loop(start: (u32, u64), stop: u32, n: u64) -> u64 {
    let head: u64;
    // SAFETY: as counted_loop.
    unsafe {
        asm!(
            "lea {head}, [rip + 6f]",
            "wrmsr",
            "mov r8, {n}",
            "6:",
            "dec r8",
            "jnz 6b",
            "mov ecx, {stop:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            n = in(reg) n,
            stop = in(reg) stop,
            head = out(reg) head,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            out("r8") _,
            options(nostack),
        );
    }
    head
}

/// Start counting, then n times a store (`mov [buf], r9d`), a load (`mov
/// r9d, [buf]`), a load-op-store (`add dword ptr [buf], 1`) and a `dec r8;
/// jnz`, then stop: n instructions of each memory class, 5n + 5
/// instructions. Returns the final value of `*buf` (n + the value stored).
pub fn mem_loop(start: (u32, u64), stop: u32, n: u64) -> u32 {
    let mut buf: u32 = 0;
    // SAFETY: as counted_loop; the loop accesses only `buf`, a live local.
    unsafe {
        asm!(
            "wrmsr",
            "mov r8, {n}",
            "2:",
            "mov dword ptr [{buf}], r9d",
            "mov r9d, dword ptr [{buf}]",
            "add dword ptr [{buf}], 1",
            "dec r8",
            "jnz 2b",
            "mov ecx, {stop:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            n = in(reg) n,
            stop = in(reg) stop,
            buf = in(reg) &mut buf as *mut u32,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            out("r8") _,
            inout("r9") 7u64 => _,
            options(nostack),
        );
    }
    buf
}

/// Start counting, then `rep stosb` of n bytes into `buf` (a string
/// instruction: one instruction retired however many iterations), then
/// stop. Returns how many bytes were stored (n: RCX counted down to 0).
pub fn rep_stos(start: (u32, u64), stop: u32, buf: &mut [u8]) -> usize {
    let left: usize;
    // SAFETY: as counted_loop; the string store writes exactly `buf`
    // (RDI = its start, RCX = its length, DF clear as the ABI keeps it).
    unsafe {
        asm!(
            "wrmsr",
            "mov rcx, {n}",
            "rep stosb",
            "mov r8, rcx",
            "mov ecx, {stop:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            n = in(reg) buf.len(),
            stop = in(reg) stop,
            inout("rdi") buf.as_mut_ptr() => _,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            out("r8") left,
            options(nostack),
        );
    }
    buf.len() - left
}

/// IA32_PERF_CAPABILITIES and its LBR_FMT field.
pub const PERF_CAPABILITIES: u32 = 0x345;
/// See [`PERF_CAPABILITIES`].
pub const LBR_FMT: u64 = 0x3f;
/// IA32_DEBUGCTL, its LBR bit and FREEZE_LBRS_ON_PMI.
pub const DEBUGCTL: u32 = 0x1d9;
/// See [`DEBUGCTL`].
pub const DEBUGCTL_LBR: u64 = 1 << 0;
/// See [`DEBUGCTL`].
pub const FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
/// The LBR stack (Nehalem and later): select, top of stack, sources,
/// targets, information words.
pub const LBR_SELECT: u32 = 0x1c8;
/// See [`LBR_SELECT`].
pub const LBR_TOS: u32 = 0x1c9;
/// See [`LBR_SELECT`].
pub const LBR_FROM: u32 = 0x680;
/// See [`LBR_SELECT`].
pub const LBR_TO: u32 = 0x6c0;
/// See [`LBR_SELECT`].
pub const LBR_INFO: u32 = 0xdc0;

/// IA32_PMC0's full-width alias (with PDCM: 48-bit writes), SDM vol. 3B
/// 20.2.6.
pub const PMC0_FULL: u32 = 0x4c1;
/// PERF_CAPABILITIES.PEBS_FORMAT (bits 11:8), SDM vol. 3B 20.9.
pub const PEBS_FMT: u64 = 0xf << 8;
/// IA32_PEBS_ENABLE: a counter's PEBS bit (GP n: bit n, fixed n: 32 + n),
/// SDM vol. 3B 20.6.2.4.
pub const PEBS_ENABLE: u32 = 0x3f1;
/// PERF_CAPABILITIES.PEBS_BASELINE: adaptive records, PEBS on every
/// counter, MSR_PEBS_DATA_CFG (SDM vol. 3B 20.9).
pub const PEBS_BASELINE: u64 = 1 << 14;
/// IA32_PERFEVTSELx.ADAPTIVE (bit 34): the counter's PEBS records carry
/// MSR_PEBS_DATA_CFG's groups (FIXED_CTR_CTRL's is bit 32 + 4i), SDM vol.
/// 3B 20.9.2.
pub const EVTSEL_ADAPTIVE: u64 = 1 << 34;
/// IA32_PERF_GLOBAL_STATUS bit 62, OvfBuffer: the PEBS buffer reached its
/// interrupt threshold, SDM vol. 3B 20.9.
pub const GLOBAL_STATUS_BUFFER_OVF: u64 = 1 << 62;
/// MSR_PEBS_DATA_CFG: an adaptive record's groups, SDM vol. 3B 20.9.2.
pub const DATA_CFG: u32 = 0x3f2;
/// IA32_DS_AREA: the linear address of the DS save area, SDM vol. 3B 19.6.3.4.
pub const DS_AREA: u32 = 0x600;

/// A 4 KiB page of words.
#[repr(C, align(4096))]
struct Page([u64; 512]);
static mut DS_PAGE: Page = Page([0; 512]);
static mut PEBS_PAGE: Page = Page([0; 512]);

/// The PEBS guests' two pages: the DS save area (SDM vol. 3B 19.6.3.4;
/// its PEBS fields are words 4-7, the reset values from word 8) and the
/// PEBS buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PebsPage {
    /// The DS save area IA32_DS_AREA points at.
    Ds,
    /// The buffer the DS area's PEBS fields describe.
    Buffer,
}

impl PebsPage {
    fn ptr(self) -> *mut u64 {
        match self {
            PebsPage::Ds => (&raw mut DS_PAGE).cast(),
            PebsPage::Buffer => (&raw mut PEBS_PAGE).cast(),
        }
    }

    /// The page's address (identity-mapped: linear and physical).
    pub fn addr(self) -> u64 {
        self.ptr() as u64
    }

    /// Word `i` (< 512), read as the vCPU's PEBS assist left it.
    pub fn word(self, i: usize) -> u64 {
        assert!(i < 512, "word {i} of a 512-word page");
        // SAFETY: i < 512 inside a static page; volatile: the vCPU's PEBS
        // assist writes it behind the compiler's back.
        unsafe { self.ptr().add(i).read_volatile() }
    }

    /// Set word `i` (< 512).
    pub fn set(self, i: usize, value: u64) {
        assert!(i < 512, "word {i} of a 512-word page");
        // SAFETY: i < 512 inside a static page; the guest runs on one vCPU
        // and no interrupt handler touches these pages.
        unsafe { self.ptr().add(i).write_volatile(value) }
    }

    /// Zero the page.
    pub fn clear(self) {
        for i in 0..512 {
            self.set(i, 0);
        }
    }
}

/// PERF_CAPABILITIES, or 0 without PDCM (and so without the MSR).
fn perf_capabilities() -> u64 {
    let pdcm = arch::cpuid(1, 0)[2] & 1 << 15 != 0;
    if pdcm {
        arch::rdmsr(PERF_CAPABILITIES).unwrap_or(0)
    } else {
        0
    }
}

/// The vCPU's PERF_CAPABILITIES.LBR_FMT (0: no LBR, or no PDCM and so no
/// PERF_CAPABILITIES at all).
pub fn lbr_format() -> u64 {
    perf_capabilities() & LBR_FMT
}

/// The vCPU's PERF_CAPABILITIES.PEBS_FORMAT (0: no PEBS, or no PDCM).
pub fn pebs_format() -> u64 {
    (perf_capabilities() & PEBS_FMT) >> 8
}
