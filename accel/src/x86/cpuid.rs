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
/// KVM_FEATURE_PV_SEND_IPI (KVM_HC_SEND_IPI).
pub const KVM_FEATURE_PV_SEND_IPI: u32 = 1 << 11;
/// KVM_FEATURE_PV_SCHED_YIELD (KVM_HC_SCHED_YIELD).
pub const KVM_FEATURE_PV_SCHED_YIELD: u32 = 1 << 13;
/// KVM_FEATURE_CLOCKSOURCE_STABLE_BIT.
pub const KVM_FEATURE_CLOCKSOURCE_STABLE_BIT: u32 = 1 << 24;

/// QEMU's register numbering in a CPUID feature word (`R_EAX` ...).
pub const REG_EAX: u32 = 0;

/// KVM feature bits rustkvm implements today. A bit not here is never
/// offered to the guest, whatever `-cpu` asks (QEMU warns that it is
/// unsupported, as it does for any feature the accelerator lacks).
pub const IMPLEMENTED_KVM_FEATURES: u32 = KVM_FEATURE_NOP_IO_DELAY
    | KVM_FEATURE_STEAL_TIME
    | KVM_FEATURE_PV_UNHALT
    | KVM_FEATURE_PV_SEND_IPI
    | KVM_FEATURE_PV_SCHED_YIELD;

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

/// Which bits of CPUID `leaf`/`subleaf` register `reg` rustkvm can offer,
/// given what TCG offers (`tcg`).
pub fn supported(leaf: u32, _subleaf: u32, reg: u32, tcg: u32) -> u32 {
    match (leaf, reg) {
        (KVM_CPUID_FEATURES, REG_EAX) => tcg | IMPLEMENTED_KVM_FEATURES,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_feature_bits_match_kvm_para_h() {
        assert_eq!(KVM_FEATURE_STEAL_TIME, 0x20);
        assert_eq!(KVM_FEATURE_PV_UNHALT, 0x80);
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
        assert_eq!(supported(1, 0, 1, 0x1234), 0x1234, "other leaves untouched");
        let d = defaults(KVM_CPUID_FEATURES, 0, REG_EAX);
        assert_eq!(d, KVM_FEATURE_NOP_IO_DELAY | KVM_FEATURE_STEAL_TIME);
        assert_eq!(d & !supported(KVM_CPUID_FEATURES, 0, REG_EAX, 0), 0);
        assert_eq!(defaults(1, 0, REG_EAX), 0);
    }
}
