//! Intel PEBS, record format 4 with the baseline (adaptive) records, as
//! KVM 5.18–6.8 offered it to a guest with an Intel vPMU on an Ice Lake
//! server host, with the architecturally correct behaviour where that KVM
//! had bugs (see below): IA32_PEBS_ENABLE, MSR_PEBS_DATA_CFG, IA32_DS_AREA,
//! PERF_CAPABILITIES' PEBS fields, and the records a PEBS-enabled counter's
//! overflow writes to the guest's DS buffer.
//!
//! Spec: Linux `arch/x86/kvm/vmx/pmu_intel.c` (`intel_pmu_refresh`'s
//! reserved bits, `intel_pmu_set_msr`, `intel_is_valid_msr`),
//! `arch/x86/kvm/vmx/vmx.c` (`vmx_get_perf_capabilities`),
//! `arch/x86/include/asm/intel_ds.h` (`struct debug_store`),
//! `arch/x86/include/asm/perf_event.h` (`struct pebs_basic` and the other
//! groups), `arch/x86/events/intel/ds.c` (`intel_pmu_pebs_enable`, the
//! reset index of fixed counters, `adaptive_pebs_record_size_update`);
//! Intel SDM vol. 3B 20.9 (PEBS) and 20.6.2.4 (adaptive PEBS);
//! kvm-unit-tests `x86/pmu_pebs.c`. Notes: docs/pmu.md "PEBS" and
//! `shared/pebs-facts.md`.
//!
//! Which KVM: Linux 6.9 and later (6.12 included) stopped offering the
//! baseline (`perf_cap &= ~PERF_CAP_PEBS_BASELINE`, "KVM: x86/pmu: Disable
//! support for adaptive PEBS") because perf made every host counter
//! adaptive (the guest got groups it did not ask for), dropped fixed
//! counters' ADAPTIVE bit and let host LBRs into the records. An emulation
//! has none of those bugs, so this model offers what 5.18–6.8 offered and
//! does what the SDM says: a counter without its ADAPTIVE bit writes basic
//! records, and LBR entries are the guest's own records.
//!
//! The PMU (`x86::pmu`) owns it and routes the MSRs here when its
//! configuration has PEBS; no vCPU's has yet (QEMU does not ask for it),
//! and the records are not written yet (issue 21 point 2).

use crate::x86::X86Error;

/// IA32_PEBS_ENABLE: which counters write records (GP i: bit i; fixed i:
/// bit 32 + i).
pub const MSR_IA32_PEBS_ENABLE: u32 = 0x3f1;
/// MSR_PEBS_DATA_CFG: the groups of an adaptive record.
pub const MSR_PEBS_DATA_CFG: u32 = 0x3f2;
/// IA32_DS_AREA: the linear address of the DS save area.
pub const MSR_IA32_DS_AREA: u32 = 0x600;

/// PERF_CAPABILITIES bits this model sets (`union perf_capabilities`).
pub mod caps {
    /// PEBS_TRAP: the record's machine state is after the instruction.
    pub const PEBS_TRAP: u64 = 1 << 6;
    /// PEBS_ARCH_REG: the record has the architectural registers.
    pub const PEBS_ARCH_REG: u64 = 1 << 7;
    /// PEBS_FORMAT (11:8): record format 4.
    pub const PEBS_FORMAT_4: u64 = 4 << 8;
    /// PEBS_BASELINE: adaptive records, PEBS on every counter, DATA_CFG.
    pub const PEBS_BASELINE: u64 = 1 << 14;
    /// Everything PEBS adds to PERF_CAPABILITIES (KVM's `PERF_CAP_PEBS_MASK`
    /// of an Ice Lake server host, as 5.18–6.8 passed it on).
    pub const PEBS: u64 = PEBS_TRAP | PEBS_ARCH_REG | PEBS_FORMAT_4 | PEBS_BASELINE;
}

/// MSR_PEBS_DATA_CFG bits (`PEBS_DATACFG_*`).
pub mod data_cfg {
    /// The memory-info group.
    pub const MEMINFO: u64 = 1 << 0;
    /// The general-purpose registers group.
    pub const GPRS: u64 = 1 << 1;
    /// The XMM registers group.
    pub const XMMS: u64 = 1 << 2;
    /// The LBR entries group.
    pub const LBRS: u64 = 1 << 3;
    /// Bits 31:24: LBR entries in the record, minus one.
    pub const LBR_SHIFT: u32 = 24;
    /// The bits a guest may set (KVM's `pebs_data_cfg_rsvd = ~0xff00000f`).
    pub const VALID: u64 = 0xff00_000f;
}

/// GLOBAL_STATUS bit 62, OvfBuffer: a PEBS record reached the interrupt
/// threshold (`GLOBAL_STATUS_BUFFER_OVF_BIT`).
pub const GLOBAL_STATUS_BUFFER_OVF: u64 = 1 << 62;

/// The DS save area's PEBS fields (64-bit layout, `struct debug_store`).
pub mod ds {
    /// pebs_buffer_base.
    pub const BUFFER_BASE: u64 = 0x20;
    /// pebs_index: where the next record goes.
    pub const INDEX: u64 = 0x28;
    /// pebs_absolute_maximum: the end of the buffer.
    pub const ABSOLUTE_MAXIMUM: u64 = 0x30;
    /// pebs_interrupt_threshold.
    pub const INTERRUPT_THRESHOLD: u64 = 0x38;
    /// pebs_event_reset[]: the value a counter reloads after its record;
    /// GP counter i at index i, fixed counter i at index 8 + i (format 4:
    /// `MAX_PEBS_EVENTS_FMT4`).
    pub const EVENT_RESET: u64 = 0x40;
    /// Index of fixed counter 0's reset value in format 4.
    pub const FIXED_RESET_INDEX: u64 = 8;
}

/// Record group sizes in bytes (`struct pebs_basic`, `pebs_meminfo`,
/// `pebs_gprs`, `pebs_xmm`, `lbr_entry`).
pub mod size {
    /// format_size, ip, applicable_counters, tsc.
    pub const BASIC: u64 = 32;
    /// address, aux, latency, tsx_tuning.
    pub const MEMINFO: u64 = 32;
    /// flags, ip, ax, cx, dx, bx, sp, bp, si, di, r8-r15.
    pub const GPRS: u64 = 144;
    /// XMM0-15, 16 bytes each.
    pub const XMMS: u64 = 256;
    /// from, to, info.
    pub const LBR_ENTRY: u64 = 24;
}

/// A counter, as PEBS_ENABLE and `applicable_counters` number them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// General-purpose counter i.
    Gp(u8),
    /// Fixed counter i.
    Fixed(u8),
}

impl Counter {
    /// Its bit in PEBS_ENABLE, GLOBAL_CTRL and `applicable_counters`.
    pub fn bit(self) -> u64 {
        match self {
            Counter::Gp(i) => 1 << i,
            Counter::Fixed(i) => 1 << (32 + u32::from(i)),
        }
    }

    /// The address of its reset value in a DS area at `ds_area`.
    fn reset_slot(self, ds_area: u64) -> u64 {
        let index = match self {
            Counter::Gp(i) => u64::from(i),
            Counter::Fixed(i) => ds::FIXED_RESET_INDEX + u64::from(i),
        };
        ds_area.wrapping_add(ds::EVENT_RESET + 8 * index)
    }
}

/// The machine state a record is made of, at the instruction boundary after
/// the instruction whose event overflowed the counter (zero skid).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// The linear address of the instruction that caused the event (the
    /// basic group's `ip`, the EventingIP).
    pub eventing_ip: u64,
    /// The linear address of the next instruction (the GPR group's `ip`,
    /// trap-like, as PEBS_TRAP says).
    pub next_ip: u64,
    /// RFLAGS.
    pub flags: u64,
    /// RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15 (the GPR group's
    /// order, which is the x86 register numbering).
    pub gprs: [u64; 16],
    /// XMM0-15, low and high quadwords.
    pub xmm: [[u64; 2]; 16],
    /// The guest's TSC.
    pub tsc: u64,
    /// The newest LBR records first: (from, to, info).
    pub lbr: Vec<(u64, u64, u64)>,
}

/// Guest memory by linear address, as the vCPU's paging maps it now.
pub trait LinearMemory {
    /// Read a quadword; None if it is not mapped to RAM.
    fn read_u64(&mut self, addr: u64) -> Option<u64>;
    /// Write `bytes` at `addr`; false if any of it is not mapped to
    /// writable RAM (then nothing is written).
    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool;
}

/// Why an overflow wrote no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// The DS save area is not mapped to RAM.
    #[error("the DS save area at {0:#x} is not in RAM")]
    DsArea(u64),
    /// The record would end past pebs_absolute_maximum: the buffer is full
    /// (the SDM asks software to set the threshold records short of it).
    #[error("the PEBS buffer is full")]
    Full,
    /// The record's place is not mapped to writable RAM.
    #[error("the PEBS buffer at {0:#x} is not writable RAM")]
    Buffer(u64),
}

/// What an overflow of a PEBS-enabled counter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The value the counter reloads (its pebs_event_reset).
    pub reload: u64,
    /// The record reached the interrupt threshold: GLOBAL_STATUS bit 62
    /// and a PMI.
    pub interrupt: bool,
}

/// A vCPU's PEBS registers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PebsRegs {
    /// IA32_PEBS_ENABLE.
    pub enable: u64,
    /// MSR_PEBS_DATA_CFG.
    pub data_cfg: u64,
    /// IA32_DS_AREA.
    pub ds_area: u64,
}

/// A vCPU's PEBS.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pebs {
    /// Whether the vCPU has PEBS (format 4 with the baseline).
    enabled: bool,
    /// The PEBS_ENABLE bits of counters that exist (KVM: the same as
    /// GLOBAL_CTRL's, with the baseline).
    counters: u64,
    regs: PebsRegs,
}

/// Whether `addr` is canonical for 48-bit linear addresses (Linux 6.12's
/// `is_noncanonical_address` for a guest without LA57, which TCG's Intel
/// models here lack).
fn canonical(addr: u64) -> bool {
    let top = (addr as i64) >> 47;
    top == 0 || top == -1
}

impl Pebs {
    /// A vCPU's PEBS after reset: all registers 0. `enabled`: it has PEBS;
    /// `gp` and `fixed`: its counters.
    pub fn new(enabled: bool, gp: u8, fixed: u8) -> Self {
        let counters = ((1u64 << gp) - 1) | (((1u64 << fixed) - 1) << 32);
        Pebs {
            enabled,
            counters,
            regs: PebsRegs::default(),
        }
    }

    /// Whether the vCPU has PEBS.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The PERF_CAPABILITIES bits PEBS adds.
    pub fn capabilities(&self) -> u64 {
        if self.enabled {
            caps::PEBS
        } else {
            0
        }
    }

    /// Whether `index` is one of PEBS's MSRs.
    pub fn owns(index: u32) -> bool {
        matches!(
            index,
            MSR_IA32_PEBS_ENABLE | MSR_PEBS_DATA_CFG | MSR_IA32_DS_AREA
        )
    }

    /// RDMSR: without PEBS the MSRs #GP (`intel_is_valid_msr`).
    pub fn read_msr(&self, index: u32) -> Result<u64, X86Error> {
        if !self.enabled {
            return Err(X86Error::Unsupported { msr: index });
        }
        match index {
            MSR_IA32_PEBS_ENABLE => Ok(self.regs.enable),
            MSR_PEBS_DATA_CFG => Ok(self.regs.data_cfg),
            MSR_IA32_DS_AREA => Ok(self.regs.ds_area),
            _ => Err(X86Error::Unsupported { msr: index }),
        }
    }

    /// WRMSR with KVM's rules: reserved bits #GP (PEBS_ENABLE: counters
    /// that do not exist and bits 60-63; DATA_CFG: outside 0xff00000f), a
    /// non-canonical DS_AREA #GPs; nothing else is checked when written.
    pub fn write_msr(&mut self, index: u32, value: u64) -> Result<(), X86Error> {
        if !self.enabled {
            return Err(X86Error::Unsupported { msr: index });
        }
        let reserved = X86Error::ReservedBits { msr: index, value };
        match index {
            MSR_IA32_PEBS_ENABLE if value & !self.counters != 0 => Err(reserved),
            MSR_IA32_PEBS_ENABLE => {
                self.regs.enable = value;
                Ok(())
            }
            MSR_PEBS_DATA_CFG if value & !data_cfg::VALID != 0 => Err(reserved),
            MSR_PEBS_DATA_CFG => {
                self.regs.data_cfg = value;
                Ok(())
            }
            MSR_IA32_DS_AREA if !canonical(value) => Err(reserved),
            MSR_IA32_DS_AREA => {
                self.regs.ds_area = value;
                Ok(())
            }
            _ => Err(X86Error::Unsupported { msr: index }),
        }
    }

    /// Whether `c`'s overflow writes a record.
    pub fn counts(&self, c: Counter) -> bool {
        self.enabled && self.regs.enable & c.bit() != 0
    }

    /// The groups a record of a counter gets: DATA_CFG's if the counter is
    /// adaptive (EVENTSEL bit 34, FIXED_CTR_CTRL bit 32 + 4i), else none
    /// (a basic record).
    pub fn groups(&self, adaptive: bool) -> u64 {
        if adaptive {
            self.regs.data_cfg
        } else {
            0
        }
    }

    /// The size of a record with `groups` (`adaptive_pebs_record_size_update`).
    pub fn record_size(groups: u64) -> u64 {
        let has = |g: u64| groups & g != 0;
        let mut n = size::BASIC;
        if has(data_cfg::MEMINFO) {
            n += size::MEMINFO;
        }
        if has(data_cfg::GPRS) {
            n += size::GPRS;
        }
        if has(data_cfg::XMMS) {
            n += size::XMMS;
        }
        if has(data_cfg::LBRS) {
            n += size::LBR_ENTRY * Self::lbr_entries(groups);
        }
        n
    }

    /// LBR entries a record with `groups` holds.
    fn lbr_entries(groups: u64) -> u64 {
        ((groups >> data_cfg::LBR_SHIFT) & 0xff) + 1
    }

    /// The record's bytes: basic group (format_size: the size in 63:48 and
    /// the groups in 47:0; EventingIP; `applicable`; TSC), then memory
    /// info (no load or store this model attributes: zeros), registers,
    /// XMM and LBR entries (those the vCPU has, zeros past them), in that
    /// order.
    pub fn record(groups: u64, applicable: u64, s: &Sample) -> Vec<u8> {
        let size = Self::record_size(groups);
        let mut out = Vec::with_capacity(size as usize);
        let mut put = |v: u64| out.extend_from_slice(&v.to_le_bytes());
        put(size << 48 | (groups & 0xffff_ffff_ffff));
        put(s.eventing_ip);
        put(applicable);
        put(s.tsc);
        if groups & data_cfg::MEMINFO != 0 {
            (0..4).for_each(|_| put(0));
        }
        if groups & data_cfg::GPRS != 0 {
            put(s.flags);
            put(s.next_ip);
            s.gprs.iter().for_each(|r| put(*r));
        }
        if groups & data_cfg::XMMS != 0 {
            s.xmm.iter().flatten().for_each(|q| put(*q));
        }
        if groups & data_cfg::LBRS != 0 {
            for i in 0..Self::lbr_entries(groups) as usize {
                let (from, to, info) = s.lbr.get(i).copied().unwrap_or_default();
                put(from);
                put(to);
                put(info);
            }
        }
        debug_assert_eq!(out.len() as u64, size);
        out
    }

    /// `c`'s pebs_event_reset in the DS area; None if the area is not RAM.
    pub fn reset_value(&self, mem: &mut impl LinearMemory, c: Counter) -> Option<u64> {
        mem.read_u64(c.reset_slot(self.regs.ds_area))
    }

    /// `c` (PEBS-enabled, adaptive or not) overflowed at `s`: write its
    /// record at pebs_index and move the index on (SDM 20.9.2). The
    /// record names every PEBS-enabled counter in `overflowed` (counters
    /// that overflowed on the same instruction share it).
    pub fn overflow(
        &self,
        mem: &mut impl LinearMemory,
        c: Counter,
        adaptive: bool,
        overflowed: u64,
        s: &Sample,
    ) -> Result<Written, Dropped> {
        let area = self.regs.ds_area;
        let field = |mem: &mut dyn LinearMemory, off: u64| {
            mem.read_u64(area.wrapping_add(off))
                .ok_or(Dropped::DsArea(area))
        };
        let index = field(mem, ds::INDEX)?;
        let max = field(mem, ds::ABSOLUTE_MAXIMUM)?;
        let threshold = field(mem, ds::INTERRUPT_THRESHOLD)?;
        let reload = mem
            .read_u64(c.reset_slot(area))
            .ok_or(Dropped::DsArea(area))?;
        let groups = self.groups(adaptive);
        let size = Self::record_size(groups);
        let end = index.checked_add(size).ok_or(Dropped::Full)?;
        if end > max {
            return Err(Dropped::Full);
        }
        // The counters were PEBS-enabled when they overflowed (the caller
        // collects only those): a PEBS_ENABLE write since, in the WRMSR
        // whose sync found the overflow, does not unname them.
        let applicable = overflowed | c.bit();
        if !mem.write(index, &Self::record(groups, applicable, s)) {
            return Err(Dropped::Buffer(index));
        }
        if !mem.write(area.wrapping_add(ds::INDEX), &end.to_le_bytes()) {
            return Err(Dropped::DsArea(area));
        }
        Ok(Written {
            reload,
            interrupt: end >= threshold,
        })
    }

    /// The registers to save.
    pub fn save(&self) -> PebsRegs {
        self.regs
    }

    /// Load saved registers as host-initiated writes: what the vCPU lacks,
    /// or KVM would refuse, is dropped.
    pub fn load(&mut self, regs: &PebsRegs) {
        let (enabled, counters) = (self.enabled, self.counters);
        *self = Pebs {
            enabled,
            counters,
            regs: PebsRegs::default(),
        };
        for (index, value) in [
            (MSR_IA32_PEBS_ENABLE, regs.enable),
            (MSR_PEBS_DATA_CFG, regs.data_cfg),
            (MSR_IA32_DS_AREA, regs.ds_area),
        ] {
            // A value KVM's KVM_SET_MSRS would refuse (reserved bits for
            // this vCPU) is dropped whole, as `Pmu::load` drops its own;
            // without PEBS every one is.
            let _ = self.write_msr(index, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Linear memory of 4 KiB pages that exist where `pages` says.
    #[derive(Default)]
    struct Pages {
        bytes: BTreeMap<u64, u8>,
        pages: Vec<u64>,
    }

    impl Pages {
        fn mapped(&self, addr: u64, len: u64) -> bool {
            (addr..addr + len).all(|a| self.pages.contains(&(a & !0xfff)))
        }
        fn put(&mut self, addr: u64, v: u64) {
            assert!(self.write(addr, &v.to_le_bytes()));
        }
        fn get(&mut self, addr: u64) -> u64 {
            self.read_u64(addr).unwrap()
        }
    }

    impl LinearMemory for Pages {
        fn read_u64(&mut self, addr: u64) -> Option<u64> {
            self.mapped(addr, 8).then(|| {
                let b: Vec<u8> = (0..8)
                    .map(|i| *self.bytes.get(&(addr + i)).unwrap_or(&0))
                    .collect();
                u64::from_le_bytes(b.try_into().unwrap())
            })
        }
        fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
            if !self.mapped(addr, bytes.len() as u64) {
                return false;
            }
            for (i, b) in bytes.iter().enumerate() {
                self.bytes.insert(addr + i as u64, *b);
            }
            true
        }
    }

    const DS: u64 = 0x10_0000;
    const BUF: u64 = 0x20_0000;

    /// A DS area at DS with a one-page buffer at BUF and the threshold
    /// `records` basic records in (kvm-unit-tests' layout).
    fn ds_area(threshold: u64) -> Pages {
        let mut m = Pages {
            pages: vec![DS, BUF],
            ..Pages::default()
        };
        m.put(DS + ds::BUFFER_BASE, BUF);
        m.put(DS + ds::INDEX, BUF);
        m.put(DS + ds::ABSOLUTE_MAXIMUM, BUF + 4096);
        m.put(DS + ds::INTERRUPT_THRESHOLD, BUF + threshold);
        m
    }

    fn on() -> Pebs {
        let mut p = Pebs::new(true, 8, 4);
        p.write_msr(MSR_IA32_DS_AREA, DS).unwrap();
        p
    }

    fn sample() -> Sample {
        Sample {
            eventing_ip: 0x40_1000,
            next_ip: 0x40_1003,
            flags: 0x246,
            gprs: core::array::from_fn(|i| 0x100 + i as u64),
            xmm: core::array::from_fn(|i| [i as u64, !(i as u64)]),
            tsc: 123_456,
            lbr: vec![(1, 2, 0), (3, 4, 0)],
        }
    }

    #[test]
    fn without_pebs_the_msrs_fault_and_capabilities_say_nothing() {
        let mut p = Pebs::new(false, 8, 4);
        for msr in [MSR_IA32_PEBS_ENABLE, MSR_PEBS_DATA_CFG, MSR_IA32_DS_AREA] {
            assert!(p.read_msr(msr).is_err(), "{msr:#x}");
            assert!(p.write_msr(msr, 0).is_err(), "{msr:#x}");
        }
        assert_eq!(p.capabilities(), 0);
        assert!(!p.counts(Counter::Gp(0)));
        assert_eq!(Pebs::new(true, 4, 3).capabilities(), 0x44c0);
    }

    #[test]
    fn kvms_reserved_bits_fault_and_keep_the_old_value() {
        let mut p = Pebs::new(true, 4, 3);
        // Counters 0-3 and fixed 0-2 (the baseline: GLOBAL_CTRL's bits).
        assert_eq!(p.write_msr(MSR_IA32_PEBS_ENABLE, 0x7_0000_000f), Ok(()));
        assert!(p.write_msr(MSR_IA32_PEBS_ENABLE, 1 << 4).is_err(), "GP 4");
        assert!(
            p.write_msr(MSR_IA32_PEBS_ENABLE, 1 << 35).is_err(),
            "fixed 3"
        );
        assert!(
            p.write_msr(MSR_IA32_PEBS_ENABLE, 1 << 60).is_err(),
            "PEBS via PT"
        );
        assert_eq!(p.read_msr(MSR_IA32_PEBS_ENABLE), Ok(0x7_0000_000f));
        assert_eq!(p.write_msr(MSR_PEBS_DATA_CFG, 0xff00_000f), Ok(()));
        assert!(p.write_msr(MSR_PEBS_DATA_CFG, 1 << 4).is_err());
        assert!(p.write_msr(MSR_PEBS_DATA_CFG, 1 << 32).is_err());
        assert_eq!(p.write_msr(MSR_IA32_DS_AREA, 0xffff_8000_0000_1000), Ok(()));
        assert!(p.write_msr(MSR_IA32_DS_AREA, 0x8000_0000_0000).is_err());
        assert_eq!(p.read_msr(MSR_IA32_DS_AREA), Ok(0xffff_8000_0000_1000));
        assert!(p.counts(Counter::Fixed(2)) && !p.counts(Counter::Gp(4)));
    }

    #[test]
    fn record_sizes_and_layout_follow_the_groups() {
        assert_eq!(Pebs::record_size(0), 32);
        assert_eq!(Pebs::record_size(data_cfg::MEMINFO | data_cfg::GPRS), 208);
        assert_eq!(
            Pebs::record_size(0xf | 31 << 24),
            32 + 32 + 144 + 256 + 24 * 32
        );
        let s = sample();
        let r = Pebs::record(data_cfg::GPRS | data_cfg::LBRS | 2 << 24, 0b101, &s);
        let q = |i: usize| u64::from_le_bytes(r[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(
            q(0),
            (32 + 144 + 72) << 48 | data_cfg::GPRS | data_cfg::LBRS | 2 << 24
        );
        assert_eq!((q(1), q(2), q(3)), (0x40_1000, 0b101, 123_456));
        assert_eq!((q(4), q(5), q(6), q(21)), (0x246, 0x40_1003, 0x100, 0x10f));
        assert_eq!(
            (q(22), q(23), q(25), q(28)),
            (1, 2, 3, 0),
            "two LBRs, then zeros"
        );
        let basic = Pebs::record(0, 1, &s);
        assert_eq!(basic.len(), 32);
        assert_eq!(basic[..8], (32u64 << 48).to_le_bytes());
    }

    #[test]
    fn an_overflow_writes_its_record_moves_the_index_and_interrupts_at_the_threshold() {
        let mut p = on();
        p.write_msr(MSR_IA32_PEBS_ENABLE, 0b11 | 1 << 32).unwrap();
        p.write_msr(MSR_PEBS_DATA_CFG, data_cfg::GPRS).unwrap();
        // kvm-unit-tests: the threshold is one record in.
        let mut m = ds_area(176);
        m.put(DS + ds::EVENT_RESET + 8, 0xffff_ffff_fff0);
        m.put(DS + ds::EVENT_RESET + 8 * 8, 0xffff_ffff_ff00);
        let s = sample();
        let w = p.overflow(&mut m, Counter::Gp(1), true, 0b1, &s).unwrap();
        assert_eq!(
            w,
            Written {
                reload: 0xffff_ffff_fff0,
                interrupt: true
            }
        );
        assert_eq!(m.get(DS + ds::INDEX), BUF + 176);
        assert_eq!(m.get(BUF) >> 48, 176);
        assert_eq!(m.get(BUF + 16), 0b11, "both overflowed counters");
        // A basic record for a counter without ADAPTIVE, the fixed one's
        // reset value at index 8 (format 4).
        let w = p.overflow(&mut m, Counter::Fixed(0), false, 0, &s).unwrap();
        assert_eq!(w.reload, 0xffff_ffff_ff00);
        assert_eq!(m.get(BUF + 176), 32 << 48, "size 32, no groups");
        assert_eq!(m.get(BUF + 176 + 16), 1 << 32);
        assert_eq!(m.get(DS + ds::INDEX), BUF + 208);
    }

    /// The WRMSR whose sync finds an overflow may clear PEBS_ENABLE: the
    /// record, owed from before it, still names the counter.
    #[test]
    fn a_record_owed_before_pebs_enable_is_cleared_names_its_counter() {
        let mut p = on();
        p.write_msr(MSR_IA32_PEBS_ENABLE, 0b1).unwrap();
        let mut m = ds_area(4096);
        p.write_msr(MSR_IA32_PEBS_ENABLE, 0).unwrap();
        p.overflow(&mut m, Counter::Gp(0), false, 0b1, &sample())
            .unwrap();
        assert_eq!(m.get(BUF + 16), 0b1, "PMC0 named");
    }

    #[test]
    fn hostile_ds_areas_get_no_record_and_no_stray_write() {
        let mut p = on();
        p.write_msr(MSR_IA32_PEBS_ENABLE, 1).unwrap();
        let s = sample();
        // The DS area unmapped.
        let mut m = Pages::default();
        assert_eq!(
            p.overflow(&mut m, Counter::Gp(0), false, 0, &s),
            Err(Dropped::DsArea(DS))
        );
        assert!(m.bytes.is_empty());
        // A full buffer: nothing written, the index stays.
        let mut m = ds_area(32);
        m.put(DS + ds::INDEX, BUF + 4096 - 16);
        assert_eq!(
            p.overflow(&mut m, Counter::Gp(0), false, 0, &s),
            Err(Dropped::Full)
        );
        assert_eq!(m.get(DS + ds::INDEX), BUF + 4096 - 16);
        // An index near the top of the address space does not wrap.
        m.put(DS + ds::INDEX, u64::MAX - 8);
        m.put(DS + ds::ABSOLUTE_MAXIMUM, u64::MAX);
        assert_eq!(
            p.overflow(&mut m, Counter::Gp(0), false, 0, &s),
            Err(Dropped::Full)
        );
        // A buffer that is not RAM.
        let mut m = ds_area(32);
        m.put(DS + ds::BUFFER_BASE, 0x30_0000);
        m.put(DS + ds::INDEX, 0x30_0000);
        m.put(DS + ds::ABSOLUTE_MAXIMUM, 0x30_1000);
        assert_eq!(
            p.overflow(&mut m, Counter::Gp(0), false, 0, &s),
            Err(Dropped::Buffer(0x30_0000))
        );
        assert_eq!(m.get(DS + ds::INDEX), 0x30_0000);
    }

    #[test]
    fn saved_registers_come_back_as_host_writes_kvm_would_take() {
        let mut p = on();
        p.write_msr(MSR_IA32_PEBS_ENABLE, 0b1).unwrap();
        p.write_msr(MSR_PEBS_DATA_CFG, 0xf).unwrap();
        let saved = p.save();
        let mut q = Pebs::new(true, 8, 4);
        q.load(&saved);
        assert_eq!(q, p);
        // Values with bits this vCPU reserves are dropped whole (not
        // masked), as KVM refuses them; the others load.
        let mut small = Pebs::new(true, 2, 3);
        small.load(&PebsRegs {
            enable: 0xff,
            data_cfg: 0xffff,
            ds_area: 0x8000_0000_0000,
        });
        assert_eq!(small.save(), PebsRegs::default());
        small.load(&PebsRegs {
            enable: 0b10,
            data_cfg: 0x3,
            ds_area: 0x1000,
        });
        assert_eq!(
            small.save(),
            PebsRegs {
                enable: 0b10,
                data_cfg: 0x3,
                ds_area: 0x1000
            }
        );
        let mut off = Pebs::new(false, 8, 4);
        off.load(&saved);
        assert_eq!(off.save(), PebsRegs::default());
    }
}
