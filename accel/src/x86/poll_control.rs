//! MSR_KVM_POLL_CONTROL: whether the host may poll before it halts a vCPU
//! that executed HLT.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/msr.rst` (MSR_KVM_POLL_CONTROL),
//! `arch/x86/kvm/x86.c` (`kvm_set_msr_common`, `kvm_get_msr_common`,
//! `kvm_arch_vcpu_postcreate`), QEMU `target/i386/cpu.c`
//! (`x86_cpu_reset_hold`: `poll_control_msr = 1`). Guest side:
//! `arch/x86/kernel/kvm.c` `arch_haltpoll_enable` (writes 0 when the
//! guest's own cpuidle-haltpoll driver polls instead).
//!
//! Under TCG there is no host-side halt polling: a halted vCPU's thread
//! waits for an interrupt whatever the MSR says, which is KVM's behaviour
//! with polling off (`halt_poll_ns=0`). The MSR is kept, read back and
//! migrated as KVM keeps it; its value changes nothing else.

use crate::x86::X86Error;

/// MSR_KVM_POLL_CONTROL.
pub const MSR_KVM_POLL_CONTROL: u32 = 0x4b56_4d05;
/// Bit 0: the host may poll (1, the reset value) or must not (0).
pub const KVM_POLL_CONTROL_ENABLE: u64 = 1;

/// The MSR's value (plain data, part of the vCPU's saved state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollControl(u64);

impl Default for PollControl {
    /// 1: KVM sets it at vCPU creation, QEMU at every reset.
    fn default() -> Self {
        PollControl(KVM_POLL_CONTROL_ENABLE)
    }
}

impl PollControl {
    /// RDMSR.
    pub fn msr(self) -> u64 {
        self.0
    }

    /// WRMSR; KVM's "only enable bit supported": any other bit set is #GP
    /// and leaves the value alone.
    pub fn write_msr(&mut self, value: u64) -> Result<(), X86Error> {
        if value & !KVM_POLL_CONTROL_ENABLE != 0 {
            return Err(X86Error::ReservedBits {
                msr: MSR_KVM_POLL_CONTROL,
                value,
            });
        }
        self.0 = value;
        Ok(())
    }

    /// A value from a saved machine: one KVM would refuse is dropped
    /// (the reset value stays).
    pub fn load(value: u64) -> Self {
        let mut p = PollControl::default();
        let _ = p.write_msr(value);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_value_is_1_and_only_bit_0_is_writable() {
        let mut p = PollControl::default();
        assert_eq!(p.msr(), 1);
        assert_eq!(p.write_msr(0), Ok(()));
        assert_eq!(p.msr(), 0);
        for bit in 1..64 {
            assert!(p.write_msr(1 << bit).is_err(), "bit {bit}");
            assert!(p.write_msr(1 | 1 << bit).is_err(), "bit {bit}");
        }
        assert_eq!(p.msr(), 0, "a refused write leaves it");
        assert_eq!(p.write_msr(1), Ok(()));
        assert_eq!(p.msr(), 1);
        assert_eq!(PollControl::load(0).msr(), 0);
        assert_eq!(PollControl::load(6).msr(), 1, "refused: reset value");
    }
}
