//! JUnit XML, as GitLab, Jenkins and most CI systems ingest it: one
//! `<testcase>` per (guest or Linux configuration, backend), carrying the
//! SKIP reason or the failure and the console's tail.
//!
//! Schema: the common subset of the Ant/Jenkins JUnit format
//! (`testsuites` > `testsuite` > `testcase` with `failure`, `skipped`,
//! `system-out`).

use std::fmt::Write;
use std::time::Duration;

use crate::linux::{self, LinuxRun};
use crate::run::{RunResult, Status};

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Passed.
    Pass,
    /// Failed: a one-line message and the detail (console tail).
    Fail {
        /// Why, one line.
        message: String,
        /// What the guest and QEMU printed last.
        detail: String,
    },
    /// Skipped, and why.
    Skip(String),
}

/// One test case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Dotted class name (CI systems group by it).
    pub classname: String,
    /// The case's name within its class.
    pub name: String,
    /// Wall time.
    pub time: Duration,
    /// How it ended.
    pub verdict: Verdict,
    /// Extra output (e.g. a passing guest's declared skipped checks).
    pub system_out: Option<String>,
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `text` escaped for an XML attribute or text node; characters XML 1.0
/// cannot carry (most C0 controls) become U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

impl Case {
    /// A bundled guest's run.
    pub fn from_guest(r: &RunResult) -> Case {
        let verdict = match &r.outcome.status {
            Status::Pass => Verdict::Pass,
            Status::Skip(why) => Verdict::Skip(why.clone()),
            Status::Fail(why) => Verdict::Fail {
                message: why.clone(),
                detail: format!(
                    "--- serial (tail) ---\n{}\n--- QEMU stderr (tail) ---\n{}",
                    tail(&r.outcome.serial, 40),
                    tail(&r.outcome.stderr, 20)
                ),
            },
        };
        let system_out = (!r.outcome.skipped_checks.is_empty()).then(|| {
            r.outcome
                .skipped_checks
                .iter()
                .map(|(n, w)| format!("declared skipped check {n}: {w}\n"))
                .collect()
        });
        Case {
            classname: format!("rustkvm.guests.{}.{}", r.arch, r.variant),
            name: format!("{}[{}]", r.test, r.backend),
            time: r.outcome.elapsed,
            verdict,
            system_out,
        }
    }

    /// A Linux boot.
    pub fn from_linux(r: &LinuxRun) -> Case {
        let verdict = match &r.outcome {
            linux::Outcome::Ok(_) => Verdict::Pass,
            linux::Outcome::Skip(why) => Verdict::Skip(why.clone()),
            linux::Outcome::Error(why) => Verdict::Fail {
                message: why.lines().next().unwrap_or("").to_string(),
                detail: format!("{why}\n--- console (tail) ---\n{}", tail(&r.console, 40)),
            },
        };
        Case {
            classname: format!("rustkvm.linux.{}", r.config.arch),
            name: r.config.label(),
            time: r.elapsed,
            verdict,
            system_out: None,
        }
    }
}

/// The JUnit document for `cases`, as one suite named `suite`.
pub fn write(suite: &str, cases: &[Case]) -> String {
    let count = |f: fn(&Verdict) -> bool| cases.iter().filter(|c| f(&c.verdict)).count();
    let failures = count(|v| matches!(v, Verdict::Fail { .. }));
    let skipped = count(|v| matches!(v, Verdict::Skip(_)));
    let time: f64 = cases.iter().map(|c| c.time.as_secs_f64()).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"{s}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{time:.3}\">",
        s = escape(suite),
        n = cases.len()
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"{s}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{time:.3}\">",
        s = escape(suite),
        n = cases.len()
    );
    for c in cases {
        let _ = write!(
            out,
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
            escape(&c.classname),
            escape(&c.name),
            c.time.as_secs_f64()
        );
        if c.verdict == Verdict::Pass && c.system_out.is_none() {
            out.push_str("/>\n");
            continue;
        }
        out.push_str(">\n");
        match &c.verdict {
            Verdict::Pass => {}
            Verdict::Skip(why) => {
                let _ = writeln!(out, "      <skipped message=\"{}\"/>", escape(why));
            }
            Verdict::Fail { message, detail } => {
                let _ = writeln!(
                    out,
                    "      <failure message=\"{}\" type=\"FAIL\">{}</failure>",
                    escape(message),
                    escape(detail)
                );
            }
        }
        if let Some(s) = &c.system_out {
            let _ = writeln!(out, "      <system-out>{}</system-out>", escape(s));
        }
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_characters_xml_cannot_carry() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("x\u{1b}[0m\ty\n"), "x\u{fffd}[0m\ty\n");
    }

    #[test]
    fn counts_and_one_element_per_verdict() {
        let case = |name: &str, verdict| Case {
            classname: "rustkvm.guests.x86_64.default".into(),
            name: name.into(),
            time: Duration::from_millis(1500),
            verdict,
            system_out: None,
        };
        let xml = write(
            "rustkvm",
            &[
                case("a[tcg]", Verdict::Pass),
                case("b[rustkvm]", Verdict::Skip("no <pmu>".into())),
                case(
                    "c[kvm]",
                    Verdict::Fail {
                        message: "x: got 1".into(),
                        detail: "ok a\nnot ok x".into(),
                    },
                ),
            ],
        );
        assert!(
            xml.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""),
            "{xml}"
        );
        assert!(
            xml.contains("<skipped message=\"no &lt;pmu&gt;\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<failure message=\"x: got 1\" type=\"FAIL\">ok a\nnot ok x</failure>")
        );
        assert!(xml.contains("name=\"a[tcg]\" time=\"1.500\"/>"), "{xml}");
    }
}
