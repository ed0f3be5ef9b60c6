//! rustkvm-test: arch=x86_64 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu vary=cycles.wrmsr-pmu,cycles.wrmsr-tcg,cycles.ratio.x1000
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU)
//!
//! The cost of a WRMSR to a PMU MSR (IA32_PERFEVTSEL0, a counter that
//! stays disabled) against a WRMSR TCG handles itself (IA32_SYSENTER_CS):
//! guest TSC cycles per instruction, interleaved in one run, best of 5
//! rounds. SKIPs without a PMU. scripts/bench-pmu.sh reports the ratio.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-wrmsr-cost", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch;

    const ROUNDS: u64 = 5;
    const N: u64 = 200_000;
    /// IA32_PERFEVTSEL0 and IA32_SYSENTER_CS.
    const PMU_MSR: u32 = 0x186;
    const TCG_MSR: u32 = 0x174;

    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("wrmsr-cost", "CPUID 0xA: no architectural PMU");
        return;
    }
    /// `n` × WRMSR `msr` = 0x10 (a disabled event select, a flat selector).
    fn wrmsr_loop(msr: u32, n: u64) {
        // SAFETY: both MSRs accept the value at CPL 0; nothing else changes.
        unsafe {
            asm!(
                ".p2align 6",
                "2:",
                "wrmsr",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                in("ecx") msr,
                in("eax") 0x10u32,
                in("edx") 0u32,
                options(nostack),
            );
        }
    }
    let (mut best_pmu, mut best_tcg) = (u64::MAX, u64::MAX);
    for _ in 0..ROUNDS {
        let t0 = arch::rdtsc();
        wrmsr_loop(PMU_MSR, N);
        let t1 = arch::rdtsc();
        wrmsr_loop(TCG_MSR, N);
        let t2 = arch::rdtsc();
        best_pmu = best_pmu.min((t1 - t0) / N);
        best_tcg = best_tcg.min((t2 - t1) / N);
    }
    t.eq("evtsel0-kept", arch::rdmsr(PMU_MSR), Ok(0x10));
    t.measure("cycles.wrmsr-pmu", format_args!("{best_pmu}"));
    t.measure("cycles.wrmsr-tcg", format_args!("{best_tcg}"));
    t.measure(
        "cycles.ratio.x1000",
        format_args!("{}", best_pmu * 1000 / best_tcg.max(1)),
    );
}
