//! `rustkvm-run`: boot the bundled guests on every backend and report.
//!
//! ```text
//! rustkvm-run [--arch A]... [--backend B]... [--variant V]... [--shard i/n]
//!             [--tap] [--junit FILE] [--quiet] [--nested] [--differential]
//!             [FILTER]
//! ```
//! Backends: `tcg` (stock TCG, the reference), `rustkvm` (`-accel rustkvm`,
//! backend=tcg), `kvm` (`-accel rustkvm,backend=kvm`: the host's KVM, in the
//! default variant only; SKIP with the reason where this host cannot).
//! Prints a table (test/arch/variant × backend → PASS/FAIL/SKIP(reason)),
//! what each guest measured under rustkvm, and any line where rustkvm's
//! answers differ from tcg's. Exits 1 if anything failed or differed.
//!
//! `--differential` runs rustkvm and kvm (default variant; with `--nested`,
//! real KVM inside a rustkvm L1) and shows each guest's fields side by side
//! (`rustkvm_tests::differential`): a difference the guest does not declare
//! host-dependent fails the run.

use std::process::ExitCode;

use rustkvm_tests::differential;
use rustkvm_tests::report::{self, Selection};
use rustkvm_tests::{guest, Arch, Backend, HarnessError, RunResult, Variant};

/// The command line.
struct Args {
    sel: Selection,
    tap: bool,
    quiet: bool,
    /// Where `--junit` writes, if asked.
    junit: Option<std::path::PathBuf>,
    nested: bool,
    differential: bool,
}

fn parse_args() -> Result<Args, HarnessError> {
    let mut sel = Selection {
        arches: Vec::new(),
        backends: Vec::new(),
        variants: Vec::new(),
        ..Selection::default()
    };
    let (mut tap, mut quiet, mut nested, mut differential) = (false, false, false, false);
    let mut junit = None;
    let mut args = std::env::args().skip(1);
    let usage = |m: String| HarnessError::Usage(m);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| usage(format!("{name} needs a value")))
        };
        match a.as_str() {
            "--arch" => {
                let v = value("--arch")?;
                sel.arches.push(
                    Arch::from_name(&v)
                        .ok_or_else(|| usage(format!("unknown arch {v} (x86_64, aarch64)")))?,
                );
            }
            "--backend" => {
                let v = value("--backend")?;
                sel.backends
                    .push(Backend::from_name(&v).ok_or_else(|| {
                        usage(format!("unknown backend {v} (tcg, rustkvm, kvm)"))
                    })?);
            }
            "--variant" => {
                let v = value("--variant")?;
                sel.variants.push(Variant::from_name(&v).ok_or_else(|| {
                    usage(format!(
                        "unknown variant {v} (default, mttcg-smp2, rr-smp2, icount)"
                    ))
                })?);
            }
            "--shard" => sel.shard = report::parse_shard(&value("--shard")?)?,
            "--tap" => tap = true,
            "--junit" => junit = Some(std::path::PathBuf::from(value("--junit")?)),
            "--quiet" => quiet = true,
            "--nested" => nested = true,
            "--differential" => differential = true,
            "-h" | "--help" => {
                println!("usage: rustkvm-run [--arch A]... [--backend B]... [--variant V]... [--shard i/n] [--tap] [--junit FILE] [--quiet] [--nested] [--differential] [FILTER]\n  --nested: the kvm backend on real KVM inside one rustkvm L1 per architecture (x86_64: kvm_amd; aarch64: KVM/arm64 at EL2, with RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh)\n  --differential: rustkvm and kvm (default variant) field by field; fails on a difference a guest does not declare (kvm-vary)");
                std::process::exit(0);
            }
            f if !f.starts_with('-') && sel.filter.is_none() => sel.filter = Some(f.to_string()),
            other => return Err(usage(format!("unknown argument {other}"))),
        }
    }
    if nested && !sel.backends.is_empty() && !sel.backends.contains(&Backend::Kvm) {
        return Err(usage(
            "--nested runs the kvm backend: add --backend kvm".into(),
        ));
    }
    if differential {
        if !(sel.backends.is_empty()
            || (sel.backends.contains(&Backend::Rustkvm) && sel.backends.contains(&Backend::Kvm)))
        {
            return Err(usage(
                "--differential compares rustkvm with kvm: no --backend, or both".into(),
            ));
        }
        if sel.variants.iter().any(|v| *v != Variant::Default) {
            return Err(usage(
                "--differential runs the default variant (kvm's only one)".into(),
            ));
        }
        sel.backends = vec![Backend::Rustkvm, Backend::Kvm];
        sel.variants = vec![Variant::Default];
    }
    if sel.arches.is_empty() {
        sel.arches = Arch::ALL.to_vec();
    }
    if sel.backends.is_empty() {
        sel.backends = Backend::ALL.to_vec();
    }
    if sel.variants.is_empty() {
        sel.variants = Variant::ALL.to_vec();
    }
    Ok(Args {
        sel,
        tap,
        quiet,
        junit,
        nested,
        differential,
    })
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rustkvm-run: {e}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<ExitCode, HarnessError> {
    let Args {
        sel,
        tap,
        quiet,
        junit,
        nested,
        differential,
    } = parse_args()?;
    let tests = guest::discover()?;
    let progress = |r: &RunResult| {
        if !quiet && !tap {
            eprintln!(
                "{:10} {:8} {:11} {:8} {}",
                r.test,
                r.arch.name(),
                r.variant.name(),
                r.backend.name(),
                r.outcome.status.label()
            );
        }
    };
    let results = if nested {
        report::run_matrix_nested(&tests, &sel, progress)?
    } else {
        report::run_matrix(&tests, &sel, progress)?
    };
    if let Some(path) = &junit {
        let cases: Vec<_> = results
            .iter()
            .map(rustkvm_tests::junit::Case::from_guest)
            .collect();
        std::fs::write(path, rustkvm_tests::junit::write("rustkvm-guests", &cases)).map_err(
            |source| HarnessError::Io {
                what: format!("writing {}", path.display()),
                source,
            },
        )?;
    }
    if tap {
        print!("{}", report::tap(&results));
    } else {
        println!();
        print!("{}", report::table(&results));
        if !quiet {
            print_measures(&results);
        }
    }
    let mut differ = 0;
    // rustkvm must answer as tcg does line for line (outside what each test
    // marks as differing); kvm is real hardware with its own CPU model.
    for r in results.iter().filter(|r| r.backend == Backend::Rustkvm) {
        let Some(reference) = counterpart(&results, r, Backend::Tcg) else {
            continue;
        };
        let test = test_of(&tests, r);
        if !test.compare {
            continue;
        }
        for d in report::differences(test, reference, r) {
            differ += 1;
            println!("DIFF {}/{}/{}: {d}", r.test, r.arch, r.variant);
        }
    }
    if differential {
        println!(
            "\nrustkvm and real KVM{}, field by field:",
            if nested { " (nested)" } else { "" }
        );
        for r in results.iter().filter(|r| r.backend == Backend::Kvm) {
            let Some(reference) = counterpart(&results, r, Backend::Rustkvm) else {
                continue;
            };
            let c = differential::guest(test_of(&tests, r), reference, r, nested);
            differ += c.findings();
            print!(
                "{}",
                differential::table(&format!("{}/{}", r.test, r.arch), &c)
            );
        }
        println!("differential: {differ} undeclared difference(s)");
    }
    let (_, failed, _) = report::counts(&results);
    Ok(if failed == 0 && differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The result of `r`'s guest, architecture and variant on `backend`.
fn counterpart<'a>(
    results: &'a [RunResult],
    r: &RunResult,
    backend: Backend,
) -> Option<&'a RunResult> {
    results.iter().find(|t| {
        t.backend == backend && t.test == r.test && t.arch == r.arch && t.variant == r.variant
    })
}

/// The discovered test a result is of.
fn test_of<'a>(tests: &'a [guest::GuestTest], r: &RunResult) -> &'a guest::GuestTest {
    tests
        .iter()
        .find(|t| t.name == r.test)
        .expect("result of a discovered test")
}

/// What the guests measured in the default variant (under rustkvm, or
/// under the only backend that ran), and which routing points they reached.
fn print_measures(results: &[RunResult]) {
    let backend = if results.iter().any(|r| r.backend == Backend::Rustkvm) {
        Backend::Rustkvm
    } else {
        match results.first() {
            Some(r) => r.backend,
            None => return,
        }
    };
    println!("\nwhat the guests measured under -accel {backend} (default variant):");
    for r in results
        .iter()
        .filter(|r| r.backend == backend && r.variant == Variant::Default)
    {
        println!("  {}/{}:", r.test, r.arch);
        for (k, v) in &r.outcome.measures {
            println!("    {k:32} {v}");
        }
        if backend != Backend::Rustkvm {
            continue;
        }
        let routes: Vec<String> = r
            .outcome
            .routes
            .iter()
            .filter(|(k, v)| **v > 0 && k.as_str() != "resets")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("    {:32} {}", "(routed into rustkvm)", routes.join(" "));
    }
}
