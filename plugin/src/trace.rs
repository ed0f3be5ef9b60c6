//! `trace=`: the executed-instruction trace, its binary format, and the
//! reader `rustkvm-trace` converts it with.
//!
//! # Format (version 1, all integers little-endian)
//!
//! The file starts with the 8 bytes `RKVMTRC1`, then records, each starting
//! with a one-byte type:
//!
//! | type | record | fields |
//! |---|---|---|
//! | 1 | instruction | `u32 id`, `u64 vaddr`, `u8 len`, `len` bytes of code, `u16 n`, `n` bytes of disassembly (UTF-8) |
//! | 2 | execution | `u32 vcpu`, `u32 id`, `u64 index` (the vCPU's counted-instruction index, from 0) |
//! | 3 | memory access | `u32 vcpu`, `u64 vaddr`, `u8 info` (bits 0–3: log2 of the size in bytes; bit 4: store), `u64 value` (the low 64 bits) |
//!
//! An instruction record comes before the first execution naming its id
//! (ids are given at translation, one per distinct address and bytes). A
//! memory access belongs to the execution record before it on the same
//! vCPU. Records of different vCPUs interleave in chunks.

use std::fmt::Write as _;
use std::io::{self, Read};

use crate::report::json_str;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"RKVMTRC1";
/// Record type: an instruction's description.
pub const REC_INSN: u8 = 1;
/// Record type: an execution.
pub const REC_EXEC: u8 = 2;
/// Record type: a memory access.
pub const REC_MEM: u8 = 3;
/// Memory access `info`: store.
pub const MEM_STORE: u8 = 1 << 4;

/// An instruction record's bytes.
pub fn insn_record(id: u32, vaddr: u64, code: &[u8], disas: &str) -> Vec<u8> {
    let code = &code[..code.len().min(255)];
    let disas = &disas.as_bytes()[..disas.len().min(u16::MAX as usize)];
    let mut r = Vec::with_capacity(16 + code.len() + disas.len());
    r.push(REC_INSN);
    r.extend_from_slice(&id.to_le_bytes());
    r.extend_from_slice(&vaddr.to_le_bytes());
    r.push(code.len() as u8);
    r.extend_from_slice(code);
    r.extend_from_slice(&(disas.len() as u16).to_le_bytes());
    r.extend_from_slice(disas);
    r
}

/// Append an execution record.
pub fn push_exec(buf: &mut Vec<u8>, vcpu: u32, id: u32, index: u64) {
    buf.push(REC_EXEC);
    buf.extend_from_slice(&vcpu.to_le_bytes());
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
}

/// Append a memory-access record.
pub fn push_mem(buf: &mut Vec<u8>, vcpu: u32, vaddr: u64, info: u8, value: u64) {
    buf.push(REC_MEM);
    buf.extend_from_slice(&vcpu.to_le_bytes());
    buf.extend_from_slice(&vaddr.to_le_bytes());
    buf.push(info);
    buf.extend_from_slice(&value.to_le_bytes());
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An instruction's description.
    Insn {
        /// Its id.
        id: u32,
        /// Guest virtual address.
        vaddr: u64,
        /// Its bytes.
        code: Vec<u8>,
        /// Its disassembly.
        disas: String,
    },
    /// An execution.
    Exec {
        /// The vCPU.
        vcpu: u32,
        /// The instruction's id.
        id: u32,
        /// The vCPU's counted-instruction index.
        index: u64,
    },
    /// A memory access of the vCPU's last execution.
    Mem {
        /// The vCPU.
        vcpu: u32,
        /// Guest virtual address.
        vaddr: u64,
        /// Size in bytes.
        size: u32,
        /// Store (else load).
        store: bool,
        /// The value (low 64 bits).
        value: u64,
    },
}

/// Reads records from a trace.
#[derive(Debug)]
pub struct Reader<R> {
    input: R,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("rustkvm trace: {what}"))
}

impl<R: Read> Reader<R> {
    /// A reader of `input`, after checking its magic.
    pub fn new(mut input: R) -> io::Result<Self> {
        let mut m = [0u8; 8];
        input.read_exact(&mut m)?;
        if &m != MAGIC {
            return Err(bad("not a trace (no RKVMTRC1 magic)"));
        }
        Ok(Reader { input })
    }

    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.input.read_exact(&mut b)?;
        Ok(b)
    }

    /// The next record; None at the end.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        let mut t = [0u8; 1];
        if self.input.read(&mut t)? == 0 {
            return Ok(None);
        }
        let u32_ = |b: [u8; 4]| u32::from_le_bytes(b);
        let u64_ = |b: [u8; 8]| u64::from_le_bytes(b);
        Ok(Some(match t[0] {
            REC_INSN => {
                let id = u32_(self.bytes()?);
                let vaddr = u64_(self.bytes()?);
                let [len] = self.bytes()?;
                let mut code = vec![0u8; len as usize];
                self.input.read_exact(&mut code)?;
                let n = u16::from_le_bytes(self.bytes()?);
                let mut d = vec![0u8; n as usize];
                self.input.read_exact(&mut d)?;
                Record::Insn {
                    id,
                    vaddr,
                    code,
                    disas: String::from_utf8_lossy(&d).into_owned(),
                }
            }
            REC_EXEC => Record::Exec {
                vcpu: u32_(self.bytes()?),
                id: u32_(self.bytes()?),
                index: u64_(self.bytes()?),
            },
            REC_MEM => {
                let vcpu = u32_(self.bytes()?);
                let vaddr = u64_(self.bytes()?);
                let [info] = self.bytes()?;
                Record::Mem {
                    vcpu,
                    vaddr,
                    size: 1 << (info & 0xf),
                    store: info & MEM_STORE != 0,
                    value: u64_(self.bytes()?),
                }
            }
            other => return Err(bad(&format!("unknown record type {other}"))),
        }))
    }
}

/// Output formats of `rustkvm-trace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// One line per execution, memory accesses indented below it.
    Text,
    /// One JSON object per execution (JSON Lines).
    JsonLines,
}

fn hex(code: &[u8]) -> String {
    code.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Convert a whole trace to `out` in `format`.
pub fn convert(input: impl Read, out: &mut impl io::Write, format: Output) -> io::Result<u64> {
    use std::collections::HashMap;
    let mut r = Reader::new(input)?;
    let mut insns: HashMap<u32, (u64, Vec<u8>, String)> = HashMap::new();
    // JSON Lines: an execution is written once its memory accesses are in.
    let mut pending: HashMap<u32, (String, Vec<String>)> = HashMap::new();
    let mut execs = 0u64;
    let flush = |out: &mut dyn io::Write, line: String, mem: Vec<String>| {
        writeln!(out, "{}, \"mem\": [{}]}}", line, mem.join(", "))
    };
    while let Some(rec) = r.next_record()? {
        match rec {
            Record::Insn {
                id,
                vaddr,
                code,
                disas,
            } => {
                insns.insert(id, (vaddr, code, disas));
            }
            Record::Exec { vcpu, id, index } => {
                execs += 1;
                let (vaddr, code, disas) = insns
                    .get(&id)
                    .ok_or_else(|| bad(&format!("execution of undescribed instruction {id}")))?;
                match format {
                    Output::Text => writeln!(
                        out,
                        "vcpu {vcpu} #{index} {vaddr:#x}: {:<20} {disas}",
                        hex(code)
                    )?,
                    Output::JsonLines => {
                        if let Some((line, mem)) = pending.remove(&vcpu) {
                            flush(out, line, mem)?;
                        }
                        let line = format!(
                            "{{\"vcpu\": {vcpu}, \"index\": {index}, \"vaddr\": \"{vaddr:#x}\", \"bytes\": \"{}\", \"disas\": {}",
                            hex(code),
                            json_str(disas)
                        );
                        pending.insert(vcpu, (line, Vec::new()));
                    }
                }
            }
            Record::Mem {
                vcpu,
                vaddr,
                size,
                store,
                value,
            } => match format {
                Output::Text => writeln!(
                    out,
                    "    {} {size} @ {vaddr:#x}: {value:#x}",
                    if store { "store" } else { "load " }
                )?,
                Output::JsonLines => {
                    if let Some((_, mem)) = pending.get_mut(&vcpu) {
                        mem.push(format!(
                            "{{\"vaddr\": \"{vaddr:#x}\", \"size\": {size}, \"store\": {store}, \"value\": \"{value:#x}\"}}"
                        ));
                    }
                }
            },
        }
    }
    let mut rest: Vec<_> = pending.into_iter().collect();
    rest.sort_by_key(|(v, _)| *v);
    for (_, (line, mem)) in rest {
        flush(out, line, mem)?;
    }
    Ok(execs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut t = MAGIC.to_vec();
        t.extend(insn_record(1, 0x1000, &[0x48, 0xff, 0xc8], "dec rax"));
        t.extend(insn_record(
            2,
            0x1003,
            &[0x89, 0x07],
            "mov dword ptr [rdi], eax",
        ));
        push_exec(&mut t, 0, 1, 41);
        push_exec(&mut t, 0, 2, 42);
        push_mem(&mut t, 0, 0x8000, 2 | MEM_STORE, 7);
        t
    }

    #[test]
    fn records_round_trip() {
        let data = sample();
        let mut r = Reader::new(&data[..]).unwrap();
        let mut all = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            all.push(rec);
        }
        assert_eq!(all.len(), 5);
        assert_eq!(
            all[4],
            Record::Mem {
                vcpu: 0,
                vaddr: 0x8000,
                size: 4,
                store: true,
                value: 7
            }
        );
    }

    #[test]
    fn text_and_json_lines() {
        let mut text = Vec::new();
        assert_eq!(convert(&sample()[..], &mut text, Output::Text).unwrap(), 2);
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("vcpu 0 #41 0x1000: 48ffc8"), "{text}");
        assert!(text.contains("    store 4 @ 0x8000: 0x7"), "{text}");
        let mut jl = Vec::new();
        convert(&sample()[..], &mut jl, Output::JsonLines).unwrap();
        let jl = String::from_utf8(jl).unwrap();
        let lines: Vec<&str> = jl.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].contains("\"mem\": [{\"vaddr\": \"0x8000\", \"size\": 4, \"store\": true"),
            "{jl}"
        );
        assert!(Reader::new(&b"garbage!"[..]).is_err());
    }
}
