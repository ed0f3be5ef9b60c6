//! The serial console (x86 COM1, arm64 PL011 on the virt machine).
//!
//! Any vCPU may print: [`crate::print!`] holds a spinlock for the whole
//! formatted text, so one `println!` is one unbroken line on the console
//! even when several vCPUs print at once.

use core::fmt;
use core::sync::atomic::{AtomicBool, Ordering};

/// Zero-sized handle to the board's first UART (unlocked: see [`lock`]).
#[derive(Debug, Clone, Copy)]
pub struct Console;

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                crate::arch::putc(b'\r');
            }
            crate::arch::putc(b);
        }
        Ok(())
    }
}

/// Held while some vCPU writes to the console.
static LOCKED: AtomicBool = AtomicBool::new(false);

/// The console, held until the guard is dropped.
#[derive(Debug)]
pub struct Guard(());

impl Drop for Guard {
    fn drop(&mut self) {
        LOCKED.store(false, Ordering::Release);
    }
}

/// Take the console for one vCPU (spins while another vCPU prints).
pub fn lock() -> Guard {
    while LOCKED
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    Guard(())
}
