//! `rustkvm-probe`: print the probe's JSON report between its markers.
//!
//! `rustkvm-probe` runs every check; `rustkvm-probe --lockbench SECONDS
//! THREADS` runs only the lock-heavy workload (scripts/bench-steal-lock.sh),
//! `--tlbbench SECONDS THREADS` only the TLB-heavy one (its report under
//! `lockbench` too);
//! `rustkvm-probe --busy AMOUNT [--perf]` only the steal-share workload
//! (`busy`), after the perf sections with `--perf`; `rustkvm-probe
//! --call-chain ROUNDS` only the known call chain (`chain`), for perf's
//! branch records and call graphs; `--three-instruction-loop ROUNDS CPU`
//! (x86) only that loop, pinned to CPU, printing its instructions'
//! addresses (`loop-ips A B C`), for precise sampling.
//!
//! Two modes print no report, for `scripts/bench-perf-stat.sh`: `--spin N`
//! runs only the workload's two-instruction loop N times (`dec; jnz` /
//! `subs; b.ne`: 2N instructions, N branches), and `--time CMD [ARG...]`
//! runs CMD and prints `time-ns NS steal-ns ST status S` to standard error,
//! NS the monotonic time from before its spawn to after its exit and ST
//! the steal time all CPUs accounted meanwhile (/proc/stat), then exits
//! with CMD's status.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, n] if flag == "--spin" => {
            let Ok(n) = n.parse::<u64>() else {
                eprintln!("rustkvm-probe: --spin wants a count, not {n:?}");
                std::process::exit(2);
            };
            rustkvm_probe::workload::spin(n);
            return;
        }
        [flag, cmd, rest @ ..] if flag == "--time" => {
            let steal = rustkvm_probe::system::steal_ns_total();
            let start = std::time::Instant::now();
            let status = std::process::Command::new(cmd).args(rest).status();
            let ns = start.elapsed().as_nanos();
            let steal = rustkvm_probe::system::steal_ns_total().saturating_sub(steal);
            let code = match status {
                Ok(s) => s.code().unwrap_or(128),
                Err(e) => {
                    eprintln!("rustkvm-probe: --time: cannot run {cmd}: {e}");
                    127
                }
            };
            eprintln!("time-ns {ns} steal-ns {steal} status {code}");
            std::process::exit(code);
        }
        _ => {}
    }
    let report = match args.as_slice() {
        [flag, secs, threads] if flag == "--lockbench" => {
            let secs = secs.parse().unwrap_or(5);
            let threads = threads.parse().unwrap_or(4);
            let mut o = rustkvm_probe::json::Json::obj();
            o.set(
                "lockbench",
                rustkvm_probe::lockbench::run("/tmp/lockbench", threads, secs),
            );
            o
        }
        [flag, secs, threads] if flag == "--tlbbench" => {
            let secs = secs.parse().unwrap_or(5);
            let threads = threads.parse().unwrap_or(4);
            let mut o = rustkvm_probe::json::Json::obj();
            o.set(
                "lockbench",
                rustkvm_probe::lockbench::run_tlb(threads, secs),
            );
            o
        }
        [flag, amount, rest @ ..] if flag == "--busy" => {
            use rustkvm_probe::busy::{run, Amount};
            let amount = Amount::parse(amount).unwrap_or(Amount::Iterations(300_000_000));
            let perf_first = rest.iter().any(|a| a == "--perf");
            let mut o = rustkvm_probe::json::Json::obj();
            o.set("busy", run(amount, perf_first));
            o
        }
        [flag, rounds] if flag == "--call-chain" => {
            let rounds = rounds.parse().unwrap_or(1_000_000);
            let mut o = rustkvm_probe::json::Json::obj();
            o.set(
                "call_chain",
                rustkvm_probe::json::Json::from(rustkvm_probe::chain::rustkvm_chain_a(rounds)),
            );
            o
        }
        #[cfg(target_arch = "x86_64")]
        [flag, rounds, cpu] if flag == "--three-instruction-loop" => {
            let rounds = rounds.parse().unwrap_or(1_000_000);
            let pinned = cpu.parse().map_err(std::io::Error::other);
            if let Err(e) = pinned.and_then(rustkvm_probe::system::pin_to) {
                eprintln!("rustkvm-probe: cannot run on CPU {cpu}: {e}");
                std::process::exit(1);
            }
            let at = rustkvm_probe::chain::three_instruction_loop(rounds);
            println!("loop-ips {:x} {:x} {:x}", at[0], at[1], at[2]);
            rustkvm_probe::json::Json::obj()
        }
        _ => rustkvm_probe::probe(&rustkvm_probe::Options::default()),
    };
    println!(
        "\n{}\n{}\n{}",
        rustkvm_probe::BEGIN_MARKER,
        report.to_string_compact(),
        rustkvm_probe::END_MARKER
    );
}
