//! Facts about the host the models need (Linux).

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;

thread_local! {
    /// This thread's `/proc/thread-self/schedstat`, opened once.
    static SCHEDSTAT: RefCell<Option<File>> = RefCell::new(File::open("/proc/thread-self/schedstat").ok());
}

/// Parse `/proc/<pid>/task/<tid>/schedstat`: "run_ns run_delay_ns slices".
pub fn parse_run_delay(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The calling thread's kernel thread id.
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// What the MTTCG sampler watches of one vCPU thread of this process: its
/// schedstat (run-queue delay, for steal) and its CPU clock (whether it is on
/// a host CPU now, for `preempted`).
#[derive(Debug)]
pub struct ThreadWatch {
    tid: i32,
    /// `/proc/self/task/<tid>/schedstat`, opened once (None if unreadable).
    schedstat: Option<File>,
}

impl ThreadWatch {
    /// Watch thread `tid` of this process.
    pub fn new(tid: i32) -> Self {
        ThreadWatch {
            tid,
            schedstat: File::open(format!("/proc/self/task/{tid}/schedstat")).ok(),
        }
    }

    /// Watch only thread `tid`'s CPU clock (no file opened).
    pub fn clock_only(tid: i32) -> Self {
        ThreadWatch {
            tid,
            schedstat: None,
        }
    }

    /// The thread watched.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// Its run-queue delay in ns (completed waits only: the kernel adds a
    /// wait when the thread gets a CPU back, `sched_info_arrive`).
    pub fn run_delay_ns(&self) -> Option<u64> {
        let f = self.schedstat.as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        parse_run_delay(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// The CPU time it has run, in ns, including the slice it is running
    /// now: its thread CPU clock (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`,
    /// `kernel/time/posix-cpu-timers.c`; `task_sched_runtime`). Unlike
    /// schedstat's fields it grows while the thread runs and stands still
    /// while it waits.
    pub fn cpu_ns(&self) -> Option<u64> {
        // clockid of a thread's CPUCLOCK_SCHED clock: ~tid << 3 | PERTHREAD
        // (4) | SCHED (2), as glibc's pthread_getcpuclockid.
        let clock = (!self.tid << 3) | 6;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec the call writes; an invalid or
        // foreign clock id makes it fail with EINVAL, which we report.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            return None;
        }
        Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }

    /// Its CPU clock now and whether it is on a CPU at this moment: the
    /// clock moved between two reads a moment apart. None if unreadable.
    pub fn cpu_ns_and_running(&self) -> Option<(u64, bool)> {
        let a = self.cpu_ns()?;
        let b = self.cpu_ns()?;
        Some((b, b != a))
    }

    /// Whether it is runnable ("R" in `/proc/self/task/<tid>/stat`): running
    /// or waiting on a run queue, not sleeping in a system call.
    pub fn runnable(&self) -> bool {
        std::fs::read_to_string(format!("/proc/self/task/{}/stat", self.tid))
            .ok()
            .is_some_and(|s| parse_stat_state(&s) == Some('R'))
    }
}

/// Ask the host scheduler for a short time slice for the calling thread
/// (`sched_setattr` with SCHED_OTHER and `sched_runtime` = `slice_ns`):
/// EEVDF (Linux 6.12 and later, `kernel/sched/fair.c`) gives a thread with a
/// shorter slice an earlier deadline, so its wakeups preempt threads that run
/// long slices instead of waiting for their slice to end. Unprivileged;
/// older kernels ignore the runtime. Returns whether the call succeeded.
pub fn request_short_slice(slice_ns: u64) -> bool {
    // Keep the thread's nice value (sched_setattr sets it too). SAFETY:
    // getpriority has no memory effects; for PRIO_PROCESS and 0 Linux
    // answers for the calling thread.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: slice_ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr reads `attr` (size given in it) for thread 0,
    // the caller; it writes nothing.
    unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        ) == 0
    }
}

/// The state letter of a `/proc/<pid>/stat` line (after the parenthesised
/// command name, which may itself hold spaces and parentheses).
pub fn parse_stat_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The calling thread's run-queue delay in ns (time runnable but not
/// running, KVM's `sched_info.run_delay`); 0 if the kernel does not say.
pub fn thread_run_delay_ns() -> u64 {
    SCHEDSTAT.with(|f| {
        let f = f.borrow();
        let Some(f) = f.as_ref() else { return 0 };
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(parse_run_delay)
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_field_two_is_the_run_delay() {
        assert_eq!(parse_run_delay("1234 5678 9\n"), Some(5678));
        assert_eq!(parse_run_delay("1234"), None);
    }

    #[test]
    fn another_threads_schedstat_is_readable_by_tid() {
        let w = ThreadWatch::new(current_tid());
        // The delay may still be 0 for a thread that has not been
        // descheduled yet; only the relation of two reads is fixed.
        let delay = w.run_delay_ns().expect("schedstat of our own thread");
        assert!(
            thread_run_delay_ns() >= delay,
            "the same counter, read later"
        );
        assert!(ThreadWatch::new(-5).run_delay_ns().is_none());
        assert!(ThreadWatch::new(-5).cpu_ns().is_none());
        assert!(!ThreadWatch::new(-5).runnable());
    }

    #[test]
    fn another_threads_cpu_clock_grows_while_it_runs_and_not_while_it_sleeps() {
        use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
        use std::sync::Arc;
        let (tid, spin, stop) = (
            Arc::new(AtomicI32::new(0)),
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
        );
        let t = {
            let (tid, spin, stop) = (tid.clone(), spin.clone(), stop.clone());
            std::thread::spawn(move || {
                tid.store(current_tid(), Ordering::SeqCst);
                while !stop.load(Ordering::SeqCst) {
                    if !spin.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
            })
        };
        while tid.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let w = ThreadWatch::new(tid.load(Ordering::SeqCst));
        let a = w.cpu_ns().expect("a thread CPU clock of this process");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = w.cpu_ns().unwrap();
        // The spinner gets at least some of 50 ms even on a loaded host.
        assert!(b > a + 1_000_000, "spinning: {a} -> {b}");
        spin.store(false, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c = w.cpu_ns().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let d = w.cpu_ns().unwrap();
        // Sleeping: a few wakeups' worth, far below the 100 ms.
        assert!(d - c < 20_000_000, "sleeping: {c} -> {d}");
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn a_short_slice_keeps_the_threads_nice_value() {
        std::thread::spawn(|| {
            // SAFETY: raising this thread's nice value is always allowed.
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) }, 0);
            let ok = request_short_slice(100_000);
            // SAFETY: as above, a read.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(nice, 3, "short slice accepted: {ok}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn stat_state_follows_the_command_name() {
        assert_eq!(parse_stat_state("42 (qemu) R 1 2 3"), Some('R'));
        assert_eq!(parse_stat_state("42 (CPU 0/TCG) S 1"), Some('S'));
        assert_eq!(parse_stat_state("42 (a) b) R 1"), Some('R'));
        assert_eq!(parse_stat_state("garbage"), None);
        assert!(ThreadWatch::new(current_tid()).runnable(), "we are running");
    }

    #[test]
    fn this_threads_run_delay_is_read_and_never_goes_back() {
        let a = thread_run_delay_ns();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_run_delay_ns() >= a);
    }
}
