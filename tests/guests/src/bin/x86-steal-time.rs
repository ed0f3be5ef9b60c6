//! rustkvm-test: arch=x86_64 compare=off vary=steal-ns,alone,alone.stolen-ns,alone.elapsed-ticks,alone.clean,shared.stolen-ns,shared.elapsed-ticks,shared.clean,shared.cpu1-insns
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//!
//! MSR_KVM_STEAL_TIME as KVM implements it: reserved bits #GP, the MSR
//! reads back, the structure is updated with the version protocol, a GPA
//! outside RAM is accepted and never written. It reports the steal a lone
//! vCPU saw (`steal-ns`), then its stolen time over a window of 10⁸ loop
//! instructions (`guest::steal`) alone and, where the machine has a second
//! vCPU (`alone` 0), while that one counts the instructions it executes
//! (the AP is started only then): the host test (tests/tests/guests.rs) checks
//! under `-icount` that the lone steal and the alone window's are 0 and the
//! shared window's exactly what the second vCPU executed; how little a lone
//! vCPU gets from the host's scheduler is a host statistic
//! (scripts/soak-guests.sh). SKIPs where the MSR is not KVM's (plain TCG).
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

/// The second vCPU's progress and its stop flag (`guest::steal`).
#[cfg(target_arch = "x86_64")]
static PROGRESS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
#[cfg(target_arch = "x86_64")]
static DONE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// A window's loop: 10⁸ instructions (100 ms of VM time under `-icount
/// shift=0`, long enough for the other vCPU to get turns); 2·10⁵ on the
/// `kvm` backend, where this project's nested KVM (kvm_pvm) runs them at a
/// few million a second and only the structure's updates matter.
#[cfg(target_arch = "x86_64")]
fn window_n() -> u64 {
    if guest::backend() == Some(guest::Backend::Kvm) {
        100_000
    } else {
        50_000_000
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use core::sync::atomic::Ordering;
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

    // Windows (guest::steal): alone, then while the second vCPU counts.
    // SAFETY: only the address of the structure the host updates is taken;
    // the windows read its `steal` field (our static, identity-mapped).
    let stolen = unsafe { addr_of!(ST.steal) };
    let report = |t: &mut Test, keys: [&str; 3], w: &guest::steal::Window| {
        t.measure(keys[0], format_args!("{}", w.stolen()));
        t.measure(keys[1], format_args!("{}", w.ticks()));
        t.measure(keys[2], format_args!("{}", u8::from(w.clean())));
    };
    // SAFETY: `stolen` is our structure's `steal` field.
    let alone = unsafe { guest::steal::clean_window(window_n(), stolen, &PROGRESS, 4) };
    report(
        t,
        ["alone.stolen-ns", "alone.elapsed-ticks", "alone.clean"],
        &alone,
    );
    let alone_on_the_machine = guest::boot_cpus() < 2;
    t.measure("alone", format_args!("{}", u8::from(alone_on_the_machine)));
    let mut seen = [steal, alone.stolen_before, alone.stolen_after, 0, 0];
    if !alone_on_the_machine {
        arch::start_ap(1, || guest::steal::count_progress(&PROGRESS, &DONE));
        let counting = (0..1_000_000_000u64).any(|_| PROGRESS.load(Ordering::Relaxed) != 0);
        t.check("ap-counts", counting, format_args!("no progress"));
        // SAFETY: as above.
        let shared = unsafe { guest::steal::clean_window(window_n(), stolen, &PROGRESS, 4) };
        DONE.store(1, Ordering::Release);
        report(
            t,
            ["shared.stolen-ns", "shared.elapsed-ticks", "shared.clean"],
            &shared,
        );
        t.measure(
            "shared.cpu1-insns",
            format_args!("{}", shared.progress() * guest::steal::PROGRESS_INSNS),
        );
        seen[3..].copy_from_slice(&[shared.stolen_before, shared.stolen_after]);
    }
    let seen = if alone_on_the_machine {
        &seen[..3]
    } else {
        &seen[..]
    };
    t.check(
        "steal-monotonic",
        seen.windows(2).all(|w| w[0] <= w[1]),
        format_args!("{seen:?}"),
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
