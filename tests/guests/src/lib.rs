//! Runtime for rustkvm's bundled test guests: boot code, a serial console, a
//! fault catcher and the result protocol the host runner reads.
//!
//! Protocol (one line each on the serial console):
//! - `# text`: commentary;
//! - `measure <key> <value>`: something the guest measured (the main job
//!   prints these, and the runner compares them across backends);
//! - `ok <name>`, `not ok <name>: <why>`, `skip <name>: <why>`;
//! - last, `summary checks=<n> passed=<p> failed=<f> skipped=<s>`: the
//!   guest's own count of the lines above. A run passes only with this line,
//!   and only when it agrees with the `ok`/`not ok`/`skip` lines the runner
//!   saw and with the exit status: exiting 0 is not passing;
//!
//! and the exit status: 0 all ok, 1 something failed, 2 skipped, 0x40 + n an
//! unexpected exception (x86: n = vector; arm64: n = ESR.EC). All stay below
//! 128 so that x86's `isa-debug-exit` status `(v << 1) | 1` fits a byte.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod arch;
pub mod console;
pub mod counted;
pub mod cross;
#[cfg(target_arch = "aarch64")]
pub mod gic;
#[cfg(target_arch = "x86_64")]
pub mod kvmclock;
pub mod paging;
#[cfg(target_arch = "x86_64")]
pub mod pv_eoi;
pub mod steal;
pub mod workload;
#[cfg(target_arch = "x86_64")]
pub mod x86_pmu;

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, Ordering};

pub use arch::exit;
use console::Console;

/// Exit status: every check passed.
pub const EXIT_PASS: u32 = 0;
/// Exit status: at least one check failed.
pub const EXIT_FAIL: u32 = 1;
/// Exit status: the test does not apply here (e.g. feature absent).
pub const EXIT_SKIP: u32 = 2;

/// What runs the guest, as the runner says in the fw_cfg file
/// `opt/rustkvm/backend` (`tcg`, `rustkvm`, `kvm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Stock TCG.
    Tcg,
    /// `-accel rustkvm` (TCG with rustkvm's models).
    Rustkvm,
    /// `-accel rustkvm,backend=kvm` (the host's KVM).
    Kvm,
}

/// fw_cfg's file directory item (FW_CFG_FILE_DIR).
const FW_CFG_FILE_DIR: u16 = 0x19;

/// Read the fw_cfg file `name` into `buf`: its length, or None if absent.
pub fn fw_cfg_file(name: &str, buf: &mut [u8]) -> Option<usize> {
    let be32 = || (0..4).fold(0u32, |v, _| (v << 8) | u32::from(arch::fw_cfg_read()));
    arch::fw_cfg_select(FW_CFG_FILE_DIR);
    let count = be32();
    for _ in 0..count.min(4096) {
        // struct FWCfgFile: be32 size, be16 select, be16 reserved, name[56].
        let size = be32() as usize;
        let select = (u16::from(arch::fw_cfg_read()) << 8) | u16::from(arch::fw_cfg_read());
        let _ = (arch::fw_cfg_read(), arch::fw_cfg_read());
        let mut matches = true;
        let want = name.as_bytes();
        for i in 0..56 {
            let b = arch::fw_cfg_read();
            let w = want.get(i).copied().unwrap_or(0);
            matches &= b == w || (i > want.len() && b == 0);
        }
        if matches {
            arch::fw_cfg_select(select);
            let n = size.min(buf.len());
            for b in &mut buf[..n] {
                *b = arch::fw_cfg_read();
            }
            return Some(n);
        }
    }
    None
}

/// The number of vCPUs the machine started with (fw_cfg's FW_CFG_NB_CPUS,
/// QEMU's `-smp` cpus, little-endian).
pub fn boot_cpus() -> u16 {
    /// FW_CFG_NB_CPUS.
    const FW_CFG_NB_CPUS: u16 = 0x05;
    arch::fw_cfg_select(FW_CFG_NB_CPUS);
    u16::from(arch::fw_cfg_read()) | (u16::from(arch::fw_cfg_read()) << 8)
}

/// The backend the runner says runs this guest (None: not told).
pub fn backend() -> Option<Backend> {
    use core::sync::atomic::{AtomicU8, Ordering};
    /// 0: not read yet; 1..=3: a backend; 4: not told.
    static CACHED: AtomicU8 = AtomicU8::new(0);
    let code = match CACHED.load(Ordering::Relaxed) {
        0 => {
            let mut buf = [0u8; 16];
            let n = fw_cfg_file("opt/rustkvm/backend", &mut buf).unwrap_or(0);
            let code = match &buf[..n] {
                b"tcg" => 1,
                b"rustkvm" => 2,
                b"kvm" => 3,
                _ => 4,
            };
            CACHED.store(code, Ordering::Relaxed);
            code
        }
        c => c,
    };
    match code {
        1 => Some(Backend::Tcg),
        2 => Some(Backend::Rustkvm),
        3 => Some(Backend::Kvm),
        _ => None,
    }
}

/// How far a measured count may be from the exact one, stated once per
/// test: emulation (tcg, rustkvm) counts exactly; hardware (`kvm`) has skid
/// and counts around the measured code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tolerance {
    /// Allowed difference on the `kvm` backend.
    pub hardware: u64,
}

impl Tolerance {
    /// Exact everywhere.
    pub const EXACT: Tolerance = Tolerance { hardware: 0 };

    /// The difference allowed on the backend running this guest.
    pub fn here(self) -> u64 {
        if backend() == Some(Backend::Kvm) {
            self.hardware
        } else {
            0
        }
    }
}

/// Spin until `cond` holds, for at most 2 * 10^9 tries (a hang guard, not a
/// time limit): whether it held.
pub fn spin_until(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..2_000_000_000u64 {
        if cond() {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Wait for a byte from the host on the serial console, for at most `ticks`
/// of the clock `now` (the host test's "go on"): whether one came.
pub fn wait_for_host(ticks: u64, now: impl Fn() -> u64) -> bool {
    let t0 = now();
    while now().wrapping_sub(t0) < ticks {
        if arch::getc().is_some() {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Whether the host test has said "go on" with a byte on the serial console,
/// without waiting. The migration tests' protocol (tests/src/migrate.rs):
/// after `ready`, a guest keeps its feature busy until this turns true,
/// which happens only on the destination of the move, once it runs.
pub fn host_said_go() -> bool {
    arch::getc().is_some()
}

/// Checks that failed on any vCPU through [`report_failure`]; the boot
/// vCPU's [`Test::finish`] counts them with its own.
static FAILED_ELSEWHERE: AtomicU32 = AtomicU32::new(0);

/// Record a failed check from any vCPU (the [`Test`] belongs to the boot
/// vCPU): prints `not ok name: why` as one line and counts it, so the
/// closing summary agrees with the lines printed.
pub fn report_failure(name: fmt::Arguments<'_>, why: fmt::Arguments<'_>) {
    FAILED_ELSEWHERE.fetch_add(1, Ordering::Relaxed);
    println!("not ok {name}: {why}");
}

/// Result collector handed to each guest's `main`.
#[derive(Debug, Default)]
pub struct Test {
    passed: u32,
    failed: u32,
    skipped: u32,
}

impl Test {
    /// Record a check: `ok name` or `not ok name: why`.
    pub fn check(&mut self, name: &str, pass: bool, why: fmt::Arguments<'_>) {
        if pass {
            self.passed += 1;
            println!("ok {name}");
        } else {
            self.failed += 1;
            println!("not ok {name}: {why}");
        }
    }

    /// Record a check of `got == want`.
    pub fn eq<T: PartialEq + fmt::Debug>(&mut self, name: &str, got: T, want: T) {
        let pass = got == want;
        self.check(name, pass, format_args!("got {got:?}, want {want:?}"));
    }

    /// A count: `want` exactly under emulation, within `tol` on hardware.
    pub fn count(&mut self, name: &str, got: u64, want: u64, tol: Tolerance) {
        let slack = tol.here();
        self.check(
            name,
            got.abs_diff(want) <= slack,
            format_args!("got {got}, want {want} ± {slack}"),
        );
    }

    /// Record a skipped check.
    pub fn skip(&mut self, name: &str, why: &str) {
        self.skipped += 1;
        println!("skip {name}: {why}");
    }

    /// Report a measured value.
    pub fn measure(&mut self, key: &str, value: fmt::Arguments<'_>) {
        println!("measure {key} {value}");
    }

    /// Print the closing summary line and exit with the protocol's status.
    /// Failures other vCPUs reported ([`report_failure`]) count here.
    pub fn finish(&self) -> ! {
        let failed = self.failed + FAILED_ELSEWHERE.load(Ordering::Relaxed);
        println!(
            "summary checks={} passed={} failed={} skipped={}",
            self.passed + failed + self.skipped,
            self.passed,
            failed,
            self.skipped
        );
        let status = if failed > 0 {
            EXIT_FAIL
        } else if self.passed == 0 && self.skipped > 0 {
            EXIT_SKIP
        } else {
            EXIT_PASS
        };
        exit(status)
    }
}

/// Write formatted text to the serial console, holding the console lock
/// (one call's text is never interleaved with another vCPU's).
pub fn _print(args: fmt::Arguments<'_>) {
    let _guard = console::lock();
    let _ = Console.write_fmt(args);
}

/// `print!` to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::_print(format_args!($($arg)*)) };
}

/// `println!` to the serial console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => { $crate::_print(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Define the guest's entry point: `guest::entry!(main)` with
/// `fn main(t: &mut guest::Test)`.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[no_mangle]
        extern "C" fn guest_main() -> ! {
            let mut t = $crate::Test::default();
            let main: fn(&mut $crate::Test) = $main;
            main(&mut t);
            t.finish()
        }
    };
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // Unlocked: the panicking vCPU may hold the console lock itself.
    let _ = writeln!(Console, "not ok panic: {info}");
    exit(EXIT_FAIL)
}
