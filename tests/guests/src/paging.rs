//! Pages that fault on purpose: a window of not-present pages a guest's own
//! fault handler maps, and (x86) pointing IDT gates at a guest's own
//! handlers. Used by the guests that check what the PMU counts when blocks
//! take faults (pmu-oracle, x86-pmu-unwind, arm-pmu-unwind).

/// 512 page-table entries, page-aligned: a table a guest owns.
#[repr(C, align(4096))]
pub struct Table(pub [u64; 512]);

impl Table {
    /// A table with no valid entry.
    pub const fn empty() -> Self {
        Table([0; 512])
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::asm;

    use super::Table;

    /// Present and writable (x86 PTE/PDE bits 0 and 1).
    const PRESENT_RW: u64 = 3;

    /// Map 1 GiB of not-present pages at `pdpt_index` GiB: the boot page
    /// tables' PDPT entry `pdpt_index` (one the boot code leaves empty) gets
    /// `pd`, whose first entry gets `pt`, whose entries are all cleared. A
    /// fault handler makes a page present by writing its PTE in `pt`.
    ///
    /// # Safety
    /// `pd` and `pt` live as long as the mapping is used; `pdpt_index` is not
    /// used by anything else; the boot tables are identity-mapped (their
    /// addresses are physical), as the runtime's are.
    pub unsafe fn add_fault_window(pdpt_index: usize, pd: *mut Table, pt: *mut Table) {
        // SAFETY: per the contract above.
        unsafe {
            let cr3: u64;
            asm!("mov {}, cr3", out(reg) cr3, options(nomem, nostack));
            let pml4 = (cr3 & !0xfff) as *const u64;
            let pdpt = (pml4.read_volatile() & 0x000f_ffff_ffff_f000) as *mut u64;
            for e in (*pt).0.iter_mut() {
                *e = 0;
            }
            (*pd).0[0] = pt as u64 | PRESENT_RW;
            pdpt.add(pdpt_index).write_volatile(pd as u64 | PRESENT_RW);
            asm!("mov cr3, {}", in(reg) cr3, options(nostack));
        }
    }

    /// The address of IDT gate `vector` (the runtime's IDT, 256 gates).
    fn gate(vector: u8) -> *mut u64 {
        let mut idtr = [0u8; 10];
        // SAFETY: SIDT stores 10 bytes into our buffer.
        unsafe { asm!("sidt [{}]", in(reg) idtr.as_mut_ptr(), options(nostack)) };
        let base = u64::from_le_bytes(idtr[2..10].try_into().unwrap_or([0; 8]));
        (base as *mut u64).wrapping_add(2 * usize::from(vector))
    }

    /// Point IDT gate `vector` at `handler` (a 64-bit interrupt gate, kernel
    /// code segment); returns the old gate for [`restore_gate`].
    ///
    /// # Safety
    /// `handler` is the address of code that handles that vector (and
    /// returns with IRETQ, popping an error code where the vector has one).
    pub unsafe fn set_gate(vector: u8, handler: u64) -> [u64; 2] {
        let g = gate(vector);
        // SAFETY: the runtime's IDT has 256 gates; only this CPU uses it
        // while the gate is the caller's.
        unsafe {
            let old = [g.read_volatile(), g.add(1).read_volatile()];
            let low = (handler & 0xffff)
                | (0x08 << 16)
                | (0x8e00 << 32)
                | ((handler >> 16) & 0xffff) << 48;
            g.write_volatile(low);
            g.add(1).write_volatile(handler >> 32);
            old
        }
    }

    /// Put back a gate [`set_gate`] replaced.
    pub fn restore_gate(vector: u8, old: [u64; 2]) {
        let g = gate(vector);
        // SAFETY: as set_gate; `old` was that gate.
        unsafe {
            g.write_volatile(old[0]);
            g.add(1).write_volatile(old[1]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{add_fault_window, restore_gate, set_gate};

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::Table;
    use crate::{read_sysreg, write_sysreg};

    /// Where [`mmu_on`]'s window of invalid pages starts (2 GiB: not RAM).
    pub const FAULT_WINDOW: u64 = 0x8000_0000;

    /// Turn the MMU on: 0-1 GiB device memory (the board's MMIO), 1-2 GiB
    /// normal memory (RAM from 0x4000_0000), identity-mapped with 1 GiB
    /// blocks; from [`FAULT_WINDOW`] on through `l3`, every entry cleared:
    /// a fault handler makes page i valid by writing `l3[i]`.
    ///
    /// # Safety
    /// The tables live as long as the MMU is on; everything the guest
    /// touches is below 2 GiB (so the identity map holds).
    pub unsafe fn mmu_on(l1: *mut Table, l2: *mut Table, l3: *mut Table) {
        /// Block/table descriptor bits: valid, table, access flag, inner
        /// shareable, attribute index 1, execute-never (EL1 and EL0).
        const BLOCK: u64 = 0b01;
        const TABLE: u64 = 0b11;
        const AF: u64 = 1 << 10;
        const ISH: u64 = 3 << 8;
        const NORMAL: u64 = 1 << 2;
        const XN: u64 = 3 << 53;
        // SAFETY: the caller's tables; the translation registers describe
        // them before SCTLR_EL1.M turns translation on.
        unsafe {
            (*l1).0[0] = BLOCK | AF | XN;
            (*l1).0[1] = 0x4000_0000 | BLOCK | AF | ISH | NORMAL;
            (*l1).0[2] = l2 as u64 | TABLE;
            (*l2).0[0] = l3 as u64 | TABLE;
            for e in (*l3).0.iter_mut() {
                *e = 0;
            }
        }
        // MAIR: attribute 0 Device-nGnRnE, 1 Normal write-back.
        write_sysreg!("mair_el1", 0xff << 8);
        // TCR: T0SZ 25 (39-bit VAs, walks from level 1), write-back
        // inner/outer, inner shareable, 4 KiB granule, no TTBR1 walks,
        // 40-bit PAs.
        write_sysreg!(
            "tcr_el1",
            25 | 1 << 8 | 1 << 10 | 3 << 12 | 1 << 23 | 2 << 32
        );
        write_sysreg!("ttbr0_el1", l1 as u64);
        // SAFETY: barrier and TLB invalidation only.
        unsafe { core::arch::asm!("dsb ish", "tlbi vmalle1", "dsb ish", "isb") };
        // SCTLR_EL1: M, C, I.
        write_sysreg!(
            "sctlr_el1",
            read_sysreg!("sctlr_el1") | 1 | 1 << 2 | 1 << 12
        );
    }
}

#[cfg(target_arch = "aarch64")]
pub use arm::{mmu_on, FAULT_WINDOW};
