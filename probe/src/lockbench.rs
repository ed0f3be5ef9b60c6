//! A lock-heavy workload for the steal-time benchmark: threads create and
//! unlink files in one shared directory, so they contend on the directory's
//! inode lock in the kernel (a sleeping lock whose waiters spin while the
//! owner runs — and stop when the owner's vCPU is reported preempted).

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
}
