//! Running the matrix and reporting it: a table (test × backend), TAP, and
//! the cross-backend comparison.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::guest::GuestTest;
use crate::qemu::{Arch, Backend, Variant};
use crate::run::{self, RunResult, Status};
use crate::HarnessError;

/// Which part of the matrix to run.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Architectures.
    pub arches: Vec<Arch>,
    /// Backends.
    pub backends: Vec<Backend>,
    /// Variants.
    pub variants: Vec<Variant>,
    /// Only tests whose name contains this.
    pub filter: Option<String>,
    /// `(i, n)`: run only rows with `row_index % n == i` (CI sharding).
    pub shard: (usize, usize),
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            arches: Arch::ALL.to_vec(),
            backends: Backend::ALL.to_vec(),
            variants: Variant::ALL.to_vec(),
            filter: None,
            shard: (0, 1),
        }
    }
}

/// One row of the table: a test on an architecture in a variant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    /// Guest test name.
    pub test: String,
    /// Architecture.
    pub arch: Arch,
    /// Variant.
    pub variant: Variant,
}

impl Row {
    /// `test/arch/variant`.
    pub fn label(&self) -> String {
        format!("{}/{}/{}", self.test, self.arch, self.variant)
    }
}

/// The rows `sel` selects from `tests`, in order, after sharding.
pub fn rows(tests: &[GuestTest], sel: &Selection) -> Vec<(GuestTest, Row)> {
    let mut all = Vec::new();
    for t in tests {
        if !t.matrix || sel.filter.as_deref().is_some_and(|f| !t.name.contains(f)) {
            continue;
        }
        for &arch in t.arches.iter().filter(|a| sel.arches.contains(a)) {
            for &variant in &sel.variants {
                all.push((
                    t.clone(),
                    Row {
                        test: t.name.clone(),
                        arch,
                        variant,
                    },
                ));
            }
        }
    }
    let (i, n) = sel.shard;
    all.into_iter()
        .enumerate()
        .filter(|(k, _)| k % n == i)
        .map(|(_, r)| r)
        .collect()
}

/// [`run_matrix`] with the kvm backend's cells run nested
/// ([`crate::nested`]): real KVM inside one rustkvm L1 per architecture.
pub fn run_matrix_nested(
    tests: &[GuestTest],
    sel: &Selection,
    mut progress: impl FnMut(&RunResult),
) -> Result<Vec<RunResult>, HarnessError> {
    let rest = Selection {
        backends: sel
            .backends
            .iter()
            .copied()
            .filter(|b| *b != Backend::Kvm)
            .collect(),
        ..sel.clone()
    };
    let mut results = run_matrix(tests, &rest, &mut progress)?;
    if !sel.backends.contains(&Backend::Kvm) {
        return Ok(results);
    }
    let rows = rows(tests, sel);
    for &arch in &sel.arches {
        let cells: Vec<(&GuestTest, Variant)> = rows
            .iter()
            .filter(|(_, r)| r.arch == arch && r.variant.applies_to(Backend::Kvm))
            .map(|(t, r)| (t, r.variant))
            .collect();
        if cells.is_empty() {
            continue;
        }
        for r in crate::nested::run_nested(&cells, arch)? {
            progress(&r);
            results.push(r);
        }
    }
    Ok(results)
}

/// Parse `i/n` (0-based shard index).
pub fn parse_shard(s: &str) -> Result<(usize, usize), HarnessError> {
    let bad = || HarnessError::Usage(format!("--shard {s}: expected i/n with 0 <= i < n"));
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// Run every selected row on every selected backend, calling `progress`
/// after each run.
pub fn run_matrix(
    tests: &[GuestTest],
    sel: &Selection,
    mut progress: impl FnMut(&RunResult),
) -> Result<Vec<RunResult>, HarnessError> {
    let mut results = Vec::new();
    for (test, row) in rows(tests, sel) {
        for &backend in sel.backends.iter().filter(|b| row.variant.applies_to(**b)) {
            let r = run::run(&test, row.arch, row.variant, backend)?;
            progress(&r);
            results.push(r);
        }
    }
    Ok(results)
}

/// Differences between the protocol lines of `backend` and `reference` for
/// the same row, ignoring `measure` keys listed in the test's `vary`.
pub fn differences(test: &GuestTest, reference: &RunResult, other: &RunResult) -> Vec<String> {
    let keep = |line: &&String| {
        !line
            .strip_prefix("measure ")
            .and_then(|r| r.split(' ').next())
            .is_some_and(|k| test.vary.iter().any(|v| v == k))
    };
    let a: Vec<&String> = reference.outcome.lines.iter().filter(keep).collect();
    let b: Vec<&String> = other.outcome.lines.iter().filter(keep).collect();
    let mut diffs = Vec::new();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if x != y {
            diffs.push(format!(
                "{}: {} says {:?}, {} says {:?}",
                i + 1,
                reference.backend,
                x.map(|s| s.as_str()).unwrap_or("<nothing>"),
                other.backend,
                y.map(|s| s.as_str()).unwrap_or("<nothing>")
            ));
        }
    }
    diffs
}

/// The results table: one line per row, one column per backend.
pub fn table(results: &[RunResult]) -> String {
    let backends: BTreeSet<Backend> = results.iter().map(|r| r.backend).collect();
    let rows: BTreeSet<Row> = results
        .iter()
        .map(|r| Row {
            test: r.test.clone(),
            arch: r.arch,
            variant: r.variant,
        })
        .collect();
    let width = rows
        .iter()
        .map(|r| r.label().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let cell = |row: &Row, b: &Backend| {
        results
            .iter()
            .find(|r| {
                r.backend == *b
                    && r.test == row.test
                    && r.arch == row.arch
                    && r.variant == row.variant
            })
            .map(|r| {
                let skipped: Vec<&str> = r
                    .outcome
                    .skipped_checks
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect();
                let inner = match (&r.outcome.status, skipped.is_empty()) {
                    (Status::Pass, false) => format!("[skipped {}]", skipped.join(",")),
                    _ => String::new(),
                };
                format!(
                    "{}{inner} {:.1}s",
                    r.outcome.status.label(),
                    r.outcome.elapsed.as_secs_f64()
                )
            })
            .unwrap_or_else(|| "-".to_string())
    };
    // Each column as wide as its widest cell (up to 60; longer reasons run on).
    let widths: Vec<usize> = backends
        .iter()
        .map(|b| {
            rows.iter()
                .map(|r| cell(r, b).len())
                .chain([b.name().len()])
                .max()
                .unwrap_or(4)
                .min(60)
        })
        .collect();
    let mut out = format!("{:width$}", "test");
    for (b, w) in backends.iter().zip(&widths) {
        let _ = write!(out, "  {:w$}", b.name());
    }
    out.push('\n');
    for row in &rows {
        let _ = write!(out, "{:width$}", row.label());
        for (b, w) in backends.iter().zip(&widths) {
            let _ = write!(out, "  {:w$}", cell(row, b));
        }
        out.push('\n');
    }
    let (p, f, s) = counts(results);
    let _ = writeln!(out, "{p} passed, {f} failed, {s} skipped");
    out
}

/// (passed, failed, skipped).
pub fn counts(results: &[RunResult]) -> (usize, usize, usize) {
    results
        .iter()
        .fold((0, 0, 0), |(p, f, s), r| match r.outcome.status {
            Status::Pass => (p + 1, f, s),
            Status::Fail(_) => (p, f + 1, s),
            Status::Skip(_) => (p, f, s + 1),
        })
}

/// TAP version 13 for the results.
pub fn tap(results: &[RunResult]) -> String {
    let mut out = format!("TAP version 13\n1..{}\n", results.len());
    for (i, r) in results.iter().enumerate() {
        let name = format!("{}/{}/{}/{}", r.test, r.arch, r.variant, r.backend);
        let _ = match &r.outcome.status {
            Status::Pass if !r.outcome.skipped_checks.is_empty() => {
                let skipped: Vec<String> = r
                    .outcome
                    .skipped_checks
                    .iter()
                    .map(|(n, w)| format!("{n} ({w})"))
                    .collect();
                writeln!(
                    out,
                    "ok {} - {name}\n# declared skipped checks: {}",
                    i + 1,
                    skipped.join("; ")
                )
            }
            Status::Pass => writeln!(out, "ok {} - {name}", i + 1),
            Status::Fail(why) => writeln!(out, "not ok {} - {name} # {why}", i + 1),
            Status::Skip(why) => writeln!(out, "ok {} - {name} # SKIP {why}", i + 1),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::judge;
    use std::time::Duration;

    fn test(name: &str, arches: &[Arch]) -> GuestTest {
        GuestTest {
            name: name.into(),
            arches: arches.to_vec(),
            smp: 1,
            timeout: Duration::from_secs(1),
            vary: vec!["t".into()],
            kvm_vary: Vec::new(),
            cpu: None,
            machine: None,
            compare: true,
            matrix: true,
            host_query: false,
            needs: Vec::new(),
            kvm_probe: None,
            expect: Vec::new(),
            expect_skip: Vec::new(),
        }
    }

    fn result(backend: Backend, serial: &str, code: i32) -> RunResult {
        RunResult {
            test: "a".into(),
            arch: Arch::Aarch64,
            variant: Variant::Default,
            backend,
            outcome: judge(
                Arch::Aarch64,
                Some(code),
                None,
                serial.into(),
                String::new(),
                Duration::ZERO,
            ),
        }
    }

    #[test]
    fn shards_partition_the_rows() {
        let tests = [test("a", &Arch::ALL), test("b", &[Arch::X86_64])];
        let all = rows(&tests, &Selection::default());
        assert_eq!(all.len(), 12, "3 arch rows x 4 variants");
        let mut seen = Vec::new();
        for i in 0..4 {
            let sel = Selection {
                shard: (i, 4),
                ..Selection::default()
            };
            seen.extend(rows(&tests, &sel).into_iter().map(|(_, r)| r.label()));
        }
        seen.sort();
        let mut want: Vec<String> = all.into_iter().map(|(_, r)| r.label()).collect();
        want.sort();
        assert_eq!(seen, want);
        assert!(parse_shard("1/3").is_ok());
        for bad in ["3/3", "1", "a/b", "0/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn comparison_ignores_only_declared_vary_keys() {
        let t = test("a", &[Arch::Aarch64]);
        let a = result(Backend::Tcg, "measure t 1\nmeasure k 1\nok x\n", 0);
        let b = result(Backend::Rustkvm, "measure t 2\nmeasure k 1\nok x\n", 0);
        assert!(differences(&t, &a, &b).is_empty());
        let c = result(Backend::Rustkvm, "measure t 2\nmeasure k 2\nok x\n", 0);
        assert_eq!(differences(&t, &a, &c).len(), 1);
    }

    #[test]
    fn table_and_tap_show_every_result() {
        let rs = [
            result(
                Backend::Tcg,
                "ok x\nsummary checks=1 passed=1 failed=0 skipped=0\n",
                0,
            ),
            result(
                Backend::Rustkvm,
                "skip x: why\nsummary checks=1 passed=0 failed=0 skipped=1\n",
                2,
            ),
        ];
        let tbl = table(&rs);
        assert!(tbl.contains("a/aarch64/default"), "{tbl}");
        assert!(
            tbl.contains("PASS") && tbl.contains("SKIP(x: why)"),
            "{tbl}"
        );
        assert!(tbl.ends_with("1 passed, 0 failed, 1 skipped\n"), "{tbl}");
        let tap = tap(&rs);
        assert!(tap.contains("1..2\nok 1 - a/aarch64/default/tcg\nok 2 - a/aarch64/default/rustkvm # SKIP x: why"), "{tap}");
    }
}
