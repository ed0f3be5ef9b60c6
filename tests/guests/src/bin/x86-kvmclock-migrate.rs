//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off
//!
//! kvmclock and the TSC across savevm/loadvm or migration: writes the TSC
//! (so the vCPU has an offset of its own) and IA32_TSC_ADJUST, enables
//! kvmclock, prints "ready", then until the host says "go on" (on the
//! destination of the move) checks that neither the TSC nor kvmclock ever
//! goes backwards; afterwards that the MSRs kept their values. Not part of
//! the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-kvmclock-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
static mut PVTI: guest::kvmclock::Pvti = guest::kvmclock::Pvti::new();

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::{rdmsr, rdtsc, wrmsr};
    use guest::kvmclock::MSR_SYSTEM_TIME;
    use guest::{host_said_go, println};

    // SAFETY: our static, which the hypervisor updates.
    let read = || unsafe { guest::kvmclock::read(&raw const PVTI) }.0;
    t.eq("tsc", wrmsr(0x10, 5_000_000_000_000), Ok(()));
    t.eq("adjust", wrmsr(0x3b, 7), Ok(()));
    let msr = (&raw const PVTI) as u64 | 1;
    t.eq("kvmclock", wrmsr(MSR_SYSTEM_TIME, msr), Ok(()));
    println!("ready");
    let (mut last_c, mut last_t) = (read(), rdtsc());
    let mut bad = None;
    // (Polling the UART leaves translated code, so the move can happen.)
    while !host_said_go() {
        let (c, tsc) = (read(), rdtsc());
        if c < last_c || tsc < last_t {
            bad = Some((last_c, c, last_t, tsc));
            break;
        }
        (last_c, last_t) = (c, tsc);
    }
    t.check("never-backwards", bad.is_none(), format_args!("{bad:?}"));
    t.eq("kvmclock-msr-kept", rdmsr(MSR_SYSTEM_TIME), Ok(msr));
    t.eq("adjust-kept", rdmsr(0x3b), Ok(7));
}
