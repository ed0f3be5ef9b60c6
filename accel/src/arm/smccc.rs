//! The SMCCC calls KVM answers itself, decoded and answered as KVM does.
//!
//! Spec: Arm DEN0028 (SMC Calling Convention), Linux
//! `include/linux/arm-smccc.h` (function IDs, return codes, the KVM UID),
//! `arch/arm64/kvm/hypercalls.c` (`kvm_smccc_call_handler`),
//! `arch/arm64/kvm/psci.c` (PSCI_FEATURES lists SMCCC_VERSION). Everything
//! else (PSCI) is left to QEMU's PSCI implementation, which answers unknown
//! function IDs with NOT_SUPPORTED, like `kvm_psci_call`. TRNG 1.0: Arm
//! DEN0098, `arch/arm64/kvm/trng.c`.

/// SMCCC_VERSION (SMC32 fast, arch owner, function 0).
pub const SMCCC_VERSION: u32 = 0x8000_0000;
/// SMCCC_ARCH_FEATURES.
pub const SMCCC_ARCH_FEATURES: u32 = 0x8000_0001;
/// SMCCC_ARCH_WORKAROUND_1 (Spectre v2 / CVE-2017-5715).
pub const SMCCC_ARCH_WORKAROUND_1: u32 = 0x8000_8000;
/// SMCCC_ARCH_WORKAROUND_2 (Spectre v4 / CVE-2018-3639).
pub const SMCCC_ARCH_WORKAROUND_2: u32 = 0x8000_7fff;
/// SMCCC_ARCH_WORKAROUND_3 (Spectre-BHB).
pub const SMCCC_ARCH_WORKAROUND_3: u32 = 0x8000_3fff;
/// PSCI_FEATURES (PSCI 1.0, SMC32).
pub const PSCI_FEATURES: u32 = 0x8400_000a;
/// ARM_SMCCC_HV_PV_TIME_FEATURES (SMC64 fast, standard hypervisor owner).
pub const PV_TIME_FEATURES: u32 = 0xc500_0020;
/// ARM_SMCCC_HV_PV_TIME_ST.
pub const PV_TIME_ST: u32 = 0xc500_0021;
/// ARM_SMCCC_VENDOR_HYP_CALL_UID_FUNC_ID.
pub const VENDOR_HYP_CALL_UID: u32 = 0x8600_ff01;
/// ARM_SMCCC_VENDOR_HYP_KVM_FEATURES_FUNC_ID.
pub const VENDOR_HYP_KVM_FEATURES: u32 = 0x8600_0000;
/// ARM_SMCCC_VENDOR_HYP_KVM_PTP_FUNC_ID (SMC32 fast, vendor hypervisor
/// owner, function 1): the host's real time and the guest's counter, read
/// together (`kvm_ptp_get_time`, drivers/ptp/ptp_kvm_arm.c).
pub const VENDOR_HYP_KVM_PTP: u32 = 0x8600_0001;
/// KVM_PTP_VIRT_COUNTER: the PTP call's x1 for the virtual counter.
pub const KVM_PTP_VIRT_COUNTER: u32 = 0;
/// KVM_PTP_PHYS_COUNTER: ... for the physical counter.
pub const KVM_PTP_PHYS_COUNTER: u32 = 1;

/// ARM_SMCCC_TRNG_VERSION (SMC32 fast, standard secure owner, 0x50).
pub const TRNG_VERSION: u32 = 0x8400_0050;
/// ARM_SMCCC_TRNG_FEATURES.
pub const TRNG_FEATURES: u32 = 0x8400_0051;
/// ARM_SMCCC_TRNG_GET_UUID.
pub const TRNG_GET_UUID: u32 = 0x8400_0052;
/// ARM_SMCCC_TRNG_RND32 (up to 96 bits in w1..w3).
pub const TRNG_RND32: u32 = 0x8400_0053;
/// ARM_SMCCC_TRNG_RND64 (SMC64: up to 192 bits in x1..x3).
pub const TRNG_RND64: u32 = 0xc400_0053;
/// ARM_SMCCC_TRNG_VERSION_1_0.
pub const TRNG_VERSION_1_0: u64 = 0x1_0000;
/// TRNG_INVALID_PARAMETER (-2; TRNG's own codes, trng.c).
pub const TRNG_INVALID_PARAMETER: u64 = -2i64 as u64;
/// KVM's TRNG UUID 0d21e000-4384-11eb-8070-524455 4e5a4c, as the four
/// little-endian words GET_UUID returns in x0..x3 (trng.c).
pub const TRNG_UUID: [u64; 4] = [0x00e0_210d, 0xeb11_8443, 0x4452_7080, 0x4c5a_4e55];

/// ARM_SMCCC_VERSION_1_1.
pub const SMCCC_VERSION_1_1: u64 = 0x1_0001;
/// SMCCC_RET_SUCCESS.
pub const RET_SUCCESS: u64 = 0;
/// SMCCC_RET_NOT_SUPPORTED (-1).
pub const RET_NOT_SUPPORTED: u64 = -1i64 as u64;
/// SMCCC_RET_NOT_REQUIRED (-2).
pub const RET_NOT_REQUIRED: u64 = -2i64 as u64;
/// SMCCC_ARCH_WORKAROUND_RET_UNAFFECTED (1).
pub const RET_WORKAROUND_UNAFFECTED: u64 = 1;
/// KVM's vendor hypervisor UID 28b46fb6-2ec5-11e9-a9ca-4b564d003a74, as the
/// four registers ARM_SMCCC_VENDOR_HYP_UID_KVM_REG_0..3.
pub const KVM_UID: [u64; 4] = [0xb66f_b428, 0xe911_c52e, 0x564b_caa9, 0x743a_004d];
/// ARM_SMCCC_KVM_FUNC_FEATURES: bit of the vendor feature bitmap.
pub const KVM_FUNC_FEATURES: u32 = 0;
/// ARM_SMCCC_KVM_FUNC_PTP: bit of the vendor feature bitmap (on by
/// default in KVM's `vendor_hyp_bmap`).
pub const KVM_FUNC_PTP: u32 = 1;

/// A call rustkvm answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// SMCCC_VERSION.
    Version,
    /// SMCCC_ARCH_FEATURES of a function ID.
    ArchFeatures(u32),
    /// A workaround function itself (1 or 3: KVM's hyp fast path returns 0).
    Workaround,
    /// PSCI_FEATURES(SMCCC_VERSION): the one PSCI answer QEMU lacks.
    PsciFeaturesSmcccVersion,
    /// PV_TIME_FEATURES of a function ID.
    PvTimeFeatures(u32),
    /// PV_TIME_ST.
    PvTimeSt,
    /// The vendor hypervisor UID.
    VendorUid,
    /// The KVM vendor feature bitmap.
    VendorFeatures,
    /// KVM's PTP call for counter `x1` (W1).
    Ptp(u32),
    /// TRNG_VERSION.
    TrngVersion,
    /// TRNG_FEATURES of a function ID.
    TrngFeatures(u32),
    /// TRNG_GET_UUID.
    TrngUuid,
    /// TRNG_RND32/RND64 for `bits` bits (`wide`: RND64).
    TrngRnd {
        /// Bits asked for (W1).
        bits: u32,
        /// RND64.
        wide: bool,
    },
}

impl Call {
    /// Decode x0..x7; None leaves the call to PSCI. SMCCC passes the
    /// function ID in W0 and these calls' argument in W1 (KVM reads both as
    /// u32), so upper halves are ignored.
    pub fn decode(regs: &[u64; 8]) -> Option<Call> {
        let arg = regs[1] as u32;
        Some(match regs[0] as u32 {
            SMCCC_VERSION => Call::Version,
            SMCCC_ARCH_FEATURES => Call::ArchFeatures(arg),
            SMCCC_ARCH_WORKAROUND_1 | SMCCC_ARCH_WORKAROUND_3 => Call::Workaround,
            PSCI_FEATURES if arg == SMCCC_VERSION => Call::PsciFeaturesSmcccVersion,
            PV_TIME_FEATURES => Call::PvTimeFeatures(arg),
            PV_TIME_ST => Call::PvTimeSt,
            VENDOR_HYP_CALL_UID => Call::VendorUid,
            VENDOR_HYP_KVM_FEATURES => Call::VendorFeatures,
            VENDOR_HYP_KVM_PTP => Call::Ptp(arg),
            TRNG_VERSION => Call::TrngVersion,
            TRNG_FEATURES => Call::TrngFeatures(arg),
            TRNG_GET_UUID => Call::TrngUuid,
            TRNG_RND32 => Call::TrngRnd {
                bits: arg,
                wide: false,
            },
            TRNG_RND64 => Call::TrngRnd {
                bits: arg,
                wide: true,
            },
            _ => return None,
        })
    }
}

/// What answering needs from the vCPU.
pub trait Services {
    /// Whether this vCPU has a PV time structure.
    fn pv_time_available(&self) -> bool;
    /// PV_TIME_ST: set the structure up; its IPA, or None.
    fn pv_time_init(&mut self) -> Option<u64>;
    /// TRNG: fill `buf` from the host's entropy (KVM: `get_random_long`).
    fn random(&mut self, buf: &mut [u64; 3]);
    /// KVM's PTP: host real time (ns since the Unix epoch) and the guest's
    /// virtual (`physical` false) or physical counter, read at one instant;
    /// None if the vCPU cannot tell (no counter frequency known).
    fn ptp(&mut self, physical: bool) -> Option<(u64, u64)>;
}

/// Answer a decoded call: x0..x3 (KVM zeroes x1..x3 unless it returns them).
pub fn handle(call: Call, svc: &mut dyn Services) -> [u64; 4] {
    let x0 = match call {
        Call::Version => SMCCC_VERSION_1_1,
        Call::ArchFeatures(f) => arch_features(f),
        Call::Workaround | Call::PsciFeaturesSmcccVersion => RET_SUCCESS,
        Call::PvTimeFeatures(PV_TIME_FEATURES | PV_TIME_ST) if svc.pv_time_available() => {
            RET_SUCCESS
        }
        Call::PvTimeFeatures(_) => RET_NOT_SUPPORTED,
        Call::PvTimeSt => svc.pv_time_init().unwrap_or(RET_NOT_SUPPORTED),
        Call::VendorUid => return KVM_UID,
        Call::VendorFeatures => 1 << KVM_FUNC_FEATURES | 1 << KVM_FUNC_PTP,
        Call::Ptp(kind) => return ptp(kind, svc),
        Call::TrngVersion => TRNG_VERSION_1_0,
        Call::TrngFeatures(
            TRNG_VERSION | TRNG_FEATURES | TRNG_GET_UUID | TRNG_RND32 | TRNG_RND64,
        ) => RET_SUCCESS,
        Call::TrngFeatures(_) => RET_NOT_SUPPORTED,
        Call::TrngUuid => return TRNG_UUID,
        Call::TrngRnd { bits, wide } => return trng_rnd(bits, wide, svc),
    };
    [x0, 0, 0, 0]
}

/// KVM's PTP call as `kvm_ptp_get_time`: x0/x1 the upper and lower 32 bits
/// of the host's real time in ns, x2/x3 those of the counter; an unknown
/// counter leaves NOT_SUPPORTED in x0 (and zeros).
fn ptp(kind: u32, svc: &mut dyn Services) -> [u64; 4] {
    let physical = match kind {
        KVM_PTP_VIRT_COUNTER => false,
        KVM_PTP_PHYS_COUNTER => true,
        _ => return [RET_NOT_SUPPORTED, 0, 0, 0],
    };
    match svc.ptp(physical) {
        Some((real, cycles)) => [
            real >> 32,
            real & 0xffff_ffff,
            cycles >> 32,
            cycles & 0xffff_ffff,
        ],
        None => [RET_NOT_SUPPORTED, 0, 0, 0],
    }
}

/// TRNG_RND32/RND64 as `kvm_trng_do_rnd`: at most 96/192 bits, else
/// INVALID_PARAMETER; `bits` random bits, the rest cleared; RND64 returns
/// them in x1 (most significant), x2, x3, RND32 in w1..w3.
fn trng_rnd(bits: u32, wide: bool, svc: &mut dyn Services) -> [u64; 4] {
    let size = if wide { 64 } else { 32 };
    if bits > 3 * size {
        return [TRNG_INVALID_PARAMETER, 0, 0, 0];
    }
    let mut r = [0u64; 3];
    svc.random(&mut r);
    // bits[i] as KVM's bitmap: word 0 holds bits 0..63.
    for (i, w) in r.iter_mut().enumerate() {
        let from = 64 * i as u32;
        *w = match bits.saturating_sub(from) {
            0 => 0,
            n if n >= 64 => *w,
            n => *w & ((1u64 << n) - 1),
        };
    }
    let lo = |v: u64| v & 0xffff_ffff;
    if wide {
        [RET_SUCCESS, r[2], r[1], r[0]]
    } else {
        [RET_SUCCESS, lo(r[1]), r[0] >> 32, lo(r[0])]
    }
}

/// SMCCC_ARCH_FEATURES: KVM's answers. The emulated CPU does not speculate,
/// so it is unaffected by the Spectre variants the workarounds address
/// (KVM's SPECTRE_UNAFFECTED answers); PV time discovery is always offered
/// (KVM's default firmware bitmap), PV_TIME_FEATURES then says whether the
/// vCPU has a structure.
fn arch_features(function: u32) -> u64 {
    match function {
        SMCCC_ARCH_WORKAROUND_1 | SMCCC_ARCH_WORKAROUND_3 => RET_WORKAROUND_UNAFFECTED,
        SMCCC_ARCH_WORKAROUND_2 => RET_NOT_REQUIRED,
        PV_TIME_FEATURES => RET_SUCCESS,
        _ => RET_NOT_SUPPORTED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Svc(Option<u64>, u32);
    impl Services for Svc {
        fn pv_time_available(&self) -> bool {
            self.0.is_some()
        }
        fn pv_time_init(&mut self) -> Option<u64> {
            self.1 += 1;
            self.0
        }
        fn random(&mut self, buf: &mut [u64; 3]) {
            *buf = [u64::MAX; 3];
        }
        fn ptp(&mut self, physical: bool) -> Option<(u64, u64)> {
            // Real time 0x1_2345_6789 ns; the virtual counter 0xab_cdef_0123,
            // the physical one 1 more.
            Some((0x1_2345_6789, 0xab_cdef_0123 + u64::from(physical)))
        }
    }

    #[test]
    fn trng_answers_as_kvms_trng_c() {
        let mut s = Svc(None, 0);
        assert_eq!(call(0x8400_0050, 0, &mut s), Some([0x1_0000, 0, 0, 0]));
        for f in [
            0x8400_0050,
            0x8400_0051,
            0x8400_0052,
            0x8400_0053,
            0xc400_0053,
        ] {
            assert_eq!(call(0x8400_0051, f, &mut s), Some([0; 4]), "{f:#x}");
        }
        assert_eq!(
            call(0x8400_0051, 0x8400_0054, &mut s).unwrap()[0],
            RET_NOT_SUPPORTED
        );
        assert_eq!(call(0x8400_0052, 0, &mut s), Some(TRNG_UUID));
        // (The host's entropy here: all ones, so the masks show.)
        assert_eq!(call(0xc400_0053, 192, &mut s), Some([0, !0, !0, !0]));
        assert_eq!(call(0xc400_0053, 65, &mut s), Some([0, 0, 1, !0]));
        assert_eq!(call(0xc400_0053, 0, &mut s), Some([0; 4]));
        assert_eq!(
            call(0xc400_0053, 193, &mut s),
            Some([TRNG_INVALID_PARAMETER, 0, 0, 0])
        );
        assert_eq!(
            call(0xc400_0053, 0xffff_ffff_0000_0001, &mut s),
            Some([0, 0, 0, 1]),
            "W1: the upper half is ignored"
        );
        assert_eq!(
            call(0x8400_0053, 96, &mut s),
            Some([0, 0xffff_ffff, 0xffff_ffff, 0xffff_ffff])
        );
        assert_eq!(
            call(0x8400_0053, 40, &mut s),
            Some([0, 0, 0xff, 0xffff_ffff])
        );
        assert_eq!(
            call(0x8400_0053, 97, &mut s),
            Some([TRNG_INVALID_PARAMETER, 0, 0, 0])
        );
    }

    fn call(x0: u64, x1: u64, svc: &mut Svc) -> Option<[u64; 4]> {
        Call::decode(&[x0, x1, 0, 0, 0, 0, 0, 0]).map(|c| handle(c, svc))
    }

    #[test]
    fn the_linux_probe_sequence_finds_pv_time() {
        let mut s = Svc(Some(0x090a_0040), 0);
        assert_eq!(call(0x8400_000a, 0x8000_0000, &mut s), Some([0; 4]));
        assert_eq!(call(0x8000_0000, 0, &mut s), Some([0x10001, 0, 0, 0]));
        assert_eq!(call(0x8000_0001, 0xc500_0020, &mut s), Some([0; 4]));
        assert_eq!(call(0xc500_0020, 0xc500_0021, &mut s), Some([0; 4]));
        assert_eq!(call(0xc500_0020, 0xc500_0020, &mut s), Some([0; 4]));
        assert_eq!(call(0xc500_0021, 0, &mut s), Some([0x090a_0040, 0, 0, 0]));
        assert_eq!(s.1, 1);
    }

    #[test]
    fn without_a_structure_pv_time_is_not_supported() {
        let mut s = Svc(None, 0);
        assert_eq!(
            call(0x8000_0001, 0xc500_0020, &mut s),
            Some([0; 4]),
            "discovery stays on, as KVM's default bitmap"
        );
        assert_eq!(
            call(0xc500_0020, 0xc500_0021, &mut s).unwrap()[0],
            RET_NOT_SUPPORTED
        );
        assert_eq!(call(0xc500_0021, 0, &mut s).unwrap()[0], RET_NOT_SUPPORTED);
    }

    #[test]
    fn unknown_and_32_bit_variants_go_to_psci() {
        let mut s = Svc(Some(0x1000), 0);
        for id in [
            0x8500_0020u64,
            0x8500_0021,
            0x8400_0000,
            0xc400_0003,
            0x8000_0002,
        ] {
            assert_eq!(call(id, 0, &mut s), None, "{id:#x}");
        }
        assert_eq!(
            call(0x8400_000a, 0x8400_0000, &mut s),
            None,
            "other PSCI_FEATURES: QEMU"
        );
        assert_eq!(
            call(0x8000_0001, 0x8500_0020, &mut s).unwrap()[0],
            RET_NOT_SUPPORTED
        );
        assert_eq!(
            call(0xc500_0020, 0x1234, &mut s).unwrap()[0],
            RET_NOT_SUPPORTED
        );
        assert_eq!(s.1, 0);
    }

    #[test]
    fn upper_halves_of_w0_and_w1_are_ignored() {
        let mut s = Svc(Some(0x1000), 0);
        assert_eq!(
            call(0xffff_ffff_8000_0000, 0, &mut s),
            Some([0x10001, 0, 0, 0])
        );
        assert_eq!(
            call(0x8000_0001, 0xdead_0000_c500_0020, &mut s),
            Some([0; 4])
        );
    }

    #[test]
    fn workarounds_kvm_uid_and_vendor_features() {
        let mut s = Svc(None, 0);
        assert_eq!(call(0x8000_0001, 0x8000_8000, &mut s).unwrap()[0], 1);
        assert_eq!(
            call(0x8000_0001, 0x8000_7fff, &mut s).unwrap()[0],
            RET_NOT_REQUIRED
        );
        assert_eq!(call(0x8000_0001, 0x8000_3fff, &mut s).unwrap()[0], 1);
        assert_eq!(call(0x8000_8000, 0, &mut s), Some([0; 4]));
        assert_eq!(
            call(0x8600_ff01, 0, &mut s),
            Some([0xb66f_b428, 0xe911_c52e, 0x564b_caa9, 0x743a_004d])
        );
        assert_eq!(
            call(0x8600_0000, 0, &mut s),
            Some([0b11, 0, 0, 0]),
            "FEATURES and PTP"
        );
    }

    #[test]
    fn ptp_returns_real_time_and_the_counter_in_32_bit_halves() {
        let mut s = Svc(None, 0);
        assert_eq!(
            call(0x8600_0001, 0, &mut s),
            Some([0x1, 0x2345_6789, 0xab, 0xcdef_0123]),
            "virtual counter"
        );
        assert_eq!(
            call(0x8600_0001, 1, &mut s),
            Some([0x1, 0x2345_6789, 0xab, 0xcdef_0124]),
            "physical counter"
        );
        assert_eq!(
            call(0x8600_0001, 2, &mut s),
            Some([RET_NOT_SUPPORTED, 0, 0, 0]),
            "no such counter"
        );
        assert_eq!(
            call(0x8600_0001, 0xffff_ffff_0000_0001, &mut s).unwrap()[3],
            0xcdef_0124,
            "W1: the upper half is ignored"
        );
    }
}
