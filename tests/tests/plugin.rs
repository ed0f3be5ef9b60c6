//! rustkvm's TCG plugin (`plugin/`) in QEMU, checked against what it
//! cannot compute itself: the guest's own arithmetic (`plugin-counted`
//! runs a loop whose every instruction, branch, class and memory access is
//! known) and QEMU's contrib `insn` plugin, in the same process; stock
//! Debian QEMU 10.0 as well as rustkvm's build; both architectures, two
//! vCPUs; filters, `limit=` stopping a two-vCPU guest, `interval=`;
//! argument and output-file errors.
//!
//! Needs `scripts/build-qemu.sh` (rustkvm's QEMU and QEMU's `libinsn.so`),
//! `scripts/build-guests.sh`, `cargo build -p rustkvm-plugin` and Debian's
//! stock QEMU 10.0 (`scripts/deps.sh`): a missing one is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use rustkvm_tests::{guest, qemu, run, Arch};

/// QEMU's exit status when `limit=` stopped the run (docs/plugin.md).
const LIMIT_EXIT_STATUS: i32 = 100;

/// The guest whose loop is the oracle, and its symbol.
const COUNTED: &str = "plugin-counted";
const COUNTED_SYMBOL: &str = "plugin_counted_loop";
/// Iterations of each vCPU's first call (tests/guests/src/bin/plugin-counted.rs).
const WARMUP: u64 = 1000;

/// Debian's stock QEMU 10.0 (`scripts/deps.sh` installs it from
/// bookworm-backports); a missing or other QEMU fails the test.
fn stock(arch: Arch) -> PathBuf {
    let exe = PathBuf::from(match arch {
        Arch::X86_64 => "/usr/bin/qemu-system-x86_64",
        Arch::Aarch64 => "/usr/bin/qemu-system-aarch64",
    });
    let version = Command::new(&exe)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("cannot run it: {e}"));
    assert!(
        version.contains("version 10.0."),
        "{} is not Debian's stock QEMU 10.0 ({:?}): scripts/deps.sh installs \
         qemu-system-x86 and qemu-system-arm 10.0 from bookworm-backports",
        exe.display(),
        version.trim()
    );
    exe
}

/// QEMU's contrib `insn` plugin from rustkvm's build: the independent
/// instruction count. Missing is a failure.
fn libinsn() -> PathBuf {
    qemu::plugin("insn").unwrap_or_else(|e| {
        panic!("QEMU's insn plugin (the independent instruction count) is missing: {e}")
    })
}

/// QEMU's `insn` plugin for [`stock`] QEMU 10.0: from rustkvm's 10.0
/// build, whichever release `RUSTKVM_QEMU` selects (10.2's needs plugin
/// API version 5, and QEMU 10.0 refuses to load it).
fn stock_libinsn() -> PathBuf {
    qemu::plugin_of("insn", Some("10.0")).unwrap_or_else(|e| {
        panic!("QEMU 10.0's insn plugin (stock QEMU 10.0's independent count) is missing: {e}")
    })
}

fn machine(arch: Arch, smp: u32) -> Vec<String> {
    let smp = smp.to_string();
    let rest = [
        "-smp", &smp, "-display", "none", "-serial", "stdio", "-monitor", "none",
    ];
    arch.machine_args()
        .iter()
        .chain(rest.iter())
        .chain(["-nodefaults"].iter())
        .map(|s| s.to_string())
        .collect()
}

/// A scratch directory per test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rustkvm-plugin-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// How a QEMU run ended.
struct Run {
    /// QEMU's exit status (None: killed by a signal).
    status: Option<i32>,
    /// The guest's serial console (its result protocol).
    serial: String,
    /// Its stderr (plugins' messages, `-d plugin` output).
    stderr: String,
}

/// Boot `guest` on `exe` with `plugins` (path, args) and `extra` arguments.
fn boot(
    exe: &Path,
    arch: Arch,
    guest: &str,
    smp: u32,
    plugins: &[(PathBuf, String)],
    extra: &[String],
) -> Run {
    let tests = guest::discover().expect("guests");
    let t = tests.iter().find(|t| t.name == guest).expect("guest");
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "10", "120"])
        .arg(exe)
        .args(machine(arch, smp));
    cmd.arg("-kernel").arg(t.binary(arch));
    for (p, a) in plugins {
        let spec = if a.is_empty() {
            p.display().to_string()
        } else {
            format!("{},{a}", p.display())
        };
        cmd.args(["-plugin", &spec]);
    }
    cmd.args(["-d", "plugin"]).args(extra);
    let out = cmd.output().expect("QEMU ran");
    Run {
        status: out.status.code(),
        serial: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `-fw_cfg` telling `plugin-counted` its iteration count.
fn iterations(n: u64) -> Vec<String> {
    vec![
        "-fw_cfg".into(),
        format!("name=opt/rustkvm/plugin-iterations,string={n}"),
    ]
}

/// `plugin-counted` on two vCPUs with `n` iterations and `plugins`; the
/// guest must pass.
/// The guest passes by the result protocol (its exit status, summary and
/// check lines agree: `run::judge`), not by QEMU's exit status alone: on
/// x86 a passing guest's isa-debug-exit status 1 is also QEMU's own exit
/// status for an error, such as a plugin it refused to load.
fn counted_passes(exe: &Path, arch: Arch, plugins: &[(PathBuf, String)], n: u64) -> Run {
    let run = boot(exe, arch, COUNTED, 2, plugins, &iterations(n));
    let outcome = run::judge(
        arch,
        run.status,
        None,
        run.serial.clone(),
        run.stderr.clone(),
        Duration::ZERO,
    );
    assert_eq!(
        outcome.status,
        run::Status::Pass,
        "{} {arch}: the guest did not pass (status {:?})\n{}\n{}",
        exe.display(),
        run.status,
        run.serial,
        run.stderr
    );
    run
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// A copy of our plugin in `dir` (QEMU loads one file once).
fn copy_of_ours(dir: &Path, name: &str) -> PathBuf {
    let ours = qemu::rustkvm_plugin().expect("plugin built");
    let copy = dir.join(format!("{name}.so"));
    std::fs::copy(&ours, &copy).unwrap();
    copy
}

/// QEMU's `insn` plugin's per-vCPU counts (`cpu N insns: X` lines).
fn insn_counts(stderr: &str, vcpus: usize) -> Vec<u64> {
    (0..vcpus)
        .map(|k| {
            let prefix = format!("cpu {k} insns: ");
            stderr
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| {
                    panic!("no '{prefix}' line from QEMU's insn plugin in\n{stderr}")
                })
        })
        .collect()
}

/// What `iters` iterations in `calls` calls of `plugin_counted_loop`
/// execute (tests/guests/src/counted.rs), as one vCPU object of the report
/// with `counters=all`.
fn counted_oracle(arch: Arch, vcpu: usize, iters: u64, calls: u64) -> Value {
    let loads = match arch {
        Arch::X86_64 => iters + calls, // each return pops
        Arch::Aarch64 => iters,
    };
    json!({
        "vcpu": vcpu,
        "instructions": 5 * iters + 2 * calls,
        "branches": iters + calls,
        "mem_access": loads + iters,
        "mem_loads": loads,
        "mem_stores": iters,
        "class_branch": iters + calls,
        "class_load_store": 2 * iters,
        "class_alu": 2 * iters + calls,
        "class_fp_simd": 0,
        "class_system": 0,
        "class_other": 0,
    })
}

/// `plugin-counted` with `n` iterations on `exe`, two vCPUs, four plugins
/// in one process: ours in exact mode, a copy per instruction, a copy
/// counting only the loop, and QEMU's `insn`. The loop copy equals the
/// guest's arithmetic on every counter of every vCPU; the exact copy
/// equals the per-instruction copy on every counter and QEMU's `insn` on
/// instructions, per vCPU; its hot blocks in the loop add up to the loop's
/// instructions.
fn exact_everywhere(exe: &Path, arch: Arch, insn: PathBuf) {
    let n = 100_000;
    let dir = scratch(&format!("exact-{}-{arch}", exe.display().to_string().len()));
    let (exact, per_insn, looped) = (
        dir.join("exact.json"),
        dir.join("insn.json"),
        dir.join("loop.json"),
    );
    let plugins = vec![
        (
            copy_of_ours(&dir, "exact"),
            format!(
                "counters=all,hot=1000000,quiet=on,outfile={}",
                exact.display()
            ),
        ),
        (
            copy_of_ours(&dir, "insn"),
            format!(
                "mode=insn,counters=all,quiet=on,outfile={}",
                per_insn.display()
            ),
        ),
        (
            copy_of_ours(&dir, "loop"),
            format!(
                "symbol={COUNTED_SYMBOL},counters=all,quiet=on,outfile={}",
                looped.display()
            ),
        ),
        (insn, "inline=on".into()),
    ];
    let run = counted_passes(exe, arch, &plugins, n);
    let label = format!("{} {arch}", exe.display());
    let (e, i, l) = (json(&exact), json(&per_insn), json(&looped));
    // The guest's arithmetic: vCPU 0 runs WARMUP + n iterations, vCPU 1
    // WARMUP + 2n, in two calls each.
    let want = json!([
        counted_oracle(arch, 0, WARMUP + n, 2),
        counted_oracle(arch, 1, WARMUP + 2 * n, 2),
    ]);
    assert_eq!(l["vcpus"], want, "{label}: the loop's counters");
    assert_eq!(
        e["vcpus"], i["vcpus"],
        "{label}: exact mode vs per-instruction"
    );
    let ours: Vec<u64> = (0..2)
        .map(|k| e["vcpus"][k]["instructions"].as_u64().expect("count"))
        .collect();
    assert_eq!(
        ours,
        insn_counts(&run.stderr, 2),
        "{label}: instructions per vCPU vs QEMU's insn plugin"
    );
    let in_loop: u64 = e["hot_blocks"]
        .as_array()
        .expect("hot blocks")
        .iter()
        .filter(|b| b["symbol"] == COUNTED_SYMBOL)
        .map(|b| b["executions"].as_u64().unwrap() * b["insns"].as_u64().unwrap())
        .sum();
    assert_eq!(
        in_loop,
        l["total"]["instructions"].as_u64().unwrap(),
        "{label}: hot blocks in the loop x their lengths"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exact_counts_equal_the_guests_arithmetic_and_qemus_insn_plugin_in_rustkvms_build() {
    for arch in Arch::ALL {
        exact_everywhere(&qemu::emulator(arch).expect("built"), arch, libinsn());
    }
}

#[test]
fn stock_debian_qemu_10_0_loads_it_and_counts_exactly() {
    for arch in Arch::ALL {
        exact_everywhere(&stock(arch), arch, stock_libinsn());
    }
}

#[test]
fn tb_mode_is_never_below_exact_and_csv_has_the_same_totals() {
    let exe = qemu::emulator(Arch::X86_64).expect("built");
    let dir = scratch("tb");
    let ours = qemu::rustkvm_plugin().expect("plugin built");
    let copy = dir.join("copy.so");
    std::fs::copy(&ours, &copy).unwrap();
    let (exact, tb) = (dir.join("exact.csv"), dir.join("tb.json"));
    boot(
        &exe,
        Arch::X86_64,
        "x86-routing",
        1,
        &[
            (ours, format!("quiet=on,outfile={}", exact.display())),
            (copy, format!("mode=tb,quiet=on,outfile={}", tb.display())),
        ],
        &[],
    );
    let csv = std::fs::read_to_string(&exact).unwrap();
    let exact_total: u64 = csv
        .lines()
        .find_map(|l| l.strip_prefix("total,instructions,"))
        .and_then(|v| v.parse().ok())
        .expect("csv total");
    let tb_total = json(&tb)["total"]["instructions"].as_u64().unwrap();
    // x86-routing takes #GP and #UD on purpose: blocks left part-way.
    assert!(tb_total > exact_total, "tb {tb_total}, exact {exact_total}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_and_unwritable_outfiles_are_refused_at_load() {
    let exe = qemu::emulator(Arch::X86_64).expect("built");
    let ours = qemu::rustkvm_plugin().expect("plugin built");
    for (arg, want) in [
        (
            "counters=cycles",
            "bad argument 'counters=cycles': accepted counters=",
        ),
        ("mode=fast", "accepted mode=exact|insn|tb"),
        ("hot=many", "accepted hot=N"),
        ("bogus=1", "accepted mode=, counters="),
        ("outfile=/nonexistent/dir/x.json", "cannot create it"),
    ] {
        let out = Command::new(&exe)
            .args(machine(Arch::X86_64, 1))
            .args(["-plugin", &format!("{},{arg}", ours.display())])
            .output()
            .expect("QEMU ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{arg}: QEMU started\n{err}");
        assert!(err.contains(want), "{arg}: {err}");
        assert!(err.contains("Could not load plugin"), "{arg}: {err}");
    }
}

/// Run `guest` on x86_64 with one copy of our plugin per argument set, in
/// one QEMU process (counts of separate processes drift by a few
/// instructions); the JSON reports and stderr.
fn run_ours(guest: &str, arg_sets: &[&str]) -> (Vec<Value>, String) {
    let exe = qemu::emulator(Arch::X86_64).expect("built");
    let dir = scratch(&format!("ours-{guest}-{}", arg_sets.join("").len()));
    let ours = qemu::rustkvm_plugin().expect("plugin built");
    let mut plugins = Vec::new();
    for (i, args) in arg_sets.iter().enumerate() {
        let copy = dir.join(format!("copy{i}.so"));
        std::fs::copy(&ours, &copy).unwrap();
        let out = dir.join(format!("r{i}.json"));
        plugins.push((copy, format!("quiet=on,outfile={},{args}", out.display())));
    }
    let stderr = boot(&exe, Arch::X86_64, guest, 1, &plugins, &[]).stderr;
    let reports = (0..arg_sets.len())
        .map(|i| json(&dir.join(format!("r{i}.json"))))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (reports, stderr)
}

fn total(r: &Value) -> u64 {
    r["total"]["instructions"].as_u64().expect("instructions")
}

#[test]
fn address_and_symbol_filters_count_only_what_they_select() {
    let (r, _) = run_ours(
        "hello",
        &[
            "counters=all",
            "counters=all,filter=0-0xffffffffffffffff",
            "filter=0xfff00000000-0xfff00001000",
            "symbol=guest_main",
        ],
    );
    assert_eq!(r[0]["total"], r[1]["total"], "a filter over everything");
    assert_eq!(total(&r[2]), 0, "{}", r[2]);
    let n = total(&r[3]);
    assert!(
        n > 0 && n < total(&r[0]) / 100,
        "guest_main alone: {n} of {}",
        total(&r[0])
    );
}

/// `limit=` on a guest whose two vCPUs are both inside the counted loop
/// when the limit is reached (each finishes its warm-up call before either
/// starts its long one; `symbol=` counts only the loop): QEMU shuts down
/// through its main loop and exits with the plugin's own status (after the
/// same plugin's `trace=` window ended, and its reset, on the way), the report says which vCPU stopped it and where,
/// and the other plugins in the process (a copy of ours counting
/// everything, QEMU's `insn`) still write theirs, read with every vCPU
/// held: the two agree on every vCPU.
#[test]
fn limit_stops_every_vcpu_writes_the_report_and_exits_with_its_own_status() {
    const LIMIT: u64 = 1_000_000;
    // Blocks of the loop hold at most 6 instructions: the count is below
    // LIMIT + 6 at the block start where the limit is seen, and that block
    // is the last one the vCPU runs.
    const SLACK: u64 = 12;
    for arch in Arch::ALL {
        let exe = qemu::emulator(arch).expect("built");
        let dir = scratch(&format!("limit-{arch}"));
        let (limited, all, trace) = (
            dir.join("limited.json"),
            dir.join("all.json"),
            dir.join("t.bin"),
        );
        let plugins = vec![
            (
                copy_of_ours(&dir, "limited"),
                format!(
                    "symbol={COUNTED_SYMBOL},counters=all,hot=4,limit={LIMIT},quiet=on,outfile={},trace={},trace-count=1000",
                    limited.display(),
                    trace.display()
                ),
            ),
            (
                copy_of_ours(&dir, "all"),
                format!("hot=4,quiet=on,outfile={}", all.display()),
            ),
            (libinsn(), "inline=on".into()),
        ];
        // Long loops (5e7 and 1e8 instructions): the limit comes first.
        let run = boot(&exe, arch, COUNTED, 2, &plugins, &iterations(10_000_000));
        let label = format!("{arch} limit={LIMIT}");
        assert_eq!(
            run.status,
            Some(LIMIT_EXIT_STATUS),
            "{label}: QEMU's exit status\n{}",
            run.stderr
        );
        // QEMU's own shutdown stopped the machine (its main loop's report
        // of the plugin's SIGTERM), not an `exit` from a vCPU thread.
        assert!(
            run.stderr.contains("terminating on signal 15 from pid"),
            "{label}: QEMU did not shut down through its main loop\n{}",
            run.stderr
        );
        let r = json(&limited);
        let v = r["stopped"]["vcpu"]
            .as_u64()
            .unwrap_or_else(|| panic!("{label}: no stopped vCPU in {r}"));
        assert_eq!(r["stopped"]["reason"], "limit", "{label}: {r}");
        assert!(
            run.stderr
                .contains(&format!("vCPU {v} reached limit={LIMIT} instructions")),
            "{label}: {}",
            run.stderr
        );
        let counts: Vec<u64> = (0..2)
            .map(|k| r["vcpus"][k]["instructions"].as_u64().expect("count"))
            .collect();
        assert!(
            (LIMIT..LIMIT + SLACK).contains(&counts[v as usize]),
            "{label}: vCPU {v} stopped at {counts:?}"
        );
        for (k, c) in counts.iter().enumerate() {
            assert!(
                *c >= 5 * WARMUP + 2,
                "{label}: vCPU {k} ran {c} loop instructions, not even its warm-up call"
            );
        }
        let hot = r["hot_blocks"].as_array().expect("hot blocks");
        assert!(
            !hot.is_empty() && hot.iter().all(|b| b["symbol"] == COUNTED_SYMBOL),
            "{label}: {hot:?}"
        );
        // The trace's window ended (its reset re-registered the callbacks)
        // before the limit, whose own reset then stopped the run; the trace
        // is complete: 1000 executions per vCPU.
        let out = Command::new(trace_tool())
            .arg(&trace)
            .output()
            .expect("rustkvm-trace");
        assert!(
            out.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with("vcpu "))
                .count(),
            2000,
            "{label}: the trace"
        );
        let everything = json(&all);
        assert_eq!(everything["stopped"], Value::Null, "{label}");
        let ours: Vec<u64> = (0..2)
            .map(|k| {
                everything["vcpus"][k]["instructions"]
                    .as_u64()
                    .expect("count")
            })
            .collect();
        assert_eq!(
            ours,
            insn_counts(&run.stderr, 2),
            "{label}: every vCPU held while the exit callbacks read"
        );
        for k in 0..2 {
            assert!(ours[k] > counts[k], "{label}: {ours:?} vs {counts:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn intervals_are_recorded() {
    let (r, _) = run_ours("hello", &["interval=1000000"]);
    let marks: Vec<u64> = r[0]["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .filter_map(|i| i["instructions"].as_u64())
        .collect();
    assert_eq!(marks.len() as u64, total(&r[0]) / 1_000_000, "{marks:?}");
    for (k, m) in marks.iter().enumerate() {
        let want = (k as u64 + 1) * 1_000_000;
        assert!(
            *m >= want && *m < want + 10_000 * (k as u64 + 1),
            "{marks:?}"
        );
    }
}

/// `timeline=` on both architectures, one QEMU process each (two vCPUs of
/// `plugin-counted`, every counter): the file is trace-event JSON as
/// Perfetto reads it (a `traceEvents` array of metadata and counter events,
/// numeric timestamps and values), one process per vCPU; per vCPU the
/// `instructions` track's intervals add up to its last cumulative count,
/// which is the report's last interval record for that vCPU; and
/// scripts/plot-timeline.py turns it into a well-formed SVG with a line per
/// vCPU, against instructions and against time.
#[test]
fn timelines_are_trace_event_json_and_plot() {
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let exe = qemu::emulator(arch).expect("built");
        let dir = scratch(&format!("timeline-{arch}"));
        let (report, timeline) = (dir.join("r.json"), dir.join("t.json"));
        let plugins = vec![(
            copy_of_ours(&dir, "tl"),
            format!(
                "counters=all,quiet=on,interval=100000,outfile={},timeline={}",
                report.display(),
                timeline.display()
            ),
        )];
        counted_passes(&exe, arch, &plugins, 200_000);
        let t = json(&timeline);
        let events = t["traceEvents"].as_array().expect("traceEvents");
        let mut last_at: std::collections::BTreeMap<u64, (u64, u64, f64)> = Default::default();
        let mut processes = 0;
        for e in events {
            let ph = e["ph"].as_str().expect("ph");
            let pid = e["pid"].as_u64().expect("pid");
            assert!(e["name"].is_string(), "{e}");
            match ph {
                "M" => {
                    assert_eq!(e["name"], "process_name", "{e}");
                    processes += 1;
                }
                "C" => {
                    let ts = e["ts"].as_f64().expect("numeric ts");
                    let args = e["args"].as_object().expect("args");
                    assert!(args.values().all(Value::is_number), "{e}");
                    if e["name"] == "instructions" {
                        let (sum, at, last_ts) = last_at.entry(pid).or_insert((0, 0, 0.0));
                        let now_at = args["at_instructions"].as_u64().expect("at");
                        assert!(now_at > *at && ts >= *last_ts, "{e}");
                        *sum += args["instructions"].as_u64().expect("delta");
                        (*at, *last_ts) = (now_at, ts);
                    }
                }
                other => panic!("{arch}: event phase {other}: {e}"),
            }
        }
        assert_eq!(processes, 2, "{arch}: one process per vCPU");
        assert_eq!(
            last_at.len(),
            2,
            "{arch}: both vCPUs have an instructions track"
        );
        let r = json(&report);
        for (pid, (sum, at, _)) in &last_at {
            assert_eq!(sum, at, "{arch}: vCPU {}: intervals add up", pid - 1);
            let last = r["intervals"]
                .as_array()
                .expect("intervals")
                .iter()
                .rfind(|i| i["vcpu"].as_u64() == Some(pid - 1))
                .expect("an interval record");
            assert_eq!(last["instructions"].as_u64(), Some(*at), "{arch}");
        }
        for x in ["instructions", "time"] {
            let svg = dir.join(format!("plot-{x}.svg"));
            let out = Command::new("python3")
                .arg(rustkvm_tests::repo_root().join("scripts/plot-timeline.py"))
                .arg(&timeline)
                .arg(&svg)
                .args(["--x", x])
                .output()
                .expect("python3");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = std::fs::read_to_string(&svg).expect("svg");
            assert!(text.starts_with("<svg"), "{text}");
            // Every panel has a line per vCPU.
            let panels = text.matches("font-weight=\"bold\"").count();
            assert!(panels >= 3, "{panels} panels");
            assert_eq!(text.matches("<polyline").count(), 2 * panels, "{arch} {x}");
            let wf = Command::new("python3")
                .args([
                    "-c",
                    "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
                ])
                .arg(&svg)
                .status()
                .expect("python3");
            assert!(wf.success(), "{arch}: the SVG is not well-formed XML");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The address of `symbol` in `guest`'s image (binutils' `nm`, which does
/// not share our code).
fn symbol_address(arch: Arch, guest: &str, symbol: &str) -> u64 {
    let tests = guest::discover().expect("guests");
    let t = tests.iter().find(|t| t.name == guest).expect("guest");
    let out = Command::new("nm")
        .arg(t.binary(arch))
        .output()
        .expect("nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (addr, _, name) = (f.next()?, f.next()?, f.next()?);
            (name == symbol).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("no {symbol} in {guest}"))
}

/// A drcov module: (base, end).
type Module = (u64, u64);
/// A drcov block: (module id, start offset, size).
type CoveredBlock = (u16, u32, u16);

/// drcov read from the format's description (DynamoRIO's drcov, version 2):
/// text lines up to `BB Table: N bbs`, then N entries of u32 start, u16
/// size, u16 module id. Returns (module (base, end)s, (module, start,
/// size)s).
fn parse_drcov(data: &[u8]) -> (Vec<Module>, Vec<CoveredBlock>) {
    let mut pos = 0;
    let mut line = || {
        let end = data[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .expect("a text line")
            + pos;
        let l = std::str::from_utf8(&data[pos..end])
            .expect("text")
            .to_string();
        pos = end + 1;
        l
    };
    assert_eq!(line(), "DRCOV VERSION: 2");
    assert!(line().starts_with("DRCOV FLAVOR: "));
    let count: usize = line()
        .strip_prefix("Module Table: version 2, count ")
        .expect("module table")
        .parse()
        .expect("count");
    assert_eq!(line(), "Columns: id, base, end, entry, path");
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).expect("hex");
    let modules: Vec<Module> = (0..count)
        .map(|i| {
            let l = line();
            let f: Vec<&str> = l.splitn(5, ',').collect();
            assert_eq!(f[0].trim().parse::<usize>().ok(), Some(i), "{l}");
            (hex(f[1]), hex(f[2]))
        })
        .collect();
    let l = line();
    let n: usize = l
        .strip_prefix("BB Table: ")
        .and_then(|r| r.strip_suffix(" bbs"))
        .expect("BB Table")
        .parse()
        .expect("bb count");
    let bin = &data[pos..];
    assert_eq!(bin.len(), 8 * n, "{n} entries of 8 bytes");
    let bbs = bin
        .chunks(8)
        .map(|e| {
            (
                u16::from_le_bytes([e[6], e[7]]),
                u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                u16::from_le_bytes([e[4], e[5]]),
            )
        })
        .collect();
    (modules, bbs)
}

/// `bbv=` and `drcov=` on both architectures, one QEMU process each (two
/// vCPUs of `plugin-counted`): every vCPU's `.bb` lines add up to its
/// instruction count (the report's, which the other tests hold against the
/// guest's arithmetic and QEMU's `insn`), every full interval holds at
/// least `interval=` instructions, and IDs start at 1; the drcov file
/// parses by the format's description, every block lies in its module, and
/// the blocks cover the guest's counted loop (its address from `nm`).
#[test]
fn basic_block_vectors_add_up_and_coverage_is_drcov() {
    const INTERVAL: u64 = 100_000;
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let exe = qemu::emulator(arch).expect("built");
        let dir = scratch(&format!("bbv-{arch}"));
        let (report, bbv, cov) = (dir.join("r.json"), dir.join("bbv"), dir.join("cov.drcov"));
        let plugins = vec![(
            copy_of_ours(&dir, "bbv"),
            format!(
                "quiet=on,interval={INTERVAL},outfile={},bbv={},drcov={}",
                report.display(),
                bbv.display(),
                cov.display()
            ),
        )];
        counted_passes(&exe, arch, &plugins, 100_000);
        let r = json(&report);
        for v in r["vcpus"].as_array().expect("vcpus") {
            let i = v["vcpu"].as_u64().expect("vcpu");
            let text = std::fs::read_to_string(format!("{}.{i}.bb", bbv.display())).expect("bb");
            let lines: Vec<u64> = text
                .lines()
                .map(|l| {
                    let pairs = l.strip_prefix("T:").expect("T line");
                    pairs
                        .split_whitespace()
                        .map(|p| {
                            let (id, n) =
                                p.trim_start_matches(':').split_once(':').expect("id:count");
                            assert!(id.parse::<u64>().expect("id") >= 1, "{p}");
                            n.parse::<u64>().expect("count")
                        })
                        .sum()
                })
                .collect();
            assert_eq!(
                lines.iter().sum::<u64>(),
                v["instructions"].as_u64().expect("instructions"),
                "{arch} vCPU {i}: the vectors add up to the instructions"
            );
            if let Some((_, full)) = lines.split_last() {
                assert!(
                    full.iter().all(|&n| n >= INTERVAL),
                    "{arch} vCPU {i}: {lines:?}"
                );
            }
        }
        let (modules, bbs) = parse_drcov(&std::fs::read(&cov).expect("drcov file"));
        assert!(!bbs.is_empty());
        for &(m, start, size) in &bbs {
            let (base, end) = modules[m as usize];
            assert!(base + u64::from(start) + u64::from(size) - 1 <= end);
        }
        let lp = symbol_address(arch, COUNTED, COUNTED_SYMBOL);
        assert!(
            bbs.iter().any(|&(m, start, size)| {
                let a = modules[m as usize].0 + u64::from(start);
                (a..a + u64::from(size)).contains(&lp)
            }),
            "{arch}: no executed block covers {COUNTED_SYMBOL} at {lp:#x}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The newest `rustkvm-trace` (target/{debug,release}; `cargo build -p
/// rustkvm-plugin` makes it).
fn trace_tool() -> PathBuf {
    let target = rustkvm_tests::repo_root().join("target");
    ["debug", "release"]
        .iter()
        .map(|p| target.join(p).join("rustkvm-trace"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .expect("rustkvm-trace built (cargo build -p rustkvm-plugin)")
}

/// `len` bytes of `elf`'s image at virtual address `vaddr`, from its
/// program headers (ELF64, little-endian): the guest binary's own code.
fn elf_bytes(elf: &[u8], vaddr: u64, len: usize) -> Option<Vec<u8>> {
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        let (offset, pvaddr, filesz) = (u64_at(ph + 8), u64_at(ph + 16), u64_at(ph + 32));
        (vaddr >= pvaddr && vaddr + len as u64 <= pvaddr + filesz).then(|| {
            let at = (offset + vaddr - pvaddr) as usize;
            elf[at..at + len].to_vec()
        })
    })
}

/// `trace=` on both architectures, one QEMU process each (two vCPUs of
/// `plugin-counted`, the loop selected with `symbol=`, instructions 1000 to
/// 1199 of each vCPU, memory accesses on): its counts equal those of a copy
/// that does not trace (the traced copy resets itself past the windows);
/// per vCPU the indices run
/// consecutively from 1000, 200 of them; every traced instruction lies in
/// the loop and its bytes are the guest image's own at that address (x86:
/// at an instruction boundary binutils' `objdump` gives); and the accesses
/// are the loop's: a load and a store of the vCPU's cell per iteration,
/// each load reading what the last store wrote, the stores growing by
/// n, n-1, n-2, ... (the loop adds its decrementing counter).
#[test]
fn traces_follow_the_guests_code_and_its_stores() {
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let exe = qemu::emulator(arch).expect("built");
        let dir = scratch(&format!("trace-{arch}"));
        let (trace, traced_report, plain_report) = (
            dir.join("t.bin"),
            dir.join("traced.json"),
            dir.join("plain.json"),
        );
        // A second copy counts the same without tracing: once every vCPU is
        // past its window the traced copy resets itself to drop the trace's
        // callbacks, and must count on exactly.
        let plugins = vec![
            (
                copy_of_ours(&dir, "trace"),
                format!(
                    "quiet=on,symbol={COUNTED_SYMBOL},outfile={},trace={},trace-start=1000,trace-count=200,trace-mem=on",
                    traced_report.display(),
                    trace.display()
                ),
            ),
            (
                copy_of_ours(&dir, "plain"),
                format!(
                    "quiet=on,symbol={COUNTED_SYMBOL},outfile={}",
                    plain_report.display()
                ),
            ),
        ];
        counted_passes(&exe, arch, &plugins, 100_000);
        assert_eq!(
            json(&traced_report)["vcpus"],
            json(&plain_report)["vcpus"],
            "{arch}: counts after the trace's reset"
        );
        let jsonl = dir.join("t.jsonl");
        let ok = Command::new(trace_tool())
            .arg("--json")
            .arg(&trace)
            .arg(&jsonl)
            .status()
            .expect("rustkvm-trace");
        assert!(ok.success());
        // Cut short, the same trace is reported truncated (exit status 1).
        let data = std::fs::read(&trace).expect("trace");
        let cut = dir.join("cut.bin");
        std::fs::write(&cut, &data[..data.len() - 20]).unwrap();
        let out = Command::new(trace_tool())
            .arg(&cut)
            .arg(dir.join("cut.txt"))
            .output()
            .expect("rustkvm-trace");
        assert_eq!(out.status.code(), Some(1), "{arch}: a cut trace");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("rustkvm-trace: truncated trace"),
            "{arch}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&jsonl).expect("jsonl");
        let tests = guest::discover().expect("guests");
        let image = std::fs::read(
            tests
                .iter()
                .find(|t| t.name == COUNTED)
                .expect("guest")
                .binary(arch),
        )
        .expect("guest image");
        let start = symbol_address(arch, COUNTED, COUNTED_SYMBOL);
        let boundaries: Option<Vec<u64>> = (arch == Arch::X86_64).then(|| {
            let t = tests.iter().find(|t| t.name == COUNTED).expect("guest");
            let out = Command::new("objdump")
                .arg("-d")
                .arg(format!("--disassemble={COUNTED_SYMBOL}"))
                .arg(t.binary(arch))
                .output()
                .expect("objdump (binutils)");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let (a, _) = l.trim_start().split_once(':')?;
                    u64::from_str_radix(a, 16).ok()
                })
                .collect()
        });
        let mut per_vcpu: std::collections::BTreeMap<u64, Vec<Value>> = Default::default();
        for l in text.lines() {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            per_vcpu
                .entry(v["vcpu"].as_u64().expect("vcpu"))
                .or_default()
                .push(v);
        }
        assert_eq!(per_vcpu.len(), 2, "{arch}: both vCPUs traced");
        for (vcpu, recs) in &per_vcpu {
            let ctx = format!("{arch} vCPU {vcpu}");
            let idx: Vec<u64> = recs.iter().map(|r| r["index"].as_u64().unwrap()).collect();
            assert_eq!(idx, (1000..1200).collect::<Vec<u64>>(), "{ctx}: indices");
            let (mut cell, mut last_store, mut last_step) = (None, None::<u64>, None::<u64>);
            for r in recs {
                let hexv = |s: &Value| {
                    u64::from_str_radix(s.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
                };
                let vaddr = hexv(&r["vaddr"]);
                let bytes: Vec<u8> = (0..r["bytes"].as_str().unwrap().len() / 2)
                    .map(|i| {
                        u8::from_str_radix(&r["bytes"].as_str().unwrap()[2 * i..2 * i + 2], 16)
                            .unwrap()
                    })
                    .collect();
                assert!(
                    (start..start + 64).contains(&vaddr),
                    "{ctx}: {vaddr:#x} outside the loop"
                );
                assert_eq!(
                    elf_bytes(&image, vaddr, bytes.len()),
                    Some(bytes.clone()),
                    "{ctx}: {r}"
                );
                match &boundaries {
                    Some(b) => assert!(
                        b.contains(&vaddr),
                        "{ctx}: {vaddr:#x} not an instruction start"
                    ),
                    None => assert_eq!(vaddr % 4, 0, "{ctx}"),
                }
                for m in r["mem"].as_array().expect("mem") {
                    let (addr, value) = (hexv(&m["vaddr"]), hexv(&m["value"]));
                    assert_eq!(m["size"], 8, "{ctx}: {m}");
                    assert_eq!(*cell.get_or_insert(addr), addr, "{ctx}: one cell");
                    if m["store"] == true {
                        if let Some(prev) = last_store {
                            let step = value.wrapping_sub(prev);
                            if let Some(s) = last_step {
                                assert_eq!(step, s - 1, "{ctx}: the counter decrements");
                            }
                            last_step = Some(step);
                        }
                        last_store = Some(value);
                    } else if let Some(prev) = last_store {
                        assert_eq!(value, prev, "{ctx}: the load reads the last store");
                    }
                }
            }
            assert!(last_step.is_some(), "{ctx}: stores traced");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `trace=` into a FIFO whose reader never reads (`trace-wait=1`): the
/// guest runs to its end, QEMU exits (once hung for ever, joining the
/// writer), the plugin says the trace is truncated, and its counts are
/// still written.
#[test]
fn a_trace_nobody_reads_does_not_hold_qemu() {
    let exe = qemu::emulator(Arch::X86_64).expect("built");
    let dir = scratch("trace-fifo");
    let (fifo, report) = (dir.join("t.fifo"), dir.join("r.json"));
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // The reader opens the FIFO (the plugin's open waits for it) and keeps
    // it open, unread, until QEMU has exited.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let f = std::fs::File::open(&fifo).expect("open the FIFO");
            let _ = rx.recv();
            drop(f);
        })
    };
    let plugins = vec![(
        copy_of_ours(&dir, "fifo"),
        format!(
            "quiet=on,symbol={COUNTED_SYMBOL},outfile={},trace={},trace-wait=1",
            report.display(),
            fifo.display()
        ),
    )];
    // 2 vCPUs × 5e5 loop iterations × 5 instructions: far more than the
    // pipe and the writer's queue hold (about 4 MiB, 250 000 records).
    let run = counted_passes(&exe, Arch::X86_64, &plugins, 500_000);
    let _ = tx.send(());
    reader.join().unwrap();
    assert!(
        run.stderr.contains("the writer made no progress for 1 s")
            && run.stderr.contains("rustkvm plugin: trace: truncated"),
        "{}",
        run.stderr
    );
    let r = json(&report);
    assert!(
        r["vcpus"][0]["instructions"].as_u64().unwrap_or(0) > 2_000_000,
        "{r}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
