//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off
//!
//! PV EOI across savevm/loadvm or migration (tests/tests/migration.rs): an
//! interrupt's handler ends it in memory (the word's bit, which the host
//! set, cleared) and then prints "ready" and waits for the host's "go on",
//! which only the destination sends; so the VM moves with an EOI the
//! guest made that the local APIC has not taken yet (rustkvm's
//! `cpu/rustkvm_pv_eoi` carries it). On the destination the vector must
//! be out of service once the APIC looks, the next interrupt of its class
//! must arrive, and the MSR must read back. A lost EOI leaves the vector
//! in service and blocks the next one.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pv-eoi-migrate", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering::SeqCst;
    use guest::arch::{self, self_ipi};
    use guest::pv_eoi::*;

    const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;

    let word = WORD.as_ptr() as u64;
    t.eq(
        "msr-enable",
        arch::wrmsr(MSR_KVM_PV_EOI_EN, word | 1),
        Ok(()),
    );
    install();
    MODE.store(END_THEN_WAIT, SeqCst);
    self_ipi(OUTER);
    take();
    MODE.store(PLAIN, SeqCst);
    let count = |v: u8| COUNT[usize::from(v)].load(SeqCst);
    t.eq(
        "moved-found-the-bit",
        SEEN[usize::from(OUTER)].load(SeqCst),
        1,
    );
    t.eq("moved-ended-in-memory", ENDED_IN_MEMORY.load(SeqCst), 1);
    t.check(
        "moved-eoi-taken-on-the-destination",
        nothing_in_service(),
        format_args!("ISR/PPR after the move"),
    );
    self_ipi(OUTER);
    take();
    t.eq("next-one-arrives", count(OUTER), 2);
    t.eq(
        "next-one-found-the-bit",
        SEEN[usize::from(OUTER)].load(SeqCst),
        1,
    );
    t.eq("next-one-ended-in-memory", PV_EOIS.load(SeqCst), 1);
    t.check(
        "nothing-in-service-at-the-end",
        nothing_in_service(),
        format_args!("ISR/PPR at the end"),
    );
    t.eq(
        "msr-survives-the-move",
        arch::rdmsr(MSR_KVM_PV_EOI_EN),
        Ok(word | 1),
    );
}
