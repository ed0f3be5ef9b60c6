//! Linux's own KVM selftests judge rustkvm as the hardware under KVM (issue
//! 48): `scripts/kvm-selftests.sh` boots the L1 (Debian's 6.12 kernel as a
//! hypervisor) on rustkvm and runs the PMU, timer and steal-time selftests
//! in it on real KVM; every verdict is declared in
//! `tests/kvm-selftests.expect` and anything else fails. The whole table,
//! with the tcg columns beside, is docs/testing.md's "KVM's own selftests".

use std::process::Command;
use std::sync::Mutex;

/// One L1 at a time: each takes both of a 2-core machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// Run `scripts/kvm-selftests.sh arch columns...` on the selftests `filter`
/// matches; fail unless every verdict is the declared one.
fn selftests(arch: &str, columns: &[&str], filter: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/kvm-selftests.sh"))
        .arg(arch)
        .args(columns)
        .env("KST_FILTER", filter)
        .output()
        .expect("bash scripts/kvm-selftests.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "kvm-selftests {arch}: {}\n{text}",
        out.status
    );
}

/// x86: kvm_amd on an AMD family 17h model (the Zen family
/// `pmu_event_filter_test` knows) with and without PerfMonV2, the PMU,
/// clock, TSC and steal-time selftests (about 50 s per L1).
#[test]
fn x86_pmu_timer_and_steal_time_selftests_on_kvm_amd_over_rustkvm() {
    selftests(
        "x86_64",
        &["rustkvm,pmu=epyc-v2", "rustkvm,pmu=epyc"],
        "^(steal_time|x86_64/(pmu_event_filter_test|kvm_clock_test|tsc_msrs_test))$",
    );
}

/// arm64: KVM/arm64 at EL2 over rustkvm's PMUv3 and timers, under icount
/// (the timer selftests assert interrupt latencies in guest time, which
/// icount makes the L1's instructions, not the host's speed; 40 s here).
/// `arch_timer_edge_cases` passes so too, in 17 minutes: docs/testing.md.
#[test]
fn arm64_pmu_timer_and_steal_time_selftests_on_kvm_arm64_over_rustkvm() {
    selftests(
        "aarch64",
        &["rustkvm,icount"],
        "^(steal_time|arch_timer|aarch64/vpmu_counter_access)$",
    );
}
