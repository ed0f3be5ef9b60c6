//! rustkvm-test: arch=x86_64 smp=2 compare=off vary=flips timeout=120
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//!
//! The PV areas under a memory map that changes: vCPU 0 registers its
//! steal-time structure, its kvmclock and its PV EOI byte in the segment
//! 0xD0000-0xD3FFF, which the i440FX's PAM3 register (PCI config 0x5C,
//! bits 1:0) maps to RAM (3) or to the PCI bus (0); vCPU 1 flips it 2,000
//! times, each flip a new FlatView, while vCPU 0 runs and rustkvm writes
//! the areas at its entries and from its sampler. An area that is not RAM
//! when it is written is not written (KVM's kvm_gfn_to_hva_cache answers
//! so); a write must never reach the PCI bus's MMIO dispatch, which takes
//! the BQL under rustkvm's locks (issue 46: a second translation after a
//! check on the first could). Once the flips end with the segment RAM, the
//! areas are written again: steal time's version is even and advances,
//! and kvmclock's, written at the MSR write, is even, advances and has
//! its scale.
//! Spec: Intel 82441FX datasheet §3.2.18 (PAM), Linux
//! Documentation/virt/kvm/x86/msr.rst (MSR_KVM_STEAL_TIME,
//! MSR_KVM_SYSTEM_TIME_NEW, MSR_KVM_PV_EOI_EN).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pam-flip", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod pam {
    use core::sync::atomic::{AtomicU64, Ordering};
    use guest::arch;

    /// PCI configuration mechanism #1.
    const CONFIG_ADDRESS: u16 = 0xcf8;
    const CONFIG_DATA: u16 = 0xcfc;
    /// PAM3 of the i440FX (bus 0, device 0, function 0), config 0x5C:
    /// bits 1:0 the segment 0xD0000-0xD3FFF.
    const PAM3: u32 = 0x5c;
    /// PAM values: the PCI bus; DRAM read and write.
    pub const PAM_PCI: u8 = 0;
    /// See [`PAM_PCI`].
    pub const PAM_RAM: u8 = 3;

    /// The segment's areas (guest-physical, identity-mapped).
    pub const STEAL: u64 = 0xd_0000;
    /// kvmclock's `pvclock_vcpu_time_info`.
    pub const PVTI: u64 = 0xd_0040;
    /// The PV EOI byte.
    pub const PV_EOI: u64 = 0xd_0080;

    /// Flips vCPU 1 makes.
    pub const FLIPS: u64 = 2_000;
    /// vCPU 1's flips so far; 1 << 63 once it ended with the segment RAM.
    pub static FLIPPED: AtomicU64 = AtomicU64::new(0);
    /// The end flag in [`FLIPPED`].
    pub const ENDED: u64 = 1 << 63;

    fn pam3() -> u8 {
        arch::outl(CONFIG_ADDRESS, 0x8000_0000 | PAM3);
        arch::inb(CONFIG_DATA)
    }

    /// Map the segment to RAM or to the PCI bus (the high half, 0xD4000,
    /// kept).
    pub fn set(to: u8) {
        let v = (pam3() & !3) | to;
        arch::outl(CONFIG_ADDRESS, 0x8000_0000 | PAM3);
        arch::outb(CONFIG_DATA, v);
    }

    /// Whether the segment is RAM now (a byte written reads back).
    pub fn is_ram() -> bool {
        let p = (PV_EOI + 32) as *mut u8;
        // SAFETY: an identity-mapped byte of the segment no area uses;
        // as PCI space it ignores the write and reads 0xff.
        unsafe {
            p.write_volatile(0x5a);
            p.read_volatile() == 0x5a
        }
    }

    /// vCPU 1: flip the segment, then leave it RAM.
    pub fn flipper() {
        for i in 0..FLIPS {
            set(if i % 2 == 0 { PAM_PCI } else { PAM_RAM });
            FLIPPED.store(i + 1, Ordering::Release);
        }
        set(PAM_RAM);
        FLIPPED.store(FLIPS | ENDED, Ordering::Release);
    }

    /// A u32 of the segment.
    pub fn read32(gpa: u64) -> u32 {
        // SAFETY: an aligned, identity-mapped address of the segment.
        unsafe { (gpa as *const u32).read_volatile() }
    }

    /// Zero the segment's first 256 bytes.
    pub fn clear() {
        for o in (0..256).step_by(8) {
            // SAFETY: as read32; the segment is RAM here.
            unsafe { ((STEAL + o) as *mut u64).write_volatile(0) };
        }
    }

    /// VM time at 2 GHz (rustkvm's guest TSC rate).
    pub const TSC_PER_MS: u64 = 2_000_000;

    /// Wait (bounded: 90 s of VM time, within the guest's timeout) until
    /// `cond`. Nested on real KVM in a rustkvm L1 each flip is two port
    /// exits to L1's QEMU: the 2,000 took about 40 s there.
    pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
        let t0 = arch::rdtsc();
        while arch::rdtsc().wrapping_sub(t0) < 90_000 * TSC_PER_MS {
            if cond() {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use guest::arch::{self, MSR_KVM_STEAL_TIME};
    use guest::kvmclock::MSR_SYSTEM_TIME;
    use pam::*;

    /// MSR_KVM_PV_EOI_EN (msr.rst): bit 0 enables, the byte's GPA.
    const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
    // KVM_FEATURE_CLOCKSOURCE2 (3), STEAL_TIME (5), PV_EOI (6).
    let pv = if arch::has_kvm_signature() {
        arch::cpuid(0x4000_0001, 0)[0]
    } else {
        0
    };
    if pv & (1 << 3) == 0 || pv & (1 << 5) == 0 || pv & (1 << 6) == 0 {
        t.skip(
            "x86-pam-flip",
            "needs kvmclock, steal time and PV EOI (KVM signature)",
        );
        return;
    }
    set(PAM_RAM);
    t.check(
        "segment-is-ram",
        is_ram(),
        format_args!("PAM3 gave no RAM at {STEAL:#x}"),
    );
    clear();
    let registered = arch::wrmsr(MSR_KVM_STEAL_TIME, STEAL | 1).is_ok()
        && arch::wrmsr(MSR_SYSTEM_TIME, PVTI | 1).is_ok()
        && arch::wrmsr(MSR_KVM_PV_EOI_EN, PV_EOI | 1).is_ok();
    t.check(
        "areas-registered",
        registered,
        format_args!("an MSR write faulted"),
    );
    let st0 = read32(STEAL + 8);
    arch::start_ap(1, flipper);
    // vCPU 0 runs (its entries write the areas) until the flips end.
    let ended = wait_until(|| FLIPPED.load(Ordering::Acquire) & ENDED != 0);
    t.check(
        "vcpu-1-flipped-and-ended-with-ram",
        ended && is_ram(),
        format_args!("{:#x} flips", FLIPPED.load(Ordering::Acquire)),
    );
    t.measure(
        "flips",
        format_args!("{}", FLIPPED.load(Ordering::Acquire) & !ENDED),
    );
    // Written again once RAM: steal time at the next entries (the sampler
    // or an exit; a PAUSE leaves the CPU loop), kvmclock at the next
    // clock update (an MSR write asks for one, as in KVM).
    let again = wait_until(|| {
        core::hint::spin_loop();
        let v = read32(STEAL + 8);
        v.is_multiple_of(2) && v > st0
    });
    t.check(
        "steal-time-written-again",
        again,
        format_args!("version {} (was {st0})", read32(STEAL + 8)),
    );
    let v0 = read32(PVTI);
    let rewrote = arch::wrmsr(MSR_SYSTEM_TIME, PVTI | 1).is_ok();
    let v = read32(PVTI);
    // tsc_to_system_mul (offset 24): never 0 in a structure KVM filled.
    let mul = read32(PVTI + 24);
    t.check(
        "kvmclock-written-again",
        rewrote && v.is_multiple_of(2) && v > v0 && mul != 0,
        format_args!("version {v0} then {v}, mul {mul:#x}"),
    );
}
