//! The overcommit benchmarks' workloads (scripts/bench-steal-lock.sh):
//! - lock-heavy: threads create and unlink files in one shared directory,
//!   so they contend on the directory's inode lock in the kernel (a
//!   sleeping lock whose waiters spin while the owner runs — and stop when
//!   the owner's vCPU is reported preempted);
//! - TLB-heavy: threads of one process map and unmap memory, so every
//!   munmap flushes the other CPUs' TLBs (PV TLB flush defers that for
//!   preempted vCPUs).

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::json::Json;

/// Run `threads` workers for `seconds` in `dir`; report the operations done.
pub fn run(dir: &str, threads: usize, seconds: u64) -> Json {
    let _ = fs::create_dir_all(dir);
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, ops, dir) = (Arc::clone(&stop), Arc::clone(&ops), dir.to_string());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let path = format!("{dir}/{t}-{}", n % 64);
                    if fs::File::create(&path).is_ok() && fs::remove_file(&path).is_ok() {
                        n += 1;
                    }
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

/// The TLB-shootdown workload (the PV TLB flush benchmark): `threads`
/// workers of one process map 16 pages, touch each and unmap them, for
/// `seconds`. Every munmap of a process whose threads run on other CPUs
/// flushes those CPUs' TLBs (IPIs, or with KVM_FEATURE_PV_TLB_FLUSH a flag
/// for each CPU whose vCPU is preempted). Reports the map/unmap rounds done.
pub fn run_tlb(threads: usize, seconds: u64) -> Json {
    const PAGES: usize = 16;
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, ops) = (Arc::clone(&stop), Arc::clone(&ops));
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if map_touch_unmap(PAGES * 4096) {
                        n += 1;
                    }
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

/// mmap `len` bytes of anonymous memory, write a byte of each page, munmap.
fn map_touch_unmap(len: usize) -> bool {
    // SAFETY: a fresh private anonymous mapping, written only inside its
    // length and unmapped before anything else can see it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        for off in (0..len).step_by(4096) {
            p.cast::<u8>().add(off).write_volatile(1);
        }
        libc::munmap(p, len) == 0
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
