//! `rustkvm-linux`: boot Debian's Linux kernels with the rustkvm-probe
//! initramfs on each configuration and print what the guest saw, side by side.
//!
//! ```text
//! rustkvm-linux [--arch A]... [--backend B[,thread=single]]... [--smp N]... [--pmu] [--timeout S] [--json]
//! ```
//! `--pmu`: x86 guests get an Intel-vendor CPU with `pmu=on`.
//! Defaults: both architectures; tcg, rustkvm, rustkvm with all vCPUs on one
//! host thread (overcommit: steal time), and kvm (which SKIPs with the reason
//! where it cannot run Linux here); 2 vCPUs. Exit status 1 if any
//! configuration ended in ERROR (a SKIP is not an error).

use std::process::ExitCode;
use std::time::Duration;

use rustkvm_tests::linux::{self, Config, Outcome};
use rustkvm_tests::{Arch, Backend, HarnessError};

struct Args {
    arches: Vec<Arch>,
    backends: Vec<(Backend, bool)>,
    smps: Vec<u32>,
    timeout: Duration,
    json: bool,
    pmu: bool,
}

fn parse() -> Result<Args, HarnessError> {
    let usage = HarnessError::Usage;
    let mut a = Args {
        arches: Vec::new(),
        backends: Vec::new(),
        smps: Vec::new(),
        timeout: linux::DEFAULT_TIMEOUT,
        json: false,
        pmu: false,
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
                let (name, single) = match v.strip_suffix(",thread=single") {
                    Some(n) => (n, true),
                    None => (v.as_str(), false),
                };
                let b = Backend::from_name(name)
                    .ok_or_else(|| usage(format!("unknown backend {v}")))?;
                a.backends.push((b, single));
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
            "--json" => a.json = true,
            "--pmu" => a.pmu = true,
            "-h" | "--help" => {
                println!("usage: rustkvm-linux [--arch A]... [--backend B[,thread=single]]... [--smp N]... [--pmu] [--timeout S] [--json]");
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
            (Backend::Tcg, false),
            (Backend::Rustkvm, false),
            (Backend::Rustkvm, true),
            (Backend::Kvm, false),
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
    for &arch in &args.arches {
        for &(backend, single_thread) in &args.backends {
            for &smp in &args.smps {
                let config = Config {
                    arch,
                    backend,
                    smp,
                    single_thread,
                    soak_s: 0,
                    pmu: args.pmu,
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
