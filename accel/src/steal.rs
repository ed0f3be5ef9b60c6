//! Steal-time accounting shared by x86 (MSR_KVM_STEAL_TIME) and arm64
//! (SMCCC PV time): how long a vCPU was runnable but not running.
//!
//! Spec: KVM adds the growth of the vCPU thread's
//! `current->sched_info.run_delay` at each entry (`arch/x86/kvm/x86.c`
//! `record_steal_time`, `arch/arm64/kvm/pvtime.c` `kvm_update_stolen_time`).
//! Under TCG (see docs/steal-time.md):
//! - MTTCG (one host thread per vCPU): the same, from
//!   `/proc/thread-self/schedstat` field 2.
//! - Round-robin TCG (one thread for all vCPUs): in addition, the wall time
//!   a vCPU waited while runnable (it left its turn without halting) until
//!   its next turn. For a guest to see that share, no turn may outlast its
//!   ticks: the sampler ends long turns (`vm::Sampler::tick`,
//!   `vm::RR_SLICE_NS`).

use crate::memory::GuestMemory;

/// How the vCPUs share host threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threading {
    /// One host thread per vCPU.
    Mttcg,
    /// One host thread for all vCPUs, taking turns.
    RoundRobin {
        /// Whether other vCPUs share the thread.
        peers: bool,
    },
}

/// The accounting of one vCPU (plain data, part of the vCPU's state). It
/// collects steal in `pending_ns`; the architecture's structure takes it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StealClock {
    /// Steal accumulated but not yet added to the guest's structure.
    pub pending_ns: u64,
    /// Thread run delay when last folded in (MTTCG) or at entry (RR); 0
    /// before the first entry after (re)start, which only synchronises.
    pub last_run_delay_ns: u64,
    /// When the vCPU left its turn while still runnable (RR), 0 if not.
    pub runnable_since_ns: u64,
    /// Host time of the last entry that folded steal in.
    pub entered_ns: u64,
}

/// Under MTTCG an entry folds steal in at most this often (ns): the sampler
/// folds it in every tick meanwhile, and a guest's PAUSE loop re-enters
/// guest execution at every PAUSE (TCG's `helper_pause` leaves the CPU loop),
/// where a read of schedstat and two writes of the structure each time would
/// slow every spin-wait of a guest that has steal time on.
pub const MTTCG_ENTRY_FOLD_NS: u64 = 1_000_000;

impl StealClock {
    /// Start counting afresh (the guest enabled the feature): nothing
    /// before this moment is steal.
    pub fn restart(&mut self) {
        *self = StealClock::default();
    }

    /// Whether an entry at `now_ns` should fold steal in (call
    /// [`StealClock::enter`]): always under round-robin, where the entry is
    /// the only place steal is seen; under MTTCG the first entry and then at
    /// most every [`MTTCG_ENTRY_FOLD_NS`].
    pub fn entry_fold_due(&self, threading: Threading, now_ns: u64) -> bool {
        threading != Threading::Mttcg
            || self.last_run_delay_ns == 0
            || now_ns.saturating_sub(self.entered_ns) >= MTTCG_ENTRY_FOLD_NS
    }

    /// The vCPU enters guest execution at host time `now_ns`, its thread's
    /// run delay being `run_delay_ns`: collect what was stolen since.
    pub fn enter(&mut self, threading: Threading, now_ns: u64, run_delay_ns: u64) {
        match threading {
            Threading::Mttcg => {
                if self.last_run_delay_ns != 0 {
                    self.pending_ns = self
                        .pending_ns
                        .saturating_add(run_delay_ns.saturating_sub(self.last_run_delay_ns));
                }
            }
            Threading::RoundRobin { .. } => {
                if self.runnable_since_ns != 0 {
                    self.pending_ns = self
                        .pending_ns
                        .saturating_add(now_ns.saturating_sub(self.runnable_since_ns));
                }
            }
        }
        self.last_run_delay_ns = run_delay_ns;
        self.runnable_since_ns = 0;
        self.entered_ns = now_ns;
    }

    /// The vCPU leaves guest execution; `halted` if it stopped voluntarily.
    /// Returns whether it was descheduled while runnable (round-robin with
    /// peers): the moment KVM marks a vCPU preempted.
    pub fn exit(
        &mut self,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
        halted: bool,
    ) -> bool {
        let Threading::RoundRobin { peers } = threading else {
            return false;
        };
        // The shared thread's own host preemption during this turn.
        self.pending_ns = self
            .pending_ns
            .saturating_add(run_delay_ns.saturating_sub(self.last_run_delay_ns));
        self.last_run_delay_ns = run_delay_ns;
        if !halted && peers {
            self.runnable_since_ns = now_ns.max(1);
            return true;
        }
        false
    }

    /// MTTCG sampler, outside the vCPU thread: the thread's run delay is now
    /// `run_delay_ns`. Collects its growth; true if there was any. Nothing
    /// before the first entry counts.
    pub fn sample(&mut self, run_delay_ns: u64) -> bool {
        if self.last_run_delay_ns == 0 || run_delay_ns <= self.last_run_delay_ns {
            return false;
        }
        self.pending_ns = self
            .pending_ns
            .saturating_add(run_delay_ns - self.last_run_delay_ns);
        self.last_run_delay_ns = run_delay_ns;
        true
    }

    /// Take the collected steal.
    pub fn take(&mut self) -> u64 {
        std::mem::take(&mut self.pending_ns)
    }
}

/// A vCPU's guest-visible steal structure (x86 `kvm_steal_time`, arm64's
/// PV stolen time), as the accounting shared by both architectures drives
/// it at entries, exits and sampler ticks (`crate::vcpu::Vcpu`). Each vCPU
/// has exactly one.
pub trait StealArea {
    /// Whether the guest turned it on (updates are due).
    fn on(&self) -> bool;
    /// Its accounting.
    fn clock(&self) -> &StealClock;
    /// Its accounting, to change (injected steal, `crate::inject`).
    fn clock_mut(&mut self) -> &mut StealClock;
    /// The vCPU enters guest code at host time `now_ns`, its thread's run
    /// delay being `run_delay_ns`: fold the steal in.
    fn enter(
        &mut self,
        mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
    );
    /// The vCPU leaves guest code; `halted` if voluntarily.
    fn exit(
        &mut self,
        mem: &dyn GuestMemory,
        threading: Threading,
        now_ns: u64,
        run_delay_ns: u64,
        halted: bool,
    );
    /// MTTCG sampler tick: the run delay now (None: not read this tick) and
    /// whether the thread is descheduled (only asked of a structure with a
    /// preempted flag). True if the vCPU should leave guest code: it marked
    /// it preempted now, or the guest asked for a TLB flush that its next
    /// entry does (see [`StealArea::take_tlb_flush`]).
    fn sample(
        &mut self,
        mem: &dyn GuestMemory,
        run_delay_ns: Option<u64>,
        descheduled: bool,
    ) -> bool;
    /// Whether the structure has KVM's "vCPU preempted" flag (x86 only:
    /// arm64's PV time has none).
    fn has_preempted_flag(&self) -> bool {
        false
    }
    /// Clear the preempted flag if the host set it (the vCPU runs).
    fn clear_preempted(&mut self, _mem: &dyn GuestMemory) {}
    /// Whether another vCPU asked for this one's TLB to be flushed while it
    /// was preempted (x86 PV TLB flush: KVM_VCPU_FLUSH_TLB in `preempted`),
    /// since the last call; the request is taken.
    fn take_tlb_flush(&mut self) -> bool {
        false
    }
    /// Mark the vCPU preempted now; true if it was marked now.
    fn mark_preempted(&mut self, _mem: &dyn GuestMemory) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46: steal collected on top of an injected amount near 2^64
    /// (QMP `steal-ns`) saturates instead of overflowing, on every path.
    #[test]
    fn steal_collected_on_top_of_a_huge_injection_saturates() {
        let rr = Threading::RoundRobin { peers: true };
        let mut c = StealClock::default();
        c.enter(Threading::Mttcg, 10, 1_000);
        c.pending_ns = u64::MAX - 1;
        c.enter(Threading::Mttcg, 2_000_000, 2_000);
        assert!(c.sample(3_000));
        assert_eq!(c.take(), u64::MAX);
        c.pending_ns = u64::MAX - 1;
        c.exit(rr, 10, 5_000, false);
        c.enter(rr, 100, 5_000);
        assert_eq!(c.take(), u64::MAX);
    }

    #[test]
    fn mttcg_counts_run_delay_growth_after_the_first_entry() {
        let mut c = StealClock::default();
        c.enter(Threading::Mttcg, 10, 1_000);
        assert_eq!(c.take(), 0, "first entry only synchronises");
        c.enter(Threading::Mttcg, 20, 1_500);
        assert_eq!(c.take(), 500);
        assert!(
            !c.exit(Threading::Mttcg, 30, 1_600, false),
            "never 'preempted' at exit"
        );
        assert!(c.sample(1_800));
        assert!(!c.sample(1_800));
        c.enter(Threading::Mttcg, 40, 1_800);
        assert_eq!(c.take(), 300, "sampled steal is not counted twice");
    }

    #[test]
    fn mttcg_entries_fold_at_most_once_a_millisecond_round_robin_always() {
        let mut c = StealClock::default();
        assert!(c.entry_fold_due(Threading::Mttcg, 5), "first entry");
        c.enter(Threading::Mttcg, 5, 1_000);
        assert!(!c.entry_fold_due(Threading::Mttcg, 5 + MTTCG_ENTRY_FOLD_NS - 1));
        assert!(c.entry_fold_due(Threading::Mttcg, 5 + MTTCG_ENTRY_FOLD_NS));
        let rr = Threading::RoundRobin { peers: true };
        assert!(c.entry_fold_due(rr, 6));
        c.restart();
        assert!(c.entry_fold_due(Threading::Mttcg, 6), "after a restart");
    }

    #[test]
    fn round_robin_counts_runnable_waits_and_the_threads_own_delay() {
        let rr = Threading::RoundRobin { peers: true };
        let mut c = StealClock::default();
        c.enter(rr, 1_000, 0);
        assert!(c.exit(rr, 2_000, 0, false), "descheduled while runnable");
        c.enter(rr, 5_000, 0);
        assert_eq!(c.take(), 3_000);
        assert!(!c.exit(rr, 6_000, 0, true), "a halt is voluntary");
        c.enter(rr, 9_000, 0);
        assert_eq!(c.take(), 0, "no steal while halted");
        c.exit(rr, 9_500, 250, true);
        c.enter(rr, 9_600, 250);
        assert_eq!(c.take(), 250);
        assert!(!c.exit(Threading::RoundRobin { peers: false }, 10_000, 250, false));
    }

    #[test]
    fn restart_forgets_everything() {
        let mut c = StealClock::default();
        c.enter(Threading::Mttcg, 1, 5);
        c.enter(Threading::Mttcg, 1, 50);
        c.restart();
        c.enter(Threading::Mttcg, 1, 500);
        assert_eq!(c.take(), 0);
    }
}
