//! The differential check: the same guest on rustkvm and on real KVM
//! (`backend=kvm`, nested in a rustkvm L1 on this project's machines),
//! field by field. KVM's own code is the oracle: every field of the guest's
//! report (each check's verdict, each `measure` value) and of the Linux
//! probe's must be the same on both, except the short list each guest
//! declares host-dependent (`kvm-vary`: cycles, steal amounts, timing, what
//! the host hypervisor adds), the keys it declares varying between any two
//! runs (`vary`), and the checks it declares skippable on kvm.
//!
//! `rustkvm-run --differential` and `rustkvm-linux --differential` print
//! the side-by-side tables and fail on any other difference
//! (scripts/test-differential.sh runs both, nested).

use crate::linux::{self, LinuxRun, Outcome as LinuxOutcome};
use crate::run::{RunResult, Status};
use crate::{Backend, GuestTest};

/// How the two values of one field compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Agreement {
    /// The same on both.
    Same,
    /// Different, as declared (why it may be).
    Declared(String),
    /// Different, not declared: a finding.
    Differs,
}

/// One field side by side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The check's name or the `measure` key.
    pub name: String,
    /// Its value on rustkvm (None: rustkvm's report has no such field).
    pub rustkvm: Option<String>,
    /// Its value on real KVM.
    pub kvm: Option<String>,
    /// How they compare.
    pub agreement: Agreement,
}

/// One guest (or Linux boot) compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comparison {
    /// Compared field by field.
    Fields(Vec<Field>),
    /// Not compared, and why (a declared kvm SKIP, a host limit): said,
    /// never a pass.
    NotCompared(String),
    /// A run failed: nothing to compare.
    Failed(String),
}

impl Comparison {
    /// The undeclared differences (a failed run counts as one).
    pub fn findings(&self) -> usize {
        match self {
            Comparison::Fields(f) => f
                .iter()
                .filter(|f| f.agreement == Agreement::Differs)
                .count(),
            Comparison::NotCompared(_) => 0,
            Comparison::Failed(_) => 1,
        }
    }
}

/// The fields of a guest's protocol lines, in order, as (field, name,
/// value): `ok NAME` → (NAME, NAME, "ok"), `not ok NAME: WHY` → "not ok:
/// WHY", `skip NAME: WHY` → "skip: WHY", `measure KEY VALUE` → ("measure
/// KEY", KEY, VALUE). A field seen again is numbered (`NAME #2`), so a check
/// a guest makes in a loop is compared occurrence by occurrence.
pub fn fields(lines: &[String]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for l in lines {
        let (field, name, value) = if let Some(m) = l.strip_prefix("measure ") {
            let (k, v) = m.split_once(' ').unwrap_or((m, ""));
            (format!("measure {k}"), k.to_string(), v.to_string())
        } else if let Some(c) = l.strip_prefix("not ok ") {
            let (n, why) = c.split_once(": ").unwrap_or((c, ""));
            (n.to_string(), n.to_string(), format!("not ok: {why}"))
        } else if let Some(c) = l.strip_prefix("skip ") {
            let (n, why) = c.split_once(": ").unwrap_or((c, ""));
            (n.to_string(), n.to_string(), format!("skip: {why}"))
        } else if let Some(c) = l.strip_prefix("ok ") {
            (c.to_string(), c.to_string(), "ok".to_string())
        } else {
            continue;
        };
        let seen = out
            .iter()
            .filter(|(_, n, _)| *n == name)
            .filter(|(f, _, _)| f.split(" #").next() == Some(field.as_str()))
            .count();
        let field = if seen == 0 {
            field
        } else {
            format!("{field} #{}", seen + 1)
        };
        out.push((field, name, value));
    }
    out
}

/// Whether `name` is in `list` (an entry `P*` matches every name that
/// starts with P).
fn listed(list: &[String], name: &str) -> bool {
    list.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p == name,
    })
}

/// `rustkvm` and `kvm` (the same guest and architecture, default variant)
/// compared field by field; `nested`: the kvm run was nested in an L1.
pub fn guest(test: &GuestTest, rustkvm: &RunResult, kvm: &RunResult, nested: bool) -> Comparison {
    match (&rustkvm.outcome.status, &kvm.outcome.status) {
        (Status::Fail(why), _) => return Comparison::Failed(format!("rustkvm FAIL: {why}")),
        (_, Status::Fail(why)) => return Comparison::Failed(format!("kvm FAIL: {why}")),
        (_, Status::Skip(why)) => {
            return Comparison::NotCompared(format!("SKIP on kvm, as declared: {why}"))
        }
        (Status::Skip(why), _) => {
            return Comparison::NotCompared(format!("SKIP on rustkvm, as declared: {why}"))
        }
        _ => {}
    }
    let a = fields(&rustkvm.outcome.lines);
    let b = fields(&kvm.outcome.lines);
    let mut names: Vec<(&String, &String)> = a.iter().map(|(f, n, _)| (f, n)).collect();
    for (f, n, _) in &b {
        if !names.iter().any(|(g, _)| *g == f) {
            names.push((f, n));
        }
    }
    let value = |side: &[(String, String, String)], f: &str| {
        side.iter()
            .find(|(g, _, _)| g == f)
            .map(|(_, _, v)| v.clone())
    };
    Comparison::Fields(
        names
            .into_iter()
            .map(|(field, name)| {
                let (x, y) = (value(&a, field), value(&b, field));
                let agreement = if x == y {
                    Agreement::Same
                } else if listed(&test.kvm_vary, name) {
                    Agreement::Declared("host-dependent on real KVM (kvm-vary)".into())
                } else if listed(&test.vary, name) {
                    Agreement::Declared("varies between runs (vary)".into())
                } else if y.as_deref().is_some_and(|v| v.starts_with("skip: "))
                    && test.may_skip(name, kvm.arch, Backend::Kvm, kvm.variant, nested)
                {
                    Agreement::Declared("declared skippable on kvm".into())
                } else if x.as_deref().is_some_and(|v| v.starts_with("skip: "))
                    && test.may_skip(name, rustkvm.arch, Backend::Rustkvm, rustkvm.variant, false)
                {
                    Agreement::Declared("declared skippable on rustkvm".into())
                } else {
                    Agreement::Differs
                };
                Field {
                    name: field.clone(),
                    rustkvm: x,
                    kvm: y,
                    agreement,
                }
            })
            .collect(),
    )
}

/// The Linux probe's fields that are the host's on real KVM, and why: the
/// declared list of [`linux_boot`].
pub const LINUX_HOST_DEPENDENT: &[(&str, &str)] = &[
    ("status", "boot time"),
    (
        "perf cycles (N1 run, N2 run)",
        "cycles are host time on KVM",
    ),
    (
        "perf ref-cycles (N1 run, N2 run)",
        "cycles are host time on KVM",
    ),
    ("perf sampling", "samples over host time"),
    ("perf sampling cycles", "samples over host time"),
    ("steal ms over busy loop", "steal is the host's scheduling"),
    ("realtime-monotonic spread ns", "timing"),
    (
        "wall clock - host s",
        "the host's wall clock (not read nested)",
    ),
];

/// A Linux boot on rustkvm and one on real KVM, row by row of the probe
/// table ([`linux::rows`]).
pub fn linux_boot(rustkvm: &LinuxRun, kvm: &LinuxRun) -> Comparison {
    match (&rustkvm.outcome, &kvm.outcome) {
        (LinuxOutcome::Error(why), _) => {
            return Comparison::Failed(format!("rustkvm: {}", why.lines().next().unwrap_or("")))
        }
        (_, LinuxOutcome::Error(why)) => {
            return Comparison::Failed(format!("kvm: {}", why.lines().next().unwrap_or("")))
        }
        (_, LinuxOutcome::Skip(why)) | (LinuxOutcome::Skip(why), _) => {
            return Comparison::NotCompared(format!("SKIP: {why}"))
        }
        _ => {}
    }
    let a = linux::rows(rustkvm);
    let b = linux::rows(kvm);
    Comparison::Fields(
        a.iter()
            .map(|(name, x)| {
                let y = b.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
                let agreement = if Some(x) == y.as_ref() {
                    Agreement::Same
                } else if let Some((_, why)) = LINUX_HOST_DEPENDENT.iter().find(|(n, _)| n == name)
                {
                    Agreement::Declared(format!("host-dependent: {why}"))
                } else {
                    Agreement::Differs
                };
                Field {
                    name: name.to_string(),
                    rustkvm: Some(x.clone()),
                    kvm: y,
                    agreement,
                }
            })
            .collect(),
    )
}

/// `comparison` of `label` as a side-by-side table (`field | rustkvm |
/// kvm | agreement`), values cut at 48 characters.
pub fn table(label: &str, comparison: &Comparison) -> String {
    let mut s = format!("== {label}\n");
    match comparison {
        Comparison::NotCompared(why) => s += &format!("   not compared: {why}\n"),
        Comparison::Failed(why) => {
            s += &format!(
                "   DIFF: a run failed: {}\n",
                why.lines().next().unwrap_or("")
            )
        }
        Comparison::Fields(fields) => {
            let cut = |v: &Option<String>| {
                let v = v.as_deref().unwrap_or("<none>");
                if v.chars().count() > 48 {
                    format!("{}…", v.chars().take(47).collect::<String>())
                } else {
                    v.to_string()
                }
            };
            let w = fields
                .iter()
                .map(|f| f.name.len())
                .max()
                .unwrap_or(5)
                .max(5);
            let wa = fields
                .iter()
                .map(|f| cut(&f.rustkvm).chars().count())
                .max()
                .unwrap_or(7)
                .max(7);
            let wb = fields
                .iter()
                .map(|f| cut(&f.kvm).chars().count())
                .max()
                .unwrap_or(3)
                .max(3);
            s += &format!("   {:w$}  {:wa$}  {:wb$}  \n", "field", "rustkvm", "kvm");
            for f in fields {
                let verdict = match &f.agreement {
                    Agreement::Same => "same".to_string(),
                    Agreement::Declared(why) => format!("differs, declared: {why}"),
                    Agreement::Differs => "DIFF".to_string(),
                };
                s += &format!(
                    "   {:w$}  {:wa$}  {:wb$}  {verdict}\n",
                    f.name,
                    cut(&f.rustkvm),
                    cut(&f.kvm),
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Outcome;
    use crate::{Arch, Variant};
    use std::time::Duration;

    fn result(backend: Backend, lines: &[&str], status: Status) -> RunResult {
        RunResult {
            test: "t".into(),
            arch: Arch::Aarch64,
            variant: Variant::Default,
            backend,
            outcome: Outcome {
                status,
                lines: lines.iter().map(|l| l.to_string()).collect(),
                measures: Vec::new(),
                skipped_checks: Vec::new(),
                routes: Default::default(),
                serial: String::new(),
                stderr: String::new(),
                elapsed: Duration::ZERO,
            },
        }
    }

    fn test(text: &str) -> GuestTest {
        GuestTest::parse("t", text).unwrap()
    }

    #[test]
    fn protocol_lines_become_fields() {
        let lines: Vec<String> = [
            "ok a.b",
            "not ok c: got 1, want 2",
            "skip d: no PMU",
            "measure e 17",
            "# nothing",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let got: Vec<(String, String)> =
            fields(&lines).into_iter().map(|(f, _, v)| (f, v)).collect();
        assert_eq!(
            got,
            [
                ("a.b".to_string(), "ok".to_string()),
                ("c".into(), "not ok: got 1, want 2".into()),
                ("d".into(), "skip: no PMU".into()),
                ("measure e".into(), "17".into()),
            ]
        );
        // Again: numbered; a measure and a check of one name apart.
        let lines: Vec<String> = ["ok a", "ok a", "measure a 1", "ok a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got: Vec<String> = fields(&lines).into_iter().map(|(f, _, _)| f).collect();
        assert_eq!(got, ["a", "a #2", "measure a", "a #3"]);
    }

    #[test]
    fn only_undeclared_differences_are_findings() {
        let t = test(
            "//! rustkvm-test: arch=aarch64 vary=t kvm-vary=cycles*\n\
             //! rustkvm-expect-skip: kvm nmi\n",
        );
        let a = result(
            Backend::Rustkvm,
            &[
                "ok x",
                "measure cycles.n 10",
                "measure t 1",
                "ok nmi",
                "measure insns 100",
            ],
            Status::Pass,
        );
        let same = guest(&t, &a, &a, true);
        assert_eq!(same.findings(), 0);
        let b = result(
            Backend::Kvm,
            &[
                "ok x",
                "measure cycles.n 99",
                "measure t 2",
                "skip nmi: none",
                "measure insns 100",
            ],
            Status::Pass,
        );
        let c = guest(&t, &a, &b, true);
        assert_eq!(c.findings(), 0, "{}", table("t", &c));
        // A check skipped on rustkvm as declared there.
        let t2 =
            test("//! rustkvm-test: arch=aarch64\n//! rustkvm-expect-skip: rustkvm/default x\n");
        let skipped = result(Backend::Rustkvm, &["skip x: never preempted"], Status::Pass);
        let ran = result(Backend::Kvm, &["ok x"], Status::Pass);
        assert_eq!(guest(&t2, &skipped, &ran, true).findings(), 0);
        assert_eq!(guest(&t, &skipped, &ran, true).findings(), 1);
        // A count that differs, a field only one side has.
        let d = result(
            Backend::Kvm,
            &["ok x", "measure insns 101", "ok extra"],
            Status::Pass,
        );
        let c = guest(&t, &a, &d, true);
        let Comparison::Fields(f) = &c else {
            panic!("{c:?}")
        };
        let diffs: Vec<&str> = f
            .iter()
            .filter(|f| f.agreement == Agreement::Differs)
            .map(|f| f.name.as_str())
            .collect();
        // nmi is missing on kvm (not a skip line): a finding too.
        assert_eq!(
            diffs,
            ["nmi", "measure insns", "extra"],
            "{}",
            table("t", &c)
        );
        // A declared SKIP is not compared; a failure is a finding.
        let skip = result(Backend::Kvm, &[], Status::Skip("no PMU".into()));
        assert_eq!(guest(&t, &a, &skip, true).findings(), 0);
        assert!(matches!(
            guest(&t, &a, &skip, true),
            Comparison::NotCompared(_)
        ));
        let fail = result(Backend::Kvm, &[], Status::Fail("x".into()));
        assert_eq!(guest(&t, &a, &fail, true).findings(), 1);
    }
}
