//! rustkvm-test: arch=x86_64,aarch64 compare=off matrix=off timeout=60 host-query=on
//!
//! A guest for `x-query-rustkvm`: it turns on what the introspection reports
//! — steal time (x86 MSR_KVM_STEAL_TIME / arm64 PV_TIME_ST), kvmclock (x86),
//! a PMU counter counting retired instructions where there is a PMU, a
//! timer armed far in the future (x86 TSC deadline / arm64 virtual timer) —
//! prints what it set as `measure` lines and `ready`, then waits until the
//! host sends a byte on the serial console (or 30 s of guest time pass). The
//! host test (tests/tests/guests.rs) and a nested run (`host-query=on`:
//! tests/src/nested.rs) query QMP meanwhile and compare
//! (tests/src/introspect.rs).
//! Not part of the matrix.
#![no_std]
#![no_main]

use guest::{wait_for_host, Test};

guest::entry!(main);

/// At least 20 000 instructions, so that the counter the host reads holds
/// more than 1000 however soon after `ready` the host's query comes (the
/// guest's wait loop may run only a few iterations before it).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn retire_some_instructions() {
    for i in 0..10_000u64 {
        core::hint::black_box(i);
    }
}

#[cfg(target_arch = "x86_64")]
static mut ST: guest::arch::KvmStealTime = guest::arch::KvmStealTime::new();

/// `struct pvclock_vcpu_time_info` (32 bytes, 32-byte aligned here).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Pvti([u8; 64]);

#[cfg(target_arch = "x86_64")]
static mut PVTI: Pvti = Pvti([0; 64]);

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::arch::{self, rdtsc, set_lapic_reg, MSR_KVM_STEAL_TIME};
    /// MSR_KVM_SYSTEM_TIME_NEW.
    const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
    /// IA32_TSC_DEADLINE.
    const MSR_TSC_DEADLINE: u32 = 0x6e0;
    /// Local APIC spurious-interrupt vector register and LVT timer.
    const SVR: u32 = 0xf0;
    const LVT_TIMER: u32 = 0x320;
    /// LVT timer: TSC-deadline mode, masked (it must never fire here).
    const LVT_DEADLINE_MASKED: u32 = (2 << 17) | (1 << 16) | 0x40;
    /// PERFEVTSEL: EN | OS | USR | event C0h (instructions retired).
    const EVTSEL_INSNS: u64 = (1 << 22) | (1 << 17) | (1 << 16) | 0xc0;

    if !arch::has_kvm_signature() {
        t.skip("introspect", "no KVM signature");
        return;
    }
    let st = addr_of!(ST) as u64;
    t.eq(
        "steal-time",
        arch::wrmsr(MSR_KVM_STEAL_TIME, st | 1),
        Ok(()),
    );
    t.measure("steal.gpa", format_args!("{st:#x}"));
    let pvti = addr_of!(PVTI) as u64;
    t.eq(
        "kvmclock",
        arch::wrmsr(MSR_KVM_SYSTEM_TIME_NEW, pvti | 1),
        Ok(()),
    );
    t.measure("pvclock.gpa", format_args!("{pvti:#x}"));
    if arch::cpuid(1, 0)[2] & (1 << 24) != 0 {
        set_lapic_reg(SVR, 0x1ff);
        set_lapic_reg(LVT_TIMER, LVT_DEADLINE_MASKED);
        let deadline = rdtsc() + (1 << 50);
        t.eq("deadline", arch::wrmsr(MSR_TSC_DEADLINE, deadline), Ok(()));
        t.measure("tsc-deadline", format_args!("{deadline:#x}"));
    }
    // A counter, on whichever PMU there is: Intel's architectural one
    // (GP0 + GLOBAL_CTRL bit 0) or AMD's (PerfEvtSel0; PerfMonV2's global
    // control resets to all enabled).
    let intel_pmu =
        arch::cpuid(0, 0)[1] == u32::from_le_bytes(*b"Genu") && arch::cpuid(0xa, 0)[0] & 0xff >= 2;
    let amd_pmu = arch::cpuid(0, 0)[1] == u32::from_le_bytes(*b"Auth")
        && arch::rdmsr(0xc001_0000).is_ok()
        && arch::wrmsr(0xc001_0000, EVTSEL_INSNS).is_ok()
        && arch::rdmsr(0xc001_0000) == Ok(EVTSEL_INSNS);
    if intel_pmu {
        t.eq("gp0", arch::wrmsr(0x186, EVTSEL_INSNS), Ok(()));
        t.eq("global-ctrl", arch::wrmsr(0x38f, 1), Ok(()));
    }
    let pmu = if intel_pmu || amd_pmu {
        "counting"
    } else {
        "none"
    };
    retire_some_instructions();
    t.measure("pmu", format_args!("{pmu}"));
    guest::println!("ready");
    // 30 s at 2 GHz.
    let released = wait_for_host(60_000_000_000, rdtsc);
    t.check(
        "released-by-host",
        released,
        format_args!("no byte from the host"),
    );
    let _ = arch::wrmsr(MSR_KVM_STEAL_TIME, 0);
    let _ = arch::wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0);
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{self, cntvct, hvc, PV_TIME_ST};
    use guest::{read_sysreg, write_sysreg};
    /// PMEVTYPER: INST_RETIRED (0x08), counted at EL0 and EL1.
    const INST_RETIRED: u64 = 0x08;
    /// PMCR_EL0.E.
    const PMCR_E: u64 = 1;
    /// CNTV_CTL_EL0: ENABLE | IMASK (it must never interrupt here).
    const CTL_ENABLE_MASKED: u64 = 0b011;

    let ipa = hvc(PV_TIME_ST, [0; 3])[0];
    if ipa as i64 <= 0 {
        t.skip("introspect", "no PV time (PV_TIME_ST not supported)");
        return;
    }
    t.measure("steal.gpa", format_args!("{ipa:#x}"));
    let pmu = arch::read_pmcr().is_ok();
    if pmu {
        write_sysreg!("pmevtyper0_el0", INST_RETIRED);
        write_sysreg!("pmcntenset_el0", 1);
        write_sysreg!("pmcr_el0", PMCR_E);
    }
    let what = if pmu { "counting" } else { "none" };
    retire_some_instructions();
    t.measure("pmu", format_args!("{what}"));
    // ID_AA64DFR0_EL1.PMUVer, bits 11:8: what x-query-rustkvm's
    // pmu.version must say.
    t.measure(
        "pmuver",
        format_args!("{}", read_sysreg!("id_aa64dfr0_el1") >> 8 & 0xf),
    );
    let cval = cntvct() + (1 << 50);
    write_sysreg!("cntv_cval_el0", cval);
    write_sysreg!("cntv_ctl_el0", CTL_ENABLE_MASKED);
    t.measure("cntv-cval", format_args!("{cval:#x}"));
    t.eq("cntv-cval-reads-back", read_sysreg!("cntv_cval_el0"), cval);
    guest::println!("ready");
    // 30 s of the generic counter.
    let released = wait_for_host(30 * arch::cntfrq(), cntvct);
    t.check(
        "released-by-host",
        released,
        format_args!("no byte from the host"),
    );
}
