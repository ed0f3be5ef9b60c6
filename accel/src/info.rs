//! What `x-query-rustkvm` (QMP) and `info rustkvm` (HMP) report for a vCPU:
//! one shape for both backends.
//!
//! Under `backend=tcg` the values come from rustkvm's models; under
//! `backend=kvm` QEMU reads them from KVM (`cpu_synchronize_state`, i.e.
//! KVM_GET_MSRS, and guest memory) and this module decodes them with the
//! same rules, so the two backends' answers compare field by field. The
//! decoding follows the guest-visible contracts: MSR_KVM_STEAL_TIME and
//! `struct kvm_steal_time` (Documentation/virt/kvm/x86/msr.rst), the
//! pvclock MSR, the x86 PMU registers (Intel SDM vol. 3 §20.2; AMD APM
//! vol. 2 §13.2), arm64 PV time (Documentation/virt/kvm/arm/pvtime.rst) and
//! PMUv3 (Arm ARM D13).

use crate::arm::pmu::SAVED_REGS;
use crate::arm::pvtime::layout as pvtime_layout;
use crate::x86::cpuid::{CPUID_8000_0001_ECX_PERFCTR_CORE, CPUID_8000_0022_EAX_PERFMON_V2};
use crate::x86::pmu::{
    PmuConfig, Vendor, MSR_AMD64_GLOBAL_CTL, MSR_AMD64_GLOBAL_STATUS, MSR_F15H_PERF_CTL0,
    MSR_K7_EVNTSEL0, MSR_K7_PERFCTR0,
};
use crate::x86::steal::{layout as steal_layout, KVM_MSR_ENABLED, KVM_STEAL_VALID_BITS};
use crate::x86::SavedMsrs;

/// IA32_PERFEVTSELx / AMD PerfEvtSeln EN (bit 22).
const EVTSEL_EN: u64 = 1 << 22;
/// Bit of IA32_PERF_GLOBAL_CTRL enabling fixed counter 0 (SDM §20.2.2).
const GLOBAL_CTRL_FIXED0: u32 = 32;
/// kvmclock's MSR_KVM_SYSTEM_TIME_NEW enable bit (msr.rst).
const PVCLOCK_ENABLE: u64 = 1;
/// PMCR_EL0.E: counters enabled (Arm ARM D13.4.6).
const PMCR_E: u64 = 1;
/// Index of the cycle counter in the arm64 PMU's counter space.
const ARM_CYCLE_IDX: usize = 31;

/// The guest's steal-time area: x86 MSR_KVM_STEAL_TIME, arm64 PV time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StealTime {
    /// The guest enabled it (x86: MSR bit 0; arm64: PV_TIME_ST called).
    pub enabled: bool,
    /// Guest-physical address of the structure (0 if none).
    pub gpa: u64,
    /// Stolen nanoseconds as the structure says now.
    pub steal_ns: u64,
    /// x86: `preempted` bit 0 (KVM_VCPU_PREEMPTED).
    pub preempted: bool,
    /// x86: the structure's version (odd while being written); None on
    /// arm64 or when the structure could not be read.
    pub version: Option<u32>,
}

/// kvmclock (x86 only): MSR_KVM_SYSTEM_TIME(_NEW).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pvclock {
    /// Bit 0 of the MSR.
    pub enabled: bool,
    /// Guest-physical address of `struct pvclock_vcpu_time_info`.
    pub gpa: u64,
}

/// One PMU counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// `gpN`, `fixedN` (x86); `evtN`, `cycles` (arm64).
    pub name: String,
    /// Its event select: IA32_PERFEVTSELx / PerfEvtSeln, the counter's
    /// IA32_FIXED_CTR_CTRL nibble, PMEVTYPERn_EL0 / PMCCFILTR_EL0.
    pub config: u64,
    /// Its count now.
    pub value: u64,
    /// Whether it counts now (its enable bits and the global ones).
    pub enabled: bool,
}

/// What one vCPU reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VcpuInfo {
    /// Steal time.
    pub steal: StealTime,
    /// kvmclock (x86).
    pub pvclock: Option<Pvclock>,
    /// PMU version: x86 KVM's `pmu->version` (0: none; Intel 2; AMD 1, 2
    /// with PerfMonV2); arm64 ID_AA64DFR0_EL1.PMUVer (0: none, 1 PMUv3, 6
    /// PMUv3p5; under backend=kvm what KVM gives the guest).
    pub pmu_version: u32,
    /// x86 PMU v2: (GLOBAL_CTRL, GLOBAL_STATUS).
    pub pmu_global: Option<(u64, u64)>,
    /// The counters that exist.
    pub counters: Vec<Counter>,
    /// Timer registers by name.
    pub timer: Vec<(&'static str, u64)>,
}

/// The x86 PMU a vCPU has, however it is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct X86PmuShape {
    /// Whose PMU; None: no PMU.
    pub vendor: Option<Vendor>,
    /// KVM's `pmu->version`.
    pub version: u32,
    /// General-purpose counters.
    pub gp: usize,
    /// Fixed counters.
    pub fixed: usize,
}

/// The CPUID words that describe an x86 vCPU's PMU (under `backend=kvm`,
/// from the CPUID QEMU gave KVM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct X86PmuCpuid {
    /// The vendor is AMD (or Hygon).
    pub amd: bool,
    /// KVM has a vPMU for it: its `enable_pmu`, and `pmu=on` or an AMD
    /// vendor (`amd_pmu_refresh` looks at no `pmu=`).
    pub pmu: bool,
    /// CPUID 0xA EAX and EDX.
    pub leaf_a: [u32; 2],
    /// CPUID 0x80000001 ECX.
    pub ext1_ecx: u32,
    /// CPUID 0x80000022 EAX and EBX.
    pub ext22: [u32; 2],
}

impl X86PmuShape {
    /// From rustkvm's PMU model.
    pub fn from_config(c: PmuConfig) -> X86PmuShape {
        if c.version == 0 {
            return X86PmuShape::default();
        }
        X86PmuShape {
            vendor: Some(c.vendor),
            version: u32::from(c.version),
            gp: c.gp_counters(),
            fixed: c.fixed_counters(),
        }
    }

    /// From CPUID, as KVM derives its vPMU: `intel_pmu_refresh` (0xA:
    /// EAX[7:0] version, EAX[15:8] GP counters, EDX[4:0] fixed counters
    /// from version 2) and `amd_pmu_refresh` (PerfMonV2: 0x80000022 EBX[3:0]
    /// counters, version 2; else 6 with PerfCtrExtCore, else 4; version 1).
    pub fn from_cpuid(c: X86PmuCpuid) -> X86PmuShape {
        if !c.pmu {
            return X86PmuShape::default();
        }
        if c.amd {
            let (version, gp) = if c.ext22[0] & CPUID_8000_0022_EAX_PERFMON_V2 != 0 {
                (2, (c.ext22[1] & 0xf) as usize)
            } else if c.ext1_ecx & CPUID_8000_0001_ECX_PERFCTR_CORE != 0 {
                (1, 6)
            } else {
                (1, 4)
            };
            return X86PmuShape {
                vendor: Some(Vendor::Amd),
                version,
                gp: gp.min(6),
                fixed: 0,
            };
        }
        let version = c.leaf_a[0] & 0xff;
        if version == 0 {
            return X86PmuShape::default();
        }
        X86PmuShape {
            vendor: Some(Vendor::Intel),
            version,
            gp: ((c.leaf_a[0] >> 8) & 0xff).min(8) as usize,
            fixed: if version > 1 {
                (c.leaf_a[1] & 0x1f).min(3) as usize
            } else {
                0
            },
        }
    }
}

/// Where the value of one of an AMD guest's PMU MSRs goes in its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmdPmuReg {
    /// PerfEvtSel of GP counter `i`.
    EventSelect(usize),
    /// PerfCtr `i`.
    Counter(usize),
    /// PerfMonV2 PerfCntrGlobalCtl.
    GlobalCtl,
    /// PerfMonV2 PerfCntrGlobalStatus.
    GlobalStatus,
}

impl X86PmuCpuid {
    /// The PMU MSRs KVM holds for an AMD guest with this CPUID, in the order
    /// to read them (`backend=kvm`: QEMU 10.0 does not read them itself):
    /// per GP counter its select then its counter, at the PerfCtrExtCore
    /// addresses (MSR_F15H_PERF_CTL0 + 2i, interleaved) when the guest has
    /// that bit, else at the legacy K7 ones; then PerfMonV2's global control
    /// and status. How many counters: [`X86PmuShape::from_cpuid`], as KVM's
    /// `amd_pmu_refresh`. Empty for an Intel guest or one without a PMU.
    pub fn amd_pmu_msrs(&self) -> Vec<(u32, AmdPmuReg)> {
        let shape = X86PmuShape::from_cpuid(*self);
        if shape.vendor != Some(Vendor::Amd) {
            return Vec::new();
        }
        let core = self.ext1_ecx & CPUID_8000_0001_ECX_PERFCTR_CORE != 0;
        let mut msrs = Vec::with_capacity(2 * shape.gp + 2);
        for i in 0..shape.gp {
            let (select, counter) = if core {
                let select = MSR_F15H_PERF_CTL0 + 2 * i as u32;
                (select, select + 1)
            } else {
                (MSR_K7_EVNTSEL0 + i as u32, MSR_K7_PERFCTR0 + i as u32)
            };
            msrs.push((select, AmdPmuReg::EventSelect(i)));
            msrs.push((counter, AmdPmuReg::Counter(i)));
        }
        if shape.version >= 2 {
            msrs.push((MSR_AMD64_GLOBAL_CTL, AmdPmuReg::GlobalCtl));
            msrs.push((MSR_AMD64_GLOBAL_STATUS, AmdPmuReg::GlobalStatus));
        }
        msrs
    }
}

/// Little-endian u64 at `off` of a 64-byte structure.
fn le64(b: &[u8; 64], off: u64) -> u64 {
    let o = off as usize;
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(w)
}

/// Little-endian u32 at `off`.
fn le32(b: &[u8; 64], off: u64) -> u32 {
    let o = off as usize;
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(w)
}

/// An x86 vCPU: its MSRs (as saved for vmstate), its PMU, and the steal-time
/// structure's 64 bytes if the MSR enables it and they could be read.
pub fn x86(msrs: &SavedMsrs, pmu: X86PmuShape, steal: Option<&[u8; 64]>) -> VcpuInfo {
    let enabled = msrs.steal_time & KVM_MSR_ENABLED != 0;
    let mut st = StealTime {
        enabled,
        gpa: msrs.steal_time & KVM_STEAL_VALID_BITS,
        ..StealTime::default()
    };
    if let (true, Some(b)) = (enabled, steal) {
        st.steal_ns = le64(b, steal_layout::STEAL);
        st.version = Some(le32(b, steal_layout::VERSION));
        st.preempted = b[steal_layout::PREEMPTED as usize] & 1 != 0;
    }
    let p = &msrs.pmu;
    let global = pmu.version >= 2;
    let on = |bit: u32| !global || p.global_ctrl & (1u64 << bit) != 0;
    let mut counters = Vec::new();
    for i in 0..pmu.gp.min(p.gp.len()) {
        counters.push(Counter {
            name: format!("gp{i}"),
            config: p.evtsel[i],
            value: p.gp[i],
            enabled: p.evtsel[i] & EVTSEL_EN != 0 && on(i as u32),
        });
    }
    for j in 0..pmu.fixed.min(p.fixed.len()) {
        let ctrl = (p.fixed_ctrl >> (4 * j)) & 0xf;
        counters.push(Counter {
            name: format!("fixed{j}"),
            config: ctrl,
            value: p.fixed[j],
            enabled: ctrl & 3 != 0 && on(GLOBAL_CTRL_FIXED0 + j as u32),
        });
    }
    VcpuInfo {
        steal: st,
        pvclock: Some(Pvclock {
            enabled: msrs.system_time & PVCLOCK_ENABLE != 0,
            gpa: msrs.system_time & !PVCLOCK_ENABLE,
        }),
        pmu_version: if pmu.vendor.is_some() { pmu.version } else { 0 },
        pmu_global: (pmu.vendor.is_some() && global).then_some((p.global_ctrl, p.global_status)),
        counters,
        timer: vec![("tsc-deadline", msrs.tsc_deadline), ("tsc", msrs.tsc)],
    }
}

/// The arm64 PMU as [`crate::arm::pmu::Pmu::save_regs`] lays it out.
#[derive(Debug, Clone, Copy)]
pub struct ArmPmu<'a> {
    /// Event counters (PMCR_EL0.N).
    pub counters: usize,
    /// ID_AA64DFR0_EL1.PMUVer (1: PMUv3, 4: v3p1 ... 6: v3p5, 7: v3p7).
    pub version: u32,
    /// The saved registers.
    pub regs: &'a [u64; SAVED_REGS],
}

/// ID_AA64DFR0_EL1.PMUVer for PMUv3 (Arm ARM D23.2.60).
pub const ARM_PMUVER_V3: u32 = 1;
/// ID_AA64DFR0_EL1.PMUVer for PMUv3p5.
pub const ARM_PMUVER_V3P5: u32 = 6;
/// ID_AA64DFR0_EL1.PMUVer: IMPLEMENTATION DEFINED PMU, not PMUv3.
pub const ARM_PMUVER_IMPDEF: u32 = 0xf;

impl<'a> ArmPmu<'a> {
    /// The PMU of a vCPU whose registers QEMU synchronized from KVM
    /// (`backend=kvm`), laid out as [`crate::arm::pmu::Pmu::save_regs`]
    /// does: PMCR_EL0.N event counters, `pmuver` its ID_AA64DFR0_EL1
    /// field; None when that field says there is no PMUv3.
    pub fn from_kvm(pmuver: u32, regs: &'a [u64; SAVED_REGS]) -> Option<ArmPmu<'a>> {
        (pmuver != 0 && pmuver != ARM_PMUVER_IMPDEF).then(|| ArmPmu {
            counters: ((regs[0] >> crate::arm::pmu::pmcr::N_SHIFT) & 0x1f) as usize,
            version: pmuver,
            regs,
        })
    }
}

/// The arm64 generic timers' registers (QEMU's, under both backends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArmTimers {
    /// CNTV_CTL_EL0.
    pub cntv_ctl: u64,
    /// CNTV_CVAL_EL0.
    pub cntv_cval: u64,
    /// CNTP_CTL_EL0.
    pub cntp_ctl: u64,
    /// CNTP_CVAL_EL0.
    pub cntp_cval: u64,
}

/// An arm64 vCPU: its PMU (None: no PMU), PV time (whether the guest asked
/// for it, the structure's IPA and its 64 bytes if read) and timers.
pub fn arm(
    pmu: Option<ArmPmu<'_>>,
    pvtime: (bool, u64, Option<&[u8; 64]>),
    timers: ArmTimers,
) -> VcpuInfo {
    let (enabled, gpa, bytes) = pvtime;
    let steal = StealTime {
        enabled,
        gpa,
        steal_ns: match (enabled, bytes) {
            (true, Some(b)) => le64(b, pvtime_layout::STOLEN_TIME),
            _ => 0,
        },
        preempted: false,
        version: None,
    };
    let mut counters = Vec::new();
    let mut pmu_version = 0;
    if let Some(p) = pmu {
        pmu_version = p.version;
        let (pmcr, cnten) = (p.regs[0], p.regs[1]);
        let counting = |i: usize| pmcr & PMCR_E != 0 && cnten & (1u64 << i) != 0;
        for i in (0..p.counters.min(ARM_CYCLE_IDX)).chain([ARM_CYCLE_IDX]) {
            counters.push(Counter {
                name: if i == ARM_CYCLE_IDX {
                    "cycles".to_string()
                } else {
                    format!("evt{i}")
                },
                config: p.regs[6 + i],
                value: p.regs[38 + i],
                enabled: counting(i),
            });
        }
    }
    VcpuInfo {
        steal,
        pvclock: None,
        pmu_version,
        pmu_global: None,
        counters,
        timer: vec![
            ("cntv-ctl", timers.cntv_ctl),
            ("cntv-cval", timers.cntv_cval),
            ("cntp-ctl", timers.cntp_ctl),
            ("cntp-cval", timers.cntp_cval),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86::pmu::PmuRegs;

    fn steal_struct(steal: u64, version: u32, preempted: u8) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&steal.to_le_bytes());
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[16] = preempted;
        b
    }

    #[test]
    fn x86_steal_time_and_kvmclock_decode_as_msr_rst_says() {
        let msrs = SavedMsrs {
            steal_time: 0x12_3440 | 1,
            system_time: 0x5000 | 1,
            tsc_deadline: 77,
            tsc: 99,
            ..SavedMsrs::default()
        };
        let b = steal_struct(123_456, 8, 1);
        let i = x86(&msrs, X86PmuShape::default(), Some(&b));
        assert_eq!(
            i.steal,
            StealTime {
                enabled: true,
                gpa: 0x12_3440,
                steal_ns: 123_456,
                preempted: true,
                version: Some(8)
            }
        );
        assert_eq!(
            i.pvclock,
            Some(Pvclock {
                enabled: true,
                gpa: 0x5000
            })
        );
        assert_eq!(i.timer, vec![("tsc-deadline", 77), ("tsc", 99)]);
        assert_eq!(i.pmu_version, 0);
        assert!(i.counters.is_empty() && i.pmu_global.is_none());
        // Disabled: the structure is not the guest's any more, not decoded.
        let off = SavedMsrs {
            steal_time: 0x12_3440,
            ..msrs
        };
        let i = x86(&off, X86PmuShape::default(), Some(&b));
        assert!(!i.steal.enabled && i.steal.version.is_none() && i.steal.steal_ns == 0);
        // Unreadable (not RAM): enabled, nothing else known.
        let i = x86(&msrs, X86PmuShape::default(), None);
        assert!(i.steal.enabled && i.steal.version.is_none());
    }

    #[test]
    fn x86_counters_are_enabled_by_their_select_and_global_ctrl() {
        let mut pmu = PmuRegs::default();
        pmu.evtsel[0] = EVTSEL_EN | 0xc0;
        pmu.evtsel[1] = EVTSEL_EN | 0xc4;
        pmu.gp[0] = 1000;
        pmu.fixed_ctrl = 0x0b0; // fixed1: OS|USR|PMI; fixed0 off
        pmu.global_ctrl = 1 | (1 << 33);
        pmu.fixed[1] = 5;
        let msrs = SavedMsrs {
            pmu,
            ..SavedMsrs::default()
        };
        let i = x86(&msrs, X86PmuShape::from_config(PmuConfig::TCG), None);
        assert_eq!(i.pmu_version, 2);
        assert_eq!(i.counters.len(), 4 + 3);
        let c = |n: &str| i.counters.iter().find(|c| c.name == n).unwrap().clone();
        assert!(c("gp0").enabled && c("gp0").value == 1000 && c("gp0").config == EVTSEL_EN | 0xc0);
        assert!(!c("gp1").enabled, "GLOBAL_CTRL bit 1 clear");
        assert!(!c("fixed0").enabled);
        assert!(c("fixed1").enabled && c("fixed1").config == 0xb && c("fixed1").value == 5);
        assert_eq!(i.pmu_global, Some((1 | (1 << 33), 0)));

        // AMD without PerfMonV2: no global control, EN alone counts.
        let amd = X86PmuShape::from_config(PmuConfig::amd(false, false, 0));
        let i = x86(&msrs, amd, None);
        assert_eq!((i.pmu_version, i.counters.len()), (1, 4));
        assert!(i.counters[1].enabled && i.pmu_global.is_none());
    }

    #[test]
    fn x86_pmu_shape_from_cpuid_follows_kvms_refresh() {
        let intel = X86PmuCpuid {
            pmu: true,
            leaf_a: [0x0830_0402, 0x0603],
            ..X86PmuCpuid::default()
        };
        assert_eq!(
            X86PmuShape::from_cpuid(intel),
            X86PmuShape {
                vendor: Some(Vendor::Intel),
                version: 2,
                gp: 4,
                fixed: 3
            }
        );
        // The rustkvm model's CPUID gives back the model's shape.
        let [eax, _, _, edx] = PmuConfig::TCG.cpuid_0xa();
        assert_eq!(
            X86PmuShape::from_cpuid(X86PmuCpuid {
                leaf_a: [eax, edx],
                ..intel
            }),
            X86PmuShape::from_config(PmuConfig::TCG)
        );
        assert_eq!(
            X86PmuShape::from_cpuid(X86PmuCpuid {
                pmu: false,
                ..intel
            }),
            X86PmuShape::default()
        );
        let amd = X86PmuCpuid {
            amd: true,
            pmu: true,
            ..X86PmuCpuid::default()
        };
        assert_eq!(X86PmuShape::from_cpuid(amd).gp, 4);
        assert_eq!(
            X86PmuShape::from_cpuid(X86PmuCpuid {
                ext1_ecx: CPUID_8000_0001_ECX_PERFCTR_CORE,
                ..amd
            }),
            X86PmuShape::from_config(PmuConfig::amd(true, false, 0))
        );
        assert_eq!(
            X86PmuShape::from_cpuid(X86PmuCpuid {
                ext1_ecx: CPUID_8000_0001_ECX_PERFCTR_CORE,
                ext22: [CPUID_8000_0022_EAX_PERFMON_V2, 5],
                ..amd
            }),
            X86PmuShape::from_config(PmuConfig::amd(true, true, 5))
        );
    }

    #[test]
    fn amd_pmu_msrs_follow_kvms_layout() {
        use AmdPmuReg::*;
        let amd = X86PmuCpuid {
            amd: true,
            pmu: true,
            ..X86PmuCpuid::default()
        };
        // legacy: four K7 counters, selects and counters in two banks
        let legacy = amd.amd_pmu_msrs();
        assert_eq!(legacy.len(), 8);
        assert_eq!(legacy[0], (0xc001_0000, EventSelect(0)));
        assert_eq!(legacy[1], (0xc001_0004, Counter(0)));
        assert_eq!(legacy[7], (0xc001_0007, Counter(3)));
        // PerfCtrExtCore: six, interleaved at 0xc0010200
        let core = X86PmuCpuid {
            ext1_ecx: CPUID_8000_0001_ECX_PERFCTR_CORE,
            ..amd
        }
        .amd_pmu_msrs();
        assert_eq!(core.len(), 12);
        assert_eq!(core[0], (0xc001_0200, EventSelect(0)));
        assert_eq!(core[1], (0xc001_0201, Counter(0)));
        assert_eq!(core[11], (0xc001_020b, Counter(5)));
        // PerfMonV2: EBX[3:0] counters (at most 6) and the global pair
        let v2 = X86PmuCpuid {
            ext1_ecx: CPUID_8000_0001_ECX_PERFCTR_CORE,
            ext22: [CPUID_8000_0022_EAX_PERFMON_V2, 0xf],
            ..amd
        }
        .amd_pmu_msrs();
        assert_eq!(v2.len(), 14);
        assert_eq!(v2[12], (0xc000_0301, GlobalCtl));
        assert_eq!(v2[13], (0xc000_0300, GlobalStatus));
        // none for Intel, or without pmu=on
        assert!(X86PmuCpuid {
            amd: false,
            leaf_a: [0x0408_0802, 3],
            ..amd
        }
        .amd_pmu_msrs()
        .is_empty());
        assert!(X86PmuCpuid { pmu: false, ..amd }.amd_pmu_msrs().is_empty());
    }

    #[test]
    fn arm_pv_time_pmu_and_timers_decode() {
        let mut regs = [0u64; SAVED_REGS];
        regs[0] = PMCR_E;
        regs[1] = 1 | (1 << 31);
        regs[6] = 0x08; // evt0: INST_RETIRED
        regs[6 + 31] = 0; // PMCCFILTR
        regs[38] = 42;
        regs[38 + 31] = 9000;
        let mut b = [0u8; 64];
        b[8..16].copy_from_slice(&555u64.to_le_bytes());
        let i = arm(
            Some(ArmPmu {
                counters: 6,
                version: ARM_PMUVER_V3P5,
                regs: &regs,
            }),
            (true, 0x90a_0040, Some(&b)),
            ArmTimers {
                cntv_ctl: 1,
                cntv_cval: 2,
                cntp_ctl: 3,
                cntp_cval: 4,
            },
        );
        assert_eq!(
            (i.steal.enabled, i.steal.gpa, i.steal.steal_ns),
            (true, 0x90a_0040, 555)
        );
        assert_eq!(i.pmu_version, 6);
        assert_eq!(i.counters.len(), 7);
        assert_eq!(
            i.counters[0],
            Counter {
                name: "evt0".into(),
                config: 8,
                value: 42,
                enabled: true
            }
        );
        assert!(!i.counters[1].enabled);
        assert_eq!(i.counters[6].name, "cycles");
        assert!(i.counters[6].enabled && i.counters[6].value == 9000);
        assert_eq!(i.timer[1], ("cntv-cval", 2));
        assert!(i.pvclock.is_none());
        // PMCR_EL0.E clear: nothing counts.
        regs[0] = 0;
        let i = arm(
            Some(ArmPmu {
                counters: 6,
                version: ARM_PMUVER_V3,
                regs: &regs,
            }),
            (false, 0x90a_0040, Some(&b)),
            ArmTimers::default(),
        );
        assert!(i.counters.iter().all(|c| !c.enabled));
        assert_eq!((i.pmu_version, i.steal.steal_ns), (1, 0));
        assert_eq!(
            arm(None, (false, 0, None), ArmTimers::default()).pmu_version,
            0
        );
    }

    #[test]
    fn arm_pmu_from_kvm_takes_n_from_pmcr_and_the_version_as_kvm_gives_it() {
        let mut regs = [0u64; SAVED_REGS];
        regs[0] = (5 << crate::arm::pmu::pmcr::N_SHIFT) | PMCR_E;
        let p = ArmPmu::from_kvm(4, &regs).expect("PMUv3p1");
        assert_eq!((p.counters, p.version), (5, 4));
        let i = arm(Some(p), (false, 0, None), ArmTimers::default());
        assert_eq!((i.pmu_version, i.counters.len()), (4, 6));
        assert!(ArmPmu::from_kvm(0, &regs).is_none());
        assert!(ArmPmu::from_kvm(ARM_PMUVER_IMPDEF, &regs).is_none());
    }
}
