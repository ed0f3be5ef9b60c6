//! Paravirtualised stolen time (Arm DEN0057A), as KVM implements it.
//!
//! Spec: Linux `Documentation/virt/kvm/arm/pvtime.rst`,
//! `arch/arm64/kvm/pvtime.c` (`kvm_init_stolen_time`,
//! `kvm_update_stolen_time`, `kvm_hypercall_pv_features`),
//! `arch/arm64/include/asm/pvclock-abi.h`. The machine (QEMU's virt board)
//! gives each vCPU a 64-byte structure in its VIRT_PVTIME region, as QEMU
//! does for KVM with `KVM_ARM_VCPU_PVTIME_IPA`; the guest learns the address
//! from PV_TIME_ST. Steal is accounted as for x86 ([`crate::steal`]).
//!
//! Difference from KVM, on purpose: KVM updates the structure on every vCPU
//! load once the machine set its address, even if the guest never asked;
//! rustkvm starts at the guest's first PV_TIME_ST (which zeroes it in both),
//! so a guest that does not use PV time costs nothing.

use crate::memory::{Gpa, GuestMemory, GuestRam};
use crate::steal::{StealClock, Threading};

/// `struct pvclock_vcpu_stolen_time` field offsets (64 bytes in all).
pub mod layout {
    use core::mem::{offset_of, size_of};
    /// `struct pvclock_vcpu_stolen_time` (Documentation/virt/kvm/arm/pvtime.rst,
    /// include/linux/arm-smccc.h's users; little-endian), 64 bytes.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct PvclockVcpuStolenTime {
        /// 0.
        pub revision: u32,
        /// 0.
        pub attributes: u32,
        /// Nanoseconds stolen.
        pub stolen_time: u64,
        /// Padding to 64 bytes.
        pub padding: [u8; 48],
    }
    type T = PvclockVcpuStolenTime;
    /// `revision`.
    pub const REVISION: u64 = offset_of!(T, revision) as u64;
    /// `attributes`.
    pub const ATTRIBUTES: u64 = offset_of!(T, attributes) as u64;
    /// `stolen_time`.
    pub const STOLEN_TIME: u64 = offset_of!(T, stolen_time) as u64;
    /// The structure's size and alignment (pvtime.rst: 64 bytes).
    pub const SIZE: u64 = size_of::<T>() as u64;
    const _: () = assert!(REVISION == 0 && ATTRIBUTES == 4 && STOLEN_TIME == 8 && SIZE == 64);
}

/// Why the machine's structure address is refused (as `kvm_arm_pvtime_set_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PvTimeError {
    /// Not 64-byte aligned (KVM: -EINVAL).
    #[error("PV time structure address {0:#x} is not 64-byte aligned")]
    Misaligned(u64),
    /// Already set (KVM: -EEXIST).
    #[error("PV time structure address already set")]
    AlreadySet,
}

/// Stolen-time state of one vCPU (plain data).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PvTime {
    /// IPA of this vCPU's structure, set by the machine; 0 = none (the
    /// board never places it at 0: KVM's INVALID_GPA).
    pub base: u64,
    /// The guest called PV_TIME_ST since the last reset: keep it updated.
    pub active: u8,
    /// What was stolen and not yet written.
    pub clock: StealClock,
}

impl PvTime {
    /// The machine gives the vCPU its structure (`KVM_ARM_VCPU_PVTIME_IPA`).
    pub fn set_base(&mut self, ipa: u64) -> Result<(), PvTimeError> {
        if ipa % layout::SIZE != 0 {
            return Err(PvTimeError::Misaligned(ipa));
        }
        if self.base != 0 {
            return Err(PvTimeError::AlreadySet);
        }
        self.base = ipa;
        Ok(())
    }

    /// Whether the vCPU has a structure (PV time offered).
    pub fn available(&self) -> bool {
        self.base != 0
    }

    /// PV_TIME_ST: zero the structure, start counting now, and return its
    /// IPA; None (NOT_SUPPORTED) without one.
    pub fn init(&mut self, mem: &dyn GuestMemory) -> Option<u64> {
        if !self.available() {
            return None;
        }
        // KVM ignores a failed write here too (kvm_write_guest's result).
        let _ = GuestRam::new(mem).write(Gpa(self.base), &[0u8; layout::SIZE as usize]);
        self.clock.restart();
        self.active = 1;
        Some(self.base)
    }

    /// Forget the guest's use (vCPU reset): the machine's address stays.
    pub fn reset(&mut self) {
        self.active = 0;
        self.clock.restart();
    }

    /// Add what was stolen and not yet written to `stolen_time`.
    fn fold(&mut self, mem: &dyn GuestMemory) {
        let steal = self.clock.take();
        if steal == 0 {
            return;
        }
        let (ram, at) = (GuestRam::new(mem), Gpa(self.base) + layout::STOLEN_TIME);
        if let Some(old) = ram.read_array::<8>(at) {
            // One single-copy-atomic 8-byte store: there is no version, the
            // guest reads it with one load (READ_ONCE in pvclock_steal_time),
            // as KVM's `kvm_update_stolen_time` updates it.
            let new = u64::from_le_bytes(old).wrapping_add(steal);
            let _ = ram.store_u64(at, new);
        }
    }
}

impl crate::steal::StealArea for PvTime {
    fn on(&self) -> bool {
        self.active != 0
    }

    fn clock(&self) -> &StealClock {
        &self.clock
    }

    fn clock_mut(&mut self) -> &mut StealClock {
        &mut self.clock
    }

    /// The vCPU enters guest execution: add what was stolen since the last
    /// entry to `stolen_time`, as `kvm_update_stolen_time`.
    fn enter(
        &mut self,
        mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
    ) {
        if self.active == 0 {
            return;
        }
        self.clock.enter(threading, now_ns, run_delay_ns);
        self.fold(mem);
    }

    /// The vCPU leaves guest execution; `halted` if voluntarily.
    fn exit(
        &mut self,
        _mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
        halted: bool,
    ) {
        if self.active != 0 {
            self.clock.exit(threading, now_ns, run_delay_ns, halted);
        }
    }

    /// MTTCG sampler tick (`crate::vm::Vm::start_sampler`): the vCPU
    /// thread's run delay is now `run_delay_ns`. Folds the growth in without
    /// waiting for the next entry, as KVM updates the structure whenever the
    /// vCPU thread is scheduled back in (`kvm_arch_vcpu_load`). No preempted
    /// flag: `descheduled` is never asked for.
    fn sample(
        &mut self,
        mem: &dyn GuestMemory,
        run_delay_ns: Option<u64>,
        _descheduled: bool,
    ) -> bool {
        if self.active != 0 && run_delay_ns.is_some_and(|rd| self.clock.sample(rd)) {
            self.fold(mem);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    // The tests lay out guest RAM as a guest would, without GuestRam.
    #![allow(clippy::disallowed_methods)]
    use super::*;
    use crate::memory::tests::FakeRam;
    use crate::memory::NoMemory;
    use crate::steal::StealArea;

    const BASE: u64 = 0x1040;

    fn stolen(ram: &FakeRam) -> u64 {
        let mut b = [0u8; 8];
        assert!(ram.read(BASE + layout::STOLEN_TIME, &mut b));
        u64::from_le_bytes(b)
    }

    #[test]
    fn base_must_be_aligned_and_set_once() {
        let mut p = PvTime::default();
        assert_eq!(p.set_base(0x1020), Err(PvTimeError::Misaligned(0x1020)));
        assert!(!p.available());
        assert_eq!(p.set_base(BASE), Ok(()));
        assert_eq!(p.set_base(BASE + 64), Err(PvTimeError::AlreadySet));
        assert_eq!(p.base, BASE);
    }

    #[test]
    fn st_zeroes_the_structure_and_counts_from_then() {
        let ram = FakeRam::new(0x4000);
        assert!(ram.write(BASE, &[0xaa; 64]));
        let mut p = PvTime::default();
        assert_eq!(p.init(&ram), None, "no structure: NOT_SUPPORTED");
        p.set_base(BASE).unwrap();
        let mm = Threading::Mttcg;
        p.enter(&ram, mm, 1, 100);
        assert_eq!(ram.write_count(), 1, "inactive until PV_TIME_ST");
        assert_eq!(p.init(&ram), Some(BASE));
        let mut all = [0xffu8; 64];
        assert!(ram.read(BASE, &mut all));
        assert_eq!(all, [0; 64], "revision, attributes and stolen_time 0");
        p.enter(&ram, mm, 2, 1_000);
        assert_eq!(stolen(&ram), 0, "first entry only synchronises");
        p.enter(&ram, mm, 3, 1_700);
        p.enter(&ram, mm, 4, 2_000);
        assert_eq!(stolen(&ram), 1_000);
        assert_eq!(ram.writes_outside(BASE, layout::SIZE), 0);
    }

    #[test]
    fn the_mttcg_sampler_folds_run_delay_in_between_entries() {
        let ram = FakeRam::new(0x4000);
        let mut p = PvTime::default();
        p.set_base(BASE).unwrap();
        p.sample(&ram, Some(500), false);
        assert_eq!(ram.write_count(), 0, "inactive: never written");
        p.init(&ram);
        let mm = Threading::Mttcg;
        p.sample(&ram, Some(500), false);
        assert_eq!(stolen(&ram), 0, "no entry yet: nothing to count from");
        p.enter(&ram, mm, 1, 1_000);
        p.sample(&ram, Some(1_600), false);
        assert_eq!(stolen(&ram), 600, "written without an entry");
        p.sample(&ram, Some(1_600), false);
        p.enter(&ram, mm, 2, 1_900);
        assert_eq!(stolen(&ram), 900, "the entry adds only what is new");
        assert_eq!(ram.writes_outside(BASE, layout::SIZE), 0);
        // No version protocol: each update is one single-copy-atomic
        // 8-byte store (the guest's READ_ONCE sees old or new).
        let at = BASE + layout::STOLEN_TIME;
        assert_eq!(ram.atomic_stores(), vec![(at, 8), (at, 8)]);
    }

    #[test]
    fn round_robin_waits_are_stolen_and_reset_stops_updates() {
        let ram = FakeRam::new(0x4000);
        let mut p = PvTime::default();
        p.set_base(BASE).unwrap();
        p.init(&ram);
        let rr = Threading::RoundRobin { peers: true };
        p.enter(&ram, rr, 1_000, 0);
        p.exit(&NoMemory, rr, 2_000, 0, false);
        p.enter(&ram, rr, 7_000, 0);
        assert_eq!(stolen(&ram), 5_000);
        p.exit(&NoMemory, rr, 8_000, 0, true);
        p.enter(&ram, rr, 9_000, 0);
        assert_eq!(stolen(&ram), 5_000, "halted is not stolen");
        p.reset();
        let writes = ram.write_count();
        p.exit(&NoMemory, rr, 10_000, 0, false);
        p.enter(&ram, rr, 20_000, 0);
        assert_eq!(ram.write_count(), writes);
        assert_eq!(p.base, BASE, "the machine's address survives reset");
    }

    #[test]
    fn a_structure_outside_ram_is_never_written() {
        let ram = FakeRam::new(0x1000);
        let mut p = PvTime::default();
        p.set_base(0x2000).unwrap();
        assert_eq!(p.init(&ram), Some(0x2000), "KVM returns the IPA regardless");
        p.enter(&ram, Threading::Mttcg, 1, 1);
        p.enter(&ram, Threading::Mttcg, 1, 9);
        assert_eq!(ram.write_count(), 0);
    }
}
