//! `rustkvm-linux`: boot Debian's Linux kernels with the rustkvm-probe
//! initramfs on each configuration and print what the guest saw, side by side.
//!
//! ```text
//! rustkvm-linux [--arch A]... [--backend B[,thread=single|icount][,pmu=intel|epyc|epyc-v2|icelake]]... [--smp N]...
//!               [--icount] [--taskset CPU] [--busy AMOUNT[,perf]]
//!               [--timeout S] [--shard i/n] [--junit FILE] [--json] [--nested]
//!               [--differential]
//! rustkvm-linux --kernel PATH --run CMD [--initrd PATH] [--modules DIR]
//!               [--add SRC[:DEST]]... [--packages P[,P]...] [--hypervisor]
//!               [--kvm-modules] [--append ARGS] [--expect PATTERN=pass|fail]... [--arch A] [--backend B]... ...
//! ```
//! With `--kernel`: boot that kernel (its architecture read from the image,
//! or `--arch`) with a userland of busybox, the probe and the Debian
//! `--packages` for its architecture (`scripts/build-userland.sh`), the
//! `--initrd`, `--modules` (a `modules_install` tree) and `--add`ed files
//! on top (DEST defaults to /root/NAME), and run CMD as root after the
//! probe; `--append` adds to the kernel's command line (repeatable);
//! `--kvm-modules` loads the project's L1 kernel's KVM modules first
//! (x86: kvm_amd and its dependencies; arm64's KVM is built in).
//! `--hypervisor` boots it as a hypervisor, for KVM in it (arm64:
//! `virt,virtualization=on,gic-version=3`, EL2; x86's `-cpu max` has
//! SVM). Prints, per configuration, CMD's output and exit status, then
//! the probe's table. CMD is expected to exit 0 everywhere unless
//! `--expect PATTERN=fail` says otherwise for the configurations whose
//! label, or backend part of it (`tcg`, `rustkvm,thread=single`), is
//! PATTERN; exit status 1 if any configuration differs from what was
//! expected or did not finish the command. Default configurations: tcg,
//! rustkvm, rustkvm with one host thread, kvm (SKIP where it cannot run).
//! `--icount`: every configuration under `-icount shift=0,sleep=off`;
//! `--taskset CPU`: QEMU's threads on that host CPU; `--busy`: instead of
//! the probe's checks, a spin loop on every vCPU at once (AMOUNT iterations,
//! or as `1500ms` that long; after the perf sections with `,perf`),
//! reporting `/proc/stat`'s user, system and steal growth
//! (docs/steal-time.md).
//! x86 guests run `-cpu max` (AMD's PMU with PerfMonV2 under rustkvm);
//! `,pmu=intel`: an Intel-vendor CPU with `pmu=on` (the architectural PMU);
//! `,pmu=epyc`: `-cpu EPYC,pmu=on` (AMD's four legacy counters);
//! `,pmu=epyc-v2`: `-cpu EPYC,perfmon-v2=on,pmu=on` (and PerfMonV2's);
//! `,pmu=icelake`: `-cpu Icelake-Server,pdcm=on,ds=on,dtes64=on,pmu=on` (a model whose LBR and PEBS
//! Linux's driver uses). Only x86
//! configurations take it. `,icount`: `-icount shift=0,sleep=off` (VM time
//! counts instructions; one TCG thread).
//! `--nested`: the kvm configurations boot on Linux's own KVM (kvm_amd on
//! x86, KVM/arm64 at EL2 on arm64) inside one rustkvm L1 per architecture
//! (docs/nested.md), labelled `kvm,nested`; the probe only (not `--kernel`).
//! `--differential`: rustkvm and kvm only, and after the table each
//! rustkvm boot beside the kvm boot of the same architecture and vCPUs,
//! row by row (`rustkvm_tests::differential`): a difference outside the
//! declared host-dependent rows fails.
//! Defaults: both architectures; tcg, rustkvm, rustkvm with all vCPUs on one
//! host thread (overcommit: steal time), rustkvm with the Intel PMU (x86),
//! and kvm (which SKIPs with the reason
//! where it cannot run Linux here); 2 vCPUs. Exit status 1 if any
//! configuration ended in ERROR (a SKIP is not an error).

use std::process::ExitCode;
use std::time::Duration;

use rustkvm_tests::boot::{self, BootSpec};
use rustkvm_tests::linux::{self, BusyAmount, Config, Outcome, PmuModel, Workload};
use rustkvm_tests::{differential, nested, Arch, Backend, HarnessError};

struct Args {
    arches: Vec<Arch>,
    backends: Vec<(Backend, bool, bool, PmuModel)>,
    smps: Vec<u32>,
    timeout: Duration,
    json: bool,
    shard: (usize, usize),
    junit: Option<std::path::PathBuf>,
    icount: bool,
    pin_cpu: Option<u32>,
    workload: Workload,
    /// `--kernel` and the rest: boot mode.
    boot: Option<BootSpec>,
    /// `--expect PATTERN=pass|fail`, in order (the last match wins).
    expect: Vec<(String, bool)>,
    /// `--nested`: the kvm configurations on Linux's own KVM inside one
    /// rustkvm L1 (rustkvm_tests::nested).
    nested: bool,
    /// `--differential`: rustkvm beside kvm, row by row.
    differential: bool,
}

/// tcg, rustkvm, rustkvm on one host thread, rustkvm with the Intel PMU
/// (x86), kvm: as (backend, thread=single, icount, PMU model).
fn default_backends() -> Vec<(Backend, bool, bool, PmuModel)> {
    vec![
        (Backend::Tcg, false, false, PmuModel::Default),
        (Backend::Rustkvm, false, false, PmuModel::Default),
        (Backend::Rustkvm, true, false, PmuModel::Default),
        (Backend::Rustkvm, false, false, PmuModel::Intel),
        (Backend::Kvm, false, false, PmuModel::Default),
    ]
}

fn parse() -> Result<Args, HarnessError> {
    let usage = HarnessError::Usage;
    let mut a = Args {
        arches: Vec::new(),
        backends: Vec::new(),
        smps: Vec::new(),
        timeout: linux::DEFAULT_TIMEOUT,
        json: false,
        shard: (0, 1),
        junit: None,
        icount: false,
        pin_cpu: None,
        workload: Workload::Probe,
        boot: None,
        expect: Vec::new(),
        nested: false,
        differential: false,
    };
    let mut spec = BootSpec::default();
    let mut kernel_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |n: &str| it.next().ok_or_else(|| usage(format!("{n} needs a value")));
        match arg.as_str() {
            "--arch" => {
                let v = value("--arch")?;
                a.arches
                    .push(Arch::from_name(&v).ok_or_else(|| usage(format!("unknown arch {v}")))?);
            }
            "--backend" => {
                let v = value("--backend")?;
                let mut parts = v.split(',');
                let name = parts.next().unwrap_or_default();
                let b = Backend::from_name(name)
                    .ok_or_else(|| usage(format!("unknown backend {v}")))?;
                let (mut single, mut icount, mut pmu) = (false, false, PmuModel::Default);
                for opt in parts {
                    match opt {
                        "thread=single" => single = true,
                        "icount" => icount = true,
                        "pmu=intel" => pmu = PmuModel::Intel,
                        "pmu=icelake" => pmu = PmuModel::Icelake,
                        "pmu=epyc" => pmu = PmuModel::Epyc,
                        "pmu=epyc-v2" => pmu = PmuModel::EpycV2,
                        _ => return Err(usage(format!("--backend {v}: unknown option {opt}"))),
                    }
                }
                a.backends.push((b, single, icount, pmu));
            }
            "--smp" => {
                let v = value("--smp")?;
                a.smps.push(
                    v.parse()
                        .ok()
                        .filter(|n| (1..=8).contains(n))
                        .ok_or_else(|| usage(format!("--smp {v}: 1..=8")))?,
                );
            }
            "--timeout" => {
                let v = value("--timeout")?;
                a.timeout = Duration::from_secs(
                    v.parse()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| usage(format!("--timeout {v}: seconds")))?,
                );
            }
            "--icount" => a.icount = true,
            "--taskset" => {
                let v = value("--taskset")?;
                a.pin_cpu = Some(
                    v.parse()
                        .map_err(|_| usage(format!("--taskset {v}: a host CPU number")))?,
                );
            }
            "--busy" => {
                let v = value("--busy")?;
                let (amount, perf_first) = match v.strip_suffix(",perf") {
                    Some(a) => (a, true),
                    None => (v.as_str(), false),
                };
                let amount = BusyAmount::parse(amount)
                    .ok_or_else(|| usage(format!("--busy {v}: ITERATIONS or MILLISms[,perf]")))?;
                a.workload = Workload::Busy { amount, perf_first };
            }
            "--json" => a.json = true,
            "--nested" => a.nested = true,
            "--differential" => a.differential = true,
            "--kernel" => {
                spec.kernel = value("--kernel")?.into();
                kernel_given = true;
            }
            "--initrd" => spec.initrd = Some(value("--initrd")?.into()),
            "--modules" => spec.modules = Some(value("--modules")?.into()),
            "--add" => {
                let v = value("--add")?;
                let (src, dest) = match v.split_once(':') {
                    Some((s, d)) => (s.to_string(), d.to_string()),
                    None => {
                        let name = std::path::Path::new(&v)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .ok_or_else(|| usage(format!("--add {v}: no file name")))?;
                        (v.clone(), format!("/root/{name}"))
                    }
                };
                if !dest.starts_with('/') {
                    return Err(usage(format!("--add {v}: DEST must be absolute")));
                }
                spec.add.push((src.into(), dest));
            }
            "--packages" => spec.packages.extend(
                value("--packages")?
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string),
            ),
            "--run" => spec.run = value("--run")?,
            "--hypervisor" => spec.hypervisor = true,
            "--kvm-modules" => spec.kvm_modules = true,
            "--append" => {
                let v = value("--append")?;
                if !spec.append.is_empty() {
                    spec.append.push(' ');
                }
                spec.append += &v;
            }
            "--expect" => {
                let v = value("--expect")?;
                let (pattern, what) = v
                    .rsplit_once('=')
                    .ok_or_else(|| usage(format!("--expect {v}: PATTERN=pass|fail")))?;
                let pass = match what {
                    "pass" => true,
                    "fail" => false,
                    _ => return Err(usage(format!("--expect {v}: pass or fail"))),
                };
                a.expect.push((pattern.to_string(), pass));
            }
            "--shard" => {
                let v = it
                    .next()
                    .ok_or_else(|| usage("--shard needs i/n".to_string()))?;
                a.shard = rustkvm_tests::report::parse_shard(&v)?;
            }
            "--junit" => {
                let v = it
                    .next()
                    .ok_or_else(|| usage("--junit needs a file".to_string()))?;
                a.junit = Some(v.into());
            }
            "-h" | "--help" => {
                println!("usage: rustkvm-linux [--arch A]... [--backend B[,thread=single|icount][,pmu=intel|epyc|epyc-v2|icelake]]... [--smp N]... [--icount] [--taskset CPU] [--busy AMOUNT[,perf]] [--timeout S] [--shard i/n] [--junit FILE] [--json] [--nested] [--differential]\n  --nested: the kvm backend on real KVM (kvm_amd, KVM/arm64) inside one rustkvm L1 per architecture\n  --differential: rustkvm and kvm row by row; fails on a difference outside the declared host-dependent rows\n       rustkvm-linux --kernel PATH --run CMD [--initrd PATH] [--modules DIR] [--add SRC[:DEST]]... [--packages P[,P]...] [--hypervisor] [--kvm-modules] [--append ARGS] [--expect PATTERN=pass|fail]... [--arch A] [--backend B]... (see the source's header or docs/boot.md)");
                std::process::exit(0);
            }
            other => return Err(usage(format!("unknown argument {other}"))),
        }
    }
    if kernel_given {
        if spec.run.is_empty() {
            return Err(usage("--kernel needs --run CMD".into()));
        }
        if !spec.kernel.is_file() {
            return Err(usage(format!(
                "--kernel {}: no such file",
                spec.kernel.display()
            )));
        }
        match (a.arches.as_slice(), boot::kernel_arch(&spec.kernel)) {
            ([], Ok(arch)) => a.arches = vec![arch],
            ([], Err(e)) => return Err(e),
            ([given], Ok(arch)) if *given != arch => {
                return Err(usage(format!(
                    "--arch {given}, but {} is an {arch} kernel",
                    spec.kernel.display()
                )))
            }
            ([_], _) => {}
            _ => {
                return Err(usage(
                    "--kernel boots one architecture: one --arch at most".into(),
                ))
            }
        }
        if a.backends.is_empty() {
            // The defaults below without the Intel-PMU column.
            a.backends = default_backends()
                .into_iter()
                .filter(|b| b.3 == PmuModel::Default)
                .collect();
        }
        a.boot = Some(spec);
    } else if !spec.run.is_empty()
        || spec.initrd.is_some()
        || spec.modules.is_some()
        || !spec.add.is_empty()
        || !spec.packages.is_empty()
        || !spec.append.is_empty()
        || spec.kvm_modules
        || !a.expect.is_empty()
    {
        return Err(usage(
            "--run, --initrd, --modules, --add, --packages, --append, --kvm-modules and --expect go with --kernel"
                .into(),
        ));
    }
    if a.nested {
        if a.boot.is_some() {
            return Err(usage(
                "--nested boots the probe: --kernel mode does not run nested yet (issue 47)".into(),
            ));
        }
        if !a.backends.is_empty() && !a.backends.iter().any(|b| b.0 == Backend::Kvm) {
            return Err(usage(
                "--nested runs the kvm backend: add --backend kvm".into(),
            ));
        }
        if a.backends
            .iter()
            .any(|b| b.0 == Backend::Kvm && (b.1 || b.2))
        {
            return Err(usage(
                "--nested: thread=single and icount are TCG options, not the kvm backend's".into(),
            ));
        }
    }
    if a.differential {
        if a.boot.is_some() {
            return Err(usage(
                "--differential compares the probe's report: not --kernel".into(),
            ));
        }
        if !a.backends.is_empty() {
            return Err(usage(
                "--differential runs rustkvm and kvm itself: no --backend".into(),
            ));
        }
        a.backends = vec![
            (Backend::Rustkvm, false, false, PmuModel::Default),
            (Backend::Kvm, false, false, PmuModel::Default),
        ];
    }
    if a.arches.is_empty() {
        a.arches = Arch::ALL.to_vec();
    }
    if a.backends.is_empty() {
        a.backends = default_backends();
    }
    if a.smps.is_empty() {
        a.smps = vec![2];
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rustkvm-linux: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(spec) = args.boot.clone() {
        return boot_main(&args, &spec);
    }
    let say = |run: &linux::LinuxRun| {
        let config = run.config;
        if !args.json {
            let status = match &run.outcome {
                Outcome::Ok(_) => "OK".to_string(),
                Outcome::Skip(w) => format!("SKIP({})", w.lines().next().unwrap_or("")),
                Outcome::Error(w) => format!("ERROR({})", w.lines().next().unwrap_or("")),
            };
            eprintln!(
                "{:24} {:6.1}s {status}",
                config.label(),
                run.elapsed.as_secs_f64()
            );
            if let Outcome::Error(w) = &run.outcome {
                eprintln!("{w}");
            }
        }
    };
    let mut runs = Vec::new();
    let mut nested = Vec::new();
    for config in linux::matrix(&args.arches, &args.backends, &args.smps, args.shard) {
        let config = Config {
            // `--icount` for all, or `,icount` for one backend.
            icount: config.icount || args.icount,
            pin_cpu: args.pin_cpu,
            workload: args.workload,
            ..config
        };
        if args.nested && config.backend == Backend::Kvm {
            nested.push((runs.len() + nested.len(), config));
            continue;
        }
        let run = linux::run(config, args.timeout);
        say(&run);
        runs.push(run);
    }
    for &arch in &args.arches {
        let of_arch: Vec<(usize, Config)> = nested
            .iter()
            .copied()
            .filter(|(_, c)| c.arch == arch)
            .collect();
        if of_arch.is_empty() {
            continue;
        }
        let configs: Vec<Config> = of_arch.iter().map(|(_, c)| *c).collect();
        match nested::run_l1(&[], &configs, arch, args.timeout) {
            Ok(r) => {
                for ((at, _), run) in of_arch.iter().zip(r.linux) {
                    say(&run);
                    runs.insert((*at).min(runs.len()), run);
                }
            }
            Err(e) => {
                eprintln!("rustkvm-linux: the nested run: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(path) = &args.junit {
        let cases: Vec<_> = runs
            .iter()
            .map(rustkvm_tests::junit::Case::from_linux)
            .collect();
        if let Err(e) = std::fs::write(path, rustkvm_tests::junit::write("rustkvm-linux", &cases)) {
            eprintln!("rustkvm-linux: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&linux::to_json(&runs)).unwrap_or_default()
        );
    } else {
        for &arch in &args.arches {
            let of_arch: Vec<&linux::LinuxRun> =
                runs.iter().filter(|r| r.config.arch == arch).collect();
            println!(
                "\n{arch} Linux guests: what the probe saw\n{}",
                linux::table(&of_arch)
            );
        }
    }
    let mut differ = 0;
    if args.differential {
        println!("\nrustkvm and real KVM, row by row:");
        for k in runs.iter().filter(|r| r.config.backend == Backend::Kvm) {
            let Some(r) = runs.iter().find(|r| {
                r.config.backend == Backend::Rustkvm
                    && r.config.arch == k.config.arch
                    && r.config.smp == k.config.smp
            }) else {
                continue;
            };
            let c = differential::linux_boot(r, k);
            differ += c.findings();
            print!(
                "{}",
                differential::table(&format!("{} / {}", r.config.label(), k.config.label()), &c)
            );
        }
        println!("differential: {differ} undeclared difference(s)");
    }
    if differ > 0 || runs.iter().any(|r| matches!(r.outcome, Outcome::Error(_))) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether `config`'s command is expected to exit 0.
fn expected_pass(expect: &[(String, bool)], config: &Config) -> bool {
    let label = config.label();
    let backend = label.split('/').nth(1).unwrap_or("");
    expect
        .iter()
        .rev()
        .find(|(p, _)| *p == label || p == backend || label.starts_with(&format!("{p}/")))
        .is_none_or(|&(_, pass)| pass)
}

/// `--kernel` mode: boot the user's kernel in every configuration, run the
/// command, report it and the probe's table.
fn boot_main(args: &Args, spec: &BootSpec) -> ExitCode {
    use rustkvm_tests::junit::{Case, Verdict};

    let arch = args.arches[0];
    let dir = std::env::temp_dir().join(format!("rustkvm-boot-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("rustkvm-linux: {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let initrd = match boot::initramfs(spec, arch, &dir) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rustkvm-linux: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            return ExitCode::from(2);
        }
    };
    let mut runs = Vec::new();
    let mut cases = Vec::new();
    let mut bad = 0;
    for config in linux::matrix(&args.arches, &args.backends, &args.smps, args.shard) {
        let config = Config {
            icount: config.icount || args.icount,
            pin_cpu: args.pin_cpu,
            ..config
        };
        let run = boot::boot(config, spec, &initrd, args.timeout);
        let want_pass = expected_pass(&args.expect, &config);
        let expected = if want_pass { "exit 0" } else { "a failure" };
        let (verdict, line) = match (&run.linux.outcome, &run.command) {
            (Outcome::Skip(why), _) => (Verdict::Skip(why.clone()), format!("SKIP ({why})")),
            (_, Some((_, status))) if (*status == 0) == want_pass => (
                Verdict::Pass,
                format!("PASS: exit {status}, expected {expected}"),
            ),
            (_, Some((_, status))) => {
                let m = format!("exit {status}, expected {expected}");
                (
                    Verdict::Fail {
                        message: m.clone(),
                        detail: run
                            .command
                            .as_ref()
                            .map(|c| c.0.clone())
                            .unwrap_or_default(),
                    },
                    format!("FAIL: {m}"),
                )
            }
            (outcome, None) => {
                let why = match outcome {
                    Outcome::Error(e) => e.clone(),
                    _ => "the command did not finish".to_string(),
                };
                let tail: Vec<&str> = run.linux.console.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                (
                    Verdict::Fail {
                        message: "the command did not finish".into(),
                        detail: format!("{why}\n--- console (tail) ---\n{}", tail.join("\n")),
                    },
                    format!(
                        "FAIL: the command did not finish ({})",
                        why.lines().next().unwrap_or("")
                    ),
                )
            }
        };
        if matches!(verdict, Verdict::Fail { .. }) {
            bad += 1;
        }
        println!(
            "== {} ({:.1}s): {line}",
            config.label(),
            run.linux.elapsed.as_secs_f64()
        );
        if let Some((out, _)) = &run.command {
            println!("{out}");
        }
        rustkvm_tests::record_verdict(
            &format!("boot {}", config.label()),
            &match &verdict {
                Verdict::Pass => rustkvm_tests::Status::Pass,
                Verdict::Skip(w) => rustkvm_tests::Status::Skip(w.clone()),
                Verdict::Fail { message, .. } => rustkvm_tests::Status::Fail(message.clone()),
            },
        );
        cases.push(Case {
            classname: format!("rustkvm.boot.{arch}"),
            name: config.label(),
            time: run.linux.elapsed,
            verdict,
            system_out: run.command.as_ref().map(|c| c.0.clone()),
        });
        runs.push(run.linux);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &args.junit {
        if let Err(e) = std::fs::write(path, rustkvm_tests::junit::write("rustkvm-boot", &cases)) {
            eprintln!("rustkvm-linux: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let all: Vec<&linux::LinuxRun> = runs.iter().collect();
    println!(
        "\n{arch} Linux guests: what the probe saw\n{}",
        linux::table(&all)
    );
    println!("boot: {} configurations, {bad} not as expected", runs.len());
    if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
