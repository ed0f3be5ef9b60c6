//! rustkvm-test: arch=x86_64 smp=2 cpu=max compare=off matrix=off timeout=120
//!
//! KVM_HC_KICK_CPU and KVM_HC_SEND_IPI aimed at a vCPU that CPU hotplug
//! adds and removes, round after round, driven by the host test
//! `x86_kick_and_ipi_at_a_vcpu_being_unplugged` (QMP; `-smp 2,maxcpus=N+2`
//! for N rounds, the host sending `a` before each and `q` after the last).
//! vCPU 1 spins both hypercalls at APIC ID 2 all along, without the BQL in
//! rustkvm's helper, while QMP `device_add`/`device_del` and this vCPU's
//! eject (QEMU's CPU hotplug registers, as `x86-hotplug` drives them) add
//! and free CPU 2 and its rustkvm state: a kick or IPI must find the CPU
//! and use it under the lock unplug holds (issue 46; under the sanitizer
//! build a use-after-free is a report). In each round, while CPU 2 is
//! present this vCPU's own SEND_IPI to it is delivered (returns 1) and once
//! ejected it is not (0), and a KICK_CPU at CPU 2, which waits for its SIPI,
//! leaves it waiting: KVM's kvm_vcpu_block keeps a vCPU in INIT_RECEIVED
//! until a SIPI, whatever pv_unhalted says (the host checks that CPU 2 is
//! halted after the kick).
//! Spec: Documentation/virt/kvm/x86/hypercalls.rst (KVM_HC_KICK_CPU,
//! KVM_HC_SEND_IPI); QEMU docs/specs/acpi_cpu_hotplug.rst.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-hotplug-kick", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod hk {
    use core::arch::asm;
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch;

    /// PIIX4 PM's CPU hotplug registers (modern interface): selector
    /// (DWORD write), flags (byte), command (byte).
    const CPUHP: u16 = 0xaf00;
    const CPUHP_FLAGS: u16 = CPUHP + 4;
    /// Flags read: enabled, insert event, remove event.
    pub const CPU_ENABLED: u8 = 1;
    /// See [`CPU_ENABLED`].
    pub const CPU_INSERT: u8 = 2;
    /// See [`CPU_ENABLED`].
    pub const CPU_REMOVE: u8 = 4;
    /// Flags write: clear the insert event, clear the remove event, eject.
    const CLEAR_INSERT: u8 = 2;
    const CLEAR_REMOVE: u8 = 4;
    const EJECT: u8 = 8;

    /// KVM_HC_KICK_CPU (hypercalls.rst): RBX flags (0), RCX the APIC ID.
    pub const KVM_HC_KICK_CPU: u64 = 5;
    /// KVM_HC_SEND_IPI: RBX/RCX the bitmap, RDX its first APIC ID, RSI the ICR.
    pub const KVM_HC_SEND_IPI: u64 = 10;
    /// The hot-plugged vCPU's APIC ID (socket 2).
    pub const HOT: u64 = 2;
    /// A fixed IPI's ICR low bits: vector 0xfd (masked off at the target,
    /// which waits for its SIPI with interrupts off).
    pub const ICR: u64 = 0xfd;

    /// VM time at 2 GHz (rustkvm's guest TSC rate).
    pub const TSC_PER_MS: u64 = 2_000_000;

    /// Set by vCPU 0 to stop vCPU 1's loop.
    pub static mut STOP: u64 = 0;
    /// vCPU 1's hypercalls so far, and those that returned what KVM's
    /// answer never is (KICK_CPU: 0; SEND_IPI: 0 or 1).
    pub static mut CALLS: u64 = 0;
    /// See [`CALLS`].
    pub static mut ODD: u64 = 0;
    /// 1 once vCPU 1 runs its loop, 2 once it left it.
    pub static mut STAGE: u64 = 0;

    pub fn get(p: *const u64) -> u64 {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.read_volatile() }
    }
    fn set(p: *mut u64, v: u64) {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.write_volatile(v) }
    }
    pub fn stop() {
        set(addr_of_mut!(STOP), 1);
    }

    /// A hypercall from vCPU 1, without the fault catching of
    /// `arch::vmcall` (whose fault record is the BSP's): the caller saw the
    /// KVM signature.
    fn hypercall(nr: u64, a: [u64; 4]) -> u64 {
        let ret: u64;
        // SAFETY: RBX (reserved by LLVM) is swapped in and out around
        // VMCALL; the other argument registers are only read by it.
        unsafe {
            asm!(
                "xchg {b}, rbx",
                "vmcall",
                "xchg {b}, rbx",
                b = inout(reg) a[0] => _,
                inout("rax") nr => ret,
                in("rcx") a[1],
                in("rdx") a[2],
                in("rsi") a[3],
                options(nostack)
            );
        }
        ret
    }

    /// vCPU 1: KICK_CPU and SEND_IPI at APIC ID 2 until told to stop.
    pub fn spinner() {
        set(addr_of_mut!(STAGE), 1);
        let (mut calls, mut odd) = (0u64, 0u64);
        while get(addr_of!(STOP)) == 0 {
            odd += u64::from(hypercall(KVM_HC_KICK_CPU, [0, HOT, 0, 0]) != 0);
            odd += u64::from(hypercall(KVM_HC_SEND_IPI, [1 << HOT, 0, 0, ICR]) > 1);
            calls += 2;
        }
        set(addr_of_mut!(CALLS), calls);
        set(addr_of_mut!(ODD), odd);
        set(addr_of_mut!(STAGE), 2);
    }

    /// The firmware-less switch to the modern interface: store 0 at the
    /// start of the legacy CPU bitmap.
    pub fn modern() {
        arch::outl(CPUHP, 0);
    }

    /// CPU `n`'s flags.
    pub fn flags(n: u32) -> u8 {
        arch::outl(CPUHP, n);
        arch::inb(CPUHP_FLAGS)
    }

    /// Acknowledge CPU `n`'s insert event, as the OS does after its check.
    pub fn ack_insert(n: u32) {
        arch::outl(CPUHP, n);
        arch::outb(CPUHP_FLAGS, CLEAR_INSERT);
    }

    /// Acknowledge CPU `n`'s remove event and eject it, as the OS's
    /// CPU scan and `_EJ0` do (QEMU keeps the event set through an eject:
    /// an OS that left it would eject the next CPU added there at once).
    pub fn eject(n: u32) {
        arch::outl(CPUHP, n);
        arch::outb(CPUHP_FLAGS, CLEAR_REMOVE);
        arch::outb(CPUHP_FLAGS, EJECT);
    }

    /// Wait (bounded: 30 s of VM time) until `cond`.
    pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
        let t0 = arch::rdtsc();
        while arch::rdtsc().wrapping_sub(t0) < 30_000 * TSC_PER_MS {
            if cond() {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// Spin for `ms` of VM time.
    pub fn pause_ms(ms: u64) {
        let t0 = arch::rdtsc();
        while arch::rdtsc().wrapping_sub(t0) < ms * TSC_PER_MS {
            core::hint::spin_loop();
        }
    }
}

/// At most this many rounds of add, kick, remove: the host sends `a` for
/// each and `q` after the last (the host test: 8; a soak, up to the
/// machine's slots).
#[cfg(target_arch = "x86_64")]
const MAX_ROUNDS: u32 = 1000;

/// The host's next byte (bounded: 30 s of VM time).
#[cfg(target_arch = "x86_64")]
fn host_byte() -> Option<u8> {
    let t0 = guest::arch::rdtsc();
    while guest::arch::rdtsc().wrapping_sub(t0) < 30_000 * hk::TSC_PER_MS {
        if let Some(b) = guest::arch::getc() {
            return Some(b);
        }
        core::hint::spin_loop();
    }
    None
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::addr_of;
    use guest::{arch, println};
    use hk::*;

    // KVM_FEATURE_PV_UNHALT (bit 7), KVM_FEATURE_PV_SEND_IPI (bit 11).
    let pv = if arch::has_kvm_signature() {
        arch::cpuid(0x4000_0001, 0)[0]
    } else {
        0
    };
    if pv & (1 << 7) == 0 || pv & (1 << 11) == 0 {
        t.skip(
            "x86-hotplug-kick",
            "needs KVM_FEATURE_PV_UNHALT and PV_SEND_IPI",
        );
        return;
    }
    modern();
    t.eq("cpu-2-absent-at-boot", flags(HOT as u32) & CPU_ENABLED, 0);
    arch::start_ap(1, spinner);
    t.check(
        "vcpu-1-spins-kick-and-ipi-at-apic-2",
        wait_until(|| get(addr_of!(STAGE)) >= 1),
        format_args!("stage {}", get(addr_of!(STAGE))),
    );
    println!("ready");
    // The first round that went wrong, and how.
    let mut bad: Option<(u32, &str, u64)> = None;
    let mut note = |round: u32, what: &'static str, v: u64| {
        if bad.is_none() {
            bad = Some((round, what, v));
        }
    };
    let mut rounds = 0;
    let mut quit = false;
    for round in 0..MAX_ROUNDS {
        match host_byte() {
            Some(b'q') => {
                quit = true;
                break;
            }
            Some(_) => {}
            None => {
                note(round, "no byte from the host", 0);
                break;
            }
        }
        let added = wait_until(|| flags(HOT as u32) & CPU_ENABLED != 0);
        if !added {
            note(
                round,
                "cpu 2 never added, flags",
                u64::from(flags(HOT as u32)),
            );
            break;
        }
        let f = flags(HOT as u32);
        if f & CPU_INSERT == 0 {
            note(round, "no insert event, flags", u64::from(f));
        }
        ack_insert(HOT as u32);
        match arch::vmcall(KVM_HC_SEND_IPI, [1 << HOT, 0, 0, ICR]) {
            Ok(1) => {}
            Ok(n) => note(round, "SEND_IPI to present cpu 2 returned", n),
            Err(_) => note(round, "SEND_IPI faulted", 0),
        }
        match arch::vmcall(KVM_HC_KICK_CPU, [0, HOT, 0, 0]) {
            Ok(0) => {}
            Ok(n) => note(round, "KICK_CPU returned", n),
            Err(_) => note(round, "KICK_CPU faulted", 0),
        }
        // Time for the kick's work to run on CPU 2's thread; the host then
        // looks at it.
        pause_ms(10);
        println!("added");
        let asked = wait_until(|| flags(HOT as u32) & CPU_REMOVE != 0);
        if !asked {
            note(
                round,
                "no remove event, flags",
                u64::from(flags(HOT as u32)),
            );
            break;
        }
        eject(HOT as u32);
        let f = flags(HOT as u32);
        if f & CPU_ENABLED != 0 {
            note(
                round,
                "cpu 2 still enabled after eject, flags",
                u64::from(f),
            );
        }
        match arch::vmcall(KVM_HC_SEND_IPI, [1 << HOT, 0, 0, ICR]) {
            Ok(0) => {}
            Ok(n) => note(round, "SEND_IPI to ejected cpu 2 returned", n),
            Err(_) => note(round, "SEND_IPI faulted", 0),
        }
        println!("removed");
        rounds += 1;
    }
    stop();
    let stopped = wait_until(|| get(addr_of!(STAGE)) == 2);
    t.check(
        "every-round-as-kvm-answers",
        bad.is_none() && quit && rounds > 0,
        format_args!("{rounds} rounds, the host's end seen: {quit}; first wrong: {bad:?}"),
    );
    t.check(
        "vcpu-1-stopped",
        stopped,
        format_args!("stage {}", get(addr_of!(STAGE))),
    );
    t.eq("vcpu-1-answers-as-kvm", get(addr_of!(ODD)), 0);
    t.measure("rounds", format_args!("{rounds}"));
    t.measure(
        "vcpu-1-hypercalls",
        format_args!("{}", get(addr_of!(CALLS))),
    );
}
