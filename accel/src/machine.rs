//! What a machine's vCPUs share ([`Shared`]) and its architecture
//! ([`Arch`]). The one cycle between modules is here by design: `Shared`
//! holds the registry of vCPUs and each [`Vcpu`] holds its `Shared`, because
//! a vCPU reaches its peers (steal time's preempted marks, kvmclock's
//! rewrite); nothing else imports upwards. [`crate::vm::Vm`] creates and
//! removes vCPUs and drops the registry's references.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::host::{HostSched, LinuxSched};
use crate::memory::Host;
use crate::steal::Threading;
use crate::vcpu::Vcpu;
use crate::x86::clock::TscRate;

/// Guest architecture of the emulator that loaded the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qemu-system-x86_64`.
    X86_64,
    /// `qemu-system-aarch64`.
    Aarch64,
}

impl Arch {
    /// Name as in QEMU's target names.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// What every vCPU of a machine shares: guest memory, the threading model,
/// the host's clock and scheduler, and how many vCPUs are live.
pub struct Shared {
    /// Guest RAM and interrupt delivery.
    pub host: Box<dyn Host + Send + Sync>,
    /// One thread per vCPU or round-robin.
    pub mttcg: bool,
    /// `-icount`: steal counts VM time ([`Shared::steal_now_ns`]).
    pub icount: bool,
    /// The host's clock and scheduler as the models read them.
    sched: Arc<dyn HostSched>,
    /// The machine's vCPUs by QEMU's `cpu_index`: the one registry (the
    /// [`Vm`] creates and removes; a spinning vCPU looks at the others).
    /// Each vCPU holds the Shared: [`Vm`]'s drop empties it.
    pub(crate) vcpus: parking_lot::RwLock<Vec<Option<Arc<Vcpu>>>>,
    /// How many of them there are (read on every entry, without the lock;
    /// changed only under `vcpus`' write lock).
    pub(crate) live_vcpus: AtomicU32,
    /// x86: the guest TSC frequency in kHz, 0 until a vCPU set it.
    tsc_khz: AtomicU64,
    /// x86: MSR_KVM_WALL_CLOCK(_NEW), one per VM as in KVM.
    pub wall_clock_msr: AtomicU64,
    /// x86: vCPU 0 last set its kvmclock through the legacy MSR
    /// (`boot_vcpu_runs_old_kvmclock`): no vCPU's kvmclock is stable then.
    pub old_kvmclock_on_boot_vcpu: AtomicBool,
    /// x86: `pmu-counters` (set once at machine creation).
    pub(crate) pmu_counters: AtomicU32,
    /// arm64: `counter-offset`, KVM's VM-wide counter offset (both
    /// `voffset` and `poffset`), as the models need it (KVM's PTP call);
    /// QEMU's timer code reads the accelerator property itself.
    pub counter_offset: u64,
    /// The MTTCG sampler found a vCPU thread kept off the host CPUs lately.
    pub(crate) contended: AtomicBool,
    /// The VM is running (QEMU's run state, [`Vm::set_running`]). Threads of
    /// ours other than vCPU threads write guest RAM only while holding this
    /// for reading and finding it true; stopping takes it for writing, so a
    /// write under way finishes before the VM counts as stopped.
    pub(crate) running: parking_lot::RwLock<bool>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("mttcg", &self.mttcg)
            .field("live_vcpus", &self.live_vcpus)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Shared state over `memory`, on the real host.
    pub fn new(host: Box<dyn Host + Send + Sync>, mttcg: bool) -> Self {
        Self::with_sched(host, mttcg, Arc::new(LinuxSched::new()))
    }

    /// Shared state over `memory`, observing the host through `sched`
    /// (tests: a fake host).
    pub fn with_sched(
        host: Box<dyn Host + Send + Sync>,
        mttcg: bool,
        sched: Arc<dyn HostSched>,
    ) -> Self {
        Shared {
            host,
            mttcg,
            icount: false,
            sched,
            vcpus: parking_lot::RwLock::new(Vec::new()),
            live_vcpus: AtomicU32::new(0),
            tsc_khz: AtomicU64::new(0),
            wall_clock_msr: AtomicU64::new(0),
            old_kvmclock_on_boot_vcpu: AtomicBool::new(false),
            pmu_counters: AtomicU32::new(0),
            counter_offset: 0,
            contended: AtomicBool::new(false),
            running: parking_lot::RwLock::new(false),
        }
    }

    /// Whether the host has lately kept a vCPU thread off its CPUs (MTTCG).
    pub fn contended(&self) -> bool {
        self.contended.load(Ordering::Relaxed)
    }

    /// Run `f` on each live vCPU, in index order.
    pub fn for_each_peer(&self, mut f: impl FnMut(&Vcpu)) {
        for v in self.vcpus.read().iter().flatten() {
            f(v);
        }
    }

    /// x86: `pmu-counters` (0: the vendor's default).
    pub fn pmu_counters(&self) -> u8 {
        self.pmu_counters.load(Ordering::Relaxed) as u8
    }

    /// The host's clock and scheduler.
    pub fn sched(&self) -> &dyn HostSched {
        &*self.sched
    }

    /// Host monotonic time in ns since the machine was created (never 0).
    pub fn now_ns(&self) -> u64 {
        self.sched.now_ns() + 1
    }

    /// QEMU's virtual clock (ns of VM time).
    pub fn virtual_ns(&self) -> u64 {
        self.host.virtual_ns()
    }

    /// The clock steal time is measured on: host time, or under `-icount`
    /// VM time, the guest's own (instructions executed): a runnable vCPU
    /// waiting for its turn then misses what the others execute,
    /// deterministically.
    pub fn steal_now_ns(&self) -> u64 {
        if self.icount {
            self.virtual_ns().max(1)
        } else {
            self.now_ns()
        }
    }

    /// The calling vCPU thread's host run delay, which is steal — except
    /// under `-icount`, where host scheduling does not move VM time (0).
    pub fn steal_run_delay_ns(&self) -> u64 {
        if self.icount {
            0
        } else {
            self.sched.current_run_delay_ns()
        }
    }

    /// Host real time and VM time as one consistent pair (see
    /// [`crate::host::real_and_vm_ns`]).
    pub fn real_and_vm_ns(&self) -> (u64, u64) {
        crate::host::real_and_vm_ns(crate::host::realtime_ns, || self.virtual_ns())
    }

    /// The VM's guest TSC rate.
    pub fn tsc_rate(&self) -> TscRate {
        TscRate::new(self.tsc_khz.load(Ordering::Relaxed))
    }

    /// Fix the VM's TSC rate: the first non-zero request wins (every vCPU
    /// has the same CPU model options).
    pub fn set_tsc_khz(&self, khz: u64) {
        let _ = self
            .tsc_khz
            .compare_exchange(0, khz, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The threading model for steal-time accounting.
    pub fn threading(&self) -> Threading {
        if self.mttcg {
            Threading::Mttcg
        } else {
            Threading::RoundRobin {
                peers: self.live_vcpus.load(Ordering::Relaxed) > 1,
            }
        }
    }
}
