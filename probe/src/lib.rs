//! rustkvm-probe: what a Linux guest sees of the PMU, clocks and steal time.
//!
//! Run as the initramfs's only job, it prints one JSON document between
//! [`BEGIN_MARKER`] and [`END_MARKER`] on the console. Nothing here may fail
//! the probe: a feature that is absent is recorded as `"supported": false`
//! with the errno.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod busy;
pub mod chain;
pub mod hypercall;
pub mod json;
pub mod lockbench;
pub mod perf;
pub mod system;
pub mod workload;

use json::Json;

/// Line before the JSON document.
pub const BEGIN_MARKER: &str = "===RUSTKVM-PROBE-BEGIN===";
/// Line after the JSON document.
pub const END_MARKER: &str = "===RUSTKVM-PROBE-END===";
/// Version of the document's layout.
pub const REPORT_VERSION: u32 = 1;

/// Workload sizes: the exact expectations are on the difference.
pub const N1: u64 = 1_000_000;
/// See [`N1`].
pub const N2: u64 = 2_000_000;
/// Sampling period, in instructions.
pub const SAMPLE_PERIOD: u64 = 100_000;

/// Probe settings.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long each CPU busy-loops for the steal measurement.
    pub busy_ms: u64,
    /// Rounds over all CPUs for the clock consistency check.
    pub clock_rounds: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            busy_ms: 1000,
            clock_rounds: 50,
        }
    }
}

fn error_json(e: &std::io::Error) -> Json {
    let mut o = Json::obj();
    o.set("supported", false)
        .set("errno", e.raw_os_error().unwrap_or(0))
        .set("error", e.to_string());
    o
}

/// Count hardware event `config` over the workload with [`N1`] and [`N2`]
/// iterations; `expected` is the exact count difference, when known.
pub fn measure_event(config: u64, expected: Option<u64>) -> Json {
    let attr = perf::PerfEventAttr::hardware_user(config);
    let counter = match perf::Counter::open(&attr) {
        Ok(c) => c,
        Err(e) => return error_json(&e),
    };
    let mut counts = [0u64; 2];
    for (slot, n) in counts.iter_mut().zip([N1, N2]) {
        let r = counter
            .start()
            .map(|()| workload::spin(n))
            .and_then(|()| counter.stop())
            .and_then(|()| counter.read());
        match r {
            Ok(v) => *slot = v,
            Err(e) => return error_json(&e),
        }
    }
    let delta = counts[1].wrapping_sub(counts[0]);
    let mut o = Json::obj();
    o.set("supported", true)
        .set("count_n1", counts[0])
        .set("count_n2", counts[1])
        .set("delta", delta)
        .set("expected_delta", expected)
        .set("exact", expected.map(|e| e == delta));
    o
}

/// The hardware-event section: instructions and branches with exact
/// expectations, cycles and ref-cycles as measured.
pub fn perf_report() -> Json {
    let (insns, branches) = workload::expected_delta(N1, N2);
    let mut o = Json::obj();
    o.set("n1", N1)
        .set("n2", N2)
        .set(
            "instructions",
            measure_event(perf::HW_INSTRUCTIONS, Some(insns)),
        )
        .set(
            "branches",
            measure_event(perf::HW_BRANCH_INSTRUCTIONS, Some(branches)),
        )
        .set("cycles", measure_event(perf::HW_CPU_CYCLES, None))
        .set("ref-cycles", measure_event(perf::HW_REF_CPU_CYCLES, None));
    o
}

/// The sampling section: overflow samples of instructions every
/// [`SAMPLE_PERIOD`] over `spin(N2)`.
pub fn sampling_report() -> Json {
    let expected = workload::INSNS_PER_ITER * N2 / SAMPLE_PERIOD;
    match perf::sample_around(perf::HW_INSTRUCTIONS, SAMPLE_PERIOD, || workload::spin(N2)) {
        Ok(s) => {
            let mut o = Json::obj();
            o.set("supported", true)
                .set("period", SAMPLE_PERIOD)
                .set("samples", s.samples)
                .set("lost", s.lost)
                .set("throttled", s.throttled)
                .set("expected_about", expected);
            o
        }
        Err(e) => error_json(&e),
    }
}

/// Cycles sampling period (cycles are time: no exact expectation).
pub const CYCLES_SAMPLE_PERIOD: u64 = 1_000_000;

/// The cycles sampling section: overflow samples of CPU cycles every
/// [`CYCLES_SAMPLE_PERIOD`] over `spin(N2)` (what `perf record` samples by
/// default).
pub fn cycles_sampling_report() -> Json {
    match perf::sample_around(perf::HW_CPU_CYCLES, CYCLES_SAMPLE_PERIOD, || {
        workload::spin(N2)
    }) {
        Ok(s) => {
            let mut o = Json::obj();
            o.set("supported", true)
                .set("period", CYCLES_SAMPLE_PERIOD)
                .set("count", s.count)
                .set("samples", s.samples)
                .set("lost", s.lost)
                .set("throttled", s.throttled);
            o
        }
        Err(e) => error_json(&e),
    }
}

/// The whole report.
pub fn probe(opts: &Options) -> Json {
    let mut o = Json::obj();
    o.set("version", REPORT_VERSION)
        .set("arch", std::env::consts::ARCH)
        .set("kernel", system::kernel_release())
        .set("cpus", system::online_cpus().len())
        .set("hypercall_from_user", hypercall::from_user())
        .set("clocksource", system::clocksource())
        .set("firmware", system::firmware())
        .set("pmu_cpu_flags", system::pmu_cpu_flags())
        .set("dmesg", system::dmesg_lines())
        .set("perf", perf_report())
        .set("sampling", sampling_report())
        .set("sampling_cycles", cycles_sampling_report())
        .set("steal", system::steal(opts.busy_ms))
        .set("clocks", system::clocks(opts.clock_rounds));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Natively on the host: the workload's counts are exactly as predicted
    /// where the host lets us count, and otherwise the report says why not.
    #[test]
    fn workload_counts_are_exact_or_reported_unsupported() {
        for (name, config, per_iter) in [
            (
                "instructions",
                perf::HW_INSTRUCTIONS,
                workload::INSNS_PER_ITER,
            ),
            (
                "branches",
                perf::HW_BRANCH_INSTRUCTIONS,
                workload::BRANCHES_PER_ITER,
            ),
        ] {
            let expected = per_iter * (N2 - N1);
            let r = measure_event(config, Some(expected));
            let text = r.to_string_compact();
            match &r {
                Json::Obj(f) if f.contains(&("supported".into(), Json::Bool(true))) => {
                    assert!(
                        text.contains(&format!("\"delta\":{expected},")),
                        "{name}: not exact on this host: {text}"
                    );
                    assert!(text.contains("\"exact\":true"), "{name}: {text}");
                }
                Json::Obj(f) => {
                    assert!(
                        f.contains(&("supported".into(), Json::Bool(false))),
                        "{text}"
                    );
                    assert!(
                        f.iter()
                            .any(|(k, v)| k == "errno" && matches!(v, Json::Int(e) if *e > 0)),
                        "{name}: unsupported without an errno: {text}"
                    );
                }
                other => panic!("{name}: not an object: {other:?}"),
            }
        }
    }

    #[test]
    fn expected_deltas() {
        assert_eq!(workload::expected_delta(N1, N2), (2 * (N2 - N1), N2 - N1));
        assert_eq!(workload::expected_delta(0, 1), (0, 0), "spin(0) runs once");
    }

    #[test]
    fn report_is_one_json_object_with_every_section() {
        let r = probe(&Options {
            busy_ms: 10,
            clock_rounds: 2,
        })
        .to_string_compact();
        for key in [
            "\"version\":1",
            "\"clocksource\":",
            "\"dmesg\":",
            "\"perf\":",
            "\"sampling\":",
            "\"steal\":",
            "\"clocks\":",
        ] {
            assert!(r.contains(key), "{key} missing in {r}");
        }
        assert!(r.starts_with('{') && r.ends_with('}'));
    }
}
