//! KVM hypercalls (VMCALL/VMMCALL).
//!
//! Spec: Linux `Documentation/virt/kvm/x86/hypercalls.rst`,
//! `arch/x86/kvm/x86.c` (`kvm_emulate_hypercall`, `____kvm_emulate_hypercall`),
//! `include/uapi/linux/kvm_para.h`.
//!
//! ABI: nr in RAX, arguments in RBX, RCX, RDX, RSI, result in RAX. Outside
//! 64-bit mode the number and arguments are truncated to 32 bits, and so is
//! the result. From CPL > 0 every call returns −KVM_EPERM.
//!
//! The other vendor's instruction (VMCALL on AMD, VMMCALL on Intel) raises
//! #UD, which KVM intercepts and emulates (`handle_ud`, then
//! `arch/x86/kvm/emulate.c`): the emulator's flags for it apply first.
//! VMCALL (`group7_rm0`) is `Priv`, so from CPL > 0 it is #GP(0); VMMCALL
//! (`group7_rm3`) is `Prot`, so in real or virtual-8086 mode it is #UD.
//! Otherwise the call proceeds as the vendor's own would. (KVM also
//! rewrites the instruction in guest memory to the vendor's own,
//! `KVM_X86_QUIRK_FIX_HYPERCALL_INSN`; rustkvm does not write guest code.)

/// KVM_HC_VAPIC_POLL_IRQ: returns 0.
pub const KVM_HC_VAPIC_POLL_IRQ: u64 = 1;
/// KVM_HC_KICK_CPU(flags, apic_id): wake a vCPU halted in a PV spinlock.
pub const KVM_HC_KICK_CPU: u64 = 5;
/// KVM_HC_CLOCK_PAIRING(gpa, type).
pub const KVM_HC_CLOCK_PAIRING: u64 = 9;
/// KVM_HC_SEND_IPI.
pub const KVM_HC_SEND_IPI: u64 = 10;
/// KVM_HC_SCHED_YIELD(apic_id): give up the CPU (to a preempted lock holder).
pub const KVM_HC_SCHED_YIELD: u64 = 11;
/// KVM_HC_MAP_GPA_RANGE.
pub const KVM_HC_MAP_GPA_RANGE: u64 = 12;

/// KVM_ENOSYS: unknown hypercall.
pub const KVM_ENOSYS: u64 = 1000;
/// KVM_EPERM: hypercall from CPL > 0.
pub const KVM_EPERM: u64 = 1;
/// KVM_EOPNOTSUPP: operation not supported.
pub const KVM_EOPNOTSUPP: u64 = 95;
/// KVM_EINVAL: invalid argument.
pub const KVM_EINVAL: u64 = 22;
/// KVM_EFAULT: the guest address could not be written.
pub const KVM_EFAULT: u64 = 14;
/// KVM_CLOCK_PAIRING_WALLCLOCK: the only clock type KVM_HC_CLOCK_PAIRING knows.
pub const KVM_CLOCK_PAIRING_WALLCLOCK: u64 = 0;

/// ICR bit 11: logical destination mode (KVM_HC_SEND_IPI refuses it).
pub const APIC_DEST_MASK: u64 = 0x800;
/// ICR bits 18-19: destination shorthand (refused too).
pub const APIC_SHORT_MASK: u64 = 0xc0000;
/// The ICR bits an IPI carries: vector (0-7), delivery mode (8-10), level
/// (14), trigger mode (15) — also the layout of an MSI's data word.
pub const APIC_IPI_BITS: u32 = 0xc7ff;

/// A hypercall as the guest made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// RAX.
    pub nr: u64,
    /// RBX, RCX, RDX, RSI.
    pub args: [u64; 4],
    /// Current privilege level.
    pub cpl: u8,
    /// 64-bit mode (long mode with CS.L): otherwise 32-bit operands.
    pub long_mode: bool,
    /// Which instruction made it, against the vCPU's vendor.
    pub insn: Insn,
    /// Protected mode (CR0.PE set, EFLAGS.VM clear).
    pub protected: bool,
}

/// The instruction of a hypercall, against the vCPU's vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insn {
    /// The vendor's own: VMCALL on Intel (VMX exit), VMMCALL on AMD
    /// (SVM intercept).
    Native,
    /// VMCALL (0F 01 C1) on an AMD vCPU: #UD, emulated; `Priv`.
    VmcallOnAmd,
    /// VMMCALL (0F 01 D9) on an Intel vCPU: #UD, emulated; `Prot`.
    VmmcallOnIntel,
}

impl Insn {
    /// The instruction (`vmmcall`: 0F 01 D9, else VMCALL) on a vCPU that
    /// is AMD's or not.
    pub fn of(vmmcall: bool, amd: bool) -> Self {
        match (vmmcall, amd) {
            (true, false) => Insn::VmmcallOnIntel,
            (false, true) => Insn::VmcallOnAmd,
            _ => Insn::Native,
        }
    }
}

/// An exception the hypercall instruction raises instead of calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// #GP(0).
    Gp,
    /// #UD.
    Ud,
}

/// What the accelerator must do besides writing RAX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// End this vCPU's turn (KVM_HC_SCHED_YIELD).
    Yield,
    /// Unhalt the vCPU with this APIC ID (KVM_HC_KICK_CPU), then yield.
    Kick(u64),
    /// Raise this exception at the instruction; RAX is not written.
    Fault(Fault),
}

/// The APIC IDs a KVM_HC_SEND_IPI addresses, as `kvm_pv_send_ipi` walks
/// them: set bits of `low` from `min`, of `high` from `min + cluster`.
pub fn ipi_targets(low: u64, high: u64, min: u64, cluster: u32) -> impl Iterator<Item = u32> {
    let bits = move |map: u64, base: u64| {
        (0..cluster.min(64))
            .filter(move |i| map >> i & 1 != 0)
            .filter_map(move |i| {
                base.checked_add(u64::from(i))
                    .and_then(|id| u32::try_from(id).ok())
            })
    };
    bits(low, min).chain(bits(high, min.saturating_add(u64::from(cluster))))
}

/// The result of a hypercall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// New RAX.
    pub ret: u64,
    /// Side effect for the accelerator.
    pub action: Action,
}

/// Which PV features the guest was offered (KVM checks them only with
/// KVM_CAP_ENFORCE_PV_FEATURE_CPUID, which QEMU leaves off by default: then
/// every implemented hypercall works).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforce(pub Option<u32>);

impl Enforce {
    /// Whether `feature` (a KVM_FEATURE_* bit) may be used.
    pub fn allows(self, feature: u32) -> bool {
        self.0.is_none_or(|f| f & feature != 0)
    }
}

/// What hypercalls need from the vCPU and the machine.
pub trait Services {
    /// Send an IPI (`icr`: the ICR's IPI bits) to the vCPU with `apic_id`,
    /// physical destination; false if there is no such vCPU.
    fn send_ipi(&mut self, apic_id: u32, icr: u32) -> bool;
    /// Write a `struct kvm_clock_pairing` (host real time and the guest TSC
    /// at the same instant) at `gpa`; false if that is not guest RAM.
    fn clock_pairing(&mut self, gpa: u64) -> bool;
}

/// Decode and execute a hypercall. KVM_HC_SEND_IPI sends an IPI to each
/// addressed vCPU and returns how many exist; KVM_HC_CLOCK_PAIRING writes
/// the pairing structure (`kvm_pv_clock_pairing`).
#[inline]
pub fn handle(call: Call, enforce: Enforce, svc: &mut dyn Services) -> Outcome {
    use super::cpuid::{
        KVM_FEATURE_PV_SCHED_YIELD, KVM_FEATURE_PV_SEND_IPI, KVM_FEATURE_PV_UNHALT,
    };
    let mask = if call.long_mode {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    };
    // The emulator's checks of the other vendor's instruction come first
    // (x86_emulate_insn: Priv, then Prot).
    let fault = match call.insn {
        Insn::VmcallOnAmd if call.cpl != 0 => Some(Fault::Gp),
        Insn::VmmcallOnIntel if !call.protected => Some(Fault::Ud),
        _ => None,
    };
    if let Some(f) = fault {
        return Outcome {
            ret: call.nr,
            action: Action::Fault(f),
        };
    }
    let nr = call.nr & mask;
    let a = call.args.map(|x| x & mask);
    let neg = |e: u64| e.wrapping_neg();
    let (ret, action) = if call.cpl != 0 {
        (neg(KVM_EPERM), Action::None)
    } else {
        match nr {
            KVM_HC_VAPIC_POLL_IRQ => (0, Action::None),
            KVM_HC_KICK_CPU if enforce.allows(KVM_FEATURE_PV_UNHALT) => (0, Action::Kick(a[1])),
            KVM_HC_SCHED_YIELD if enforce.allows(KVM_FEATURE_PV_SCHED_YIELD) => (0, Action::Yield),
            KVM_HC_SEND_IPI if enforce.allows(KVM_FEATURE_PV_SEND_IPI) => {
                if a[3] & (APIC_DEST_MASK | APIC_SHORT_MASK) != 0 {
                    (neg(KVM_EINVAL), Action::None)
                } else {
                    let cluster = if call.long_mode { 64 } else { 32 };
                    let icr = a[3] as u32 & APIC_IPI_BITS;
                    let min = a[2] & u64::from(u32::MAX);
                    let sent = ipi_targets(a[0], a[1], min, cluster)
                        .filter(|&apic| svc.send_ipi(apic, icr))
                        .count() as u64;
                    (sent, Action::None)
                }
            }
            // 64-bit only in KVM (CONFIG_X86_64 guests make it in 64-bit mode).
            KVM_HC_CLOCK_PAIRING if a[1] != KVM_CLOCK_PAIRING_WALLCLOCK => {
                (neg(KVM_EOPNOTSUPP), Action::None)
            }
            KVM_HC_CLOCK_PAIRING if svc.clock_pairing(a[0]) => (0, Action::None),
            KVM_HC_CLOCK_PAIRING => (neg(KVM_EFAULT), Action::None),
            _ => (neg(KVM_ENOSYS), Action::None),
        }
    };
    Outcome {
        ret: ret & mask,
        action,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test services: IPIs through `ipi`; clock pairing works below 4 GiB.
    struct Svc<F: FnMut(u32, u32) -> bool>(F);
    impl<F: FnMut(u32, u32) -> bool> Services for Svc<F> {
        fn send_ipi(&mut self, apic_id: u32, icr: u32) -> bool {
            (self.0)(apic_id, icr)
        }
        fn clock_pairing(&mut self, gpa: u64) -> bool {
            gpa < 1 << 32
        }
    }

    /// `handle` with an IPI sink that accepts APIC IDs below 4.
    fn handle(c: Call, e: Enforce) -> Outcome {
        super::handle(c, e, &mut Svc(|apic, _| apic < 4))
    }

    fn call(nr: u64) -> Call {
        Call {
            nr,
            args: [0; 4],
            cpl: 0,
            long_mode: true,
            insn: Insn::Native,
            protected: true,
        }
    }
    const OFF: Enforce = Enforce(None);

    #[test]
    fn unknown_numbers_return_minus_kvm_enosys() {
        for nr in [
            0,
            2,
            3,
            4,
            6,
            7,
            8,
            KVM_HC_MAP_GPA_RANGE,
            13,
            1 << 40,
            u64::MAX,
        ] {
            let o = handle(call(nr), OFF);
            assert_eq!(o.ret as i64, -1000, "nr {nr}");
            assert_eq!(o.action, Action::None);
        }
    }

    #[test]
    fn cpl_above_zero_gets_minus_kvm_eperm_for_everything() {
        for cpl in 1..=3 {
            for nr in [
                KVM_HC_VAPIC_POLL_IRQ,
                KVM_HC_KICK_CPU,
                KVM_HC_SCHED_YIELD,
                77,
            ] {
                let o = handle(Call { cpl, ..call(nr) }, OFF);
                assert_eq!((o.ret as i64, o.action), (-1, Action::None));
            }
        }
    }

    #[test]
    fn the_instruction_is_told_apart_by_vendor() {
        assert_eq!(Insn::of(false, false), Insn::Native);
        assert_eq!(Insn::of(true, true), Insn::Native);
        assert_eq!(Insn::of(false, true), Insn::VmcallOnAmd);
        assert_eq!(Insn::of(true, false), Insn::VmmcallOnIntel);
    }

    /// KVM's emulator, which the other vendor's instruction reaches through
    /// #UD: VMCALL is `Priv` (#GP(0) from CPL > 0), VMMCALL `Prot` (#UD in
    /// real and virtual-8086 mode); past those checks it is a hypercall.
    #[test]
    fn the_other_vendors_instruction_faults_as_kvms_emulator_says() {
        for cpl in 0..=3 {
            for protected in [false, true] {
                for insn in [Insn::Native, Insn::VmcallOnAmd, Insn::VmmcallOnIntel] {
                    let c = Call {
                        cpl,
                        protected,
                        insn,
                        ..call(KVM_HC_VAPIC_POLL_IRQ)
                    };
                    let want = match insn {
                        Insn::VmcallOnAmd if cpl != 0 => Action::Fault(Fault::Gp),
                        Insn::VmmcallOnIntel if !protected => Action::Fault(Fault::Ud),
                        _ => Action::None,
                    };
                    let o = handle(c, OFF);
                    assert_eq!(o.action, want, "{insn:?} cpl {cpl} protected {protected}");
                    let ret = match (want, cpl) {
                        (Action::Fault(_), _) => KVM_HC_VAPIC_POLL_IRQ,
                        (_, 0) => 0,
                        _ => KVM_EPERM.wrapping_neg(),
                    };
                    assert_eq!(o.ret, ret, "{insn:?} cpl {cpl}: RAX kept on a fault");
                }
            }
        }
    }

    #[test]
    fn thirty_two_bit_mode_truncates_number_arguments_and_result() {
        let c = Call {
            nr: 0xffff_ffff_0000_0000 | KVM_HC_KICK_CPU,
            args: [0, 0xdead_0000_0000_0003, 0, 0],
            long_mode: false,
            ..call(0)
        };
        assert_eq!(
            handle(c, OFF),
            Outcome {
                ret: 0,
                action: Action::Kick(3)
            }
        );
        let o = handle(
            Call {
                nr: 99,
                long_mode: false,
                ..call(0)
            },
            OFF,
        );
        assert_eq!(o.ret, u64::from((-1000i32) as u32), "(u32)-KVM_ENOSYS");
        let o = handle(Call { nr: 99, ..call(0) }, OFF);
        assert_eq!(o.ret, (-1000i64) as u64);
    }

    #[test]
    fn implemented_calls() {
        assert_eq!(handle(call(KVM_HC_VAPIC_POLL_IRQ), OFF).ret, 0);
        let kick = Call {
            args: [0, 7, 0, 0],
            ..call(KVM_HC_KICK_CPU)
        };
        assert_eq!(
            handle(kick, OFF),
            Outcome {
                ret: 0,
                action: Action::Kick(7)
            }
        );
        assert_eq!(
            handle(call(KVM_HC_SCHED_YIELD), OFF),
            Outcome {
                ret: 0,
                action: Action::Yield
            }
        );
        let pair = |gpa, kind| Call {
            args: [gpa, kind, 0, 0],
            ..call(KVM_HC_CLOCK_PAIRING)
        };
        assert_eq!(handle(pair(0x1000, 0), OFF).ret, 0, "wall clock");
        assert_eq!(handle(pair(0x1000, 1), OFF).ret as i64, -95, "other clocks");
        assert_eq!(handle(pair(1 << 40, 0), OFF).ret as i64, -14, "not RAM");
    }

    #[test]
    fn send_ipi_decodes_like_kvm_pv_send_ipi() {
        let mut sent = Vec::new();
        let c = Call {
            args: [0b101, 0b1, 1, 0x4000 | 0x0400 | 0xfd],
            ..call(KVM_HC_SEND_IPI)
        };
        let o = super::handle(
            c,
            OFF,
            &mut Svc(|apic, icr| {
                sent.push((apic, icr));
                apic < 4
            }),
        );
        assert_eq!(sent, vec![(1, 0x44fd), (3, 0x44fd), (65, 0x44fd)]);
        assert_eq!(
            o,
            Outcome {
                ret: 2,
                action: Action::None
            },
            "APIC 65 does not exist"
        );
        assert_eq!(
            ipi_targets(0b101, 1, 3, 64).collect::<Vec<_>>(),
            vec![3, 5, 67]
        );
        // 32-bit mode: 32-bit bitmaps and clusters, 32-bit result.
        let c32 = Call {
            long_mode: false,
            args: [0xffff_ffff_0000_0002, 1, 0, 0xfd],
            ..call(KVM_HC_SEND_IPI)
        };
        let mut ids = Vec::new();
        super::handle(
            c32,
            OFF,
            &mut Svc(|apic, _| {
                ids.push(apic);
                true
            }),
        );
        assert_eq!(ids, vec![1, 32]);
        // Logical destination or a shorthand: -KVM_EINVAL, nothing sent.
        for icr in [0x800, 0x40000, 0x80000] {
            let o = super::handle(
                Call {
                    args: [1, 0, 0, icr | 0xfd],
                    ..call(KVM_HC_SEND_IPI)
                },
                OFF,
                &mut Svc(|_, _| panic!("sent")),
            );
            assert_eq!(
                (o.ret as i64, o.action),
                (-22, Action::None),
                "icr {icr:#x}"
            );
        }
        // A huge min never wraps around to low APIC IDs.
        assert_eq!(ipi_targets(1 << 63, 1, u64::MAX - 1, 64).count(), 0);
    }

    #[test]
    fn enforced_cpuid_turns_unoffered_calls_into_enosys() {
        let none = Enforce(Some(0));
        assert_eq!(handle(call(KVM_HC_KICK_CPU), none).ret as i64, -1000);
        assert_eq!(handle(call(KVM_HC_SCHED_YIELD), none).ret as i64, -1000);
        assert_eq!(handle(call(KVM_HC_VAPIC_POLL_IRQ), none).ret, 0);
    }
}
