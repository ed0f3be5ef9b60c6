//! An x86 vCPU: its state and the routing points QEMU calls on it (CPUID,
//! RDMSR/WRMSR, RDPMC, hypercalls, the TSC and its deadline timer).
//!
//! Every MSR access enters [`X86::rdmsr`] or [`X86::wrmsr`] once, which
//! applies the two rules of the MSR space in one place — KVM's
//! `kvm-pv-enforce-cpuid` (KVM_CAP_ENFORCE_PV_FEATURE_CPUID), then "not
//! ours: TCG's" — and hands it to exactly one model ([`MsrOwner`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::machine::Shared;
use crate::memory::{Gpa, GuestRam};
use crate::vcpu::{
    bump, CountingPtr, LocalCell, PmuClock, ResetKind, Route, RouteCounters, Unhalted, Vcpu,
};
use crate::x86::clock::{self, Timer, X86Clock};
use crate::x86::cpuid::{
    self, CPUID_8000_0001_ECX_PERFCTR_CORE, CPUID_8000_0022_EAX_PERFMON_V2,
    KVM_FEATURE_CLOCKSOURCE_STABLE_BIT,
};
use crate::x86::hypercall;
use crate::x86::lbr::{self, Branch, BranchKind, Lbr};
use crate::x86::pebs::{self, LinearMemory};
use crate::x86::pmu::{self, Counting, Events, Pmu, PmuConfig};
use crate::x86::poll_control::{PollControl, MSR_KVM_POLL_CONTROL};
use crate::x86::pv_eoi::{PvEoi, PvEoiState, MSR_KVM_PV_EOI_EN};
use crate::x86::steal::{StealTime, MSR_KVM_STEAL_TIME};
pub use crate::x86::SavedMsrs;

/// The x86 PMU's engine arguments: `pmu` from rustkvm.h (`RUSTKVM_PMU_*`).
pub const PMU_NONE: u32 = 0;
/// Intel architectural PMU version 2.
pub const PMU_INTEL: u32 = 1;
/// AMD PMU (legacy K7 counters; with the flags below, more).
pub const PMU_AMD: u32 = 2;
/// With PDCM: IA32_PERF_CAPABILITIES, full-width writes.
pub const PMU_FULL_WIDTH: u32 = 0x100;
/// AMD PerfCtrExtCore (CPUID 0x80000001 ECX bit 23).
pub const PMU_PERFCTR_CORE: u32 = 0x200;
/// AMD PerfMonV2 (CPUID 0x80000022 EAX bit 0).
pub const PMU_PERFMON_V2: u32 = 0x400;
/// Intel with PDCM: legacy LBR (PERF_CAPABILITIES.LBR_FMT 5, `x86::lbr`).
pub const PMU_LBR: u32 = 0x800;
/// Intel with PDCM, DS and DTES64: PEBS format 4 with the baseline
/// (`x86::pebs`).
pub const PMU_PEBS: u32 = 0x1000;
/// AMD with SVM (CPUID 0x80000001 ECX bit 2): event selects keep and honour
/// HostOnly/GuestOnly (`PmuConfig::host_guest`).
pub const PMU_SVM: u32 = 0x2000;

/// An x86 vCPU's state under its lock: steal time, the TSC and kvmclock,
/// poll control, PV EOI.
#[derive(Debug, Default)]
pub(crate) struct X86State {
    /// Steal time (MSR_KVM_STEAL_TIME).
    pub(crate) steal: StealTime,
    /// TSC, TSC_ADJUST, kvmclock, TSC-deadline.
    pub(crate) clock: X86Clock,
    /// MSR_KVM_POLL_CONTROL.
    pub(crate) poll_control: PollControl,
    /// MSR_KVM_PV_EOI_EN and the PV EOI protocol.
    pub(crate) pv_eoi: PvEoi,
}

/// An x86 vCPU's lock-free state (see [`LocalCell`]): the PMU.
#[derive(Debug, Default)]
pub(crate) struct X86Local {
    /// The PMU's registers.
    pmu: Pmu,
    /// The last branch records (with KVM's Intel PMU; see [`X86Local::lbr_routed`]).
    lbr: Lbr,
    /// Its unhalted cycles.
    unhalted: Unhalted,
    /// The counting engine's state in QEMU's CPU state (None: none).
    counting: Option<CountingPtr>,
    /// An INIT was applied ([`X86::reset`] with [`ResetKind::Init`]) and
    /// the `cpu_reset()` QEMU emulates the rest of it with is under way:
    /// its cold reset is skipped and its setup keeps the PMU.
    init_pending: bool,
}

impl PmuClock for X86Local {
    fn has_pmu(&self) -> bool {
        self.pmu.config.version != 0
    }
    fn unhalted(&mut self) -> &mut Unhalted {
        &mut self.unhalted
    }
}

impl X86Local {
    /// Whether IA32_DEBUGCTL and the LBR MSRs are the LBR model's: with
    /// KVM's Intel PMU (`vmx_set_msr`, `intel_pmu_is_valid_lbr_msr`),
    /// whether or not it has LBR; other vCPUs keep TCG's answers.
    fn lbr_routed(&self) -> bool {
        self.pmu.config.version != 0 && self.pmu.config.vendor == pmu::Vendor::Intel
    }

    /// Tell the engine whether blocks must report taken branches.
    fn publish_lbr(&mut self) {
        let recording = self.lbr.recording();
        if let Some(c) = self.counting() {
            c.set_lbr_recording(recording);
        }
    }

    /// The counting engine's state, if QEMU gave it.
    fn counting(&mut self) -> Option<&mut Counting> {
        // SAFETY: `self` is borrowed from the vCPU's `LocalCell::with`, and
        // the one reference made here lives no longer than that borrow.
        self.counting.map(|p| unsafe { p.get() })
    }

    /// The PMU's event totals now. Cycles need the VM clock, which costs
    /// more than the rest: they are 0 unless `cycles` (a counter counts
    /// them, or may start to with the access at hand).
    fn events(&mut self, shared: &Shared, cycles: bool) -> Events {
        let cycles = if cycles {
            self.unhalted.cycles(shared)
        } else {
            0
        };
        self.counting().map_or(
            Events {
                cycles,
                ref_cycles: cycles,
                ..Events::default()
            },
            |c| c.events(cycles),
        )
    }

    /// Tell the engine what the PMU needs now (and raise a PMI for `pmi`).
    fn publish(&mut self, shared: &Shared, ev: &Events, pmi: u64, routes: &RouteCounters) {
        if pmi != 0 {
            bump(&routes.pmi);
            // KVM freezes LBR when it delivers the PMI
            // (`intel_pmu_legacy_freezing_lbrs_on_pmi`).
            self.lbr.on_pmi();
        }
        // A cycle counter's PMI: when its wrap is due at the earliest (if
        // the vCPU halts meanwhile, the engine calls back early and the
        // deadline moves on).
        let deadline = self.pmu.cycles_until_overflow(ev).map_or(-1, |ticks| {
            let ns = shared
                .virtual_ns()
                .saturating_add(shared.tsc_rate().ns_for(ticks));
            i64::try_from(ns).unwrap_or(i64::MAX)
        });
        // SAFETY: as in `counting` (a copy of the pointer, so that the PMU
        // can be borrowed alongside).
        if let Some(c) = self.counting.map(|p| unsafe { p.get() }) {
            c.publish(&self.pmu, ev, pmi, self.lbr.recording());
            c.cycles_deadline_ns = deadline;
        }
    }
}

/// An x86 vCPU's own state (the core is [`Vcpu`]).
#[derive(Debug, Default)]
pub struct X86Vcpu {
    // Touched by the vCPU's own thread on every routed access and, rarely, by
    // the main thread (introspection, exit report): never contended in practice.
    state: Mutex<X86State>,
    // The PMU, without a lock (see LocalCell).
    pub(crate) local: LocalCell<X86Local>,
    // Set by another vCPU's KVM_HC_KICK_CPU, consumed by this vCPU's HLT.
    pv_unhalt: AtomicBool,
    // The KVM feature bits its CPUID advertises (set at reset).
    kvm_features: AtomicU32,
    // `kvm-pv-enforce-cpuid`: PV MSRs and hypercalls not advertised
    // fault / return -KVM_ENOSYS (KVM_CAP_ENFORCE_PV_FEATURE_CPUID).
    pv_enforce: AtomicBool,
}

impl X86Vcpu {
    /// The state under the lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, X86State> {
        self.state.lock()
    }
}

/// The model that owns an MSR rustkvm implements: each declares its MSRs,
/// and [`X86::rdmsr`]/[`X86::wrmsr`] look the owner up once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsrOwner {
    /// The PMU: its architectural, AMD and legacy MSRs
    /// ([`pmu::is_arch_pmu_msr`]).
    Pmu,
    /// Steal time: MSR_KVM_STEAL_TIME.
    StealTime,
    /// The TSC: IA32_TSC, IA32_TSC_ADJUST, IA32_TSC_DEADLINE.
    Tsc,
    /// kvmclock: MSR_KVM_SYSTEM_TIME(_NEW) (per vCPU).
    Kvmclock,
    /// kvmclock's wall clock: MSR_KVM_WALL_CLOCK(_NEW) (one per VM).
    WallClock,
    /// MSR_KVM_POLL_CONTROL.
    PollControl,
    /// MSR_KVM_PV_EOI_EN.
    PvEoi,
    /// IA32_DEBUGCTL and the LBR MSRs ([`Lbr::owns`]).
    Lbr,
}

impl MsrOwner {
    /// The owner of MSR `index`; None: not rustkvm's (TCG's).
    pub fn of(index: u32) -> Option<Self> {
        Some(match index {
            i if pmu::is_arch_pmu_msr(i) => MsrOwner::Pmu,
            MSR_KVM_STEAL_TIME => MsrOwner::StealTime,
            clock::MSR_IA32_TSC | clock::MSR_IA32_TSC_ADJUST | clock::MSR_IA32_TSC_DEADLINE => {
                MsrOwner::Tsc
            }
            clock::MSR_KVM_SYSTEM_TIME | clock::MSR_KVM_SYSTEM_TIME_NEW => MsrOwner::Kvmclock,
            clock::MSR_KVM_WALL_CLOCK | clock::MSR_KVM_WALL_CLOCK_NEW => MsrOwner::WallClock,
            MSR_KVM_POLL_CONTROL => MsrOwner::PollControl,
            MSR_KVM_PV_EOI_EN => MsrOwner::PvEoi,
            i if Lbr::owns(i) => MsrOwner::Lbr,
            _ => return None,
        })
    }
}

/// An x86 vCPU's routing points: the core and the x86 state together
/// ([`Vcpu::x86`]).
#[derive(Debug, Clone, Copy)]
pub struct X86<'a> {
    vcpu: &'a Vcpu,
    x: &'a X86Vcpu,
}

impl<'a> X86<'a> {
    pub(crate) fn new(vcpu: &'a Vcpu, x: &'a X86Vcpu) -> Self {
        X86 { vcpu, x }
    }

    fn shared(&self) -> &'a Shared {
        &self.vcpu.shared
    }

    fn routes(&self) -> &'a RouteCounters {
        &self.vcpu.routes
    }

    /// The lock-free part (see [`LocalCell`]); `f` must not call back into
    /// it (that panics).
    fn local<R>(&self, f: impl FnOnce(&mut X86Local) -> R) -> R {
        self.x.local.with(f)
    }

    /// A reset of `kind`, as KVM's `kvm_vcpu_reset(vcpu, init_event)`.
    /// Both kinds turn steal time, kvmclock and a pending KICK_CPU off, and
    /// disarm the TSC-deadline timer; a cold reset also puts the TSC back on
    /// the VM's timeline, clears IA32_TSC_ADJUST and (when this vCPU
    /// advertises kvmclock) the VM's MSR_KVM_WALL_CLOCK, as QEMU writes its
    /// reset MSRs into KVM (`kvm_put_msrs` at `KVM_PUT_RESET_STATE`). The
    /// PMU is reset by the setup after a cold reset ([`X86::setup`]).
    ///
    /// QEMU emulates an INIT with a full `cpu_reset()` right after telling
    /// Rust (`do_cpu_init`): until the setup that ends that reset, a cold
    /// reset is part of the INIT and changes nothing, and the setup keeps the
    /// PMU as it is. Returns whether the reset counts as one.
    pub(crate) fn reset(&self, kind: ResetKind) -> bool {
        if kind == ResetKind::Cold && self.local(|l| l.init_pending) {
            return false;
        }
        let mut s = self.x.lock();
        s.steal.reset(kind);
        s.clock.reset(kind);
        // KVM's kvm_lapic_reset clears PV EOI on INIT and RESET alike.
        s.pv_eoi.reset();
        if kind == ResetKind::Cold {
            // QEMU's reset value (KVM's own reset leaves it alone).
            s.poll_control = PollControl::default();
        }
        drop(s);
        self.x.pv_unhalt.store(false, Ordering::Relaxed);
        match kind {
            ResetKind::Init => self.local(|l| l.init_pending = true),
            ResetKind::Cold => {
                let kvmclock = cpuid::KVM_FEATURE_CLOCKSOURCE | cpuid::KVM_FEATURE_CLOCKSOURCE2;
                if self.x.kvm_features.load(Ordering::Relaxed) & kvmclock != 0 {
                    self.shared().wall_clock_msr.store(0, Ordering::Relaxed);
                }
            }
        }
        true
    }

    /// Restore MSR_KVM_STEAL_TIME from a saved machine (loadvm, incoming
    /// migration). A value KVM would refuse (reserved bits) turns it off;
    /// accounting restarts from the next entry, as KVM's does.
    pub fn load_steal_time_msr(&self, value: u64) {
        let mut s = self.x.lock();
        s.steal = StealTime::default();
        if s.steal.write_msr(value).is_err() {
            s.steal = StealTime::default();
        }
    }

    /// CPUID `leaf`/`subleaf`; `tcg` is TCG's answer (EAX, EBX, ECX, EDX).
    pub fn cpuid(&self, leaf: u32, _subleaf: u32, tcg: [u32; 4]) -> Route<[u32; 4]> {
        bump(&self.routes().cpuid);
        let config = self.local(|l| l.pmu.config);
        let amd = config.version != 0 && config.vendor == pmu::Vendor::Amd;
        match leaf {
            0xa if config.version != 0 && !amd => Route::Handled(config.cpuid_0xa()),
            // PerfCtrExtCore only with the AMD PMU that has it (KVM drops
            // the bit without a PMU).
            0x8000_0001
                if tcg[2] & CPUID_8000_0001_ECX_PERFCTR_CORE != 0
                    && !(amd && config.perfctr_core) =>
            {
                let mut r = tcg;
                r[2] &= !CPUID_8000_0001_ECX_PERFCTR_CORE;
                Route::Handled(r)
            }
            // PDCM (IA32_PERF_CAPABILITIES) only with the Intel PMU that has
            // the MSR (an AMD model with pmu=on would show it otherwise);
            // DS and DTES64 (the DS save area) only with PEBS, as KVM offers
            // them only where it offers PEBS (`vmx_set_cpu_caps`).
            1 => {
                let mut r = tcg;
                if !(config.version != 0 && !amd && config.full_width_writes) {
                    r[2] &= !cpuid::CPUID_1_ECX_PDCM;
                }
                if !config.pebs {
                    r[2] &= !cpuid::CPUID_1_ECX_DTES64;
                    r[3] &= !cpuid::CPUID_1_EDX_DS;
                }
                if r == tcg {
                    Route::Unhandled
                } else {
                    Route::Handled(r)
                }
            }
            // PerfMonV2 and its number of core counters (EBX[3:0]).
            0x8000_0022 if amd && config.version >= 2 => {
                Route::Handled([CPUID_8000_0022_EAX_PERFMON_V2, u32::from(config.gp), 0, 0])
            }
            _ => Route::Unhandled,
        }
    }

    /// The local APIC acknowledged `vector` (`level`: its TMR bit), for
    /// PV EOI.
    pub fn apic_acked(&self, vector: u8, level: bool) {
        self.x.lock().pv_eoi.acked(vector, level);
    }

    /// The local APIC did an EOI.
    pub fn apic_eoied(&self) {
        self.x.lock().pv_eoi.eoied();
    }

    /// The local APIC looks at its state (see [`crate::x86::pv_eoi`]),
    /// after an interrupt event or not: true if it must do an EOI now,
    /// one the guest made in memory.
    pub fn pv_eoi_sync(&self, irr_pending: bool, event: bool) -> bool {
        let ram = GuestRam::new(&*self.shared().host);
        let eoi = self.x.lock().pv_eoi.sync(ram, irr_pending, event);
        if eoi {
            bump(&self.routes().pv_eoi);
        }
        eoi
    }

    /// CPUID leaf 0x15, 0x16 or 0x40000010 from the VM's one TSC rate
    /// ([`cpuid::tsc_leaf`]); QEMU asks only for a leaf in range that the
    /// CPU model gets.
    pub fn tsc_cpuid(&self, leaf: u32) -> [u32; 4] {
        cpuid::tsc_leaf(leaf, self.shared().tsc_rate())
    }

    /// The owner of MSR `index` after the MSR space's rules, which apply
    /// here and nowhere else: a PV MSR whose feature `kvm-pv-enforce-cpuid`
    /// hides faults (KVM's `guest_pv_has`), whether or not rustkvm
    /// implements it; an MSR of KVM's range no model owns faults (KVM
    /// #GPs on what it does not implement; TCG would read 0 and drop the
    /// write); any other MSR no model owns is TCG's.
    fn msr_owner<T>(&self, index: u32) -> Result<MsrOwner, Route<T>> {
        let allowed = cpuid::pv_msr_feature(index).is_none_or(|f| self.pv_enforced().allows(f));
        match MsrOwner::of(index) {
            _ if !allowed => Err(Route::Fault),
            Some(owner) => Ok(owner),
            None if cpuid::is_kvm_msr(index) => Err(Route::Fault),
            None => Err(Route::Unhandled),
        }
    }

    /// RDMSR.
    pub fn rdmsr(&self, index: u32) -> Route<u64> {
        bump(&self.routes().rdmsr);
        let owner = match self.msr_owner(index) {
            Ok(owner) => owner,
            Err(r) => return r,
        };
        let shared = self.shared();
        if owner == MsrOwner::Lbr {
            return self.local(|l| match l.lbr_routed() {
                false => Route::Unhandled,
                true => l.lbr.read_msr(index).map_or(Route::Fault, Route::Handled),
            });
        }
        if owner == MsrOwner::Pmu {
            return self.local(|l| {
                let ev = l.events(shared, l.pmu.counts_cycles());
                match l.pmu.read_msr(index, &ev) {
                    Some(v) => Route::Handled(v),
                    // Not this PMU's: KVM still reads the legacy ones as 0.
                    None if !l.pmu.claims(index) && pmu::kvm_reads_as_zero(index) => {
                        Route::Handled(0)
                    }
                    None => Route::Fault,
                }
            });
        }
        let s = self.x.lock();
        Route::Handled(match index {
            MSR_KVM_STEAL_TIME => s.steal.msr,
            clock::MSR_IA32_TSC => s.clock.tsc(shared.tsc_rate(), shared.virtual_ns()),
            clock::MSR_IA32_TSC_ADJUST => s.clock.tsc_adjust,
            clock::MSR_IA32_TSC_DEADLINE => s.clock.read_deadline(),
            clock::MSR_KVM_SYSTEM_TIME | clock::MSR_KVM_SYSTEM_TIME_NEW => s.clock.system_time_msr,
            MSR_KVM_POLL_CONTROL => s.poll_control.msr(),
            MSR_KVM_PV_EOI_EN => s.pv_eoi.msr(),
            // (MsrOwner::WallClock; the PMU and LBR returned above.)
            _ => shared.wall_clock_msr.load(Ordering::Relaxed),
        })
    }

    /// The vCPU entered or left SVM guest mode (VMRUN, #VMEXIT), with
    /// EFER.SVME `svme`: counters with HostOnly/GuestOnly start or stop
    /// (`Pmu::set_svm`).
    pub fn svm_mode(&self, svme: bool, guest: bool) {
        let (shared, routes) = (self.shared(), self.routes());
        self.local(|l| {
            if !l.pmu.config.host_guest {
                return;
            }
            // With the cycles: a cycle counter may start counting here,
            // and its base must be the cycles now.
            let ev = l.events(shared, true);
            let pmi = l.pmu.set_svm(pmu::SvmMode { svme, guest }, &ev);
            l.publish(shared, &ev, pmi, routes);
        });
    }

    /// WRMSR.
    pub fn wrmsr(&self, index: u32, value: u64) -> Route<()> {
        bump(&self.routes().wrmsr);
        let owner = match self.msr_owner(index) {
            Ok(owner) => owner,
            Err(r) => return r,
        };
        let timer = match owner {
            MsrOwner::Pmu => return self.pmu_wrmsr(index, value),
            MsrOwner::Lbr => {
                return self.local(|l| {
                    if !l.lbr_routed() {
                        return Route::Unhandled;
                    }
                    let r = l.lbr.write_msr(index, value);
                    l.publish_lbr();
                    r.map_or(Route::Fault, Route::Handled)
                })
            }
            MsrOwner::StealTime => {
                let mut s = self.x.lock();
                if s.steal.write_msr(value).is_err() {
                    return Route::Fault;
                }
                // KVM requests a steal-time update on the write
                // (KVM_REQ_STEAL_UPDATE): the structure is valid as soon as
                // the guest runs again.
                self.vcpu.enter_steal(&mut s.steal);
                Timer::Unchanged
            }
            MsrOwner::Tsc => self.tsc_wrmsr(index, value),
            MsrOwner::Kvmclock => {
                self.kvmclock_wrmsr(index, value);
                Timer::Unchanged
            }
            MsrOwner::WallClock => {
                let shared = self.shared();
                shared.wall_clock_msr.store(value, Ordering::Relaxed);
                let (real, vm) = shared.real_and_vm_ns();
                clock::write_wall_clock(&*shared.host, value, vm, real);
                Timer::Unchanged
            }
            MsrOwner::PollControl => {
                if self.x.lock().poll_control.write_msr(value).is_err() {
                    return Route::Fault;
                }
                Timer::Unchanged
            }
            MsrOwner::PvEoi => {
                let ram = GuestRam::new(&*self.shared().host);
                if self.x.lock().pv_eoi.write_msr(ram, value).is_err() {
                    return Route::Fault;
                }
                Timer::Unchanged
            }
        };
        if timer == Timer::Changed {
            self.shared().host.tsc_deadline_changed(self.vcpu.index());
        }
        Route::Handled(())
    }

    /// A PMU MSR write.
    fn pmu_wrmsr(&self, index: u32, value: u64) -> Route<()> {
        let (shared, routes) = (self.shared(), self.routes());
        self.local(|l| {
            if let Some(r) = l.pmu.write_quiet(index, value) {
                return r.map_or(Route::Fault, Route::Handled);
            }
            // The clock only if a cycle counter counts or may start to.
            let cycles = l.pmu.counts_cycles() || pmu::may_start_cycles(index, value);
            let ev = l.events(shared, cycles);
            // The counters catch up first, so that a write refused below
            // (#GP) still delivers the PMI of an overflow it found.
            let due = l.pmu.sync(&ev);
            let route = match l.pmu.write_msr(index, value, &ev) {
                Ok(pmi) => {
                    l.publish(shared, &ev, due | pmi, routes);
                    return Route::Handled(());
                }
                // Not this PMU's: KVM still ignores writes to the legacy ones.
                Err(_) if !l.pmu.claims(index) && pmu::kvm_reads_as_zero(index) => {
                    Route::Handled(())
                }
                Err(_) => Route::Fault,
            };
            if due != 0 {
                l.publish(shared, &ev, due, routes);
            }
            route
        })
    }

    /// IA32_TSC, IA32_TSC_ADJUST, IA32_TSC_DEADLINE.
    fn tsc_wrmsr(&self, index: u32, value: u64) -> Timer {
        let shared = self.shared();
        let (rate, mem) = (shared.tsc_rate(), &*shared.host);
        let mut s = self.x.lock();
        match index {
            clock::MSR_IA32_TSC_DEADLINE => s.clock.write_deadline(value),
            _ => {
                let t = if index == clock::MSR_IA32_TSC {
                    s.clock.write_tsc(rate, shared.virtual_ns(), value)
                } else {
                    s.clock.write_tsc_adjust(value)
                };
                // KVM_REQ_CLOCK_UPDATE: kvmclock follows the new TSC.
                s.clock.write_pvclock(mem, rate, self.kvmclock_stable());
                t
            }
        }
    }

    /// MSR_KVM_SYSTEM_TIME(_NEW).
    fn kvmclock_wrmsr(&self, index: u32, value: u64) {
        let shared = self.shared();
        let (rate, mem) = (shared.tsc_rate(), &*shared.host);
        let mut s = self.x.lock();
        s.clock.system_time_msr = value;
        let old = index == clock::MSR_KVM_SYSTEM_TIME;
        // `kvm_write_system_time`: vCPU 0's choice of MSR decides whether
        // the VM's kvmclock can be stable (the master clock needs the new
        // one); a change rewrites every vCPU's.
        let changed = self.vcpu.index() == 0
            && shared
                .old_kvmclock_on_boot_vcpu
                .swap(old, Ordering::Relaxed)
                != old;
        s.clock.write_pvclock(mem, rate, self.kvmclock_stable());
        drop(s);
        if changed {
            shared.for_each_peer(|peer| {
                if let Some(p) = peer.x86().filter(|_| peer.index() != self.vcpu.index()) {
                    let stable = p.kvmclock_stable();
                    p.x.lock().clock.write_pvclock(mem, rate, stable);
                }
            });
        }
    }

    /// A taken branch a block reports while LBR records (`kind` from
    /// rustkvm.h's `RUSTKVM_LBR_*`; another number is dropped).
    pub fn lbr_branch(&self, from: u64, to: u64, kind: u32, cpl: u32) {
        let Some(kind) = BranchKind::from_abi(kind) else {
            return;
        };
        let cpl = cpl.min(3) as u8;
        self.local(|l| {
            l.lbr.record(Branch {
                from,
                to,
                kind,
                cpl,
            })
        });
    }

    /// PEBS records are owed (`Counting::pebs_due`): write one, made of
    /// `s` (the vCPU's registers at the boundary after the instruction
    /// that overflowed) with this vCPU's TSC and LBR records, naming every
    /// PEBS counter that overflowed, and reload them from their
    /// pebs_event_reset; a record that reaches the threshold raises the
    /// PMI. A DS area or buffer that is not mapped RAM gets nothing
    /// written (the counters reload where their reset values can be read).
    pub fn pebs_write(&self, mut s: pebs::Sample) {
        let (shared, routes) = (self.shared(), self.routes());
        s.tsc = self.rdtsc();
        let index = self.vcpu.index();
        self.local(|l| {
            let owed = l.pmu.take_pebs_overflows();
            let Some(first) = pmu::Pmu::counters_in(owed).next() else {
                return;
            };
            s.lbr = l.lbr.newest_first();
            let mut mem = VcpuLinear {
                host: &*shared.host,
                index,
            };
            let adaptive = l.pmu.adaptive(first);
            let written = l
                .pmu
                .pebs()
                .overflow(&mut mem, first.pebs(), adaptive, owed, &s);
            let ev = l.events(shared, l.pmu.counts_cycles());
            for c in pmu::Pmu::counters_in(owed) {
                if let Some(v) = l.pmu.pebs().reset_value(&mut mem, c.pebs()) {
                    l.pmu.pebs_reload(c, v, &ev);
                }
            }
            let pmi = match written {
                Ok(w) if w.interrupt && l.pmu.pebs_threshold_reached() => {
                    pebs::GLOBAL_STATUS_BUFFER_OVF
                }
                _ => 0,
            };
            l.publish(shared, &ev, pmi, routes);
        });
    }

    /// The PMI budget ran out (see `rustkvm_x86_pmu_due`): sync, publish.
    pub(crate) fn pmu_due(&self) {
        let (shared, routes) = (self.shared(), self.routes());
        self.local(|l| {
            let ev = l.events(shared, l.pmu.counts_cycles());
            let pmi = l.pmu.sync(&ev);
            l.publish(shared, &ev, pmi, routes);
        });
    }

    /// The enforcement the hypercalls and PV MSRs see.
    fn pv_enforced(&self) -> hypercall::Enforce {
        hypercall::Enforce(
            self.x
                .pv_enforce
                .load(Ordering::Relaxed)
                .then(|| self.x.kvm_features.load(Ordering::Relaxed)),
        )
    }

    /// Whether a KVM_VCPU_FLUSH_TLB the guest set is honoured: KVM's
    /// `record_steal_time` flushes only if `guest_pv_has(vcpu,
    /// KVM_FEATURE_PV_TLB_FLUSH)` — always without enforcement, else when
    /// advertised.
    pub fn pv_tlb_flush_on(&self) -> bool {
        self.pv_enforced().allows(cpuid::KVM_FEATURE_PV_TLB_FLUSH)
    }

    /// After each setup: whether PV CPUID is enforced
    /// (`-cpu ...,kvm-pv-enforce-cpuid=on`).
    pub fn enforce_pv_cpuid(&self, on: bool) {
        self.x.pv_enforce.store(on, Ordering::Relaxed);
    }

    /// PVCLOCK_TSC_STABLE_BIT for this vCPU's kvmclock: advertised, and
    /// KVM's master clock possible (vCPU 0 not on the legacy MSR).
    fn kvmclock_stable(&self) -> bool {
        self.x.kvm_features.load(Ordering::Relaxed) & KVM_FEATURE_CLOCKSOURCE_STABLE_BIT != 0
            && !self
                .shared()
                .old_kvmclock_on_boot_vcpu
                .load(Ordering::Relaxed)
    }

    /// After each reset: the CPU model's TSC frequency (0: default; the
    /// first vCPU's sets the VM's), advertised KVM feature bits, the PMU
    /// (`PMU_*`) and the counting engine's state (reset here; None: no
    /// engine, the PMU then only sees cycles). After an INIT
    /// ([`ResetKind::Init`]) the PMU and the engine's state are kept.
    pub fn setup(&self, tsc_khz: u64, kvm_features: u32, pmu: u32, counting: Option<CountingPtr>) {
        let (shared, routes) = (self.shared(), self.routes());
        shared.set_tsc_khz(tsc_khz);
        self.x.kvm_features.store(kvm_features, Ordering::Relaxed);
        let n = shared.pmu_counters();
        let config = if pmu & 0xff == PMU_INTEL {
            PmuConfig {
                gp: if n == 0 { PmuConfig::TCG.gp } else { n },
                full_width_writes: pmu & PMU_FULL_WIDTH != 0,
                // LBR_FMT is a PERF_CAPABILITIES field: only with PDCM.
                lbr_format: if pmu & (PMU_FULL_WIDTH | PMU_LBR) == PMU_FULL_WIDTH | PMU_LBR {
                    lbr::LBR_FORMAT_INFO as u8
                } else {
                    0
                },
                // PEBS's fields are PERF_CAPABILITIES's too.
                pebs: pmu & (PMU_FULL_WIDTH | PMU_PEBS) == PMU_FULL_WIDTH | PMU_PEBS,
                ..PmuConfig::TCG
            }
        } else if pmu & 0xff == PMU_AMD {
            let gp = if n == 0 { pmu::MAX_AMD_GP as u8 } else { n };
            PmuConfig {
                host_guest: pmu & PMU_SVM != 0,
                ..PmuConfig::amd(pmu & PMU_PERFCTR_CORE != 0, pmu & PMU_PERFMON_V2 != 0, gp)
            }
        } else {
            PmuConfig::OFF
        };
        self.local(|l| {
            let init = std::mem::take(&mut l.init_pending);
            if init && l.pmu.config == config && l.counting == counting {
                // INIT: the PMU keeps its registers and goes on counting
                // (KVM has no PMU reset on INIT); tell the engine again
                // what it needs, as QEMU's reset stopped counting blocks.
                // INIT clears EFER and leaves SVM guest mode: HostOnly and
                // GuestOnly counters stop (QEMU's do_cpu_init).
                let ev = l.events(shared, true);
                let pmi = l.pmu.set_svm(pmu::SvmMode::default(), &ev);
                l.publish(shared, &ev, pmi, routes);
                return;
            }
            *l = X86Local {
                pmu: Pmu::new(config),
                lbr: Lbr::new(config.lbr_format != 0),
                counting,
                ..X86Local::default()
            };
            if let Some(c) = l.counting() {
                *c = Counting::default();
            }
        });
    }

    /// RDTSC: the guest TSC now.
    pub fn rdtsc(&self) -> u64 {
        let shared = self.shared();
        let now = shared.virtual_ns();
        self.x.lock().clock.tsc(shared.tsc_rate(), now)
    }

    /// The LVT timer register was written (`restore`: from a saved machine).
    pub fn lvtt_write(&self, lvt: u32, restore: bool) {
        let mut s = self.x.lock();
        if restore {
            s.clock.lvtt_mode = ((lvt >> clock::LVT_TIMER_MODE_SHIFT) & 3) as u8;
            return;
        }
        let changed = s.clock.write_lvtt(lvt);
        drop(s);
        if changed == Timer::Changed {
            self.shared().host.tsc_deadline_changed(self.vcpu.index());
        }
    }

    /// When the TSC-deadline timer is due (VM ns), if armed.
    pub fn tsc_deadline_ns(&self) -> Option<u64> {
        let shared = self.shared();
        let now = shared.virtual_ns();
        self.x.lock().clock.deadline_ns(shared.tsc_rate(), now)
    }

    /// The APIC timer went off: whether the deadline was reached (disarmed).
    pub fn tsc_deadline_fire(&self) -> bool {
        let shared = self.shared();
        let now = shared.virtual_ns();
        self.x.lock().clock.deadline_expired(shared.tsc_rate(), now)
    }

    /// The MSRs QEMU saves.
    pub fn save_msrs(&self) -> SavedMsrs {
        let shared = self.shared();
        let s = self.x.lock();
        SavedMsrs {
            steal_time: s.steal.msr,
            tsc: s.clock.tsc(shared.tsc_rate(), shared.virtual_ns()),
            tsc_adjust: s.clock.tsc_adjust,
            tsc_deadline: s.clock.tsc_deadline,
            system_time: s.clock.system_time_msr,
            wall_clock: shared.wall_clock_msr.load(Ordering::Relaxed),
            poll_control: s.poll_control.msr(),
            pv_eoi: s.pv_eoi.msr(),
            pv_eoi_state: s.pv_eoi.state().code(),
            pmu: self.local(|l| {
                let ev = l.events(shared, l.pmu.counts_cycles());
                l.pmu.save(&ev)
            }),
            lbr: self.local(|l| l.lbr.save()),
            pebs: self.local(|l| l.pmu.pebs().save()),
        }
    }

    /// Take them back after QEMU loaded the vCPU (loadvm, incoming
    /// migration): host-initiated writes, which do not move TSC_ADJUST or
    /// rewrite the wall clock; kvmclock is rewritten for the restored TSC.
    pub fn load_msrs(&self, m: &SavedMsrs) {
        self.load_steal_time_msr(m.steal_time);
        let (shared, routes) = (self.shared(), self.routes());
        let (rate, now) = (shared.tsc_rate(), shared.virtual_ns());
        let mut s = self.x.lock();
        s.clock.restore_tsc(rate, now, m.tsc);
        s.clock.tsc_adjust = m.tsc_adjust;
        s.clock.tsc_deadline = m.tsc_deadline;
        s.clock.system_time_msr = m.system_time;
        s.clock
            .write_pvclock(&*shared.host, rate, self.kvmclock_stable());
        shared.wall_clock_msr.store(m.wall_clock, Ordering::Relaxed);
        s.poll_control = PollControl::load(m.poll_control);
        let ram = GuestRam::new(&*shared.host);
        s.pv_eoi
            .load(ram, m.pv_eoi, PvEoiState::from_code(m.pv_eoi_state));
        drop(s);
        self.local(|l| {
            let ev = l.events(shared, true);
            l.pmu.load(&m.pmu, &ev);
            l.lbr.load(&m.lbr);
            l.pmu.pebs_load(&m.pebs);
            l.publish(shared, &ev, 0, routes);
        });
    }

    /// RDPMC (the CR4.PCE/CPL #GP rule has already been applied by QEMU).
    pub fn rdpmc(&self, ecx: u32) -> Route<u64> {
        bump(&self.routes().rdpmc);
        let shared = self.shared();
        self.local(|l| {
            let ev = l.events(shared, l.pmu.counts_cycles());
            // With no PMU KVM's kvm_pmu_rdpmc fails too: #GP (TCG: #UD).
            l.pmu.rdpmc(ecx, &ev).map_or(Route::Fault, Route::Handled)
        })
    }

    /// A KVM hypercall (VMCALL/VMMCALL). IPIs are sent here; kicks and
    /// yields are left to the accelerator.
    #[inline]
    pub fn hypercall(&self, call: hypercall::Call) -> hypercall::Outcome {
        bump(&self.routes().hypercall);
        hypercall::handle(call, self.pv_enforced(), &mut HypercallServices(*self))
    }

    /// Record a KVM_HC_KICK_CPU aimed at this vCPU.
    pub fn pv_kick(&self) {
        self.x.pv_unhalt.store(true, Ordering::Release);
    }

    /// Consume a pending kick: true if one was pending.
    pub fn take_pv_unhalt(&self) -> bool {
        self.x.pv_unhalt.swap(false, Ordering::AcqRel)
    }

    /// The PMU this vCPU has, for `x-query-rustkvm`.
    pub fn pmu_shape(&self) -> crate::info::X86PmuShape {
        self.local(|l| crate::info::X86PmuShape::from_config(l.pmu.config))
    }
}

/// A vCPU's linear memory: its paging now (QEMU's walk) onto guest RAM.
struct VcpuLinear<'a> {
    host: &'a dyn crate::memory::Host,
    index: u32,
}

impl VcpuLinear<'_> {
    /// The guest-physical pieces of `len` bytes at `addr`, page by page;
    /// None unless every page is mapped.
    fn pieces(&self, addr: u64, len: u64) -> Option<Vec<(Gpa, usize)>> {
        const PAGE: u64 = 4096;
        let mut out = Vec::new();
        let mut at = addr;
        let end = addr.checked_add(len)?;
        while at < end {
            let n = (PAGE - at % PAGE).min(end - at);
            out.push((
                Gpa(self.host.x86_linear_to_gpa(self.index, at)?),
                n as usize,
            ));
            at += n;
        }
        Some(out)
    }
}

impl LinearMemory for VcpuLinear<'_> {
    fn read_u64(&mut self, addr: u64) -> Option<u64> {
        let ram = GuestRam::new(self.host);
        let mut b = [0u8; 8];
        let mut off = 0;
        for (gpa, n) in self.pieces(addr, 8)? {
            if !ram.read(gpa, &mut b[off..off + n]) {
                return None;
            }
            off += n;
        }
        Some(u64::from_le_bytes(b))
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        self.pieces(addr, bytes.len() as u64)
            .is_some_and(|pieces| write_pieces(GuestRam::new(self.host), &pieces, bytes))
    }
}

/// Write `bytes` over `pieces` (guest-physical, in order) all or nothing:
/// a piece that is not writable RAM (ROM reads but refuses writes) leaves
/// the pieces before it as they were.
fn write_pieces(ram: GuestRam<'_>, pieces: &[(Gpa, usize)], bytes: &[u8]) -> bool {
    // What each piece held: every piece must be RAM before any is written,
    // and the old bytes go back if a later one refuses the write.
    let mut old = vec![0u8; bytes.len()];
    let mut off = 0;
    for &(gpa, n) in pieces {
        if !ram.read(gpa, &mut old[off..off + n]) {
            return false;
        }
        off += n;
    }
    let mut off = 0;
    for (i, &(gpa, n)) in pieces.iter().enumerate() {
        if !ram.write(gpa, &bytes[off..off + n]) {
            let mut back = 0;
            for &(gpa, n) in &pieces[..i] {
                ram.write(gpa, &old[back..back + n]);
                back += n;
            }
            return false;
        }
        off += n;
    }
    true
}

/// The vCPU as the hypercall handler sees it.
struct HypercallServices<'a>(X86<'a>);

impl hypercall::Services for HypercallServices<'_> {
    fn send_ipi(&mut self, apic_id: u32, icr: u32) -> bool {
        self.0.shared().host.send_ipi(apic_id, icr)
    }

    /// `struct kvm_clock_pairing` (64 bytes): sec, nsec, tsc, flags 0, pad.
    fn clock_pairing(&mut self, gpa: u64) -> bool {
        let shared = self.0.shared();
        let (real, now) = shared.real_and_vm_ns();
        let tsc = self.0.x.lock().clock.tsc(shared.tsc_rate(), now);
        let pairing = clock::KvmClockPairing {
            sec: (real / 1_000_000_000) as i64,
            nsec: (real % 1_000_000_000) as i64,
            tsc,
            ..Default::default()
        };
        GuestRam::new(&*shared.host).write(Gpa(gpa), &pairing.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    /// RAM whose page at `rom` reads but refuses writes (a ROM).
    struct RomPage {
        ram: crate::memory::tests::FakeRam,
        rom: u64,
    }

    #[allow(clippy::disallowed_methods, reason = "a GuestMemory implementation")]
    impl crate::memory::GuestMemory for RomPage {
        fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
            self.ram.read(gpa, buf)
        }
        fn write(&self, gpa: u64, buf: &[u8]) -> bool {
            gpa / 4096 != self.rom / 4096 && self.ram.write(gpa, buf)
        }
        fn store_u32(&self, _gpa: u64, _value: u32) -> bool {
            false
        }
        fn store_u64(&self, _gpa: u64, _value: u64) -> bool {
            false
        }
        fn xchg_u8(&self, _gpa: u64, _value: u8) -> Option<u8> {
            None
        }
    }

    #[test]
    fn a_write_straddling_ram_and_rom_leaves_the_ram_as_it_was() {
        let mem = RomPage {
            ram: crate::memory::tests::FakeRam::new(3 * 4096),
            rom: 4096,
        };
        let ram = GuestRam::new(&mem);
        assert!(GuestRam::new(&mem.ram).write(Gpa(4096 - 8), &[0x11; 8]));
        // 16 bytes: 8 at the end of page 0 (RAM), 8 at the start of page 1 (ROM).
        let pieces = [(Gpa(4096 - 8), 8), (Gpa(4096), 8)];
        assert!(!write_pieces(ram, &pieces, &[0xee; 16]), "refused");
        let mut b = [0u8; 8];
        assert!(ram.read(Gpa(4096 - 8), &mut b));
        assert_eq!(b, [0x11; 8], "the RAM piece is as it was");
        // Both pieces RAM: written.
        let pieces = [(Gpa(8), 8), (Gpa(16), 8)];
        assert!(write_pieces(ram, &pieces, &[0xee; 16]));
        let mut b = [0u8; 16];
        assert!(ram.read(Gpa(8), &mut b));
        assert_eq!(b, [0xee; 16]);
    }

    use super::*;
    use crate::machine::Arch;
    use crate::vcpu::TestCounting;

    #[test]
    fn no_feature_claims_anything_yet() {
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        assert_eq!(v.cpuid(0x4000_0000, 0, [1, 2, 3, 4]), Route::Unhandled);
        assert_eq!(v.rdmsr(0x1b), Route::Unhandled);
        assert_eq!(v.wrmsr(0x1b, 0x1001), Route::Unhandled);
        assert_eq!(v.rdpmc(0x4000_0000), Route::Fault, "no PMU: #GP as KVM");
        assert_eq!(v.rdmsr(0x188), Route::Fault, "no PMU: its MSRs #GP ...");
        assert_eq!(v.wrmsr(0x38f, 1), Route::Fault);
        assert_eq!(
            v.rdmsr(0x186),
            Route::Handled(0),
            "... but the legacy ones read 0"
        );
        assert_eq!(
            v.wrmsr(0xc1, 5),
            Route::Handled(()),
            "... and ignore writes"
        );
        assert_eq!(v.rdmsr(0xc1), Route::Handled(0));
    }

    #[test]
    fn the_pmu_reads_the_engines_totals_and_publishes_what_it_needs() {
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        let c = TestCounting::new(Counting {
            events: [7; 12],
            budget: 3,
            ..Counting::default()
        });
        v.setup(0, 0, PMU_INTEL, c.ptr());
        assert_eq!(c.get(), Counting::default(), "setup resets the engine");
        let Route::Handled(leaf) = v.cpuid(0xa, 0, [0; 4]) else {
            panic!("CPUID 0xA is the PMU's");
        };
        assert_eq!(leaf[0] & 0xff, 2);
        assert_eq!(v.rdmsr(0x345), Route::Fault, "no PDCM under TCG");
        // PMC0 counts instructions at any CPL, with INT, 10 from the wrap.
        let sel = pmu::evtsel::EN | pmu::evtsel::OS | pmu::evtsel::USR | pmu::evtsel::INT | 0xc0;
        assert_eq!(v.wrmsr(0x186, sel), Route::Handled(()));
        assert_eq!(v.wrmsr(0xc1, (-10i64) as u64), Route::Handled(()));
        assert_eq!((c.get().active, c.get().budget), (1, 10));
        c.update(|c| c.events[0] += 3);
        c.update(|c| c.events[1] += 6);
        assert_eq!(v.rdpmc(0), Route::Handled(0xffff_ffff_ffff));
        c.update(|c| c.events[2] += 1);
        assert_eq!(
            v.rdpmc(0),
            Route::Handled(0xffff_ffff_ffff),
            "branches do not count"
        );
        c.update(|c| c.events[1] += 1);
        v.pmu_due();
        assert_eq!(c.get().pmi, 1, "wrapped on the 10th instruction");
        assert_eq!(v.rdmsr(0x38e), Route::Handled(1), "GLOBAL_STATUS");
        assert_eq!(v.rdpmc(0), Route::Handled(0));
        assert_eq!(v.wrmsr(0x38f, 0), Route::Handled(()));
        assert_eq!(
            (c.get().active, c.get().budget),
            (0, i64::MAX),
            "GLOBAL_CTRL stops it"
        );
        v.setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH, c.ptr());
        assert_eq!(v.rdmsr(0x345), Route::Handled(1 << 13), "PDCM: FW_WRITE");
        assert_eq!(v.wrmsr(0x4c1, 1 << 40), Route::Handled(()), "full width");
        assert_eq!(v.rdpmc(0), Route::Handled(1 << 40));
        v.setup(0, 0, PMU_NONE, None);
        assert_eq!(v.cpuid(0xa, 0, [0; 4]), Route::Unhandled);
    }

    #[test]
    fn lbr_is_routed_with_the_intel_pmu_and_blocks_report_branches_only_while_it_records() {
        use crate::x86::lbr::{debugctl, MSR_IA32_DEBUGCTLMSR, MSR_LBR_NHM_FROM, MSR_LBR_NHM_TO};
        use crate::x86::lbr::{select, MSR_LBR_SELECT, MSR_LBR_TOS};
        use crate::x86::pmu::{ACTIVE_LBR, ACTIVE_RETIRED};
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        let c = TestCounting::new(Counting::default());
        // No PMU, or AMD's: DEBUGCTL and the stack stay TCG's.
        assert_eq!(v.rdmsr(MSR_IA32_DEBUGCTLMSR), Route::Unhandled);
        assert_eq!(v.wrmsr(MSR_LBR_TOS, 1), Route::Unhandled);
        v.setup(0, 0, PMU_AMD, c.ptr());
        assert_eq!(v.wrmsr(MSR_IA32_DEBUGCTLMSR, 1), Route::Unhandled);
        // Intel without PDCM: no LBR_FMT, so no LBR (KVM's
        // intel_pmu_lbr_is_enabled): the stack #GPs, DEBUGCTL.LBR is dropped.
        v.setup(0, 0, PMU_INTEL | PMU_LBR, c.ptr());
        assert_eq!(v.rdmsr(MSR_LBR_TOS), Route::Fault);
        assert_eq!(
            v.wrmsr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR),
            Route::Handled(())
        );
        assert_eq!(v.rdmsr(MSR_IA32_DEBUGCTLMSR), Route::Handled(0));
        assert_eq!(v.wrmsr(MSR_IA32_DEBUGCTLMSR, 1 << 6), Route::Fault, "TR");
        assert_eq!(c.get().active, 0);
        // PDCM without LBR: PERF_CAPABILITIES has no LBR_FMT.
        v.setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH, c.ptr());
        assert_eq!(v.rdmsr(0x345), Route::Handled(1 << 13));
        assert_eq!(v.rdmsr(MSR_LBR_TOS), Route::Fault);
        // With LBR: format 5, and blocks report branches exactly while
        // DEBUGCTL.LBR is set.
        v.setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH | PMU_LBR, c.ptr());
        assert_eq!(v.rdmsr(0x345), Route::Handled(1 << 13 | 5));
        assert_eq!(v.rdmsr(MSR_LBR_TOS), Route::Handled(0));
        v.lbr_branch(0x10, 0x20, BranchKind::Jcc as u32, 3);
        assert_eq!(v.rdmsr(MSR_LBR_TOS), Route::Handled(0), "not recording");
        assert_eq!(
            v.wrmsr(
                MSR_IA32_DEBUGCTLMSR,
                debugctl::LBR | debugctl::FREEZE_LBRS_ON_PMI
            ),
            Route::Handled(())
        );
        assert_eq!(c.get().active, ACTIVE_LBR);
        v.lbr_branch(0x10, 0x20, BranchKind::Jcc as u32, 3);
        v.lbr_branch(0x30, 0x40, 99, 3);
        assert_eq!(v.rdmsr(MSR_LBR_TOS), Route::Handled(1), "kind 99 dropped");
        assert_eq!(v.rdmsr(MSR_LBR_NHM_FROM + 1), Route::Handled(0x10));
        assert_eq!(v.rdmsr(MSR_LBR_NHM_TO + 1), Route::Handled(0x20));
        assert_eq!(
            v.wrmsr(MSR_LBR_SELECT, select::CPL_NEQ_0),
            Route::Handled(())
        );
        v.lbr_branch(0x50, 0x60, BranchKind::NearRet as u32, 3);
        assert_eq!(
            v.rdmsr(MSR_LBR_TOS),
            Route::Handled(1),
            "user branches suppressed"
        );
        // Counting and recording side by side; the PMI freezes recording.
        let sel = pmu::evtsel::EN | pmu::evtsel::OS | pmu::evtsel::INT | 0xc0;
        assert_eq!(v.wrmsr(0x186, sel), Route::Handled(()));
        assert_eq!(v.wrmsr(0xc1, (-2i64) as u64), Route::Handled(()));
        assert_eq!(c.get().active, ACTIVE_RETIRED | ACTIVE_LBR);
        let saved = v.save_msrs();
        assert_eq!(
            saved.lbr.debugctl,
            debugctl::LBR | debugctl::FREEZE_LBRS_ON_PMI
        );
        c.update(|c| c.events[1] += 2);
        v.pmu_due();
        assert_eq!(c.get().pmi, 1);
        assert_eq!(c.get().active, ACTIVE_RETIRED, "frozen: no more reports");
        assert_eq!(
            v.rdmsr(MSR_IA32_DEBUGCTLMSR),
            Route::Handled(debugctl::FREEZE_LBRS_ON_PMI)
        );
        // Loading the saved registers records again, with the records kept.
        v.load_msrs(&saved);
        assert_eq!(c.get().active & ACTIVE_LBR, ACTIVE_LBR);
        assert_eq!(v.rdmsr(MSR_LBR_NHM_FROM + 1), Route::Handled(0x10));
        assert_eq!(v.rdmsr(MSR_LBR_SELECT), Route::Handled(select::CPL_NEQ_0));
    }

    #[test]
    fn an_amd_pmu_shows_in_amds_leaves_and_not_in_intels() {
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        let tcg = [0, 0, 1 << 23 | 1, 0];
        // No PMU: PerfCtrExtCore is taken out of 0x80000001 ECX (as KVM).
        assert_eq!(v.cpuid(0x8000_0001, 0, tcg), Route::Handled([0, 0, 1, 0]));
        v.setup(0, 0, PMU_AMD | PMU_PERFCTR_CORE | PMU_PERFMON_V2, None);
        assert_eq!(v.cpuid(0x8000_0001, 0, tcg), Route::Unhandled);
        assert_eq!(
            v.cpuid(0x8000_0022, 0, [0; 4]),
            Route::Handled([1, 6, 0, 0])
        );
        assert_eq!(v.cpuid(0xa, 0, [0; 4]), Route::Unhandled, "no Intel leaf");
        assert_eq!(
            v.cpuid(1, 0, [0, 0, 1 << 15, 0]),
            Route::Handled([0; 4]),
            "no PDCM"
        );
        assert_eq!(v.rdmsr(0xc000_0301), Route::Handled(0x3f));
        assert_eq!(v.rdmsr(0x38f), Route::Fault);
        assert_eq!(v.rdpmc(5), Route::Handled(0));
        assert_eq!(v.rdpmc(6), Route::Fault);
        // Legacy only: 4 counters, no PerfMonV2 leaf, no extended MSRs.
        v.setup(0, 0, PMU_AMD, None);
        assert_eq!(v.cpuid(0x8000_0022, 0, [0; 4]), Route::Unhandled);
        assert_eq!(v.rdmsr(0xc001_0007), Route::Handled(0));
        assert_eq!(v.rdmsr(0xc001_0200), Route::Fault);
        assert_eq!(v.rdpmc(4), Route::Fault);
    }

    /// Found by the property tests: with PerfMonV2 and fewer than 4
    /// counters, the K7 MSRs of the missing ones #GP (KVM's
    /// `amd_is_valid_msr` claims the K7 range whenever the PMU exists, and
    /// `amd_pmu_get_msr` / `amd_pmu_set_msr` find no counter); they read 0
    /// only on a vCPU whose PMU does not claim them.
    /// An overflow that a refused PMU WRMSR's sync finds raises its PMI
    /// all the same (the write #GPs; the overflow happened before it).
    #[test]
    fn a_refused_pmu_wrmsr_still_delivers_the_overflow_its_sync_found() {
        let vm = crate::Vm::new(crate::VmConfig::new(Arch::X86_64, 1, false).unwrap());
        let vcpu = vm.create_vcpu(0).unwrap();
        let v = vcpu.x86().unwrap();
        let c = TestCounting::new(Counting::default());
        v.setup(0, 0, PMU_INTEL, c.ptr());
        // PMC0: kernel instructions with INT, 3 from the wrap.
        let sel = pmu::evtsel::EN | pmu::evtsel::OS | pmu::evtsel::INT | 0xc0;
        assert_eq!(v.wrmsr(0x186, sel), Route::Handled(()));
        assert_eq!(v.wrmsr(0xc1, 0xffff_fffd), Route::Handled(()));
        assert_eq!(v.wrmsr(0x38f, 1), Route::Handled(()));
        assert_eq!(c.get().pmi, 0);
        // Four instructions retire (the budget's 3 and one more, a block
        // that ended past the wrap), then a reserved bit of FIXED_CTR_CTRL.
        c.update(|c| c.events[1] += 4);
        assert_eq!(v.wrmsr(0x38d, 1 << 63), Route::Fault);
        assert_eq!(c.get().pmi, 1, "the overflow's PMI");
        assert_eq!(v.rdmsr(0x38e), Route::Handled(1), "GLOBAL_STATUS");
    }

    #[test]
    fn a_pebs_overflow_writes_its_record_through_the_vcpus_paging_and_reloads() {
        use crate::memory::tests::FakeRam;
        use crate::x86::pebs::{self, ds};
        use std::sync::Arc;
        const DS: u64 = 0x1000;
        const BUF: u64 = 0x2000;
        let ram = Arc::new(FakeRam::new(0x4000));
        let vm = crate::Vm::with_memory(
            crate::VmConfig::new(Arch::X86_64, 1, false).unwrap(),
            Box::new(Arc::clone(&ram)),
        );
        let vcpu = vm.create_vcpu(0).unwrap();
        let v = vcpu.x86().unwrap();
        let c = TestCounting::new(Counting::default());
        // PDCM but no DS/DTES64 (PMU_PEBS unset): no PEBS, DS hidden.
        v.setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH, c.ptr());
        assert_eq!(v.rdmsr(pebs::MSR_IA32_DS_AREA), Route::Fault);
        assert_eq!(
            v.cpuid(1, 0, [0, 0, 1 << 15 | 1 << 2, 1 << 21]),
            Route::Handled([0, 0, 1 << 15, 0])
        );
        v.setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH | PMU_PEBS, c.ptr());
        assert_eq!(
            v.cpuid(1, 0, [0, 0, 1 << 15 | 1 << 2, 1 << 21]),
            Route::Unhandled
        );
        assert_eq!(v.rdmsr(0x345), Route::Handled(1 << 13 | pebs::caps::PEBS));
        let mem = GuestRam::new(&*ram);
        let put = |gpa: u64, val: u64| assert!(mem.write(Gpa(gpa), &val.to_le_bytes()));
        let get = |gpa: u64| {
            let mut b = [0u8; 8];
            assert!(mem.read(Gpa(gpa), &mut b));
            u64::from_le_bytes(b)
        };
        put(DS + ds::BUFFER_BASE, BUF);
        put(DS + ds::INDEX, BUF);
        put(DS + ds::ABSOLUTE_MAXIMUM, BUF + 0x1000);
        put(DS + ds::INTERRUPT_THRESHOLD, BUF + 1);
        put(DS + ds::EVENT_RESET, 0xffff_ffff_fffc);
        // PMC0: kernel instructions, adaptive, PEBS, 2 from the wrap.
        let sel = pmu::evtsel::EN | pmu::evtsel::OS | pmu::EVTSEL_ADAPTIVE | 0xc0;
        assert_eq!(v.wrmsr(0x186, sel), Route::Handled(()));
        assert_eq!(v.wrmsr(0x4c1, 0xffff_ffff_fffe), Route::Handled(()));
        assert_eq!(
            v.wrmsr(pebs::MSR_PEBS_DATA_CFG, pebs::data_cfg::GPRS),
            Route::Handled(())
        );
        assert_eq!(v.wrmsr(pebs::MSR_IA32_DS_AREA, DS), Route::Handled(()));
        assert_eq!(v.wrmsr(pebs::MSR_IA32_PEBS_ENABLE, 1), Route::Handled(()));
        assert_eq!(c.get().budget, 2, "the engine stops at the overflow");
        c.update(|c| c.events[1] += 2);
        v.pmu_due();
        assert_eq!(
            (c.get().pmi, c.get().pebs_due),
            (0, 1),
            "a record owed, no PMI"
        );
        let mut s = pebs::Sample {
            eventing_ip: 0x40_1000,
            next_ip: 0x40_1002,
            ..Default::default()
        };
        s.gprs[0] = 0xaaaa;
        v.pebs_write(s);
        assert_eq!(get(DS + ds::INDEX), BUF + 176, "basic + GPRs");
        assert_eq!(get(BUF), 176 << 48 | pebs::data_cfg::GPRS);
        assert_eq!((get(BUF + 8), get(BUF + 16)), (0x40_1000, 1));
        assert_eq!((get(BUF + 40), get(BUF + 48)), (0x40_1002, 0xaaaa));
        assert_eq!(c.get().pmi, 1, "the threshold is reached");
        assert_eq!(
            v.rdmsr(0x38e),
            Route::Handled(pebs::GLOBAL_STATUS_BUFFER_OVF)
        );
        assert_eq!(v.rdpmc(0), Route::Handled(0xffff_ffff_fffc), "reloaded");
        assert_eq!(c.get().budget, 4);
    }

    #[test]
    fn amd_k7_msrs_of_counters_a_perfmon_v2_pmu_lacks_fault() {
        let vm = crate::Vm::new(
            crate::VmConfig::new(Arch::X86_64, 1, false)
                .unwrap()
                .with_pmu_counters(2)
                .unwrap(),
        );
        let vcpu = vm.create_vcpu(0).unwrap();
        let v = vcpu.x86().unwrap();
        let v2 = PMU_AMD | PMU_PERFCTR_CORE | PMU_PERFMON_V2;
        v.setup(0, 0, v2, None);
        assert_eq!(v.rdmsr(0xc001_0005), Route::Handled(0), "counter 1 exists");
        for msr in [0xc001_0002, 0xc001_0003, 0xc001_0006, 0xc001_0007] {
            assert_eq!(v.rdmsr(msr), Route::Fault, "{msr:#x}");
            assert_eq!(v.wrmsr(msr, 0), Route::Fault, "{msr:#x}");
        }
        assert_eq!(v.rdmsr(0xc1), Route::Handled(0), "Intel's legacy MSRs: 0");
        v.setup(0, 0, PMU_NONE, None);
        assert_eq!(v.rdmsr(0xc001_0007), Route::Handled(0), "no PMU: 0");
    }

    #[test]
    fn steal_time_msr_is_kvms_and_reset_turns_it_off() {
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0));
        assert_eq!(
            v.wrmsr(MSR_KVM_STEAL_TIME, 0x1002),
            Route::Fault,
            "reserved bit 1"
        );
        assert_eq!(v.wrmsr(MSR_KVM_STEAL_TIME, 0x1001), Route::Handled(()));
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0x1001));
        vcpu.run_begin(); // no memory: nothing written, no crash
        vcpu.run_end(false);
        vcpu.reset(ResetKind::Cold);
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0));
        assert!(
            Vcpu::new(0, Arch::Aarch64).x86().is_none(),
            "no x86 routing on arm64"
        );
    }

    #[test]
    #[should_panic(expected = "entered twice at once")]
    fn a_vcpus_lock_free_state_cannot_be_entered_twice() {
        // A re-entry (or a second thread) gets a panic, never a second
        // `&mut Local`.
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        v.local(|_| v.local(|_| ()));
    }

    /// QEMU's INIT as `do_cpu_init` drives it: the INIT, then the
    /// `cpu_reset()` it emulates the rest with (a cold reset, then setup).
    fn qemu_init(vcpu: &Vcpu, features: u32, pmu: u32, c: &TestCounting) {
        vcpu.reset(ResetKind::Init);
        vcpu.reset(ResetKind::Cold);
        vcpu.x86().unwrap().setup(0, features, pmu, c.ptr());
    }

    /// ... and its RESET: `cpu_reset()` alone.
    fn qemu_reset(vcpu: &Vcpu, features: u32, pmu: u32, c: &TestCounting) {
        vcpu.reset(ResetKind::Cold);
        vcpu.x86().unwrap().setup(0, features, pmu, c.ptr());
    }

    #[test]
    fn x86_init_keeps_the_pmu_and_tsc_and_turns_pv_areas_off_as_kvm() {
        use crate::x86::clock::{MSR_IA32_TSC, MSR_IA32_TSC_ADJUST, MSR_KVM_SYSTEM_TIME_NEW};
        use crate::x86::cpuid::KVM_DEFAULT_FEATURES;
        let vcpu = Vcpu::new(1, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        let c = TestCounting::new(Counting::default());
        let features = KVM_DEFAULT_FEATURES;
        qemu_reset(&vcpu, features, PMU_INTEL, &c);
        // PMC0: instructions at any CPL; PMC1: cycles with a PMI.
        let insns = pmu::evtsel::EN | pmu::evtsel::OS | pmu::evtsel::USR | 0xc0;
        let cycles = insns | pmu::evtsel::INT | 0x3c;
        assert_eq!(v.wrmsr(0x186, insns), Route::Handled(()));
        assert_eq!(v.wrmsr(0xc1, 1_000), Route::Handled(()));
        assert_eq!(v.wrmsr(0x187, cycles & !0xc0), Route::Handled(()));
        assert_eq!(v.wrmsr(0x38f, 3), Route::Handled(()));
        c.update(|c| c.events[1] += 50);
        assert_eq!(v.wrmsr(MSR_KVM_STEAL_TIME, 0x1001), Route::Handled(()));
        assert_eq!(v.wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0x2001), Route::Handled(()));
        assert_eq!(v.wrmsr(MSR_IA32_TSC, 1 << 40), Route::Handled(()));
        let Route::Handled(adjust) = v.rdmsr(MSR_IA32_TSC_ADJUST) else {
            panic!("TSC_ADJUST is rustkvm's");
        };
        v.pv_kick();

        qemu_init(&vcpu, features, PMU_INTEL, &c);
        assert_eq!(vcpu.resets(), 2, "the INIT's own cpu_reset does not count");
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0), "steal off");
        assert_eq!(
            v.rdmsr(MSR_KVM_SYSTEM_TIME_NEW),
            Route::Handled(0),
            "kvmclock off"
        );
        assert!(!v.take_pv_unhalt());
        assert_eq!(v.rdmsr(MSR_IA32_TSC), Route::Handled(1 << 40), "TSC kept");
        assert_eq!(v.rdmsr(MSR_IA32_TSC_ADJUST), Route::Handled(adjust));
        assert_eq!(v.rdmsr(0x186), Route::Handled(insns), "selects kept");
        assert_eq!(v.rdmsr(0x187), Route::Handled(cycles & !0xc0));
        assert_eq!(v.rdmsr(0x38f), Route::Handled(3), "GLOBAL_CTRL kept");
        assert_eq!(v.rdpmc(0), Route::Handled(1_050), "PMC0 kept");
        assert_eq!(
            c.get().active,
            1,
            "the engine still counts (published again)"
        );
        c.update(|c| c.events[0] += 7);
        assert_eq!(v.rdpmc(0), Route::Handled(1_057), "and goes on counting");

        // A later RESET resets it all, and clears the VM's wall clock MSR
        // (QEMU writes 0 into KVM's at reset when kvmclock is advertised).
        let wall = crate::x86::clock::MSR_KVM_WALL_CLOCK_NEW;
        assert_eq!(v.wrmsr(wall, 0x3000), Route::Handled(()));
        vcpu.reset(ResetKind::Init);
        vcpu.reset(ResetKind::Cold);
        assert_eq!(
            v.rdmsr(wall),
            Route::Handled(0x3000),
            "INIT: the VM's, kept"
        );
        v.setup(0, features, PMU_INTEL, c.ptr());
        qemu_reset(&vcpu, features, PMU_INTEL, &c);
        assert_eq!(v.rdmsr(wall), Route::Handled(0), "RESET clears it");
        assert_eq!(v.rdmsr(0x186), Route::Handled(0));
        assert_eq!(v.rdpmc(0), Route::Handled(0));
        assert_eq!((c.get().active, c.get().events), (0, [0; 12]));
        assert_eq!(v.rdmsr(MSR_IA32_TSC_ADJUST), Route::Handled(0));
        assert_eq!(vcpu.resets(), 4);
        // Without kvmclock in CPUID, QEMU leaves KVM's wall clock alone.
        qemu_reset(&vcpu, 0, PMU_INTEL, &c);
        assert_eq!(v.wrmsr(wall, 0x3000), Route::Handled(()));
        qemu_reset(&vcpu, 0, PMU_INTEL, &c);
        assert_eq!(v.rdmsr(wall), Route::Handled(0x3000));
    }

    #[test]
    fn a_deferred_tlb_flush_is_honoured_as_guest_pv_has_says() {
        use crate::x86::cpuid::{KVM_FEATURE_PV_TLB_FLUSH, KVM_FEATURE_STEAL_TIME};
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        v.setup(0, KVM_FEATURE_STEAL_TIME, PMU_NONE, None);
        assert!(v.pv_tlb_flush_on(), "not enforced: KVM flushes");
        v.enforce_pv_cpuid(true);
        assert!(!v.pv_tlb_flush_on(), "enforced, not advertised: ignored");
        v.setup(
            0,
            KVM_FEATURE_STEAL_TIME | KVM_FEATURE_PV_TLB_FLUSH,
            PMU_NONE,
            None,
        );
        v.enforce_pv_cpuid(true);
        assert!(v.pv_tlb_flush_on(), "enforced and advertised");
    }

    #[test]
    fn kicks_are_remembered_until_consumed_once() {
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        assert!(!v.take_pv_unhalt());
        v.pv_kick();
        v.pv_kick();
        assert!(v.take_pv_unhalt());
        assert!(!v.take_pv_unhalt(), "two kicks before a halt unhalt once");
    }

    #[test]
    fn each_msr_reaches_one_model_after_the_enforcement_rule() {
        use crate::x86::clock::*;
        use MsrOwner::*;
        for (msr, owner) in [
            (0xc1, Pmu),
            (0x38f, Pmu),
            (0xc001_0200, Pmu),
            (MSR_KVM_STEAL_TIME, StealTime),
            (MSR_IA32_TSC, Tsc),
            (MSR_IA32_TSC_ADJUST, Tsc),
            (MSR_IA32_TSC_DEADLINE, Tsc),
            (MSR_KVM_SYSTEM_TIME, Kvmclock),
            (MSR_KVM_SYSTEM_TIME_NEW, Kvmclock),
            (MSR_KVM_WALL_CLOCK, WallClock),
            (MSR_KVM_WALL_CLOCK_NEW, WallClock),
            (0x4b56_4d05, PollControl),
            (0x4b56_4d04, PvEoi),
        ] {
            assert_eq!(MsrOwner::of(msr), Some(owner), "{msr:#x}");
        }
        let (apic_base, async_pf) = (0x1b, 0x4b56_4d02);
        assert_eq!(MsrOwner::of(apic_base), None, "TCG's");
        assert_eq!(MsrOwner::of(async_pf), None, "not implemented: TCG's");
        let vcpu = Vcpu::new(0, Arch::X86_64);
        let v = vcpu.x86().unwrap();
        v.setup(0, 0, PMU_NONE, None);
        assert_eq!(
            v.rdmsr(async_pf),
            Route::Fault,
            "not enforced, not implemented: #GP, not TCG's silent 0"
        );
        assert_eq!(v.rdmsr(0x4b56_4d04), Route::Handled(0), "PV EOI, off");
        assert_eq!(v.wrmsr(0x4b56_4d08, 1), Route::Fault, "migration control");
        assert_eq!(v.rdmsr(0x4b56_4dff), Route::Fault, "KVM's range");
        assert_eq!(v.rdmsr(0x4b56_4e00), Route::Unhandled, "beyond it: TCG's");
        assert_eq!(v.rdmsr(0x4b56_4d05), Route::Handled(1), "poll control");
        v.enforce_pv_cpuid(true);
        // KVM_CAP_ENFORCE_PV_FEATURE_CPUID: a PV MSR whose feature is not
        // advertised faults, whether or not rustkvm implements it.
        assert_eq!(v.rdmsr(0x4b56_4d04), Route::Fault, "PV EOI");
        assert_eq!(v.wrmsr(0x4b56_4d04, 0), Route::Fault);
        assert_eq!(v.rdmsr(async_pf), Route::Fault);
        assert_eq!(v.wrmsr(MSR_KVM_STEAL_TIME, 0x1001), Route::Fault);
        assert_eq!(v.rdmsr(MSR_KVM_WALL_CLOCK_NEW), Route::Fault);
        assert_eq!(v.rdmsr(apic_base), Route::Unhandled, "not a PV MSR");
        assert_eq!(v.rdmsr(MSR_IA32_TSC_ADJUST), Route::Handled(0));
    }
}
