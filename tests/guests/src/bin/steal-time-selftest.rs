//! rustkvm-test: arch=x86_64,aarch64 compare=off matrix=off timeout=60
//!
//! The guest half of Linux's KVM selftest `tools/testing/selftests/kvm/
//! steal_time.c`, for x86 MSR_KVM_STEAL_TIME and arm64 PV stolen time. It
//! sets the structure up (x86: the MSR reads back GPA | enabled, then the
//! structure is zeroed, as the selftest does; arm64: the SMCCC discovery
//! sequence, then PV_TIME_ST), says `sync0`, waits for a byte on its
//! console, and checks the structure each time (x86: version even, flags
//! 0, preempted 0; arm64: revision 0, attributes 0) and that the version
//! grew (x86). It reports `stolen.sync0` and `stolen.sync1`: the host test
//! (tests/tests/guests.rs) keeps the vCPU off its CPU in between and checks
//! stolen ≤ the vCPU thread's run_delay at sync0 and the growth ≥ the
//! run-queue delay it forced, as the selftest does. Not part of the matrix.
#![no_std]
#![no_main]

use guest::{wait_for_host, Test};

guest::entry!(main);

#[cfg(target_arch = "x86_64")]
static mut ST: guest::arch::KvmStealTime = guest::arch::KvmStealTime::new();

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch::{self, rdtsc, MSR_KVM_STEAL_TIME};
    /// KVM_MSR_ENABLED.
    const ENABLED: u64 = 1;

    if !arch::has_kvm_signature() || arch::cpuid(0x4000_0001, 0)[0] & (1 << 5) == 0 {
        t.skip("steal-time-selftest", "no KVM_FEATURE_STEAL_TIME");
        return;
    }
    let gpa = addr_of!(ST) as u64;
    t.eq(
        "enable",
        arch::wrmsr(MSR_KVM_STEAL_TIME, gpa | ENABLED),
        Ok(()),
    );
    t.eq(
        "msr-reads-gpa-enabled",
        arch::rdmsr(MSR_KVM_STEAL_TIME),
        Ok(gpa | ENABLED),
    );
    // SAFETY: the structure is ours; the host updates it only on entries.
    unsafe { addr_of_mut!(ST).write_volatile(guest::arch::KvmStealTime::new()) };
    // Let the host update it (an exit and re-entry), as GUEST_SYNC(0) does.
    arch::outb(0x80, 0);
    // SAFETY: volatile reads of memory the host updates.
    let read = || unsafe {
        (
            addr_of!(ST.steal).read_volatile(),
            addr_of!(ST.version).read_volatile(),
            addr_of!(ST.flags).read_volatile(),
            addr_of!(ST.preempted).read_volatile(),
        )
    };
    let check_status = |t: &mut Test, at: &str| {
        let (_, version, flags, preempted) = read();
        t.check(
            "status",
            version % 2 == 0 && flags == 0 && preempted == 0,
            format_args!("{at}: version {version} flags {flags} preempted {preempted}"),
        );
    };
    check_status(t, "sync0");
    let (stolen0, version0, _, _) = read();
    t.measure("stolen.sync0", format_args!("{stolen0}"));
    guest::println!("sync0");
    // 30 s at 2 GHz.
    let released = wait_for_host(60_000_000_000, rdtsc);
    t.check("released-by-host", released, format_args!("no byte"));
    // Let updates taken after the release land (KVM: at the next entries,
    // which port I/O causes; rustkvm MTTCG: the sampler's ticks): 20 ms at
    // ≥ 2 GHz. A busy host may take this vCPU off its CPU meanwhile; KVM
    // clears `preempted` at the entry that follows, rustkvm at the exit it
    // then requests (at most a block later), so the check below sees 0.
    let t1 = rdtsc();
    while rdtsc().wrapping_sub(t1) < 40_000_000 {
        arch::outb(0x80, 0);
    }
    check_status(t, "sync1");
    let (stolen1, version1, _, _) = read();
    t.check(
        "version-grew",
        version1 > version0,
        format_args!("{version0} -> {version1}"),
    );
    t.measure("stolen.sync1", format_args!("{stolen1}"));
    let _ = arch::wrmsr(MSR_KVM_STEAL_TIME, 0);
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{cntfrq, cntvct, hvc};
    /// SMCCC_ARCH_FEATURES.
    const ARCH_FEATURES: u32 = 0x8000_0001;
    /// ARM_SMCCC_HV_PV_TIME_FEATURES.
    const PV_TIME_FEATURES: u32 = 0xc500_0020;
    /// ARM_SMCCC_HV_PV_TIME_ST.
    const PV_TIME_ST: u32 = 0xc500_0021;
    let smccc = |func: u32, arg: u64| hvc(func, [arg, 0, 0])[0] as i64;

    if smccc(ARCH_FEATURES, PV_TIME_FEATURES.into()) != 0 {
        t.skip("steal-time-selftest", "no PV_TIME_FEATURES");
        return;
    }
    t.eq(
        "pv-time-features",
        smccc(PV_TIME_FEATURES, PV_TIME_FEATURES.into()),
        0,
    );
    t.eq(
        "pv-time-st-offered",
        smccc(PV_TIME_FEATURES, PV_TIME_ST.into()),
        0,
    );
    let st = smccc(PV_TIME_ST, 0);
    t.check("pv-time-st", st != -1, format_args!("{st}"));
    if st == -1 {
        return;
    }
    let st = st as u64 as *const u32;
    // SAFETY: the structure PV_TIME_ST returned (the MMU is off: IPA = VA);
    // volatile reads of memory the host updates.
    let read = || unsafe {
        (
            st.read_volatile(),
            st.add(1).read_volatile(),
            st.add(2).cast::<u64>().read_volatile(),
        )
    };
    let check_status = |t: &mut Test, at: &str| {
        let (rev, attr, _) = read();
        t.check(
            "status",
            rev == 0 && attr == 0,
            format_args!("{at}: revision {rev} attributes {attr}"),
        );
    };
    check_status(t, "sync0");
    t.measure("stolen.sync0", format_args!("{}", read().2));
    guest::println!("sync0");
    let released = wait_for_host(30 * cntfrq(), cntvct);
    t.check("released-by-host", released, format_args!("no byte"));
    // Let updates taken after the release land: 20 ms.
    let t1 = cntvct();
    while cntvct().wrapping_sub(t1) < cntfrq() / 50 {
        core::hint::spin_loop();
    }
    check_status(t, "sync1");
    t.measure("stolen.sync1", format_args!("{}", read().2));
}
