//! arm64 PMUv3 as KVM gives it to a guest: the PMU system registers with
//! their EL0 access rules, event counters and the cycle counter computed
//! lazily from per-vCPU event totals, SW_INCR and CHAIN in software, and
//! the level of the overflow interrupt.
//!
//! Spec: Arm ARM D12 (PMUv3) and the registers' descriptions; Linux
//! `arch/arm64/kvm/pmu-emul.c` (`kvm_pmu_handle_pmcr`,
//! `kvm_pmu_software_increment`, `kvm_pmu_counter_can_chain`,
//! `kvm_pmu_overflow_status`, `kvm_pmu_evtyper_mask`, `compute_pmceid0`),
//! `arch/arm64/kvm/sys_regs.c` (`access_pmcr`, `access_pmselr`,
//! `access_pmu_evcntr`, `access_pmuserenr`, `check_pmu_access_disabled`,
//! `pmu_counter_idx_valid`, `reset_pmu_reg`), `include/linux/perf/arm_pmuv3.h`.
//!
//! Counting model, as for the x86 PMU (`x86::pmu`): the accelerator keeps
//! monotonic per-vCPU totals ([`Events`]: instructions and branches retired
//! and memory accesses, at EL0 and at EL1; unhalted cycles); a counter
//! stores its value at the last sync and the selected event's total then.
//! Where this follows current KVM rather than older releases (the overflow
//! interrupt without PMCNTENSET, software CHAIN), the function says so.
//!
//! QEMU's AArch64 counting engine (patch 0021) keeps the totals; the
//! accelerator routes every PMU system register here (`Vcpu::pmu_read`,
//! `pmu_write`) and drives the PMU interrupt line with [`Pmu::irq_level`].

use thiserror::Error;

/// PMCR_EL0 bits (arm_pmuv3.h `ARMV8_PMU_PMCR_*`).
pub mod pmcr {
    /// Enable.
    pub const E: u64 = 1 << 0;
    /// Event counter reset (write-only action, reads 0).
    pub const P: u64 = 1 << 1;
    /// Cycle counter reset (write-only action, reads 0).
    pub const C: u64 = 1 << 2;
    /// Clock divider (stored, no effect: KVM does not act on it either).
    pub const D: u64 = 1 << 3;
    /// Export enable (stored, no effect).
    pub const X: u64 = 1 << 4;
    /// Disable cycle counter when prohibited (stored, no effect).
    pub const DP: u64 = 1 << 5;
    /// Cycle counter overflows at 64 bits.
    pub const LC: u64 = 1 << 6;
    /// Event counters overflow at 64 bits (PMUv3p5).
    pub const LP: u64 = 1 << 7;
    /// The guest-writable bits.
    pub const MASK: u64 = 0xff;
    /// Number of event counters, bits 15:11.
    pub const N_SHIFT: u32 = 11;
}

/// PMEVTYPER`<n>`_EL0 / PMCCFILTR_EL0 bits.
pub mod evtyper {
    /// Do not count at EL1.
    pub const P: u64 = 1 << 31;
    /// Do not count at EL0.
    pub const U: u64 = 1 << 30;
    /// Count at (Non-secure) EL2: 0 prohibits it (Arm ARM D24.5
    /// PMEVTYPER<n>_EL0.NSH; `ARMV8_PMU_INCLUDE_EL2`). Exists with EL2.
    pub const NSH: u64 = 1 << 27;
    /// evtCount (PMUv3p1 and later: 16 bits).
    pub const EVENT: u64 = 0xffff;
    /// What a KVM guest without EL2 or EL3 can write (`kvm_pmu_evtyper_mask`).
    pub const MASK: u64 = P | U | EVENT;
    /// ... and a guest with EL2 (`kvm_pmu_evtyper_mask` with
    /// ID_AA64PFR0_EL1.EL2 implemented: `ARMV8_PMU_INCLUDE_EL2` too).
    pub const MASK_EL2: u64 = MASK | NSH;
}

/// MDCR_EL2's PMU fields, for a vCPU with EL2 (Arm ARM D24.2 MDCR_EL2;
/// KVM's nested PMU: `kvm_pmu_hyp_counter_mask`, `kvm_pmc_counts_at_el2`,
/// `kvm_pmu_counter_is_enabled`, `kvm_pmu_overflow_status`, `access_mdcr`).
pub mod mdcr {
    /// HPMN: event counters below it are EL1's (PMCR_EL0.E enables them),
    /// the rest up to PMCR_EL0.N EL2's (HPME enables them; EL0 and EL1
    /// neither see nor reach them). Reset: N; KVM clamps writes to N.
    pub const HPMN: u64 = 0x1f;
    /// TPM: EL0's and EL1's PMU accesses trap to EL2 (QEMU's access checks).
    pub const TPM: u64 = 1 << 6;
    /// HPME: EL2's event counters are enabled.
    pub const HPME: u64 = 1 << 7;
    /// HPMD: EL1's event counters and the cycle counter do not count at
    /// EL2 (PMUv3p1; KVM applies it to the cycle counter whatever
    /// PMCR_EL0.DP says).
    pub const HPMD: u64 = 1 << 17;
    /// HCCD: the cycle counter does not count at EL2 (PMUv3p5; the
    /// architecture's, which KVM's vPMU leaves out).
    pub const HCCD: u64 = 1 << 23;
    /// HLP: EL2's event counters overflow at 64 bits (PMUv3p5).
    pub const HLP: u64 = 1 << 26;
}

/// PMUSERENR_EL0 bits.
pub mod userenr {
    /// EL0 access to everything.
    pub const EN: u64 = 1 << 0;
    /// EL0 writes to PMSWINC.
    pub const SW: u64 = 1 << 1;
    /// EL0 reads of the cycle counter.
    pub const CR: u64 = 1 << 2;
    /// EL0 reads of the event counters (and PMSELR).
    pub const ER: u64 = 1 << 3;
    /// All of them.
    pub const MASK: u64 = 0xf;
}

/// Architectural event numbers (Arm ARM, "Common event numbers").
pub mod event {
    /// Software increment (PMSWINC).
    pub const SW_INCR: u16 = 0x00;
    /// Instruction architecturally executed, load.
    pub const LD_RETIRED: u16 = 0x06;
    /// Instruction architecturally executed, store.
    pub const ST_RETIRED: u16 = 0x07;
    /// Exception taken.
    pub const EXC_TAKEN: u16 = 0x09;
    /// Instruction architecturally executed.
    pub const INST_RETIRED: u16 = 0x08;
    /// Cycle.
    pub const CPU_CYCLES: u16 = 0x11;
    /// Data memory access.
    pub const MEM_ACCESS: u16 = 0x13;
    /// Instruction speculatively executed (TCG does not speculate: retired).
    pub const INST_SPEC: u16 = 0x1b;
    /// Chain: counts overflows of the even counter below.
    pub const CHAIN: u16 = 0x1e;
    /// Branch instruction architecturally executed.
    pub const BR_RETIRED: u16 = 0x21;
    /// Cycles the frontend issued nothing (required from PMUv3p1).
    pub const STALL_FRONTEND: u16 = 0x23;
    /// Cycles the backend accepted nothing (required from PMUv3p1).
    pub const STALL_BACKEND: u16 = 0x24;
    /// Cycles nothing was issued (required from PMUv3p4).
    pub const STALL: u16 = 0x3c;
}

/// Index of the cycle counter in the enable/overflow/interrupt registers.
pub const CYCLE_IDX: usize = 31;
/// Most event counters PMUv3 has.
pub const MAX_COUNTERS: usize = 31;
/// KVM's "UNKNOWN" reset pattern (`reset_unknown` in sys_regs.h), masked
/// per register: a KVM guest sees these values before it programs the PMU.
pub const RESET_UNKNOWN: u64 = 0x1de7_ec7e_dbad_c0de;

/// How many registers [`Pmu::save_regs`] saves (`RUSTKVM_ARM_PMU_REGS`).
pub const SAVED_REGS: usize = 70;

/// A PMU system register, decoded from its `sys_reg()` encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuReg {
    /// PMCR_EL0.
    Pmcr,
    /// PMCNTENSET_EL0.
    CntenSet,
    /// PMCNTENCLR_EL0.
    CntenClr,
    /// PMOVSCLR_EL0.
    OvsClr,
    /// PMSWINC_EL0 (write-only).
    Swinc,
    /// PMSELR_EL0.
    Selr,
    /// PMCEID0_EL0 / PMCEID1_EL0 (read-only).
    Ceid(u8),
    /// PMCCNTR_EL0.
    Ccntr,
    /// PMXEVTYPER_EL0.
    Xevtyper,
    /// PMXEVCNTR_EL0.
    Xevcntr,
    /// PMUSERENR_EL0.
    Userenr,
    /// PMINTENSET_EL1.
    IntenSet,
    /// PMINTENCLR_EL1.
    IntenClr,
    /// PMOVSSET_EL0.
    OvsSet,
    /// PMEVCNTR`<n>`_EL0.
    Evcntr(u8),
    /// PMEVTYPER`<n>`_EL0 (n = 31: PMCCFILTR_EL0).
    Evtyper(u8),
}

impl PmuReg {
    /// Decode KVM's `sys_reg(op0, op1, crn, crm, op2)` encoding:
    /// op0 << 14 | op1 << 11 | crn << 7 | crm << 3 | op2.
    pub fn decode(encoding: u32) -> Option<PmuReg> {
        let (op0, op1, crn, crm, op2) = (
            encoding >> 14 & 3,
            encoding >> 11 & 7,
            encoding >> 7 & 15,
            encoding >> 3 & 15,
            (encoding & 7) as u8,
        );
        if op0 != 3 {
            return None;
        }
        Some(match (op1, crn, crm, op2) {
            (3, 9, 12, 0) => PmuReg::Pmcr,
            (3, 9, 12, 1) => PmuReg::CntenSet,
            (3, 9, 12, 2) => PmuReg::CntenClr,
            (3, 9, 12, 3) => PmuReg::OvsClr,
            (3, 9, 12, 4) => PmuReg::Swinc,
            (3, 9, 12, 5) => PmuReg::Selr,
            (3, 9, 12, 6) => PmuReg::Ceid(0),
            (3, 9, 12, 7) => PmuReg::Ceid(1),
            (3, 9, 13, 0) => PmuReg::Ccntr,
            (3, 9, 13, 1) => PmuReg::Xevtyper,
            (3, 9, 13, 2) => PmuReg::Xevcntr,
            (3, 9, 14, 0) => PmuReg::Userenr,
            (0, 9, 14, 1) => PmuReg::IntenSet,
            (0, 9, 14, 2) => PmuReg::IntenClr,
            (3, 9, 14, 3) => PmuReg::OvsSet,
            // PMEVCNTR0..30_EL0; (14, 11, 7) is unallocated (counter 31 is
            // the cycle counter, PMCCNTR_EL0): KVM UNDEFs it.
            (3, 14, 11, 7) => return None,
            (3, 14, 8..=11, n) => PmuReg::Evcntr(((crm as u8 - 8) << 3) | n),
            (3, 14, 12..=15, n) => PmuReg::Evtyper(((crm as u8 - 12) << 3) | n),
            _ => return None,
        })
    }
}

/// Why an access is UNDEFINED for the guest (KVM injects UNDEF).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum PmuError {
    /// EL0 access that PMUSERENR_EL0 does not allow.
    #[error("EL0 access to {0:?} not enabled by PMUSERENR_EL0")]
    El0Disabled(PmuReg),
    /// A counter the PMU does not have (PMSELR.SEL or n ≥ PMCR.N, not 31).
    #[error("counter {0} does not exist")]
    NoSuchCounter(u8),
    /// A read of a write-only register or a write of a read-only one.
    #[error("{0:?} cannot be accessed that way")]
    Direction(PmuReg),
    /// The vCPU has no PMU (all PMU registers are hidden).
    #[error("no PMU")]
    NoPmu,
    /// An EL0 or EL1 access to an event counter MDCR_EL2.HPMN reserves for
    /// EL2 (QEMU's access check traps these to EL2 first:
    /// [`Pmu::traps_to_el2`]).
    #[error("counter {0} is EL2's (MDCR_EL2.HPMN)")]
    El2Counter(u8),
}

/// Monotonic per-vCPU event totals the accelerator maintains, by the
/// exception level they happened at: index 0 is EL0, 1 is EL1, 2 is EL2
/// (only a vCPU with EL2 has any there).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// Instructions architecturally executed.
    pub instructions: [u64; 3],
    /// Branch instructions architecturally executed.
    pub branches: [u64; 3],
    /// Load and store instructions (one access each).
    pub mem_accesses: [u64; 3],
    /// Instructions that load (atomics both load and store).
    pub loads: [u64; 3],
    /// Instructions that store.
    pub stores: [u64; 3],
    /// Exceptions taken, by the EL they were taken from.
    pub exceptions: [u64; 3],
    /// Cycles the vCPU ran outside EL2 (index 0: EL0 and EL1 are not told
    /// apart) and at EL2 (index 1).
    pub cycles: [u64; 2],
}

/// An event rustkvm counts from the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Instructions,
    Branches,
    MemAccesses,
    Loads,
    Stores,
    Exceptions,
    Cycles,
}

impl Counted {
    /// At most one per instruction: counted by the blocks, within the PMI
    /// budget (exceptions are counted as they are taken).
    fn per_instruction(self) -> bool {
        !matches!(self, Counted::Cycles | Counted::Exceptions)
    }

    /// Counted from the blocks' loads and stores.
    fn memory(self) -> bool {
        matches!(
            self,
            Counted::MemAccesses | Counted::Loads | Counted::Stores
        )
    }
}

/// What a counter does: count totals, or only software (SW_INCR, CHAIN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Totals(Counted),
    SwIncr,
    Chain,
    /// An event rustkvm does not count: the counter keeps its value (as KVM
    /// when it cannot create the host event).
    Nothing,
}

impl Source {
    fn of(evtcount: u16) -> Source {
        match evtcount {
            event::SW_INCR => Source::SwIncr,
            event::CHAIN => Source::Chain,
            event::INST_RETIRED | event::INST_SPEC => Source::Totals(Counted::Instructions),
            event::BR_RETIRED => Source::Totals(Counted::Branches),
            event::MEM_ACCESS => Source::Totals(Counted::MemAccesses),
            event::LD_RETIRED => Source::Totals(Counted::Loads),
            event::ST_RETIRED => Source::Totals(Counted::Stores),
            event::EXC_TAKEN => Source::Totals(Counted::Exceptions),
            event::CPU_CYCLES => Source::Totals(Counted::Cycles),
            // TCG models no pipeline: no cycle stalls, the count stays (as
            // QEMU's own PMU, which counts them as zero).
            event::STALL_FRONTEND | event::STALL_BACKEND | event::STALL => Source::Nothing,
            _ => Source::Nothing,
        }
    }
}

/// PMCEID0_EL0 and PMCEID1_EL0: the common events 0x00–0x3F counted
/// (SW_INCR and CHAIN always, as KVM), with the stall events the
/// architecture requires from PMUv3p1/p4 (Arm ARM D13.11.1; kvm-unit-tests'
/// `pmu-event-introspection` checks STALL_FRONTEND and STALL_BACKEND), which
/// count zero cycles here as under QEMU's own PMU. Optional for a PMUv3
/// without p1, where advertising them is allowed.
pub fn pmceid() -> [u64; 2] {
    let ids = [
        event::SW_INCR,
        event::LD_RETIRED,
        event::ST_RETIRED,
        event::EXC_TAKEN,
        event::INST_RETIRED,
        event::CPU_CYCLES,
        event::MEM_ACCESS,
        event::INST_SPEC,
        event::CHAIN,
        event::BR_RETIRED,
        event::STALL_FRONTEND,
        event::STALL_BACKEND,
        event::STALL,
    ];
    let bits = ids.iter().fold(0u64, |m, &e| m | 1 << e);
    [bits & 0xffff_ffff, bits >> 32]
}

/// The PMU a vCPU is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuConfig {
    /// Event counters (PMCR_EL0.N), 0..=31; None: no PMU.
    pub counters: Option<u8>,
    /// PMUv3p5: 64-bit event counters and PMCR_EL0.LP.
    pub v3p5: bool,
    /// The vCPU has EL2 (`-M virt,virtualization=on`): PMEVTYPER<n>_EL0.NSH
    /// and PMCCFILTR_EL0.NSH exist and choose whether EL2 counts.
    pub el2: bool,
}

impl PmuConfig {
    /// KVM's default on a typical host: 6 counters, PMUv3p5, a guest
    /// without EL2.
    pub const DEFAULT: PmuConfig = PmuConfig {
        counters: Some(6),
        v3p5: true,
        el2: false,
    };

    /// The event type bits a guest can write (`kvm_pmu_evtyper_mask`).
    fn evtyper_mask(self) -> u64 {
        if self.el2 {
            evtyper::MASK_EL2
        } else {
            evtyper::MASK
        }
    }

    fn n(self) -> usize {
        usize::from(self.counters.unwrap_or(0)).min(MAX_COUNTERS)
    }

    /// The counters that exist: event counters 0..N and the cycle counter.
    fn mask(self) -> u64 {
        ((1u64 << self.n()) - 1) | 1 << CYCLE_IDX
    }
}

/// One counter: its value at the last sync and its event's total then.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counter {
    value: u64,
    base: u64,
}

/// A vCPU's PMUv3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pmu {
    config: PmuConfig,
    pmcr: u64,
    cnten: u64,
    inten: u64,
    ovs: u64,
    selr: u64,
    userenr: u64,
    evtyper: [u64; 32],
    counters: [Counter; 32],
    /// MDCR_EL2 as the vCPU last set it ([`Pmu::write_mdcr_el2`]; without
    /// EL2 it stays HPMN = N: every counter is EL1's).
    mdcr: u64,
}

/// What the guest's access changed that the accelerator must act on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// The overflow interrupt's level now (it is level-sensitive).
    pub irq: bool,
}

impl Pmu {
    /// A PMU in KVM's reset state (`reset_pmcr`, `reset_pmu_reg`,
    /// `reset_pmevcntr`, `reset_pmevtyper`, `reset_pmselr`): PMCR_EL0 0,
    /// the enable/interrupt/overflow registers, counters and event types
    /// KVM's UNKNOWN pattern masked to what exists, PMCCFILTR_EL0 and
    /// PMUSERENR_EL0 0.
    pub fn new(config: PmuConfig) -> Pmu {
        let m = config.mask();
        let mut evtyper = [RESET_UNKNOWN & config.evtyper_mask(); 32];
        evtyper[CYCLE_IDX] = 0;
        let mut counters = [Counter {
            value: RESET_UNKNOWN & 0xffff_ffff,
            base: 0,
        }; 32];
        counters[CYCLE_IDX].value = RESET_UNKNOWN;
        Pmu {
            config,
            pmcr: 0,
            cnten: RESET_UNKNOWN & m,
            inten: RESET_UNKNOWN & m,
            ovs: RESET_UNKNOWN & m,
            selr: RESET_UNKNOWN & 0x1f,
            userenr: 0,
            evtyper,
            counters,
            mdcr: config.n() as u64,
        }
    }

    /// Whether PMUv3 exists for this vCPU.
    pub fn present(&self) -> bool {
        self.config.counters.is_some()
    }

    /// What the guest was given.
    pub fn config(&self) -> PmuConfig {
        self.config
    }

    fn exists(&self, i: usize) -> bool {
        i == CYCLE_IDX || i < self.config.n()
    }

    fn source(&self, i: usize) -> Source {
        if i == CYCLE_IDX {
            Source::Totals(Counted::Cycles)
        } else {
            Source::of((self.evtyper[i] & evtyper::EVENT) as u16)
        }
    }

    /// The event counters MDCR_EL2.HPMN reserves for EL2: HPMN..N
    /// (`kvm_pmu_hyp_counter_mask`; none without EL2).
    fn el2_counters(&self) -> u64 {
        let (n, hpmn) = (self.config.n(), (self.mdcr & mdcr::HPMN) as usize);
        if !self.config.el2 || hpmn >= n {
            0
        } else {
            ((1u64 << n) - 1) & !((1u64 << hpmn) - 1)
        }
    }

    fn is_el2_counter(&self, i: usize) -> bool {
        self.el2_counters() & 1 << i != 0
    }

    /// The counters an access at `el` reaches: all that exist from EL2,
    /// EL1's from EL0 and EL1 (`kvm_pmu_accessible_counter_mask`).
    fn reachable(&self, el: u8) -> u64 {
        let m = self.config.mask();
        if el >= 2 {
            m
        } else {
            m & !self.el2_counters()
        }
    }

    /// Whether counter `i` counts now: its enable bit, and PMCR_EL0.E for
    /// EL1's counters and the cycle counter, MDCR_EL2.HPME for EL2's
    /// (`kvm_pmu_counter_is_enabled`).
    fn enabled(&self, i: usize) -> bool {
        let on = if self.is_el2_counter(i) {
            self.mdcr & mdcr::HPME != 0
        } else {
            self.pmcr & pmcr::E != 0
        };
        on && self.cnten & 1 << i != 0
    }

    /// Whether counter `i` may count at EL2 (besides its NSH): not one of
    /// EL1's counters or the cycle counter under MDCR_EL2.HPMD
    /// (`kvm_pmc_counts_at_el2`), not the cycle counter under HCCD.
    fn el2_allowed(&self, i: usize) -> bool {
        let hpmd = self.mdcr & mdcr::HPMD != 0 && !self.is_el2_counter(i);
        let hccd = i == CYCLE_IDX && self.config.v3p5 && self.mdcr & mdcr::HCCD != 0;
        !hpmd && !hccd
    }

    /// Whether an access to `reg` at `el` traps to EL2 because it names an
    /// event counter MDCR_EL2.HPMN reserves for EL2 (PMEVCNTR<n>_EL0,
    /// PMEVTYPER<n>_EL0, or PMXEV* with PMSELR_EL0.SEL n; Arm ARM D24.5,
    /// `GetNumEventCountersAccessible()`; KVM forwards these to the guest
    /// hypervisor: `check_mdcr_hpmn`).
    pub fn traps_to_el2(&self, reg: PmuReg, el: u8) -> bool {
        let n = match reg {
            PmuReg::Evcntr(n) | PmuReg::Evtyper(n) => n,
            PmuReg::Xevcntr | PmuReg::Xevtyper => self.selected(),
            _ => return false,
        };
        el < 2 && usize::from(n) != CYCLE_IDX && self.is_el2_counter(usize::from(n))
    }

    /// MDCR_EL2 := `value` (a guest write at EL2, a reset, a load) with the
    /// totals `ev`: what the register holds (HPMN clamped to N, as KVM's
    /// `access_mdcr`) and the interrupt level.
    pub fn write_mdcr_el2(&mut self, value: u64, ev: &Events) -> (u64, Effects) {
        self.sync(ev);
        let hpmn = (value & mdcr::HPMN).min(self.config.n() as u64);
        self.mdcr = (value & !mdcr::HPMN) | hpmn;
        self.rebase(ev);
        (self.mdcr, self.effects())
    }

    /// Every counter counts on from the totals `ev`.
    fn rebase(&mut self, ev: &Events) {
        for i in 0..32 {
            if self.exists(i) {
                self.counters[i].base = self.total(i, ev).unwrap_or(0);
            }
        }
    }

    /// The selected total of counter `i` through its EL filter (U excludes
    /// EL0, P excludes EL1, NSH includes EL2: Arm ARM D12.6 and QEMU's
    /// `pmu_counter_enabled`; the cycles outside EL2 are not split between
    /// EL0 and EL1: either counts them).
    fn total(&self, i: usize, ev: &Events) -> Option<u64> {
        let Source::Totals(c) = self.source(i) else {
            return None;
        };
        let t = self.evtyper[i];
        let on = [
            t & evtyper::U == 0,
            t & evtyper::P == 0,
            t & evtyper::NSH != 0 && self.el2_allowed(i),
        ];
        let split = |v: [u64; 3]| {
            v.iter()
                .zip(on)
                .filter(|&(_, counts)| counts)
                .fold(0u64, |s, (&n, _)| s.wrapping_add(n))
        };
        Some(match c {
            Counted::Instructions => split(ev.instructions),
            Counted::Branches => split(ev.branches),
            Counted::MemAccesses => split(ev.mem_accesses),
            Counted::Loads => split(ev.loads),
            Counted::Stores => split(ev.stores),
            Counted::Exceptions => split(ev.exceptions),
            Counted::Cycles => (if on[0] || on[1] { ev.cycles[0] } else { 0 })
                .wrapping_add(if on[2] { ev.cycles[1] } else { 0 }),
        })
    }

    /// Counter `i`'s width in bits (what it reads as) and where it
    /// overflows (`kvm_pmc_is_64bit`, `kvm_pmc_has_64bit_overflow`: EL2's
    /// counters by MDCR_EL2.HLP, EL1's by PMCR_EL0.LP).
    fn width_and_overflow(&self, i: usize) -> (u32, u32) {
        let long = if self.is_el2_counter(i) {
            self.mdcr & mdcr::HLP != 0
        } else {
            self.pmcr & pmcr::LP != 0
        };
        if i == CYCLE_IDX {
            (64, if self.pmcr & pmcr::LC != 0 { 64 } else { 32 })
        } else if self.config.v3p5 {
            (64, if long { 64 } else { 32 })
        } else {
            (32, 32)
        }
    }

    /// Add `delta` to counter `i`: its new value and how many times it
    /// overflowed.
    fn add(&self, i: usize, value: u64, delta: u64) -> (u64, u64) {
        let (width, ovf) = self.width_and_overflow(i);
        let wraps = if ovf == 64 {
            u64::from(value.checked_add(delta).is_none())
        } else {
            // Carries out of bit 31 of value + delta, without overflowing
            // when delta is near 2^64 (totals below the synced base).
            (delta >> 32) + (((value & 0xffff_ffff) + (delta & 0xffff_ffff)) >> 32)
        };
        let mut v = value.wrapping_add(delta);
        if width == 32 {
            v &= 0xffff_ffff;
        }
        (v, wraps)
    }

    /// Counter `i` brought up to `ev` without changing anything: its value
    /// and its overflows since the last sync (a CHAIN counter also counts
    /// its even neighbour's overflows).
    fn advanced(&self, i: usize, ev: &Events) -> (u64, u64) {
        let c = self.counters[i];
        if !self.enabled(i) {
            return (c.value, 0);
        }
        let delta = match self.source(i) {
            Source::Totals(_) => self.total(i, ev).unwrap_or(0).wrapping_sub(c.base),
            Source::Chain if self.chains_into(i) => self.advanced(i - 1, ev).1,
            _ => 0,
        };
        self.add(i, c.value, delta)
    }

    /// Whether odd counter `i` takes its even neighbour's overflows
    /// (`kvm_pmu_counter_can_chain`: 32-bit overflow of the even counter).
    fn chains_into(&self, i: usize) -> bool {
        i % 2 == 1
            && i < CYCLE_IDX
            && self.width_and_overflow(i - 1).1 == 32
            && self.source(i) == Source::Chain
    }

    /// Counter `i`'s value now.
    pub fn value(&self, i: usize, ev: &Events) -> u64 {
        self.advanced(i, ev).0
    }

    /// Fold the events since the last sync into every counter, setting
    /// PMOVSSET bits for those that overflowed; returns the interrupt level.
    pub fn sync(&mut self, ev: &Events) -> Effects {
        let mut next = self.counters;
        for (i, slot) in next.iter_mut().enumerate() {
            if !self.exists(i) {
                continue;
            }
            let (value, wraps) = self.advanced(i, ev);
            if wraps != 0 {
                self.ovs |= 1 << i;
            }
            *slot = Counter {
                value,
                base: self.total(i, ev).unwrap_or(0),
            };
        }
        self.counters = next;
        self.effects()
    }

    /// The overflow interrupt's level: an overflow whose interrupt is
    /// enabled, of one of EL1's counters or the cycle counter with
    /// PMCR_EL0.E, of one of EL2's with MDCR_EL2.HPME
    /// (`kvm_pmu_overflow_status`; current KVM no longer requires the
    /// counter to be enabled in PMCNTENSET).
    pub fn irq_level(&self) -> bool {
        let mut r = self.ovs & self.inten;
        if self.pmcr & pmcr::E == 0 {
            r &= self.el2_counters();
        }
        if self.mdcr & mdcr::HPME == 0 {
            r &= !self.el2_counters();
        }
        r != 0
    }

    fn effects(&self) -> Effects {
        Effects {
            irq: self.irq_level(),
        }
    }

    /// Whether some enabled counter counts instructions, branches or memory
    /// accesses (the accelerator must count them).
    pub fn counts_retired(&self) -> bool {
        (0..self.config.n()).any(|i| {
            self.enabled(i) && matches!(self.source(i), Source::Totals(c) if c.per_instruction())
        })
    }

    /// Whether some enabled counter counts exceptions taken (QEMU then
    /// adds each and calls back).
    pub fn counts_exceptions(&self) -> bool {
        (0..self.config.n())
            .any(|i| self.enabled(i) && self.source(i) == Source::Totals(Counted::Exceptions))
    }

    /// Cycles that may pass before a counter counting cycles (the cycle
    /// counter, or an event counter on CPU_CYCLES) overflows with its
    /// interrupt enabled; None if none does (a timer waits for it).
    pub fn cycles_until_overflow(&self, ev: &Events) -> Option<u64> {
        (0..32)
            .filter(|&i| self.exists(i) && self.enabled(i) && self.inten & 1 << i != 0)
            .filter(|&i| self.source(i) == Source::Totals(Counted::Cycles))
            .map(|i| {
                let v = self.value(i, ev);
                if self.width_and_overflow(i).1 == 64 {
                    v.wrapping_neg().max(1)
                } else {
                    (1u64 << 32) - (v & 0xffff_ffff)
                }
            })
            .min()
    }

    /// Whether some enabled counter counts memory accesses (the engine
    /// must count load/store instructions too).
    pub fn counts_mem(&self) -> bool {
        (0..self.config.n())
            .any(|i| self.enabled(i) && matches!(self.source(i), Source::Totals(c) if c.memory()))
    }

    /// Instructions that may retire before a counter counting instructions,
    /// branches or memory accesses (at most one each per instruction)
    /// overflows with its interrupt enabled; None if none does.
    pub fn until_overflow(&self, ev: &Events) -> Option<u64> {
        (0..self.config.n())
            .filter(|&i| self.enabled(i) && self.inten & 1 << i != 0)
            .filter(|&i| matches!(self.source(i), Source::Totals(c) if c.per_instruction()))
            .map(|i| {
                let v = self.value(i, ev);
                let (_, ovf) = self.width_and_overflow(i);
                if ovf == 64 {
                    v.wrapping_neg().max(1)
                } else {
                    (1u64 << 32) - (v & 0xffff_ffff)
                }
            })
            .min()
    }

    /// The EL0 access rule of `reg` (`check_pmu_access_disabled` and its
    /// callers): which PMUSERENR_EL0 bits allow it.
    fn el0_allows(&self, reg: PmuReg, write: bool) -> bool {
        let u = self.userenr;
        let any = |bits: u64| u & bits != 0;
        match reg {
            PmuReg::IntenSet | PmuReg::IntenClr => false,
            // Readable at EL0, written only at EL1 (`access_pmuserenr`).
            PmuReg::Userenr => !write,
            PmuReg::Swinc => any(userenr::SW | userenr::EN),
            PmuReg::Ccntr if !write => any(userenr::CR | userenr::EN),
            PmuReg::Evcntr(_) | PmuReg::Xevcntr if !write => any(userenr::ER | userenr::EN),
            PmuReg::Selr => any(userenr::ER | userenr::EN),
            _ => any(userenr::EN),
        }
    }

    /// The counter PMSELR_EL0 selects.
    fn selected(&self) -> u8 {
        (self.selr & 0x1f) as u8
    }

    /// UNDEF unless counter `n` exists (`pmu_counter_idx_valid`), and
    /// EL2's counters out of reach below EL2 ([`Pmu::traps_to_el2`]).
    fn check_counter(&self, n: u8, el: u8) -> Result<usize, PmuError> {
        let i = usize::from(n);
        if !self.exists(i) {
            Err(PmuError::NoSuchCounter(n))
        } else if self.reachable(el) & 1 << i == 0 {
            Err(PmuError::El2Counter(n))
        } else {
            Ok(i)
        }
    }

    /// MRS of `reg` at EL `el` (0, 1 or 2) with the totals `ev`.
    pub fn read(&self, reg: PmuReg, el: u8, ev: &Events) -> Result<u64, PmuError> {
        if !self.present() {
            return Err(PmuError::NoPmu);
        }
        if el == 0 && !self.el0_allows(reg, false) {
            return Err(PmuError::El0Disabled(reg));
        }
        // Below EL2 PMCR_EL0.N reads as MDCR_EL2.HPMN (`kvm_vcpu_read_pmcr`).
        let n = if el < 2 && self.config.el2 {
            self.mdcr & mdcr::HPMN
        } else {
            self.config.n() as u64
        };
        Ok(match reg {
            PmuReg::Pmcr => (self.pmcr & !(pmcr::P | pmcr::C)) | n << pmcr::N_SHIFT,
            PmuReg::CntenSet | PmuReg::CntenClr => self.cnten,
            PmuReg::IntenSet | PmuReg::IntenClr => self.inten,
            PmuReg::OvsSet | PmuReg::OvsClr => self.ovs | self.pending_ovs(ev),
            PmuReg::Swinc => return Err(PmuError::Direction(reg)),
            PmuReg::Selr => u64::from(self.selected()),
            PmuReg::Ceid(k) => pmceid()[usize::from(k & 1)],
            PmuReg::Ccntr => self.value(CYCLE_IDX, ev),
            PmuReg::Xevtyper => self.evtyper[self.check_counter(self.selected(), el)?],
            PmuReg::Xevcntr => self.value(self.check_counter(self.selected(), el)?, ev),
            PmuReg::Userenr => self.userenr,
            PmuReg::Evcntr(i) => self.value(self.check_counter(i, el)?, ev),
            PmuReg::Evtyper(i) => self.evtyper[self.check_counter(i, el)?],
        })
    }

    /// Overflows since the last sync, not yet in PMOVSSET.
    fn pending_ovs(&self, ev: &Events) -> u64 {
        (0..32)
            .filter(|&i| self.exists(i) && self.advanced(i, ev).1 != 0)
            .fold(0, |m, i| m | 1 << i)
    }

    /// MSR of `reg` = `value` at EL `el` with the totals `ev`.
    pub fn write(
        &mut self,
        reg: PmuReg,
        value: u64,
        el: u8,
        ev: &Events,
    ) -> Result<Effects, PmuError> {
        if !self.present() {
            return Err(PmuError::NoPmu);
        }
        if el == 0 && (!self.el0_allows(reg, true) || matches!(reg, PmuReg::Userenr)) {
            return Err(PmuError::El0Disabled(reg));
        }
        // Everything below changes what counts or a value: fold first.
        self.sync(ev);
        // Writes reach EL2's counters only from EL2 (reads see them all).
        let m = self.reachable(el);
        match reg {
            PmuReg::Pmcr => {
                let mut v = value & pmcr::MASK & !(pmcr::P | pmcr::C);
                if !self.config.v3p5 {
                    v &= !pmcr::LP;
                }
                self.pmcr = v;
                if value & pmcr::C != 0 {
                    self.counters[CYCLE_IDX].value = 0;
                }
                if value & pmcr::P != 0 {
                    // From EL2 every event counter, below it EL1's
                    // (`kvm_pmu_handle_pmcr`).
                    for (i, c) in self.counters[..self.config.n()].iter_mut().enumerate() {
                        if m & 1 << i != 0 {
                            c.value = 0;
                        }
                    }
                }
            }
            PmuReg::CntenSet => self.cnten |= value & m,
            PmuReg::CntenClr => self.cnten &= !(value & m),
            PmuReg::IntenSet => self.inten |= value & m,
            PmuReg::IntenClr => self.inten &= !(value & m),
            PmuReg::OvsSet => self.ovs |= value & m,
            PmuReg::OvsClr => self.ovs &= !(value & m),
            PmuReg::Swinc => self.software_increment(value & m & !(1 << CYCLE_IDX)),
            PmuReg::Selr => self.selr = value,
            PmuReg::Ceid(_) => return Err(PmuError::Direction(reg)),
            PmuReg::Ccntr => self.counters[CYCLE_IDX].value = value,
            PmuReg::Xevtyper => {
                let i = self.check_counter(self.selected(), el)?;
                self.evtyper[i] = value & self.config.evtyper_mask();
            }
            PmuReg::Xevcntr => {
                let i = self.check_counter(self.selected(), el)?;
                self.set_counter(i, value);
            }
            PmuReg::Userenr => self.userenr = value & userenr::MASK,
            PmuReg::Evcntr(n) => {
                let i = self.check_counter(n, el)?;
                self.set_counter(i, value);
            }
            PmuReg::Evtyper(n) => {
                let i = self.check_counter(n, el)?;
                self.evtyper[i] = value & self.config.evtyper_mask();
            }
        }
        // Counting restarts from the totals now for whatever changed.
        self.rebase(ev);
        Ok(self.effects())
    }

    /// The registers to save (`RUSTKVM_ARM_PMU_REGS`): PMCR_EL0,
    /// PMCNTENSET, PMINTENSET, PMOVSSET, PMSELR, PMUSERENR, the 32 event
    /// types (31: PMCCFILTR), the 32 counter values (31: PMCCNTR) now.
    pub fn save_regs(&self, ev: &Events) -> [u64; SAVED_REGS] {
        let mut r = [0; SAVED_REGS];
        r[..6].copy_from_slice(&[
            self.pmcr,
            self.cnten,
            self.inten,
            self.ovs | self.pending_ovs(ev),
            self.selr,
            self.userenr,
        ]);
        r[6..38].copy_from_slice(&self.evtyper);
        for (i, v) in r[38..].iter_mut().enumerate() {
            *v = if self.exists(i) { self.value(i, ev) } else { 0 };
        }
        r
    }

    /// Load saved registers (loadvm, incoming migration) with the totals
    /// `ev` now: counters continue from their saved values; what this PMU
    /// cannot hold is masked as a guest write would be.
    pub fn load_regs(&mut self, r: &[u64; SAVED_REGS], ev: &Events) -> Effects {
        let m = self.config.mask();
        let mut pmcr = r[0] & pmcr::MASK & !(pmcr::P | pmcr::C);
        if !self.config.v3p5 {
            pmcr &= !pmcr::LP;
        }
        self.pmcr = pmcr;
        self.cnten = r[1] & m;
        self.inten = r[2] & m;
        self.ovs = r[3] & m;
        self.selr = r[4];
        self.userenr = r[5] & userenr::MASK;
        for i in 0..32 {
            self.evtyper[i] = r[6 + i] & self.config.evtyper_mask();
            if self.exists(i) {
                self.set_counter(i, r[38 + i]);
            }
        }
        self.rebase(ev);
        self.effects()
    }

    fn set_counter(&mut self, i: usize, value: u64) {
        let (width, _) = self.width_and_overflow(i);
        self.counters[i].value = if width == 32 {
            value & 0xffff_ffff
        } else {
            value
        };
    }

    /// PMSWINC_EL0 (`kvm_pmu_software_increment`): with PMCR_EL0.E, each
    /// enabled counter in `mask` whose event is SW_INCR counts 1, whatever
    /// its EL filter; an even counter's overflow feeds a CHAIN neighbour.
    fn software_increment(&mut self, mask: u64) {
        if self.pmcr & pmcr::E == 0 {
            return;
        }
        for i in 0..self.config.n() {
            if mask & 1 << i == 0 || !self.enabled(i) || self.source(i) != Source::SwIncr {
                continue;
            }
            let (v, wraps) = self.add(i, self.counters[i].value, 1);
            self.counters[i].value = v;
            if wraps != 0 {
                self.ovs |= 1 << i;
                let j = i + 1;
                if j < self.config.n() && self.enabled(j) && self.chains_into(j) {
                    let (w, w2) = self.add(j, self.counters[j].value, 1);
                    self.counters[j].value = w;
                    if w2 != 0 {
                        self.ovs |= 1 << j;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sys_reg() encodings of the registers the tests use.
    fn enc(op0: u32, op1: u32, crn: u32, crm: u32, op2: u32) -> u32 {
        op0 << 14 | op1 << 11 | crn << 7 | crm << 3 | op2
    }

    fn ev(el0: u64, el1: u64) -> Events {
        Events {
            instructions: [el0, el1, 0],
            branches: [el0 / 4, el1 / 4, 0],
            mem_accesses: [el0 / 3, el1 / 3, 0],
            loads: [el0 / 5, el1 / 5, 0],
            stores: [el0 / 6, el1 / 6, 0],
            exceptions: [el0 / 100, el1 / 100, 0],
            cycles: [2 * (el0 + el1), 0],
        }
    }

    fn pmu() -> Pmu {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        let e = Events::default();
        // What Linux does first: clear the UNKNOWN reset state.
        p.write(PmuReg::CntenClr, u64::MAX, 1, &e).unwrap();
        p.write(PmuReg::IntenClr, u64::MAX, 1, &e).unwrap();
        p.write(PmuReg::OvsClr, u64::MAX, 1, &e).unwrap();
        p
    }

    /// Issue 46: a 32-bit overflow count of value + delta for any delta,
    /// up to 2^64 - 1 (totals that fell below the synced base), as the sum
    /// in 128 bits counts it.
    #[test]
    fn adding_any_delta_counts_its_32_bit_overflows_without_overflowing() {
        let p = pmu();
        let edges = [
            0,
            1,
            0x7fff_ffff,
            0xffff_ffff,
            1 << 32,
            u64::MAX - 1,
            u64::MAX,
        ];
        for value in edges {
            for delta in edges {
                let (v, wraps) = p.add(0, value, delta);
                let sum = u128::from(value & 0xffff_ffff) + u128::from(delta);
                assert_eq!(u128::from(wraps), sum >> 32, "{value:#x} + {delta:#x}");
                let width = p.width_and_overflow(0).0;
                let mask = if width == 64 { u64::MAX } else { 0xffff_ffff };
                assert_eq!(v, value.wrapping_add(delta) & mask);
            }
        }
    }

    /// PMCCFILTR_EL0 and PMEVTYPER<n>_EL0 filter EL2 by NSH alone (P and
    /// U leave EL2 alone: Arm ARM D24.5; QEMU's `pmu_counter_enabled`),
    /// and NSH exists only for a vCPU with EL2.
    #[test]
    fn nsh_alone_decides_what_counts_at_el2() {
        let config = PmuConfig {
            el2: true,
            ..PmuConfig::DEFAULT
        };
        let mut p = Pmu::new(config);
        let e = Events {
            instructions: [1, 20, 300],
            cycles: [4_000, 50_000],
            ..Events::default()
        };
        let (pu, nsh) = (evtyper::P | evtyper::U, evtyper::NSH);
        for (t, insns, cycles) in [
            (0, 21, 4_000),
            (nsh, 321, 54_000),
            (pu, 0, 0),
            (pu | nsh, 300, 50_000),
            (evtyper::U, 20, 4_000),
        ] {
            p.write(PmuReg::Evtyper(0), t | 0x08, 2, &e).unwrap();
            p.write(PmuReg::Evtyper(31), t, 2, &e).unwrap();
            assert_eq!(p.total(0, &e), Some(insns), "PMEVTYPER0 {t:#x}");
            assert_eq!(p.total(CYCLE_IDX, &e), Some(cycles), "PMCCFILTR {t:#x}");
            assert_eq!(p.read(PmuReg::Evtyper(31), 2, &e), Ok(t));
        }
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        p.write(PmuReg::Evtyper(31), pu | nsh, 1, &e).unwrap();
        assert_eq!(
            p.read(PmuReg::Evtyper(31), 1, &e),
            Ok(pu),
            "RES0 without EL2"
        );
    }

    /// MDCR_EL2.HPMN splits the event counters between EL1 (below it:
    /// PMCR_EL0.E, LP) and EL2 (HPME, HLP, out of EL0's and EL1's sight),
    /// HPMD and HCCD keep counters from counting at EL2, as KVM's nested
    /// PMU gives them (`kvm_pmu_hyp_counter_mask` and its users).
    #[test]
    fn mdcr_el2_splits_the_counters_between_el1_and_el2() {
        use super::mdcr::{HCCD, HLP, HPMD, HPME};
        let mut p = Pmu::new(PmuConfig {
            el2: true,
            ..PmuConfig::DEFAULT
        });
        let mut e = Events::default();
        p.write(PmuReg::IntenClr, u64::MAX, 2, &e).unwrap();
        p.write(PmuReg::OvsClr, u64::MAX, 2, &e).unwrap();
        let n_at = |p: &Pmu, el| (p.read(PmuReg::Pmcr, el, &e).unwrap() >> pmcr::N_SHIFT) & 0x1f;
        assert_eq!((n_at(&p, 1), n_at(&p, 2)), (6, 6), "reset: HPMN = N");
        assert_eq!(p.write_mdcr_el2(31, &e).0, 6, "HPMN clamped to N");
        assert_eq!(p.write_mdcr_el2(4, &e).0, 4);
        assert_eq!((n_at(&p, 1), n_at(&p, 2)), (4, 6));
        // Counters 4 and 5 are EL2's: EL1 traps, writes from EL1 miss them.
        assert!(p.traps_to_el2(PmuReg::Evcntr(4), 1));
        assert!(p.traps_to_el2(PmuReg::Evtyper(5), 0));
        assert!(!p.traps_to_el2(PmuReg::Evcntr(3), 1));
        assert!(!p.traps_to_el2(PmuReg::Evcntr(4), 2));
        assert!(!p.traps_to_el2(PmuReg::Ccntr, 1));
        p.write(PmuReg::Selr, 5, 1, &e).unwrap();
        assert!(p.traps_to_el2(PmuReg::Xevcntr, 1));
        p.write(PmuReg::Selr, 31, 1, &e).unwrap();
        assert!(!p.traps_to_el2(PmuReg::Xevtyper, 1), "PMCCFILTR");
        assert_eq!(
            p.read(PmuReg::Evcntr(4), 1, &e),
            Err(PmuError::El2Counter(4))
        );
        p.write(PmuReg::CntenClr, u64::MAX, 2, &e).unwrap();
        p.write(PmuReg::CntenSet, u64::MAX, 1, &e).unwrap();
        assert_eq!(p.read(PmuReg::CntenSet, 1, &e), Ok(0x8000_000f));
        p.write(PmuReg::CntenSet, u64::MAX, 2, &e).unwrap();
        assert_eq!(
            p.read(PmuReg::CntenSet, 1, &e),
            Ok(0x8000_003f),
            "reads see all"
        );

        // Counter 0 (EL1's) and 4 (EL2's) count instructions everywhere.
        for i in [0, 4] {
            p.write(PmuReg::Evtyper(i), evtyper::NSH | 0x08, 2, &e)
                .unwrap();
            p.write(PmuReg::Evcntr(i), 0, 2, &e).unwrap();
        }
        p.write(PmuReg::Evtyper(31), evtyper::NSH, 2, &e).unwrap();
        p.write(PmuReg::Ccntr, 0, 2, &e).unwrap();
        let run = |p: &Pmu, e: &mut Events| {
            e.instructions = [
                e.instructions[0] + 1,
                e.instructions[1] + 10,
                e.instructions[2] + 100,
            ];
            e.cycles = [e.cycles[0] + 1_000, e.cycles[1] + 10_000];
            let v = |i| p.value(i, e);
            (v(0), v(4), v(CYCLE_IDX))
        };
        p.write(PmuReg::Pmcr, pmcr::E, 2, &e).unwrap();
        assert_eq!(
            run(&p, &mut e),
            (111, 0, 11_000),
            "PMCR.E: EL1's and the cycle counter"
        );
        p.sync(&e);
        p.write_mdcr_el2(4 | HPME, &e);
        p.write(PmuReg::Pmcr, 0, 2, &e).unwrap();
        assert_eq!(run(&p, &mut e), (111, 111, 11_000), "HPME alone: EL2's");
        p.write(PmuReg::Pmcr, pmcr::E, 2, &e).unwrap();
        p.write_mdcr_el2(4 | HPME | HPMD, &e);
        assert_eq!(
            run(&p, &mut e),
            (122, 222, 12_000),
            "HPMD: not EL1's at EL2"
        );
        p.write_mdcr_el2(4 | HPME | HCCD, &e);
        assert_eq!(
            run(&p, &mut e),
            (233, 333, 13_000),
            "HCCD: not the cycles at EL2"
        );

        // PMCR.P from EL1 resets EL1's counters, from EL2 all.
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::P, 1, &e).unwrap();
        assert_eq!((p.value(0, &e), p.value(4, &e)), (0, 333));
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::P, 2, &e).unwrap();
        assert_eq!(p.value(4, &e), 0);

        // The interrupt: EL2's overflow needs HPME, EL1's PMCR.E.
        p.write(PmuReg::IntenSet, 1 << 4, 2, &e).unwrap();
        p.write(PmuReg::OvsSet, 1 << 4, 2, &e).unwrap();
        p.write(PmuReg::Pmcr, 0, 2, &e).unwrap();
        assert!(p.irq_level(), "HPME without PMCR.E");
        p.write_mdcr_el2(4, &e);
        assert!(!p.irq_level());
        p.write(PmuReg::Pmcr, pmcr::E, 2, &e).unwrap();
        assert!(!p.irq_level(), "PMCR.E does not enable EL2's");

        // Overflow at 64 bits: EL2's by HLP, EL1's by LP.
        p.write_mdcr_el2(4 | HLP, &e);
        assert_eq!(p.width_and_overflow(4), (64, 64));
        assert_eq!(p.width_and_overflow(0), (64, 32));
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::LP, 2, &e).unwrap();
        p.write_mdcr_el2(4, &e);
        assert_eq!(
            (p.width_and_overflow(0), p.width_and_overflow(4)),
            ((64, 64), (64, 32))
        );
    }

    #[test]
    fn encodings_decode_to_the_pmu_registers() {
        assert_eq!(PmuReg::decode(enc(3, 3, 9, 12, 0)), Some(PmuReg::Pmcr));
        assert_eq!(PmuReg::decode(enc(3, 0, 9, 14, 1)), Some(PmuReg::IntenSet));
        assert_eq!(PmuReg::decode(enc(3, 3, 9, 13, 0)), Some(PmuReg::Ccntr));
        assert_eq!(PmuReg::decode(enc(3, 3, 14, 8, 0)), Some(PmuReg::Evcntr(0)));
        assert_eq!(
            PmuReg::decode(enc(3, 3, 14, 11, 6)),
            Some(PmuReg::Evcntr(30))
        );
        assert_eq!(
            PmuReg::decode(enc(3, 3, 14, 15, 7)),
            Some(PmuReg::Evtyper(31)),
            "PMCCFILTR"
        );
        assert_eq!(PmuReg::decode(enc(3, 3, 9, 12, 6)), Some(PmuReg::Ceid(0)));
        assert_eq!(PmuReg::decode(enc(3, 0, 9, 12, 0)), None);
        // Found by the property tests: there is no PMEVCNTR31_EL0; its
        // would-be encoding must not read the cycle counter.
        assert_eq!(PmuReg::decode(enc(3, 3, 14, 11, 7)), None);
        assert_eq!(PmuReg::decode(enc(2, 3, 9, 12, 0)), None);
    }

    #[test]
    fn reset_state_is_kvms_unknown_pattern_and_pmcr_reads_n() {
        let p = Pmu::new(PmuConfig::DEFAULT);
        let e = Events::default();
        assert_eq!(p.read(PmuReg::Pmcr, 1, &e), Ok(6 << 11));
        assert_eq!(p.read(PmuReg::CntenSet, 1, &e), Ok(0x8000_001e));
        assert_eq!(p.read(PmuReg::OvsSet, 1, &e), Ok(0x8000_001e));
        assert_eq!(p.read(PmuReg::Selr, 1, &e), Ok(0x1e));
        assert_eq!(p.read(PmuReg::Evtyper(0), 1, &e), Ok(0xc000_c0de));
        assert_eq!(p.read(PmuReg::Evtyper(31), 1, &e), Ok(0), "PMCCFILTR");
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e), Ok(0xdbad_c0de));
        assert!(!p.irq_level(), "E is 0");
        let none = Pmu::new(PmuConfig {
            counters: None,
            ..PmuConfig::DEFAULT
        });
        assert_eq!(none.read(PmuReg::Pmcr, 1, &e), Err(PmuError::NoPmu));
    }

    #[test]
    fn counters_count_their_event_through_the_el_filter_when_enabled() {
        let mut p = pmu();
        let e0 = ev(1000, 500);
        p.write(PmuReg::Evtyper(0), u64::from(event::INST_RETIRED), 1, &e0)
            .unwrap();
        p.write(
            PmuReg::Evtyper(1),
            evtyper::P | u64::from(event::BR_RETIRED),
            1,
            &e0,
        )
        .unwrap();
        p.write(
            PmuReg::Evtyper(2),
            evtyper::U | u64::from(event::MEM_ACCESS),
            1,
            &e0,
        )
        .unwrap();
        for i in 0..3 {
            p.write(PmuReg::Evcntr(i), 0, 1, &e0).unwrap();
        }
        p.write(PmuReg::CntenSet, 0b111 | 1 << 31, 1, &e0).unwrap();
        let e1 = ev(1400, 800);
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e1), Ok(0), "PMCR.E is 0");
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::C, 1, &e1).unwrap();
        let e2 = ev(1800, 1100);
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e2), Ok(400 + 300));
        assert_eq!(
            p.read(PmuReg::Evcntr(1), 1, &e2),
            Ok(100),
            "EL0 branches only"
        );
        assert_eq!(
            p.read(PmuReg::Evcntr(2), 1, &e2),
            Ok(100),
            "EL1 accesses only"
        );
        assert_eq!(p.read(PmuReg::Ccntr, 1, &e2), Ok(2 * 700), "C reset it");
        assert_eq!(
            p.read(PmuReg::Pmcr, 1, &e2),
            Ok(pmcr::E | 6 << 11),
            "C reads 0"
        );
        // P resets the event counters, not the cycle counter.
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::P, 1, &e2).unwrap();
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e2), Ok(0));
        assert_eq!(p.read(PmuReg::Ccntr, 1, &e2), Ok(1400));
        // Unknown events keep their value.
        p.write(PmuReg::Evtyper(3), 0x40, 1, &e2).unwrap();
        p.write(PmuReg::Evcntr(3), 77, 1, &e2).unwrap();
        p.write(PmuReg::CntenSet, 1 << 3, 1, &e2).unwrap();
        assert_eq!(p.read(PmuReg::Evcntr(3), 1, &ev(9000, 9000)), Ok(77));
    }

    #[test]
    fn overflow_at_32_bits_sets_pmovs_and_the_irq_follows_kvm() {
        let mut p = pmu();
        let e0 = ev(0, 0);
        p.write(PmuReg::Evtyper(0), u64::from(event::INST_RETIRED), 1, &e0)
            .unwrap();
        p.write(PmuReg::Evcntr(0), 0xffff_fff0, 1, &e0).unwrap();
        p.write(PmuReg::CntenSet, 1, 1, &e0).unwrap();
        p.write(PmuReg::IntenSet, 1, 1, &e0).unwrap();
        p.write(PmuReg::Pmcr, pmcr::E, 1, &e0).unwrap();
        assert_eq!(p.until_overflow(&e0), Some(16));
        let e1 = ev(20, 0);
        // PMUv3p5 without LP: 64 bits wide, overflow flagged at 32.
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e1), Ok(0x1_0000_0004));
        assert_eq!(p.read(PmuReg::OvsSet, 1, &e1), Ok(1), "seen before a sync");
        assert!(p.sync(&e1).irq);
        // Current KVM: the level ignores PMCNTENSET.
        p.write(PmuReg::CntenClr, 1, 1, &e1).unwrap();
        assert!(p.irq_level());
        p.write(PmuReg::OvsClr, 1, 1, &e1).unwrap();
        assert!(!p.irq_level());
        // LP: 64-bit overflow; without PMUv3p5 LP is RES0 and 32-bit counters.
        let mut q = Pmu::new(PmuConfig {
            counters: Some(2),
            v3p5: false,
            el2: false,
        });
        q.write(PmuReg::Pmcr, pmcr::LP, 1, &e0).unwrap();
        assert_eq!(q.read(PmuReg::Pmcr, 1, &e0), Ok(2 << 11));
        q.write(PmuReg::Evcntr(0), u64::MAX, 1, &e0).unwrap();
        assert_eq!(q.read(PmuReg::Evcntr(0), 1, &e0), Ok(0xffff_ffff));
    }

    #[test]
    fn sw_incr_and_chain() {
        let mut p = pmu();
        let e = Events::default();
        p.write(PmuReg::Evtyper(0), u64::from(event::SW_INCR), 1, &e)
            .unwrap();
        p.write(PmuReg::Evtyper(1), u64::from(event::CHAIN), 1, &e)
            .unwrap();
        p.write(PmuReg::Evcntr(0), 0xffff_fffe, 1, &e).unwrap();
        p.write(PmuReg::Evcntr(1), 7, 1, &e).unwrap();
        // Without PMCR.E nothing counts.
        p.write(PmuReg::CntenSet, 0b11, 1, &e).unwrap();
        p.write(PmuReg::Swinc, 1, 1, &e).unwrap();
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e), Ok(0xffff_fffe));
        p.write(PmuReg::Pmcr, pmcr::E, 1, &e).unwrap();
        p.write(PmuReg::Swinc, 1, 1, &e).unwrap();
        p.write(PmuReg::Swinc, 1, 1, &e).unwrap();
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e), Ok(0x1_0000_0000));
        assert_eq!(
            p.read(PmuReg::Evcntr(1), 1, &e),
            Ok(8),
            "CHAIN took the overflow"
        );
        assert_eq!(p.read(PmuReg::OvsSet, 1, &e), Ok(1));
        // CHAIN of a counted event: the odd counter counts the even one's
        // 32-bit overflows, lazily.
        let mut q = pmu();
        let e0 = ev(0, 0);
        q.write(PmuReg::Evtyper(2), u64::from(event::INST_RETIRED), 1, &e0)
            .unwrap();
        q.write(PmuReg::Evtyper(3), u64::from(event::CHAIN), 1, &e0)
            .unwrap();
        q.write(PmuReg::Evcntr(2), 0xffff_ff00, 1, &e0).unwrap();
        q.write(PmuReg::Evcntr(3), 0, 1, &e0).unwrap();
        q.write(PmuReg::CntenSet, 0b1100, 1, &e0).unwrap();
        q.write(PmuReg::Pmcr, pmcr::E, 1, &e0).unwrap();
        let e1 = ev(0x100, 0);
        assert_eq!(q.read(PmuReg::Evcntr(3), 1, &e1), Ok(1));
        q.sync(&e1);
        assert_eq!(q.read(PmuReg::Evcntr(3), 1, &ev(0x1_0000_0100, 0)), Ok(2));
        // With LP (64-bit overflow) nothing chains.
        q.write(PmuReg::Pmcr, pmcr::E | pmcr::LP, 1, &e1).unwrap();
        assert_eq!(q.read(PmuReg::Evcntr(3), 1, &ev(0x3_0000_0000, 0)), Ok(1));
    }

    #[test]
    fn loads_stores_and_exceptions_count_by_el_and_only_memory_events_need_blocks() {
        let mut p = pmu();
        let e0 = Events::default();
        p.write(PmuReg::Pmcr, pmcr::E, 1, &e0).unwrap();
        p.write(PmuReg::Evtyper(0), u64::from(event::LD_RETIRED), 1, &e0)
            .unwrap();
        p.write(
            PmuReg::Evtyper(1),
            evtyper::P | u64::from(event::ST_RETIRED),
            1,
            &e0,
        )
        .unwrap();
        p.write(PmuReg::Evtyper(2), u64::from(event::EXC_TAKEN), 1, &e0)
            .unwrap();
        for i in 0..3 {
            p.write(PmuReg::Evcntr(i), 0, 1, &e0).unwrap();
        }
        p.write(PmuReg::CntenSet, 0b011, 1, &e0).unwrap();
        assert!(p.counts_mem() && p.counts_retired() && !p.counts_exceptions());
        p.write(PmuReg::CntenSet, 0b100, 1, &e0).unwrap();
        assert!(p.counts_exceptions());
        let e = Events {
            loads: [3, 40, 0],
            stores: [5, 60, 0],
            exceptions: [1, 2, 0],
            ..Events::default()
        };
        assert_eq!(p.read(PmuReg::Evcntr(0), 1, &e), Ok(43));
        assert_eq!(
            p.read(PmuReg::Evcntr(1), 1, &e),
            Ok(5),
            "P: EL0 stores only"
        );
        assert_eq!(p.read(PmuReg::Evcntr(2), 1, &e), Ok(3));
        // The PMI budget covers the per-instruction events, not exceptions.
        p.write(PmuReg::IntenSet, 0b111, 1, &e).unwrap();
        p.write(PmuReg::Evcntr(0), 0xffff_fff0, 1, &e).unwrap();
        p.write(PmuReg::Evcntr(2), 0xffff_ffff, 1, &e).unwrap();
        assert_eq!(p.until_overflow(&e), Some(16));
        p.write(PmuReg::CntenClr, 0b011, 1, &e).unwrap();
        assert!(!p.counts_mem() && !p.counts_retired() && p.counts_exceptions());
    }

    #[test]
    fn pmselr_indirection_and_missing_counters_undef() {
        let mut p = pmu();
        let e = Events::default();
        p.write(PmuReg::Selr, 0xffff_ff02, 1, &e).unwrap();
        assert_eq!(p.read(PmuReg::Selr, 1, &e), Ok(2));
        p.write(
            PmuReg::Xevtyper,
            u64::from(event::CPU_CYCLES) | 1 << 29,
            1,
            &e,
        )
        .unwrap();
        assert_eq!(
            p.read(PmuReg::Evtyper(2), 1, &e),
            Ok(u64::from(event::CPU_CYCLES)),
            "NSK is RES0"
        );
        p.write(PmuReg::Selr, 31, 1, &e).unwrap();
        p.write(PmuReg::Xevtyper, evtyper::U, 1, &e).unwrap();
        assert_eq!(
            p.read(PmuReg::Evtyper(31), 1, &e),
            Ok(evtyper::U),
            "PMCCFILTR"
        );
        p.write(PmuReg::Selr, 6, 1, &e).unwrap();
        assert_eq!(
            p.read(PmuReg::Xevcntr, 1, &e),
            Err(PmuError::NoSuchCounter(6))
        );
        assert_eq!(
            p.read(PmuReg::Evcntr(30), 1, &e),
            Err(PmuError::NoSuchCounter(30))
        );
        assert_eq!(
            p.write(PmuReg::Ceid(0), 0, 1, &e),
            Err(PmuError::Direction(PmuReg::Ceid(0)))
        );
        assert_eq!(
            p.read(PmuReg::Swinc, 1, &e),
            Err(PmuError::Direction(PmuReg::Swinc))
        );
        let ceid = p.read(PmuReg::Ceid(0), 1, &e).unwrap();
        assert_eq!(
            ceid,
            1 | 1 << 6 | 1 << 7 | 1 << 8 | 1 << 9 | 1 << 0x11 | 1 << 0x13 | 1 << 0x1b | 1 << 30
        );
        assert_eq!(
            p.read(PmuReg::Ceid(1), 1, &e),
            Ok(1 << 1 | 1 << 3 | 1 << 4 | 1 << 28),
            "BR_RETIRED (0x21), STALL_FRONTEND (0x23), STALL_BACKEND (0x24), STALL (0x3c)"
        );
    }

    #[test]
    fn el0_access_follows_pmuserenr() {
        let mut p = pmu();
        let e = Events::default();
        assert!(p.read(PmuReg::Pmcr, 0, &e).is_err());
        assert!(
            p.write(PmuReg::Userenr, 0xf, 0, &e).is_err(),
            "never from EL0"
        );
        p.write(PmuReg::Userenr, userenr::CR | 0xf0, 1, &e).unwrap();
        assert_eq!(
            p.read(PmuReg::Userenr, 0, &e),
            Ok(userenr::CR),
            "EL0 reads PMUSERENR_EL0 (KVM's access_pmuserenr)"
        );
        assert_eq!(p.read(PmuReg::Userenr, 1, &e), Ok(userenr::CR));
        assert!(
            p.read(PmuReg::Ccntr, 0, &e).is_ok(),
            "CR: cycle counter reads"
        );
        assert!(p.write(PmuReg::Ccntr, 0, 0, &e).is_err(), "writes need EN");
        assert!(p.read(PmuReg::Evcntr(0), 0, &e).is_err());
        p.write(PmuReg::Userenr, userenr::ER | userenr::SW, 1, &e)
            .unwrap();
        assert!(p.read(PmuReg::Evcntr(0), 0, &e).is_ok());
        assert!(p.read(PmuReg::Selr, 0, &e).is_ok());
        assert!(p.write(PmuReg::Swinc, 1, 0, &e).is_ok());
        assert!(p.read(PmuReg::Pmcr, 0, &e).is_err());
        p.write(PmuReg::Userenr, userenr::EN, 1, &e).unwrap();
        assert!(p.read(PmuReg::Pmcr, 0, &e).is_ok());
        assert!(
            p.read(PmuReg::IntenSet, 0, &e).is_err(),
            "PMINTEN never from EL0"
        );
    }

    #[test]
    fn saved_registers_load_into_another_engine_and_count_on() {
        let mut p = pmu();
        let e0 = ev(100, 100);
        p.write(PmuReg::Evtyper(0), u64::from(event::INST_RETIRED), 1, &e0)
            .unwrap();
        p.write(PmuReg::Evcntr(0), 0xffff_fff0, 1, &e0).unwrap();
        p.write(PmuReg::CntenSet, 1 | 1 << 31, 1, &e0).unwrap();
        p.write(PmuReg::IntenSet, 1, 1, &e0).unwrap();
        p.write(PmuReg::Pmcr, pmcr::E, 1, &e0).unwrap();
        let e1 = ev(110, 110);
        let saved = p.save_regs(&e1);
        assert_eq!(saved[38], 0x1_0000_0004, "20 more: wrapped at 32 bits");
        assert_eq!(saved[3], 1, "the overflow not yet synced is saved");
        let mut q = Pmu::new(PmuConfig::DEFAULT);
        let f0 = ev(5, 5);
        assert!(
            q.load_regs(&saved, &f0).irq,
            "the interrupt is pending again"
        );
        assert_eq!(q.read(PmuReg::Evcntr(0), 1, &ev(6, 6)), Ok(0x1_0000_0006));
        assert_eq!(q.save_regs(&f0), saved, "a round trip changes nothing");
        let mut bad = saved;
        bad[0] |= pmcr::P | 0xff00;
        bad[1] |= 1 << 20;
        q.load_regs(&bad, &f0);
        assert_eq!(q.read(PmuReg::Pmcr, 1, &f0), Ok(pmcr::E | 6 << 11));
        assert_eq!(q.read(PmuReg::CntenSet, 1, &f0), Ok(1 | 1 << 31));
    }

    #[test]
    fn cycle_counters_with_an_interrupt_tell_how_many_cycles_are_left() {
        let mut p = pmu();
        let e0 = ev(0, 0);
        assert_eq!(p.cycles_until_overflow(&e0), None);
        p.write(PmuReg::Ccntr, 0xffff_ff00, 1, &e0).unwrap();
        p.write(PmuReg::CntenSet, 1 << 31, 1, &e0).unwrap();
        p.write(PmuReg::Pmcr, pmcr::E, 1, &e0).unwrap();
        assert_eq!(p.cycles_until_overflow(&e0), None, "no interrupt enabled");
        p.write(PmuReg::IntenSet, 1 << 31, 1, &e0).unwrap();
        assert_eq!(
            p.cycles_until_overflow(&e0),
            Some(0x100),
            "32-bit overflow (LC=0)"
        );
        assert_eq!(p.cycles_until_overflow(&ev(10, 10)), Some(0x100 - 40));
        p.write(PmuReg::Pmcr, pmcr::E | pmcr::LC, 1, &e0).unwrap();
        assert_eq!(
            p.cycles_until_overflow(&e0),
            Some(u64::MAX - 0xffff_ff00 + 1)
        );
    }
}
