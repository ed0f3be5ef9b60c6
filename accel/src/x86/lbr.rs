//! Intel's legacy last branch records (LBR) as KVM exposes them to a guest
//! with `pmu=on` on a Skylake/Ice Lake-class host: format 5
//! (LBR_FORMAT_INFO), 32 entries at MSR_LBR_NHM_FROM/TO and MSR_LBR_INFO_0,
//! MSR_LBR_TOS, MSR_LBR_SELECT, and IA32_DEBUGCTL's LBR and
//! FREEZE_LBRS_ON_PMI bits. Arch LBR (CPUID 0x1C) is not offered: KVM never
//! merged it, and on an Arch-LBR host it offers no LBR at all
//! (`vmx_get_perf_capabilities`).
//!
//! Spec: Linux `arch/x86/kvm/vmx/pmu_intel.c` (`intel_pmu_is_valid_lbr_msr`,
//! `intel_pmu_handle_lbr_msrs_access`, `intel_pmu_legacy_freezing_lbrs_on_pmi`),
//! `arch/x86/kvm/vmx/vmx.c` (`vmx_get_supported_debugctl`, DEBUGCTL in
//! `vmx_set_msr`), `arch/x86/events/intel/lbr.c` (record layout, TOS, the
//! LBR_SELECT suppress bits, call-stack mode); Intel SDM vol. 3B 18.4 (Last
//! Branch Recording). Notes: docs/pmu.md "LBR".
//!
//! The records are exact: every taken branch the filter selects, in order,
//! with its true source and target (the engine reports each at the block
//! exit that takes it, `rustkvm_x86_lbr_branch`). The vCPU routes
//! DEBUGCTL and the LBR MSRs here when it has KVM's Intel PMU
//! (`X86::rdmsr`); other vCPUs keep TCG's answers for them.

use crate::x86::X86Error;

/// IA32_DEBUGCTL.
pub const MSR_IA32_DEBUGCTLMSR: u32 = 0x1d9;
/// MSR_LBR_SELECT: the filter (SDM 18.9.1).
pub const MSR_LBR_SELECT: u32 = 0x1c8;
/// MSR_LBR_TOS: the index of the most recent record.
pub const MSR_LBR_TOS: u32 = 0x1c9;
/// MSR_LBR_NHM_FROM: record 0's source (then one MSR per record).
pub const MSR_LBR_NHM_FROM: u32 = 0x680;
/// MSR_LBR_NHM_TO: record 0's target.
pub const MSR_LBR_NHM_TO: u32 = 0x6c0;
/// MSR_LBR_INFO_0: record 0's information (format 5).
pub const MSR_LBR_INFO_0: u32 = 0xdc0;
/// MSR_LBR_CORE_FROM: Core 2's stack (8 records at most, then MSR_LBR_CORE_TO
/// at 0x60); not this model's addresses: KVM #GPs them (kvm-unit-tests'
/// `pmu_lbr` probes 0x40 first), and TCG would take them.
pub const MSR_LBR_CORE_FROM: u32 = 0x40;
/// MSR_LBR_CORE_TO.
pub const MSR_LBR_CORE_TO: u32 = 0x60;
/// Core 2's deepest stack (0x48 is IA32_SPEC_CTRL).
const CORE_DEPTH: u32 = 8;
/// MSR_IA32_LASTBRANCHFROMIP .. MSR_IA32_LASTINTTOIP: KVM reads them as 0
/// (`kvm_get_msr_common`).
pub const MSR_IA32_LASTBRANCH_FIRST: u32 = 0x1db;
/// The last of them (MSR_IA32_LASTINTTOIP).
pub const MSR_IA32_LASTBRANCH_LAST: u32 = 0x1de;

/// IA32_DEBUGCTL bits (msr-index.h `DEBUGCTLMSR_*`).
pub mod debugctl {
    /// Record branches in the LBR stack.
    pub const LBR: u64 = 1 << 0;
    /// Single-step on branches: never offered by KVM; a write drops it.
    pub const BTF: u64 = 1 << 1;
    /// Clear LBR when a PMI is raised (the legacy freeze, PMU v2).
    pub const FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
}

/// MSR_LBR_SELECT bits (lbr.c `LBR_*`): bits 0-8 *suppress* what they
/// name (0 records everything); bit 9 turns call-stack mode on.
pub mod select {
    /// Do not record branches at CPL 0.
    pub const CPL_EQ_0: u64 = 1 << 0;
    /// Do not record branches at CPL > 0.
    pub const CPL_NEQ_0: u64 = 1 << 1;
    /// Do not record conditional branches.
    pub const JCC: u64 = 1 << 2;
    /// Do not record near relative calls.
    pub const NEAR_REL_CALL: u64 = 1 << 3;
    /// Do not record near indirect calls.
    pub const NEAR_IND_CALL: u64 = 1 << 4;
    /// Do not record near returns.
    pub const NEAR_RET: u64 = 1 << 5;
    /// Do not record near indirect jumps.
    pub const NEAR_IND_JMP: u64 = 1 << 6;
    /// Do not record near relative jumps.
    pub const NEAR_REL_JMP: u64 = 1 << 7;
    /// Do not record far branches (and interrupts, exceptions, SYSCALL...).
    pub const FAR_BRANCH: u64 = 1 << 8;
    /// Call-stack mode: calls push, returns pop.
    pub const EN_CALLSTACK: u64 = 1 << 9;
    /// The defined bits (lbr.c `LBR_SEL_MASK`).
    pub const MASK: u64 = 0x3ff;
}

/// PERF_CAPABILITIES[5:0] LBR_FMT: LBR_FORMAT_INFO (FROM/TO plain
/// addresses, flags and cycles in MSR_LBR_INFO_x), Skylake/Ice Lake server.
pub const LBR_FORMAT_INFO: u64 = 5;
/// Records in the stack (lbr.c `intel_pmu_lbr_init_skl`).
pub const DEPTH: usize = 32;

/// MSR_LBR_INFO_x bits (msr-index.h `LBR_INFO_*`).
pub mod info {
    /// The branch was mispredicted.
    pub const MISPRED: u64 = 1 << 63;
}

/// What kind of branch was taken (the classes LBR_SELECT filters); the
/// values are QEMU's `RUSTKVM_LBR_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum BranchKind {
    /// A taken conditional jump (Jcc, LOOP, JCXZ).
    Jcc = 1,
    /// CALL rel.
    NearRelCall = 2,
    /// CALL r/m.
    NearIndCall = 3,
    /// RET.
    NearRet = 4,
    /// JMP r/m.
    NearIndJmp = 5,
    /// JMP rel.
    NearRelJmp = 6,
    /// Far transfers: far CALL/JMP/RET, IRET, SYSCALL/SYSRET, interrupts and
    /// exceptions.
    Far = 7,
}

impl BranchKind {
    /// The kind QEMU reports (`RUSTKVM_LBR_*` in rustkvm.h); None for a
    /// number it never sends.
    pub fn from_abi(kind: u32) -> Option<Self> {
        [
            BranchKind::Jcc,
            BranchKind::NearRelCall,
            BranchKind::NearIndCall,
            BranchKind::NearRet,
            BranchKind::NearIndJmp,
            BranchKind::NearRelJmp,
            BranchKind::Far,
        ]
        .into_iter()
        .find(|k| *k as u32 == kind)
    }

    /// The LBR_SELECT bit that suppresses this kind.
    fn suppress_bit(self) -> u64 {
        match self {
            BranchKind::Jcc => select::JCC,
            BranchKind::NearRelCall => select::NEAR_REL_CALL,
            BranchKind::NearIndCall => select::NEAR_IND_CALL,
            BranchKind::NearRet => select::NEAR_RET,
            BranchKind::NearIndJmp => select::NEAR_IND_JMP,
            BranchKind::NearRelJmp => select::NEAR_REL_JMP,
            BranchKind::Far => select::FAR_BRANCH,
        }
    }
}

/// One taken branch as the engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The branch instruction's address.
    pub from: u64,
    /// Where it went.
    pub to: u64,
    /// Its kind.
    pub kind: BranchKind,
    /// The CPL the branch ends at: LBR_SELECT's CPL bits filter "branches
    /// ending in ring 0" and "ending in ring > 0" (SDM vol. 3B 18.9.1).
    pub cpl: u8,
}

/// The registers a saved machine carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LbrRegs {
    /// IA32_DEBUGCTL.
    pub debugctl: u64,
    /// MSR_LBR_SELECT.
    pub select: u64,
    /// MSR_LBR_TOS.
    pub tos: u64,
    /// The sources.
    pub from: [u64; DEPTH],
    /// The targets.
    pub to: [u64; DEPTH],
    /// The information words.
    pub info: [u64; DEPTH],
}

/// A vCPU's LBR state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lbr {
    /// Whether the vCPU has LBR (KVM: `intel_pmu_lbr_is_enabled`: an Intel
    /// PMU with PDCM and a non-zero LBR_FMT).
    enabled: bool,
    regs: LbrRegs,
}

/// Which register of the LBR MSR space an index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Debugctl,
    LegacyZero,
    Core,
    Select,
    Tos,
    From(usize),
    To(usize),
    Info(usize),
}

fn in_stack(index: u32, base: u32) -> Option<usize> {
    let i = index.checked_sub(base)? as usize;
    (i < DEPTH).then_some(i)
}

impl Reg {
    fn of(index: u32) -> Option<Reg> {
        Some(match index {
            MSR_IA32_DEBUGCTLMSR => Reg::Debugctl,
            MSR_IA32_LASTBRANCH_FIRST..=MSR_IA32_LASTBRANCH_LAST => Reg::LegacyZero,
            i if (MSR_LBR_CORE_FROM..MSR_LBR_CORE_FROM + CORE_DEPTH).contains(&i)
                || (MSR_LBR_CORE_TO..MSR_LBR_CORE_TO + CORE_DEPTH).contains(&i) =>
            {
                Reg::Core
            }
            MSR_LBR_SELECT => Reg::Select,
            MSR_LBR_TOS => Reg::Tos,
            i => {
                if let Some(n) = in_stack(i, MSR_LBR_NHM_FROM) {
                    Reg::From(n)
                } else if let Some(n) = in_stack(i, MSR_LBR_NHM_TO) {
                    Reg::To(n)
                } else if let Some(n) = in_stack(i, MSR_LBR_INFO_0) {
                    Reg::Info(n)
                } else {
                    return None;
                }
            }
        })
    }
}

impl Lbr {
    /// A vCPU's LBR after reset: all registers 0; `enabled` as its model.
    pub fn new(enabled: bool) -> Self {
        Lbr {
            enabled,
            regs: LbrRegs::default(),
        }
    }

    /// Whether the vCPU has LBR.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `index` is an MSR this model answers: IA32_DEBUGCTL, the
    /// legacy last-branch MSRs KVM reads as 0, the LBR stack's MSRs, and
    /// Core 2's stack, which #GPs.
    pub fn owns(index: u32) -> bool {
        Reg::of(index).is_some()
    }

    /// The DEBUGCTL bits a guest may set (`vmx_get_supported_debugctl`).
    fn supported_debugctl(&self) -> u64 {
        if self.enabled {
            debugctl::LBR | debugctl::FREEZE_LBRS_ON_PMI
        } else {
            0
        }
    }

    /// RDMSR of an owned MSR. Without LBR the stack's MSRs #GP
    /// (`intel_pmu_is_valid_lbr_msr` false, `KVM_MSR_RET_UNSUPPORTED`).
    pub fn read_msr(&self, index: u32) -> Result<u64, X86Error> {
        let r = &self.regs;
        match Reg::of(index) {
            Some(Reg::Debugctl) => Ok(r.debugctl),
            Some(Reg::LegacyZero) => Ok(0),
            Some(Reg::Core) => Err(X86Error::Unsupported { msr: index }),
            Some(_) if !self.enabled => Err(X86Error::Unsupported { msr: index }),
            Some(Reg::Select) => Ok(r.select),
            Some(Reg::Tos) => Ok(r.tos),
            Some(Reg::From(i)) => Ok(r.from[i]),
            Some(Reg::To(i)) => Ok(r.to[i]),
            Some(Reg::Info(i)) => Ok(r.info[i]),
            None => Err(X86Error::Unsupported { msr: index }),
        }
    }

    /// WRMSR of an owned MSR. DEBUGCTL: BTF, and LBR without LBR, are
    /// dropped silently; any other unsupported bit #GPs (`vmx_set_msr`).
    /// The stack's MSRs take any value (KVM passes them to the hardware);
    /// TOS keeps its index bits.
    pub fn write_msr(&mut self, index: u32, value: u64) -> Result<(), X86Error> {
        let reg = Reg::of(index).ok_or(X86Error::Unsupported { msr: index })?;
        let supported = self.supported_debugctl();
        let r = &mut self.regs;
        match reg {
            Reg::Debugctl => {
                let silently = debugctl::BTF | debugctl::LBR;
                if value & !supported & !silently != 0 {
                    return Err(X86Error::ReservedBits { msr: index, value });
                }
                r.debugctl = value & supported;
                Ok(())
            }
            Reg::LegacyZero | Reg::Core => Err(X86Error::Unsupported { msr: index }),
            _ if !self.enabled => Err(X86Error::Unsupported { msr: index }),
            Reg::Select => {
                r.select = value & select::MASK;
                Ok(())
            }
            Reg::Tos => {
                r.tos = value & (DEPTH as u64 - 1);
                Ok(())
            }
            Reg::From(i) => {
                r.from[i] = value;
                Ok(())
            }
            Reg::To(i) => {
                r.to[i] = value;
                Ok(())
            }
            Reg::Info(i) => {
                r.info[i] = value;
                Ok(())
            }
        }
    }

    /// Whether taken branches are recorded now: the engine reports them
    /// only then (no cost while DEBUGCTL.LBR is clear).
    pub fn recording(&self) -> bool {
        self.enabled && self.regs.debugctl & debugctl::LBR != 0
    }

    /// Whether LBR_SELECT lets `b` through.
    fn selected(&self, b: &Branch) -> bool {
        let s = self.regs.select;
        let cpl = if b.cpl == 0 {
            select::CPL_EQ_0
        } else {
            select::CPL_NEQ_0
        };
        s & cpl == 0 && s & b.kind.suppress_bit() == 0
    }

    /// A taken branch: recorded at the next slot if recording and the
    /// filter selects it. In call-stack mode a call pushes and a return
    /// pops (the popped record is left as it is, to be overwritten: lbr.c's
    /// call-stack reader stops at the TOS).
    pub fn record(&mut self, b: Branch) {
        if !self.recording() || !self.selected(&b) {
            return;
        }
        let mask = DEPTH as u64 - 1;
        let r = &mut self.regs;
        if r.select & select::EN_CALLSTACK != 0 && b.kind == BranchKind::NearRet {
            r.tos = r.tos.wrapping_sub(1) & mask;
            return;
        }
        r.tos = (r.tos + 1) & mask;
        let i = r.tos as usize;
        r.from[i] = b.from;
        r.to[i] = b.to;
        // Exact branches: nothing mispredicted, no TSX, no cycle count.
        r.info[i] = 0;
    }

    /// The records newest first (from TOS down), as a PEBS record's LBR
    /// group holds them; none without LBR.
    pub fn newest_first(&self) -> Vec<(u64, u64, u64)> {
        if !self.enabled {
            return Vec::new();
        }
        let r = &self.regs;
        (0..DEPTH)
            .map(|i| {
                let k = (r.tos as usize + DEPTH - i) % DEPTH;
                (r.from[k], r.to[k], r.info[k])
            })
            .collect()
    }

    /// A PMI was raised: with FREEZE_LBRS_ON_PMI, recording stops (DEBUGCTL.LBR
    /// cleared), as KVM's `intel_pmu_legacy_freezing_lbrs_on_pmi` for its
    /// version-2 PMU; GLOBAL_STATUS bit 58 is never set.
    pub fn on_pmi(&mut self) {
        if self.enabled && self.regs.debugctl & debugctl::FREEZE_LBRS_ON_PMI != 0 {
            self.regs.debugctl &= !debugctl::LBR;
        }
    }

    /// The registers to save.
    pub fn save(&self) -> LbrRegs {
        self.regs
    }

    /// Load saved registers, each as its MSR write would (host-initiated:
    /// nothing faults; what the vCPU lacks is dropped).
    pub fn load(&mut self, regs: &LbrRegs) {
        let enabled = self.enabled;
        *self = Lbr::new(enabled);
        if !enabled {
            return;
        }
        let mut r = *regs;
        r.debugctl &= self.supported_debugctl();
        r.select &= select::MASK;
        r.tos &= DEPTH as u64 - 1;
        self.regs = r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(from: u64, to: u64) -> Branch {
        Branch {
            from,
            to,
            kind: BranchKind::NearRelCall,
            cpl: 3,
        }
    }

    /// The records newest first, as Linux reads them (`(tos - i) & mask`).
    fn newest_first(l: &Lbr, n: usize) -> Vec<(u64, u64)> {
        let tos = l.read_msr(MSR_LBR_TOS).unwrap() as u32;
        (0..n as u32)
            .map(|i| {
                let k = (tos.wrapping_sub(i)) & (DEPTH as u32 - 1);
                (
                    l.read_msr(MSR_LBR_NHM_FROM + k).unwrap(),
                    l.read_msr(MSR_LBR_NHM_TO + k).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn without_lbr_the_stack_faults_and_debugctl_keeps_kvms_rules() {
        let mut l = Lbr::new(false);
        for msr in [
            MSR_LBR_SELECT,
            MSR_LBR_TOS,
            MSR_LBR_NHM_FROM,
            MSR_LBR_NHM_TO + 31,
            MSR_LBR_INFO_0,
        ] {
            assert!(l.read_msr(msr).is_err(), "{msr:#x}");
            assert!(l.write_msr(msr, 0).is_err(), "{msr:#x}");
        }
        assert_eq!(l.read_msr(0x1db), Ok(0), "LASTBRANCHFROMIP reads 0");
        assert_eq!(
            l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR | debugctl::BTF),
            Ok(())
        );
        assert_eq!(
            l.read_msr(MSR_IA32_DEBUGCTLMSR),
            Ok(0),
            "LBR and BTF dropped"
        );
        assert!(l
            .write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::FREEZE_LBRS_ON_PMI)
            .is_err());
        assert!(
            l.write_msr(MSR_IA32_DEBUGCTLMSR, 1 << 6).is_err(),
            "TR #GPs"
        );
        assert!(!l.recording());
    }

    #[test]
    fn the_stack_is_32_deep_at_kvms_addresses_and_the_core_ones_fault() {
        let mut l = Lbr::new(true);
        // pmu_lbr.c's probe: the CORE addresses must #GP on this model
        // (and are this model's, so that TCG does not take them).
        for msr in [0x40, 0x47, 0x60, 0x67] {
            assert!(Lbr::owns(msr), "{msr:#x}");
            assert!(l.write_msr(msr, 0).is_err(), "{msr:#x}");
            assert!(l.read_msr(msr).is_err(), "{msr:#x}");
        }
        assert!(!Lbr::owns(0x48), "IA32_SPEC_CTRL is not the LBR's");
        for i in 0..DEPTH as u32 {
            assert_eq!(l.write_msr(MSR_LBR_NHM_FROM + i, 0), Ok(()));
            assert_eq!(l.write_msr(MSR_LBR_NHM_TO + i, 0), Ok(()));
            assert_eq!(l.write_msr(MSR_LBR_INFO_0 + i, 0), Ok(()));
        }
        assert!(l.write_msr(MSR_LBR_NHM_FROM + 32, 0).is_err());
        assert!(!Lbr::owns(MSR_LBR_NHM_TO + 32));
        assert_eq!(
            l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR | debugctl::BTF),
            Ok(())
        );
        assert_eq!(
            l.read_msr(MSR_IA32_DEBUGCTLMSR),
            Ok(debugctl::LBR),
            "BTF dropped"
        );
        assert!(
            l.write_msr(MSR_IA32_DEBUGCTLMSR, 1 << 7).is_err(),
            "BTS #GPs"
        );
    }

    #[test]
    fn records_are_every_selected_taken_branch_in_order() {
        let mut l = Lbr::new(true);
        l.record(call(1, 2));
        assert_eq!(
            l.read_msr(MSR_LBR_TOS),
            Ok(0),
            "nothing before DEBUGCTL.LBR"
        );
        l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR).unwrap();
        for i in 0..40u64 {
            l.record(call(0x1000 + i, 0x2000 + i));
        }
        // 40 records in a 32-deep ring: TOS = 40 mod 32; the newest first.
        assert_eq!(l.read_msr(MSR_LBR_TOS), Ok(40 % 32));
        let got = newest_first(&l, 32);
        assert_eq!(got[0], (0x1000 + 39, 0x2000 + 39));
        assert_eq!(got[31], (0x1000 + 8, 0x2000 + 8));
        assert!(got.windows(2).all(|w| w[0].0 == w[1].0 + 1));
        assert_eq!(l.read_msr(MSR_LBR_INFO_0 + 8), Ok(0), "no misprediction");
    }

    #[test]
    fn lbr_select_suppresses_by_cpl_and_kind() {
        let mut l = Lbr::new(true);
        l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR).unwrap();
        l.write_msr(MSR_LBR_SELECT, select::CPL_EQ_0 | select::JCC)
            .unwrap();
        let kernel = Branch {
            cpl: 0,
            ..call(1, 2)
        };
        let jcc = Branch {
            kind: BranchKind::Jcc,
            ..call(3, 4)
        };
        l.record(kernel);
        l.record(jcc);
        assert_eq!(l.read_msr(MSR_LBR_TOS), Ok(0), "both suppressed");
        l.record(call(5, 6));
        assert_eq!(l.read_msr(MSR_LBR_TOS), Ok(1));
        assert_eq!(newest_first(&l, 1), vec![(5, 6)]);
        l.write_msr(MSR_LBR_SELECT, u64::MAX).unwrap();
        assert_eq!(l.read_msr(MSR_LBR_SELECT), Ok(select::MASK));
    }

    #[test]
    fn call_stack_mode_pushes_calls_and_pops_returns() {
        let mut l = Lbr::new(true);
        l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR).unwrap();
        // Linux's CALL_STACK|USER request: 0x3c5.
        l.write_msr(MSR_LBR_SELECT, 0x3c5).unwrap();
        let ret = |from, to| Branch {
            kind: BranchKind::NearRet,
            ..call(from, to)
        };
        l.record(call(0x10, 0x100)); // main -> a
        l.record(call(0x110, 0x200)); // a -> b
        l.record(Branch {
            kind: BranchKind::Jcc,
            ..call(0x210, 0x220)
        });
        l.record(ret(0x230, 0x114)); // b returns
        l.record(call(0x120, 0x300)); // a -> c
        assert_eq!(l.read_msr(MSR_LBR_TOS), Ok(2));
        assert_eq!(
            newest_first(&l, 2),
            vec![(0x120, 0x300), (0x10, 0x100)],
            "c, then a"
        );
    }

    #[test]
    fn a_pmi_freezes_recording_only_with_freeze_lbrs_on_pmi() {
        let mut l = Lbr::new(true);
        l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR).unwrap();
        l.on_pmi();
        assert!(l.recording(), "no freeze asked for");
        l.write_msr(
            MSR_IA32_DEBUGCTLMSR,
            debugctl::LBR | debugctl::FREEZE_LBRS_ON_PMI,
        )
        .unwrap();
        l.record(call(1, 2));
        l.on_pmi();
        assert_eq!(
            l.read_msr(MSR_IA32_DEBUGCTLMSR),
            Ok(debugctl::FREEZE_LBRS_ON_PMI)
        );
        l.record(call(3, 4));
        assert_eq!(newest_first(&l, 1), vec![(1, 2)], "frozen after the PMI");
    }

    #[test]
    fn saved_registers_come_back_and_a_vcpu_without_lbr_drops_them() {
        let mut l = Lbr::new(true);
        l.write_msr(MSR_IA32_DEBUGCTLMSR, debugctl::LBR).unwrap();
        l.write_msr(MSR_LBR_SELECT, select::JCC).unwrap();
        l.record(call(7, 8));
        let saved = l.save();
        let mut m = Lbr::new(true);
        m.load(&saved);
        assert_eq!(m, l);
        let mut off = Lbr::new(false);
        off.load(&saved);
        assert_eq!(off, Lbr::new(false));
    }
}
