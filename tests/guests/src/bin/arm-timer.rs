//! rustkvm-test: arch=aarch64 smp=2 vary=cntvct.start,vtimer.late-ticks,ptimer.late-ticks,cross-vcpu.rounds
//!
//! The generic timer as a KVM guest sees it: the virtual and physical
//! counters agree (no CNTVOFF at EL1; on real KVM: a fixed offset) and
//! never go backwards from one vCPU to
//! the other; the virtual timer interrupts on PPI 27 and the physical timer
//! on PPI 30 (the virt board's wiring, as KVM's defaults), each after its
//! deadline and never before. Interrupts stay masked at the CPU (PSTATE.I):
//! the test acknowledges them at the GICv2 CPU interface. The host test
//! boots it again with `-accel rustkvm,counter-offset=N` and reads
//! `cntvct.start` (the counter at entry: near 0 without an offset).
//! Spec: Arm ARM D12 (generic timer); Linux arch/arm64/kvm/arch_timer.c,
//! Documentation/virt/kvm/api.rst (KVM_ARM_SET_COUNTER_OFFSET).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-timer", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
use guest::gic::any as gic;

#[cfg(target_arch = "aarch64")]
mod timer {
    use guest::{read_sysreg, write_sysreg};

    /// The virtual timer's PPI on the virt board (KVM's default too).
    pub const VTIMER_PPI: u32 = 27;
    /// The EL1 physical timer's PPI.
    pub const PTIMER_PPI: u32 = 30;
    /// CNT*_CTL_EL0.ENABLE.
    const CTL_ENABLE: u64 = 1;
    /// CNT*_CTL_EL0.ISTATUS.
    pub const CTL_ISTATUS: u64 = 1 << 2;

    /// The counter, read on both vCPUs.
    pub static CROSS: guest::cross::CrossCheck = guest::cross::CrossCheck::new();

    pub use guest::arch::cntpct;

    /// Which timer.
    #[derive(Clone, Copy)]
    pub enum Which {
        /// CNTV_*.
        Virtual,
        /// CNTP_*.
        Physical,
    }

    impl Which {
        /// Its counter.
        pub fn now(self) -> u64 {
            match self {
                Which::Virtual => guest::arch::cntvct(),
                Which::Physical => cntpct(),
            }
        }
        /// Arm it at `cval` (enabled, unmasked) or disarm it.
        pub fn arm(self, cval: Option<u64>) {
            match (self, cval) {
                (Which::Virtual, Some(c)) => {
                    write_sysreg!("cntv_cval_el0", c);
                    write_sysreg!("cntv_ctl_el0", CTL_ENABLE);
                }
                (Which::Physical, Some(c)) => {
                    write_sysreg!("cntp_cval_el0", c);
                    write_sysreg!("cntp_ctl_el0", CTL_ENABLE);
                }
                (Which::Virtual, None) => write_sysreg!("cntv_ctl_el0", 0),
                (Which::Physical, None) => write_sysreg!("cntp_ctl_el0", 0),
            }
        }
        /// CNT*_CTL_EL0.
        pub fn ctl(self) -> u64 {
            match self {
                Which::Virtual => read_sysreg!("cntv_ctl_el0"),
                Which::Physical => read_sysreg!("cntp_ctl_el0"),
            }
        }
    }

    /// vCPU 1: follow vCPU 0's counter readings with its own.
    pub fn secondary() {
        CROSS.follow(guest::arch::cntvct);
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch;
    use timer::*;

    let start = arch::cntvct();
    let frq = arch::cntfrq();
    t.measure("cntvct.start", format_args!("{start:#x}"));
    t.measure("cntfrq", format_args!("{frq}"));
    // No CNTVOFF: the physical counter, read between two reads of the
    // virtual one, lies between them. Real KVM gives a VM's virtual
    // counter an offset (its creation time: `kvm_timer_init_vm`,
    // arch/arm64/kvm/arch_timer.c) and leaves the physical counter the
    // host's: there the two advance together, their difference fixed (the
    // bounds of two readings 10 ms apart overlap).
    let (v, p, v2) = (arch::cntvct(), cntpct(), arch::cntvct());
    if guest::backend() != Some(guest::Backend::Kvm) {
        t.check(
            "physical-and-virtual-counters-agree",
            v <= p && p <= v2,
            format_args!("cntvct {v:#x}, cntpct {p:#x}, cntvct {v2:#x}"),
        );
    } else {
        let until = v2 + frq / 100;
        while arch::cntvct() < until {
            core::hint::spin_loop();
        }
        let (w, q, w2) = (arch::cntvct(), cntpct(), arch::cntvct());
        // offset = cntpct - cntvct at one instant: within [p - v2, p - v].
        let (lo, hi) = (p.wrapping_sub(v2), p.wrapping_sub(v));
        let (lo2, hi2) = (q.wrapping_sub(w2), q.wrapping_sub(w));
        t.check(
            "physical-and-virtual-counters-agree",
            lo <= hi2 && lo2 <= hi,
            format_args!("offset in [{lo:#x}, {hi:#x}], 10 ms later [{lo2:#x}, {hi2:#x}]"),
        );
    }

    // Counter monotonic across vCPUs.
    if arch::cpu_on(1, secondary) == 0 {
        let t0 = arch::cntvct();
        let (rounds, backwards) = CROSS.lead(arch::cntvct, || {
            arch::cntvct().wrapping_sub(t0) < frq * 3 / 10
        });
        t.check(
            "cross-vcpu-rounds",
            rounds >= 1,
            format_args!("{rounds} rounds"),
        );
        t.measure("cross-vcpu.rounds", format_args!("{rounds}"));
        t.eq("counter-never-backwards-across-vcpus", backwards, false);
    }

    // Each timer: armed 5 ms ahead, nothing pending before the deadline,
    // its PPI pending after it, ISTATUS set.
    for (which, ppi, name) in [
        (Which::Virtual, VTIMER_PPI, "vtimer"),
        (Which::Physical, PTIMER_PPI, "ptimer"),
    ] {
        gic::enable(ppi);
        let cval = which.now().wrapping_add(frq / 200);
        which.arm(Some(cval));
        let early = gic::ack();
        let early_now = which.now();
        if early != gic::SPURIOUS {
            gic::eoi(early);
        }
        t.check(
            &concat_name(name, "-nothing-before-deadline"),
            early == gic::SPURIOUS || early_now.wrapping_sub(cval) < u64::MAX / 2,
            format_args!("IAR {early} at {early_now:#x}, deadline {cval:#x}"),
        );
        let mut got = gic::SPURIOUS;
        let mut at = 0;
        for _ in 0..50_000_000u64 {
            got = gic::ack();
            if got != gic::SPURIOUS {
                at = which.now();
                break;
            }
        }
        if got != gic::SPURIOUS {
            gic::eoi(got);
        }
        t.eq(&concat_name(name, "-fires-on-its-ppi"), got, ppi);
        let late = at.wrapping_sub(cval);
        t.check(
            &concat_name(name, "-not-before-deadline"),
            late < u64::MAX / 2,
            format_args!("acknowledged at {at:#x}, deadline {cval:#x}"),
        );
        t.check(
            &concat_name(name, "-istatus"),
            which.ctl() & CTL_ISTATUS != 0,
            format_args!("ctl {:#x}", which.ctl()),
        );
        t.measure(&concat_name(name, ".late-ticks"), format_args!("{late}"));
        which.arm(None);
        gic::disable(ppi);
    }
}

/// `a` followed by `b` in a small stack buffer (no allocator here).
#[cfg(target_arch = "aarch64")]
fn concat_name(a: &str, b: &str) -> Name {
    let mut n = Name([0; 48], 0);
    for &c in a.as_bytes().iter().chain(b.as_bytes()) {
        if n.1 < n.0.len() {
            n.0[n.1] = c;
            n.1 += 1;
        }
    }
    n
}

/// A short name built at run time.
#[cfg(target_arch = "aarch64")]
struct Name([u8; 48], usize);

#[cfg(target_arch = "aarch64")]
impl core::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        core::str::from_utf8(&self.0[..self.1]).unwrap_or("?")
    }
}
