//! Discovering guest tests and their metadata.
//!
//! Metadata lines in a guest source (`tests/guests/src/bin/NAME.rs`):
//!
//! ```text
//! //! rustkvm-test: arch=x86_64,aarch64 smp=2 timeout=30 vary=key1,key2
//! ```
//!
//! - `arch`: architectures the guest runs on (required);
//! - `smp`: vCPUs to give it (default 1; the `mttcg-smp2` variant uses at
//!   least 2);
//! - `timeout`: seconds before the run is killed and reported FAIL (default
//!   120: a hang guard, long enough for a loaded host);
//! - `vary`: `measure` keys whose values legitimately differ between runs or
//!   backends, left out of the cross-backend comparison;
//! - `kvm-vary`: fields (`measure` keys and check names; `NAME*` a prefix)
//!   that are the host's on real KVM (cycles, steal amounts, timing, what
//!   the host hypervisor adds): the differential check
//!   (`crate::differential`) shows them but does not fail on them;
//! - `cpu`: the `-cpu` model (default: QEMU's default for the machine);
//! - `machine`: options added to the machine (`-M virt,OPTS`), e.g.
//!   `gic-version=3`;
//! - `compare`: `off` for a test whose results differ between backends by
//!   design (it checks a rustkvm feature and SKIPs where it is absent);
//! - `matrix`: `off` for a guest only a dedicated host test boots (e.g. one
//!   that is migrated half-way);
//! - `host-query`: `on` for a guest that prints `ready` and waits for a
//!   byte on its console: a nested run queries `x-query-rustkvm` then and
//!   releases it (`crate::nested`, `crate::introspect`);
//! - `needs`: host features the `kvm` backend must have, comma-separated:
//!   `pmu` (a vPMU), `pv-eoi` (a KVM that arms PV EOI: no APICv/AVIC),
//!   `lbr` (a host LBR that KVM passes on: legacy, not Arch LBR), `pebs`
//!   (PEBS with the baseline: a host KVM older than Linux 6.9 with PEBS);
//!   without them the `kvm` run is SKIP with the reason.
//!
//! and, for what some hosts' KVM cannot do (the project's kvm_pvm hosts,
//! measured), one line naming the probe that tries it and the SKIP reason
//! where the probe fails:
//!
//! ```text
//! //! rustkvm-kvm-probe: tsc-write guest writes to IA32_TSC do not move the TSC
//! ```
//!
//! The probe is the guest `kvm-probe-NAME`, booted on the kvm backend with
//! its short time limit, once per runner process (`run.rs` `kvm_skip`): a
//! host where it passes runs the guest; one where it fails or hangs SKIPs
//! it, with the reason and what the probe did.
//!
//! What the guest is expected to do is declared, not inferred from what it
//! does: a run whose outcome differs from the declaration fails.
//!
//! ```text
//! //! rustkvm-expect: tcg=skip rustkvm/icount=pass
//! //! rustkvm-expect-skip: tcg/icount pv-time,kvm-signature
//! ```
//!
//! - `rustkvm-expect: SELECTOR=pass|skip ...`: the whole guest's outcome on
//!   the configurations SELECTOR names; PASS where nothing is declared. Of
//!   the items that match a configuration, the last one wins.
//! - `rustkvm-expect-skip: SELECTOR CHECK[,CHECK...]`: checks (the names of
//!   `skip NAME: why` lines) that may be skipped inside a passing guest on
//!   those configurations; any other skipped check fails the run. A guest
//!   declared to SKIP may skip any check.
//! - SELECTOR is `[ARCH:]BACKEND[/VARIANT]`, where BACKEND may be `*`
//!   (every backend), e.g. `tcg`, `aarch64:tcg`, `*/icount`, `kvm`, or
//!   `kvm-nested`: the kvm backend on real KVM inside a rustkvm L1
//!   (`rustkvm-run --nested`, crate::nested), where KVM answers as on its
//!   host (kvm_amd on an AMD CPU, L1's clocksource kvm-clock, not the TSC).
//!   A `kvm` item names nested runs too; a `kvm-nested` one only them.
//!
//! A `kvm` run the runner SKIPs before booting — a host limit it detected
//! (`kvm_skip` in `run.rs`) — is not the guest's outcome and needs no
//! declaration.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::qemu::{Arch, Backend, Variant};
use crate::HarnessError;

/// Marker that starts a metadata line.
const MARKER: &str = "//! rustkvm-test:";
/// A guest's `timeout` when it names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Marker of the line naming a host probe and the SKIP reason where it fails.
const KVM_PROBE_MARKER: &str = "//! rustkvm-kvm-probe:";
/// Marker of a line declaring the guest's outcome per configuration.
const EXPECT_MARKER: &str = "//! rustkvm-expect:";
/// Marker of a line declaring checks a passing guest may skip.
const EXPECT_SKIP_MARKER: &str = "//! rustkvm-expect-skip:";

/// A guest's outcome as declared for a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Every check runs and passes (skips only where declared).
    Pass,
    /// The guest does not apply there and says so (exit status 2).
    Skip,
}

impl Expected {
    /// `PASS` / `SKIP`, as the runner's verdicts are written.
    pub fn label(self) -> &'static str {
        match self {
            Expected::Pass => "PASS",
            Expected::Skip => "SKIP",
        }
    }
}

/// Which configurations a declaration is about: `[ARCH:]BACKEND[/VARIANT]`,
/// None standing for "any".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selector {
    /// Only this architecture.
    pub arch: Option<Arch>,
    /// Only this backend.
    pub backend: Option<Backend>,
    /// Only this variant.
    pub variant: Option<Variant>,
    /// Only nested kvm runs (`kvm-nested`).
    pub nested: bool,
}

impl Selector {
    /// Parse `[ARCH:]BACKEND[/VARIANT]` (`*` for any backend).
    pub fn parse(text: &str) -> Result<Selector, String> {
        let (arch, rest) = match text.split_once(':') {
            Some((a, rest)) => (
                Some(Arch::from_name(a).ok_or_else(|| format!("unknown arch '{a}'"))?),
                rest,
            ),
            None => (None, text),
        };
        let (backend, variant) = match rest.split_once('/') {
            Some((b, v)) => (
                b,
                Some(Variant::from_name(v).ok_or_else(|| format!("unknown variant '{v}'"))?),
            ),
            None => (rest, None),
        };
        let (backend, nested) = match backend {
            "*" => (None, false),
            "kvm-nested" => (Some(Backend::Kvm), true),
            b => (
                Some(Backend::from_name(b).ok_or_else(|| format!("unknown backend '{b}'"))?),
                false,
            ),
        };
        Ok(Selector {
            arch,
            backend,
            variant,
            nested,
        })
    }

    /// Whether it names this configuration (`nested`: a kvm run nested in
    /// a rustkvm L1).
    pub fn matches(&self, arch: Arch, backend: Backend, variant: Variant, nested: bool) -> bool {
        self.arch.is_none_or(|a| a == arch)
            && self.backend.is_none_or(|b| b == backend)
            && self.variant.is_none_or(|v| v == variant)
            && (nested || !self.nested)
    }
}

/// One guest test: a bundled guest program and how to run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestTest {
    /// File stem, e.g. `hello`.
    pub name: String,
    /// Architectures it runs on.
    pub arches: Vec<Arch>,
    /// vCPUs.
    pub smp: u32,
    /// Run time limit.
    pub timeout: Duration,
    /// `measure` keys excluded from cross-backend comparison.
    pub vary: Vec<String>,
    /// Fields that are the host's on real KVM (`kvm-vary`): the
    /// differential check does not fail on them.
    pub kvm_vary: Vec<String>,
    /// `-cpu` model, if not the machine's default.
    pub cpu: Option<String>,
    /// Options added to `-M`.
    pub machine: Option<String>,
    /// Whether rustkvm's lines must equal tcg's.
    pub compare: bool,
    /// Whether the runner's matrix boots it.
    pub matrix: bool,
    /// Whether it waits at `ready` for the host to query it (`host-query`).
    pub host_query: bool,
    /// Host features the `kvm` backend needs (`pmu`, `pv-eoi`, `lbr`, `pebs`).
    pub needs: Vec<String>,
    /// The host probe (guest `kvm-probe-NAME`) the `kvm` backend must pass
    /// to run it, and the SKIP reason where the probe fails.
    pub kvm_probe: Option<(String, String)>,
    /// Declared outcomes (`rustkvm-expect`), in file order.
    pub expect: Vec<(Selector, Expected)>,
    /// Declared skippable checks (`rustkvm-expect-skip`), in file order.
    pub expect_skip: Vec<(Selector, Vec<String>)>,
}

impl GuestTest {
    /// Parse the metadata of the guest source `text` named `name`.
    pub fn parse(name: &str, text: &str) -> Result<Self, HarnessError> {
        let bad = |why: String| HarnessError::Metadata {
            file: format!("{name}.rs"),
            why,
        };
        let mut test = GuestTest {
            name: name.to_string(),
            arches: Vec::new(),
            smp: 1,
            // A hang guard, not a speed test: a guest that takes seconds
            // on an idle host may take a minute on a loaded one.
            timeout: DEFAULT_TIMEOUT,
            vary: Vec::new(),
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
        };
        let mut seen = false;
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix(KVM_PROBE_MARKER) {
                let (probe, why) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
                if probe.is_empty() || why.trim().is_empty() {
                    return Err(bad(format!("'{}' is not 'PROBE REASON'", rest.trim())));
                }
                test.kvm_probe = Some((probe.to_string(), why.trim().to_string()));
                continue;
            }
            if let Some(rest) = line.trim().strip_prefix(EXPECT_SKIP_MARKER) {
                let mut words = rest.split_whitespace();
                let (Some(sel), Some(checks), None) = (words.next(), words.next(), words.next())
                else {
                    return Err(bad(format!(
                        "'{}' is not 'SELECTOR CHECK[,CHECK...]'",
                        rest.trim()
                    )));
                };
                let sel = Selector::parse(sel).map_err(&bad)?;
                test.expect_skip
                    .push((sel, checks.split(',').map(str::to_string).collect()));
                continue;
            }
            if let Some(rest) = line.trim().strip_prefix(EXPECT_MARKER) {
                for item in rest.split_whitespace() {
                    let (sel, outcome) = item
                        .split_once('=')
                        .ok_or_else(|| bad(format!("'{item}' is not SELECTOR=pass|skip")))?;
                    let outcome = match outcome {
                        "pass" => Expected::Pass,
                        "skip" => Expected::Skip,
                        o => return Err(bad(format!("{sel}={o}: expected pass or skip"))),
                    };
                    test.expect
                        .push((Selector::parse(sel).map_err(&bad)?, outcome));
                }
                continue;
            }
            let Some(rest) = line.trim().strip_prefix(MARKER) else {
                continue;
            };
            seen = true;
            for item in rest.split_whitespace() {
                let (key, value) = item
                    .split_once('=')
                    .ok_or_else(|| bad(format!("'{item}' is not key=value")))?;
                match key {
                    "arch" => {
                        for a in value.split(',') {
                            test.arches.push(
                                Arch::from_name(a)
                                    .ok_or_else(|| bad(format!("unknown arch '{a}'")))?,
                            );
                        }
                    }
                    "smp" => {
                        test.smp = value
                            .parse()
                            .ok()
                            .filter(|n| (1..=64).contains(n))
                            .ok_or_else(|| bad(format!("smp={value} is not 1..=64")))?;
                    }
                    "timeout" => {
                        let secs: u64 = value
                            .parse()
                            .ok()
                            .filter(|s| *s > 0)
                            .ok_or_else(|| bad(format!("timeout={value} is not seconds")))?;
                        test.timeout = Duration::from_secs(secs);
                    }
                    "vary" => test.vary.extend(value.split(',').map(str::to_string)),
                    "kvm-vary" => test.kvm_vary.extend(value.split(',').map(str::to_string)),
                    "cpu" => test.cpu = Some(value.to_string()),
                    "machine" => test.machine = Some(value.to_string()),
                    "needs" => {
                        for n in value.split(',') {
                            if !matches!(n, "pmu" | "pv-eoi" | "lbr" | "pebs" | "el2") {
                                return Err(bad(format!(
                                    "needs={n}: known: pmu, pv-eoi, lbr, pebs, el2"
                                )));
                            }
                            test.needs.push(n.to_string());
                        }
                    }
                    "compare" | "matrix" | "host-query" => {
                        let on = match value {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad(format!("{key}={value} is not on/off"))),
                        };
                        match key {
                            "compare" => test.compare = on,
                            "matrix" => test.matrix = on,
                            _ => test.host_query = on,
                        }
                    }
                    other => return Err(bad(format!("unknown key '{other}'"))),
                }
            }
        }
        if !seen {
            return Err(bad(format!("no '{MARKER}' line")));
        }
        if test.arches.is_empty() {
            return Err(bad("no arch=".to_string()));
        }
        Ok(test)
    }

    /// The declared outcome on a configuration (PASS unless declared).
    pub fn expected(&self, arch: Arch, backend: Backend, variant: Variant) -> Expected {
        self.expected_on(arch, backend, variant, false)
    }

    /// [`GuestTest::expected`], of a kvm run nested in a rustkvm L1 when
    /// `nested`.
    pub fn expected_on(
        &self,
        arch: Arch,
        backend: Backend,
        variant: Variant,
        nested: bool,
    ) -> Expected {
        self.expect
            .iter()
            .rev()
            .find(|(s, _)| s.matches(arch, backend, variant, nested))
            .map_or(Expected::Pass, |(_, e)| *e)
    }

    /// Whether check `name` is declared skippable on a configuration
    /// (`nested`: see [`GuestTest::expected_on`]).
    pub fn may_skip(
        &self,
        name: &str,
        arch: Arch,
        backend: Backend,
        variant: Variant,
        nested: bool,
    ) -> bool {
        self.expect_skip.iter().any(|(s, checks)| {
            s.matches(arch, backend, variant, nested) && checks.iter().any(|c| c == name)
        })
    }

    /// The built guest binary for `arch`.
    pub fn binary(&self, arch: Arch) -> PathBuf {
        guests_dir()
            .join("target")
            .join(arch.rust_target())
            .join("release")
            .join(&self.name)
    }
}

/// `tests/guests`.
pub fn guests_dir() -> PathBuf {
    crate::repo_root().join("tests").join("guests")
}

/// All guest tests, sorted by name.
pub fn discover() -> Result<Vec<GuestTest>, HarnessError> {
    discover_in(&guests_dir().join("src").join("bin"))
}

/// All guest tests in `dir`, sorted by name.
pub fn discover_in(dir: &Path) -> Result<Vec<GuestTest>, HarnessError> {
    let io = |what: String| move |source| HarnessError::Io { what, source };
    let mut tests = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))? {
        let path = entry
            .map_err(io(format!("reading {}", dir.display())))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let text = fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        tests.push(GuestTest::parse(&name, &text)?);
    }
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_keys() {
        let t = GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64,aarch64 smp=2\n//! rustkvm-test: timeout=5 vary=a,b cpu=max compare=off\nfn x() {}\n",
        )
        .unwrap();
        assert_eq!(t.arches, vec![Arch::X86_64, Arch::Aarch64]);
        assert_eq!(t.smp, 2);
        assert_eq!(t.timeout, Duration::from_secs(5));
        assert_eq!(t.vary, vec!["a", "b"]);
        assert_eq!(t.cpu.as_deref(), Some("max"));
        assert_eq!(t.machine, None);
        let m =
            GuestTest::parse("g", "//! rustkvm-test: arch=aarch64 machine=gic-version=3").unwrap();
        assert_eq!(m.machine.as_deref(), Some("gic-version=3"));
        assert!(!t.compare);
        assert!(t.matrix);
        let t = GuestTest::parse("g", "//! rustkvm-test: arch=x86_64 matrix=off").unwrap();
        assert!(!t.matrix);
        assert!(t.needs.is_empty() && t.kvm_probe.is_none());
        let t = GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64 needs=pmu\n//! rustkvm-kvm-probe: hypercall  VMCALL hangs \n",
        )
        .unwrap();
        assert_eq!(t.needs, vec!["pmu"]);
        assert_eq!(
            t.kvm_probe,
            Some(("hypercall".to_string(), "VMCALL hangs".to_string()))
        );
        assert!(GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-kvm-probe: hypercall\n"
        )
        .is_err());
    }

    #[test]
    fn rejects_bad_metadata() {
        for text in [
            "fn main() {}",
            "//! rustkvm-test: smp=2",
            "//! rustkvm-test: arch=riscv64",
            "//! rustkvm-test: arch=x86_64 smp=0",
            "//! rustkvm-test: arch=x86_64 timeout=soon",
            "//! rustkvm-test: arch=x86_64 colour=blue",
            "//! rustkvm-test: arch",
            "//! rustkvm-test: arch=x86_64 compare=maybe",
            "//! rustkvm-test: arch=x86_64 needs=gpu",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: tcg=maybe",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: tcg",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: xen=skip",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: tcg/fast=skip",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: riscv64:tcg=skip",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect-skip: tcg",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect-skip: tcg a b",
        ] {
            let err = GuestTest::parse("g", text).unwrap_err();
            assert!(
                matches!(err, HarnessError::Metadata { .. }),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn declarations_select_configurations() {
        let t = GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64,aarch64\n\
             //! rustkvm-expect: *=skip rustkvm=pass x86_64:rustkvm/icount=skip\n\
             //! rustkvm-expect-skip: */rr-smp2 a,b\n",
        )
        .unwrap();
        let (x, a) = (Arch::X86_64, Arch::Aarch64);
        assert_eq!(
            t.expected(x, Backend::Tcg, Variant::Default),
            Expected::Skip
        );
        assert_eq!(
            t.expected(x, Backend::Kvm, Variant::Default),
            Expected::Skip
        );
        assert_eq!(
            t.expected(x, Backend::Rustkvm, Variant::Default),
            Expected::Pass
        );
        assert_eq!(
            t.expected(x, Backend::Rustkvm, Variant::Icount),
            Expected::Skip
        );
        assert_eq!(
            t.expected(a, Backend::Rustkvm, Variant::Icount),
            Expected::Pass
        );
        assert!(t.may_skip("b", a, Backend::Tcg, Variant::RrSmp2, false));
        assert!(!t.may_skip("b", a, Backend::Tcg, Variant::Default, false));
        assert!(!t.may_skip("c", a, Backend::Tcg, Variant::RrSmp2, false));
        let nested = GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64\n//! rustkvm-expect: kvm-nested=skip\n//! rustkvm-expect-skip: kvm-nested c\n",
        )
        .unwrap();
        let k = (x, Backend::Kvm, Variant::Default);
        assert_eq!(nested.expected_on(k.0, k.1, k.2, true), Expected::Skip);
        assert_eq!(
            nested.expected_on(k.0, k.1, k.2, false),
            Expected::Pass,
            "kvm-nested names nested runs only"
        );
        assert_eq!(
            t.expected_on(k.0, k.1, k.2, true),
            Expected::Skip,
            "a kvm item names nested runs too"
        );
        assert!(
            nested.may_skip("c", k.0, k.1, k.2, true)
                && !nested.may_skip("c", k.0, k.1, k.2, false)
        );
        let plain = GuestTest::parse("g", "//! rustkvm-test: arch=x86_64").unwrap();
        assert_eq!(
            plain.expected(x, Backend::Tcg, Variant::Icount),
            Expected::Pass
        );
    }

    #[test]
    fn bundled_guests_all_parse() {
        let tests = discover().unwrap();
        let names: Vec<&str> = tests.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"hello"), "{names:?}");
        let hello = tests.iter().find(|t| t.name == "hello").unwrap();
        assert_eq!(hello.arches, vec![Arch::X86_64, Arch::Aarch64]);
    }
}
