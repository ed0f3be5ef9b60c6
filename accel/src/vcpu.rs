//! One vCPU: the core both architectures share — steal accounting, exit
//! requests, route counts, the registry's view of it — and the
//! architecture's own state ([`crate::x86::vcpu::X86Vcpu`],
//! [`crate::arm::vcpu::ArmVcpu`]), whose modules hold the routing points.
//!
//! Every routing point answers with a [`Route`]. What no model claims (the
//! PMU, steal time, kvmclock and the TSC, hypercalls, SMCCC, PV time) is
//! [`Route::Unhandled`], and QEMU does exactly what TCG does.

use std::cell::UnsafeCell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::arm::vcpu::{Arm, ArmVcpu};
use crate::machine::{Arch, Shared};
use crate::memory::NoMemory;
use crate::steal::{StealArea, Threading};
use crate::x86::pmu::Counting;
use crate::x86::vcpu::{X86Vcpu, X86};
pub use crate::x86::ResetKind;

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
    /// x86 EOIs the guest made in memory (PV EOI).
    pub pv_eoi: u64,
}

impl fmt::Display for RouteCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpuid={} rdmsr={} wrmsr={} rdpmc={} hypercall={} hvc_smc={} pmu_read={} pmu_write={} pmi={} pv_eoi={}",
            self.cpuid,
            self.rdmsr,
            self.wrmsr,
            self.rdpmc,
            self.hypercall,
            self.hvc_smc,
            self.pmu_read,
            self.pmu_write,
            self.pmi,
            self.pv_eoi
        )
    }
}

/// The live counters behind [`RouteCounts`]: only the vCPU's own thread
/// bumps them (a plain load and store, no atomic read-modify-write and no
/// lock on the routing paths); other threads read a snapshot.
#[derive(Debug, Default)]
pub struct RouteCounters {
    pub(crate) cpuid: AtomicU64,
    pub(crate) rdmsr: AtomicU64,
    pub(crate) wrmsr: AtomicU64,
    pub(crate) rdpmc: AtomicU64,
    pub(crate) hypercall: AtomicU64,
    pub(crate) hvc_smc: AtomicU64,
    pub(crate) pmu_read: AtomicU64,
    pub(crate) pmu_write: AtomicU64,
    pub(crate) pmi: AtomicU64,
    pub(crate) pv_eoi: AtomicU64,
}

/// Count one more (the vCPU's own thread only).
pub(crate) fn bump(c: &AtomicU64) {
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
            pv_eoi: g(&self.pv_eoi),
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
    /// as a vCPU given it (by the x86 or arm64 setup) keeps it, and that
    /// nothing else accesses while that vCPU's thread runs guest code or a
    /// routing point, other than that thread's translated code: QEMU's
    /// contract for its CPU state (rustkvm.h), and a test's for its own
    /// `Counting`.
    pub unsafe fn new(ptr: *mut Counting) -> Option<Self> {
        NonNull::new(ptr).map(CountingPtr)
    }

    /// The engine's state, for the holder of the vCPU's [`LocalCell`].
    ///
    /// # Safety
    /// The caller holds the `LocalCell` of the vCPU this pointer was given
    /// to, and no other reference to the `Counting` is live.
    pub(crate) unsafe fn get<'a>(self) -> &'a mut Counting {
        // SAFETY: valid (`new`'s contract) and not accessed by anyone else
        // while the vCPU's `LocalCell` is held (this function's contract).
        unsafe { &mut *self.0.as_ptr() }
    }
}

// SAFETY: the pointee is reached only through a vCPU's `LocalCell`, under
// its one-holder rule, as `CountingPtr::new`'s contract allows from any thread.
unsafe impl Send for CountingPtr {}

/// vCPU state only the vCPU's own thread touches — or one thread while the
/// vCPU is stopped (reset, savevm/loadvm) — so it needs no lock: the PMU,
/// which every PMU register access, RDPMC and PMI reaches. QEMU reaches it
/// from that vCPU's thread, or from one thread while the vCPU is stopped
/// (rustkvm.h: the routing points, run begin/end, setup at reset,
/// savevm/loadvm); [`LocalCell::with`] enforces it, so that no safe call
/// can race: a second holder at once (another thread, or a re-entry from
/// inside `with`) panics (the process aborts: `panic = "abort"`) instead of
/// getting a second `&mut`. One uncontended compare-exchange per access.
#[derive(Debug, Default)]
pub(crate) struct LocalCell<T> {
    held: AtomicBool,
    local: UnsafeCell<T>,
}

// SAFETY: `local` is reached only through `with`, which admits one holder at
// a time (`held`, taken with Acquire and given back with Release, orders
// each holder's accesses after the previous holder's); `T` is `Send`.
unsafe impl<T: Send> Sync for LocalCell<T> {}

impl<T> LocalCell<T> {
    /// Run `f` on the state, as its only holder; `f` must not call back
    /// into it (that panics).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
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
        // no other reference to the state exists meanwhile.
        f(unsafe { &mut *self.local.get() })
    }
}

/// Unhalted cycles of a vCPU with a PMU: VM nanoseconds spent in guest code.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unhalted {
    /// Completed stretches so far ...
    ns: u64,
    /// ... and when the current one began (VM ns; 0: not in guest code).
    since_ns: u64,
}

impl Unhalted {
    /// Entry into guest code at VM time `now_ns`.
    fn begin(&mut self, now_ns: u64) {
        self.since_ns = now_ns.max(1);
    }

    /// Exit from guest code at VM time `now_ns`.
    fn end(&mut self, now_ns: u64) {
        if self.since_ns != 0 {
            self.ns += now_ns.saturating_sub(self.since_ns);
            self.since_ns = 0;
        }
    }

    /// Unhalted cycles so far, at the guest TSC rate.
    pub(crate) fn cycles(&self, shared: &Shared) -> u64 {
        let mut ns = self.ns;
        if self.since_ns != 0 {
            ns += shared.virtual_ns().saturating_sub(self.since_ns);
        }
        shared.tsc_rate().ticks(ns)
    }
}

/// The lock-free per-architecture state the core drives at entry and exit.
pub(crate) trait PmuClock {
    /// Whether the vCPU has a PMU (then its unhalted cycles are kept).
    fn has_pmu(&self) -> bool;
    /// Its unhalted cycles.
    fn unhalted(&mut self) -> &mut Unhalted;
}

/// The architecture's part of a [`Vcpu`]: an x86 vCPU carries no arm64
/// state and the reverse (each boxed, so neither carries the other's size).
#[derive(Debug)]
pub(crate) enum ArchVcpu {
    /// x86: PMU, steal time, TSC and kvmclock, PV MSRs and hypercalls.
    X86(Box<X86Vcpu>),
    /// arm64: PMUv3, PV stolen time, SMCCC.
    Aarch64(Box<ArmVcpu>),
}

/// One vCPU of a [`crate::Vm`].
#[derive(Debug)]
pub struct Vcpu {
    index: u32,
    /// Resets seen since creation (RESET and INIT; the `cpu_reset()` QEMU
    /// emulates an INIT with is part of the INIT).
    resets: AtomicU64,
    pub(crate) routes: RouteCounters,
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
    // Host ns of this vCPU's last look at the others
    // ([`Vcpu::mark_descheduled_peers`]); its own thread only.
    peers_seen_ns: AtomicU64,
    // Makes the vCPU leave guest code at its next block (QEMU's cpu_exit),
    // from any thread; called and cleared under this lock.
    exit_request: Mutex<Option<ExitRequest>>,
    // Held off its CPU by an injected preemption (`crate::inject`): it runs
    // no guest code until released.
    held: AtomicBool,
    pub(crate) shared: Arc<Shared>,
    arch: ArchVcpu,
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
            resets: AtomicU64::new(0),
            routes: RouteCounters::default(),
            tid: AtomicI32::new(0),
            in_guest: AtomicBool::new(false),
            halts: AtomicU64::new(0),
            turn_since_ns: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            peers_seen_ns: AtomicU64::new(0),
            exit_request: Mutex::new(None),
            held: AtomicBool::new(false),
            shared,
            arch: match arch {
                Arch::X86_64 => ArchVcpu::X86(Box::default()),
                Arch::Aarch64 => ArchVcpu::Aarch64(Box::default()),
            },
        }
    }

    /// The x86 vCPU's routing points; None on arm64.
    pub fn x86(&self) -> Option<X86<'_>> {
        match &self.arch {
            ArchVcpu::X86(x) => Some(X86::new(self, x)),
            ArchVcpu::Aarch64(_) => None,
        }
    }

    /// The arm64 vCPU's routing points; None on x86.
    pub fn arm(&self) -> Option<Arm<'_>> {
        match &self.arch {
            ArchVcpu::Aarch64(a) => Some(Arm::new(self, a)),
            ArchVcpu::X86(_) => None,
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

    /// Whether an injected preemption holds the vCPU off its CPU: QEMU
    /// neither runs it nor counts it as wanting to run (it is idle).
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// An injected preemption starts (`crate::inject::Action::Hold`): the
    /// vCPU leaves guest code at its next block and runs no more until
    /// [`Vcpu::release`]; x86's `preempted` is set meanwhile, as KVM's
    /// `kvm_steal_time_set_preempted` does when a runnable vCPU's thread is
    /// scheduled out. False if the guest has no steal structure on (the hold
    /// happens anyway).
    pub fn hold(&self) -> bool {
        self.held.store(true, Ordering::Release);
        let mem = &*self.shared.host;
        let on = self.with_steal(|area| {
            area.on() && {
                area.mark_preempted(mem);
                true
            }
        });
        self.request_exit();
        on
    }

    /// Held or not as a loaded injection schedule says (loadvm, incoming
    /// migration: the VM is stopped; `preempted` came in guest RAM).
    pub(crate) fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Release);
    }

    /// The injected preemption ends (`crate::inject::Action::Release`): the
    /// vCPU may run, and its next entry adds `steal_ns` to its steal (and
    /// clears `preempted`). From then on it is a runnable vCPU waiting for
    /// its turn like any other (round-robin's own steal counts again). QEMU
    /// is asked to wake its thread. False if the guest has no steal
    /// structure on: the steal is dropped, as KVM counts none then.
    pub fn release(&self, steal_ns: u64) -> bool {
        let threading = self.shared.threading();
        let now = self.shared.steal_now_ns();
        let added = self.with_steal(|area| {
            area.on() && {
                let clock = area.clock_mut();
                clock.pending_ns = clock.pending_ns.saturating_add(steal_ns);
                if threading == (Threading::RoundRobin { peers: true }) {
                    clock.runnable_since_ns = now;
                }
                true
            }
        });
        self.held.store(false, Ordering::Release);
        self.shared.host.wake_vcpu(self.index);
        added
    }

    /// Injected steal without a window (`crate::inject::Action::Steal`):
    /// the vCPU's next entry, which this asks for, adds `steal_ns`. False
    /// (dropped) if the guest has no steal structure on.
    pub fn inject_steal(&self, steal_ns: u64) -> bool {
        let added = self.with_steal(|area| {
            area.on() && {
                let clock = area.clock_mut();
                clock.pending_ns = clock.pending_ns.saturating_add(steal_ns);
                true
            }
        });
        self.request_exit();
        added
    }

    /// The guest architecture.
    pub fn arch(&self) -> Arch {
        match self.arch {
            ArchVcpu::X86(_) => Arch::X86_64,
            ArchVcpu::Aarch64(_) => Arch::Aarch64,
        }
    }

    /// Resets seen since creation (RESET and INIT; the `cpu_reset()` QEMU
    /// emulates an INIT with is part of the INIT).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// How often each routing point was reached.
    pub fn routes(&self) -> RouteCounts {
        self.routes.snapshot()
    }

    /// A reset of `kind`, as KVM's `kvm_vcpu_reset(vcpu, init_event)`.
    /// Statistics survive resets. Each architecture says what it resets
    /// (`X86::reset`, `Arm::reset`).
    pub fn reset(&self, kind: ResetKind) {
        let counted = match &self.arch {
            ArchVcpu::X86(x) => X86::new(self, x).reset(kind),
            ArchVcpu::Aarch64(a) => Arm::new(self, a).reset(),
        };
        if counted {
            self.resets.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The vCPU's steal structure (x86 steal time, arm64 PV stolen time),
    /// under the vCPU's lock.
    fn with_steal<R>(&self, f: impl FnOnce(&mut dyn StealArea) -> R) -> R {
        match &self.arch {
            ArchVcpu::X86(x) => f(&mut x.lock().steal),
            ArchVcpu::Aarch64(a) => f(&mut *a.lock_pvtime()),
        }
    }

    /// The PMU's unhalted-cycle clock, if the vCPU has a PMU.
    fn with_pmu_clock(&self, f: impl FnOnce(&mut Unhalted)) {
        fn on<T: PmuClock>(l: &mut T, f: impl FnOnce(&mut Unhalted)) {
            if l.has_pmu() {
                f(l.unhalted());
            }
        }
        match &self.arch {
            ArchVcpu::X86(x) => x.local.with(|l| on(l, f)),
            ArchVcpu::Aarch64(a) => a.local.with(|l| on(l, f)),
        }
    }

    /// The vCPU's thread is about to run guest code. True: flush its whole
    /// TLB first (x86 PV TLB flush, as KVM's `record_steal_time` does with
    /// `kvm_vcpu_flush_tlb_guest`).
    pub fn run_begin(&self) -> bool {
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
        self.with_pmu_clock(|u| u.begin(self.shared.virtual_ns()));
        if self.held() {
            // Held since QEMU last looked: leave at once, `preempted` kept.
            self.request_exit();
            return false;
        }
        let flush = self.with_steal(|area| {
            self.enter_steal(area);
            area.take_tlb_flush()
        });
        self.mark_descheduled_peers();
        flush
            && match &self.arch {
                ArchVcpu::X86(x) => X86::new(self, x).pv_tlb_flush_on(),
                ArchVcpu::Aarch64(_) => false,
            }
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
        if now.saturating_sub(self.peers_seen_ns.load(Ordering::Relaxed)) < PEER_LOOK_NS {
            return;
        }
        self.peers_seen_ns.store(now, Ordering::Relaxed);
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
                && peer.with_steal(|area| area.mark_preempted(mem))
            {
                peer.request_exit();
            }
        });
    }

    /// Fold steal in at an entry into guest code (or when the guest turns
    /// its structure on); under MTTCG at most every `MTTCG_ENTRY_FOLD_NS`,
    /// clearing only the sampler's `preempted` in between. `area` is this
    /// vCPU's, under its lock.
    pub(crate) fn enter_steal(&self, area: &mut dyn StealArea) {
        if !area.on() {
            return;
        }
        let (now, threading) = (self.shared.steal_now_ns(), self.shared.threading());
        let mem = &*self.shared.host;
        if !area.clock().entry_fold_due(threading, now) {
            area.clear_preempted(mem);
            return;
        }
        area.enter(mem, threading, now, self.shared.steal_run_delay_ns());
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
    /// A vCPU out of guest code (halted) costs no system call: its steal is
    /// folded in at its next entry.
    pub fn sample(&self, view: &mut Option<SamplerView>, interval_ns: u64, fold: bool) -> Sampled {
        let tid = self.tid.load(Ordering::Relaxed);
        let (on, flag) = self.with_steal(|area| (area.on(), area.has_preempted_flag()));
        if self.held() {
            // An injected preemption owns `preempted` until it ends.
            *view = None;
            return Sampled::Idle;
        }
        if tid == 0 || !on {
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
        let descheduled = flag
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
        let mem = &*self.shared.host;
        if self.with_steal(|area| area.sample(mem, rd, descheduled)) {
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
        self.with_steal(|area| area.on())
    }

    /// Round-robin: end the vCPU's turn at its next translation block
    /// (QEMU's `cpu_exit`): the loop moves on to the next vCPU.
    pub fn end_turn(&self) {
        self.request_exit();
    }

    /// The vCPU's thread left guest code; `halted` if voluntarily.
    pub fn run_end(&self, halted: bool) {
        // A held vCPU left because of its injected preemption: no turn of
        // its own to account (the injection says what it stole).
        let halted = halted || self.held();
        if halted {
            self.halts.fetch_add(1, Ordering::Release);
        }
        self.in_guest.store(false, Ordering::Release);
        self.with_pmu_clock(|u| u.end(self.shared.virtual_ns()));
        let threading = self.shared.threading();
        if threading == Threading::Mttcg {
            // Nothing happens at an MTTCG exit (the sampler and the next
            // entry see the host's scheduling).
            return;
        }
        self.turn_since_ns.store(0, Ordering::Release);
        self.waiting.store(!halted, Ordering::Release);
        self.with_steal(|area| {
            if area.on() {
                let (now, rd) = (self.shared.steal_now_ns(), self.shared.steal_run_delay_ns());
                area.exit(&*self.shared.host, threading, now, rd, halted);
            }
        });
    }

    /// The PMI budget ran out (`rustkvm_x86_pmu_due`, `rustkvm_arm_pmu_due`):
    /// the PMU syncs with the engine and tells it what it needs next.
    pub fn pmu_due(&self) {
        match &self.arch {
            ArchVcpu::X86(x) => X86::new(self, x).pmu_due(),
            ArchVcpu::Aarch64(a) => Arm::new(self, a).pmu_due(),
        }
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
    use super::*;

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

    #[test]
    fn routes_and_resets_are_counted() {
        let v = Vcpu::new(3, Arch::X86_64);
        let x = v.x86().unwrap();
        v.reset(ResetKind::Cold);
        v.reset(ResetKind::Cold);
        x.cpuid(0, 0, [0; 4]);
        x.rdmsr(0x1b);
        x.rdmsr(0x1b);
        x.wrmsr(0x1b, 0);
        x.rdpmc(0);
        assert_eq!(v.resets(), 2);
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
            "cpuid=1 rdmsr=2 wrmsr=1 rdpmc=1 hypercall=0 hvc_smc=0 pmu_read=0 pmu_write=0 pmi=0 pv_eoi=0"
        );
    }
}
