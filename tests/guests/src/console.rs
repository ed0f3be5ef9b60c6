//! The serial console (x86 COM1, arm64 PL011 on the virt machine).

use core::fmt;

/// Zero-sized handle to the board's first UART.
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
