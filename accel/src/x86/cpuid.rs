//! KVM's CPUID leaves as rustkvm implements them.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/cpuid.rst`,
//! `arch/x86/include/uapi/asm/kvm_para.h`.

use crate::x86::clock::TscRate;

/// KVM_CPUID_SIGNATURE: EAX = highest KVM leaf, EBX/ECX/EDX = "KVMKVMKVM\0\0\0".
pub const KVM_CPUID_SIGNATURE: u32 = 0x4000_0000;
/// KVM_CPUID_FEATURES: EAX = feature bits, EDX = hints.
pub const KVM_CPUID_FEATURES: u32 = 0x4000_0001;

/// KVM_FEATURE_CLOCKSOURCE (kvmclock, MSRs 0x11/0x12).
pub const KVM_FEATURE_CLOCKSOURCE: u32 = 1 << 0;
/// KVM_FEATURE_NOP_IO_DELAY: the guest may skip port-I/O delays.
pub const KVM_FEATURE_NOP_IO_DELAY: u32 = 1 << 1;
/// KVM_FEATURE_CLOCKSOURCE2 (kvmclock, MSRs 0x4b564d00/01).
pub const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// KVM_FEATURE_ASYNC_PF.
pub const KVM_FEATURE_ASYNC_PF: u32 = 1 << 4;
/// KVM_FEATURE_STEAL_TIME (MSR 0x4b564d03).
pub const KVM_FEATURE_STEAL_TIME: u32 = 1 << 5;
/// KVM_FEATURE_PV_EOI.
pub const KVM_FEATURE_PV_EOI: u32 = 1 << 6;
/// KVM_FEATURE_PV_UNHALT (KVM_HC_KICK_CPU).
pub const KVM_FEATURE_PV_UNHALT: u32 = 1 << 7;
/// KVM_FEATURE_PV_TLB_FLUSH: KVM_VCPU_FLUSH_TLB in a preempted vCPU's
/// steal-time `preempted` stands for a TLB-flush IPI.
pub const KVM_FEATURE_PV_TLB_FLUSH: u32 = 1 << 9;
/// KVM_FEATURE_PV_SEND_IPI (KVM_HC_SEND_IPI).
pub const KVM_FEATURE_PV_SEND_IPI: u32 = 1 << 11;
/// KVM_FEATURE_POLL_CONTROL (MSR_KVM_POLL_CONTROL).
pub const KVM_FEATURE_POLL_CONTROL: u32 = 1 << 12;
/// KVM_FEATURE_PV_SCHED_YIELD (KVM_HC_SCHED_YIELD).
pub const KVM_FEATURE_PV_SCHED_YIELD: u32 = 1 << 13;
/// KVM_FEATURE_ASYNC_PF_INT (MSR_KVM_ASYNC_PF_INT, MSR_KVM_ASYNC_PF_ACK).
pub const KVM_FEATURE_ASYNC_PF_INT: u32 = 1 << 14;
/// KVM_FEATURE_MSI_EXT_DEST_ID: MSI address bits 11:5 carry destination
/// bits 14:8 (`x86::msi`).
pub const KVM_FEATURE_MSI_EXT_DEST_ID: u32 = 1 << 15;
/// KVM_FEATURE_CLOCKSOURCE_STABLE_BIT.
pub const KVM_FEATURE_CLOCKSOURCE_STABLE_BIT: u32 = 1 << 24;

/// QEMU's register numbering in a CPUID feature word (`R_EAX` ...).
pub const REG_EAX: u32 = 0;
/// `R_ECX`.
pub const REG_ECX: u32 = 1;
/// `R_EDX`.
pub const REG_EDX: u32 = 2;
/// `R_EBX`.
pub const REG_EBX: u32 = 3;

/// `CPUID.1:ECX[24]` TSC_DEADLINE: the local APIC's TSC-deadline mode (SDM).
pub const CPUID_1_ECX_TSC_DEADLINE: u32 = 1 << 24;
/// `CPUID.(EAX=7,ECX=0):EBX[1]` TSC_ADJUST: IA32_TSC_ADJUST.
pub const CPUID_7_0_EBX_TSC_ADJUST: u32 = 1 << 1;
/// `CPUID.80000007H:EDX[8]` invariant TSC.
pub const CPUID_8000_0007_EDX_INVTSC: u32 = 1 << 8;

/// KVM feature bits rustkvm implements today. A bit not here is never
/// offered to the guest, whatever `-cpu` asks (QEMU warns that it is
/// unsupported, as it does for any feature the accelerator lacks).
pub const IMPLEMENTED_KVM_FEATURES: u32 = KVM_FEATURE_CLOCKSOURCE
    | KVM_FEATURE_NOP_IO_DELAY
    | KVM_FEATURE_CLOCKSOURCE2
    | KVM_FEATURE_CLOCKSOURCE_STABLE_BIT
    | KVM_FEATURE_STEAL_TIME
    | KVM_FEATURE_PV_EOI
    | KVM_FEATURE_PV_UNHALT
    | KVM_FEATURE_PV_TLB_FLUSH
    | KVM_FEATURE_PV_SEND_IPI
    | KVM_FEATURE_POLL_CONTROL
    | KVM_FEATURE_PV_SCHED_YIELD
    | KVM_FEATURE_MSI_EXT_DEST_ID;

/// The KVM features QEMU turns on by default for named CPU models under KVM
/// (`kvm_default_props` in QEMU's `target/i386/cpu.c`: kvmclock,
/// kvm-nopiodelay, kvm-asyncpf, kvm-steal-time, kvm-pv-eoi,
/// kvmclock-stable-bit). `-cpu max` gets every implemented feature, as
/// `-cpu host` does under KVM.
pub const KVM_DEFAULT_FEATURES: u32 = KVM_FEATURE_CLOCKSOURCE
    | KVM_FEATURE_NOP_IO_DELAY
    | KVM_FEATURE_CLOCKSOURCE2
    | KVM_FEATURE_ASYNC_PF
    | KVM_FEATURE_STEAL_TIME
    | KVM_FEATURE_PV_EOI
    | KVM_FEATURE_CLOCKSOURCE_STABLE_BIT;

/// CPUID.1:ECX bit 3 MONITOR: MONITOR/MWAIT (SDM vol. 2A, CPUID).
pub const CPUID_1_ECX_MONITOR: u32 = 1 << 3;

/// CPUID.1:ECX bit 15 PDCM: IA32_PERF_CAPABILITIES exists (QEMU clears it
/// without `pmu=on`; SDM vol. 2A, CPUID).
pub const CPUID_1_ECX_PDCM: u32 = 1 << 15;
/// CPUID.1:ECX bit 2 DTES64: the 64-bit DS save area layout (PEBS).
pub const CPUID_1_ECX_DTES64: u32 = 1 << 2;
/// CPUID.1:EDX bit 21 DS: the DS save area, IA32_DS_AREA (PEBS).
pub const CPUID_1_EDX_DS: u32 = 1 << 21;
/// CPUID 0x80000001 ECX bit 23 PerfCtrExtCore: six core counters at
/// 0xc0010200 (APM vol. 3, CPUID Fn8000_0001_ECX).
pub const CPUID_8000_0001_ECX_PERFCTR_CORE: u32 = 1 << 23;
/// CPUID 0x80000022 EAX bit 0 PerfMonV2: the global control and status
/// MSRs (APM vol. 3, CPUID Fn8000_0022_EAX).
pub const CPUID_8000_0022_EAX_PERFMON_V2: u32 = 1;

/// CPUID 0x15: the TSC / core crystal clock ratio (EAX denominator, EBX
/// numerator) and the crystal's rate in Hz (ECX) (SDM vol. 2A, CPUID leaf
/// 15H; Linux `native_calibrate_tsc`, perf's `arch_get_tsc_freq`).
pub const CPUID_TSC_CRYSTAL: u32 = 0x15;
/// CPUID 0x16: processor base (EAX[15:0]), maximum (EBX[15:0]) and bus
/// (ECX[15:0]) frequency in MHz (SDM vol. 2A, CPUID leaf 16H).
pub const CPUID_PROCESSOR_FREQUENCY: u32 = 0x16;
/// CPUID 0x40000010: the TSC (EAX) and APIC bus (EBX) rates in kHz, the
/// leaf QEMU adds under KVM with `vmware-cpuid-freq` (`kvm_arch_init_vcpu`
/// in QEMU's `target/i386/kvm/kvm.c`).
pub const CPUID_HV_TIMING: u32 = 0x4000_0010;
/// The basic CPUID level that holds both TSC leaves: Intel models under
/// rustkvm get at least this one (unless `-cpu ...,level=` says otherwise).
pub const TSC_LEAVES_MIN_LEVEL: u32 = CPUID_PROCESSOR_FREQUENCY;
/// The local APIC timer's input clock in Hz: QEMU's TCG local APIC counts
/// nanoseconds of VM time (`hw/intc/apic.c`), as KVM's does
/// (KVM_APIC_BUS_FREQUENCY, 1 GHz). It is what leaf 0x15 reports as the
/// core crystal, which is the local APIC timer's clock on the CPUs that
/// enumerate it (Linux sets `lapic_timer_period` from it).
pub const APIC_BUS_HZ: u64 = 1_000_000_000;

/// What TSC-rate leaf `leaf` (0x15, 0x16 or 0x40000010) holds for a guest
/// TSC of `rate`, as EAX, EBX, ECX, EDX; zeros for any other leaf. The
/// ratio is exact: crystal Hz * EBX / EAX = the TSC's rate in Hz.
pub fn tsc_leaf(leaf: u32, rate: TscRate) -> [u32; 4] {
    let khz = rate.khz();
    let crystal_khz = APIC_BUS_HZ / 1000;
    let clamp = |v: u64, max: u64| v.min(max) as u32;
    match leaf {
        CPUID_TSC_CRYSTAL => {
            let g = gcd(khz, crystal_khz);
            [
                clamp(crystal_khz / g, u32::MAX.into()),
                clamp(khz / g, u32::MAX.into()),
                APIC_BUS_HZ as u32,
                0,
            ]
        }
        CPUID_PROCESSOR_FREQUENCY => {
            let mhz = clamp(khz / 1000, 0xffff);
            [mhz, mhz, clamp(APIC_BUS_HZ / 1_000_000, 0xffff), 0]
        }
        CPUID_HV_TIMING => [clamp(khz, u32::MAX.into()), crystal_khz as u32, 0, 0],
        _ => [0; 4],
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Which bits of CPUID `leaf`/`subleaf` register `reg` rustkvm can offer,
/// given what TCG offers (`tcg`).
/// Besides KVM's leaves: the TSC-deadline timer, IA32_TSC_ADJUST and the
/// invariant TSC (the guest TSC counts VM time at a fixed rate, see
/// `x86::clock`), which TCG lacks, PDCM (the PMU's
/// IA32_PERF_CAPABILITIES, with full-width counter writes), and DS and
/// DTES64 (PEBS's DS save area; a vCPU without PEBS does not show them).
pub fn supported(leaf: u32, subleaf: u32, reg: u32, tcg: u32) -> u32 {
    match (leaf, subleaf, reg) {
        (KVM_CPUID_FEATURES, _, REG_EAX) => tcg | IMPLEMENTED_KVM_FEATURES,
        (1, _, REG_ECX) => tcg | CPUID_1_ECX_TSC_DEADLINE | CPUID_1_ECX_PDCM | CPUID_1_ECX_DTES64,
        (1, _, REG_EDX) => tcg | CPUID_1_EDX_DS,
        (7, 0, REG_EBX) => tcg | CPUID_7_0_EBX_TSC_ADJUST,
        (0x8000_0007, _, REG_EDX) => tcg | CPUID_8000_0007_EDX_INVTSC,
        // The AMD PMU's PerfCtrExtCore and PerfMonV2 (with pmu=on).
        (0x8000_0001, _, REG_ECX) => tcg | CPUID_8000_0001_ECX_PERFCTR_CORE,
        (0x8000_0022, _, REG_EAX) => tcg | CPUID_8000_0022_EAX_PERFMON_V2,
        _ => tcg,
    }
}

/// Which of rustkvm's CPUID defaults a vCPU gets (QEMU's
/// `-cpu ...,x-rustkvm-cpuid-defaults=N`). The defaults are part of the
/// guest ABI of a versioned machine type, so they are versioned too: a
/// version, once released, never changes (`defaults_1_is_frozen`), and a
/// new default comes as a new version that only newer machine types get,
/// older ones keeping theirs through a machine-type compat property
/// (docs/architecture.md, "CPUID defaults and machine types").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuidDefaults {
    /// 0: none; the CPU model's CPUID as TCG gives it.
    None,
    /// 1: rustkvm's defaults on QEMU 10.0's machine types: KVM's default PV
    /// features that rustkvm implements ([`DEFAULTS_1_KVM_FEATURES`]) for
    /// named models, MONITOR/MWAIT off for every model.
    V1,
}

/// The KVM features named models get with [`CpuidDefaults::V1`]:
/// [`KVM_DEFAULT_FEATURES`] that rustkvm implemented when V1 was released
/// (kvmclock with both MSR pairs and its stable bit, nopiodelay, steal
/// time, PV EOI). Frozen: implementing another default does not add it here.
pub const DEFAULTS_1_KVM_FEATURES: u32 = KVM_FEATURE_CLOCKSOURCE
    | KVM_FEATURE_NOP_IO_DELAY
    | KVM_FEATURE_CLOCKSOURCE2
    | KVM_FEATURE_STEAL_TIME
    | KVM_FEATURE_PV_EOI
    | KVM_FEATURE_CLOCKSOURCE_STABLE_BIT;

impl CpuidDefaults {
    /// What a machine type without a compat property gets: the newest.
    pub const LATEST: CpuidDefaults = CpuidDefaults::V1;

    /// The version numbered `n` (the property's value), if there is one.
    pub fn from_number(n: u32) -> Option<CpuidDefaults> {
        match n {
            0 => Some(CpuidDefaults::None),
            1 => Some(CpuidDefaults::V1),
            _ => None,
        }
    }

    /// Which bits named CPU models get by default (before the user's `-cpu`
    /// switches), as under KVM; always a subset of [`supported`].
    pub fn defaults(self, leaf: u32, _subleaf: u32, reg: u32) -> u32 {
        match (self, leaf, reg) {
            (CpuidDefaults::V1, KVM_CPUID_FEATURES, REG_EAX) => DEFAULTS_1_KVM_FEATURES,
            _ => 0,
        }
    }

    /// Which bits every CPU model, `max` included, has off unless the
    /// user's `-cpu` turns them on: MONITOR/MWAIT, which KVM does not offer
    /// (MWAIT exits unless `KVM_X86_DISABLE_EXITS_MWAIT`; QEMU's
    /// `kvm_default_props` has "monitor=off"). A guest then idles with HLT,
    /// as a KVM guest does, and Linux takes the PV paths it reserves for
    /// guests without MWAIT (PV TLB flush, `pv_tlb_flush_supported`).
    pub fn default_off(self, leaf: u32, _subleaf: u32, reg: u32) -> u32 {
        match (self, leaf, reg) {
            (CpuidDefaults::V1, 1, REG_ECX) => CPUID_1_ECX_MONITOR,
            _ => 0,
        }
    }
}

/// Whether `index` is in KVM's own MSR range, 0x4b564d00..=0x4b564dff
/// (`arch/x86/include/uapi/asm/kvm_para.h`; the old kvmclock pair 0x11
/// and 0x12 sits elsewhere).
pub fn is_kvm_msr(index: u32) -> bool {
    index & !0xff == 0x4b56_4d00
}

/// The KVM feature bit that gates PV MSR `index` (Documentation/virt/kvm/
/// x86/msr.rst; `kvm_set_msr_common`/`kvm_get_msr_common`, which #GP when
/// PV CPUID is enforced — `-cpu ...,kvm-pv-enforce-cpuid=on` — and the bit
/// is not advertised); None for other MSRs.
pub fn pv_msr_feature(index: u32) -> Option<u32> {
    Some(match index {
        0x11 | 0x12 => KVM_FEATURE_CLOCKSOURCE,
        0x4b56_4d00 | 0x4b56_4d01 => KVM_FEATURE_CLOCKSOURCE2,
        0x4b56_4d02 => KVM_FEATURE_ASYNC_PF,
        0x4b56_4d03 => KVM_FEATURE_STEAL_TIME,
        0x4b56_4d04 => KVM_FEATURE_PV_EOI,
        0x4b56_4d05 => KVM_FEATURE_POLL_CONTROL,
        0x4b56_4d06 | 0x4b56_4d07 => KVM_FEATURE_ASYNC_PF_INT,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every CPUID feature word QEMU 10.0 has (`feature_word_info`: leaf,
    /// subleaf, register), where a default could land.
    const FEATURE_WORDS: &[(u32, u32, u32)] = &[
        (1, 0, REG_EDX),
        (1, 0, REG_ECX),
        (6, 0, REG_EAX),
        (7, 0, REG_EBX),
        (7, 0, REG_ECX),
        (7, 0, REG_EDX),
        (7, 1, REG_EAX),
        (7, 1, REG_EDX),
        (7, 2, REG_EDX),
        (0xd, 1, REG_EAX),
        (0x14, 0, REG_EBX),
        (0x19, 0, REG_EBX),
        (0x24, 0, REG_EBX),
        (0x4000_0001, 0, REG_EAX),
        (0x4000_0001, 0, REG_EDX),
        (0x8000_0001, 0, REG_EDX),
        (0x8000_0001, 0, REG_ECX),
        (0x8000_0007, 0, REG_EDX),
        (0x8000_0008, 0, REG_EBX),
        (0x8000_000a, 0, REG_EDX),
        (0x8000_001f, 0, REG_EAX),
        (0x8000_0021, 0, REG_EAX),
        (0x8000_0022, 0, REG_EAX),
        (0xc000_0001, 0, REG_EDX),
    ];

    /// Version 1 is released: it is the guest ABI of QEMU 10.0's versioned
    /// machine types under rustkvm. A new default is a new version, never a
    /// change here.
    #[test]
    fn defaults_1_is_frozen() {
        for &(leaf, subleaf, reg) in FEATURE_WORDS {
            let on = CpuidDefaults::V1.defaults(leaf, subleaf, reg);
            let off = CpuidDefaults::V1.default_off(leaf, subleaf, reg);
            let (want_on, want_off) = match (leaf, reg) {
                (0x4000_0001, REG_EAX) => (0x0100_006b, 0),
                (1, REG_ECX) => (0, 1 << 3),
                _ => (0, 0),
            };
            assert_eq!(on, want_on, "V1 defaults of {leaf:#x}.{subleaf} reg {reg}");
            assert_eq!(
                off, want_off,
                "V1 default-off of {leaf:#x}.{subleaf} reg {reg}"
            );
            assert_eq!(
                on & !supported(leaf, subleaf, reg, 0),
                0,
                "a default is supported"
            );
            assert_eq!(CpuidDefaults::None.defaults(leaf, subleaf, reg), 0);
            assert_eq!(CpuidDefaults::None.default_off(leaf, subleaf, reg), 0);
        }
        assert_eq!(CpuidDefaults::from_number(0), Some(CpuidDefaults::None));
        assert_eq!(CpuidDefaults::from_number(1), Some(CpuidDefaults::V1));
        assert_eq!(CpuidDefaults::from_number(2), None);
        assert_eq!(CpuidDefaults::LATEST, CpuidDefaults::V1);
    }

    #[test]
    fn kvm_feature_bits_match_kvm_para_h() {
        assert_eq!(KVM_FEATURE_STEAL_TIME, 0x20);
        assert_eq!(KVM_FEATURE_PV_UNHALT, 0x80);
        assert_eq!(KVM_FEATURE_PV_TLB_FLUSH, 0x200);
        assert_eq!(KVM_FEATURE_PV_SEND_IPI, 0x800);
        assert_eq!(KVM_FEATURE_PV_SCHED_YIELD, 0x2000);
        assert_eq!(KVM_FEATURE_CLOCKSOURCE_STABLE_BIT, 0x0100_0000);
    }

    #[test]
    fn the_tsc_leaves_give_the_tsc_rate_exactly() {
        for khz in [2_000_000u64, 1_500_000, 2_345_678, 3_000_001, 999] {
            let rate = TscRate::new(khz);
            let [den, num, crystal, edx] = tsc_leaf(CPUID_TSC_CRYSTAL, rate);
            assert_eq!(crystal, 1_000_000_000, "the APIC bus is the crystal");
            assert_eq!(edx, 0);
            assert!(den != 0 && num != 0, "{khz} kHz: {den}/{num}");
            // Linux's native_calibrate_tsc: crystal_khz * EBX / EAX.
            assert_eq!(
                u64::from(crystal) / 1000 * u64::from(num) / u64::from(den),
                khz
            );
            // perf's arch_get_tsc_freq: ECX * EBX / EAX in Hz.
            assert_eq!(
                u64::from(crystal) * u64::from(num) / u64::from(den),
                khz * 1000
            );
            assert_eq!(
                tsc_leaf(CPUID_PROCESSOR_FREQUENCY, rate),
                [(khz / 1000) as u32, (khz / 1000) as u32, 1000, 0]
            );
            assert_eq!(
                tsc_leaf(CPUID_HV_TIMING, rate),
                [khz as u32, 1_000_000, 0, 0]
            );
        }
        assert_eq!(
            tsc_leaf(CPUID_TSC_CRYSTAL, TscRate::new(2_000_000))[..2],
            [1, 2],
            "2 GHz on a 1 GHz crystal: 2/1, reduced"
        );
        assert_eq!(tsc_leaf(0x14, TscRate::new(0)), [0; 4]);
    }

    #[test]
    fn only_implemented_bits_are_supported_and_defaults_are_kvms() {
        assert_eq!(
            supported(KVM_CPUID_FEATURES, 0, REG_EAX, 0),
            IMPLEMENTED_KVM_FEATURES
        );
        assert_eq!(
            supported(KVM_CPUID_FEATURES, 0, 2, 0),
            0,
            "hints (EDX) stay TCG's"
        );
        assert_eq!(
            supported(1, 0, REG_EBX, 0x1234),
            0x1234,
            "other words untouched"
        );
        assert_eq!(supported(1, 0, REG_EDX, 0x1234), 0x1234 | 1 << 21, "DS");
        assert_eq!(
            supported(1, 0, REG_ECX, 0),
            1 << 24 | 1 << 15 | 1 << 2,
            "TSC-deadline, PDCM, DTES64"
        );
        assert_eq!(supported(7, 0, REG_EBX, 1), 3, "TSC_ADJUST");
        assert_eq!(supported(7, 1, REG_EBX, 0), 0);
        assert_eq!(supported(0x8000_0007, 0, REG_EDX, 0), 1 << 8, "invtsc");
        // V1's defaults are among KVM's (kvm_default_props) that rustkvm
        // implements (all of them at V1's release; more may come later)
        assert_eq!(
            DEFAULTS_1_KVM_FEATURES & !(KVM_DEFAULT_FEATURES & IMPLEMENTED_KVM_FEATURES),
            0
        );
    }
}
