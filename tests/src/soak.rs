//! The soak (`scripts/soak.sh MINUTES`, `rustkvm-soak`): the `soak` guest
//! on 8 vCPUs under `-accel rustkvm` with MTTCG, one VM per architecture at
//! the same time, for MINUTES, while the host
//!
//! - polls `x-query-rustkvm` over QMP at 50 Hz, checking each reply against
//!   the documented schema (docs/introspection.md) and that what it shows
//!   never goes backwards either (steal-ns, counting PMU counters, x86's
//!   TSC);
//! - every [`Config::action_every`] alternately stops the VM and continues
//!   it, or migrates it to a file (`migrate file:...`, waiting for
//!   `completed` with `query-migrate`) and continues it from
//!   `postmigrate`;
//! - watches the guest's progress lines: every vCPU's read count must grow
//!   within [`Config::stall_limit`];
//! - at the end sends the guest a byte on its console, and judges its exit
//!   and closing summary like any guest run.
//!
//! Anything else — QEMU exiting before it is told, a QMP error, a guest
//! `not ok`, a stall — fails the VM's run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::guard::HangGuard;
use crate::guest::GuestTest;
use crate::qemu::{self, Arch, Backend, Variant};
use crate::qmp::{Qmp, QmpError};
use crate::run::{self, Capture, Status};

/// Timing of the soak.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long the VMs run before they are told to stop.
    pub duration: Duration,
    /// Between two `x-query-rustkvm` polls (50 Hz).
    pub poll_every: Duration,
    /// Between the end of one stop/cont or migration and the next (they
    /// alternate).
    pub action_every: Duration,
    /// How long a `stop` lasts before `cont`.
    pub stop_for: Duration,
    /// Longest a vCPU may go without its read count growing.
    pub stall_limit: Duration,
    /// Longest a migration may take.
    pub migration_limit: Duration,
    /// Longest the guest may take to stop and exit once told.
    pub exit_limit: Duration,
}

impl Config {
    /// The soak's timing for a run of `duration`.
    pub fn new(duration: Duration) -> Config {
        Config {
            duration,
            poll_every: Duration::from_millis(20),
            action_every: Duration::from_secs(2),
            stop_for: Duration::from_millis(300),
            stall_limit: Duration::from_secs(30),
            migration_limit: Duration::from_secs(60),
            exit_limit: Duration::from_secs(60),
        }
    }
}

/// What one VM's soak did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Reads per vCPU the guest reported at the end (its last progress
    /// line if it never got there).
    pub reads: Vec<u64>,
    /// `x-query-rustkvm` replies received and checked.
    pub polls: u64,
    /// Their total and longest round-trip time.
    pub poll_time: Duration,
    /// See [`Report::poll_time`].
    pub poll_max: Duration,
    /// Total and longest time from `migrate` to `completed`.
    pub migration_time: Duration,
    /// See [`Report::migration_time`].
    pub migration_max: Duration,
    /// stop + cont cycles completed.
    pub stop_conts: u64,
    /// Migrations to a file completed (and continued from).
    pub migrations: u64,
    /// Backwards steps the guest counted.
    pub guest_violations: u64,
    /// Backwards steps seen in `x-query-rustkvm` replies.
    pub host_violations: u64,
    /// QEMU ended other than by the guest's exit when told.
    pub crashes: u64,
    /// Every failure, in order, each one line.
    pub failures: Vec<String>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl Report {
    /// Mean `x-query-rustkvm` round trip.
    pub fn poll_mean(&self) -> Duration {
        self.poll_time / u32::try_from(self.polls.max(1)).unwrap_or(u32::MAX)
    }

    /// Mean migration time.
    pub fn migration_mean(&self) -> Duration {
        self.migration_time / u32::try_from(self.migrations.max(1)).unwrap_or(u32::MAX)
    }

    /// Reads over all vCPUs.
    pub fn total_reads(&self) -> u64 {
        self.reads.iter().sum()
    }

    /// Violations of both kinds.
    pub fn violations(&self) -> u64 {
        self.guest_violations + self.host_violations
    }

    /// No failure, violation or crash.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.violations() == 0 && self.crashes == 0
    }
}

/// The `-cpu` the soak gives each architecture: x86 an Intel PMU with
/// kvmclock and steal time (`max`: KVM's PV features by default); arm64
/// the machine's `max`, PMUv3 and PV time.
pub fn cpu_model(arch: Arch) -> Option<&'static str> {
    match arch {
        Arch::X86_64 => Some("max,vendor=GenuineIntel,pmu=on"),
        Arch::Aarch64 => None,
    }
}

/// Parse a guest `# progress reads=A,B,... violations=V` line: the reads.
pub fn parse_progress(line: &str) -> Option<Vec<u64>> {
    let rest = line.trim_end().strip_prefix("# progress reads=")?;
    let (reads, _) = rest.split_once(' ')?;
    reads.split(',').map(|r| r.parse().ok()).collect()
}

/// A migration that takes this long is logged with QEMU's own timings.
const SLOW_MIGRATION: Duration = Duration::from_secs(10);

/// What every guest line about a backwards step says (tests/guests/src/bin/soak.rs).
const VIOLATION_MARK: &str = "went backwards";

/// The value of the guest's closing `measure KEY VALUE` line.
fn measure<'a>(serial: &'a str, key: &str) -> Option<&'a str> {
    serial.lines().rev().find_map(|l| {
        l.trim_end()
            .strip_prefix("measure ")?
            .strip_prefix(key)?
            .strip_prefix(' ')
    })
}

fn field<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a Value, String> {
    v.get(key).ok_or_else(|| format!("{at}: no '{key}'"))
}

fn uint(v: &Value, key: &str, at: &str) -> Result<u64, String> {
    field(v, key, at)?
        .as_u64()
        .ok_or_else(|| format!("{at}.{key}: not an unsigned integer"))
}

fn boolean(v: &Value, key: &str, at: &str) -> Result<bool, String> {
    field(v, key, at)?
        .as_bool()
        .ok_or_else(|| format!("{at}.{key}: not a boolean"))
}

fn text<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a str, String> {
    field(v, key, at)?
        .as_str()
        .ok_or_else(|| format!("{at}.{key}: not a string"))
}

fn array<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a Vec<Value>, String> {
    field(v, key, at)?
        .as_array()
        .ok_or_else(|| format!("{at}.{key}: not an array"))
}

/// Check a `x-query-rustkvm` reply (its `return`) against the schema
/// (`qapi/rustkvm.json`, docs/introspection.md) for an `arch` VM of
/// `vcpus` vCPUs under `backend=tcg`.
pub fn check_reply(arch: Arch, vcpus: usize, r: &Value) -> Result<(), String> {
    let top = "return";
    if text(r, "backend", top)? != "tcg" {
        return Err(format!("backend {}, want tcg", r["backend"]));
    }
    if text(r, "arch", top)? != arch.name() {
        return Err(format!("arch {}, want {arch}", r["arch"]));
    }
    let cpus = array(r, "vcpus", top)?;
    if cpus.len() != vcpus {
        return Err(format!("{} vcpus, want {vcpus}", cpus.len()));
    }
    for (i, c) in cpus.iter().enumerate() {
        let at = format!("vcpus[{i}]");
        let index = field(c, "cpu-index", &at)?.as_i64();
        if index != Some(i as i64) {
            return Err(format!("{at}.cpu-index {index:?}, want {i}"));
        }
        let st = field(c, "steal-time", &at)?;
        let st_at = format!("{at}.steal-time");
        boolean(st, "enabled", &st_at)?;
        uint(st, "gpa", &st_at)?;
        uint(st, "steal-ns", &st_at)?;
        boolean(st, "preempted", &st_at)?;
        let version = st.get("version");
        match (arch, version) {
            (Arch::X86_64, Some(v)) if v.as_u64().is_some_and(|v| v <= u64::from(u32::MAX)) => {}
            // Absent only while the structure is not RAM (not enabled yet).
            (Arch::X86_64, None) if !st["enabled"].as_bool().unwrap_or(true) => {}
            (Arch::Aarch64, None) => {}
            (_, v) => return Err(format!("{st_at}.version {v:?} on {arch}")),
        }
        match (arch, c.get("pvclock")) {
            (Arch::X86_64, Some(p)) => {
                boolean(p, "enabled", &format!("{at}.pvclock"))?;
                uint(p, "gpa", &format!("{at}.pvclock"))?;
            }
            (Arch::Aarch64, None) => {}
            (_, p) => return Err(format!("{at}.pvclock {p:?} on {arch}")),
        }
        let pmu = field(c, "pmu", &at)?;
        let pmu_at = format!("{at}.pmu");
        let version = uint(pmu, "version", &pmu_at)?;
        let global = pmu.get("global-ctrl").is_some() && pmu.get("global-status").is_some();
        match arch {
            Arch::X86_64 if version == 2 && global => {
                uint(pmu, "global-ctrl", &pmu_at)?;
                uint(pmu, "global-status", &pmu_at)?;
            }
            Arch::Aarch64 if version >= 1 && pmu.get("global-ctrl").is_none() => {}
            _ => {
                return Err(format!(
                    "{pmu_at}: version {version}, global registers {global}"
                ))
            }
        }
        let counters = array(pmu, "counters", &pmu_at)?;
        if counters.is_empty() {
            return Err(format!("{pmu_at}.counters: none"));
        }
        for (j, k) in counters.iter().enumerate() {
            let k_at = format!("{pmu_at}.counters[{j}]");
            let name = text(k, "name", &k_at)?;
            let known = match arch {
                Arch::X86_64 => ["gp", "fixed"].iter().any(|p| {
                    name.strip_prefix(p)
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                }),
                Arch::Aarch64 => {
                    name == "cycles"
                        || name
                            .strip_prefix("evt")
                            .is_some_and(|n| n.parse::<u32>().is_ok())
                }
            };
            if !known {
                return Err(format!("{k_at}.name '{name}' on {arch}"));
            }
            uint(k, "config", &k_at)?;
            uint(k, "value", &k_at)?;
            boolean(k, "enabled", &k_at)?;
        }
        let timers = array(c, "timer", &at)?;
        let want: &[&str] = match arch {
            // backend=tcg: the arch's registers, then QEMU's timer for the
            // cycle counters' PMI (patch 0034, docs/introspection.md).
            Arch::X86_64 => &["tsc-deadline", "tsc", "pmu-timer"],
            Arch::Aarch64 => &[
                "cntv-ctl",
                "cntv-cval",
                "cntp-ctl",
                "cntp-cval",
                "pmu-timer",
            ],
        };
        let mut names = Vec::new();
        for (j, t) in timers.iter().enumerate() {
            let t_at = format!("{at}.timer[{j}]");
            names.push(text(t, "name", &t_at)?);
            uint(t, "value", &t_at)?;
        }
        if names != want {
            return Err(format!("{at}.timer names {names:?}, want {want:?}"));
        }
    }
    Ok(())
}

/// What the host sees in `x-query-rustkvm` replies that must not go
/// backwards between two polls: a vCPU's steal-ns (same structure, while
/// enabled), a PMU counter's value (same config, counting in both), x86's
/// guest TSC. The guest writes none of them after setting them up.
#[derive(Debug, Default)]
pub struct HostWatch {
    /// (vCPU, what) → (what it depends on, last value).
    last: HashMap<(usize, String), (u64, u64)>,
}

impl HostWatch {
    /// Take in a checked reply; what went backwards since the last one.
    pub fn see(&mut self, r: &Value) -> Vec<String> {
        let mut seen: Vec<(usize, String, u64, u64)> = Vec::new();
        for (i, c) in r["vcpus"].as_array().into_iter().flatten().enumerate() {
            let st = &c["steal-time"];
            if st["enabled"] == json!(true) {
                let (gpa, ns) = (st["gpa"].as_u64(), st["steal-ns"].as_u64());
                seen.push((i, "steal-ns".into(), gpa.unwrap_or(0), ns.unwrap_or(0)));
            }
            for k in c["pmu"]["counters"].as_array().into_iter().flatten() {
                if k["enabled"] == json!(true) {
                    let name = format!("pmu.{}", k["name"].as_str().unwrap_or("?"));
                    let (config, value) = (k["config"].as_u64(), k["value"].as_u64());
                    seen.push((i, name, config.unwrap_or(0), value.unwrap_or(0)));
                }
            }
            for t in c["timer"].as_array().into_iter().flatten() {
                if t["name"] == json!("tsc") {
                    seen.push((i, "tsc".into(), 0, t["value"].as_u64().unwrap_or(0)));
                }
            }
        }
        let mut now = HashMap::new();
        let mut backwards = Vec::new();
        for (cpu, what, key, value) in seen {
            if let Some(&(k, before)) = self.last.get(&(cpu, what.clone())) {
                if k == key && value < before {
                    backwards.push(format!(
                        "x-query-rustkvm: vCPU {cpu} {what} went backwards: {before} then {value}"
                    ));
                }
            }
            now.insert((cpu, what), (key, value));
        }
        self.last = now;
        backwards
    }
}

/// The guest's console as the soak reads it.
#[derive(Debug)]
struct Serial {
    /// Everything printed.
    text: String,
    /// Per vCPU: its read count, and when that last grew.
    reads: Vec<(u64, Instant)>,
    /// `not ok` lines, in order.
    not_ok: Vec<String>,
}

/// Read the guest's console on a thread into shared [`Serial`] state.
fn watch_serial(
    stdout: std::process::ChildStdout,
    vcpus: usize,
) -> (Arc<Mutex<Serial>>, thread::JoinHandle<()>) {
    let state = Arc::new(Mutex::new(Serial {
        text: String::new(),
        reads: vec![(0, Instant::now()); vcpus],
        not_ok: Vec::new(),
    }));
    let into = Arc::clone(&state);
    let reader = thread::spawn(move || {
        let mut out = BufReader::new(stdout);
        let mut buf = Vec::new();
        while matches!(out.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&buf).into_owned();
            buf.clear();
            let Ok(mut s) = into.lock() else { return };
            s.text.push_str(&line);
            if let Some(reads) = parse_progress(&line) {
                for (slot, r) in s.reads.iter_mut().zip(reads) {
                    if r > slot.0 {
                        *slot = (r, Instant::now());
                    }
                }
            }
            if line.starts_with("not ok ") {
                s.not_ok.push(line.trim_end().to_string());
            }
        }
    });
    (state, reader)
}

/// Where the VM is in its stop/cont and migration cycle.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Running; the next action at this time.
    Running { next: Instant },
    /// Stopped; continue at this time.
    Stopped { until: Instant },
    /// Migrating since this time.
    Migrating { since: Instant },
}

/// One VM under the soak.
struct Vm {
    arch: Arch,
    child: Child,
    stdin: Option<ChildStdin>,
    serial: Arc<Mutex<Serial>>,
    serial_reader: Option<thread::JoinHandle<()>>,
    stderr: Option<Capture>,
    qmp: Qmp,
    state_file: PathBuf,
    started: Instant,
    report: Report,
    /// `not ok` lines already reported as failures.
    not_ok_seen: usize,
    /// The run cannot usefully go on (the monitor is gone, a vCPU stalled).
    give_up: bool,
    log: Box<dyn Fn(&str) + Send>,
}

/// Soak `test` (the `soak` guest) on `arch` for `cfg.duration`, with its
/// files in `dir`; `log` gets a line for each failure and a status line
/// every minute.
pub fn soak(
    arch: Arch,
    test: &GuestTest,
    cfg: &Config,
    dir: &Path,
    log: Box<dyn Fn(&str) + Send>,
) -> Report {
    let started = Instant::now();
    let mut report = Report::default();
    let mut vm = match Vm::start(arch, test, dir, log) {
        Ok(vm) => vm,
        Err(why) => {
            report.failures.push(why);
            report.crashes += 1;
            return report;
        }
    };
    vm.run(cfg, test.smp as usize);
    let mut report = vm.finish(cfg);
    report.elapsed = started.elapsed();
    report
}

impl Vm {
    fn start(
        arch: Arch,
        test: &GuestTest,
        dir: &Path,
        log: Box<dyn Fn(&str) + Send>,
    ) -> Result<Vm, String> {
        let exe = qemu::emulator(arch).map_err(|e| e.to_string())?;
        let sock = dir.join(format!("{arch}.qmp"));
        let state_file = dir.join(format!("{arch}.migration"));
        let _ = std::fs::remove_file(&sock);
        let mut child = Command::new(&exe)
            .args(qemu::command_args(
                arch,
                Backend::Rustkvm,
                Variant::MttcgSmp2,
                test.smp,
                cpu_model(arch),
                &test.binary(arch),
            ))
            .args([
                "-qmp",
                &format!("unix:{},server=on,wait=off", sock.display()),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        let stdin = child.stdin.take();
        let stderr = Capture::spawn(child.stderr.take());
        let Some(stdout) = child.stdout.take() else {
            return Err("no stdout".to_string());
        };
        let (serial, serial_reader) = watch_serial(stdout, test.smp as usize);
        let qmp = match Qmp::connect(&sock, Duration::from_secs(30)) {
            Ok(q) => q,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{e}; QEMU said: {}", stderr.finish().trim()));
            }
        };
        Ok(Vm {
            arch,
            child,
            stdin,
            serial,
            serial_reader: Some(serial_reader),
            stderr: Some(stderr),
            qmp,
            state_file,
            started: Instant::now(),
            report: Report::default(),
            not_ok_seen: 0,
            give_up: false,
            log,
        })
    }

    fn fail(&mut self, why: String) {
        (self.log)(&format!("FAIL {why}"));
        self.report.failures.push(why);
    }

    /// A command whose failure is the soak's failure (None then).
    fn command(&mut self, command: &str, arguments: Option<Value>) -> Option<Value> {
        match self.qmp.execute(command, arguments) {
            Ok(v) => Some(v),
            Err(e) => {
                self.give_up |= matches!(e, QmpError::Transport(_));
                self.fail(format!("{command}: {e}"));
                None
            }
        }
    }

    fn status(&mut self) -> Option<String> {
        let s = self.command("query-status", None)?;
        Some(s["status"].as_str().unwrap_or("?").to_string())
    }

    /// The main loop: polls and actions until the time is up or the VM
    /// cannot go on.
    fn run(&mut self, cfg: &Config, vcpus: usize) {
        let end = self.started + cfg.duration;
        let mut phase = Phase::Running {
            next: self.started + cfg.action_every,
        };
        let mut watch = HostWatch::default();
        let mut actions = 0u64;
        let mut next_status = self.started + Duration::from_secs(60);
        let mut tick = Instant::now();
        loop {
            let now = Instant::now();
            if let Ok(Some(status)) = self.child.try_wait() {
                self.report.crashes += 1;
                self.fail(format!(
                    "QEMU exited ({status}) after {:.1} s without being told",
                    self.started.elapsed().as_secs_f64()
                ));
                return;
            }
            if self.give_up {
                return;
            }
            let asked = Instant::now();
            if let Some(r) = self.command("x-query-rustkvm", None) {
                let took = asked.elapsed();
                self.report.polls += 1;
                self.report.poll_time += took;
                self.report.poll_max = self.report.poll_max.max(took);
                if let Err(why) = check_reply(self.arch, vcpus, &r) {
                    self.fail(format!("x-query-rustkvm reply: {why}"));
                }
                for b in watch.see(&r) {
                    self.report.host_violations += 1;
                    self.fail(b);
                }
            }
            phase = match phase {
                Phase::Running { .. } if now >= end => break,
                Phase::Running { next } if now >= next => {
                    actions += 1;
                    if actions % 2 == 1 {
                        self.command("stop", None);
                        if let Some(s) = self.status().filter(|s| s != "paused") {
                            self.fail(format!("after stop: status {s}"));
                        }
                        Phase::Stopped {
                            until: now + cfg.stop_for,
                        }
                    } else {
                        let _ = std::fs::remove_file(&self.state_file);
                        let uri = format!("file:{}", self.state_file.display());
                        match self.command("migrate", Some(json!({ "uri": uri }))) {
                            Some(_) => Phase::Migrating { since: now },
                            None => Phase::Running {
                                next: now + cfg.action_every,
                            },
                        }
                    }
                }
                Phase::Stopped { until } if now >= until => {
                    self.command("cont", None);
                    self.report.stop_conts += 1;
                    self.expect_running("cont after stop");
                    Phase::Running {
                        next: Instant::now() + cfg.action_every,
                    }
                }
                Phase::Migrating { since } => match self.migration(since, cfg) {
                    Some(()) => Phase::Running {
                        next: Instant::now() + cfg.action_every,
                    },
                    None => phase,
                },
                p => p,
            };
            self.check_serial(cfg);
            if now >= next_status {
                next_status = now + Duration::from_secs(60);
                let reads: u64 = self.reads().iter().sum();
                let r = &self.report;
                (self.log)(&format!(
                    "{:.0} s: reads {reads}, stop/cont {}, migrations {}, QMP polls {}, failures {}",
                    self.started.elapsed().as_secs_f64(),
                    r.stop_conts,
                    r.migrations,
                    r.polls,
                    r.failures.len()
                ));
            }
            tick += cfg.poll_every;
            let now = Instant::now();
            if tick > now {
                thread::sleep(tick - now);
            } else {
                tick = now;
            }
        }
    }

    fn expect_running(&mut self, after: &str) {
        if let Some(s) = self.status().filter(|s| s != "running") {
            self.fail(format!("{after}: status {s}"));
        }
    }

    /// Follow a migration: Some once it is over (and the VM continued),
    /// whether it completed or failed.
    fn migration(&mut self, since: Instant, cfg: &Config) -> Option<()> {
        let Some(info) = self.command("query-migrate", None) else {
            // Already a failure: leave the migration, keep the VM running.
            if !self.give_up && self.status().as_deref() != Some("running") {
                self.command("cont", None);
            }
            return Some(());
        };
        let status = info["status"].as_str().unwrap_or("?").to_string();
        match status.as_str() {
            "completed" => {
                let size = std::fs::metadata(&self.state_file).map_or(0, |m| m.len());
                if size == 0 {
                    self.fail(format!(
                        "migration completed but {} is empty",
                        self.state_file.display()
                    ));
                }
                if let Some(s) = self.status().filter(|s| s != "postmigrate") {
                    self.fail(format!("after migration: status {s}, want postmigrate"));
                }
                let took = since.elapsed();
                if took >= SLOW_MIGRATION {
                    let ram = &info["ram"];
                    (self.log)(&format!(
                        "slow migration: {} ms here; QEMU's total-time {} ms, setup-time {} ms, \
                         downtime {} ms, dirty syncs {}, {} bytes",
                        took.as_millis(),
                        info["total-time"],
                        info["setup-time"],
                        info["downtime"],
                        ram["dirty-sync-count"],
                        ram["transferred"]
                    ));
                }
                self.command("cont", None);
                self.report.migrations += 1;
                self.report.migration_time += took;
                self.report.migration_max = self.report.migration_max.max(took);
                self.expect_running("cont after migration");
                Some(())
            }
            "failed" | "cancelled" => {
                let why = info["error-desc"].as_str().unwrap_or("").to_string();
                self.fail(format!("migration {status}: {why}"));
                if self.status().as_deref() != Some("running") {
                    self.command("cont", None);
                }
                Some(())
            }
            _ if since.elapsed() > cfg.migration_limit => {
                self.fail(format!(
                    "migration still '{status}' after {} s",
                    cfg.migration_limit.as_secs()
                ));
                self.command("migrate_cancel", None);
                Some(())
            }
            _ => None,
        }
    }

    fn reads(&self) -> Vec<u64> {
        self.serial
            .lock()
            .map(|s| s.reads.iter().map(|r| r.0).collect())
            .unwrap_or_default()
    }

    /// New guest `not ok` lines and stalled vCPUs are failures.
    fn check_serial(&mut self, cfg: &Config) {
        let (new, stalled) = {
            let Ok(s) = self.serial.lock() else { return };
            let new: Vec<String> = s.not_ok[self.not_ok_seen..].to_vec();
            let stalled = s
                .reads
                .iter()
                .enumerate()
                .find(|(_, (_, at))| at.elapsed() > cfg.stall_limit)
                .map(|(i, (r, at))| (i, *r, at.elapsed()));
            (new, stalled)
        };
        self.not_ok_seen += new.len();
        for line in new {
            self.fail(format!("guest: {line}"));
        }
        if let Some((cpu, reads, for_)) = stalled {
            self.give_up = true;
            self.fail(format!(
                "vCPU {cpu} made no progress for {:.0} s (reads stuck at {reads})",
                for_.as_secs_f64()
            ));
        }
    }

    /// Tell the guest to stop, wait for it, and judge its run.
    fn finish(mut self, cfg: &Config) -> Report {
        if self.report.crashes == 0 {
            if !self.give_up && self.status().as_deref() != Some("running") {
                self.command("cont", None);
            }
            if let Some(mut stdin) = self.stdin.take() {
                if let Err(e) = stdin.write_all(b"x").and_then(|()| stdin.flush()) {
                    self.fail(format!("telling the guest to stop: {e}"));
                }
                self.stdin = Some(stdin);
            }
        }
        let guard = HangGuard::new(self.child.id(), cfg.exit_limit, Instant::now());
        let (status, hang) = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break (Some(status), None),
                Ok(None) => {
                    if let Some(hang) = guard.check() {
                        let _ = self.child.kill();
                        break (self.child.wait().ok(), Some(hang));
                    }
                    thread::sleep(Duration::from_millis(20))
                }
                Err(_) => {
                    let _ = self.child.kill();
                    break (self.child.wait().ok(), None);
                }
            }
        };
        let code = status.and_then(|s| s.code());
        drop(self.stdin.take());
        if let Some(reader) = self.serial_reader.take() {
            let _ = reader.join();
        }
        let stderr = self.stderr.take().map(Capture::finish).unwrap_or_default();
        let serial = self
            .serial
            .lock()
            .map(|s| s.text.clone())
            .unwrap_or_default();
        self.check_serial_final(&serial);
        if self.report.crashes > 0 {
            return self.report;
        }
        let outcome = run::judge(
            self.arch,
            code,
            hang,
            serial,
            stderr,
            self.started.elapsed(),
        );
        let guest_status = code.and_then(|c| self.arch.guest_status(c));
        if let Some(hang) = hang {
            self.fail(format!(
                "the guest did not exit after being told to stop: {hang}"
            ));
        } else if guest_status.is_none() {
            self.report.crashes += 1;
            let last = outcome.stderr.lines().last().unwrap_or("").to_string();
            let how = status.map_or("?".to_string(), |s| s.to_string());
            self.fail(format!(
                "QEMU ended ({how}) after {:.1} s without the guest's status{}{last}",
                self.started.elapsed().as_secs_f64(),
                if last.is_empty() {
                    ""
                } else {
                    "; its last words: "
                }
            ));
        } else if outcome.status != Status::Pass {
            self.fail(format!("guest run: {}", outcome.status.label()));
        }
        self.report
    }

    /// The guest's closing totals (or its last progress), and its `not
    /// ok` lines not yet reported.
    fn check_serial_final(&mut self, serial: &str) {
        let not_ok: Vec<String> = serial
            .lines()
            .filter(|l| l.starts_with("not ok "))
            .skip(self.not_ok_seen)
            .map(|l| l.trim_end().to_string())
            .collect();
        self.not_ok_seen += not_ok.len();
        for line in not_ok {
            self.fail(format!("guest: {line}"));
        }
        self.report.reads = measure(serial, "reads")
            .and_then(|r| r.split(',').map(|x| x.parse().ok()).collect())
            .unwrap_or_else(|| self.reads());
        let counted = measure(serial, "violations").and_then(|v| v.parse().ok());
        let live = serial
            .lines()
            .filter(|l| l.starts_with("not ok cpu") && l.contains(VIOLATION_MARK))
            .count() as u64;
        self.report.guest_violations = counted.unwrap_or(0).max(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x86_reply() -> Value {
        let cpu = |i: usize, steal: u64, value: u64, tsc: u64| {
            json!({
                "cpu-index": i,
                "steal-time": {"enabled": true, "gpa": 4096, "steal-ns": steal,
                               "preempted": false, "version": 4},
                "pvclock": {"enabled": true, "gpa": 8192},
                "pmu": {"version": 2, "global-ctrl": 3, "global-status": 0,
                        "counters": [{"name": "gp0", "config": 196, "value": value,
                                      "enabled": true},
                                     {"name": "fixed0", "config": 3, "value": 1,
                                      "enabled": false}]},
                "timer": [{"name": "tsc-deadline", "value": 0},
                          {"name": "tsc", "value": tsc},
                          {"name": "pmu-timer", "value": 0}]
            })
        };
        json!({"backend": "tcg", "arch": "x86_64",
               "vcpus": [cpu(0, 10, 100, 1000), cpu(1, 20, 200, 2000)]})
    }

    #[test]
    fn replies_are_held_to_the_documented_schema() {
        let r = x86_reply();
        assert_eq!(check_reply(Arch::X86_64, 2, &r), Ok(()));
        assert!(check_reply(Arch::X86_64, 3, &r)
            .unwrap_err()
            .contains("2 vcpus"));
        assert!(check_reply(Arch::Aarch64, 2, &r).is_err());
        let mut bad = r.clone();
        bad["vcpus"][1]["steal-time"]
            .as_object_mut()
            .unwrap()
            .remove("steal-ns");
        assert!(check_reply(Arch::X86_64, 2, &bad)
            .unwrap_err()
            .contains("vcpus[1].steal-time: no 'steal-ns'"));
        let mut bad = r.clone();
        bad["vcpus"][0]["pmu"]["counters"][0]["value"] = json!(-1);
        assert!(check_reply(Arch::X86_64, 2, &bad).is_err());
        let mut bad = r;
        bad["vcpus"][0]["timer"][1]["name"] = json!("tick");
        assert!(check_reply(Arch::X86_64, 2, &bad).is_err());

        let arm = json!({"backend": "tcg", "arch": "aarch64", "vcpus": [{
            "cpu-index": 0,
            "steal-time": {"enabled": true, "gpa": 4096, "steal-ns": 5, "preempted": false},
            "pmu": {"version": 6, "counters": [
                {"name": "evt0", "config": 8, "value": 9, "enabled": true},
                {"name": "cycles", "config": 0, "value": 9, "enabled": true}]},
            "timer": [{"name": "cntv-ctl", "value": 0}, {"name": "cntv-cval", "value": 0},
                      {"name": "cntp-ctl", "value": 0}, {"name": "cntp-cval", "value": 0},
                      {"name": "pmu-timer", "value": 0}]}]});
        assert_eq!(check_reply(Arch::Aarch64, 1, &arm), Ok(()));
        let mut bad = arm.clone();
        bad["vcpus"][0]["timer"].as_array_mut().unwrap().pop();
        assert!(check_reply(Arch::Aarch64, 1, &bad)
            .unwrap_err()
            .contains("timer names"));
        let mut bad = arm;
        bad["vcpus"][0]["pvclock"] = json!({"enabled": false, "gpa": 0});
        assert!(check_reply(Arch::Aarch64, 1, &bad).is_err());
    }

    #[test]
    fn the_host_sees_values_go_backwards_only_where_they_must_not() {
        let mut w = HostWatch::default();
        assert!(w.see(&x86_reply()).is_empty());
        let mut r = x86_reply();
        r["vcpus"][1]["steal-time"]["steal-ns"] = json!(19);
        r["vcpus"][0]["pmu"]["counters"][0]["value"] = json!(99);
        r["vcpus"][0]["pmu"]["counters"][1]["value"] = json!(0); // not counting
        let back = w.see(&r);
        assert_eq!(back.len(), 2, "{back:?}");
        assert!(back[0].contains("vCPU 0 pmu.gp0 went backwards: 100 then 99"));
        assert!(back[1].contains("vCPU 1 steal-ns went backwards: 20 then 19"));
        // A new structure or a reprogrammed counter starts afresh.
        r["vcpus"][1]["steal-time"]["gpa"] = json!(64);
        r["vcpus"][1]["steal-time"]["steal-ns"] = json!(0);
        r["vcpus"][0]["pmu"]["counters"][0]["config"] = json!(192);
        r["vcpus"][0]["pmu"]["counters"][0]["value"] = json!(0);
        assert!(w.see(&r).is_empty());
        r["vcpus"][1]["timer"][1]["value"] = json!(1999);
        assert_eq!(w.see(&r).len(), 1);
    }

    #[test]
    fn progress_lines_parse() {
        assert_eq!(
            parse_progress("# progress reads=1,22,333 violations=0\r\n"),
            Some(vec![1, 22, 333])
        );
        assert_eq!(parse_progress("# progress reads=1,x violations=0"), None);
        assert_eq!(parse_progress("ok reads"), None);
        let serial = "measure reads 5,6\nmeasure violations 0\r\n";
        assert_eq!(measure(serial, "reads"), Some("5,6"));
        assert_eq!(measure(serial, "violations"), Some("0"));
    }
}
