//! The kvm column for real: bundled guests on Linux's own KVM (kvm_amd on
//! x86, KVM/arm64 at EL2 on arm64) inside a rustkvm L1 of each architecture
//! (`rustkvm_tests::nested`, one L1 boot each), each held to its declared
//! kvm (and kvm-nested) outcome, then Linux with the probe in the same L1.
//! scripts/test-nested.sh runs it and every guest this way.
//!
//! In the test command since the nested start hang was found (an interrupt
//! L1's KVM injected was delivered twice, patch 0050; docs/nested.md): 10
//! runs in a row with two busy loops beside them passed.

use rustkvm_tests::linux::{self, Outcome};
use rustkvm_tests::{
    differential, guest, nested, run, run::Status, Arch, Backend, RunResult, Variant,
};
use serde_json::Value;
use std::time::Duration;

/// A subset within the test command's budget (about 15 s): the PV
/// interface, kvmclock, steal time and the preempted hint, the TSC-deadline
/// timer, PV TLB flush, PV EOI (KVM's bit a hint it takes back at any
/// exit: docs/nested.md), AMD's PMU (L1's KVM counts the nested guest with
/// GuestOnly counters of rustkvm's PMU), an Intel-PMU guest, which KVM on
/// this AMD L1 does not offer (declared SKIP), and a guest that is itself a
/// hypervisor (EVENTINJ delivered once, on kvm_amd's nested SVM).
const SUBSET: &[&str] = &[
    "hello",
    "x86-kvm-pv",
    "x86-kvm-pv-smp",
    "x86-kvmclock",
    "x86-steal-time",
    "x86-tsc-deadline",
    "x86-pv-tlb-flush",
    "x86-pv-eoi",
    "x86-pmu-amd",
    "x86-pmu",
    "x86-svm-event-inj",
];

/// arm64's subset: PSCI and SMCCC as KVM/arm64 answers them (TRNG, the
/// HVC path), PV stolen time, two vCPUs, the timers through GICv3, and
/// KVM's vPMU over rustkvm's PMUv3 with EL2 told apart: counts, events,
/// CHAIN, EL0 access through MDCR_EL2.TPM, the overflow interrupt (also
/// after a fault, as an NMI, and reset by CPU_ON), routing; arm-pmu-el2
/// and arm-counter-el2 SKIP on this L1 (its KVM gives guests no EL2).
/// Still open: docs/nested.md.
const ARM64_SUBSET: &[&str] = &[
    "hello",
    "smp",
    "arm-pv-time",
    "arm-smccc-trng",
    "arm-hvc-cost",
    "arm-timer",
    "arm-pmu",
    "arm-pmu-chain",
    "arm-pmu-el0",
    "arm-pmu-events",
    "arm-pmu-irq",
    "arm-pmu-unwind",
    "arm-pmu-cpu-on",
    "arm-pmu-routing",
    "arm-pmu-nmi",
    "arm-pmu-el2",
    "arm-counter-el2",
];

/// Run `subset` (default variant), the `introspect` guest and one Linux
/// boot (two vCPUs) in one L1 of `arch`; fail on any guest that failed its
/// declaration and on an `x-query-rustkvm` answer of real KVM's backend
/// that is not what `introspect` set; how many of `subset` passed, their
/// results and the Linux run.
fn run_subset(arch: Arch, subset: &[&str]) -> (usize, Vec<RunResult>, linux::LinuxRun) {
    // One L1 at a time: each takes both of a 2-core machine's cores.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tests = guest::discover().expect("guests");
    let cells: Vec<(&guest::GuestTest, Variant)> = subset
        .iter()
        .chain(&["introspect"])
        .map(|n| {
            let t = tests
                .iter()
                .find(|t| t.name == *n)
                .unwrap_or_else(|| panic!("no guest {n}"));
            (t, Variant::Default)
        })
        .collect();
    // The same L1 then boots Linux with the probe on its KVM (two vCPUs).
    let boot = [linux::Config::new(arch, Backend::Kvm, 2)];
    let mut l1 =
        nested::run_l1(&cells, &boot, arch, Duration::from_secs(120)).expect("the nested run");
    let mut results = l1.guests;
    assert_eq!(results.len(), subset.len() + 1);
    assert_eq!(l1.linux.len(), 1);
    let at = results.iter().position(|r| r.test == "introspect");
    let introspect = results.remove(at.expect("introspect's result"));
    introspection_on_real_kvm(arch, &introspect, &l1.queries);
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| match &r.outcome.status {
            Status::Fail(why) => Some(format!(
                "{}: {why}\n--- serial\n{}\n--- stderr\n{}",
                r.test, r.outcome.serial, r.outcome.stderr
            )),
            _ => None,
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    // Not all SKIPs: real KVM ran the guests.
    let passed = results
        .iter()
        .filter(|r| r.outcome.status == Status::Pass)
        .count();
    (passed, results, l1.linux.remove(0))
}

/// `x-query-rustkvm` under `backend=kvm` on Linux's own KVM (x86: KVM_GET_MSRS;
/// arm64: the registers QEMU synchronizes and KVM's PV time IPA) says what
/// the `introspect` guest set (`rustkvm_tests::introspect`), and the guest
/// passed: it was released by the query's side.
fn introspection_on_real_kvm(
    arch: Arch,
    r: &RunResult,
    queries: &[(String, Result<Value, String>)],
) {
    let ctx = format!(
        "introspect/{arch} nested: {:?}\n--- serial\n{}\n--- stderr\n{}",
        r.outcome.status, r.outcome.serial, r.outcome.stderr
    );
    assert_eq!(r.outcome.status, Status::Pass, "{ctx}");
    let q = match queries.iter().find(|(n, _)| n == "introspect") {
        Some((_, Ok(q))) => q,
        Some((_, Err(why))) => panic!("{why}\n{ctx}"),
        None => panic!("introspect was not queried\n{ctx}"),
    };
    let measures = r.outcome.measures.iter().cloned().collect();
    let bad = rustkvm_tests::introspect::check(arch, Backend::Kvm, q, &measures);
    assert!(bad.is_empty(), "wrong: {bad:?}\n{q}\n{ctx}");
    // Real KVM gives these guests a PMU (kvm_amd's over rustkvm's
    // PerfMonV2 on x86 needs the model to offer one: measured, not assumed).
    if arch == Arch::Aarch64 {
        assert_eq!(r.outcome.measure("pmu"), "counting", "{ctx}");
    }
}

/// The differential check (docs/nested.md): each of `nested` (real KVM's
/// results) and the `linux` boot beside the same on rustkvm at this level,
/// field by field; fails on any difference not declared.
fn same_as_rustkvm(nested: &[RunResult], linux: &linux::LinuxRun) {
    let tests = guest::discover().expect("guests");
    let mut findings = Vec::new();
    for k in nested {
        let t = tests.iter().find(|t| t.name == k.test).expect("a guest");
        let r = run::run(t, k.arch, Variant::Default, Backend::Rustkvm).expect("the rustkvm run");
        let c = differential::guest(t, &r, k, true);
        if c.findings() > 0 {
            findings.push(differential::table(&format!("{}/{}", k.test, k.arch), &c));
        }
    }
    let r = linux::run(
        linux::Config::new(linux.config.arch, Backend::Rustkvm, linux.config.smp),
        linux::DEFAULT_TIMEOUT,
    );
    let c = differential::linux_boot(&r, linux);
    if c.findings() > 0 {
        findings.push(differential::table("linux", &c));
    }
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}

#[test]
fn x86_guests_meet_their_declarations_on_real_kvm_nested_in_rustkvm() {
    let (passed, results, linux) = run_subset(Arch::X86_64, SUBSET);
    linux_on_real_kvm(&linux);
    same_as_rustkvm(&results, &linux);
    assert_eq!(
        passed,
        SUBSET.len() - 1,
        "only x86-pmu is declared SKIP here"
    );
}

#[test]
fn arm64_guests_meet_their_declarations_on_real_kvm_arm64_nested_in_rustkvm() {
    let (passed, results, linux) = run_subset(Arch::Aarch64, ARM64_SUBSET);
    assert_eq!(
        passed,
        ARM64_SUBSET.len() - 2,
        "only arm-pmu-el2 and arm-counter-el2 SKIP here (L1's KVM gives guests no EL2)"
    );
    arm64_linux_on_real_kvm(&linux);
    same_as_rustkvm(&results, &linux);
}

/// A nested Linux run's label and probe report (panics if it has none).
fn report(run: &linux::LinuxRun) -> (String, &Value) {
    let label = run.config.label();
    match &run.outcome {
        Outcome::Ok(r) => (label, r),
        other => panic!("{label}: {other:?}\n{}", run.console),
    }
}

/// Linux nested on KVM/arm64 at EL2 of a rustkvm L1: KVM's SMCCC vendor
/// UID, the PMUv3 driver over KVM's PMU emulation (perf events of L1's
/// kernel on rustkvm's PMUv3), counting the probe's loop exactly, and KVM's
/// PV stolen time.
fn arm64_linux_on_real_kvm(run: &linux::LinuxRun) {
    let (label, r) = report(run);
    let dmesg_has = |needle: &str| linux::dmesg_has(r, needle);
    for needle in ["smccc: KVM:", "armv8_pmuv3 PMU driver", "arm-pv"] {
        assert!(dmesg_has(needle), "{label}: {needle}: {}", r["dmesg"]);
    }
    linux::assert_perf_counts_exactly(r, &label);
}

/// Linux nested on real KVM, whose vPMU programs rustkvm's PMU (GuestOnly
/// counters, as kvm_amd does) and whose answers are KVM's own.
fn linux_on_real_kvm(run: &linux::LinuxRun) {
    let (label, r) = report(run);
    let dmesg_has = |needle: &str| linux::dmesg_has(r, needle);
    assert!(
        dmesg_has("Hypervisor detected: KVM"),
        "{label}: {}",
        r["dmesg"]
    );
    assert!(dmesg_has("AMD PMU driver"), "{label}: {}", r["dmesg"]);
    assert_eq!(
        r.pointer("/clocksource/current").and_then(Value::as_str),
        Some("kvm-clock"),
        "{label}"
    );
    linux::assert_perf_counts_exactly(r, &label);
    // KVM on an AMD host: VMCALL from user mode is #GP (SIGSEGV), which
    // rustkvm now answers too (tests/tests/linux.rs).
    assert_eq!(
        r.pointer("/hypercall_from_user/signal"),
        Some(&Value::from(11)),
        "{label}: {}",
        r["hypercall_from_user"]
    );
}
