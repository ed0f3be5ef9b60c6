//! rustkvm-test: arch=x86_64 compare=off matrix=off timeout=5
//!
//! A probe of the host, not a test of rustkvm: does a hypercall complete on
//! this host's KVM? The runner boots it on the kvm backend, with a short
//! bound, for the guests that declare `rustkvm-kvm-probe: hypercall`
//! (tests/src/run.rs `kvm_skip`): they run where it passes and SKIP with
//! their declared reason where it does not (kvm_pvm leaves the vCPU on
//! the VMCALL). KVM_HC_VAPIC_POLL_IRQ returns 0 (hypercalls.rst).
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("kvm-probe-hypercall", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    /// KVM_HC_VAPIC_POLL_IRQ.
    const KVM_HC_VAPIC_POLL_IRQ: u64 = 1;
    t.eq(
        "vmcall-completes",
        guest::arch::vmcall(KVM_HC_VAPIC_POLL_IRQ, [0; 4]),
        Ok(0),
    );
}
