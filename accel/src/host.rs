//! Facts about the host the models need (Linux).

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

thread_local! {
    /// This thread's `/proc/thread-self/schedstat`, opened once.
    static SCHEDSTAT: RefCell<Option<File>> = RefCell::new(File::open("/proc/thread-self/schedstat").ok());
}

/// Parse `/proc/<pid>/task/<tid>/schedstat`: "run_ns run_delay_ns slices".
pub fn parse_run_delay(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Fill `buf` from the host's entropy (`getrandom(2)`, as KVM's TRNG takes
/// the kernel's `get_random_long`); it blocks only until the host's pool
/// is initialised.
pub fn random(buf: &mut [u64; 3]) {
    let len = std::mem::size_of_val(buf);
    let mut done = 0;
    while done < len {
        // SAFETY: writes at most `len - done` bytes into `buf`, from
        // byte `done` on.
        let n = unsafe {
            libc::getrandom(
                buf.as_mut_ptr().cast::<u8>().add(done).cast(),
                len - done,
                0,
            )
        };
        if n > 0 {
            done += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No entropy to give: zeros (KVM's get_random_long cannot fail).
            return;
        }
    }
}

/// The calling thread's kernel thread id.
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// What the MTTCG sampler watches of one vCPU thread of this process: its
/// schedstat (run-queue delay, for steal) and its CPU clock (whether it is on
/// a host CPU now, for `preempted`). The models read it through a
/// [`HostSched`].
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
        // Miri has no thread CPU clocks: unreadable, as on a foreign host.
        if cfg!(miri) {
            return None;
        }
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

/// The host's clock and scheduler as the models observe them: what a vCPU
/// entry, a spinning vCPU looking at its peers and the MTTCG sampler read of
/// the host. The machine holds one ([`crate::machine::Shared`]): [`LinuxSched`]
/// in production; unit tests give a fake whose time and threads they set,
/// so that no verdict depends on how the host schedules the test.
pub trait HostSched: Send + Sync {
    /// Host monotonic time in ns since an origin of the implementation's
    /// (fixed for its life).
    fn now_ns(&self) -> u64;

    /// The calling thread's kernel thread id.
    fn current_tid(&self) -> i32;

    /// The calling thread's run-queue delay in ns (see
    /// [`thread_run_delay_ns`]); 0 if the kernel does not say.
    fn current_run_delay_ns(&self) -> u64;

    /// `thread`'s CPU clock in ns and whether it is on a CPU at this moment
    /// (see [`ThreadWatch::cpu_ns_and_running`]); None if unreadable.
    fn cpu_ns_and_running(&self, thread: &ThreadWatch) -> Option<(u64, bool)>;

    /// `thread`'s run-queue delay in ns, completed waits only (see
    /// [`ThreadWatch::run_delay_ns`]); None if unreadable.
    fn run_delay_ns(&self, thread: &ThreadWatch) -> Option<u64>;

    /// Whether `thread` is runnable: running or waiting on a run queue, not
    /// sleeping (see [`ThreadWatch::runnable`]).
    fn runnable(&self, thread: &ThreadWatch) -> bool;
}

/// The real host: `CLOCK_MONOTONIC` (through [`Instant`]), thread CPU
/// clocks, `/proc` schedstat and stat.
#[derive(Debug, Clone, Copy)]
pub struct LinuxSched {
    /// Where [`HostSched::now_ns`] counts from.
    origin: Instant,
}

impl LinuxSched {
    /// The host, its time counted from now.
    pub fn new() -> Self {
        LinuxSched {
            origin: Instant::now(),
        }
    }
}

impl Default for LinuxSched {
    fn default() -> Self {
        Self::new()
    }
}

impl HostSched for LinuxSched {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn current_tid(&self) -> i32 {
        current_tid()
    }

    fn current_run_delay_ns(&self) -> u64 {
        thread_run_delay_ns()
    }

    fn cpu_ns_and_running(&self, thread: &ThreadWatch) -> Option<(u64, bool)> {
        thread.cpu_ns_and_running()
    }

    fn run_delay_ns(&self, thread: &ThreadWatch) -> Option<u64> {
        thread.run_delay_ns()
    }

    fn runnable(&self, thread: &ThreadWatch) -> bool {
        thread.runnable()
    }
}

/// Spawn a thread the way QEMU's `qemu_thread_create` does
/// (util/qemu-thread-posix.c): with every signal blocked except the
/// synchronous SIGSEGV, SIGFPE and SIGILL, so that signals QEMU expects on its
/// main loop (SIGTERM, SIGINT, SIGHUP, SIGUSR*, SIGCHLD …) are never taken on
/// it. The mask is inherited from the spawning thread's, set around the
/// spawn and restored after, so there is no window where the new thread runs
/// with signals open.
pub fn spawn_with_signals_blocked<F>(
    builder: std::thread::Builder,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // Miri (the unit tests under `cargo miri test`) has no signal masks.
    if cfg!(miri) {
        return builder.spawn(f);
    }
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset initialise and
    // modify the set we own.
    let mut block: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `block` is a valid set for these calls to initialise and edit.
    unsafe {
        libc::sigfillset(&mut block);
        libc::sigdelset(&mut block, libc::SIGSEGV);
        libc::sigdelset(&mut block, libc::SIGFPE);
        libc::sigdelset(&mut block, libc::SIGILL);
    }
    // SAFETY: valid sets; only the calling thread's mask changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &block, &mut old) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let spawned = builder.spawn(f);
    // SAFETY: restores the mask saved above, for this thread only.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// The calling thread's blocked-signal mask.
pub fn blocked_signals() -> libc::sigset_t {
    // SAFETY: plain data, filled by the call below.
    let mut cur: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a NULL new set only reads the mask into `cur`.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) };
    cur
}

/// Ask the host scheduler for a short time slice for the calling thread
/// (`sched_setattr` with SCHED_OTHER and `sched_runtime` = `slice_ns`):
/// EEVDF (Linux 6.12 and later, `kernel/sched/fair.c`) gives a thread with a
/// shorter slice an earlier deadline, so its wakeups preempt threads that run
/// long slices instead of waiting for their slice to end. Unprivileged;
/// older kernels ignore the runtime. Returns whether the call succeeded.
pub fn request_short_slice(slice_ns: u64) -> bool {
    // Miri (`cargo miri test`) has no scheduler to ask.
    if cfg!(miri) {
        return false;
    }
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

/// Host real time, ns since the Unix epoch.
pub(crate) fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Host real time and VM time as one consistent pair, as KVM reads the
/// host's clocks under one seqcount (`kvm_get_wall_clock_epoch`,
/// `kvm_get_time_and_clockread`): of up to [`PAIR_TRIES`] rounds of reads
/// real, VM, real, the first whose real-time reads lie within
/// [`PAIR_GAP_NS`] of each other, else the closest one; real time is their
/// midpoint. A host stall between two reads would otherwise move the
/// guest's wall clock by the stall (seen: 160 ms ahead on a loaded host).
pub(crate) fn real_and_vm_ns(
    mut real: impl FnMut() -> u64,
    mut vm: impl FnMut() -> u64,
) -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..PAIR_TRIES {
        let r1 = real();
        let v = vm();
        let r2 = real().max(r1);
        let gap = r2 - r1;
        if gap < best.0 {
            best = (gap, r1 + gap / 2, v);
        }
        if gap <= PAIR_GAP_NS {
            break;
        }
    }
    (best.1, best.2)
}

/// Rounds [`real_and_vm_ns`] tries at most.
const PAIR_TRIES: u32 = 8;
/// A gap between the real-time reads that ends [`real_and_vm_ns`]'s tries.
const PAIR_GAP_NS: u64 = 100_000;

#[cfg(test)]
pub mod tests {
    //! A fake host scheduler for model tests, and the tests of the real one.
    //! Tests that need the real scheduler to behave in some way (a spinning
    //! thread getting CPU time, a sleeping one not) are statistics of the
    //! host: `#[ignore]`d here, run by `scripts/soak-host-sched.sh`.
    use super::*;
    use parking_lot::Mutex;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
    use std::sync::Arc;

    /// One thread of a [`FakeSched`], as the test sets it.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct FakeThread {
        /// Its CPU clock (ns).
        pub cpu_ns: u64,
        /// On a CPU at this moment.
        pub running: bool,
        /// Its run-queue delay so far (ns).
        pub run_delay_ns: u64,
        /// Running or on a run queue (not sleeping).
        pub runnable: bool,
    }

    /// Run by a [`FakeSched`] as a thread's CPU clock is read.
    pub type ClockReadHook = Box<dyn FnOnce() + Send>;

    /// What a [`FakeSched`] says, all of it set by the test.
    #[derive(Default)]
    struct FakeState {
        /// Host time (ns).
        now_ns: u64,
        /// The thread the test is calling as.
        current: i32,
        /// The host threads by tid; any other tid is unreadable.
        threads: HashMap<i32, FakeThread>,
        /// Reads of a thread's CPU clock so far.
        clock_reads: u64,
        /// Runs at the next read of a thread's CPU clock.
        on_clock_read: Option<ClockReadHook>,
    }

    impl std::fmt::Debug for FakeState {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("FakeState")
                .field("now_ns", &self.now_ns)
                .field("current", &self.current)
                .field("threads", &self.threads)
                .field("clock_reads", &self.clock_reads)
                .finish_non_exhaustive()
        }
    }

    /// A host whose clock stands still and whose threads do nothing until
    /// the test says: time moves by [`FakeSched::advance`], the calling
    /// thread is whichever [`FakeSched::call_as`] named last (one test
    /// thread can act as every vCPU thread), threads are what
    /// [`FakeSched::set`] made them.
    #[derive(Debug, Default)]
    pub struct FakeSched(Mutex<FakeState>);

    impl FakeSched {
        /// A host at time `now_ns` with no threads, called from tid 0 (which
        /// a vCPU takes for "never ran").
        pub fn at(now_ns: u64) -> Arc<Self> {
            let fake = FakeSched::default();
            fake.0.lock().now_ns = now_ns;
            Arc::new(fake)
        }

        /// Move host time on by `ns`.
        pub fn advance(&self, ns: u64) {
            self.0.lock().now_ns += ns;
        }

        /// From now on the caller is thread `tid`.
        pub fn call_as(&self, tid: i32) {
            self.0.lock().current = tid;
        }

        /// Thread `tid` is now `thread`.
        pub fn set(&self, tid: i32, thread: FakeThread) {
            self.0.lock().threads.insert(tid, thread);
        }

        /// Change thread `tid` (a default one if it did not exist).
        pub fn update(&self, tid: i32, f: impl FnOnce(&mut FakeThread)) {
            f(self.0.lock().threads.entry(tid).or_default());
        }

        /// Thread `tid` is gone: unreadable from now on.
        pub fn forget(&self, tid: i32) {
            self.0.lock().threads.remove(&tid);
        }

        /// Run `hook` (once) when a thread's CPU clock is next read, before
        /// the read: what another thread does at that moment.
        pub fn on_clock_read(&self, hook: ClockReadHook) {
            self.0.lock().on_clock_read = Some(hook);
        }

        /// How often a thread's CPU clock was read so far.
        pub fn clock_reads(&self) -> u64 {
            self.0.lock().clock_reads
        }

        /// Thread `tid` as set, if it exists.
        fn thread(&self, tid: i32) -> Option<FakeThread> {
            self.0.lock().threads.get(&tid).copied()
        }
    }

    impl HostSched for FakeSched {
        fn now_ns(&self) -> u64 {
            self.0.lock().now_ns
        }

        fn current_tid(&self) -> i32 {
            self.0.lock().current
        }

        fn current_run_delay_ns(&self) -> u64 {
            self.thread(self.current_tid())
                .map_or(0, |t| t.run_delay_ns)
        }

        fn cpu_ns_and_running(&self, thread: &ThreadWatch) -> Option<(u64, bool)> {
            let hook = {
                let mut state = self.0.lock();
                state.clock_reads += 1;
                state.on_clock_read.take()
            };
            if let Some(hook) = hook {
                hook();
            }
            self.thread(thread.tid()).map(|t| (t.cpu_ns, t.running))
        }

        fn run_delay_ns(&self, thread: &ThreadWatch) -> Option<u64> {
            self.thread(thread.tid()).map(|t| t.run_delay_ns)
        }

        fn runnable(&self, thread: &ThreadWatch) -> bool {
            self.thread(thread.tid()).is_some_and(|t| t.runnable)
        }
    }

    #[test]
    fn the_fake_host_says_what_the_test_set() {
        let fake = FakeSched::at(7);
        let (a, b) = (ThreadWatch::clock_only(11), ThreadWatch::clock_only(12));
        assert_eq!(fake.now_ns(), 7);
        fake.advance(3);
        assert_eq!(fake.now_ns(), 10, "time moves only when told");
        assert_eq!(fake.cpu_ns_and_running(&a), None, "no such thread");
        assert_eq!(fake.run_delay_ns(&a), None);
        assert!(!fake.runnable(&a));
        let t = FakeThread {
            cpu_ns: 5,
            running: true,
            run_delay_ns: 9,
            runnable: true,
        };
        fake.set(11, t);
        assert_eq!(fake.cpu_ns_and_running(&a), Some((5, true)));
        assert_eq!(fake.run_delay_ns(&a), Some(9));
        assert!(fake.runnable(&a));
        assert_eq!(fake.cpu_ns_and_running(&b), None, "only the thread set");
        assert_eq!(fake.clock_reads(), 3);
        assert_eq!((fake.current_tid(), fake.current_run_delay_ns()), (0, 0));
        fake.call_as(11);
        assert_eq!((fake.current_tid(), fake.current_run_delay_ns()), (11, 9));
        fake.update(11, |t| t.running = false);
        assert_eq!(fake.cpu_ns_and_running(&a), Some((5, false)));
        let hooked = Arc::new(AtomicBool::new(false));
        fake.on_clock_read({
            let hooked = Arc::clone(&hooked);
            Box::new(move || hooked.store(true, Ordering::SeqCst))
        });
        assert!(!hooked.load(Ordering::SeqCst));
        fake.forget(11);
        assert_eq!(fake.cpu_ns_and_running(&a), None, "forgotten");
        assert!(hooked.load(Ordering::SeqCst), "run at the read");
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
    fn the_linux_host_reads_this_threads_clocks_through_the_watch() {
        let host = LinuxSched::new();
        let t0 = host.now_ns();
        assert!(host.now_ns() >= t0, "monotonic");
        let tid = host.current_tid();
        assert_eq!(tid, current_tid());
        let w = ThreadWatch::new(tid);
        let (cpu, _) = host
            .cpu_ns_and_running(&w)
            .expect("this thread's CPU clock");
        let (later, _) = host.cpu_ns_and_running(&w).unwrap();
        assert!(later >= cpu, "the same clock, read later");
        let delay = host.run_delay_ns(&w).expect("this thread's schedstat");
        assert!(host.current_run_delay_ns() >= delay, "read later");
        assert!(host.runnable(&w), "we are running");
        let bad = ThreadWatch::new(-5);
        assert_eq!(host.cpu_ns_and_running(&bad), None, "EINVAL");
        assert_eq!(host.run_delay_ns(&bad), None);
        assert!(!host.runnable(&bad));
    }

    #[test]
    fn schedstat_field_two_is_the_run_delay() {
        assert_eq!(parse_run_delay("1234 5678 9\n"), Some(5678));
        assert_eq!(parse_run_delay("1234"), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
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

    /// A thread that spins while `spin` is set and naps 1 ms at a time
    /// otherwise, until `stop`; returns its tid and its handle.
    fn spinner(
        spin: &Arc<AtomicBool>,
        stop: &Arc<AtomicBool>,
    ) -> (i32, std::thread::JoinHandle<()>) {
        let tid = Arc::new(AtomicI32::new(0));
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
        (tid.load(Ordering::SeqCst), t)
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
    fn another_threads_cpu_clock_is_readable_and_never_goes_back() {
        let (spin, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tid, t) = spinner(&spin, &stop);
        let w = ThreadWatch::new(tid);
        let a = w.cpu_ns().expect("a thread CPU clock of this process");
        let b = w.cpu_ns().unwrap();
        assert!(b >= a, "the same clock, read later: {a} -> {b}");
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    #[ignore = "host scheduler statistics: run by scripts/soak-host-sched.sh"]
    fn another_threads_cpu_clock_grows_while_it_runs_and_not_while_it_sleeps() {
        let (spin, stop) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tid, t) = spinner(&spin, &stop);
        let w = ThreadWatch::new(tid);
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

    /// The host CPUs the calling thread may run on.
    fn allowed_cpus() -> Vec<usize> {
        // SAFETY: all zeroes is a valid (empty) cpu_set_t.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the call writes at most `size_of_val(&set)` bytes to `set`.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `c` is below CPU_SETSIZE, within `set`.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// Keep thread `tid` (0: the caller) on the host CPUs `cpus`.
    fn pin(tid: i32, cpus: &[usize]) {
        // SAFETY: all zeroes is a valid (empty) cpu_set_t.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            // SAFETY: `cpu` comes from `allowed_cpus`, below CPU_SETSIZE.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: the call reads `size_of_val(&set)` bytes of `set`.
        let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        assert_eq!(r, 0, "pin thread {tid} to CPUs {cpus:?}");
    }

    #[test]
    #[ignore = "host scheduler statistics: run by scripts/soak-host-sched.sh"]
    fn a_sleeping_thread_is_seen_off_the_cpus_and_a_spinning_one_on_them() {
        // What `Vcpu::mark_descheduled_peers` and the sampler rely on: a
        // thread's CPU clock stands still between two reads while it sleeps
        // and moves while it runs.
        let cpus = allowed_cpus();
        let (spin, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tid, t) = spinner(&spin, &stop);
        let host = LinuxSched::new();
        let w = ThreadWatch::clock_only(tid);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let asleep = (0..100)
            .filter(|_| host.cpu_ns_and_running(&w).is_some_and(|(_, r)| !r))
            .count();
        // It wakes every 1 ms for a few microseconds.
        assert!(asleep >= 90, "seen off the CPUs {asleep} of 100 times");
        if cpus.len() >= 2 {
            // Apart: sharing our CPU, it would be off it whenever we look
            // (which is what a spinning vCPU counts on).
            pin(tid, &cpus[..1]);
            pin(0, &cpus[1..2]);
            spin.store(true, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            let running = (0..100)
                .filter(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    host.cpu_ns_and_running(&w).is_some_and(|(_, r)| r)
                })
                .count();
            // Over 100 ms its CPU runs it at some of our looks, however
            // loaded.
            pin(0, &cpus);
            assert!(running > 0, "seen on a CPU {running} of 100 times");
        } else {
            eprintln!("one host CPU: a spinning thread is never seen running");
        }
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
    fn threads_we_spawn_block_signals_as_qemus_own_and_the_spawner_keeps_its_mask() {
        let is_blocked = |set: &libc::sigset_t, sig| {
            // SAFETY: a valid, initialised set.
            unsafe { libc::sigismember(set, sig) == 1 }
        };
        let before = blocked_signals();
        let seen = spawn_with_signals_blocked(std::thread::Builder::new(), move || {
            let set = blocked_signals();
            for sig in [
                libc::SIGINT,
                libc::SIGTERM,
                libc::SIGHUP,
                libc::SIGUSR1,
                libc::SIGCHLD,
            ] {
                assert!(is_blocked(&set, sig), "signal {sig} open");
            }
            for sig in [libc::SIGSEGV, libc::SIGFPE, libc::SIGILL] {
                assert!(!is_blocked(&set, sig), "synchronous signal {sig} blocked");
            }
        })
        .unwrap()
        .join();
        assert!(seen.is_ok());
        let after = blocked_signals();
        for sig in 1..32 {
            assert_eq!(
                is_blocked(&before, sig),
                is_blocked(&after, sig),
                "signal {sig}"
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
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
        // (Miri has no /proc of its own.)
        if !cfg!(miri) {
            assert!(ThreadWatch::new(current_tid()).runnable(), "we are running");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the real host (syscalls, /proc)")]
    fn this_threads_run_delay_is_read_and_never_goes_back() {
        let a = thread_run_delay_ns();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_run_delay_ns() >= a);
    }

    #[test]
    fn the_wall_clock_pair_skips_a_round_with_a_host_stall() {
        // Round 1: stalled 160 ms between the real-time reads; round 2: not.
        let reals = std::cell::RefCell::new(vec![1_000, 160_001_000, 200_000_000, 200_000_050]);
        let vms = std::cell::RefCell::new(vec![500, 199_999_525]);
        let next = |v: &std::cell::RefCell<Vec<u64>>| v.borrow_mut().remove(0);
        let (real, vm) = real_and_vm_ns(|| next(&reals), || next(&vms));
        assert_eq!((real, vm), (200_000_025, 199_999_525));
        assert_eq!(real - vm, 500, "the epoch of the stall-free round");
        // Always stalled: the closest round.
        let mut t = 0u64;
        let (real, _) = real_and_vm_ns(
            || {
                t += 1_000_000;
                t
            },
            || 0,
        );
        assert_eq!(real, 1_500_000);
    }
}
