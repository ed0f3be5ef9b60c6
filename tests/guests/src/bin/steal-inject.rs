//! rustkvm-test: arch=x86_64,aarch64 smp=2 compare=off matrix=off timeout=300
//!
//! Injected steal and preemption (`-accel rustkvm,inject-steal=...`,
//! docs/steal-time.md "Injected steal") as the guest sees it. Only the host
//! test `steal_injection_lands_exactly_and_identically_twice`
//! (tests/tests/guests.rs) boots it, under `-icount shift=0,sleep=off` with
//! the schedule [`X86_SCHEDULE`] / [`ARM_SCHEDULE`] (one instruction is one
//! ns of VM time; the x86 TSC runs at 1 GHz, `tsc-frequency`). It measures;
//! the host test compares the measures with the schedule and the two runs
//! with each other.
//!
//! - Phase A (x86: vCPU 1 held 20..25 ms while vCPU 0 watches): vCPU 1
//!   counts in a loop; vCPU 0 reads the TSC and vCPU 1's count and steal.
//!   Over the window vCPU 1's count must not move (a held vCPU runs
//!   nothing), and it moves again after. (`preempted` says nothing here:
//!   with both vCPUs on one thread, as `-icount` has them, a vCPU waiting
//!   for its turn reads preempted anyway, docs/steal-time.md.)
//! - Phase B (both: vCPU 0 preempted, nothing else running): vCPU 0 reads
//!   its clock (TSC / CNTVCT) in a loop; a hold shows as one gap, and each
//!   change of its own steal is recorded. vCPU 1 is parked (x86: halted;
//!   arm64: never started), so no round-robin turn adds steal of its own:
//!   the steal seen is exactly the injected steal.
//!
//! The oracle is the guest's own clock and counter, not rustkvm's output.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

/// The schedule the host test passes on x86 (documentation of what the
/// measures mean; the host test has its own copy).
pub const X86_SCHEDULE: &str = "1:20ms:3ms:5ms/0:60ms:1ms:4ms/0:70ms:2ms";
/// The arm64 schedule: phase B only (PV time has no `preempted` flag).
pub const ARM_SCHEDULE: &str = "0:60ms:1ms:4ms/0:70ms:2ms";

/// vCPU 1's window in [`X86_SCHEDULE`] (VM ns).
#[cfg(target_arch = "x86_64")]
const HOLD_FROM_NS: u64 = 20_000_000;
/// See HOLD_FROM_NS.
#[cfg(target_arch = "x86_64")]
const HOLD_TO_NS: u64 = 25_000_000;
/// End of phase A and of phase B, in VM ns.
#[cfg(target_arch = "x86_64")]
const PHASE_A_END_NS: u64 = 40_000_000;
/// See PHASE_A_END_NS.
const PHASE_B_END_NS: u64 = 85_000_000;
/// A clock step this large (ns) between two reads of phase B is a hold.
const GAP_NS: u64 = 100_000;
/// Most steal changes phase B records.
const MAX_STEPS: usize = 4;
/// Each recorded change's keys: when vCPU 0 saw it, and by how much.
const STEP_KEYS: [[&str; 2]; MAX_STEPS] = [
    ["b.step0.at-ns", "b.step0.ns"],
    ["b.step1.at-ns", "b.step1.ns"],
    ["b.step2.at-ns", "b.step2.ns"],
    ["b.step3.at-ns", "b.step3.ns"],
];

/// Phase B on vCPU 0: `now()` in ns of VM time, `steal()` its steal so far.
fn phase_b(t: &mut Test, now: impl Fn() -> u64, steal: impl Fn() -> u64) {
    let (mut gaps, mut gap_ns, mut gap_at) = (0u64, 0u64, 0u64);
    let mut steps = [(0u64, 0u64); MAX_STEPS];
    let mut n_steps = 0;
    let mut last_steal = steal();
    let mut prev = now();
    while prev < PHASE_B_END_NS {
        // Steal first: a change is then dated by a clock read after it.
        let s = steal();
        let t1 = now();
        if t1 - prev >= GAP_NS {
            gaps += 1;
            (gap_ns, gap_at) = (t1 - prev, prev);
        }
        if s != last_steal {
            if n_steps < MAX_STEPS {
                steps[n_steps] = (t1, s - last_steal);
            }
            n_steps += 1;
            last_steal = s;
        }
        prev = t1;
    }
    t.measure("b.gaps", format_args!("{gaps}"));
    t.measure("b.gap-ns", format_args!("{gap_ns}"));
    t.measure("b.gap-from-ns", format_args!("{gap_at}"));
    t.measure("b.steal-steps", format_args!("{n_steps}"));
    for (i, (at, d)) in steps.iter().take(n_steps.min(MAX_STEPS)).enumerate() {
        t.measure(STEP_KEYS[i][0], format_args!("{at}"));
        t.measure(STEP_KEYS[i][1], format_args!("{d}"));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::ptr::addr_of;
    use core::sync::atomic::{AtomicU64, Ordering};
    use guest::arch::{self, KvmStealTime, MSR_KVM_STEAL_TIME};

    pub static mut ST0: KvmStealTime = KvmStealTime::new();
    pub static mut ST1: KvmStealTime = KvmStealTime::new();
    /// vCPU 1's count, and vCPU 0's word for it to stop.
    pub static PROGRESS: AtomicU64 = AtomicU64::new(0);
    pub static STOP: AtomicU64 = AtomicU64::new(0);
    pub static AP_ON: AtomicU64 = AtomicU64::new(0);
    pub static AP_DONE: AtomicU64 = AtomicU64::new(0);

    /// vCPU 1: steal time on, then count until told to stop (then halt).
    pub fn ap() {
        let on = arch::wrmsr(MSR_KVM_STEAL_TIME, addr_of!(ST1) as u64 | 1).is_ok();
        AP_ON.store(1 + u64::from(on), Ordering::Release);
        while STOP.load(Ordering::Relaxed) == 0 {
            PROGRESS.fetch_add(1, Ordering::Relaxed);
        }
        AP_DONE.store(1, Ordering::Release);
    }

    /// A volatile read of a field the host writes.
    pub fn steal_of(st: *const KvmStealTime) -> u64 {
        // SAFETY: our static structure, identity-mapped.
        unsafe { addr_of!((*st).steal).read_volatile() }
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use core::sync::atomic::Ordering;
    use guest::arch::{self, MSR_KVM_STEAL_TIME};
    use x86::*;

    if !arch::has_kvm_signature() {
        t.skip("steal-inject", "no KVM signature at CPUID 0x40000000");
        return;
    }
    t.eq(
        "steal-time-on",
        arch::wrmsr(MSR_KVM_STEAL_TIME, addr_of!(ST0) as u64 | 1),
        Ok(()),
    );
    arch::start_ap(1, ap);
    t.eq("ap-steal-time-on", AP_ON.load(Ordering::Acquire), 2);
    let st1 = addr_of!(ST1);

    // Phase A: watch vCPU 1's count around its window (20..25 ms).
    let (mut at_start, mut at_end) = (None, None);
    // The longest step between two of vCPU 0's reads in the window: with
    // vCPU 1 held, vCPU 0 alone runs through it (no round-robin turn).
    let (mut prev, mut max_gap) = (0u64, 0u64);
    let mut steal_before = steal_of(st1);
    let last = loop {
        let now = arch::rdtsc();
        let progress = PROGRESS.load(Ordering::Relaxed);
        if now < HOLD_FROM_NS {
            steal_before = steal_of(st1);
        } else if now < HOLD_TO_NS {
            if at_start.is_some() {
                max_gap = max_gap.max(now - prev);
            }
            at_start.get_or_insert((now, progress));
            at_end = Some((now, progress));
        }
        prev = now;
        if now >= PHASE_A_END_NS {
            break progress;
        }
    };
    let (start, end) = (at_start.unwrap_or_default(), at_end.unwrap_or_default());
    t.check(
        "watched-the-window",
        at_start.is_some(),
        format_args!("no read of vCPU 0 in 20..25 ms"),
    );
    t.check(
        "held-vcpu-ran-nothing",
        start.1 == end.1,
        format_args!(
            "vCPU 1 counted {} from {} to {} ns",
            end.1 - start.1,
            start.0,
            end.0
        ),
    );
    // Released, it runs again at its next round-robin turn (-icount gives
    // vCPU 0 a slice first, up to half the time to the next deadline).
    t.check(
        "released-vcpu-runs-again",
        guest::spin_until(|| PROGRESS.load(Ordering::Relaxed) > last),
        format_args!("vCPU 1's count stays {last}"),
    );
    t.measure("a.resumed-by-ns", format_args!("{}", arch::rdtsc()));
    let steal_after = steal_of(st1);
    t.measure("a.max-gap-ns", format_args!("{max_gap}"));
    t.measure("a.first-read-ns", format_args!("{}", start.0));
    t.measure("a.last-read-ns", format_args!("{}", end.0));
    t.measure(
        "a.steal-ns",
        format_args!("{}", steal_after.wrapping_sub(steal_before)),
    );
    STOP.store(1, Ordering::Release);
    t.check(
        "ap-stopped",
        guest::spin_until(|| AP_DONE.load(Ordering::Acquire) != 0),
        format_args!("vCPU 1 never stopped"),
    );

    // Phase B: vCPU 0 itself.
    let st0 = addr_of!(ST0);
    phase_b(t, arch::rdtsc, || steal_of(st0));
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch;
    let Some(base) = arch::pv_time_st() else {
        t.skip("steal-inject", "no PV time (SMCCC PV_TIME_ST)");
        return;
    };
    t.check(
        "pv-time-st-answers",
        base != 0,
        format_args!("structure at {base:#x}"),
    );
    let hz = arch::cntfrq().max(1);
    let now = || (u128::from(arch::cntvct()) * 1_000_000_000 / u128::from(hz)) as u64;
    phase_b(t, now, || arch::stolen_time(base));
}
