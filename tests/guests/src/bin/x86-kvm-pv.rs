//! rustkvm-test: arch=x86_64 cpu=max compare=off
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//! rustkvm-kvm-probe: hypercall hypercalls never complete on this host's KVM (measured: VMCALL and VMMCALL leave the vCPU on the instruction)
//! rustkvm-expect-skip: kvm-nested clock-pairing,clock-pairing-values,clock-pairing-not-ram
//! rustkvm-test: kvm-vary=cpuid.40000001.eax,clock-pairing
//!   (on real KVM the bits of async PF, which rustkvm does not offer, and
//!   not MSI_EXT_DEST_ID, which QEMU/KVM offers only with a split irqchip:
//!   docs/timekeeping.md; `cpuid.40000001.eax.shared` compares the rest;
//!   KVM_HC_CLOCK_PAIRING answers -KVM_EOPNOTSUPP unless the host's clocksource
//!   is the TSC: kvm_pv_clock_pairing)
//!   (kvm-nested: L1's clocksource is kvm-clock, so KVM pairs no clock)
//!
//! KVM's paravirtual interface as a KVM guest sees it: the signature and
//! feature leaves, and hypercalls through VMCALL and VMMCALL (from CPL 3
//! too, where the other vendor's instruction meets KVM's emulator). SKIPs where
//! there is no KVM signature (plain TCG).
//! Spec: Linux Documentation/virt/kvm/x86/cpuid.rst, hypercalls.rst;
//! arch/x86/kvm/x86.c (kvm_emulate_hypercall).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvm-pv", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;

    /// KVM_FEATURE_PV_UNHALT.
    const PV_UNHALT: u32 = 1 << 7;
    /// CPUID 0x40000001.EAX bits that differ from QEMU/KVM's by design:
    /// ASYNC_PF (4), ASYNC_PF_VMEXIT (10), ASYNC_PF_INT (14), which rustkvm does
    /// not offer, and MSI_EXT_DEST_ID (15), which QEMU gives under KVM only with
    /// a split irqchip (docs/timekeeping.md).
    const NOT_SHARED: u32 = (1 << 4) | (1 << 10) | (1 << 14) | (1 << 15);
    /// KVM_FEATURE_PV_SCHED_YIELD.
    const PV_SCHED_YIELD: u32 = 1 << 13;
    /// −KVM_ENOSYS.
    const ENOSYS: u64 = (-1000i64) as u64;
    /// −KVM_EOPNOTSUPP.
    const EOPNOTSUPP: u64 = (-95i64) as u64;
    const KVM_HC_VAPIC_POLL_IRQ: u64 = 1;
    const KVM_HC_KICK_CPU: u64 = 5;
    const KVM_HC_CLOCK_PAIRING: u64 = 9;
    const KVM_HC_SCHED_YIELD: u64 = 11;
    const KVM_HC_SEND_IPI: u64 = 10;
    /// −KVM_EINVAL.
    const EINVAL: u64 = (-22i64) as u64;
    /// KVM_FEATURE_PV_SEND_IPI.
    const PV_SEND_IPI: u32 = 1 << 11;

    let h = arch::cpuid(0x4000_0000, 0);
    if !arch::has_kvm_signature() {
        t.skip("kvm-signature", "no KVM signature at CPUID 0x40000000");
        return;
    }
    // KVM sets CPUID.1:ECX.hypervisor beside its signature (kvm_set_cpu_caps).
    let ecx = arch::cpuid(1, 0)[2];
    t.check(
        "kvm-signature-with-hypervisor-bit",
        ecx & (1 << 31) != 0,
        format_args!("CPUID.1:ECX = {ecx:#x}"),
    );
    t.eq("kvm-max-leaf", h[0], 0x4000_0001);
    let f = arch::cpuid(0x4000_0001, 0);
    t.measure("cpuid.40000001.eax", format_args!("{:#x}", f[0]));
    t.measure(
        "cpuid.40000001.eax.shared",
        format_args!("{:#x}", f[0] & !NOT_SHARED),
    );
    t.measure("cpuid.40000001.edx", format_args!("{:#x}", f[3]));
    let want = PV_UNHALT | PV_SCHED_YIELD | PV_SEND_IPI;
    t.eq("pv-unhalt-sched-yield-send-ipi-offered", f[0] & want, want);

    t.eq(
        "vmcall-unknown-enosys",
        arch::vmcall(0x1234, [1, 2, 3, 4]),
        Ok(ENOSYS),
    );
    t.eq(
        "vmmcall-unknown-enosys",
        arch::vmmcall(0x1234, [0; 4]),
        Ok(ENOSYS),
    );
    t.eq(
        "vmcall-huge-number-enosys",
        arch::vmcall(u64::MAX, [0; 4]),
        Ok(ENOSYS),
    );
    t.eq(
        "vapic-poll-irq",
        arch::vmcall(KVM_HC_VAPIC_POLL_IRQ, [0; 4]),
        Ok(0),
    );
    // From CPL 3 the vendor's own instruction returns -KVM_EPERM
    // (kvm_emulate_hypercall). The other one raises #UD, which KVM
    // emulates (handle_ud, arch/x86/kvm/emulate.c), and the emulator
    // checks first: VMCALL is Priv (group7_rm0), so on AMD it is #GP(0);
    // VMMCALL is not, so on Intel it is -KVM_EPERM too.
    let v = arch::cpuid(0, 0);
    let amd = &arch::cpuid_string([v[1], v[3], v[2]]) == b"AuthenticAMD";
    arch::call_user(user_hypercalls);
    // SAFETY: written by user_hypercalls, which has returned.
    let (vmcall, vmmcall) = unsafe {
        (
            (&raw const USER_VMCALL).read(),
            (&raw const USER_VMMCALL).read(),
        )
    };
    let eperm = Ok(1u64.wrapping_neg());
    if amd {
        t.check(
            "cpl3.vmcall-on-amd-gp",
            matches!(vmcall, Err(f) if f.vector == arch::GP_VECTOR && f.error == 0),
            format_args!("{vmcall:?}"),
        );
        t.eq("cpl3.vmmcall-eperm", vmmcall, eperm);
    } else {
        t.eq("cpl3.vmcall-eperm", vmcall, eperm);
        t.eq("cpl3.vmmcall-on-intel-eperm", vmmcall, eperm);
    }
    // Outside 64-bit mode (here: compatibility mode) KVM reads 32-bit
    // operands and returns a 32-bit result (kvm_emulate_hypercall's
    // !op_64_bit path): the number's upper half is ignored, RAX's upper
    // half comes back 0.
    let high = 0xdead_beef_0000_0000u64;
    t.eq(
        "64-bit-mode-keeps-the-upper-half",
        arch::vmcall(high | KVM_HC_VAPIC_POLL_IRQ, [0; 4]),
        Ok(ENOSYS),
    );
    t.eq(
        "compat-mode-truncates-the-number",
        arch::vmcall_compat(high | KVM_HC_VAPIC_POLL_IRQ, high),
        0,
    );
    t.eq(
        "compat-mode-returns-32-bits",
        arch::vmcall_compat(high | 0x1234, 0),
        u64::from(ENOSYS as u32),
    );
    // KVM_HC_CLOCK_PAIRING(gpa, KVM_CLOCK_PAIRING_WALLCLOCK): host real
    // time and the guest TSC at one instant; other clock types
    // -KVM_EOPNOTSUPP, a GPA outside RAM -KVM_EFAULT.
    #[repr(C, align(64))]
    struct Pairing([u64; 8]);
    static mut PAIRING: Pairing = Pairing([u64::MAX; 8]);
    const CLOCK_PAIRING: u64 = 9;
    let gpa = (&raw const PAIRING) as u64;
    let before = arch::rdtsc();
    let paired = arch::vmcall(CLOCK_PAIRING, [gpa, 0, 0, 0]);
    let after = arch::rdtsc();
    // KVM pairs only a TSC-based host clock: on a host whose clocksource is
    // not the TSC (kvm-clock, nested) every pairing is -KVM_EOPNOTSUPP
    // before the GPA is looked at (arch/x86/kvm/x86.c,
    // kvm_pv_clock_pairing, kvm_get_walltime_and_clockread).
    let host_clock_not_tsc =
        guest::backend() == Some(guest::Backend::Kvm) && paired == Ok(EOPNOTSUPP);
    if host_clock_not_tsc {
        const WHY: &str =
            "KVM_HC_CLOCK_PAIRING: -KVM_EOPNOTSUPP, the host's clocksource is not the TSC";
        for name in [
            "clock-pairing",
            "clock-pairing-values",
            "clock-pairing-not-ram",
        ] {
            t.skip(name, WHY);
        }
    } else {
        t.eq("clock-pairing", paired, Ok(0));
        // SAFETY: the structure the hypervisor just wrote.
        let p = unsafe { (&raw const PAIRING.0).read_volatile() };
        t.check(
            "clock-pairing-values",
            p[0] > 1_700_000_000
                && p[1] < 1_000_000_000
                && (before..=after).contains(&p[2])
                && p[3..].iter().all(|w| *w == 0),
            format_args!("{p:x?} tsc {before}..{after}"),
        );
    }
    t.eq(
        "clock-pairing-other-clock",
        arch::vmcall(CLOCK_PAIRING, [gpa, 1, 0, 0]),
        Ok((-95i64) as u64),
    );
    if !host_clock_not_tsc {
        t.eq(
            "clock-pairing-not-ram",
            arch::vmcall(CLOCK_PAIRING, [0xf_0000_0000, 0, 0, 0]),
            Ok((-14i64) as u64),
        );
    }
    t.eq(
        "sched-yield",
        arch::vmcall(KVM_HC_SCHED_YIELD, [0, 0, 0, 0]),
        Ok(0),
    );
    t.eq(
        "sched-yield-vmmcall",
        arch::vmmcall(KVM_HC_SCHED_YIELD, [1, 0, 0, 0]),
        Ok(0),
    );
    // Kicking an APIC ID nobody has is not an error (KVM finds no target).
    t.eq(
        "kick-missing-cpu",
        arch::vmcall(KVM_HC_KICK_CPU, [0, 200, 0, 0]),
        Ok(0),
    );
    // SEND_IPI returns how many vCPUs it reached: ourselves (APIC ID 0; the
    // vector stays pending, interrupts are off), nobody at IDs 100..163.
    t.eq(
        "send-ipi-self",
        arch::vmcall(KVM_HC_SEND_IPI, [1, 0, 0, 0xfd]),
        Ok(1),
    );
    t.eq(
        "send-ipi-nobody",
        arch::vmcall(KVM_HC_SEND_IPI, [u64::MAX, 0, 100, 0xfd]),
        Ok(0),
    );
    t.eq(
        "send-ipi-logical-einval",
        arch::vmcall(KVM_HC_SEND_IPI, [1, 0, 0, 0x800 | 0xfd]),
        Ok(EINVAL),
    );
    t.eq(
        "send-ipi-shorthand-einval",
        arch::vmcall(KVM_HC_SEND_IPI, [1, 0, 0, 0xc0000 | 0xfd]),
        Ok(EINVAL),
    );
    let pairing = arch::vmcall(KVM_HC_CLOCK_PAIRING, [0, 0, 0, 0]);
    t.measure("clock-pairing", format_args!("{pairing:?}"));
    t.check(
        "clock-pairing-without-kvmclock",
        pairing == Ok(EOPNOTSUPP) || f[0] & 1 != 0,
        format_args!("{pairing:?}"),
    );
}

/// What VMCALL and VMMCALL gave at CPL 3 (`user_hypercalls`).
#[cfg(target_arch = "x86_64")]
static mut USER_VMCALL: Result<u64, guest::arch::Fault> = Ok(0);
#[cfg(target_arch = "x86_64")]
static mut USER_VMMCALL: Result<u64, guest::arch::Fault> = Ok(0);

/// At CPL 3: KVM_HC_VAPIC_POLL_IRQ through VMCALL, then VMMCALL.
#[cfg(target_arch = "x86_64")]
extern "C" fn user_hypercalls() {
    use guest::arch;
    let vmcall = arch::vmcall(1, [0; 4]);
    let vmmcall = arch::vmmcall(1, [0; 4]);
    // SAFETY: one vCPU; read after call_user returns.
    unsafe {
        (&raw mut USER_VMCALL).write(vmcall);
        (&raw mut USER_VMMCALL).write(vmmcall);
    }
}
