//! PV EOI (KVM_FEATURE_PV_EOI): a guest may end an interrupt by clearing a
//! bit in its own memory instead of writing the local APIC's EOI register.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/msr.rst` (MSR_KVM_EOI_EN),
//! `arch/x86/kvm/lapic.c` (`kvm_lapic_set_pv_eoi`,
//! `apic_sync_pv_eoi_to_guest`, `apic_sync_pv_eoi_from_guest`,
//! `pv_eoi_test_and_clr_pending`, `kvm_lapic_reset`), `arch/x86/kvm/x86.c`
//! (`kvm_set_msr_common`). Guest side: `arch/x86/kernel/kvm.c`
//! (`kvm_guest_apic_eoi_write`, `kvm_guest_cpu_init`).
//!
//! KVM's two halves, and where QEMU's TCG local APIC (`hw/intc/apic.c`)
//! has them, always on the vCPU's own thread with the guest not running:
//! - **To the guest**, at an entry after an interrupt event: with PV EOI
//!   on, no interrupt requested (IRR empty), the vector in service the one
//!   acknowledged last with no EOI since (KVM's `highest_isr_cache`) and
//!   edge-triggered (a level-triggered vector's EOI must reach the I/O
//!   APIC: KVM's `kvm_ioapic_handles_vector`; QEMU's APIC broadcasts the
//!   EOI exactly for vectors with their TMR bit set), the host sets the
//!   guest's bit and marks the vCPU pending.
//! - **From the guest**, at every exit: a pending vCPU's bit is read and
//!   cleared. Already clear means the guest ended the interrupt, and the
//!   host does the EOI then.
//!
//! In QEMU's APIC an "exit" is every point where the APIC's in-service
//! state matters: each register access by the guest, each interrupt
//! acknowledgement and each re-evaluation of what to deliver
//! (`apic_update_irq` on the vCPU's own thread, where a request from
//! another thread lands through CPU_INTERRUPT_POLL). An EOI the guest made
//! in memory is so taken before anything could see the vector still in
//! service, as under KVM.

use crate::memory::{Gpa, GuestRam};
use crate::x86::X86Error;

/// MSR_KVM_PV_EOI_EN (msr.rst calls it MSR_KVM_EOI_EN).
pub const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
/// KVM_MSR_ENABLED: bit 0 of the MSR, PV EOI on.
pub const KVM_MSR_ENABLED: u64 = 1;
/// KVM_PV_EOI_ENABLED: bit 0 of the guest's word, "you may skip the EOI
/// write" (`arch/x86/include/uapi/asm/kvm_para.h`).
pub const KVM_PV_EOI_ENABLED: u8 = 1;

/// What the host last did with the guest's bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PvEoiState {
    /// Nothing outstanding (KVM_APIC_PV_EOI_PENDING clear).
    #[default]
    Idle,
    /// The host set the bit; the guest may clear it instead of an EOI.
    Pending,
    /// The guest cleared it, which was seen when the MSR changed under
    /// it: the APIC owes that EOI at its next look.
    EoiOwed,
}

impl PvEoiState {
    /// The state's code in a saved machine (0 idle, 1 pending, 2 EOI owed).
    pub fn code(self) -> u8 {
        match self {
            PvEoiState::Idle => 0,
            PvEoiState::Pending => 1,
            PvEoiState::EoiOwed => 2,
        }
    }

    /// From a saved machine; an unknown code is idle.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => PvEoiState::Pending,
            2 => PvEoiState::EoiOwed,
            _ => PvEoiState::Idle,
        }
    }
}

/// One vCPU's PV EOI: the MSR and the protocol's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PvEoi {
    msr: u64,
    state: PvEoiState,
    /// The vector acknowledged last with no EOI since, and whether it is
    /// level-triggered (KVM's `highest_isr_cache`; None after any EOI,
    /// reset or load).
    last_ack: Option<(u8, bool)>,
    /// EOIs the guest made in memory (introspection and `stats=on`).
    taken: u64,
}

impl PvEoi {
    /// RDMSR.
    pub fn msr(&self) -> u64 {
        self.msr
    }

    /// The protocol's state (saved with the vCPU).
    pub fn state(&self) -> PvEoiState {
        self.state
    }

    /// EOIs the guest made by clearing its bit, since the vCPU was made.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// The guest's word, where PV EOI is on.
    fn word(&self) -> Option<Gpa> {
        (self.msr & KVM_MSR_ENABLED != 0).then_some(Gpa(self.msr & !KVM_MSR_ENABLED))
    }

    /// WRMSR (`kvm_lapic_set_pv_eoi`): the address must be 4-byte aligned
    /// (bit 1 is reserved) and, to enable, guest RAM; else #GP with the
    /// MSR unchanged. A write while the host's bit is outstanding first
    /// settles it, as KVM's exit before the WRMSR does.
    pub fn write_msr(&mut self, ram: GuestRam<'_>, value: u64) -> Result<(), X86Error> {
        let addr = value & !KVM_MSR_ENABLED;
        let refused = Err(X86Error::ReservedBits {
            msr: MSR_KVM_PV_EOI_EN,
            value,
        });
        if addr & 3 != 0 {
            return refused;
        }
        if value & KVM_MSR_ENABLED != 0 && !ram.is_ram(Gpa(addr), 1) {
            return refused;
        }
        if self.state == PvEoiState::Pending && self.take_from_guest(ram) {
            self.state = PvEoiState::EoiOwed;
        }
        self.msr = value;
        Ok(())
    }

    /// The vCPU acknowledged `vector` (IRR to ISR); `level`: its TMR bit.
    pub fn acked(&mut self, vector: u8, level: bool) {
        self.last_ack = Some((vector, level));
    }

    /// The APIC did an EOI (a register write, or one the guest made in
    /// memory).
    pub fn eoied(&mut self) {
        self.last_ack = None;
    }

    /// Read and clear the guest's bit (`pv_eoi_test_and_clr_pending`); true
    /// if the guest had cleared it: it ended the interrupt.
    fn take_from_guest(&mut self, ram: GuestRam<'_>) -> bool {
        self.state = PvEoiState::Idle;
        let Some(word) = self.word() else {
            return false;
        };
        // The guest is not running on this vCPU; its own clear is a locked
        // test-and-clear of the same byte, so one exchange is exact.
        match ram.xchg_u8(word, 0) {
            Some(old) => old & KVM_PV_EOI_ENABLED == 0,
            // The word is no longer RAM: KVM's read fails and does no EOI.
            None => false,
        }
    }

    /// The APIC looks at its state (an "exit"): settle the guest's bit
    /// and, after an interrupt event (`event`: KVM's entry with
    /// KVM_REQ_EVENT, where it calls `kvm_lapic_sync_to_vapic`), re-arm it
    /// where KVM would. Returns true when the APIC must do an EOI now (of
    /// its highest in-service vector) because the guest made one in
    /// memory. `irr_pending`: any IRR bit set.
    pub fn sync(&mut self, ram: GuestRam<'_>, irr_pending: bool, event: bool) -> bool {
        let eoi = match self.state {
            PvEoiState::Idle => false,
            PvEoiState::EoiOwed => {
                self.state = PvEoiState::Idle;
                true
            }
            PvEoiState::Pending => self.take_from_guest(ram),
        };
        if eoi {
            self.taken += 1;
            self.last_ack = None;
        }
        // apic_sync_pv_eoi_to_guest.
        if let (true, Some(word), false, Some((_, false))) =
            (event, self.word(), irr_pending, self.last_ack)
        {
            if ram.xchg_u8(word, KVM_PV_EOI_ENABLED).is_some() {
                self.state = PvEoiState::Pending;
            }
        }
        eoi
    }

    /// A reset, INIT or RESET alike (`kvm_lapic_reset` clears the MSR and
    /// the pending bit either way).
    pub fn reset(&mut self) {
        let taken = self.taken;
        *self = PvEoi {
            taken,
            ..PvEoi::default()
        };
    }

    /// The state of a saved machine: an MSR KVM would refuse turns PV EOI
    /// off. Nothing counts as acknowledged (KVM's `kvm_apic_set_state`).
    pub fn load(&mut self, ram: GuestRam<'_>, msr: u64, state: PvEoiState) {
        let taken = self.taken;
        *self = PvEoi {
            taken,
            ..PvEoi::default()
        };
        if self.write_msr(ram, msr).is_ok() && self.msr & KVM_MSR_ENABLED != 0 {
            self.state = state;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tests::FakeRam;

    const WORD: u64 = 0x1000;

    fn on(ram: &FakeRam) -> PvEoi {
        let mut p = PvEoi::default();
        p.write_msr(GuestRam::new(ram), WORD | 1).expect("enable");
        p
    }

    fn bit(ram: &FakeRam) -> u8 {
        GuestRam::new(ram).read_array::<1>(Gpa(WORD)).expect("ram")[0]
    }

    fn set_bit(ram: &FakeRam, v: u8) {
        assert!(GuestRam::new(ram).write(Gpa(WORD), &[v]));
    }

    #[test]
    fn msr_rules_are_kvms() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = PvEoi::default();
        assert_eq!(p.msr(), 0);
        // Bit 1 (reserved) and any address not 4-byte aligned: #GP.
        for v in [2u64, 3, WORD | 3, WORD + 2, WORD + 6, WORD + 7] {
            assert!(p.write_msr(g, v).is_err(), "{v:#x}");
        }
        // Enabling needs RAM; disabling does not look.
        assert!(p.write_msr(g, 0x10_0000 | 1).is_err(), "not RAM");
        assert!(p.write_msr(g, !3u64).is_ok(), "off: any aligned address");
        assert_eq!(p.msr(), !3u64);
        assert!(p.write_msr(g, WORD | 1).is_ok());
        assert_eq!(p.msr(), WORD | 1);
        assert!(p.write_msr(g, 6).is_err());
        assert_eq!(p.msr(), WORD | 1, "a refused write keeps the value");
    }

    #[test]
    fn an_edge_interrupt_alone_gets_the_bit_and_the_guests_clear_is_its_eoi() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = on(&ram);
        p.acked(0x40, false);
        assert!(!p.sync(g, false, true), "nothing to EOI yet");
        assert_eq!(bit(&ram), 1, "armed");
        assert_eq!(p.state(), PvEoiState::Pending);
        // Another look while the guest has not ended it: cleared and set
        // again (an exit and an event entry), no EOI.
        assert!(!p.sync(g, false, true));
        assert_eq!(bit(&ram), 1);
        // The guest ends it in memory.
        set_bit(&ram, 0);
        assert!(p.sync(g, false, true), "the guest's EOI, once");
        assert_eq!((p.taken(), bit(&ram), p.state()), (1, 0, PvEoiState::Idle));
        assert!(!p.sync(g, false, true), "and not twice");
        assert_eq!(bit(&ram), 0, "not re-armed after the EOI");
    }

    #[test]
    fn a_register_access_settles_without_re_arming() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = on(&ram);
        p.acked(0x40, false);
        p.sync(g, false, true);
        assert_eq!(bit(&ram), 1);
        // An exit with no event (a register read): KVM clears the bit and
        // enters without arming it again; the guest then writes its EOI.
        assert!(!p.sync(g, false, false));
        assert_eq!((bit(&ram), p.state()), (0, PvEoiState::Idle));
        // A later event re-arms it while the vector is still the last one.
        assert!(!p.sync(g, false, true));
        assert_eq!(bit(&ram), 1);
        // Settled without an event after the guest's clear: still its EOI.
        set_bit(&ram, 0);
        assert!(p.sync(g, false, false));
    }

    #[test]
    fn no_bit_with_irr_pending_for_level_vectors_or_after_an_eoi() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = on(&ram);
        p.acked(0x40, false);
        assert!(!p.sync(g, true, true), "IRR pending: could nest");
        assert_eq!((bit(&ram), p.state()), (0, PvEoiState::Idle));
        p.acked(0x41, true);
        assert!(
            !p.sync(g, false, true),
            "level-triggered: the I/O APIC needs the EOI"
        );
        assert_eq!(bit(&ram), 0);
        p.acked(0x42, false);
        p.eoied();
        assert!(
            !p.sync(g, false, true),
            "the guest wrote EOI: nothing in the cache"
        );
        assert_eq!(bit(&ram), 0);
        // Armed, then an interrupt arrives: the look disarms it (the guest
        // must write EOI), and the guest's later EOI write is the only one.
        p.acked(0x43, false);
        p.sync(g, false, true);
        assert_eq!(bit(&ram), 1);
        assert!(!p.sync(g, true, true));
        assert_eq!((bit(&ram), p.state()), (0, PvEoiState::Idle));
        p.eoied();
        assert!(!p.sync(g, false, true));
        assert_eq!(p.taken(), 0);
    }

    #[test]
    fn nested_interrupts_end_one_at_a_time() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = on(&ram);
        p.acked(0x40, false);
        p.sync(g, false, true);
        assert_eq!(bit(&ram), 1, "outer armed");
        // A higher vector nests: its request disarms the outer's bit ...
        assert!(!p.sync(g, true, true));
        assert_eq!(bit(&ram), 0);
        // ... and its acknowledgement arms the bit for the inner one.
        p.acked(0x80, false);
        p.sync(g, false, true);
        assert_eq!(bit(&ram), 1);
        set_bit(&ram, 0);
        assert!(p.sync(g, false, true), "the inner one's EOI");
        // The outer one is no longer the last acknowledged: its EOI is a
        // register write (KVM's cache is invalid after an EOI).
        assert_eq!(bit(&ram), 0);
        assert!(!p.sync(g, false, true));
        assert_eq!(p.taken(), 1);
    }

    #[test]
    fn changing_the_msr_settles_an_outstanding_bit() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = on(&ram);
        p.acked(0x40, false);
        p.sync(g, false, true);
        set_bit(&ram, 0);
        // Linux's reboot path: the EOI in memory, then PV EOI off.
        p.write_msr(g, 0).expect("off");
        assert_eq!(p.state(), PvEoiState::EoiOwed);
        assert!(p.sync(g, false, true), "the owed EOI is not lost");
        assert!(!p.sync(g, false, true));
        // Not yet ended: turning it off clears the bit, and the guest
        // writes EOI itself.
        let mut p = on(&ram);
        p.acked(0x40, false);
        p.sync(g, false, true);
        assert_eq!(bit(&ram), 1);
        p.write_msr(g, 0).expect("off");
        assert_eq!((bit(&ram), p.state()), (0, PvEoiState::Idle));
        assert!(!p.sync(g, false, true));
    }

    #[test]
    fn off_or_reset_it_writes_nothing() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = PvEoi::default();
        set_bit(&ram, 0xfe);
        p.acked(0x40, false);
        assert!(!p.sync(g, false, true));
        assert_eq!(bit(&ram), 0xfe, "off: the word is not touched");
        let mut p = on(&ram);
        p.acked(0x40, false);
        p.sync(g, false, true);
        p.reset();
        assert_eq!((p.msr(), p.state()), (0, PvEoiState::Idle));
        set_bit(&ram, 0);
        assert!(!p.sync(g, false, true), "after a reset nothing is owed");
    }

    #[test]
    fn a_saved_pending_bit_is_settled_after_the_load() {
        let ram = FakeRam::new(0x10000);
        let g = GuestRam::new(&ram);
        let mut p = PvEoi::default();
        set_bit(&ram, 0);
        p.load(g, WORD | 1, PvEoiState::Pending);
        assert!(p.sync(g, false, true), "the guest ended it before the move");
        let mut p = PvEoi::default();
        p.load(g, WORD | 3, PvEoiState::Pending);
        assert_eq!((p.msr(), p.state()), (0, PvEoiState::Idle), "refused MSR");
        for s in [PvEoiState::Idle, PvEoiState::Pending, PvEoiState::EoiOwed] {
            assert_eq!(PvEoiState::from_code(s.code()), s);
        }
        assert_eq!(PvEoiState::from_code(7), PvEoiState::Idle);
    }
}
