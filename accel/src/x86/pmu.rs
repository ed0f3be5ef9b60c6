//! Intel architectural PMU (version 2) as KVM gives it to a guest: CPUID
//! leaf 0xA, the PMU MSRs with their #GP rules, RDPMC, and counters computed
//! lazily from per-vCPU event totals.
//!
//! Spec: Intel SDM vol. 3 ch. 20 ("Architectural Performance Monitoring",
//! versions 1 and 2; Figure 20-1 IA32_PERFEVTSELx, Figure 20-2
//! IA32_FIXED_CTR_CTRL, §20.2.2 GLOBAL_CTRL/STATUS/OVF_CTRL, Table 20-1
//! architectural events); Linux `arch/x86/kvm/pmu.c`, `pmu.h`,
//! `vmx/pmu_intel.c` (`intel_pmu_set_msr`, `intel_pmu_get_msr`,
//! `intel_pmu_refresh`, `kvm_pmu_rdpmc`).
//!
//! Counting model: the accelerator keeps, per vCPU, monotonic totals of the
//! events rustkvm counts ([`Events`]: retired instructions and branches split
//! by privilege, unhalted and reference cycles). A counter stores its value
//! at the last *sync* and the event total then; its value now is that plus
//! the events since, if it was counting. Nothing is done per event: a
//! counter is only touched when the guest reads it or changes what it
//! counts (KVM's lesson from `pmc->is_paused`). Overflow is found at those
//! points and from [`Pmu::until_overflow`], which tells the accelerator how
//! many instructions may run before a counter wraps (for a zero-skid PMI).
//!
//! The totals come from QEMU's counting engine ([`Counting`], shared with
//! the generated code: each translation block adds its instruction and
//! branch counts when counters count, see `docs/pmu.md`); cycles come from
//! the time the vCPU spends in guest code.

use crate::x86::pebs::{self, Pebs};
use crate::x86::X86Error;

/// IA32_PMC0: general-purpose counters, 0xC1 + i (writes sign-extend bit 31).
pub const MSR_IA32_PMC0: u32 = 0xc1;
/// IA32_PERFEVTSEL0: event selects, 0x186 + i.
pub const MSR_IA32_PERFEVTSEL0: u32 = 0x186;
/// IA32_PERF_CAPABILITIES (bit 13: FW_WRITE, full-width counter writes).
pub const MSR_IA32_PERF_CAPABILITIES: u32 = 0x345;
/// IA32_FIXED_CTR0..2: instructions, core cycles, reference cycles.
pub const MSR_CORE_PERF_FIXED_CTR0: u32 = 0x309;
/// IA32_FIXED_CTR_CTRL: 4 bits per fixed counter.
pub const MSR_CORE_PERF_FIXED_CTR_CTRL: u32 = 0x38d;
/// IA32_PERF_GLOBAL_STATUS (read-only).
pub const MSR_CORE_PERF_GLOBAL_STATUS: u32 = 0x38e;
/// IA32_PERF_GLOBAL_CTRL.
pub const MSR_CORE_PERF_GLOBAL_CTRL: u32 = 0x38f;
/// IA32_PERF_GLOBAL_OVF_CTRL (write 1 to clear a status bit; reads 0).
pub const MSR_CORE_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
/// IA32_A_PMC0: full-width aliases of the GP counters, 0x4C1 + i.
pub const MSR_IA32_PMC0_FULL: u32 = 0x4c1;
/// RDPMC ECX[31:16]: the counter type (architectural PMUs, SDM RDPMC).
pub const RDPMC_TYPE_MASK: u32 = 0xffff_0000;
/// RDPMC ECX[15:0]: the counter index within its type.
pub const RDPMC_INDEX_MASK: u32 = 0xffff;
/// RDPMC type: the general-purpose counters.
pub const RDPMC_TYPE_GP: u32 = 0;
/// RDPMC type: the fixed counters (ECX bit 30).
pub const RDPMC_TYPE_FIXED: u32 = 1 << 30;
/// IA32_PERF_GLOBAL_STATUS.OvfBuf (bit 62), clearable through OVF_CTRL.
pub const GLOBAL_OVF_BUF: u64 = 1 << 62;
/// IA32_PERF_GLOBAL_STATUS.CondChgd (bit 63), clearable through OVF_CTRL.
pub const GLOBAL_COND_CHGD: u64 = 1 << 63;
/// PERF_CAPABILITIES.FW_WRITE.
pub const PERF_CAP_FW_WRITES: u64 = 1 << 13;
/// PERF_CAPABILITIES[5:0] LBR_FMT (SDM vol. 3B 18.4.8.1, `PERF_CAP_LBR_FMT`).
pub const PERF_CAP_LBR_FMT: u64 = 0x3f;

/// AMD MSR_K7_EVNTSEL0: legacy event selects, 0xC0010000 + i (i < 4).
pub const MSR_K7_EVNTSEL0: u32 = 0xc001_0000;
/// AMD MSR_K7_PERFCTR0: legacy counters, 0xC0010004 + i (i < 4).
pub const MSR_K7_PERFCTR0: u32 = 0xc001_0004;
/// AMD MSR_F15H_PERF_CTL0: PerfCtrExtCore selects, 0xC0010200 + 2i; the
/// counters are interleaved at 0xC0010201 + 2i (APM vol. 2 §13.2).
pub const MSR_F15H_PERF_CTL0: u32 = 0xc001_0200;
/// AMD PerfMonV2 MSR_AMD64_PERF_CNTR_GLOBAL_STATUS (read-only: guest
/// writes are ignored).
pub const MSR_AMD64_GLOBAL_STATUS: u32 = 0xc000_0300;
/// AMD PerfMonV2 MSR_AMD64_PERF_CNTR_GLOBAL_CTL.
pub const MSR_AMD64_GLOBAL_CTL: u32 = 0xc000_0301;
/// AMD PerfMonV2 MSR_AMD64_PERF_CNTR_GLOBAL_STATUS_CLR (write 1 to clear).
pub const MSR_AMD64_GLOBAL_STATUS_CLR: u32 = 0xc000_0302;
/// AMD PerfMonV2 MSR_AMD64_PERF_CNTR_GLOBAL_STATUS_SET (write 1 to set;
/// reads 0).
pub const MSR_AMD64_GLOBAL_STATUS_SET: u32 = 0xc000_0303;
/// Bits KVM drops from AMD event-select writes (`amd_pmu_refresh`:
/// `reserved_bits`; bits 19, 21 and 36–63, so also HostOnly/GuestOnly).
pub const AMD_EVTSEL_RESERVED: u64 = 0xffff_fff0_0028_0000;
/// AMD PerfEvtSeln bit 40, GuestOnly: with EFER.SVME, count only in SVM
/// guest mode (AMD APM vol. 2 §13.2.4 and vol. 3 PerfEvtSeln "HG_ONLY";
/// Linux `AMD64_EVENTSEL_GUESTONLY`).
pub const AMD_EVTSEL_GUESTONLY: u64 = 1 << 40;
/// AMD PerfEvtSeln bit 41, HostOnly: with EFER.SVME, count only outside
/// SVM guest mode (`AMD64_EVENTSEL_HOSTONLY`).
pub const AMD_EVTSEL_HOSTONLY: u64 = 1 << 41;
/// Most GP counters an AMD PMU has (KVM_MAX_NR_AMD_GP_COUNTERS).
pub const MAX_AMD_GP: usize = 6;

/// Counter width (GP and fixed), as KVM on current Intel hosts.
pub const COUNTER_WIDTH: u32 = 48;
/// Largest number of GP counters KVM offers (KVM_INTEL_PMC_MAX_GENERIC).
pub const MAX_GP: usize = 8;
/// Fixed counters of an architectural PMU v2 (KVM_MAX_NR_INTEL_FIXED_COUTNERS
/// is larger, but version 2 defines three).
pub const NUM_FIXED: usize = 3;
/// Reserved IA32_PERFEVTSELx bits: the high dword and AnyThread (bit 21),
/// `pmu->reserved_bits` in `intel_pmu_refresh`.
pub const EVTSEL_RESERVED: u64 = 0xffff_ffff_0020_0000;
/// IA32_PERFEVTSELx bit 34, ADAPTIVE: the counter's PEBS records carry
/// MSR_PEBS_DATA_CFG's groups (`ICL_EVENTSEL_ADAPTIVE`; writable with the
/// PEBS baseline).
pub const EVTSEL_ADAPTIVE: u64 = 1 << 34;

/// IA32_PERFEVTSELx fields (SDM Figure 20-1).
pub mod evtsel {
    /// Event select, bits 0..7.
    pub const EVENT: u64 = 0xff;
    /// Unit mask, bits 8..15.
    pub const UMASK: u64 = 0xff << 8;
    /// Count at CPL > 0.
    pub const USR: u64 = 1 << 16;
    /// Count at CPL 0.
    pub const OS: u64 = 1 << 17;
    /// Edge detect.
    pub const EDGE: u64 = 1 << 18;
    /// APIC interrupt (PMI) on overflow.
    pub const INT: u64 = 1 << 20;
    /// Enable.
    pub const EN: u64 = 1 << 22;
    /// Invert the counter-mask comparison.
    pub const INV: u64 = 1 << 23;
    /// Counter mask, bits 24..31.
    pub const CMASK: u64 = 0xff << 24;
}

/// An event rustkvm counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Instructions retired (event C0H umask 00H; fixed counter 0).
    Instructions,
    /// Branch instructions retired (C4H/00H).
    Branches,
    /// Unhalted core cycles (3CH/00H; fixed counter 1).
    Cycles,
    /// Unhalted reference cycles (3CH/01H; fixed counter 2).
    RefCycles,
    /// Memory instructions of the classes in the mask ([`mem`]): AMD's
    /// LsDispatch (PMCx029, umask = the mask), Intel's
    /// MEM_INST_RETIRED.ALL_LOADS / ALL_STORES (D0H/81H, D0H/82H).
    Mem(u8),
}

/// [`Event::Mem`]'s classes: each memory instruction is in one, by the
/// loads and stores its translation makes (docs/pmu.md, "Memory events").
/// The bits are AMD's PMCx029 LsDispatch unit mask (PPR for AMD Family
/// 17h, "Core::X86::Pmc::Core::LsDispatch").
pub mod mem {
    /// LdDispatch: it loads and does not store.
    pub const LOAD: u8 = 1 << 0;
    /// StDispatch: it stores and does not load.
    pub const STORE: u8 = 1 << 1;
    /// LdStDispatch: it loads and stores (load-op-store, an atomic).
    pub const LOAD_STORE: u8 = 1 << 2;
    /// Every class.
    pub const ALL: u8 = LOAD | STORE | LOAD_STORE;
}

impl Event {
    /// The event a PERFEVTSEL value selects, if rustkvm counts it.
    pub fn from_evtsel(v: u64) -> Option<Event> {
        match (v & evtsel::EVENT, (v & evtsel::UMASK) >> 8) {
            (0xc0, 0x00) => Some(Event::Instructions),
            (0xc4, 0x00) => Some(Event::Branches),
            (0x3c, 0x00) => Some(Event::Cycles),
            (0x3c, 0x01) => Some(Event::RefCycles),
            // MEM_INST_RETIRED.ALL_LOADS, .ALL_STORES (SDM vol. 3B,
            // Skylake and later; Linux's perf tables for Icelake-Server).
            (0xd0, 0x81) => Some(Event::Mem(mem::LOAD | mem::LOAD_STORE)),
            (0xd0, 0x82) => Some(Event::Mem(mem::STORE | mem::LOAD_STORE)),
            _ => None,
        }
    }

    /// The event an AMD PerfEvtSel value selects, if rustkvm counts it:
    /// EventSelect is bits 7:0 and 35:32 (APM vol. 2 §13.2.1; Linux's
    /// `amd_zen1_perfmon_event_map`).
    pub fn from_amd_evtsel(v: u64) -> Option<Event> {
        let event = (v & 0xff) | ((v >> 24) & 0xf00);
        match (event, (v & evtsel::UMASK) >> 8) {
            (0xc0, 0x00) => Some(Event::Instructions),
            (0xc2, 0x00) => Some(Event::Branches),
            (0x76, 0x00) => Some(Event::Cycles),
            // LsDispatch: the classes its unit mask names (bits 7:3 are
            // reserved: such a select counts nothing, as an unknown one).
            (0x29, m) if m != 0 && m & !u64::from(mem::ALL) == 0 => Some(Event::Mem(m as u8)),
            _ => None,
        }
    }

    /// The event of fixed counter `i`.
    pub fn fixed(i: usize) -> Event {
        match i {
            0 => Event::Instructions,
            1 => Event::Cycles,
            _ => Event::RefCycles,
        }
    }
}

/// Monotonic per-vCPU event totals the accelerator maintains.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// Instructions retired at CPL > 0 and at CPL 0.
    pub instructions: [u64; 2],
    /// Branch instructions retired at CPL > 0 and at CPL 0.
    pub branches: [u64; 2],
    /// Unhalted core cycles (guest TSC rate).
    pub cycles: u64,
    /// Unhalted reference cycles (guest TSC rate).
    pub ref_cycles: u64,
    /// Instructions that load or store (or both), at CPL > 0 and at CPL 0.
    pub mem: [u64; 2],
    /// Of those, the ones that load.
    pub loads: [u64; 2],
    /// ... and the ones that store.
    pub stores: [u64; 2],
}

/// Privilege filter: count at user level, at kernel level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// CPL > 0.
    pub usr: bool,
    /// CPL 0.
    pub os: bool,
}

impl Events {
    /// The total of `event` through `filter`. Cycles are not split by
    /// privilege: either filter bit counts them.
    pub fn total(&self, event: Event, f: Filter) -> u64 {
        let split =
            |v: [u64; 2]| (if f.usr { v[0] } else { 0 }).wrapping_add(if f.os { v[1] } else { 0 });
        match event {
            Event::Instructions => split(self.instructions),
            Event::Branches => split(self.branches),
            Event::Cycles if f.usr || f.os => self.cycles,
            Event::RefCycles if f.usr || f.os => self.ref_cycles,
            Event::Mem(m) => split(self.mem_classes(m)),
            _ => 0,
        }
    }

    /// The memory instructions of the classes in `m` ([`mem`]), at CPL > 0
    /// and CPL 0. The totals count each memory instruction once, and again
    /// among the loads and the stores as it does: loads only are the
    /// memory instructions less the storing ones, and both are the loads
    /// plus the stores less the memory instructions (wrapping: the totals
    /// are monotonic, their differences exact modulo 2^64).
    fn mem_classes(&self, m: u8) -> [u64; 2] {
        let mut v = [0u64; 2];
        for (k, v) in v.iter_mut().enumerate() {
            let (all, ld, st) = (self.mem[k], self.loads[k], self.stores[k]);
            if m & mem::LOAD != 0 {
                *v = v.wrapping_add(all.wrapping_sub(st));
            }
            if m & mem::STORE != 0 {
                *v = v.wrapping_add(all.wrapping_sub(ld));
            }
            if m & mem::LOAD_STORE != 0 {
                *v = v.wrapping_add(ld.wrapping_add(st).wrapping_sub(all));
            }
        }
        v
    }
}

/// Every MSR index of the architectural PMU rustkvm implements, whatever
/// the configuration: with no PMU (or beyond the configured counters) KVM
/// answers these with #GP, where stock TCG reads 0 and ignores writes.
pub fn is_arch_pmu_msr(index: u32) -> bool {
    let gp = MAX_GP as u32;
    (MSR_IA32_PMC0..MSR_IA32_PMC0 + gp).contains(&index)
        || (MSR_IA32_PERFEVTSEL0..MSR_IA32_PERFEVTSEL0 + gp).contains(&index)
        || (MSR_IA32_PMC0_FULL..MSR_IA32_PMC0_FULL + gp).contains(&index)
        || (MSR_CORE_PERF_FIXED_CTR0..MSR_CORE_PERF_FIXED_CTR0 + NUM_FIXED as u32).contains(&index)
        || (MSR_CORE_PERF_FIXED_CTR_CTRL..=MSR_CORE_PERF_GLOBAL_OVF_CTRL).contains(&index)
        || index == MSR_IA32_PERF_CAPABILITIES
        || (MSR_K7_EVNTSEL0..MSR_K7_PERFCTR0 + 4).contains(&index)
        || (MSR_F15H_PERF_CTL0..MSR_F15H_PERF_CTL0 + 2 * MAX_AMD_GP as u32).contains(&index)
        || (MSR_AMD64_GLOBAL_STATUS..=MSR_AMD64_GLOBAL_STATUS_SET).contains(&index)
        || Pebs::owns(index)
}

/// Whether writing `value` to `index` could make a counter count cycles
/// (so the write needs the cycle totals): the controls, and event selects
/// that select event 3CH.
pub fn may_start_cycles(index: u32, value: u64) -> bool {
    let amd_select = (MSR_K7_EVNTSEL0..MSR_K7_EVNTSEL0 + 4).contains(&index)
        || ((MSR_F15H_PERF_CTL0..MSR_F15H_PERF_CTL0 + 2 * MAX_AMD_GP as u32).contains(&index)
            && index & 1 == 0);
    matches!(
        index,
        MSR_CORE_PERF_FIXED_CTR_CTRL | MSR_CORE_PERF_GLOBAL_CTRL | MSR_AMD64_GLOBAL_CTL
    ) || ((MSR_IA32_PERFEVTSEL0..MSR_IA32_PERFEVTSEL0 + MAX_GP as u32).contains(&index)
        && value & evtsel::EVENT == 0x3c)
        || (amd_select && value & evtsel::EVENT == 0x76)
}

/// The legacy counter MSRs KVM answers even when the PMU does not have
/// them: they read 0 and writes are ignored (`kvm_get_msr_common`,
/// `kvm_set_msr_common`: MSR_P6_PERFCTR0..1, MSR_P6_EVNTSEL0..1 and AMD's
/// MSR_K7_EVNTSEL0..3, MSR_K7_PERFCTR0..3). Every other PMU MSR #GPs.
pub fn kvm_reads_as_zero(index: u32) -> bool {
    matches!(index, 0xc1 | 0xc2 | 0x186 | 0x187) || (0xc001_0000..=0xc001_0007).contains(&index)
}

/// The counting engine's per-vCPU state, shared with QEMU's generated code
/// (`RustkvmCounting` in `rustkvm.h`, which lives in QEMU's `CPUState`; the
/// FFI layer checks the layouts agree). Only the vCPU's thread touches it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counting {
    /// Instructions retired at CPL > 0, at CPL 0; branches at CPL > 0,
    /// CPL 0; load/store instructions, loads, stores and (arm64)
    /// exceptions taken, each at EL0, EL1 (`RUSTKVM_EV_*`), as of the last
    /// [`Counting::arm`]: the instructions and branches since are in
    /// `acc` ([`Counting::totals`] adds them).
    pub events: [u64; 12],
    /// Instructions that may retire before a PMI can be due (`i64::MAX`:
    /// none armed); [`Counting::arm`] gives it to the engine in `acc[0]`,
    /// and the engine calls back when it is spent.
    pub budget: i64,
    /// The block being entered: its instruction count (engine-owned).
    pub tb_insns: u32,
    /// The block being entered: its branch count (engine-owned).
    pub tb_branches: u32,
    /// The block being entered: its load/store count (engine-owned).
    pub tb_mem: u32,
    /// The block being entered: its loads (engine-owned).
    pub tb_loads: u32,
    /// The block being entered: its stores (engine-owned).
    pub tb_stores: u32,
    /// The block being entered: 1 if its events are privileged
    /// (engine-owned).
    pub tb_priv: u32,
    /// What blocks do ([`ACTIVE_RETIRED`], [`ACTIVE_MEM`], [`ACTIVE_LBR`]): the engine
    /// translates blocks that count, or report taken branches, only then.
    pub active: u32,
    /// Nonzero when a PMI is due (the engine delivers it and clears this).
    pub pmi: u32,
    /// When a cycle counter with a PMI may wrap (VM clock ns; -1: none):
    /// the engine arms a timer that calls back then.
    pub cycles_deadline_ns: i64,
    /// Nonzero when PEBS records are owed: the engine calls back with the
    /// vCPU's state (`rustkvm_x86_pebs_write`).
    pub pebs_due: u32,
    /// The entered block's last instruction's offset from its first
    /// (engine-owned).
    pub tb_last_ofs: u32,
    /// The engine's sums since the last [`Counting::arm`]: each block adds
    /// its instructions shifted by [`ACC_INSNS_SHIFT`] plus its branches.
    /// `acc[0]` takes every block and carries the budget (spent once it is
    /// no longer negative as an `i64`), `acc[1]` privileged blocks only.
    pub acc: [u64; 2],
    /// `acc` as [`Counting::arm`] left it.
    pub acc_armed: [u64; 2],
}

/// [`Counting::acc`]: a block's instructions are added from this bit up,
/// its branches below it (`RUSTKVM_ACC_INSNS_SHIFT`).
pub const ACC_INSNS_SHIFT: u32 = 32;
/// [`Counting::acc`]'s branch half is armed at this bias, so that the
/// engine's taking back a block's branches never borrows from the
/// instruction half (`RUSTKVM_ACC_BIAS`).
pub const ACC_BIAS: u64 = 1 << 31;
/// The largest budget `acc[0]` is armed with: no PMI armed means a sync
/// every this many instructions (`RUSTKVM_ACC_BUDGET_MAX`).
pub const ACC_BUDGET_MAX: i64 = 1 << 30;

/// [`Counting::active`]: blocks count instructions and branches
/// (`RUSTKVM_ACTIVE_RETIRED`).
pub const ACTIVE_RETIRED: u32 = 1;
/// [`Counting::active`]: blocks add their loads and stores
/// (`RUSTKVM_ACTIVE_MEM`; with [`ACTIVE_RETIRED`]).
pub const ACTIVE_MEM: u32 = 2;
/// [`Counting::active`]: blocks report taken branches to the LBR
/// (`RUSTKVM_ACTIVE_LBR`).
pub const ACTIVE_LBR: u32 = 8;

impl Default for Counting {
    fn default() -> Self {
        let mut c = Counting {
            events: [0; 12],
            budget: i64::MAX,
            tb_insns: 0,
            tb_branches: 0,
            tb_mem: 0,
            tb_loads: 0,
            tb_stores: 0,
            tb_priv: 0,
            active: 0,
            pmi: 0,
            cycles_deadline_ns: -1,
            pebs_due: 0,
            tb_last_ofs: 0,
            acc: [ACC_BIAS; 2],
            acc_armed: [ACC_BIAS; 2],
        };
        c.arm();
        c
    }
}

impl Counting {
    /// The instructions and branches the engine added to `acc[k]` since
    /// it was armed (negative if it took back more than it added).
    fn acc_since_armed(&self, k: usize) -> (i64, i64) {
        // Two's complement: the low half is the branches (signed: the bias
        // keeps it from borrowing), the rest the instructions.
        let d = self.acc[k].wrapping_sub(self.acc_armed[k]) as i64;
        let branches = i64::from(d as i32);
        (d.wrapping_sub(branches) >> ACC_INSNS_SHIFT, branches)
    }

    /// The event totals now (`RUSTKVM_EV_*`): `events` plus what `acc`
    /// added since it was armed.
    pub fn totals(&self) -> [u64; 12] {
        let (insns, branches) = self.acc_since_armed(0);
        let (kinsns, kbranches) = self.acc_since_armed(1);
        let mut e = self.events;
        for (i, d) in [insns - kinsns, kinsns, branches - kbranches, kbranches]
            .into_iter()
            .enumerate()
        {
            e[i] = e[i].wrapping_add_signed(d);
        }
        e
    }

    /// Fold `acc` into `events` and arm it again with `budget` (at most
    /// [`ACC_BUDGET_MAX`]).
    pub fn arm(&mut self) {
        self.events = self.totals();
        let budget = self.budget.clamp(0, ACC_BUDGET_MAX);
        self.acc = [
            (budget.wrapping_neg() as u64) << ACC_INSNS_SHIFT | ACC_BIAS,
            ACC_BIAS,
        ];
        self.acc_armed = self.acc;
    }
}

impl Counting {
    /// The event totals, with `cycles` unhalted (and reference) cycles.
    pub fn events(&self, cycles: u64) -> Events {
        let e = self.totals();
        Events {
            instructions: [e[0], e[1]],
            branches: [e[2], e[3]],
            cycles,
            ref_cycles: cycles,
            mem: [e[4], e[5]],
            loads: [e[6], e[7]],
            stores: [e[8], e[9]],
        }
    }

    /// Tell the engine what `pmu` needs after it changed or synced with
    /// `ev`: whether blocks must count and report taken branches
    /// (`lbr_recording`), the next PMI budget, and a PMI if `pmi` (counters
    /// that overflowed with their PMI enabled) is not 0.
    pub fn publish(&mut self, pmu: &Pmu, ev: &Events, pmi: u64, lbr_recording: bool) {
        self.active = if pmu.counts_retired() {
            ACTIVE_RETIRED
        } else {
            0
        } | if pmu.counts_mem() { ACTIVE_MEM } else { 0 }
            | if lbr_recording { ACTIVE_LBR } else { 0 };
        self.budget = pmu
            .until_overflow(ev)
            .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
        self.arm();
        if pmi != 0 {
            self.pmi = 1;
        }
        if pmu.pebs_owed() {
            self.pebs_due = 1;
        }
    }
}

impl Counting {
    /// Whether blocks report taken branches ([`ACTIVE_LBR`]), leaving the
    /// rest as [`Counting::publish`] set it.
    pub fn set_lbr_recording(&mut self, on: bool) {
        if on {
            self.active |= ACTIVE_LBR;
        } else {
            self.active &= !ACTIVE_LBR;
        }
    }
}

/// The PMU registers as QEMU saves them (its `CPUX86State` PMU MSR homes,
/// vmstate subsection `cpu/msr_architectural_pmu`): counter values, not
/// the event totals behind them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PmuRegs {
    /// IA32_FIXED_CTR_CTRL.
    pub fixed_ctrl: u64,
    /// IA32_PERF_GLOBAL_CTRL.
    pub global_ctrl: u64,
    /// IA32_PERF_GLOBAL_STATUS (including overflows not yet synced).
    pub global_status: u64,
    /// IA32_FIXED_CTRx.
    pub fixed: [u64; NUM_FIXED],
    /// IA32_PMCx.
    pub gp: [u64; MAX_GP],
    /// IA32_PERFEVTSELx.
    pub evtsel: [u64; MAX_GP],
}

/// Whose PMU a vCPU has: the CPU model's vendor.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// Intel's architectural PMU (CPUID 0xA, IA32_* MSRs).
    #[default]
    Intel,
    /// AMD's PMU (K7 and PerfCtrExtCore MSRs, PerfMonV2).
    Amd,
}

/// The PMU a vCPU is given, from `-cpu ...,pmu=on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuConfig {
    /// Whose PMU.
    pub vendor: Vendor,
    /// PMU version: 0 (no PMU); Intel 2 (architectural PMU v2); AMD 1, or
    /// 2 with PerfMonV2 (KVM's `pmu->version` for each).
    pub version: u8,
    /// General-purpose counters (Intel 1..=8; AMD 4, 6 with
    /// PerfCtrExtCore, or CPUID 0x80000022 EBX with PerfMonV2, at most 6).
    pub gp: u8,
    /// Intel: IA32_PERF_CAPABILITIES offers FW_WRITE (full-width writes).
    pub full_width_writes: bool,
    /// AMD: PerfCtrExtCore (CPUID 0x80000001 ECX bit 23), the 0xC0010200 MSRs.
    pub perfctr_core: bool,
    /// Intel with PERF_CAPABILITIES: its LBR_FMT, 0 (no LBR) or
    /// [`crate::x86::lbr::LBR_FORMAT_INFO`] (the vCPU's LBR).
    pub lbr_format: u8,
    /// Intel with PERF_CAPABILITIES: PEBS format 4 with the baseline
    /// (`x86::pebs`).
    pub pebs: bool,
    /// AMD with SVM (CPUID 0x80000001 ECX bit 2): the event selects keep
    /// HostOnly/GuestOnly and count as the hardware does against SVM guest
    /// mode ([`SvmMode`]), for a hypervisor in the guest (nested KVM
    /// programs GuestOnly for its guests' counters). KVM 6.12 drops the two
    /// bits for every guest (`amd_pmu_refresh`'s `reserved_bits`); without
    /// SVM, so does rustkvm.
    pub host_guest: bool,
}

/// Where an AMD vCPU with SVM runs, for HostOnly/GuestOnly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SvmMode {
    /// EFER.SVME.
    pub svme: bool,
    /// In SVM guest mode (between VMRUN and #VMEXIT).
    pub guest: bool,
}

impl SvmMode {
    /// Whether an AMD event select with these HostOnly/GuestOnly bits
    /// counts now: both clear or both set count in both modes; one alone
    /// counts in its mode, and nowhere while EFER.SVME is clear (Linux's
    /// `amd_pmu_disable_virt`: "the counter will not count anything").
    pub fn counts(self, sel: u64) -> bool {
        match sel & (AMD_EVTSEL_HOSTONLY | AMD_EVTSEL_GUESTONLY) {
            AMD_EVTSEL_GUESTONLY => self.svme && self.guest,
            AMD_EVTSEL_HOSTONLY => self.svme && !self.guest,
            _ => true,
        }
    }
}

impl PmuConfig {
    /// No PMU (`pmu=off`): CPUID 0xA is 0, every PMU MSR #GPs.
    pub const OFF: PmuConfig = PmuConfig {
        vendor: Vendor::Intel,
        version: 0,
        gp: 0,
        full_width_writes: false,
        perfctr_core: false,
        lbr_format: 0,
        pebs: false,
        host_guest: false,
    };
    /// KVM's default Intel PMU: version 2, 4 GP counters, full-width writes.
    pub const DEFAULT: PmuConfig = PmuConfig {
        vendor: Vendor::Intel,
        version: 2,
        gp: 4,
        full_width_writes: true,
        perfctr_core: false,
        lbr_format: 0,
        pebs: false,
        host_guest: false,
    };

    /// KVM's AMD PMU for a CPU with PerfCtrExtCore (`perfctr_core`) and
    /// PerfMonV2 (`v2`, then with `gp` counters): `amd_pmu_refresh`.
    pub fn amd(perfctr_core: bool, v2: bool, gp: u8) -> PmuConfig {
        let gp = if v2 {
            gp
        } else if perfctr_core {
            MAX_AMD_GP as u8
        } else {
            4
        };
        PmuConfig {
            vendor: Vendor::Amd,
            version: if v2 { 2 } else { 1 },
            gp: gp.min(MAX_AMD_GP as u8),
            full_width_writes: false,
            perfctr_core,
            lbr_format: 0,
            pebs: false,
            host_guest: false,
        }
    }

    /// AMD: the event select bits a write drops (KVM's `reserved_bits`,
    /// less HostOnly/GuestOnly with [`PmuConfig::host_guest`]).
    fn amd_evtsel_reserved(self) -> u64 {
        if self.host_guest {
            AMD_EVTSEL_RESERVED & !(AMD_EVTSEL_HOSTONLY | AMD_EVTSEL_GUESTONLY)
        } else {
            AMD_EVTSEL_RESERVED
        }
    }

    /// Whether counting is gated by a global control register (Intel v2,
    /// AMD PerfMonV2; KVM's `kvm_pmu_has_perf_global_ctrl`).
    fn has_global_ctrl(self) -> bool {
        match self.vendor {
            Vendor::Intel => self.version >= 2,
            Vendor::Amd => self.version >= 2,
        }
    }
    /// What rustkvm gives `-cpu <Intel model>,pmu=on`: KVM's default without
    /// PERF_CAPABILITIES, since TCG does not offer PDCM (CPUID.1:ECX bit 15),
    /// and KVM then zeroes the guest's perf capabilities.
    pub const TCG: PmuConfig = PmuConfig {
        full_width_writes: false,
        ..PmuConfig::DEFAULT
    };

    /// General-purpose counters that exist.
    pub fn gp_counters(self) -> usize {
        self.gp()
    }

    /// Fixed counters that exist (Intel only).
    pub fn fixed_counters(self) -> usize {
        self.fixed()
    }

    fn gp(self) -> usize {
        if self.version == 0 {
            0
        } else {
            usize::from(self.gp).min(MAX_GP)
        }
    }

    fn fixed(self) -> usize {
        if self.version == 0 || self.vendor == Vendor::Amd {
            0
        } else {
            NUM_FIXED
        }
    }

    /// CPUID leaf 0xA (EAX, EBX, ECX, EDX). EBX marks unavailable the
    /// architectural events rustkvm does not count (LLC references and
    /// misses, branch mispredicts).
    pub fn cpuid_0xa(self) -> [u32; 4] {
        if self.version == 0 || self.vendor == Vendor::Amd {
            return [0; 4];
        }
        /// EBX: bit i set = architectural event i not available.
        const UNAVAILABLE: u32 = 1 << 3 | 1 << 4 | 1 << 6;
        let eax = u32::from(self.version) | (self.gp() as u32) << 8 | COUNTER_WIDTH << 16 | 7 << 24;
        let edx = NUM_FIXED as u32 | COUNTER_WIDTH << 5;
        [eax, UNAVAILABLE, 0, edx]
    }

    fn global_ctrl_mask(self) -> u64 {
        ((1u64 << self.gp()) - 1) | ((1u64 << self.fixed()) - 1) << 32
    }

    fn fixed_ctrl_mask(self) -> u64 {
        // OS, USR and PMI per counter; AnyThread (bit 2 of each) reserved;
        // with the PEBS baseline, ADAPTIVE at 32 + 4i (intel_pmu_refresh).
        let adaptive = |i: usize| if self.pebs { 1u64 << (32 + 4 * i) } else { 0 };
        (0..self.fixed()).fold(0, |m, i| m | 0xb << (4 * i) | adaptive(i))
    }

    /// IA32_PERFEVTSELx's reserved bits (Intel): with the PEBS baseline,
    /// ADAPTIVE is not.
    fn evtsel_reserved(self) -> u64 {
        if self.pebs {
            EVTSEL_RESERVED & !EVTSEL_ADAPTIVE
        } else {
            EVTSEL_RESERVED
        }
    }
}

const MASK: u64 = (1 << COUNTER_WIDTH) - 1;

/// One counter: its value at the last sync and the event total then.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// Value (COUNTER_WIDTH bits) at the last sync.
    pub value: u64,
    /// The selected event's total at the last sync.
    pub base: u64,
}

/// What a counter counts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Selected {
    event: Event,
    filter: Filter,
}

/// The PMU state of one vCPU (plain data, savable).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PmuState {
    /// IA32_PERFEVTSELx.
    pub evtsel: [u64; MAX_GP],
    /// IA32_PMCx.
    pub gp: [Counter; MAX_GP],
    /// IA32_FIXED_CTR_CTRL.
    pub fixed_ctrl: u64,
    /// IA32_FIXED_CTRx.
    pub fixed: [Counter; NUM_FIXED],
    /// IA32_PERF_GLOBAL_CTRL.
    pub global_ctrl: u64,
    /// IA32_PERF_GLOBAL_STATUS.
    pub global_status: u64,
}

/// A vCPU's PMU: its configuration and state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pmu {
    /// What the guest was given.
    pub config: PmuConfig,
    /// The registers.
    pub state: PmuState,
    /// Derived from the registers after each change (`refresh`): the
    /// counters counting now, those counting retired instructions or
    /// branches, those counting cycles (GLOBAL_CTRL bit order). Every hot
    /// path walks only these.
    live: Live,
    /// PEBS (IA32_PEBS_ENABLE and the rest), with `config.pebs`.
    pebs: Pebs,
    /// PEBS-enabled counters that overflowed since
    /// [`Pmu::take_pebs_overflows`] (GLOBAL_CTRL order): each owes a record
    /// instead of a status bit and a PMI.
    pebs_pending: u64,
    /// With `config.host_guest`: where the vCPU runs ([`Pmu::set_svm`]).
    svm: SvmMode,
}

/// See [`Pmu::live`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Live {
    all: u64,
    retired: u64,
    cycles: u64,
    /// Of `retired`, the counters of memory events.
    mem: u64,
}

/// Counter index in GLOBAL_CTRL/STATUS bit order: GP i → i, fixed i → 32 + i.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// General-purpose counter.
    Gp(usize),
    /// Fixed counter.
    Fixed(usize),
}

impl Which {
    fn bit(self) -> u64 {
        match self {
            Which::Gp(i) => 1 << i,
            Which::Fixed(i) => 1 << (32 + i),
        }
    }

    /// The same counter as PEBS numbers it.
    pub fn pebs(self) -> pebs::Counter {
        match self {
            Which::Gp(i) => pebs::Counter::Gp(i as u8),
            Which::Fixed(i) => pebs::Counter::Fixed(i as u8),
        }
    }
}

/// The counters whose bits (GLOBAL_CTRL order) are set in `mask`.
fn bits(mut mask: u64) -> impl Iterator<Item = Which> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let b = mask.trailing_zeros();
        mask &= mask - 1;
        Some(if b >= 32 {
            Which::Fixed((b - 32) as usize)
        } else {
            Which::Gp(b as usize)
        })
    })
}

impl Default for Pmu {
    fn default() -> Self {
        Pmu::new(PmuConfig::OFF)
    }
}

impl Pmu {
    /// Whether some counter counts retired instructions or branches now
    /// (then the accelerator must count them).
    pub fn counts_retired(&self) -> bool {
        self.live.retired != 0
    }

    /// Whether some counter counts memory instructions now (then the
    /// accelerator's blocks must add their loads and stores).
    pub fn counts_mem(&self) -> bool {
        self.live.mem != 0
    }

    /// Re-derive [`Live`] from the registers.
    fn refresh(&mut self) {
        self.refresh_some(u64::MAX);
    }

    /// Re-derive [`Live`] for the counters in `mask` (GLOBAL_CTRL order).
    fn refresh_some(&mut self, mask: u64) {
        let mut live = self.live;
        for w in bits(mask & self.config.global_ctrl_mask()) {
            let b = w.bit();
            live.all &= !b;
            live.retired &= !b;
            live.cycles &= !b;
            live.mem &= !b;
            if let Some(k) = self.counting(w) {
                live.all |= b;
                match k.event {
                    Event::Instructions | Event::Branches => live.retired |= b,
                    Event::Mem(_) => {
                        live.retired |= b;
                        live.mem |= b;
                    }
                    Event::Cycles | Event::RefCycles => live.cycles |= b,
                }
            }
        }
        self.live = live;
    }

    /// The vCPU entered or left SVM guest mode, or set or cleared
    /// EFER.SVME, with the events `ev` now: the counters catch up, then
    /// count (or not) by their HostOnly/GuestOnly bits in `mode`. The PMI
    /// bits of overflows found. Nothing without `config.host_guest`.
    pub fn set_svm(&mut self, mode: SvmMode, ev: &Events) -> u64 {
        if !self.config.host_guest || mode == self.svm {
            return 0;
        }
        let pmi = self.sync(ev);
        self.svm = mode;
        let gp = (1u64 << self.config.gp()) - 1;
        self.refresh_some(gp);
        for w in self.live().filter(|w| w.bit() & gp != 0) {
            if let Some(k) = self.counting(w) {
                self.counter_mut(w).base = ev.total(k.event, k.filter);
            }
        }
        pmi
    }

    /// The counters counting now.
    fn live(&self) -> impl Iterator<Item = Which> + use<> {
        bits(self.live.all)
    }

    /// The registers to save, with the events `ev` now (nothing changes).
    pub fn save(&self, ev: &Events) -> PmuRegs {
        let mut r = PmuRegs {
            fixed_ctrl: self.state.fixed_ctrl,
            global_ctrl: self.state.global_ctrl,
            global_status: self.state.global_status | self.pending_status(ev),
            ..PmuRegs::default()
        };
        for w in self.counters() {
            match w {
                Which::Gp(i) => {
                    r.gp[i] = self.value(w, ev);
                    r.evtsel[i] = self.state.evtsel[i];
                }
                Which::Fixed(i) => r.fixed[i] = self.value(w, ev),
            }
        }
        r
    }

    /// Load saved registers (loadvm, incoming migration) with the events
    /// `ev` now: counters continue from their saved values. What this PMU
    /// does not have, or a value KVM would refuse, is dropped (reset value).
    pub fn load(&mut self, r: &PmuRegs, ev: &Events) {
        let cfg = self.config;
        *self = Pmu::new(cfg);
        if cfg.version == 0 {
            return;
        }
        let s = &mut self.state;
        if r.fixed_ctrl & !cfg.fixed_ctrl_mask() == 0 {
            s.fixed_ctrl = r.fixed_ctrl;
        }
        if r.global_ctrl & !cfg.global_ctrl_mask() == 0 {
            s.global_ctrl = r.global_ctrl;
        }
        s.global_status = r.global_status & cfg.global_ctrl_mask();
        for i in 0..cfg.gp() {
            if cfg.vendor == Vendor::Amd {
                s.evtsel[i] = r.evtsel[i] & !cfg.amd_evtsel_reserved();
            } else if r.evtsel[i] & cfg.evtsel_reserved() == 0 {
                s.evtsel[i] = r.evtsel[i];
            }
            s.gp[i].value = r.gp[i] & MASK;
        }
        for i in 0..cfg.fixed() {
            s.fixed[i].value = r.fixed[i] & MASK;
        }
        self.refresh();
        self.rebase(ev);
    }

    /// Whether some counter counts cycles (then its totals need the clock).
    pub fn counts_cycles(&self) -> bool {
        self.live.cycles != 0
    }

    /// A PMU in its reset state: everything 0 but IA32_PERF_GLOBAL_CTRL,
    /// whose GP enable bits are set at RESET (SDM: "Sets bits n-1:0 and
    /// clears the upper bits"; KVM since commit de120e1d692d, Linux 6.9).
    pub fn new(config: PmuConfig) -> Pmu {
        let gp_enables = if config.has_global_ctrl() {
            (1u64 << config.gp()) - 1
        } else {
            0
        };
        Pmu {
            config,
            state: PmuState {
                global_ctrl: gp_enables,
                ..PmuState::default()
            },
            // Nothing counts at reset: no event select is enabled.
            live: Live::default(),
            pebs: Pebs::new(
                config.pebs && config.vendor == Vendor::Intel && config.version >= 2,
                config.gp() as u8,
                config.fixed() as u8,
            ),
            pebs_pending: 0,
            svm: SvmMode::default(),
        }
    }

    fn counters(&self) -> impl Iterator<Item = Which> + use<> {
        let (gp, fixed) = (self.config.gp(), self.config.fixed());
        (0..gp).map(Which::Gp).chain((0..fixed).map(Which::Fixed))
    }

    fn counting(&self, w: Which) -> Option<Selected> {
        let s = &self.state;
        if self.config.has_global_ctrl() && s.global_ctrl & w.bit() == 0 {
            return None;
        }
        match w {
            Which::Gp(i) => {
                let sel = s.evtsel[i];
                // EDGE/INV/CMASK change what is counted per cycle, which
                // rustkvm does not model: such a counter does not count.
                if sel & evtsel::EN == 0 || sel & (evtsel::EDGE | evtsel::INV | evtsel::CMASK) != 0
                {
                    return None;
                }
                if self.config.host_guest && !self.svm.counts(sel) {
                    return None;
                }
                let event = match self.config.vendor {
                    Vendor::Intel => Event::from_evtsel(sel)?,
                    Vendor::Amd => Event::from_amd_evtsel(sel)?,
                };
                Some(Selected {
                    event,
                    filter: Filter {
                        usr: sel & evtsel::USR != 0,
                        os: sel & evtsel::OS != 0,
                    },
                })
            }
            Which::Fixed(i) => {
                let ctl = s.fixed_ctrl >> (4 * i);
                let filter = Filter {
                    os: ctl & 1 != 0,
                    usr: ctl & 2 != 0,
                };
                (filter.os || filter.usr).then_some(Selected {
                    event: Event::fixed(i),
                    filter,
                })
            }
        }
    }

    fn counter(&self, w: Which) -> Counter {
        match w {
            Which::Gp(i) => self.state.gp[i],
            Which::Fixed(i) => self.state.fixed[i],
        }
    }

    fn counter_mut(&mut self, w: Which) -> &mut Counter {
        match w {
            Which::Gp(i) => &mut self.state.gp[i],
            Which::Fixed(i) => &mut self.state.fixed[i],
        }
    }

    /// For a counting counter: its value at the last sync plus the events
    /// since (not yet wrapped: above MASK means it overflowed) and the
    /// selected event's total now. None if it does not count.
    fn advanced(&self, w: Which, ev: &Events) -> Option<(u64, u64)> {
        let k = self.counting(w)?;
        let c = self.counter(w);
        let total = ev.total(k.event, k.filter);
        Some((c.value + (total.wrapping_sub(c.base) & MASK), total))
    }

    /// Counter `w`'s value given the event totals `ev`, without changing
    /// anything (an overflow not yet synced shows as the wrapped value).
    pub fn value(&self, w: Which, ev: &Events) -> u64 {
        self.advanced(w, ev)
            .map_or(self.counter(w).value, |(sum, _)| sum & MASK)
    }

    /// Fold the events since the last sync into every counting counter,
    /// setting GLOBAL_STATUS for those that wrapped; returns the counters
    /// that overflowed now and want a PMI (INT / fixed PMI bit).
    pub fn sync(&mut self, ev: &Events) -> u64 {
        let mut pmi = 0;
        for w in self.live() {
            let Some((sum, total)) = self.advanced(w, ev) else {
                continue;
            };
            if sum > MASK && self.pebs.counts(w.pebs()) {
                // A PEBS counter's overflow writes a record instead: KVM
                // sets only GLOBAL_STATUS bit 62, for the record that
                // reaches the threshold (`__kvm_perf_overflow`).
                self.pebs_pending |= w.bit();
            } else if sum > MASK {
                self.state.global_status |= w.bit();
                if self.wants_pmi(w) {
                    pmi |= w.bit();
                }
            }
            *self.counter_mut(w) = Counter {
                value: sum & MASK,
                base: total,
            };
        }
        pmi
    }

    /// Whether the accelerator must stop at `w`'s overflow: it raises a
    /// PMI, or writes a PEBS record (KVM: `pmc->intr = intr || pebs`).
    fn stops_at_overflow(&self, w: Which) -> bool {
        self.wants_pmi(w) || self.pebs.counts(w.pebs())
    }

    /// The PEBS-enabled counters that overflowed since the last call; the
    /// caller writes their records ([`Pebs::overflow`]) and reloads them
    /// ([`Pmu::pebs_reload`]).
    pub fn take_pebs_overflows(&mut self) -> u64 {
        std::mem::take(&mut self.pebs_pending)
    }

    /// PEBS.
    pub fn pebs(&self) -> &Pebs {
        &self.pebs
    }

    /// Load PEBS's saved registers (after [`Pmu::load`], which resets it).
    pub fn pebs_load(&mut self, regs: &pebs::PebsRegs) {
        self.pebs.load(regs);
    }

    /// Whether PEBS records are owed.
    pub fn pebs_owed(&self) -> bool {
        self.pebs_pending != 0
    }

    /// Whether `w`'s PEBS records carry MSR_PEBS_DATA_CFG's groups
    /// (EVENTSEL bit 34, FIXED_CTR_CTRL bit 32 + 4i).
    pub fn adaptive(&self, w: Which) -> bool {
        match w {
            Which::Gp(i) => self.state.evtsel[i] & EVTSEL_ADAPTIVE != 0,
            Which::Fixed(i) => self.state.fixed_ctrl >> (32 + 4 * i) & 1 != 0,
        }
    }

    /// The counters whose bits (GLOBAL_CTRL order) are set in `mask`.
    pub fn counters_in(mask: u64) -> impl Iterator<Item = Which> {
        bits(mask)
    }

    /// After `w`'s PEBS record: it counts on from `value` (its
    /// pebs_event_reset), with the events `ev` now (the caller synced).
    pub fn pebs_reload(&mut self, w: Which, value: u64, ev: &Events) {
        let base = self.counting(w).map_or(0, |k| ev.total(k.event, k.filter));
        *self.counter_mut(w) = Counter {
            value: value & MASK,
            base,
        };
    }

    /// A PEBS record reached the interrupt threshold: GLOBAL_STATUS bit 62;
    /// true if that raises a PMI (KVM raises one until the guest clears
    /// the bit: `skip_pmi = __test_and_set_bit(62, ...)`).
    pub fn pebs_threshold_reached(&mut self) -> bool {
        let first = self.state.global_status & GLOBAL_OVF_BUF == 0;
        self.state.global_status |= GLOBAL_OVF_BUF;
        first
    }

    fn wants_pmi(&self, w: Which) -> bool {
        match w {
            Which::Gp(i) => self.state.evtsel[i] & evtsel::INT != 0,
            Which::Fixed(i) => self.state.fixed_ctrl >> (4 * i) & 8 != 0,
        }
    }

    /// Re-base every counter on `ev` after a configuration change (the
    /// caller synced first): what was counted stays, counting restarts now.
    /// (Only counting counters have a base that matters.)
    fn rebase(&mut self, ev: &Events) {
        for w in self.live() {
            let base = self.counting(w).map_or(0, |k| ev.total(k.event, k.filter));
            self.counter_mut(w).base = base;
        }
    }

    /// How many more cycles may pass before a cycle counter with a PMI
    /// wraps; None if none counts.
    pub fn cycles_until_overflow(&self, ev: &Events) -> Option<u64> {
        if self.live.cycles == 0 {
            return None;
        }
        bits(self.live.cycles)
            .filter(|w| self.stops_at_overflow(*w))
            .map(|w| MASK + 1 - self.value(w, ev))
            .min()
    }

    /// How many more instructions (counted as the instruction and branch
    /// counters count them, an upper bound for branches and memory
    /// instructions too: each instruction is at most one of them) may
    /// retire before a counter with a PMI wraps; None if no such counter
    /// counts instructions, branches or memory instructions. The
    /// accelerator stops there for a zero-skid PMI.
    pub fn until_overflow(&self, ev: &Events) -> Option<u64> {
        if self.live.retired == 0 {
            return None;
        }
        self.live()
            .filter(|w| self.stops_at_overflow(*w))
            .filter_map(|w| {
                let k = self.counting(w)?;
                matches!(
                    k.event,
                    Event::Instructions | Event::Branches | Event::Mem(_)
                )
                .then(|| MASK + 1 - self.value(w, ev))
            })
            .min()
    }

    /// The counter an MSR names, if this PMU has it: (which, full-width).
    fn counter_msr(&self, index: u32) -> Option<(Which, bool)> {
        let (gp, fixed) = (self.config.gp() as u32, self.config.fixed() as u32);
        match index {
            i if (MSR_IA32_PMC0..MSR_IA32_PMC0 + gp).contains(&i) => {
                Some((Which::Gp((i - MSR_IA32_PMC0) as usize), false))
            }
            i if self.config.full_width_writes
                && (MSR_IA32_PMC0_FULL..MSR_IA32_PMC0_FULL + gp).contains(&i) =>
            {
                Some((Which::Gp((i - MSR_IA32_PMC0_FULL) as usize), true))
            }
            i if (MSR_CORE_PERF_FIXED_CTR0..MSR_CORE_PERF_FIXED_CTR0 + fixed).contains(&i) => {
                Some((Which::Fixed((i - MSR_CORE_PERF_FIXED_CTR0) as usize), true))
            }
            _ => None,
        }
    }

    /// Whether `index` is one of this PMU's MSRs.
    pub fn is_pmu_msr(&self, index: u32) -> bool {
        if self.config.version == 0 {
            return false;
        }
        if self.config.vendor == Vendor::Amd {
            return self.amd_msr(index).is_some();
        }
        let gp = self.config.gp() as u32;
        self.counter_msr(index).is_some()
            || (MSR_IA32_PERFEVTSEL0..MSR_IA32_PERFEVTSEL0 + gp).contains(&index)
            || matches!(
                index,
                MSR_CORE_PERF_FIXED_CTR_CTRL
                    | MSR_CORE_PERF_GLOBAL_STATUS
                    | MSR_CORE_PERF_GLOBAL_CTRL
                    | MSR_CORE_PERF_GLOBAL_OVF_CTRL
            )
            || (index == MSR_IA32_PERF_CAPABILITIES && self.config.full_width_writes)
            || (self.pebs.enabled() && Pebs::owns(index))
    }

    /// Whether KVM takes `index` as this PMU's (`kvm_pmu_is_valid_msr`):
    /// its MSRs and, for AMD, every K7 MSR whenever the PMU exists
    /// (`amd_is_valid_msr`), so that those of counters it lacks (PerfMonV2
    /// with fewer than 4) #GP instead of reading 0 as the legacy MSRs of a
    /// PMU that does not claim them ([`kvm_reads_as_zero`]).
    pub fn claims(&self, index: u32) -> bool {
        self.is_pmu_msr(index)
            || (self.config.vendor == Vendor::Amd
                && self.config.version != 0
                && (MSR_K7_EVNTSEL0..MSR_K7_PERFCTR0 + 4).contains(&index))
    }

    /// RDMSR; None for an MSR this PMU does not have (#GP).
    pub fn read_msr(&self, index: u32, ev: &Events) -> Option<u64> {
        if self.config.vendor == Vendor::Amd {
            return self.amd_read_msr(index, ev);
        }
        if !self.is_pmu_msr(index) {
            return None;
        }
        if let Some((w, _)) = self.counter_msr(index) {
            return Some(self.value(w, ev));
        }
        let s = &self.state;
        Some(match index {
            MSR_CORE_PERF_FIXED_CTR_CTRL => s.fixed_ctrl,
            MSR_CORE_PERF_GLOBAL_STATUS => s.global_status | self.pending_status(ev),
            MSR_CORE_PERF_GLOBAL_CTRL => s.global_ctrl,
            MSR_CORE_PERF_GLOBAL_OVF_CTRL => 0,
            // (Only with PDCM, which `full_width_writes` stands for.)
            MSR_IA32_PERF_CAPABILITIES => {
                PERF_CAP_FW_WRITES
                    | u64::from(self.config.lbr_format) & PERF_CAP_LBR_FMT
                    | self.pebs.capabilities()
            }
            i if Pebs::owns(i) => return self.pebs.read_msr(i).ok(),
            i => s.evtsel[(i - MSR_IA32_PERFEVTSEL0) as usize],
        })
    }

    /// Status bits of counters that wrapped since the last sync.
    fn pending_status(&self, ev: &Events) -> u64 {
        self.live()
            .filter(|w| !self.pebs.counts(w.pebs()))
            .filter(|w| self.advanced(*w, ev).is_some_and(|(sum, _)| sum > MASK))
            .fold(0, |m, w| m | w.bit())
    }

    /// The cheap case of a WRMSR: an Intel event select or counter whose
    /// counter neither counts before nor after the write. Nothing counts
    /// differently, so no event totals, sync or engine update are needed;
    /// Some(Ok) when done here, None to take the full path.
    pub fn write_quiet(&mut self, index: u32, value: u64) -> Option<Result<(), X86Error>> {
        if self.config.vendor != Vendor::Intel || self.config.version == 0 {
            return None;
        }
        let gp = self.config.gp() as u32;
        if (MSR_IA32_PERFEVTSEL0..MSR_IA32_PERFEVTSEL0 + gp).contains(&index) {
            let i = (index - MSR_IA32_PERFEVTSEL0) as usize;
            let w = Which::Gp(i);
            if value & self.config.evtsel_reserved() != 0 || self.live.all & w.bit() != 0 {
                return None;
            }
            let old = self.state.evtsel[i];
            self.state.evtsel[i] = value;
            if self.counting(w).is_some() {
                // It starts counting: the full path re-bases it.
                self.state.evtsel[i] = old;
                return None;
            }
            return Some(Ok(()));
        }
        let (w, full) = self.counter_msr(index)?;
        if self.live.all & w.bit() != 0 || wider_than_gp_counter(w, full, value) {
            return None;
        }
        let v = if full {
            value
        } else {
            value as u32 as i32 as i64 as u64
        };
        self.counter_mut(w).value = v & MASK;
        Some(Ok(()))
    }

    /// WRMSR from the guest, with the events `ev` now. Ok(pmi) carries the
    /// counters that overflowed (and want a PMI) in the sync the write
    /// needed; Err means #GP (KVM's answers in `intel_pmu_set_msr`).
    pub fn write_msr(&mut self, index: u32, value: u64, ev: &Events) -> Result<u64, X86Error> {
        if self.config.vendor == Vendor::Amd {
            return self.amd_write_msr(index, value, ev);
        }
        let gp_fault = Err(X86Error::ReservedBits { msr: index, value });
        if !self.is_pmu_msr(index) {
            return gp_fault;
        }
        let pmi = self.sync(ev);
        if Pebs::owns(index) {
            // Which counters write records changes what the engine must
            // stop at: the caller publishes.
            return self.pebs.write_msr(index, value).map(|()| pmi);
        }
        if let Some((w, full)) = self.counter_msr(index) {
            if wider_than_gp_counter(w, full, value) {
                return gp_fault;
            }
            // Legacy PMCx writes sign-extend bit 31 (KVM; SDM 20.2.5).
            let v = if full {
                value
            } else {
                value as u32 as i32 as i64 as u64
            };
            let base = self.counting(w).map_or(0, |k| ev.total(k.event, k.filter));
            *self.counter_mut(w) = Counter {
                value: v & MASK,
                base,
            };
            return Ok(pmi);
        }
        let cfg = self.config;
        // The counters whose selection the write may change.
        let changed = match index {
            MSR_CORE_PERF_FIXED_CTR_CTRL => {
                if value & !cfg.fixed_ctrl_mask() != 0 {
                    return gp_fault;
                }
                self.state.fixed_ctrl = value;
                cfg.global_ctrl_mask() & !0xffff_ffff
            }
            MSR_CORE_PERF_GLOBAL_STATUS | MSR_IA32_PERF_CAPABILITIES => return gp_fault,
            MSR_CORE_PERF_GLOBAL_CTRL => {
                if value & !cfg.global_ctrl_mask() != 0 {
                    return gp_fault;
                }
                self.state.global_ctrl = value;
                cfg.global_ctrl_mask()
            }
            MSR_CORE_PERF_GLOBAL_OVF_CTRL => {
                // GLOBAL_STATUS's reserved bits: GLOBAL_CTRL's less OvfBuf
                // and CondChgd (`global_status_rsvd` in intel_pmu_refresh).
                if value & !(cfg.global_ctrl_mask() | GLOBAL_OVF_BUF | GLOBAL_COND_CHGD) != 0 {
                    return gp_fault;
                }
                self.state.global_status &= !value;
                0
            }
            i => {
                if value & cfg.evtsel_reserved() != 0 {
                    return gp_fault;
                }
                let i = (i - MSR_IA32_PERFEVTSEL0) as usize;
                self.state.evtsel[i] = value;
                Which::Gp(i).bit()
            }
        };
        self.refresh_some(changed);
        // The sync re-based every counter that counted; those that start
        // counting now start from the totals now.
        for w in self.live().filter(|w| w.bit() & changed != 0) {
            if let Some(k) = self.counting(w) {
                self.counter_mut(w).base = ev.total(k.event, k.filter);
            }
        }
        Ok(pmi)
    }

    /// RDPMC with ECX = `ecx` (after the CR4.PCE/CPL check). Intel:
    /// ECX[31:16] is the counter type, 0 for the GP counters and 0x4000
    /// (bit 30) for the fixed ones, ECX[15:0] the index; any other type —
    /// bit 31's "fast" read included, which only non-architectural PMUs
    /// have — is #GP (`intel_rdpmc_ecx_to_pmc`, Linux 6.9 and later). None
    /// means #GP.
    pub fn rdpmc(&self, ecx: u32, ev: &Events) -> Option<u64> {
        if self.config.version == 0 {
            return None;
        }
        if self.config.vendor == Vendor::Amd {
            // ECX is the counter index, 0..gp (`amd_check_rdpmc_early`).
            let i = ecx as usize;
            return (i < self.config.gp()).then(|| self.value(Which::Gp(i), ev));
        }
        let idx = (ecx & RDPMC_INDEX_MASK) as usize;
        let w = match ecx & RDPMC_TYPE_MASK {
            RDPMC_TYPE_GP => (idx < self.config.gp()).then_some(Which::Gp(idx))?,
            RDPMC_TYPE_FIXED => (idx < self.config.fixed()).then_some(Which::Fixed(idx))?,
            _ => return None,
        };
        Some(self.value(w, ev))
    }
}

/// What an AMD PMU MSR is (see [`Pmu::amd_msr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AmdMsr {
    /// PerfEvtSel of GP counter i.
    Select(usize),
    /// PerfCtr of GP counter i.
    Counter(usize),
    /// PerfMonV2 global registers.
    GlobalStatus,
    GlobalCtl,
    GlobalStatusClr,
    GlobalStatusSet,
}

impl Pmu {
    /// The AMD PMU MSR `index` names, if this PMU has it (KVM's
    /// `amd_is_valid_msr` and `get_gp_pmc_amd`): the K7 MSRs alias
    /// counters 0–3; the PerfCtrExtCore ones exist only with that feature;
    /// the global registers only with PerfMonV2.
    fn amd_msr(&self, index: u32) -> Option<AmdMsr> {
        let gp = self.config.gp();
        let counter = |i: usize, m: AmdMsr| (i < gp).then_some(m);
        match index {
            i if (MSR_K7_EVNTSEL0..MSR_K7_EVNTSEL0 + 4).contains(&i) => {
                let n = (i - MSR_K7_EVNTSEL0) as usize;
                counter(n, AmdMsr::Select(n))
            }
            i if (MSR_K7_PERFCTR0..MSR_K7_PERFCTR0 + 4).contains(&i) => {
                let n = (i - MSR_K7_PERFCTR0) as usize;
                counter(n, AmdMsr::Counter(n))
            }
            i if self.config.perfctr_core
                && (MSR_F15H_PERF_CTL0..MSR_F15H_PERF_CTL0 + 2 * MAX_AMD_GP as u32)
                    .contains(&i) =>
            {
                let n = ((i - MSR_F15H_PERF_CTL0) / 2) as usize;
                if i & 1 == 0 {
                    counter(n, AmdMsr::Select(n))
                } else {
                    counter(n, AmdMsr::Counter(n))
                }
            }
            MSR_AMD64_GLOBAL_STATUS if self.config.has_global_ctrl() => Some(AmdMsr::GlobalStatus),
            MSR_AMD64_GLOBAL_CTL if self.config.has_global_ctrl() => Some(AmdMsr::GlobalCtl),
            MSR_AMD64_GLOBAL_STATUS_CLR if self.config.has_global_ctrl() => {
                Some(AmdMsr::GlobalStatusClr)
            }
            MSR_AMD64_GLOBAL_STATUS_SET if self.config.has_global_ctrl() => {
                Some(AmdMsr::GlobalStatusSet)
            }
            _ => None,
        }
    }

    /// RDMSR of an AMD PMU; None means #GP (`kvm_pmu_get_msr`,
    /// `amd_pmu_get_msr`).
    fn amd_read_msr(&self, index: u32, ev: &Events) -> Option<u64> {
        if self.config.version == 0 {
            return None;
        }
        let s = &self.state;
        Some(match self.amd_msr(index)? {
            AmdMsr::Select(i) => s.evtsel[i],
            AmdMsr::Counter(i) => self.value(Which::Gp(i), ev),
            AmdMsr::GlobalStatus => s.global_status | self.pending_status(ev),
            AmdMsr::GlobalCtl => s.global_ctrl,
            AmdMsr::GlobalStatusClr | AmdMsr::GlobalStatusSet => 0,
        })
    }

    /// WRMSR of an AMD PMU (`kvm_pmu_set_msr`, `amd_pmu_set_msr`): counters
    /// take 48 bits; event selects and GLOBAL_CTL drop reserved bits
    /// silently; GLOBAL_STATUS ignores guest writes ("Per PPR, Read-only
    /// MSR. Writes are ignored."; no #GP: that is Intel's), STATUS_CLR
    /// clears and STATUS_SET sets status bits of counters that exist (KVM
    /// emulates it since "KVM: x86/pmu: Emulate PERF_CNTR_GLOBAL_STATUS_SET
    /// for PerfMonV2", a stable fix of 2025).
    fn amd_write_msr(&mut self, index: u32, value: u64, ev: &Events) -> Result<u64, X86Error> {
        let Some(msr) = self.amd_msr(index).filter(|_| self.config.version != 0) else {
            return Err(X86Error::ReservedBits { msr: index, value });
        };
        let pmi = self.sync(ev);
        let changed = match msr {
            AmdMsr::Counter(i) => {
                let w = Which::Gp(i);
                let base = self.counting(w).map_or(0, |k| ev.total(k.event, k.filter));
                *self.counter_mut(w) = Counter {
                    value: value & MASK,
                    base,
                };
                return Ok(pmi);
            }
            AmdMsr::Select(i) => {
                self.state.evtsel[i] = value & !self.config.amd_evtsel_reserved();
                Which::Gp(i).bit()
            }
            AmdMsr::GlobalStatus => return Ok(pmi),
            AmdMsr::GlobalStatusSet => {
                self.state.global_status |= value & self.config.global_ctrl_mask();
                return Ok(pmi);
            }
            AmdMsr::GlobalStatusClr => {
                self.state.global_status &= !value;
                return Ok(pmi);
            }
            AmdMsr::GlobalCtl => {
                self.state.global_ctrl = value & self.config.global_ctrl_mask();
                self.config.global_ctrl_mask()
            }
        };
        self.refresh_some(changed);
        for w in self.live().filter(|w| w.bit() & changed != 0) {
            if let Some(k) = self.counting(w) {
                self.counter_mut(w).base = ev.total(k.event, k.filter);
            }
        }
        Ok(pmi)
    }
}

/// A write through a GP counter's full-width alias (IA32_A_PMCx) of a value
/// wider than the counter: #GP (`intel_pmu_set_msr`). Legacy IA32_PMCx
/// writes sign-extend instead, fixed counters are masked.
fn wider_than_gp_counter(w: Which, full: bool, value: u64) -> bool {
    matches!(w, Which::Gp(_)) && full && value & !MASK != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(user: u64, kernel: u64) -> Events {
        Events {
            instructions: [user, kernel],
            branches: [user / 4, kernel / 4],
            cycles: 3 * (user + kernel),
            ref_cycles: 2 * (user + kernel),
            ..Events::default()
        }
    }

    const INSNS_USR_OS: u64 = evtsel::EN | evtsel::USR | evtsel::OS | 0xc0;

    #[test]
    fn cpuid_0xa_is_kvms_version_2_shape() {
        let [eax, ebx, ecx, edx] = PmuConfig::DEFAULT.cpuid_0xa();
        assert_eq!(eax & 0xff, 2, "version");
        assert_eq!((eax >> 8) & 0xff, 4, "GP counters");
        assert_eq!((eax >> 16) & 0xff, 48, "width");
        assert_eq!(eax >> 24, 7, "EBX length");
        assert_eq!(ebx, 0x58, "LLC ref/miss and mispredicts unavailable");
        assert_eq!(ecx, 0);
        assert_eq!((edx & 0x1f, (edx >> 5) & 0xff), (3, 48));
        assert_eq!(PmuConfig::OFF.cpuid_0xa(), [0; 4]);
    }

    #[test]
    fn no_pmu_means_every_pmu_msr_faults() {
        let mut p = Pmu::new(PmuConfig::OFF);
        let e = Events::default();
        for msr in [0xc1, 0x186, 0x309, 0x38d, 0x38e, 0x38f, 0x390, 0x4c1, 0x345] {
            assert_eq!(p.read_msr(msr, &e), None, "{msr:#x}");
            assert!(p.write_msr(msr, 0, &e).is_err(), "{msr:#x}");
        }
        assert_eq!(p.rdpmc(0, &e), None);
    }

    #[test]
    fn reserved_bits_and_read_only_registers_fault_like_kvm() {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        let e = Events::default();
        let reset = p.state;
        assert_eq!(reset.global_ctrl, 0xf, "GP counters enabled at RESET");
        assert!(p.write_msr(0x186, 1 << 21, &e).is_err(), "AnyThread");
        assert!(p.write_msr(0x186, 1 << 32, &e).is_err(), "high dword");
        assert!(p.write_msr(0x186 + 4, 0, &e).is_err(), "only 4 GP counters");
        assert!(p.write_msr(0xc1 + 4, 0, &e).is_err());
        assert!(p.write_msr(0x38d, 0x4, &e).is_err(), "fixed AnyThread");
        assert!(p.write_msr(0x38d, 0xb << 12, &e).is_err(), "no fixed 3");
        assert!(p.write_msr(0x38f, 1 << 4, &e).is_err(), "GP 4 enable");
        assert!(p.write_msr(0x38f, 1 << 35, &e).is_err(), "fixed 3 enable");
        assert!(
            p.write_msr(0x38e, 0, &e).is_err(),
            "GLOBAL_STATUS is read-only"
        );
        assert!(
            p.write_msr(0x345, 0, &e).is_err(),
            "PERF_CAPABILITIES is read-only"
        );
        assert!(p.write_msr(0x390, 1 << 40, &e).is_err());
        // OvfBuf and CondChgd are not reserved in OVF_CTRL.
        assert_eq!(p.write_msr(0x390, 3 << 62, &e), Ok(0));
        assert_eq!(p.state, reset, "nothing changed");
        assert_eq!(p.write_msr(0x38d, 0xbbb, &e), Ok(0));
        assert_eq!(p.write_msr(0x38f, 0x7_0000_000f, &e), Ok(0));
        assert_eq!(p.read_msr(0x345, &e), Some(PERF_CAP_FW_WRITES));
        assert_eq!(p.read_msr(0x390, &e), Some(0), "OVF_CTRL reads 0");
    }

    #[test]
    fn pebs_with_the_baseline_opens_its_msrs_and_adaptive_bits_only_when_configured() {
        let e = Events::default();
        let mut none = Pmu::new(PmuConfig::DEFAULT);
        for msr in [
            pebs::MSR_IA32_PEBS_ENABLE,
            pebs::MSR_PEBS_DATA_CFG,
            pebs::MSR_IA32_DS_AREA,
        ] {
            assert_eq!(none.read_msr(msr, &e), None, "{msr:#x}");
            assert!(none.write_msr(msr, 0, &e).is_err(), "{msr:#x}");
        }
        assert!(none.write_msr(0x186, EVTSEL_ADAPTIVE, &e).is_err());
        assert!(none.write_msr(0x38d, 1 << 32, &e).is_err());
        let mut p = Pmu::new(PmuConfig {
            pebs: true,
            ..PmuConfig::DEFAULT
        });
        assert_eq!(
            p.read_msr(0x345, &e),
            Some(PERF_CAP_FW_WRITES | pebs::caps::PEBS)
        );
        assert_eq!(p.write_msr(0x186, EVTSEL_ADAPTIVE | 0xc0, &e), Ok(0));
        assert_eq!(p.write_msr(0x38d, 1 << 32 | 1 << 40 | 0xb, &e), Ok(0));
        assert!(p.write_msr(0x38d, 1 << 44, &e).is_err(), "no fixed 3");
        assert_eq!(
            p.write_msr(pebs::MSR_IA32_PEBS_ENABLE, 0x7_0000_000f, &e),
            Ok(0)
        );
        assert!(p.write_msr(pebs::MSR_IA32_PEBS_ENABLE, 1 << 4, &e).is_err());
        assert_eq!(
            p.read_msr(pebs::MSR_IA32_PEBS_ENABLE, &e),
            Some(0x7_0000_000f)
        );
        assert!(p.pebs().counts(pebs::Counter::Fixed(2)));
        // An AMD PMU never has PEBS.
        let amd = Pmu::new(PmuConfig {
            pebs: true,
            ..PmuConfig::amd(true, true, 6)
        });
        assert!(!amd.pebs().enabled());
    }

    #[test]
    fn a_pebs_counters_overflow_owes_a_record_not_a_status_bit_or_a_pmi() {
        let mut p = Pmu::new(PmuConfig {
            pebs: true,
            ..PmuConfig::DEFAULT
        });
        let e = ev(0, 0);
        // PMC0 counts kernel instructions without INT, PEBS-enabled, 10
        // from the wrap; PMC1 the same without PEBS, with INT, 20 from it.
        p.write_msr(0x186, evtsel::EN | evtsel::OS | 0xc0, &e)
            .unwrap();
        p.write_msr(0x187, evtsel::EN | evtsel::OS | evtsel::INT | 0xc0, &e)
            .unwrap();
        p.write_msr(0xc1, (MASK + 1 - 10) as u32 as u64, &e)
            .unwrap();
        p.write_msr(0xc2, (MASK + 1 - 20) as u32 as u64, &e)
            .unwrap();
        assert_eq!(p.until_overflow(&e), Some(20), "PEBS off: INT only");
        p.write_msr(pebs::MSR_IA32_PEBS_ENABLE, 1, &e).unwrap();
        assert_eq!(
            p.until_overflow(&e),
            Some(10),
            "a PEBS counter stops the engine without INT"
        );
        let e = ev(0, 10);
        assert_eq!(p.sync(&e), 0, "no PMI");
        assert_eq!(p.read_msr(0x38e, &e), Some(0), "no status bit");
        assert_eq!(p.take_pebs_overflows(), 1);
        assert_eq!(p.take_pebs_overflows(), 0);
        p.pebs_reload(Which::Gp(0), MASK + 1 - 5, &e);
        assert_eq!(p.until_overflow(&e), Some(5), "reloaded");
        assert!(p.pebs_threshold_reached(), "the first raises a PMI");
        assert!(!p.pebs_threshold_reached(), "not again until cleared");
        assert_eq!(p.read_msr(0x38e, &e), Some(GLOBAL_OVF_BUF));
        p.write_msr(0x390, GLOBAL_OVF_BUF, &e).unwrap();
        assert!(p.pebs_threshold_reached());
        // The non-PEBS counter still sets its bit and wants its PMI.
        let e = ev(0, 20);
        assert_eq!(p.sync(&e), 0b10);
        assert_eq!(
            p.take_pebs_overflows(),
            1,
            "PMC0, reloaded 5 from its wrap, wrapped again"
        );
        assert_eq!(p.read_msr(0x38e, &e), Some(GLOBAL_OVF_BUF | 0b10));
    }

    #[test]
    fn legacy_writes_sign_extend_full_width_writes_do_not() {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        let e = Events::default();
        p.write_msr(0xc1, 0x8000_0000, &e).unwrap();
        assert_eq!(p.read_msr(0xc1, &e), Some(0xffff_8000_0000));
        p.write_msr(0x4c1, 0x8000_0000, &e).unwrap();
        assert_eq!(p.read_msr(0xc1, &e), Some(0x8000_0000));
        p.write_msr(0x4c1, MASK, &e).unwrap();
        assert_eq!(p.read_msr(0x4c1, &e), Some(MASK), "48 bits");
        // Wider than the counter through the full-width alias: #GP, the
        // counter unchanged (kvm-unit-tests' check_gp_counters_write_width),
        // on the quiet path and on the full one.
        for v in [u64::MAX, 0xffff_ff01_2345_6789, 1 << 48] {
            assert!(p.write_quiet(0x4c1, v).is_none(), "not taken quietly");
            assert!(p.write_msr(0x4c1, v, &e).is_err(), "{v:#x}");
            assert_eq!(p.read_msr(0x4c1, &e), Some(MASK));
        }
        // The legacy MSR and the fixed counters take any value.
        assert!(p.write_msr(0xc1, u64::MAX, &e).is_ok());
        assert!(p.write_msr(0x309, u64::MAX, &e).is_ok());
        assert_eq!(p.read_msr(0x309, &e), Some(MASK));
        let no_fw = Pmu::new(PmuConfig {
            full_width_writes: false,
            ..PmuConfig::DEFAULT
        });
        assert_eq!(no_fw.read_msr(0x4c1, &e), None, "no full-width MSRs");
        // No PDCM, so KVM zeroes the perf capabilities: the MSR #GPs.
        assert_eq!(no_fw.read_msr(0x345, &e), None);
    }

    #[test]
    fn counts_follow_events_enables_and_privilege_filters() {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        let e0 = ev(1000, 500);
        p.write_msr(0x186, INSNS_USR_OS, &e0).unwrap();
        p.write_msr(0x187, evtsel::EN | evtsel::USR | 0xc4, &e0)
            .unwrap();
        p.write_msr(0x188, evtsel::EN | evtsel::OS | 0xc0, &e0)
            .unwrap();
        p.write_msr(0x38d, 0x3 | 0x3 << 4, &e0).unwrap(); // fixed 0, 1: OS+USR
        p.write_msr(0x38f, 0, &e0).unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(2000, 900)), Some(0), "GLOBAL_CTRL off");
        p.write_msr(0x38f, 0x3_0000_0007, &e0).unwrap();
        let e1 = ev(1400, 700);
        assert_eq!(p.read_msr(0xc1, &e1), Some(600), "all instructions");
        assert_eq!(p.read_msr(0xc2, &e1), Some(100), "user branches");
        assert_eq!(p.read_msr(0xc3, &e1), Some(200), "kernel instructions");
        assert_eq!(p.read_msr(0x309, &e1), Some(600), "fixed 0 = GP 0");
        assert_eq!(p.read_msr(0x30a, &e1), Some(1800), "cycles");
        assert_eq!(p.read_msr(0x30b, &e1), Some(0), "fixed 2 not enabled");
        assert_eq!(p.rdpmc(0, &e1), Some(600));
        assert_eq!(p.rdpmc(1 << 30, &e1), Some(600), "fixed via ECX bit 30");
        assert_eq!(p.rdpmc(4, &e1), None);
        assert_eq!(p.rdpmc(1 << 30 | 3, &e1), None);
        // Types other than GP (0) and fixed (0x4000) #GP, "fast" reads (bit
        // 31) included, as KVM since Linux 6.9.
        assert_eq!(p.rdpmc(1 << 31, &e1), None, "fast GP read");
        assert_eq!(p.rdpmc(3 << 30, &e1), None, "fast fixed read");
        assert_eq!(p.rdpmc(1 << 16, &e1), None);
        assert_eq!(p.rdpmc(1 << 30 | 1 << 16, &e1), None);
        // Disabling keeps the count; re-enabling resumes from there.
        p.write_msr(0x38f, 0, &e1).unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(9000, 9000)), Some(600));
        p.write_msr(0x38f, 1, &ev(9000, 9000)).unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(9010, 9000)), Some(610));
        // A write mid-count restarts from the value written.
        p.write_msr(0xc1, 5, &ev(9010, 9000)).unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(9020, 9001)), Some(16));
        // Events rustkvm does not count, or EDGE/INV/CMASK: nothing.
        // (Totals only grow: the accelerator's are monotonic.)
        p.write_msr(0x186, evtsel::EN | evtsel::USR | 0x2e, &ev(9020, 9001))
            .unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(9100, 9100)), Some(16));
        p.write_msr(0x186, INSNS_USR_OS | 1 << 24, &ev(9100, 9100))
            .unwrap();
        assert_eq!(p.read_msr(0xc1, &ev(9200, 9200)), Some(16));
    }

    #[test]
    fn overflow_sets_status_asks_for_a_pmi_and_ovf_ctrl_clears_it() {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        let e0 = ev(0, 0);
        p.write_msr(0x186, INSNS_USR_OS | evtsel::INT, &e0).unwrap();
        p.write_msr(0x4c1, MASK - 9, &e0).unwrap(); // 10 to go
        p.write_msr(0x38f, 1, &e0).unwrap();
        assert_eq!(p.until_overflow(&ev(3, 0)), Some(7));
        assert_eq!(p.read_msr(0x38e, &ev(9, 0)), Some(0));
        assert_eq!(
            p.read_msr(0x38e, &ev(10, 0)),
            Some(1),
            "wrapped, seen lazily"
        );
        assert_eq!(p.read_msr(0xc1, &ev(12, 0)), Some(2));
        assert_eq!(p.sync(&ev(12, 0)), 1, "PMI wanted");
        assert_eq!(p.state.global_status, 1);
        assert_eq!(p.sync(&ev(13, 0)), 0, "once per overflow");
        p.write_msr(0x390, 1, &ev(13, 0)).unwrap();
        assert_eq!(p.read_msr(0x38e, &ev(13, 0)), Some(0));
        assert_eq!(p.read_msr(0xc1, &ev(13, 0)), Some(3));
        // Without INT: status only, no PMI, no overflow budget.
        p.write_msr(0x186, INSNS_USR_OS, &ev(13, 0)).unwrap();
        assert_eq!(p.until_overflow(&ev(13, 0)), None);
    }

    #[test]
    fn counters_never_go_backwards_between_syncs() {
        let mut p = Pmu::new(PmuConfig::DEFAULT);
        p.write_msr(0x186, INSNS_USR_OS, &ev(0, 0)).unwrap();
        p.write_msr(0x38f, 1, &ev(0, 0)).unwrap();
        let mut last = 0;
        for i in 1..200u64 {
            let e = ev(i * 37, i * 11);
            if i % 7 == 0 {
                p.sync(&e);
            }
            let v = p.read_msr(0xc1, &e).unwrap();
            assert!(v >= last, "{v} < {last}");
            last = v;
        }
        assert_eq!(last, 199 * 48);
    }

    #[test]
    fn counting_tells_the_engine_when_to_count_and_when_a_pmi_can_be_due() {
        let mut p = Pmu::new(PmuConfig::TCG);
        let mut c = Counting::default();
        let e = c.events(0);
        c.publish(&p, &e, 0, false);
        assert_eq!(
            (c.active, c.budget, c.pmi),
            (0, i64::MAX, 0),
            "nothing counts"
        );
        // A cycles counter needs no counting blocks.
        p.write_msr(0x186, evtsel::EN | evtsel::OS | 0x3c, &e)
            .unwrap();
        c.publish(&p, &e, 0, false);
        assert_eq!(c.active, 0);
        // Branches with INT, 100 before the wrap: blocks count, the budget
        // is 100 instructions (a lower bound: every branch is one).
        p.write_msr(0x187, evtsel::EN | evtsel::OS | evtsel::INT | 0xc4, &e)
            .unwrap();
        p.write_msr(0xc2, (MASK + 1 - 100) as u32 as u64, &e)
            .unwrap();
        c.publish(&p, &e, 0, false);
        assert_eq!((c.active, c.budget), (1, 100));
        c.events = [0, 400, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0];
        let e = c.events(0);
        let pmi = p.sync(&e);
        assert_eq!(pmi, 2, "counter 1 wrapped with INT");
        c.publish(&p, &e, pmi, false);
        assert_eq!(c.pmi, 1);
        assert_eq!(
            c.budget,
            (MASK + 1) as i64,
            "a full period to the next wrap"
        );
        assert!(is_arch_pmu_msr(0x38f) && is_arch_pmu_msr(0x4c8) && is_arch_pmu_msr(0x345));
        assert!(!is_arch_pmu_msr(0x391) && !is_arch_pmu_msr(0xc9) && !is_arch_pmu_msr(0x30c));
    }

    /// What the engine (accel/tcg/translator.c) does to `acc` for a block
    /// of `n` instructions and `b` branches entered (or, negative, taken
    /// back) at privilege `k`.
    fn engine_add(c: &mut Counting, k: usize, n: i64, b: i64) {
        let d = ((n as u64) << ACC_INSNS_SHIFT).wrapping_add(b as u64);
        for i in 0..=k {
            c.acc[i] = c.acc[i].wrapping_add(d);
        }
    }

    /// Whether the engine calls back: `acc[0]` no longer negative.
    fn spent(c: &Counting) -> bool {
        c.acc[0] as i64 >= 0
    }

    #[test]
    fn the_engines_sums_split_by_privilege_and_spend_the_budget_exactly() {
        let mut c = Counting::default();
        assert_eq!(c.totals(), [0; 12]);
        c.budget = 10;
        c.arm();
        engine_add(&mut c, 0, 4, 1); // user block: 4 instructions, a branch
        engine_add(&mut c, 1, 5, 1); // kernel block
        assert!(!spent(&c), "9 of 10");
        assert_eq!(c.totals()[..4], [4, 5, 1, 1]);
        engine_add(&mut c, 0, 1, 0);
        assert!(spent(&c), "the 10th instruction spends it");
        // An unwind takes back the last block: not spent again.
        engine_add(&mut c, 0, -1, 0);
        assert!(!spent(&c));
        // Armed again (a sync), then a kernel block taken back that was
        // entered before: the branch half goes below its armed value
        // without borrowing from the instructions.
        c.budget = 3;
        c.arm();
        assert_eq!(c.totals()[..4], [4, 5, 1, 1], "arming keeps the totals");
        engine_add(&mut c, 1, -5, -1);
        assert_eq!(c.totals()[..4], [4, 0, 1, 0]);
        engine_add(&mut c, 1, 7, 0);
        assert!(!spent(&c), "the take-back gave 5 back: 2 of 3");
        engine_add(&mut c, 1, 1, 0);
        assert!(spent(&c));
        assert_eq!(c.totals()[..4], [4, 8, 1, 0]);
        // No PMI armed: spent every ACC_BUDGET_MAX instructions.
        c.budget = i64::MAX;
        c.arm();
        engine_add(&mut c, 0, ACC_BUDGET_MAX - 1, 0);
        assert!(!spent(&c));
        engine_add(&mut c, 0, 1, 0);
        assert!(spent(&c));
        assert_eq!(c.totals()[0], 4 + ACC_BUDGET_MAX as u64);
        // Memory events and exceptions are added to `events` directly.
        c.events[10] += 2;
        assert_eq!(c.totals()[10], 2);
    }

    #[test]
    fn saved_registers_continue_counting_in_another_engine() {
        let mut p = Pmu::new(PmuConfig::TCG);
        let e0 = ev(100, 50);
        p.write_msr(0x186, INSNS_USR_OS, &e0).unwrap();
        p.write_msr(0xc1, (MASK - 9) as u32 as u64, &e0).unwrap();
        p.write_msr(0x38d, 0xb, &e0).unwrap();
        p.write_msr(0x38f, 0x1_0000_0001, &e0).unwrap();
        let e1 = ev(110, 55);
        let saved = p.save(&e1);
        assert_eq!(saved.gp[0], 5, "wrapped after 10 of the 15");
        assert_eq!(saved.global_status, 1, "the wrap not yet synced is saved");
        assert_eq!(saved.fixed[0], 15);
        // A fresh engine elsewhere: totals restart from 0.
        let mut q = Pmu::new(PmuConfig::TCG);
        let f0 = ev(0, 0);
        q.load(&saved, &f0);
        let f1 = ev(3, 4);
        assert_eq!(q.value(Which::Gp(0), &f1), 12);
        assert_eq!(q.value(Which::Fixed(0), &f1), 22);
        assert_eq!(q.read_msr(0x38e, &f1), Some(1));
        assert_eq!(q.save(&f0), saved, "a round trip changes nothing");
        // Reserved bits are dropped, as KVM refuses them.
        let mut bad = saved;
        bad.evtsel[0] |= 1 << 21;
        bad.global_ctrl |= 1 << 40;
        q.load(&bad, &f0);
        assert_eq!(q.state.evtsel[0], 0);
        assert_eq!(q.state.global_ctrl, 0xf);
        let mut none = Pmu::new(PmuConfig::OFF);
        none.load(&saved, &f0);
        assert_eq!(none, Pmu::new(PmuConfig::OFF));
    }

    #[test]
    fn cycle_counters_with_a_pmi_tell_how_many_cycles_are_left() {
        let mut p = Pmu::new(PmuConfig::TCG);
        let e0 = ev(0, 0);
        assert_eq!(p.cycles_until_overflow(&e0), None);
        // Fixed counter 1 (cycles) at OS+USR without PMI: nothing to wait for.
        p.write_msr(0x38d, 0x30, &e0).unwrap();
        p.write_msr(0x38f, 1 << 33, &e0).unwrap();
        assert!(p.counts_cycles());
        assert_eq!(p.cycles_until_overflow(&e0), None);
        // With its PMI bit, 1000 cycles before the wrap.
        p.write_msr(0x38d, 0xb0, &e0).unwrap();
        p.write_msr(0x30a, MASK + 1 - 1000, &e0).unwrap();
        assert_eq!(p.cycles_until_overflow(&e0), Some(1000));
        let e1 = ev(100, 0); // 300 cycles later
        assert_eq!(p.cycles_until_overflow(&e1), Some(700));
        assert_eq!(p.until_overflow(&e1), None, "no instruction budget for it");
        let e2 = ev(400, 0);
        assert_eq!(p.sync(&e2), 1 << 33, "wrapped: its PMI");
    }

    /// Memory totals: `mem` instructions, of which `loads` load and
    /// `stores` store, at CPL > 0 and CPL 0.
    fn mem_ev(mem: [u64; 2], loads: [u64; 2], stores: [u64; 2]) -> Events {
        Events {
            mem,
            loads,
            stores,
            ..ev(1000, 1000)
        }
    }

    #[test]
    fn ls_dispatch_and_mem_inst_retired_count_each_memory_class() {
        // Decoding: AMD PMCx029's unit mask is the classes; none, or a
        // reserved bit, counts nothing. Intel's D0H 81H/82H.
        let amd = |umask: u64| Event::from_amd_evtsel(0x29 | umask << 8);
        assert_eq!(amd(1), Some(Event::Mem(mem::LOAD)));
        assert_eq!(amd(7), Some(Event::Mem(mem::ALL)));
        assert_eq!(amd(0), None);
        assert_eq!(amd(9), None, "bit 3 is reserved");
        assert_eq!(
            Event::from_evtsel(0xd0 | 0x81 << 8),
            Some(Event::Mem(mem::LOAD | mem::LOAD_STORE))
        );
        assert_eq!(
            Event::from_evtsel(0xd0 | 0x82 << 8),
            Some(Event::Mem(mem::STORE | mem::LOAD_STORE))
        );
        assert_eq!(Event::from_amd_evtsel(0xd0 | 0x81 << 8), None);
        // 10 memory instructions at CPL 3: 7 load, 5 store, so 2 do both,
        // 5 only load, 3 only store; at CPL 0, 4: 1 loads, 3 store.
        let e0 = mem_ev([0; 2], [0; 2], [0; 2]);
        let e1 = mem_ev([10, 4], [7, 1], [3 + 2, 3]);
        let f = |usr, os| Filter { usr, os };
        for (m, usr, os) in [
            (mem::LOAD, 5, 1),
            (mem::STORE, 3, 3),
            (mem::LOAD_STORE, 2, 0),
            (mem::ALL, 10, 4),
            (mem::LOAD | mem::LOAD_STORE, 7, 1),
        ] {
            let d = |f| {
                e1.total(Event::Mem(m), f)
                    .wrapping_sub(e0.total(Event::Mem(m), f))
            };
            assert_eq!((d(f(true, false)), d(f(false, true))), (usr, os), "{m:#x}");
        }
        // A counter of them makes blocks add loads and stores, and bounds
        // the PMI budget as instructions do (one class per instruction).
        let mut p = Pmu::new(PmuConfig::amd(true, false, 0));
        let mut c = Counting::default();
        p.write_msr(
            0xc001_0200,
            evtsel::EN | evtsel::USR | evtsel::INT | 0x29 | 2 << 8,
            &e0,
        )
        .unwrap();
        p.write_msr(0xc001_0201, MASK - 99, &e0).unwrap();
        assert!(p.counts_retired() && p.counts_mem());
        c.publish(&p, &e0, 0, false);
        assert_eq!((c.active, c.budget), (ACTIVE_RETIRED | ACTIVE_MEM, 100));
        assert_eq!(
            p.read_msr(0xc001_0201, &e1),
            Some(MASK - 99 + 3),
            "stores only, CPL 3"
        );
        // Without it, blocks add none.
        p.write_msr(0xc001_0200, evtsel::EN | evtsel::USR | 0xc0, &e1)
            .unwrap();
        c.publish(&p, &e1, 0, false);
        assert!(!p.counts_mem());
        assert_eq!(c.active, ACTIVE_RETIRED);
    }

    #[test]
    fn amd_legacy_and_extended_msrs_alias_and_count_kvms_events() {
        let mut p = Pmu::new(PmuConfig::amd(true, false, 0));
        assert_eq!(
            (p.config.version, p.config.gp()),
            (1, 6),
            "PerfCtrExtCore: 6"
        );
        assert_eq!(p.config.cpuid_0xa(), [0; 4], "no Intel leaf");
        let e0 = ev(1000, 500);
        // Retired instructions (C0H) at any CPL on counter 1 via the K7
        // select; no global control: EN alone counts.
        let sel = evtsel::EN | evtsel::USR | evtsel::OS | 0xc0;
        p.write_msr(0xc001_0001, sel, &e0).unwrap();
        assert_eq!(
            p.read_msr(0xc001_0202, &e0),
            Some(sel),
            "CTL1 aliases EVNTSEL1"
        );
        p.write_msr(0xc001_0203, 100, &e0).unwrap();
        let e1 = ev(1010, 505);
        assert_eq!(
            p.read_msr(0xc001_0005, &e1),
            Some(115),
            "PERFCTR1 aliases CTR1"
        );
        assert_eq!(p.rdpmc(1, &e1), Some(115));
        assert_eq!(p.rdpmc(6, &e1), None, "RDPMC beyond the counters #GPs");
        assert_eq!(p.rdpmc(1 << 30, &e1), None, "no fixed counters");
        // Retired branches (C2H) and cycles not in halt (76H).
        p.write_msr(0xc001_0204, evtsel::EN | evtsel::OS | 0xc2, &e1)
            .unwrap();
        p.write_msr(0xc001_0206, evtsel::EN | evtsel::OS | 0x76, &e1)
            .unwrap();
        assert!(p.counts_cycles() && p.counts_retired());
        let e2 = ev(1010, 545);
        assert_eq!(p.read_msr(0xc001_0205, &e2), Some(10), "kernel branches");
        assert_eq!(p.read_msr(0xc001_0207, &e2), Some(3 * 40), "cycles");
        // Intel's event numbers count nothing here.
        p.write_msr(0xc001_0208, evtsel::EN | evtsel::OS | 0xc4, &e2)
            .unwrap();
        assert_eq!(p.read_msr(0xc001_0209, &ev(2000, 2000)), Some(0));
        // Reserved bits (bits 19, 21, 36+, so HostOnly/GuestOnly) drop.
        p.write_msr(0xc001_020a, sel | 1 << 41 | 1 << 19 | 0xf << 32, &e2)
            .unwrap();
        assert_eq!(
            p.read_msr(0xc001_020a, &e2),
            Some(sel | 0xf << 32),
            "EventSelect[11:8] kept"
        );
        assert_eq!(p.read_msr(0xc001_020c, &e2), None, "no 7th counter");
        // No PerfMonV2: no global registers, no Intel MSRs.
        for msr in [0xc000_0300, 0xc000_0301, 0x38f, 0xc1, 0x186] {
            assert_eq!(p.read_msr(msr, &e2), None, "{msr:#x}");
            assert!(p.write_msr(msr, 0, &e2).is_err(), "{msr:#x}");
        }
        // Counters take 48 bits, unsigned.
        p.write_msr(0xc001_0004, u64::MAX, &e2).unwrap();
        assert_eq!(p.read_msr(0xc001_0004, &e2), Some(MASK));
        // Without PerfCtrExtCore: 4 counters, K7 MSRs only.
        let q = Pmu::new(PmuConfig::amd(false, false, 0));
        assert_eq!(q.config.gp(), 4);
        assert_eq!(q.read_msr(0xc001_0200, &e0), None);
        assert_eq!(q.read_msr(0xc001_0007, &e0), Some(0));
    }

    /// With SVM (a hypervisor in the guest): GuestOnly counts only between
    /// VMRUN and #VMEXIT, HostOnly only outside, both or neither always,
    /// one alone nothing while EFER.SVME is clear; without SVM both bits
    /// drop, as KVM drops them.
    #[test]
    fn amd_host_only_and_guest_only_follow_svm_guest_mode() {
        let mut p = Pmu::new(PmuConfig {
            host_guest: true,
            ..PmuConfig::amd(true, false, 0)
        });
        let base = evtsel::EN | evtsel::USR | evtsel::OS | 0xc0;
        let e0 = ev(1000, 0);
        let on = SvmMode {
            svme: true,
            guest: false,
        };
        p.set_svm(on, &e0);
        let sels = [
            base | AMD_EVTSEL_GUESTONLY,
            base | AMD_EVTSEL_HOSTONLY,
            base | AMD_EVTSEL_GUESTONLY | AMD_EVTSEL_HOSTONLY,
            base,
        ];
        for (i, sel) in sels.iter().enumerate() {
            p.write_msr(0xc001_0200 + 2 * i as u32, *sel, &e0).unwrap();
            assert_eq!(
                p.read_msr(0xc001_0200 + 2 * i as u32, &e0),
                Some(*sel),
                "kept"
            );
        }
        let ctr = |p: &Pmu, i: u32, e: &Events| p.read_msr(0xc001_0201 + 2 * i, e).unwrap();
        // 10 in the host, then VMRUN, 20 in the guest, #VMEXIT, 5 in the host.
        let e1 = ev(1010, 0);
        p.set_svm(SvmMode { guest: true, ..on }, &e1);
        let e2 = ev(1030, 0);
        p.set_svm(on, &e2);
        let e3 = ev(1035, 0);
        let got: Vec<u64> = (0..4).map(|i| ctr(&p, i, &e3)).collect();
        assert_eq!(got, [20, 15, 35, 35], "GuestOnly, HostOnly, both, neither");
        // EFER.SVME clear: one bit alone counts nothing.
        p.set_svm(SvmMode::default(), &e3);
        let e4 = ev(1045, 0);
        let got: Vec<u64> = (0..4).map(|i| ctr(&p, i, &e4)).collect();
        assert_eq!(got, [20, 15, 45, 45]);
        // Without SVM: KVM's answer, the bits drop and the counter counts.
        let mut q = Pmu::new(PmuConfig::amd(true, false, 0));
        q.write_msr(0xc001_0200, base | AMD_EVTSEL_GUESTONLY, &e0)
            .unwrap();
        assert_eq!(q.read_msr(0xc001_0200, &e0), Some(base));
        assert_eq!(
            q.set_svm(
                SvmMode {
                    svme: true,
                    guest: true
                },
                &e1
            ),
            0
        );
        assert_eq!(q.read_msr(0xc001_0201, &e1), Some(10));
    }

    #[test]
    fn amd_perfmon_v2_gates_counting_and_its_status_registers_behave_as_kvm() {
        let mut p = Pmu::new(PmuConfig::amd(true, true, 6));
        assert_eq!(p.config.version, 2);
        let e0 = ev(0, 0);
        assert_eq!(
            p.read_msr(0xc000_0301, &e0),
            Some(0x3f),
            "GLOBAL_CTL resets enabled"
        );
        let sel = evtsel::EN | evtsel::USR | evtsel::OS | evtsel::INT | 0xc0;
        p.write_msr(0xc001_0200, sel, &e0).unwrap();
        p.write_msr(0xc001_0201, MASK + 1 - 10, &e0).unwrap();
        assert_eq!(p.until_overflow(&e0), Some(10));
        // GLOBAL_CTL stops counter 0 (reserved bits drop, no #GP).
        p.write_msr(0xc000_0301, 0x3e | 1 << 40, &e0).unwrap();
        assert_eq!(p.read_msr(0xc000_0301, &e0), Some(0x3e));
        assert!(!p.counts_retired());
        assert_eq!(p.read_msr(0xc001_0201, &ev(100, 100)), Some(MASK + 1 - 10));
        p.write_msr(0xc000_0301, 0x3f, &e0).unwrap();
        let e1 = ev(8, 4);
        assert_eq!(p.sync(&e1), 1, "wrapped with INT: a PMI");
        assert_eq!(p.read_msr(0xc000_0300, &e1), Some(1), "GLOBAL_STATUS");
        assert_eq!(
            p.write_msr(0xc000_0300, 0, &e1),
            Ok(0),
            "GLOBAL_STATUS ignores guest writes, without #GP"
        );
        assert_eq!(p.read_msr(0xc000_0300, &e1), Some(1));
        assert_eq!(p.read_msr(0xc000_0302, &e1), Some(0));
        p.write_msr(0xc000_0302, 1, &e1).unwrap();
        assert_eq!(p.read_msr(0xc000_0300, &e1), Some(0), "STATUS_CLR clears");
        // NumCorePmc 2: counters 2+ do not exist.
        let q = Pmu::new(PmuConfig::amd(true, true, 2));
        assert_eq!(q.read_msr(0xc001_0204, &e0), None);
        assert_eq!(q.read_msr(0xc000_0301, &e0), Some(0x3));
        // A saved AMD PMU loads back.
        let saved = p.save(&e1);
        let mut r = Pmu::new(PmuConfig::amd(true, true, 6));
        r.load(&saved, &e0);
        assert_eq!(r.save(&e0), saved);
    }

    /// Found by the property tests: AMD's status registers as
    /// `kvm_pmu_set_msr` / `kvm_pmu_get_msr` answer them (kvm-unit-tests'
    /// check in the STATUS_SET patch's review: SET -1 then STATUS = the
    /// counters' bits, CLR -1 then 0).
    #[test]
    fn amd_status_set_sets_counters_bits_and_status_ignores_guest_writes() {
        let mut p = Pmu::new(PmuConfig::amd(true, true, 6));
        let e = ev(0, 0);
        assert_eq!(p.write_msr(0xc000_0303, u64::MAX, &e), Ok(0));
        assert_eq!(
            p.read_msr(0xc000_0300, &e),
            Some(0x3f),
            "bits 63:6 reserved"
        );
        assert_eq!(p.read_msr(0xc000_0303, &e), Some(0), "STATUS_SET reads 0");
        assert_eq!(p.write_msr(0xc000_0300, 0, &e), Ok(0), "no #GP");
        assert_eq!(p.read_msr(0xc000_0300, &e), Some(0x3f), "and no change");
        p.write_msr(0xc000_0302, u64::MAX, &e).unwrap();
        assert_eq!(p.read_msr(0xc000_0300, &e), Some(0));
        p.write_msr(0xc000_0303, 0, &e).unwrap();
        assert_eq!(p.read_msr(0xc000_0300, &e), Some(0));
        // NumCorePmc 2: only counters 0 and 1 have status bits.
        let mut q = Pmu::new(PmuConfig::amd(true, true, 2));
        q.write_msr(0xc000_0303, u64::MAX, &e).unwrap();
        assert_eq!(q.read_msr(0xc000_0300, &e), Some(0x3));
    }

    #[test]
    fn quiet_writes_change_nothing_that_counts() {
        let mut p = Pmu::new(PmuConfig::TCG);
        let e = ev(10, 10);
        // A disabled select and an idle counter: handled without the engine.
        assert_eq!(p.write_quiet(0x186, 0xc0), Some(Ok(())));
        assert_eq!(p.write_quiet(0xc1, 0x8000_0000), Some(Ok(())));
        assert_eq!(
            p.read_msr(0xc1, &e),
            Some(0xffff_8000_0000),
            "sign-extended"
        );
        assert_eq!(p.read_msr(0x186, &e), Some(0xc0));
        // Reserved bits, a select that starts counting, a counting counter:
        // the full path (which faults or re-bases).
        assert_eq!(p.write_quiet(0x186, 1 << 21), None);
        assert_eq!(p.write_quiet(0x186, INSNS_USR_OS), None);
        assert_eq!(p.read_msr(0x186, &e), Some(0xc0), "left as it was");
        p.write_msr(0x186, INSNS_USR_OS, &e).unwrap();
        assert_eq!(p.write_quiet(0xc1, 5), None);
        assert_eq!(p.write_quiet(0x187, 0), Some(Ok(())), "another counter");
        assert_eq!(p.write_quiet(0x38f, 0), None, "controls take the full path");
        let mut amd = Pmu::new(PmuConfig::amd(true, true, 6));
        assert_eq!(amd.write_quiet(0xc001_0200, 0), None);
    }
}
