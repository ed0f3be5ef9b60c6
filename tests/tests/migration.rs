//! Streams between QEMUs with and without rustkvm (issue 17.7): a stream
//! saved under rustkvm is refused, with a clear error, by a QEMU without
//! rustkvm (its state travels in KVM's MSR homes, which such a QEMU would
//! load with another meaning), and a stream from stock TCG starts rustkvm's
//! models cleanly (no stale `env->tsc`).
//!
//! Needs `scripts/build-qemu.sh`, `scripts/build-guests.sh` and Debian's
//! stock QEMU 10.0 (`scripts/deps.sh` installs it); a missing one is a
//! failure.

use std::path::PathBuf;

use rustkvm_tests::migrate::{self, Endpoint, Transfer};
use rustkvm_tests::{guest, Arch, Backend, Status, Variant};

fn find_test(name: &str) -> guest::GuestTest {
    guest::discover()
        .expect("guest tests")
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no guest test {name}"))
}

/// Debian's own QEMU 10.0 (no rustkvm).
fn stock_x86() -> PathBuf {
    let p = PathBuf::from("/usr/bin/qemu-system-x86_64");
    assert!(
        p.exists(),
        "{} missing: scripts/deps.sh installs it",
        p.display()
    );
    p
}

#[test]
fn a_rustkvm_stream_is_refused_by_a_qemu_without_rustkvm() {
    let t = find_test("x86-kvmclock-migrate");
    let src = Endpoint::ours(Arch::X86_64, Backend::Rustkvm).expect("built");
    let dst = Endpoint {
        exe: stock_x86(),
        backend: Backend::Tcg,
    };
    for how in [Transfer::Live, Transfer::SaveVm] {
        let r = migrate::move_midway(&t, Arch::X86_64, Variant::Default, &src, &dst, how)
            .expect("moved");
        assert_ne!(
            r.code,
            Some(0),
            "{how:?}: stock QEMU ran the rustkvm stream"
        );
        assert!(
            r.outcome.stderr.contains("'rustkvm'"),
            "{how:?}: the error does not name rustkvm's state: {}\n{}",
            r.outcome.stderr,
            r.outcome.serial
        );
    }
}

#[test]
fn a_stock_tcg_stream_starts_rustkvm_cleanly() {
    let t = find_test("x86-tsc-migrate");
    let src = Endpoint::ours(Arch::X86_64, Backend::Tcg).expect("built");
    let dst = Endpoint::ours(Arch::X86_64, Backend::Rustkvm).expect("built");
    for how in [Transfer::Live, Transfer::SaveVm] {
        let r = migrate::move_midway(&t, Arch::X86_64, Variant::Default, &src, &dst, how)
            .expect("moved");
        assert_eq!(
            r.outcome.status,
            Status::Pass,
            "{how:?}: {}\n{}",
            r.outcome.serial,
            r.outcome.stderr
        );
    }
}

#[test]
fn rustkvm_state_survives_savevm_and_loadvm() {
    // Each guest checks its feature across the move: steal time, kvmclock
    // with the TSC and TSC_ADJUST, the x86 PMU's counters, the arm64 PMU,
    // PV time.
    for (arch, name, variant) in [
        (Arch::X86_64, "x86-steal-migrate", Variant::Default),
        (Arch::X86_64, "x86-kvmclock-migrate", Variant::Default),
        (Arch::X86_64, "x86-pmu-migrate", Variant::Default),
        (Arch::Aarch64, "arm-pmu-migrate", Variant::Default),
        // Under -icount: each of its windows surely holds the other
        // vCPU's turns, however the host schedules QEMU.
        (Arch::Aarch64, "arm-pv-time-migrate", Variant::Icount),
    ] {
        let t = find_test(name);
        let ours = Endpoint::ours(arch, Backend::Rustkvm).expect("built");
        let r =
            migrate::move_midway(&t, arch, variant, &ours, &ours, Transfer::SaveVm).expect("moved");
        assert_eq!(
            r.outcome.status,
            Status::Pass,
            "{name}: {}\n{}",
            r.outcome.serial,
            r.outcome.stderr
        );
    }
}
