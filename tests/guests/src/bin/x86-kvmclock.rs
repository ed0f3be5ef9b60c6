//! rustkvm-test: arch=x86_64 smp=2 cpu=max compare=off vary=wall.unix-s,pvclock.tsc-khz,cross-vcpu.rounds
//! rustkvm-expect: tcg=skip
//!   (no kvmclock under stock TCG)
//! rustkvm-test: kvm-vary=backwards-without-master-clock
//! rustkvm-expect-skip: kvm-nested stable-bit-as-advertised,new-msr-stable-as-advertised-again,never-backwards-across-vcpus,monotonic-over-200000-reads-and-a-tsc-write
//!   (kvm-nested: L1's clocksource is kvm-clock, so KVM has no master clock)
//!
//! kvmclock as KVM implements it (Linux Documentation/virt/kvm/x86/msr.rst,
//! arch/x86/include/asm/pvclock-abi.h, arch/x86/kvm/x86.c): the wall clock
//! and per-vCPU time structures are written with even versions; the scale
//! gives the TSC rate; PVCLOCK_TSC_STABLE_BIT is set exactly when CPUID
//! 0x40000001 advertises it and vCPU 0 does not use the legacy MSR; the clock read as Linux reads it never goes
//! backwards, on one vCPU over many reads, across a TSC write, or from one
//! vCPU to the other; a structure address outside RAM is accepted (no #GP,
//! as KVM), and so is one whose 32 bytes cross a page, which KVM's
//! page-sized cache then never writes. `wall.unix-s` is the guest's wall-clock time, which the host
//! test compares with its own. SKIPs without kvmclock (plain TCG).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvmclock", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod kc {
    use core::sync::atomic::{AtomicBool, Ordering};
    use guest::arch;
    pub use guest::kvmclock::{Pvti, MSR_SYSTEM_TIME, MSR_SYSTEM_TIME_OLD, MSR_WALL_CLOCK};

    /// kvmclock from one of this guest's structures.
    pub fn read(p: *const Pvti) -> (u64, u8) {
        // SAFETY: `p` is BSP or AP, statics the hypervisor updates.
        unsafe { guest::kvmclock::read(p) }
    }

    /// `struct pvclock_wall_clock`.
    #[repr(C, align(16))]
    pub struct Wall {
        pub version: u32,
        pub sec: u32,
        pub nsec: u32,
    }

    pub static mut BSP: Pvti = Pvti::new();
    pub static mut AP: Pvti = Pvti::new();
    pub static mut WALL: Wall = Wall {
        version: 0,
        sec: 0,
        nsec: 0,
    };
    pub static CROSS: guest::cross::CrossCheck = guest::cross::CrossCheck::new();
    pub static AP_READY: AtomicBool = AtomicBool::new(false);

    /// vCPU 1: its own structure, then check each value vCPU 0 publishes
    /// against a later read of its own clock.
    pub fn ap() {
        let gpa = (&raw const AP) as u64;
        if arch::wrmsr(MSR_SYSTEM_TIME, gpa | 1).is_err() {
            return;
        }
        AP_READY.store(true, Ordering::Release);
        CROSS.follow(|| read(&raw const AP).0);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use guest::arch;
    use guest::kvmclock::FEATURE_CLOCKSOURCE2;
    use kc::*;
    const STABLE_BIT: u32 = 1 << 24;

    if !arch::has_kvm_signature() || arch::cpuid(0x4000_0001, 0)[0] & FEATURE_CLOCKSOURCE2 == 0 {
        t.skip("kvmclock", "no KVM_FEATURE_CLOCKSOURCE2");
        return;
    }
    let advertised_stable = arch::cpuid(0x4000_0001, 0)[0] & STABLE_BIT != 0;
    let wall = (&raw const WALL) as u64;
    let bsp = (&raw const BSP) as u64;
    t.eq("wall-clock-msr", arch::wrmsr(MSR_WALL_CLOCK, wall), Ok(()));
    t.eq(
        "system-time-msr",
        arch::wrmsr(MSR_SYSTEM_TIME, bsp | 1),
        Ok(()),
    );
    t.eq(
        "system-time-reads-back",
        arch::rdmsr(MSR_SYSTEM_TIME),
        Ok(bsp | 1),
    );
    // SAFETY: volatile reads of structures the hypervisor wrote.
    let (wv, sec, nsec, v, mul, shift) = unsafe {
        (
            (&raw const WALL.version).read_volatile(),
            (&raw const WALL.sec).read_volatile(),
            (&raw const WALL.nsec).read_volatile(),
            (&raw const BSP.version).read_volatile(),
            (&raw const BSP.mul).read_volatile(),
            (&raw const BSP.shift).read_volatile(),
        )
    };
    t.check(
        "versions-even-and-written",
        wv != 0 && wv % 2 == 0 && v != 0 && v % 2 == 0,
        format_args!("wall {wv}, vcpu {v}"),
    );
    // pvclock_tsc_khz: the TSC rate the scale describes.
    let mut khz = (1_000_000u64 << 32) / u64::from(mul.max(1));
    if shift < 0 {
        khz <<= -shift as u32;
    } else {
        khz >>= shift as u32;
    }
    t.measure("pvclock.tsc-khz", format_args!("{khz}"));
    let (now, flags) = read(&raw const BSP);
    // KVM sets the stable bit only with its master clock, which needs a
    // TSC-based host clocksource (arch/x86/kvm/x86.c: kvm_guest_time_update
    // sets PVCLOCK_TSC_STABLE_BIT when use_master_clock;
    // pvclock_update_vm_gtod_copy, kvm_get_time_and_clockread): a host on
    // kvm-clock (nested) advertises the bit and never sets it.
    let no_master_clock =
        guest::backend() == Some(guest::Backend::Kvm) && advertised_stable && flags & 1 == 0;
    const NO_MASTER: &str = "KVM has no master clock: the host's clocksource is not the TSC";
    if no_master_clock {
        t.skip("stable-bit-as-advertised", NO_MASTER);
    } else {
        t.eq(
            "stable-bit-as-advertised",
            flags & 1 != 0,
            advertised_stable,
        );
    }
    let unix_ns = u64::from(sec) * 1_000_000_000 + u64::from(nsec) + now;
    t.measure("wall.unix-s", format_args!("{}", unix_ns / 1_000_000_000));

    // vCPU 0 on the legacy MSR turns KVM's master clock off, and with it
    // the stable bit (`kvm_write_system_time`, `boot_vcpu_runs_old_kvmclock`);
    // back on the new MSR, the stable bit is as advertised again.
    if arch::cpuid(0x4000_0001, 0)[0] & 1 != 0 {
        let _ = arch::wrmsr(MSR_SYSTEM_TIME_OLD, bsp | 1);
        t.eq("legacy-msr-not-stable", read(&raw const BSP).1 & 1, 0);
        let _ = arch::wrmsr(MSR_SYSTEM_TIME, bsp | 1);
        if no_master_clock {
            t.skip("new-msr-stable-as-advertised-again", NO_MASTER);
        } else {
            t.eq(
                "new-msr-stable-as-advertised-again",
                read(&raw const BSP).1 & 1 != 0,
                advertised_stable,
            );
        }
    }

    // Monotonic over many reads, and across a TSC write (kvmclock follows).
    let mut last = 0;
    let mut backwards = 0;
    for i in 0..200_000u32 {
        if i == 100_000 {
            let _ = arch::wrmsr(0x10, 12345);
        }
        let (c, _) = read(&raw const BSP);
        if c < last {
            backwards += 1;
        }
        last = c;
    }
    // Without a master clock each update samples the TSC and the host's
    // clock apart (kvm_guest_time_update): a later one can step back, which
    // only Linux's global last value hides (pvclock_clocksource_read).
    if no_master_clock {
        t.skip("monotonic-over-200000-reads-and-a-tsc-write", NO_MASTER);
        t.measure(
            "backwards-without-master-clock",
            format_args!("{backwards}"),
        );
    } else {
        t.eq("monotonic-over-200000-reads-and-a-tsc-write", backwards, 0);
    }

    // Across vCPUs: vCPU 1 never reads less than what vCPU 0 published.
    arch::start_ap(1, ap);
    let t0 = arch::rdtsc();
    while !AP_READY.load(Ordering::Acquire) && arch::rdtsc().wrapping_sub(t0) < 4_000_000_000 {
        core::hint::spin_loop();
    }
    let start = read(&raw const BSP).0;
    let (rounds, backwards) = CROSS.lead(
        || read(&raw const BSP).0,
        || read(&raw const BSP).0 - start < 300_000_000,
    );
    t.measure("cross-vcpu.rounds", format_args!("{rounds}"));
    t.check("cross-vcpu-rounds", rounds >= 1, format_args!("{rounds}"));
    // Without the stable bit KVM promises no order between vCPUs' clocks
    // (each vCPU's structure is its own snapshot; Linux keeps a global
    // last value then: pvclock_clocksource_read, arch/x86/kernel/pvclock.c).
    if no_master_clock {
        t.skip("never-backwards-across-vcpus", NO_MASTER);
    } else {
        t.eq("never-backwards-across-vcpus", backwards, false);
    }

    // Outside RAM: accepted, read back, nothing breaks.
    t.eq(
        "outside-ram-accepted",
        arch::wrmsr(MSR_SYSTEM_TIME, 0xf_0000_0000 | 1),
        Ok(()),
    );
    t.eq(
        "outside-ram-reads-back",
        arch::rdmsr(MSR_SYSTEM_TIME),
        Ok(0xf_0000_0001),
    );

    // 32 bytes that cross a page: the MSR takes them, and (KVM's
    // gfn_to_pfn_cache maps one page) nothing is ever written there.
    let cross = (&raw const CROSS_PAGE) as u64 + 4096 - 16;
    t.eq(
        "cross-page-accepted",
        arch::wrmsr(MSR_SYSTEM_TIME, cross | 1),
        Ok(()),
    );
    // A few exits, each an entry at which a pending update would land.
    for _ in 0..100 {
        arch::outb(0x80, 0);
    }
    // SAFETY: our own static, read with volatile loads.
    let untouched =
        (0..8192).all(|i| unsafe { (&raw const CROSS_PAGE.0[i]).read_volatile() } == 0xa5);
    t.check(
        "cross-page-never-written",
        untouched,
        format_args!("bytes around {cross:#x} changed"),
    );
    let _ = arch::wrmsr(MSR_SYSTEM_TIME, 0);
}

/// Two pages the guest fills with 0xa5 and points kvmclock across.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(4096))]
struct TwoPages([u8; 8192]);

#[cfg(target_arch = "x86_64")]
static mut CROSS_PAGE: TwoPages = TwoPages([0xa5; 8192]);
