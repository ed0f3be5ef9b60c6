//! The arm64 virt board's interrupt controller, polled (the guests run with
//! PSTATE.I masked and acknowledge at the CPU interface): GICv2 (the
//! default; distributor 0x0800_0000, CPU interface 0x0801_0000, Arm IHI
//! 0048B) and GICv3 (`-M virt,gic-version=3`; the redistributors from
//! 0x080A_0000, each CPU its own, system-register CPU interface, Arm IHI
//! 0069).

/// The interrupt ID an acknowledge reads when nothing is pending.
pub const SPURIOUS: u32 = 1023;

const GICD: usize = 0x0800_0000;
/// GICD_CTLR: v2 bit 0 enables forwarding; v3 bit 1 EnableGrp1, bit 4 ARE.
const GICD_CTLR: usize = 0x000;
/// GICD_ISENABLER0 / GICD_ICENABLER0 (v2: banked PPIs).
const GICD_ISENABLER0: usize = 0x100;
const GICD_ICENABLER0: usize = 0x180;
/// GICD_IPRIORITYR (v2: banked for PPIs), one byte per interrupt.
const GICD_IPRIORITYR: usize = 0x400;

const GICC: usize = 0x0801_0000;
/// GICC_CTLR: bit 0 enables signalling.
const GICC_CTLR: usize = 0x000;
/// GICC_PMR: priority mask.
const GICC_PMR: usize = 0x004;
/// GICC_IAR: acknowledge.
const GICC_IAR: usize = 0x00c;
/// GICC_EOIR: end of interrupt.
const GICC_EOIR: usize = 0x010;

/// The redistributor region: CPU 0's RD_base first, each CPU's 128 KiB
/// (RD_base, then its SGI/PPI frame at +64 KiB).
const GICR: usize = 0x080a_0000;
/// One redistributor's two frames.
const GICR_STRIDE: usize = 0x2_0000;
/// Its SGI/PPI frame, after RD_base.
const GICR_SGI_FRAME: usize = 0x1_0000;
/// GICR_TYPER (64-bit, read as two words): Affinity in bits 63:32, Last
/// (the region's last redistributor) bit 4.
const GICR_TYPER: usize = 0x0008;
/// GICR_WAKER: bit 1 ProcessorSleep.
const GICR_WAKER: usize = 0x0014;
/// GICR_IGROUPR0, GICR_ISENABLER0, GICR_ICENABLER0, GICR_ISPENDR0,
/// GICR_IPRIORITYR (SGI/PPI frame).
const GICR_IGROUPR0: usize = 0x080;
const GICR_ISENABLER0: usize = 0x100;
const GICR_ICENABLER0: usize = 0x180;
const GICR_ISPENDR0: usize = 0x200;
const GICR_IPRIORITYR: usize = 0x400;
/// GICD_ISPENDR0 (v2: banked for SGIs and PPIs).
const GICD_ISPENDR0: usize = 0x200;

fn w(addr: usize, v: u32) {
    // SAFETY: GIC MMIO on the virt board, identity-mapped (MMU off).
    unsafe { crate::arch::mmio::write32(addr, v) }
}

fn r(addr: usize) -> u32 {
    // SAFETY: as above.
    unsafe { crate::arch::mmio::read32(addr) }
}

fn w8(addr: usize, v: u8) {
    // SAFETY: as above (the priority registers are byte-accessible).
    unsafe { crate::arch::mmio::write8(addr, v) }
}

/// GICv2.
pub mod v2 {
    pub use super::SPURIOUS;
    use super::*;

    /// Enable the distributor, this CPU's interface (priority mask `pmr`)
    /// and PPI `id` at `priority`.
    pub fn enable_at(id: u32, priority: u8, pmr: u8) {
        w(GICD + GICD_CTLR, 1);
        w(GICC + GICC_PMR, u32::from(pmr));
        w(GICC + GICC_CTLR, 1);
        w8(GICD + GICD_IPRIORITYR + id as usize, priority);
        w(GICD + GICD_ISENABLER0, 1 << id);
    }

    /// Enable PPI `id`, nothing masked.
    pub fn enable(id: u32) {
        enable_at(id, 0xa0, 0xff);
    }

    /// Disable PPI `id`.
    pub fn disable(id: u32) {
        w(GICD + GICD_ICENABLER0, 1 << id);
    }

    /// Whether PPI `id` is pending for this CPU (banked GICD_ISPENDR0).
    pub fn pending(id: u32) -> bool {
        r(GICD + GICD_ISPENDR0) & (1 << id) != 0
    }

    /// Acknowledge the highest-priority pending interrupt (ID or SPURIOUS).
    pub fn ack() -> u32 {
        r(GICC + GICC_IAR) & 0x3ff
    }

    /// End interrupt `id`.
    pub fn eoi(id: u32) {
        w(GICC + GICC_EOIR, id);
    }
}

/// GICv3 (`-M virt,gic-version=3`).
pub mod v3 {
    pub use super::SPURIOUS;
    use super::*;
    use crate::{read_sysreg, write_sysreg};

    /// This CPU's redistributor (RD_base): the one whose GICR_TYPER
    /// affinity is this CPU's MPIDR_EL1 affinity, found once per CPU (by
    /// Aff0) walking the region to its Last; CPU 0's if none matches.
    fn rd() -> usize {
        use core::sync::atomic::{AtomicUsize, Ordering};
        /// Each CPU's RD_base by Aff0 (0: not looked up yet).
        static FOUND: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];
        let mpidr = read_sysreg!("mpidr_el1");
        let slot = &FOUND[(mpidr & 7) as usize];
        let known = slot.load(Ordering::Relaxed);
        if known != 0 {
            return known;
        }
        let aff = (((mpidr >> 32) & 0xff) << 24 | (mpidr & 0xff_ffff)) as u32;
        let mut rd = GICR;
        let found = loop {
            if r(rd + GICR_TYPER + 4) == aff {
                break rd;
            }
            if r(rd + GICR_TYPER) & (1 << 4) != 0 {
                break GICR;
            }
            rd += GICR_STRIDE;
        };
        slot.store(found, Ordering::Relaxed);
        found
    }

    /// This CPU's SGI/PPI frame.
    fn sgi() -> usize {
        rd() + GICR_SGI_FRAME
    }

    /// Enable affinity routing and Group 1, wake this CPU's redistributor,
    /// enable the system-register interface with priority mask `pmr`.
    pub fn init(pmr: u8) {
        w(GICD + GICD_CTLR, (1 << 4) | (1 << 1));
        let rd = rd();
        w(rd + GICR_WAKER, r(rd + GICR_WAKER) & !(1 << 1));
        while r(rd + GICR_WAKER) & (1 << 2) != 0 {}
        w(sgi() + GICR_IGROUPR0, u32::MAX);
        write_sysreg!("S3_0_C12_C12_5", 1u64 | read_sysreg!("S3_0_C12_C12_5")); // ICC_SRE_EL1.SRE
        write_sysreg!("S3_0_C4_C6_0", u64::from(pmr)); // ICC_PMR_EL1
        write_sysreg!("S3_0_C12_C12_7", 1u64); // ICC_IGRPEN1_EL1
    }

    /// Enable PPI `id` at `priority` (lower is more urgent).
    pub fn enable_at(id: u32, priority: u8) {
        w8(sgi() + GICR_IPRIORITYR + id as usize, priority);
        w(sgi() + GICR_ISENABLER0, 1 << id);
    }

    /// Disable PPI `id`.
    pub fn disable(id: u32) {
        w(sgi() + GICR_ICENABLER0, 1 << id);
    }

    /// Whether PPI `id` is pending for this CPU (its GICR_ISPENDR0).
    pub fn pending(id: u32) -> bool {
        r(sgi() + GICR_ISPENDR0) & (1 << id) != 0
    }

    /// Acknowledge (ICC_IAR1_EL1): the ID, or SPURIOUS.
    pub fn ack() -> u32 {
        (read_sysreg!("S3_0_C12_C12_0") & 0xff_ffff) as u32
    }

    /// End interrupt `id` (ICC_EOIR1_EL1).
    pub fn eoi(id: u32) {
        write_sysreg!("S3_0_C12_C12_1", u64::from(id));
    }
}

/// The GIC the guest finds: GICv3 where ID_AA64PFR0_EL1.GIC says its
/// system-register CPU interface exists and the distributor's
/// GICD_PIDR2.ArchRev says 3 (`-M virt,gic-version=3`, and KVM on a GICv3
/// host without GICv2 compatibility, which gives a guest a GICv3 whatever
/// the machine asked: measured nested, PIDR2 0x3b, the GICv2 CPU interface
/// reading 0), GICv2 otherwise. The API of [`v2`].
pub mod any {
    pub use super::SPURIOUS;
    use super::{v2, v3};
    /// GICD_PIDR2: ArchRev in bits 7:4 (Arm IHI 0069 12.9.27); GICv2's
    /// is within its 4 KiB distributor (Arm IHI 0048B, the ID registers),
    /// where GICv3's frame reads 0.
    const GICD_PIDR2: usize = 0xffe8;
    const GICV2_PIDR2: usize = 0xfe8;

    /// Whether the GICv3 system-register interface is there.
    pub fn is_v3() -> bool {
        let rev = |pidr2: usize| (super::r(super::GICD + pidr2) >> 4) & 0xf;
        (crate::read_sysreg!("id_aa64pfr0_el1") >> 24) & 0xf != 0
            && rev(GICV2_PIDR2) != 2
            && rev(GICD_PIDR2) >= 3
    }

    /// Enable PPI `id`, nothing masked (GICv3: the distributor, this CPU's
    /// redistributor and interface first).
    pub fn enable(id: u32) {
        if is_v3() {
            v3::init(0xff);
            v3::enable_at(id, 0xa0);
        } else {
            v2::enable(id);
        }
    }

    /// Disable PPI `id`.
    pub fn disable(id: u32) {
        if is_v3() {
            v3::disable(id)
        } else {
            v2::disable(id)
        }
    }

    /// Acknowledge the highest-priority pending interrupt (ID or SPURIOUS).
    pub fn ack() -> u32 {
        if is_v3() {
            v3::ack()
        } else {
            v2::ack()
        }
    }

    /// Whether PPI `id` is pending for this CPU.
    pub fn pending(id: u32) -> bool {
        if is_v3() {
            v3::pending(id)
        } else {
            v2::pending(id)
        }
    }

    /// End interrupt `id`.
    pub fn eoi(id: u32) {
        if is_v3() {
            v3::eoi(id)
        } else {
            v2::eoi(id)
        }
    }
}
