//! rustkvm-test: arch=x86_64 smp=8 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off needs=pmu timeout=120
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU)
//!
//! Eight vCPUs, each with its own PMU (KVM's PMU is per vCPU): every vCPU
//! counts its own instructions on PMC0 and FIXED_CTR0, reads PMC0 with
//! RDPMC 200 000 times checking it never goes backwards, then counts a
//! known loop exactly. With MTTCG the eight vCPU threads share the host's
//! cores (2 here), so they are preempted while counting; round-robin runs
//! them in turns on one thread. SKIPs without a PMU.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-smp", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod smp {
    use guest::arch::{self, wrmsr};
    use guest::x86_pmu::counted_loop;

    /// Per vCPU (by APIC ID): RDPMC reads that went backwards, the exact
    /// loop's count, and 1 when done.
    pub static mut BACKWARDS: [u64; 8] = [0; 8];
    pub static mut LOOP: [u64; 8] = [0; 8];
    pub static mut DONE: [u64; 8] = [0; 8];
    /// Loop iterations and the count they give (see `work`).
    pub const N: u64 = 50_000;
    pub const WANT: u64 = 2 * N + 5;

    fn apic_id() -> usize {
        (arch::cpuid(1, 0)[1] >> 24) as usize & 7
    }

    /// What every vCPU does.
    pub fn work() {
        let me = apic_id();
        let w = |i, v| wrmsr(i, v).expect("PMU MSR");
        w(0x38f, 0);
        w(0x186, 1 << 22 | 1 << 17 | 1 << 16 | 0xc0); // PMC0: instructions
        w(0x38d, 0x3); // FIXED_CTR0
        w(0xc1, 0);
        w(0x309, 0);
        w(0x38f, 1 | 1 << 32);
        let mut last = 0;
        let mut backwards = 0;
        for _ in 0..200_000 {
            let v = arch::rdpmc(0).unwrap_or(0);
            if v < last {
                backwards += 1;
            }
            last = v;
        }
        w(0x38f, 0);
        w(0xc1, 0);
        // GLOBAL_CTRL: PMC0 and FIXED_CTR0; 2N + 5 on PMC0.
        counted_loop((0x38f, 1 | 1 << 32), 0x38f, N);
        let count = arch::rdmsr(0xc1).unwrap_or(0);
        // SAFETY: each vCPU writes only its own slots.
        unsafe {
            (&raw mut BACKWARDS[me]).write_volatile(backwards);
            (&raw mut LOOP[me]).write_volatile(count);
            (&raw mut DONE[me]).write_volatile(1);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;
    use smp::*;

    if arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-pmu-smp", "CPUID 0xA: no architectural PMU");
        return;
    }
    for id in 1..8u8 {
        arch::start_ap(id, work);
    }
    work();
    let done = |i: usize| {
        // SAFETY: reading slots the vCPUs write.
        unsafe { (&raw const DONE[i]).read_volatile() }
    };
    let mut all = false;
    for _ in 0..4_000_000_000u64 {
        if (0..8).all(|i| done(i) == 1) {
            all = true;
            break;
        }
        core::hint::spin_loop();
    }
    t.check("all-eight-finished", all, format_args!(""));
    for i in 0..8 {
        // SAFETY: as above.
        let (back, count) = unsafe {
            (
                (&raw const BACKWARDS[i]).read_volatile(),
                (&raw const LOOP[i]).read_volatile(),
            )
        };
        t.eq("never-backwards", (i, back), (i, 0));
        t.eq("exact-loop", (i, count), (i, WANT));
    }
}
