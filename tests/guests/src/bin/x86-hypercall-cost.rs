//! rustkvm-test: arch=x86_64 compare=off vary=cycles.vmcall,cycles.cpuid,cycles.ratio.x1000
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//! rustkvm-kvm-probe: hypercall hypercalls never complete on this host's KVM (measured: VMCALL and VMMCALL leave the vCPU on the instruction)
//!
//! The cost of a KVM hypercall against the cost of CPUID, the cheapest
//! instruction that also leaves translated code for a helper: guest TSC
//! cycles per VMCALL (KVM_HC_VAPIC_POLL_IRQ, which does nothing) and per
//! CPUID leaf 0, measured side by side in one run. SKIPs without the KVM
//! signature. scripts/bench-hypercall.sh reports the ratio.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-hypercall-cost", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;

    const ROUNDS: u64 = 5;
    const N: u64 = 20_000;

    if !arch::has_kvm_signature() {
        t.skip("hypercall-cost", "no KVM signature at CPUID 0x40000000");
        return;
    }
    // The two loops are the same instructions but for VMCALL/CPUID, each
    // aligned so it never straddles a page (TCG chains blocks only within
    // one). Interleave them so a noisy host affects both alike; keep the best
    // round of each.
    let (mut best_vmcall, mut best_cpuid) = (u64::MAX, u64::MAX);
    let mut ok = true;
    for _ in 0..ROUNDS {
        let t0 = arch::rdtsc();
        ok &= vmcall_loop(N) == 0;
        let t1 = arch::rdtsc();
        cpuid_loop(N);
        let t2 = arch::rdtsc();
        best_vmcall = best_vmcall.min((t1 - t0) / N);
        best_cpuid = best_cpuid.min((t2 - t1) / N);
    }
    t.check("every-vmcall-returned-0", ok, format_args!(""));
    t.measure("cycles.vmcall", format_args!("{best_vmcall}"));
    t.measure("cycles.cpuid", format_args!("{best_cpuid}"));
    t.measure(
        "cycles.ratio.x1000",
        format_args!("{}", best_vmcall * 1000 / best_cpuid.max(1)),
    );
}

/// `n` × VMCALL(KVM_HC_VAPIC_POLL_IRQ); returns the last RAX (0 expected).
#[cfg(target_arch = "x86_64")]
fn vmcall_loop(n: u64) -> u64 {
    let ret: u64;
    // SAFETY: RBX is saved and restored around the loop; VMCALL does not
    // fault here (the KVM signature was seen).
    unsafe {
        core::arch::asm!(
            "mov {save}, rbx",
            ".p2align 8",
            "2:",
            "mov eax, 1",
            "xor ebx, ebx",
            "vmcall",
            "dec {n}",
            "jnz 2b",
            "mov rbx, {save}",
            n = inout(reg) n => _,
            save = out(reg) _,
            out("rax") ret,
            out("rcx") _,
            out("rdx") _,
            options(nostack)
        );
    }
    ret
}

/// `n` × CPUID leaf 0, in a loop shaped like [`vmcall_loop`].
#[cfg(target_arch = "x86_64")]
fn cpuid_loop(n: u64) {
    // SAFETY: as vmcall_loop; CPUID has no side effects.
    unsafe {
        core::arch::asm!(
            "mov {save}, rbx",
            ".p2align 8",
            "2:",
            "mov eax, 0",
            "xor ebx, ebx",
            "cpuid",
            "dec {n}",
            "jnz 2b",
            "mov rbx, {save}",
            n = inout(reg) n => _,
            save = out(reg) _,
            out("rax") _,
            out("rcx") _,
            out("rdx") _,
            options(nostack)
        );
    }
}
