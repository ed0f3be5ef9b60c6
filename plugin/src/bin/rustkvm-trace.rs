//! `rustkvm-trace`: convert the plugin's `trace=` file (crate::trace's
//! binary format) to text or JSON Lines.
//!
//! ```text
//! rustkvm-trace [--json] TRACE [OUT]      OUT defaults to standard output
//! ```

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::process::ExitCode;

use rustkvm_plugin::trace::{convert, Output};

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
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustkvm-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
