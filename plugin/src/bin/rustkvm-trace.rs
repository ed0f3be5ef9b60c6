//! `rustkvm-trace`: convert the plugin's `trace=` file (crate::trace's
//! binary format) to text or JSON Lines.
//!
//! ```text
//! rustkvm-trace [--json] TRACE [OUT]      OUT defaults to standard output
//! ```
//!
//! Exit status 0: the trace is complete (its end record counts what was
//! read). 1: it is truncated (converted up to where it breaks off) or the
//! plugin could not record some executions (its end record says how
//! many); stderr says which. 2: bad arguments or files.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::process::ExitCode;

use rustkvm_plugin::trace::{convert, End, Output};

fn main() -> ExitCode {
    let mut format = Output::Text;
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--json" | "--jsonl" => format = Output::JsonLines,
            "-h" | "--help" => {
                println!("usage: rustkvm-trace [--json] TRACE [OUT]");
                return ExitCode::SUCCESS;
            }
            _ => files.push(a),
        }
    }
    let (Some(input), out) = (files.first(), files.get(1)) else {
        eprintln!("usage: rustkvm-trace [--json] TRACE [OUT]");
        return ExitCode::from(2);
    };
    let input = match File::open(input) {
        Ok(f) => BufReader::new(f),
        Err(e) => {
            eprintln!("rustkvm-trace: {input}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out: Box<dyn Write> = match out {
        Some(p) => match File::create(p) {
            Ok(f) => Box::new(BufWriter::new(f)),
            Err(e) => {
                eprintln!("rustkvm-trace: {p}: {e}");
                return ExitCode::from(2);
            }
        },
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    match convert(input, &mut out, format).and_then(|n| out.flush().map(|()| n)) {
        Ok(s) => match s.end {
            End::Complete { lost: 0 } => ExitCode::SUCCESS,
            End::Complete { lost } => {
                eprintln!(
                    "rustkvm-trace: incomplete trace: the plugin could not record {lost} executions or accesses (its messages on QEMU's stderr say why)"
                );
                ExitCode::FAILURE
            }
            End::Truncated(why) => {
                eprintln!(
                    "rustkvm-trace: truncated trace: {why}; converted the {} records before",
                    s.records
                );
                ExitCode::FAILURE
            }
            End::V1 => {
                eprintln!("rustkvm-trace: a version 1 trace: it has no end record, so whether it is complete is unknown");
                ExitCode::SUCCESS
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            eprintln!("rustkvm-trace: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("rustkvm-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
