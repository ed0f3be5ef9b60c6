//! KVM's VM-wide generic-timer counter offset.
//!
//! Spec: Linux `Documentation/virt/kvm/api.rst` (KVM_ARM_SET_COUNTER_OFFSET,
//! `struct kvm_arm_counter_offset`): one VM-wide offset, subtracted from
//! both the virtual and the physical counter views, like CNTVOFF_EL2 and
//! CNTPOFF_EL2 but global; `arch/arm64/kvm/arch_timer.c`
//! (`kvm_vm_ioctl_set_counter_offset`, `timer_get_offset`). Without one,
//! KVM's virtual counter starts near 0 at VM creation and is the same on
//! every vCPU; TCG's counter counts QEMU's virtual clock from VM start, which
//! gives both views exactly that, and keeps counting across savevm/loadvm.

/// The offset subtracted from every counter view of the guest, modulo 2^64
/// (a counter-offset larger than the counter makes the views wrap, as KVM's).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CounterOffset(pub u64);

impl CounterOffset {
    /// The guest's view of the raw counter value `raw`.
    pub fn view(self, raw: u64) -> u64 {
        raw.wrapping_sub(self.0)
    }

    /// The total offset of a timer whose architectural offset (CNTVOFF_EL2,
    /// CNTPOFF_EL2, or 0) is `arch`: what QEMU's timer code subtracts from
    /// the raw counter, so that deadlines stay in raw counter time.
    pub fn with(self, arch: u64) -> u64 {
        arch.wrapping_add(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_and_deadlines_wrap_modulo_2_64() {
        let none = CounterOffset::default();
        assert_eq!(none.view(1234), 1234);
        let off = CounterOffset(1_000);
        assert_eq!(off.view(1_500), 500);
        assert_eq!(off.view(10), u64::MAX - 989, "wraps, as KVM's");
        // A guest comparing CVAL with its view fires when raw reaches
        // CVAL + total offset (modulo 2^64).
        let total = off.with(0);
        let cval = 7u64;
        let raw_deadline = cval.wrapping_add(total);
        assert_eq!(off.view(raw_deadline), cval);
        // The architectural offset adds to it.
        assert_eq!(CounterOffset(u64::MAX).with(2), 1);
        assert_eq!(CounterOffset(5).with(3), 8);
    }
}
