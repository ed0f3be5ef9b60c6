//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off timeout=5
//!
//! A probe of the host, not a test of rustkvm: is a self-IPI requested
//! with interrupts off delivered in the next sti window (`sti; nop; nop;
//! cli`: at the first boundary after the sti shadow) on this host's
//! KVM? The runner boots it on the kvm backend, with a short bound, for
//! the guests that declare `rustkvm-kvm-probe: self-ipi`
//! (tests/src/run.rs `kvm_skip`): they run where it passes and SKIP with
//! their declared reason where it does not (kvm_pvm leaves it in the IRR).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("kvm-probe-self-ipi", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering::SeqCst;
    use guest::pv_eoi::{install, take, COUNT, OUTER};
    install();
    guest::arch::self_ipi(OUTER);
    take();
    t.eq(
        "self-ipi-delivered-in-an-sti-window",
        COUNT[usize::from(OUTER)].load(SeqCst),
        1,
    );
}
