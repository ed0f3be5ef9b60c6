//! `rustkvm-probe`: print the probe's JSON report between its markers.
//!
//! `rustkvm-probe` runs every check; `rustkvm-probe --lockbench SECONDS
//! THREADS` runs only the lock-heavy workload (scripts/bench-steal-lock.sh),
//! `--tlbbench SECONDS THREADS` only the TLB-heavy one (its report under
//! `lockbench` too);
//! `rustkvm-probe --busy AMOUNT [--perf]` only the steal-share workload
//! (`busy`), after the perf sections with `--perf`; `rustkvm-probe
//! --call-chain ROUNDS` only the known call chain (`chain`), for perf's
//! branch records and call graphs; `--three-instruction-loop ROUNDS` (x86)
//! only that loop, printing its instructions' addresses (`loop-ips A B C`),
//! for precise sampling.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
        [flag, rounds] if flag == "--three-instruction-loop" => {
            let rounds = rounds.parse().unwrap_or(1_000_000);
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
