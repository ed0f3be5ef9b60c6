//! rustkvm's TCG plugin (`plugin/`) in QEMU: exactness against QEMU's own
//! contrib `insn` plugin and against its own per-instruction mode, in the
//! same process; stock Debian QEMU 10.0 as well as rustkvm's build; both
//! architectures, several vCPUs; argument and output-file errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use rustkvm_tests::{guest, qemu, Arch};

/// Debian's stock QEMU (`scripts/deps.sh` installs 10.0 from
/// bookworm-backports).
fn stock(arch: Arch) -> PathBuf {
    PathBuf::from(match arch {
        Arch::X86_64 => "/usr/bin/qemu-system-x86_64",
        Arch::Aarch64 => "/usr/bin/qemu-system-aarch64",
    })
}

fn machine(arch: Arch, smp: u32) -> Vec<String> {
    let smp = smp.to_string();
    let rest = [
        "-smp", &smp, "-display", "none", "-serial", "none", "-monitor", "none",
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

/// Boot `guest` on `exe` with `plugins` (path, args); returns stderr.
fn boot(exe: &Path, arch: Arch, guest: &str, smp: u32, plugins: &[(PathBuf, String)]) -> String {
    let tests = guest::discover().expect("guests");
    let t = tests.iter().find(|t| t.name == guest).expect("guest");
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg(exe).args(machine(arch, smp));
    cmd.arg("-kernel").arg(t.binary(arch));
    for (p, a) in plugins {
        let spec = if a.is_empty() {
            p.display().to_string()
        } else {
            format!("{},{a}", p.display())
        };
        cmd.args(["-plugin", &spec]);
    }
    cmd.args(["-d", "plugin"]);
    let out = cmd.output().expect("QEMU ran");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// Ours in exact mode, a copy of ours per instruction, and QEMU's `insn`
/// (when given) in one process: every counter equal, per vCPU.
fn exact_everywhere(exe: &Path, arch: Arch, guest: &str, smp: u32, insn: Option<PathBuf>) {
    let dir = scratch(&format!("{}-{guest}-{smp}", arch.name()));
    let ours = qemu::rustkvm_plugin().expect("plugin built");
    let copy = dir.join("librustkvm_plugin_copy.so");
    std::fs::copy(&ours, &copy).unwrap();
    let (exact, per_insn) = (dir.join("exact.json"), dir.join("insn.json"));
    let mut plugins = vec![
        (
            ours,
            format!("counters=all,hot=5,quiet=on,outfile={}", exact.display()),
        ),
        (
            copy,
            format!(
                "mode=insn,counters=all,quiet=on,outfile={}",
                per_insn.display()
            ),
        ),
    ];
    if let Some(i) = insn {
        plugins.push((i, "inline=on".into()));
    }
    let stderr = boot(exe, arch, guest, smp, &plugins);
    let (e, i) = (json(&exact), json(&per_insn));
    let label = format!("{} {arch} {guest} smp{smp}", exe.display());
    assert_eq!(
        e["vcpus"], i["vcpus"],
        "{label}: exact mode vs per-instruction"
    );
    assert_eq!(
        e["vcpus"].as_array().map(Vec::len),
        Some(smp as usize),
        "{label}"
    );
    let total = e["total"]["instructions"].as_u64().expect("count");
    assert!(total > 10_000, "{label}: {total}");
    for k in ["branches", "mem_loads", "mem_stores", "class_alu"] {
        assert!(
            e["total"][k].as_u64().is_some_and(|v| v > 0),
            "{label}: {k}"
        );
    }
    let classes: u64 = [
        "class_branch",
        "class_load_store",
        "class_alu",
        "class_fp_simd",
        "class_system",
        "class_other",
    ]
    .iter()
    .map(|k| e["total"][*k].as_u64().unwrap_or(0))
    .sum();
    assert_eq!(classes, total, "{label}: every instruction has one class");
    assert_eq!(
        e["total"]["branches"], e["total"]["class_branch"],
        "{label}"
    );
    assert!(!e["hot_blocks"].as_array().unwrap().is_empty(), "{label}");
    if plugins.len() == 3 {
        let line = stderr
            .lines()
            .find_map(|l| l.strip_prefix("total insns: "))
            .unwrap_or_else(|| panic!("{label}: no insn output in\n{stderr}"));
        assert_eq!(
            line.trim().parse::<u64>().ok(),
            Some(total),
            "{label}: QEMU's insn plugin"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exact_counts_equal_qemus_insn_plugin_in_rustkvms_build() {
    for arch in Arch::ALL {
        let exe = qemu::emulator(arch).expect("built");
        let insn = qemu::plugin("insn").ok();
        let guest = match arch {
            Arch::X86_64 => "hello",
            Arch::Aarch64 => "smp",
        };
        let smp = if arch == Arch::Aarch64 { 2 } else { 1 };
        exact_everywhere(&exe, arch, guest, smp, insn);
    }
}

#[test]
fn stock_debian_qemu_10_0_loads_it_and_counts_exactly() {
    for arch in Arch::ALL {
        let exe = stock(arch);
        let version = Command::new(&exe).arg("--version").output();
        let v = version
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !v.contains("version 10.0.") {
            eprintln!(
                "SKIP: {} is not QEMU 10.0 ({v:?}); scripts/deps.sh installs it",
                exe.display()
            );
            continue;
        }
        let guest = match arch {
            Arch::X86_64 => "hello",
            Arch::Aarch64 => "smp",
        };
        exact_everywhere(&exe, arch, guest, 2, None);
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
    let stderr = boot(&exe, Arch::X86_64, guest, 1, &plugins);
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

#[test]
fn limit_stops_qemu_and_intervals_are_recorded() {
    let (r, stderr) = run_ours("plugin-workload", &["limit=1000000"]);
    assert!(stderr.contains("reached limit=1000000"), "{stderr}");
    let n = total(&r[0]);
    assert!((1_000_000..1_010_000).contains(&n), "stopped at {n}");
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
