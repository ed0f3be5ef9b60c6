//! MSI extended destination ID (KVM_FEATURE_MSI_EXT_DEST_ID): a guest with
//! the feature puts bits 14:8 of an x2APIC destination in bits 11:5 of an
//! MSI address (and of an I/O APIC redirection entry, bits 55:49, which the
//! I/O APIC turns into those address bits), so it can route device
//! interrupts to APIC IDs above 255 without an IOMMU.
//!
//! Spec: Linux `Documentation/virt/kvm/x86/cpuid.rst`, guest
//! `arch/x86/kernel/apic/io_apic.c`/`msi.c` (`x86_init.hyper.msi_ext_dest_id`,
//! `__irq_msi_compose_msg`), host: QEMU `target/i386/kvm/kvm.c`
//! (`kvm_swizzle_msi_ext_dest_id`, which moves the bits to the address's
//! upper half for KVM's `x86_msi_msg_get_destid`). QEMU's local APIC takes
//! destination bits 31:8 from the upper half of an MSI address
//! (`apic_send_msi`), so the same swizzle serves TCG's.

/// MSI address bit 4: the remappable (interrupt-remapping) format.
pub const MSI_ADDR_REMAPPABLE: u64 = 1 << 4;
/// MSI address bits 11:4 QEMU examines (`0xff << MSI_ADDR_DEST_IDX_SHIFT`):
/// bits 11:5 carry destination bits 14:8, bit 4 the remappable format.
pub const MSI_ADDR_EXT_BITS: u64 = 0xff << 4;
/// Where the extended bits go: address bit 5 becomes bit 40, which is
/// destination bit 8 in the upper half of the address.
const EXT_SHIFT: u32 = 35;

/// The MSI `address` a guest composed with extended destination IDs, as
/// the local APICs read it: bits 11:5 moved to the upper half (destination
/// bits 14:8). Left alone, as QEMU leaves it for KVM: an address with none
/// of those bits, in the remappable format, or whose upper half is already
/// set (an IOMMU's translation).
pub fn swizzle_ext_dest_id(address: u64) -> u64 {
    let ext = address & MSI_ADDR_EXT_BITS;
    if ext == 0 || ext & MSI_ADDR_REMAPPABLE != 0 || address >> 32 != 0 {
        return address;
    }
    (address & !ext) | ext << EXT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The destination QEMU's `apic_send_msi` reads.
    fn dest(address: u64) -> u64 {
        ((address & 0x000f_f000) >> 12) | address >> 32
    }

    /// Linux's `__irq_msi_compose_msg` with `msi_ext_dest_id`.
    fn linux_compose(apic_id: u32) -> u64 {
        0xfee0_0000 | u64::from(apic_id & 0xff) << 12 | u64::from((apic_id >> 8) & 0x7f) << 5
    }

    #[test]
    fn ids_up_to_32767_reach_their_apic() {
        for id in [0u32, 1, 255, 256, 300, 0x1234, 32767] {
            assert_eq!(
                dest(swizzle_ext_dest_id(linux_compose(id))),
                u64::from(id),
                "{id}"
            );
        }
    }

    #[test]
    fn remappable_iommu_and_plain_addresses_are_left_alone() {
        let plain = 0xfee0_1000;
        assert_eq!(swizzle_ext_dest_id(plain), plain);
        let remappable = 0xfee0_0000 | MSI_ADDR_REMAPPABLE | 1 << 5;
        assert_eq!(swizzle_ext_dest_id(remappable), remappable);
        let iommu = 0x1_0000_0000 | linux_compose(300);
        assert_eq!(swizzle_ext_dest_id(iommu), iommu);
    }
}
