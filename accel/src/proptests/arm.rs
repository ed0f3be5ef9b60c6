//! arm64: a machine of 1–2 vCPUs with no PMU or PMUv3 of 0–31 event
//! counters (PMUv3p5 or not), a PV time structure per vCPU or none.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use proptest::prelude::*;

use super::{check_counter, check_writes, edge_u64, gpa, tid, Host, Owner, Region, Registry};
use crate::arm::pmu::SAVED_REGS;
use crate::host::tests::FakeThread;
use crate::host::HostSched;
use crate::vcpu::TestCounting;
use crate::vcpu::{Route, SamplerView, Vcpu};
use crate::vm::{Arch, Vm, VmConfig};
use crate::x86::clock::TscRate;
use crate::x86::pmu::Counting;

/// A PMU system register as the architecture names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Pmcr,
    CntenSet,
    CntenClr,
    OvsClr,
    Swinc,
    Selr,
    Ceid(u32),
    Ccntr,
    Xevtyper,
    Xevcntr,
    Userenr,
    IntenSet,
    IntenClr,
    OvsSet,
    Evcntr(u32),
    Evtyper(u32),
    /// Any encoding.
    Raw(u32),
}

impl Reg {
    /// KVM's `sys_reg(op0, op1, crn, crm, op2)` (Arm ARM, the registers'
    /// encodings).
    fn encoding(self) -> u32 {
        let e = |op1: u32, crn: u32, crm: u32, op2: u32| {
            3 << 14 | op1 << 11 | crn << 7 | crm << 3 | op2
        };
        match self {
            Reg::Pmcr => e(3, 9, 12, 0),
            Reg::CntenSet => e(3, 9, 12, 1),
            Reg::CntenClr => e(3, 9, 12, 2),
            Reg::OvsClr => e(3, 9, 12, 3),
            Reg::Swinc => e(3, 9, 12, 4),
            Reg::Selr => e(3, 9, 12, 5),
            Reg::Ceid(k) => e(3, 9, 12, 6 + (k & 1)),
            Reg::Ccntr => e(3, 9, 13, 0),
            Reg::Xevtyper => e(3, 9, 13, 1),
            Reg::Xevcntr => e(3, 9, 13, 2),
            Reg::Userenr => e(3, 9, 14, 0),
            Reg::IntenSet => e(0, 9, 14, 1),
            Reg::IntenClr => e(0, 9, 14, 2),
            Reg::OvsSet => e(3, 9, 14, 3),
            Reg::Evcntr(n) => e(3, 14, 8 + (n >> 3), n & 7),
            Reg::Evtyper(n) => e(3, 14, 12 + (n >> 3), n & 7),
            Reg::Raw(x) => x,
        }
    }
}

fn reg() -> impl Strategy<Value = Reg> {
    prop_oneof![
        6 => prop::sample::select(vec![
            Reg::Pmcr, Reg::CntenSet, Reg::CntenClr, Reg::OvsClr, Reg::Swinc, Reg::Selr,
            Reg::Ceid(0), Reg::Ceid(1), Reg::Ccntr, Reg::Xevtyper, Reg::Xevcntr, Reg::Userenr,
            Reg::IntenSet, Reg::IntenClr, Reg::OvsSet,
        ]),
        3 => (0..32u32).prop_map(Reg::Evcntr),
        3 => (0..32u32).prop_map(Reg::Evtyper),
        1 => any::<u32>().prop_map(|x| Reg::Raw(x & 0xffff)),
    ]
}

/// Register values: edge values, PMCR with E/P/C/LC/LP, event types with
/// the events rustkvm counts, PMSELR.SEL beyond N, bitmaps.
fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => edge_u64(),
        2 => (0..256u64).prop_map(|v| v | (0xff00 * (v & 1))),
        2 => (prop::sample::select(vec![0x00u64, 0x08, 0x11, 0x13, 0x1b, 0x1e, 0x21, 0x06, 0x07, 0x09, 0x23, 0x3c, 0xffff]),
              prop::sample::select(vec![0u64, 1 << 31, 1 << 30, 1 << 29, 3 << 30]))
            .prop_map(|(e, f)| e | f),
        2 => 0..64u64,
        1 => prop::sample::select(vec![0x8000_0001u64, 0x8000_003f, 0xffff_ffff, 1 << 31]),
    ]
}

/// SMCCC function IDs: KVM's, PSCI's, their SMC64/SMC32 twins, junk in
/// the upper half of x0, any.
fn function() -> impl Strategy<Value = u64> {
    let known = prop::sample::select(vec![
        0x8000_0000u64,
        0x8000_0001,
        0x8000_8000,
        0x8000_7fff,
        0x8000_3fff,
        0x8400_000a,
        0xc500_0020,
        0xc500_0021,
        0x8500_0020,
        0x8500_0021,
        0x8600_ff01,
        0x8600_0000,
        0xc000_0000,
        0x8400_0000,
        0xc400_0003,
        0x8000_0002,
        0x8600_0001,
        0xc600_0000,
    ]);
    prop_oneof![
        6 => known.clone(),
        2 => (known, any::<u32>()).prop_map(|(f, hi)| f | u64::from(hi) << 32),
        2 => any::<u32>().prop_map(u64::from),
        1 => any::<u64>(),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Read {
        cpu: usize,
        reg: Reg,
        el: u32,
    },
    Write {
        cpu: usize,
        reg: Reg,
        el: u32,
        value: u64,
    },
    Smccc {
        cpu: usize,
        smc: bool,
        x0: u64,
        x1: u64,
        x2: u64,
    },
    Enter {
        cpu: usize,
    },
    Exit {
        cpu: usize,
        halted: bool,
    },
    Sample {
        cpu: usize,
        interval: u64,
        fold: bool,
    },
    Thread {
        cpu: usize,
        delay: u64,
        running: bool,
    },
    Time {
        host_ns: u64,
        vm_ns: u64,
    },
    Events {
        cpu: usize,
        slot: usize,
        n: u64,
    },
    PmuDue {
        cpu: usize,
    },
    Save {
        cpu: usize,
    },
    Load {
        cpu: usize,
        slot: usize,
    },
    Reset {
        cpu: usize,
    },
}

fn op(cpus: usize) -> impl Strategy<Value = Op> {
    let cpu = 0..cpus;
    let el = prop_oneof![3 => Just(1u32), 1 => Just(0u32), 1 => Just(2u32)];
    let arg = prop_oneof![
        2 => prop::sample::select(vec![0xc500_0020u64, 0xc500_0021, 0x8000_0000, 0x8000_8000, 0x8000_7fff, 0x8000_3fff, 0x8500_0020]),
        1 => edge_u64(),
    ];
    // Programming that makes counters count: PMCR.E (with LC/LP), every
    // counter enabled, an event rustkvm counts.
    let program = prop_oneof![
        (0..4u64).prop_map(|f| (Reg::Pmcr, 1 | (f & 1) << 6 | (f >> 1) << 7)),
        Just((Reg::CntenSet, u64::MAX)),
        (
            0..31u32,
            prop::sample::select(vec![0x08u64, 0x11, 0x21, 0x13, 0x00, 0x1e, 0x09])
        )
            .prop_map(|(n, e)| (Reg::Evtyper(n), e)),
    ];
    prop_oneof![
        4 => (cpu.clone(), program).prop_map(|(cpu, (reg, value))| Op::Write { cpu, reg, el: 1, value }),
        6 => (cpu.clone(), reg(), el.clone()).prop_map(|(cpu, reg, el)| Op::Read { cpu, reg, el }),
        8 => (cpu.clone(), reg(), el, value()).prop_map(|(cpu, reg, el, value)| Op::Write { cpu, reg, el, value }),
        3 => (cpu.clone(), any::<bool>(), function(), arg, edge_u64())
            .prop_map(|(cpu, smc, x0, x1, x2)| Op::Smccc { cpu, smc, x0, x1, x2 }),
        3 => cpu.clone().prop_map(|cpu| Op::Enter { cpu }),
        3 => (cpu.clone(), any::<bool>()).prop_map(|(cpu, halted)| Op::Exit { cpu, halted }),
        2 => (cpu.clone(), 1..5_000_000u64, any::<bool>())
            .prop_map(|(cpu, interval, fold)| Op::Sample { cpu, interval, fold }),
        2 => (cpu.clone(), 0..3_000_000u64, any::<bool>())
            .prop_map(|(cpu, delay, running)| Op::Thread { cpu, delay, running }),
        3 => (0..2_000_000u64, prop_oneof![8 => 0..5_000_000u64, 1 => Just(1 << 26)])
            .prop_map(|(host_ns, vm_ns)| Op::Time { host_ns, vm_ns }),
        3 => (cpu.clone(), 0..12usize, prop_oneof![8 => 0..1000u64, 1 => 1..(1u64 << 28)])
            .prop_map(|(cpu, slot, n)| Op::Events { cpu, slot, n }),
        1 => cpu.clone().prop_map(|cpu| Op::PmuDue { cpu }),
        1 => cpu.clone().prop_map(|cpu| Op::Save { cpu }),
        1 => (cpu.clone(), 0..4usize).prop_map(|(cpu, slot)| Op::Load { cpu, slot }),
        1 => cpu.prop_map(|cpu| Op::Reset { cpu }),
    ]
}

/// PMUSERENR_EL0 bits (Arm ARM; KVM's `check_pmu_access_disabled`).
const EN: u64 = 1;
const SW: u64 = 2;
const CR: u64 = 4;
const ER: u64 = 8;

struct World {
    host: Host,
    _vm: Vm,
    vcpus: Vec<Arc<Vcpu>>,
    /// The engines' states (their addresses are the vCPUs': never resized).
    counting: Vec<TestCounting>,
    /// Event counters (None: no PMU), PMUv3p5.
    pmu: (Option<u8>, bool),
    /// PV time structure of each vCPU (None: the machine gave none), and
    /// whether the guest asked for it (PV_TIME_ST since the last reset).
    pvtime: Vec<Option<u64>>,
    pvtime_on: Vec<bool>,
    /// PMUSERENR_EL0 as the guest (EL1) last wrote it; PMSELR_EL0 (None:
    /// KVM's UNKNOWN reset value, read through the vCPU).
    userenr: Vec<u64>,
    selr: Vec<Option<u64>>,
    views: Vec<Option<SamplerView>>,
    /// Between `run_begin` and `run_end` (QEMU pairs them; a vCPU is out
    /// of guest code when it is reset, saved or loaded).
    in_guest: Vec<bool>,
    registry: Registry,
    saved: Vec<([u64; SAVED_REGS], bool)>,
    counters: HashMap<(usize, u32), (u64, u64)>,
    stolen_seen: Vec<Option<u64>>,
}

impl World {
    fn new(
        cpus: usize,
        pmu: (Option<u8>, bool),
        mttcg: bool,
        icount: bool,
        pvtime: Vec<Option<u64>>,
    ) -> World {
        let host = Host::new();
        let config = VmConfig {
            mttcg,
            icount,
            ..VmConfig::new(Arch::Aarch64, cpus as u32, false).unwrap()
        };
        let vm = Vm::with_sched(
            config,
            Box::new(Arc::clone(&host.ram)),
            Arc::clone(&host.sched) as Arc<dyn HostSched>,
        );
        let vcpus: Vec<_> = (0..cpus)
            .map(|i| vm.create_vcpu(i as u32).unwrap())
            .collect();
        let mut given = Vec::new();
        for (i, v) in vcpus.iter().enumerate() {
            host.sched.set(
                tid(i),
                FakeThread {
                    running: true,
                    runnable: true,
                    ..FakeThread::default()
                },
            );
            // kvm_arm_pvtime_set_attr: 64-byte aligned (-EINVAL), set once
            // (-EEXIST).
            let base = pvtime[i];
            given.push(match base {
                Some(b) => {
                    let r = v.arm().unwrap().set_pvtime_base(b);
                    assert_eq!(r.is_ok(), b % 64 == 0, "PV time base {b:#x}");
                    if r.is_ok() {
                        assert!(
                            v.arm().unwrap().set_pvtime_base(b ^ 64).is_err(),
                            "set twice"
                        );
                    }
                    r.ok().map(|()| b)
                }
                None => None,
            });
        }
        let mut w = World {
            host,
            _vm: vm,
            vcpus,
            counting: (0..cpus)
                .map(|_| TestCounting::new(Counting::default()))
                .collect(),
            pmu,
            pvtime: given,
            pvtime_on: vec![false; cpus],
            userenr: vec![0; cpus],
            selr: vec![None; cpus],
            views: (0..cpus).map(|_| None).collect(),
            in_guest: vec![false; cpus],
            registry: Registry::default(),
            saved: Vec::new(),
            counters: HashMap::new(),
            stolen_seen: vec![None; cpus],
        };
        for i in 0..cpus {
            w.setup(i);
        }
        w
    }

    fn setup(&mut self, i: usize) {
        let config = crate::arm::pmu::PmuConfig {
            counters: self.pmu.0,
            v3p5: self.pmu.1,
            el2: false,
        };
        self.vcpus[i]
            .arm()
            .unwrap()
            .setup(config, self.counting[i].ptr(), 1_000_000_000);
    }

    fn active(&self) -> Vec<Region> {
        (0..self.vcpus.len())
            .filter(|&i| self.pvtime_on[i])
            .filter_map(|i| self.pvtime[i].map(|b| Region::new(b, 64)))
            .collect()
    }

    fn n(&self) -> u32 {
        u32::from(self.pmu.0.unwrap_or(0))
    }

    /// Whether counter `i` exists: event counters below N, and the cycle
    /// counter 31 (`pmu_counter_idx_valid`).
    fn exists(&self, i: u32) -> bool {
        i < self.n() || i == 31
    }

    fn forget(&mut self, cpu: usize, which: impl Fn(u32) -> bool) {
        self.counters.retain(|(c, i), _| *c != cpu || !which(*i));
    }

    fn budget(&mut self, cpu: Option<usize>, n: u64) {
        for ((c, _), (_, b)) in self.counters.iter_mut() {
            if cpu.is_none_or(|cpu| cpu == *c) {
                *b = b.saturating_add(n);
            }
        }
    }

    /// PMSELR_EL0.SEL now.
    fn sel(&self, cpu: usize) -> u32 {
        let v = self.selr[cpu].unwrap_or_else(|| {
            match self.vcpus[cpu]
                .arm()
                .unwrap()
                .pmu_read(Reg::Selr.encoding(), 1)
            {
                Route::Handled(v) => v,
                r => panic!("PMSELR_EL0 at EL1: {r:?}"),
            }
        });
        (v & 0x1f) as u32
    }

    /// Whether EL0 may make the access (KVM's `check_pmu_access_disabled`
    /// callers, `access_pmuserenr`; PMINTEN* are EL1 registers).
    fn el0_allows(&self, cpu: usize, reg: Reg, write: bool) -> bool {
        let u = self.userenr[cpu];
        let any = |bits: u64| u & bits != 0;
        match reg {
            Reg::IntenSet | Reg::IntenClr => false,
            Reg::Userenr => !write,
            Reg::Swinc => any(SW | EN),
            Reg::Ccntr if !write => any(CR | EN),
            Reg::Evcntr(_) | Reg::Xevcntr if !write => any(ER | EN),
            Reg::Selr => any(ER | EN),
            _ => any(EN),
        }
    }

    /// The counter an access reads or writes, if it names one that exists;
    /// Err(()) if it names one that does not (UNDEF).
    fn counter_of(&self, cpu: usize, reg: Reg) -> Option<Result<u32, ()>> {
        let check = |i: u32| if self.exists(i) { Ok(i) } else { Err(()) };
        Some(match reg {
            Reg::Ccntr => Ok(31),
            // There is no PMEVCNTR31_EL0 (its encoding is unallocated).
            Reg::Evcntr(31) => Err(()),
            Reg::Evcntr(n) => check(n),
            Reg::Xevcntr => check(self.sel(cpu)),
            _ => return None,
        })
    }

    fn width(&self, i: u32) -> u32 {
        if i == 31 || self.pmu.1 {
            64
        } else {
            32
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let before = self.active();
        let skip = self.host.ram.write_count();
        let mut oneshot = Vec::new();
        if let Op::Save { cpu } | Op::Load { cpu, .. } | Op::Reset { cpu } = *op {
            if self.in_guest[cpu] {
                self.host.sched.call_as(tid(cpu));
                self.vcpus[cpu].run_end(false);
                self.in_guest[cpu] = false;
            }
        }
        match *op {
            Op::Read { cpu, reg, el } => self.access(cpu, reg, el, None)?,
            Op::Write {
                cpu,
                reg,
                el,
                value,
            } => self.access(cpu, reg, el, Some(value))?,
            Op::Smccc {
                cpu,
                smc,
                x0,
                x1,
                x2,
            } => self.smccc(cpu, smc, [x0, x1, x2, 0, 0, 0, 0, 0], &mut oneshot)?,
            Op::Enter { cpu } if !self.in_guest[cpu] => {
                self.host.sched.call_as(tid(cpu));
                self.vcpus[cpu].run_begin();
                self.in_guest[cpu] = true;
            }
            Op::Exit { cpu, halted } if self.in_guest[cpu] => {
                self.host.sched.call_as(tid(cpu));
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
                running,
            } => self.host.sched.update(tid(cpu), |t| {
                t.run_delay_ns += delay;
                t.running = running;
            }),
            Op::Time { host_ns, vm_ns } => {
                self.host.sched.advance(host_ns);
                let now = self.host.vm_ns.load(Ordering::SeqCst);
                self.host.vm_ns.store(now + vm_ns, Ordering::SeqCst);
                let rate = TscRate::default();
                self.budget(None, rate.ticks(now + vm_ns) - rate.ticks(now) + 1);
            }
            Op::Events { cpu, slot, n } => {
                self.counting[cpu].update(|c| c.events[slot] = c.events[slot].wrapping_add(n));
                self.budget(Some(cpu), n);
            }
            Op::PmuDue { cpu } => self.vcpus[cpu].pmu_due(),
            Op::Save { cpu } => {
                let regs = self.vcpus[cpu].arm().unwrap().pmu_save();
                let on = self.vcpus[cpu].arm().unwrap().pvtime_active();
                prop_assert_eq!(on, self.pvtime_on[cpu], "saved PV time use");
                self.saved.push((regs, on));
            }
            Op::Load { cpu, slot } => {
                if let Some((regs, on)) = self.saved.get(slot).copied() {
                    self.vcpus[cpu].arm().unwrap().pmu_load(&regs);
                    self.vcpus[cpu].arm().unwrap().load_pvtime_active(on);
                    self.pvtime_on[cpu] = on && self.pvtime[cpu].is_some();
                    self.userenr[cpu] = regs[5] & 0xf;
                    self.selr[cpu] = Some(regs[4]);
                    self.forget(cpu, |_| true);
                    self.stolen_seen[cpu] = None;
                }
            }
            Op::Reset { cpu } => {
                self.vcpus[cpu].reset(crate::vcpu::ResetKind::Cold);
                self.setup(cpu);
                self.pvtime_on[cpu] = false;
                self.userenr[cpu] = 0;
                self.selr[cpu] = None;
                self.views[cpu] = None;
                self.forget(cpu, |_| true);
                self.stolen_seen[cpu] = None;
            }
        }
        for i in 0..self.vcpus.len() {
            if let (true, Some(b)) = (self.pvtime_on[i], self.pvtime[i]) {
                self.registry.add(Owner::PvTime(i), Region::new(b, 64));
            }
        }
        let mut allowed = before;
        allowed.extend(self.active());
        allowed.extend(oneshot);
        check_writes(&self.host.ram, skip, &allowed, op)?;
        self.check_pvtime()
    }

    /// A PMU register access at `el` (a write if `value`), against KVM's
    /// rules (`arch/arm64/kvm/sys_regs.c`): without PMUv3 nothing is
    /// rustkvm's; EL0 as PMUSERENR_EL0 allows; PMSWINC is write-only and
    /// PMCEID read-only (UNDEF otherwise); a counter that does not exist
    /// (PMEVCNTR/PMEVTYPER n ≥ N but PMCCFILTR, PMXEV* with SEL ≥ N but 31)
    /// is UNDEF — `Route::Fault`, which QEMU's glue makes read-as-zero /
    /// write-ignored (docs/pmu.md) — and changes nothing.
    fn access(
        &mut self,
        cpu: usize,
        reg: Reg,
        el: u32,
        value: Option<u64>,
    ) -> Result<(), TestCaseError> {
        let v = Arc::clone(&self.vcpus[cpu]);
        let enc = reg.encoding();
        let write = value.is_some();
        let sel_before = if self.pmu.0.is_some() && matches!(reg, Reg::Xevcntr | Reg::Xevtyper) {
            self.sel(cpu)
        } else {
            0
        };
        let counter = if self.pmu.0.is_some() {
            self.counter_of(cpu, reg)
        } else {
            None
        };
        let regs_before = v.arm().unwrap().pmu_save();
        let r = match value {
            Some(x) => match v.arm().unwrap().pmu_write(enc, el, x) {
                Route::Handled(()) => Route::Handled(0),
                Route::Fault => Route::Fault,
                Route::Unhandled => Route::Unhandled,
            },
            None => v.arm().unwrap().pmu_read(enc, el),
        };
        if self.pmu.0.is_none() {
            prop_assert_eq!(r, Route::Unhandled, "{:?} without PMUv3", reg);
            return Ok(());
        }
        if let Reg::Raw(_) = reg {
            return Ok(()); // any encoding: no panic is the rule
        }
        let el0 = el == 0;
        let undef = (el0 && !self.el0_allows(cpu, reg, write))
            || (reg == Reg::Swinc && !write)
            || (matches!(reg, Reg::Ceid(_)) && write)
            || matches!(counter, Some(Err(())))
            || match reg {
                Reg::Evtyper(n) => !self.exists(n),
                Reg::Xevtyper => !self.exists(sel_before),
                _ => false,
            };
        if reg == Reg::Evcntr(31) {
            // Unallocated: UNDEF, or left to QEMU (which has no such
            // register); never the cycle counter.
            prop_assert!(
                matches!(r, Route::Fault | Route::Unhandled),
                "PMEVCNTR31: {:?}",
                r
            );
            prop_assert_eq!(
                v.arm().unwrap().pmu_save(),
                regs_before,
                "PMEVCNTR31 changed the PMU"
            );
            return Ok(());
        }
        if undef {
            prop_assert_eq!(
                r,
                Route::Fault,
                "{:?} at EL{} ({:?}), PMUSERENR {:#x}, SEL {}, N {}",
                reg,
                el,
                value,
                self.userenr[cpu],
                sel_before,
                self.n()
            );
            prop_assert_eq!(
                v.arm().unwrap().pmu_save(),
                regs_before,
                "an UNDEF {:?} changed the PMU",
                reg
            );
            return Ok(());
        }
        let Route::Handled(got) = r else {
            return Err(TestCaseError::fail(format!(
                "{reg:?} at EL{el} ({value:?}): {r:?}"
            )));
        };
        match (value, reg) {
            (None, Reg::Pmcr) => {
                prop_assert_eq!((got >> 11) & 0x1f, u64::from(self.n()), "PMCR_EL0.N");
                prop_assert_eq!(got & 6, 0, "PMCR_EL0.P and C read 0");
            }
            (None, Reg::Selr) => prop_assert_eq!(got, u64::from(self.sel(cpu)), "PMSELR_EL0"),
            (None, Reg::Userenr) => prop_assert_eq!(got, self.userenr[cpu], "PMUSERENR_EL0"),
            (None, _) => {
                if let Some(Ok(i)) = counter {
                    if let Some((then, budget)) = self.counters.get(&(cpu, i)) {
                        check_counter(&(cpu, i), *then, got, self.width(i), *budget)?;
                    }
                    self.counters.insert((cpu, i), (got, 0));
                }
            }
            (Some(x), _) => {
                match reg {
                    Reg::Userenr => self.userenr[cpu] = x & 0xf,
                    Reg::Selr => self.selr[cpu] = Some(x),
                    // PMCR_EL0.P resets the event counters, C the cycle
                    // counter.
                    Reg::Pmcr => {
                        let n = self.n();
                        if x & 2 != 0 {
                            self.forget(cpu, |i| i < n);
                        }
                        if x & 4 != 0 {
                            self.forget(cpu, |i| i == 31);
                        }
                    }
                    Reg::Swinc => self.budget(Some(cpu), 1),
                    _ => {}
                }
                if let Some(Ok(i)) = counter {
                    self.counters.remove(&(cpu, i));
                }
            }
        }
        Ok(())
    }

    /// SMCCC calls KVM answers (`kvm_smccc_call_handler`,
    /// `kvm_hypercall_pv_features`, `kvm_init_stolen_time`): SMCCC 1.1;
    /// ARCH_FEATURES of anything but the workarounds and PV time, and any
    /// unknown function: NOT_SUPPORTED (here: NOT_SUPPORTED, or left to
    /// QEMU's PSCI, which answers it); PV_TIME_FEATURES of PV_TIME_FEATURES
    /// or PV_TIME_ST: SUCCESS with a structure, else NOT_SUPPORTED;
    /// PV_TIME_ST: the structure's IPA, or NOT_SUPPORTED; x1..x3 are 0 but
    /// for the UID. W0 and W1 are the function ID and its argument.
    fn smccc(
        &mut self,
        cpu: usize,
        smc: bool,
        regs: [u64; 8],
        oneshot: &mut Vec<Region>,
    ) -> Result<(), TestCaseError> {
        self.host.sched.call_as(tid(cpu));
        let r = self.vcpus[cpu].arm().unwrap().hvc_smc(smc, regs);
        const NOT_SUPPORTED: u64 = u64::MAX;
        let (f, arg) = (regs[0] as u32, regs[1] as u32);
        let base = self.pvtime[cpu];
        let want: Option<u64> = match f {
            0x8000_0000 => Some(0x1_0001),
            0x8000_0001 => match arg {
                0x8000_8000 | 0x8000_7fff | 0x8000_3fff => None,
                0xc500_0020 => Some(0),
                _ => Some(NOT_SUPPORTED),
            },
            0xc500_0020 => Some(match arg {
                0xc500_0020 | 0xc500_0021 if base.is_some() => 0,
                _ => NOT_SUPPORTED,
            }),
            0xc500_0021 => Some(base.unwrap_or(NOT_SUPPORTED)),
            // UID, vendor features, workarounds, PSCI: no rule here.
            0x8600_ff01 | 0x8600_0000 | 0x8000_8000 | 0x8000_3fff => None,
            // KVM's PTP: real time and the counter for counters 0 and 1
            // (the vCPU has a counter frequency here), NOT_SUPPORTED else.
            0x8600_0001 => {
                let Route::Handled(v) = r else {
                    return Err(TestCaseError::fail(format!("PTP: {r:?}")));
                };
                prop_assert!(
                    if arg <= 1 {
                        v.iter().all(|w| *w >> 32 == 0) && (v[0] | v[1]) != 0
                    } else {
                        v == [NOT_SUPPORTED, 0, 0, 0]
                    },
                    "PTP({}): {:x?}",
                    arg,
                    v
                );
                None
            }
            0x8400_0000..=0x8400_001f | 0xc400_0000..=0xc400_001f => None,
            _ => {
                prop_assert!(
                    matches!(
                        r,
                        Route::Unhandled | Route::Handled([NOT_SUPPORTED, 0, 0, 0])
                    ),
                    "unknown SMCCC function {:#x}: {:?}",
                    regs[0],
                    r
                );
                None
            }
        };
        if let Some(x0) = want {
            prop_assert_eq!(
                r,
                Route::Handled([x0, 0, 0, 0]),
                "SMCCC {:#x}({:#x})",
                regs[0],
                regs[1]
            );
        }
        if f == 0xc500_0021 {
            if let Some(b) = base {
                // PV_TIME_ST zeroes the structure and starts updating it.
                oneshot.push(Region::new(b, 64));
                self.pvtime_on[cpu] = true;
                self.stolen_seen[cpu] = None;
            }
        }
        if let (0x8000_0000 | 0x8000_0001 | 0xc500_0020 | 0xc500_0021, Route::Handled(x)) = (f, r) {
            prop_assert_eq!(&x[1..], &[0, 0, 0], "x1..x3");
        }
        Ok(())
    }

    /// PV time as the guest reads it: revision and attributes 0, stolen
    /// time never decreasing between PV_TIME_STs.
    fn check_pvtime(&mut self) -> Result<(), TestCaseError> {
        use crate::memory::GuestMemory;
        for i in 0..self.vcpus.len() {
            let Some(b) = self.pvtime[i] else { continue };
            let region = Region::new(b, 64);
            if !self.pvtime_on[i]
                || !region.in_ram()
                || !self.registry.exclusive(Owner::PvTime(i), region)
            {
                continue;
            }
            let mut s = [0u8; 16];
            prop_assert!(self.host.ram.read(b, &mut s));
            prop_assert_eq!(&s[0..8], &[0; 8], "revision and attributes");
            let stolen = u64::from_le_bytes(s[8..16].try_into().unwrap());
            if let Some(then) = self.stolen_seen[i] {
                prop_assert!(
                    stolen >= then,
                    "vCPU {} stolen time went back: {} -> {}",
                    i,
                    then,
                    stolen
                );
            }
            self.stolen_seen[i] = Some(stolen);
        }
        Ok(())
    }
}

type Case = (
    usize,
    (Option<u8>, bool),
    (bool, bool),
    Vec<Option<u64>>,
    Vec<Op>,
);

fn case() -> impl Strategy<Value = Case> {
    (1..=2usize).prop_flat_map(|cpus| {
        (
            Just(cpus),
            (
                prop_oneof![1 => Just(None), 1 => Just(Some(6u8)), 2 => (0..=31u8).prop_map(Some)],
                any::<bool>(),
            ),
            (any::<bool>(), prop::bool::weighted(0.2)),
            prop::collection::vec(
                // The board never places the structure at 0 (the model's
                // "none", KVM's INVALID_GPA being all-ones).
                prop_oneof![1 => Just(None), 3 => gpa().prop_map(|g| (g != 0).then_some(g))],
                cpus,
            ),
            prop::collection::vec(op(cpus), 1..60),
        )
    })
}

proptest! {
    #![proptest_config(super::config(1500))]

    /// Random arm64 sequences keep every invariant after every step.
    #[test]
    fn arm64_sequences_keep_kvms_rules((cpus, pmu, (mttcg, icount), pvtime, ops) in case()) {
        let mut w = World::new(cpus, pmu, mttcg, icount, pvtime);
        for op in &ops {
            w.step(op)?;
        }
    }
}
