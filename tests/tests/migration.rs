//! Moving a VM (issue 17.7): every rustkvm feature survives savevm/loadvm
//! and live migration, checked by a guest whose checks span the move; a
//! stream saved under rustkvm is refused, with a clear error, by a QEMU
//! without rustkvm (its state travels in KVM's MSR homes, which such a QEMU
//! would load with another meaning), and a stream from stock TCG starts
//! rustkvm's models cleanly (no stale `env->tsc`).
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
    // The machine type both releases know (ours may be QEMU 10.2, whose
    // `pc` is pc-i440fx-10.2: stock 10.0 would refuse it for that alone).
    let machine = ["-M".to_string(), "pc-i440fx-10.0".to_string()];
    for how in [Transfer::Live, Transfer::SaveVm] {
        let r = migrate::move_midway_with_args(
            &t,
            Arch::X86_64,
            Variant::Default,
            &[],
            &machine,
            &src,
            &dst,
            how,
        )
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

/// Move `name` from rustkvm to rustkvm by `how`; the destination's run must
/// pass.
fn moved_passes(
    arch: Arch,
    name: &str,
    variant: Variant,
    accel_opts: &[String],
    how: Transfer,
) -> migrate::Resumed {
    let t = find_test(name);
    let ours = Endpoint::ours(arch, Backend::Rustkvm).expect("built");
    let r =
        migrate::move_midway_with(&t, arch, variant, accel_opts, &ours, &ours, how).expect("moved");
    assert_eq!(
        r.outcome.status,
        Status::Pass,
        "{name} ({how:?}): {}\n{}",
        r.outcome.serial,
        r.outcome.stderr
    );
    r
}

#[test]
fn rustkvm_state_survives_savevm_loadvm_and_live_migration() {
    // Each guest keeps its feature busy across the move (it goes on only
    // when the destination sends a byte) and checks it on both sides:
    // steal time, kvmclock with the TSC and TSC_ADJUST, an armed
    // TSC-deadline timer, the x86 PMU's counters with a PMI pending, an
    // EOI made in memory (PV EOI) the APIC has not taken yet, LBR records
    // with recording on across the move, PEBS's registers and a counter
    // that writes its record after it, the arm64
    // PMU, PV time.
    for (arch, name, variant) in [
        (Arch::X86_64, "x86-steal-migrate", Variant::Default),
        (Arch::X86_64, "x86-kvmclock-migrate", Variant::Default),
        (Arch::X86_64, "x86-tsc-deadline-migrate", Variant::Default),
        (Arch::X86_64, "x86-pmu-migrate", Variant::Default),
        (Arch::X86_64, "x86-pv-eoi-migrate", Variant::Default),
        (Arch::X86_64, "x86-lbr-migrate", Variant::Default),
        (Arch::X86_64, "x86-pebs-migrate", Variant::Default),
        (Arch::Aarch64, "arm-pmu-migrate", Variant::Default),
        // Under -icount: each of its windows surely holds the other
        // vCPU's turns, however the host schedules QEMU.
        (Arch::Aarch64, "arm-pv-time-migrate", Variant::Icount),
    ] {
        for how in [Transfer::SaveVm, Transfer::Live] {
            moved_passes(arch, name, variant, &[], how);
        }
    }
}

/// Injected steal (`inject-steal`, docs/steal-time.md) is done once across
/// a move: the schedule not done yet travels in `rustkvm/inject`, so the
/// destination, started as the source was, neither repeats the injection
/// done before the move nor loses the one after it (the guest checks its
/// steal grew by exactly each). (Broken on purpose: `Vm::inject_save`
/// saving nothing, so the stream had no `rustkvm/inject`, failed
/// `second-injection-once-on-the-destination: got 0, want 3000000`.)
#[test]
fn injected_steal_is_done_once_across_a_move() {
    let t = find_test("x86-steal-inject-migrate");
    let ours = Endpoint::ours(Arch::X86_64, Backend::Rustkvm).expect("built");
    let accel = ["inject-steal=0:10ms:1ms/0:100s:3ms:2ms".to_string()];
    let icount = ["-icount".to_string(), "shift=0,sleep=off".to_string()];
    for how in [Transfer::SaveVm, Transfer::Live] {
        let r = migrate::move_midway_with_args(
            &t,
            Arch::X86_64,
            Variant::Default,
            &accel,
            &icount,
            &ours,
            &ours,
            how,
        )
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

/// Where `rustkvm/inject`'s length field is in a stream: after the
/// subsection's marker (QEMU_VM_SUBSECTION, the name's length and the name)
/// and its version (be32). The records follow the length (be32).
fn inject_len_at(stream: &[u8]) -> usize {
    let name = b"\x05\x0erustkvm/inject";
    let at = stream
        .windows(name.len())
        .position(|w| w == name)
        .expect("the stream has rustkvm/inject");
    at + name.len() + 4
}

/// A hostile `rustkvm/inject` subsection is refused by the destination with
/// a clear error and exit status 1 (issue 46): a length beyond the machine's
/// bound (before QEMU allocates it) or not of whole records, a vCPU the
/// machine does not have, a bad state, two overlapping windows of one vCPU,
/// and a length that runs into the section's footer (0x7e, then the
/// section id: read as a record's vCPU 126). The schedule left at
/// the move: vCPU 0's windows at 100 s and 200 s (32-byte records: cpu,
/// state, at, steal, window). (Broken on purpose: without the
/// VMSTATE_VALIDATE the 0xffffffe0 length aborted QEMU in g_malloc, "GLib:
/// failed to allocate 18446744073709551584 bytes" (sign-extended); with
/// decode's window check removed, the overlap loaded and the guest ran.)
#[test]
fn a_hostile_inject_stream_is_refused_with_a_clear_error() {
    let t = find_test("x86-steal-inject-migrate");
    let ours = Endpoint::ours(Arch::X86_64, Backend::Rustkvm).expect("built");
    let accel = ["inject-steal=0:10ms:1ms/0:100s:3ms:2ms/0:200s:1ms:1ms".to_string()];
    let icount = ["-icount".to_string(), "shift=0,sleep=off".to_string()];
    let set_len = |v: u32| {
        move |b: &mut Vec<u8>| {
            let at = inject_len_at(b);
            b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
    };
    // Record r's field at `off` (cpu 0, state 4, at 8, window 24).
    let set_field = |r: usize, off: usize, v: &'static [u8]| {
        move |b: &mut Vec<u8>| {
            let at = inject_len_at(b) + 4 + 32 * r + off;
            b[at..at + v.len()].copy_from_slice(v);
        }
    };
    // 1 ms into vCPU 0's 2 ms window at 100 s.
    const OVERLAP_AT: [u8; 8] = 100_001_000_000u64.to_le_bytes();
    let cases: Vec<(&str, Box<migrate::StreamEdit>, &str)> = vec![
        (
            "a 4 GiB length",
            Box::new(set_len(0xffff_ffe0)),
            "Input validation failed: rustkvm/inject",
        ),
        (
            "a length of no whole records",
            Box::new(set_len(33)),
            "Input validation failed: rustkvm/inject",
        ),
        (
            "a length into the next section",
            Box::new(set_len(96)),
            "vCPU 126 does not exist",
        ),
        (
            "vCPU 99",
            Box::new(set_field(0, 0, &[99, 0, 0, 0])),
            "vCPU 99 does not exist",
        ),
        (
            "state 7",
            Box::new(set_field(1, 4, &[7, 0, 0, 0])),
            "injection state 7",
        ),
        (
            "overlapping windows",
            Box::new(set_field(1, 8, &OVERLAP_AT)),
            "overlaps another of its windows",
        ),
    ];
    for (what, mutate, want) in &cases {
        let r =
            migrate::move_midway_mutated(&t, Arch::X86_64, &accel, &icount, &ours, mutate.as_ref())
                .expect("moved");
        assert!(
            r.code == Some(1) && r.outcome.stderr.contains(want),
            "{what}: exit {:?}, want 1 and {want:?} in:\n{}",
            r.code,
            r.outcome.stderr
        );
    }
}

#[test]
fn the_arm64_counter_offset_survives_savevm_and_live_migration() {
    // 2^63: the guest's counters run near 2^63 (KVM's VM-wide offset, the
    // same on both sides). Afterwards they go on from where they were, and
    // are still offset: near 2^63 plus the few seconds since the first VM
    // was created, not restarted from 0 or offset twice.
    let offset = 1u64 << 63;
    for how in [Transfer::SaveVm, Transfer::Live] {
        let r = moved_passes(
            Arch::Aarch64,
            "arm-counter-migrate",
            Variant::Default,
            &[format!("counter-offset={offset}")],
            how,
        );
        let measure = |key: &str| r.outcome.measure_u64(key);
        let (after, frq) = (measure("cntvct.after"), measure("cntfrq"));
        // 120 s: longer than both runs' time limits together.
        let since_creation = after.wrapping_add(offset);
        assert!(
            since_creation < 120 * frq,
            "{how:?}: counter {after:#x} after the move ({frq:#x} Hz)"
        );
    }
}
