//! One vCPU: its saved state and the routing points QEMU calls on it.
//!
//! Every routing point answers with a [`Route`]. What no model claims (the
//! PMU, steal time, kvmclock and the TSC, hypercalls, SMCCC, PV time) is
//! [`Route::Unhandled`], and QEMU does exactly what TCG does.

use std::cell::UnsafeCell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::arm::pvtime::{PvTime, PvTimeError};
use crate::arm::smccc;
use crate::memory::NoMemory;
use crate::steal::Threading;
use crate::vm::{Arch, Shared};
use crate::x86::clock::{self, Timer, X86Clock};
use crate::x86::cpuid::KVM_FEATURE_CLOCKSOURCE_STABLE_BIT;
use crate::x86::hypercall;
use crate::x86::pmu::{self, Counting, Events, Pmu, PmuConfig};
use crate::x86::steal::{StealTime, MSR_KVM_STEAL_TIME};

/// The answer of a routing point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<T> {
    /// Not claimed by rustkvm: TCG's behaviour applies.
    Unhandled,
    /// Claimed; the access completes with this result.
    Handled(T),
    /// Claimed and faults: #GP(0) on x86, UNDEFINED on arm64.
    Fault,
}

/// What kind of reset a vCPU goes through (rustkvm.h `RUSTKVM_RESET_*`):
/// the `init_event` of KVM's `kvm_vcpu_reset(vcpu, init_event)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    /// RESET: power-on, system reset, `cpu_reset()` (KVM: vCPU creation and
    /// QEMU writing the reset state back). Every guest-visible register goes
    /// back to its reset value.
    Cold,
    /// x86 INIT (an INIT IPI, INIT-SIPI-SIPI): KVM's `init_event = true`.
    /// Steal time, kvmclock, async PF and the LAPIC timer are reset as on a
    /// RESET; the PMU, the TSC and IA32_TSC_ADJUST are kept (SDM vol. 3
    /// table 10-1 "INIT: unchanged"; KVM never resets its PMU on INIT). On
    /// arm64 there is none: it is taken as [`ResetKind::Cold`].
    Init,
}

/// How often each routing point was reached on one vCPU (`stats=on`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RouteCounts {
    /// x86 CPUID instructions.
    pub cpuid: u64,
    /// x86 RDMSR instructions.
    pub rdmsr: u64,
    /// x86 WRMSR instructions.
    pub wrmsr: u64,
    /// x86 RDPMC instructions that passed the CR4.PCE/CPL check.
    pub rdpmc: u64,
    /// x86 hypercalls (VMCALL/VMMCALL).
    pub hypercall: u64,
    /// arm64 HVC/SMC calls on the PSCI conduit.
    pub hvc_smc: u64,
    /// arm64 PMU system register reads.
    pub pmu_read: u64,
    /// arm64 PMU system register writes.
    pub pmu_write: u64,
    /// PMU overflow interrupts raised (x86 LVTPC).
    pub pmi: u64,
}

impl fmt::Display for RouteCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpuid={} rdmsr={} wrmsr={} rdpmc={} hypercall={} hvc_smc={} pmu_read={} pmu_write={} pmi={}",
            self.cpuid,
            self.rdmsr,
            self.wrmsr,
            self.rdpmc,
            self.hypercall,
            self.hvc_smc,
            self.pmu_read,
            self.pmu_write,
            self.pmi
        )
    }
}

/// The live counters behind [`RouteCounts`]: only the vCPU's own thread
/// bumps them (a plain load and store, no atomic read-modify-write and no
/// lock on the routing paths); other threads read a snapshot.
#[derive(Debug, Default)]
pub struct RouteCounters {
    cpuid: AtomicU64,
    rdmsr: AtomicU64,
    wrmsr: AtomicU64,
    rdpmc: AtomicU64,
    hypercall: AtomicU64,
    hvc_smc: AtomicU64,
    pmu_read: AtomicU64,
    pmu_write: AtomicU64,
    pmi: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

impl RouteCounters {
    /// A copy of the counts.
    pub fn snapshot(&self) -> RouteCounts {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RouteCounts {
            cpuid: g(&self.cpuid),
            rdmsr: g(&self.rdmsr),
            wrmsr: g(&self.wrmsr),
            rdpmc: g(&self.rdpmc),
            hypercall: g(&self.hypercall),
            hvc_smc: g(&self.hvc_smc),
            pmu_read: g(&self.pmu_read),
            pmu_write: g(&self.pmu_write),
            pmi: g(&self.pmi),
        }
    }
}

/// Per-vCPU state under the vCPU's lock: steal-time and clock accounting,
/// the PV MSRs. (savevm/loadvm carry what the guest can see of it through
/// [`SavedMsrs`] and QEMU's CPU state, not this struct.)
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VcpuState {
    /// Resets seen since creation (RESET and INIT; the `cpu_reset()` QEMU
    /// emulates an INIT with is part of the INIT).
    pub resets: u64,
    /// x86 steal time.
    pub steal: StealTime,
    /// arm64 PV stolen time.
    pub pvtime: PvTime,
    /// x86 TSC, TSC_ADJUST, kvmclock, TSC-deadline.
    pub clock: X86Clock,
}

/// vCPU state only the vCPU's own thread touches — or one thread while the
/// vCPU is stopped (reset, savevm/loadvm) — so it needs no lock: the x86
/// PMU, which every PMU MSR access, RDPMC and PMI reaches.
#[derive(Debug)]
struct Local {
    /// x86 PMU registers.
    pmu: Pmu,
    /// arm64 PMUv3 registers.
    arm_pmu: crate::arm::pmu::Pmu,
    /// Unhalted cycles: VM nanoseconds spent in guest code (PMU only) ...
    unhalted_ns: u64,
    /// ... and when the current stretch began (VM ns; 0: not in guest code).
    run_since_ns: u64,
    /// The counting engine's state in QEMU's CPU state (None: none).
    counting: Option<CountingPtr>,
    /// Host ns of this vCPU's last look at the others ([`Vcpu::mark_descheduled_peers`]).
    peers_seen_ns: u64,
    /// x86: an INIT was applied ([`Vcpu::reset`] with [`ResetKind::Init`])
    /// and the `cpu_reset()` QEMU emulates the rest of it with is under way:
    /// its cold reset is skipped and its setup keeps the PMU.
    init_pending: bool,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            pmu: Pmu::default(),
            arm_pmu: crate::arm::pmu::Pmu::new(crate::arm::pmu::PmuConfig {
                counters: None,
                v3p5: false,
            }),
            unhalted_ns: 0,
            run_since_ns: 0,
            counting: None,
            peers_seen_ns: 0,
            init_pending: false,
        }
    }
}

/// The counting engine's state of one vCPU, which QEMU keeps in the vCPU's
/// CPU state (`CPUX86State`/`CPUARMState`, rustkvm.h `RustkvmCounting`) and
/// the vCPU thread's translated code updates inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountingPtr(NonNull<Counting>);

impl CountingPtr {
    /// None for a null `ptr`.
    ///
    /// # Safety
    /// `ptr` is null or points to a `Counting` that stays valid for as long
    /// as a vCPU given it (by [`Vcpu::x86_setup`] or [`Vcpu::arm_setup`])
    /// keeps it, and that nothing else accesses while that vCPU's thread runs
    /// guest code or a routing point, other than that thread's translated
    /// code: QEMU's contract for its CPU state (rustkvm.h), and a test's
    /// for its own `Counting`.
    pub unsafe fn new(ptr: *mut Counting) -> Option<Self> {
        NonNull::new(ptr).map(CountingPtr)
    }
}

// SAFETY: the pointee is reached only through `Local`, under `LocalCell`'s
// one-holder rule, as `CountingPtr::new`'s contract allows from any thread.
unsafe impl Send for CountingPtr {}

/// [`Local`] for one holder at a time. QEMU reaches a vCPU's `Local` from
/// that vCPU's thread, or from one thread while the vCPU is stopped
/// (rustkvm.h: the routing points, run begin/end, setup at reset,
/// savevm/loadvm); [`LocalCell::with`] enforces it, so that no safe call
/// can race: a second holder at once (another thread, or a re-entry from
/// inside `with`) panics (the process aborts: `panic = "abort"`) instead of
/// getting a second `&mut`. One uncontended compare-exchange per access.
#[derive(Debug, Default)]
struct LocalCell {
    held: AtomicBool,
    local: UnsafeCell<Local>,
}

// SAFETY: `local` is reached only through `with`, which admits one holder at
// a time (`held`, taken with Acquire and given back with Release, orders
// each holder's accesses after the previous holder's); `Local` is `Send`.
unsafe impl Sync for LocalCell {}

impl LocalCell {
    /// Run `f` on the `Local`, as its only holder.
    fn with<R>(&self, f: impl FnOnce(&mut Local) -> R) -> R {
        if self
            .held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            panic!(
                "rustkvm: a vCPU's PMU state entered twice at once (from two threads, or re-entered): QEMU's one-thread-per-vCPU contract broken"
            );
        }
        /// Gives `held` back when `f` returns (or unwinds, in tests).
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&self.held);
        // SAFETY: `held` was false and is now ours until `_release` drops:
        // no other reference to the `Local` exists meanwhile.
        f(unsafe { &mut *self.local.get() })
    }
}

impl Local {
    /// The counting engine's state, if QEMU gave it.
    fn counting(&mut self) -> Option<&mut Counting> {
        // SAFETY: valid and not accessed by anyone else while this vCPU's
        // `Local` is held (`CountingPtr::new`'s contract; `self` is borrowed
        // from `LocalCell::with`).
        self.counting.map(|p| unsafe { &mut *p.0.as_ptr() })
    }

    /// Unhalted cycles so far, at the guest TSC rate.
    fn cycles(&self, shared: &Shared) -> u64 {
        let mut ns = self.unhalted_ns;
        if self.run_since_ns != 0 {
            ns += shared.virtual_ns().saturating_sub(self.run_since_ns);
        }
        shared.tsc_rate().ticks(ns)
    }

    /// The arm64 PMU's event totals now.
    fn arm_events(&mut self, shared: &Shared) -> crate::arm::pmu::Events {
        let cycles = self.cycles(shared);
        let e = self.counting().map_or([0; 12], |c| c.events);
        crate::arm::pmu::Events {
            instructions: [e[0], e[1]],
            branches: [e[2], e[3]],
            mem_accesses: [e[4], e[5]],
            loads: [e[6], e[7]],
            stores: [e[8], e[9]],
            exceptions: [e[10], e[11]],
            cycles,
        }
    }

    /// Tell the engine what the arm64 PMU needs now: whether blocks count,
    /// the next PMI budget, the interrupt's level, when a cycle counter can
    /// overflow.
    fn arm_publish(&mut self, shared: &Shared, ev: &crate::arm::pmu::Events, irq: bool) {
        let deadline = self.arm_pmu.cycles_until_overflow(ev).map_or(-1, |ticks| {
            let ns = shared
                .virtual_ns()
                .saturating_add(shared.tsc_rate().ns_for(ticks));
            i64::try_from(ns).unwrap_or(i64::MAX)
        });
        if let Some(c) = self.counting() {
            c.cycles_deadline_ns = deadline;
        }
        let p = &self.arm_pmu;
        let active = if p.counts_retired() {
            ACTIVE_RETIRED
        } else {
            0
        } | if p.counts_mem() { ACTIVE_MEM } else { 0 }
            | if p.counts_exceptions() { ACTIVE_EXC } else { 0 };
        let budget = p.until_overflow(ev);
        if let Some(c) = self.counting() {
            c.active = active;
            c.budget = budget.map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
            c.pmi = u32::from(irq);
        }
    }

    /// The PMU's event totals now. Cycles need the VM clock, which costs
    /// more than the rest: they are 0 unless `cycles` (a counter counts
    /// them, or may start to with the access at hand).
    fn events(&mut self, shared: &Shared, cycles: bool) -> Events {
        let cycles = if cycles { self.cycles(shared) } else { 0 };
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
        // can be borrowed alongside without copying it).
        if let Some(c) = self.counting.map(|p| unsafe { &mut *p.0.as_ptr() }) {
            c.publish(&self.pmu, ev, pmi);
            c.cycles_deadline_ns = deadline;
        }
    }
}

/// CPUID 0x80000001 ECX[23]: AMD PerfCtrExtCore.
const CPUID_8000_0001_ECX_PERFCTR_CORE: u32 = 1 << 23;

/// `RustkvmCounting.active` (arm64): a counter counts instructions,
/// branches or memory events; the engine translates counting blocks.
pub const ACTIVE_RETIRED: u32 = 1;
/// ... a counter counts memory events: blocks add their loads and stores.
pub const ACTIVE_MEM: u32 = 2;
/// ... a counter counts exceptions taken: QEMU adds each and calls back.
pub const ACTIVE_EXC: u32 = 4;

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

/// The x86 MSRs QEMU saves for rustkvm (see `RustkvmX86Msrs`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SavedMsrs {
    /// MSR_KVM_STEAL_TIME.
    pub steal_time: u64,
    /// IA32_TSC.
    pub tsc: u64,
    /// IA32_TSC_ADJUST.
    pub tsc_adjust: u64,
    /// IA32_TSC_DEADLINE.
    pub tsc_deadline: u64,
    /// MSR_KVM_SYSTEM_TIME(_NEW).
    pub system_time: u64,
    /// MSR_KVM_WALL_CLOCK(_NEW).
    pub wall_clock: u64,
    /// The PMU's registers.
    pub pmu: pmu::PmuRegs,
}

/// One vCPU of a [`crate::Vm`].
#[derive(Debug)]
pub struct Vcpu {
    index: u32,
    arch: Arch,
    // Touched by the vCPU's own thread on every routed access and, rarely, by
    // the main thread (introspection, exit report): never contended in practice.
    state: Mutex<VcpuState>,
    // Set by another vCPU's KVM_HC_KICK_CPU, consumed by this vCPU's HLT.
    pv_unhalt: AtomicBool,
    routes: RouteCounters,
    // The host thread running this vCPU (MTTCG sampler), 0 until it runs.
    tid: AtomicI32,
    // Between run_begin and run_end (MTTCG sampler).
    in_guest: AtomicBool,
    // Voluntary halts so far (MTTCG sampler: a halt in an interval explains
    // a thread that got little CPU).
    halts: AtomicU64,
    // Round-robin: host ns when its current turn began, 0 while it is out of
    // guest code (the sampler's time slices, `Sampler::tick`).
    turn_since_ns: AtomicU64,
    // Round-robin: it left its last turn runnable (not halted) and waits for
    // its next.
    waiting: AtomicBool,
    // x86: the KVM feature bits its CPUID advertises (set at reset).
    kvm_features: AtomicU32,
    // x86: `kvm-pv-enforce-cpuid`: PV MSRs and hypercalls not advertised
    // fault / return -KVM_ENOSYS (KVM_CAP_ENFORCE_PV_FEATURE_CPUID).
    pv_enforce: AtomicBool,
    // x86: the PMU, without a lock (see LocalCell).
    local: LocalCell,
    // Makes the vCPU leave guest code at its next block (QEMU's cpu_exit),
    // from any thread; called and cleared under this lock.
    exit_request: Mutex<Option<ExitRequest>>,
    shared: Arc<Shared>,
}

/// Asks a vCPU's thread, from any thread, to leave guest code at its next
/// translation block and enter again (QEMU's `cpu_exit`).
pub struct ExitRequest(Box<dyn Fn() + Send + Sync>);

impl ExitRequest {
    /// `request` makes the vCPU leave guest code; callable from any thread.
    pub fn new(request: impl Fn() + Send + Sync + 'static) -> Self {
        ExitRequest(Box::new(request))
    }
}

impl fmt::Debug for ExitRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExitRequest")
    }
}

impl Vcpu {
    /// A vCPU in its creation state, alone, without guest memory.
    pub fn new(index: u32, arch: Arch) -> Self {
        Self::with_shared(index, arch, Arc::new(Shared::new(Box::new(NoMemory), true)))
    }

    /// A vCPU of a machine.
    pub fn with_shared(index: u32, arch: Arch, shared: Arc<Shared>) -> Self {
        Vcpu {
            index,
            arch,
            state: Mutex::new(VcpuState::default()),
            pv_unhalt: AtomicBool::new(false),
            routes: RouteCounters::default(),
            tid: AtomicI32::new(0),
            in_guest: AtomicBool::new(false),
            halts: AtomicU64::new(0),
            turn_since_ns: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            kvm_features: AtomicU32::new(0),
            pv_enforce: AtomicBool::new(false),
            local: LocalCell::default(),
            exit_request: Mutex::new(None),
            shared,
        }
    }

    /// Install (or, with None, remove) how this vCPU is made to leave guest
    /// code from another thread. Once removal returns, the old one is no
    /// longer running and is never called again.
    pub fn set_exit_request(&self, request: Option<ExitRequest>) {
        *self.exit_request.lock() = request;
    }

    /// Make the vCPU leave guest code at its next block, so its entry clears
    /// a `preempted` flag set while its thread was off the host CPUs: when
    /// the host runs the thread again it finishes at most the block it was
    /// in before the entry clears the flag, as a KVM vCPU enters through
    /// `record_steal_time` after a preemption.
    pub(crate) fn request_exit(&self) {
        if let Some(request) = &*self.exit_request.lock() {
            (request.0)();
        }
    }

    /// QEMU's `cpu_index`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The guest architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// A copy of the state.
    pub fn state(&self) -> VcpuState {
        *self.state.lock()
    }

    /// How often each routing point was reached.
    pub fn routes(&self) -> RouteCounts {
        self.routes.snapshot()
    }

    fn lock(&self) -> MutexGuard<'_, VcpuState> {
        self.state.lock()
    }

    /// A reset of `kind`, as KVM's `kvm_vcpu_reset(vcpu, init_event)`.
    /// Statistics survive resets. Both kinds turn steal time, kvmclock,
    /// arm64 PV time and a pending KICK_CPU off, and disarm the TSC-deadline
    /// timer; a cold reset also puts the TSC back on the VM's timeline,
    /// clears IA32_TSC_ADJUST and (when this vCPU advertises kvmclock) the
    /// VM's MSR_KVM_WALL_CLOCK, as QEMU writes its reset MSRs into KVM
    /// (`kvm_put_msrs` at `KVM_PUT_RESET_STATE`). The PMU is reset by the
    /// setup after a cold reset ([`Vcpu::x86_setup`], [`Vcpu::arm_setup`]).
    ///
    /// QEMU emulates an INIT with a full `cpu_reset()` right after telling
    /// Rust (`do_cpu_init`): until the x86 setup that ends that reset, a cold
    /// reset is part of the INIT and changes nothing, and the setup keeps the
    /// PMU as it is.
    pub fn reset(&self, kind: ResetKind) {
        let kind = if self.arch == Arch::X86_64 {
            kind
        } else {
            ResetKind::Cold
        };
        if kind == ResetKind::Cold && self.local(|l| l.init_pending) {
            return;
        }
        let mut s = self.lock();
        s.resets += 1;
        s.steal.reset(kind);
        s.pvtime.reset();
        s.clock.reset(kind);
        drop(s);
        self.pv_unhalt.store(false, Ordering::Relaxed);
        match kind {
            ResetKind::Init => self.local(|l| l.init_pending = true),
            ResetKind::Cold => {
                let kvmclock = crate::x86::cpuid::KVM_FEATURE_CLOCKSOURCE
                    | crate::x86::cpuid::KVM_FEATURE_CLOCKSOURCE2;
                if self.kvm_features.load(Ordering::Relaxed) & kvmclock != 0 {
                    self.shared.wall_clock_msr.store(0, Ordering::Relaxed);
                }
            }
        }
    }

    /// Restore MSR_KVM_STEAL_TIME from a saved machine (loadvm, incoming
    /// migration). A value KVM would refuse (reserved bits) turns it off;
    /// accounting restarts from the next entry, as KVM's does.
    pub fn load_steal_time_msr(&self, value: u64) {
        let mut s = self.lock();
        s.steal = StealTime::default();
        if s.steal.write_msr(value).is_err() {
            s.steal = StealTime::default();
        }
    }

    /// The vCPU's thread is about to run guest code.
    pub fn run_begin(&self) {
        if self.tid.load(Ordering::Relaxed) == 0 {
            self.tid
                .store(self.shared.sched().current_tid(), Ordering::Relaxed);
        }
        self.in_guest.store(true, Ordering::Release);
        if !self.shared.mttcg {
            self.waiting.store(false, Ordering::Relaxed);
            self.turn_since_ns
                .store(self.shared.now_ns(), Ordering::Release);
        }
        self.local(|l| {
            if l.pmu.config.version != 0 || l.arm_pmu.present() {
                l.run_since_ns = self.shared.virtual_ns().max(1);
            }
        });
        self.enter_steal(&mut self.lock());
        self.mark_descheduled_peers();
    }

    /// A vCPU entering guest code again and again — a guest spin-wait: each
    /// PAUSE leaves TCG's CPU loop — on an MTTCG host the sampler found
    /// overcommitted looks, at most every [`PEER_LOOK_NS`], at the other
    /// vCPUs and marks `preempted` those in guest code whose thread is off
    /// the host CPUs at this moment (CPU clock still between two reads).
    /// While this thread runs, a vCPU sharing its one host CPU is off it for
    /// sure, and the sampler — which cannot run then — would see it late.
    /// No `R` check here (a /proc read): a vCPU thread in guest code and off
    /// the CPUs is not running guest code, whether it waits on a run queue
    /// or on QEMU's lock; a halted vCPU is not in guest code and never
    /// marked. A marked vCPU is asked to leave guest code (see
    /// [`Vcpu::request_exit`]).
    fn mark_descheduled_peers(&self) {
        if !self.shared.mttcg || !self.shared.contended() {
            return;
        }
        let now = self.shared.now_ns();
        let due = self.local(|l| {
            let due = now.saturating_sub(l.peers_seen_ns) >= PEER_LOOK_NS;
            if due {
                l.peers_seen_ns = now;
            }
            due
        });
        if !due {
            return;
        }
        let (mem, sched) = (&*self.shared.host, self.shared.sched());
        self.shared.for_each_peer(|peer| {
            let tid = peer.tid.load(Ordering::Relaxed);
            if peer.index == self.index || tid == 0 || !peer.in_guest.load(Ordering::Acquire) {
                return;
            }
            let off_cpu = sched
                .cpu_ns_and_running(&crate::host::ThreadWatch::clock_only(tid))
                .is_some_and(|(_, running)| !running);
            if off_cpu
                && peer.in_guest.load(Ordering::Acquire)
                && peer.lock().steal.mark_preempted(mem)
            {
                peer.request_exit();
            }
        });
    }

    /// Fold steal in at an entry into guest code (or a steal-time enable);
    /// under MTTCG at most every `MTTCG_ENTRY_FOLD_NS`, clearing only the
    /// sampler's `preempted` in between.
    fn enter_steal(&self, s: &mut VcpuState) {
        let (x86, arm) = (s.steal.enabled(), s.pvtime.active != 0);
        if !x86 && !arm {
            return;
        }
        let (now, threading) = (self.shared.steal_now_ns(), self.shared.threading());
        let mem = &*self.shared.host;
        let due = (x86 && s.steal.clock.entry_fold_due(threading, now))
            || (arm && s.pvtime.clock.entry_fold_due(threading, now));
        if !due {
            s.steal.clear_preempted(mem);
            return;
        }
        let rd = self.shared.steal_run_delay_ns();
        s.steal.enter(mem, threading, now, rd);
        s.pvtime.enter(mem, threading, now, rd);
    }

    /// MTTCG sampler tick, `interval_ns` after the previous one: `view` is
    /// what it saw of this vCPU then and is updated; `fold` asks for the
    /// run delay to be folded in. Decides `preempted` (x86): the vCPU was in
    /// guest code at both ticks without halting in between, its thread is
    /// off the host CPUs now after a real wait ([`descheduled`]) and is
    /// runnable — waiting on a host run queue, KVM's "preempted"
    /// (`kvm_sched_out` with the task still on the run queue). Marking it
    /// asks it to leave guest code, so the entry after its thread gets a CPU
    /// back clears the flag (a tick that finds it running clears it too).
    /// A vCPU out of
    /// guest code (halted) costs no system call: its steal is folded in at
    /// its next entry.
    pub fn sample(&self, view: &mut Option<SamplerView>, interval_ns: u64, fold: bool) -> Sampled {
        let tid = self.tid.load(Ordering::Relaxed);
        let (x86, arm) = {
            let s = self.lock();
            (s.steal.enabled(), s.pvtime.active != 0)
        };
        if tid == 0 || !(x86 || arm) {
            *view = None;
            return Sampled::Unwatched;
        }
        let v = match view {
            Some(v) if v.watch.tid() == tid => v,
            _ => view.insert(SamplerView::new(tid)),
        };
        let sched = self.shared.sched();
        let in_guest = self.in_guest.load(Ordering::Acquire);
        let halts = self.halts.load(Ordering::Acquire);
        let now = if in_guest {
            sched.cpu_ns_and_running(&v.watch)
        } else {
            None
        };
        let descheduled = x86
            && v.in_guest
            && v.halts == halts
            && match (v.cpu_ns, now) {
                (Some(then), Some((cpu, running))) => {
                    descheduled(cpu.saturating_sub(then), running, interval_ns)
                }
                _ => false,
            }
            && sched.runnable(&v.watch);
        let rd = if fold && in_guest {
            sched.run_delay_ns(&v.watch)
        } else {
            None
        };
        let marked = {
            let mem = &*self.shared.host;
            let mut s = self.lock();
            let marked = s.steal.sample(mem, rd, descheduled);
            if let Some(rd) = rd {
                s.pvtime.sample(mem, rd);
            }
            marked
        };
        if marked {
            self.request_exit();
        }
        (v.cpu_ns, v.in_guest, v.halts) = (now.map(|(cpu, _)| cpu), in_guest, halts);
        if descheduled {
            Sampled::Contended
        } else if in_guest {
            Sampled::Running
        } else {
            Sampled::Idle
        }
    }

    /// Round-robin: since when (host ns) the vCPU has been in guest code, if
    /// it is, and whether it waits for its turn (it left its last one
    /// runnable); what the sampler's time slices go by (`Sampler::tick`).
    pub fn rr_turn(&self) -> (Option<u64>, bool) {
        let since = self.turn_since_ns.load(Ordering::Acquire);
        (
            (since != 0).then_some(since),
            self.waiting.load(Ordering::Acquire),
        )
    }

    /// Whether the guest has steal time (x86) or PV stolen time (arm64) on.
    pub fn steal_on(&self) -> bool {
        let s = self.lock();
        s.steal.enabled() || s.pvtime.active != 0
    }

    /// Round-robin: end the vCPU's turn at its next translation block
    /// (QEMU's `cpu_exit`): the loop moves on to the next vCPU.
    pub fn end_turn(&self) {
        self.request_exit();
    }

    /// The vCPU's thread left guest code; `halted` if voluntarily.
    pub fn run_end(&self, halted: bool) {
        if halted {
            self.halts.fetch_add(1, Ordering::Release);
        }
        self.in_guest.store(false, Ordering::Release);
        self.local(|l| {
            if l.run_since_ns != 0 {
                let now = self.shared.virtual_ns();
                l.unhalted_ns += now.saturating_sub(l.run_since_ns);
                l.run_since_ns = 0;
            }
        });
        let threading = self.shared.threading();
        if threading == Threading::Mttcg {
            // Nothing happens at an MTTCG exit (the sampler and the next
            // entry see the host's scheduling).
            return;
        }
        self.turn_since_ns.store(0, Ordering::Release);
        self.waiting.store(!halted, Ordering::Release);
        let mut s = self.lock();
        if s.steal.enabled() || s.pvtime.active != 0 {
            let (now, rd) = (self.shared.steal_now_ns(), self.shared.steal_run_delay_ns());
            s.steal.exit(&*self.shared.host, threading, now, rd, halted);
            s.pvtime.exit(threading, now, rd, halted);
        }
    }

    /// CPUID `leaf`/`subleaf`; `tcg` is TCG's answer (EAX, EBX, ECX, EDX).
    pub fn cpuid(&self, leaf: u32, _subleaf: u32, tcg: [u32; 4]) -> Route<[u32; 4]> {
        bump(&self.routes.cpuid);
        if self.arch != Arch::X86_64 {
            return Route::Unhandled;
        }
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
            // the MSR (an AMD model with pmu=on would show it otherwise).
            1 if tcg[2] & crate::x86::cpuid::CPUID_1_ECX_PDCM != 0
                && !(config.version != 0 && !amd && config.full_width_writes) =>
            {
                let mut r = tcg;
                r[2] &= !crate::x86::cpuid::CPUID_1_ECX_PDCM;
                Route::Handled(r)
            }
            // PerfMonV2 and its number of core counters (EBX[3:0]).
            0x8000_0022 if amd && config.version >= 2 => {
                Route::Handled([1, u32::from(config.gp), 0, 0])
            }
            _ => Route::Unhandled,
        }
    }

    /// The lock-free part of the vCPU (see [`LocalCell`]); `f` must not
    /// call back into it (that panics).
    fn local<R>(&self, f: impl FnOnce(&mut Local) -> R) -> R {
        self.local.with(f)
    }

    /// A PMU MSR read: None if `index` is not one (then not the PMU's).
    fn pmu_rdmsr(&self, index: u32) -> Option<Route<u64>> {
        if !pmu::is_arch_pmu_msr(index) {
            return None;
        }
        Some(self.local(|l| {
            let ev = l.events(&self.shared, l.pmu.counts_cycles());
            match l.pmu.read_msr(index, &ev) {
                Some(v) => Route::Handled(v),
                // Not this PMU's: KVM still reads the legacy ones as 0.
                None if !l.pmu.claims(index) && pmu::kvm_reads_as_zero(index) => Route::Handled(0),
                None => Route::Fault,
            }
        }))
    }

    /// A PMU MSR write: None if `index` is not one.
    fn pmu_wrmsr(&self, index: u32, value: u64) -> Option<Route<()>> {
        if !pmu::is_arch_pmu_msr(index) {
            return None;
        }
        Some(self.local(|l| {
            if let Some(r) = l.pmu.write_quiet(index, value) {
                return r.map_or(Route::Fault, Route::Handled);
            }
            // The clock only if a cycle counter counts or may start to.
            let cycles = l.pmu.counts_cycles() || pmu::may_start_cycles(index, value);
            let ev = l.events(&self.shared, cycles);
            match l.pmu.write_msr(index, value, &ev) {
                Ok(pmi) => {
                    l.publish(&self.shared, &ev, pmi, &self.routes);
                    Route::Handled(())
                }
                // Not this PMU's: KVM still ignores writes to the legacy ones.
                Err(_) if !l.pmu.claims(index) && pmu::kvm_reads_as_zero(index) => {
                    Route::Handled(())
                }
                Err(_) => Route::Fault,
            }
        }))
    }

    /// The PMI budget ran out (see `rustkvm_x86_pmu_due`): sync, publish.
    pub fn pmu_due(&self) {
        if self.arch == Arch::Aarch64 {
            self.local(|l| {
                let ev = l.arm_events(&self.shared);
                let irq = l.arm_pmu.sync(&ev).irq;
                l.arm_publish(&self.shared, &ev, irq);
            });
            return;
        }
        self.local(|l| {
            let ev = l.events(&self.shared, l.pmu.counts_cycles());
            let pmi = l.pmu.sync(&ev);
            l.publish(&self.shared, &ev, pmi, &self.routes);
        });
    }

    /// RDMSR.
    pub fn rdmsr(&self, index: u32) -> Route<u64> {
        bump(&self.routes.rdmsr);
        if self.arch != Arch::X86_64 {
            return Route::Unhandled;
        }
        if let Some(r) = self.pmu_rdmsr(index) {
            return r;
        }
        if !self.pv_msr_allowed(index) {
            return Route::Fault;
        }
        if !owns_msr(index) {
            return Route::Unhandled;
        }
        let s = self.lock();
        Route::Handled(match index {
            MSR_KVM_STEAL_TIME => s.steal.msr,
            clock::MSR_IA32_TSC => s
                .clock
                .tsc(self.shared.tsc_rate(), self.shared.virtual_ns()),
            clock::MSR_IA32_TSC_ADJUST => s.clock.tsc_adjust,
            clock::MSR_IA32_TSC_DEADLINE => s.clock.read_deadline(),
            clock::MSR_KVM_SYSTEM_TIME | clock::MSR_KVM_SYSTEM_TIME_NEW => s.clock.system_time_msr,
            clock::MSR_KVM_WALL_CLOCK | clock::MSR_KVM_WALL_CLOCK_NEW => {
                self.shared.wall_clock_msr.load(Ordering::Relaxed)
            }
            _ => return Route::Unhandled,
        })
    }

    /// WRMSR.
    pub fn wrmsr(&self, index: u32, value: u64) -> Route<()> {
        bump(&self.routes.wrmsr);
        if self.arch != Arch::X86_64 {
            return Route::Unhandled;
        }
        let (rate, mem) = (self.shared.tsc_rate(), &*self.shared.host);
        if let Some(r) = self.pmu_wrmsr(index, value) {
            return r;
        }
        if !self.pv_msr_allowed(index) {
            return Route::Fault;
        }
        if !owns_msr(index) {
            return Route::Unhandled;
        }
        let mut s = self.lock();
        let timer = match index {
            MSR_KVM_STEAL_TIME => match s.steal.write_msr(value) {
                Ok(()) => {
                    // KVM requests a steal-time update on the write
                    // (KVM_REQ_STEAL_UPDATE): the structure is valid as soon
                    // as the guest runs again.
                    self.enter_steal(&mut s);
                    Timer::Unchanged
                }
                Err(_) => return Route::Fault,
            },
            clock::MSR_IA32_TSC | clock::MSR_IA32_TSC_ADJUST => {
                let t = if index == clock::MSR_IA32_TSC {
                    s.clock.write_tsc(rate, self.shared.virtual_ns(), value)
                } else {
                    s.clock.write_tsc_adjust(value)
                };
                // KVM_REQ_CLOCK_UPDATE: kvmclock follows the new TSC.
                s.clock.write_pvclock(mem, rate, self.kvmclock_stable());
                t
            }
            clock::MSR_IA32_TSC_DEADLINE => s.clock.write_deadline(value),
            clock::MSR_KVM_SYSTEM_TIME | clock::MSR_KVM_SYSTEM_TIME_NEW => {
                s.clock.system_time_msr = value;
                let old = index == clock::MSR_KVM_SYSTEM_TIME;
                // `kvm_write_system_time`: vCPU 0's choice of MSR decides
                // whether the VM's kvmclock can be stable (the master clock
                // needs the new one); a change rewrites every vCPU's.
                let changed = self.index == 0
                    && self
                        .shared
                        .old_kvmclock_on_boot_vcpu
                        .swap(old, Ordering::Relaxed)
                        != old;
                s.clock.write_pvclock(mem, rate, self.kvmclock_stable());
                if changed {
                    drop(s);
                    self.shared.for_each_peer(|peer| {
                        if peer.index != self.index {
                            let stable = peer.kvmclock_stable();
                            peer.lock().clock.write_pvclock(mem, rate, stable);
                        }
                    });
                    return Route::Handled(());
                }
                Timer::Unchanged
            }
            clock::MSR_KVM_WALL_CLOCK | clock::MSR_KVM_WALL_CLOCK_NEW => {
                self.shared.wall_clock_msr.store(value, Ordering::Relaxed);
                let (real, vm) = real_and_vm_ns(realtime_ns, || self.shared.virtual_ns());
                clock::write_wall_clock(mem, value, vm, real);
                Timer::Unchanged
            }
            _ => return Route::Unhandled,
        };
        drop(s);
        if timer == Timer::Changed {
            self.shared.host.tsc_deadline_changed(self.index);
        }
        Route::Handled(())
    }

    /// Whether the guest may access PV MSR `index` (any other MSR: yes):
    /// KVM's `guest_pv_has` — always without enforcement, else only with
    /// its feature advertised.
    fn pv_msr_allowed(&self, index: u32) -> bool {
        crate::x86::cpuid::pv_msr_feature(index).is_none_or(|f| self.pv_enforced().allows(f))
    }

    /// The enforcement the hypercalls and PV MSRs see.
    fn pv_enforced(&self) -> hypercall::Enforce {
        hypercall::Enforce(
            self.pv_enforce
                .load(Ordering::Relaxed)
                .then(|| self.kvm_features.load(Ordering::Relaxed)),
        )
    }

    /// x86, after each setup: whether PV CPUID is enforced
    /// (`-cpu ...,kvm-pv-enforce-cpuid=on`).
    pub fn x86_enforce_pv_cpuid(&self, on: bool) {
        self.pv_enforce.store(on, Ordering::Relaxed);
    }

    /// PVCLOCK_TSC_STABLE_BIT for this vCPU's kvmclock: advertised, and
    /// KVM's master clock possible (vCPU 0 not on the legacy MSR).
    fn kvmclock_stable(&self) -> bool {
        self.kvm_features.load(Ordering::Relaxed) & KVM_FEATURE_CLOCKSOURCE_STABLE_BIT != 0
            && !self
                .shared
                .old_kvmclock_on_boot_vcpu
                .load(Ordering::Relaxed)
    }

    /// x86, after each reset: the CPU model's TSC frequency (0: default;
    /// the first vCPU's sets the VM's), advertised KVM feature bits, the
    /// PMU (`PMU_*`) and the counting engine's state (reset here; null:
    /// no engine, the PMU then only sees cycles). After an INIT
    /// ([`ResetKind::Init`]) the PMU and the engine's state are kept.
    pub fn x86_setup(
        &self,
        tsc_khz: u64,
        kvm_features: u32,
        pmu: u32,
        counting: Option<CountingPtr>,
    ) {
        self.shared.set_tsc_khz(tsc_khz);
        self.kvm_features.store(kvm_features, Ordering::Relaxed);
        let n = self.shared.pmu_counters();
        let config = if pmu & 0xff == PMU_INTEL {
            PmuConfig {
                gp: if n == 0 { PmuConfig::TCG.gp } else { n },
                full_width_writes: pmu & PMU_FULL_WIDTH != 0,
                ..PmuConfig::TCG
            }
        } else if pmu & 0xff == PMU_AMD {
            let gp = if n == 0 { pmu::MAX_AMD_GP as u8 } else { n };
            PmuConfig::amd(pmu & PMU_PERFCTR_CORE != 0, pmu & PMU_PERFMON_V2 != 0, gp)
        } else {
            PmuConfig::OFF
        };
        self.local(|l| {
            let init = std::mem::take(&mut l.init_pending);
            if init && l.pmu.config == config && l.counting == counting {
                // INIT: the PMU keeps its registers and goes on counting
                // (KVM has no PMU reset on INIT); tell the engine again
                // what it needs, as QEMU's reset stopped counting blocks.
                let ev = l.events(&self.shared, l.pmu.counts_cycles());
                l.publish(&self.shared, &ev, 0, &self.routes);
                return;
            }
            *l = Local {
                pmu: Pmu::new(config),
                counting,
                ..Local::default()
            };
            if let Some(c) = l.counting() {
                *c = Counting::default();
            }
        });
    }

    /// RDTSC: the guest TSC now.
    pub fn rdtsc(&self) -> u64 {
        let now = self.shared.virtual_ns();
        self.lock().clock.tsc(self.shared.tsc_rate(), now)
    }

    /// The LVT timer register was written (`restore`: from a saved machine).
    pub fn lvtt_write(&self, lvt: u32, restore: bool) {
        let mut s = self.lock();
        if restore {
            s.clock.lvtt_mode = ((lvt >> clock::LVT_TIMER_MODE_SHIFT) & 3) as u8;
            return;
        }
        let changed = s.clock.write_lvtt(lvt);
        drop(s);
        if changed == Timer::Changed {
            self.shared.host.tsc_deadline_changed(self.index);
        }
    }

    /// When the TSC-deadline timer is due (VM ns), if armed.
    pub fn tsc_deadline_ns(&self) -> Option<u64> {
        let now = self.shared.virtual_ns();
        self.lock().clock.deadline_ns(self.shared.tsc_rate(), now)
    }

    /// The APIC timer went off: whether the deadline was reached (disarmed).
    pub fn tsc_deadline_fire(&self) -> bool {
        let now = self.shared.virtual_ns();
        self.lock()
            .clock
            .deadline_expired(self.shared.tsc_rate(), now)
    }

    /// The MSRs QEMU saves.
    pub fn save_msrs(&self) -> SavedMsrs {
        let s = self.lock();
        SavedMsrs {
            steal_time: s.steal.msr,
            tsc: s
                .clock
                .tsc(self.shared.tsc_rate(), self.shared.virtual_ns()),
            tsc_adjust: s.clock.tsc_adjust,
            tsc_deadline: s.clock.tsc_deadline,
            system_time: s.clock.system_time_msr,
            wall_clock: self.shared.wall_clock_msr.load(Ordering::Relaxed),
            pmu: self.local(|l| {
                let ev = l.events(&self.shared, l.pmu.counts_cycles());
                l.pmu.save(&ev)
            }),
        }
    }

    /// Take them back after QEMU loaded the vCPU (loadvm, incoming
    /// migration): host-initiated writes, which do not move TSC_ADJUST or
    /// rewrite the wall clock; kvmclock is rewritten for the restored TSC.
    pub fn load_msrs(&self, m: &SavedMsrs) {
        self.load_steal_time_msr(m.steal_time);
        let (rate, now) = (self.shared.tsc_rate(), self.shared.virtual_ns());
        let mut s = self.lock();
        s.clock.restore_tsc(rate, now, m.tsc);
        s.clock.tsc_adjust = m.tsc_adjust;
        s.clock.tsc_deadline = m.tsc_deadline;
        s.clock.system_time_msr = m.system_time;
        s.clock
            .write_pvclock(&*self.shared.host, rate, self.kvmclock_stable());
        self.shared
            .wall_clock_msr
            .store(m.wall_clock, Ordering::Relaxed);
        drop(s);
        self.local(|l| {
            let ev = l.events(&self.shared, true);
            l.pmu.load(&m.pmu, &ev);
            l.publish(&self.shared, &ev, 0, &self.routes);
        });
    }

    /// RDPMC (the CR4.PCE/CPL #GP rule has already been applied by QEMU).
    pub fn rdpmc(&self, ecx: u32) -> Route<u64> {
        bump(&self.routes.rdpmc);
        if self.arch != Arch::X86_64 {
            return Route::Unhandled;
        }
        self.local(|l| {
            let ev = l.events(&self.shared, l.pmu.counts_cycles());
            // With no PMU KVM's kvm_pmu_rdpmc fails too: #GP (TCG: #UD).
            l.pmu.rdpmc(ecx, &ev).map_or(Route::Fault, Route::Handled)
        })
    }

    /// A KVM hypercall (VMCALL/VMMCALL). IPIs are sent here; kicks and
    /// yields are left to the accelerator.
    #[inline]
    pub fn hypercall(&self, call: hypercall::Call) -> hypercall::Outcome {
        bump(&self.routes.hypercall);
        hypercall::handle(call, self.pv_enforced(), &mut HypercallServices(self))
    }

    /// Record a KVM_HC_KICK_CPU aimed at this vCPU.
    pub fn pv_kick(&self) {
        self.pv_unhalt.store(true, Ordering::Release);
    }

    /// Consume a pending kick: true if one was pending.
    pub fn take_pv_unhalt(&self) -> bool {
        self.pv_unhalt.swap(false, Ordering::AcqRel)
    }

    /// HVC/SMC with x0..x7 on the PSCI conduit (either instruction: KVM
    /// answers SMCCC on whichever conduit the machine describes); a handled
    /// call returns x0..x3, anything else is PSCI's.
    pub fn hvc_smc(&self, _is_smc: bool, regs: [u64; 8]) -> Route<[u64; 4]> {
        bump(&self.routes.hvc_smc);
        if self.arch != Arch::Aarch64 {
            return Route::Unhandled;
        }
        match smccc::Call::decode(&regs) {
            Some(call) => {
                let mut svc = SmcccServices {
                    state: &mut self.lock(),
                    vcpu: self,
                };
                Route::Handled(smccc::handle(call, &mut svc))
            }
            None => Route::Unhandled,
        }
    }

    /// The machine gives this vCPU its PV stolen-time structure (QEMU's
    /// virt board, like `KVM_ARM_VCPU_PVTIME_IPA`).
    pub fn set_pvtime_base(&self, ipa: u64) -> Result<(), PvTimeError> {
        self.lock().pvtime.set_base(ipa)
    }

    /// Whether the guest uses PV stolen time (saved with the vCPU).
    pub fn pvtime_active(&self) -> bool {
        self.lock().pvtime.active != 0
    }

    /// Restore the guest's use of PV stolen time (loadvm, incoming
    /// migration): updates resume without a new PV_TIME_ST, as under KVM,
    /// and accounting restarts from the next entry.
    pub fn load_pvtime_active(&self, active: bool) {
        let mut s = self.lock();
        s.pvtime.reset();
        s.pvtime.active = u8::from(active && s.pvtime.available());
    }

    /// An access to the arm64 PMU register `encoding` (KVM `sys_reg()`):
    /// Unhandled unless it is one and the vCPU has PMUv3.
    fn arm_pmu_access<T>(
        &self,
        encoding: u32,
        f: impl FnOnce(&mut Local, crate::arm::pmu::PmuReg, &crate::arm::pmu::Events) -> Route<T>,
    ) -> Route<T> {
        let Some(reg) = crate::arm::pmu::PmuReg::decode(encoding) else {
            return Route::Unhandled;
        };
        self.local(|l| {
            if !l.arm_pmu.present() {
                return Route::Unhandled;
            }
            let ev = l.arm_events(&self.shared);
            f(l, reg, &ev)
        })
    }

    /// MRS of a PMU system register (KVM `sys_reg()` encoding) at `el`.
    pub fn pmu_read(&self, encoding: u32, el: u32) -> Route<u64> {
        bump(&self.routes.pmu_read);
        self.arm_pmu_access(encoding, |l, reg, ev| {
            l.arm_pmu
                .read(reg, el.min(1) as u8, ev)
                .map_or(Route::Fault, Route::Handled)
        })
    }

    /// MSR of a PMU system register (KVM `sys_reg()` encoding) at `el`.
    pub fn pmu_write(&self, encoding: u32, el: u32, value: u64) -> Route<()> {
        bump(&self.routes.pmu_write);
        self.arm_pmu_access(encoding, |l, reg, ev| {
            match l.arm_pmu.write(reg, value, el.min(1) as u8, ev) {
                Ok(fx) => {
                    l.arm_publish(&self.shared, ev, fx.irq);
                    Route::Handled(())
                }
                Err(_) => Route::Fault,
            }
        })
    }

    /// The x86 PMU this vCPU has, for `query-rustkvm`.
    pub fn x86_pmu_shape(&self) -> crate::info::X86PmuShape {
        self.local(|l| crate::info::X86PmuShape::from_config(l.pmu.config))
    }

    /// The arm64 PV time structure's IPA if the guest asked for it
    /// (PV_TIME_ST since the last reset), else 0.
    pub fn arm_pvtime_ipa(&self) -> u64 {
        let s = self.lock();
        if s.pvtime.active != 0 {
            s.pvtime.base
        } else {
            0
        }
    }

    /// What `query-rustkvm` reports for an arm64 vCPU: the PMU and PV time
    /// from the models, the structure's bytes as read from guest memory
    /// (None if unread), QEMU's timer registers.
    pub fn arm_info(
        &self,
        pvtime: Option<&[u8; 64]>,
        timers: crate::info::ArmTimers,
    ) -> crate::info::VcpuInfo {
        let ipa = self.arm_pvtime_ipa();
        let regs = self.arm_pmu_save();
        let config = self.local(|l| l.arm_pmu.config());
        let pmu = config.counters.map(|n| crate::info::ArmPmu {
            counters: usize::from(n),
            v3p5: config.v3p5,
            regs: &regs,
        });
        crate::info::arm(pmu, (ipa != 0, ipa, pvtime), timers)
    }

    /// Whether the vCPU has rustkvm's arm64 PMUv3.
    pub fn arm_pmu_present(&self) -> bool {
        self.local(|l| l.arm_pmu.present())
    }

    /// The arm64 PMU registers to save (the vCPU is stopped).
    pub fn arm_pmu_save(&self) -> [u64; crate::arm::pmu::SAVED_REGS] {
        self.local(|l| {
            let ev = l.arm_events(&self.shared);
            l.arm_pmu.save_regs(&ev)
        })
    }

    /// Load saved arm64 PMU registers (the vCPU is stopped).
    pub fn arm_pmu_load(&self, regs: &[u64; crate::arm::pmu::SAVED_REGS]) {
        self.local(|l| {
            let ev = l.arm_events(&self.shared);
            let irq = l.arm_pmu.load_regs(regs, &ev).irq;
            l.arm_publish(&self.shared, &ev, irq);
        });
    }

    /// arm64, after each reset: the vCPU's PMUv3 (None: none; Some(n): n
    /// event counters), PMUv3p5, and the counting engine's state (reset).
    pub fn arm_setup(&self, counters: Option<u8>, v3p5: bool, counting: Option<CountingPtr>) {
        self.local(|l| {
            *l = Local {
                arm_pmu: crate::arm::pmu::Pmu::new(crate::arm::pmu::PmuConfig { counters, v3p5 }),
                counting,
                ..Local::default()
            };
            if let Some(c) = l.counting() {
                *c = Counting::default();
            }
        });
    }
}

/// Host real time, ns since the Unix epoch.
/// The x86 MSRs rustkvm implements besides the PMU's: everything else is
/// TCG's, answered without taking the vCPU lock.
fn owns_msr(index: u32) -> bool {
    matches!(
        index,
        MSR_KVM_STEAL_TIME
            | clock::MSR_IA32_TSC
            | clock::MSR_IA32_TSC_ADJUST
            | clock::MSR_IA32_TSC_DEADLINE
            | clock::MSR_KVM_SYSTEM_TIME
            | clock::MSR_KVM_SYSTEM_TIME_NEW
            | clock::MSR_KVM_WALL_CLOCK
            | clock::MSR_KVM_WALL_CLOCK_NEW
    )
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Host real time and VM time as one consistent pair, as KVM reads the
/// host's clocks under one seqcount (`kvm_get_wall_clock_epoch`,
/// `kvm_get_time_and_clockread`): of up to [`PAIR_TRIES`] rounds of reads
/// real, VM, real, the first whose real-time reads lie within
/// [`PAIR_GAP_NS`] of each other, else the closest one; real time is their
/// midpoint. A host stall between two reads would otherwise move the
/// guest's wall clock by the stall (seen: 160 ms ahead on a loaded host).
fn real_and_vm_ns(mut real: impl FnMut() -> u64, mut vm: impl FnMut() -> u64) -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..PAIR_TRIES {
        let r1 = real();
        let v = vm();
        let r2 = real().max(r1);
        let gap = r2 - r1;
        if gap < best.0 {
            best = (gap, r1 + gap / 2, v);
        }
        if gap <= PAIR_GAP_NS {
            break;
        }
    }
    (best.1, best.2)
}

/// Rounds [`real_and_vm_ns`] tries at most.
const PAIR_TRIES: u32 = 8;
/// A gap between the real-time reads that ends [`real_and_vm_ns`]'s tries.
const PAIR_GAP_NS: u64 = 100_000;

/// The vCPU as the hypercall handler sees it.
struct HypercallServices<'a>(&'a Vcpu);

impl hypercall::Services for HypercallServices<'_> {
    fn send_ipi(&mut self, apic_id: u32, icr: u32) -> bool {
        self.0.shared.host.send_ipi(apic_id, icr)
    }

    /// `struct kvm_clock_pairing` (64 bytes): sec, nsec, tsc, flags 0, pad.
    fn clock_pairing(&mut self, gpa: u64) -> bool {
        let v = self.0;
        let (real, now) = real_and_vm_ns(realtime_ns, || v.shared.virtual_ns());
        let tsc = v.lock().clock.tsc(v.shared.tsc_rate(), now);
        let pairing = clock::KvmClockPairing {
            sec: (real / 1_000_000_000) as i64,
            nsec: (real % 1_000_000_000) as i64,
            tsc,
            ..Default::default()
        };
        v.shared.host.write(gpa, &pairing.to_bytes())
    }
}

/// The vCPU as the SMCCC handler sees it.
struct SmcccServices<'a> {
    state: &'a mut VcpuState,
    vcpu: &'a Vcpu,
}

impl smccc::Services for SmcccServices<'_> {
    fn pv_time_available(&self) -> bool {
        self.state.pvtime.available()
    }
    fn pv_time_init(&mut self) -> Option<u64> {
        let base = self.state.pvtime.init(&*self.vcpu.shared.host)?;
        // The first entry after this synchronises the clock.
        self.vcpu.enter_steal(self.state);
        Some(base)
    }
    fn random(&mut self, buf: &mut [u64; 3]) {
        crate::host::random(buf);
    }
}

/// A spinning vCPU looks at the others at most this often (host ns).
pub const PEER_LOOK_NS: u64 = 50_000;

/// What a sampler tick found of one vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampled {
    /// Steal time and PV time off (or the vCPU never ran): not worth watching.
    Unwatched,
    /// Watched, out of guest code (halted).
    Idle,
    /// Watched, in guest code and getting its CPU.
    Running,
    /// Watched, in guest code and kept off the host CPUs (marked preempted).
    Contended,
}

/// What the MTTCG sampler saw of one vCPU at its previous tick.
#[derive(Debug)]
pub struct SamplerView {
    watch: crate::host::ThreadWatch,
    /// The thread's CPU clock then (None: unreadable, or the first tick).
    cpu_ns: Option<u64>,
    /// The vCPU was in guest code then.
    in_guest: bool,
    /// Its halt count then.
    halts: u64,
}

impl SamplerView {
    fn new(tid: i32) -> Self {
        SamplerView {
            watch: crate::host::ThreadWatch::new(tid),
            cpu_ns: None,
            in_guest: false,
            halts: 0,
        }
    }
}

/// Whether a vCPU thread that had guest code to run for a whole sampling
/// interval of `interval_ns`, and ran `cpu_ns` of it, is descheduled now:
/// it is not on a CPU at this moment (`running` false: its CPU clock stood
/// still between two reads) and was kept off the CPUs for at least a fifth
/// of the interval — which a thread that the sampler itself displaced for a
/// few microseconds (one host CPU for all) was not.
pub fn descheduled(cpu_ns: u64, running: bool, interval_ns: u64) -> bool {
    !running
        && interval_ns > 0
        && interval_ns.saturating_sub(cpu_ns).saturating_mul(5) >= interval_ns
}

/// A [`Counting`] for tests, on the heap behind one raw pointer that the test
/// and the vCPU it is given to both go through, as QEMU's translated code and
/// rustkvm do: no reference to it outlives one access.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TestCounting(NonNull<Counting>);

#[cfg(test)]
impl TestCounting {
    /// A new one holding `c`.
    pub(crate) fn new(c: Counting) -> Self {
        TestCounting(NonNull::from(Box::leak(Box::new(c))))
    }

    /// What a vCPU is given. The caller keeps `self` alive as long as that
    /// vCPU may use it.
    pub(crate) fn ptr(&self) -> Option<CountingPtr> {
        // SAFETY: valid until `self` drops (the caller's part); a test is
        // one thread, and its accesses go through the same pointer.
        unsafe { CountingPtr::new(self.0.as_ptr()) }
    }

    /// A copy of its contents.
    pub(crate) fn get(&self) -> Counting {
        // SAFETY: valid; no reference to it is live between accesses.
        unsafe { self.0.as_ptr().read() }
    }

    /// Change its contents.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Counting)) {
        // SAFETY: as in `get`; the `&mut` lives only during `f`.
        f(unsafe { &mut *self.0.as_ptr() })
    }
}

#[cfg(test)]
impl Drop for TestCounting {
    fn drop(&mut self) {
        // SAFETY: from Box::leak in `new`, freed once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn descheduled_means_off_the_cpu_now_after_a_real_wait() {
        let ms = 1_000_000;
        assert!(descheduled(0, false, ms), "off for the whole interval");
        assert!(
            descheduled(800_000, false, ms),
            "just switched out, 0.2 ms off"
        );
        assert!(
            !descheduled(990_000, false, ms),
            "displaced by the sampler only"
        );
        assert!(!descheduled(0, true, ms), "running now, whatever it ran");
        assert!(!descheduled(ms, false, ms));
        assert!(!descheduled(2 * ms, false, 0), "no interval");
    }

    use super::*;

    #[test]
    fn no_feature_claims_anything_yet() {
        let v = Vcpu::new(0, Arch::X86_64);
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
        let a = Vcpu::new(1, Arch::Aarch64);
        assert_eq!(
            a.hvc_smc(false, [0x8400_0000, 0, 0, 0, 0, 0, 0, 0]),
            Route::Unhandled,
            "PSCI_VERSION is QEMU's"
        );
        assert_eq!(a.pmu_read(0xdce0, 1), Route::Unhandled, "no PMUv3 set up");
        assert_eq!(a.pmu_write(0xdce0, 1, 1), Route::Unhandled);
    }

    #[test]
    fn the_pmu_reads_the_engines_totals_and_publishes_what_it_needs() {
        let v = Vcpu::new(0, Arch::X86_64);
        let c = TestCounting::new(Counting {
            events: [7; 12],
            budget: 3,
            ..Counting::default()
        });
        v.x86_setup(0, 0, PMU_INTEL, c.ptr());
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
        v.x86_setup(0, 0, PMU_INTEL | PMU_FULL_WIDTH, c.ptr());
        assert_eq!(v.rdmsr(0x345), Route::Handled(1 << 13), "PDCM: FW_WRITE");
        assert_eq!(v.wrmsr(0x4c1, 1 << 40), Route::Handled(()), "full width");
        assert_eq!(v.rdpmc(0), Route::Handled(1 << 40));
        v.x86_setup(0, 0, PMU_NONE, None);
        assert_eq!(v.cpuid(0xa, 0, [0; 4]), Route::Unhandled);
    }

    #[test]
    fn an_amd_pmu_shows_in_amds_leaves_and_not_in_intels() {
        let v = Vcpu::new(0, Arch::X86_64);
        let tcg = [0, 0, 1 << 23 | 1, 0];
        // No PMU: PerfCtrExtCore is taken out of 0x80000001 ECX (as KVM).
        assert_eq!(v.cpuid(0x8000_0001, 0, tcg), Route::Handled([0, 0, 1, 0]));
        v.x86_setup(0, 0, PMU_AMD | PMU_PERFCTR_CORE | PMU_PERFMON_V2, None);
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
        v.x86_setup(0, 0, PMU_AMD, None);
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
    #[test]
    fn amd_k7_msrs_of_counters_a_perfmon_v2_pmu_lacks_fault() {
        let vm = crate::Vm::new(
            crate::VmConfig::new(Arch::X86_64, 1, false)
                .unwrap()
                .with_pmu_counters(2)
                .unwrap(),
        );
        let v = vm.create_vcpu(0).unwrap();
        let v2 = PMU_AMD | PMU_PERFCTR_CORE | PMU_PERFMON_V2;
        v.x86_setup(0, 0, v2, None);
        assert_eq!(v.rdmsr(0xc001_0005), Route::Handled(0), "counter 1 exists");
        for msr in [0xc001_0002, 0xc001_0003, 0xc001_0006, 0xc001_0007] {
            assert_eq!(v.rdmsr(msr), Route::Fault, "{msr:#x}");
            assert_eq!(v.wrmsr(msr, 0), Route::Fault, "{msr:#x}");
        }
        assert_eq!(v.rdmsr(0xc1), Route::Handled(0), "Intel's legacy MSRs: 0");
        v.x86_setup(0, 0, PMU_NONE, None);
        assert_eq!(v.rdmsr(0xc001_0007), Route::Handled(0), "no PMU: 0");
    }

    #[test]
    fn the_arm64_pmu_reads_the_engines_totals_and_drives_the_interrupt_level() {
        use crate::arm::pmu::{evtyper, pmcr};
        let v = Vcpu::new(0, Arch::Aarch64);
        let c = TestCounting::new(Counting::default());
        v.arm_setup(Some(6), true, c.ptr());
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
    fn steal_time_msr_is_kvms_and_reset_turns_it_off() {
        let v = Vcpu::new(0, Arch::X86_64);
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0));
        assert_eq!(
            v.wrmsr(MSR_KVM_STEAL_TIME, 0x1002),
            Route::Fault,
            "reserved bit 1"
        );
        assert_eq!(v.wrmsr(MSR_KVM_STEAL_TIME, 0x1001), Route::Handled(()));
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0x1001));
        v.run_begin(); // no memory: nothing written, no crash
        v.run_end(false);
        v.reset(ResetKind::Cold);
        assert_eq!(v.rdmsr(MSR_KVM_STEAL_TIME), Route::Handled(0));
        let a = Vcpu::new(0, Arch::Aarch64);
        assert_eq!(a.rdmsr(MSR_KVM_STEAL_TIME), Route::Unhandled);
    }

    #[test]
    fn the_wall_clock_pair_skips_a_round_with_a_host_stall() {
        // Round 1: stalled 160 ms between the real-time reads; round 2: not.
        let reals = std::cell::RefCell::new(vec![1_000, 160_001_000, 200_000_000, 200_000_050]);
        let vms = std::cell::RefCell::new(vec![500, 199_999_525]);
        let next = |v: &std::cell::RefCell<Vec<u64>>| v.borrow_mut().remove(0);
        let (real, vm) = real_and_vm_ns(|| next(&reals), || next(&vms));
        assert_eq!((real, vm), (200_000_025, 199_999_525));
        assert_eq!(real - vm, 500, "the epoch of the stall-free round");
        // Always stalled: the closest round.
        let mut t = 0u64;
        let (real, _) = real_and_vm_ns(
            || {
                t += 1_000_000;
                t
            },
            || 0,
        );
        assert_eq!(real, 1_500_000);
    }

    #[test]
    #[should_panic(expected = "entered twice at once")]
    fn a_vcpus_lock_free_state_cannot_be_entered_twice() {
        // A re-entry (or a second thread) gets a panic, never a second
        // `&mut Local`.
        let v = Vcpu::new(0, Arch::X86_64);
        v.local(|_| v.local(|_| ()));
    }

    /// QEMU's INIT as `do_cpu_init` drives it: the INIT, then the
    /// `cpu_reset()` it emulates the rest with (a cold reset, then setup).
    fn qemu_init(v: &Vcpu, features: u32, pmu: u32, c: &TestCounting) {
        v.reset(ResetKind::Init);
        v.reset(ResetKind::Cold);
        v.x86_setup(0, features, pmu, c.ptr());
    }

    /// ... and its RESET: `cpu_reset()` alone.
    fn qemu_reset(v: &Vcpu, features: u32, pmu: u32, c: &TestCounting) {
        v.reset(ResetKind::Cold);
        v.x86_setup(0, features, pmu, c.ptr());
    }

    #[test]
    fn x86_init_keeps_the_pmu_and_tsc_and_turns_pv_areas_off_as_kvm() {
        use crate::x86::clock::{MSR_IA32_TSC, MSR_IA32_TSC_ADJUST, MSR_KVM_SYSTEM_TIME_NEW};
        use crate::x86::cpuid::KVM_DEFAULT_FEATURES;
        let v = Vcpu::new(1, Arch::X86_64);
        let c = TestCounting::new(Counting::default());
        let features = KVM_DEFAULT_FEATURES;
        qemu_reset(&v, features, PMU_INTEL, &c);
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

        qemu_init(&v, features, PMU_INTEL, &c);
        assert_eq!(
            v.state().resets,
            2,
            "the INIT's own cpu_reset does not count"
        );
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
        v.reset(ResetKind::Init);
        v.reset(ResetKind::Cold);
        assert_eq!(
            v.rdmsr(wall),
            Route::Handled(0x3000),
            "INIT: the VM's, kept"
        );
        v.x86_setup(0, features, PMU_INTEL, c.ptr());
        qemu_reset(&v, features, PMU_INTEL, &c);
        assert_eq!(v.rdmsr(wall), Route::Handled(0), "RESET clears it");
        assert_eq!(v.rdmsr(0x186), Route::Handled(0));
        assert_eq!(v.rdpmc(0), Route::Handled(0));
        assert_eq!((c.get().active, c.get().events), (0, [0; 12]));
        assert_eq!(v.rdmsr(MSR_IA32_TSC_ADJUST), Route::Handled(0));
        assert_eq!(v.state().resets, 4);
        // Without kvmclock in CPUID, QEMU leaves KVM's wall clock alone.
        qemu_reset(&v, 0, PMU_INTEL, &c);
        assert_eq!(v.wrmsr(wall, 0x3000), Route::Handled(()));
        qemu_reset(&v, 0, PMU_INTEL, &c);
        assert_eq!(v.rdmsr(wall), Route::Handled(0x3000));
    }

    #[test]
    fn arm64_has_no_init_a_requested_one_is_a_reset() {
        let a = Vcpu::new(0, Arch::Aarch64);
        assert!(a.set_pvtime_base(0x90a_0040).is_ok());
        let st = [0xc500_0021, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(a.hvc_smc(true, st), Route::Handled([0x90a_0040, 0, 0, 0]));
        a.reset(ResetKind::Init);
        assert!(!a.pvtime_active());
        a.reset(ResetKind::Cold);
        assert_eq!(a.state().resets, 2, "no INIT pending to swallow the reset");
    }

    #[test]
    fn smccc_is_answered_on_arm64_and_pv_time_needs_the_machines_structure() {
        let a = Vcpu::new(0, Arch::Aarch64);
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
        a.reset(ResetKind::Cold);
        assert!(!a.pvtime_active(), "reset forgets the guest's use");
        a.load_pvtime_active(true);
        assert!(a.pvtime_active(), "loadvm restores it");
        let x = Vcpu::new(0, Arch::X86_64);
        assert_eq!(x.hvc_smc(false, version), Route::Unhandled);
        x.load_pvtime_active(true);
        assert!(!x.pvtime_active(), "no structure, no PV time");
    }

    #[test]
    fn kicks_are_remembered_until_consumed_once() {
        let v = Vcpu::new(0, Arch::X86_64);
        assert!(!v.take_pv_unhalt());
        v.pv_kick();
        v.pv_kick();
        assert!(v.take_pv_unhalt());
        assert!(!v.take_pv_unhalt(), "two kicks before a halt unhalt once");
    }

    #[test]
    fn routes_and_resets_are_counted() {
        let v = Vcpu::new(3, Arch::X86_64);
        v.reset(ResetKind::Cold);
        v.reset(ResetKind::Cold);
        v.cpuid(0, 0, [0; 4]);
        v.rdmsr(0x1b);
        v.rdmsr(0x1b);
        v.wrmsr(0x1b, 0);
        v.rdpmc(0);
        assert_eq!(v.state().resets, 2);
        assert_eq!(
            v.routes(),
            RouteCounts {
                cpuid: 1,
                rdmsr: 2,
                wrmsr: 1,
                rdpmc: 1,
                ..RouteCounts::default()
            }
        );
        assert_eq!(
            v.routes().to_string(),
            "cpuid=1 rdmsr=2 wrmsr=1 rdpmc=1 hypercall=0 hvc_smc=0 pmu_read=0 pmu_write=0 pmi=0"
        );
    }
}
