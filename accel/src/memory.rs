//! Guest physical memory as the models see it.

/// Access to guest RAM. Implementations must refuse (return false, touch
/// nothing) any range that is not entirely RAM: MMIO, ROM, holes, or beyond
/// the end of memory. That is how a hostile GPA becomes a no-op, as in KVM.
pub trait GuestMemory {
    /// Read `buf.len()` bytes at `gpa`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> bool;
    /// Write `buf` at `gpa` (no atomicity: bytes may land in any order).
    fn write(&self, gpa: u64, buf: &[u8]) -> bool;
    /// Store `value` (little-endian) at `gpa` as one single-copy-atomic
    /// 4-byte store, as KVM's `put_user` of a `u32` field: a guest reading
    /// the field with one load sees the old value or the new one, never a
    /// mix. False, nothing written, unless `gpa` is 4-byte aligned and the
    /// 4 bytes are writable RAM.
    fn store_u32(&self, gpa: u64, value: u32) -> bool;
    /// As [`GuestMemory::store_u32`], 8 bytes, `gpa` 8-byte aligned.
    fn store_u64(&self, gpa: u64, value: u64) -> bool;
    /// Exchange the byte at `gpa` for `value` in one atomic
    /// read-modify-write, as KVM's `xchgb` on `steal_time.preempted`
    /// (`record_steal_time`): a guest's concurrent `cmpxchg` on the byte
    /// lands before or after it, never lost. The old byte; None, nothing
    /// written, unless the byte is writable RAM.
    fn xchg_u8(&self, gpa: u64, value: u8) -> Option<u8>;
    /// x86: the guest-physical address vCPU `index`'s paging maps
    /// `linear` to now (a walk without faults or accessed bits); None if
    /// none. Only on that vCPU's thread.
    fn x86_linear_to_gpa(&self, _index: u32, _linear: u64) -> Option<u64> {
        None
    }
}

/// Order the guest-RAM stores before it ahead of those after it, for a
/// guest that reads them on another CPU under a version protocol: KVM's
/// `smp_wmb()` between a PV structure's version and its data
/// (`record_steal_time`, `kvm_setup_guest_pvclock`). A release fence: a
/// compiler barrier on x86 (stores are not reordered with stores), a `dmb`
/// on arm64 hosts. The stores themselves are calls into QEMU, which the
/// compiler does not reorder either.
pub fn write_barrier() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// A guest-physical address: an x86 GPA, an arm64 IPA. Offsets saturate
/// at the top of the address space, where no RAM is: [`GuestRam`] refuses
/// any range that does not fit below 2^64, so a hostile address plus a
/// field offset can neither wrap nor panic.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gpa(pub u64);

impl Gpa {
    /// The raw address.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether the address is a multiple of `align` (a power of two).
    pub const fn is_aligned(self, align: u64) -> bool {
        self.0 & (align - 1) == 0
    }
}

impl std::ops::Add<u64> for Gpa {
    type Output = Gpa;
    /// The address `offset` bytes further, saturating (see [`Gpa`]).
    fn add(self, offset: u64) -> Gpa {
        Gpa(self.0.saturating_add(offset))
    }
}

impl std::fmt::LowerHex for Gpa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// The one accessor through which the models read and write guest RAM.
/// It provides what the guest's protocols need: ranges that are entirely
/// RAM or nothing ([`GuestMemory`]'s rule, plus no range past 2^64),
/// single-copy-atomic 4- and 8-byte stores, and the version protocol of
/// KVM's shared structures ([`GuestRam::versioned`]).
#[derive(Clone, Copy)]
pub struct GuestRam<'a>(&'a dyn GuestMemory);

impl std::fmt::Debug for GuestRam<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GuestRam")
    }
}

impl<'a> GuestRam<'a> {
    /// The accessor over the machine's memory.
    pub fn new(mem: &'a dyn GuestMemory) -> Self {
        GuestRam(mem)
    }

    /// Whether `len` bytes at `gpa` lie within the 2^64-byte address space.
    fn fits(gpa: Gpa, len: usize) -> bool {
        len == 0 || gpa.0.checked_add(len as u64 - 1).is_some()
    }

    /// Read `buf.len()` bytes at `gpa`; false (buf unspecified) unless all
    /// of it is RAM.
    pub fn read(self, gpa: Gpa, buf: &mut [u8]) -> bool {
        Self::fits(gpa, buf.len()) && self.0.read(gpa.0, buf)
    }

    /// `N` bytes at `gpa`, if all of them are RAM.
    pub fn read_array<const N: usize>(self, gpa: Gpa) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        self.read(gpa, &mut b).then_some(b)
    }

    /// Whether `len` bytes at `gpa` are all RAM (read, not written).
    pub fn is_ram(self, gpa: Gpa, len: usize) -> bool {
        // Probing the first and the last byte is enough for the models'
        // structures, each within one page.
        len == 0
            || (Self::fits(gpa, len)
                && self.read(gpa, &mut [0u8])
                && self.read(gpa + (len as u64 - 1), &mut [0u8]))
    }

    /// Write `bytes` at `gpa`, with no atomicity (bytes may land in any
    /// order): only for what the guest does not read concurrently (a
    /// structure being zeroed before use, a single byte).
    #[allow(clippy::disallowed_methods, reason = "the one accessor")]
    pub fn write(self, gpa: Gpa, bytes: &[u8]) -> bool {
        Self::fits(gpa, bytes.len()) && self.0.write(gpa.0, bytes)
    }

    /// One single-copy-atomic 4-byte store (see [`GuestMemory::store_u32`]).
    #[allow(clippy::disallowed_methods, reason = "the one accessor")]
    pub fn store_u32(self, gpa: Gpa, value: u32) -> bool {
        Self::fits(gpa, 4) && self.0.store_u32(gpa.0, value)
    }

    /// One single-copy-atomic 8-byte store (see [`GuestMemory::store_u64`]).
    #[allow(clippy::disallowed_methods, reason = "the one accessor")]
    pub fn store_u64(self, gpa: Gpa, value: u64) -> bool {
        Self::fits(gpa, 8) && self.0.store_u64(gpa.0, value)
    }

    /// One atomic byte exchange (see [`GuestMemory::xchg_u8`]): the old byte.
    #[allow(clippy::disallowed_methods, reason = "the one accessor")]
    pub fn xchg_u8(self, gpa: Gpa, value: u8) -> Option<u8> {
        if Self::fits(gpa, 1) {
            self.0.xchg_u8(gpa.0, value)
        } else {
            None
        }
    }

    /// A 4-byte field: one atomic store where aligned, else bytes (a
    /// guest's misaligned structure is written all the same, as KVM's
    /// `kvm_write_guest` does, without the atomicity it could not have).
    pub fn put_u32(self, gpa: Gpa, value: u32) -> bool {
        if gpa.is_aligned(4) {
            self.store_u32(gpa, value)
        } else {
            self.write(gpa, &value.to_le_bytes())
        }
    }

    /// An 8-byte field, as [`GuestRam::put_u32`].
    pub fn put_u64(self, gpa: Gpa, value: u64) -> bool {
        if gpa.is_aligned(8) {
            self.store_u64(gpa, value)
        } else {
            self.write(gpa, &value.to_le_bytes())
        }
    }

    /// KVM's version protocol for a structure the guest reads on another
    /// CPU (`record_steal_time`, `kvm_setup_guest_pvclock`,
    /// `kvm_write_wall_clock`): store `version` (odd) at `at`, a write
    /// barrier, `body`, a write barrier, `version + 1` (even). Nothing more
    /// is written if the first store fails; false then.
    pub fn versioned(self, at: Gpa, version: u32, body: impl FnOnce(GuestRam<'a>)) -> bool {
        if !self.put_u32(at, version) {
            return false;
        }
        write_barrier();
        body(self);
        write_barrier();
        self.put_u32(at, version.wrapping_add(1))
    }
}

/// Interrupt delivery to other vCPUs.
pub trait Interrupts {
    /// Send an IPI (`icr`: vector, delivery mode, level, trigger as in the
    /// ICR) to the vCPU with `apic_id`, physical destination; false if there
    /// is no such vCPU.
    fn send_ipi(&self, apic_id: u32, icr: u32) -> bool;
}

/// The machine's clock and timers.
pub trait Timers {
    /// QEMU's virtual clock: nanoseconds of VM time (stops while the VM is
    /// stopped, travels with it in migration). What the guest TSC counts.
    fn virtual_ns(&self) -> u64 {
        0
    }
    /// vCPU `index`'s TSC-deadline timer changed: QEMU re-arms its local
    /// APIC timer from `Vcpu::tsc_deadline_ns`. Called without any vCPU lock.
    fn tsc_deadline_changed(&self, _index: u32) {}
    /// Arm the machine's injection timer (`crate::inject`) at VM time
    /// `deadline_ns`, or disarm it (None); when it fires QEMU calls
    /// `rustkvm_inject_fire`.
    fn inject_timer(&self, _deadline_ns: Option<u64>) {}
    /// vCPU `index` may run again (its injected preemption ended): QEMU
    /// wakes its thread (`qemu_cpu_kick`).
    fn wake_vcpu(&self, _index: u32) {}
}

/// Threads of ours that are not vCPU threads (the steal sampler) follow
/// QEMU's rules before they touch guest memory: QEMU's memory API may only be
/// used by registered RCU readers (`rcu_register_thread`, docs/devel/rcu.rst),
/// or a FlatView can be freed under them.
pub trait Threads {
    /// The calling thread starts using guest memory (QEMU:
    /// `rcu_register_thread`). Called once, first, by the thread itself.
    fn thread_attach(&self) {}
    /// The calling thread is done with guest memory (QEMU:
    /// `rcu_unregister_thread`). Called last, by the thread itself.
    fn thread_detach(&self) {}
}

/// Everything the models need from the machine around them.
pub trait Host: GuestMemory + Interrupts + Timers + Threads {}

impl<T: GuestMemory + Interrupts + Timers + Threads> Host for T {}

/// Memory that has nothing: every access is refused.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMemory;

impl Interrupts for NoMemory {
    fn send_ipi(&self, _apic_id: u32, _icr: u32) -> bool {
        false
    }
}

impl Timers for NoMemory {}

impl Threads for NoMemory {}

impl GuestMemory for NoMemory {
    fn read(&self, _gpa: u64, _buf: &mut [u8]) -> bool {
        false
    }
    fn write(&self, _gpa: u64, _buf: &[u8]) -> bool {
        false
    }
    fn store_u32(&self, _gpa: u64, _value: u32) -> bool {
        false
    }
    fn store_u64(&self, _gpa: u64, _value: u64) -> bool {
        false
    }
    fn xchg_u8(&self, _gpa: u64, _value: u8) -> Option<u8> {
        None
    }
}

#[cfg(test)]
pub mod tests {
    //! A fake RAM for model tests that records every write.
    #![allow(clippy::disallowed_methods)]
    use super::GuestMemory;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// `size` bytes of RAM at GPA 0 with a write log (shareable between
    /// threads, as the machine's memory is).
    #[derive(Debug)]
    pub struct FakeRam {
        bytes: Mutex<Vec<u8>>,
        log: Mutex<Vec<(u64, Vec<u8>)>>,
        clock: Option<Arc<AtomicU64>>,
        /// Threads that called `thread_attach` (and not `thread_detach`).
        attached: Mutex<Vec<std::thread::ThreadId>>,
        /// Names of the threads that ever called `thread_attach`.
        attached_names: Mutex<Vec<String>>,
        /// Writes from a spawned thread that had not attached.
        unattached_writes: AtomicU64,
        /// (gpa, size) of every single-copy-atomic store, in order.
        stores: Mutex<Vec<(u64, usize)>>,
        /// The injection timer's deadline as last armed (None: disarmed).
        pub inject_timer: Mutex<Option<u64>>,
        /// vCPUs woken (`wake_vcpu`), in order.
        pub woken: Mutex<Vec<u32>>,
    }

    impl FakeRam {
        /// Zeroed RAM; the VM clock stands at 0.
        pub fn new(size: usize) -> Self {
            FakeRam {
                bytes: Mutex::new(vec![0; size]),
                log: Mutex::new(Vec::new()),
                clock: None,
                attached: Mutex::new(Vec::new()),
                attached_names: Mutex::new(Vec::new()),
                unattached_writes: AtomicU64::new(0),
                stores: Mutex::new(Vec::new()),
                inject_timer: Mutex::new(None),
                woken: Mutex::new(Vec::new()),
            }
        }
        /// Zeroed RAM whose VM clock (`Timers::virtual_ns`) is `clock`.
        pub fn with_clock(size: usize, clock: Arc<AtomicU64>) -> Self {
            FakeRam {
                clock: Some(clock),
                ..FakeRam::new(size)
            }
        }
        /// Writes made by a thread named `rustkvm-*` (ours, not a vCPU's
        /// stand-in in a test) that had not called `thread_attach`.
        pub fn unattached_writes(&self) -> u64 {
            self.unattached_writes.load(Ordering::SeqCst)
        }
        /// (gpa, size) of the single-copy-atomic stores so far, in order.
        pub fn atomic_stores(&self) -> Vec<(u64, usize)> {
            self.stores.lock().clone()
        }
        /// Names of the threads that ever attached.
        pub fn attached_names(&self) -> Vec<String> {
            self.attached_names.lock().clone()
        }
        /// Writes so far.
        pub fn write_count(&self) -> usize {
            self.log.lock().len()
        }
        /// Writes that touched bytes outside `[base, base + len)`.
        pub fn writes_outside(&self, base: u64, len: u64) -> usize {
            self.log
                .lock()
                .iter()
                .filter(|(g, b)| *g < base || g + b.len() as u64 > base + len)
                .count()
        }
        /// (gpa, length) of every write after the first `skip`, in order.
        pub fn writes_since(&self, skip: usize) -> Vec<(u64, usize)> {
            self.log
                .lock()
                .iter()
                .skip(skip)
                .map(|(g, b)| (*g, b.len()))
                .collect()
        }
        /// The RAM's size in bytes.
        pub fn size(&self) -> u64 {
            self.bytes.lock().len() as u64
        }
        /// Writes at exactly `gpa` since the first `skip` writes.
        pub fn byte_writes(&self, gpa: u64, skip: usize) -> usize {
            self.log
                .lock()
                .iter()
                .skip(skip)
                .filter(|(g, _)| *g == gpa)
                .count()
        }
        /// Every u32 written at `gpa`, in order.
        pub fn version_history(&self, gpa: u64) -> Vec<u32> {
            self.log
                .lock()
                .iter()
                .filter(|(g, b)| *g == gpa && b.len() == 4)
                .map(|(_, b)| u32::from_le_bytes(b[..4].try_into().unwrap()))
                .collect()
        }
    }

    impl super::Timers for FakeRam {
        fn virtual_ns(&self) -> u64 {
            self.clock.as_ref().map_or(0, |c| c.load(Ordering::SeqCst))
        }
        fn inject_timer(&self, deadline_ns: Option<u64>) {
            *self.inject_timer.lock() = deadline_ns;
        }
        fn wake_vcpu(&self, index: u32) {
            self.woken.lock().push(index);
        }
    }

    impl super::Threads for FakeRam {
        fn thread_attach(&self) {
            let me = std::thread::current();
            self.attached.lock().push(me.id());
            self.attached_names
                .lock()
                .push(me.name().unwrap_or("").to_string());
        }
        fn thread_detach(&self) {
            let me = std::thread::current().id();
            self.attached.lock().retain(|t| *t != me);
        }
    }

    impl super::Interrupts for FakeRam {
        fn send_ipi(&self, _apic_id: u32, _icr: u32) -> bool {
            false
        }
    }

    /// One FakeRam shared by a machine and the test that inspects it.
    impl super::Timers for Arc<FakeRam> {
        fn virtual_ns(&self) -> u64 {
            (**self).virtual_ns()
        }
        fn inject_timer(&self, deadline_ns: Option<u64>) {
            (**self).inject_timer(deadline_ns)
        }
        fn wake_vcpu(&self, index: u32) {
            (**self).wake_vcpu(index)
        }
    }

    impl super::Threads for Arc<FakeRam> {
        fn thread_attach(&self) {
            (**self).thread_attach()
        }
        fn thread_detach(&self) {
            (**self).thread_detach()
        }
    }

    impl super::Interrupts for Arc<FakeRam> {
        fn send_ipi(&self, apic_id: u32, icr: u32) -> bool {
            (**self).send_ipi(apic_id, icr)
        }
    }

    impl GuestMemory for Arc<FakeRam> {
        fn x86_linear_to_gpa(&self, index: u32, linear: u64) -> Option<u64> {
            (**self).x86_linear_to_gpa(index, linear)
        }
        fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
            (**self).read(gpa, buf)
        }
        fn write(&self, gpa: u64, buf: &[u8]) -> bool {
            (**self).write(gpa, buf)
        }
        fn store_u32(&self, gpa: u64, value: u32) -> bool {
            (**self).store_u32(gpa, value)
        }
        fn store_u64(&self, gpa: u64, value: u64) -> bool {
            (**self).store_u64(gpa, value)
        }
        fn xchg_u8(&self, gpa: u64, value: u8) -> Option<u8> {
            (**self).xchg_u8(gpa, value)
        }
    }

    impl FakeRam {
        /// A store of `bytes` as one unit: aligned, inside RAM; logged as
        /// a write and as an atomic store.
        fn store(&self, gpa: u64, bytes: &[u8]) -> bool {
            let size = bytes.len();
            if gpa % size as u64 != 0 || !self.write(gpa, bytes) {
                return false;
            }
            self.stores.lock().push((gpa, size));
            true
        }
    }

    impl GuestMemory for FakeRam {
        /// Paging off: linear addresses are physical, inside the RAM.
        fn x86_linear_to_gpa(&self, _index: u32, linear: u64) -> Option<u64> {
            (linear < self.size()).then_some(linear)
        }
        fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
            let bytes = self.bytes.lock();
            let Some(end) = gpa
                .checked_add(buf.len() as u64)
                .filter(|e| *e <= bytes.len() as u64)
            else {
                return false;
            };
            buf.copy_from_slice(&bytes[gpa as usize..end as usize]);
            true
        }
        fn write(&self, gpa: u64, buf: &[u8]) -> bool {
            let mut bytes = self.bytes.lock();
            let Some(end) = gpa
                .checked_add(buf.len() as u64)
                .filter(|e| *e <= bytes.len() as u64)
            else {
                return false;
            };
            bytes[gpa as usize..end as usize].copy_from_slice(buf);
            self.log.lock().push((gpa, buf.to_vec()));
            let me = std::thread::current();
            if me.name().is_some_and(|n| n.starts_with("rustkvm-"))
                && !self.attached.lock().contains(&me.id())
            {
                self.unattached_writes.fetch_add(1, Ordering::SeqCst);
            }
            true
        }
        fn store_u32(&self, gpa: u64, value: u32) -> bool {
            self.store(gpa, &value.to_le_bytes())
        }
        fn store_u64(&self, gpa: u64, value: u64) -> bool {
            self.store(gpa, &value.to_le_bytes())
        }
        fn xchg_u8(&self, gpa: u64, value: u8) -> Option<u8> {
            // One lock held across the read and the write: atomic against
            // the tests' other accesses, which take the same lock.
            let mut bytes = self.bytes.lock();
            let old = *bytes.get(usize::try_from(gpa).ok()?)?;
            bytes[gpa as usize] = value;
            drop(bytes);
            self.log.lock().push((gpa, vec![value]));
            self.stores.lock().push((gpa, 1));
            Some(old)
        }
    }

    /// Memory that claims every range is RAM and counts the calls: what
    /// reaches the backend at all.
    #[derive(Default)]
    struct Everything(std::sync::atomic::AtomicUsize);

    impl GuestMemory for Everything {
        fn read(&self, _gpa: u64, _buf: &mut [u8]) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn write(&self, _gpa: u64, _buf: &[u8]) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn store_u32(&self, _gpa: u64, _value: u32) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn store_u64(&self, _gpa: u64, _value: u64) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn xchg_u8(&self, _gpa: u64, _value: u8) -> Option<u8> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Some(0)
        }
    }

    #[test]
    fn no_access_wraps_the_address_space() {
        use super::{Gpa, GuestRam};
        assert_eq!(Gpa(u64::MAX - 2) + 8, Gpa(u64::MAX), "offsets saturate");
        let mem = Everything::default();
        let ram = GuestRam::new(&mem);
        let top = Gpa(u64::MAX - 3);
        assert!(!ram.write(top, &[0; 8]));
        assert!(!ram.store_u64(top, 1));
        assert!(!ram.put_u32(top + 2, 1));
        assert!(!ram.read(top, &mut [0; 8]));
        assert!(!ram.is_ram(top, 64));
        assert!(!ram.versioned(top + 4, 1, |_| panic!("no body after a refused version")));
        assert_eq!(
            mem.0.load(Ordering::SeqCst),
            0,
            "nothing reached the backend"
        );
        assert!(ram.store_u32(top, 1), "4 bytes still fit");
        // A hostile wall-clock GPA at the top: nothing written, no panic.
        crate::x86::clock::write_wall_clock(&FakeRam::new(4096), u64::MAX - 3, 0, 1 << 40);
    }

    #[test]
    fn versioned_writes_odd_version_body_even_version_in_order() {
        use super::{Gpa, GuestRam};
        let ram = FakeRam::new(64);
        let g = GuestRam::new(&ram);
        assert!(g.versioned(Gpa(8), 3, |g| {
            assert!(g.store_u64(Gpa(0), 7));
            assert!(g.put_u32(Gpa(13), 9), "misaligned: bytes");
        }));
        assert_eq!(ram.writes_since(0), vec![(8, 4), (0, 8), (13, 4), (8, 4)]);
        assert_eq!(ram.atomic_stores(), vec![(8, 4), (0, 8), (8, 4)]);
        assert_eq!(ram.version_history(8), vec![3, 4]);
    }
}
