//! `rustkvm-soak MINUTES [--arch A]...`: the soak (`scripts/soak.sh`,
//! docs/testing.md "Soak"). Boots the `soak` guest on 8 vCPUs under
//! `-accel rustkvm` with MTTCG for each architecture (default: x86_64 and
//! aarch64, at the same time), stops/continues and migrates each VM to a
//! file every few seconds, polls `x-query-rustkvm` at 50 Hz, and after
//! MINUTES tells the guests to stop. Prints a summary; exit status 0 only
//! with no violation, crash or other failure.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustkvm_tests::soak::{self, Config, Report};
use rustkvm_tests::{guest, Arch};

/// One line on stderr at a time (both VMs log).
static LOG: Mutex<()> = Mutex::new(());

fn usage() -> ExitCode {
    eprintln!("usage: rustkvm-soak MINUTES [--arch x86_64|aarch64]...");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut minutes = None;
    let mut arches = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--arch" => match args.next().as_deref().and_then(Arch::from_name) {
                Some(arch) => arches.push(arch),
                None => return usage(),
            },
            m => match m.parse::<f64>() {
                Ok(m) if m > 0.0 && minutes.is_none() => minutes = Some(m),
                _ => return usage(),
            },
        }
    }
    let Some(minutes) = minutes else {
        return usage();
    };
    if arches.is_empty() {
        arches = Arch::ALL.to_vec();
    }
    let test = match guest::discover().map(|tests| tests.into_iter().find(|t| t.name == "soak")) {
        Ok(Some(t)) => t,
        Ok(None) => {
            eprintln!("rustkvm-soak: no guest 'soak' in tests/guests/src/bin");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("rustkvm-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    for &arch in &arches {
        if !test.binary(arch).exists() {
            eprintln!(
                "rustkvm-soak: {} not built (scripts/build-guests.sh)",
                test.binary(arch).display()
            );
            return ExitCode::FAILURE;
        }
    }
    let dir = std::env::temp_dir().join(format!("rustkvm-soak-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("rustkvm-soak: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let cfg = Config::new(Duration::from_secs_f64(minutes * 60.0));
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "rustkvm-soak: {minutes} min, {} at once, {} vCPUs each, MTTCG on {host_cpus} host CPUs; \
         x-query-rustkvm every {} ms, stop/cont and migration to a file alternating every {} s",
        arches
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(" + "),
        test.smp,
        cfg.poll_every.as_millis(),
        cfg.action_every.as_secs()
    );
    let started = Instant::now();
    let reports: Vec<(Arch, Report)> = std::thread::scope(|s| {
        let handles: Vec<_> = arches
            .iter()
            .map(|&arch| {
                let (test, cfg, dir) = (&test, &cfg, &dir);
                let log = Box::new(move |line: &str| {
                    let _held = LOG.lock();
                    eprintln!("[{arch}] {line}");
                });
                (arch, s.spawn(move || soak::soak(arch, test, cfg, dir, log)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(arch, h)| {
                let report = h.join().unwrap_or_else(|_| Report {
                    failures: vec!["the soak's thread panicked".to_string()],
                    ..Report::default()
                });
                (arch, report)
            })
            .collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    summarize(minutes, started.elapsed(), &reports)
}

/// Print the summary; the exit status.
fn summarize(minutes: f64, elapsed: Duration, reports: &[(Arch, Report)]) -> ExitCode {
    let sum = |f: fn(&Report) -> u64| reports.iter().map(|(_, r)| f(r)).sum::<u64>();
    let passed = reports.iter().all(|(_, r)| r.passed());
    println!(
        "soak summary ({:.1} min of wall time):",
        elapsed.as_secs_f64() / 60.0
    );
    for (arch, r) in reports {
        let per_vcpu: Vec<String> = r.reads.iter().map(u64::to_string).collect();
        println!(
            "  {arch}: {} — reads {} (per vCPU {}), stop/cont cycles {}, migrations {} \
             (mean {} ms, max {} ms), QMP polls {} ({:.1}/s; round trip mean {} ms, max {} ms), \
             violations {} (guest {}, x-query-rustkvm {}), crashes {}, failures {}",
            if r.passed() { "PASS" } else { "FAIL" },
            r.total_reads(),
            per_vcpu.join(","),
            r.stop_conts,
            r.migrations,
            r.migration_mean().as_millis(),
            r.migration_max.as_millis(),
            r.polls,
            r.polls as f64 / r.elapsed.as_secs_f64().max(1.0),
            r.poll_mean().as_millis(),
            r.poll_max.as_millis(),
            r.violations(),
            r.guest_violations,
            r.host_violations,
            r.crashes,
            r.failures.len()
        );
        for f in r.failures.iter().take(20) {
            println!("    {f}");
        }
        if r.failures.len() > 20 {
            println!("    ... {} more", r.failures.len() - 20);
        }
    }
    let reads: Vec<String> = reports
        .iter()
        .map(|(arch, r)| format!("{arch} {}", r.total_reads()))
        .collect();
    println!(
        "soak: {} minutes={minutes} reads: {} stop/cont cycles={} migrations={} QMP polls={} \
         violations={} crashes={}",
        if passed { "PASS" } else { "FAIL" },
        reads.join(", "),
        sum(|r| r.stop_conts),
        sum(|r| r.migrations),
        sum(|r| r.polls),
        sum(Report::violations),
        sum(|r| r.crashes),
    );
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
