//! Runtime for rustkvm's bundled test guests: boot code, a serial console, a
//! fault catcher and the result protocol the host runner reads.
//!
//! Protocol (one line each on the serial console):
//! - `# text`: commentary;
//! - `measure <key> <value>`: something the guest measured (the main job
//!   prints these, and the runner compares them across backends);
//! - `ok <name>`, `not ok <name>: <why>`, `skip <name>: <why>`;
//!
//! and the exit status: 0 all ok, 1 something failed, 2 skipped, 0x40 + n an
//! unexpected exception (x86: n = vector; arm64: n = ESR.EC). All stay below
//! 128 so that x86's `isa-debug-exit` status `(v << 1) | 1` fits a byte.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod arch;
pub mod console;
pub mod cross;
pub mod workload;
#[cfg(target_arch = "x86_64")]
pub mod x86_pmu;

use core::fmt::{self, Write};

pub use arch::exit;
use console::Console;

/// Exit status: every check passed.
pub const EXIT_PASS: u32 = 0;
/// Exit status: at least one check failed.
pub const EXIT_FAIL: u32 = 1;
/// Exit status: the test does not apply here (e.g. feature absent).
pub const EXIT_SKIP: u32 = 2;

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

    /// Record a skipped check.
    pub fn skip(&mut self, name: &str, why: &str) {
        self.skipped += 1;
        println!("skip {name}: {why}");
    }

    /// Report a measured value.
    pub fn measure(&mut self, key: &str, value: fmt::Arguments<'_>) {
        println!("measure {key} {value}");
    }

    /// Print the summary and exit with the protocol's status.
    pub fn finish(&self) -> ! {
        println!(
            "# {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        );
        let status = if self.failed > 0 {
            EXIT_FAIL
        } else if self.passed == 0 && self.skipped > 0 {
            EXIT_SKIP
        } else {
            EXIT_PASS
        };
        exit(status)
    }
}

/// Write formatted text to the serial console.
pub fn _print(args: fmt::Arguments<'_>) {
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
    println!("not ok panic: {info}");
    exit(EXIT_FAIL)
}
