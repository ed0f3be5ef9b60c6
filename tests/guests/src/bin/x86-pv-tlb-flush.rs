//! rustkvm-test: arch=x86_64 smp=2 cpu=max compare=off vary=flush.waited-ticks
//! rustkvm-expect: tcg=skip
//!   (no KVM signature under stock TCG)
//! rustkvm-expect-skip: rustkvm/default deferred-flush-seen-on-resume
//! rustkvm-expect-skip: rustkvm/mttcg-smp2 deferred-flush-seen-on-resume
//! rustkvm-expect-skip: kvm deferred-flush-seen-on-resume
//!   (under MTTCG a vCPU is preempted only when the host deschedules its
//!   thread: on an idle host the BSP may never see the AP's flag)
//!
//! KVM's PV TLB flush (KVM_FEATURE_PV_TLB_FLUSH, Documentation/virt/kvm/x86/
//! cpuid.rst; arch/x86/kvm/x86.c `record_steal_time`): instead of sending a
//! TLB-flush IPI to a vCPU whose steal-time `preempted` says it is
//! preempted, a guest ORs KVM_VCPU_FLUSH_TLB into that byte (Linux's
//! `kvm_flush_tlb_multi`: cmpxchg PREEMPTED -> PREEMPTED|FLUSH_TLB), and the
//! host flushes that vCPU's TLB before it runs guest code again.
//!
//! The AP reads a virtual page over and over (its TLB caches the
//! translation). The BSP points the page's PTE at another page, waits until
//! the AP is marked preempted, sets FLUSH_TLB instead of an IPI, and checks
//! that the AP, once resumed, reads the new page and finds its flag clear.
//! Under `thread=single` and `-icount` the vCPUs take turns, so the AP is
//! preempted whenever the BSP runs; without the host's flush the AP reads
//! the old page from its TLB (TCG keeps it until a flush), which fails.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pv-tlb-flush", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod flush {
    use core::ptr::{addr_of, addr_of_mut};
    use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};
    use guest::arch::{self, KvmStealTime, MSR_KVM_STEAL_TIME};
    use guest::paging::{self, Table};

    /// CPUID 0x40000001 EAX bit 9.
    pub const KVM_FEATURE_PV_TLB_FLUSH: u32 = 1 << 9;
    /// `preempted` bit 0.
    pub const KVM_VCPU_PREEMPTED: u8 = 1 << 0;
    /// `preempted` bit 1.
    pub const KVM_VCPU_FLUSH_TLB: u8 = 1 << 1;
    /// The page the AP reads: PDPT entry 6 (6 GiB), the window's first page.
    pub const VA: u64 = 6 << 30;
    /// What the two backing pages hold in their first word.
    pub const OLD: u64 = 0x01d0_01d0;
    pub const NEW: u64 = 0x0e30_0e30;

    #[repr(C, align(4096))]
    pub struct Page(pub [u64; 512]);

    pub static mut PD: Table = Table::empty();
    pub static mut PT: Table = Table::empty();
    pub static mut OLD_PAGE: Page = Page([0; 512]);
    pub static mut NEW_PAGE: Page = Page([0; 512]);
    pub static mut AP_ST: KvmStealTime = KvmStealTime::new();
    /// 1: steal time on (99: refused); 2: stopped.
    pub static AP_STAGE: AtomicU64 = AtomicU64::new(0);
    /// The word the AP read at `VA` last.
    pub static AP_SEEN: AtomicU64 = AtomicU64::new(0);
    /// How many times it read it.
    pub static AP_READS: AtomicU64 = AtomicU64::new(0);
    pub static STOP: AtomicU64 = AtomicU64::new(0);

    /// The AP's `preempted` byte, as the guest's other vCPUs use it.
    pub fn ap_preempted() -> &'static AtomicU8 {
        // SAFETY: the byte lives as long as the guest; the host and the
        // vCPUs access it with single-byte (atomic) accesses only.
        unsafe { AtomicU8::from_ptr(addr_of_mut!(AP_ST.preempted)) }
    }

    /// Map `VA` to the old page (the BSP, before the AP starts).
    pub fn map_window() {
        // SAFETY: the tables and pages are this guest's statics, identity
        // mapped; PDPT entry 6 is unused by the runtime.
        unsafe {
            (&raw mut OLD_PAGE.0[0]).write_volatile(OLD);
            (&raw mut NEW_PAGE.0[0]).write_volatile(NEW);
            paging::add_fault_window(6, addr_of_mut!(PD), addr_of_mut!(PT));
            (&raw mut PT.0[0]).write_volatile(addr_of!(OLD_PAGE) as u64 | 3);
            core::arch::asm!("invlpg [{}]", in(reg) VA, options(nostack));
        }
    }

    /// Point `VA` at the new page and flush this vCPU's translation only.
    pub fn remap() {
        // SAFETY: as in map_window.
        unsafe {
            (&raw mut PT.0[0]).write_volatile(addr_of!(NEW_PAGE) as u64 | 3);
            core::arch::asm!("invlpg [{}]", in(reg) VA, options(nostack));
        }
    }

    /// The AP: steal time on, then read `VA` until told to stop.
    pub fn ap_work() {
        let gpa = addr_of!(AP_ST) as u64;
        let ok = arch::wrmsr(MSR_KVM_STEAL_TIME, gpa | 1).is_ok();
        AP_STAGE.store(if ok { 1 } else { 99 }, Ordering::Release);
        while STOP.load(Ordering::Acquire) == 0 {
            // SAFETY: VA is mapped (map_window) to one of this guest's pages.
            let word = unsafe { (VA as *const u64).read_volatile() };
            AP_SEEN.store(word, Ordering::Release);
            AP_READS.fetch_add(1, Ordering::AcqRel);
        }
        AP_STAGE.store(2, Ordering::Release);
    }

    /// Linux's deferral: while the AP's byte says preempted, cmpxchg
    /// PREEMPTED|FLUSH_TLB into it. Waits up to `ticks` TSC ticks for a
    /// preempted AP; the ticks it waited when the cmpxchg took.
    pub fn defer_flush(ticks: u64) -> Option<u64> {
        let t0 = arch::rdtsc();
        let st = ap_preempted();
        while arch::rdtsc().wrapping_sub(t0) < ticks {
            let state = st.load(Ordering::Acquire);
            if state & KVM_VCPU_PREEMPTED != 0
                && st
                    .compare_exchange(
                        state,
                        state | KVM_VCPU_FLUSH_TLB,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
            {
                return Some(arch::rdtsc().wrapping_sub(t0));
            }
            core::hint::spin_loop();
        }
        None
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    use core::sync::atomic::Ordering;
    use flush::*;
    use guest::{arch, spin_until};

    if !arch::has_kvm_signature() {
        t.skip("pv-tlb-flush", "no KVM signature at CPUID 0x40000000");
        return;
    }
    let features = arch::cpuid(0x4000_0001, 0)[0];
    t.check(
        "pv-tlb-flush-advertised",
        features & KVM_FEATURE_PV_TLB_FLUSH != 0,
        format_args!("CPUID 0x40000001 EAX {features:#x}"),
    );
    map_window();
    arch::start_ap(1, ap_work);
    let up = spin_until(|| AP_STAGE.load(Ordering::Acquire) != 0);
    t.check(
        "ap-started-and-enabled-steal-time",
        up && AP_STAGE.load(Ordering::Acquire) == 1,
        format_args!("stage {}", AP_STAGE.load(Ordering::Acquire)),
    );
    if !up {
        return;
    }
    let cached = spin_until(|| AP_READS.load(Ordering::Acquire) >= 3);
    t.check(
        "ap-reads-the-old-page",
        cached && AP_SEEN.load(Ordering::Acquire) == OLD,
        format_args!("seen {:#x}", AP_SEEN.load(Ordering::Acquire)),
    );

    remap();
    // 2 * 10^9 TSC ticks: a second under rustkvm (2 GHz).
    match defer_flush(2_000_000_000) {
        Some(waited) => {
            t.measure("flush.waited-ticks", format_args!("{waited}"));
            let reads = AP_READS.load(Ordering::Acquire);
            // A few reads after the resume: under MTTCG the AP's thread may
            // finish the block it was in when it was descheduled first.
            let resumed = spin_until(|| AP_READS.load(Ordering::Acquire) >= reads + 3);
            let seen = AP_SEEN.load(Ordering::Acquire);
            let flag = ap_preempted().load(Ordering::Acquire);
            t.check(
                "deferred-flush-seen-on-resume",
                resumed && seen == NEW,
                format_args!(
                    "resumed {resumed}, the AP read {seen:#x} (old {OLD:#x}, new {NEW:#x}), \
                     preempted byte now {flag:#x}"
                ),
            );
        }
        None => t.skip(
            "deferred-flush-seen-on-resume",
            "the AP was never preempted while the BSP ran",
        ),
    }

    STOP.store(1, Ordering::Release);
    let done = spin_until(|| AP_STAGE.load(Ordering::Acquire) == 2);
    t.check(
        "ap-stopped",
        done,
        format_args!("stage {}", AP_STAGE.load(Ordering::Acquire)),
    );
    // The AP is done: its flag carries no request the host has not taken.
    let flag = ap_preempted().load(Ordering::Acquire);
    t.check(
        "no-flush-request-left",
        flag & KVM_VCPU_FLUSH_TLB == 0,
        format_args!("preempted byte {flag:#x}"),
    );
}
