//! rustkvm-test: arch=x86_64 cpu=max compare=off needs=pv-eoi
//! rustkvm-expect: tcg=skip
//! rustkvm-test: kvm-vary=alone-ended-in-memory,back-to-back-each-ended-once,two-one-eoi-each-way,nested-one-eoi-each-way
//!   (how many EOIs KVM ends in memory depends on the host's exits: it
//!   takes the hint back at any exit)
//!   (no KVM signature under stock TCG)
//! rustkvm-kvm-probe: self-ipi a self-IPI requested with interrupts off stays in the IRR through the sti windows on this host's KVM (measured: IRR set, no handler run, with PV EOI on or off)
//!
//! PV EOI (KVM_FEATURE_PV_EOI) as a KVM guest sees it, with Linux's own
//! handler protocol (`kvm_guest_apic_eoi_write`: a test-and-clear of the
//! word's bit 0, else an EOI write). Spec: Documentation/virt/kvm/x86/
//! msr.rst (MSR_KVM_EOI_EN), arch/x86/kvm/lapic.c
//! (`apic_sync_pv_eoi_to_guest`, `apic_sync_pv_eoi_from_guest`,
//! `kvm_lapic_set_pv_eoi`).
//! - MSR_KVM_PV_EOI_EN: bit 1 or an address not 4-byte aligned #GP, so
//!   does enabling at an address that is not RAM; the value is kept.
//! - An interrupt alone finds the bit set and ends by clearing it; the
//!   local APIC then has nothing in service (the ISR read is the oracle).
//! - Back to back, 100 times: each delivered once, each ended once.
//! - Two requested at once: the first finds the bit clear (the second is
//!   pending: could nest) and writes EOI; the second finds it set.
//! - Nested: the inner (higher) one ends in memory while the outer stays
//!   in service (no EOI doubled), and the outer then must write its EOI
//!   (KVM's cache of the vector in service is gone after an EOI).
//! - Off: the host leaves the word alone.
//!
//! A lost EOI leaves a vector in service (ISR set, later interrupts of its
//! class blocked); a doubled one ends the outer interrupt early.
//!
//! On real KVM the bit is a hint: KVM takes it back at every exit
//! (`apic_sync_pv_eoi_from_guest` from `kvm_lapic_sync_from_vapic`) and
//! sets it again only at an entry that processes KVM_REQ_EVENT
//! (`kvm_lapic_sync_to_vapic` in `vcpu_enter_guest`), so an exit between
//! the injection and the handler's test-and-clear (the host's own timer:
//! often, nested in a rustkvm L1) leaves the guest to write its EOI. There
//! the checks whether a handler found the bit, and which way each
//! interrupt ended, become: each ended exactly once. Under rustkvm nothing
//! but the guest's own instructions exits, and the split is exact.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pv-eoi", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering::SeqCst;
    use guest::arch::{self, self_ipi};
    use guest::pv_eoi::*;

    const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
    const KVM_FEATURE_PV_EOI: u32 = 1 << 6;

    if !arch::has_kvm_signature() {
        t.skip("x86-pv-eoi", "no KVM signature at CPUID 0x40000000");
        return;
    }
    let features = arch::cpuid(0x4000_0001, 0)[0];
    t.check(
        "pv-eoi-offered",
        features & KVM_FEATURE_PV_EOI != 0,
        format_args!("CPUID 0x40000001 EAX {features:#x}"),
    );
    install();
    let count = |v: u8| COUNT[usize::from(v)].load(SeqCst);
    let seen = |v: u8| SEEN[usize::from(v)].load(SeqCst);
    let eois = || (PV_EOIS.load(SeqCst), APIC_EOIS.load(SeqCst));
    let exact = guest::backend() != Some(guest::Backend::Kvm);

    // The MSR.
    let word = WORD.as_ptr() as u64;
    let gp = |r: Result<(), arch::Fault>| matches!(r, Err(f) if f.vector == arch::GP_VECTOR);
    t.eq("msr-starts-0", arch::rdmsr(MSR_KVM_PV_EOI_EN), Ok(0));
    for (name, value) in [
        ("msr-bit-1-gp", word | 3),
        ("msr-unaligned-gp", (word + 2) | 1),
        ("msr-not-ram-gp", 0x10_0000_0000 | 1),
    ] {
        let r = arch::wrmsr(MSR_KVM_PV_EOI_EN, value);
        t.check(name, gp(r), format_args!("wrmsr {value:#x}: {r:?}"));
    }
    t.eq("msr-kept-after-gp", arch::rdmsr(MSR_KVM_PV_EOI_EN), Ok(0));
    t.eq(
        "msr-enable",
        arch::wrmsr(MSR_KVM_PV_EOI_EN, word | 1),
        Ok(()),
    );
    t.eq(
        "msr-reads-back",
        arch::rdmsr(MSR_KVM_PV_EOI_EN),
        Ok(word | 1),
    );

    // One interrupt alone.
    self_ipi(OUTER);
    take();
    t.eq("alone-delivered-once", count(OUTER), 1);
    found(t, exact, "alone-found-the-bit", seen(OUTER));
    ended(t, exact, "alone-ended-in-memory", eois(), (1, 0));
    t.check(
        "alone-nothing-in-service",
        nothing_in_service(),
        format_args!("ISR/PPR after a PV EOI"),
    );

    // Back to back.
    for _ in 0..100 {
        self_ipi(OUTER);
        take();
    }
    t.eq("back-to-back-each-once", count(OUTER), 101);
    ended(t, exact, "back-to-back-each-ended-once", eois(), (101, 0));
    t.check(
        "back-to-back-nothing-in-service",
        nothing_in_service(),
        format_args!("ISR/PPR after 100 PV EOIs"),
    );

    // Two requested together: 0x41 first, with 0x40 pending.
    record_order(true);
    self_ipi(OUTER);
    self_ipi(SAME_CLASS);
    take();
    t.eq(
        "two-in-priority-order",
        [ORDER[0].load(SeqCst), ORDER[1].load(SeqCst)],
        [SAME_CLASS, OUTER],
    );
    t.eq("two-first-found-no-bit", seen(SAME_CLASS), 0);
    found(t, exact, "two-second-found-the-bit", seen(OUTER));
    t.eq("two-each-once", (count(SAME_CLASS), count(OUTER)), (1, 102));
    ended(t, exact, "two-one-eoi-each-way", eois(), (102, 1));
    t.check(
        "two-nothing-in-service",
        nothing_in_service(),
        format_args!("ISR/PPR after the pair"),
    );

    // Nested.
    MODE.store(NEST, SeqCst);
    self_ipi(OUTER);
    take();
    MODE.store(PLAIN, SeqCst);
    t.eq("nested-each-once", (count(OUTER), count(INNER)), (103, 1));
    found(t, exact, "nested-outer-found-the-bit", seen(OUTER));
    found(t, exact, "nested-inner-found-the-bit", seen(INNER));
    let after = AFTER_INNER.load(SeqCst);
    t.check(
        "nested-outer-still-in-service",
        after & 3 == 1,
        format_args!(
            "after the inner one: ISR 0x40 {}, 0x80 {}",
            after & 1,
            after >> 1 & 1
        ),
    );
    t.eq("nested-outer-must-write-eoi", after >> 2 & 1, 0);
    ended(t, exact, "nested-one-eoi-each-way", eois(), (103, 2));
    t.check(
        "nested-nothing-in-service",
        nothing_in_service(),
        format_args!("ISR/PPR after the nest"),
    );

    // Off: the host leaves the word alone.
    let before = eois();
    t.eq("msr-disable", arch::wrmsr(MSR_KVM_PV_EOI_EN, 0), Ok(()));
    WORD.store(0x80, SeqCst);
    self_ipi(OUTER);
    take();
    t.eq("off-delivered", count(OUTER), 104);
    t.eq("off-no-bit", seen(OUTER), 0);
    t.eq("off-word-untouched", WORD.load(SeqCst), 0x80);
    let now = eois();
    t.eq(
        "off-eoi-written",
        (now.0 - before.0, now.1 - before.1),
        (0, 1),
    );
    t.check(
        "off-nothing-in-service",
        nothing_in_service(),
        format_args!("ISR/PPR at the end"),
    );
}

/// Whether a handler found the bit (0 or 1): set, where `exact`; on real
/// KVM either (the module's doc).
#[cfg(target_arch = "x86_64")]
fn found(t: &mut Test, exact: bool, name: &str, seen: u8) {
    if exact {
        t.eq(name, seen, 1);
    } else {
        t.check(name, seen <= 1, format_args!("handler not run: {seen:#x}"));
    }
}

/// Interrupts ended so far, `(in memory, by an EOI write)`: `want`, where
/// `exact`; on real KVM the same number either way (the module's doc).
#[cfg(target_arch = "x86_64")]
fn ended(t: &mut Test, exact: bool, name: &str, got: (u32, u32), want: (u32, u32)) {
    if exact {
        t.eq(name, got, want);
    } else {
        t.measure(name, format_args!("{} {}", got.0, got.1));
        t.eq(name, got.0 + got.1, want.0 + want.1);
    }
}
