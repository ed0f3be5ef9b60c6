//! rustkvm-test: arch=x86_64 cpu=max,kvm-pv-enforce-cpuid=on,kvm-steal-time=off,kvm-pv-unhalt=off,kvm-pv-ipi=off,kvm-pv-sched-yield=off,kvm-pv-eoi=off compare=off
//! rustkvm-expect: tcg=skip
//! rustkvm-test: kvm-vary=features
//!   (no KVM signature under stock TCG)
//! rustkvm-kvm-probe: hypercall hypercalls never complete on this host's KVM (measured: VMCALL and VMMCALL leave the vCPU on the instruction)
//!
//! `-cpu ...,kvm-pv-enforce-cpuid=on` (KVM_CAP_ENFORCE_PV_FEATURE_CPUID), as
//! Linux's KVM selftest `kvm_pv_test.c` checks it: every PV MSR whose
//! feature bit CPUID 0x40000001 does not advertise #GPs on RDMSR and WRMSR,
//! the advertised ones work, and the hypercalls of features not advertised
//! return −KVM_ENOSYS. The CPU model here turns off steal time, PV unhalt,
//! PV IPIs, PV sched-yield and PV EOI; async PF is never advertised by
//! rustkvm; poll control is. SKIPs without the KVM signature (plain TCG).
//! Spec: Documentation/virt/kvm/x86/msr.rst, cpuid.rst; arch/x86/kvm/x86.c
//! (`guest_pv_has` in kvm_set_msr_common / kvm_get_msr_common,
//! kvm_emulate_hypercall).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvm-pv-enforce", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;

    /// −KVM_ENOSYS.
    const ENOSYS: u64 = (-1000i64) as u64;
    const KVM_HC_KICK_CPU: u64 = 5;
    const KVM_HC_SEND_IPI: u64 = 10;
    const KVM_HC_SCHED_YIELD: u64 = 11;
    /// (MSR, the KVM_FEATURE_* bit number that gates it).
    const PV_MSRS: [(u32, u32); 10] = [
        (0x11, 0),         // MSR_KVM_WALL_CLOCK: CLOCKSOURCE
        (0x12, 0),         // MSR_KVM_SYSTEM_TIME: CLOCKSOURCE
        (0x4b56_4d00, 3),  // MSR_KVM_WALL_CLOCK_NEW: CLOCKSOURCE2
        (0x4b56_4d01, 3),  // MSR_KVM_SYSTEM_TIME_NEW: CLOCKSOURCE2
        (0x4b56_4d02, 4),  // MSR_KVM_ASYNC_PF_EN: ASYNC_PF
        (0x4b56_4d03, 5),  // MSR_KVM_STEAL_TIME: STEAL_TIME
        (0x4b56_4d04, 6),  // MSR_KVM_PV_EOI_EN: PV_EOI
        (0x4b56_4d05, 12), // MSR_KVM_POLL_CONTROL: POLL_CONTROL
        (0x4b56_4d06, 14), // MSR_KVM_ASYNC_PF_INT: ASYNC_PF_INT
        (0x4b56_4d07, 14), // MSR_KVM_ASYNC_PF_ACK: ASYNC_PF_INT
    ];

    if !arch::has_kvm_signature() {
        t.skip("x86-kvm-pv-enforce", "no KVM signature at CPUID 0x40000000");
        return;
    }
    let features = arch::cpuid(0x4000_0001, 0)[0];
    t.measure("features", format_args!("{features:#x}"));
    // Without the bits that differ from QEMU/KVM's by design: async PF
    // (4, 10, 14), which rustkvm does not offer, and MSI_EXT_DEST_ID (15),
    // which QEMU gives under KVM only with a split irqchip.
    t.measure(
        "features.shared",
        format_args!(
            "{:#x}",
            features & !((1 << 4) | (1 << 10) | (1 << 14) | (1 << 15))
        ),
    );
    t.eq("steal-time-not-offered", features & (1 << 5), 0);
    let gp = |r: Result<u64, arch::Fault>| matches!(r, Err(f) if f.vector == arch::GP_VECTOR);
    let mut offered = 0;
    for (msr, bit) in PV_MSRS {
        let has = features & (1 << bit) != 0;
        offered += u32::from(has);
        let read = arch::rdmsr(msr);
        // Writing 0 disables whatever the MSR controls: harmless.
        let write = arch::wrmsr(msr, 0).map(|()| 0);
        t.check(
            "pv-msr.gp-unless-offered",
            gp(read) != has && gp(write) != has,
            format_args!(
                "MSR {msr:#x} feature bit {bit} offered {has}: read {read:?} write {write:?}"
            ),
        );
    }
    t.check(
        "pv-msr.some-offered",
        offered >= 2,
        format_args!("kvmclock's MSRs should be offered: {offered}"),
    );
    for (name, nr) in [
        ("kick-cpu", KVM_HC_KICK_CPU),
        ("send-ipi", KVM_HC_SEND_IPI),
        ("sched-yield", KVM_HC_SCHED_YIELD),
    ] {
        t.check(
            "hypercall.enosys-unless-offered",
            arch::vmcall(nr, [0, 0, 0, 0]) == Ok(ENOSYS),
            format_args!("{name}"),
        );
    }
}
