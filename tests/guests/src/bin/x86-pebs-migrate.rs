//! rustkvm-test: arch=x86_64 cpu=max,vendor=GenuineIntel,pmu=on compare=off needs=pmu,pebs matrix=off
//!
//! PEBS across savevm/loadvm or migration: IA32_PEBS_ENABLE,
//! MSR_PEBS_DATA_CFG and IA32_DS_AREA set before the move must read back
//! the same after it, and a PEBS counter armed before the move must write
//! its record into the DS buffer on the destination. Not part of the
//! matrix.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pebs-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch::{self, rdmsr, set_lapic_reg, wrmsr};
    use guest::println;
    use guest::x86_pmu::{
        pebs_format, DATA_CFG, DS_AREA, EN, EVTSEL0, GLOBAL_CTRL, GLOBAL_STATUS, LVTPC, LVT_MASKED,
        OS, PEBS_ENABLE, PMC0_FULL,
    };

    const MASK: u64 = (1 << 48) - 1;
    /// COM1's line status register; bit 0: a byte arrived.
    const COM1_LSR: u32 = 0x3fd;

    #[repr(C, align(4096))]
    struct Page([u64; 512]);
    static mut DS: Page = Page([0; 512]);
    static mut BUF: Page = Page([0; 512]);

    if pebs_format() == 0 {
        t.skip("x86-pebs-migrate", "no PERF_CAPABILITIES.PEBS_FORMAT");
        return;
    }
    let w = |i, v| wrmsr(i, v).expect("PEBS MSR");
    let r = |i| rdmsr(i).expect("PEBS MSR");
    let (ds, buf) = ((&raw mut DS).cast::<u64>(), (&raw mut BUF).cast::<u64>());
    // SAFETY: one vCPU writes its own static page.
    unsafe {
        let base = buf as u64;
        ds.add(4).write_volatile(base);
        ds.add(5).write_volatile(base);
        ds.add(6).write_volatile(base + 4096);
        ds.add(7).write_volatile(base + 32);
    }
    set_lapic_reg(LVTPC, LVT_MASKED);
    w(GLOBAL_CTRL, 0);
    w(DS_AREA, ds as u64);
    w(DATA_CFG, 0x2 | 3 << 24);
    w(EVTSEL0, EN | OS | 0xc0);
    // Far from the wrap: the wait loop below must not reach it.
    w(PMC0_FULL, MASK + 1 - 1_000_000_000_000);
    w(PEBS_ENABLE, 1);
    println!("ready");
    // Wait for the host's byte with PMC0 counting, then count to the wrap.
    // SAFETY: WRMSRs of GLOBAL_CTRL and PMC0, a read of COM1's status.
    unsafe {
        asm!(
            "mov ecx, 0x38f",
            "mov eax, 1",
            "xor edx, edx",
            "wrmsr",
            "mov edx, {lsr:e}",
            "2:",
            "in al, dx",
            "test al, 1",
            "jz 2b",
            lsr = in(reg) COM1_LSR,
            out("rax") _, out("rcx") _, out("rdx") _,
            options(nostack),
        );
    }
    let _ = arch::getc();
    t.eq("after.ds-area", r(DS_AREA), ds as u64);
    t.eq("after.data-cfg", r(DATA_CFG), 0x2 | 3 << 24);
    t.eq("after.pebs-enable", r(PEBS_ENABLE), 1);
    // 3 from the wrap: the record comes on the destination.
    w(PMC0_FULL, MASK + 1 - 3);
    for i in 0..10u64 {
        core::hint::black_box(i);
    }
    w(GLOBAL_CTRL, 0);
    // SAFETY: reads of the static pages the PEBS assist wrote.
    let (index, size) = unsafe { (ds.add(5).read_volatile(), buf.read_volatile() >> 48) };
    t.eq("after.record-written", index - buf as u64, 32);
    t.eq("after.record-size", size, 32);
    t.eq("after.status", r(GLOBAL_STATUS) >> 62 & 1, 1);
    w(PEBS_ENABLE, 0);
    w(EVTSEL0, 0);
}
