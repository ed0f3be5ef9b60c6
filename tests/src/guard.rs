//! The hang guard of a guest's QEMU: when a run counts as hung.
//!
//! A guest's `timeout` only catches a hung guest; no verdict depends on how
//! fast a guest ran (docs/testing.md). A plain wall-clock limit breaks that
//! on a loaded host: with the CPUs shared five ways, a boot that takes 40 s
//! alone takes 200 s, and a 180 s limit calls it hung. So a run is hung
//! when either
//!
//! - it has had its chance and spent it: `limit` of wall time has passed
//!   *and* QEMU has used `limit` of CPU time (what one busy thread gets in
//!   that time on a quiet host), so a guest spinning in a wait that never
//!   ends is stopped when it would have been without the load; or
//! - it waits for nothing: [`WAIT_FACTOR`] × `limit` of wall time has
//!   passed, whatever the CPU time (a guest halted for good uses none).
//!
//! On a quiet host a spinning hang is stopped at `limit`, as before; a
//! loaded host only makes the guard wait longer, never fire sooner.

use std::fmt;
use std::time::{Duration, Instant};

/// How many `limit`s of wall time a run that uses less CPU than its limit
/// may take before it counts as hung (a guest that waits forever).
pub const WAIT_FACTOR: u32 = 4;

/// Why a run counts as hung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hang {
    /// It used its `limit` of CPU time, and its `limit` of wall time passed.
    Spent {
        /// The guard's limit.
        limit: Duration,
        /// Wall time when the guard fired.
        wall: Duration,
    },
    /// [`WAIT_FACTOR`] × `limit` of wall time passed with less CPU used.
    Waited {
        /// The guard's limit.
        limit: Duration,
        /// CPU time used when the guard fired (None: unreadable).
        cpu: Option<Duration>,
    },
}

impl fmt::Display for Hang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Hang::Spent { limit, wall } => write!(
                f,
                "timeout after {}s (hung: {}s of CPU time used in {}s)",
                limit.as_secs(),
                limit.as_secs(),
                wall.as_secs()
            ),
            Hang::Waited { limit, cpu } => write!(
                f,
                "timeout after {}s (hung: waited {}s, {} of CPU time used)",
                limit.as_secs(),
                (limit * WAIT_FACTOR).as_secs(),
                cpu.map_or("unknown".to_string(), |c| format!(
                    "{:.1}s",
                    c.as_secs_f64()
                ))
            ),
        }
    }
}

/// The decision, from what was observed: `wall` since the start and the
/// process's `cpu` time (None when it could not be read: then wall time
/// alone, at the longer limit).
pub fn judge(limit: Duration, wall: Duration, cpu: Option<Duration>) -> Option<Hang> {
    if wall >= limit && cpu.is_some_and(|c| c >= limit) {
        Some(Hang::Spent { limit, wall })
    } else if wall >= limit * WAIT_FACTOR {
        Some(Hang::Waited { limit, cpu })
    } else {
        None
    }
}

/// The guard of one process, started when the process was.
#[derive(Debug, Clone, Copy)]
pub struct HangGuard {
    pid: u32,
    limit: Duration,
    start: Instant,
}

impl HangGuard {
    /// Guard process `pid`, started at `start`, with `limit`.
    pub fn new(pid: u32, limit: Duration, start: Instant) -> Self {
        HangGuard { pid, limit, start }
    }

    /// The guard's limit.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Whether the process counts as hung now.
    pub fn check(&self) -> Option<Hang> {
        let wall = self.start.elapsed();
        // Reading /proc costs a little: only once the first limit is near.
        if wall < self.limit {
            return None;
        }
        judge(self.limit, wall, cpu_time(self.pid))
    }
}

/// The CPU time (user + system, all threads) process `pid` has used, from
/// `/proc/PID/stat` (fields 14 and 15, in clock ticks: proc(5)).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_time_of_stat(&stat, clock_ticks_per_second()?)
}

/// [`cpu_time`] from the text of a `/proc/PID/stat`.
fn cpu_time_of_stat(stat: &str, ticks_per_s: u64) -> Option<Duration> {
    // The command name (field 2) is in parentheses and may hold spaces.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = utime.checked_add(stime)?;
    Some(
        Duration::from_secs(ticks / ticks_per_s)
            + Duration::from_nanos((ticks % ticks_per_s) * 1_000_000_000 / ticks_per_s),
    )
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the system; no pointers involved.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_spinning_hang_is_stopped_at_the_limit_on_a_quiet_host() {
        assert_eq!(judge(S(120), S(119), Some(S(119))), None);
        assert_eq!(
            judge(S(120), S(120), Some(S(120))),
            Some(Hang::Spent {
                limit: S(120),
                wall: S(120)
            })
        );
        // Two busy vCPU threads use the CPU time sooner; the wall limit
        // still holds.
        assert_eq!(judge(S(120), S(70), Some(S(140))), None);
    }

    #[test]
    fn a_loaded_host_makes_the_guard_wait_for_the_cpu_time() {
        // A fifth of a CPU: 180 s of wall time is 36 s of running.
        assert_eq!(judge(S(180), S(180), Some(S(36))), None);
        assert_eq!(judge(S(180), S(700), Some(S(179))), None);
        assert!(matches!(
            judge(S(180), S(700), Some(S(180))),
            Some(Hang::Spent { .. })
        ));
    }

    #[test]
    fn a_waiting_hang_is_stopped_at_the_wait_factor() {
        assert_eq!(judge(S(120), S(479), Some(S(1))), None);
        assert_eq!(
            judge(S(120), S(480), Some(S(1))),
            Some(Hang::Waited {
                limit: S(120),
                cpu: Some(S(1))
            })
        );
        // CPU time unreadable: wall time alone, at the longer limit.
        assert_eq!(judge(S(120), S(400), None), None);
        assert!(matches!(
            judge(S(120), S(480), None),
            Some(Hang::Waited { cpu: None, .. })
        ));
    }

    #[test]
    fn the_verdict_names_the_limit_first() {
        // run::judge's callers and tests look for "timeout after".
        let h = judge(S(7), S(9), Some(S(8))).expect("hung");
        assert!(h.to_string().starts_with("timeout after 7s"), "{h}");
        let h = judge(S(7), S(28), Some(Duration::from_millis(1500))).expect("hung");
        assert_eq!(
            h.to_string(),
            "timeout after 7s (hung: waited 28s, 1.5s of CPU time used)"
        );
    }

    #[test]
    fn proc_stat_fields_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (qemu (x) 1) S 1 2 3 0 -1 4194560 10 0 0 0 250 75 0 0 20 0 5 0 99 0 0";
        assert_eq!(
            cpu_time_of_stat(stat, 100),
            Some(Duration::from_millis(3250))
        );
        assert_eq!(cpu_time_of_stat("1 (x) S 1 2", 100), None);
    }

    #[test]
    fn this_process_cpu_time_grows_as_it_runs() {
        let before = cpu_time(std::process::id()).expect("readable");
        let mut x = 0u64;
        // Spin until the kernel has charged us a tick more, however long
        // the host makes that take.
        while cpu_time(std::process::id()).expect("readable") <= before {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
    }
}
