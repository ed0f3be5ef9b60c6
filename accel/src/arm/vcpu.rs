//! An arm64 vCPU: its state and the routing points QEMU calls on it (PMU
//! system registers, HVC/SMC, PV stolen time).
//!
//! One dispatch per register space: a system register access reaches the
//! PMU if [`PmuReg::decode`] knows its encoding (no other arm64 model owns
//! system registers), else it is TCG's; an HVC/SMC reaches the one SMCCC
//! service its function ID names ([`smccc::Call::decode`], [`smccc::handle`]),
//! else it is QEMU's PSCI.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::arm::pmu::{self, PmuReg};
use crate::arm::pvtime::{PvTime, PvTimeError};
use crate::arm::smccc;
use crate::machine::Shared;
use crate::vcpu::{bump, CountingPtr, LocalCell, PmuClock, Route, Unhalted, Vcpu};
use crate::x86::pmu::Counting;

/// `RustkvmCounting.active`, as on x86: a counter counts instructions,
/// branches or memory events (the engine translates counting blocks); a
/// counter counts memory events (blocks add their loads and stores).
pub use crate::x86::pmu::{ACTIVE_MEM, ACTIVE_RETIRED};
/// ... (arm64) a counter counts exceptions taken: QEMU adds each and calls
/// back.
pub const ACTIVE_EXC: u32 = 4;

/// An arm64 vCPU's lock-free state (see [`LocalCell`]): the PMUv3.
#[derive(Debug)]
pub(crate) struct ArmLocal {
    /// PMUv3 registers.
    pmu: pmu::Pmu,
    /// Its unhalted cycles.
    unhalted: Unhalted,
    /// The counting engine's state in QEMU's CPU state (None: none).
    counting: Option<CountingPtr>,
    /// What of the engine's privileged totals is EL2's.
    el2: El2Split,
}

/// How many privileged totals [`El2Split`] follows: the engine's six
/// (instructions, branches, memory accesses, loads, stores, exceptions
/// taken) and the cycles.
const SPLIT: usize = 7;

/// EL2's share of the privileged totals. The engine counts EL1 and EL2
/// together as privileged (a block's `count_priv`); QEMU reports every
/// change of exception level of a vCPU with EL2 (an exception taken, an
/// exception return: [`Arm::el_change`]), and what the privileged totals
/// and the cycles gained while the vCPU was at EL2 is EL2's.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct El2Split {
    /// Gained at EL2 over the visits that ended.
    done: [u64; SPLIT],
    /// The totals as the vCPU entered EL2, while it is there.
    entered: Option<[u64; SPLIT]>,
}

impl El2Split {
    /// EL2's share of the totals `now`.
    fn at_el2(&self, now: &[u64; SPLIT]) -> [u64; SPLIT] {
        let mut s = self.done;
        if let Some(e) = self.entered {
            for k in 0..SPLIT {
                s[k] = s[k].wrapping_add(now[k].wrapping_sub(e[k]));
            }
        }
        s
    }

    /// The vCPU is at `el` with the totals `now` (any report: a repeated
    /// one changes nothing).
    fn at(&mut self, el: u32, now: [u64; SPLIT]) {
        match (self.entered.is_some(), el == 2) {
            (true, false) => {
                self.done = self.at_el2(&now);
                self.entered = None;
            }
            (false, true) => self.entered = Some(now),
            _ => {}
        }
    }
}

impl Default for ArmLocal {
    fn default() -> Self {
        ArmLocal {
            pmu: pmu::Pmu::new(pmu::PmuConfig {
                counters: None,
                v3p5: false,
                el2: false,
            }),
            unhalted: Unhalted::default(),
            counting: None,
            el2: El2Split::default(),
        }
    }
}

impl PmuClock for ArmLocal {
    fn has_pmu(&self) -> bool {
        self.pmu.present()
    }
    fn unhalted(&mut self) -> &mut Unhalted {
        &mut self.unhalted
    }
}

impl ArmLocal {
    /// The counting engine's state, if QEMU gave it.
    fn counting(&mut self) -> Option<&mut Counting> {
        // SAFETY: `self` is borrowed from the vCPU's `LocalCell::with`, and
        // the one reference made here lives no longer than that borrow.
        self.counting.map(|p| unsafe { p.get() })
    }

    /// The engine's totals (EL0, privileged for each event) and the cycles.
    fn raw(&mut self, shared: &Shared) -> ([u64; 12], u64) {
        let cycles = self.unhalted.cycles(shared);
        (self.counting().map_or([0; 12], |c| c.totals()), cycles)
    }

    /// The privileged totals [`El2Split`] follows.
    fn privileged((e, cycles): ([u64; 12], u64)) -> [u64; SPLIT] {
        [e[1], e[3], e[5], e[7], e[9], e[11], cycles]
    }

    /// The vCPU is at `el` now (see [`El2Split`]): the totals it read.
    fn note_el(&mut self, shared: &Shared, el: u32) -> ([u64; 12], u64) {
        let raw = self.raw(shared);
        self.el2.at(el, Self::privileged(raw));
        raw
    }

    /// The PMU's event totals now, by exception level.
    fn events(&mut self, shared: &Shared) -> pmu::Events {
        let raw = self.raw(shared);
        self.events_of(raw)
    }

    /// The PMU's event totals by exception level from the engine's `raw`
    /// ones (one reading: the EL2 split and the events agree).
    fn events_of(&self, raw: ([u64; 12], u64)) -> pmu::Events {
        let el2 = self.el2.at_el2(&Self::privileged(raw));
        let (e, cycles) = raw;
        let by_el = |k: usize| [e[2 * k], e[2 * k + 1].wrapping_sub(el2[k]), el2[k]];
        pmu::Events {
            instructions: by_el(0),
            branches: by_el(1),
            mem_accesses: by_el(2),
            loads: by_el(3),
            stores: by_el(4),
            exceptions: by_el(5),
            cycles: [cycles.wrapping_sub(el2[6]), el2[6]],
        }
    }

    /// Tell the engine what the PMU needs now: whether blocks count, the
    /// next PMI budget, the interrupt's level, when a cycle counter can
    /// overflow.
    fn publish(&mut self, shared: &Shared, ev: &pmu::Events, irq: bool) {
        let deadline = self.pmu.cycles_until_overflow(ev).map_or(-1, |ticks| {
            let ns = shared
                .virtual_ns()
                .saturating_add(shared.tsc_rate().ns_for(ticks));
            i64::try_from(ns).unwrap_or(i64::MAX)
        });
        let p = &self.pmu;
        let active = if p.counts_retired() {
            ACTIVE_RETIRED
        } else {
            0
        } | if p.counts_mem() { ACTIVE_MEM } else { 0 }
            | if p.counts_exceptions() { ACTIVE_EXC } else { 0 };
        let budget = p.until_overflow(ev);
        if let Some(c) = self.counting() {
            c.cycles_deadline_ns = deadline;
            c.active = active;
            c.budget = budget.map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
            c.arm();
            c.pmi = u32::from(irq);
        }
    }
}

/// An arm64 vCPU's own state (the core is [`Vcpu`]).
#[derive(Debug, Default)]
pub struct ArmVcpu {
    // PV stolen time, under the vCPU's lock: the vCPU's thread and the
    // sampler.
    pvtime: Mutex<PvTime>,
    // The PMU, without a lock (see LocalCell).
    pub(crate) local: LocalCell<ArmLocal>,
    // The generic timer's counter frequency (CNTFRQ_EL0, Hz; 0: unknown),
    // set at each setup: KVM's PTP call converts VM time with it.
    cntfrq_hz: AtomicU64,
}

impl ArmVcpu {
    /// PV stolen time under the lock.
    pub(crate) fn lock_pvtime(&self) -> MutexGuard<'_, PvTime> {
        self.pvtime.lock()
    }
}

/// An arm64 vCPU's routing points: the core and the arm64 state together
/// ([`Vcpu::arm`]).
#[derive(Debug, Clone, Copy)]
pub struct Arm<'a> {
    vcpu: &'a Vcpu,
    a: &'a ArmVcpu,
}

impl<'a> Arm<'a> {
    pub(crate) fn new(vcpu: &'a Vcpu, a: &'a ArmVcpu) -> Self {
        Arm { vcpu, a }
    }

    fn shared(&self) -> &'a Shared {
        &self.vcpu.shared
    }

    /// The lock-free part (see [`LocalCell`]); `f` must not call back into
    /// it (that panics).
    fn local<R>(&self, f: impl FnOnce(&mut ArmLocal) -> R) -> R {
        self.a.local.with(f)
    }

    /// A reset (arm64 has no INIT: a requested one is a reset), as KVM's
    /// `kvm_reset_vcpu`: PV stolen time is off until the guest asks again.
    /// The PMU is reset by the setup that follows ([`Arm::setup`]).
    /// Returns whether the reset counts as one (always).
    pub(crate) fn reset(&self) -> bool {
        self.a.lock_pvtime().reset();
        true
    }

    /// HVC/SMC with x0..x7 on the PSCI conduit (either instruction: KVM
    /// answers SMCCC on whichever conduit the machine describes); a handled
    /// call returns x0..x3, anything else is PSCI's.
    pub fn hvc_smc(&self, _is_smc: bool, regs: [u64; 8]) -> Route<[u64; 4]> {
        bump(&self.vcpu.routes.hvc_smc);
        match smccc::Call::decode(&regs) {
            Some(call) => {
                let mut svc = SmcccServices {
                    pvtime: &mut self.a.lock_pvtime(),
                    vcpu: self.vcpu,
                    cntfrq_hz: self.a.cntfrq_hz.load(Ordering::Relaxed),
                };
                Route::Handled(smccc::handle(call, &mut svc))
            }
            None => Route::Unhandled,
        }
    }

    /// The machine gives this vCPU its PV stolen-time structure (QEMU's
    /// virt board, like `KVM_ARM_VCPU_PVTIME_IPA`).
    pub fn set_pvtime_base(&self, ipa: u64) -> Result<(), PvTimeError> {
        self.a.lock_pvtime().set_base(ipa)
    }

    /// Whether the guest uses PV stolen time (saved with the vCPU).
    pub fn pvtime_active(&self) -> bool {
        self.a.lock_pvtime().active != 0
    }

    /// Restore the guest's use of PV stolen time (loadvm, incoming
    /// migration): updates resume without a new PV_TIME_ST, as under KVM,
    /// and accounting restarts from the next entry.
    pub fn load_pvtime_active(&self, active: bool) {
        let mut p = self.a.lock_pvtime();
        p.reset();
        p.active = u8::from(active && p.available());
    }

    /// The PV time structure's IPA if the guest asked for it (PV_TIME_ST
    /// since the last reset), else 0.
    pub fn pvtime_ipa(&self) -> u64 {
        let p = self.a.lock_pvtime();
        if p.active != 0 {
            p.base
        } else {
            0
        }
    }

    /// An access to the PMU register `encoding` (KVM `sys_reg()`):
    /// Unhandled unless it is one and the vCPU has PMUv3.
    fn pmu_access<T>(
        &self,
        encoding: u32,
        el: u32,
        f: impl FnOnce(&mut ArmLocal, PmuReg, &pmu::Events) -> Route<T>,
    ) -> Route<T> {
        let Some(reg) = PmuReg::decode(encoding) else {
            return Route::Unhandled;
        };
        let shared = self.shared();
        self.local(|l| {
            if !l.pmu.present() {
                return Route::Unhandled;
            }
            let raw = l.note_el(shared, el);
            let ev = l.events_of(raw);
            f(l, reg, &ev)
        })
    }

    /// MRS of a PMU system register (KVM `sys_reg()` encoding) at `el`.
    pub fn pmu_read(&self, encoding: u32, el: u32) -> Route<u64> {
        bump(&self.vcpu.routes.pmu_read);
        self.pmu_access(encoding, el, |l, reg, ev| {
            l.pmu
                .read(reg, el.min(2) as u8, ev)
                .map_or(Route::Fault, Route::Handled)
        })
    }

    /// MSR of a PMU system register (KVM `sys_reg()` encoding) at `el`.
    pub fn pmu_write(&self, encoding: u32, el: u32, value: u64) -> Route<()> {
        bump(&self.vcpu.routes.pmu_write);
        let shared = self.shared();
        self.pmu_access(encoding, el, |l, reg, ev| {
            match l.pmu.write(reg, value, el.min(2) as u8, ev) {
                Ok(fx) => {
                    l.publish(shared, ev, fx.irq);
                    Route::Handled(())
                }
                Err(_) => Route::Fault,
            }
        })
    }

    /// QEMU took an exception or returned from one: the vCPU is at `el`
    /// now (reported for a vCPU with EL2, and after each reset and load).
    pub fn el_change(&self, el: u32) {
        let shared = self.shared();
        self.local(|l| {
            l.note_el(shared, el);
        });
    }

    /// MDCR_EL2 := `value` (a write at EL2, after a reset or a load): what
    /// the register holds ([`pmu::Pmu::write_mdcr_el2`]; `value` without
    /// rustkvm's PMU).
    pub fn mdcr_el2(&self, value: u64) -> u64 {
        let shared = self.shared();
        self.local(|l| {
            if !l.pmu.present() {
                return value;
            }
            let ev = l.events(shared);
            let (held, fx) = l.pmu.write_mdcr_el2(value, &ev);
            l.publish(shared, &ev, fx.irq);
            held
        })
    }

    /// Whether an access to the PMU register `encoding` at `el` traps to
    /// EL2 ([`pmu::Pmu::traps_to_el2`]).
    pub fn pmu_traps_to_el2(&self, encoding: u32, el: u32) -> bool {
        let Some(reg) = PmuReg::decode(encoding) else {
            return false;
        };
        self.local(|l| l.pmu.present() && l.pmu.traps_to_el2(reg, el.min(2) as u8))
    }

    /// The PMI budget ran out (see `rustkvm_arm_pmu_due`): sync, publish.
    pub(crate) fn pmu_due(&self) {
        let shared = self.shared();
        self.local(|l| {
            let ev = l.events(shared);
            let irq = l.pmu.sync(&ev).irq;
            l.publish(shared, &ev, irq);
        });
    }

    /// What `x-query-rustkvm` reports for the vCPU: the PMU and PV time from
    /// the models, the structure's bytes as read from guest memory (None if
    /// unread), QEMU's timer registers.
    pub fn info(
        &self,
        pvtime: Option<&[u8; 64]>,
        timers: crate::info::ArmTimers,
    ) -> crate::info::VcpuInfo {
        let ipa = self.pvtime_ipa();
        let regs = self.pmu_save();
        let config = self.local(|l| l.pmu.config());
        let pmu = config.counters.map(|n| crate::info::ArmPmu {
            counters: usize::from(n),
            version: if config.v3p5 {
                crate::info::ARM_PMUVER_V3P5
            } else {
                crate::info::ARM_PMUVER_V3
            },
            regs: &regs,
        });
        crate::info::arm(pmu, (ipa != 0, ipa, pvtime), timers)
    }

    /// Whether the vCPU has rustkvm's PMUv3.
    pub fn pmu_present(&self) -> bool {
        self.local(|l| l.pmu.present())
    }

    /// The PMU registers to save (the vCPU is stopped).
    pub fn pmu_save(&self) -> [u64; pmu::SAVED_REGS] {
        let shared = self.shared();
        self.local(|l| {
            let ev = l.events(shared);
            l.pmu.save_regs(&ev)
        })
    }

    /// Load saved PMU registers (the vCPU is stopped).
    /// The EL2 split starts again from the engine's totals now (which a
    /// load need not keep): every counter continues from its saved value.
    pub fn pmu_load(&self, regs: &[u64; pmu::SAVED_REGS]) {
        let shared = self.shared();
        self.local(|l| {
            let raw = l.raw(shared);
            l.el2 = El2Split {
                done: [0; SPLIT],
                entered: l.el2.entered.map(|_| ArmLocal::privileged(raw)),
            };
            let ev = l.events_of(raw);
            let irq = l.pmu.load_regs(regs, &ev).irq;
            l.publish(shared, &ev, irq);
        });
    }

    /// After each reset: the vCPU's PMUv3 (`counters` None: none), the
    /// counting engine's state (reset) and the generic timer's counter
    /// frequency (Hz; 0: unknown). The vCPU is at EL1 until told otherwise
    /// ([`Arm::el_change`]).
    pub fn setup(&self, config: pmu::PmuConfig, counting: Option<CountingPtr>, cntfrq_hz: u64) {
        self.a.cntfrq_hz.store(cntfrq_hz, Ordering::Relaxed);
        self.local(|l| {
            *l = ArmLocal {
                pmu: pmu::Pmu::new(config),
                counting,
                ..ArmLocal::default()
            };
            if let Some(c) = l.counting() {
                *c = Counting::default();
            }
        });
    }
}

/// The vCPU as the SMCCC handler sees it.
struct SmcccServices<'a> {
    pvtime: &'a mut PvTime,
    vcpu: &'a Vcpu,
    cntfrq_hz: u64,
}

impl smccc::Services for SmcccServices<'_> {
    fn pv_time_available(&self) -> bool {
        self.pvtime.available()
    }
    fn pv_time_init(&mut self) -> Option<u64> {
        let base = self.pvtime.init(&*self.vcpu.shared.host)?;
        // The first entry after this synchronises the clock.
        self.vcpu.enter_steal(self.pvtime);
        Some(base)
    }
    fn random(&mut self, buf: &mut [u64; 3]) {
        crate::host::random(buf);
    }
    /// `kvm_ptp_get_time`: the counter is QEMU's (`gt_get_countervalue`:
    /// VM ns over the counter period in whole ns) minus KVM's VM offset
    /// (`voffset`/`poffset`, both the counter offset), read with real time
    /// as one pair. A guest's own CNTVOFF_EL2 (nested virtualization) is
    /// not subtracted, as KVM's VM-level offsets do not include it.
    fn ptp(&mut self, _physical: bool) -> Option<(u64, u64)> {
        if self.cntfrq_hz == 0 {
            return None;
        }
        let shared = &self.vcpu.shared;
        let (real, vm_ns) = shared.real_and_vm_ns();
        let period_ns = (1_000_000_000 / self.cntfrq_hz).max(1);
        Some((
            real,
            (vm_ns / period_ns).wrapping_sub(shared.counter_offset),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Arch;
    use crate::vcpu::{ResetKind, TestCounting};

    /// An AArch64 vCPU with KVM's default PMUv3 (6 counters, PMUv3p5),
    /// with or without EL2, on a test counting state.
    fn pmu_vcpu(el2: bool) -> (Vcpu, TestCounting) {
        let vcpu = Vcpu::new(0, Arch::Aarch64);
        let c = TestCounting::new(Counting::default());
        let config = pmu::PmuConfig {
            counters: Some(6),
            v3p5: true,
            el2,
        };
        vcpu.arm().unwrap().setup(config, c.ptr(), 1_000_000_000);
        (vcpu, c)
    }

    #[test]
    fn no_feature_claims_anything_yet() {
        let vcpu = Vcpu::new(1, Arch::Aarch64);
        let a = vcpu.arm().unwrap();
        assert_eq!(
            a.hvc_smc(false, [0x8400_0000, 0, 0, 0, 0, 0, 0, 0]),
            Route::Unhandled,
            "PSCI_VERSION is QEMU's"
        );
        assert_eq!(a.pmu_read(0xdce0, 1), Route::Unhandled, "no PMUv3 set up");
        assert_eq!(a.pmu_write(0xdce0, 1, 1), Route::Unhandled);
    }

    #[test]
    fn the_arm64_pmu_reads_the_engines_totals_and_drives_the_interrupt_level() {
        use crate::arm::pmu::{evtyper, pmcr};
        let (vcpu, c) = pmu_vcpu(false);
        let v = vcpu.arm().unwrap();
        // sys_reg() encodings: PMCR_EL0, PMCNTENSET/CLR, PMINTENSET/CLR_EL1,
        // PMOVSCLR, PMEVTYPER0, PMEVCNTR0.
        let (pmcr_el0, cntenset, cntenclr, intenset, intenclr, ovsclr) =
            (0xdce0, 0xdce1, 0xdce2, 0xc4f1, 0xc4f2, 0xdce3);
        let (evtyper0, evcntr0) = (0xdf60, 0xdf40);
        for (reg, value) in [
            (cntenclr, u64::MAX),
            (intenclr, u64::MAX),
            (ovsclr, u64::MAX),
        ] {
            assert_eq!(v.pmu_write(reg, 1, value), Route::Handled(()));
        }
        assert_eq!(
            v.pmu_write(evtyper0, 1, evtyper::P | 0x08),
            Route::Handled(())
        );
        assert_eq!(v.pmu_write(evcntr0, 1, 0xffff_fff0), Route::Handled(()));
        assert_eq!(v.pmu_write(cntenset, 1, 1), Route::Handled(()));
        assert_eq!(v.pmu_write(intenset, 1, 1), Route::Handled(()));
        assert_eq!(c.get().active, 0, "PMCR.E is 0");
        assert_eq!(v.pmu_write(pmcr_el0, 1, pmcr::E), Route::Handled(()));
        assert_eq!((c.get().active, c.get().budget, c.get().pmi), (1, 16, 0));
        c.update(|c| c.events[0] += 10); // EL0 instructions count (P excludes EL1)
        c.update(|c| c.events[1] += 99);
        assert_eq!(v.pmu_read(evcntr0, 1), Route::Handled(0xffff_fffa));
        c.update(|c| c.events[0] += 6);
        v.pmu_due();
        assert_eq!(
            c.get().pmi,
            1,
            "overflow with its interrupt enabled: level high"
        );
        assert_eq!(
            v.pmu_read(pmcr_el0, 0),
            Route::Fault,
            "EL0 needs PMUSERENR.EN"
        );
        assert_eq!(v.pmu_write(ovsclr, 1, 1), Route::Handled(()));
        assert_eq!(c.get().pmi, 0, "level low again");
    }

    #[test]
    fn what_a_vcpu_with_el2_does_at_el2_counts_at_el2_alone() {
        use crate::arm::pmu::{evtyper, pmcr};
        let (vcpu, c) = pmu_vcpu(true);
        let v = vcpu.arm().unwrap();
        // PMEVTYPER0..2 and PMEVCNTR0..2, PMCNTENSET, PMCR_EL0.
        let (evtyper, evcntr) = (|n| 0xdf60 + n, |n| 0xdf40 + n);
        let (cntenset, pmcr_el0) = (0xdce1, 0xdce0);
        let inst = 0x08;
        // 0: EL1 only (U excludes EL0, NSH clear excludes EL2); 1: EL2 only
        // (P, U set; NSH set); 2: every level.
        let types = [
            evtyper::U,
            evtyper::P | evtyper::U | evtyper::NSH,
            evtyper::NSH,
        ];
        for (n, t) in types.into_iter().enumerate() {
            let n = n as u32;
            assert_eq!(v.pmu_write(evtyper(n), 2, t | inst), Route::Handled(()));
            assert_eq!(
                v.pmu_read(evtyper(n), 2),
                Route::Handled(t | inst),
                "NSH kept with EL2"
            );
            assert_eq!(v.pmu_write(evcntr(n), 2, 0), Route::Handled(()));
        }
        assert_eq!(v.pmu_write(cntenset, 2, 0b111), Route::Handled(()));
        assert_eq!(v.pmu_write(pmcr_el0, 2, pmcr::E), Route::Handled(()));
        let counts = |v: &Arm| (0..3).map(|n| v.pmu_read(evcntr(n), 1)).collect::<Vec<_>>();
        let h = Route::Handled;
        // The write above was at EL2 (the access reports it): 7 privileged
        // instructions there, then the vCPU returns to EL1.
        c.update(|c| c.events[1] += 7);
        v.el_change(1);
        v.el_change(1); // a repeated report changes nothing
        assert_eq!(counts(&v), [h(0), h(7), h(7)]);
        c.update(|c| c.events[1] += 5); // at EL1
        c.update(|c| c.events[0] += 3); // at EL0 (the engine tells EL0 apart)
        assert_eq!(counts(&v), [h(5), h(7), h(15)]);
        v.el_change(2);
        c.update(|c| c.events[1] += 100); // at EL2 again
        assert_eq!(
            counts(&v),
            [h(5), h(107), h(115)],
            "read at EL1 in the middle"
        );
        v.el_change(1);
        c.update(|c| c.events[1] += 1);
        assert_eq!(counts(&v), [h(6), h(107), h(116)]);

        // Without EL2, NSH is RES0: it reads 0 and counts nothing apart.
        let (vcpu, _c) = pmu_vcpu(false);
        let v = vcpu.arm().unwrap();
        let t = evtyper::P | evtyper::U | evtyper::NSH | inst;
        assert_eq!(v.pmu_write(evtyper(0), 1, t), Route::Handled(()));
        assert_eq!(v.pmu_read(evtyper(0), 1), Route::Handled(t & !evtyper::NSH));
    }

    #[test]
    fn a_load_at_el2_continues_the_counters_from_their_saved_values() {
        use crate::arm::pmu::{evtyper, pmcr};
        let (vcpu, c) = pmu_vcpu(true);
        let v = vcpu.arm().unwrap();
        let nsh_only = evtyper::P | evtyper::U | evtyper::NSH | 0x08;
        assert_eq!(v.pmu_write(0xdf60, 2, nsh_only), Route::Handled(()));
        assert_eq!(v.pmu_write(0xdf40, 2, 0), Route::Handled(()));
        assert_eq!(v.pmu_write(0xdce1, 2, 1), Route::Handled(()));
        assert_eq!(v.pmu_write(0xdce0, 2, pmcr::E), Route::Handled(()));
        c.update(|c| c.events[1] += 40);
        let saved = v.pmu_save();
        assert_eq!(v.pmu_read(0xdf40, 2), Route::Handled(40));
        // The engine's totals need not survive (a fresh destination).
        c.update(|c| c.events[1] = 1_000);
        v.pmu_load(&saved);
        assert_eq!(v.pmu_read(0xdf40, 2), Route::Handled(40), "continues at 40");
        c.update(|c| c.events[1] += 2);
        assert_eq!(v.pmu_read(0xdf40, 2), Route::Handled(42));
    }

    #[test]
    fn arm64_has_no_init_a_requested_one_is_a_reset() {
        let vcpu = Vcpu::new(0, Arch::Aarch64);
        let a = vcpu.arm().unwrap();
        assert!(a.set_pvtime_base(0x90a_0040).is_ok());
        let st = [0xc500_0021, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(a.hvc_smc(true, st), Route::Handled([0x90a_0040, 0, 0, 0]));
        vcpu.reset(ResetKind::Init);
        assert!(!a.pvtime_active());
        vcpu.reset(ResetKind::Cold);
        assert_eq!(vcpu.resets(), 2, "no INIT pending to swallow the reset");
    }

    #[test]
    fn smccc_is_answered_on_arm64_and_pv_time_needs_the_machines_structure() {
        let vcpu = Vcpu::new(0, Arch::Aarch64);
        let a = vcpu.arm().unwrap();
        let version = [0x8000_0000, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            a.hvc_smc(false, version),
            Route::Handled([0x1_0001, 0, 0, 0])
        );
        let st = [0xc500_0021, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(a.hvc_smc(false, st), Route::Handled([u64::MAX, 0, 0, 0]));
        assert!(a.set_pvtime_base(0x90a_0040).is_ok());
        assert!(a.set_pvtime_base(0x90a_0080).is_err(), "set once");
        assert_eq!(a.hvc_smc(true, st), Route::Handled([0x90a_0040, 0, 0, 0]));
        assert!(a.pvtime_active());
        vcpu.reset(ResetKind::Cold);
        assert!(!a.pvtime_active(), "reset forgets the guest's use");
        a.load_pvtime_active(true);
        assert!(a.pvtime_active(), "loadvm restores it");
        assert!(
            Vcpu::new(0, Arch::X86_64).arm().is_none(),
            "no SMCCC on x86"
        );
    }
}
