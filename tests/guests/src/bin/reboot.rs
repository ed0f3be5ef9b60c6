//! rustkvm-test: arch=x86_64,aarch64 compare=off matrix=off timeout=60
//!
//! A guest reboot forgets what the guest registered, as under KVM (QEMU
//! writes its reset MSRs into KVM: `kvm_put_msrs` at KVM_PUT_RESET_STATE;
//! arm64 `kvm_reset_vcpu`). Booted by the host test
//! `a_reboot_forgets_what_the_guest_registered` without `-no-reboot` (x86:
//! `-cpu qemu64,vendor=GenuineIntel,pmu=on`; arm64: `thread=single`). RAM
//! survives QEMU's reset, so the guest knows its second boot by a marker
//! it left at a fixed address.
//!
//! First boot: x86 turns on steal time, kvmclock and the wall clock at
//! fixed addresses; arm64 asks for its PV time structure (PV_TIME_ST) and
//! sees it updated while a secondary vCPU competes for the one host thread
//! (`thread=single`: steal accrues). Both arm a cycle counter's overflow
//! interrupt (x86: PMC1 from 0, 2^48 cycles ahead; arm64: the 64-bit cycle
//! counter 60 s ahead), so QEMU's PMU timer is armed (the host checks with
//! x-query-rustkvm), say `armed`, wait for the host, and reset the machine
//! (x86: port 0xcf9; arm64: PSCI SYSTEM_RESET).
//!
//! Second boot: the MSRs read 0 (including the VM's wall clock MSR: QEMU
//! writes 0 into KVM's; kvmclock's is SeaBIOS's own again, which the reset
//! ran again) and the PMU is in its reset state; the old areas,
//! marked, are not written while the guest keeps entering guest code
//! (x86: halts on its LAPIC timer; kvmclock would also be rewritten by a
//! TSC_ADJUST write; arm64: the secondary competes again). Say `rebooted`
//! (the host checks that the PMU timer is disarmed) and finish; arm64 then
//! asks for PV time again, which updates the structure again.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

/// "RBOOTMRK": the first boot left its marker.
const MAGIC: u64 = 0x4b52_4d54_4f4f_4252;

/// The marker: `[magic, boots so far, what the first boot registered]`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn marker() -> *mut [u64; 4] {
    #[cfg(target_arch = "x86_64")]
    const MARK: u64 = 0x0200_0000;
    #[cfg(target_arch = "aarch64")]
    const MARK: u64 = 0x4200_0000;
    MARK as *mut [u64; 4]
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn read_marker() -> [u64; 4] {
    // SAFETY: a fixed, aligned RAM address no one else uses.
    unsafe { marker().read_volatile() }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn write_marker(m: [u64; 4]) {
    // SAFETY: as read_marker.
    unsafe { marker().write_volatile(m) }
}

/// Fill the 64 bytes at `gpa` with `byte`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn fill(gpa: u64, byte: u8) {
    // SAFETY: 64-byte-aligned RAM the test owns.
    unsafe { (gpa as *mut [u64; 8]).write_volatile([u64::from_ne_bytes([byte; 8]); 8]) }
}

/// Whether the 64 bytes at `gpa` are all `byte`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn filled(gpa: u64, byte: u8) -> bool {
    // SAFETY: as fill.
    unsafe { (gpa as *const [u64; 8]).read_volatile() == [u64::from_ne_bytes([byte; 8]); 8] }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn main(t: &mut Test) {
    t.skip("reboot", "x86_64 and aarch64 only");
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn main(t: &mut Test) {
    let m = read_marker();
    match (m[0], m[1]) {
        (MAGIC, 1) => {
            write_marker([MAGIC, 2, m[2], m[3]]);
            guest::println!("# second boot");
            second_boot(t, m[2]);
        }
        (MAGIC, n) => t.check(
            "booted-at-most-twice",
            false,
            format_args!("boot {}", n + 1),
        ),
        _ => {
            guest::println!("# first boot");
            if let Some(registered) = first_boot(t) {
                write_marker([MAGIC, 1, registered, 0]);
                guest::println!("armed");
                let go = wait_for_host();
                t.check(
                    "released-by-host",
                    go,
                    format_args!("no byte from the host"),
                );
                reset();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
use x86::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use guest::arch::{self, rdmsr, wrmsr, MSR_KVM_STEAL_TIME};
    use guest::x86_pmu::{EN, EVTSEL0, GLOBAL_CTRL, INT, OS, PMC0, USR};
    use guest::Test;

    const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
    const MSR_KVM_WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
    const MSR_IA32_TSC_ADJUST: u32 = 0x3b;
    const PMC1: u32 = PMC0 + 1;
    const EVTSEL1: u32 = EVTSEL0 + 1;
    /// The areas the first boot registers (RAM, 64-byte aligned).
    const STEAL: u64 = 0x0200_1000;
    const PVCLOCK: u64 = 0x0200_2000;
    const WALL: u64 = 0x0200_3000;
    /// The LAPIC timer's vector, in the runtime's counted range.
    const TIMER_VECTOR: u8 = 0x40;

    /// The u32 version of the structure at `gpa`: at offset 8 in
    /// `struct kvm_steal_time`, 0 in the pvclock structures.
    fn version(gpa: u64) -> u32 {
        let at = if gpa == STEAL { gpa + 8 } else { gpa };
        // SAFETY: aligned RAM.
        unsafe { (at as *const u32).read_volatile() }
    }

    pub fn wait_for_host() -> bool {
        guest::wait_for_host(60_000_000_000, arch::rdtsc)
    }

    pub fn first_boot(t: &mut Test) -> Option<u64> {
        if !arch::has_kvm_signature() || arch::cpuid(0xa, 0)[0] & 0xff == 0 {
            t.skip("reboot", "needs the KVM signature and a PMU");
            return None;
        }
        for gpa in [STEAL, PVCLOCK, WALL] {
            super::fill(gpa, 0);
        }
        let mut ok = true;
        for (msr, value) in [
            (MSR_KVM_STEAL_TIME, STEAL | 1),
            (MSR_KVM_SYSTEM_TIME_NEW, PVCLOCK | 1),
            (MSR_KVM_WALL_CLOCK_NEW, WALL),
            (GLOBAL_CTRL, 0),
            (PMC1, 0),
            (EVTSEL1, EN | OS | USR | INT | 0x3c),
            (GLOBAL_CTRL, 2),
        ] {
            ok &= wrmsr(msr, value).is_ok();
        }
        t.check("registered", ok, format_args!("a WRMSR faulted"));
        // Under MTTCG steal time is written at entries into guest code, at
        // most once a millisecond: enter a few times.
        halt_on_timer(5);
        let v = [version(STEAL), version(PVCLOCK), version(WALL)];
        t.check(
            "steal-time-kvmclock-wall-clock-written",
            v.iter().all(|&v| v >= 2 && v % 2 == 0),
            format_args!("versions {v:?}"),
        );
        Some(0)
    }

    pub fn reset() {
        // PIIX3 reset control register: system reset, reset the CPU.
        arch::outb(0xcf9, 0x06);
        loop {
            // SAFETY: waiting for the reset.
            unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) }
        }
    }

    /// Halt `n` times, woken by a periodic LAPIC timer (an exit from and an
    /// entry into guest code each time).
    fn halt_on_timer(n: u64) {
        // The 8259s as SeaBIOS left them would deliver the PIT's ticks at
        // vector 8: masked.
        arch::outb(0x21, 0xff);
        arch::outb(0xa1, 0xff);
        let start = arch::irqs(TIMER_VECTOR);
        arch::set_lapic_reg(0xf0, 0x1ff); // SVR: enabled
        arch::set_lapic_reg(0x3e0, 0xb); // divide by 1
        arch::set_lapic_reg(0x320, (1 << 17) | u32::from(TIMER_VECTOR)); // periodic
        arch::set_lapic_reg(0x380, 1_000_000); // 1 ms
        while arch::irqs(TIMER_VECTOR) - start < n {
            // SAFETY: an interrupt comes within a millisecond; then masked again.
            unsafe { core::arch::asm!("sti; hlt; cli", options(nomem, nostack)) }
        }
        arch::set_lapic_reg(0x320, 1 << 16); // masked
        arch::set_lapic_reg(0x380, 0);
    }

    pub fn second_boot(t: &mut Test, _registered: u64) {
        let rd = |msr| rdmsr(msr).unwrap_or(u64::MAX);
        t.eq("steal-time-msr-reset", rd(MSR_KVM_STEAL_TIME), 0);
        // SeaBIOS, run again by the reset, turns on a kvmclock of its own
        // (and leaves it on): only the first boot's must be gone.
        let kvmclock = rd(MSR_KVM_SYSTEM_TIME_NEW);
        t.check(
            "kvmclock-msr-reset",
            kvmclock & !0x3f != PVCLOCK,
            format_args!("{kvmclock:#x}"),
        );
        t.eq("wall-clock-msr-reset", rd(MSR_KVM_WALL_CLOCK_NEW), 0);
        for (gpa, byte) in [(STEAL, 0xa5), (PVCLOCK, 0x5a), (WALL, 0x3c)] {
            super::fill(gpa, byte);
        }
        halt_on_timer(20);
        let adjust = rd(MSR_IA32_TSC_ADJUST);
        let _ = wrmsr(MSR_IA32_TSC_ADJUST, adjust.wrapping_add(1000));
        guest::println!("rebooted");
        let go = wait_for_host();
        t.check(
            "released-by-host",
            go,
            format_args!("no byte from the host"),
        );
        halt_on_timer(20);
        t.check(
            "old-steal-time-area-not-written",
            super::filled(STEAL, 0xa5),
            format_args!("version {}", version(STEAL)),
        );
        t.check(
            "old-kvmclock-area-not-written",
            super::filled(PVCLOCK, 0x5a),
            format_args!("version {}", version(PVCLOCK)),
        );
        t.check(
            "old-wall-clock-area-not-written",
            super::filled(WALL, 0x3c),
            format_args!("version {}", version(WALL)),
        );
        // Last: a PMU access brings QEMU's PMU timer in line on its own.
        t.eq("pmu-reset", [rd(EVTSEL1), rd(PMC1)], [0, 0]);
    }
}

#[cfg(target_arch = "aarch64")]
use arm::*;

#[cfg(target_arch = "aarch64")]
mod arm {
    use core::sync::atomic::{AtomicBool, Ordering};
    use guest::arch::{self, hvc};
    use guest::{read_sysreg, write_sysreg, Test};

    const PV_TIME_ST: u32 = 0xc500_0021;
    /// PSCI AFFINITY_INFO (64-bit): 1 when the CPU is off.
    const PSCI_AFFINITY_INFO: u32 = 0xc400_0004;
    const PSCI_SYSTEM_RESET: u32 = 0x8400_0009;
    const NOT_SUPPORTED: u64 = u64::MAX;
    /// `stolen_time` in the structure.
    const STOLEN_TIME: u64 = 8;
    /// PMCR_EL0.E and .LC (64-bit cycle counter); the cycle counter's bit.
    const E: u64 = 1;
    const LC: u64 = 1 << 6;
    const CYCLES: u64 = 1 << 31;
    /// 60 s of cycles at 2 GHz.
    const PMI_CYCLES: u64 = 120_000_000_000;

    /// Set by the primary when the secondary may stop competing.
    static STOP: AtomicBool = AtomicBool::new(false);

    fn compete() {
        while !STOP.load(Ordering::Relaxed) {
            core::hint::spin_loop();
        }
    }

    fn stolen(base: u64) -> u64 {
        // SAFETY: the 64-byte-aligned structure the machine gave.
        unsafe { ((base + STOLEN_TIME) as *const u64).read_volatile() }
    }

    /// Spin for `ms` of the generic counter with the secondary competing
    /// for the one host thread: whether `stolen_time` at `base` changed,
    /// or None if the secondary did not run (CPU_ON failed) or never went
    /// off again.
    fn run_with_the_secondary(base: u64, ms: u64) -> Option<bool> {
        STOP.store(false, Ordering::Relaxed);
        if arch::cpu_on(1, compete) != 0 {
            return None;
        }
        let before = stolen(base);
        let (t0, ticks) = (arch::cntvct(), arch::cntfrq() * ms / 1000);
        while arch::cntvct().wrapping_sub(t0) < ticks {
            core::hint::spin_loop();
        }
        let changed = stolen(base) != before;
        STOP.store(true, Ordering::Relaxed);
        // It goes off (CPU_OFF) before the next CPU_ON.
        let t1 = arch::cntvct();
        while hvc(PSCI_AFFINITY_INFO, [1, 0, 0])[0] != 1 {
            if arch::cntvct().wrapping_sub(t1) > 10 * arch::cntfrq() {
                return None;
            }
            core::hint::spin_loop();
        }
        Some(changed)
    }

    pub fn wait_for_host() -> bool {
        guest::wait_for_host(60 * arch::cntfrq(), arch::cntvct)
    }

    pub fn first_boot(t: &mut Test) -> Option<u64> {
        let base = hvc(PV_TIME_ST, [0; 3])[0];
        if base == NOT_SUPPORTED {
            t.skip("reboot", "no PV time (PV_TIME_ST: NOT_SUPPORTED)");
            return None;
        }
        let updated = run_with_the_secondary(base, 200);
        t.check(
            "pv-time-updated-before-the-reboot",
            updated == Some(true),
            format_args!("{updated:?}, stolen_time {}", stolen(base)),
        );
        arch::pmu_clear();
        write_sysreg!("pmcr_el0", E | LC);
        write_sysreg!("pmccfiltr_el0", 0);
        write_sysreg!("pmccntr_el0", 0u64.wrapping_sub(PMI_CYCLES));
        write_sysreg!("pmintenset_el1", CYCLES);
        write_sysreg!("pmcntenset_el0", CYCLES);
        Some(base)
    }

    pub fn reset() {
        hvc(PSCI_SYSTEM_RESET, [0; 3]);
        loop {
            // SAFETY: waiting for the reset.
            unsafe { core::arch::asm!("wfi", options(nomem, nostack)) }
        }
    }

    pub fn second_boot(t: &mut Test, base: u64) {
        super::fill(base, 0xa5);
        let written = run_with_the_secondary(base, 200);
        guest::println!("rebooted");
        let go = wait_for_host();
        t.check(
            "released-by-host",
            go,
            format_args!("no byte from the host"),
        );
        t.check(
            "old-pv-time-structure-not-written",
            written == Some(false) && super::filled(base, 0xa5),
            format_args!("{written:?}, stolen_time {:#x}", stolen(base)),
        );
        let again = hvc(PV_TIME_ST, [0; 3])[0];
        t.eq("pv-time-st-again-same-structure", again, base);
        let updated = run_with_the_secondary(base, 200);
        t.check(
            "pv-time-updated-again-after-pv-time-st",
            updated == Some(true),
            format_args!("{updated:?}, stolen_time {}", stolen(base)),
        );
        // Last: a PMU access brings QEMU's PMU timer in line on its own.
        // KVM resets PMCR_EL0.E to 0 and the enables and counters to
        // UNKNOWN values (its 0x1de7ec7edbadc0de pattern, masked).
        let (pmcr, cycles) = (read_sysreg!("pmcr_el0"), read_sysreg!("pmccntr_el0"));
        t.check(
            "pmu-reset",
            pmcr & E == 0 && cycles != 0u64.wrapping_sub(PMI_CYCLES),
            format_args!("PMCR_EL0 {pmcr:#x}, PMCCNTR_EL0 {cycles:#x}"),
        );
    }
}
