//! What the kernel says about clocks, steal time and paravirt features.

use std::fs;
use std::time::{Duration, Instant};

use crate::json::Json;

/// dmesg substrings worth reporting (PMU driver, kvm-clock, steal time,
/// arm64 PV time, arch timer, hypervisor detection, clocksource changes).
pub const DMESG_PATTERNS: &[&str] = &[
    "Performance Events",
    "PMU",
    "pmu",
    "kvm-clock",
    "kvm-stealtime",
    "kvm-guest",
    "arm-pv",
    "arch_timer",
    "Hypervisor detected",
    "clocksource",
    "steal",
    "tsc:",
    "psci",
    "smccc",
    "TSC deadline",
    "timekeeping watchdog",
    "unstable",
    // rtc_hctosys: the wall clock set from the RTC (drivers/rtc/class.c).
    "setting system clock",
];
/// At most this many dmesg lines are reported.
const DMESG_MAX_LINES: usize = 80;

fn read_trim(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `uname -r`.
pub fn kernel_release() -> Option<String> {
    read_trim("/proc/sys/kernel/osrelease")
}

/// The PMU-related CPU flags the kernel found (/proc/cpuinfo, first CPU):
/// arch_perfmon and pdcm (Intel), perfctr_core and perfmon_v2 (AMD).
pub fn pmu_cpu_flags() -> Vec<String> {
    const PMU_FLAGS: [&str; 4] = ["arch_perfmon", "pdcm", "perfctr_core", "perfmon_v2"];
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("flags")).map(|l| {
                l.split_whitespace()
                    .filter(|f| PMU_FLAGS.contains(f))
                    .map(str::to_string)
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Online CPU numbers (from the affinity mask of this process).
pub fn online_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pin the calling thread to `cpu`.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "beyond what a cpu_set_t names",
        ));
    }
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Current and available clocksources.
pub fn clocksource() -> Json {
    let base = "/sys/devices/system/clocksource/clocksource0";
    let mut o = Json::obj();
    o.set("current", read_trim(&format!("{base}/current_clocksource")))
        .set(
            "available",
            read_trim(&format!("{base}/available_clocksource"))
                .map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>()),
        );
    o
}

/// Firmware services Linux found, by the devices it registered for them:
/// `smccc_trng` (arm64: SMCCC TRNG answered, drivers/firmware/smccc) and
/// `ptp_clocks`, the PTP clocks' names (`ptp_kvm`: "KVM virtual PTP", from
/// KVM's PTP call on arm64, KVM_HC_CLOCK_PAIRING on x86).
pub fn firmware() -> Json {
    let mut o = Json::obj();
    o.set(
        "smccc_trng",
        std::path::Path::new("/sys/bus/platform/devices/smccc_trng").exists(),
    );
    let mut clocks: Vec<String> = std::fs::read_dir("/sys/class/ptp")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| read_trim(&format!("{}/clock_name", e.path().display())))
                .collect()
        })
        .unwrap_or_default();
    clocks.sort();
    o.set("ptp_clocks", clocks);
    o
}

/// The kernel log (syslog(2) READ_ALL), or an error object.
pub fn kernel_log() -> Result<String, std::io::Error> {
    const SYSLOG_ACTION_READ_ALL: i32 = 3;
    const SYSLOG_ACTION_SIZE_BUFFER: i32 = 10;
    // SAFETY: SIZE_BUFFER ignores the buffer arguments.
    let size = unsafe { libc::klogctl(SYSLOG_ACTION_SIZE_BUFFER, std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; size.max(4096) as usize];
    // SAFETY: the buffer is valid for buf.len() bytes.
    let n = unsafe {
        libc::klogctl(
            SYSLOG_ACTION_READ_ALL,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Kernel log lines matching [`DMESG_PATTERNS`], without the `<level>` prefix.
pub fn dmesg_lines() -> Json {
    match kernel_log() {
        Ok(log) => Json::from(filter_dmesg(&log)),
        Err(e) => {
            let mut o = Json::obj();
            o.set("supported", false)
                .set("errno", e.raw_os_error().unwrap_or(0))
                .set("error", e.to_string());
            o
        }
    }
}

/// The matching lines of a kernel log.
pub fn filter_dmesg(log: &str) -> Vec<String> {
    log.lines()
        .map(|l| match l.strip_prefix('<') {
            Some(rest) => rest.split_once('>').map_or(l, |(_, t)| t),
            None => l,
        })
        .filter(|l| DMESG_PATTERNS.iter().any(|p| l.contains(p)))
        .take(DMESG_MAX_LINES)
        .map(str::to_string)
        .collect()
}

/// Steal ticks per CPU from /proc/stat (8th value of each `cpuN` line).
pub fn parse_proc_stat_steal(stat: &str) -> Vec<(usize, u64)> {
    stat.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let steal = f.nth(7)?.parse().ok()?;
            Some((cpu, steal))
        })
        .collect()
}

/// Steal time of all CPUs together so far, in ns (from /proc/stat's
/// ticks: a resolution of one tick, 10 ms at USER_HZ 100); 0 where the
/// kernel accounts none.
pub fn steal_ns_total() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = parse_proc_stat_steal(&stat).iter().map(|(_, s)| s).sum();
    ticks.saturating_mul(1_000_000_000) / hz
}

fn spin_for(d: Duration) {
    let end = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < end {
        for i in 0..1000u64 {
            x = x.wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}

/// Steal time over a busy loop of `busy_ms` on every CPU at once.
pub fn steal(busy_ms: u64) -> Json {
    let before = fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpus = online_cpus();
    let threads: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            std::thread::spawn(move || {
                // (unpinned, it still spins)
                let _ = pin_to(cpu);
                spin_for(Duration::from_millis(busy_ms));
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let after = fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let b = parse_proc_stat_steal(&before);
    let a = parse_proc_stat_steal(&after);
    let mut per_cpu = Vec::new();
    let mut total_ms = 0u64;
    for (cpu, s1) in &a {
        let s0 = b.iter().find(|(c, _)| c == cpu).map_or(0, |(_, s)| *s);
        let ms = s1.saturating_sub(s0) * 1000 / hz;
        total_ms += ms;
        let mut o = Json::obj();
        o.set("cpu", *cpu)
            .set("steal_before_ticks", s0)
            .set("steal_after_ticks", *s1)
            .set("delta_ms", ms);
        per_cpu.push(o);
    }
    let mut o = Json::obj();
    o.set("busy_ms", busy_ms)
        .set("clk_tck", hz)
        .set("per_cpu", Json::Arr(per_cpu))
        .set("total_delta_ms", total_ms);
    o
}

fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// CLOCK_MONOTONIC and CLOCK_REALTIME read while hopping across every CPU:
/// monotonic must never go back, and realtime − monotonic must be the same
/// everywhere.
pub fn clocks(rounds: u32) -> Json {
    let cpus = online_cpus();
    let mut last_mono: Option<i128> = None;
    let (mut backwards, mut max_back) = (0u64, 0i128);
    let (mut min_off, mut max_off) = (i128::MAX, i128::MIN);
    let mut samples = 0u64;
    for _ in 0..rounds.max(1) {
        for &cpu in &cpus {
            if pin_to(cpu).is_err() {
                continue;
            }
            let mono = now_ns(libc::CLOCK_MONOTONIC);
            let real = now_ns(libc::CLOCK_REALTIME);
            if let Some(prev) = last_mono {
                if mono < prev {
                    backwards += 1;
                    max_back = max_back.max(prev - mono);
                }
            }
            last_mono = Some(mono);
            let off = real - mono;
            min_off = min_off.min(off);
            max_off = max_off.max(off);
            samples += 1;
        }
    }
    if let Some(&first) = cpus.first() {
        let _ = pin_to(first);
    }
    let mut o = Json::obj();
    o.set("cpus", cpus.len())
        .set("samples", samples)
        .set("monotonic_backwards", backwards)
        .set("max_backwards_ns", max_back as i64)
        .set(
            "realtime_minus_monotonic_spread_ns",
            if samples > 0 {
                (max_off - min_off) as i64
            } else {
                0
            },
        )
        .set("realtime_unix_ns", Json::Int(now_ns(libc::CLOCK_REALTIME)))
        .set("monotonic_ns", Json::Int(now_ns(libc::CLOCK_MONOTONIC)));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_steal_column() {
        let stat = "cpu  1 2 3 4 5 6 7 99 0 0\ncpu0 1 2 3 4 5 6 7 40 0 0\ncpu1 1 2 3 4 5 6 7 59 0 0\nintr 5\n";
        assert_eq!(parse_proc_stat_steal(stat), vec![(0, 40), (1, 59)]);
    }

    #[test]
    fn dmesg_filter_strips_levels_and_keeps_relevant_lines() {
        let log = "<6>[    0.000000] Hypervisor detected: KVM\n<6>[    0.1] random line\n<6>[    0.2] clocksource: Switched to clocksource kvm-clock\n";
        assert_eq!(
            filter_dmesg(log),
            vec![
                "[    0.000000] Hypervisor detected: KVM",
                "[    0.2] clocksource: Switched to clocksource kvm-clock"
            ]
        );
    }
}
