//! `rustkvm-probe`: print the probe's JSON report between its markers.

fn main() {
    let report = rustkvm_probe::probe(&rustkvm_probe::Options::default());
    println!(
        "\n{}\n{}\n{}",
        rustkvm_probe::BEGIN_MARKER,
        report.to_string_compact(),
        rustkvm_probe::END_MARKER
    );
}
