//! `x-query-rustkvm` held to what the `introspect` guest set: the guest's
//! own `measure` lines are the oracle (the GPAs it registered, the timer it
//! armed, the counter it started, its ID register), on every backend and
//! nested (tests/tests/guests.rs, tests/tests/nested.rs; the schema is
//! docs/introspection.md).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{Arch, Backend};

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// What is wrong with `query` (an `x-query-rustkvm` return value) for an
/// `arch` guest on `backend` that measured `measures`; empty when nothing.
/// A guest that found no PMU must be reported with none (version 0, no
/// counters), not one made up.
pub fn check(
    arch: Arch,
    backend: Backend,
    query: &Value,
    measures: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut bad = Vec::new();
    let mut want = |what: &str, ok: bool| {
        if !ok {
            bad.push(what.to_string());
        }
    };
    let m = |k: &str| measures.get(k).map(String::as_str);
    let mhex = |k: &str| m(k).and_then(hex);
    want(
        "backend",
        query["backend"]
            == if backend == Backend::Kvm {
                "kvm"
            } else {
                "tcg"
            },
    );
    want("arch", query["arch"] == arch.name());
    let v = &query["vcpus"][0];
    want("vcpus[0].cpu-index 0", v["cpu-index"] == 0);
    want("steal-time.enabled", v["steal-time"]["enabled"] == true);
    want(
        "steal-time.gpa: the guest's",
        mhex("steal.gpa").is_some() && v["steal-time"]["gpa"].as_u64() == mhex("steal.gpa"),
    );
    let timer = |name: &str| {
        v["timer"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name))
            .and_then(|x| x["value"].as_u64())
    };
    let counters = v["pmu"]["counters"].as_array().cloned().unwrap_or_default();
    let counting = m("pmu") == Some("counting");
    match arch {
        Arch::X86_64 => {
            // Updated at least once, and not mid-update.
            let version = v["steal-time"]["version"].as_u64();
            want(
                "steal-time.version even and at least 2",
                version.is_some_and(|n| n >= 2 && n % 2 == 0),
            );
            want("pvclock.enabled", v["pvclock"]["enabled"] == true);
            want(
                "pvclock.gpa: the guest's",
                v["pvclock"]["gpa"].as_u64() == mhex("pvclock.gpa"),
            );
            if let Some(d) = mhex("tsc-deadline") {
                want(
                    "timer tsc-deadline: the guest's",
                    timer("tsc-deadline") == Some(d),
                );
            }
            want("timer tsc nonzero", timer("tsc").is_some_and(|t| t > 0));
            if counting {
                want(
                    "pmu.version nonzero",
                    v["pmu"]["version"].as_u64() > Some(0),
                );
                let c = counters.first();
                want(
                    "pmu.counters[0]: gp0, enabled, counted more than 1000",
                    c.is_some_and(|c| {
                        c["name"] == "gp0"
                            && c["enabled"] == true
                            && c["value"].as_u64() > Some(1000)
                    }),
                );
            }
        }
        Arch::Aarch64 => {
            want("no pvclock", v.get("pvclock").is_none());
            want(
                "timer cntv-cval: the guest's",
                mhex("cntv-cval").is_some() && timer("cntv-cval") == mhex("cntv-cval"),
            );
            if let Some(ver) = m("pmuver").and_then(|s| s.parse::<u64>().ok()) {
                want(
                    "pmu.version: the guest's ID_AA64DFR0_EL1.PMUVer",
                    v["pmu"]["version"].as_u64() == Some(if counting { ver } else { 0 }),
                );
            }
            if counting {
                let c = counters.first();
                want(
                    "pmu.counters[0]: evt0, INST_RETIRED (8), enabled, counted more than 1000",
                    c.is_some_and(|c| {
                        c["name"] == "evt0"
                            && c["config"] == 8
                            && c["enabled"] == true
                            && c["value"].as_u64() > Some(1000)
                    }),
                );
            }
        }
    }
    if !counting {
        want(
            "no PMU reported where the guest found none",
            v["pmu"]["version"] == 0 && counters.is_empty(),
        );
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn measures(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_arm64_answer_is_held_to_the_guests_measures() {
        let m = measures(&[
            ("steal.gpa", "0x90a0000"),
            ("pmu", "counting"),
            ("pmuver", "6"),
            ("cntv-cval", "0x4000000000001"),
        ]);
        let mut q = json!({"backend": "kvm", "arch": "aarch64", "vcpus": [{
            "cpu-index": 0,
            "steal-time": {"enabled": true, "gpa": 0x90a0000u64, "steal-ns": 5, "preempted": false},
            "pmu": {"version": 6, "counters": [{"name": "evt0", "config": 8, "value": 5000, "enabled": true}]},
            "timer": [{"name": "cntv-cval", "value": 0x4000000000001u64}]}]});
        assert_eq!(
            check(Arch::Aarch64, Backend::Kvm, &q, &m),
            Vec::<String>::new()
        );
        assert_eq!(
            check(Arch::Aarch64, Backend::Rustkvm, &q, &m),
            vec!["backend"]
        );
        q["vcpus"][0]["pmu"]["version"] = json!(1);
        q["vcpus"][0]["steal-time"]["gpa"] = json!(0);
        assert_eq!(
            check(Arch::Aarch64, Backend::Kvm, &q, &m),
            vec![
                "steal-time.gpa: the guest's",
                "pmu.version: the guest's ID_AA64DFR0_EL1.PMUVer"
            ]
        );
    }
}
