//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on compare=off needs=pmu,pebs
//! rustkvm-expect: tcg=skip kvm-nested=skip
//! (kvm-nested: an Intel-vendor PMU on an AMD host's KVM, which zeroes CPUID
//! 0xA where the host CPU has no ARCH_PERFMON: arch/x86/kvm/cpuid.c,
//! __do_cpuid_func, case 0xa.)
//!   (stock TCG has no x86 PMU, so no PEBS)
//!
//! kvm-unit-tests `pmu_pebs`'s sweep, as its rules say (x86/pmu_pebs.c;
//! that suite cannot be fetched here, so its loop is written out again):
//! for each counter start value (0, 0xfffffffffff0, 0xfffffffffffe,
//! 0xffffffffffff), each fixed counter (with the baseline), each GP counter
//! counting its architectural event (branches, branch misses, reference
//! cycles, cycles, instructions, bus cycles, LLC references, LLC misses,
//! one per counter) and the fixed counters with every other GP counter at
//! once, run a short workload of branches and CPUIDs with PEBS on, then:
//! no GLOBAL_STATUS_BUFFER_OVF status means an empty buffer; with it, a non-empty buffer
//! up to the interrupt threshold (one record) whose every record names a
//! counter of the mask, has the expected size and says which groups it
//! holds, with its LBR entries empty (LBR is off). Non-adaptive first;
//! with the baseline, again for each MSR_PEBS_DATA_CFG 0x0..0xf (with all
//! 32 LBR entries when the LBR group is on), adaptive and "ignored
//! adaptive" (DATA_CFG set, the counters not adaptive: basic records).
//! Odd counters stop with PEBS_ENABLE cleared before GLOBAL_CTRL. LVTPC
//! stays masked; the buffer-full interrupt is read in GLOBAL_STATUS, which
//! is all pmu_pebs reads too. One check per start value and pass, naming
//! the first case that failed.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pebs-sweep", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod sweep {
    use core::arch::asm;
    use guest::arch::{self, set_lapic_reg};
    use guest::x86_pmu::PebsPage::{Buffer, Ds};
    use guest::x86_pmu::{
        pebs_format, rd, wr, DATA_CFG, DS_AREA, EN, EVTSEL0, EVTSEL_ADAPTIVE, FIXED_CTR0,
        FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS, GLOBAL_STATUS_BUFFER_OVF,
        LVTPC, LVT_MASKED, OS, PEBS_BASELINE, PEBS_ENABLE, PERF_CAPABILITIES, PMC0_FULL, USR,
    };
    use guest::Test;

    /// IA32_MISC_ENABLE and its PEBS_UNAVAILABLE bit (SDM vol. 4, table 2-2).
    const MISC_ENABLE: u32 = 0x1a0;
    const PEBS_UNAVAILABLE: u64 = 1 << 12;
    /// DATA_CFG's groups: memory info, GPRs, XMM, LBR; the LBR count field.
    const CFG_MEMINFO: u64 = 1 << 0;
    const CFG_GPRS: u64 = 1 << 1;
    const CFG_XMMS: u64 = 1 << 2;
    const CFG_LBRS: u64 = 1 << 3;
    const CFG_LBR_SHIFT: u32 = 24;
    /// LBR entries a record with the LBR group carries (pmu_pebs's 32).
    const LBR_ENTRIES: u64 = 32;
    /// The architectural events, one per GP counter, in pmu_pebs's order.
    const EVENTS: [u64; 8] = [0xc4, 0xc5, 0x300, 0x3c, 0xc0, 0x13c, 0x4f2e, 0x412e];
    /// Counter start values: no overflow, none, two left, one left.
    const STARTS: [u64; 4] = [0, 0xffff_ffff_fff0, 0xffff_ffff_fffe, 0xffff_ffff_ffff];
    /// Each start value's checks: basic records, adaptive, ignored adaptive.
    const NAMES: [[&str; 3]; 4] = [
        [
            "start-0.basic",
            "start-0.adaptive",
            "start-0.ignored-adaptive",
        ],
        [
            "start-fff0.basic",
            "start-fff0.adaptive",
            "start-fff0.ignored-adaptive",
        ],
        [
            "start-fffe.basic",
            "start-fffe.adaptive",
            "start-fffe.ignored-adaptive",
        ],
        [
            "start-ffff.basic",
            "start-ffff.adaptive",
            "start-ffff.ignored-adaptive",
        ],
    ];

    /// Cases whose buffer held records (each verified), and records seen.
    static mut WITH_RECORDS: (u64, u64) = (0, 0);

    /// A record's size for DATA_CFG `cfg`, adaptive or not.
    fn record_size(cfg: u64, adaptive: bool) -> u64 {
        let mut size = 32;
        if adaptive {
            size += if cfg & CFG_MEMINFO != 0 { 32 } else { 0 };
            size += if cfg & CFG_GPRS != 0 { 144 } else { 0 };
            size += if cfg & CFG_XMMS != 0 { 256 } else { 0 };
            size += if cfg & CFG_LBRS != 0 {
                LBR_ENTRIES * 24
            } else {
                0
            };
        }
        size
    }

    /// The counters the vCPU has: (GP counters swept, fixed counters).
    fn shape() -> (usize, usize) {
        let a = arch::cpuid(0xa, 0);
        let gp = ((a[0] >> 8) & 0xff) as usize;
        (gp.min(EVENTS.len()), (a[3] & 0x1f) as usize)
    }

    /// pmu_pebs's reset_pebs: buffers, PEBS and every counter cleared.
    fn reset(baseline: bool, (gp, fixed): (usize, usize)) {
        Ds.clear();
        Buffer.clear();
        wr(PEBS_ENABLE, 0);
        wr(DS_AREA, 0);
        if baseline {
            wr(DATA_CFG, 0);
        }
        wr(GLOBAL_CTRL, 0);
        wr(GLOBAL_OVF_CTRL, rd(GLOBAL_STATUS));
        for i in 0..gp as u32 {
            wr(EVTSEL0 + i, 0);
            wr(PMC0_FULL + i, 0);
        }
        wr(FIXED_CTR_CTRL, 0);
        for i in 0..fixed as u32 {
            wr(FIXED_CTR0 + i, 0);
        }
    }

    /// pmu_pebs's pebs_enable: the DS area, the counters of `mask` from
    /// `start`, then PEBS_ENABLE and GLOBAL_CTRL.
    fn enable(mask: u64, cfg: u64, adaptive: bool, baseline: bool, start: u64, gp: usize) {
        if baseline {
            wr(DATA_CFG, cfg);
        }
        let base = Buffer.addr();
        Ds.set(4, base); // pebs_buffer_base
        Ds.set(5, base); // pebs_index
        Ds.set(6, base + 4096); // pebs_absolute_maximum
        Ds.set(7, base + record_size(cfg, adaptive)); // interrupt threshold
        let mut fixed_ctrl = 0;
        for i in 0..3u32 {
            if mask & 1 << (32 + i) != 0 {
                wr(FIXED_CTR0 + i, start);
                fixed_ctrl |= 0xb << (4 * i) | u64::from(adaptive) << (32 + 4 * i);
            }
        }
        if fixed_ctrl != 0 {
            wr(FIXED_CTR_CTRL, fixed_ctrl);
        }
        for (i, event) in EVENTS.iter().enumerate().take(gp) {
            if mask & 1 << i != 0 {
                let a = if adaptive { EVTSEL_ADAPTIVE } else { 0 };
                wr(EVTSEL0 + i as u32, EN | OS | USR | event | a);
                wr(PMC0_FULL + i as u32, start);
            }
        }
        wr(DS_AREA, Ds.addr());
        wr(PEBS_ENABLE, mask);
        wr(GLOBAL_CTRL, mask);
    }

    /// pmu_pebs's workload: eight untaken branches, six CPUIDs.
    fn workload() {
        // SAFETY: register-only instructions and CPUID: EAX, ECX and EDX
        // are declared clobbered, RBX (which LLVM reserves) is saved and
        // restored on the stack, and no branch is taken out of the block.
        unsafe {
            asm!(
                "push rbx",
                "mov eax, 0",
                "cmp eax, 0",
                "jne 2f",
                "jne 2f",
                "jne 2f",
                "jne 2f",
                "mov eax, 0",
                "cmp eax, 0",
                "jne 2f",
                "jne 2f",
                "jne 2f",
                "jne 2f",
                "mov eax, 0xa",
                "cpuid",
                "mov eax, 0xa",
                "cpuid",
                "mov eax, 0xa",
                "cpuid",
                "mov eax, 0xa",
                "cpuid",
                "mov eax, 0xa",
                "cpuid",
                "mov eax, 0xa",
                "cpuid",
                "2:",
                "pop rbx",
                out("eax") _,
                out("ecx") _,
                out("edx") _,
            );
        }
    }

    /// pmu_pebs's check_pebs_records: None if the buffer is as the status
    /// says, else what is wrong.
    fn verify(mask: u64, cfg: u64, adaptive: bool) -> Option<&'static str> {
        let base = Buffer.addr();
        let index = Ds.word(5);
        let empty = index == base && Buffer.word(0) == 0;
        if rd(GLOBAL_STATUS) & GLOBAL_STATUS_BUFFER_OVF == 0 {
            return (!empty).then_some("records without GLOBAL_STATUS_BUFFER_OVF");
        }
        if empty {
            return Some("GLOBAL_STATUS_BUFFER_OVF without records");
        }
        if index < Ds.word(7) {
            return Some("GLOBAL_STATUS_BUFFER_OVF below the threshold");
        }
        let size = record_size(cfg, adaptive);
        let groups = if adaptive { cfg } else { 0 };
        let mut at = 0;
        while base + at < index {
            let w = (at / 8) as usize;
            let format_size = Buffer.word(w);
            if Buffer.word(w + 2) & mask == 0 {
                return Some("a record names no counter of the mask");
            }
            if format_size >> 48 != size {
                return Some("a record's size");
            }
            if format_size & ((1 << 48) - 1) != groups {
                return Some("a record's groups");
            }
            if adaptive && cfg & CFG_LBRS != 0 {
                let lbrs = w + (record_size(cfg & !CFG_LBRS, true) / 8) as usize;
                if (0..LBR_ENTRIES as usize)
                    .any(|i| Buffer.word(lbrs + 3 * i) | Buffer.word(lbrs + 3 * i + 1) != 0)
                {
                    return Some("an LBR entry not empty (LBR is off)");
                }
            }
            at += size;
            // SAFETY: one vCPU, no interrupt handler touches it.
            unsafe { WITH_RECORDS.1 += 1 };
        }
        // SAFETY: as above.
        unsafe { WITH_RECORDS.0 += 1 };
        None
    }

    /// pmu_pebs's check_pebs_counters for one start value and pass: every
    /// counter alone, then the multiple; the first failure.
    fn sweep(
        start: u64,
        cfg: u64,
        adaptive: bool,
        baseline: bool,
        shape: (usize, usize),
    ) -> Option<(u64, &'static str)> {
        let (gp, fixed) = shape;
        let mut cases: [u64; 12] = [0; 12];
        let mut n = 0;
        if baseline {
            for i in 0..fixed {
                cases[n] = 1 << (32 + i);
                n += 1;
            }
        }
        for i in 0..gp {
            cases[n] = 1 << i;
            n += 1;
        }
        let mut multiple = 0;
        if baseline {
            for i in 0..fixed {
                multiple |= 1 << (32 + i);
            }
        }
        for i in (0..gp).step_by(2) {
            multiple |= 1 << i;
        }
        cases[n] = multiple;
        n += 1;
        for (k, &mask) in cases[..n].iter().enumerate() {
            reset(baseline, shape);
            enable(mask, cfg, adaptive, baseline, start, gp);
            workload();
            // pebs_disable: odd single counters clear PEBS_ENABLE first.
            let single = k + 1 < n;
            if single && (mask.trailing_zeros() % 32) % 2 == 1 {
                wr(PEBS_ENABLE, 0);
            }
            wr(GLOBAL_CTRL, 0);
            if let Some(why) = verify(mask, cfg, adaptive) {
                return Some((mask, why));
            }
        }
        None
    }

    pub fn main(t: &mut Test) {
        if pebs_format() == 0 {
            t.skip("x86-pebs-sweep", "no PERF_CAPABILITIES.PEBS_FORMAT");
            return;
        }
        t.check(
            "misc-enable.pebs-available",
            arch::rdmsr(MISC_ENABLE).is_ok_and(|v| v & PEBS_UNAVAILABLE == 0),
            format_args!("IA32_MISC_ENABLE says PEBS_UNAVAILABLE"),
        );
        let baseline = arch::rdmsr(PERF_CAPABILITIES).unwrap_or(0) & PEBS_BASELINE != 0;
        let shape = shape();
        t.measure("gp-fixed", format_args!("{} {}", shape.0, shape.1));
        set_lapic_reg(LVTPC, LVT_MASKED);
        for (start, names) in STARTS.iter().zip(NAMES) {
            let r = sweep(*start, 0, false, baseline, shape);
            let (mask, why) = r.unwrap_or_default();
            t.check(names[0], r.is_none(), format_args!("mask {mask:#x}: {why}"));
            if !baseline {
                continue;
            }
            for (adaptive, name) in [(true, names[1]), (false, names[2])] {
                let first = (0..=0xf).find_map(|j| {
                    let lbrs = if j & CFG_LBRS != 0 {
                        (LBR_ENTRIES - 1) << CFG_LBR_SHIFT
                    } else {
                        0
                    };
                    sweep(*start, j | lbrs, adaptive, baseline, shape)
                        .map(|(m, w)| (j | lbrs, m, w))
                });
                let (cfg, mask, why) = first.unwrap_or_default();
                t.check(
                    name,
                    first.is_none(),
                    format_args!("cfg {cfg:#x}, mask {mask:#x}: {why}"),
                );
            }
        }
        reset(baseline, shape);
        // SAFETY: as in verify.
        let (cases, records) = unsafe { WITH_RECORDS };
        t.measure("cases-with-records", format_args!("{cases}"));
        t.measure("records", format_args!("{records}"));
        t.check(
            "records-were-written",
            cases > 0,
            format_args!("no case wrote a record"),
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    sweep::main(t);
}
