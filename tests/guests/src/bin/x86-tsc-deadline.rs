//! rustkvm-test: arch=x86_64 cpu=max compare=off vary=deadline.late-ticks
//! rustkvm-expect: tcg=skip
//! rustkvm-test: kvm-vary=past-fires-before-the-next-instruction
//!   (hardware may take a past deadline a few instructions late)
//!   (stock TCG's max model has no TSC-deadline mode)
//!
//! The local APIC's TSC-deadline mode (Intel SDM vol. 3 §11.5.4.1) as KVM
//! implements it (`arch/x86/kvm/lapic.c`): IA32_TSC_DEADLINE writes are
//! ignored and it reads 0 outside the mode; in the mode, the timer interrupt
//! becomes pending when the TSC reaches the deadline, never before
//! (`deadline.late-ticks` after it), and the MSR reads 0 afterwards; a deadline in the past fires at once; writing 0
//! disarms; a huge deadline never fires; leaving the mode disarms.
//! Interrupts stay disabled: the test watches the vector in the IRR.
//! SKIPs where CPUID.1:ECX[24] is clear (plain TCG).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-tsc-deadline", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{self, lapic_irr, lapic_reg, rdtsc, set_lapic_reg};

    use guest::arch::{
        LAPIC_LVT_TIMER as LVT_TIMER, LAPIC_SVR as SVR,
        LVT_TIMER_TSC_DEADLINE as TSC_DEADLINE_MODE, MSR_TSC_DEADLINE,
    };
    /// LVT timer mode: periodic (bits 18:17 = 01b).
    const PERIODIC_MODE: u32 = 1 << 17;
    /// LVT mask bit.
    const MASKED: u32 = 1 << 16;
    /// Timer initial count and current count registers.
    const TMICT: u32 = 0x380;
    const TMCCT: u32 = 0x390;
    /// TSC ticks to wait for something that must not happen (5 ms at 2 GHz).
    const QUIET: u64 = 10_000_000;

    if !arch::has_tsc_deadline() {
        t.skip(
            "tsc-deadline",
            "CPUID.1:ECX[24] clear: no TSC-deadline mode",
        );
        return;
    }
    set_lapic_reg(SVR, 0x1ff);
    let arm = |vector: u8, deadline: u64| {
        set_lapic_reg(LVT_TIMER, TSC_DEADLINE_MODE | u32::from(vector));
        arch::wrmsr(MSR_TSC_DEADLINE, deadline)
    };
    // Spin until `vector` is pending or `ticks` pass; the TSC read just
    // after the IRR showed it pending. Read after, not before: a vCPU
    // descheduled between a TSC read and the IRR read would see a vector
    // that became pending later than that TSC value, and the check below
    // would call a punctual interrupt early.
    let wait = |vector: u8, ticks: u64| {
        let t0 = rdtsc();
        loop {
            let pending = lapic_irr(vector);
            let now = rdtsc();
            if pending {
                return Some(now);
            }
            if now.wrapping_sub(t0) > ticks {
                return None;
            }
        }
    };

    // One-shot <-> periodic keeps the initial count (and the count going);
    // only entering or leaving TSC-deadline mode clears it (KVM's
    // apic_update_lvtt; kvm-unit-tests' apic test_apic_change_mode).
    set_lapic_reg(LVT_TIMER, MASKED | 0x45);
    set_lapic_reg(TMICT, 0x1000_0000);
    set_lapic_reg(LVT_TIMER, MASKED | PERIODIC_MODE | 0x45);
    t.eq("periodic.keeps-tmict", lapic_reg(TMICT), 0x1000_0000);
    t.check(
        "periodic.count-goes-on",
        lapic_reg(TMCCT) != 0,
        format_args!("TMCCT 0"),
    );
    set_lapic_reg(LVT_TIMER, MASKED | 0x45);
    t.eq("one-shot.keeps-tmict", lapic_reg(TMICT), 0x1000_0000);
    set_lapic_reg(LVT_TIMER, MASKED | TSC_DEADLINE_MODE | 0x45);
    t.eq("deadline.clears-tmict", lapic_reg(TMICT), 0);
    set_lapic_reg(LVT_TIMER, MASKED | 0x45);
    t.eq("leaving-deadline.tmict-0", lapic_reg(TMICT), 0);

    // One-shot mode: the MSR ignores writes and reads 0.
    set_lapic_reg(LVT_TIMER, 0x30);
    t.eq(
        "write-outside-mode",
        arch::wrmsr(MSR_TSC_DEADLINE, rdtsc() + QUIET),
        Ok(()),
    );
    t.eq("reads-0-outside-mode", arch::rdmsr(MSR_TSC_DEADLINE), Ok(0));
    t.eq("ignored-outside-mode", wait(0x30, QUIET), None);

    // Armed 1 ms ahead: pending after the deadline, not before. It reads
    // back until then (after it, 0: a host that kept this vCPU off past
    // the deadline between the write and the read sees that).
    let deadline = rdtsc() + 2_000_000;
    let armed = arm(0x40, deadline);
    let (back, now) = (arch::rdmsr(MSR_TSC_DEADLINE), rdtsc());
    t.eq("arm", armed, Ok(()));
    t.check(
        "reads-back",
        back == Ok(deadline) || (back == Ok(0) && now >= deadline),
        format_args!("{back:?} at {now}, deadline {deadline}"),
    );
    // (Up to 10 s: a hang guard. How soon it fires is the host's
    // scheduling, `deadline.late-ticks`: the host tests check it exactly
    // under -icount and as a statistic in host time.)
    let seen = wait(0x40, 20_000_000_000);
    t.check(
        "fires-not-before-deadline",
        seen.is_some_and(|s| s >= deadline),
        format_args!("deadline {deadline}, seen at {seen:?}"),
    );
    let late = seen.map_or(u64::MAX, |s| s.wrapping_sub(deadline));
    t.measure("deadline.late-ticks", format_args!("{late}"));
    t.eq(
        "disarmed-after-firing",
        arch::rdmsr(MSR_TSC_DEADLINE),
        Ok(0),
    );

    // In the past: at once, taken before the next instruction (KVM's
    // start_sw_tscdeadline; kvm-unit-tests' apic "tsc deadline timer":
    // `sti; wrmsr; nop` and the interrupt has been taken). On the kvm
    // backend the host's timing is not ours to promise: a short wait there.
    // Take what earlier checks left pending in the IRR first (their stubs
    // count and EOI them), so only this deadline can come in the window.
    // SAFETY: interrupts on for one instruction; every vector has a stub.
    unsafe { core::arch::asm!("sti", "nop", "nop", "cli", options(nostack)) };
    set_lapic_reg(LVT_TIMER, TSC_DEADLINE_MODE | 0x41);
    let before = arch::irqs(0x41);
    let past = rdtsc() - 1_000;
    // SAFETY: WRMSR of IA32_TSC_DEADLINE with interrupts on for it and the
    // NOP after it; vector 0x41's stub counts and EOIs.
    unsafe {
        core::arch::asm!(
            "sti",
            "wrmsr",
            "nop",
            "cli",
            in("ecx") MSR_TSC_DEADLINE,
            in("eax") past as u32,
            in("edx") (past >> 32) as u32,
            options(nostack),
        );
    }
    let taken = arch::irqs(0x41) - before;
    t.measure("past.taken-at-once", format_args!("{taken}"));
    if guest::backend() != Some(guest::Backend::Kvm) {
        t.eq("past-fires-before-the-next-instruction", taken, 1);
    }
    t.eq("past-disarmed", arch::rdmsr(MSR_TSC_DEADLINE), Ok(0));

    // Arm `vector` ahead and run `undo` at once: if `undo` finished before
    // the deadline (the TSC after it says so), nothing may be pending by
    // 2·QUIET past the deadline. A host that kept this vCPU off past the
    // deadline in between makes a try inconclusive: again, further ahead
    // (2·QUIET, then 16 and 256 times that), what was pending taken first.
    // Returns the arming's result, `undo`'s, and whether the vector came
    // (None: every try inconclusive).
    let disarms = |vector: u8, undo: &dyn Fn() -> Result<u64, arch::Fault>| {
        let mut lead = 2 * QUIET;
        let mut last = (Ok(()), Ok(0), None);
        for _ in 0..3 {
            // SAFETY: interrupts on for two NOPs; every vector has a stub.
            unsafe { core::arch::asm!("sti", "nop", "nop", "cli", options(nostack)) };
            let deadline = rdtsc() + lead;
            let armed = arm(vector, deadline);
            let undone = undo();
            let after = rdtsc();
            last = (armed, undone, None);
            if after < deadline {
                let fired = wait(vector, deadline + 2 * QUIET - rdtsc().min(deadline));
                last.2 = Some(fired.is_some());
                break;
            }
            lead *= 16;
        }
        last
    };

    // Written 0 before the deadline: disarmed.
    let (armed, written, came) = disarms(0x42, &|| arch::wrmsr(MSR_TSC_DEADLINE, 0).map(|()| 0));
    t.eq("arm-then-0", armed, Ok(()));
    t.eq("write-0", written, Ok(0));
    t.eq("zero-disarms", came, Some(false));

    // Huge: never (within the wait), and it reads back.
    t.eq("arm-huge", arm(0x43, u64::MAX), Ok(()));
    t.eq(
        "huge-reads-back",
        arch::rdmsr(MSR_TSC_DEADLINE),
        Ok(u64::MAX),
    );
    t.eq("huge-does-not-fire", wait(0x43, QUIET), None);

    // Leaving the mode disarms (and the MSR reads 0 from then on).
    let (armed, cleared, came) = disarms(0x44, &|| {
        set_lapic_reg(LVT_TIMER, 0x44);
        let msr = arch::rdmsr(MSR_TSC_DEADLINE);
        set_lapic_reg(LVT_TIMER, TSC_DEADLINE_MODE | 0x44);
        msr
    });
    t.eq("arm-then-leave", armed, Ok(()));
    t.eq("mode-change-clears", cleared, Ok(0));
    t.eq("mode-change-disarms", came, Some(false));
    t.eq("still-0", arch::rdmsr(MSR_TSC_DEADLINE), Ok(0));
}
