//! rustkvm-test: arch=x86_64 compare=off
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//!
//! MSR_KVM_STEAL_TIME as KVM implements it: reserved bits #GP, the MSR
//! reads back, the structure is updated with the version protocol, a GPA
//! outside RAM is accepted and never written, a lone vCPU sees (almost) no
//! steal. SKIPs where the MSR is not KVM's (plain TCG).
//! Spec: Linux Documentation/virt/kvm/x86/msr.rst (MSR_KVM_STEAL_TIME),
//! arch/x86/kvm/x86.c (kvm_set_msr_common, record_steal_time).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-steal-time", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
static mut ST: guest::arch::KvmStealTime = guest::arch::KvmStealTime::new();

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::arch::{self, GP_VECTOR, MSR_KVM_STEAL_TIME};
    const KVM_FEATURE_STEAL_TIME: u32 = 1 << 5;

    if !arch::has_kvm_signature() {
        t.skip("steal-time", "no KVM signature at CPUID 0x40000000");
        return;
    }
    let f = arch::cpuid(0x4000_0001, 0)[0];
    t.check(
        "steal-time-offered",
        f & KVM_FEATURE_STEAL_TIME != 0,
        format_args!("{f:#x}"),
    );

    let gpa = addr_of!(ST) as u64;
    for bit in 1..=5 {
        let r = arch::wrmsr(MSR_KVM_STEAL_TIME, gpa | 1 | (1 << bit));
        t.check(
            "reserved-bit-gp",
            matches!(r, Err(f) if f.vector == GP_VECTOR),
            format_args!("bit {bit}: {r:?}"),
        );
    }
    t.eq(
        "msr-unchanged-after-gp",
        arch::rdmsr(MSR_KVM_STEAL_TIME),
        Ok(0),
    );

    t.eq("enable", arch::wrmsr(MSR_KVM_STEAL_TIME, gpa | 1), Ok(()));
    t.eq(
        "msr-reads-back",
        arch::rdmsr(MSR_KVM_STEAL_TIME),
        Ok(gpa | 1),
    );
    // Let the vCPU leave and re-enter the CPU loop a few times (port I/O to
    // the serial console does), then look at the structure.
    // ~50 ms by the TSC (≥ 2 GHz everywhere this runs): an iteration count
    // would take seconds on a slow nested KVM.
    let t0 = arch::rdtsc();
    while arch::rdtsc().wrapping_sub(t0) < 100_000_000 {
        core::hint::spin_loop();
    }
    for _ in 0..20 {
        guest::print!("");
        arch::outb(0x80, 0);
    }
    // SAFETY: volatile reads of memory the host updates.
    let (version, steal) = unsafe {
        (
            addr_of!(ST.version).read_volatile(),
            addr_of!(ST.steal).read_volatile(),
        )
    };
    t.check(
        "version-even-and-updated",
        version >= 2 && version % 2 == 0,
        format_args!("version {version}"),
    );
    t.measure("steal-ns", format_args!("{steal}"));
    // A lone vCPU waits for nobody but the host's other work: well below the
    // time this guest takes (the exact figure depends on the host's load).
    t.check(
        "lone-vcpu-little-steal",
        steal < 500_000_000,
        format_args!("{steal} ns"),
    );

    // A GPA that is not RAM (the local APIC page) is accepted, never written.
    t.eq(
        "mmio-gpa-accepted",
        arch::wrmsr(MSR_KVM_STEAL_TIME, 0xfee0_0000 | 1),
        Ok(()),
    );
    arch::outb(0x80, 0);
    t.eq("disable", arch::wrmsr(MSR_KVM_STEAL_TIME, 0), Ok(()));
    t.eq("msr-zero", arch::rdmsr(MSR_KVM_STEAL_TIME), Ok(0));
}
