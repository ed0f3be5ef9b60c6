//! rustkvm-test: arch=x86_64 smp=1 cpu=qemu64,vendor=GenuineIntel,pmu=on compare=off matrix=off timeout=90
//!
//! CPU hotplug under rustkvm, driven by the host test
//! `x86_cpu_hotplug_and_unplug_with_steal_time_and_an_armed_counter`
//! (QMP; `-smp 1,maxcpus=3`). The guest does what a kernel's ACPI CPU
//! hotplug driver does, through QEMU's CPU hotplug registers on the PIIX4
//! PM device (QEMU `docs/specs/acpi_cpu_hotplug.rst`; I/O 0xaf00), without
//! ACPI tables:
//! 1. switch them to the modern interface, say `ready` and wait: the host
//!    adds CPU 1 (`device_add`) and, refused by rustkvm, fails to add CPU 2;
//! 2. CPU 1 is present and CPU 2 is not; start CPU 1 with INIT-SIPI-SIPI:
//!    it turns steal time on and arms a cycle counter's PMI (its timer
//!    fires every 20 ms of VM time while the AP is halted), then parks;
//!    say `added` and wait for the remove event (the host's `device_del`);
//! 3. eject CPU 1 (the `_EJ0` a kernel's AML would run): QEMU unrealizes
//!    it, rustkvm frees its vCPU and its PMU timer; 100 ms of VM time later
//!    (five of the old timer's periods) its steal-time area was not
//!    written; say `removed` and wait: the host adds CPU 1 again (the
//!    index rustkvm freed), which starts with steal time off and a PMU in
//!    its reset state.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-hotplug", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod hp {
    use core::ptr::{addr_of, addr_of_mut};
    use guest::arch::{self, KvmStealTime, MSR_KVM_STEAL_TIME};
    use guest::x86_pmu::{EN, EVTSEL0, GLOBAL_CTRL, INT, OS, PMC0, USR};

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
    /// Flags write: clear the insert event; eject.
    const CLEAR_INSERT: u8 = 2;
    const EJECT: u8 = 8;

    /// VM time at 2 GHz (rustkvm's guest TSC rate).
    pub const TSC_PER_MS: u64 = 2_000_000;
    /// The AP's cycle counter wraps after this many unhalted cycles.
    pub const PMI_CYCLES: u64 = 20 * TSC_PER_MS;

    pub static mut STEAL: KvmStealTime = KvmStealTime::new();
    pub static mut STAGE: u64 = 0;
    /// What the re-added AP read: steal MSR, EVTSEL1, PMC1.
    pub static mut FRESH: [u64; 3] = [0; 3];

    pub fn get(p: *const u64) -> u64 {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.read_volatile() }
    }
    fn set(p: *mut u64, v: u64) {
        // SAFETY: aligned static shared between the vCPUs.
        unsafe { p.write_volatile(v) }
    }
    pub fn stage() -> u64 {
        get(addr_of!(STAGE))
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

    /// Eject CPU `n` (the OS's `_EJ0`).
    pub fn eject(n: u32) {
        arch::outl(CPUHP, n);
        arch::outb(CPUHP_FLAGS, EJECT);
    }

    /// PMC1 (IA32_PMC1) and PERFEVTSEL1.
    pub const PMC1: u32 = PMC0 + 1;
    /// See [`PMC1`].
    pub const EVTSEL1: u32 = EVTSEL0 + 1;

    /// The hot-added AP: steal time on, PMC0 counting instructions, PMC1
    /// unhalted cycles with a PMI 20 ms of running away; then park.
    pub fn first() {
        let mut ok = arch::wrmsr(MSR_KVM_STEAL_TIME, addr_of!(STEAL) as u64 | 1).is_ok();
        for (msr, value) in [
            (GLOBAL_CTRL, 0),
            (PMC0, 0),
            (EVTSEL0, EN | OS | USR | 0xc0),
            (PMC1, (1u64 << 48) - PMI_CYCLES),
            (EVTSEL1, EN | OS | USR | INT | 0x3c),
            (GLOBAL_CTRL, 3),
        ] {
            ok &= arch::wrmsr(msr, value).is_ok();
        }
        set(addr_of_mut!(STAGE), if ok { 1 } else { 99 });
    }

    /// The AP added again: what it starts with.
    pub fn again() {
        let rd = |msr| arch::rdmsr(msr).unwrap_or(u64::MAX);
        let fresh = [rd(MSR_KVM_STEAL_TIME), rd(EVTSEL1), rd(PMC1)];
        // SAFETY: only this AP writes it, before STAGE says so.
        unsafe { addr_of_mut!(FRESH).write_volatile(fresh) };
        set(addr_of_mut!(STAGE), 2);
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
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::ptr::{addr_of, addr_of_mut};
    use guest::{arch, println, wait_for_host};
    use hp::*;

    if !arch::has_kvm_signature() || arch::cpuid(0xa, 0)[0] & 0xff == 0 {
        t.skip("x86-hotplug", "needs the KVM signature and a PMU");
        return;
    }
    modern();
    t.eq("only-cpu-0-at-boot", flags(1) & CPU_ENABLED, 0);
    println!("ready");
    let go = wait_for_host(30_000 * TSC_PER_MS, arch::rdtsc);
    t.check(
        "host-added-cpu-1",
        go,
        format_args!("no byte from the host"),
    );
    if !go {
        return;
    }
    let (f1, f2) = (flags(1), flags(2));
    t.eq(
        "cpu-1-present-with-an-insert-event",
        f1 & (CPU_ENABLED | CPU_INSERT),
        CPU_ENABLED | CPU_INSERT,
    );
    t.eq("refused-cpu-2-absent", f2 & CPU_ENABLED, 0);
    ack_insert(1);

    arch::start_ap(1, first);
    let up = wait(1) && stage() == 1;
    t.check(
        "hot-added-ap-runs-with-steal-time-and-an-armed-counter",
        up,
        format_args!("stage {}", stage()),
    );
    if !up {
        return;
    }
    // SAFETY: volatile read of the structure the host writes.
    let version = unsafe { addr_of!(STEAL.version).read_volatile() };
    t.check(
        "its-steal-time-is-written",
        version >= 2 && version % 2 == 0,
        format_args!("version {version}"),
    );
    println!("added");
    let asked = wait_until(|| flags(1) & CPU_REMOVE != 0);
    t.check(
        "remove-event-for-cpu-1",
        asked,
        format_args!("flags {:#x}", flags(1)),
    );
    if !asked {
        return;
    }
    eject(1);
    t.eq("cpu-1-gone-after-eject", flags(1) & CPU_ENABLED, 0);
    // SAFETY: CPU 1 is gone; nothing else may write its old area.
    unsafe {
        addr_of_mut!(STEAL)
            .cast::<[u8; 64]>()
            .write_volatile([0xa5; 64])
    };
    let t0 = arch::rdtsc();
    while arch::rdtsc().wrapping_sub(t0) < 5 * PMI_CYCLES {
        core::hint::spin_loop();
    }
    // SAFETY: volatile read of our static.
    let area = unsafe { addr_of!(STEAL).cast::<[u8; 64]>().read_volatile() };
    t.check(
        "removed-cpus-steal-time-area-not-written",
        area == [0xa5; 64],
        format_args!("first bytes {:02x?}", &area[..16]),
    );
    println!("removed");
    let again = wait_for_host(30_000 * TSC_PER_MS, arch::rdtsc)
        && wait_until(|| flags(1) & CPU_ENABLED != 0);
    t.check(
        "host-added-cpu-1-again",
        again,
        format_args!("flags {:#x}", flags(1)),
    );
    if !again {
        return;
    }
    ack_insert(1);
    arch::start_ap(1, hp::again);
    let up = wait(2);
    // SAFETY: written by the AP before it set STAGE.
    let fresh = unsafe { addr_of!(FRESH).read_volatile() };
    t.check(
        "re-added-ap-starts-from-reset",
        up && fresh == [0, 0, 0],
        format_args!("stage {}, steal MSR, EVTSEL1, PMC1 = {fresh:#x?}", stage()),
    );
}
