//! KVM's x86 time: one guest TSC per VM, IA32_TSC and IA32_TSC_ADJUST,
//! kvmclock and the local APIC's TSC-deadline mode.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/msr.rst` (MSR_KVM_WALL_CLOCK*,
//! MSR_KVM_SYSTEM_TIME*), `arch/x86/include/asm/pvclock-abi.h`,
//! `arch/x86/kvm/x86.c` (`kvm_set_msr_common`: MSR_IA32_TSC,
//! MSR_IA32_TSC_ADJUST; `kvm_write_wall_clock`, `kvm_write_system_time`,
//! `kvm_get_time_scale`, `kvm_setup_guest_pvclock`), `arch/x86/kvm/lapic.c`
//! (`kvm_set_lapic_tscdeadline_msr`, `apic_update_lvtt`); Intel SDM vol. 3
//! §11.5.4.1 (TSC-deadline mode), §18.17 (TSC, IA32_TSC_ADJUST).
//!
//! The guest TSC counts QEMU's virtual clock (nanoseconds since the VM
//! started; it stops while the VM is stopped and travels with it in
//! savevm/migration) at one frequency for the whole VM: `ticks(ns) =
//! ns * khz / 10^6`, exact integer arithmetic, so it never drifts from the
//! clock the timers use. Each vCPU adds its own offset, 0 until the guest
//! writes IA32_TSC or IA32_TSC_ADJUST: the TSCs stay synchronised unless the
//! guest desynchronises them, as under KVM.

use crate::memory::{Gpa, GuestMemory, GuestRam};

/// x86's page size: KVM maps a PV structure within one page.
pub const PAGE_SIZE: u64 = 4096;

/// IA32_TIME_STAMP_COUNTER.
pub const MSR_IA32_TSC: u32 = 0x10;
/// IA32_TSC_ADJUST (`CPUID.7.0:EBX[1]`).
pub const MSR_IA32_TSC_ADJUST: u32 = 0x3b;
/// IA32_TSC_DEADLINE (`CPUID.1:ECX[24]`).
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// MSR_KVM_WALL_CLOCK (KVM_FEATURE_CLOCKSOURCE).
pub const MSR_KVM_WALL_CLOCK: u32 = 0x11;
/// MSR_KVM_SYSTEM_TIME (KVM_FEATURE_CLOCKSOURCE).
pub const MSR_KVM_SYSTEM_TIME: u32 = 0x12;
/// MSR_KVM_WALL_CLOCK_NEW (KVM_FEATURE_CLOCKSOURCE2).
pub const MSR_KVM_WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
/// MSR_KVM_SYSTEM_TIME_NEW (KVM_FEATURE_CLOCKSOURCE2).
pub const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// PVCLOCK_TSC_STABLE_BIT: `flags` bit 0.
pub const PVCLOCK_TSC_STABLE_BIT: u8 = 1 << 0;
/// The guest TSC's frequency unless `-cpu ...,tsc-frequency=` says
/// otherwise: 2 GHz, for which kvmclock's TSC-to-ns scale is exact.
pub const DEFAULT_TSC_KHZ: u64 = 2_000_000;
/// LVT timer mode field (bits 17..18): TSC-deadline (SDM Figure 11-8).
pub const LVT_TIMER_MODE_TSC_DEADLINE: u8 = 2;
/// LVT timer mode field shift.
pub const LVT_TIMER_MODE_SHIFT: u32 = 17;

/// `struct pvclock_vcpu_time_info` (arch/x86/include/asm/pvclock-abi.h),
/// as the guest lays it out; the models write its fields at the offsets
/// [`pvti`] takes from it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PvclockVcpuTimeInfo {
    /// Odd while the host writes.
    pub version: u32,
    /// Padding.
    pub pad0: u32,
    /// The TSC at `system_time`.
    pub tsc_timestamp: u64,
    /// kvmclock ns at `tsc_timestamp`.
    pub system_time: u64,
    /// TSC to ns: 32.32 multiplier ...
    pub tsc_to_system_mul: u32,
    /// ... after this shift.
    pub tsc_shift: i8,
    /// PVCLOCK_TSC_STABLE_BIT and friends.
    pub flags: u8,
    /// Padding.
    pub pad: [u8; 2],
}

/// [`PvclockVcpuTimeInfo`]'s field offsets and size.
pub mod pvti {
    use super::PvclockVcpuTimeInfo as T;
    use core::mem::{offset_of, size_of};
    /// `version`.
    pub const VERSION: u64 = offset_of!(T, version) as u64;
    /// `tsc_timestamp`.
    pub const TSC_TIMESTAMP: u64 = offset_of!(T, tsc_timestamp) as u64;
    /// `system_time`.
    pub const SYSTEM_TIME: u64 = offset_of!(T, system_time) as u64;
    /// `tsc_to_system_mul`.
    pub const MUL: u64 = offset_of!(T, tsc_to_system_mul) as u64;
    /// `tsc_shift`.
    pub const SHIFT: u64 = offset_of!(T, tsc_shift) as u64;
    /// `flags`.
    pub const FLAGS: u64 = offset_of!(T, flags) as u64;
    /// sizeof(struct pvclock_vcpu_time_info): 32.
    pub const SIZE: u64 = size_of::<T>() as u64;
    const _: () = assert!(
        VERSION == 0
            && TSC_TIMESTAMP == 8
            && SYSTEM_TIME == 16
            && MUL == 24
            && SHIFT == 28
            && FLAGS == 29
            && SIZE == 32
    );
}

/// `struct pvclock_wall_clock` (arch/x86/include/asm/pvclock-abi.h), 12
/// bytes, packed as the guest lays it out.
#[repr(C, packed(4))]
#[derive(Debug, Default, Clone, Copy)]
pub struct PvclockWallClock {
    /// Odd while the host writes.
    pub version: u32,
    /// Seconds of the wall clock at VM time 0.
    pub sec: u32,
    /// Nanoseconds.
    pub nsec: u32,
}

/// [`PvclockWallClock`]'s field offsets.
pub mod wall {
    use super::PvclockWallClock as T;
    use core::mem::{offset_of, size_of};
    /// `version`.
    pub const VERSION: u64 = offset_of!(T, version) as u64;
    /// `sec`.
    pub const SEC: u64 = offset_of!(T, sec) as u64;
    /// `nsec`.
    pub const NSEC: u64 = offset_of!(T, nsec) as u64;
    /// sizeof(struct pvclock_wall_clock): 12.
    pub const SIZE: u64 = size_of::<T>() as u64;
    const _: () = assert!(VERSION == 0 && SEC == 4 && NSEC == 8 && SIZE == 12);
}

/// `struct kvm_clock_pairing` (arch/x86/include/uapi/asm/kvm_para.h): what
/// KVM_HC_CLOCK_PAIRING writes, 64 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct KvmClockPairing {
    /// Host real time: seconds ...
    pub sec: i64,
    /// ... and nanoseconds ...
    pub nsec: i64,
    /// ... at this guest TSC.
    pub tsc: u64,
    /// 0.
    pub flags: u32,
    /// Padding to 64 bytes.
    pub pad: [u32; 9],
}

impl KvmClockPairing {
    /// Its bytes as the guest reads them (little-endian).
    pub fn to_bytes(&self) -> [u8; 64] {
        use core::mem::offset_of;
        const _: () = assert!(core::mem::size_of::<KvmClockPairing>() == 64);
        let mut b = [0u8; 64];
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(offset_of!(Self, sec), &self.sec.to_le_bytes());
        put(offset_of!(Self, nsec), &self.nsec.to_le_bytes());
        put(offset_of!(Self, tsc), &self.tsc.to_le_bytes());
        put(offset_of!(Self, flags), &self.flags.to_le_bytes());
        b
    }
}

/// `kvm_get_time_scale`: shift and 32.32 multiplier such that
/// `scaled = ((base << shift) * mul) >> 32` (negative shift: right).
pub fn time_scale(scaled_hz: u64, base_hz: u64) -> (i8, u32) {
    let mut shift: i32 = 0;
    let mut tps64 = base_hz;
    let mut scaled64 = scaled_hz;
    while tps64 > scaled64.saturating_mul(2) || tps64 & 0xffff_ffff_0000_0000 != 0 {
        tps64 >>= 1;
        shift -= 1;
    }
    let mut tps32 = tps64 as u32;
    while u64::from(tps32) <= scaled64 || scaled64 & 0xffff_ffff_0000_0000 != 0 {
        if scaled64 & 0xffff_ffff_0000_0000 != 0 || tps32 & 0x8000_0000 != 0 {
            scaled64 >>= 1;
        } else {
            tps32 <<= 1;
        }
        shift += 1;
    }
    // div_frac: (scaled64 << 32) / tps32, which fits in 32 bits here.
    let mul = if tps32 == 0 {
        0
    } else {
        ((scaled64 << 32) / u64::from(tps32)) as u32
    };
    (shift as i8, mul)
}

/// `pvclock_scale_delta`: what the guest computes from a TSC delta.
pub fn scale_delta(delta: u64, mul: u32, shift: i8) -> u64 {
    let d = if shift < 0 {
        delta >> (-shift) as u32
    } else {
        delta << shift as u32
    };
    ((u128::from(d) * u128::from(mul)) >> 32) as u64
}

/// The VM's TSC frequency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscRate {
    khz: u64,
}

impl Default for TscRate {
    fn default() -> Self {
        TscRate {
            khz: DEFAULT_TSC_KHZ,
        }
    }
}

impl TscRate {
    /// A rate of `khz` kHz; 0 means the default.
    pub fn new(khz: u64) -> Self {
        TscRate {
            khz: if khz == 0 { DEFAULT_TSC_KHZ } else { khz },
        }
    }

    /// kHz.
    pub fn khz(self) -> u64 {
        self.khz
    }

    /// TSC ticks after `ns` nanoseconds of VM time.
    pub fn ticks(self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.khz) / 1_000_000) as u64
    }

    /// The nanoseconds after which `ticks` have certainly elapsed
    /// (rounded up), saturating at `i64::MAX` ("never" for QEMU timers).
    pub fn ns_for(self, ticks: u64) -> u64 {
        let ns = (u128::from(ticks) * 1_000_000).div_ceil(u128::from(self.khz));
        ns.min(i64::MAX as u128) as u64
    }

    /// kvmclock's scale for this TSC: (shift, mul).
    pub fn pvclock_scale(self) -> (i8, u32) {
        time_scale(1_000_000_000, self.khz * 1000)
    }
}

/// The x86 time state of one vCPU (plain data, part of its saved state).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct X86Clock {
    /// Guest TSC = VM ticks + this (mod 2^64).
    pub tsc_offset: u64,
    /// IA32_TSC_ADJUST.
    pub tsc_adjust: u64,
    /// MSR_KVM_SYSTEM_TIME(_NEW) as written (bit 0 = enable).
    pub system_time_msr: u64,
    /// IA32_TSC_DEADLINE (0 = disarmed).
    pub tsc_deadline: u64,
    /// The LVT timer mode field (0 one-shot, 1 periodic, 2 TSC-deadline).
    pub lvtt_mode: u8,
}

/// What a write did to the TSC-deadline timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Timer {
    /// Nothing changed.
    Unchanged,
    /// The deadline (or the TSC under it) changed: re-arm.
    Changed,
}

impl X86Clock {
    /// The guest TSC at VM time `now_ns`.
    pub fn tsc(&self, rate: TscRate, now_ns: u64) -> u64 {
        rate.ticks(now_ns).wrapping_add(self.tsc_offset)
    }

    /// A reset, as KVM's `kvm_vcpu_reset` and `kvm_lapic_reset`: kvmclock
    /// off (`kvmclock_reset`, both kinds) and the LAPIC timer back in
    /// one-shot mode with no deadline. A cold reset also puts the TSC back
    /// on the VM's timeline and clears IA32_TSC_ADJUST (QEMU writes them as
    /// 0 into KVM, whose TSC write of 0 synchronises with the other vCPUs);
    /// INIT keeps both (SDM vol. 3 table 10-1; KVM does not touch them).
    pub fn reset(&mut self, kind: crate::x86::ResetKind) {
        *self = match kind {
            crate::x86::ResetKind::Cold => X86Clock::default(),
            crate::x86::ResetKind::Init => X86Clock {
                tsc_offset: self.tsc_offset,
                tsc_adjust: self.tsc_adjust,
                ..X86Clock::default()
            },
        };
    }

    /// WRMSR IA32_TSC from the guest: the TSC jumps to `value`, and
    /// IA32_TSC_ADJUST moves by the same amount (KVM, SDM §18.17.3).
    pub fn write_tsc(&mut self, rate: TscRate, now_ns: u64, value: u64) -> Timer {
        let adj = value.wrapping_sub(self.tsc(rate, now_ns));
        self.tsc_offset = self.tsc_offset.wrapping_add(adj);
        self.tsc_adjust = self.tsc_adjust.wrapping_add(adj);
        Timer::Changed
    }

    /// WRMSR IA32_TSC_ADJUST from the guest: the TSC moves by the change.
    pub fn write_tsc_adjust(&mut self, value: u64) -> Timer {
        let adj = value.wrapping_sub(self.tsc_adjust);
        self.tsc_offset = self.tsc_offset.wrapping_add(adj);
        self.tsc_adjust = value;
        Timer::Changed
    }

    /// Restore the TSC (loadvm, migration): the value QEMU saved, without
    /// touching IA32_TSC_ADJUST (a host-initiated write, as KVM's).
    pub fn restore_tsc(&mut self, rate: TscRate, now_ns: u64, value: u64) {
        self.tsc_offset = value.wrapping_sub(rate.ticks(now_ns));
    }

    /// Whether kvmclock is on for this vCPU.
    pub fn kvmclock_enabled(&self) -> bool {
        self.system_time_msr & 1 != 0
    }

    /// Write this vCPU's `pvclock_vcpu_time_info`, as
    /// `kvm_setup_guest_pvclock`: version made odd, fields, version even.
    /// The reference point is VM time 0 (system_time 0 at the TSC the vCPU
    /// had then), the same for every vCPU: the clock is monotonic across
    /// vCPUs by construction, and exactly the VM clock when the scale is
    /// exact (the default 2 GHz). Nothing is written unless all 32 bytes
    /// are RAM.
    pub fn write_pvclock(&self, mem: &dyn GuestMemory, rate: TscRate, stable: bool) {
        if !self.kvmclock_enabled() {
            return;
        }
        let (ram, gpa) = (GuestRam::new(mem), Gpa(self.system_time_msr & !1));
        // KVM's gfn_to_pfn_cache maps the structure within one page: one
        // that crosses a page is accepted by the MSR and never written
        // (kvm_gpc_activate fails, kvm_setup_guest_pvclock gives up).
        if gpa.raw() % PAGE_SIZE + pvti::SIZE > PAGE_SIZE {
            return;
        }
        let Some(old) = ram.read_array::<{ pvti::SIZE as usize }>(gpa) else {
            return;
        };
        let version = (u32::from_le_bytes([old[0], old[1], old[2], old[3]]).wrapping_add(1)) | 1;
        let (shift, mul) = rate.pvclock_scale();
        let flags = if stable { PVCLOCK_TSC_STABLE_BIT } else { 0 };
        ram.versioned(gpa + pvti::VERSION, version, |ram| {
            ram.put_u64(gpa + pvti::TSC_TIMESTAMP, self.tsc_offset);
            ram.put_u64(gpa + pvti::SYSTEM_TIME, 0);
            ram.put_u32(gpa + pvti::MUL, mul);
            let _ = ram.write(gpa + pvti::SHIFT, &[shift as u8, flags]);
        });
    }

    /// LVT timer register written with `lvt`: a mode change disarms the
    /// TSC-deadline timer (`apic_update_lvtt`).
    pub fn write_lvtt(&mut self, lvt: u32) -> Timer {
        let mode = ((lvt >> LVT_TIMER_MODE_SHIFT) & 3) as u8;
        if mode == self.lvtt_mode {
            return Timer::Unchanged;
        }
        self.lvtt_mode = mode;
        self.tsc_deadline = 0;
        Timer::Changed
    }

    fn deadline_mode(&self) -> bool {
        self.lvtt_mode == LVT_TIMER_MODE_TSC_DEADLINE
    }

    /// RDMSR IA32_TSC_DEADLINE: 0 outside TSC-deadline mode (SDM).
    pub fn read_deadline(&self) -> u64 {
        if self.deadline_mode() {
            self.tsc_deadline
        } else {
            0
        }
    }

    /// WRMSR IA32_TSC_DEADLINE: ignored outside TSC-deadline mode (SDM,
    /// `kvm_set_lapic_tscdeadline_msr`); 0 disarms.
    pub fn write_deadline(&mut self, value: u64) -> Timer {
        if !self.deadline_mode() {
            return Timer::Unchanged;
        }
        self.tsc_deadline = value;
        Timer::Changed
    }

    /// When the armed deadline is due, in VM ns (`now_ns` for a deadline
    /// already passed, `i64::MAX` for one too far to matter); None if none.
    pub fn deadline_ns(&self, rate: TscRate, now_ns: u64) -> Option<u64> {
        if !self.deadline_mode() || self.tsc_deadline == 0 {
            return None;
        }
        let tsc = self.tsc(rate, now_ns);
        if tsc >= self.tsc_deadline {
            return Some(now_ns);
        }
        Some(
            now_ns
                .saturating_add(rate.ns_for(self.tsc_deadline - tsc))
                .min(i64::MAX as u64),
        )
    }

    /// The timer went off at `now_ns`: true (and disarmed, as the SDM says)
    /// if the TSC has reached the deadline.
    pub fn deadline_expired(&mut self, rate: TscRate, now_ns: u64) -> bool {
        if !self.deadline_mode()
            || self.tsc_deadline == 0
            || self.tsc(rate, now_ns) < self.tsc_deadline
        {
            return false;
        }
        self.tsc_deadline = 0;
        true
    }
}

/// MSR_KVM_WALL_CLOCK(_NEW) written with `gpa`: write the wall-clock time
/// at VM time 0 (host real time − kvmclock), as `kvm_write_wall_clock`.
pub fn write_wall_clock(mem: &dyn GuestMemory, gpa: u64, now_ns: u64, realtime_ns: u64) {
    let (ram, gpa) = (GuestRam::new(mem), Gpa(gpa));
    if gpa == Gpa(0) {
        return;
    }
    let Some(v) = ram
        .read_array::<4>(gpa)
        .filter(|_| ram.is_ram(gpa, wall::SIZE as usize))
    else {
        return;
    };
    let mut version = u32::from_le_bytes(v);
    if version & 1 != 0 {
        version = version.wrapping_add(1); // first write: random junk
    }
    version = version.wrapping_add(1);
    // KVM writes the version, the body and the version again with
    // kvm_write_guest (no barrier needed between its copies there: one
    // thread, and the guest reads the wall clock once at boot); ours are
    // ordered all the same.
    let boot = realtime_ns.saturating_sub(now_ns);
    let sec = (boot / 1_000_000_000) as u32; // overflows in 2106, as KVM's
    let nsec = (boot % 1_000_000_000) as u32;
    ram.versioned(gpa + wall::VERSION, version, |ram| {
        ram.put_u32(gpa + wall::SEC, sec);
        ram.put_u32(gpa + wall::NSEC, nsec);
    });
}

#[cfg(test)]
mod tests {
    // The tests lay out guest RAM as a guest would, without GuestRam.
    #![allow(clippy::disallowed_methods)]
    use super::*;
    use crate::memory::tests::FakeRam;

    #[test]
    fn time_scale_matches_kvm_for_common_frequencies() {
        // TSC -> ns for several TSC rates: (shift, mul) as KVM's C
        // kvm_get_time_scale computes them (reference values from a
        // line-by-line port run outside this code), and the conversion
        // error over one second.
        for (khz, want) in [
            (2_000_000u64, (0i8, 0x8000_0000u32)),
            (1_000_000, (1, 0x8000_0000)),
            (3_000_000, (-1, 0xaaaa_aaaa)),
            (2_400_000, (-1, 0xd555_5555)),
            (1_800_000, (0, 0x8e38_e38e)),
        ] {
            let rate = TscRate::new(khz);
            assert_eq!(rate.pvclock_scale(), want, "{khz} kHz");
            let (shift, mul) = want;
            let ns = scale_delta(rate.ticks(1_000_000_000), mul, shift);
            assert!(
                (999_999_990..=1_000_000_000).contains(&ns),
                "{khz} kHz: 1 s -> {ns} ns"
            );
        }
        // ns -> TSC, as KVM's virtual_tsc_mult for a 2 GHz guest.
        assert_eq!(time_scale(2_000_000_000, 1_000_000_000), (2, 0x8000_0000));
    }

    #[test]
    fn tsc_write_and_adjust_move_each_other() {
        let r = TscRate::default();
        let mut c = X86Clock::default();
        assert_eq!(c.tsc(r, 1_000), 2_000, "2 GHz from VM start");
        let _ = c.write_tsc(r, 1_000, 500);
        assert_eq!(c.tsc(r, 1_000), 500);
        assert_eq!(c.tsc_adjust as i64, -1_500, "ADJUST follows the TSC write");
        assert_eq!(c.tsc(r, 2_000), 2_500, "and keeps counting");
        let _ = c.write_tsc_adjust(0);
        assert_eq!(c.tsc(r, 2_000), 4_000, "ADJUST back to 0 undoes it");
        assert_eq!(c.tsc_offset, 0);
        // Backwards and wrapping writes are just offsets.
        let _ = c.write_tsc(r, 2_000, u64::MAX - 10);
        assert_eq!(c.tsc(r, 2_000), u64::MAX - 10);
        assert_eq!(c.tsc(r, 2_010), 9, "wraps like hardware");
        // Restoring a saved TSC does not touch ADJUST.
        let adj = c.tsc_adjust;
        c.restore_tsc(r, 5_000, 42);
        assert_eq!((c.tsc(r, 5_000), c.tsc_adjust), (42, adj));
    }

    #[test]
    fn pvclock_fields_are_atomic_stores_between_the_versions() {
        let ram = FakeRam::new(0x3000);
        let r = TscRate::default();
        let c = X86Clock {
            system_time_msr: 0x1000 | 1,
            ..Default::default()
        };
        c.write_pvclock(&ram, r, true);
        let at = |o: u64| 0x1000 + o;
        assert_eq!(
            ram.atomic_stores(),
            vec![
                (at(pvti::VERSION), 4),
                (at(pvti::TSC_TIMESTAMP), 8),
                (at(pvti::SYSTEM_TIME), 8),
                (at(pvti::MUL), 4),
                (at(pvti::VERSION), 4),
            ]
        );
    }

    /// Found by the property tests: a kvmclock at a GPA that is even but not
    /// 8-byte aligned (the MSR takes any) was left with its `u64` fields
    /// unwritten (at 2 mod 4, not written at all), and the guest's clock
    /// jumped back after the next TSC change. KVM writes it wherever it is.
    #[test]
    fn an_unaligned_pvclock_is_written_whole_and_converts_exactly() {
        let r = TscRate::default();
        for gpa in [0x1004u64, 0x1002, 0x100e] {
            let ram = FakeRam::new(0x2000);
            let mut c = X86Clock {
                system_time_msr: gpa | 1,
                ..Default::default()
            };
            let _ = c.write_tsc(r, 1_000, 77);
            c.write_pvclock(&ram, r, true);
            let mut b = [0u8; 32];
            assert!(ram.read(gpa, &mut b));
            let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
            assert_eq!(
                u32::from_le_bytes(b[0..4].try_into().unwrap()),
                2,
                "{gpa:#x}"
            );
            let mul = u32::from_le_bytes(b[24..28].try_into().unwrap());
            let guest =
                word(16) + scale_delta(c.tsc(r, 5_000).wrapping_sub(word(8)), mul, b[28] as i8);
            assert_eq!(guest, 5_000, "{gpa:#x}");
            assert_eq!(ram.writes_outside(gpa, 32), 0);
        }
    }

    #[test]
    fn a_pvclock_crossing_a_page_is_never_written_as_kvms_page_cache() {
        let ram = FakeRam::new(0x3000);
        let r = TscRate::default();
        // 32 bytes from 0x1ff0 cross into the next page; 0x1fe0 just fits.
        for (gpa, written) in [(0x1ff0u64, false), (0x1fe8, false), (0x1fe0, true)] {
            let skip = ram.write_count();
            let c = X86Clock {
                system_time_msr: gpa | 1,
                ..Default::default()
            };
            assert!(c.kvmclock_enabled(), "the MSR takes it");
            c.write_pvclock(&ram, r, true);
            assert_eq!(ram.write_count() > skip, written, "{gpa:#x}");
        }
    }

    #[test]
    fn init_keeps_the_tsc_and_adjust_a_reset_puts_it_back_on_the_vm() {
        use crate::x86::ResetKind;
        let r = TscRate::default();
        let armed = || {
            let mut c = X86Clock {
                system_time_msr: 0x1000 | 1,
                ..Default::default()
            };
            let _ = c.write_tsc(r, 1_000, 1 << 40);
            assert_eq!(c.write_lvtt(2 << LVT_TIMER_MODE_SHIFT), Timer::Changed);
            let _ = c.write_deadline(1 << 41);
            assert!(c.deadline_ns(r, 1_000).is_some());
            c
        };
        let mut c = armed();
        let adjust = c.tsc_adjust;
        c.reset(ResetKind::Init);
        assert_eq!(c.tsc(r, 2_000), (1 << 40) + 2_000, "INIT: TSC goes on");
        assert_eq!(c.tsc_adjust, adjust, "INIT: ADJUST kept");
        assert!(!c.kvmclock_enabled(), "INIT: kvmclock off");
        assert_eq!(c.system_time_msr, 0);
        assert_eq!((c.tsc_deadline, c.lvtt_mode), (0, 0), "LAPIC timer reset");
        assert_eq!(c.deadline_ns(r, 2_000), None);
        let mut c = armed();
        c.reset(ResetKind::Cold);
        assert_eq!(c, X86Clock::default(), "RESET: all back");
        assert_eq!(c.tsc(r, 2_000), 4_000, "on the VM's timeline");
    }

    #[test]
    fn pvclock_follows_the_version_protocol_and_converts_exactly() {
        let ram = FakeRam::new(0x2000);
        let r = TscRate::default();
        let mut c = X86Clock {
            system_time_msr: 0x1000 | 1,
            ..Default::default()
        };
        assert!(ram.write(0x1000, &7u32.to_le_bytes()));
        let _ = c.write_tsc(r, 10_000, 123_456_789);
        c.write_pvclock(&ram, r, true);
        let mut b = [0u8; 32];
        assert!(ram.read(0x1000, &mut b));
        let version = u32::from_le_bytes(b[0..4].try_into().unwrap());
        assert_eq!(version, 10, "7 -> 9 (odd) while writing -> 10");
        assert!(ram.version_history(0x1000).contains(&9));
        let tsc_ts = u64::from_le_bytes(b[8..16].try_into().unwrap());
        let sys = u64::from_le_bytes(b[16..24].try_into().unwrap());
        let mul = u32::from_le_bytes(b[24..28].try_into().unwrap());
        let (shift, flags) = (b[28] as i8, b[29]);
        assert_eq!(flags, PVCLOCK_TSC_STABLE_BIT);
        // What the guest computes equals the VM clock, at any time.
        for now in [10_000u64, 1_000_000_007, 86_400_000_000_000] {
            let guest_ns = sys + scale_delta(c.tsc(r, now).wrapping_sub(tsc_ts), mul, shift);
            assert_eq!(guest_ns, now);
        }
        assert_eq!(ram.writes_outside(0x1000, 32), 0);
        // Not advertised: no stable bit.
        c.write_pvclock(&ram, r, false);
        assert!(ram.read(0x1000, &mut b));
        assert_eq!(b[29], 0);
        // Disabled or outside RAM: nothing written.
        let n = ram.write_count();
        X86Clock::default().write_pvclock(&ram, r, true);
        X86Clock {
            system_time_msr: 0x1ff0 | 1,
            ..Default::default()
        }
        .write_pvclock(&ram, r, true);
        assert_eq!(ram.write_count(), n);
    }

    #[test]
    fn wall_clock_is_real_time_at_vm_start() {
        let ram = FakeRam::new(0x1000);
        assert!(ram.write(0x100, &3u32.to_le_bytes()));
        write_wall_clock(&ram, 0x100, 2_500_000_000, 1_700_000_003_000_000_000);
        let mut b = [0u8; 12];
        assert!(ram.read(0x100, &mut b));
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        assert_eq!(word(0), 6, "odd junk 3 -> 4, 5 while writing, 6");
        assert_eq!((word(4), word(8)), (1_700_000_000, 500_000_000));
        let n = ram.write_count();
        write_wall_clock(&ram, 0xffc, 0, 0);
        write_wall_clock(&ram, 0, 0, 0);
        assert_eq!(ram.write_count(), n, "not all RAM, or 0: nothing");
    }

    #[test]
    fn tsc_deadline_only_in_its_mode_fires_once_and_never_early() {
        let r = TscRate::default();
        let mut c = X86Clock::default();
        assert_eq!(c.write_deadline(5_000), Timer::Unchanged, "one-shot mode");
        assert_eq!(c.read_deadline(), 0);
        assert_eq!(c.write_lvtt(2 << 17 | 0x40), Timer::Changed);
        assert_eq!(c.write_lvtt(2 << 17 | 0x41), Timer::Unchanged, "same mode");
        assert_eq!(c.write_deadline(5_001), Timer::Changed);
        assert_eq!(c.read_deadline(), 5_001);
        // TSC 5001 is reached at 2500.5 ns: armed for 2501, not 2500.
        assert_eq!(c.deadline_ns(r, 1_000), Some(2_501));
        assert!(!c.deadline_expired(r, 2_500), "never early");
        assert!(c.deadline_expired(r, 2_501));
        assert_eq!(c.read_deadline(), 0, "disarmed after firing");
        assert!(!c.deadline_expired(r, 3_000), "once");
        // In the past: due now. 0 disarms. Huge: effectively never.
        let _ = c.write_deadline(10);
        assert_eq!(c.deadline_ns(r, 3_000), Some(3_000));
        let _ = c.write_deadline(0);
        assert_eq!(c.deadline_ns(r, 3_000), None);
        let _ = c.write_deadline(u64::MAX);
        assert_eq!(c.deadline_ns(r, 3_000), Some(i64::MAX as u64));
        // A TSC write moves the deadline's time.
        let _ = c.write_deadline(10_000);
        let _ = c.write_tsc(r, 0, 9_000);
        assert_eq!(c.deadline_ns(r, 0), Some(500));
        // Leaving the mode disarms.
        assert_eq!(c.write_lvtt(0), Timer::Changed);
        assert_eq!(c.deadline_ns(r, 0), None);
        let _ = c.write_lvtt(2 << 17);
        assert_eq!(c.read_deadline(), 0, "not re-armed by coming back");
    }
}
