//! rustkvm-test: arch=x86_64 cpu=max compare=off
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//!
//! KVM's PV MSRs without a structure in guest memory, as a KVM guest sees
//! them with `-cpu max` (`-cpu host` under KVM), no enforcement:
//! - MSR_KVM_POLL_CONTROL (KVM_FEATURE_POLL_CONTROL): 1 after reset, only
//!   bit 0 writable, anything else #GP with the value kept
//!   (`kvm_set_msr_common`);
//! - MSR_KVM_MIGRATION_CONTROL (KVM_FEATURE_MIGRATION_CONTROL): not
//!   advertised, and #GP both ways, as KVM without a userspace MSR filter
//!   (the MSR is userspace's, for SEV live migration: hypercalls.rst).
//!
//! Spec: Documentation/virt/kvm/x86/msr.rst, cpuid.rst.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvm-pv-msrs", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;

    const MSR_KVM_POLL_CONTROL: u32 = 0x4b56_4d05;
    const MSR_KVM_MIGRATION_CONTROL: u32 = 0x4b56_4d08;
    const POLL_CONTROL: u32 = 1 << 12;
    const MIGRATION_CONTROL: u32 = 1 << 17;

    if !arch::has_kvm_signature() {
        t.skip("x86-kvm-pv-msrs", "no KVM signature at CPUID 0x40000000");
        return;
    }
    let gp = |r: Result<u64, arch::Fault>| matches!(r, Err(f) if f.vector == arch::GP_VECTOR);
    let features = arch::cpuid(0x4000_0001, 0)[0];
    t.check(
        "poll-control-offered",
        features & POLL_CONTROL != 0,
        format_args!("CPUID 0x40000001 EAX {features:#x}"),
    );
    t.eq(
        "poll-control-reset-value",
        arch::rdmsr(MSR_KVM_POLL_CONTROL),
        Ok(1),
    );
    t.eq(
        "poll-control-write-0",
        arch::wrmsr(MSR_KVM_POLL_CONTROL, 0),
        Ok(()),
    );
    t.eq(
        "poll-control-reads-0",
        arch::rdmsr(MSR_KVM_POLL_CONTROL),
        Ok(0),
    );
    for value in [2u64, 3, 1 << 63] {
        let w = arch::wrmsr(MSR_KVM_POLL_CONTROL, value).map(|()| 0);
        t.check(
            "poll-control-reserved-bits-gp",
            gp(w),
            format_args!("wrmsr {value:#x}: {w:?}"),
        );
    }
    t.eq(
        "poll-control-kept-after-gp",
        arch::rdmsr(MSR_KVM_POLL_CONTROL),
        Ok(0),
    );
    t.eq(
        "poll-control-write-1",
        arch::wrmsr(MSR_KVM_POLL_CONTROL, 1),
        Ok(()),
    );
    t.eq(
        "poll-control-reads-1",
        arch::rdmsr(MSR_KVM_POLL_CONTROL),
        Ok(1),
    );

    t.eq(
        "migration-control-not-offered",
        features & MIGRATION_CONTROL,
        0,
    );
    let r = arch::rdmsr(MSR_KVM_MIGRATION_CONTROL);
    let w = arch::wrmsr(MSR_KVM_MIGRATION_CONTROL, 1).map(|()| 0);
    t.check(
        "migration-control-gp",
        gp(r) && gp(w),
        format_args!("rdmsr {r:?}, wrmsr {w:?}"),
    );
}
