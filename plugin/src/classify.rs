//! What each translated instruction is, decided once at translation with
//! capstone: its class, whether it is a branch, and whether it may leave
//! the translation block early (fault, trap, exit to the CPU loop).
//!
//! Exactness (see docs/plugin.md): QEMU's contrib `insn` plugin counts an
//! instruction when it starts executing. This plugin adds counts per
//! *group* — a run of instructions of which only the last may leave the
//! block — at the group's first instruction: execution reaches the first
//! instruction of a group exactly when it reaches all of them, so the totals
//! equal per-instruction counting with one add per group instead of one per
//! instruction. "May leave" is decided conservatively: anything that touches
//! memory, a system, FP/SIMD or control register, divides (x86 #DE), or is
//! not on a list of plain register operations.

use capstone::arch::{self, ArchOperand, BuildsCapstone};
use capstone::{Capstone, InsnGroupType};

/// Guest architectures the plugin understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// x86_64 guests (16-, 32- and 64-bit code).
    X86,
    /// aarch64 guests (A64 code).
    Aarch64,
}

impl Arch {
    /// From QEMU's `target_name`.
    pub fn from_target(name: &str) -> Option<Arch> {
        match name {
            "x86_64" | "i386" => Some(Arch::X86),
            "aarch64" => Some(Arch::Aarch64),
            _ => None,
        }
    }
}

/// Instruction classes (howvec-like), reported as `class_<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Branches, calls, returns.
    Branch = 0,
    /// Instructions with a memory operand.
    LoadStore = 1,
    /// Integer register operations.
    Alu = 2,
    /// Floating point and SIMD.
    FpSimd = 3,
    /// System, privileged, exception-generating.
    System = 4,
    /// Anything else (or not decodable).
    Other = 5,
}

impl Class {
    /// Every class, in reporting order.
    pub const ALL: [Class; 6] = [
        Class::Branch,
        Class::LoadStore,
        Class::Alu,
        Class::FpSimd,
        Class::System,
        Class::Other,
    ];
    /// Counter name.
    pub fn name(self) -> &'static str {
        match self {
            Class::Branch => "class_branch",
            Class::LoadStore => "class_load_store",
            Class::Alu => "class_alu",
            Class::FpSimd => "class_fp_simd",
            Class::System => "class_system",
            Class::Other => "class_other",
        }
    }
}

/// What the plugin knows about one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsnInfo {
    /// Its class.
    pub class: Class,
    /// A branch instruction (retires as one, taken or not).
    pub branch: bool,
    /// It may end the block's execution early.
    pub may_exit: bool,
}

impl InsnInfo {
    /// Something capstone could not decode: assume the worst.
    pub const UNKNOWN: InsnInfo = InsnInfo {
        class: Class::Other,
        branch: false,
        may_exit: true,
    };
}

/// A run of instructions counted with one add per counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Group {
    /// Index of its first instruction in the block.
    pub start: usize,
    /// Instructions in it.
    pub insns: u64,
    /// Branches in it.
    pub branches: u64,
    /// Instructions per class (indexed by `Class as usize`).
    pub classes: [u64; 6],
}

/// Split a block's instructions into groups: a group ends after an
/// instruction that may exit (and at the end of the block).
pub fn groups(insns: &[InsnInfo]) -> Vec<Group> {
    groups_of(insns, |_| true)
}

/// As [`groups`], counting only the instructions `counted(i)` says: a group
/// also ends before an instruction that is not counted.
pub fn groups_of(insns: &[InsnInfo], counted: impl Fn(usize) -> bool) -> Vec<Group> {
    let mut out = Vec::new();
    let mut g = Group::default();
    for (i, info) in insns.iter().enumerate() {
        if !counted(i) {
            if g.insns > 0 {
                out.push(g);
                g = Group::default();
            }
            continue;
        }
        if g.insns == 0 {
            g.start = i;
        }
        g.insns += 1;
        g.branches += u64::from(info.branch);
        g.classes[info.class as usize] += 1;
        if info.may_exit {
            out.push(g);
            g = Group::default();
        }
    }
    if g.insns > 0 {
        out.push(g);
    }
    out
}

/// Mnemonics of x86 register-only operations that cannot fault (no divide,
/// no string, no I/O, no privileged or FP/SIMD instruction).
const X86_SAFE: &[&str] = &[
    "mov", "movabs", "movzx", "movsx", "movsxd", "add", "adc", "sub", "sbb", "and", "or", "xor",
    "cmp", "test", "inc", "dec", "neg", "not", "lea", "shl", "shr", "sar", "sal", "rol", "ror",
    "rcl", "rcr", "shld", "shrd", "imul", "mul", "bswap", "xchg", "bt", "bts", "btr", "btc", "bsf",
    "bsr", "tzcnt", "lzcnt", "popcnt", "andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "sarx",
    "shlx", "shrx", "rorx", "pdep", "pext", "cbw", "cwde", "cdqe", "cwd", "cdq", "cqo", "nop",
    "endbr64", "endbr32", "clc", "stc", "cmc", "cld", "std", "lahf", "sahf",
];

/// Mnemonics of A64 register-only integer operations that cannot trap.
const A64_SAFE: &[&str] = &[
    "add", "adds", "sub", "subs", "and", "ands", "orr", "eor", "eon", "bic", "bics", "orn", "mov",
    "movz", "movn", "movk", "mvn", "neg", "negs", "cmp", "cmn", "tst", "lsl", "lsr", "asr", "ror",
    "lslv", "lsrv", "asrv", "rorv", "madd", "msub", "mul", "mneg", "smull", "umull", "smulh",
    "umulh", "smaddl", "umaddl", "smsubl", "umsubl", "sdiv", "udiv", "csel", "csinc", "csinv",
    "csneg", "cset", "csetm", "cinc", "cinv", "cneg", "adr", "adrp", "ubfx", "sbfx", "ubfiz",
    "sbfiz", "bfi", "bfxil", "bfm", "ubfm", "sbfm", "extr", "sxtb", "sxth", "sxtw", "uxtb", "uxth",
    "rbit", "rev", "rev16", "rev32", "clz", "cls", "ccmp", "ccmn", "adc", "adcs", "sbc", "sbcs",
    "ngc", "ngcs", "nop",
];

/// A decoder for one architecture (one per translating thread: capstone
/// handles are not shared between threads).
pub struct Classifier {
    arch: Arch,
    modes: Vec<Capstone>,
}

impl std::fmt::Debug for Classifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier")
            .field("arch", &self.arch)
            .finish()
    }
}

impl Classifier {
    /// A classifier for `arch`; None if capstone cannot be set up.
    pub fn new(arch: Arch) -> Option<Classifier> {
        let modes = match arch {
            // The plugin API does not say which x86 mode the code runs in:
            // try 64-bit first, then 32 and 16, and keep the decoding whose
            // length matches what QEMU translated.
            Arch::X86 => [
                arch::x86::ArchMode::Mode64,
                arch::x86::ArchMode::Mode32,
                arch::x86::ArchMode::Mode16,
            ]
            .into_iter()
            .map(|m| Capstone::new().x86().mode(m).detail(true).build().ok())
            .collect::<Option<Vec<_>>>()?,
            Arch::Aarch64 => vec![Capstone::new()
                .arm64()
                .mode(arch::arm64::ArchMode::Arm)
                .detail(true)
                .build()
                .ok()?],
        };
        Some(Classifier { arch, modes })
    }

    /// Classify the instruction `bytes` that QEMU translated as `len` bytes.
    pub fn classify(&self, bytes: &[u8], len: usize) -> InsnInfo {
        for cs in &self.modes {
            let Ok(insns) = cs.disasm_count(bytes, 0, 1) else {
                continue;
            };
            let Some(insn) = insns.iter().next() else {
                continue;
            };
            if insn.len() != len {
                continue;
            }
            let Ok(detail) = cs.insn_detail(insn) else {
                return InsnInfo::UNKNOWN;
            };
            let mnemonic = insn.mnemonic().unwrap_or("");
            let in_group = |g: u32| detail.groups().iter().any(|id| u32::from(id.0) == g);
            let branch = in_group(InsnGroupType::CS_GRP_JUMP)
                || in_group(InsnGroupType::CS_GRP_CALL)
                || in_group(InsnGroupType::CS_GRP_RET)
                || in_group(InsnGroupType::CS_GRP_IRET)
                || in_group(InsnGroupType::CS_GRP_BRANCH_RELATIVE) && mnemonic != "adr";
            let system =
                in_group(InsnGroupType::CS_GRP_INT) || in_group(InsnGroupType::CS_GRP_PRIVILEGE);
            let ops = detail.arch_detail().operands();
            let mut mem = false;
            let mut special_reg = false;
            for op in &ops {
                match op {
                    ArchOperand::X86Operand(o) => match o.op_type {
                        arch::x86::X86OperandType::Mem(_) => mem |= mnemonic != "lea",
                        arch::x86::X86OperandType::Reg(r) => {
                            special_reg |= cs.reg_name(r).is_some_and(|n| x86_special_reg(&n));
                        }
                        _ => {}
                    },
                    ArchOperand::Arm64Operand(o) => match o.op_type {
                        arch::arm64::Arm64OperandType::Mem(_) => mem = true,
                        arch::arm64::Arm64OperandType::Reg(r) => {
                            special_reg |= cs.reg_name(r).is_some_and(|n| !a64_gpr(&n));
                        }
                        arch::arm64::Arm64OperandType::Imm(_)
                        | arch::arm64::Arm64OperandType::Cimm(_)
                        | arch::arm64::Arm64OperandType::Invalid => {}
                        _ => special_reg = true,
                    },
                    _ => special_reg = true,
                }
            }
            let safe_list = match self.arch {
                Arch::X86 => X86_SAFE,
                Arch::Aarch64 => A64_SAFE,
            };
            let plain = safe_list.contains(&mnemonic)
                || self.arch == Arch::X86
                    && (mnemonic.starts_with("cmov") || mnemonic.starts_with("set"));
            let fp = special_reg && !system && !branch && self.fp_regs(&ops, cs);
            let class = if branch {
                Class::Branch
            } else if system {
                Class::System
            } else if mem {
                Class::LoadStore
            } else if fp {
                Class::FpSimd
            } else if plain && !special_reg {
                Class::Alu
            } else {
                Class::Other
            };
            let may_exit = branch || mem || special_reg || !plain;
            return InsnInfo {
                class,
                branch,
                may_exit,
            };
        }
        InsnInfo::UNKNOWN
    }

    fn fp_regs(&self, ops: &[ArchOperand], cs: &Capstone) -> bool {
        ops.iter().any(|op| {
            let reg = match op {
                ArchOperand::X86Operand(o) => match o.op_type {
                    arch::x86::X86OperandType::Reg(r) => r,
                    _ => return false,
                },
                ArchOperand::Arm64Operand(o) => match o.op_type {
                    arch::arm64::Arm64OperandType::Reg(r) => r,
                    _ => return false,
                },
                _ => return false,
            };
            cs.reg_name(reg).is_some_and(|n| match self.arch {
                Arch::X86 => {
                    n.starts_with("xmm")
                        || n.starts_with("ymm")
                        || n.starts_with("zmm")
                        || n.starts_with("st")
                        || n.starts_with("mm")
                }
                Arch::Aarch64 => {
                    matches!(
                        n.as_bytes().first(),
                        Some(b'v' | b'q' | b'd' | b's' | b'h' | b'b')
                    ) && n != "sp"
                }
            })
        })
    }
}

/// x86 registers whose use may fault or is not plain integer work:
/// segment, control, debug, FP/SIMD, mask registers.
fn x86_special_reg(name: &str) -> bool {
    matches!(name, "es" | "cs" | "ss" | "ds" | "fs" | "gs")
        || name.starts_with("cr")
        || name.starts_with("dr")
        || name.starts_with("xmm")
        || name.starts_with("ymm")
        || name.starts_with("zmm")
        || name.starts_with("st")
        || name.starts_with("mm")
        || name.starts_with('k') && name.len() == 2
}

/// A64 general-purpose registers (and the zero and stack registers).
fn a64_gpr(name: &str) -> bool {
    let num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    matches!(name, "sp" | "wsp" | "xzr" | "wzr" | "fp" | "lr")
        || name.strip_prefix('x').is_some_and(num)
        || name.strip_prefix('w').is_some_and(num)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x86(bytes: &[u8]) -> InsnInfo {
        Classifier::new(Arch::X86)
            .unwrap()
            .classify(bytes, bytes.len())
    }
    fn a64(word: u32) -> InsnInfo {
        Classifier::new(Arch::Aarch64)
            .unwrap()
            .classify(&word.to_le_bytes(), 4)
    }

    #[test]
    fn x86_register_alu_is_safe_and_everything_else_may_exit() {
        let alu = x86(&[0x48, 0x01, 0xd8]); // add rax, rbx
        assert_eq!(
            (alu.class, alu.branch, alu.may_exit),
            (Class::Alu, false, false)
        );
        let lea = x86(&[0x48, 0x8d, 0x04, 0x18]); // lea rax, [rax+rbx]
        assert_eq!(
            (lea.class, lea.may_exit),
            (Class::Alu, false),
            "LEA reads no memory"
        );
        let load = x86(&[0x48, 0x8b, 0x03]); // mov rax, [rbx]
        assert_eq!((load.class, load.may_exit), (Class::LoadStore, true));
        let div = x86(&[0xf7, 0xf3]); // div ebx: #DE
        assert!(div.may_exit);
        let jnz = x86(&[0x75, 0xfe]); // jnz .
        assert_eq!(
            (jnz.class, jnz.branch, jnz.may_exit),
            (Class::Branch, true, true)
        );
        let cr = x86(&[0x0f, 0x22, 0xc0]); // mov cr0, rax
        assert!(cr.may_exit, "{cr:?}");
        let sse = x86(&[0x66, 0x0f, 0xef, 0xc0]); // pxor xmm0, xmm0
        assert_eq!((sse.class, sse.may_exit), (Class::FpSimd, true));
        let vmcall = x86(&[0x0f, 0x01, 0xc1]);
        assert!(vmcall.may_exit);
        let cmov = x86(&[0x48, 0x0f, 0x44, 0xc3]); // cmove rax, rbx
        assert!(!cmov.may_exit);
        assert!(x86(&[0x0f, 0x0b]).may_exit, "ud2");
    }

    #[test]
    fn x86_mode_follows_the_length_qemu_translated() {
        let c = Classifier::new(Arch::X86).unwrap();
        // b8 imm32: mov eax, imm32 is 5 bytes in 32/64-bit code, 3 in 16-bit.
        let bytes = [0xb8, 0x01, 0x00, 0x02, 0x00];
        assert_eq!(c.classify(&bytes, 5).class, Class::Alu);
        assert_eq!(c.classify(&bytes[..3], 3).class, Class::Alu, "16-bit");
        assert_eq!(
            c.classify(&bytes, 4),
            InsnInfo::UNKNOWN,
            "no mode decodes 4"
        );
    }

    #[test]
    fn a64_classes() {
        let add = a64(0x8b02_0020); // add x0, x1, x2
        assert_eq!((add.class, add.may_exit), (Class::Alu, false));
        let ldr = a64(0xf940_0020); // ldr x0, [x1]
        assert_eq!((ldr.class, ldr.may_exit), (Class::LoadStore, true));
        let bne = a64(0x5400_0001); // b.ne .
        assert_eq!((bne.class, bne.branch), (Class::Branch, true));
        let ret = a64(0xd65f_03c0);
        assert!(ret.branch);
        let svc = a64(0xd400_0001); // svc #0
        assert!(svc.may_exit && !svc.branch);
        let mrs = a64(0xd53b_9c00); // mrs x0, pmcr_el0
        assert!(mrs.may_exit);
        let fadd = a64(0x1e22_2820); // fadd s0, s1, s2
        assert_eq!((fadd.class, fadd.may_exit), (Class::FpSimd, true));
        let adrp = a64(0x9000_0000); // adrp x0, .
        assert_eq!(
            (adrp.class, adrp.branch, adrp.may_exit),
            (Class::Alu, false, false)
        );
    }

    #[test]
    fn groups_end_after_instructions_that_may_exit() {
        let alu = InsnInfo {
            class: Class::Alu,
            branch: false,
            may_exit: false,
        };
        let load = InsnInfo {
            class: Class::LoadStore,
            branch: false,
            may_exit: true,
        };
        let br = InsnInfo {
            class: Class::Branch,
            branch: true,
            may_exit: true,
        };
        let g = groups(&[alu, alu, load, alu, load, load, alu, br]);
        let shape: Vec<(usize, u64, u64)> =
            g.iter().map(|g| (g.start, g.insns, g.branches)).collect();
        assert_eq!(shape, vec![(0, 3, 0), (3, 2, 0), (5, 1, 0), (6, 2, 1)]);
        assert_eq!(g.iter().map(|g| g.insns).sum::<u64>(), 8);
        assert_eq!(g[0].classes[Class::Alu as usize], 2);
        assert_eq!(
            groups(&[alu, alu]),
            vec![Group {
                start: 0,
                insns: 2,
                branches: 0,
                classes: [0, 0, 2, 0, 0, 0]
            }]
        );
        assert!(groups(&[]).is_empty());
        // Only instructions 1..=3 counted (an address filter).
        let g = groups_of(&[alu, alu, alu, alu, alu], |i| (1..=3).contains(&i));
        assert_eq!(
            g.iter().map(|g| (g.start, g.insns)).collect::<Vec<_>>(),
            vec![(1, 3)]
        );
        let g = groups_of(&[alu, alu, alu], |i| i != 1);
        assert_eq!(
            g.iter().map(|g| (g.start, g.insns)).collect::<Vec<_>>(),
            vec![(0, 1), (2, 1)]
        );
    }
}
