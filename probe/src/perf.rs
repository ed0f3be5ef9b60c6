//! `perf_event_open(2)` for hardware events (uapi `linux/perf_event.h`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// PERF_TYPE_HARDWARE.
pub const PERF_TYPE_HARDWARE: u32 = 0;
/// PERF_COUNT_HW_CPU_CYCLES.
pub const HW_CPU_CYCLES: u64 = 0;
/// PERF_COUNT_HW_INSTRUCTIONS.
pub const HW_INSTRUCTIONS: u64 = 1;
/// PERF_COUNT_HW_BRANCH_INSTRUCTIONS.
pub const HW_BRANCH_INSTRUCTIONS: u64 = 4;
/// PERF_COUNT_HW_REF_CPU_CYCLES.
pub const HW_REF_CPU_CYCLES: u64 = 9;

/// attr.flags bit 0: start disabled.
const FLAG_DISABLED: u64 = 1 << 0;
/// attr.flags bit 5: don't count kernel mode.
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
/// attr.flags bit 6: don't count hypervisor mode.
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
/// PERF_SAMPLE_IP.
pub const SAMPLE_IP: u64 = 1 << 0;
/// PERF_RECORD_LOST.
pub const RECORD_LOST: u32 = 2;
/// PERF_RECORD_SAMPLE.
pub const RECORD_SAMPLE: u32 = 9;
/// PERF_RECORD_THROTTLE: the kernel stopped sampling until the next tick
/// (too many samples per tick, `kernel.perf_event_max_sample_rate`).
pub const RECORD_THROTTLE: u32 = 5;

/// `_IO('$', 0)`.
const IOC_ENABLE: u64 = 0x2400;
/// `_IO('$', 1)`.
const IOC_DISABLE: u64 = 0x2401;
/// `_IO('$', 3)`.
const IOC_RESET: u64 = 0x2403;

/// `struct perf_event_attr` up to `sig_data` (PERF_ATTR_SIZE_VER7, 128 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PerfEventAttr {
    /// Event type (PERF_TYPE_*).
    pub type_: u32,
    /// sizeof(struct).
    pub size: u32,
    /// Event within the type.
    pub config: u64,
    /// Sample period (or frequency).
    pub sample_period: u64,
    /// PERF_SAMPLE_* bits.
    pub sample_type: u64,
    /// PERF_FORMAT_* bits.
    pub read_format: u64,
    /// The bitfield word (disabled, exclude_kernel, ...).
    pub flags: u64,
    /// Wake up every n events/bytes.
    pub wakeup_events: u32,
    /// Breakpoint type.
    pub bp_type: u32,
    /// config1.
    pub config1: u64,
    /// config2.
    pub config2: u64,
    /// Branch sample type.
    pub branch_sample_type: u64,
    /// User registers to sample.
    pub sample_regs_user: u64,
    /// User stack to sample.
    pub sample_stack_user: u32,
    /// Clock id.
    pub clockid: i32,
    /// Interrupt registers to sample.
    pub sample_regs_intr: u64,
    /// AUX watermark.
    pub aux_watermark: u32,
    /// Max callchain depth.
    pub sample_max_stack: u16,
    /// Reserved.
    pub reserved_2: u16,
    /// AUX sample size.
    pub aux_sample_size: u32,
    /// Reserved.
    pub reserved_3: u32,
    /// Signal data.
    pub sig_data: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 128);

impl PerfEventAttr {
    /// A disabled, user-only hardware counter for `config`.
    pub fn hardware_user(config: u64) -> Self {
        PerfEventAttr {
            type_: PERF_TYPE_HARDWARE,
            size: std::mem::size_of::<Self>() as u32,
            config,
            flags: FLAG_DISABLED | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV,
            ..Default::default()
        }
    }
}

/// An open perf event.
#[derive(Debug)]
pub struct Counter {
    fd: OwnedFd,
}

impl Counter {
    /// Open `attr` for this thread on any CPU.
    pub fn open(attr: &PerfEventAttr) -> io::Result<Counter> {
        // SAFETY: attr points to a valid perf_event_attr of the size it says.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr as *const PerfEventAttr,
                0 as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                0 as libc::c_ulong,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new file descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Counter { fd })
    }

    fn ioctl(&self, req: u64) -> io::Result<()> {
        // SAFETY: perf ioctls without an argument on our own descriptor.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Zero, enable.
    pub fn start(&self) -> io::Result<()> {
        self.ioctl(IOC_RESET)?;
        self.ioctl(IOC_ENABLE)
    }

    /// Disable.
    pub fn stop(&self) -> io::Result<()> {
        self.ioctl(IOC_DISABLE)
    }

    /// Read the count.
    pub fn read(&self) -> io::Result<u64> {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a u64 from our own descriptor.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n != 8 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }

    /// The raw descriptor (for mmap).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Count `config` (user mode only) around `work`.
pub fn count_around(config: u64, work: impl FnOnce()) -> io::Result<u64> {
    let c = Counter::open(&PerfEventAttr::hardware_user(config))?;
    c.start()?;
    work();
    c.stop()?;
    c.read()
}

/// Sampling result: overflow samples and lost records in the ring buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Samples {
    /// PERF_RECORD_SAMPLE records.
    pub samples: u64,
    /// Records the kernel reported lost.
    pub lost: u64,
    /// Times the kernel throttled the event (no samples until its next tick).
    pub throttled: u64,
    /// The event's whole count over the work (every period's, and the
    /// remainder): `count / period` overflows were due.
    pub count: u64,
}

/// Sample `config` every `period` events around `work`, and count the
/// samples that reached the ring buffer.
pub fn sample_around(config: u64, period: u64, work: impl FnOnce()) -> io::Result<Samples> {
    const DATA_PAGES: usize = 16;
    let mut attr = PerfEventAttr::hardware_user(config);
    attr.sample_period = period;
    attr.sample_type = SAMPLE_IP;
    let c = Counter::open(&attr)?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = page * (1 + DATA_PAGES);
    // SAFETY: mapping the perf ring buffer of our own descriptor, as
    // perf_event_open(2) describes; unmapped below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            c.raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        c.start()?;
        work();
        c.stop()?;
        // struct perf_event_mmap_page: data_head at 1024, data_offset at 1040,
        // data_size at 1048.
        // SAFETY: the first page is the kernel's control page.
        let (head, off, size) = unsafe {
            let p = base.cast::<u8>();
            let head = p.add(1024).cast::<u64>().read_volatile();
            let off = p.add(1040).cast::<u64>().read_volatile();
            let size = p.add(1048).cast::<u64>().read_volatile();
            (head, off, size)
        };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let (off, size) = if size == 0 {
            (page as u64, (page * DATA_PAGES) as u64)
        } else {
            (off, size)
        };
        let mut out = Samples {
            samples: 0,
            lost: 0,
            throttled: 0,
            count: c.read()?,
        };
        let mut pos = head.saturating_sub(size);
        while pos + 8 <= head {
            // SAFETY: within the data area (wrapping modulo its size); a
            // record header is 8 bytes and never straddles the wrap point
            // at 8-byte alignment.
            let (ty, rsize, lost) = unsafe {
                let rec = base.cast::<u8>().add((off + pos % size) as usize);
                let ty = rec.cast::<u32>().read_unaligned();
                let rsize = rec.add(6).cast::<u16>().read_unaligned();
                let lost = if ty == RECORD_LOST && (pos % size) + 24 <= size {
                    rec.add(16).cast::<u64>().read_unaligned()
                } else {
                    0
                };
                (ty, rsize, lost)
            };
            if rsize == 0 {
                break;
            }
            match ty {
                RECORD_SAMPLE => out.samples += 1,
                RECORD_LOST => out.lost += lost,
                RECORD_THROTTLE => out.throttled += 1,
                _ => {}
            }
            pos += u64::from(rsize);
        }
        Ok(out)
    })();
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(base, len) };
    result
}
