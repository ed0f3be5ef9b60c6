//! `rustkvm-linux`: boot Debian's Linux kernels with the rustkvm-probe
//! initramfs on each configuration and print what the guest saw, side by side.
//!
//! ```text
//! rustkvm-linux [--arch A]... [--backend B[,thread=single|icount][,pmu=intel|epyc]]... [--smp N]...
//!               [--icount] [--taskset CPU] [--busy AMOUNT[,perf]]
//!               [--timeout S] [--shard i/n] [--junit FILE] [--json]
//! ```
//! `--icount`: every configuration under `-icount shift=0,sleep=off`;
//! `--taskset CPU`: QEMU's threads on that host CPU; `--busy`: instead of
//! the probe's checks, a spin loop on every vCPU at once (AMOUNT iterations,
//! or as `1500ms` that long; after the perf sections with `,perf`),
//! reporting `/proc/stat`'s user, system and steal growth
//! (docs/steal-time.md).
//! x86 guests run `-cpu max` (AMD's PMU with PerfMonV2 under rustkvm);
//! `,pmu=intel`: an Intel-vendor CPU with `pmu=on` (the architectural PMU);
//! `,pmu=epyc`: `-cpu EPYC,pmu=on` (AMD's four legacy counters). Only x86
//! configurations take it. `,icount`: `-icount shift=0,sleep=off` (VM time
//! counts instructions; one TCG thread).
//! Defaults: both architectures; tcg, rustkvm, rustkvm with all vCPUs on one
//! host thread (overcommit: steal time), rustkvm with the Intel PMU (x86),
//! and kvm (which SKIPs with the reason
//! where it cannot run Linux here); 2 vCPUs. Exit status 1 if any
//! configuration ended in ERROR (a SKIP is not an error).

use std::process::ExitCode;
use std::time::Duration;

use rustkvm_tests::linux::{self, BusyAmount, Config, Outcome, PmuModel, Workload};
use rustkvm_tests::{Arch, Backend, HarnessError};

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
    };
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
                        "pmu=epyc" => pmu = PmuModel::Epyc,
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
                println!("usage: rustkvm-linux [--arch A]... [--backend B[,thread=single|icount][,pmu=intel|epyc]]... [--smp N]... [--icount] [--taskset CPU] [--busy AMOUNT[,perf]] [--timeout S] [--shard i/n] [--junit FILE] [--json]");
                std::process::exit(0);
            }
            other => return Err(usage(format!("unknown argument {other}"))),
        }
    }
    if a.arches.is_empty() {
        a.arches = Arch::ALL.to_vec();
    }
    if a.backends.is_empty() {
        a.backends = vec![
            (Backend::Tcg, false, false, PmuModel::Default),
            (Backend::Rustkvm, false, false, PmuModel::Default),
            (Backend::Rustkvm, true, false, PmuModel::Default),
            (Backend::Rustkvm, false, false, PmuModel::Intel),
            (Backend::Kvm, false, false, PmuModel::Default),
        ];
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
    let mut runs = Vec::new();
    for config in linux::matrix(&args.arches, &args.backends, &args.smps, args.shard) {
        let config = Config {
            // `--icount` for all, or `,icount` for one backend.
            icount: config.icount || args.icount,
            pin_cpu: args.pin_cpu,
            workload: args.workload,
            ..config
        };
        let run = linux::run(config, args.timeout);
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
        runs.push(run);
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
    if runs.iter().any(|r| matches!(r.outcome, Outcome::Error(_))) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
