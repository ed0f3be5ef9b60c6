//! Booting real Linux guests (Debian's 6.12 kernels with the rustkvm-probe
//! initramfs, `scripts/build-linux-guests.sh`) and reading back what the
//! probe saw.
//!
//! A configuration is architecture × backend × vCPU count. Each run ends as
//! OK (the probe's JSON), SKIP (only for `kvm`, which cannot run here: the
//! reason the runner detected) or ERROR (with the tail of the console).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::guard::HangGuard;
use crate::host;
use crate::qemu::{self, Arch, Backend};
use crate::run::Capture;
use crate::HarnessError;

/// Line before the probe's JSON (rustkvm-probe's BEGIN_MARKER).
pub const BEGIN_MARKER: &str = "===RUSTKVM-PROBE-BEGIN===";
/// Line after it.
pub const END_MARKER: &str = "===RUSTKVM-PROBE-END===";
/// What QEMU prints when KVM cannot emulate an instruction the guest ran.
const KVM_INTERNAL_ERROR: &str = "KVM internal error";
/// Default time limit for one boot.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(180);

/// One Linux boot configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Config {
    /// Guest architecture.
    pub arch: Arch,
    /// Backend.
    pub backend: Backend,
    /// vCPUs.
    pub smp: u32,
    /// All vCPUs on one host thread (`thread=single`): overcommit.
    pub single_thread: bool,
    /// `-icount shift=0,sleep=off`: VM time counts instructions (1 ns
    /// each) and skips ahead while every vCPU idles, so the guest's clocks,
    /// its steal time (docs/steal-time.md) and its timers follow what it
    /// executes, not the host's scheduling; implies one TCG thread.
    pub icount: bool,
    /// Run QEMU with every thread on this host CPU (`taskset -c`).
    pub pin_cpu: Option<u32>,
    /// What the initramfs runs.
    pub workload: Workload,
    /// Seconds the guest idles before the probe runs (`rustkvm.soak=`):
    /// time for the clocksource watchdog to complain, if it would.
    pub soak_s: u32,
    /// x86: which PMU the guest's CPU has.
    pub pmu: PmuModel,
    /// kvm only: on Linux's own KVM inside a rustkvm L1
    /// ([`crate::nested`]), not on this host's KVM.
    pub nested: bool,
}

/// x86: the CPU model, for its PMU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum PmuModel {
    /// `-cpu max` (an AMD model under TCG, `pmu=on` by default like under
    /// KVM): under rustkvm AMD's PMU with PerfCtrExtCore and PerfMonV2.
    #[default]
    Default,
    /// `-cpu max,vendor=GenuineIntel,pmu=on`: Intel's architectural PMU.
    Intel,
    /// `-cpu EPYC,pmu=on`: AMD's four legacy counters only.
    Epyc,
    /// `-cpu EPYC,perfmon-v2=on,pmu=on`: family 17h (the Zen family KVM's
    /// `pmu_event_filter_test` knows) with PerfMonV2's six counters and
    /// global registers.
    EpycV2,
    /// `-cpu Icelake-Server,pdcm=on,ds=on,dtes64=on,pmu=on`: a model Linux's
    /// Intel PMU driver knows, so it uses the LBR and precise PEBS (QEMU's
    /// model has no PDCM, so no PERF_CAPABILITIES, nor DS and DTES64, so no
    /// PEBS, without them, as under KVM).
    Icelake,
}

impl PmuModel {
    /// Its name in labels and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PmuModel::Default => "default",
            PmuModel::Intel => "intel",
            PmuModel::Epyc => "epyc",
            PmuModel::EpycV2 => "epyc-v2",
            PmuModel::Icelake => "icelake",
        }
    }
}

/// What the guest's initramfs runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// Every check of the probe.
    #[default]
    Probe,
    /// The steal-share workload only (`rustkvm.busy=`, rustkvm-probe's
    /// `busy` module): a spin loop on every vCPU at once, after the perf
    /// sections if `perf_first`; its report is under `/busy`.
    Busy {
        /// How much each vCPU spins.
        amount: BusyAmount,
        /// Run the probe's perf counting and sampling first.
        perf_first: bool,
    },
}

/// How much each vCPU of [`Workload::Busy`] spins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BusyAmount {
    /// Loop iterations (`dec; jnz` / `subs; b.ne`).
    Iterations(u64),
    /// Milliseconds of the guest's time, all loops ending together.
    Millis(u64),
}

impl BusyAmount {
    /// `300000000` or `1500ms`, as the kernel command line takes it.
    pub fn parse(s: &str) -> Option<BusyAmount> {
        match s.strip_suffix("ms") {
            Some(ms) => ms.parse().ok().map(BusyAmount::Millis),
            None => s.parse().ok().map(BusyAmount::Iterations),
        }
    }
}

impl std::fmt::Display for BusyAmount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusyAmount::Iterations(n) => write!(f, "{n}"),
            BusyAmount::Millis(ms) => write!(f, "{ms}ms"),
        }
    }
}

impl Workload {
    /// The kernel command-line words that select it (with a leading space).
    pub fn cmdline(self) -> String {
        match self {
            Workload::Probe => String::new(),
            Workload::Busy { amount, perf_first } => {
                format!(
                    " rustkvm.busy={amount}{}",
                    if perf_first { ",perf" } else { "" }
                )
            }
        }
    }
}

impl Config {
    /// x86_64 or aarch64 `arch` on `backend` with `smp` vCPUs, the probe,
    /// and nothing else set.
    pub fn new(arch: Arch, backend: Backend, smp: u32) -> Config {
        Config {
            arch,
            backend,
            smp,
            single_thread: false,
            icount: false,
            pin_cpu: None,
            workload: Workload::Probe,
            soak_s: 0,
            pmu: PmuModel::Default,
            nested: false,
        }
    }

    /// `arch/backend[,nested][,thread=single|,icount][,taskset=N][,pmu=M]/smpN`.
    pub fn label(&self) -> String {
        let thread = match (self.single_thread, self.icount) {
            (_, true) => ",icount",
            (true, false) => ",thread=single",
            (false, false) => "",
        };
        let thread = match self.pin_cpu {
            Some(cpu) => format!("{thread},taskset={cpu}"),
            None => thread.to_string(),
        };
        let pmu = match self.pmu {
            PmuModel::Default => String::new(),
            m => format!(",pmu={}", m.name()),
        };
        let nested = if self.nested { ",nested" } else { "" };
        format!(
            "{}/{}{nested}{thread}{pmu}/smp{}",
            self.arch, self.backend, self.smp
        )
    }
}

/// Every configuration of `arches` × `backends` (`(backend,
/// thread=single, PMU model)`) × `smps`, in order (a PMU model other than
/// the default only on x86), then only those with `index % n == i` for
/// `shard = (i, n)`: `n` shards cover the matrix exactly once.
pub fn matrix(
    arches: &[Arch],
    backends: &[(Backend, bool, bool, PmuModel)],
    smps: &[u32],
    shard: (usize, usize),
) -> Vec<Config> {
    let mut all = Vec::new();
    for &arch in arches {
        for &(backend, single_thread, icount, pmu) in backends {
            if pmu != PmuModel::Default && arch != Arch::X86_64 {
                continue;
            }
            for &smp in smps {
                all.push(Config {
                    single_thread,
                    icount,
                    pmu,
                    ..Config::new(arch, backend, smp)
                });
            }
        }
    }
    let (i, n) = shard;
    all.into_iter()
        .enumerate()
        .filter(|(k, _)| k % n.max(1) == i)
        .map(|(_, c)| c)
        .collect()
}

/// How a boot ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The probe's report.
    Ok(Value),
    /// The configuration cannot run here (kvm only), and why.
    Skip(String),
    /// Something went wrong, and what.
    Error(String),
}

impl Outcome {
    /// As a verdict (an error's first line).
    pub fn status(&self) -> crate::Status {
        match self {
            Outcome::Ok(_) => crate::Status::Pass,
            Outcome::Skip(why) => crate::Status::Skip(why.clone()),
            Outcome::Error(why) => crate::Status::Fail(why.lines().next().unwrap_or("").into()),
        }
    }
}

/// One boot's result.
#[derive(Debug, Clone)]
pub struct LinuxRun {
    /// What was booted.
    pub config: Config,
    /// How it ended.
    pub outcome: Outcome,
    /// Guest wall clock minus host wall clock when the report arrived, in
    /// seconds (None without a report).
    pub wallclock_offset_s: Option<f64>,
    /// Host wall clock (Unix seconds) just before QEMU started and when the
    /// report was seen: the guest read its wall clock in between.
    pub host_unix_s: (f64, Option<f64>),
    /// How far the host's wall clock moved against its monotonic clock
    /// between those two moments (seconds; negative: set back): a step of
    /// the host's clock (by whatever sets it) that the guest's clock, which
    /// counts VM time, cannot follow, as under KVM.
    pub host_clock_step_s: Option<f64>,
    /// Host time taken.
    pub elapsed: Duration,
    /// The console (serial) output.
    pub console: String,
    /// How QEMU ended ("exited with status 0", "killed by signal 11
    /// (SIGSEGV)", what its hang guard saw), and the end of its stderr:
    /// what a boot that stopped short of its work left to tell why.
    pub ending: String,
}

/// `$RUSTKVM_CACHE` (the shell scripts' default: /var/cache/rustkvm).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("RUSTKVM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/rustkvm"))
}

/// Kernel and initramfs for `arch`: the initramfs this clone's
/// `scripts/build-linux-guests.sh` built (its path in
/// `target/linux-images/ARCH.initrd`; the cache keeps one per probe and
/// `/init`, so clones at other commits do not swap each other's), else the
/// cache's last one.
pub fn images(arch: Arch) -> Result<(PathBuf, PathBuf), HarnessError> {
    let (kernel, last) = images_in(&cache_dir(), arch)?;
    let ours = crate::repo_root()
        .join("target/linux-images")
        .join(format!("{}.initrd", arch.name()));
    let initrd = std::fs::read_to_string(ours)
        .ok()
        .map(|p| PathBuf::from(p.trim()))
        .filter(|p| p.exists())
        .unwrap_or(last);
    Ok((kernel, initrd))
}

/// Kernel and initramfs for `arch` under the cache directory `cache`.
pub fn images_in(cache: &std::path::Path, arch: Arch) -> Result<(PathBuf, PathBuf), HarnessError> {
    let dir = cache.join("linux").join(arch.name());
    let kernel = dir.join("vmlinuz");
    let initrd = dir.join("initramfs.cpio.gz");
    for p in [&kernel, &initrd] {
        if !p.exists() {
            return Err(HarnessError::NotBuilt(
                p.clone(),
                "scripts/build-linux-guests.sh",
            ));
        }
    }
    Ok((kernel, initrd))
}

/// The QEMU arguments for booting `config`.
pub fn command_args(
    config: Config,
    kernel: &std::path::Path,
    initrd: &std::path::Path,
) -> Vec<String> {
    command_args_for(
        config,
        &Images {
            kernel: kernel.to_path_buf(),
            initrd: initrd.to_path_buf(),
            mem_mib: DEFAULT_MEM_MIB,
            append: String::new(),
            hypervisor: false,
        },
    )
}

/// Guest RAM for the probe's initramfs.
pub const DEFAULT_MEM_MIB: u32 = 512;

/// What a boot boots: a kernel, an initramfs (several concatenated, as the
/// kernel unpacks them), how much RAM, and more kernel command line.
#[derive(Debug, Clone)]
pub struct Images {
    /// The kernel image (`-kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`-initrd`).
    pub initrd: PathBuf,
    /// `-m`, in MiB.
    pub mem_mib: u32,
    /// Appended to the kernel command line (with a leading space).
    pub append: String,
    /// The guest is itself a hypervisor (a nested L1, [`crate::nested`]):
    /// on arm64 `virt,virtualization=on,gic-version=3` (EL2, and a GIC
    /// KVM/arm64 can virtualize); x86's `-cpu max` has SVM already.
    pub hypervisor: bool,
}

/// The QEMU arguments for booting `config` from `images`.
pub fn command_args_for(config: Config, images: &Images) -> Vec<String> {
    let (kernel, initrd) = (&images.kernel, &images.initrd);
    let (machine, cpu, console) = match (config.arch, config.backend) {
        (Arch::X86_64, Backend::Kvm) if config.pmu != PmuModel::Default => {
            ("pc", "host,pmu=on", "ttyS0")
        }
        (Arch::X86_64, Backend::Kvm) => ("pc", "host", "ttyS0"),
        (Arch::X86_64, _) if config.pmu == PmuModel::Intel => {
            ("pc", "max,vendor=GenuineIntel,pmu=on", "ttyS0")
        }
        (Arch::X86_64, _) if config.pmu == PmuModel::Epyc => ("pc", "EPYC,pmu=on", "ttyS0"),
        (Arch::X86_64, _) if config.pmu == PmuModel::EpycV2 => {
            ("pc", "EPYC,perfmon-v2=on,pmu=on", "ttyS0")
        }
        (Arch::X86_64, _) if config.pmu == PmuModel::Icelake => (
            "pc",
            "Icelake-Server,pdcm=on,ds=on,dtes64=on,pmu=on",
            "ttyS0",
        ),
        (Arch::X86_64, _) => ("pc", "max", "ttyS0"),
        (Arch::Aarch64, Backend::Kvm) => ("virt", "host", "ttyAMA0"),
        (Arch::Aarch64, _) if images.hypervisor => {
            ("virt,virtualization=on,gic-version=3", "max", "ttyAMA0")
        }
        (Arch::Aarch64, _) => ("virt", "max", "ttyAMA0"),
    };
    let cpu = match config.backend {
        // Inside the L1 it is Linux's own KVM: the model as declared.
        Backend::Kvm if config.nested => cpu.to_string(),
        Backend::Kvm => host::kvm_cpu(Some(cpu)).unwrap_or_default(),
        _ => cpu.to_string(),
    };
    let mut accel = match config.backend {
        Backend::Tcg => "tcg",
        Backend::Rustkvm => "rustkvm",
        Backend::Kvm => "rustkvm,backend=kvm",
    }
    .to_string();
    if config.single_thread && config.backend != Backend::Kvm {
        accel += ",thread=single";
    }
    let icount: &[&str] = if config.icount && config.backend != Backend::Kvm {
        &["-icount", "shift=0,sleep=off"]
    } else {
        &[]
    };
    let soak = if config.soak_s > 0 {
        format!(" rustkvm.soak={}", config.soak_s)
    } else {
        String::new()
    };
    // x86 Linux reports its steal-time registration only with pr_debug on.
    let dyndbg = match config.arch {
        Arch::X86_64 => " dyndbg=\"file arch/x86/kernel/kvm.c +p\"",
        Arch::Aarch64 => "",
    };
    [
        "-M",
        machine,
        "-cpu",
        &cpu,
        "-accel",
        &accel,
        "-smp",
        &config.smp.to_string(),
        "-m",
        &images.mem_mib.to_string(),
    ]
    .iter()
    .chain(icount)
    .chain(qemu::HEADLESS.iter())
    .map(|s| s.to_string())
    .chain(
        [
            "-kernel",
            &kernel.display().to_string(),
            "-initrd",
            &initrd.display().to_string(),
            "-append",
            &format!(
                "console={console} loglevel=1 panic=-1 rdinit=/init{dyndbg}{soak}{}{}",
                config.workload.cmdline(),
                images.append
            ),
        ]
        .iter()
        .map(|s| s.to_string()),
    )
    .collect()
}

/// Panics unless the probe's report says `perf_event_open` counted its
/// known loop exactly: instructions and branches (the oracle is the loop's
/// own arithmetic, 2 instructions and 1 branch an iteration). For the
/// tests of every PMU path (tests/tests/linux.rs, tests/tests/nested.rs).
pub fn assert_perf_counts_exactly(report: &Value, label: &str) {
    for ev in ["instructions", "branches"] {
        assert_eq!(
            report.pointer(&format!("/perf/{ev}/exact")),
            Some(&Value::Bool(true)),
            "{label}: {ev}: {}",
            report["perf"][ev]
        );
    }
}

/// The JSON between the probe's markers in `console`.
pub fn extract_report(console: &str) -> Result<Value, String> {
    let start = console
        .find(BEGIN_MARKER)
        .ok_or_else(|| "the probe's report never started".to_string())?
        + BEGIN_MARKER.len();
    let end = console[start..]
        .find(END_MARKER)
        .ok_or_else(|| "the probe's report never ended".to_string())?
        + start;
    let text: String = console[start..end].chars().filter(|c| *c != '\r').collect();
    serde_json::from_str(text.trim()).map_err(|e| format!("garbled report: {e}"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Boot `config` and collect what the probe reports.
pub fn run(config: Config, timeout: Duration) -> LinuxRun {
    run_images(config, timeout, None)
}

/// [`run`] from `images` instead of the project's own (None).
pub fn run_images(config: Config, timeout: Duration, from: Option<&Images>) -> LinuxRun {
    let start = Instant::now();
    let started_unix_s = unix_now();
    let done = |outcome: Outcome,
                console: String,
                ending: String,
                offset: Option<(f64, f64)>,
                seen: Option<Instant>| {
        record(config, &outcome);
        LinuxRun {
            config,
            outcome,
            wallclock_offset_s: offset.map(|(guest, host)| guest - host),
            host_unix_s: (started_unix_s, offset.map(|(_, host)| host)),
            host_clock_step_s: offset.zip(seen).map(|((_, host), seen)| {
                (host - started_unix_s) - seen.duration_since(start).as_secs_f64()
            }),
            elapsed: start.elapsed(),
            console,
            ending,
        }
    };
    // A boot that never started: nothing printed, nothing measured.
    let unstarted = |outcome: Outcome| done(outcome, String::new(), String::new(), None, None);
    if config.backend == Backend::Kvm {
        if let Some(why) = host::kvm_unavailable(config.arch) {
            return unstarted(Outcome::Skip(why));
        }
    }
    let images = match from {
        Some(i) => i.clone(),
        None => match images(config.arch) {
            Ok((kernel, initrd)) => Images {
                kernel,
                initrd,
                mem_mib: DEFAULT_MEM_MIB,
                hypervisor: false,
                append: String::new(),
            },
            Err(e) => return unstarted(Outcome::Error(e.to_string())),
        },
    };
    let exe = match qemu::emulator(config.arch) {
        Ok(p) => p,
        Err(e) => return unstarted(Outcome::Error(e.to_string())),
    };
    let mut command = match config.pin_cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let mut child = match command
        .args(command_args_for(config, &images))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return unstarted(Outcome::Error(format!("starting {}: {e}", exe.display()))),
    };
    let out = Capture::spawn(child.stdout.take());
    let err = Capture::spawn(child.stderr.take());
    let guard = HangGuard::new(child.id(), timeout, start);
    let mut hang = None;
    let mut status = None;
    let mut report_seen_at = None;
    let mut report_seen_instant = None;
    loop {
        if report_seen_at.is_none() && out.snapshot().contains(END_MARKER) {
            report_seen_at = Some(unix_now());
            report_seen_instant = Some(Instant::now());
        }
        if config.backend == Backend::Kvm && kvm_internal_error(&err.snapshot()).is_some() {
            let _ = child.kill();
        }
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(s)) => {
                status = Some(s);
                break;
            }
            Err(_) => break,
        }
        hang = guard.check();
        if hang.is_some() {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let console = out.finish();
    let stderr = err.finish();
    if report_seen_at.is_none() && console.contains(END_MARKER) {
        report_seen_at = Some(unix_now());
        report_seen_instant = Some(Instant::now());
    }
    let ending = ending(status, hang.as_ref().map(|h| h.to_string()), &stderr);
    let outcome = boot_outcome(config, &console, &stderr, hang.map(|h| h.to_string()));
    let offset = match (&outcome, report_seen_at) {
        (Outcome::Ok(r), Some(host)) => r
            .pointer("/clocks/realtime_unix_ns")
            .and_then(Value::as_f64)
            .map(|g| (g / 1e9, host)),
        _ => None,
    };
    done(outcome, console, ending, offset, report_seen_instant)
}

/// How a QEMU that ended with `status` (None: killed by its guard, which
/// saw `hang`) and wrote `stderr` ended, in one line and the tail of its
/// stderr.
fn ending(status: Option<std::process::ExitStatus>, hang: Option<String>, stderr: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match (status, hang) {
        (_, Some(h)) => format!("QEMU killed by the harness: {h}"),
        (Some(s), None) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("QEMU exited with status {c}"),
            (None, Some(sig)) => format!(
                "QEMU killed by signal {sig} ({}){}",
                signal_name(sig),
                if s.core_dumped() { ", core dumped" } else { "" }
            ),
            (None, None) => format!("QEMU ended: {s}"),
        },
        (None, None) => "QEMU's end unknown (waiting for it failed)".into(),
    };
    if stderr.trim().is_empty() {
        how
    } else {
        format!("{how}; its stderr ends:\n{}", tail(stderr, 6))
    }
}

/// The name of signal `sig` (signal(7)), for the common ones.
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        _ => "another signal",
    }
}

/// The `KVM internal error` line in QEMU's `stderr`, with the faulting
/// instruction's bytes.
fn kvm_internal_error(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.contains(KVM_INTERNAL_ERROR))?;
    // The faulting instruction's bytes: "Code=... <c4> 42 69 f7 ...".
    let insn = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Code="))
        .and_then(|c| c.split_once('<'))
        .map(|(_, rest)| {
            rest.split_whitespace()
                .take(6)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .map(|b| format!(" at instruction bytes <{b}"))
        .unwrap_or_default();
    Some(format!("{line} (emulation failure{insn})"))
}

/// How a boot of `config` that printed `console` and `stderr` ended: the
/// probe's report, or why not (`hang`: what its watchdog saw).
fn boot_outcome(config: Config, console: &str, stderr: &str, hang: Option<String>) -> Outcome {
    let kvm_error = match config.backend {
        Backend::Kvm => kvm_internal_error(stderr),
        _ => None,
    };
    match extract_report(console) {
        Ok(report) => Outcome::Ok(report),
        Err(why) => {
            let detail = format!(
                "{why}{}; console tail:\n{}{}",
                hang.map(|h| format!(" ({h})")).unwrap_or_default(),
                tail(console, 8),
                if stderr.trim().is_empty() {
                    String::new()
                } else {
                    format!("\nstderr tail:\n{}", tail(stderr, 4))
                }
            );
            match (config.backend, kvm_error) {
                // kvm_pvm's recognised failure: a platform limit, reported
                // with its signature, never a failure.
                (Backend::Kvm, Some(e)) if !config.nested && host::kvm_is_pvm() => Outcome::Skip(
                    format!("kvm_pvm: Linux does not boot under this host's KVM: {e}"),
                ),
                // Anything else — a timeout, a crash, a refusal to start —
                // is a failure on kvm as everywhere: only a host limit
                // detected before the boot, or the recognised kvm_pvm
                // signature above, is a SKIP.
                _ => Outcome::Error(detail),
            }
        }
    }
}

/// Record the verdict of a boot of `config` that ended in `outcome`, as
/// `linux LABEL`.
pub fn record(config: Config, outcome: &Outcome) {
    crate::record_verdict(&format!("linux {}", config.label()), &outcome.status());
}

/// A boot of `config` that ran elsewhere (in a nested L1,
/// [`crate::nested`]) and printed `console` and `stderr` in `elapsed`
/// (`hang`: why its watchdog ended it). The host clocks are not this
/// host's: no wall-clock offset. Its verdict is the caller's to record
/// ([`record`]).
pub fn from_output(
    config: Config,
    console: String,
    stderr: &str,
    elapsed: Duration,
    hang: Option<String>,
) -> LinuxRun {
    let outcome = boot_outcome(config, &console, stderr, hang);
    LinuxRun {
        config,
        outcome,
        wallclock_offset_s: None,
        host_unix_s: (unix_now(), None),
        host_clock_step_s: None,
        elapsed,
        console,
        ending: String::new(),
    }
}

/// The value of `path` (a JSON pointer) in a report, as a display string.
fn at(report: &Value, path: &str) -> Option<String> {
    report.pointer(path).map(|v| match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| x.to_string())
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    })
}

/// Whether a line of the report's dmesg contains `needle`.
pub fn dmesg_has(report: &Value, needle: &str) -> bool {
    dmesg_with(report, needle).is_some()
}

/// The dmesg line containing `needle`, from just after the timestamp.
fn dmesg_with(report: &Value, needle: &str) -> Option<String> {
    report
        .get("dmesg")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|l| {
            l.contains(needle)
                .then(|| l.split_once("] ").map_or(l, |(_, t)| t).to_string())
        })
}

/// A `perf` row: an event with an exact expectation shows the difference
/// between the two runs against it; one without (cycles and ref-cycles are
/// time, and the second, longer run may well take fewer of them than the
/// first, which also translated the loop) shows both runs' counts and their
/// signed difference, never an unsigned one that wrapped.
fn event_cell(report: &Value, event: &str) -> String {
    let base = format!("/perf/{event}");
    match report
        .pointer(&format!("{base}/supported"))
        .and_then(Value::as_bool)
    {
        Some(true) => {
            let count = |run: &str| {
                report
                    .pointer(&format!("{base}/count_{run}"))
                    .and_then(Value::as_u64)
            };
            let expected = report
                .pointer(&format!("{base}/expected_delta"))
                .and_then(Value::as_u64);
            match (expected, count("n1"), count("n2")) {
                (None, Some(c1), Some(c2)) => {
                    let d = i128::from(c2) - i128::from(c1);
                    format!("{c1} then {c2} (Δ {d:+})")
                }
                _ => {
                    let delta = at(report, &format!("{base}/delta")).unwrap_or_default();
                    match expected {
                        Some(_)
                            if report.pointer(&format!("{base}/exact"))
                                == Some(&Value::Bool(true)) =>
                        {
                            format!("{delta} (exact)")
                        }
                        Some(e) => format!("{delta} (expected {e})"),
                        None => delta,
                    }
                }
            }
        }
        Some(false) => format!(
            "unsupported (errno {})",
            at(report, &format!("{base}/errno")).unwrap_or_default()
        ),
        None => "-".to_string(),
    }
}

/// What [`Workload::Busy`] reported: `/proc/stat`'s growth over the loops
/// (USER_HZ ticks), per vCPU and summed, and the loops' length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyTimes {
    /// (user, system, steal) ticks of each vCPU.
    pub per_cpu: Vec<(u64, u64, u64)>,
    /// Their sums.
    pub user: u64,
    /// See `user`.
    pub system: u64,
    /// See `user`.
    pub steal: u64,
    /// The guest's time from the start of the loops to the end of the last.
    pub elapsed_ms: u64,
    /// Ticks per second (USER_HZ).
    pub clk_tck: u64,
    /// Local timer interrupts each vCPU took over the loops.
    pub timer_irqs: Vec<u64>,
}

impl BusyTimes {
    /// The `/busy` section of a report, if it has one.
    pub fn from_report(r: &Value) -> Option<BusyTimes> {
        let b = r.get("busy")?;
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
        let per_cpu = b
            .get("per_cpu")?
            .as_array()?
            .iter()
            .map(|c| Some((n(c, "user")?, n(c, "system")?, n(c, "steal")?)))
            .collect::<Option<Vec<_>>>()?;
        Some(BusyTimes {
            user: per_cpu.iter().map(|c| c.0).sum(),
            system: per_cpu.iter().map(|c| c.1).sum(),
            steal: per_cpu.iter().map(|c| c.2).sum(),
            per_cpu,
            elapsed_ms: n(b, "elapsed_ms")?,
            clk_tck: n(b, "clk_tck")?,
            timer_irqs: b
                .get("timer_irqs")?
                .as_array()?
                .iter()
                .filter_map(Value::as_u64)
                .collect(),
        })
    }

    /// Steal's share of the time the guest accounted to the busy vCPUs:
    /// steal / (user + system + steal).
    pub fn steal_share(&self) -> f64 {
        self.steal as f64 / (self.user + self.system + self.steal).max(1) as f64
    }

    /// User + system + steal as a share of what `per_cpu.len()` vCPUs had
    /// over the loops (elapsed time each): below 1 by the ticks the guest
    /// lost.
    pub fn accounted(&self) -> f64 {
        let had = self.per_cpu.len() as u64 * self.elapsed_ms * self.clk_tck;
        (self.user + self.system + self.steal) as f64 * 1000.0 / had.max(1) as f64
    }
}

fn busy_rows(run: &LinuxRun, r: &Value) -> Vec<(&'static str, String)> {
    let Some(b) = BusyTimes::from_report(r) else {
        return vec![("status", "ERROR(no busy report)".into())];
    };
    let loops = match (r.pointer("/busy/iterations"), r.pointer("/busy/busy_ms")) {
        (Some(n), _) => format!("{n} iterations"),
        (_, Some(ms)) => format!("{ms} ms"),
        _ => "-".into(),
    };
    let perf = r.pointer("/busy/perf_first") == Some(&Value::Bool(true));
    vec![
        ("status", format!("OK {:.1}s", run.elapsed.as_secs_f64())),
        (
            "busy loops",
            format!("{loops}{}", if perf { ", after perf" } else { "" }),
        ),
        ("loops took ms", b.elapsed_ms.to_string()),
        (
            "user/system/steal ticks",
            format!("{}/{}/{}", b.user, b.system, b.steal),
        ),
        (
            "per vCPU user/system/steal",
            b.per_cpu
                .iter()
                .map(|(u, s, st)| format!("{u}/{s}/{st}"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        ("steal share", format!("{:.3}", b.steal_share())),
        ("accounted share", format!("{:.3}", b.accounted())),
        (
            "timer interrupts/s per vCPU",
            b.timer_irqs
                .iter()
                .map(|i| (i * 1000 / b.elapsed_ms.max(1)).to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ]
}

/// The table rows: (label, value) for one run.
pub fn rows(run: &LinuxRun) -> Vec<(&'static str, String)> {
    let r = match &run.outcome {
        Outcome::Ok(r) => r,
        Outcome::Skip(why) => return vec![("status", format!("SKIP({why})"))],
        Outcome::Error(why) => {
            return vec![(
                "status",
                format!("ERROR({})", why.lines().next().unwrap_or("")),
            )]
        }
    };
    if r.get("busy").is_some() {
        return busy_rows(run, r);
    }
    let yes_no = |needle: &str| {
        if dmesg_with(r, needle).is_some() {
            "yes"
        } else {
            "no"
        }
        .to_string()
    };
    let sampling_cycles = match r
        .pointer("/sampling_cycles/supported")
        .and_then(Value::as_bool)
    {
        Some(true) => format!(
            "{} samples every {} cycles, {} lost",
            at(r, "/sampling_cycles/samples").unwrap_or_default(),
            at(r, "/sampling_cycles/period").unwrap_or_default(),
            at(r, "/sampling_cycles/lost").unwrap_or_default()
        ),
        _ => format!(
            "unsupported (errno {})",
            at(r, "/sampling_cycles/errno").unwrap_or_default()
        ),
    };
    let sampling = match r.pointer("/sampling/supported").and_then(Value::as_bool) {
        Some(true) => format!(
            "{} samples (~{} expected), {} lost, throttled {}x",
            at(r, "/sampling/samples").unwrap_or_default(),
            at(r, "/sampling/expected_about").unwrap_or_default(),
            at(r, "/sampling/lost").unwrap_or_default(),
            at(r, "/sampling/throttled").unwrap_or_default()
        ),
        _ => format!(
            "unsupported (errno {})",
            at(r, "/sampling/errno").unwrap_or_default()
        ),
    };
    vec![
        ("status", format!("OK {:.1}s", run.elapsed.as_secs_f64())),
        ("kernel", at(r, "/kernel").unwrap_or_default()),
        ("cpus", at(r, "/cpus").unwrap_or_default()),
        (
            "hypervisor detected",
            dmesg_with(r, "Hypervisor detected")
                .map(|l| l.replace("Hypervisor detected: ", ""))
                .or_else(|| dmesg_with(r, "smccc: KVM:").map(|_| "KVM (SMCCC vendor UID)".into()))
                .unwrap_or_else(|| "no".into()),
        ),
        (
            "pmu driver",
            dmesg_with(r, "Performance Events:")
                .or_else(|| dmesg_with(r, "hw perfevents:"))
                .unwrap_or_else(|| "none".into()),
        ),
        (
            "VMCALL from user mode",
            match (
                at(r, "/hypercall_from_user/rax"),
                at(r, "/hypercall_from_user/signal"),
            ) {
                (Some(rax), _) => format!("RAX = {rax}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "-".into(),
            },
        ),
        (
            "clocksource",
            at(r, "/clocksource/current").unwrap_or_default(),
        ),
        (
            "clocksources available",
            at(r, "/clocksource/available").unwrap_or_default(),
        ),
        ("dmesg kvm-clock", yes_no("kvm-clock")),
        // Linux 6.12's kvm_register_steal_time (arch/x86/kernel/kvm.c,
        // pr_fmt "kvm-guest: "): "kvm-guest: stealtime: cpu 1, msr ...";
        // before 5.11 the line began "kvm-stealtime: ", which this matches too.
        ("dmesg steal time registered", yes_no("stealtime: cpu")),
        ("dmesg TSC deadline timer", yes_no("TSC deadline timer")),
        ("dmesg clocksource watchdog", yes_no("timekeeping watchdog")),
        ("dmesg arm-pv", yes_no("arm-pv")),
        (
            "smccc",
            dmesg_with(r, "SMC Calling Convention").unwrap_or_else(|| "-".into()),
        ),
        (
            "smccc trng",
            at(r, "/firmware/smccc_trng").unwrap_or_else(|| "-".into()),
        ),
        ("perf instructions Δ", event_cell(r, "instructions")),
        ("perf branches Δ", event_cell(r, "branches")),
        ("perf cycles (N1 run, N2 run)", event_cell(r, "cycles")),
        (
            "perf ref-cycles (N1 run, N2 run)",
            event_cell(r, "ref-cycles"),
        ),
        ("perf sampling", sampling),
        ("perf sampling cycles", sampling_cycles),
        (
            "steal ms over busy loop",
            at(r, "/steal/total_delta_ms").unwrap_or_default(),
        ),
        (
            "monotonic backwards",
            at(r, "/clocks/monotonic_backwards").unwrap_or_default(),
        ),
        (
            "realtime-monotonic spread ns",
            at(r, "/clocks/realtime_minus_monotonic_spread_ns").unwrap_or_default(),
        ),
        (
            "wall clock - host s",
            run.wallclock_offset_s
                .map_or("-".into(), |o| format!("{o:.2}")),
        ),
    ]
}

/// Side-by-side table for the runs of one architecture: rows = what the
/// probe measured, columns = configurations.
pub fn table(runs: &[&LinuxRun]) -> String {
    let cols: Vec<Vec<(&str, String)>> = runs.iter().map(|r| rows(r)).collect();
    let mut labels: Vec<&str> = Vec::new();
    for c in &cols {
        for (l, _) in c {
            if !labels.contains(l) {
                labels.push(l);
            }
        }
    }
    let lw = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = runs
        .iter()
        .zip(&cols)
        .map(|(r, c)| {
            c.iter()
                .map(|(_, v)| v.chars().count())
                .chain([r.config.label().len()])
                .max()
                .unwrap_or(8)
                .min(60)
        })
        .collect();
    let mut out = format!("{:lw$}", "");
    for (r, w) in runs.iter().zip(&widths) {
        let _ = write!(out, " | {:w$}", r.config.label());
    }
    out.push('\n');
    for l in labels {
        let _ = write!(out, "{:lw$}", l);
        for (c, w) in cols.iter().zip(&widths) {
            let v = c
                .iter()
                .find(|(k, _)| *k == l)
                .map(|(_, v)| v.as_str())
                .unwrap_or("");
            let v: String = v.chars().take(*w).collect();
            let _ = write!(out, " | {v:w$}");
        }
        out.push('\n');
    }
    out
}

/// The runs as one JSON document (for tests and CI).
pub fn to_json(runs: &[LinuxRun]) -> Value {
    Value::Array(
        runs.iter()
            .map(|r| {
                let (status, reason, report) = match &r.outcome {
                    Outcome::Ok(v) => ("ok", Value::Null, v.clone()),
                    Outcome::Skip(w) => ("skip", Value::String(w.clone()), Value::Null),
                    Outcome::Error(w) => ("error", Value::String(w.clone()), Value::Null),
                };
                serde_json::json!({
                    "arch": r.config.arch.name(),
                    "backend": r.config.backend.name(),
                    "smp": r.config.smp,
                    "single_thread": r.config.single_thread,
                    "icount": r.config.icount,
                    "taskset": r.config.pin_cpu,
                    "status": status,
                    "reason": reason,
                    "elapsed_s": r.elapsed.as_secs_f64(),
                    "wallclock_minus_host_s": r.wallclock_offset_s,
                    "report": report,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_qemu_ended_is_said() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        assert_eq!(
            ending(Some(ExitStatus::from_raw(0)), None, ""),
            "QEMU exited with status 0"
        );
        // Killed by SIGABRT (6) with a core: the wait status 6 | 0x80.
        let e = ending(
            Some(ExitStatus::from_raw(6 | 0x80)),
            None,
            "a\nqemu: assertion failed\n",
        );
        assert_eq!(
            e,
            "QEMU killed by signal 6 (SIGABRT), core dumped; its stderr ends:\na\nqemu: assertion failed"
        );
        assert!(
            ending(None, Some("hung".into()), "").starts_with("QEMU killed by the harness: hung")
        );
    }

    #[test]
    fn shards_cover_the_linux_matrix_exactly_once() {
        let backends = [
            (Backend::Tcg, false, false, PmuModel::Default),
            (Backend::Rustkvm, false, false, PmuModel::Default),
            (Backend::Rustkvm, true, false, PmuModel::Default),
            (Backend::Rustkvm, false, false, PmuModel::Intel),
            (Backend::Kvm, false, false, PmuModel::Default),
        ];
        let all = matrix(&Arch::ALL, &backends, &[1, 2], (0, 1));
        // The Intel PMU only on x86: 5 x86 + 4 arm64 configurations, 2 sizes.
        assert_eq!(all.len(), 18);
        for n in 1..=5 {
            let mut seen: Vec<String> = (0..n)
                .flat_map(|i| matrix(&Arch::ALL, &backends, &[1, 2], (i, n)))
                .map(|c| c.label())
                .collect();
            seen.sort();
            let mut want: Vec<String> = all.iter().map(|c| c.label()).collect();
            want.sort();
            assert_eq!(seen, want, "{n} shards");
        }
    }

    fn run_with(console: &str, backend: Backend) -> LinuxRun {
        LinuxRun {
            config: Config {
                arch: Arch::X86_64,
                backend,
                smp: 2,
                single_thread: false,
                icount: false,
                pin_cpu: None,
                workload: Workload::Probe,
                soak_s: 0,
                pmu: PmuModel::Default,
                nested: false,
            },
            outcome: match extract_report(console) {
                Ok(v) => Outcome::Ok(v),
                Err(e) => Outcome::Error(e),
            },
            wallclock_offset_s: Some(0.25),
            host_unix_s: (1.0, Some(2.0)),
            host_clock_step_s: Some(0.0),
            elapsed: Duration::from_secs(5),
            console: console.into(),
            ending: String::new(),
        }
    }

    #[test]
    fn report_extraction_and_errors() {
        let ok = format!("boot\r\n{BEGIN_MARKER}\r\n{{\"a\":1}}\r\n{END_MARKER}\r\n");
        assert_eq!(extract_report(&ok).unwrap(), serde_json::json!({"a": 1}));
        assert!(extract_report("no probe")
            .unwrap_err()
            .contains("never started"));
        assert!(extract_report(&format!("{BEGIN_MARKER}\n{{"))
            .unwrap_err()
            .contains("never ended"));
        let garbled = format!("{BEGIN_MARKER}\n{{\"a\":\n{END_MARKER}\n");
        assert!(extract_report(&garbled).unwrap_err().contains("garbled"));
    }

    #[test]
    fn table_rows_summarise_the_report() {
        let report = r#"{"kernel":"6.12","cpus":2,"clocksource":{"current":"tsc","available":["tsc","hpet"]},
            "dmesg":["[    0.4] Performance Events: PMU not available due to virtualization, using software events only."],
            "perf":{"instructions":{"supported":true,"delta":2000000,"expected_delta":2000000,"exact":true},
                    "branches":{"supported":false,"errno":2}},
            "sampling":{"supported":false,"errno":2},"steal":{"total_delta_ms":0},
            "clocks":{"monotonic_backwards":0,"realtime_minus_monotonic_spread_ns":1000}}"#;
        let console = format!(
            "{BEGIN_MARKER}\n{}\n{END_MARKER}\n",
            report.replace('\n', " ")
        );
        let run = run_with(&console, Backend::Tcg);
        let cells = rows(&run);
        let get = |k: &str| {
            cells
                .iter()
                .find(|(l, _)| *l == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("perf instructions Δ"), "2000000 (exact)");
        assert_eq!(get("perf branches Δ"), "unsupported (errno 2)");
        assert_eq!(get("clocksources available"), "tsc hpet");
        assert!(get("pmu driver").starts_with("Performance Events: PMU not available"));
        assert_eq!(get("dmesg kvm-clock"), "no");
        assert_eq!(get("wall clock - host s"), "0.25");
        let bad = run_with("kernel panic", Backend::Rustkvm);
        assert!(rows(&bad)[0]
            .1
            .starts_with("ERROR(the probe's report never started"));
        let t = table(&[&run, &bad]);
        assert!(
            t.contains("x86_64/tcg/smp2") && t.contains("x86_64/rustkvm/smp2"),
            "{t}"
        );
        let j = to_json(&[run, bad]);
        assert_eq!(j[0]["status"], "ok");
        assert_eq!(j[1]["status"], "error");
    }

    /// Every row of the table, for a report whose answers are known: the
    /// dmesg lines Linux 6.12 prints under rustkvm on x86 (AMD model, two
    /// vCPUs), and perf counts where the second cycles run took fewer
    /// cycles than the first (the table shows a signed difference).
    #[test]
    fn every_row_of_a_known_linux_6_12_report() {
        let report = r#"{"kernel":"6.12.57+deb13-amd64","cpus":2,
            "clocksource":{"current":"kvm-clock","available":["kvm-clock","tsc","acpi_pm"]},
            "dmesg":["[    0.000000] Hypervisor detected: KVM",
                     "[    0.000000] kvm-clock: Using msrs 4b564d01 and 4b564d00",
                     "[    0.051234] kvm-guest: stealtime: cpu 0, msr 7dc2a0c0",
                     "[    0.101000] Performance Events: Fam17h+ 16-deep LBR, core perfctr, AMD PMU driver.",
                     "[    0.120000] kvm-guest: stealtime: cpu 1, msr 7dd2a0c0",
                     "[    0.300000] TSC deadline timer available",
                     "[    1.000000] clocksource: Switched to clocksource kvm-clock"],
            "hypercall_from_user":{"rax":-1},
            "perf":{"instructions":{"supported":true,"count_n1":2000010,"count_n2":4000010,"delta":2000000,"expected_delta":2000000,"exact":true},
                    "branches":{"supported":true,"count_n1":1000003,"count_n2":2000004,"delta":1000001,"expected_delta":1000000,"exact":false},
                    "cycles":{"supported":true,"count_n1":7600000,"count_n2":3800000,"delta":18446744073705751616,"expected_delta":null,"exact":null},
                    "ref-cycles":{"supported":false,"errno":2}},
            "sampling":{"supported":true,"period":100000,"samples":40,"lost":0,"throttled":0,"expected_about":40},
            "sampling_cycles":{"supported":true,"period":1000000,"samples":7,"lost":0},
            "steal":{"total_delta_ms":12},
            "clocks":{"monotonic_backwards":0,"realtime_minus_monotonic_spread_ns":1000}}"#;
        let console = format!(
            "{BEGIN_MARKER}\n{}\n{END_MARKER}\n",
            report.replace('\n', " ")
        );
        let run = run_with(&console, Backend::Rustkvm);
        let want = [
            ("status", "OK 5.0s"),
            ("kernel", "6.12.57+deb13-amd64"),
            ("cpus", "2"),
            ("hypervisor detected", "KVM"),
            (
                "pmu driver",
                "Performance Events: Fam17h+ 16-deep LBR, core perfctr, AMD PMU driver.",
            ),
            ("VMCALL from user mode", "RAX = -1"),
            ("clocksource", "kvm-clock"),
            ("clocksources available", "kvm-clock tsc acpi_pm"),
            ("dmesg kvm-clock", "yes"),
            ("dmesg steal time registered", "yes"),
            ("dmesg TSC deadline timer", "yes"),
            ("dmesg clocksource watchdog", "no"),
            ("dmesg arm-pv", "no"),
            ("smccc", "-"),
            ("smccc trng", "-"),
            ("perf instructions Δ", "2000000 (exact)"),
            ("perf branches Δ", "1000001 (expected 1000000)"),
            (
                "perf cycles (N1 run, N2 run)",
                "7600000 then 3800000 (Δ -3800000)",
            ),
            ("perf ref-cycles (N1 run, N2 run)", "unsupported (errno 2)"),
            (
                "perf sampling",
                "40 samples (~40 expected), 0 lost, throttled 0x",
            ),
            (
                "perf sampling cycles",
                "7 samples every 1000000 cycles, 0 lost",
            ),
            ("steal ms over busy loop", "12"),
            ("monotonic backwards", "0"),
            ("realtime-monotonic spread ns", "1000"),
            ("wall clock - host s", "0.25"),
        ];
        let got = rows(&run);
        let got: Vec<(&str, &str)> = got.iter().map(|(l, v)| (*l, v.as_str())).collect();
        assert_eq!(got, want);
        // Linux before 5.11 said "kvm-stealtime: cpu 0, ..."; a guest
        // without steal time prints neither.
        let old = console.replace("kvm-guest: stealtime", "kvm-stealtime");
        let none = console.replace("kvm-guest: stealtime: cpu", "kvm-guest: setup PV IPIs");
        for (c, yes) in [(old, "yes"), (none, "no")] {
            let r = rows(&run_with(&c, Backend::Rustkvm));
            assert!(
                r.contains(&("dmesg steal time registered", yes.into())),
                "{r:?}"
            );
        }
    }

    #[test]
    fn busy_reports_are_summed_per_vcpu() {
        let console = format!(
            "{BEGIN_MARKER}\n{}\n{END_MARKER}\n",
            r#"{"busy":{"busy_ms":1500,"perf_first":true,"cpus":2,"clk_tck":100,"elapsed_ms":1500,"loop_ms":[1500,1500],"timer_irqs":[375,360],
                "per_cpu":[{"user":70,"system":5,"steal":75,"cpu":0},{"user":72,"system":3,"steal":74,"cpu":1}]}}"#
                .replace('\n', " ")
        );
        let run = run_with(&console, Backend::Rustkvm);
        let Outcome::Ok(r) = &run.outcome else {
            panic!("{:?}", run.outcome)
        };
        let b = BusyTimes::from_report(r).unwrap();
        assert_eq!((b.user, b.system, b.steal), (142, 8, 149));
        assert_eq!(b.per_cpu, vec![(70, 5, 75), (72, 3, 74)]);
        assert!((b.steal_share() - 149.0 / 299.0).abs() < 1e-9);
        assert!((b.accounted() - 299.0 / 300.0).abs() < 1e-9);
        let cells = rows(&run);
        let get = |k: &str| cells.iter().find(|(l, _)| *l == k).map(|(_, v)| v.clone());
        assert_eq!(get("busy loops").as_deref(), Some("1500 ms, after perf"));
        assert_eq!(
            get("timer interrupts/s per vCPU").as_deref(),
            Some("250 240")
        );
        assert_eq!(get("steal share").as_deref(), Some("0.498"));
        assert_eq!(
            BusyTimes::from_report(&serde_json::json!({"steal": {}})),
            None
        );
    }

    #[test]
    fn a_hypervisor_boots_at_el2_with_a_gicv3_on_arm64() {
        let images = |hypervisor| Images {
            kernel: "/k".into(),
            initrd: "/i".into(),
            mem_mib: 512,
            append: String::new(),
            hypervisor,
        };
        let machine = |arch, hypervisor| {
            let a = command_args_for(Config::new(arch, Backend::Rustkvm, 2), &images(hypervisor));
            let i = a.iter().position(|x| x == "-M").expect("-M");
            a[i + 1].clone()
        };
        assert_eq!(
            machine(Arch::Aarch64, true),
            "virt,virtualization=on,gic-version=3"
        );
        assert_eq!(machine(Arch::Aarch64, false), "virt");
        // x86's -cpu max has SVM already.
        assert_eq!(machine(Arch::X86_64, true), "pc");
    }

    #[test]
    fn a_nested_kvm_boot_asks_for_the_cpu_as_declared_and_says_nested() {
        let k = std::path::Path::new("/k");
        let c = Config {
            nested: true,
            ..Config::new(Arch::X86_64, Backend::Kvm, 2)
        };
        let a = command_args(c, k, k);
        let cpu = a
            .iter()
            .position(|x| x == "-cpu")
            .map(|i| a[i + 1].as_str());
        // Not host::kvm_cpu()'s adaptation to this host's KVM: the L1's.
        assert_eq!(cpu, Some("host"));
        assert!(a.iter().any(|x| x == "rustkvm,backend=kvm"), "{a:?}");
        assert_eq!(c.label(), "x86_64/kvm,nested/smp2");
        let pmu = Config {
            pmu: PmuModel::Epyc,
            ..c
        };
        let a = command_args(pmu, k, k);
        assert!(a.iter().any(|x| x == "host,pmu=on"), "{a:?}");
    }

    #[test]
    fn a_boot_that_ran_elsewhere_is_judged_as_one_here() {
        let c = Config {
            nested: true,
            ..Config::new(Arch::X86_64, Backend::Kvm, 2)
        };
        let console = format!("noise\n{BEGIN_MARKER}\n{{\"kernel\": \"6.12\"}}\n{END_MARKER}\n");
        let run = from_output(c, console, "", Duration::from_secs(3), None);
        assert!(matches!(run.outcome, Outcome::Ok(_)), "{:?}", run.outcome);
        assert_eq!(run.wallclock_offset_s, None);
        let hung = from_output(
            c,
            "half a boot\n".into(),
            "KVM internal error. Suberror: 1\n",
            Duration::from_secs(9),
            Some("timed out in L1 after 9 s".into()),
        );
        // An emulation failure in the L1 is a failure, never kvm_pvm's SKIP.
        match hung.outcome {
            Outcome::Error(why) => {
                assert!(why.contains("timed out in L1 after 9 s"), "{why}");
                assert!(why.contains("half a boot"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn busy_workloads_on_the_kernel_command_line() {
        let k = std::path::Path::new("/k");
        let c = Config {
            workload: Workload::Busy {
                amount: BusyAmount::Iterations(300_000_000),
                perf_first: true,
            },
            ..Config::new(Arch::X86_64, Backend::Rustkvm, 2)
        };
        let a = command_args(c, k, k).join(" ");
        assert!(a.ends_with(" rustkvm.busy=300000000,perf"), "{a}");
        let c = Config {
            workload: Workload::Busy {
                amount: BusyAmount::Millis(1500),
                perf_first: false,
            },
            ..c
        };
        assert!(command_args(c, k, k)
            .join(" ")
            .ends_with(" rustkvm.busy=1500ms"));
        assert_eq!(BusyAmount::parse("1500ms"), Some(BusyAmount::Millis(1500)));
        assert_eq!(
            BusyAmount::parse("300000000"),
            Some(BusyAmount::Iterations(300_000_000))
        );
        assert_eq!(BusyAmount::parse("fast"), None);
        assert_eq!(
            Config {
                pin_cpu: Some(0),
                ..c
            }
            .label(),
            "x86_64/rustkvm,taskset=0/smp2"
        );
    }

    #[test]
    fn a_missing_image_names_the_build_step() {
        let err = images_in(std::path::Path::new("/nonexistent"), Arch::Aarch64).unwrap_err();
        assert!(
            err.to_string().contains("scripts/build-linux-guests.sh"),
            "{err}"
        );
    }

    #[test]
    fn command_lines_per_backend() {
        let k = std::path::Path::new("/k");
        let c = Config {
            arch: Arch::X86_64,
            backend: Backend::Kvm,
            smp: 1,
            single_thread: false,
            icount: false,
            pin_cpu: None,
            workload: Workload::Probe,
            soak_s: 0,
            pmu: PmuModel::Default,
            nested: false,
        };
        let a = command_args(c, k, k).join(" ");
        let cpu = if crate::host::kvm_is_pvm() {
            "host,-arch-capabilities"
        } else {
            "host"
        };
        assert!(
            a.contains(&format!("-cpu {cpu} -accel rustkvm,backend=kvm -smp 1")),
            "{a}"
        );
        let c = Config {
            arch: Arch::Aarch64,
            backend: Backend::Rustkvm,
            smp: 2,
            single_thread: true,
            icount: false,
            pin_cpu: None,
            workload: Workload::Probe,
            soak_s: 0,
            pmu: PmuModel::Default,
            nested: false,
        };
        let a = command_args(c, k, k).join(" ");
        assert!(
            a.contains("-M virt -cpu max -accel rustkvm,thread=single -smp 2"),
            "{a}"
        );
        assert_eq!(c.label(), "aarch64/rustkvm,thread=single/smp2");
        assert!(a.contains("console=ttyAMA0"), "{a}");
        let c = Config {
            arch: Arch::X86_64,
            backend: Backend::Rustkvm,
            pmu: PmuModel::Intel,
            ..c
        };
        let a = command_args(c, k, k).join(" ");
        assert!(
            a.contains("-cpu max,vendor=GenuineIntel,pmu=on -accel rustkvm"),
            "{a}"
        );
        assert_eq!(c.label(), "x86_64/rustkvm,thread=single,pmu=intel/smp2");
        let c = Config {
            pmu: PmuModel::Epyc,
            ..c
        };
        assert!(command_args(c, k, k)
            .join(" ")
            .contains("-cpu EPYC,pmu=on -accel"));
        let c = Config {
            pmu: PmuModel::EpycV2,
            ..c
        };
        assert!(command_args(c, k, k)
            .join(" ")
            .contains("-cpu EPYC,perfmon-v2=on,pmu=on -accel"));
        assert_eq!(c.label(), "x86_64/rustkvm,thread=single,pmu=epyc-v2/smp2");
        let c = Config {
            pmu: PmuModel::Default,
            single_thread: false,
            icount: true,
            ..c
        };
        let a = command_args(c, k, k).join(" ");
        assert!(
            a.contains("-accel rustkvm -smp 2 -m 512 -icount shift=0,sleep=off -nodefaults"),
            "{a}"
        );
        assert_eq!(c.label(), "x86_64/rustkvm,icount/smp2");
    }
}
