//! rustkvm-test: arch=aarch64 compare=off matrix=off
//!
//! The generic counters and an armed virtual timer across savevm/loadvm or
//! migration, under `-accel rustkvm,counter-offset=N` on both sides
//! (tests/tests/migration.rs; KVM_ARM_SET_COUNTER_OFFSET's VM-wide offset).
//! The guest runs 1 s of counter time first (so a counter that restarts
//! from the destination's creation shows as going backwards), arms the
//! virtual timer, prints "ready" and keeps the deadline at least 250 ms
//! ahead until the host says "go on" (tests/src/migrate.rs: only the
//! destination does). On the destination both counters go on from where
//! they were (forwards, by less than a minute: no jump by the offset), and
//! the timer fires on PPI 27 at or after its deadline.
//! Interrupts stay masked at the CPU; the GICv2 CPU interface acknowledges.
//! Spec: Arm ARM D12; Linux arch/arm64/kvm/arch_timer.c,
//! Documentation/virt/kvm/api.rst (KVM_ARM_SET_COUNTER_OFFSET).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-counter-migrate", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::{cntfrq, cntvct};
    use guest::gic::v2 as gic;
    use guest::{host_said_go, println, read_sysreg, write_sysreg};

    /// The virtual timer's PPI on the virt board (KVM's default too).
    const VTIMER_PPI: u32 = 27;
    /// CNTV_CTL_EL0.ENABLE.
    const CTL_ENABLE: u64 = 1;
    let cntpct = || -> u64 {
        let v: u64;
        // SAFETY: reading the physical counter at EL1 has no side effects.
        unsafe { core::arch::asm!("isb; mrs {}, cntpct_el0", out(reg) v, options(nomem, nostack)) };
        v
    };
    let frq = cntfrq();
    t.measure("cntfrq", format_args!("{frq:#x}"));
    let ahead = frq / 2;
    let t0 = cntvct();
    while cntvct().wrapping_sub(t0) < frq {
        core::hint::spin_loop();
    }
    gic::enable(VTIMER_PPI);
    let mut cval = cntvct().wrapping_add(ahead);
    write_sysreg!("cntv_cval_el0", cval);
    write_sysreg!("cntv_ctl_el0", CTL_ENABLE);
    let (v0, p0) = (cntvct(), cntpct());
    t.measure("cntvct.before", format_args!("{v0:#x}"));
    println!("ready");
    // Keep it ahead; a stalled source vCPU that sees it fire acknowledges
    // it and arms again, so the timer is armed at the move.
    let (mut rearmed, mut v_last, mut p_last) = (0u32, v0, p0);
    let mut early = None;
    // Each read against the one before it: the move falls between two.
    let limit = 60 * frq;
    let mut jump = None;
    while !host_said_go() {
        let id = gic::ack();
        if id != gic::SPURIOUS {
            let at = cntvct();
            if at.wrapping_sub(cval) > u64::MAX / 2 {
                early = Some((id, at, cval));
            }
            gic::eoi(id);
        }
        let (v, p) = (cntvct(), cntpct());
        if v.wrapping_sub(v_last) >= limit || p.wrapping_sub(p_last) >= limit {
            jump.get_or_insert((v_last, v, p_last, p));
        }
        (v_last, p_last) = (v, p);
        if cval.wrapping_sub(v_last) < ahead / 2 || cval.wrapping_sub(v_last) > u64::MAX / 2 {
            cval = v_last.wrapping_add(ahead);
            write_sysreg!("cntv_cval_el0", cval);
            rearmed += 1;
        }
    }
    let (v1, p1) = (cntvct(), cntpct());
    t.measure("rearmed", format_args!("{rearmed}"));
    t.check(
        "never-before-its-deadline-while-kept-ahead",
        early.is_none(),
        format_args!("(IAR, at, deadline) {early:x?}"),
    );
    t.measure("cntvct.after", format_args!("{v1:#x}"));
    // Forwards, and by less than a minute (the runs' time limits) from one
    // read to the next: not by the offset, not from the destination's
    // creation.
    t.check(
        "counters-go-on",
        jump.is_none() && v1.wrapping_sub(v_last) < limit && p1.wrapping_sub(p_last) < limit,
        format_args!("(cntvct, then, cntpct, then) {jump:#x?}"),
    );
    t.eq("cval-kept", read_sysreg!("cntv_cval_el0"), cval);
    t.eq("ctl-kept", read_sysreg!("cntv_ctl_el0") & 0b11, CTL_ENABLE);
    // It fires on the destination, at or after its deadline.
    let mut got = gic::SPURIOUS;
    let mut at = 0;
    while cntvct().wrapping_sub(v1) < 20 * frq {
        got = gic::ack();
        if got != gic::SPURIOUS {
            at = cntvct();
            break;
        }
    }
    if got != gic::SPURIOUS {
        gic::eoi(got);
    }
    t.eq("fires-on-its-ppi", got, VTIMER_PPI);
    t.check(
        "not-before-its-deadline",
        at.wrapping_sub(cval) < u64::MAX / 2,
        format_args!("acknowledged at {at:#x}, deadline {cval:#x}"),
    );
    write_sysreg!("cntv_ctl_el0", 0);
    gic::disable(VTIMER_PPI);
}
