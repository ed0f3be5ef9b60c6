//! rustkvm-test: arch=aarch64 compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//!   (stock TCG counts no LD_RETIRED/ST_RETIRED/EXC_TAKEN)
//! rustkvm-expect-skip: kvm mops,sve
//!   (a host CPU may lack FEAT_MOPS or SVE; `-cpu max` has both)
//!
//! The rest of the exactly counted events: LD_RETIRED (0x06),
//! ST_RETIRED (0x07) and EXC_TAKEN (0x09), advertised in PMCEID0. A loop
//! of n iterations with one load, one store, one atomic add (both) and one
//! load pair counts exactly 3n loads, 2n stores and 4n memory accesses; a
//! loop of a memory copy and a memory set (FEAT_MOPS: prologue, main and
//! epilogue each) counts 3n loads, 6n stores and 6n accesses; a loop of
//! SVE's contiguous load and store, its vector load and store and a
//! prefetch counts 2n loads, 2n stores and 4n accesses (a prefetch is no
//! load, as PRFM in the first loop's group). A run of EL0 code is one
//! exception (its SVC) taken from EL0, a caught BRK one taken from EL1,
//! filtered by PMEVTYPER's P and U bits (on KVM at least those: the
//! exceptions to the host hypervisor count too). SKIPs where the events
//! are not counted (stock TCG).
//! Spec: Arm ARM D13 (common events), K3 (PMU event descriptions), C6.2
//! (CPY*, SET*), and the SVE supplement's LD1D, ST1D, LDR, STR, PRFD.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-pmu-events", "aarch64 only");
}

#[cfg(target_arch = "aarch64")]
extern "C" fn nothing(x: u64) -> u64 {
    x
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use core::arch::asm;
    use guest::arch::run_el0;
    use guest::{read_sysreg, write_sysreg, Tolerance};
    const LD_RETIRED: u64 = 0x06;
    const ST_RETIRED: u64 = 0x07;
    const EXC_TAKEN: u64 = 0x09;
    const MEM_ACCESS: u64 = 0x13;
    /// PMEVTYPER: P (not at EL1), U (not at EL0).
    const P: u64 = 1 << 31;
    const U: u64 = 1 << 30;
    const E: u64 = 1;
    /// What hardware may add around the measured code.
    const COUNT: Tolerance = Tolerance { hardware: 16 };

    let ceid = read_sysreg!("pmceid0_el0");
    let wanted = (1 << LD_RETIRED) | (1 << ST_RETIRED) | (1 << EXC_TAKEN);
    if ceid & wanted != wanted {
        t.skip(
            "arm-pmu-events",
            "PMCEID0: no LD_RETIRED, ST_RETIRED, EXC_TAKEN",
        );
        return;
    }
    guest::arch::pmu_clear();
    write_sysreg!("pmcr_el0", E);
    write_sysreg!("pmevtyper0_el0", LD_RETIRED);
    write_sysreg!("pmevtyper1_el0", ST_RETIRED);
    write_sysreg!("pmevtyper2_el0", MEM_ACCESS);

    let mut slots = [0u64; 4];
    let names = ["loop.loads", "loop.stores", "loop.mem-access"];
    check_ldst(t, names, [3, 2, 4], &[1, 1000, 100_000], COUNT, |n| {
        // SAFETY: loads and stores to a local array; PMU enables at EL1.
        unsafe {
            asm!(
                "msr pmcntenset_el0, {mask}",
                "mov {i}, {n}",
                "2:",
                "ldr {a}, [{p}]",           // load
                "str {a}, [{p}, #8]",       // store
                ".arch_extension lse",
                "ldadd {one}, {b}, [{q}]",  // atomic: load and store
                "ldp {a}, {b}, [{p}]",      // load (one instruction)
                "subs {i}, {i}, #1",
                "b.ne 2b",
                "msr pmcntenclr_el0, {mask}",
                mask = in(reg) 0b111u64,
                n = in(reg) n,
                p = in(reg) slots.as_mut_ptr(),
                q = in(reg) slots.as_mut_ptr().wrapping_add(2),
                one = in(reg) 1u64,
                i = out(reg) _,
                a = out(reg) _,
                b = out(reg) _,
                options(nostack),
            );
        }
    });
    mops(t, COUNT);
    sve(t, COUNT);

    // Exceptions: counter 3 any EL, counter 4 only from EL0 (P), counter 5
    // only from EL1 (U).
    write_sysreg!("pmevtyper3_el0", EXC_TAKEN);
    write_sysreg!("pmevtyper4_el0", P | EXC_TAKEN);
    write_sysreg!("pmevtyper5_el0", U | EXC_TAKEN);
    write_sysreg!("pmevcntr3_el0", 0);
    write_sysreg!("pmevcntr4_el0", 0);
    write_sysreg!("pmevcntr5_el0", 0);
    write_sysreg!("pmcntenset_el0", 0b111000);
    for i in 0..5 {
        let r = run_el0(nothing, i);
        t.eq("el0-run", r.ok(), Some(i));
    }
    for _ in 0..3 {
        let f = guest::arch::brk();
        t.check("brk-caught", f.is_some(), format_args!("BRK did not trap"));
    }
    write_sysreg!("pmcntenclr_el0", 0b111000);
    // On KVM the exceptions taken to the host hypervisor while the guest
    // runs (its interrupts, its traps: a PMU access under MDCR_EL2.TPM)
    // are taken from the guest's EL and counted too (measured nested: 224
    // for 8): at least the guest's own there, exactly them elsewhere.
    let exc = |t: &mut Test, name: &str, got: u64, want: u64| {
        if guest::backend() == Some(guest::Backend::Kvm) {
            t.check(
                name,
                got >= want,
                format_args!("got {got}, want at least {want}"),
            );
        } else {
            t.count(name, got, want, Tolerance::EXACT);
        }
    };
    exc(t, "exc.all", read_sysreg!("pmevcntr3_el0"), 8);
    exc(t, "exc.from-el0", read_sysreg!("pmevcntr4_el0"), 5);
    exc(t, "exc.from-el1", read_sysreg!("pmevcntr5_el0"), 3);
}

/// Counters 0–2 (LD_RETIRED, ST_RETIRED, MEM_ACCESS, as `main` set them)
/// over `run(n)` for each n of `ns`, each from 0, checked as `names`
/// against `per` (loads, stores, accesses) times n. `run` enables them
/// with `msr pmcntenset_el0` (mask 0b111) and disables them with `msr
/// pmcntenclr_el0` around only the code it counts.
#[cfg(target_arch = "aarch64")]
fn check_ldst(
    t: &mut Test,
    names: [&str; 3],
    per: [u64; 3],
    ns: &[u64],
    tol: guest::Tolerance,
    mut run: impl FnMut(u64),
) {
    use guest::{read_sysreg, write_sysreg};
    for &n in ns {
        for i in 0..3 {
            // PMEVCNTRn by PMSELR (the registers are not indexable).
            write_sysreg!("pmselr_el0", i);
            write_sysreg!("pmxevcntr_el0", 0);
        }
        run(n);
        let got = [
            read_sysreg!("pmevcntr0_el0"),
            read_sysreg!("pmevcntr1_el0"),
            read_sysreg!("pmevcntr2_el0"),
        ];
        for k in 0..3 {
            t.count(names[k], got[k], per[k] * n, tol);
        }
    }
}

/// FEAT_MOPS: CPYF{P,M,E} each load and store, SET{P,M,E} each store.
#[cfg(target_arch = "aarch64")]
fn mops(t: &mut Test, tol: guest::Tolerance) {
    use core::arch::asm;
    use guest::read_sysreg;
    // ID_AA64ISAR2_EL1.MOPS, bits [19:16].
    if (read_sysreg!("s3_0_c0_c6_2") >> 16) & 0xf == 0 {
        t.skip("mops", "ID_AA64ISAR2_EL1: no FEAT_MOPS");
        return;
    }
    let src = [1u8; 64];
    let mut dst = [0u8; 64];
    let names = ["mops.loads", "mops.stores", "mops.mem-access"];
    check_ldst(t, names, [3, 6, 6], &[1, 1000], tol, |n| {
        // SAFETY: copies and sets within the two local arrays (64
        // bytes each); MOPS is enabled at EL1 without EL2.
        unsafe {
            asm!(
                ".arch_extension mops",
                "mov {i}, {n}",
                "msr pmcntenset_el0, {mask}",
                "2:",
                "mov {d}, {dst}",
                "mov {s}, {src}",
                "mov {c}, #64",
                "cpyfp [{d}]!, [{s}]!, {c}!",
                "cpyfm [{d}]!, [{s}]!, {c}!",
                "cpyfe [{d}]!, [{s}]!, {c}!",
                "mov {d}, {dst}",
                "mov {c}, #64",
                "setp [{d}]!, {c}!, {v}",
                "setm [{d}]!, {c}!, {v}",
                "sete [{d}]!, {c}!, {v}",
                "subs {i}, {i}, #1",
                "b.ne 2b",
                "msr pmcntenclr_el0, {mask}",
                mask = in(reg) 0b111u64,
                n = in(reg) n,
                dst = in(reg) dst.as_mut_ptr(),
                src = in(reg) src.as_ptr(),
                v = in(reg) 7u64,
                i = out(reg) _,
                d = out(reg) _,
                s = out(reg) _,
                c = out(reg) _,
                options(nostack),
            );
        }
    });
    t.eq("mops.set", dst[63], 7);
}

/// SVE: LD1D and LDR (vector) load, ST1D and STR store, PRFD neither.
#[cfg(target_arch = "aarch64")]
fn sve(t: &mut Test, tol: guest::Tolerance) {
    use core::arch::asm;
    use guest::{read_sysreg, write_sysreg};
    // ID_AA64PFR0_EL1.SVE, bits [35:32].
    if (read_sysreg!("id_aa64pfr0_el1") >> 32) & 0xf == 0 {
        t.skip("sve", "ID_AA64PFR0_EL1: no SVE");
        return;
    }
    // CPACR_EL1.ZEN = 0b11 beside FPEN, then 128-bit vectors (ZCR_EL1.LEN
    // 0), so that the buffers below hold any vector.
    write_sysreg!("cpacr_el1", (3 << 20) | (3 << 16));
    // SAFETY: an ISB after the CPACR_EL1 write.
    unsafe { asm!("isb", options(nostack)) };
    write_sysreg!("s3_0_c1_c2_0", 0);
    // SAFETY: an ISB after the ZCR_EL1 write.
    unsafe { asm!("isb", options(nostack)) };
    let mut buf: [u64; 8] = core::array::from_fn(|i| i as u64 + 1);
    let names = ["sve.loads", "sve.stores", "sve.mem-access"];
    check_ldst(t, names, [2, 2, 4], &[1, 1000], tol, |n| {
        // SAFETY: 16-byte vectors loaded from and stored to the local
        // array (64 bytes); SVE is enabled at EL1 above.
        unsafe {
            asm!(
                ".arch_extension sve",
                "ptrue p0.d",
                "mov {i}, {n}",
                "msr pmcntenset_el0, {mask}",
                "2:",
                "ld1d {{z0.d}}, p0/z, [{p}]",
                "st1d {{z0.d}}, p0, [{p}, #1, mul vl]",
                "ldr z1, [{p}, #2, mul vl]",
                "str z1, [{p}, #3, mul vl]",
                "prfd pldl1keep, p0, [{p}]",
                "subs {i}, {i}, #1",
                "b.ne 2b",
                "msr pmcntenclr_el0, {mask}",
                mask = in(reg) 0b111u64,
                n = in(reg) n,
                p = in(reg) buf.as_mut_ptr(),
                i = out(reg) _,
                out("v0") _,
                out("v1") _,
                out("p0") _,
                options(nostack),
            );
        }
    });
    t.eq("sve.stored", (buf[2], buf[3], buf[6], buf[7]), (1, 2, 5, 6));
    write_sysreg!("cpacr_el1", 3 << 20);
}
