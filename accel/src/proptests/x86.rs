//! x86: a machine of 1–3 vCPUs with no PMU, an Intel PMU (1–8 GP
//! counters, with or without full-width writes) or an AMD PMU (legacy,
//! PerfCtrExtCore, PerfMonV2 with 1–6 counters), PV CPUID enforced or not.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use proptest::prelude::*;

use super::{check_counter, check_writes, edge_u64, gpa, tid, Host, Owner, Region, Registry, RAM};
use crate::host::tests::FakeThread;
use crate::host::HostSched;
use crate::vcpu::TestCounting;
use crate::vcpu::{ResetKind, Route, SamplerView, Vcpu};
use crate::vm::{Arch, Vm, VmConfig};
use crate::x86::clock::{scale_delta, TscRate, PAGE_SIZE};
use crate::x86::hypercall::{Action, Call, Fault, Insn};
use crate::x86::pmu::Counting;
use crate::x86::vcpu::SavedMsrs;

// The MSRs, numbered as in Linux's msr-index.h and kvm_para.h.
const STEAL: u32 = 0x4b56_4d03;
const SYSTEM_TIME: u32 = 0x12;
const SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
const WALL_CLOCK: u32 = 0x11;
const WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
const TSC: u32 = 0x10;
const TSC_ADJUST: u32 = 0x3b;
const TSC_DEADLINE: u32 = 0x6e0;

/// KVM_FEATURE_* bits (kvm_para.h) the PV MSRs and hypercalls need.
const CLOCKSOURCE: u32 = 1 << 0;
const CLOCKSOURCE2: u32 = 1 << 3;
const STEAL_TIME: u32 = 1 << 5;
const PV_UNHALT: u32 = 1 << 7;
const PV_SEND_IPI: u32 = 1 << 11;
const PV_SCHED_YIELD: u32 = 1 << 13;
const CLOCKSOURCE_STABLE: u32 = 1 << 24;

/// The PMU the vCPUs are given (`-cpu ...,pmu=on` and `pmu-counters`).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Off,
    Intel { gp: u8, fw: bool },
    Amd { core: bool, v2: bool, gp: u8 },
}

impl Shape {
    /// From the machine's `pmu-counters` (0: the vendor's default), as
    /// `intel_pmu_refresh` / `amd_pmu_refresh` size it.
    fn new(kind: u8, n: u8, fw: bool, core: bool, v2: bool) -> Shape {
        match kind {
            0 => Shape::Off,
            1 => Shape::Intel {
                gp: if n == 0 { 4 } else { n },
                fw,
            },
            _ => Shape::Amd {
                core,
                v2,
                gp: if v2 {
                    if n == 0 {
                        6
                    } else {
                        n.min(6)
                    }
                } else if core {
                    6
                } else {
                    4
                },
            },
        }
    }

    /// `Vcpu::x86_setup`'s `pmu` argument.
    fn setup_arg(self) -> u32 {
        use crate::x86::vcpu::*;
        match self {
            Shape::Off => PMU_NONE,
            Shape::Intel { fw, .. } => PMU_INTEL | if fw { PMU_FULL_WIDTH } else { 0 },
            Shape::Amd { core, v2, .. } => {
                PMU_AMD
                    | if core { PMU_PERFCTR_CORE } else { 0 }
                    | if v2 { PMU_PERFMON_V2 } else { 0 }
            }
        }
    }

    /// GP counters.
    fn gp(self) -> usize {
        match self {
            Shape::Off => 0,
            Shape::Intel { gp, .. } | Shape::Amd { gp, .. } => usize::from(gp),
        }
    }

    /// GLOBAL_CTRL's (Intel) / GLOBAL_CTL's (AMD v2) valid bits: the GP
    /// counters, and Intel's 3 fixed counters at bit 32.
    fn ctrl_mask(self) -> u64 {
        let gp = (1u64 << self.gp()) - 1;
        match self {
            Shape::Intel { .. } => gp | 7 << 32,
            _ => gp,
        }
    }
}

/// A counter, as every MSR and RDPMC index that reads it names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Ctr {
    Gp(usize),
    Fixed(usize),
}

/// How a write to a counter MSR becomes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    /// IA32_PMCx: bit 31 sign-extended (`intel_pmu_set_msr`: `(s64)(s32)`).
    Legacy,
    /// IA32_A_PMCx: a value wider than 48 bits #GPs.
    Full,
    /// Fixed counters and AMD counters: masked to 48 bits.
    Masked,
}

/// What KVM makes of a PMU MSR of a vCPU with `Shape` — from
/// `kvm_{get,set}_msr_common` (the legacy P6/K7 MSRs read 0 and ignore
/// writes when the PMU does not claim them; any other PMU MSR it does not
/// have #GPs), `kvm_pmu_is_valid_msr`, `intel_is_valid_msr`,
/// `amd_is_valid_msr` (K7 MSRs are the PMU's whenever it exists, so those
/// of missing counters #GP), `get_gp_pmc_amd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pmsr {
    Legacy0,
    Invalid,
    Counter(Ctr, Width),
    /// An event select; AMD drops reserved bits, Intel #GPs on them.
    Select(usize, bool),
    FixedCtrl,
    GlobalStatus,
    GlobalCtrl,
    OvfCtrl,
    PerfCaps,
    AmdStatus,
    AmdCtl,
    AmdStatusClr,
    AmdStatusSet,
    /// No rule stated here.
    Other,
}

fn classify(shape: Shape, msr: u32) -> Pmsr {
    let n = shape.gp();
    let legacy = matches!(msr, 0xc1 | 0xc2 | 0x186 | 0x187);
    let k7 = (0xc001_0000..0xc001_0008).contains(&msr);
    let f15h = (0xc001_0200..0xc001_020c).contains(&msr);
    let amd_global = (0xc000_0300..=0xc000_0303).contains(&msr);
    let intel_msr = |m: u32| {
        (0xc1..0xc9).contains(&m)
            || (0x186..0x18e).contains(&m)
            || (0x4c1..0x4c9).contains(&m)
            || (0x309..0x30c).contains(&m)
            || (0x38d..=0x390).contains(&m)
            || m == 0x345
    };
    match shape {
        Shape::Off if legacy || k7 => Pmsr::Legacy0,
        Shape::Off if intel_msr(msr) || f15h || amd_global => Pmsr::Invalid,
        Shape::Intel { fw, .. } => match msr {
            0xc1..=0xc8 if ((msr - 0xc1) as usize) < n => {
                Pmsr::Counter(Ctr::Gp((msr - 0xc1) as usize), Width::Legacy)
            }
            0x186..=0x18d if ((msr - 0x186) as usize) < n => {
                Pmsr::Select((msr - 0x186) as usize, false)
            }
            0x4c1..=0x4c8 if fw && ((msr - 0x4c1) as usize) < n => {
                Pmsr::Counter(Ctr::Gp((msr - 0x4c1) as usize), Width::Full)
            }
            0x309..=0x30b => Pmsr::Counter(Ctr::Fixed((msr - 0x309) as usize), Width::Masked),
            0x38d => Pmsr::FixedCtrl,
            0x38e => Pmsr::GlobalStatus,
            0x38f => Pmsr::GlobalCtrl,
            0x390 => Pmsr::OvfCtrl,
            0x345 => Pmsr::PerfCaps,
            _ if legacy || k7 => Pmsr::Legacy0,
            _ if intel_msr(msr) || f15h || amd_global => Pmsr::Invalid,
            _ => Pmsr::Other,
        },
        Shape::Amd { core, v2, .. } => {
            let counter = |i: usize, sel: bool| {
                if i >= n {
                    Pmsr::Invalid
                } else if sel {
                    Pmsr::Select(i, true)
                } else {
                    Pmsr::Counter(Ctr::Gp(i), Width::Masked)
                }
            };
            match msr {
                0xc001_0000..=0xc001_0003 => counter((msr - 0xc001_0000) as usize, true),
                0xc001_0004..=0xc001_0007 => counter((msr - 0xc001_0004) as usize, false),
                _ if f15h && core => counter(((msr - 0xc001_0200) / 2) as usize, msr & 1 == 0),
                0xc000_0300 if v2 => Pmsr::AmdStatus,
                0xc000_0301 if v2 => Pmsr::AmdCtl,
                0xc000_0302 if v2 => Pmsr::AmdStatusClr,
                0xc000_0303 if v2 => Pmsr::AmdStatusSet,
                // With PerfMonV2 KVM also takes Intel's three global MSRs
                // (`kvm_pmu_has_perf_global_ctrl`): no rule stated here.
                0x38e..=0x390 if v2 => Pmsr::Other,
                _ if legacy => Pmsr::Legacy0,
                _ if intel_msr(msr) || f15h || amd_global => Pmsr::Invalid,
                _ => Pmsr::Other,
            }
        }
        Shape::Off => Pmsr::Other,
    }
}

/// A step of the sequence.
#[derive(Debug, Clone)]
enum Op {
    Wrmsr {
        cpu: usize,
        msr: u32,
        value: u64,
    },
    Rdmsr {
        cpu: usize,
        msr: u32,
    },
    Rdpmc {
        cpu: usize,
        ecx: u32,
    },
    Hypercall {
        cpu: usize,
        call: Call,
    },
    Enter {
        cpu: usize,
    },
    Exit {
        cpu: usize,
        halted: bool,
    },
    /// A sampler tick on vCPU `cpu`, `interval` ns after the previous.
    Sample {
        cpu: usize,
        interval: u64,
        fold: bool,
    },
    /// vCPU `cpu`'s host thread: waited `delay` more ns on a run queue,
    /// ran `cpu_ns` more, is on a CPU or not, runnable or asleep.
    Thread {
        cpu: usize,
        delay: u64,
        cpu_ns: u64,
        running: bool,
        runnable: bool,
    },
    /// Host time and VM time move on.
    Time {
        host_ns: u64,
        vm_ns: u64,
    },
    /// The engine counted `n` more of event slot `slot` (instructions and
    /// branches at CPL>0 / CPL 0).
    Events {
        cpu: usize,
        slot: usize,
        n: u64,
    },
    PmuDue {
        cpu: usize,
    },
    /// RDPMC, the engine's callback (a sync), RDPMC again: a counter read
    /// twice with nothing counted between must read the same.
    ReadTwice {
        cpu: usize,
        ecx: u32,
    },
    Lvtt {
        cpu: usize,
        mode: u32,
    },
    Save {
        cpu: usize,
    },
    Load {
        cpu: usize,
        slot: usize,
    },
    /// A RESET, or (`init`) an INIT as QEMU drives it: the INIT, then the
    /// `cpu_reset()` that emulates it.
    Reset {
        cpu: usize,
        init: bool,
    },
}

/// The MSRs the sequences use, biased to the interesting ones.
fn msr() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => prop::sample::select(vec![STEAL, SYSTEM_TIME, SYSTEM_TIME_NEW, WALL_CLOCK, WALL_CLOCK_NEW]),
        2 => prop::sample::select(vec![TSC, TSC_ADJUST, TSC_DEADLINE, 0x4b56_4d02, 0x4b56_4d04, 0x4b56_4d05]),
        3 => 0xc1..0xc9u32,
        3 => 0x186..0x18eu32,
        2 => 0x4c1..0x4c9u32,
        2 => 0x309..0x30cu32,
        3 => 0x38d..=0x390u32,
        1 => Just(0x345u32),
        3 => 0xc001_0000..0xc001_0008u32,
        3 => 0xc001_0200..0xc001_020cu32,
        3 => 0xc000_0300..=0xc000_0303u32,
        1 => any::<u32>(),
    ]
}

/// MSR values: edge values, structure addresses with the enable bit and
/// sometimes reserved bits, event selects, counter values near the wrap.
fn value() -> impl Strategy<Value = u64> {
    let select = (
        prop::sample::select(vec![0xc0u64, 0xc4, 0x3c, 0xc2, 0x76, 0x2e, 0x00]),
        0..2u64,
        0..16u64,
        prop::sample::select(vec![0u64, 1 << 21, 1 << 24, 1 << 32, 1 << 19, 0xf << 32]),
    )
        .prop_map(|(ev, umask, flags, junk)| {
            // flags: USR (16), OS (17), INT (20), EN (22).
            let f = [16, 17, 20, 22]
                .iter()
                .enumerate()
                .fold(0, |m, (k, b)| m | ((flags >> k) & 1) << b);
            ev | umask << 8 | f | junk
        });
    prop_oneof![
        4 => edge_u64(),
        4 => (gpa(), 0..2u64, prop::sample::select(vec![0u64, 0, 0, 2, 4, 0x20, 0x3e]))
            .prop_map(|(g, en, rsvd)| (g & !1) | en | rsvd),
        3 => select,
        2 => prop::sample::select(vec![0x3u64, 0xb, 0xbbb, 0x4, 0xf, 0xff, 0x7_0000_000f, 0x3f, 3 << 62, 1 << 40]),
    ]
}

fn op(cpus: usize) -> impl Strategy<Value = Op> {
    let cpu = 0..cpus;
    let call = (
        prop_oneof![
            4 => prop::sample::select(vec![1u64, 5, 9, 10, 11, 12]),
            1 => edge_u64(),
        ],
        (
            gpa(),
            prop_oneof![3 => Just(0u64), 1 => edge_u64()],
            edge_u64(),
            edge_u64(),
        ),
        prop_oneof![4 => Just(0u8), 1 => 1..=3u8],
        prop::bool::weighted(0.8),
        (prop::bool::ANY, prop::bool::ANY, prop::bool::weighted(0.9)),
    )
        .prop_map(
            |(nr, (a0, a1, a2, a3), cpl, long_mode, (vmmcall, amd, protected))| Call {
                nr,
                args: [a0, a1, a2, a3],
                cpl,
                long_mode,
                insn: Insn::of(vmmcall, amd),
                protected,
            },
        );
    // Programming that makes counters count: an enabled select of an
    // event rustkvm counts (Intel's or AMD's numbers), the fixed counters.
    let program = prop_oneof![
        (
            prop_oneof![
                0x186..0x18eu32,
                0xc001_0000..0xc001_0004u32,
                (0..6u32).prop_map(|i| 0xc001_0200 + 2 * i)
            ],
            prop::sample::select(vec![0xc0u64, 0xc4, 0x3c, 0x13c, 0xc2, 0x76]),
            0..8u64,
        )
            .prop_map(|(msr, ev, f)| (msr, ev | 1 << 22 | (f & 3) << 16 | (f >> 2) << 20)),
        prop::sample::select(vec![0x333u64, 0xbbb, 0x3, 0x30]).prop_map(|v| (0x38d, v)),
    ];
    prop_oneof![
        4 => (cpu.clone(), program).prop_map(|(cpu, (msr, value))| Op::Wrmsr { cpu, msr, value }),
        8 => (cpu.clone(), msr(), value()).prop_map(|(cpu, msr, value)| Op::Wrmsr { cpu, msr, value }),
        6 => (cpu.clone(), msr()).prop_map(|(cpu, msr)| Op::Rdmsr { cpu, msr }),
        // Counter reads, often, so that one is read twice with a change
        // between.
        4 => (
            cpu.clone(),
            prop_oneof![0xc1..0xc5u32, 0x309..0x30cu32, 0xc001_0004..0xc001_0008u32, (0..6u32).prop_map(|i| 0xc001_0201 + 2 * i)],
        )
            .prop_map(|(cpu, msr)| Op::Rdmsr { cpu, msr }),
        3 => (cpu.clone(), prop_oneof![0..8u32, (0..4u32).prop_map(|i| 1 << 30 | i), any::<u32>()])
            .prop_map(|(cpu, ecx)| Op::Rdpmc { cpu, ecx }),
        2 => (cpu.clone(), call).prop_map(|(cpu, call)| Op::Hypercall { cpu, call }),
        3 => cpu.clone().prop_map(|cpu| Op::Enter { cpu }),
        3 => (cpu.clone(), any::<bool>()).prop_map(|(cpu, halted)| Op::Exit { cpu, halted }),
        2 => (cpu.clone(), 1..5_000_000u64, any::<bool>())
            .prop_map(|(cpu, interval, fold)| Op::Sample { cpu, interval, fold }),
        2 => (cpu.clone(), 0..3_000_000u64, 0..2_000_000u64, any::<bool>(), any::<bool>())
            .prop_map(|(cpu, delay, cpu_ns, running, runnable)| Op::Thread { cpu, delay, cpu_ns, running, runnable }),
        3 => (prop_oneof![0..2_000_000u64, Just(50_000u64)], prop_oneof![8 => 0..5_000_000u64, 1 => Just(1 << 30)])
            .prop_map(|(host_ns, vm_ns)| Op::Time { host_ns, vm_ns }),
        // Mostly few events, so that a counter read twice tells something
        // (a budget past 2^48 would allow any value).
        3 => (cpu.clone(), 0..4usize, prop_oneof![8 => 0..1000u64, 1 => 1..(1u64 << 40)])
            .prop_map(|(cpu, slot, n)| Op::Events { cpu, slot, n }),
        2 => cpu.clone().prop_map(|cpu| Op::PmuDue { cpu }),
        2 => (cpu.clone(), prop_oneof![0..6u32, (0..3u32).prop_map(|i| 1 << 30 | i)])
            .prop_map(|(cpu, ecx)| Op::ReadTwice { cpu, ecx }),
        1 => (cpu.clone(), 0..4u32).prop_map(|(cpu, mode)| Op::Lvtt { cpu, mode }),
        1 => cpu.clone().prop_map(|cpu| Op::Save { cpu }),
        1 => (cpu.clone(), 0..4usize).prop_map(|(cpu, slot)| Op::Load { cpu, slot }),
        1 => (cpu, any::<bool>()).prop_map(|(cpu, init)| Op::Reset { cpu, init }),
    ]
}

/// The machine and the test's own record of what the guest did.
struct World {
    host: Host,
    _vm: Vm,
    vcpus: Vec<Arc<Vcpu>>,
    /// The engines' states (their addresses are the vCPUs': never resized).
    counting: Vec<TestCounting>,
    shape: Shape,
    /// The KVM features advertised; enforced (`kvm-pv-enforce-cpuid`) or not.
    features: u32,
    enforce: bool,
    tsc_khz: u64,
    views: Vec<Option<SamplerView>>,
    /// Between `run_begin` and `run_end` (QEMU pairs them; a vCPU is out
    /// of guest code when it is reset, saved or loaded).
    in_guest: Vec<bool>,
    /// MSR_KVM_STEAL_TIME and MSR_KVM_SYSTEM_TIME(_NEW) as the guest (or a
    /// load) last set them, per vCPU.
    steal: Vec<u64>,
    systime: Vec<u64>,
    /// vCPU 0 last wrote the legacy MSR_KVM_SYSTEM_TIME
    /// (`boot_vcpu_runs_old_kvmclock`).
    boot_old: bool,
    wall: u64,
    registry: Registry,
    saved: Vec<(SavedMsrs, u64, u64)>,
    /// Last value read of each counter and the events since (its budget).
    counters: HashMap<(usize, Ctr), (u64, u64)>,
    steal_seen: Vec<Option<u64>>,
    clock_seen: Vec<Option<u64>>,
    stable_seen: Option<u64>,
}

impl World {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cpus: usize,
        shape: Shape,
        n: u8,
        mttcg: bool,
        icount: bool,
        features: u32,
        enforce: bool,
        tsc_khz: u64,
    ) -> World {
        let host = Host::new();
        let config = VmConfig {
            mttcg,
            icount,
            ..VmConfig::new(Arch::X86_64, cpus as u32, false)
                .unwrap()
                .with_pmu_counters(u32::from(n))
                .unwrap()
        };
        let vm = Vm::with_sched(
            config,
            Box::new(Arc::clone(&host.ram)),
            Arc::clone(&host.sched) as Arc<dyn HostSched>,
        );
        let vcpus: Vec<_> = (0..cpus)
            .map(|i| vm.create_vcpu(i as u32).unwrap())
            .collect();
        for i in 0..cpus {
            host.sched.set(
                tid(i),
                FakeThread {
                    running: true,
                    runnable: true,
                    ..FakeThread::default()
                },
            );
        }
        let mut w = World {
            host,
            _vm: vm,
            vcpus,
            counting: (0..cpus)
                .map(|_| TestCounting::new(Counting::default()))
                .collect(),
            shape,
            features,
            enforce,
            tsc_khz,
            views: (0..cpus).map(|_| None).collect(),
            in_guest: vec![false; cpus],
            steal: vec![0; cpus],
            systime: vec![0; cpus],
            boot_old: false,
            wall: 0,
            registry: Registry::default(),
            saved: Vec::new(),
            counters: HashMap::new(),
            steal_seen: vec![None; cpus],
            clock_seen: vec![None; cpus],
            stable_seen: None,
        };
        for i in 0..cpus {
            w.setup(i);
        }
        w
    }

    /// QEMU's setup after a reset.
    fn setup(&mut self, i: usize) {
        self.vcpus[i].x86().unwrap().setup(
            self.tsc_khz,
            self.features,
            self.shape.setup_arg(),
            self.counting[i].ptr(),
        );
        self.vcpus[i].x86().unwrap().enforce_pv_cpuid(self.enforce);
    }

    /// The structures registered now.
    fn active(&self) -> Vec<Region> {
        let mut r = Vec::new();
        for i in 0..self.vcpus.len() {
            if self.steal[i] & 1 != 0 {
                r.push(steal_region(self.steal[i]));
            }
            if self.systime[i] & 1 != 0 {
                r.push(Region::new(self.systime[i] & !1, 32));
            }
        }
        r
    }

    fn register_active(&mut self) {
        for i in 0..self.vcpus.len() {
            if self.steal[i] & 1 != 0 {
                self.registry
                    .add(Owner::Steal(i), steal_region(self.steal[i]));
            }
            if self.systime[i] & 1 != 0 {
                self.registry
                    .add(Owner::Kvmclock(i), Region::new(self.systime[i] & !1, 32));
            }
        }
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
        use crate::memory::GuestMemory;
        self.host.ram.read(gpa, buf)
    }

    /// Forget what was read of vCPU `i`'s counters (a guest or host write
    /// set their values).
    fn forget_counters(&mut self, i: usize) {
        self.counters.retain(|(c, _), _| *c != i);
    }

    /// Counter `c` of vCPU `i` read as `v`: check it against the last read.
    fn counter_read(&mut self, i: usize, c: Ctr, v: u64) -> Result<(), TestCaseError> {
        if let Some((then, budget)) = self.counters.get(&(i, c)) {
            check_counter(&(i, c), *then, v, 48, *budget)?;
        }
        self.counters.insert((i, c), (v, 0));
        Ok(())
    }

    fn budget(&mut self, i: Option<usize>, n: u64) {
        for ((c, _), (_, b)) in self.counters.iter_mut() {
            if i.is_none_or(|i| i == *c) {
                *b = b.saturating_add(n);
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let before = self.active();
        let skip = self.host.ram.write_count();
        let mut oneshot = Vec::new();
        if let Some(cpu) = op_cpu(op) {
            self.host.sched.call_as(tid(cpu));
            if matches!(op, Op::Save { .. } | Op::Load { .. } | Op::Reset { .. })
                && self.in_guest[cpu]
            {
                self.vcpus[cpu].run_end(false);
                self.in_guest[cpu] = false;
            }
        }
        match *op {
            Op::Wrmsr { cpu, msr, value } => self.wrmsr(cpu, msr, value, &mut oneshot)?,
            Op::Rdmsr { cpu, msr } => {
                let r = self.vcpus[cpu].x86().unwrap().rdmsr(msr);
                self.check_rdmsr(cpu, msr, r)?;
            }
            Op::Rdpmc { cpu, ecx } => self.rdpmc(cpu, ecx)?,
            Op::Hypercall { cpu, call } => self.hypercall(cpu, call, &mut oneshot)?,
            Op::Enter { cpu } if !self.in_guest[cpu] => {
                self.vcpus[cpu].run_begin();
                self.in_guest[cpu] = true;
            }
            Op::Exit { cpu, halted } if self.in_guest[cpu] => {
                self.vcpus[cpu].run_end(halted);
                self.in_guest[cpu] = false;
            }
            Op::Enter { .. } | Op::Exit { .. } => {}
            Op::Sample {
                cpu,
                interval,
                fold,
            } => {
                let mut view = self.views[cpu].take();
                self.host.sched.call_as(0);
                self.vcpus[cpu].sample(&mut view, interval, fold);
                self.views[cpu] = view;
            }
            Op::Thread {
                cpu,
                delay,
                cpu_ns,
                running,
                runnable,
            } => {
                self.host.sched.update(tid(cpu), |t| {
                    t.run_delay_ns += delay;
                    t.cpu_ns += cpu_ns;
                    t.running = running;
                    t.runnable = runnable || running;
                });
            }
            Op::Time { host_ns, vm_ns } => {
                self.host.sched.advance(host_ns);
                let rate = TscRate::new(self.tsc_khz);
                let now = self.host.vm_ns.load(Ordering::SeqCst);
                self.host.vm_ns.store(now + vm_ns, Ordering::SeqCst);
                // Unhalted cycles: at most the TSC ticks of the time passed.
                let ticks = rate.ticks(now + vm_ns) - rate.ticks(now) + 1;
                self.budget(None, ticks);
            }
            Op::Events { cpu, slot, n } => {
                self.counting[cpu].update(|c| c.events[slot] = c.events[slot].wrapping_add(n));
                self.budget(Some(cpu), n);
            }
            Op::PmuDue { cpu } => self.vcpus[cpu].pmu_due(),
            Op::ReadTwice { cpu, ecx } => {
                self.rdpmc(cpu, ecx)?;
                self.vcpus[cpu].pmu_due();
                self.rdpmc(cpu, ecx)?;
            }
            Op::Lvtt { cpu, mode } => self.vcpus[cpu].x86().unwrap().lvtt_write(mode << 17, false),
            Op::Save { cpu } => {
                let m = self.vcpus[cpu].x86().unwrap().save_msrs();
                prop_assert_eq!(m.steal_time, self.steal[cpu], "saved steal-time MSR");
                prop_assert_eq!(m.system_time, self.systime[cpu], "saved system-time MSR");
                self.saved.push((m, self.steal[cpu], self.systime[cpu]));
            }
            Op::Load { cpu, slot } => {
                if let Some((m, steal, systime)) = self.saved.get(slot).copied() {
                    self.vcpus[cpu].x86().unwrap().load_msrs(&m);
                    self.steal[cpu] = steal;
                    self.systime[cpu] = systime;
                    self.wall = m.wall_clock;
                    self.forget_counters(cpu);
                    self.steal_seen[cpu] = None;
                }
            }
            Op::Reset { cpu, init } => {
                if init {
                    self.vcpus[cpu].reset(ResetKind::Init);
                }
                self.vcpus[cpu].reset(ResetKind::Cold);
                self.setup(cpu);
                // Both kinds: steal time and kvmclock off (kvm_vcpu_reset).
                self.steal[cpu] = 0;
                self.systime[cpu] = 0;
                self.views[cpu] = None;
                self.steal_seen[cpu] = None;
                if !init {
                    // RESET: the PMU is new (an INIT keeps it: the counters
                    // read since must go on from where they were); QEMU
                    // writes KVM's wall clock MSR as 0 when the vCPU
                    // advertises kvmclock.
                    self.forget_counters(cpu);
                    if self.features & (CLOCKSOURCE | CLOCKSOURCE2) != 0 {
                        self.wall = 0;
                    }
                }
            }
        }
        self.register_active();
        let mut allowed = before;
        allowed.extend(self.active());
        allowed.extend(oneshot);
        check_writes(&self.host.ram, skip, &allowed, op)?;
        self.check_structures()
    }

    fn wrmsr(
        &mut self,
        cpu: usize,
        msr: u32,
        value: u64,
        oneshot: &mut Vec<Region>,
    ) -> Result<(), TestCaseError> {
        let v = Arc::clone(&self.vcpus[cpu]);
        let (enforce, features) = (self.enforce, self.features);
        let pv = move |f: u32| !enforce || features & f != 0;
        match msr {
            STEAL => {
                let r = v.x86().unwrap().wrmsr(msr, value);
                // kvm_set_msr_common: #GP without the feature (enforced) or
                // with KVM_STEAL_RESERVED_MASK (bits 1..5); the MSR is left.
                if !pv(STEAL_TIME) || value & 0x3e != 0 {
                    prop_assert_eq!(r, Route::Fault, "steal-time MSR {:#x}", value);
                } else {
                    prop_assert_eq!(r, Route::Handled(()));
                    if value != self.steal[cpu] {
                        self.steal_seen[cpu] = None;
                    }
                    self.steal[cpu] = value;
                }
                if pv(STEAL_TIME) {
                    prop_assert_eq!(v.x86().unwrap().rdmsr(msr), Route::Handled(self.steal[cpu]));
                }
            }
            SYSTEM_TIME | SYSTEM_TIME_NEW => {
                let f = if msr == SYSTEM_TIME {
                    CLOCKSOURCE
                } else {
                    CLOCKSOURCE2
                };
                let r = v.x86().unwrap().wrmsr(msr, value);
                if !pv(f) {
                    prop_assert_eq!(r, Route::Fault);
                } else {
                    // kvm_write_system_time: any value; vCPU 0's choice of
                    // MSR is the VM's boot_vcpu_runs_old_kvmclock.
                    prop_assert_eq!(r, Route::Handled(()));
                    prop_assert_eq!(v.x86().unwrap().rdmsr(msr), Route::Handled(value));
                    self.systime[cpu] = value;
                    if cpu == 0 {
                        self.boot_old = msr == SYSTEM_TIME;
                    }
                }
            }
            WALL_CLOCK | WALL_CLOCK_NEW => {
                let f = if msr == WALL_CLOCK {
                    CLOCKSOURCE
                } else {
                    CLOCKSOURCE2
                };
                let r = v.x86().unwrap().wrmsr(msr, value);
                if !pv(f) {
                    prop_assert_eq!(r, Route::Fault);
                } else {
                    // One per VM: every vCPU reads it back.
                    prop_assert_eq!(r, Route::Handled(()));
                    self.wall = value;
                    oneshot.push(Region::new(value, 12));
                    self.registry.add(Owner::WallClock, Region::new(value, 12));
                    for other in &self.vcpus {
                        prop_assert_eq!(other.x86().unwrap().rdmsr(msr), Route::Handled(value));
                    }
                }
            }
            0x4b56_4d02 | 0x4b56_4d04 | 0x4b56_4d05 => {
                let r = v.x86().unwrap().wrmsr(msr, value);
                if !pv(other_pv_feature(msr)) {
                    prop_assert_eq!(r, Route::Fault);
                }
            }
            TSC | TSC_ADJUST => {
                prop_assert_eq!(v.x86().unwrap().wrmsr(msr, value), Route::Handled(()));
                if msr == TSC_ADJUST {
                    prop_assert_eq!(v.x86().unwrap().rdmsr(msr), Route::Handled(value));
                }
            }
            _ => self.pmu_wrmsr(cpu, msr, value)?,
        }
        Ok(())
    }

    fn pmu_wrmsr(&mut self, cpu: usize, msr: u32, value: u64) -> Result<(), TestCaseError> {
        let v = Arc::clone(&self.vcpus[cpu]);
        let class = classify(self.shape, msr);
        let readable = !matches!(class, Pmsr::Invalid | Pmsr::Other)
            && (class != Pmsr::PerfCaps || matches!(self.shape, Shape::Intel { fw: true, .. }));
        let old = v.x86().unwrap().rdmsr(msr);
        let status_msr = match self.shape {
            Shape::Amd { v2: true, .. } => Some(0xc000_0300),
            Shape::Intel { .. } => Some(0x38e),
            _ => None,
        };
        let status = |v: &Vcpu| status_msr.map(|m| v.x86().unwrap().rdmsr(m));
        let status_old = status(&v);
        let r = v.x86().unwrap().wrmsr(msr, value);
        let after = v.x86().unwrap().rdmsr(msr);
        let mask48 = (1u64 << 48) - 1;
        let shape = self.shape;
        let gp = (1u64 << shape.gp()) - 1;
        let fault_unchanged = |r: Route<()>| -> Result<(), TestCaseError> {
            prop_assert_eq!(
                r,
                Route::Fault,
                "WRMSR {:#x} = {:#x} on {:?}",
                msr,
                value,
                shape
            );
            prop_assert_eq!(after, old, "a faulting WRMSR {:#x} changed it", msr);
            Ok(())
        };
        // Written as the guest asks, read back as KVM's rule says.
        let expect = |r: Route<()>, want: u64| -> Result<(), TestCaseError> {
            prop_assert_eq!(
                r,
                Route::Handled(()),
                "WRMSR {:#x} = {:#x} on {:?}",
                msr,
                value,
                shape
            );
            prop_assert_eq!(
                after,
                Route::Handled(want),
                "RDMSR {:#x} after writing {:#x}",
                msr,
                value
            );
            Ok(())
        };
        match class {
            Pmsr::Other => {}
            Pmsr::Invalid => fault_unchanged(r)?,
            Pmsr::Legacy0 => expect(r, 0)?,
            Pmsr::Counter(c, width) => {
                match width {
                    Width::Full if value & !mask48 != 0 => fault_unchanged(r)?,
                    Width::Legacy => expect(r, (value as u32 as i32 as i64 as u64) & mask48)?,
                    _ => expect(r, value & mask48)?,
                }
                if r == Route::Handled(()) {
                    self.counters.remove(&(cpu, c));
                }
            }
            // Intel: pmu->reserved_bits 0xffffffff00200000 #GP; AMD drops
            // 0xfffffff000280000 (amd_pmu_refresh).
            Pmsr::Select(_, false) if value & 0xffff_ffff_0020_0000 != 0 => fault_unchanged(r)?,
            Pmsr::Select(_, false) => expect(r, value)?,
            Pmsr::Select(_, true) => expect(r, value & !0xffff_fff0_0028_0000)?,
            // fixed_ctr_ctrl_rsvd: all but OS, USR, PMI of each fixed counter.
            Pmsr::FixedCtrl if value & !0xbbb != 0 => fault_unchanged(r)?,
            Pmsr::FixedCtrl => expect(r, value)?,
            Pmsr::GlobalCtrl if value & !self.shape.ctrl_mask() != 0 => fault_unchanged(r)?,
            Pmsr::GlobalCtrl => expect(r, value)?,
            // Read-only for the guest: #GP.
            Pmsr::GlobalStatus | Pmsr::PerfCaps => fault_unchanged(r)?,
            // global_status_rsvd: GLOBAL_CTRL's less OvfBuf and CondChgd.
            Pmsr::OvfCtrl if value & !(self.shape.ctrl_mask() | 3 << 62) != 0 => {
                fault_unchanged(r)?
            }
            Pmsr::OvfCtrl => {
                expect(r, 0)?;
                if let (Some(Route::Handled(s)), Some(now)) = (status_old, status(&v)) {
                    prop_assert_eq!(now, Route::Handled(s & !value), "OVF_CTRL clears");
                }
            }
            // kvm_pmu_set_msr (AMD): GLOBAL_CTL drops reserved bits;
            // GLOBAL_STATUS ignores guest writes ("Per PPR, Read-only");
            // STATUS_CLR clears and STATUS_SET sets status bits, both read 0.
            Pmsr::AmdCtl => expect(r, value & gp)?,
            Pmsr::AmdStatus | Pmsr::AmdStatusClr | Pmsr::AmdStatusSet => {
                prop_assert_eq!(r, Route::Handled(()), "WRMSR {:#x} = {:#x}", msr, value);
                let Some(Route::Handled(s)) = status_old else {
                    return Err(TestCaseError::fail("AMD GLOBAL_STATUS unreadable"));
                };
                let want = match class {
                    Pmsr::AmdStatus => s,
                    Pmsr::AmdStatusClr => s & !value,
                    _ => s | (value & gp),
                };
                prop_assert_eq!(
                    status(&v),
                    Some(Route::Handled(want)),
                    "GLOBAL_STATUS after {:#x} = {:#x}",
                    msr,
                    value
                );
                if class != Pmsr::AmdStatus {
                    prop_assert_eq!(after, Route::Handled(0), "{:#x} reads 0", msr);
                }
            }
        }
        if readable && r == Route::Handled(()) {
            prop_assert!(
                matches!(after, Route::Handled(_)),
                "RDMSR {:#x} after a write: {:?}",
                msr,
                after
            );
        }
        Ok(())
    }

    fn check_rdmsr(&mut self, cpu: usize, msr: u32, r: Route<u64>) -> Result<(), TestCaseError> {
        let (enforce, features) = (self.enforce, self.features);
        let pv = move |f: u32| !enforce || features & f != 0;
        match msr {
            STEAL if !pv(STEAL_TIME) => prop_assert_eq!(r, Route::Fault),
            STEAL => prop_assert_eq!(r, Route::Handled(self.steal[cpu])),
            SYSTEM_TIME | WALL_CLOCK if !pv(CLOCKSOURCE) => prop_assert_eq!(r, Route::Fault),
            SYSTEM_TIME_NEW | WALL_CLOCK_NEW if !pv(CLOCKSOURCE2) => {
                prop_assert_eq!(r, Route::Fault)
            }
            SYSTEM_TIME | SYSTEM_TIME_NEW => prop_assert_eq!(r, Route::Handled(self.systime[cpu])),
            WALL_CLOCK | WALL_CLOCK_NEW => prop_assert_eq!(r, Route::Handled(self.wall)),
            // Async PF, PV EOI, poll control: #GP when enforced and not
            // advertised (`guest_pv_has`); their values are the models'
            // unit tests' business.
            0x4b56_4d02 | 0x4b56_4d04 | 0x4b56_4d05 => {
                if !pv(other_pv_feature(msr)) {
                    prop_assert_eq!(r, Route::Fault);
                }
            }
            _ => match classify(self.shape, msr) {
                Pmsr::Invalid => {
                    prop_assert_eq!(r, Route::Fault, "RDMSR {:#x} on {:?}", msr, self.shape)
                }
                Pmsr::Legacy0 | Pmsr::OvfCtrl | Pmsr::AmdStatusClr | Pmsr::AmdStatusSet => {
                    prop_assert_eq!(r, Route::Handled(0), "RDMSR {:#x} on {:?}", msr, self.shape)
                }
                // PERF_CAPABILITIES: only with PDCM (full-width writes here).
                Pmsr::PerfCaps if !matches!(self.shape, Shape::Intel { fw: true, .. }) => {
                    prop_assert_eq!(r, Route::Fault)
                }
                Pmsr::Counter(c, _) => {
                    let Route::Handled(v) = r else {
                        return Err(TestCaseError::fail(format!("RDMSR {msr:#x}: {r:?}")));
                    };
                    self.counter_read(cpu, c, v)?;
                }
                Pmsr::Other => {}
                _ => prop_assert!(matches!(r, Route::Handled(_)), "RDMSR {:#x}: {:?}", msr, r),
            },
        }
        Ok(())
    }

    /// RDPMC: no PMU #GPs (`kvm_pmu_rdpmc`); Intel takes type 0 (GP) and
    /// 0x4000 (fixed) in ECX[31:16] and an index below the count, anything
    /// else #GPs (`intel_rdpmc_ecx_to_pmc`); AMD an index below the count
    /// (`amd_check_rdpmc_early`).
    fn rdpmc(&mut self, cpu: usize, ecx: u32) -> Result<(), TestCaseError> {
        let r = self.vcpus[cpu].x86().unwrap().rdpmc(ecx);
        let n = self.shape.gp();
        let idx = (ecx & 0xffff) as usize;
        let ctr = match self.shape {
            Shape::Off => None,
            Shape::Intel { .. } => match ecx >> 16 {
                0 if idx < n => Some(Ctr::Gp(idx)),
                0x4000 if idx < 3 => Some(Ctr::Fixed(idx)),
                _ => None,
            },
            Shape::Amd { .. } => ((ecx as usize) < n).then_some(Ctr::Gp(ecx as usize)),
        };
        match (ctr, r) {
            (None, r) => prop_assert_eq!(r, Route::Fault, "RDPMC {:#x} on {:?}", ecx, self.shape),
            (Some(c), Route::Handled(v)) => self.counter_read(cpu, c, v)?,
            (Some(_), r) => return Err(TestCaseError::fail(format!("RDPMC {ecx:#x}: {r:?}"))),
        }
        Ok(())
    }

    /// Hypercalls (`____kvm_emulate_hypercall`): VMCALL on AMD from CPL > 0
    /// → #GP, VMMCALL on Intel outside protected mode → #UD (the
    /// emulator's checks); CPL > 0 → -KVM_EPERM;
    /// unknown numbers, and those whose feature is enforced away →
    /// -KVM_ENOSYS; CLOCK_PAIRING of another clock → -KVM_EOPNOTSUPP, of a
    /// buffer that is not RAM → -KVM_EFAULT, else it writes 64 bytes there;
    /// outside 64-bit mode arguments and result are 32-bit.
    fn hypercall(
        &mut self,
        cpu: usize,
        call: Call,
        oneshot: &mut Vec<Region>,
    ) -> Result<(), TestCaseError> {
        let out = self.vcpus[cpu].x86().unwrap().hypercall(call);
        // The other vendor's instruction goes through KVM's emulator, whose
        // Priv (VMCALL) and Prot (VMMCALL) checks come first: nothing else
        // happens, nothing is written.
        let fault = match call.insn {
            Insn::VmcallOnAmd if call.cpl > 0 => Some(Fault::Gp),
            Insn::VmmcallOnIntel if !call.protected => Some(Fault::Ud),
            _ => None,
        };
        if let Some(f) = fault {
            prop_assert_eq!(out.action, Action::Fault(f), "{:?}", call);
            return Ok(());
        }
        let mask = if call.long_mode {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        let (nr, a) = (call.nr & mask, call.args.map(|x| x & mask));
        let neg = |e: u64| e.wrapping_neg() & mask;
        let (enforce, features) = (self.enforce, self.features);
        let pv = move |f: u32| !enforce || features & f != 0;
        let want = if call.cpl != 0 {
            Some(neg(1))
        } else {
            match nr {
                1 => Some(0),
                5 if pv(PV_UNHALT) => Some(0),
                11 if pv(PV_SCHED_YIELD) => Some(0),
                10 if pv(PV_SEND_IPI) => (a[3] & 0xc0800 != 0).then(|| neg(22)),
                9 if a[1] != 0 => Some(neg(95)),
                9 => {
                    let buf = Region::new(a[0], 64);
                    if buf.in_ram() {
                        oneshot.push(buf);
                        self.registry.add(Owner::Pairing, buf);
                        Some(0)
                    } else {
                        Some(neg(14))
                    }
                }
                _ => Some(neg(1000)),
            }
        };
        if let Some(want) = want {
            prop_assert_eq!(out.ret, want, "{:?}", call);
        }
        prop_assert_eq!(out.ret & !mask, 0, "a 32-bit result: {:?}", out);
        Ok(())
    }

    /// The structures as a guest reads them, after the step: versions even;
    /// `steal` never decreasing while the MSR stays; kvmclock as the guest
    /// computes it never decreasing on a vCPU, nor across vCPUs while
    /// stable; the stable flag never set while vCPU 0 is on the legacy
    /// MSR (KVM's master clock needs `!boot_vcpu_runs_old_kvmclock`).
    fn check_structures(&mut self) -> Result<(), TestCaseError> {
        for i in 0..self.vcpus.len() {
            let st = steal_region(self.steal[i]);
            if self.steal[i] & 1 != 0 && st.in_ram() && self.registry.exclusive(Owner::Steal(i), st)
            {
                let mut b = [0u8; 16];
                prop_assert!(self.read(st.base, &mut b));
                let steal = u64::from_le_bytes(b[0..8].try_into().unwrap());
                let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
                prop_assert_eq!(version % 2, 0, "vCPU {} steal-time version odd", i);
                if let Some(then) = self.steal_seen[i] {
                    prop_assert!(
                        steal >= then,
                        "vCPU {} steal went back: {} -> {}",
                        i,
                        then,
                        steal
                    );
                }
                self.steal_seen[i] = Some(steal);
            }
            let kc = Region::new(self.systime[i] & !1, 32);
            if self.systime[i] & 1 == 0
                || !kc.in_ram()
                || kc.base % PAGE_SIZE + 32 > PAGE_SIZE
                || !self.registry.exclusive(Owner::Kvmclock(i), kc)
            {
                continue;
            }
            let mut b = [0u8; 32];
            prop_assert!(self.read(kc.base, &mut b));
            let version = u32::from_le_bytes(b[0..4].try_into().unwrap());
            if version == 0 {
                continue; // never written (a pvclock MSR loaded as is)
            }
            prop_assert_eq!(version % 2, 0, "vCPU {} kvmclock version odd", i);
            let tsc_ts = u64::from_le_bytes(b[8..16].try_into().unwrap());
            let sys = u64::from_le_bytes(b[16..24].try_into().unwrap());
            let mul = u32::from_le_bytes(b[24..28].try_into().unwrap());
            let (shift, flags) = (b[28] as i8, b[29]);
            let tsc = self.vcpus[i].x86().unwrap().rdtsc();
            let ns = sys.wrapping_add(scale_delta(tsc.wrapping_sub(tsc_ts), mul, shift));
            if let Some(then) = self.clock_seen[i] {
                prop_assert!(
                    ns >= then,
                    "vCPU {} kvmclock went back: {} -> {}",
                    i,
                    then,
                    ns
                );
            }
            self.clock_seen[i] = Some(ns);
            if flags & 1 != 0 {
                prop_assert!(
                    !self.boot_old,
                    "vCPU {} stable while vCPU 0 runs the old kvmclock",
                    i
                );
                if let Some(then) = self.stable_seen {
                    prop_assert!(
                        ns >= then,
                        "stable kvmclock went back across vCPUs: {} -> {}",
                        then,
                        ns
                    );
                }
                self.stable_seen = Some(ns);
            }
        }
        Ok(())
    }
}

/// The KVM feature of the PV MSRs this harness does not model (async PF,
/// PV EOI, poll control): enforced and not advertised, they #GP.
fn other_pv_feature(msr: u32) -> u32 {
    match msr {
        0x4b56_4d02 => 1 << 4,
        0x4b56_4d04 => 1 << 6,
        _ => 1 << 12,
    }
}

fn steal_region(msr: u64) -> Region {
    Region::new(msr & !0x3f, 64)
}

fn op_cpu(op: &Op) -> Option<usize> {
    match *op {
        Op::Wrmsr { cpu, .. }
        | Op::Rdmsr { cpu, .. }
        | Op::Rdpmc { cpu, .. }
        | Op::Hypercall { cpu, .. }
        | Op::Enter { cpu }
        | Op::Exit { cpu, .. }
        | Op::PmuDue { cpu }
        | Op::ReadTwice { cpu, .. }
        | Op::Lvtt { cpu, .. }
        | Op::Save { cpu }
        | Op::Load { cpu, .. }
        | Op::Reset { cpu, .. } => Some(cpu),
        _ => None,
    }
}

/// A machine's configuration and a sequence of steps for it.
/// vCPUs, PMU, `pmu-counters`, (MTTCG, icount), (KVM features, enforced),
/// TSC kHz, the steps.
type Case = (usize, Shape, u8, (bool, bool), (u32, bool), u64, Vec<Op>);

fn case() -> impl Strategy<Value = Case> {
    (1..=3usize).prop_flat_map(|cpus| {
        (
            Just(cpus),
            (0..3u8, 0..=8u8, any::<bool>(), any::<bool>(), any::<bool>()),
            (any::<bool>(), prop::bool::weighted(0.2)),
            (
                prop_oneof![
                    3 => Just(CLOCKSOURCE | CLOCKSOURCE2 | STEAL_TIME | CLOCKSOURCE_STABLE | PV_UNHALT | PV_SEND_IPI | PV_SCHED_YIELD),
                    1 => any::<u32>(),
                ],
                prop::bool::weighted(0.3),
            ),
            prop::sample::select(vec![0u64, 0, 1, 1_000_000, 2_400_000, 3_000_000, 999_999_999]),
            prop::collection::vec(op(cpus), 1..60),
        )
            .prop_map(|(cpus, (kind, n, fw, core, v2), threads, pv, khz, ops)| {
                (cpus, Shape::new(kind, n, fw, core, v2), n, threads, pv, khz, ops)
            })
    })
}

proptest! {
    #![proptest_config(super::config(1500))]

    /// Random x86 sequences keep every invariant after every step.
    #[test]
    fn x86_sequences_keep_kvms_rules(
        (cpus, shape, n, (mttcg, icount), (features, enforce), khz, ops) in case()
    ) {
        let mut w = World::new(cpus, shape, n, mttcg, icount, features, enforce, khz);
        for op in &ops {
            w.step(op)?;
        }
        // The RAM beyond the machine's is never touched (no write may
        // reach past it; FakeRam refuses, this checks the log agrees).
        prop_assert!(w.host.ram.writes_since(0).iter().all(|(g, l)| g + *l as u64 <= RAM));
    }
}
