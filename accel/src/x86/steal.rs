//! KVM steal time (MSR_KVM_STEAL_TIME) and the "vCPU preempted" hint.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/msr.rst` (MSR_KVM_STEAL_TIME),
//! `arch/x86/include/uapi/asm/kvm_para.h` (`struct kvm_steal_time`,
//! KVM_STEAL_*), `arch/x86/kvm/x86.c` (`kvm_set_msr_common`,
//! `record_steal_time`, `kvm_steal_time_set_preempted`).
//!
//! Steal is accounted by [`crate::steal::StealClock`] (shared with arm64's
//! PV time; docs/steal-time.md). "Descheduled": in round-robin TCG, a vCPU
//! that leaves its turn while runnable, with other vCPUs to run, gets
//! `preempted` set, cleared at its next entry; under MTTCG the sampler sets
//! it while the vCPU's thread waits on the host run queue. A halt is
//! voluntary and sets nothing.

use crate::memory::{Gpa, GuestMemory, GuestRam};
use crate::steal::StealClock;
pub use crate::steal::Threading;
use crate::x86::X86Error;

/// MSR_KVM_STEAL_TIME.
pub const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
/// KVM_MSR_ENABLED: bit 0 of the MSR.
pub const KVM_MSR_ENABLED: u64 = 1;
/// KVM_STEAL_ALIGNMENT_BITS: the structure is 64-byte aligned.
pub const KVM_STEAL_ALIGNMENT_BITS: u32 = 5;
/// KVM_STEAL_VALID_BITS: the GPA bits of the MSR.
pub const KVM_STEAL_VALID_BITS: u64 = !0u64 << (KVM_STEAL_ALIGNMENT_BITS + 1);
/// KVM_STEAL_RESERVED_MASK: bits 1..5; a write with any set is refused (#GP).
pub const KVM_STEAL_RESERVED_MASK: u64 = ((1 << KVM_STEAL_ALIGNMENT_BITS) - 1) << 1;
/// KVM_VCPU_PREEMPTED: bit 0 of `preempted`.
pub const KVM_VCPU_PREEMPTED: u8 = 1 << 0;
/// KVM_VCPU_FLUSH_TLB: bit 1 of `preempted`, set by another vCPU of the
/// guest (with KVM_FEATURE_PV_TLB_FLUSH) instead of a TLB-flush IPI.
pub const KVM_VCPU_FLUSH_TLB: u8 = 1 << 1;

/// `struct kvm_steal_time` (arch/x86/include/uapi/asm/kvm_para.h), as the
/// guest lays it out in its memory; the models write its fields at the
/// offsets [`layout`] takes from it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct KvmStealTime {
    /// Nanoseconds stolen.
    pub steal: u64,
    /// Odd while the host writes.
    pub version: u32,
    /// Flags (0).
    pub flags: u32,
    /// KVM_VCPU_PREEMPTED (and, with PV TLB flush, KVM_VCPU_FLUSH_TLB).
    pub preempted: u8,
    /// Padding.
    pub u8_pad: [u8; 3],
    /// Padding to 64 bytes.
    pub pad: [u32; 11],
}

/// [`KvmStealTime`]'s field offsets and size, as guest addresses count them.
pub mod layout {
    use super::KvmStealTime;
    use core::mem::{offset_of, size_of};
    /// `steal`.
    pub const STEAL: u64 = offset_of!(KvmStealTime, steal) as u64;
    /// `version`.
    pub const VERSION: u64 = offset_of!(KvmStealTime, version) as u64;
    /// `flags`.
    pub const FLAGS: u64 = offset_of!(KvmStealTime, flags) as u64;
    /// `preempted`.
    pub const PREEMPTED: u64 = offset_of!(KvmStealTime, preempted) as u64;
    /// sizeof(struct kvm_steal_time): 64 (the MSR's alignment).
    pub const SIZE: u64 = size_of::<KvmStealTime>() as u64;
    const _: () =
        assert!(STEAL == 0 && VERSION == 8 && FLAGS == 12 && PREEMPTED == 16 && SIZE == 64);
}

/// Steal-time state of one vCPU (plain data, part of the vCPU's saved state).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StealTime {
    /// The MSR as the guest wrote it.
    pub msr: u64,
    /// What was stolen and not yet written.
    pub clock: StealClock,
    /// Whether the host set `preempted` and has not cleared it yet.
    pub preempted: u8,
    /// The guest's KVM_VCPU_FLUSH_TLB, taken from `preempted` and not yet
    /// done: the vCPU's next entry flushes its TLB.
    pub flush_tlb: bool,
}

impl StealTime {
    /// Whether the guest enabled steal time.
    pub fn enabled(&self) -> bool {
        self.msr & KVM_MSR_ENABLED != 0
    }

    fn gpa(&self) -> Gpa {
        Gpa(self.msr & KVM_STEAL_VALID_BITS)
    }

    /// A reset of either kind turns steal time off and forgets what was
    /// pending: KVM's `kvm_vcpu_reset` clears `st.msr_val` on INIT as on
    /// RESET, so nothing is written to the old structure afterwards.
    pub fn reset(&mut self, _kind: crate::x86::ResetKind) {
        *self = StealTime::default();
    }

    /// WRMSR MSR_KVM_STEAL_TIME; an error means #GP (reserved bits set).
    pub fn write_msr(&mut self, value: u64) -> Result<(), X86Error> {
        if value & KVM_STEAL_RESERVED_MASK != 0 {
            return Err(X86Error::ReservedBits {
                msr: MSR_KVM_STEAL_TIME,
                value,
            });
        }
        let was = self.enabled();
        self.msr = value;
        if self.enabled() && !was {
            // KVM starts counting from the run delay at the next update.
            self.clock.restart();
            self.preempted = 0;
        }
        Ok(())
    }

    /// `record_steal_time`'s `xchgb` of `preempted` with 0: one atomic
    /// exchange, so a KVM_VCPU_FLUSH_TLB another vCPU sets meanwhile is
    /// either taken here (and the flush done at the entry) or left for the
    /// next one, never lost. KVM exchanges the byte only with PV TLB flush
    /// advertised (else a plain store); the flush is done only then too
    /// (`X86::take_tlb_flush`), so the exchange itself is the same store.
    fn take_preempted_byte(&mut self, mem: &dyn GuestMemory) {
        if let Some(old) = GuestRam::new(mem).xchg_u8(self.gpa() + layout::PREEMPTED, 0) {
            self.preempted = 0;
            self.flush_tlb |= old & KVM_VCPU_FLUSH_TLB != 0;
        }
    }

    /// `kvm_steal_time_set_preempted`: mark the vCPU preempted in the guest.
    /// True if the flag was clear and is set now.
    fn set_preempted(&mut self, mem: &dyn GuestMemory) -> bool {
        if self.preempted != 0 {
            return false;
        }
        let set = GuestRam::new(mem).write(self.gpa() + layout::PREEMPTED, &[KVM_VCPU_PREEMPTED]);
        if set {
            self.preempted = KVM_VCPU_PREEMPTED;
        }
        set
    }

    /// `record_steal_time`: clear `preempted` (on entry, `clear_preempted`),
    /// then bump the version to odd, add the steal, bump it to even. Nothing
    /// is written unless the whole structure is guest RAM.
    fn record(&mut self, mem: &dyn GuestMemory, clear_preempted: bool) {
        let (ram, gpa) = (GuestRam::new(mem), self.gpa());
        let Some(st) = ram
            .read_array::<{ layout::PREEMPTED as usize + 1 }>(gpa)
            .filter(|_| ram.is_ram(gpa, layout::SIZE as usize))
        else {
            return;
        };
        if clear_preempted {
            self.take_preempted_byte(mem);
        }
        let mut version = u32::from_le_bytes(st[8..12].try_into().unwrap_or_default());
        if version & 1 != 0 {
            // First write: the guest left junk (KVM's comment).
            version = version.wrapping_add(1);
        }
        // KVM's order: version odd, smp_wmb(), steal, smp_wmb(), version
        // even; each field one single-copy-atomic store (the structure is
        // 64-byte aligned).
        let steal = u64::from_le_bytes(st[0..8].try_into().unwrap_or_default())
            .wrapping_add(self.clock.take());
        ram.versioned(gpa + layout::VERSION, version.wrapping_add(1), |ram| {
            let _ = ram.store_u64(gpa + layout::STEAL, steal);
        });
    }
}

impl crate::steal::StealArea for StealTime {
    fn on(&self) -> bool {
        self.enabled()
    }

    fn clock(&self) -> &StealClock {
        &self.clock
    }

    fn clock_mut(&mut self) -> &mut StealClock {
        &mut self.clock
    }

    /// The vCPU enters guest execution at host time `now_ns`, its thread's
    /// run delay being `run_delay_ns`: fold the steal in and clear
    /// `preempted` in the guest's structure, as `record_steal_time` does.
    fn enter(
        &mut self,
        mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
    ) {
        if !self.enabled() {
            return;
        }
        self.clock.enter(threading, now_ns, run_delay_ns);
        self.record(mem, true);
    }

    /// The vCPU leaves guest execution; `halted` if it stopped voluntarily.
    fn exit(
        &mut self,
        mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
        halted: bool,
    ) {
        if self.enabled() && self.clock.exit(threading, now_ns, run_delay_ns, halted) {
            self.set_preempted(mem);
        }
    }

    /// MTTCG sampler (another thread, every tick): the vCPU thread's run
    /// delay is now `run_delay_ns` (None: not read this tick), and
    /// `descheduled` says whether the thread is runnable but off the host
    /// CPUs now (see `Vcpu::sample`). Folds the steal in at once, sets
    /// `preempted` while descheduled, clears it once the thread runs again
    /// (it may not re-enter for a long time). A halted vCPU's thread sleeps:
    /// it is never descheduled. True if it marked the vCPU preempted now.
    fn sample(
        &mut self,
        mem: &dyn GuestMemory,
        run_delay_ns: Option<u64>,
        descheduled: bool,
    ) -> bool {
        if !self.enabled() {
            return false;
        }
        if run_delay_ns.is_some_and(|rd| self.clock.sample(rd)) {
            // The vCPU is not entering: `preempted` is the sampler's to decide.
            self.record(mem, false);
        }
        if descheduled {
            self.set_preempted(mem)
        } else {
            self.clear_preempted(mem);
            // The vCPU runs: a flush the guest asked for is done at its
            // next entry, which the caller brings about.
            self.flush_tlb
        }
    }

    /// Clear `preempted` in the guest's structure if we set it: the vCPU
    /// runs (an entry that does not fold steal in, or the sampler).
    fn clear_preempted(&mut self, mem: &dyn GuestMemory) {
        if self.enabled() && self.preempted != 0 {
            self.take_preempted_byte(mem);
        }
    }

    fn take_tlb_flush(&mut self) -> bool {
        std::mem::take(&mut self.flush_tlb)
    }

    /// Mark the vCPU preempted now (another vCPU found it off the host
    /// CPUs); nothing unless steal time is on. True if it marked it now.
    fn mark_preempted(&mut self, mem: &dyn GuestMemory) -> bool {
        self.enabled() && self.set_preempted(mem)
    }

    fn has_preempted_flag(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    // The tests lay out guest RAM as a guest would, without GuestRam.
    #![allow(clippy::disallowed_methods)]
    use super::*;
    use crate::memory::tests::FakeRam;
    use crate::steal::StealArea;

    const GPA: u64 = 0x1000;

    fn rd(ram: &FakeRam, off: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        assert!(ram.read(GPA + off, &mut b));
        b
    }
    fn steal(ram: &FakeRam) -> u64 {
        u64::from_le_bytes(rd(ram, layout::STEAL, 8).try_into().unwrap())
    }
    fn version(ram: &FakeRam) -> u32 {
        u32::from_le_bytes(rd(ram, layout::VERSION, 4).try_into().unwrap())
    }
    fn preempted(ram: &FakeRam) -> u8 {
        rd(ram, layout::PREEMPTED, 1)[0]
    }

    #[test]
    fn constants_match_kvm_para_h() {
        assert_eq!(KVM_STEAL_RESERVED_MASK, 0x3e);
        assert_eq!(KVM_STEAL_VALID_BITS, !0x3f);
        assert_eq!(layout::SIZE, 64);
    }

    #[test]
    fn init_and_reset_both_turn_it_off_and_nothing_is_written_after() {
        use crate::x86::ResetKind;
        for kind in [ResetKind::Init, ResetKind::Cold] {
            let ram = FakeRam::new(0x4000);
            let mut st = StealTime::default();
            st.write_msr(GPA | 1).unwrap();
            st.enter(&ram, Threading::RoundRobin { peers: true }, 10, 0);
            st.exit(&ram, Threading::RoundRobin { peers: true }, 20, 0, false);
            assert!(version(&ram) >= 2, "{kind:?}: updated while on");
            st.reset(kind);
            assert_eq!((st.msr, st.enabled()), (0, false), "{kind:?}: MSR reads 0");
            assert!(ram.write(GPA, &[0xa5; 64]));
            st.enter(&ram, Threading::RoundRobin { peers: true }, 1_000, 0);
            assert!(!st.mark_preempted(&ram));
            st.exit(&ram, Threading::RoundRobin { peers: true }, 2_000, 0, false);
            st.enter(&ram, Threading::RoundRobin { peers: true }, 3_000, 0);
            st.clear_preempted(&ram);
            assert_eq!(rd(&ram, 0, 64), [0xa5; 64], "{kind:?}: old area untouched");
        }
    }

    #[test]
    fn reserved_bits_are_refused_and_leave_the_msr_alone() {
        let mut st = StealTime::default();
        for bit in 1..=5 {
            assert!(st.write_msr(GPA | 1 | (1 << bit)).is_err(), "bit {bit}");
        }
        assert_eq!(st.msr, 0);
        assert_eq!(st.write_msr(GPA | 1), Ok(()));
        assert!(st.enabled());
        // Bits above 5 belong to the GPA: accepted, even if not RAM.
        assert_eq!(st.write_msr(0xdead_0000_0040 | 1), Ok(()));
    }

    #[test]
    fn mttcg_adds_run_delay_growth_with_the_version_protocol() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 10, 1_000);
        assert_eq!(
            (steal(&ram), version(&ram)),
            (0, 2),
            "first entry only syncs"
        );
        st.enter(&ram, Threading::Mttcg, 20, 1_500);
        assert_eq!((steal(&ram), version(&ram)), (500, 4));
        st.enter(&ram, Threading::Mttcg, 30, 1_500);
        assert_eq!((steal(&ram), version(&ram)), (500, 6));
        assert_eq!(ram.writes_outside(GPA, layout::SIZE), 0);
        // The version seen in the middle of an update is odd.
        assert!(ram
            .version_history(GPA + layout::VERSION)
            .iter()
            .any(|v| v % 2 == 1));
    }

    #[test]
    fn version_and_steal_are_each_one_atomic_store_in_kvms_order() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 10, 1_000);
        let (p, v, s) = (
            GPA + layout::PREEMPTED,
            GPA + layout::VERSION,
            GPA + layout::STEAL,
        );
        // record_steal_time: xchgb preempted, version odd, steal, version
        // even — the guest reads `steal` (8 bytes) and `version` (4) each
        // with one load, and cmpxchgs `preempted`.
        assert_eq!(ram.atomic_stores(), vec![(p, 1), (v, 4), (s, 8), (v, 4)]);
    }

    #[test]
    fn odd_junk_version_is_made_even_first() {
        let ram = FakeRam::new(0x4000);
        assert!(ram.write(GPA + layout::VERSION, &7u32.to_le_bytes()));
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 1);
        assert_eq!(version(&ram), 10, "7 -> 8, then 9 while writing, 10 after");
    }

    #[test]
    fn round_robin_wait_is_steal_and_sets_preempted_only_when_runnable() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        let rr = Threading::RoundRobin { peers: true };
        st.enter(&ram, rr, 1_000, 0);
        st.exit(&ram, rr, 2_000, 0, false);
        assert_eq!(
            preempted(&ram),
            KVM_VCPU_PREEMPTED,
            "descheduled while runnable"
        );
        st.enter(&ram, rr, 5_000, 0);
        assert_eq!(preempted(&ram), 0, "cleared on entry");
        assert_eq!(steal(&ram), 3_000, "waited 2000..5000");
        st.exit(&ram, rr, 6_000, 0, true);
        assert_eq!(preempted(&ram), 0, "a halt is voluntary");
        st.enter(&ram, rr, 9_000, 0);
        assert_eq!(steal(&ram), 3_000, "no steal while halted");
        // Host preemption of the shared thread during the turn is steal too.
        st.exit(&ram, rr, 9_500, 250, true);
        st.enter(&ram, rr, 9_600, 250);
        assert_eq!(steal(&ram), 3_250);
        // A lone vCPU is never "preempted" by another.
        let lone = Threading::RoundRobin { peers: false };
        st.exit(&ram, lone, 10_000, 250, false);
        assert_eq!(preempted(&ram), 0);
    }

    /// The guest side of PV TLB flush, as Linux's `kvm_flush_tlb_multi`:
    /// cmpxchg PREEMPTED -> PREEMPTED|FLUSH_TLB; true if it took.
    fn guest_defers_flush(ram: &FakeRam) -> bool {
        let state = preempted(ram);
        state & KVM_VCPU_PREEMPTED != 0
            && ram.xchg_u8(GPA + layout::PREEMPTED, state | KVM_VCPU_FLUSH_TLB) == Some(state)
    }

    #[test]
    fn a_flush_asked_of_a_preempted_vcpu_is_taken_once_at_its_next_entry() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        let rr = Threading::RoundRobin { peers: true };
        st.enter(&ram, rr, 1_000, 0);
        assert!(!guest_defers_flush(&ram), "running: the guest sends an IPI");
        st.exit(&ram, rr, 2_000, 0, false);
        assert!(guest_defers_flush(&ram), "preempted: the guest defers");
        assert!(!st.take_tlb_flush(), "not before the entry");
        st.enter(&ram, rr, 3_000, 0);
        assert_eq!(preempted(&ram), 0, "both bits cleared at the entry");
        assert!(st.take_tlb_flush(), "the entry flushes");
        assert!(!st.take_tlb_flush(), "once");
        st.exit(&ram, rr, 4_000, 0, false);
        st.enter(&ram, rr, 5_000, 0);
        assert!(!st.take_tlb_flush(), "no flush without a request");
        // Under MTTCG an entry between folds only clears the flag.
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 0);
        assert!(st.mark_preempted(&ram));
        assert!(guest_defers_flush(&ram));
        st.clear_preempted(&ram);
        assert_eq!(preempted(&ram), 0);
        assert!(st.take_tlb_flush());
    }

    #[test]
    fn the_sampler_clearing_the_flag_keeps_the_flush_for_the_entry() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 0);
        assert!(
            st.sample(&ram, None, true),
            "marked preempted: leave guest code"
        );
        assert!(guest_defers_flush(&ram));
        // The thread runs again before it leaves guest code: the sampler
        // clears the flag, and must not drop the guest's request.
        assert!(
            st.sample(&ram, None, false),
            "a flush is pending: the vCPU must leave guest code"
        );
        assert_eq!(preempted(&ram), 0);
        assert!(st.sample(&ram, None, false), "until its entry takes it");
        assert!(st.take_tlb_flush());
        assert!(!st.sample(&ram, None, false));
    }

    #[test]
    fn a_flush_request_outside_ram_or_after_a_reset_is_dropped() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        let rr = Threading::RoundRobin { peers: true };
        st.enter(&ram, rr, 1, 0);
        st.exit(&ram, rr, 2, 0, false);
        assert!(guest_defers_flush(&ram));
        st.reset(crate::x86::ResetKind::Init);
        assert!(
            !st.take_tlb_flush(),
            "a reset flushes anyway; nothing pending"
        );
        // A structure beyond RAM: nothing read, nothing written, no flush.
        let mut far = StealTime::default();
        far.write_msr(0x10_0000 | 1).unwrap();
        far.enter(&ram, rr, 3, 0);
        far.exit(&ram, rr, 4, 0, false);
        far.enter(&ram, rr, 5, 0);
        assert!(!far.take_tlb_flush());
    }

    #[test]
    fn mttcg_sampler_marks_a_descheduled_thread_preempted_and_clears_it() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 1_000);
        // Descheduled now: preempted at once, before the kernel reports the
        // wait in run_delay (it does when the thread gets a CPU back).
        assert!(st.sample(&ram, Some(1_000), true), "marked now");
        assert_eq!((preempted(&ram), steal(&ram)), (KVM_VCPU_PREEMPTED, 0));
        assert_eq!(version(&ram) % 2, 0);
        // Still off the CPU: stays set (not marked again); the finished wait
        // is folded in.
        assert!(!st.sample(&ram, Some(801_000), true), "already marked");
        assert_eq!(
            (preempted(&ram), steal(&ram)),
            (KVM_VCPU_PREEMPTED, 800_000)
        );
        // Running again: cleared, no new steal.
        assert!(!st.sample(&ram, Some(801_000), false));
        assert_eq!((preempted(&ram), steal(&ram)), (0, 800_000));
        // A tick that does not read the delay still decides `preempted`.
        assert!(st.sample(&ram, None, true));
        assert_eq!(preempted(&ram), KVM_VCPU_PREEMPTED);
        // The vCPU's own entry clears it without folding (and the sampled
        // steal is not counted twice when it does fold).
        st.clear_preempted(&ram);
        assert_eq!(preempted(&ram), 0);
        st.enter(&ram, Threading::Mttcg, 2, 901_000);
        assert_eq!(steal(&ram), 900_000);
    }

    #[test]
    fn clearing_preempted_touches_nothing_it_did_not_set() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.write_msr(GPA | 1).unwrap();
        ram.write(GPA + layout::PREEMPTED, &[0x5a]);
        st.clear_preempted(&ram);
        assert_eq!(preempted(&ram), 0x5a, "not ours to clear");
        st.write_msr(GPA).unwrap();
        assert!(!st.sample(&ram, Some(5), true));
        assert!(!st.mark_preempted(&ram));
        assert_eq!(preempted(&ram), 0x5a, "disabled: never written");
    }

    #[test]
    fn disabled_or_unmapped_structures_are_never_written() {
        let ram = FakeRam::new(0x4000);
        let mut st = StealTime::default();
        st.enter(&ram, Threading::Mttcg, 1, 5);
        st.write_msr(GPA).unwrap(); // bit 0 clear: disabled
        st.enter(&ram, Threading::Mttcg, 1, 5);
        st.exit(&ram, Threading::RoundRobin { peers: true }, 2, 5, false);
        assert_eq!(ram.write_count(), 0);
        // Enabled, but the struct is (partly) outside RAM.
        st.write_msr((0x4000 - 0x40) | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 5);
        assert!(ram.write_count() > 0, "last 64 bytes of RAM are fine");
        let before = ram.write_count();
        st.write_msr(0x4000 | 1).unwrap();
        st.enter(&ram, Threading::Mttcg, 1, 9);
        st.exit(&ram, Threading::RoundRobin { peers: true }, 2, 9, false);
        assert_eq!(ram.write_count(), before, "nothing outside RAM");
    }
}
