//! rustkvm's guest test harness.
//!
//! A *guest test* is one file in `tests/guests/src/bin/`: a freestanding
//! program plus `//! rustkvm-test:` metadata lines saying on which
//! architectures it runs and how ([`GuestTest`]). The runner boots each guest
//! test on every (architecture, [`Variant`], [`Backend`]) it applies to,
//! reads the guest's result protocol from the serial console and its exit
//! status, and reports PASS / FAIL / SKIP(reason) per backend ([`report`]).
//!
//! Backends are what later issues compare: plain `tcg`, `rustkvm` (the
//! emulated KVM) and, with the KVM backend issue, `kvm`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod boot;
pub mod differential;
pub mod guard;
pub mod guest;
pub mod host;
pub mod introspect;
pub mod junit;
pub mod linux;
pub mod migrate;
pub mod nested;
pub mod qemu;
pub mod qmp;
pub mod report;
pub mod run;
pub mod soak;

use std::path::PathBuf;

use thiserror::Error;

pub use guest::GuestTest;
pub use qemu::{Arch, Backend, Variant};
pub use run::{Outcome, RunResult, Status};

/// Errors of the harness itself (not of a guest).
#[derive(Debug, Error)]
pub enum HarnessError {
    /// Reading a guest source or spawning a process failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A `//! rustkvm-test:` line could not be understood.
    #[error("{file}: bad rustkvm-test metadata: {why}")]
    Metadata {
        /// The guest source file.
        file: String,
        /// What is wrong.
        why: String,
    },
    /// A build product is missing.
    #[error("{0} not found: run {1}")]
    NotBuilt(PathBuf, &'static str),
    /// A bad command-line argument to the runner.
    #[error("{0}")]
    Usage(String),
}

/// Environment variable naming the verdict log: when set, every run the
/// runners judge appends one line `PASS|FAIL|SKIP<TAB>label<TAB>reason`, so
/// `scripts/test.sh` can count passes, failures and skips from the runners'
/// own verdicts (a cargo test that only saw SKIPs still "passes").
pub const VERDICT_LOG_ENV: &str = "RUSTKVM_VERDICT_LOG";

/// What goes before each label in the verdict log, if set: scripts/test.sh
/// runs the bundled guests on the other QEMU release too and names those
/// verdicts `qemu-RELEASE:`.
pub const VERDICT_PREFIX_ENV: &str = "RUSTKVM_VERDICT_PREFIX";

/// Append one run's verdict to the verdict log, if one is named.
pub fn record_verdict(label: &str, status: &Status) {
    use std::io::Write;
    let Some(path) = std::env::var_os(VERDICT_LOG_ENV) else {
        return;
    };
    let (word, why) = match status {
        Status::Pass => ("PASS", ""),
        Status::Fail(w) => ("FAIL", w.as_str()),
        Status::Skip(w) => ("SKIP", w.as_str()),
    };
    let flat = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    // A run that is not the suite's own says which it is
    // ([`VERDICT_PREFIX_ENV`]).
    let prefix = std::env::var(VERDICT_PREFIX_ENV).unwrap_or_default();
    // The cargo test that ran it (libtest names each test's thread after
    // the test): scripts/test.sh counts that test's runs, not the test too.
    let test = std::thread::current().name().unwrap_or_default().to_owned();
    let line = format!(
        "{word}\t{}{}\t{}\t{}\n",
        flat(&prefix),
        flat(label),
        flat(why),
        flat(&test)
    );
    // One write of one short line to an O_APPEND file: lines from parallel
    // tests do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "cannot append to the verdict log {}: {e}",
            path.to_string_lossy()
        );
    }
}

/// The repository root (this crate lives in `tests/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".."))
}
