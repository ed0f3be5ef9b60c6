//! `hot=`: one execution counter per distinct translated block, however
//! often QEMU translates it again (after a code-cache flush, a write to a
//! page holding code, a block split at an exception, ...).
//!
//! A block is identified as QEMU's contrib `hotblocks.c` identifies it: by
//! the guest virtual address of its first instruction and its instruction
//! count (the plugin API exposes no other identity of a translation). Every
//! translation of the same block gets the same counter, so memory grows with
//! the number of distinct blocks, not with the number of translations.
//! Two different blocks at one address with the same length (the same
//! virtual address in two address spaces) share a counter, as in
//! `hotblocks.c`.

use std::collections::HashMap;

use crate::report::HotBlock;

/// Identity of a translated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// Guest virtual address of its first instruction.
    pub vaddr: u64,
    /// Instructions in it.
    pub insns: usize,
}

/// What is recorded, once, about a distinct block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo<S> {
    /// Its execution counter (in the plugin: a QEMU scoreboard).
    pub counter: S,
    /// Symbol of its first instruction, if QEMU knows one.
    pub symbol: String,
    /// Disassembly of its first instruction.
    pub disas: String,
}

/// Distinct blocks a table keeps at most: memory stays bounded (a guest
/// JIT or ASLR'd processes make new blocks for ever); translations of
/// further blocks are counted in [`Distinct::refused`] and the report says
/// so.
pub const MAX_BLOCKS: usize = 1 << 18;

/// Per distinct block, a `V` made the first time it is translated, in that
/// order, up to a cap: the table behind `hot=` ([`HotTable`]) and `bbv=`
/// and `drcov=` (crate::blocks).
#[derive(Debug, Clone)]
pub struct Distinct<V> {
    index: HashMap<BlockKey, usize>,
    entries: Vec<(BlockKey, V)>,
    cap: usize,
    refused: u64,
}

impl<V> Default for Distinct<V> {
    fn default() -> Self {
        Self::with_cap(MAX_BLOCKS)
    }
}

impl<V> Distinct<V> {
    /// An empty table of at most `cap` blocks.
    pub fn with_cap(cap: usize) -> Self {
        Distinct {
            index: HashMap::new(),
            entries: Vec::new(),
            cap,
            refused: 0,
        }
    }

    /// The entry of block `key`; `make` (given the block's 0-based position)
    /// runs only the first time it is translated. None, counted as refused,
    /// for a new block once the table is full.
    pub fn get_or_insert(&mut self, key: BlockKey, make: impl FnOnce(usize) -> V) -> Option<&V> {
        if let Some(&i) = self.index.get(&key) {
            return Some(&self.entries[i].1);
        }
        let i = self.entries.len();
        if i >= self.cap {
            self.refused += 1;
            return None;
        }
        self.index.insert(key, i);
        self.entries.push((key, make(i)));
        Some(&self.entries[i].1)
    }

    /// Translations of blocks the full table refused.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Distinct blocks recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no block was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every block, in the order first translated.
    pub fn iter(&self) -> impl Iterator<Item = &(BlockKey, V)> {
        self.entries.iter()
    }
}

/// `hot=`'s table: per distinct block, its counter and description.
pub type HotTable<S> = Distinct<BlockInfo<S>>;

impl<S: Copy> Distinct<BlockInfo<S>> {
    /// The counter of the block `key`. `describe` (which allocates the
    /// counter and reads the symbol and disassembly) runs only the first
    /// time the block is translated; None once the table is full.
    pub fn counter(&mut self, key: BlockKey, describe: impl FnOnce() -> BlockInfo<S>) -> Option<S> {
        self.get_or_insert(key, |_| describe()).map(|i| i.counter)
    }

    /// The `n` most executed blocks, most executed first (ties: lower
    /// address first), `executions` reading a counter. The report names a
    /// block by its address, so blocks at one address with different
    /// lengths are reported as one, with the length of the first one
    /// translated and the executions of all.
    pub fn hottest(&self, n: usize, executions: impl Fn(S) -> u64) -> Vec<HotBlock> {
        let mut by_addr: HashMap<u64, HotBlock> = HashMap::new();
        for (key, info) in &self.entries {
            let b = by_addr.entry(key.vaddr).or_insert_with(|| HotBlock {
                vaddr: key.vaddr,
                insns: key.insns,
                executions: 0,
                symbol: info.symbol.clone(),
                disas: info.disas.clone(),
            });
            b.executions += executions(info.counter);
        }
        let mut hot: Vec<HotBlock> = by_addr.into_values().collect();
        hot.sort_by(|a, b| b.executions.cmp(&a.executions).then(a.vaddr.cmp(&b.vaddr)));
        hot.truncate(n);
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(counter: usize) -> BlockInfo<usize> {
        BlockInfo {
            counter,
            symbol: format!("f{counter}"),
            disas: "nop".into(),
        }
    }

    #[test]
    fn retranslating_a_block_allocates_its_counter_once() {
        let mut t = HotTable::default();
        let mut allocated = 0;
        let key = BlockKey {
            vaddr: 0x1000,
            insns: 4,
        };
        for _ in 0..1000 {
            let c = t.counter(key, || {
                allocated += 1;
                info(allocated)
            });
            assert_eq!(c, Some(1), "every translation gets the first counter");
        }
        assert_eq!((allocated, t.len()), (1, 1));
        // Another length at the same address, another address: new blocks.
        for key in [
            BlockKey {
                vaddr: 0x1000,
                insns: 2,
            },
            BlockKey {
                vaddr: 0x2000,
                insns: 4,
            },
        ] {
            for _ in 0..10 {
                t.counter(key, || {
                    allocated += 1;
                    info(allocated)
                });
            }
        }
        assert_eq!((allocated, t.len()), (3, 3));
    }

    #[test]
    fn hottest_merges_one_address_and_sorts() {
        let mut t = HotTable::default();
        for (vaddr, insns, counter) in [
            (0x1000, 4, 1),
            (0x2000, 3, 2),
            (0x1000, 2, 3),
            (0x3000, 1, 4),
        ] {
            t.counter(BlockKey { vaddr, insns }, || info(counter));
        }
        // Executions per counter: 0x1000 runs 5 + 20, 0x2000 10, 0x3000 10.
        let runs = |c: usize| [0, 5, 10, 20, 10][c];
        let hot = t.hottest(10, runs);
        let shape: Vec<(u64, usize, u64, &str)> = hot
            .iter()
            .map(|h| (h.vaddr, h.insns, h.executions, h.symbol.as_str()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0x1000, 4, 25, "f1"),
                (0x2000, 3, 10, "f2"),
                (0x3000, 1, 10, "f4")
            ]
        );
        assert_eq!(t.hottest(1, runs).len(), 1);
        assert!(HotTable::<usize>::default().hottest(5, runs).is_empty());
    }

    #[test]
    fn a_full_table_refuses_new_blocks_and_counts_them() {
        let mut t = HotTable::with_cap(2);
        let key = |vaddr| BlockKey { vaddr, insns: 1 };
        assert_eq!(t.counter(key(0x1000), || info(1)), Some(1));
        assert_eq!(t.counter(key(0x2000), || info(2)), Some(2));
        for _ in 0..3 {
            assert_eq!(t.counter(key(0x3000), || info(3)), None, "past the cap");
        }
        assert_eq!(
            t.counter(key(0x1000), || info(9)),
            Some(1),
            "known blocks stay"
        );
        assert_eq!((t.len(), t.refused()), (2, 3));
    }
}
