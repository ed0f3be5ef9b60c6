//! KVM's CPUID leaves as rustkvm implements them.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/cpuid.rst`,
//! `arch/x86/include/uapi/asm/kvm_para.h`.

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

/// Which bits of CPUID `leaf`/`subleaf` register `reg` rustkvm can offer,
/// given what TCG offers (`tcg`).
/// Besides KVM's leaves: the TSC-deadline timer, IA32_TSC_ADJUST and the
/// invariant TSC (the guest TSC counts VM time at a fixed rate, see
/// `x86::clock`), which TCG lacks, and PDCM (the PMU's
/// IA32_PERF_CAPABILITIES, with full-width counter writes).
pub fn supported(leaf: u32, subleaf: u32, reg: u32, tcg: u32) -> u32 {
    match (leaf, subleaf, reg) {
        (KVM_CPUID_FEATURES, _, REG_EAX) => tcg | IMPLEMENTED_KVM_FEATURES,
        (1, _, REG_ECX) => tcg | CPUID_1_ECX_TSC_DEADLINE | CPUID_1_ECX_PDCM,
        (7, 0, REG_EBX) => tcg | CPUID_7_0_EBX_TSC_ADJUST,
        (0x8000_0007, _, REG_EDX) => tcg | CPUID_8000_0007_EDX_INVTSC,
        // The AMD PMU's PerfCtrExtCore and PerfMonV2 (with pmu=on).
        (0x8000_0001, _, REG_ECX) => tcg | 1 << 23,
        (0x8000_0022, _, REG_EAX) => tcg | 1,
        _ => tcg,
    }
}

/// Which bits named CPU models get by default (before the user's `-cpu`
/// switches), as under KVM; always a subset of [`supported`].
pub fn defaults(leaf: u32, subleaf: u32, reg: u32) -> u32 {
    match (leaf, reg) {
        (KVM_CPUID_FEATURES, REG_EAX) => KVM_DEFAULT_FEATURES & supported(leaf, subleaf, reg, 0),
        _ => 0,
    }
}

/// Which bits every CPU model, `max` included, has off unless the user's
/// `-cpu` turns them on: MONITOR/MWAIT, which KVM does not offer (MWAIT
/// exits unless `KVM_X86_DISABLE_EXITS_MWAIT`; QEMU's `kvm_default_props`
/// has "monitor=off"). A guest then idles with HLT, as a KVM guest does,
/// and Linux takes the PV paths it reserves for guests without MWAIT (PV
/// TLB flush, `pv_tlb_flush_supported`).
pub fn default_off(leaf: u32, _subleaf: u32, reg: u32) -> u32 {
    match (leaf, reg) {
        (1, REG_ECX) => CPUID_1_ECX_MONITOR,
        _ => 0,
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
            supported(1, 0, REG_EDX, 0x1234),
            0x1234,
            "other words untouched"
        );
        assert_eq!(
            supported(1, 0, REG_ECX, 0),
            1 << 24 | 1 << 15,
            "TSC-deadline, PDCM"
        );
        assert_eq!(supported(7, 0, REG_EBX, 1), 3, "TSC_ADJUST");
        assert_eq!(supported(7, 1, REG_EBX, 0), 0);
        assert_eq!(supported(0x8000_0007, 0, REG_EDX, 0), 1 << 8, "invtsc");
        let d = defaults(KVM_CPUID_FEATURES, 0, REG_EAX);
        assert_eq!(
            d,
            KVM_FEATURE_CLOCKSOURCE
                | KVM_FEATURE_NOP_IO_DELAY
                | KVM_FEATURE_CLOCKSOURCE2
                | KVM_FEATURE_STEAL_TIME
                | KVM_FEATURE_CLOCKSOURCE_STABLE_BIT
        );
        assert_eq!(d, 0x100_002b);
        assert_eq!(d & !supported(KVM_CPUID_FEATURES, 0, REG_EAX, 0), 0);
        assert_eq!(defaults(1, 0, REG_EAX), 0);
        assert_eq!(default_off(1, 0, REG_ECX), 1 << 3, "monitor=off, as KVM");
        assert_eq!(default_off(1, 0, REG_EDX), 0);
        assert_eq!(default_off(KVM_CPUID_FEATURES, 0, REG_EAX), 0);
    }
}
