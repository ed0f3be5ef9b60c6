//! The machine: configuration and the registry of live vCPUs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::AccelError;
use crate::host::{HostSched, LinuxSched};
use crate::inject::{Action, InjectError, Injection, Schedule};
pub use crate::machine::{Arch, Shared};
use crate::memory::{Host, NoMemory};
use crate::steal::Threading;
use crate::vcpu::{Sampled, SamplerView, Vcpu};

/// How often the steal-time sampler looks while no vCPU has steal time on.
const IDLE_SAMPLER_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// At the fast period the sampler folds run delay (steal) in every this
/// many ticks (every tick otherwise); it decides `preempted` at every tick.
const STEAL_FOLD_TICKS: u64 = 4;
/// The sampler looks every period for this many ticks after it last found
/// a vCPU kept off the host CPUs, and every RELAXED_FACTOR periods otherwise.
const CONTENDED_TICKS: u64 = 200;
/// See CONTENDED_TICKS.
const RELAXED_FACTOR: u32 = 8;
/// The host time slice the sampler asks for (it runs for microseconds).
const SAMPLER_SLICE_NS: u64 = 100_000;
/// Round-robin (without `-icount`): the longest turn a vCPU takes while
/// another one waits for its turn, while a guest has steal time on — half
/// of Linux's shortest tick (HZ 1000), so that a busy vCPU sharing the
/// thread is not kept waiting through whole ticks (docs/steal-time.md).
pub const RR_SLICE_NS: u64 = 500_000;
/// The sampler's shortest nap while it times a round-robin turn.
const RR_MIN_NAP_NS: u64 = 50_000;

/// Most vCPUs a machine may have (QEMU's x86 `max_cpus` limit).
pub const MAX_VCPUS: u32 = 4096;

/// Machine-wide options (the `-accel rustkvm,...` properties).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmConfig {
    /// Target architecture.
    pub arch: Arch,
    /// `-smp maxcpus`.
    pub max_cpus: u32,
    /// `stats=on`: report per-vCPU routing counts at exit.
    pub stats: bool,
    /// One host thread per vCPU.
    pub mttcg: bool,
    /// `-icount`: VM time counts instructions; steal counts VM time.
    pub icount: bool,
    /// arm64 `counter-offset`: KVM_ARM_SET_COUNTER_OFFSET's VM-wide offset,
    /// subtracted modulo 2^64 from both the virtual and the physical counter
    /// views, like CNTVOFF_EL2/CNTPOFF_EL2 but global (Linux
    /// `Documentation/virt/kvm/api.rst`, `arch/arm64/kvm/arch_timer.c`
    /// `timer_get_offset`). Without one the counters count QEMU's virtual
    /// clock from VM start, as KVM's start near 0 at VM creation.
    pub counter_offset: u64,
    /// x86 `pmu-counters`: GP counters of a `pmu=on` vCPU's PMU (0: the
    /// vendor's default, Intel 4, AMD PerfMonV2 6).
    pub pmu_counters: u8,
    /// A vCPU index whose creation is refused (the test hook
    /// `RUSTKVM_FAIL_VCPU_CREATE`): what a failed vCPU creation does to
    /// QEMU (a refused `device_add`) can then be tested.
    pub refused_vcpu: Option<u32>,
}

impl VmConfig {
    /// Validate a configuration.
    pub fn new(arch: Arch, max_cpus: u32, stats: bool) -> Result<Self, AccelError> {
        if max_cpus == 0 || max_cpus > MAX_VCPUS {
            return Err(AccelError::InvalidCpuCount {
                count: max_cpus,
                max: MAX_VCPUS,
            });
        }
        Ok(VmConfig {
            arch,
            max_cpus,
            stats,
            mttcg: true,
            icount: false,
            counter_offset: 0,
            pmu_counters: 0,
            refused_vcpu: None,
        })
    }

    /// Set the x86 PMU's GP counter count (0: the default); arm64's PMU
    /// does not take it yet.
    pub fn with_pmu_counters(self, n: u32) -> Result<Self, AccelError> {
        if n == 0 {
            return Ok(self);
        }
        if self.arch != Arch::X86_64 {
            return Err(AccelError::OptionNotForArch {
                option: "pmu-counters",
                arch: self.arch.name(),
            });
        }
        match u8::try_from(n) {
            Ok(gp) if (1..=crate::x86::pmu::MAX_GP as u8).contains(&gp) => Ok(VmConfig {
                pmu_counters: gp,
                ..self
            }),
            _ => Err(AccelError::InvalidPmuCounters {
                count: n,
                max: crate::x86::pmu::MAX_GP as u32,
            }),
        }
    }

    /// Set the arm64 counter offset; other architectures have none.
    pub fn with_counter_offset(self, offset: u64) -> Result<Self, AccelError> {
        if offset != 0 && self.arch != Arch::Aarch64 {
            return Err(AccelError::OptionNotForArch {
                option: "counter-offset",
                arch: self.arch.name(),
            });
        }
        Ok(VmConfig {
            counter_offset: offset,
            ..self
        })
    }
}

/// One guest machine: its configuration and its vCPUs, indexed by QEMU's
/// `cpu_index`.
#[derive(Debug)]
pub struct Vm {
    config: VmConfig,
    shared: Arc<Shared>,
    /// Steal and preemption injections not done yet (`crate::inject`).
    inject: parking_lot::Mutex<Schedule>,
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Each vCPU holds the Shared: let the registry go with the machine
        // (vCPUs QEMU still holds stay valid until it destroys them).
        self.shared.vcpus.write().clear();
        self.shared.live_vcpus.store(0, Ordering::Relaxed);
    }
}

impl Vm {
    /// A machine with no vCPUs and no guest memory yet.
    pub fn new(config: VmConfig) -> Self {
        Self::with_memory(config, Box::new(NoMemory))
    }

    /// A machine with no vCPUs over `memory`.
    pub fn with_memory(config: VmConfig, memory: Box<dyn Host + Send + Sync>) -> Self {
        Self::with_sched(config, memory, Arc::new(LinuxSched::new()))
    }

    /// A machine with no vCPUs over `memory`, observing the host through
    /// `sched` (tests: a fake host).
    pub fn with_sched(
        config: VmConfig,
        memory: Box<dyn Host + Send + Sync>,
        sched: Arc<dyn HostSched>,
    ) -> Self {
        let mut shared = Shared::with_sched(memory, config.mttcg, sched);
        shared.icount = config.icount;
        shared.counter_offset = config.counter_offset;
        shared
            .pmu_counters
            .store(u32::from(config.pmu_counters), Ordering::Relaxed);
        *shared.vcpus.get_mut() = vec![None; config.max_cpus as usize];
        Vm {
            config,
            shared: Arc::new(shared),
            inject: parking_lot::Mutex::new(Schedule::default()),
        }
    }

    /// The machine's configuration.
    pub fn config(&self) -> VmConfig {
        self.config
    }

    /// Create vCPU `index`.
    pub fn create_vcpu(&self, index: u32) -> Result<Arc<Vcpu>, AccelError> {
        let mut vcpus = self.shared.vcpus.write();
        let slot = vcpus
            .get_mut(index as usize)
            .ok_or(AccelError::VcpuIndexOutOfRange {
                index,
                max_cpus: self.config.max_cpus,
            })?;
        if slot.is_some() {
            return Err(AccelError::VcpuExists(index));
        }
        if self.config.refused_vcpu == Some(index) {
            return Err(AccelError::VcpuRefused(index));
        }
        let vcpu = Arc::new(Vcpu::with_shared(
            index,
            self.config.arch,
            Arc::clone(&self.shared),
        ));
        *slot = Some(Arc::clone(&vcpu));
        self.shared.live_vcpus.fetch_add(1, Ordering::Relaxed);
        Ok(vcpu)
    }

    /// Forget vCPU `index`; returns whether it existed.
    pub fn remove_vcpu(&self, index: u32) -> bool {
        let mut vcpus = self.shared.vcpus.write();
        let removed = vcpus
            .get_mut(index as usize)
            .and_then(Option::take)
            .is_some();
        if removed {
            self.shared.live_vcpus.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// The live vCPUs, in index order.
    pub fn vcpus(&self) -> Vec<Arc<Vcpu>> {
        self.shared.vcpus.read().iter().flatten().cloned().collect()
    }

    /// QEMU's VM run state changed (a VM change state handler, BQL held):
    /// until it runs, and once this returns for a stop, the sampler writes no
    /// guest RAM — nothing changes RAM under savevm, `stop`, or migration's
    /// last RAM pass (KVM likewise only writes steal time from a vCPU thread
    /// about to enter the guest). A sampler tick under way finishes first.
    pub fn set_running(&self, running: bool) {
        *self.shared.running.write() = running;
    }

    /// Start the steal-time sampler. Under MTTCG every `period` it looks at
    /// each vCPU thread's host scheduling (see `Vcpu::sample`); under
    /// round-robin TCG it ends turns longer than [`RR_SLICE_NS`] while
    /// another vCPU waits (see [`Sampler::tick`]). It stops when the
    /// machine is dropped. Its thread is created as QEMU creates its own
    /// (`qemu_thread_create`: every asynchronous signal blocked, left to the
    /// main loop) and registers as a reader of QEMU's memory map
    /// ([`crate::memory::Threads`]) before it touches guest RAM.
    pub fn start_sampler(self: &Arc<Self>, period: std::time::Duration) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        let shared = Arc::clone(&self.shared);
        let builder = std::thread::Builder::new().name("rustkvm-steal".into());
        crate::host::spawn_with_signals_blocked(builder, move || {
            shared.host.thread_attach();
            // Look when the tick is due, not when a busy vCPU thread's
            // slice ends (one host CPU for all: the hint would come late).
            crate::host::request_short_slice(SAMPLER_SLICE_NS);
            let mut sampler = Sampler::new(period, shared.now_ns());
            loop {
                std::thread::sleep(sampler.nap);
                let Some(vm) = weak.upgrade() else { break };
                sampler.tick(&vm);
            }
            shared.host.thread_detach();
        })
        .map(|_| ())
    }

    /// Add injections of steal and preemption (`-accel rustkvm,inject-steal`
    /// at machine creation, QMP `x-rustkvm-inject-steal` later): all or,
    /// on the first refusal, none. Re-arms the injection timer.
    pub fn inject_add(&self, injections: &[Injection]) -> Result<(), InjectError> {
        let now = self.shared.virtual_ns();
        let mut schedule = self.inject.lock();
        let mut next = schedule.clone();
        for inj in injections {
            next.add(*inj, self.config.max_cpus, now)?;
        }
        *schedule = next;
        self.shared.host.inject_timer(schedule.next_deadline());
        Ok(())
    }

    /// The injection timer fired: apply what is due at VM time now, in VM
    /// time order, and re-arm the timer. Under `-icount` the timer stops
    /// guest execution at its deadline, so this runs at the same guest
    /// instruction every run. What cannot be applied is said on stderr.
    pub fn inject_fire(&self) {
        let now = self.shared.virtual_ns();
        let actions = {
            let mut schedule = self.inject.lock();
            let actions = schedule.due(now);
            self.shared.host.inject_timer(schedule.next_deadline());
            actions
        };
        for action in actions {
            let (Action::Hold { cpu } | Action::Release { cpu, .. } | Action::Steal { cpu, .. }) =
                action;
            let vcpu = self
                .shared
                .vcpus
                .read()
                .get(cpu as usize)
                .cloned()
                .flatten();
            let Some(vcpu) = vcpu else {
                eprintln!("rustkvm: inject-steal: vCPU {cpu} does not exist at VM time {now} ns: {action:?} dropped");
                continue;
            };
            let (applied, steal) = match action {
                Action::Hold { .. } => (vcpu.hold(), 0),
                Action::Release { steal_ns, .. } => (vcpu.release(steal_ns), steal_ns),
                Action::Steal { steal_ns, .. } => (vcpu.inject_steal(steal_ns), steal_ns),
            };
            if !applied && steal != 0 {
                eprintln!("rustkvm: inject-steal: vCPU {cpu} has no steal structure on at VM time {now} ns: {steal} ns of steal dropped");
            }
        }
    }

    /// The injections not done yet, as they travel in vmstate
    /// ([`Schedule::encode`]).
    pub fn inject_save(&self) -> Vec<u8> {
        self.inject.lock().encode()
    }

    /// Take the schedule a migration stream or snapshot brought (empty:
    /// none), instead of this machine's own: the vCPUs of the windows in
    /// progress are held (their `preempted` came in guest RAM), the others
    /// not, and the timer is re-armed. Refused, nothing changed, if the
    /// bytes are malformed.
    pub fn inject_load(&self, bytes: &[u8]) -> Result<(), InjectError> {
        let loaded = Schedule::decode(bytes, self.config.max_cpus)?;
        let mut schedule = self.inject.lock();
        for vcpu in self.vcpus() {
            let held = loaded.active().iter().any(|a| a.cpu == vcpu.index());
            vcpu.set_held(held);
        }
        *schedule = loaded;
        self.shared.host.inject_timer(schedule.next_deadline());
        Ok(())
    }

    /// VM time now (QEMU's virtual clock, ns).
    pub fn virtual_ns(&self) -> u64 {
        self.shared.virtual_ns()
    }

    /// The `stats=on` report: one line per live vCPU.
    pub fn stats_report(&self) -> String {
        let mut out = String::new();
        for vcpu in self.vcpus() {
            out += &format!(
                "rustkvm: {} vcpu {}: resets={} {}\n",
                self.config.arch.name(),
                vcpu.index(),
                vcpu.resets(),
                vcpu.routes()
            );
        }
        out
    }
}

/// The steal-time sampler's state between ticks (see [`Vm::start_sampler`]).
#[derive(Debug)]
pub struct Sampler {
    /// The fast period.
    period: std::time::Duration,
    /// How long to sleep before the next tick.
    pub nap: std::time::Duration,
    /// What the last tick saw of each vCPU, by index.
    last: Vec<Option<SamplerView>>,
    /// Host time of the last tick.
    t0: u64,
    /// Ticks so far.
    tick: u64,
    /// Ticks since a vCPU was last found kept off the host CPUs.
    calm: u64,
    /// Round-robin: the turn last ended, (vCPU index, when it began).
    ended: Option<(u32, u64)>,
}

impl Sampler {
    /// A sampler whose fast period is `period`, started at host time `now`.
    pub fn new(period: std::time::Duration, now: u64) -> Self {
        Sampler {
            period,
            nap: period,
            last: Vec::new(),
            t0: now,
            tick: 0,
            calm: u64::MAX,
            ended: None,
        }
    }

    /// One look at every vCPU of `vm`; sets [`Sampler::nap`]. While the VM
    /// is not running it looks at nothing and writes nothing (the run state
    /// is held for the whole tick, so a stop waits for it).
    pub fn tick(&mut self, vm: &Vm) {
        let running_vm = vm.shared.running.read();
        let now = vm.shared.now_ns();
        let interval = now.saturating_sub(self.t0);
        self.t0 = now;
        if !*running_vm {
            // Stopped: the vCPUs are paused; the time does not count as a
            // sampling interval.
            self.nap = IDLE_SAMPLER_PERIOD;
            for view in &mut self.last {
                *view = None;
            }
            return;
        }
        self.tick += 1;
        if !vm.shared.mttcg {
            self.round_robin_tick(vm, now);
            return;
        }
        let fold = self.nap != self.period || self.tick % STEAL_FOLD_TICKS == 0;
        let (mut watching, mut running) = (false, false);
        self.calm = self.calm.saturating_add(1);
        for v in vm.vcpus() {
            let i = v.index() as usize;
            if self.last.len() <= i {
                self.last.resize_with(i + 1, || None);
            }
            match v.sample(&mut self.last[i], interval, fold) {
                Sampled::Unwatched => {}
                Sampled::Idle => watching = true,
                Sampled::Running => (watching, running) = (true, true),
                Sampled::Contended => (watching, running, self.calm) = (true, true, 0),
            }
        }
        // A guest that does not use the feature should not pay for it: look
        // rarely while none has it on, and every `period` only while the host
        // has recently kept a vCPU off its CPUs (overcommit).
        vm.shared
            .contended
            .store(self.calm < CONTENDED_TICKS, Ordering::Relaxed);
        self.nap = if !watching {
            IDLE_SAMPLER_PERIOD
        } else if running && self.calm < CONTENDED_TICKS {
            self.period
        } else {
            self.period * RELAXED_FACTOR
        };
    }
}

impl Sampler {
    /// Round-robin TCG (all vCPUs on one thread): QEMU's loop runs a vCPU
    /// until an interrupt for any vCPU — its own too — kicks it out, so with
    /// a guest whose CPUs tick at the same moments (Linux's default) the
    /// turns follow the ticks: a busy vCPU takes its tick only after waiting
    /// through the other's whole tick period, half of its ticks are lost,
    /// and each one it takes carries a whole tick of steal, which Linux
    /// accounts before user time (`account_process_tick`) — `/proc/stat`
    /// then says steal for nearly all of the time (issue 17 point 5). A
    /// host scheduler gives runnable threads short slices whatever the
    /// guest's interrupts; this does the same: while a guest has steal time
    /// on, a turn that has lasted [`RR_SLICE_NS`] while another vCPU waits
    /// for its turn is ended (`cpu_exit`), so no busy vCPU waits through a
    /// tick. Not under `-icount`, where QEMU slices turns by instruction
    /// budget and the sampler does not run (a host-timed kick would make
    /// the run non-deterministic).
    fn round_robin_tick(&mut self, vm: &Vm, now: u64) {
        let (mut watching, mut runner, mut waiting) = (false, None, 0u32);
        if vm.shared.threading() == (Threading::RoundRobin { peers: true }) {
            for v in vm.vcpus() {
                watching |= v.steal_on();
                match v.rr_turn() {
                    (Some(since), _) => runner = Some((v, since)),
                    (None, true) => waiting += 1,
                    (None, false) => {}
                }
            }
        }
        self.nap = match (watching, runner) {
            // No guest that looks, or a lone vCPU: nothing to slice.
            (false, _) => IDLE_SAMPLER_PERIOD,
            (true, Some((v, since))) if waiting > 0 => {
                let turn = (v.index(), since);
                let ends = since.saturating_add(RR_SLICE_NS);
                if now >= ends && self.ended != Some(turn) {
                    v.end_turn();
                    self.ended = Some(turn);
                }
                let left = if self.ended == Some(turn) {
                    RR_SLICE_NS
                } else {
                    ends.saturating_sub(now)
                };
                std::time::Duration::from_nanos(left.max(RR_MIN_NAP_NS))
            }
            (true, _) => std::time::Duration::from_nanos(RR_SLICE_NS) * RELAXED_FACTOR,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::tests::{FakeSched, FakeThread};
    use crate::memory::GuestMemory;
    use std::sync::atomic::AtomicU64;

    /// Host threads of the vCPUs in the tests below.
    const T0: i32 = 10;
    /// See T0.
    const T1: i32 = 11;
    /// A host thread on a CPU, that has run 1 ms with 1 us of run delay.
    const ON_CPU: FakeThread = FakeThread {
        cpu_ns: 1_000_000,
        running: true,
        run_delay_ns: 1_000,
        runnable: true,
    };

    fn vm(n: u32) -> Vm {
        Vm::new(VmConfig::new(Arch::X86_64, n, false).unwrap())
    }

    #[test]
    fn config_rejects_zero_and_too_many_cpus() {
        assert_eq!(
            VmConfig::new(Arch::X86_64, 0, false),
            Err(AccelError::InvalidCpuCount {
                count: 0,
                max: MAX_VCPUS
            })
        );
        assert_eq!(
            VmConfig::new(Arch::Aarch64, MAX_VCPUS + 1, false),
            Err(AccelError::InvalidCpuCount {
                count: MAX_VCPUS + 1,
                max: MAX_VCPUS
            })
        );
        assert!(VmConfig::new(Arch::Aarch64, MAX_VCPUS, false).is_ok());
    }

    #[test]
    fn pmu_counters_are_x86s_and_kvms_range() {
        let x86 = VmConfig::new(Arch::X86_64, 1, false).unwrap();
        assert_eq!(x86.pmu_counters, 0, "the vendor's default");
        assert_eq!(x86.with_pmu_counters(0).unwrap().pmu_counters, 0);
        assert_eq!(x86.with_pmu_counters(8).unwrap().pmu_counters, 8);
        assert_eq!(x86.with_pmu_counters(1).unwrap().pmu_counters, 1);
        assert_eq!(
            x86.with_pmu_counters(9),
            Err(AccelError::InvalidPmuCounters { count: 9, max: 8 })
        );
        assert_eq!(
            x86.with_pmu_counters(1 << 8),
            Err(AccelError::InvalidPmuCounters { count: 256, max: 8 })
        );
        let arm = VmConfig::new(Arch::Aarch64, 1, false).unwrap();
        assert!(matches!(
            arm.with_pmu_counters(2),
            Err(AccelError::OptionNotForArch { .. })
        ));
        let vm = Vm::new(x86.with_pmu_counters(6).unwrap());
        let v = vm.create_vcpu(0).unwrap();
        v.x86()
            .unwrap()
            .setup(0, 0, crate::x86::vcpu::PMU_INTEL, None);
        let crate::vcpu::Route::Handled(leaf) = v.x86().unwrap().cpuid(0xa, 0, [0; 4]) else {
            panic!("CPUID 0xA");
        };
        assert_eq!((leaf[0] >> 8) & 0xff, 6, "GP counters in CPUID 0xA");
    }

    #[test]
    fn counter_offset_is_arm64s() {
        let arm = VmConfig::new(Arch::Aarch64, 1, false).unwrap();
        assert_eq!(arm.with_counter_offset(5).unwrap().counter_offset, 5);
        let x86 = VmConfig::new(Arch::X86_64, 1, false).unwrap();
        assert_eq!(x86.with_counter_offset(0), Ok(x86));
        assert!(matches!(
            x86.with_counter_offset(5),
            Err(AccelError::OptionNotForArch {
                option: "counter-offset",
                ..
            })
        ));
    }

    #[test]
    fn vcpu_indices_are_bounded_and_unique() {
        let vm = vm(2);
        assert!(vm.create_vcpu(0).is_ok());
        assert_eq!(vm.create_vcpu(0).unwrap_err(), AccelError::VcpuExists(0));
        assert_eq!(
            vm.create_vcpu(2).unwrap_err(),
            AccelError::VcpuIndexOutOfRange {
                index: 2,
                max_cpus: 2
            }
        );
        assert!(vm.create_vcpu(1).is_ok());
        assert_eq!(vm.vcpus().len(), 2);
    }

    #[test]
    fn removed_vcpu_index_can_be_reused() {
        let vm = vm(1);
        vm.create_vcpu(0).unwrap();
        assert!(vm.remove_vcpu(0));
        assert!(!vm.remove_vcpu(0));
        assert!(!vm.remove_vcpu(7));
        assert!(vm.create_vcpu(0).is_ok());
    }

    #[test]
    fn the_refused_vcpu_index_fails_and_the_others_do_not() {
        let vm = Vm::new(VmConfig {
            refused_vcpu: Some(1),
            ..VmConfig::new(Arch::X86_64, 3, false).unwrap()
        });
        assert_eq!(
            vm.create_vcpu(1).map(|_| ()),
            Err(AccelError::VcpuRefused(1))
        );
        assert!(vm.create_vcpu(0).is_ok() && vm.create_vcpu(2).is_ok());
        assert_eq!(vm.vcpus().len(), 2, "the refused one is not registered");
    }

    #[test]
    fn stats_report_lists_each_vcpu() {
        let vm = vm(2);
        let v1 = vm.create_vcpu(1).unwrap();
        vm.create_vcpu(0).unwrap();
        v1.reset(crate::vcpu::ResetKind::Cold);
        assert_eq!(v1.x86().unwrap().rdmsr(0x1b), crate::Route::Unhandled);
        let report = vm.stats_report();
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("rustkvm: x86_64 vcpu 0: resets=0 "));
        assert!(lines[1].starts_with("rustkvm: x86_64 vcpu 1: resets=1 "));
        assert!(lines[1].contains(" rdmsr=1 "), "{}", lines[1]);
    }

    #[test]
    fn under_icount_a_waiting_vcpu_steals_the_vm_time_others_ran_not_host_time() {
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        const GPA: u64 = 0x1000;
        let clock = Arc::new(AtomicU64::new(1_000));
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let config = VmConfig {
            mttcg: false,
            icount: true,
            ..VmConfig::new(Arch::X86_64, 2, false).unwrap()
        };
        let vm = Vm::with_sched(
            config,
            Box::new(crate::memory::tests::FakeRam::with_clock(
                0x2000,
                Arc::clone(&clock),
            )),
            Arc::clone(&host) as Arc<dyn HostSched>,
        );
        let (v0, _v1) = (vm.create_vcpu(0).unwrap(), vm.create_vcpu(1).unwrap());
        let steal = || {
            let mut b = [0u8; 8];
            vm.shared.host.read(GPA, &mut b);
            u64::from_le_bytes(b)
        };
        assert_eq!(
            v0.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v0.run_begin();
        // The host keeps the thread on a run queue for 3 ms of its turn ...
        host.advance(5_000_000);
        host.update(T0, |t| t.run_delay_ns += 3_000_000);
        clock.store(2_000, Ordering::SeqCst);
        // ... which ends runnable; vCPU 1 executes 500 ns of VM time while
        // the host takes 20 ms, 7 ms of them with the thread on a run queue.
        v0.run_end(false);
        clock.store(2_500, Ordering::SeqCst);
        host.advance(20_000_000);
        host.update(T0, |t| t.run_delay_ns += 7_000_000);
        v0.run_begin();
        assert_eq!(steal(), 500, "VM time, whatever the host did");
        v0.run_end(true);
    }

    #[test]
    fn the_boot_vcpu_on_the_legacy_kvmclock_msr_makes_no_kvmclock_stable() {
        use crate::x86::clock::{pvti, MSR_KVM_SYSTEM_TIME, MSR_KVM_SYSTEM_TIME_NEW};
        use crate::x86::cpuid::KVM_FEATURE_CLOCKSOURCE_STABLE_BIT as STABLE;
        const A: u64 = 0x1000;
        const B: u64 = 0x1040;
        let vm = Vm::with_memory(
            VmConfig::new(Arch::X86_64, 2, false).unwrap(),
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
        );
        let (v0, v1) = (vm.create_vcpu(0).unwrap(), vm.create_vcpu(1).unwrap());
        for v in [&v0, &v1] {
            v.x86().unwrap().setup(0, STABLE, 0, None);
        }
        let flags = |gpa: u64| {
            let mut b = [0u8];
            vm.shared.host.read(gpa + pvti::FLAGS, &mut b);
            b[0]
        };
        let wr = |v: &Vcpu, msr, value| {
            assert_eq!(
                v.x86().unwrap().wrmsr(msr, value),
                crate::vcpu::Route::Handled(())
            );
        };
        wr(&v1, MSR_KVM_SYSTEM_TIME_NEW, B | 1);
        wr(&v0, MSR_KVM_SYSTEM_TIME_NEW, A | 1);
        assert_eq!((flags(A), flags(B)), (1, 1), "advertised: stable");
        // vCPU 0 moves to MSR 0x12: no master clock, every vCPU rewritten.
        wr(&v0, MSR_KVM_SYSTEM_TIME, A | 1);
        assert_eq!((flags(A), flags(B)), (0, 0));
        // Another vCPU's choice does not matter.
        wr(&v1, MSR_KVM_SYSTEM_TIME, B | 1);
        wr(&v1, MSR_KVM_SYSTEM_TIME_NEW, B | 1);
        assert_eq!(flags(B), 0);
        // vCPU 0 back on the new MSR (even disabling it): stable again.
        wr(&v0, MSR_KVM_SYSTEM_TIME_NEW, A);
        assert_eq!(flags(B), 1);
        wr(&v1, MSR_KVM_SYSTEM_TIME, B | 1);
        assert_eq!(flags(B), 1);
    }

    /// `struct kvm_steal_time`'s guest address in the tests below, and
    /// where its `preempted` byte is.
    const ST_GPA: u64 = 0x1000;
    /// See ST_GPA.
    const ST_PREEMPTED: u64 = ST_GPA + 16;

    /// A machine of `n` x86 vCPUs with 8 KiB of fake RAM on `host`.
    fn vm_on(n: u32, host: &Arc<FakeSched>) -> Arc<Vm> {
        Arc::new(Vm::with_sched(
            VmConfig::new(Arch::X86_64, n, false).unwrap(),
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
            Arc::clone(host) as Arc<dyn HostSched>,
        ))
    }

    /// Counts `v`'s exit requests (QEMU's cpu_exit: how often it was asked
    /// to leave guest code).
    fn count_exits(v: &Vcpu) -> Arc<AtomicU64> {
        let exits = Arc::new(AtomicU64::new(0));
        v.set_exit_request(Some({
            let exits = Arc::clone(&exits);
            crate::vcpu::ExitRequest::new(move || {
                exits.fetch_add(1, Ordering::SeqCst);
            })
        }));
        exits
    }

    #[test]
    fn a_spinning_vcpu_marks_a_peer_off_the_cpus_preempted_only_when_contended() {
        use crate::vcpu::PEER_LOOK_NS;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        // vCPU 0 runs on host thread T0, vCPU 1 on T1; this test's thread
        // acts as each in turn.
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.set(T1, ON_CPU);
        let vm = vm_on(2, &host);
        let (v0, v1) = (vm.create_vcpu(0).unwrap(), vm.create_vcpu(1).unwrap());
        let byte = || {
            let mut b = [0u8];
            vm.shared.host.read(ST_PREEMPTED, &mut b);
            b[0]
        };
        let exits = count_exits(&v1);
        let exits = || exits.load(Ordering::SeqCst);
        // vCPU 1 enables steal time and enters guest code, and the host
        // takes its thread off the CPUs: in guest code, off the CPUs.
        host.call_as(T1);
        assert_eq!(
            v1.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v1.run_begin();
        host.update(T1, |t| t.running = false);
        // The host not known to be overcommitted: nobody looks.
        host.call_as(T0);
        v0.run_begin();
        v0.run_end(false);
        assert_eq!(byte(), 0);
        assert_eq!(host.clock_reads(), 0, "no thread's clock read");
        // Overcommitted: vCPU 0's next entry finds vCPU 1 off the CPUs.
        vm.shared.contended.store(true, Ordering::Relaxed);
        host.advance(PEER_LOOK_NS);
        v0.run_begin();
        assert_eq!(byte(), 1, "marked preempted");
        assert_eq!(exits(), 1, "and asked to leave");
        assert_eq!(host.clock_reads(), 1, "vCPU 1's clock only, not its own");
        v0.run_end(false);
        // vCPU 1's thread gets a CPU back: its entry clears the flag.
        host.update(T1, |t| t.running = true);
        host.call_as(T1);
        v1.run_end(false);
        v1.run_begin();
        assert_eq!(byte(), 0, "cleared at its entry");
        // Off the CPUs again, but vCPU 0 looked less than PEER_LOOK_NS ago.
        host.update(T1, |t| t.running = false);
        host.call_as(T0);
        host.advance(PEER_LOOK_NS - 1);
        v0.run_begin();
        v0.run_end(false);
        assert_eq!((byte(), exits(), host.clock_reads()), (0, 1, 1), "no look");
        host.advance(1);
        v0.run_begin();
        v0.run_end(false);
        assert_eq!((byte(), exits()), (1, 2), "looked: marked again");
        // On a CPU when vCPU 0 looks: not marked.
        host.call_as(T1);
        v1.run_end(false);
        v1.run_begin();
        assert_eq!(byte(), 0);
        host.update(T1, |t| t.running = true);
        host.call_as(T0);
        host.advance(PEER_LOOK_NS);
        v0.run_begin();
        v0.run_end(false);
        assert_eq!((byte(), exits(), host.clock_reads()), (0, 2, 3), "running");
        // Out of guest code (here: a voluntary stop) it is never marked,
        // though its thread is off the CPUs.
        host.call_as(T1);
        v1.run_end(true);
        host.update(T1, |t| t.running = false);
        host.call_as(T0);
        host.advance(PEER_LOOK_NS);
        v0.run_begin();
        assert_eq!(byte(), 0, "a halted vCPU is not preempted");
        assert_eq!(exits(), 2);
        v0.run_end(false);
        // Nor is one that leaves guest code while vCPU 0 reads its clock.
        host.call_as(T1);
        v1.run_begin();
        host.call_as(T0);
        host.on_clock_read({
            let v1 = Arc::clone(&v1);
            Box::new(move || v1.run_end(true))
        });
        host.advance(PEER_LOOK_NS);
        v0.run_begin();
        assert_eq!((byte(), exits()), (0, 2), "left guest code meanwhile");
        v0.run_end(false);
        // Nor is a peer whose thread cannot be read (it exited, say).
        host.call_as(T1);
        v1.run_begin();
        host.forget(T1);
        host.call_as(T0);
        host.advance(PEER_LOOK_NS);
        v0.run_begin();
        assert_eq!(
            (byte(), exits()),
            (0, 2),
            "unreadable: not known off the CPUs"
        );
        v0.run_end(false);
        // Under round-robin TCG no vCPU looks (the exit marks instead).
        let rr = Vm::with_sched(
            VmConfig {
                mttcg: false,
                ..VmConfig::new(Arch::X86_64, 2, false).unwrap()
            },
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
            Arc::clone(&host) as Arc<dyn HostSched>,
        );
        rr.shared.contended.store(true, Ordering::Relaxed);
        let (r0, r1) = (rr.create_vcpu(0).unwrap(), rr.create_vcpu(1).unwrap());
        host.set(
            T1,
            FakeThread {
                running: false,
                ..ON_CPU
            },
        );
        host.call_as(T1);
        assert_eq!(
            r1.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        r1.run_begin();
        host.call_as(T0);
        let reads = host.clock_reads();
        host.advance(PEER_LOOK_NS);
        r0.run_begin();
        assert_eq!(host.clock_reads(), reads, "round-robin: no look");
    }

    #[test]
    fn the_sampler_writes_no_guest_ram_until_the_vm_runs_nor_after_it_stops() {
        use crate::vcpu::Sampled;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        const MS: u64 = 1_000_000;
        let host = FakeSched::at(MS);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let vm = vm_on(1, &host);
        let v0 = vm.create_vcpu(0).unwrap();
        let byte = || {
            let mut b = [0u8];
            assert!(vm.shared.host.read(ST_PREEMPTED, &mut b));
            b[0]
        };
        assert_eq!(
            v0.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v0.run_begin();
        // vCPU 0 in guest code, kept off the CPUs on a run queue for most
        // of every tick: what the sampler marks preempted.
        let starve = || {
            host.advance(MS);
            host.update(T0, |t| {
                t.cpu_ns += 100_000;
                t.running = false;
            });
        };
        let mut sampler = Sampler::new(std::time::Duration::from_micros(500), host.now_ns());
        // Before QEMU says the VM runs (a machine created stopped, -S, an
        // incoming migration): no look, no write, nothing remembered.
        for _ in 0..3 {
            starve();
            sampler.tick(&vm);
            assert_eq!(byte(), 0, "written before the VM ran");
        }
        assert!(sampler.last.iter().all(Option::is_none));
        assert_eq!(sampler.nap, IDLE_SAMPLER_PERIOD);
        vm.set_running(true);
        starve();
        sampler.tick(&vm);
        starve();
        sampler.tick(&vm);
        assert_eq!(byte(), 1, "running: marked preempted");
        // Cleared by its own entry, then the VM stops (savevm, stop, the
        // last RAM pass of a migration): however long the vCPU thread is
        // kept off the CPUs, nothing is written.
        v0.run_end(false);
        v0.run_begin();
        assert_eq!(byte(), 0);
        vm.set_running(false);
        for _ in 0..3 {
            starve();
            sampler.tick(&vm);
            assert_eq!(byte(), 0, "written while the VM was stopped");
        }
        // Running again: the first tick only looks (the stopped time is no
        // sampling interval), the next may mark.
        vm.set_running(true);
        starve();
        sampler.tick(&vm);
        assert_eq!(byte(), 0, "the stop counted as a wait");
        starve();
        sampler.tick(&vm);
        assert_eq!(byte(), 1);
        assert_eq!(v0.sample(&mut None, MS, false), Sampled::Running);
    }

    #[test]
    fn the_sampler_thread_attaches_to_guest_memory_before_it_writes() {
        use crate::memory::tests::FakeRam;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        let ram = Arc::new(FakeRam::new(0x2000));
        let vm = Arc::new(Vm::with_memory(
            VmConfig::new(Arch::X86_64, 1, true).unwrap(),
            Box::new(Arc::clone(&ram)),
        ));
        vm.set_running(true);
        let v0 = vm.create_vcpu(0).unwrap();
        assert_eq!(
            v0.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v0.run_begin();
        vm.start_sampler(std::time::Duration::from_micros(500))
            .unwrap();
        // Wait for the sampler to attach; it does so before anything else.
        // (The bound only keeps a broken build from hanging the suite.)
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !ram.attached_names().iter().any(|n| n == "rustkvm-steal") {
            assert!(
                std::time::Instant::now() < give_up,
                "the sampler never attached"
            );
            std::thread::yield_now();
        }
        v0.run_end(false);
        drop(vm);
        assert_eq!(ram.unattached_writes(), 0);
    }

    #[test]
    fn the_sampler_marks_a_vcpu_kept_off_the_cpus_and_folds_its_run_delay() {
        use crate::vcpu::Sampled;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        const MS: u64 = 1_000_000;
        let host = FakeSched::at(MS);
        host.set(
            T0,
            FakeThread {
                run_delay_ns: 2 * MS,
                ..ON_CPU
            },
        );
        host.call_as(T0);
        let vm = vm_on(1, &host);
        let v0 = vm.create_vcpu(0).unwrap();
        let read = |gpa: u64, b: &mut [u8]| assert!(vm.shared.host.read(gpa, b));
        let byte = || {
            let mut b = [0u8];
            read(ST_PREEMPTED, &mut b);
            b[0]
        };
        let steal = || {
            let mut b = [0u8; 8];
            read(ST_GPA, &mut b);
            u64::from_le_bytes(b)
        };
        let exits = count_exits(&v0);
        let exits = || exits.load(Ordering::SeqCst);
        let mut view = None;
        // A tick every 1 ms of host time; `fold` reads the run delay.
        let mut tick = |fold: bool| {
            host.advance(MS);
            v0.sample(&mut view, MS, fold)
        };
        assert_eq!(tick(true), Sampled::Unwatched, "steal time off");
        assert_eq!(
            v0.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        assert_eq!(tick(true), Sampled::Unwatched, "never ran");
        v0.run_begin();
        assert_eq!(tick(false), Sampled::Running, "nothing to compare with yet");
        // Ran 0.99 ms of the 1 ms and off the CPU now (displaced by the
        // sampler itself): not preempted.
        host.update(T0, |t| {
            t.cpu_ns += 990_000;
            t.running = false;
        });
        assert_eq!(tick(false), Sampled::Running);
        assert_eq!((byte(), exits()), (0, 0));
        // Ran 0.5 ms of 1 ms, off the CPUs and on a run queue: preempted,
        // and asked to leave guest code.
        host.update(T0, |t| t.cpu_ns += 500_000);
        assert_eq!(tick(false), Sampled::Contended);
        assert_eq!((byte(), exits()), (1, 1));
        // Off the CPUs but asleep (on QEMU's lock, say): not a run-queue
        // wait, not preempted; the flag is cleared.
        host.update(T0, |t| t.runnable = false);
        assert_eq!(tick(false), Sampled::Running);
        assert_eq!((byte(), exits()), (0, 1));
        host.update(T0, |t| t.runnable = true);
        assert_eq!(tick(false), Sampled::Contended);
        assert_eq!((byte(), exits()), (1, 2));
        // Back on a CPU: cleared; a folding tick adds the run delay's
        // growth since the entry as steal, without an entry.
        assert_eq!(steal(), 0);
        host.update(T0, |t| {
            t.cpu_ns += MS;
            t.running = true;
            t.run_delay_ns += 700_000;
        });
        assert_eq!(tick(true), Sampled::Running);
        assert_eq!((byte(), steal()), (0, 700_000));
        // A halt between two ticks explains a thread that got little CPU.
        v0.run_end(true);
        v0.run_begin();
        host.update(T0, |t| t.running = false);
        assert_eq!(tick(false), Sampled::Running);
        assert_eq!((byte(), exits()), (0, 2));
        assert_eq!(tick(false), Sampled::Contended, "no halt this time");
        // Out of guest code: idle, and no clock read.
        v0.run_end(true);
        let reads = host.clock_reads();
        assert_eq!(tick(true), Sampled::Idle);
        assert_eq!(host.clock_reads(), reads);
        assert_eq!(steal(), 700_000);
    }

    #[test]
    fn round_robin_turns_end_after_a_slice_while_another_vcpu_waits() {
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let vm = Arc::new(Vm::with_sched(
            VmConfig {
                mttcg: false,
                ..VmConfig::new(Arch::X86_64, 2, false).unwrap()
            },
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
            Arc::clone(&host) as Arc<dyn HostSched>,
        ));
        vm.set_running(true);
        let (v0, v1) = (vm.create_vcpu(0).unwrap(), vm.create_vcpu(1).unwrap());
        let (e0, e1) = (count_exits(&v0), count_exits(&v1));
        let ends = || (e0.load(Ordering::SeqCst), e1.load(Ordering::SeqCst));
        let mut sampler = Sampler::new(std::time::Duration::from_micros(500), host.now_ns());
        let nap = |s: &Sampler| s.nap.as_nanos() as u64;
        // No guest with steal time: nothing to time, the idle period.
        v0.run_begin();
        host.advance(10 * RR_SLICE_NS);
        sampler.tick(&vm);
        assert_eq!((ends(), sampler.nap), ((0, 0), IDLE_SAMPLER_PERIOD));
        v0.run_end(false);
        // A lone vCPU with steal time on: nobody to share with.
        let lone = Arc::new(Vm::with_sched(
            VmConfig {
                mttcg: false,
                ..VmConfig::new(Arch::X86_64, 1, false).unwrap()
            },
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
            Arc::clone(&host) as Arc<dyn HostSched>,
        ));
        lone.set_running(true);
        let only = lone.create_vcpu(0).unwrap();
        let only_ends = count_exits(&only);
        assert_eq!(
            only.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        only.run_begin();
        only.run_end(false);
        only.run_begin();
        host.advance(10 * RR_SLICE_NS);
        sampler.tick(&lone);
        assert_eq!(only_ends.load(Ordering::SeqCst), 0);
        assert_eq!(sampler.nap, IDLE_SAMPLER_PERIOD);
        for (v, gpa) in [(&v0, ST_GPA), (&v1, ST_GPA + 0x40)] {
            assert_eq!(
                v.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, gpa | 1),
                crate::vcpu::Route::Handled(())
            );
        }
        // vCPU 1 halted, vCPU 0 busy: nobody waits, turns are not timed.
        v1.run_begin();
        v1.run_end(true);
        v0.run_begin();
        host.advance(10 * RR_SLICE_NS);
        sampler.tick(&vm);
        assert_eq!(ends(), (0, 0));
        assert_eq!(nap(&sampler), RR_SLICE_NS * u64::from(RELAXED_FACTOR));
        v0.run_end(false);
        // vCPU 1 busy too, waiting while vCPU 0 has its turn: the sampler
        // wakes when the slice is over and ends the turn, once.
        v1.run_begin();
        v1.run_end(false);
        v0.run_begin();
        host.advance(RR_SLICE_NS / 5);
        sampler.tick(&vm);
        assert_eq!(ends(), (0, 0), "within its slice");
        assert_eq!(nap(&sampler), RR_SLICE_NS * 4 / 5, "until the slice ends");
        host.advance(RR_SLICE_NS * 4 / 5);
        sampler.tick(&vm);
        assert_eq!(ends(), (1, 0), "the slice is over");
        host.advance(RR_MIN_NAP_NS);
        sampler.tick(&vm);
        assert_eq!(ends(), (1, 0), "a turn is ended once");
        // vCPU 1's turn is timed afresh.
        v0.run_end(false);
        v1.run_begin();
        host.advance(RR_SLICE_NS - 1);
        sampler.tick(&vm);
        assert_eq!((ends(), nap(&sampler)), ((1, 0), RR_MIN_NAP_NS));
        host.advance(1);
        sampler.tick(&vm);
        assert_eq!(ends(), (1, 1));
        // A stopped VM's turns are not ended.
        v1.run_end(false);
        v0.run_begin();
        vm.set_running(false);
        host.advance(10 * RR_SLICE_NS);
        sampler.tick(&vm);
        assert_eq!(ends(), (1, 1));
        vm.set_running(true);
        sampler.tick(&vm);
        assert_eq!(ends(), (2, 1), "once it runs again");
    }

    /// What a Linux guest's `/proc/stat` says of busy vCPUs sharing one
    /// round-robin thread: user and steal time in ns, ticks handled.
    #[derive(Debug, Default, Clone, Copy)]
    struct GuestTimes {
        user_ns: u64,
        steal_ns: u64,
        ticks: u64,
    }

    /// One guest CPU of [`round_robin_linux`]: its tick timer and its tick
    /// accounting.
    #[derive(Debug, Default, Clone, Copy)]
    struct GuestCpu {
        /// When the tick timer expires next (ns); it fires once, then waits
        /// for the tick handler to re-arm it.
        expires: u64,
        armed: bool,
        /// The timer fired: its interrupt waits for the handler.
        pending: bool,
        /// Steal time the last tick accounted up to (`rq->prev_steal_time`).
        prev_steal: u64,
        times: GuestTimes,
    }

    /// Busy vCPUs of a Linux guest on one round-robin thread, in host time,
    /// on an idle host, driving the real vCPUs and sampler:
    ///
    /// - Linux (6.12) ticks every `tick_ns` on every CPU at the same moments
    ///   (`tick_setup_sched_timer` without `skew_tick`); a tick handler
    ///   accounts the steal since the previous tick and the rest of the
    ///   tick, if any, as user time (`account_process_tick`,
    ///   `steal_account_process_time`), and re-arms the timer at the next
    ///   tick after now (`hrtimer_forward`: ticks that passed are lost).
    /// - QEMU's round-robin loop (`rr_cpu_thread_fn`) runs each vCPU in turn
    ///   until it is asked to leave; an interrupt for any vCPU kicks the
    ///   running one out (`rr_kick_vcpu_thread` exits every vCPU), even an
    ///   interrupt for itself: it takes the interrupt then (the frame is
    ///   pushed), and the handler runs at its next turn. A vCPU waiting for
    ///   its turn with a pending interrupt takes it when its turn comes.
    /// - Between two turns the loop spends `switch_ns`.
    ///
    /// The sampler ticks when its nap says (the fake host's clock).
    fn round_robin_linux(n: u32, tick_ns: u64, run_ns: u64) -> Vec<GuestTimes> {
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        const STEP_NS: u64 = 10_000;
        const SWITCH_NS: u64 = 5_000;
        let gpa = |i: usize| 0x1000 + 0x40 * i as u64;
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let config = VmConfig {
            mttcg: false,
            ..VmConfig::new(Arch::X86_64, n, false).unwrap()
        };
        let vm = Arc::new(Vm::with_sched(
            config,
            Box::new(crate::memory::tests::FakeRam::new(0x2000)),
            Arc::clone(&host) as Arc<dyn HostSched>,
        ));
        vm.set_running(true);
        let vcpus: Vec<_> = (0..n).map(|i| vm.create_vcpu(i).unwrap()).collect();
        let exits: Vec<_> = vcpus.iter().map(|v| count_exits(v)).collect();
        let start = host.now_ns();
        let mut cpus = vec![
            GuestCpu {
                expires: start + tick_ns,
                armed: true,
                ..GuestCpu::default()
            };
            n as usize
        ];
        for (i, v) in vcpus.iter().enumerate() {
            assert_eq!(
                v.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, gpa(i) | 1),
                crate::vcpu::Route::Handled(())
            );
        }
        let steal_of = |i: usize| {
            let mut b = [0u8; 8];
            assert!(vm.shared.host.read(gpa(i), &mut b));
            u64::from_le_bytes(b)
        };
        let mut sampler = Sampler::new(std::time::Duration::from_micros(500), start);
        let mut next_look = start + sampler.nap.as_nanos() as u64;
        let end = start + run_ns;
        let mut c = 0;
        while host.now_ns() < end {
            let seen = exits[c].load(Ordering::SeqCst);
            vcpus[c].run_begin();
            let now = host.now_ns();
            let cpu = &mut cpus[c];
            if cpu.pending {
                // The tick handler: steal first, the rest of the tick is
                // user time; the timer re-armed at the next tick to come.
                cpu.pending = false;
                let steal = steal_of(c);
                let delta = steal - cpu.prev_steal;
                cpu.prev_steal = steal;
                cpu.times.steal_ns += delta;
                cpu.times.user_ns += tick_ns.saturating_sub(delta);
                cpu.times.ticks += 1;
                while cpu.expires <= now {
                    cpu.expires += tick_ns;
                }
                cpu.armed = true;
            }
            // Guest code until an interrupt or an exit request.
            loop {
                host.advance(STEP_NS);
                let now = host.now_ns();
                if now >= next_look {
                    sampler.tick(&vm);
                    next_look = now + (sampler.nap.as_nanos() as u64).max(1);
                }
                let mut kick = false;
                for cpu in cpus.iter_mut().filter(|g| g.armed && g.expires <= now) {
                    (cpu.armed, cpu.pending, kick) = (false, true, true);
                }
                if kick || exits[c].load(Ordering::SeqCst) != seen || now >= end {
                    break;
                }
            }
            vcpus[c].run_end(false);
            host.advance(SWITCH_NS);
            c = (c + 1) % n as usize;
        }
        cpus.iter().map(|g| g.times).collect()
    }

    /// Steal's share of the accounted time, and the ticks handled per vCPU
    /// as a share of the ticks that were due.
    fn steal_share_and_ticks(t: &[GuestTimes], tick_ns: u64, run_ns: u64) -> (f64, f64) {
        let (user, steal) = t
            .iter()
            .fold((0, 0), |(u, s), c| (u + c.user_ns, s + c.steal_ns));
        let ticks = t.iter().map(|c| c.ticks).min().unwrap_or(0);
        (
            steal as f64 / (user + steal).max(1) as f64,
            ticks as f64 / (run_ns / tick_ns) as f64,
        )
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "three simulated seconds of round-robin turns: too slow under Miri; the same paths run in the other vm tests"
    )]
    fn busy_linux_vcpus_sharing_a_round_robin_thread_see_their_share_as_steal() {
        // Linux at HZ 250 (Debian's) and HZ 1000; 2 and 3 busy vCPUs: each
        // is runnable but not running (n-1)/n of the time, and steal is that
        // share of what the guest accounts, within 15 %.
        const S: u64 = 1_000_000_000;
        for (n, tick_ns) in [(2, 4_000_000), (3, 4_000_000), (2, 1_000_000)] {
            let t = round_robin_linux(n, tick_ns, S);
            let (share, ticks) = steal_share_and_ticks(&t, tick_ns, S);
            let want = f64::from(n - 1) / f64::from(n);
            assert!(
                (share - want).abs() <= 0.15 * want,
                "{n} vCPUs, {tick_ns} ns ticks: steal share {share:.3}, not about {want:.3}; handled {:.0} % of the ticks; {t:?}",
                ticks * 100.0
            );
            assert!(
                ticks >= 0.9,
                "{n} vCPUs, {tick_ns} ns ticks: each handled only {:.0} % of its ticks: {t:?}",
                ticks * 100.0
            );
        }
    }

    /// A round-robin `-icount` machine of `n` vCPUs of `arch` over `ram`,
    /// whose VM time is `clock`.
    fn icount_vm(
        arch: Arch,
        n: u32,
        ram: &Arc<crate::memory::tests::FakeRam>,
        host: &Arc<FakeSched>,
    ) -> Vm {
        let config = VmConfig {
            mttcg: false,
            icount: true,
            ..VmConfig::new(arch, n, false).unwrap()
        };
        Vm::with_sched(
            config,
            Box::new(Arc::clone(ram)),
            Arc::clone(host) as Arc<dyn HostSched>,
        )
    }

    fn inj(cpu: u32, at: u64, steal: u64, window: u64) -> Injection {
        Injection::new(cpu, at, steal, window)
    }

    #[test]
    fn an_injected_preemption_holds_the_vcpu_preempted_then_adds_exactly_its_steal() {
        use crate::memory::tests::FakeRam;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        let clock = Arc::new(AtomicU64::new(1_000));
        let ram = Arc::new(FakeRam::with_clock(0x2000, Arc::clone(&clock)));
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let vm = icount_vm(Arch::X86_64, 2, &ram, &host);
        let (v0, v1) = (vm.create_vcpu(0).unwrap(), vm.create_vcpu(1).unwrap());
        let exits = count_exits(&v1);
        let exits = || exits.load(Ordering::SeqCst);
        let byte = || {
            let mut b = [0u8];
            assert!(ram.read(ST_PREEMPTED, &mut b));
            b[0]
        };
        let steal = || {
            let mut b = [0u8; 8];
            assert!(ram.read(ST_GPA, &mut b));
            u64::from_le_bytes(b)
        };
        assert_eq!(
            v1.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v1.run_begin();
        v1.run_end(true);
        assert!(matches!(
            vm.inject_add(&[inj(1, 10_000, 777, 5_000), inj(0, 999, 1, 0)]),
            Err(InjectError::Past { .. })
        ));
        assert_eq!(*ram.inject_timer.lock(), None, "a refusal adds nothing");
        vm.inject_add(&[inj(1, 10_000, 777, 5_000)]).unwrap();
        assert_eq!(*ram.inject_timer.lock(), Some(10_000));
        let before = steal();

        clock.store(10_000, Ordering::SeqCst);
        vm.inject_fire();
        assert!(v1.held() && !v0.held());
        assert_eq!((byte(), exits()), (1, 1), "preempted, and asked to leave");
        assert_eq!(*ram.inject_timer.lock(), Some(15_000));
        // QEMU looked before the hold: the entry leaves at once, flag kept.
        assert!(!v1.run_begin());
        assert_eq!((byte(), exits()), (1, 2));
        v1.run_end(false);
        // vCPU 0 runs on meanwhile, and sees vCPU 1 preempted throughout.
        clock.store(12_000, Ordering::SeqCst);
        v0.run_begin();
        v0.run_end(false);
        assert_eq!((byte(), steal()), (1, before));

        clock.store(15_000, Ordering::SeqCst);
        vm.inject_fire();
        assert!(!v1.held());
        assert_eq!(*ram.woken.lock(), vec![1]);
        assert_eq!(*ram.inject_timer.lock(), None);
        assert_eq!(byte(), 1, "cleared by its entry, as KVM's");
        v1.run_begin();
        assert_eq!(byte(), 0);
        assert_eq!(steal(), before + 777, "exactly the injected steal");
        v1.run_end(true);
    }

    #[test]
    fn injected_steal_without_a_window_and_on_arm64_has_no_flag_to_set() {
        use crate::arm::pvtime::layout::STOLEN_TIME;
        use crate::memory::tests::FakeRam;
        const BASE: u64 = 0x1000;
        let clock = Arc::new(AtomicU64::new(0));
        let ram = Arc::new(FakeRam::with_clock(0x2000, Arc::clone(&clock)));
        let host = FakeSched::at(1_000_000);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let vm = icount_vm(Arch::Aarch64, 1, &ram, &host);
        let v0 = vm.create_vcpu(0).unwrap();
        let arm = v0.arm().unwrap();
        arm.set_pvtime_base(BASE).unwrap();
        // PV_TIME_ST: the guest asks for its structure.
        let regs = [
            u64::from(crate::arm::smccc::PV_TIME_ST),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(
            arm.hvc_smc(false, regs),
            crate::Route::Handled([BASE, 0, 0, 0])
        );
        let stolen = || {
            let mut b = [0u8; 8];
            assert!(ram.read(BASE + STOLEN_TIME, &mut b));
            u64::from_le_bytes(b)
        };
        v0.run_begin();
        v0.run_end(true);
        let before = stolen();
        vm.inject_add(&[inj(0, 100, 40, 0), inj(0, 200, 60, 50)])
            .unwrap();
        clock.store(100, Ordering::SeqCst);
        vm.inject_fire();
        assert!(!v0.held());
        v0.run_begin();
        v0.run_end(true);
        assert_eq!(stolen(), before + 40);
        clock.store(200, Ordering::SeqCst);
        vm.inject_fire();
        assert!(v0.held(), "held, with no flag to show it");
        clock.store(250, Ordering::SeqCst);
        vm.inject_fire();
        v0.run_begin();
        assert_eq!(stolen(), before + 100);
        v0.run_end(true);
    }

    #[test]
    fn the_sampler_leaves_an_injected_preemption_alone() {
        use crate::vcpu::Sampled;
        use crate::x86::steal::MSR_KVM_STEAL_TIME;
        const MS: u64 = 1_000_000;
        let host = FakeSched::at(MS);
        host.set(T0, ON_CPU);
        host.call_as(T0);
        let vm = vm_on(1, &host);
        let v0 = vm.create_vcpu(0).unwrap();
        let byte = || {
            let mut b = [0u8];
            assert!(vm.shared.host.read(ST_PREEMPTED, &mut b));
            b[0]
        };
        assert_eq!(
            v0.x86().unwrap().wrmsr(MSR_KVM_STEAL_TIME, ST_GPA | 1),
            crate::vcpu::Route::Handled(())
        );
        v0.run_begin();
        vm.inject_add(&[inj(0, 0, 5, 10)]).unwrap();
        vm.inject_fire();
        v0.run_end(false);
        assert_eq!(byte(), 1);
        let mut view = None;
        for _ in 0..3 {
            host.advance(MS);
            assert_eq!(v0.sample(&mut view, MS, true), Sampled::Idle);
            assert_eq!(byte(), 1, "the sampler cleared an injected preemption");
        }
    }

    #[test]
    fn injections_for_a_vcpu_without_steal_time_or_absent_are_dropped_not_applied() {
        use crate::memory::tests::FakeRam;
        let clock = Arc::new(AtomicU64::new(0));
        let ram = Arc::new(FakeRam::with_clock(0x2000, Arc::clone(&clock)));
        let host = FakeSched::at(1_000_000);
        let vm = icount_vm(Arch::X86_64, 2, &ram, &host);
        let v0 = vm.create_vcpu(0).unwrap();
        vm.inject_add(&[inj(0, 10, 5, 10), inj(1, 10, 5, 0)])
            .unwrap();
        let writes = ram.writes_since(0).len();
        clock.store(10, Ordering::SeqCst);
        vm.inject_fire();
        assert!(v0.held(), "a hold needs no steal structure");
        clock.store(20, Ordering::SeqCst);
        vm.inject_fire();
        assert!(!v0.held());
        assert_eq!(ram.writes_since(writes), vec![], "nothing written");
    }
}
