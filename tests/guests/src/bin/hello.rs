//! rustkvm-test: arch=x86_64,aarch64
//! rustkvm-test: vary=cpuid.40000000.signature,cpuid.40000001.eax,cpuid.1.ecx.monitor,backend
//!
//! Boots, identifies the CPU and what hypervisor interface it sees, and exits.
//! The smallest end-to-end check of a backend: serial output, exit status,
//! and (on every backend) the same answers as plain TCG, except the
//! hypervisor signature (rustkvm answers KVM's). It also reads which backend
//! the runner says runs it (fw_cfg `opt/rustkvm/backend`, what per-backend
//! tolerances go by).
#![no_std]
#![no_main]

use guest::{arch, println, Test};

guest::entry!(main);

/// The runner names the backend on fw_cfg.
fn backend(t: &mut Test) {
    let b = guest::backend();
    t.check(
        "backend-named",
        b.is_some(),
        format_args!("no opt/rustkvm/backend"),
    );
    t.measure("backend", format_args!("{b:?}"));
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    println!("# hello from the x86_64 guest");
    backend(t);
    let leaf0 = arch::cpuid(0, 0);
    let vendor = arch::cpuid_string([leaf0[1], leaf0[3], leaf0[2]]);
    t.measure(
        "cpu.vendor",
        format_args!("{}", core::str::from_utf8(&vendor).unwrap_or("?")),
    );
    let leaf1 = arch::cpuid(1, 0);
    let hypervisor = leaf1[2] & (1 << 31) != 0;
    t.measure(
        "cpuid.1.ecx.hypervisor",
        format_args!("{}", hypervisor as u8),
    );
    // MONITOR/MWAIT: KVM offers none, so rustkvm's models have it off.
    t.measure(
        "cpuid.1.ecx.monitor",
        format_args!("{}", arch::cpuid(1, 0)[2] >> 3 & 1),
    );
    if hypervisor {
        let h = arch::cpuid(0x4000_0000, 0);
        let sig = arch::cpuid_string([h[1], h[2], h[3]]);
        let sig = core::str::from_utf8(&sig)
            .unwrap_or("?")
            .trim_end_matches('\0');
        t.measure("cpuid.40000000.signature", format_args!("{sig}"));
        t.measure("cpuid.40000000.eax", format_args!("{:#x}", h[0]));
        let f = arch::cpuid(0x4000_0001, 0);
        t.measure("cpuid.40000001.eax", format_args!("{:#x}", f[0]));
    }
    let efer = arch::rdmsr(0xc000_0080);
    t.check(
        "rdmsr-efer-lme",
        matches!(efer, Ok(v) if v & 0x500 == 0x500),
        format_args!("{efer:?}"),
    );
    let t0 = arch::rdtsc();
    let t1 = arch::rdtsc();
    t.check("tsc-advances", t1 > t0, format_args!("{t0} then {t1}"));
    arithmetic(t);
}

/// The guest's own arithmetic, executed (not folded by the compiler): a loop
/// over a bound the compiler cannot see agrees with Gauss's formula.
fn arithmetic(t: &mut Test) {
    let n: u64 = core::hint::black_box(1000);
    let mut sum = 0u64;
    for i in 1..=n {
        sum = core::hint::black_box(sum + i);
    }
    t.eq("sum-1-to-n", sum, n * (n + 1) / 2);
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    println!("# hello from the aarch64 guest");
    backend(t);
    t.measure("midr_el1", format_args!("{:#x}", arch::midr()));
    t.measure("mpidr", format_args!("{:#x}", arch::mpidr()));
    let psci = arch::hvc(arch::PSCI_VERSION, [0; 3])[0];
    t.measure(
        "psci.version",
        format_args!("{}.{}", psci >> 16, psci & 0xffff),
    );
    t.check(
        "psci-answers",
        psci >> 16 >= 1,
        format_args!("PSCI_VERSION = {psci:#x}"),
    );
    t.measure("cntfrq", format_args!("{}", arch::cntfrq()));
    let c0 = arch::cntvct();
    let c1 = arch::cntvct();
    t.check("counter-advances", c1 >= c0, format_args!("{c0} then {c1}"));
    arithmetic(t);
}
