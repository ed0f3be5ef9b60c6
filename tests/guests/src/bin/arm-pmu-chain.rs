//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG's PMU has no INST_RETIRED or CHAIN)
//!
//! CHAIN (event 0x1E) as KVM implements it (`kvm_pmu_counter_can_chain`,
//! `kvm_pmu_perf_overflow`): odd counter 2n+1 counts the 32-bit overflows
//! of even counter 2n — only while the odd counter is enabled and its event
//! is CHAIN, and not once the even counter overflows at 64 bits
//! (PMCR_EL0.LP, PMUv3p5); an odd counter that wraps sets its own PMOVSSET
//! bit. An instruction counter started 256 below a 32-bit wrap runs a 2000
//! instruction loop for each case. SKIPs without INST_RETIRED or CHAIN.
//! Spec: Arm ARM D13 (CHAIN); Linux arch/arm64/kvm/pmu-emul.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-chain", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::{read_sysreg, write_sysreg};
    const INST_RETIRED: u64 = 0x08;
    const SW_INCR: u64 = 0x00;
    const CHAIN: u64 = 0x1e;
    const E: u64 = 1;
    /// PMCR_EL0.LP: event counters overflow at 64 bits.
    const LP: u64 = 1 << 7;

    let ceid = read_sysreg!("pmceid0_el0");
    if ceid & (1 << INST_RETIRED) == 0 || ceid & (1 << CHAIN) == 0 {
        // Stock TCG has no CHAIN (and INST_RETIRED only with -icount).
        t.skip("arm-pmu-chain", "PMCEID0: no INST_RETIRED or CHAIN");
        return;
    }
    // Run 2000 instructions with counters `enable` counting; returns
    // (counter 0, counter 1, PMOVSSET & 3).
    let run = |pmcr: u64, odd_event: u64, odd_start: u64, enable: u64| {
        write_sysreg!("pmcntenclr_el0", u64::MAX);
        write_sysreg!("pmovsclr_el0", u64::MAX);
        write_sysreg!("pmcr_el0", pmcr);
        write_sysreg!("pmevtyper0_el0", INST_RETIRED);
        write_sysreg!("pmevtyper1_el0", odd_event);
        write_sysreg!("pmevcntr0_el0", 0xffff_ff00);
        write_sysreg!("pmevcntr1_el0", odd_start);
        guest::arch::pmu_counted_loop(enable, 1000);
        (
            read_sysreg!("pmevcntr0_el0"),
            read_sysreg!("pmevcntr1_el0"),
            read_sysreg!("pmovsset_el0") & 3,
        )
    };

    let (c0, c1, ovs) = run(E, CHAIN, 0, 0b11);
    t.check(
        "chain.even-wrapped",
        c0 & 0xffff_ffff < 0x1000,
        format_args!("{c0:#x}"),
    );
    t.eq("chain.odd-counted-the-overflow", c1, 1);
    t.eq("chain.ovs-even-only", ovs, 0b01);

    let (_, c1, ovs) = run(E, CHAIN, 0, 0b01);
    t.eq("odd-disabled.no-chain", c1, 0);
    t.eq("odd-disabled.even-overflowed", ovs, 0b01);

    let (_, c1, _) = run(E, SW_INCR, 0, 0b11);
    t.eq("odd-not-chain.no-chain", c1, 0);

    let (c0, c1, ovs) = run(E | LP, CHAIN, 0, 0b11);
    t.check(
        "lp.even-does-not-wrap",
        c0 > 0xffff_ffff,
        format_args!("{c0:#x}"),
    );
    t.eq("lp.no-chain", c1, 0);
    t.eq("lp.no-overflow", ovs, 0);

    let (_, c1, ovs) = run(E, CHAIN, 0xffff_ffff, 0b11);
    t.eq("odd-wraps.value", c1 & 0xffff_ffff, 0);
    t.eq("odd-wraps.ovs-both", ovs, 0b11);
    write_sysreg!("pmovsclr_el0", u64::MAX);
}
