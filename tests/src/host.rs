//! What this host's KVM can do, for the `kvm` backend
//! (`-accel rustkvm,backend=kvm`): detected once, reported as SKIP reasons.
//!
//! The project's own machines run **kvm_pvm**, a software KVM nested inside
//! the VM (module `kvm_pvm`) with `kvm.enable_pmu=N`: tiny guests run, there
//! is no vPMU, and QEMU aborts setting MSR 0x10a (IA32_ARCH_CAPABILITIES)
//! on `-cpu host`/`max` unless the feature is taken out. Real hosts have
//! none of that; the runner adapts only where it detects it.

use std::path::Path;

use crate::qemu::Arch;

/// Module directory whose presence means the host KVM is kvm_pvm.
const KVM_PVM_MODULE: &str = "/sys/module/kvm_pvm";
/// KVM's module parameter for the vPMU (`Y`/`N`).
const KVM_ENABLE_PMU: &str = "/sys/module/kvm/parameters/enable_pmu";

/// Why `kvm` cannot run `arch` guests on this host, if it cannot.
pub fn kvm_unavailable(arch: Arch) -> Option<String> {
    let host = std::env::consts::ARCH;
    if host != arch.name() {
        return Some(format!("kvm runs only {host} guests on this {host} host"));
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/kvm: {e}")),
    }
}

/// Whether the host KVM is kvm_pvm (the nested software KVM).
pub fn kvm_is_pvm() -> bool {
    Path::new(KVM_PVM_MODULE).exists()
}

/// Why the host KVM gives guests no vPMU, if it gives none.
pub fn kvm_no_pmu() -> Option<String> {
    let v = std::fs::read_to_string(KVM_ENABLE_PMU).ok()?;
    matches!(v.trim(), "N" | "0").then(|| "host KVM has no vPMU (kvm.enable_pmu=N)".to_string())
}

/// Whether the Linux release `release` ("6.12.95+deb12-arm64") is
/// `major.minor` or later.
pub fn linux_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut v = release
        .trim()
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (major, minor)
}

/// The Linux release from which KVM gives an arm64 guest EL2
/// (KVM_CAP_ARM_EL2).
pub const KVM_ARM_EL2_SINCE: (u32, u32) = (6, 16);

/// `KVM_CHECK_EXTENSION`, `_IO(KVMIO, 0x03)` (include/uapi/linux/kvm.h).
const KVM_CHECK_EXTENSION: libc::c_ulong = 0xae03;
/// `KVM_CAP_ARM_EL2`: KVM gives an arm64 guest EL2 (nested virtualization,
/// Linux 6.16 and later on FEAT_NV2 hardware).
const KVM_CAP_ARM_EL2: libc::c_ulong = 240;

/// Why the host KVM cannot give a guest EL2 (`-M virt,virtualization=on`),
/// if it cannot: QEMU refuses the machine on KVM without KVM_CAP_ARM_EL2.
pub fn kvm_no_el2() -> Option<String> {
    use std::os::fd::AsRawFd;
    let kvm = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(f) => f,
        Err(e) => return Some(format!("/dev/kvm: {e}")),
    };
    // SAFETY: KVM_CHECK_EXTENSION on the open /dev/kvm takes the
    // capability number by value and touches no memory of ours.
    let n = unsafe { libc::ioctl(kvm.as_raw_fd(), KVM_CHECK_EXTENSION as _, KVM_CAP_ARM_EL2) };
    (n <= 0).then(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let (major, minor) = KVM_ARM_EL2_SINCE;
        format!(
            "host KVM (Linux {}) gives guests no EL2 (no KVM_CAP_ARM_EL2: Linux {major}.{minor} and later, on FEAT_NV2 hardware)",
            release.trim()
        )
    })
}

/// Why the host KVM offers a guest no legacy LBR, if it does not: KVM
/// passes the host's LBR through (`vmx_get_perf_capabilities`), so the host's
/// perf must have one (its depth in `cpu/caps/branches`), and not Arch LBR,
/// with which KVM offers none.
pub fn kvm_no_lbr() -> Option<String> {
    let depth = std::fs::read_to_string("/sys/bus/event_source/devices/cpu/caps/branches")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let arch_lbr = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "arch_lbr"));
    if depth == 0 {
        Some("the host has no LBR for KVM to offer (no perf cpu/caps/branches)".to_string())
    } else if arch_lbr {
        Some("the host has Arch LBR, with which KVM offers no LBR".to_string())
    } else {
        None
    }
}

/// Why the host KVM offers a guest no PEBS with the baseline, if it does
/// not: Linux 6.9 and later never do ("KVM: x86/pmu: Disable support for
/// adaptive PEBS"), and older ones only on a host with PEBS.
pub fn kvm_no_pebs() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let pebs = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "pebs"));
    if linux_at_least(&release, (6, 9)) {
        Some(format!(
            "host KVM (Linux {}) offers no PEBS baseline (6.9 and later)",
            release.trim()
        ))
    } else if !pebs {
        Some("the host has no PEBS for KVM to offer".to_string())
    } else {
        None
    }
}

/// Why the host KVM never arms PV EOI, if it does not: with APICv (Intel)
/// or AVIC (AMD) on, KVM keeps `irr_pending` set and its in-service cache
/// invalid, so `apic_sync_pv_eoi_to_guest` never sets the guest's bit
/// (arch/x86/kvm/lapic.c); the guest then always writes its EOI.
pub fn kvm_apicv() -> Option<String> {
    let on = |p: &str| std::fs::read_to_string(p).is_ok_and(|v| matches!(v.trim(), "Y" | "1"));
    if on("/sys/module/kvm_intel/parameters/enable_apicv") {
        Some("host KVM uses APICv (kvm_intel.enable_apicv=Y): it never arms PV EOI".to_string())
    } else if on("/sys/module/kvm_amd/parameters/avic") {
        Some("host KVM uses AVIC (kvm_amd.avic=1): it never arms PV EOI".to_string())
    } else {
        None
    }
}

/// The `-cpu` model for a guest under `kvm` that asked for `cpu` (None:
/// QEMU's default model, which kvm_pvm runs as is). On kvm_pvm the
/// arch-capabilities feature is taken out of `host`/`max`-based models, or
/// QEMU aborts writing MSR 0x10a.
pub fn kvm_cpu(cpu: Option<&str>) -> Option<String> {
    let cpu = cpu?;
    let base = cpu.split(',').next().unwrap_or(cpu);
    if kvm_is_pvm() && matches!(base, "host" | "max") {
        Some(format!("{cpu},-arch-capabilities"))
    } else {
        Some(cpu.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_architecture_is_never_kvm_capable() {
        let foreign = if std::env::consts::ARCH == "x86_64" {
            Arch::Aarch64
        } else {
            Arch::X86_64
        };
        assert!(kvm_unavailable(foreign).unwrap().contains("runs only"));
    }

    #[test]
    fn linux_releases_compare_by_major_and_minor() {
        assert!(linux_at_least("6.12.95+deb12-arm64", (6, 9)));
        assert!(!linux_at_least("6.12.95+deb12-arm64", KVM_ARM_EL2_SINCE));
        assert!(linux_at_least("6.16-rc1", KVM_ARM_EL2_SINCE));
        assert!(linux_at_least("7.0.1", KVM_ARM_EL2_SINCE));
        assert!(!linux_at_least("garbage", (6, 9)));
    }

    #[test]
    fn cpu_models_keep_their_options_under_kvm() {
        assert_eq!(kvm_cpu(None), None);
        assert_eq!(kvm_cpu(Some("qemu64")).as_deref(), Some("qemu64"));
        let max = kvm_cpu(Some("max,pmu=on")).unwrap();
        assert!(max.starts_with("max,pmu=on"), "{max}");
        assert_eq!(max.ends_with(",-arch-capabilities"), kvm_is_pvm());
    }
}
