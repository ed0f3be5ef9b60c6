//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on matrix=off timeout=120 needs=pmu,pebs
//!
//! scripts/bench-pmu.sh's PEBS case: the same workload as plugin-workload
//! (`guest::workload`) with a PEBS counter sampling it throughout: PMC0
//! counts instructions retired at every CPL with its PEBS bit set, from
//! `-PERIOD`, and each overflow writes a basic record (32 bytes) into a
//! DS buffer big enough for the whole run and reloads the counter from
//! the DS area's reset value, as `perf record -e instructions:p -c
//! PERIOD` would have it (no PMI: the interrupt threshold is past the
//! buffer's end). Fixed counter 0 counts the same instructions without
//! PEBS. Prints the checksum, the records written and the instructions
//! counted, and checks that every record is a basic record of PMC0 and
//! that the records' periods plus what PMC0 counted after the last one
//! are fixed counter 0's count, exactly (rustkvm has no skid; hardware
//! would differ by its skid per record). SKIPs without PEBS. Not part of
//! the matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pebs-workload", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch::set_lapic_reg;
    use guest::x86_pmu::{
        pebs_format, rd, wr, DATA_CFG, DS_AREA, EN, EVTSEL0, FIXED_CTR0, FIXED_CTR_CTRL,
        GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS, LVTPC, LVT_MASKED, OS, PEBS_ENABLE, PMC0,
        PMC0_FULL, USR,
    };

    /// Instructions between records.
    const PERIOD: u64 = 100_000;
    /// Instructions retired.
    const INSNS: u64 = 0xc0;
    /// A basic record's size.
    const RECORD: usize = 32;
    /// 48-bit counters.
    const MASK: u64 = (1 << 48) - 1;
    /// Room for 65 536 basic records (the workload needs about 59 000).
    const WORDS: usize = 65_536 * RECORD / 8;

    #[repr(C, align(4096))]
    struct Ds([u64; 512]);
    #[repr(C, align(4096))]
    struct Buf([u64; WORDS]);
    static mut DS: Ds = Ds([0; 512]);
    static mut BUF: Buf = Buf([0; WORDS]);

    if pebs_format() == 0 {
        t.skip("x86-pebs-workload", "no PERF_CAPABILITIES.PEBS_FORMAT");
        return;
    }
    let (ds, buf) = ((&raw mut DS).cast::<u64>(), (&raw mut BUF).cast::<u64>());
    let base = buf as u64;
    let end = base + (WORDS * 8) as u64;
    // SAFETY: one vCPU writes its own static DS page before PEBS is on.
    unsafe {
        ds.add(4).write_volatile(base); // pebs_buffer_base
        ds.add(5).write_volatile(base); // pebs_index
        ds.add(6).write_volatile(end); // pebs_absolute_maximum
        ds.add(7).write_volatile(end + RECORD as u64); // interrupt threshold: never
        ds.add(8).write_volatile(MASK + 1 - PERIOD); // pebs_event_reset[0]
    }
    set_lapic_reg(LVTPC, LVT_MASKED);
    wr(GLOBAL_CTRL, 0);
    wr(DS_AREA, ds as u64);
    wr(DATA_CFG, 0);
    wr(EVTSEL0, EN | OS | USR | INSNS);
    wr(PMC0_FULL, MASK + 1 - PERIOD);
    wr(PEBS_ENABLE, 1);
    wr(FIXED_CTR_CTRL, 0b11); // fixed counter 0: OS and USR, no PMI
    wr(FIXED_CTR0, 0);
    wr(GLOBAL_OVF_CTRL, rd(GLOBAL_STATUS));
    wr(GLOBAL_CTRL, 1 | 1 << 32);
    let sum = guest::workload::run(10_000);
    wr(GLOBAL_CTRL, 0);
    wr(PEBS_ENABLE, 0);
    let left = rd(PMC0);
    let fixed = rd(FIXED_CTR0);
    // SAFETY: PEBS is off: nothing writes the DS page or the buffer now.
    let written = unsafe { ds.add(5).read_volatile() } - base;
    let records = written as usize / RECORD;
    t.measure("checksum", format_args!("{sum:#x}"));
    t.measure("records", format_args!("{records}"));
    // The records' periods and the count since the last one.
    let counted = records as u64 * PERIOD + (left.wrapping_sub(MASK + 1 - PERIOD) & MASK);
    t.measure("instructions", format_args!("{counted}"));
    t.eq("records-and-count.fixed-counter-0", counted, fixed);
    t.check(
        "filled",
        records > 0 && written.is_multiple_of(RECORD as u64) && base + written < end,
        format_args!("{written} bytes written"),
    );
    // Every record: format 0 with size 32, counter 0 applicable.
    let bad = (0..records)
        // SAFETY: i < records: words the PEBS assist wrote, inside BUF.
        .find(|&i| unsafe { (buf.add(i * 4).read(), buf.add(i * 4 + 2).read()) } != (32 << 48, 1));
    t.check(
        "records.basic-pmc0",
        bad.is_none(),
        format_args!("record {bad:?}"),
    );
}
