//! rustkvm-test: arch=aarch64 machine=virtualization=on compare=off needs=el2
//! rustkvm-expect-skip: tcg cntpoff.el1-physical-offset
//!   (stock TCG applies CNTPOFF_EL2 only with SCR_EL3.ECVEn, which without
//!   EL3 stays 0: QEMU's gt_phys_raw_cnt_offset)
//!
//! The counters a hypervisor at EL2 offsets for its guest at EL1, as KVM
//! does (`-M virt,virtualization=on`; the guest runtime drops to EL1 over a
//! stub that runs code at EL2): CNTVOFF_EL2 shifts EL1's virtual counter
//! (CNTVCT_EL0 = physical - CNTVOFF_EL2), and with FEAT_ECV and
//! CNTHCTL_EL2.ECV, CNTPOFF_EL2 shifts EL1's physical counter (CNTPCT_EL0
//! = physical - CNTPOFF_EL2; without EL3, SCR_EL3.ECVEn behaves as 1).
//! EL2's own CNTPCT_EL0 is the physical count; each EL1 reading must lie
//! between two EL2 readings around it, shifted by the offset. Both offsets
//! back at 0, EL1 reads the physical count again. KVM/arm64 programs
//! CNTVOFF_EL2 for every guest (`kvm_timer_vcpu_load`) and CNTPOFF_EL2 for
//! a physical counter offset where FEAT_ECV has it (`has_cntpoff`).
//! Spec: Arm ARM D12.1 (the generic timer's offsets), the CNTPCT_EL0 and
//! CNTVCT_EL0 access pseudocode, CNTPOFF_EL2 (FEAT_ECV); Linux
//! arch/arm64/kvm/arch_timer.c.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "aarch64"))]
fn main(t: &mut Test) {
    t.skip("arm-counter-el2", "aarch64 only");
}

/// What runs at EL2 (through `guest::arch::run_el2`).
#[cfg(target_arch = "aarch64")]
mod el2 {
    /// The physical count (CNTPCT_EL0 at EL2: no offset).
    pub extern "C" fn cntpct(_: u64) -> u64 {
        guest::read_sysreg!("cntpct_el0")
    }

    /// CNTVOFF_EL2 := `v`.
    pub extern "C" fn cntvoff(v: u64) -> u64 {
        guest::write_sysreg!("cntvoff_el2", v);
        0
    }

    /// CNTPOFF_EL2 := `v`, and CNTHCTL_EL2.ECV set when `v` is not 0
    /// (EL1PCTEN and EL1PCEN stay set, as the runtime left them).
    pub extern "C" fn cntpoff(v: u64) -> u64 {
        /// CNTHCTL_EL2: EL1PCTEN | EL1PCEN; ECV (bit 12).
        const EL1PC: u64 = 3;
        const ECV: u64 = 1 << 12;
        guest::write_sysreg!("S3_4_C14_C0_6", v); // CNTPOFF_EL2
        guest::write_sysreg!("cnthctl_el2", if v != 0 { EL1PC | ECV } else { EL1PC });
        0
    }
}

#[cfg(target_arch = "aarch64")]
fn main(t: &mut Test) {
    use guest::arch::run_el2;
    use guest::{read_sysreg, Backend};
    /// The offsets (far beyond any count this run reaches).
    const VOFF: u64 = 1 << 40;
    const POFF: u64 = 3 << 40;

    if !guest::arch::has_el2() {
        t.check("el2.present", false, format_args!("entered at EL1: no EL2"));
        return;
    }
    let phys = || run_el2(el2::cntpct, 0).unwrap_or(0);
    // An EL1 reading `el1()` between two EL2 readings, all unshifted by
    // `offset`: whether it lies between them.
    let between = |t: &mut Test, name: &str, offset: u64, el1: &dyn Fn() -> u64| {
        let a = phys();
        let r = el1().wrapping_add(offset);
        let b = phys();
        t.check(
            name,
            a <= r && r <= b,
            format_args!("EL2 {a:#x}, EL1 + offset {r:#x}, EL2 {b:#x}"),
        );
    };
    let cntvct = || read_sysreg!("cntvct_el0");
    let cntpct = || read_sysreg!("cntpct_el0");

    between(t, "cntvoff.zero", 0, &cntvct);
    let _ = run_el2(el2::cntvoff, VOFF);
    between(t, "cntvoff.el1-virtual-offset", VOFF, &cntvct);
    between(t, "cntvoff.el1-physical-untouched", 0, &cntpct);
    let _ = run_el2(el2::cntvoff, 0);
    between(t, "cntvoff.back-to-zero", 0, &cntvct);

    // FEAT_ECV: ID_AA64MMFR0_EL1.ECV, bits 63:60.
    if read_sysreg!("id_aa64mmfr0_el1") >> 60 == 0 {
        t.skip("cntpoff", "no FEAT_ECV");
        return;
    }
    let _ = run_el2(el2::cntpoff, POFF);
    if guest::backend() == Some(Backend::Tcg) {
        t.skip(
            "cntpoff.el1-physical-offset",
            "stock TCG ignores CNTPOFF_EL2 without EL3",
        );
    } else {
        between(t, "cntpoff.el1-physical-offset", POFF, &cntpct);
    }
    between(t, "cntpoff.el1-virtual-untouched", 0, &cntvct);
    let _ = run_el2(el2::cntpoff, 0);
    between(t, "cntpoff.back-to-zero", 0, &cntpct);
}
