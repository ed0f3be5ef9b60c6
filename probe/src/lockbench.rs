//! The overcommit benchmarks' workloads (scripts/bench-steal-lock.sh):
//! - lock-heavy: threads create and unlink files in one shared directory,
//!   so they contend on the directory's inode lock in the kernel (a
//!   sleeping lock whose waiters spin while the owner runs — and stop when
//!   the owner's vCPU is reported preempted);
//! - TLB-heavy: threads of one process take write access away from their
//!   pages, so every mprotect flushes the other CPUs' TLBs (PV TLB flush
//!   defers that for preempted vCPUs).

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::json::Json;

/// Run `threads` workers for `seconds` in `dir`; report the operations done.
pub fn run(dir: &str, threads: usize, seconds: u64) -> Json {
    let _ = fs::create_dir_all(dir);
    let dir = dir.to_string();
    timed(threads, seconds, move |t| {
        let (dir, mut n) = (dir.clone(), 0u64);
        Some(move || {
            let path = format!("{dir}/{t}-{}", n % 64);
            let done = fs::File::create(&path).is_ok() && fs::remove_file(&path).is_ok();
            n += u64::from(done);
            done
        })
    })
}

/// The TLB-shootdown workload (the PV TLB flush benchmark): `threads`
/// workers of one process each write a page of their own and take write
/// access away again (mprotect), for `seconds`. Every downgrade flushes the
/// page from the TLBs of the other CPUs that run the process: an IPI each,
/// which the flushing CPU waits for, or with KVM_FEATURE_PV_TLB_FLUSH a
/// flag for each CPU whose vCPU is preempted. Reports the rounds done.
pub fn run_tlb(threads: usize, seconds: u64) -> Json {
    timed(threads, seconds, |_| {
        let page = Page::new()?;
        Some(move || page.write_then_protect())
    })
}

/// `threads` workers, each running the round `setup` makes for it (None:
/// that worker does nothing) until `seconds` have passed; the report
/// counts the rounds that succeeded.
fn timed<S, R>(threads: usize, seconds: u64, setup: S) -> Json
where
    S: Fn(usize) -> Option<R> + Send + Sync + 'static,
    R: FnMut() -> bool,
{
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let setup = Arc::new(setup);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, ops, setup) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&setup));
            std::thread::spawn(move || {
                let Some(mut round) = setup(t) else {
                    return;
                };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += u64::from(round());
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let total = ops.load(Ordering::Relaxed);
    let mut o = Json::obj();
    o.set("threads", threads)
        .set("seconds", elapsed)
        .set("ops", total)
        .set("ops_per_s", total as f64 / elapsed.max(1e-9));
    o
}

/// One private anonymous page, unmapped when dropped.
struct Page(*mut libc::c_void);

const PAGE: usize = 4096;

impl Page {
    fn new() -> Option<Page> {
        // SAFETY: a fresh private anonymous mapping of one page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(Page(p))
    }

    /// Give write access, write the page, take write access away (the
    /// downgrade is what flushes the other CPUs' TLBs).
    fn write_then_protect(&self) -> bool {
        // SAFETY: the page is this thread's own mapping; it is written only
        // while writable.
        unsafe {
            if libc::mprotect(self.0, PAGE, libc::PROT_READ | libc::PROT_WRITE) != 0 {
                return false;
            }
            self.0.cast::<u8>().write_volatile(1);
            libc::mprotect(self.0, PAGE, libc::PROT_READ) == 0
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe {
            libc::munmap(self.0, PAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn workers_make_progress_and_report() {
        let dir = std::env::temp_dir().join(format!("rustkvm-lockbench-{}", std::process::id()));
        let r = super::run(dir.to_str().unwrap(), 2, 1).to_string_compact();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(r.contains("\"threads\":2"), "{r}");
        assert!(!r.contains("\"ops\":0,"), "no progress: {r}");
    }

    #[test]
    fn tlb_workers_map_and_unmap() {
        let r = super::run_tlb(2, 1).to_string_compact();
        assert!(r.contains("\"threads\":2"), "{r}");
        assert!(!r.contains("\"ops\":0,"), "no progress: {r}");
    }
}
