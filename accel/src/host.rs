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

/// (run ns, run-queue delay ns) of thread `tid` of this process.
pub fn task_schedstat(tid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut f = text.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
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
        let tid = current_tid();
        // Both fields are kernel accounting that may still be 0 for a thread
        // that has not been descheduled yet; only their relation is fixed.
        let (_run, delay) = task_schedstat(tid).expect("schedstat of our own thread");
        assert!(
            thread_run_delay_ns() >= delay,
            "the same counter, read later"
        );
        assert!(task_schedstat(-5).is_none());
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
