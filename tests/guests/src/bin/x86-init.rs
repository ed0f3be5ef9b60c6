//! rustkvm-test: arch=x86_64 smp=2 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has neither KVM's PV MSRs nor an x86 PMU)
//!
//! INIT is not RESET, as under KVM (`kvm_vcpu_reset(vcpu, init_event)` in
//! Linux `arch/x86/kvm/x86.c`). The application processor enables steal
//! time and kvmclock, counts instructions on PMC0, moves its TSC (and so
//! IA32_TSC_ADJUST) and parks; then it gets INIT-SIPI-SIPI again. After the
//! INIT:
//! - MSR_KVM_STEAL_TIME and MSR_KVM_SYSTEM_TIME_NEW read 0 and their old
//!   areas are never written again (KVM clears `st.msr_val` and calls
//!   `kvmclock_reset` on INIT as on RESET);
//! - PERFEVTSEL0 and GLOBAL_CTRL are kept and PMC0 kept counting through
//!   the INIT and the start-up code (KVM has no PMU reset on INIT; SDM vol.
//!   3 table 10-1: performance counters and event selects unchanged);
//! - the TSC went on from where the AP had moved it and IA32_TSC_ADJUST
//!   is unchanged (KVM touches neither on INIT).
//!
//! SKIPs without the KVM signature or without a PMU (CPUID 0xA).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-init", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod ap {
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch::{self, KvmStealTime, MSR_KVM_STEAL_TIME};
    use guest::x86_pmu::{EN, EVTSEL0, GLOBAL_CTRL, OS, PMC0, USR};

    /// MSR_KVM_SYSTEM_TIME_NEW.
    pub const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
    /// IA32_TSC and IA32_TSC_ADJUST.
    pub const MSR_IA32_TSC: u32 = 0x10;
    /// See [`MSR_IA32_TSC`].
    pub const MSR_IA32_TSC_ADJUST: u32 = 0x3b;
    /// PERFEVTSEL0: instructions retired at any CPL.
    pub const INSNS: u64 = EN | OS | USR | 0xc0;
    /// How far the AP moves its TSC ahead of the VM's.
    pub const TSC_JUMP: u64 = 1 << 40;

    /// `struct pvclock_vcpu_time_info`, 32 bytes (64 here: one line).
    #[repr(C, align(64))]
    pub struct Pvclock(pub [u8; 64]);

    pub static mut STEAL: KvmStealTime = KvmStealTime::new();
    pub static mut PVCLOCK: Pvclock = Pvclock([0; 64]);
    /// What the AP saw, by slot (see the `R_*` indexes).
    pub static mut SEEN: [u64; 16] = [0; 16];
    /// Stage the AP reached: 1 after its first start, 2, 3 after INITs.
    pub static mut STAGE: u64 = 0;

    pub const R_PMC_BEFORE: usize = 0;
    pub const R_TSC_BEFORE: usize = 1;
    pub const R_ADJUST_BEFORE: usize = 2;
    pub const R_STEAL_MSR: usize = 3;
    pub const R_KVMCLOCK_MSR: usize = 4;
    pub const R_EVTSEL: usize = 5;
    pub const R_GLOBAL_CTRL: usize = 6;
    pub const R_PMC_AFTER: usize = 7;
    pub const R_TSC_AFTER: usize = 8;
    pub const R_ADJUST_AFTER: usize = 9;
    pub const R_FAULTS: usize = 10;

    pub fn get(p: *const u64) -> u64 {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.read_volatile() }
    }
    fn set(p: *mut u64, v: u64) {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.write_volatile(v) }
    }
    fn record(slot: usize, v: u64) {
        set(addr_of_mut!(SEEN).cast::<u64>().wrapping_add(slot), v);
    }
    pub fn seen(slot: usize) -> u64 {
        get(addr_of!(SEEN).cast::<u64>().wrapping_add(slot))
    }
    pub fn stage() -> u64 {
        get(addr_of!(STAGE))
    }
    fn rd(index: u32) -> u64 {
        arch::rdmsr(index).unwrap_or_else(|_| {
            record(R_FAULTS, seen(R_FAULTS) + 1);
            0
        })
    }
    fn wr(index: u32, value: u64) {
        if arch::wrmsr(index, value).is_err() {
            record(R_FAULTS, seen(R_FAULTS) + 1);
        }
    }

    /// First start: turn everything on, then park.
    pub fn first() {
        wr(MSR_KVM_STEAL_TIME, addr_of!(STEAL) as u64 | 1);
        wr(MSR_KVM_SYSTEM_TIME_NEW, addr_of!(PVCLOCK) as u64 | 1);
        wr(GLOBAL_CTRL, 0);
        wr(PMC0, 0);
        wr(EVTSEL0, INSNS);
        wr(GLOBAL_CTRL, 1);
        wr(MSR_IA32_TSC, arch::rdtsc().wrapping_add(TSC_JUMP));
        let mut x = 0u64;
        for i in 0..1000 {
            x = core::hint::black_box(x + i);
        }
        record(R_ADJUST_BEFORE, rd(MSR_IA32_TSC_ADJUST));
        record(R_PMC_BEFORE, rd(PMC0));
        record(R_TSC_BEFORE, arch::rdtsc());
        set(addr_of_mut!(STAGE), 1);
    }

    /// After an INIT: what is left of it.
    pub fn second() {
        record(R_TSC_AFTER, arch::rdtsc());
        record(R_PMC_AFTER, rd(PMC0));
        record(R_STEAL_MSR, rd(MSR_KVM_STEAL_TIME));
        record(R_KVMCLOCK_MSR, rd(MSR_KVM_SYSTEM_TIME_NEW));
        record(R_EVTSEL, rd(EVTSEL0));
        record(R_GLOBAL_CTRL, rd(GLOBAL_CTRL));
        record(R_ADJUST_AFTER, rd(MSR_IA32_TSC_ADJUST));
        set(addr_of_mut!(STAGE), 2);
    }

    /// After another INIT: run (entries into guest code), and move the TSC
    /// (a kvmclock update, KVM_REQ_CLOCK_UPDATE, if kvmclock were still on).
    pub fn third() {
        let adjust = rd(MSR_IA32_TSC_ADJUST);
        wr(MSR_IA32_TSC_ADJUST, adjust.wrapping_add(1000));
        for _ in 0..100 {
            core::hint::spin_loop();
        }
        set(addr_of_mut!(STAGE), 3);
    }

    /// Wait (bounded) for the AP to reach `stage`.
    pub fn wait(stage: u64) -> bool {
        for _ in 0..2_000_000_000u64 {
            if self::stage() >= stage {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use ap::*;
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch;

    if !arch::has_kvm_signature() {
        t.skip("x86-init", "no KVM signature at CPUID 0x40000000");
        return;
    }
    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-init", "CPUID 0xA: no architectural PMU");
        return;
    }

    arch::start_ap(1, first);
    let up = wait(1);
    t.check(
        "ap-set-everything-up",
        up && seen(R_FAULTS) == 0,
        format_args!(
            "stage {}, {} faulting MSR accesses",
            stage(),
            seen(R_FAULTS)
        ),
    );
    if !up {
        return;
    }
    // SAFETY: volatile reads of structures the host writes.
    let (steal_version, pvclock_version) = unsafe {
        (
            addr_of!(STEAL.version).read_volatile(),
            addr_of!(PVCLOCK.0).cast::<u32>().read_volatile(),
        )
    };
    t.check(
        "steal-time-and-kvmclock-were-written",
        steal_version >= 2 && pvclock_version >= 2,
        format_args!("versions {steal_version}, {pvclock_version}"),
    );

    arch::start_ap(1, second);
    if !wait(2) {
        t.check(
            "ap-restarted-after-init",
            false,
            format_args!("stage {}", stage()),
        );
        return;
    }
    t.eq("steal-time-msr-reset-by-init", seen(R_STEAL_MSR), 0);
    t.eq("kvmclock-msr-reset-by-init", seen(R_KVMCLOCK_MSR), 0);
    t.eq("evtsel0-kept", seen(R_EVTSEL), INSNS);
    t.eq("global-ctrl-kept", seen(R_GLOBAL_CTRL), 1);
    let (before, after) = (seen(R_PMC_BEFORE), seen(R_PMC_AFTER));
    t.check(
        "pmc0-kept-counting-through-init",
        after > before && after - before < 100_000,
        format_args!("{before} before the INIT, {after} after"),
    );
    t.eq(
        "tsc-adjust-kept",
        seen(R_ADJUST_AFTER),
        seen(R_ADJUST_BEFORE),
    );
    let (tsc0, tsc1) = (seen(R_TSC_BEFORE), seen(R_TSC_AFTER));
    t.check(
        "tsc-kept-its-offset",
        tsc1 > tsc0 && tsc1 - tsc0 < TSC_JUMP / 2,
        format_args!("{tsc0:#x} before the INIT, {tsc1:#x} after"),
    );

    // The old areas: marked now, never written again.
    // SAFETY: the host no longer owns them (both MSRs read 0); plain
    // volatile stores to our statics.
    unsafe {
        addr_of_mut!(STEAL)
            .cast::<[u8; 64]>()
            .write_volatile([0xa5; 64]);
        addr_of_mut!(PVCLOCK.0).write_volatile([0x5a; 64]);
    }
    arch::start_ap(1, third);
    let done = wait(3);
    // SAFETY: volatile reads of our statics.
    let (steal, pvclock) = unsafe {
        (
            addr_of!(STEAL).cast::<[u8; 64]>().read_volatile(),
            addr_of!(PVCLOCK.0).read_volatile(),
        )
    };
    t.check(
        "old-steal-time-area-not-written-after-init",
        done && steal == [0xa5; 64],
        format_args!("stage {}, first bytes {:02x?}", stage(), &steal[..16]),
    );
    t.check(
        "old-kvmclock-area-not-written-after-init",
        done && pvclock == [0x5a; 64],
        format_args!("first bytes {:02x?}", &pvclock[..16]),
    );
}
