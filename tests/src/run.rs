//! Booting one guest on one backend and reading what it reported.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::guard::{Hang, HangGuard};
use crate::guest::{Expected, GuestTest};
use crate::host;
use crate::qemu::{self, Arch, Backend, Variant};
use crate::HarnessError;

/// Guest exit status for "passed" (see the guest runtime's protocol).
pub const GUEST_PASS: u32 = 0;
/// Guest exit status for "failed".
pub const GUEST_FAIL: u32 = 1;
/// Guest exit status for "skipped".
pub const GUEST_SKIP: u32 = 2;
/// Guest exit statuses from 0x40 on mean "unexpected exception" (x86: 0x40 +
/// vector; arm64: 0x40 + ESR.EC).
pub const GUEST_EXCEPTION_BASE: u32 = 0x40;

/// PASS / FAIL(reason) / SKIP(reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every check passed.
    Pass,
    /// Something failed; why.
    Fail(String),
    /// The test does not apply; why.
    Skip(String),
}

impl Status {
    /// `PASS`, `FAIL(...)`, `SKIP(...)`.
    pub fn label(&self) -> String {
        match self {
            Status::Pass => "PASS".to_string(),
            Status::Fail(why) => format!("FAIL({why})"),
            Status::Skip(why) => format!("SKIP({why})"),
        }
    }
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The verdict.
    pub status: Status,
    /// Protocol lines (`ok`, `not ok`, `skip`, `measure`) in order.
    pub lines: Vec<String>,
    /// `measure` lines as (key, value).
    pub measures: Vec<(String, String)>,
    /// Checks the guest skipped, as (name, why), in order.
    pub skipped_checks: Vec<(String, String)>,
    /// rustkvm's `stats=on` counters summed over vCPUs (empty on tcg).
    pub routes: BTreeMap<String, u64>,
    /// Everything the guest printed.
    pub serial: String,
    /// QEMU's standard error.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Outcome {
    /// The value of the guest's `measure KEY VALUE` line; panics (a test
    /// helper) with the console when there is none.
    pub fn measure(&self, key: &str) -> &str {
        self.measures
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no measure {key} in\n{}", self.serial))
    }

    /// [`Outcome::measure`] as a number, decimal or `0x` hexadecimal.
    pub fn measure_u64(&self, key: &str) -> u64 {
        let v = self.measure(key);
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        };
        parsed.unwrap_or_else(|e| panic!("measure {key} {v}: {e}"))
    }
}

/// One cell of the result table.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Guest test name.
    pub test: String,
    /// Architecture.
    pub arch: Arch,
    /// Variant.
    pub variant: Variant,
    /// Backend.
    pub backend: Backend,
    /// What happened.
    pub outcome: Outcome,
}

/// A child's pipe read on a thread (so neither pipe can fill up and block
/// QEMU), readable while the child runs and to the end afterwards.
#[derive(Debug)]
pub struct Capture {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: thread::JoinHandle<()>,
}

impl Capture {
    /// Start reading `pipe` (nothing to read if it is None).
    pub fn spawn<R: Read + Send + 'static>(pipe: Option<R>) -> Capture {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&bytes);
        let reader = thread::spawn(move || {
            let Some(mut p) = pipe else { return };
            let mut buf = [0u8; 4096];
            while let Ok(n) = p.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut b) = into.lock() {
                    b.extend_from_slice(&buf[..n]);
                }
            }
        });
        Capture { bytes, reader }
    }

    /// What has arrived so far (bytes are kept whole, so a multi-byte
    /// character split between reads is decoded intact).
    pub fn snapshot(&self) -> String {
        self.bytes
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Wait for the pipe to close and return everything.
    pub fn finish(self) -> String {
        let Capture { bytes, reader } = self;
        let _ = reader.join();
        let text = bytes
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        text.unwrap_or_default()
    }
}

/// Wait for `child` until it ends or its hang `guard` fires; kill it then.
/// Returns the exit code (None when killed or ended by a signal) and the
/// hang, if it hung.
pub fn wait_guarded(
    child: &mut Child,
    guard: &HangGuard,
) -> std::io::Result<(Option<i32>, Option<Hang>)> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status.code(), None));
        }
        if let Some(hang) = guard.check() {
            let _ = child.kill();
            child.wait()?;
            return Ok((None, Some(hang)));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Extra knobs for one run (the defaults come from the guest's metadata).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Time limit instead of the guest's `timeout`.
    pub timeout: Option<Duration>,
    /// Extra `-accel` properties, e.g. `one-insn-per-tb=on`.
    pub accel_opts: Vec<String>,
    /// Extra QEMU arguments, e.g. `-plugin ...`.
    pub qemu_args: Vec<String>,
    /// Run QEMU on this one host CPU only (`taskset -c`): overcommit.
    pub pin_cpu: Option<usize>,
    /// Another emulator than the build's (e.g. an installed one).
    pub emulator: Option<PathBuf>,
}

impl RunOptions {
    /// Whether these are the defaults: the run is then one of the matrix's
    /// configurations, which the guest's declarations describe. A run with
    /// other options is judged by the host test that asks for it.
    pub fn is_plain(&self) -> bool {
        self.timeout.is_none()
            && self.accel_opts.is_empty()
            && self.qemu_args.is_empty()
            && self.pin_cpu.is_none()
            && self.emulator.is_none()
    }
}

/// Boot `test` on `arch`/`variant`/`backend` and judge the result.
pub fn run(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    backend: Backend,
) -> Result<RunResult, HarnessError> {
    run_with(test, arch, variant, backend, &RunOptions::default())
}

/// QEMU's arguments for `test` on `arch` in `variant` with `backend`,
/// booting `kernel` (the guest's binary, where the QEMU that runs it sees
/// it): what [`run_with`] runs, and the nested runner inside its L1.
pub fn guest_args(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    backend: Backend,
    opts: &RunOptions,
    kernel: &Path,
) -> Vec<String> {
    let mut args = qemu::command_args(
        arch,
        backend,
        variant,
        test.smp,
        test.cpu.as_deref(),
        kernel,
    );
    if let Some(m) = &test.machine {
        // command_args puts the machine right after "-M".
        if let Some(i) = args.iter().position(|a| a == "-M") {
            args[i + 1] = format!("{},{m}", args[i + 1]);
        }
    }
    qemu::add_accel_opts(&mut args, &opts.accel_opts);
    args.extend(opts.qemu_args.iter().cloned());
    args
}

/// [`run`] with [`RunOptions`].
pub fn run_with(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    backend: Backend,
    opts: &RunOptions,
) -> Result<RunResult, HarnessError> {
    if backend == Backend::Kvm {
        if let Some(why) = kvm_skip(test, arch) {
            crate::record_verdict(
                &format!("guest {}/{arch}/{variant}/{backend}", test.name),
                &Status::Skip(why.clone()),
            );
            return Ok(RunResult {
                test: test.name.clone(),
                arch,
                variant,
                backend,
                outcome: Outcome::skipped(why),
            });
        }
    }
    let timeout = opts.timeout.unwrap_or(test.timeout) * timeout_scale();
    let kernel = test.binary(arch);
    if !kernel.exists() {
        return Err(HarnessError::NotBuilt(kernel, "scripts/build-guests.sh"));
    }
    let exe = match &opts.emulator {
        Some(e) => e.clone(),
        None => qemu::emulator(arch)?,
    };
    let args = guest_args(test, arch, variant, backend, opts, &kernel);
    let start = Instant::now();
    let mut cmd = match opts.pin_cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let mut child = cmd
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HarnessError::Io {
            what: format!("starting {}", exe.display()),
            source,
        })?;
    let out = Capture::spawn(child.stdout.take());
    let err = Capture::spawn(child.stderr.take());
    let guard = HangGuard::new(child.id(), timeout, start);
    let (code, hang) = wait_guarded(&mut child, &guard).map_err(|source| HarnessError::Io {
        what: format!("waiting for {}", exe.display()),
        source,
    })?;
    let serial = out.finish();
    let stderr = err.finish();
    let outcome = judge(arch, code, hang, serial, stderr, start.elapsed());
    let outcome = if opts.is_plain() {
        let outcome = hold_to_declaration(test, arch, variant, backend, outcome);
        crate::record_verdict(
            &format!("guest {}/{arch}/{variant}/{backend}", test.name),
            &outcome.status,
        );
        outcome
    } else {
        outcome
    };
    Ok(RunResult {
        test: test.name.clone(),
        arch,
        variant,
        backend,
        outcome,
    })
}

/// `RUSTKVM_TIMEOUT_SCALE`: a whole factor for every guest's time limit
/// (default 1), for slow emulators such as the sanitizer build
/// (`scripts/sanitize.sh` sets 4). A limit only catches a hung guest; no
/// verdict depends on how fast a guest ran.
pub fn timeout_scale() -> u32 {
    std::env::var("RUSTKVM_TIMEOUT_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s| (1..=100).contains(s))
        .unwrap_or(1)
}

/// Why the `kvm` backend does not boot `test` on `arch` here, if it does not:
/// no usable KVM for the architecture, a host feature the test needs, or
/// what the test says kvm_pvm cannot do.
pub fn kvm_skip(test: &GuestTest, arch: Arch) -> Option<String> {
    if let Some(why) = host::kvm_unavailable(arch) {
        return Some(why);
    }
    if test.needs.iter().any(|n| n == "pmu") {
        if let Some(why) = host::kvm_no_pmu() {
            return Some(why);
        }
    }
    if test.needs.iter().any(|n| n == "lbr") {
        if let Some(why) = host::kvm_no_lbr() {
            return Some(why);
        }
    }
    if test.needs.iter().any(|n| n == "pebs") {
        if let Some(why) = host::kvm_no_pebs() {
            return Some(why);
        }
    }
    if test.needs.iter().any(|n| n == "el2") {
        if let Some(why) = host::kvm_no_el2() {
            return Some(why);
        }
    }
    if test.needs.iter().any(|n| n == "pv-eoi") {
        if let Some(why) = host::kvm_apicv() {
            return Some(why);
        }
    }
    let (probe, why) = test.kvm_probe.as_ref()?;
    probe_failure(probe, arch).map(|what| format!("{why} (probe kvm-probe-{probe}: {what})"))
}

/// What the host probe `kvm-probe-NAME` did on the kvm backend when it did
/// not pass (None: it passed, the host can), booted once per process and
/// architecture within its own short time limit: the host limit itself is
/// tried, not inferred from which KVM module is loaded.
fn probe_failure(name: &str, arch: Arch) -> Option<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// Each probe's answer, per architecture.
    type Answers = HashMap<(String, Arch), Option<String>>;
    static SEEN: OnceLock<Mutex<Answers>> = OnceLock::new();
    let key = (name.to_string(), arch);
    let seen = SEEN.get_or_init(Default::default);
    // The lock is held over the boot: a second caller waits for the answer.
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(answer) = seen.get(&key) {
        return answer.clone();
    }
    let probe = format!("kvm-probe-{name}");
    let answer = match crate::guest::discover()
        .ok()
        .and_then(|all| all.into_iter().find(|t| t.name == probe))
    {
        None => Some(format!("no guest {probe}")),
        Some(t) => {
            // Not a plain run: the probe's outcome is no verdict of its own.
            let opts = RunOptions {
                timeout: Some(t.timeout),
                ..RunOptions::default()
            };
            match run_with(&t, arch, Variant::Default, Backend::Kvm, &opts) {
                Ok(r) => match r.outcome.status {
                    Status::Pass => None,
                    Status::Fail(w) => Some(w),
                    Status::Skip(w) => Some(format!("skipped: {w}")),
                },
                Err(e) => Some(e.to_string()),
            }
        }
    };
    seen.insert(key, answer.clone());
    answer
}

impl Outcome {
    /// A run that did not happen, and why.
    pub fn skipped(why: String) -> Outcome {
        Outcome {
            status: Status::Skip(why),
            lines: Vec::new(),
            measures: Vec::new(),
            skipped_checks: Vec::new(),
            routes: BTreeMap::new(),
            serial: String::new(),
            stderr: String::new(),
            elapsed: Duration::ZERO,
        }
    }
}

/// The guest's closing line (`summary checks=N passed=P failed=F
/// skipped=S`), parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Checks run.
    pub checks: u32,
    /// Passed.
    pub passed: u32,
    /// Failed.
    pub failed: u32,
    /// Skipped.
    pub skipped: u32,
}

impl Summary {
    /// Parse a `summary ...` line's fields (None if any is missing or bad).
    pub fn parse(rest: &str) -> Option<Summary> {
        let mut s = Summary::default();
        let mut seen = 0u8;
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            let v: u32 = v.parse().ok()?;
            let (field, bit) = match k {
                "checks" => (&mut s.checks, 1),
                "passed" => (&mut s.passed, 2),
                "failed" => (&mut s.failed, 4),
                "skipped" => (&mut s.skipped, 8),
                _ => return None,
            };
            *field = v;
            seen |= bit;
        }
        (seen == 15).then_some(s)
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checks={} passed={} failed={} skipped={}",
            self.checks, self.passed, self.failed, self.skipped
        )
    }
}

/// Turn QEMU's exit and the guest's output into an [`Outcome`]. A guest
/// passes (or skips) only by saying so: its exit status, its closing
/// `summary` line and the `ok`/`not ok`/`skip` lines seen must all agree.
pub fn judge(
    arch: Arch,
    code: Option<i32>,
    hang: Option<Hang>,
    serial: String,
    stderr: String,
    elapsed: Duration,
) -> Outcome {
    let mut lines = Vec::new();
    let mut measures = Vec::new();
    let mut first_failure = None;
    let mut skipped_checks = Vec::new();
    let mut seen = Summary::default();
    let mut summary = None;
    let mut after_summary = false;
    for line in serial.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(rest) = line.strip_prefix("summary ") {
            summary = Some(Summary::parse(rest).ok_or_else(|| line.to_string()));
            continue;
        }
        if let Some(rest) = line.strip_prefix("measure ") {
            let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
            measures.push((k.to_string(), v.to_string()));
        } else if let Some(rest) = line.strip_prefix("not ok ") {
            seen.failed += 1;
            first_failure.get_or_insert_with(|| rest.to_string());
        } else if let Some(rest) = line.strip_prefix("skip ") {
            seen.skipped += 1;
            let (name, why) = rest.split_once(": ").unwrap_or((rest, ""));
            skipped_checks.push((name.to_string(), why.to_string()));
        } else if line.starts_with("ok ") {
            seen.passed += 1;
        } else {
            continue;
        }
        after_summary |= summary.is_some();
        lines.push(line.to_string());
    }
    seen.checks = seen.passed + seen.failed + seen.skipped;
    // An arm64 guest on KVM (no semihosting) prints its status as `exit N`
    // and powers off: QEMU then exits 0.
    let said = serial
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("exit "))
        .filter_map(|n| n.trim().parse::<u32>().ok())
        .next_back();
    let guest = match (arch, code, said) {
        (Arch::Aarch64, Some(0), Some(n)) => Some(n),
        _ => code.and_then(|c| arch.guest_status(c)),
    };
    let first_skip = || {
        skipped_checks
            .first()
            .map(|(n, w)| format!("{n}: {w}"))
            .unwrap_or_else(|| "guest skipped".to_string())
    };
    let status = if let Some(hang) = hang {
        Status::Fail(hang.to_string())
    } else {
        match guest {
            Some(GUEST_PASS | GUEST_FAIL) if first_failure.is_some() => {
                Status::Fail(first_failure.unwrap_or_default())
            }
            Some(GUEST_FAIL) => Status::Fail("guest exited with status 1".to_string()),
            Some(s @ (GUEST_PASS | GUEST_SKIP)) => match summary {
                None => Status::Fail(format!(
                    "guest exited with status {s} without its closing summary line"
                )),
                Some(Err(line)) => Status::Fail(format!("malformed summary line '{line}'")),
                Some(Ok(_)) if after_summary => {
                    Status::Fail("protocol lines after the closing summary".to_string())
                }
                Some(Ok(sum)) if sum != seen => Status::Fail(format!(
                    "the guest's summary says {sum}, the runner saw {seen}"
                )),
                Some(Ok(sum)) if s == GUEST_PASS && sum.passed == 0 => {
                    Status::Fail("guest exited 0 but no check passed".to_string())
                }
                Some(Ok(sum)) if s == GUEST_SKIP && (sum.passed > 0 || sum.skipped == 0) => {
                    Status::Fail(format!("guest exited SKIP but its summary says {sum}"))
                }
                Some(Ok(_)) if s == GUEST_SKIP => Status::Skip(first_skip()),
                Some(Ok(_)) => Status::Pass,
            },
            Some(s) if s >= GUEST_EXCEPTION_BASE => Status::Fail(format!(
                "unexpected exception {:#x}",
                s - GUEST_EXCEPTION_BASE
            )),
            Some(s) => Status::Fail(format!("guest exit status {s}")),
            None => {
                let last = stderr
                    .lines()
                    .find(|l| !l.starts_with("rustkvm: "))
                    .unwrap_or("");
                Status::Fail(format!(
                    "QEMU exited ({}) without a guest status{}{}",
                    code.map_or("signal".to_string(), |c| c.to_string()),
                    if last.is_empty() { "" } else { ": " },
                    last
                ))
            }
        }
    };
    Outcome {
        status,
        lines,
        measures,
        skipped_checks,
        routes: parse_routes(&stderr),
        serial,
        stderr,
        elapsed,
    }
}

/// Hold a judged run against what `test` declares for its configuration
/// (`rustkvm-expect`, `rustkvm-expect-skip`): a SKIP where PASS is declared,
/// a PASS where SKIP is declared, or a check skipped inside a passing guest
/// that is not declared, fails the run. Failures stay failures.
pub fn hold_to_declaration(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    backend: Backend,
    outcome: Outcome,
) -> Outcome {
    hold_to_declaration_on(test, arch, variant, backend, false, outcome)
}

/// [`hold_to_declaration`], for a kvm run nested in a rustkvm L1 when
/// `nested` (its `kvm-nested` declarations apply too).
pub fn hold_to_declaration_on(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    backend: Backend,
    nested: bool,
    mut outcome: Outcome,
) -> Outcome {
    let expected = test.expected_on(arch, backend, variant, nested);
    let verdict = match (&outcome.status, expected) {
        (Status::Fail(_), _) => None,
        (Status::Skip(why), Expected::Pass) => {
            Some(format!("declared PASS here, the guest SKIPped ({why})"))
        }
        (Status::Pass, Expected::Skip) => Some(
            "declared SKIP here, the guest PASSed (update its rustkvm-expect line)".to_string(),
        ),
        (Status::Skip(_), Expected::Skip) => None,
        (Status::Pass, Expected::Pass) => outcome
            .skipped_checks
            .iter()
            .find(|(name, _)| !test.may_skip(name, arch, backend, variant, nested))
            .map(|(name, why)| {
                format!("check {name} skipped ({why}), not declared in rustkvm-expect-skip")
            }),
    };
    if let Some(why) = verdict {
        outcome.status = Status::Fail(why);
    }
    outcome
}

/// Sum rustkvm's `stats=on` lines (`rustkvm: ARCH vcpu N: key=value ...`).
pub fn parse_routes(stderr: &str) -> BTreeMap<String, u64> {
    let mut routes = BTreeMap::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("rustkvm: ") else {
            continue;
        };
        let Some((_, counts)) = rest.split_once(": ") else {
            continue;
        };
        for kv in counts.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=') {
                if let Ok(v) = v.parse::<u64>() {
                    *routes.entry(k.to_string()).or_insert(0) += v;
                }
            }
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(arch: Arch, code: Option<i32>, serial: &str) -> Outcome {
        judge(
            arch,
            code,
            None,
            serial.to_string(),
            "rustkvm: x86_64 vcpu 0: resets=1 cpuid=2\nrustkvm: x86_64 vcpu 1: resets=1 cpuid=3\n"
                .into(),
            Duration::ZERO,
        )
    }

    #[test]
    fn an_arm64_guest_on_kvm_says_its_status_then_powers_off() {
        let skip = "skip x: no pmu\nsummary checks=1 passed=0 failed=0 skipped=1\nexit 2\n";
        assert_eq!(
            j(Arch::Aarch64, Some(0), skip).status,
            Status::Skip("x: no pmu".into())
        );
        let fail = "ok a\nsummary checks=2 passed=1 failed=1 skipped=0\nexit 1\n";
        assert!(matches!(
            j(Arch::Aarch64, Some(0), fail).status,
            Status::Fail(_)
        ));
        // QEMU's own failure is not overridden by the line.
        assert!(matches!(
            j(Arch::Aarch64, Some(0x40 + 7), skip).status,
            Status::Fail(_)
        ));
    }

    #[test]
    fn verdicts() {
        let pass = "ok a\nsummary checks=1 passed=1 failed=0 skipped=0\n";
        assert_eq!(j(Arch::X86_64, Some(1), pass).status, Status::Pass);
        assert_eq!(j(Arch::Aarch64, Some(0), pass).status, Status::Pass);
        assert_eq!(
            j(Arch::X86_64, Some(3), "ok a\nnot ok b: why\n").status,
            Status::Fail("b: why".into())
        );
        assert_eq!(
            j(Arch::Aarch64, Some(0), "not ok b: why\n").status,
            Status::Fail("b: why".into()),
            "a failed check fails the run even if the guest exits 0"
        );
        assert_eq!(
            j(
                Arch::Aarch64,
                Some(2),
                "skip x: no pmu\nsummary checks=1 passed=0 failed=0 skipped=1\n"
            )
            .status,
            Status::Skip("x: no pmu".into())
        );
        assert_eq!(
            j(Arch::X86_64, Some(((0x40 + 13) << 1) | 1), "").status,
            Status::Fail("unexpected exception 0xd".into())
        );
        assert!(
            matches!(j(Arch::X86_64, Some(0), "").status, Status::Fail(w) if w.contains("without a guest status"))
        );
        let t = judge(
            Arch::X86_64,
            None,
            crate::guard::judge(
                Duration::from_secs(7),
                Duration::from_secs(9),
                Some(Duration::from_secs(7)),
            ),
            String::new(),
            String::new(),
            Duration::ZERO,
        );
        assert_eq!(
            t.status,
            Status::Fail("timeout after 7s (hung: 7s of CPU time used in 9s)".into())
        );
    }

    #[test]
    fn exiting_zero_is_not_passing_without_an_agreeing_summary() {
        let fail = |arch, code, serial: &str| match j(arch, Some(code), serial).status {
            Status::Fail(why) => why,
            other => panic!("{serial:?}: {other:?}"),
        };
        // A clean PSCI SYSTEM_OFF (aarch64 status 0) with no summary.
        assert!(fail(Arch::Aarch64, 0, "ok a\n").contains("without its closing summary"));
        assert!(fail(Arch::X86_64, 5, "skip a: b\n").contains("without its closing summary"));
        // The summary disagrees with the lines seen (a line lost, or one
        // printed by something else).
        assert!(fail(
            Arch::Aarch64,
            0,
            "ok a\nok b\nsummary checks=3 passed=3 failed=0 skipped=0\n"
        )
        .contains("the runner saw checks=2 passed=2"));
        assert!(fail(
            Arch::Aarch64,
            0,
            "ok a\nsummary checks=1 passed=1 failed=0 skipped=0\nok b\n"
        )
        .contains("after the closing summary"));
        assert!(fail(Arch::Aarch64, 0, "ok a\nsummary checks=1 passed=1\n").contains("malformed"));
        // Nothing checked is not a pass; a SKIP exit with passed checks or
        // no skip is not a skip.
        assert!(fail(
            Arch::Aarch64,
            0,
            "summary checks=0 passed=0 failed=0 skipped=0\n"
        )
        .contains("no check passed"));
        assert!(fail(
            Arch::Aarch64,
            2,
            "ok a\nskip b: c\nsummary checks=2 passed=1 failed=0 skipped=1\n"
        )
        .contains("exited SKIP"));
        assert!(fail(
            Arch::X86_64,
            3,
            "summary checks=0 passed=0 failed=0 skipped=0\n"
        )
        .contains("status 1"));
        // Skipped checks inside a passing guest are reported.
        let o = j(
            Arch::Aarch64,
            Some(0),
            "ok a\nskip b: why\nsummary checks=2 passed=1 failed=0 skipped=1\n",
        );
        assert_eq!(o.status, Status::Pass);
        assert_eq!(o.skipped_checks, vec![("b".to_string(), "why".to_string())]);
    }

    #[test]
    fn runs_are_held_to_what_the_guest_declares() {
        let test = GuestTest::parse(
            "g",
            "//! rustkvm-test: arch=x86_64,aarch64\n\
             //! rustkvm-expect: tcg=skip aarch64:tcg/icount=pass\n\
             //! rustkvm-expect-skip: rustkvm/rr-smp2 b\n",
        )
        .unwrap();
        let pass = "ok a\nsummary checks=1 passed=1 failed=0 skipped=0\n";
        let skip = "skip a: absent\nsummary checks=1 passed=0 failed=0 skipped=1\n";
        let inner = "ok a\nskip b: why\nsummary checks=2 passed=1 failed=0 skipped=1\n";
        let held = |arch, variant, backend, code, serial: &str| {
            hold_to_declaration(&test, arch, variant, backend, j(arch, Some(code), serial)).status
        };
        let (x, a, d) = (Arch::X86_64, Arch::Aarch64, Variant::Default);
        assert_eq!(held(x, d, Backend::Rustkvm, 1, pass), Status::Pass);
        assert_eq!(
            held(x, d, Backend::Tcg, 5, skip),
            Status::Skip("a: absent".into())
        );
        assert!(
            matches!(held(x, d, Backend::Rustkvm, 5, skip), Status::Fail(w) if w.contains("declared PASS")),
            "a feature rustkvm stopped offering turns the run red"
        );
        assert!(
            matches!(held(x, d, Backend::Tcg, 1, pass), Status::Fail(w) if w.contains("declared SKIP"))
        );
        assert_eq!(
            held(a, Variant::Icount, Backend::Tcg, 0, pass),
            Status::Pass,
            "last match wins"
        );
        assert!(matches!(
            held(x, Variant::Icount, Backend::Tcg, 1, pass),
            Status::Fail(_)
        ));
        assert_eq!(
            held(x, Variant::RrSmp2, Backend::Rustkvm, 1, inner),
            Status::Pass
        );
        assert!(
            matches!(held(x, d, Backend::Rustkvm, 1, inner), Status::Fail(w) if w.contains("check b skipped")),
            "an undeclared skipped check fails"
        );
        let failed = "not ok a: no\n";
        assert_eq!(
            held(x, d, Backend::Tcg, 3, failed),
            Status::Fail("a: no".into())
        );
    }

    #[test]
    fn protocol_lines_and_routes() {
        let o = j(
            Arch::X86_64,
            Some(1),
            "# note\nmeasure k v w\nok a\r\nnoise\nsummary checks=1 passed=1 failed=0 skipped=0\n",
        );
        assert_eq!(o.lines, vec!["measure k v w", "ok a"]);
        assert_eq!(o.measures, vec![("k".to_string(), "v w".to_string())]);
        assert_eq!(o.routes.get("cpuid"), Some(&5));
        assert_eq!(o.routes.get("resets"), Some(&2));
    }
}
