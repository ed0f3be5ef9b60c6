//! What the plugin reports: per-vCPU and total counters, the hottest
//! blocks, as JSON, CSV or a table (schema in docs/plugin.md).

use std::fmt::Write as _;

use crate::args::{Counters, Mode};
use crate::classify::Class;

/// One vCPU's counters: the scoreboard element QEMU's inline operations
/// add to (`repr(C)`, each field a `u64` at a fixed offset).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VcpuCounts {
    /// Instructions executed.
    pub instructions: u64,
    /// Branch instructions executed.
    pub branches: u64,
    /// Memory reads.
    pub mem_loads: u64,
    /// Memory writes.
    pub mem_stores: u64,
    /// Instructions per class (`Class as usize`).
    pub classes: [u64; 6],
    /// Counted instructions since the last interval record (bookkeeping,
    /// not reported).
    pub since_interval: u64,
}

impl VcpuCounts {
    /// Byte offset of `instructions` in the scoreboard element.
    pub const INSTRUCTIONS: usize = 0;
    /// Byte offset of `branches`.
    pub const BRANCHES: usize = 8;
    /// Byte offset of `mem_loads`.
    pub const MEM_LOADS: usize = 16;
    /// Byte offset of `mem_stores`.
    pub const MEM_STORES: usize = 24;
    /// Byte offset of `classes[c]`.
    pub const fn class(c: Class) -> usize {
        32 + 8 * c as usize
    }
    /// Byte offset of `since_interval`.
    pub const SINCE_INTERVAL: usize = 80;

    fn add(&mut self, o: &VcpuCounts) {
        self.instructions += o.instructions;
        self.branches += o.branches;
        self.mem_loads += o.mem_loads;
        self.mem_stores += o.mem_stores;
        for (a, b) in self.classes.iter_mut().zip(o.classes) {
            *a += b;
        }
    }

    /// The enabled counters as (event name, value), in report order.
    pub fn events(&self, c: Counters) -> Vec<(&'static str, u64)> {
        let mut v = Vec::new();
        if c.instructions {
            v.push(("instructions", self.instructions));
        }
        if c.branches {
            v.push(("branches", self.branches));
        }
        if c.mem {
            v.push(("mem_access", self.mem_loads + self.mem_stores));
            v.push(("mem_loads", self.mem_loads));
            v.push(("mem_stores", self.mem_stores));
        }
        if c.classes {
            for class in Class::ALL {
                v.push((class.name(), self.classes[class as usize]));
            }
        }
        v
    }
}

/// A translated block and how often it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotBlock {
    /// Guest virtual address of its first instruction.
    pub vaddr: u64,
    /// Instructions in it.
    pub insns: usize,
    /// Executions (all vCPUs).
    pub executions: u64,
    /// Symbol of its first instruction, if QEMU knows one.
    pub symbol: String,
    /// Disassembly of its first instruction.
    pub disas: String,
}

/// One vCPU's counters when it crossed an `interval=` boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// The vCPU.
    pub vcpu: u32,
    /// Its counters then (cumulative).
    pub counts: VcpuCounts,
    /// Host time then, ns since the plugin was loaded (monotonic).
    pub host_ns: u64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// QEMU's target name.
    pub target: String,
    /// Counting mode.
    pub mode: Mode,
    /// Which counters.
    pub counters: Counters,
    /// Per vCPU, by index.
    pub vcpus: Vec<VcpuCounts>,
    /// Hottest blocks first.
    pub hot: Vec<HotBlock>,
    /// Interval records, in the order they were taken.
    pub intervals: Vec<Interval>,
    /// The vCPU that reached `limit=` when the run was stopped by it (None:
    /// the run ended otherwise).
    pub stopped_at_limit: Option<u32>,
    /// Translations of blocks past a table's cap (crate::hot::MAX_BLOCKS),
    /// not counted: `hot=`'s, and `bbv=`/`drcov=`'s.
    pub past_cap: PastCap,
}

/// Translations of blocks the full tables refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PastCap {
    /// `hot=`'s table: these blocks' executions are not in `hot_blocks`.
    pub hot: u64,
    /// `bbv=`'s and `drcov=`'s: these blocks are not in their files.
    pub blocks: u64,
}

/// `s` as a JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Report {
    /// Sum over vCPUs.
    pub fn total(&self) -> VcpuCounts {
        let mut t = VcpuCounts::default();
        for v in &self.vcpus {
            t.add(v);
        }
        t
    }

    fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Exact => "exact",
            Mode::Insn => "insn",
            Mode::Tb => "tb",
        }
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        let obj = |c: &VcpuCounts| {
            c.events(self.counters)
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let stopped = match self.stopped_at_limit {
            Some(v) => format!("{{\"reason\": \"limit\", \"vcpu\": {v}}}"),
            None => "null".to_string(),
        };
        let mut s = format!(
            "{{\n  \"schema\": \"rustkvm-plugin/1\",\n  \"target\": {},\n  \"mode\": \"{}\",\n  \"stopped\": {stopped},\n  \"blocks_past_cap\": {{\"cap\": {}, \"hot\": {}, \"bbv_drcov\": {}}},\n  \"vcpus\": [\n",
            json_str(&self.target),
            self.mode_name(),
            crate::hot::MAX_BLOCKS,
            self.past_cap.hot,
            self.past_cap.blocks
        );
        let rows: Vec<String> = self
            .vcpus
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let body = obj(c);
                let sep = if body.is_empty() { "" } else { ", " };
                format!("    {{\"vcpu\": {i}{sep}{body}}}")
            })
            .collect();
        s += &rows.join(",\n");
        let _ = write!(
            s,
            "\n  ],\n  \"total\": {{{}}},\n  \"hot_blocks\": [",
            obj(&self.total())
        );
        let hot: Vec<String> = self
            .hot
            .iter()
            .map(|h| {
                format!(
                    "\n    {{\"vaddr\": \"{:#x}\", \"insns\": {}, \"executions\": {}, \"symbol\": {}, \"disas\": {}}}",
                    h.vaddr,
                    h.insns,
                    h.executions,
                    json_str(&h.symbol),
                    json_str(&h.disas)
                )
            })
            .collect();
        s += &hot.join(",");
        s += if self.hot.is_empty() {
            "],\n"
        } else {
            "\n  ],\n"
        };
        s += "  \"intervals\": [";
        let iv: Vec<String> = self
            .intervals
            .iter()
            .map(|i| format!("\n    {{\"vcpu\": {}, {}}}", i.vcpu, obj(&i.counts)))
            .collect();
        s += &iv.join(",");
        s += if self.intervals.is_empty() {
            "]\n}\n"
        } else {
            "\n  ]\n}\n"
        };
        s
    }

    /// The interval records as Chrome/Perfetto trace-event JSON ("JSON
    /// Object Format": `traceEvents`, timestamps in µs of host time since
    /// the plugin was loaded): per vCPU one process ("vCPU N") whose counter
    /// tracks ("ph": "C") hold, at each record, what the interval counted
    /// of each counter, and `per instruction` ratios (branches, loads,
    /// stores per instruction). Each record also carries its cumulative
    /// instruction count (`args.at_instructions` of the `instructions`
    /// track) for plotting against instructions executed
    /// (scripts/plot-timeline.py).
    pub fn to_timeline(&self, interval: u64) -> String {
        let mut ev: Vec<String> = Vec::new();
        let mut seen: Vec<u32> = self.intervals.iter().map(|i| i.vcpu).collect();
        seen.sort_unstable();
        seen.dedup();
        for v in &seen {
            ev.push(format!(
                "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"args\": {{\"name\": \"vCPU {v}\"}}}}",
                v + 1
            ));
        }
        let mut last: Vec<VcpuCounts> =
            vec![VcpuCounts::default(); seen.last().map_or(0, |v| *v as usize + 1)];
        for i in &self.intervals {
            let prev = last[i.vcpu as usize];
            last[i.vcpu as usize] = i.counts;
            let d = |a: u64, b: u64| a.saturating_sub(b);
            let insns = d(i.counts.instructions, prev.instructions);
            let ts = i.host_ns as f64 / 1000.0;
            let pid = i.vcpu + 1;
            let mut counter = |name: &str, args: String| {
                ev.push(format!(
                    "{{\"name\": {}, \"ph\": \"C\", \"ts\": {ts:.3}, \"pid\": {pid}, \"args\": {{{args}}}}}",
                    json_str(name)
                ));
            };
            if self.counters.instructions {
                counter(
                    "instructions",
                    format!(
                        "\"instructions\": {insns}, \"at_instructions\": {}",
                        i.counts.instructions
                    ),
                );
            }
            let ratio = |n: u64| {
                if insns == 0 {
                    0.0
                } else {
                    n as f64 / insns as f64
                }
            };
            if self.counters.branches {
                let b = d(i.counts.branches, prev.branches);
                counter("branches", format!("\"branches\": {b}"));
                counter(
                    "branches per instruction",
                    format!("\"ratio\": {:.6}", ratio(b)),
                );
            }
            if self.counters.mem {
                let (l, st) = (
                    d(i.counts.mem_loads, prev.mem_loads),
                    d(i.counts.mem_stores, prev.mem_stores),
                );
                counter("loads", format!("\"loads\": {l}"));
                counter("stores", format!("\"stores\": {st}"));
                counter(
                    "memory accesses per instruction",
                    format!("\"ratio\": {:.6}", ratio(l + st)),
                );
            }
            if self.counters.classes {
                for c in Class::ALL {
                    let n = d(i.counts.classes[c as usize], prev.classes[c as usize]);
                    counter(c.name(), format!("\"instructions\": {n}"));
                }
            }
        }
        format!(
            "{{\"displayTimeUnit\": \"ns\",\n \"otherData\": {{\"schema\": \"rustkvm-plugin-timeline/1\", \"target\": {}, \"interval\": {interval}}},\n \"traceEvents\": [\n  {}\n ]\n}}\n",
            json_str(&self.target),
            ev.join(",\n  ")
        )
    }

    /// `scope,event,value` rows: `vcpuN`, `total`, `hot:0xADDR`,
    /// `intervalK:vcpuN`, and `stopped,limit_vcpu,N` when `limit=` stopped
    /// the run.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("scope,event,value\n");
        if let Some(v) = self.stopped_at_limit {
            let _ = writeln!(s, "stopped,limit_vcpu,{v}");
        }
        for (k, v) in [
            ("hot", self.past_cap.hot),
            ("bbv_drcov", self.past_cap.blocks),
        ] {
            if v > 0 {
                let _ = writeln!(s, "blocks_past_cap,{k},{v}");
            }
        }
        for (i, c) in self.vcpus.iter().enumerate() {
            for (k, v) in c.events(self.counters) {
                let _ = writeln!(s, "vcpu{i},{k},{v}");
            }
        }
        for (k, v) in self.total().events(self.counters) {
            let _ = writeln!(s, "total,{k},{v}");
        }
        for h in &self.hot {
            let _ = writeln!(s, "hot:{:#x},executions,{}", h.vaddr, h.executions);
            let _ = writeln!(s, "hot:{:#x},insns,{}", h.vaddr, h.insns);
        }
        for (n, i) in self.intervals.iter().enumerate() {
            for (k, v) in i.counts.events(self.counters) {
                let _ = writeln!(s, "interval{n}:vcpu{},{k},{v}", i.vcpu);
            }
        }
        s
    }

    /// A table for humans (stderr).
    pub fn table(&self) -> String {
        let total = self.total();
        let events = total.events(self.counters);
        let mut s = format!(
            "rustkvm plugin ({}, {} counting)\n{:<18}",
            self.target,
            self.mode_name(),
            "event"
        );
        for i in 0..self.vcpus.len() {
            let _ = write!(s, " {:>16}", format!("vcpu{i}"));
        }
        let _ = writeln!(s, " {:>16}", "total");
        for (n, (name, value)) in events.iter().enumerate() {
            let _ = write!(s, "{name:<18}");
            for v in &self.vcpus {
                let _ = write!(s, " {:>16}", v.events(self.counters)[n].1);
            }
            let _ = writeln!(s, " {value:>16}");
        }
        if let Some(v) = self.stopped_at_limit {
            let _ = writeln!(
                s,
                "stopped: vcpu{v} reached limit= (QEMU exits with status {})",
                crate::LIMIT_EXIT_STATUS
            );
        }
        for (what, v) in [
            ("hot=", self.past_cap.hot),
            ("bbv=/drcov=", self.past_cap.blocks),
        ] {
            if v > 0 {
                let _ = writeln!(
                    s,
                    "{what}: {v} translations of blocks past the table's {} distinct blocks were not counted",
                    crate::hot::MAX_BLOCKS
                );
            }
        }
        if !self.hot.is_empty() {
            let _ = writeln!(s, "hot blocks:");
            for h in &self.hot {
                let _ = writeln!(
                    s,
                    "  {:#018x} {:>12} x {:>3} insns  {}  {}",
                    h.vaddr, h.executions, h.insns, h.symbol, h.disas
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut a = VcpuCounts {
            instructions: 10,
            branches: 2,
            mem_loads: 3,
            mem_stores: 1,
            ..Default::default()
        };
        a.classes[Class::Alu as usize] = 8;
        Report {
            target: "x86_64".into(),
            mode: Mode::Exact,
            counters: Counters {
                instructions: true,
                branches: true,
                mem: true,
                classes: false,
            },
            vcpus: vec![
                a,
                VcpuCounts {
                    instructions: 5,
                    ..Default::default()
                },
            ],
            hot: vec![HotBlock {
                vaddr: 0x1000,
                insns: 4,
                executions: 99,
                symbol: "main".into(),
                disas: "mov \"x\"".into(),
            }],
            intervals: vec![Interval {
                vcpu: 1,
                counts: VcpuCounts {
                    instructions: 4,
                    ..Default::default()
                },
                host_ns: 2_500,
            }],
            stopped_at_limit: None,
            past_cap: PastCap::default(),
        }
    }

    #[test]
    fn the_timeline_has_a_process_per_vcpu_and_counter_events() {
        let mut r = report();
        r.intervals.push(Interval {
            vcpu: 1,
            counts: VcpuCounts {
                instructions: 14,
                branches: 5,
                ..Default::default()
            },
            host_ns: 7_000,
        });
        let t = r.to_timeline(10);
        for want in [
            "\"traceEvents\"",
            "\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 2, \"args\": {\"name\": \"vCPU 1\"}",
            "\"name\": \"instructions\", \"ph\": \"C\", \"ts\": 7.000, \"pid\": 2, \"args\": {\"instructions\": 10, \"at_instructions\": 14}",
            "\"ratio\": 0.500000",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
    }

    #[test]
    fn offsets_match_the_struct() {
        let c = VcpuCounts::default();
        let base = &c as *const _ as usize;
        assert_eq!(
            &c.branches as *const _ as usize - base,
            VcpuCounts::BRANCHES
        );
        assert_eq!(
            &c.mem_stores as *const _ as usize - base,
            VcpuCounts::MEM_STORES
        );
        assert_eq!(
            &c.classes[Class::Other as usize] as *const _ as usize - base,
            VcpuCounts::class(Class::Other)
        );
        assert_eq!(
            &c.since_interval as *const _ as usize - base,
            VcpuCounts::SINCE_INTERVAL
        );
        assert_eq!(std::mem::size_of::<VcpuCounts>(), 88);
    }

    #[test]
    fn json_csv_and_table() {
        let r = report();
        let j = r.to_json();
        assert!(j.contains("\"schema\": \"rustkvm-plugin/1\""), "{j}");
        assert!(j.contains("\"stopped\": null,"), "{j}");
        assert!(j.contains("{\"vcpu\": 0, \"instructions\": 10, \"branches\": 2, \"mem_access\": 4, \"mem_loads\": 3, \"mem_stores\": 1}"), "{j}");
        assert!(j.contains("\"total\": {\"instructions\": 15,"), "{j}");
        assert!(j.contains("\"disas\": \"mov \\\"x\\\"\""), "escaped: {j}");
        let c = r.to_csv();
        assert!(
            c.starts_with("scope,event,value\nvcpu0,instructions,10\n"),
            "{c}"
        );
        assert!(
            c.contains("total,mem_access,4\n") && c.contains("hot:0x1000,executions,99\n"),
            "{c}"
        );
        let t = r.table();
        assert!(
            t.contains("instructions") && t.contains("15") && t.contains("main"),
            "{t}"
        );
        assert!(
            j.contains("\"intervals\": [\n    {\"vcpu\": 1, \"instructions\": 4,"),
            "{j}"
        );
        assert!(c.contains("interval0:vcpu1,instructions,4\n"), "{c}");
        let stopped = Report {
            stopped_at_limit: Some(1),
            past_cap: PastCap { hot: 3, blocks: 0 },
            ..r.clone()
        };
        let j = stopped.to_json();
        assert!(
            j.contains("\"stopped\": {\"reason\": \"limit\", \"vcpu\": 1},"),
            "{j}"
        );
        let c = stopped.to_csv();
        assert!(
            c.starts_with("scope,event,value\nstopped,limit_vcpu,1\n"),
            "{c}"
        );
        assert!(stopped.table().contains("vcpu1 reached limit="));
        assert!(
            j.contains("\"blocks_past_cap\": {\"cap\": 262144, \"hot\": 3, \"bbv_drcov\": 0},"),
            "{j}"
        );
        assert!(
            c.contains("blocks_past_cap,hot,3\n") && !c.contains("bbv_drcov"),
            "{c}"
        );
        assert!(
            stopped
                .table()
                .contains("hot=: 3 translations of blocks past the table's 262144 distinct blocks were not counted"),
            "{}",
            stopped.table()
        );
        let empty = Report {
            hot: vec![],
            vcpus: vec![],
            intervals: vec![],
            ..r
        };
        assert!(empty
            .to_json()
            .ends_with("\"hot_blocks\": [],\n  \"intervals\": []\n}\n"));
    }
}
