//! The runners' JUnit output, read by a JUnit consumer that does not share
//! our code: `junitparser` (PyPI; `scripts/deps.sh` installs it in
//! `$RUSTKVM_CACHE/venv`). A missing consumer is a failure.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rustkvm_tests::junit::{self, Case};
use rustkvm_tests::linux::{self, Config, LinuxRun};
use rustkvm_tests::{Arch, Backend};

/// Python with junitparser.
fn python() -> PathBuf {
    let p = linux::cache_dir().join("venv").join("bin").join("python");
    assert!(
        p.exists(),
        "{} missing: scripts/deps.sh makes it",
        p.display()
    );
    p
}

/// What junitparser reads from `file`: one line per case,
/// `classname|name|result|message`, after a line of suite totals.
fn parse(file: &std::path::Path) -> Vec<String> {
    let script = r#"
import sys
from junitparser import JUnitXml, Failure, Skipped
xml = JUnitXml.fromfile(sys.argv[1])
for suite in xml:
    print(f"suite|{suite.name}|{suite.tests}|{suite.failures}|{suite.skipped}")
    for case in suite:
        kind, msg = "pass", ""
        for r in case.result:
            kind = "fail" if isinstance(r, Failure) else "skip" if isinstance(r, Skipped) else kind
            msg = r.message or ""
        print(f"{case.classname}|{case.name}|{kind}|{msg}")
"#;
    let out = Command::new(python())
        .args(["-c", script])
        .arg(file)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "junitparser refused {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rustkvm-junit-{}-{name}.xml", std::process::id()))
}

#[test]
fn the_guest_runners_junit_parses_with_every_verdict() {
    let file = tmp("guests");
    // x86-pmu-amd passes under rustkvm and is declared to SKIP on tcg.
    let status = Command::new(env!("CARGO_BIN_EXE_rustkvm-run"))
        .args([
            "--arch",
            "x86_64",
            "--backend",
            "tcg",
            "--backend",
            "rustkvm",
            "--variant",
            "default",
            "--quiet",
            "--junit",
        ])
        .arg(&file)
        .arg("x86-pmu-amd")
        .status()
        .expect("rustkvm-run runs");
    assert!(status.success());
    let lines = parse(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(lines[0], "suite|rustkvm-guests|2|0|1", "{lines:#?}");
    for want in [
        "rustkvm.guests.x86_64.default|x86-pmu-amd[tcg]|skip|x86-pmu-amd: the K7 event selects read 0: no PMU",
        "rustkvm.guests.x86_64.default|x86-pmu-amd[rustkvm]|pass|",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} not in {lines:#?}");
    }
}

#[test]
fn linux_runs_and_failures_parse_with_their_console_tail() {
    let run = |backend, outcome| LinuxRun {
        config: Config::new(Arch::X86_64, backend, 2),
        outcome,
        wallclock_offset_s: None,
        host_unix_s: (0.0, None),
        host_clock_step_s: None,
        elapsed: Duration::from_secs(3),
        console: "[    0.1] Linux version 6.12\n\u{1b}[0mKernel panic <not syncing>\n".into(),
        ending: String::new(),
    };
    let cases: Vec<Case> = [
        run(Backend::Rustkvm, linux::Outcome::Ok(serde_json::json!({}))),
        run(Backend::Kvm, linux::Outcome::Skip("kvm_pvm: no".into())),
        run(
            Backend::Tcg,
            linux::Outcome::Error("no report & a panic\nmore".into()),
        ),
    ]
    .iter()
    .map(Case::from_linux)
    .collect();
    let file = tmp("linux");
    std::fs::write(&file, junit::write("rustkvm-linux", &cases)).unwrap();
    let lines = parse(&file);
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(lines[0], "suite|rustkvm-linux|3|1|1", "{lines:#?}");
    assert!(lines.contains(&"rustkvm.linux.x86_64|x86_64/kvm/smp2|skip|kvm_pvm: no".to_string()));
    assert!(lines
        .contains(&"rustkvm.linux.x86_64|x86_64/tcg/smp2|fail|no report & a panic".to_string()));
    // The console's tail travels with the failure, escaped.
    assert!(text.contains("Kernel panic &lt;not syncing&gt;"), "{text}");
}
