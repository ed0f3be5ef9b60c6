//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off timeout=60
//!
//! KVM_HC_SEND_IPI to an APIC ID above 255, which only x2APIC mode can
//! address: KVM's `kvm_pv_send_ipi` walks the physical APIC map by
//! `min + bit` over 32-bit APIC IDs. The host test (tests/tests/guests.rs)
//! starts a q35 machine whose second vCPU sits in socket 1 of 129-core
//! sockets, so its APIC ID is [`AP_ID`] = 256. vCPU 0 switches to x2APIC
//! mode, starts it with INIT-SIPI-SIPI through the x2APIC ICR, the AP
//! switches to x2APIC mode too, and vCPU 0 sends it a vector with
//! SEND_IPI(bitmap 1, min 256): the hypercall returns 1, the vector is
//! pending in the AP's IRR, and not in vCPU 0's (APIC ID 256 truncated to
//! 8 bits is vCPU 0's). A bitmap beyond the last APIC ID delivers nothing
//! and returns 0. SKIPs without the KVM signature or PV_SEND_IPI, or
//! without x2APIC. Not part of the matrix (it needs that machine).
//! Spec: Documentation/virt/kvm/x86/hypercalls.rst (KVM_HC_SEND_IPI),
//! arch/x86/kvm/lapic.c (`kvm_pv_send_ipi`), SDM §11.12 (x2APIC).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvm-pv-ipi-x2apic", "x86_64 only");
}

/// The AP's APIC ID on the host test's machine.
#[cfg(target_arch = "x86_64")]
const AP_ID: u32 = 256;
/// The vector sent.
#[cfg(target_arch = "x86_64")]
const VECTOR: u8 = 0x42;

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;
    /// KVM_HC_SEND_IPI.
    const KVM_HC_SEND_IPI: u64 = 10;
    /// KVM_FEATURE_PV_SEND_IPI.
    const PV_SEND_IPI: u32 = 1 << 11;
    /// CPUID.1:ECX[21]: x2APIC.
    const X2APIC: u32 = 1 << 21;

    if !arch::has_kvm_signature() || arch::cpuid(0x4000_0001, 0)[0] & PV_SEND_IPI == 0 {
        t.skip("send-ipi-x2apic", "no KVM_FEATURE_PV_SEND_IPI");
        return;
    }
    if arch::cpuid(1, 0)[2] & X2APIC == 0 {
        t.skip("send-ipi-x2apic", "no x2APIC");
        return;
    }
    arch::enable_x2apic();
    t.eq(
        "x2apic-mode",
        arch::rdmsr(arch::MSR_IA32_APIC_BASE).map(|b| b & arch::APIC_BASE_EXTD),
        Ok(arch::APIC_BASE_EXTD),
    );
    let id = arch::start_x2apic_irr_watcher(AP_ID, VECTOR);
    t.eq("ap-started-in-x2apic-mode", id.is_some(), true);
    t.eq("ap-x2apic-id", id, Some(AP_ID));

    // Fixed delivery, physical destination: the ICR's low bits are the vector.
    let icr = u64::from(VECTOR);
    t.eq(
        "beyond-the-last-apic-id-delivers-nothing",
        arch::vmcall(KVM_HC_SEND_IPI, [1, 0, u64::from(AP_ID) + 1, icr]),
        Ok(0),
    );
    t.eq(
        "send-ipi-min-256-returns-1",
        arch::vmcall(KVM_HC_SEND_IPI, [1, 0, u64::from(AP_ID), icr]),
        Ok(1),
    );
    t.eq(
        "ap-256-has-the-vector",
        arch::x2apic_irr_watcher_saw(),
        true,
    );
    t.eq("vcpu-0-does-not", arch::x2apic_irr(VECTOR), false);
}
