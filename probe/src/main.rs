//! `rustkvm-probe`: print the probe's JSON report between its markers.
//!
//! `rustkvm-probe` runs every check; `rustkvm-probe --lockbench SECONDS
//! THREADS` runs only the lock-heavy workload (scripts/bench-steal-lock.sh).

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
        _ => rustkvm_probe::probe(&rustkvm_probe::Options::default()),
    };
    println!(
        "\n{}\n{}\n{}",
        rustkvm_probe::BEGIN_MARKER,
        report.to_string_compact(),
        rustkvm_probe::END_MARKER
    );
}
