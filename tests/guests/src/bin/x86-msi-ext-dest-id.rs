//! rustkvm-test: arch=x86_64 cpu=max compare=off matrix=off timeout=60
//!
//! KVM_FEATURE_MSI_EXT_DEST_ID: a device interrupt reaches an APIC ID above
//! 255 without an IOMMU, its destination bits 14:8 in bits 55:49 of the I/O
//! APIC redirection entry (address bits 11:5 of the MSI the I/O APIC sends),
//! as Linux programs them when the feature is there
//! (`x86_init.hyper.msi_ext_dest_id`). The host test (tests/tests/guests.rs)
//! starts the q35 machine of `x86-kvm-pv-ipi-x2apic`, whose second vCPU has
//! APIC ID [`AP_ID`] = 256. Both vCPUs go to x2APIC mode; the AP keeps
//! interrupts off, so a delivered vector waits in its IRR. vCPU 0 routes
//! the PIT's interrupt (ISA IRQ 0, I/O APIC pin 2) to APIC ID 256 and fires
//! it once: the vector must be pending in the AP's IRR and not in vCPU 0's
//! (without the extended bits the destination is 0, vCPU 0). SKIPs without
//! the feature (plain TCG). Not part of the matrix (it needs that machine).
//! Spec: Documentation/virt/kvm/x86/cpuid.rst; QEMU target/i386/kvm/kvm.c
//! `kvm_swizzle_msi_ext_dest_id`; the I/O APIC datasheet (82093AA) for the
//! redirection entry.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-msi-ext-dest-id", "x86_64 only");
}

/// The AP's APIC ID on the host test's machine.
#[cfg(target_arch = "x86_64")]
const AP_ID: u32 = 256;
/// The vector the PIT's interrupt is routed to.
#[cfg(target_arch = "x86_64")]
const VECTOR: u8 = 0x43;

#[cfg(target_arch = "x86_64")]
mod ioapic {
    /// The I/O APIC's MMIO base (identity-mapped).
    const BASE: usize = 0xfec0_0000;

    fn write(reg: u32, value: u32) {
        // SAFETY: the I/O APIC's index and data registers, identity-mapped
        // MMIO no one else in this guest uses.
        unsafe {
            ((BASE) as *mut u32).write_volatile(reg);
            ((BASE + 0x10) as *mut u32).write_volatile(value);
        }
    }

    /// Redirection entry `pin`: fixed delivery, physical destination, edge,
    /// unmasked, `vector`, to x2APIC ID `dest` as Linux writes it with
    /// extended destination IDs: bits 7:0 in 63:56, bits 14:8 in 55:49.
    pub fn route(pin: u32, vector: u8, dest: u32) {
        let high = (dest & 0xff) << 24 | ((dest >> 8) & 0x7f) << 17;
        write(0x10 + 2 * pin, 1 << 16); // masked while it changes
        write(0x11 + 2 * pin, high);
        write(0x10 + 2 * pin, u32::from(vector));
    }

    /// Mask `pin` again.
    pub fn mask(pin: u32) {
        write(0x10 + 2 * pin, 1 << 16);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use guest::arch;
    /// KVM_FEATURE_MSI_EXT_DEST_ID.
    const MSI_EXT_DEST_ID: u32 = 1 << 15;
    /// CPUID.1:ECX[21]: x2APIC.
    const X2APIC: u32 = 1 << 21;
    /// ISA IRQ 0 (the PIT) is I/O APIC pin 2 on QEMU's PC machines.
    const PIT_PIN: u32 = 2;

    if !arch::has_kvm_signature() || arch::cpuid(0x4000_0001, 0)[0] & MSI_EXT_DEST_ID == 0 {
        t.skip("msi-ext-dest-id", "no KVM_FEATURE_MSI_EXT_DEST_ID");
        return;
    }
    if arch::cpuid(1, 0)[2] & X2APIC == 0 {
        t.skip("msi-ext-dest-id", "no x2APIC");
        return;
    }
    arch::enable_x2apic();
    let id = arch::start_x2apic_irr_watcher(AP_ID, VECTOR);
    t.eq("ap-started-in-x2apic-mode", id, Some(AP_ID));

    ioapic::route(PIT_PIN, VECTOR, AP_ID);
    // PIT channel 0, mode 0 (interrupt on terminal count), 100 ticks: one
    // rising edge of IRQ 0 about 84 us from now.
    arch::outb(0x43, 0x30);
    arch::outb(0x40, 100);
    arch::outb(0x40, 0);
    let saw = arch::x2apic_irr_watcher_saw();
    ioapic::mask(PIT_PIN);
    t.eq("ap-256-has-the-device-interrupt", saw, true);
    t.eq("vcpu-0-does-not", arch::x2apic_irr(VECTOR), false);
}
