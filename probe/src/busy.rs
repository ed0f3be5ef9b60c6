//! The steal-share workload (`rustkvm-probe --busy AMOUNT [--perf]`,
//! kernel command line `rustkvm.busy=AMOUNT[,perf]`): one thread per online
//! CPU, pinned, each running [`crate::workload::spin`] — `AMOUNT` iterations,
//! or with an `ms` suffix for that many milliseconds, all ending together —
//! started together; `/proc/stat`'s per-CPU times and the local timer
//! interrupts (`/proc/interrupts`) before and after.
//!
//! With N busy vCPUs sharing one host CPU each is runnable but not running
//! (N−1)/N of the time, so steal / (user + system + steal) is about
//! (N−1)/N, and user + system + steal about what user + system is without
//! steal time (tcg). `--perf` first runs the probe's perf sections (counting
//! and sampling, `perf stat` and `perf record`'s kinds of use): the report of
//! issue 17 point 5 saw steal swallow user time after them.

use std::fs;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::json::Json;
use crate::system::{online_cpus, pin_to};

/// The `/proc/stat` columns reported, in their order on a `cpuN` line.
pub const COLUMNS: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

/// Per-CPU times from `/proc/stat`: (cpu, the [`COLUMNS`] in USER_HZ ticks).
pub fn parse_proc_stat(stat: &str) -> Vec<(usize, [u64; 8])> {
    stat.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let mut v = [0u64; 8];
            for slot in &mut v {
                *slot = f.next()?.parse().ok()?;
            }
            Some((cpu, v))
        })
        .collect()
}

/// What grew between two [`parse_proc_stat`] readings, per CPU of `after`.
pub fn deltas(before: &[(usize, [u64; 8])], after: &[(usize, [u64; 8])]) -> Vec<(usize, [u64; 8])> {
    after
        .iter()
        .map(|(cpu, a)| {
            let b = before
                .iter()
                .find(|(c, _)| c == cpu)
                .map_or([0; 8], |(_, b)| *b);
            let mut d = [0u64; 8];
            for i in 0..8 {
                d[i] = a[i].saturating_sub(b[i]);
            }
            (*cpu, d)
        })
        .collect()
}

fn times_json(v: &[u64; 8]) -> Json {
    let mut o = Json::obj();
    for (name, x) in COLUMNS.iter().zip(v) {
        o.set(name, *x);
    }
    o
}

/// How much each thread spins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// This many loop iterations.
    Iterations(u64),
    /// Until this long after the start (in chunks of [`CHUNK`] iterations).
    Millis(u64),
}

/// Iterations between two looks at the clock in [`Amount::Millis`].
pub const CHUNK: u64 = 1_000_000;

impl Amount {
    /// `300000000` or `1500ms`.
    pub fn parse(s: &str) -> Option<Amount> {
        match s.strip_suffix("ms") {
            Some(ms) => ms.parse().ok().map(Amount::Millis),
            None => s.parse().ok().map(Amount::Iterations),
        }
    }
}

/// Local timer interrupts per CPU from `/proc/interrupts`: x86's `LOC:`
/// line, arm64's `arch_timer` line(s) summed.
pub fn parse_timer_irqs(interrupts: &str) -> Vec<u64> {
    let mut lines = interrupts.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    let mut out = vec![0u64; cpus];
    for l in lines {
        let mut f = l.split_whitespace();
        let Some(name) = f.next() else { continue };
        if name == "LOC:" || l.contains("arch_timer") {
            for (slot, v) in out.iter_mut().zip(f) {
                *slot += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    out
}

fn timer_irqs() -> Vec<u64> {
    parse_timer_irqs(&fs::read_to_string("/proc/interrupts").unwrap_or_default())
}

/// Run the workload (after the perf sections if `perf_first`) and report.
pub fn run(amount: Amount, perf_first: bool) -> Json {
    let mut o = Json::obj();
    if perf_first {
        o.set("perf", crate::perf_report())
            .set("sampling", crate::sampling_report())
            .set("sampling_cycles", crate::cycles_sampling_report());
    }
    let cpus = online_cpus();
    // Every thread pinned and waiting before the first reading, so the loops
    // start together (the main thread joins the barrier last).
    let start = Arc::new(Barrier::new(cpus.len() + 1));
    let threads: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                // (unpinned, it still spins)
                let _ = pin_to(cpu);
                start.wait();
                let t = Instant::now();
                match amount {
                    Amount::Iterations(n) => crate::workload::spin(n),
                    Amount::Millis(ms) => {
                        let end = t + Duration::from_millis(ms);
                        while Instant::now() < end {
                            crate::workload::spin(CHUNK);
                        }
                    }
                }
                t.elapsed().as_millis() as u64
            })
        })
        .collect();
    let before = parse_proc_stat(&fs::read_to_string("/proc/stat").unwrap_or_default());
    let irqs_before = timer_irqs();
    let t0 = Instant::now();
    start.wait();
    let loop_ms: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap_or(0)).collect();
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let after = parse_proc_stat(&fs::read_to_string("/proc/stat").unwrap_or_default());
    let irqs: Vec<u64> = timer_irqs()
        .iter()
        .zip(irqs_before.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let d = deltas(&before, &after);
    let mut total = [0u64; 8];
    let per_cpu: Vec<Json> = d
        .iter()
        .map(|(cpu, v)| {
            for i in 0..8 {
                total[i] += v[i];
            }
            let mut c = times_json(v);
            c.set("cpu", *cpu);
            c
        })
        .collect();
    match amount {
        Amount::Iterations(n) => o.set("iterations", n),
        Amount::Millis(ms) => o.set("busy_ms", ms),
    };
    o.set("perf_first", perf_first)
        .set("cpus", cpus.len())
        .set("clk_tck", hz)
        .set("elapsed_ms", elapsed_ms)
        .set("loop_ms", loop_ms)
        .set("timer_irqs", irqs)
        .set("per_cpu", Json::Arr(per_cpu))
        .set("total", times_json(&total));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_columns_and_their_growth() {
        let b = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 4 5 6 7 40 0 0\ncpu1 1 2 3 4 5 6 7 59 0 0\nintr 5\n";
        let a = "cpu0 11 2 4 4 5 6 7 90 0 0\ncpu1 31 2 3 4 5 6 8 60 0 0\n";
        let (b, a) = (parse_proc_stat(b), parse_proc_stat(a));
        assert_eq!(b[0], (0, [1, 2, 3, 4, 5, 6, 7, 40]));
        assert_eq!(
            deltas(&b, &a),
            vec![
                (0, [10, 0, 1, 0, 0, 0, 0, 50]),
                (1, [30, 0, 0, 0, 0, 0, 1, 1])
            ]
        );
    }

    #[test]
    fn amounts_are_iterations_or_milliseconds() {
        assert_eq!(
            Amount::parse("300000000"),
            Some(Amount::Iterations(300_000_000))
        );
        assert_eq!(Amount::parse("1500ms"), Some(Amount::Millis(1500)));
        assert_eq!(Amount::parse("ms"), None);
        assert_eq!(Amount::parse("1.5s"), None);
    }

    #[test]
    fn timer_interrupts_per_cpu_on_x86_and_arm64() {
        let x86 = "           CPU0       CPU1\n  0:         44          0   IO-APIC   2-edge      timer\nLOC:       1000       2000   Local timer interrupts\nRES:  5 6 Rescheduling\n";
        assert_eq!(parse_timer_irqs(x86), vec![1000, 2000]);
        let arm = "           CPU0       CPU1\n 10:        700        800     GICv3  27 Level     arch_timer\n 11:  1 1 GICv3 33 Level uart-pl011\n";
        assert_eq!(parse_timer_irqs(arm), vec![700, 800]);
    }

    #[test]
    fn the_report_has_every_cpu_and_the_totals() {
        for amount in [Amount::Iterations(1000), Amount::Millis(20)] {
            let r = run(amount, false).to_string_compact();
            for key in [
                "\"per_cpu\":[",
                "\"total\":{\"user\":",
                "\"steal\":",
                "\"loop_ms\":[",
                "\"timer_irqs\":",
            ] {
                assert!(r.contains(key), "{key} missing in {r}");
            }
        }
    }
}
