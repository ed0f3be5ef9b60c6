//! `bbv=` and `drcov=`: what the plugin knows of each distinct block, and
//! the two file formats.
//!
//! - Basic-block vectors, SimPoint's `.bb` format as QEMU's contrib `bbv`
//!   plugin writes it: per vCPU a file `PATH.N.bb`, one line per interval,
//!   `T` then `:ID:COUNT ` for each block that executed in it, COUNT being
//!   the (counted) instructions it executed. IDs start at 1, as SimPoint's
//!   reader wants (contrib `bbv` starts at 0). A last line holds the partial
//!   interval at exit, so the counts add up to every instruction counted.
//! - Coverage in drcov format (version 2, as DynamoRIO's drcov and QEMU's
//!   contrib `drcov` write it, which coverage tools such as lighthouse
//!   read): a text header with a module table, then `BB Table: N bbs` and N
//!   binary entries `{u32 start; u16 size; u16 mod_id}` (little-endian),
//!   `start` an offset from the module's base. Guest addresses do not fit
//!   in 32 bits, so each 4 GiB window of the address space that holds an
//!   executed block is a module of its own (base = the window's start).
//!
//! Blocks are identified as for `hot=` ([`BlockKey`]: first instruction's
//! address and instruction count), so retranslations share an ID.

use std::fmt::Write as _;

use crate::hot::{BlockKey, Distinct};

/// One distinct block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block<S> {
    /// Its ID in the `.bb` files (1-based, in order of first translation).
    pub id: u32,
    /// Its bytes of guest code (for drcov).
    pub bytes: u32,
    /// Per-vCPU counters (in the plugin: QEMU scoreboards): instructions in
    /// the current interval, and executions (for drcov).
    pub counters: S,
}

/// `bbv=`'s and `drcov=`'s table: per distinct block, its ID, size and
/// counters.
pub type BlockTable<S> = Distinct<Block<S>>;

impl<S: Copy> Distinct<Block<S>> {
    /// The block `key`'s counters; `make` (which allocates them) runs only
    /// the first time it is translated; None once the table is full.
    pub fn counters(&mut self, key: BlockKey, bytes: u32, make: impl FnOnce() -> S) -> Option<S> {
        self.get_or_insert(key, |i| Block {
            id: i as u32 + 1,
            bytes,
            counters: make(),
        })
        .map(|b| b.counters)
    }
}

/// One `.bb` line from (ID, count) pairs (zero counts left out); None if
/// nothing executed.
pub fn bb_line(counts: impl IntoIterator<Item = (u32, u64)>) -> Option<String> {
    let mut line = String::from("T");
    let mut any = false;
    for (id, n) in counts {
        if n > 0 {
            let _ = write!(line, ":{id}:{n} ");
            any = true;
        }
    }
    line.push('\n');
    any.then_some(line)
}

/// The drcov file for the executed blocks (`(start address, bytes)`),
/// naming each module `path`.
pub fn drcov(executed: &[(u64, u32)], path: &str) -> Vec<u8> {
    const WINDOW: u64 = 1 << 32;
    let mut bases: Vec<u64> = executed.iter().map(|(a, _)| a & !(WINDOW - 1)).collect();
    bases.sort_unstable();
    bases.dedup();
    let mut out = format!(
        "DRCOV VERSION: 2\nDRCOV FLAVOR: drcov-64\nModule Table: version 2, count {}\nColumns: id, base, end, entry, path\n",
        bases.len()
    );
    for (id, base) in bases.iter().enumerate() {
        let _ = writeln!(
            out,
            "{id}, {base:#018x}, {:#018x}, 0x0000000000000000, {path}",
            base + (WINDOW - 1)
        );
    }
    let _ = writeln!(out, "BB Table: {} bbs", executed.len());
    let mut bytes = out.into_bytes();
    for &(addr, size) in executed {
        let base = addr & !(WINDOW - 1);
        let module = bases.binary_search(&base).unwrap_or(0) as u16;
        bytes.extend_from_slice(&((addr - base) as u32).to_le_bytes());
        bytes.extend_from_slice(&(size.min(u32::from(u16::MAX)) as u16).to_le_bytes());
        bytes.extend_from_slice(&module.to_le_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_per_distinct_block_from_1() {
        let mut t = BlockTable::default();
        let k = |vaddr, insns| BlockKey { vaddr, insns };
        assert_eq!(t.counters(k(0x1000, 4), 12, || 'a'), Some('a'));
        assert_eq!(t.counters(k(0x2000, 2), 5, || 'b'), Some('b'));
        assert_eq!(
            t.counters(k(0x1000, 4), 12, || 'c'),
            Some('a'),
            "retranslated"
        );
        let ids: Vec<u32> = t.iter().map(|(_, b)| b.id).collect();
        assert_eq!(ids, [1, 2]);
    }

    #[test]
    fn bb_lines_leave_out_blocks_that_did_not_run() {
        assert_eq!(
            bb_line([(1, 24), (2, 0), (3, 100)]).as_deref(),
            Some("T:1:24 :3:100 \n")
        );
        assert_eq!(bb_line([(1, 0)]), None);
    }

    #[test]
    fn drcov_has_a_module_per_4_gib_window() {
        let f = drcov(&[(0x10_0000, 12), (0xffff_ffff_8100_0010, 70_000)], "guest");
        let text_end = f.windows(4).position(|w| w == b"bbs\n").unwrap() + 4;
        let text = std::str::from_utf8(&f[..text_end]).unwrap();
        assert!(
            text.contains("Module Table: version 2, count 2\n"),
            "{text}"
        );
        assert!(
            text.contains("0, 0x0000000000000000, 0x00000000ffffffff, 0x0000000000000000, guest\n")
        );
        assert!(text.contains("1, 0xffffffff00000000, 0xffffffffffffffff"));
        assert!(text.ends_with("BB Table: 2 bbs\n"));
        let bin = &f[text_end..];
        assert_eq!(bin.len(), 16);
        assert_eq!(&bin[..8], &[0, 0, 0x10, 0, 12, 0, 0, 0]);
        assert_eq!(
            &bin[8..],
            &[0x10, 0, 0, 0x81, 0xff, 0xff, 1, 0],
            "size capped at 16 bits"
        );
    }
}
