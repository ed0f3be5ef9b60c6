//! The PMU oracle (issue 18, point 6): in one QEMU process, the
//! instructions and branches rustkvm's guest PMU counts over a code region
//! equal what rustkvm's TCG plugin counts for the same region with
//! `filter=`, on x86_64 and aarch64, for a workload that takes page faults,
//! exceptions and timer interrupts (guest `pmu-oracle`).
//!
//! What is compared (docs/testing.md, "The PMU oracle"). The guest enables
//! its counters with the instruction right before `oracle_region_start`
//! and disables them with the one at `oracle_region_end`; everything it
//! executes in between, handlers included, is in `[oracle_region_start,
//! oracle_region_end)`, and nothing there runs outside that window. The
//! plugin counts an instruction each time it *starts* executing (as QEMU's
//! contrib `insn` plugin); the PMU counts what *retires* (KVM's and the
//! hardware's semantics). They differ by exactly:
//!
//! - instructions: `PMU = plugin(region) − faults − rep + 1`. A fault
//!   (x86 #PF and #UD, arm64 data abort and UNDEFINED) is taken *at* its
//!   instruction, which does not retire: the plugin counted its start, the
//!   PMU nothing. A #PF'd load runs again after the handler and then
//!   retires once: two starts, one retirement; a skipped `UD2`/`UDF`: one
//!   start, no retirement. So each fault is one start too many. `faults` is
//!   what the plugin counts on `[oracle_fault_marks,
//!   oracle_fault_marks_end)`, through which each load fault's and #UD's
//!   handler passes with exactly one instruction. `rep` (x86) is the `REP
//!   STOSB`'s starts that did not retire: its starts minus those of the
//!   `UD2` right after it (it retires once a round), i.e. its two faults a
//!   round (at its first byte and half-way), plus, under `-icount`, one
//!   re-entry per iteration, which the plugin counts as a start and the
//!   PMU not (the REP retires once). A trap (`INT3`, `SVC`) retires and is
//!   counted by both; an interrupt is taken between instructions, its
//!   handler counted by both; `HLT`/`WFI` retire once. The `+ 1` is the
//!   enabling instruction, which counts itself under KVM (x86 WRMSR; arm64
//!   MSR PMCNTENSET), while the disabling one does not; neither is in the
//!   plugin's range.
//! - branches: `PMU = plugin(region) + extra`. The plugin's branches are
//!   capstone's jump/call/return/iret groups; the PMU's also include x86
//!   `INT n`/`INT3` (BR_INST_RETIRED.ALL_BRANCHES counts far branches) and
//!   arm64 `ERET` (BR_RETIRED). `extra` is what the plugin counts on
//!   `[oracle_extra_branch, _end)`: the region's only `INT3` (x86), the
//!   only `ERET` every handler returns through (arm64). Faulting
//!   instructions here are never branches.
//!
//! The correction terms are checked against the guest's own bookkeeping
//! (its handlers count what they handle), and the plugin itself against
//! QEMU's `libinsn` (whole-run totals, same process).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use rustkvm_tests::{guest, qemu, run, Arch, Backend, Status, Variant};

/// The guest.
const GUEST: &str = "pmu-oracle";

/// How one oracle run is made: the variant and extra `-accel` options.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Name in messages.
    name: &'static str,
    /// The runner's variant.
    variant: Variant,
    /// Extra `-accel` options.
    accel: &'static [&'static str],
}

/// QEMU's default (MTTCG, 1 vCPU), round-robin (`thread=single`), MTTCG
/// with 2 vCPUs, and `-icount shift=0`.
const DEFAULT: Setup = Setup {
    name: "default",
    variant: Variant::Default,
    accel: &[],
};
/// `thread=single` with 1 vCPU.
const RR_SMP1: Setup = Setup {
    name: "rr-smp1",
    variant: Variant::Default,
    accel: &["thread=single"],
};
/// `thread=single` with 2 vCPUs.
const RR_SMP2: Setup = Setup {
    name: "rr-smp2",
    variant: Variant::RrSmp2,
    accel: &[],
};
/// `thread=multi` with 2 vCPUs.
const MTTCG_SMP2: Setup = Setup {
    name: "mttcg-smp2",
    variant: Variant::MttcgSmp2,
    accel: &[],
};
/// `-icount shift=0`.
const ICOUNT: Setup = Setup {
    name: "icount",
    variant: Variant::Icount,
    accel: &[],
};

/// The symbols of an ELF64 little-endian file (its `.symtab`), by name.
fn elf_symbols(path: &Path) -> BTreeMap<String, u64> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bad =
        |why: &str| -> ! { panic!("{}: not an ELF64 LE file I can read: {why}", path.display()) };
    let bytes = |off: usize, n: usize| data.get(off..off + n).unwrap_or_else(|| bad("short"));
    let u16_at = |off| u16::from_le_bytes(bytes(off, 2).try_into().unwrap_or_default()) as usize;
    let u32_at = |off| u32::from_le_bytes(bytes(off, 4).try_into().unwrap_or_default()) as usize;
    let u64_at = |off| u64::from_le_bytes(bytes(off, 8).try_into().unwrap_or_default());
    if bytes(0, 6) != b"\x7fELF\x02\x01" {
        bad("magic");
    }
    let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| shoff + i * shentsize;
    let symtab = (0..shnum)
        .map(section)
        .find(|&s| u32_at(s + 4) == 2) // SHT_SYMTAB
        .unwrap_or_else(|| bad("no .symtab"));
    let strtab = section(u32_at(symtab + 40));
    let (str_off, str_size) = (u64_at(strtab + 24) as usize, u64_at(strtab + 32) as usize);
    let (sym_off, sym_size) = (u64_at(symtab + 24) as usize, u64_at(symtab + 32) as usize);
    let mut symbols = BTreeMap::new();
    for sym in (sym_off..sym_off + sym_size).step_by(24) {
        let name = str_off + u32_at(sym);
        let len = data
            .get(name..str_off + str_size)
            .and_then(|s| s.iter().position(|&b| b == 0))
            .unwrap_or(0);
        if len > 0 {
            let name = String::from_utf8_lossy(bytes(name, len)).into_owned();
            symbols.insert(name, u64_at(sym + 8));
        }
    }
    symbols
}

/// A copy of rustkvm's plugin counting one range.
struct Probe {
    /// What it counts.
    name: &'static str,
    /// `[start, end)`, or everything.
    range: Option<(u64, u64)>,
    /// Its JSON report.
    out: PathBuf,
}

/// The counts of one oracle run.
#[derive(Debug)]
struct Counts {
    /// The guest PMU's instructions and branches retired.
    pmu: (u64, u64),
    /// The plugin's instructions and branches started in the region.
    region: (u64, u64),
    /// Faults of loads and #UD/UNDEFINED, whose instruction does not
    /// retire (plugin).
    faults: u64,
    /// x86: starts of the `REP STOSB` that did not retire (its starts minus
    /// those of the instruction after it; plugin); arm64: 0.
    rep: u64,
    /// Branches the PMU counts and capstone does not (plugin).
    extra: u64,
}

impl Counts {
    /// What the PMU must have counted, from the plugin's counts.
    fn expected(&self) -> (u64, u64) {
        (
            self.region.0 - self.faults - self.rep + 1,
            self.region.1 + self.extra,
        )
    }

    /// The comparison, for the test's output and its failure message.
    fn table(&self, arch: Arch, variant: &str, range: (u64, u64)) -> String {
        let (want_i, want_b) = self.expected();
        let mark = |got: u64, want: u64| {
            if got == want {
                "ok".to_string()
            } else {
                format!("DIFFERS by {:+}", got as i128 - want as i128)
            }
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{GUEST} {arch} {variant}: region [{:#x}, {:#x})",
            range.0, range.1
        );
        let _ = writeln!(
            s,
            "  instructions: PMU {} | plugin {} - faults {} - REP starts not retired {} + enabling insn 1 = {}  {}",
            self.pmu.0,
            self.region.0,
            self.faults,
            self.rep,
            want_i,
            mark(self.pmu.0, want_i)
        );
        let _ = writeln!(
            s,
            "  branches:     PMU {} | plugin {} + {} {} = {}  {}",
            self.pmu.1,
            self.region.1,
            self.extra,
            match arch {
                Arch::X86_64 => "INT3",
                Arch::Aarch64 => "ERET",
            },
            want_b,
            mark(self.pmu.1, want_b)
        );
        s
    }
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn total(report: &Value, counter: &str) -> u64 {
    report["total"][counter]
        .as_u64()
        .unwrap_or_else(|| panic!("no total.{counter} in {report}"))
}

/// A `measure` value of the run, as a number.
fn measure(r: &run::RunResult, key: &str) -> u64 {
    r.outcome.measure_u64(key)
}

/// Boot the guest under rustkvm in `variant` with the probes and QEMU's
/// libinsn in the same process, and check the oracle.
fn oracle(arch: Arch, setup: Setup) {
    let variant = setup.name;
    let test = guest::discover()
        .expect("guest tests")
        .into_iter()
        .find(|t| t.name == GUEST)
        .expect("the pmu-oracle guest");
    let syms = elf_symbols(&test.binary(arch));
    let sym = |name: &str| {
        *syms
            .get(name)
            .unwrap_or_else(|| panic!("{GUEST} ({arch}) has no symbol {name}"))
    };
    let range = |from: &str, to: &str| (sym(from), sym(to));
    let region = range("oracle_region_start", "oracle_region_end");
    let dir = std::env::temp_dir().join(format!(
        "rustkvm-oracle-{}-{arch}-{variant}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let probes = [
        ("region", Some(region)),
        (
            "faults",
            Some(range("oracle_fault_marks", "oracle_fault_marks_end")),
        ),
        (
            "extra",
            Some(range("oracle_extra_branch", "oracle_extra_branch_end")),
        ),
        ("all", None),
    ]
    .into_iter()
    .chain(
        syms.get("oracle_rep")
            .map(|_| {
                let (rep, after) = range("oracle_rep", "oracle_rep_end");
                [
                    ("rep", Some((rep, after))),
                    ("after-rep", Some((after, after + 1))),
                ]
            })
            .into_iter()
            .flatten(),
    )
    .collect::<Vec<_>>()
    .into_iter()
    .map(|(name, range)| Probe {
        name,
        range,
        out: dir.join(format!("{name}.json")),
    })
    .collect::<Vec<_>>();

    let ours = qemu::rustkvm_plugin().expect("plugin built");
    let insn = qemu::plugin("insn").expect("QEMU's libinsn.so built");
    let mut args: Vec<String> = Vec::new();
    if arch == Arch::X86_64 {
        // The Intel PMU (the guest's metadata cannot name an x86 model: it
        // runs on arm64 too).
        args.extend(["-cpu".into(), "qemu64,vendor=GenuineIntel,pmu=on".into()]);
    }
    for p in &probes {
        // One copy of the .so per instance: QEMU loads a path once.
        let copy = dir.join(format!("probe-{}.so", p.name));
        std::fs::copy(&ours, &copy).expect("copy of the plugin");
        let mut spec = format!(
            "{},quiet=on,counters=instructions+branches,outfile={}",
            copy.display(),
            p.out.display()
        );
        if let Some((a, b)) = p.range {
            let _ = write!(spec, ",filter={a:#x}-{b:#x}");
        }
        args.extend(["-plugin".into(), spec]);
    }
    args.extend([
        "-plugin".into(),
        format!("{},inline=on", insn.display()),
        "-d".into(),
        "plugin".into(),
    ]);
    let opts = run::RunOptions {
        qemu_args: args,
        accel_opts: setup.accel.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    let r = run::run_with(&test, arch, setup.variant, Backend::Rustkvm, &opts).expect("QEMU ran");
    let context = format!("{GUEST} {arch} {variant}");
    assert_eq!(
        r.outcome.status,
        Status::Pass,
        "{context}:\n{}\n{}",
        r.outcome.serial,
        r.outcome.stderr
    );
    let reports: BTreeMap<&str, Value> = probes.iter().map(|p| (p.name, json(&p.out))).collect();
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(
        (measure(&r, "region.start"), measure(&r, "region.end")),
        region,
        "{context}: the guest's region and its ELF symbols"
    );
    let c = Counts {
        pmu: (
            measure(&r, "oracle.pmu.instructions"),
            measure(&r, "oracle.pmu.branches"),
        ),
        region: (
            total(&reports["region"], "instructions"),
            total(&reports["region"], "branches"),
        ),
        faults: total(&reports["faults"], "instructions"),
        extra: total(&reports["extra"], "instructions"),
        rep: match (reports.get("rep"), reports.get("after-rep")) {
            (Some(rep), Some(after)) => total(rep, "instructions") - total(after, "instructions"),
            _ => 0,
        },
    };
    let table = c.table(arch, variant, region);
    eprint!("{table}");

    // The correction terms, from the plugin, against the guest's handlers.
    let (pf, ud, traps, ticks) = (
        measure(&r, "oracle.page-faults"),
        measure(&r, "oracle.undefined"),
        measure(&r, "oracle.traps"),
        measure(&r, "oracle.ticks"),
    );
    if let Some(after) = reports.get("after-rep") {
        // The REP retires once a round; its faults alone (no -icount) or
        // with re-entries (-icount) are the starts it did not retire.
        let rep_faults = measure(&r, "oracle.rep-faults");
        assert_eq!(
            total(after, "instructions"),
            traps,
            "{context}: REP STOSB retirements (one a round)\n{table}"
        );
        assert!(
            c.rep >= rep_faults,
            "{context}: REP starts not retired {} < its {rep_faults} faults\n{table}",
            c.rep
        );
    }
    assert_eq!(
        c.faults,
        pf + ud,
        "{context}: fault entries the plugin saw vs the guest's {pf} page faults + {ud} UNDEFINED\n{table}"
    );
    let extra_want = match arch {
        Arch::X86_64 => traps,
        Arch::Aarch64 => pf + ud + traps + ticks,
    };
    assert_eq!(
        c.extra, extra_want,
        "{context}: INT3/ERET executions the plugin saw vs the guest's handlers\n{table}"
    );
    // The plugin against QEMU's own libinsn, whole run.
    let libinsn: u64 = r
        .outcome
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("total insns: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{context}: no libinsn total in\n{}", r.outcome.stderr));
    assert_eq!(
        total(&reports["all"], "instructions"),
        libinsn,
        "{context}: rustkvm's plugin (unfiltered) vs QEMU's libinsn"
    );
    // The oracle.
    assert_eq!(c.pmu, c.expected(), "{context}: PMU vs plugin\n{table}");
}

#[test]
fn x86_pmu_counts_equal_the_plugins_over_faults_traps_and_interrupts() {
    for setup in [DEFAULT, RR_SMP1, MTTCG_SMP2, ICOUNT] {
        oracle(Arch::X86_64, setup);
    }
}

#[test]
fn arm64_pmu_counts_equal_the_plugins_over_faults_traps_and_interrupts() {
    for setup in [DEFAULT, RR_SMP1, RR_SMP2, MTTCG_SMP2, ICOUNT] {
        oracle(Arch::Aarch64, setup);
    }
}

/// Round-robin with 2 x86 vCPUs: stock QEMU 10.0 crashes there as soon as
/// an inline per-instruction plugin is loaded (gen_plugin_u64_ptr multiplied
/// the constant cpu_index of a non-parallel TB in place); rustkvm's build
/// carries the fix (qemu-patches/0002).
#[test]
fn x86_pmu_oracle_round_robin_two_vcpus() {
    oracle(Arch::X86_64, RR_SMP2);
}
