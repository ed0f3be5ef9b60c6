//! rustkvm-test: arch=x86_64 vary=vmcall.sched-yield,rdmsr.tsc.nonzero,rdpmc.0 cpu=qemu64,vendor=GenuineIntel
//! rustkvm-kvm-probe: hypercall hypercalls never complete on this host's KVM (measured: VMCALL and VMMCALL leave the vCPU on the instruction)
//! rustkvm-expect-skip: kvm rdpmc-without-pmu-faults
//!   (kvm: on an AMD host, KVM's legacy counters answer RDPMC)
//!
//! Exercises every x86 instruction rustkvm routes into Rust (CPUID, RDMSR,
//! WRMSR, RDPMC) plus VMCALL, and records how each is answered. Every answer
//! must be TCG's own (the runner checks rustkvm's output line for line against
//! tcg's) except VMCALL, which rustkvm answers as a KVM hypercall
//! (x86-kvm-pv checks that), RDMSR IA32_TSC, which reads 0 under stock
//! TCG and the guest TSC under rustkvm, and RDPMC without a PMU: TCG raises
//! #UD, KVM (so rustkvm) #GP (the host test checks each side). PERFEVTSEL0
//! reads 0 on both: KVM answers the legacy counter MSRs so without a PMU.
//! An Intel-vendor model: "without a PMU" is `pmu=off` on an Intel host's
//! KVM; on an AMD host's KVM every guest has the legacy counters (so
//! rustkvm on an AMD model, patch 0058).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-routing", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, Fault, GP_VECTOR, UD_VECTOR};

    /// KVM's steal-time MSR (Documentation/virt/kvm/x86/msr.rst).
    const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
    /// IA32_PERFEVTSEL0 (Intel SDM vol. 3 ch. 20).
    const IA32_PERFEVTSEL0: u32 = 0x186;
    /// IA32_TSC.
    const IA32_TSC: u32 = 0x10;
    /// KVM_HC_SCHED_YIELD (Documentation/virt/kvm/x86/hypercalls.rst).
    const KVM_HC_SCHED_YIELD: u64 = 11;

    fn show<T: core::fmt::Debug>(r: &Result<T, Fault>) -> impl core::fmt::Display + '_ {
        struct S<'a, T>(&'a Result<T, Fault>);
        impl<T: core::fmt::Debug> core::fmt::Display for S<'_, T> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.0 {
                    Ok(v) => write!(f, "ok:{v:?}"),
                    Err(e) => write!(f, "fault:{}:{}", e.vector, e.error),
                }
            }
        }
        S(r)
    }

    let max_leaf = arch::cpuid(0, 0)[0];
    t.check(
        "cpuid-0-max-leaf",
        max_leaf >= 1,
        format_args!("{max_leaf:#x}"),
    );
    let pmu = arch::cpuid(0, 0)[0] >= 0xa;
    let leaf_a = if pmu { arch::cpuid(0xa, 0) } else { [0; 4] };
    t.measure("cpuid.0xa.eax", format_args!("{:#x}", leaf_a[0]));

    // TCG does not implement RDMSR IA32_TSC (it reads 0): a gap rustkvm's
    // timer work closes. Record whether it reads a live counter.
    let tsc = arch::rdmsr(IA32_TSC);
    t.measure(
        "rdmsr.tsc.nonzero",
        format_args!("{}", matches!(tsc, Ok(v) if v > 0)),
    );

    let steal = arch::rdmsr(MSR_KVM_STEAL_TIME);
    t.measure("rdmsr.kvm-steal-time", format_args!("{}", show(&steal)));
    let w = arch::wrmsr(MSR_KVM_STEAL_TIME, 0);
    t.measure("wrmsr.kvm-steal-time.0", format_args!("{}", show(&w)));

    let sel = arch::rdmsr(IA32_PERFEVTSEL0);
    t.measure("rdmsr.perfevtsel0", format_args!("{}", show(&sel)));

    let pmc = arch::rdpmc(0);
    t.measure("rdpmc.0", format_args!("{}", show(&pmc)));
    // KVM on an AMD host gives every guest AMD's four legacy counters,
    // whatever CPUID says (arch/x86/kvm/svm/pmu.c, amd_pmu_refresh), unless
    // the VMM turns the vPMU off (KVM_CAP_PMU_CAPABILITY, which QEMU 10.0
    // and 10.2 do not use): there RDPMC 0 reads the legacy counter.
    let amd_host_counters = guest::backend() == Some(guest::Backend::Kvm) && pmc.is_ok();
    if leaf_a[0] & 0xff == 0 && amd_host_counters {
        t.skip(
            "rdpmc-without-pmu-faults",
            "KVM gives AMD's legacy counters without a PMU in CPUID (an AMD host)",
        );
    } else if leaf_a[0] & 0xff == 0 {
        // No architectural PMU advertised: RDPMC must not succeed (TCG: #UD,
        // KVM on Intel and rustkvm: #GP).
        t.check(
            "rdpmc-without-pmu-faults",
            matches!(
                pmc,
                Err(Fault {
                    vector: UD_VECTOR | GP_VECTOR,
                    ..
                })
            ),
            format_args!("{}", show(&pmc)),
        );
    }

    let hc = arch::vmcall(KVM_HC_SCHED_YIELD, [0; 4]);
    t.measure("vmcall.sched-yield", format_args!("{}", show(&hc)));
}
