//! The plugin's arguments (`-plugin librustkvm_plugin.so,key=value,...`).
//!
//! Every argument is checked at load time; a bad one makes QEMU refuse the
//! plugin with a message that names it and what it accepts, and the output
//! file is created at load, so an unwritable path fails then, not at exit.

use std::fmt;
use std::path::PathBuf;

/// How instructions are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Exact (equal to per-instruction counting): one add per group of
    /// instructions of which only the last may leave the block.
    Exact,
    /// One add per instruction (the reference the exact mode is tested
    /// against; as QEMU's contrib `insn` plugin with `inline=on`).
    Insn,
    /// One add per block: cheapest, over-counts when a block is left early
    /// (a fault or trap part-way).
    Tb,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON document (docs/plugin.md).
    Json,
    /// `scope,event,value` rows.
    Csv,
}

/// Which counters to collect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// `instructions`.
    pub instructions: bool,
    /// `branches`.
    pub branches: bool,
    /// `mem_access`, `mem_loads`, `mem_stores` (dynamic accesses).
    pub mem: bool,
    /// `class_*` (instructions per class).
    pub classes: bool,
}

/// The parsed arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Counting mode.
    pub mode: Mode,
    /// Counters.
    pub counters: Counters,
    /// Report the N hottest blocks (0: off); one counter per distinct block
    /// (first instruction's address and length), however often translated.
    pub hot: usize,
    /// Where to write the report; None: stderr table only.
    pub outfile: Option<PathBuf>,
    /// Format of `outfile`.
    pub format: Format,
    /// No table on stderr.
    pub quiet: bool,
    /// Count only instructions at addresses in `[start, end)`.
    pub range: Option<(u64, u64)>,
    /// Count only instructions in this symbol (QEMU's symbol lookup).
    pub symbol: Option<String>,
    /// Stop QEMU once a vCPU has executed this many counted instructions
    /// (at the next block boundary; 0: never): every vCPU is stopped, the
    /// report is written, and QEMU exits with status
    /// [`crate::LIMIT_EXIT_STATUS`] (100).
    pub limit: u64,
    /// Record every vCPU's counters each time it executes this many more
    /// counted instructions (at block boundaries; 0: never).
    pub interval: u64,
    /// Where to write the interval records as Chrome/Perfetto trace-event
    /// JSON (counter tracks per vCPU); needs `interval=`.
    pub timeline: Option<PathBuf>,
    /// `bbv=PATH`: basic-block vectors per vCPU per interval, in
    /// `PATH.N.bb` (needs `interval=`; crate::blocks).
    pub bbv: Option<PathBuf>,
    /// `drcov=PATH`: the executed blocks in drcov format (crate::blocks).
    pub drcov: Option<PathBuf>,
    /// `trace=PATH`: the executed-instruction trace (crate::trace).
    pub trace: Option<PathBuf>,
    /// `trace-start=N`: trace from each vCPU's N-th counted instruction.
    pub trace_start: u64,
    /// `trace-count=M`: at most M instructions per vCPU (0: no limit).
    pub trace_count: u64,
    /// `trace-mem=on`: also each traced instruction's memory accesses.
    pub trace_mem: bool,
    /// `trace-wait=SECONDS`: how long the trace waits for a writer that
    /// makes no progress before it stops, truncated (None: `0`, for ever).
    pub trace_wait: Option<std::time::Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Exact,
            counters: Counters {
                instructions: true,
                branches: true,
                mem: false,
                classes: false,
            },
            hot: 0,
            outfile: None,
            format: Format::Json,
            quiet: false,
            range: None,
            symbol: None,
            limit: 0,
            interval: 0,
            timeline: None,
            bbv: None,
            drcov: None,
            trace: None,
            trace_start: 0,
            trace_count: 0,
            trace_mem: false,
            trace_wait: Some(std::time::Duration::from_secs(30)),
        }
    }
}

/// A refused argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// The argument as given.
    pub arg: String,
    /// What is accepted.
    pub accepted: &'static str,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rustkvm plugin: bad argument '{}': accepted {}",
            self.arg, self.accepted
        )
    }
}

impl std::error::Error for ArgError {}

const KEYS: &str =
    "mode=, counters=, hot=, outfile=, format=, quiet=, filter=, symbol=, limit=, interval=, timeline=, bbv=, drcov=, trace=, trace-start=, trace-count=, trace-mem=, trace-wait=";
const TRACE: &str = "trace=PATH (a file the plugin can create: the executed-instruction trace)";
const TRACE_WINDOW: &str =
    "trace-start=N and trace-count=M (instructions of each vCPU; with trace=)";
const TRACE_WAIT: &str =
    "trace-wait=SECONDS (0 to 3600, with trace=: how long the trace waits for a writer that makes no progress; 0: for ever)";
const BBV: &str =
    "bbv=PATH (with interval=N: basic-block vectors per vCPU in PATH.N.bb, SimPoint's format)";
const DRCOV: &str = "drcov=PATH (a file the plugin can create: executed blocks, drcov format)";
const TIMELINE: &str =
    "timeline=PATH (a file the plugin can create; with interval=N: the interval records as trace-event JSON)";
const RANGE: &str =
    "filter=START-END (guest virtual addresses, hex with 0x or decimal, START < END)";
const LIMIT: &str =
    "limit=N (instructions, 1 or more; QEMU then writes the report and exits with status 100)";
const INTERVAL: &str = "interval=N (instructions, 1000 or more)";
const MODES: &str = "mode=exact|insn|tb";
const COUNTERS: &str =
    "counters=LIST of instructions,branches,mem,classes,all (joined with '+', or counters= repeated: QEMU splits arguments at commas)";
const FORMATS: &str = "format=json|csv";
const BOOLS: &str = "quiet=on|off|true|false";
const HOT: &str = "hot=N (blocks to report, 0 to 1000000)";

fn number(v: &str) -> Option<u64> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

fn boolean(v: &str) -> Option<bool> {
    match v {
        "on" | "true" | "yes" => Some(true),
        "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Parse QEMU's `key=value` arguments. QEMU splits `-plugin` options at
    /// commas, so a counter list may also be given as repeated `counters=`
    /// or joined with `+`.
    pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<Config, ArgError> {
        let mut c = Config::default();
        let mut format_given = false;
        let mut trace_wait_given = false;
        let mut counters_given = false;
        for arg in args {
            let bad = |accepted| ArgError {
                arg: arg.to_string(),
                accepted,
            };
            let (key, value) = arg.split_once('=').ok_or_else(|| bad(KEYS))?;
            match key {
                "mode" => {
                    c.mode = match value {
                        "exact" => Mode::Exact,
                        "insn" => Mode::Insn,
                        "tb" => Mode::Tb,
                        _ => return Err(bad(MODES)),
                    }
                }
                "counters" => {
                    if !counters_given {
                        c.counters = Counters {
                            instructions: false,
                            branches: false,
                            mem: false,
                            classes: false,
                        };
                        counters_given = true;
                    }
                    for name in value.split(['+', ':']) {
                        match name {
                            "instructions" | "insns" => c.counters.instructions = true,
                            "branches" => c.counters.branches = true,
                            "mem" => c.counters.mem = true,
                            "classes" => c.counters.classes = true,
                            "all" => {
                                c.counters = Counters {
                                    instructions: true,
                                    branches: true,
                                    mem: true,
                                    classes: true,
                                }
                            }
                            _ => return Err(bad(COUNTERS)),
                        }
                    }
                }
                "hot" => {
                    c.hot = value
                        .parse()
                        .ok()
                        .filter(|n| *n <= 1_000_000)
                        .ok_or_else(|| bad(HOT))?
                }
                "outfile" => {
                    if value.is_empty() {
                        return Err(bad("outfile=PATH (a file the plugin can create)"));
                    }
                    c.outfile = Some(PathBuf::from(value));
                }
                "format" => {
                    format_given = true;
                    c.format = match value {
                        "json" => Format::Json,
                        "csv" => Format::Csv,
                        _ => return Err(bad(FORMATS)),
                    }
                }
                "quiet" => c.quiet = boolean(value).ok_or_else(|| bad(BOOLS))?,
                "filter" => {
                    let (a, b) = value.split_once('-').ok_or_else(|| bad(RANGE))?;
                    let (a, b) = (number(a), number(b));
                    c.range = Some(a.zip(b).filter(|(a, b)| a < b).ok_or_else(|| bad(RANGE))?);
                }
                "symbol" => {
                    if value.is_empty() {
                        return Err(bad(
                            "symbol=NAME (a symbol QEMU knows from the guest image)",
                        ));
                    }
                    c.symbol = Some(value.to_string());
                }
                "limit" => c.limit = number(value).filter(|n| *n > 0).ok_or_else(|| bad(LIMIT))?,
                "interval" => {
                    c.interval = number(value)
                        .filter(|n| *n >= 1000)
                        .ok_or_else(|| bad(INTERVAL))?
                }
                "timeline" => {
                    if value.is_empty() {
                        return Err(bad(TIMELINE));
                    }
                    c.timeline = Some(PathBuf::from(value));
                }
                "bbv" => {
                    if value.is_empty() {
                        return Err(bad(BBV));
                    }
                    c.bbv = Some(PathBuf::from(value));
                }
                "trace" => {
                    if value.is_empty() {
                        return Err(bad(TRACE));
                    }
                    c.trace = Some(PathBuf::from(value));
                }
                "trace-start" => c.trace_start = number(value).ok_or_else(|| bad(TRACE_WINDOW))?,
                "trace-count" => c.trace_count = number(value).ok_or_else(|| bad(TRACE_WINDOW))?,
                "trace-mem" => c.trace_mem = boolean(value).ok_or_else(|| bad(BOOLS))?,
                "trace-wait" => {
                    let n = number(value)
                        .filter(|n| *n <= 3600)
                        .ok_or_else(|| bad(TRACE_WAIT))?;
                    c.trace_wait = (n > 0).then(|| std::time::Duration::from_secs(n));
                    trace_wait_given = true;
                }
                "drcov" => {
                    if value.is_empty() {
                        return Err(bad(DRCOV));
                    }
                    c.drcov = Some(PathBuf::from(value));
                }
                _ => return Err(bad(KEYS)),
            }
        }
        if c.trace.is_none()
            && (c.trace_start > 0 || c.trace_count > 0 || c.trace_mem || trace_wait_given)
        {
            return Err(ArgError {
                arg: "trace-start=/trace-count=/trace-mem=/trace-wait=".to_string(),
                accepted: TRACE,
            });
        }
        if c.bbv.is_some() && c.interval == 0 {
            return Err(ArgError {
                arg: "bbv=".to_string(),
                accepted: BBV,
            });
        }
        if c.timeline.is_some() && c.interval == 0 {
            return Err(ArgError {
                arg: "timeline=".to_string(),
                accepted: TIMELINE,
            });
        }
        if !format_given {
            if let Some(p) = &c.outfile {
                if p.extension().is_some_and(|e| e == "csv") {
                    c.format = Format::Csv;
                }
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_every_key() {
        assert_eq!(Config::parse([]), Ok(Config::default()));
        let c = Config::parse([
            "mode=tb",
            "counters=instructions+mem",
            "counters=classes",
            "hot=10",
            "outfile=/tmp/x.csv",
            "quiet=on",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::Tb);
        assert_eq!(
            c.counters,
            Counters {
                instructions: true,
                branches: false,
                mem: true,
                classes: true
            }
        );
        assert_eq!((c.hot, c.format, c.quiet), (10, Format::Csv, true));
        let c = Config::parse(["outfile=/tmp/x.csv", "format=json", "counters=all"]).unwrap();
        assert_eq!(c.format, Format::Json, "an explicit format wins");
        assert!(c.counters.classes && c.counters.mem && c.counters.branches);
        let c = Config::parse([
            "filter=0x1000-0x2000",
            "symbol=main",
            "limit=1000000",
            "interval=0x10000",
        ])
        .unwrap();
        assert_eq!(c.range, Some((0x1000, 0x2000)));
        assert_eq!(c.symbol.as_deref(), Some("main"));
        assert_eq!((c.limit, c.interval), (1_000_000, 0x10000));
        let c = Config::parse(["interval=1000", "timeline=/tmp/t.json"]).unwrap();
        assert_eq!(c.timeline, Some(PathBuf::from("/tmp/t.json")));
        assert_eq!(
            Config::parse(["timeline=/tmp/t.json"])
                .unwrap_err()
                .accepted,
            TIMELINE,
            "a timeline needs intervals"
        );
        let c = Config::parse(["interval=1000", "bbv=/tmp/b", "drcov=/tmp/d"]).unwrap();
        assert_eq!(c.bbv, Some(PathBuf::from("/tmp/b")));
        assert_eq!(c.drcov, Some(PathBuf::from("/tmp/d")));
        assert_eq!(
            Config::parse(["bbv=/tmp/b"]).unwrap_err().accepted,
            BBV,
            "BBVs need intervals"
        );
        let c = Config::parse([
            "trace=/tmp/t",
            "trace-start=1000000",
            "trace-count=10000",
            "trace-mem=on",
        ])
        .unwrap();
        assert_eq!(
            (c.trace_start, c.trace_count, c.trace_mem),
            (1_000_000, 10_000, true)
        );
        assert!(Config::parse(["trace-count=5"]).is_err(), "needs trace=");
    }

    #[test]
    fn bad_arguments_name_themselves_and_what_is_accepted() {
        for (arg, accepted) in [
            ("mode=fast", MODES),
            ("counters=cycles", COUNTERS),
            ("hot=-1", HOT),
            ("hot=lots", HOT),
            ("format=xml", FORMATS),
            ("quiet=maybe", BOOLS),
            ("colour=on", KEYS),
            ("verbose", KEYS),
            ("filter=0x2000-0x1000", RANGE),
            ("filter=0x1000", RANGE),
            ("filter=a-b", RANGE),
            ("limit=0", LIMIT),
            ("interval=10", INTERVAL),
        ] {
            let e = Config::parse([arg]).unwrap_err();
            assert_eq!(e.accepted, accepted, "{arg}");
            assert!(e.to_string().contains(arg), "{e}");
        }
        assert!(Config::parse(["outfile="]).is_err());
        assert!(
            LIMIT.contains(&format!("exits with status {}", crate::LIMIT_EXIT_STATUS)),
            "the help names the status: {LIMIT}"
        );
    }
}
