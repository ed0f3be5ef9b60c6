//! Property tests of the models (issue 17, "Checks that keep it so").
//!
//! Random sequences of guest accesses (MSRs, RDPMC, hypercalls, arm64 PMU
//! system registers, SMCCC calls), vCPU entries and exits, sampler ticks,
//! host and VM time, engine event counts, saves, loads and resets drive a
//! whole machine ([`crate::Vm`] over a [`FakeRam`] and a [`FakeSched`]).
//! After every step the invariants of docs/testing.md ("Property tests")
//! are checked: no panic; no byte written outside the structures the guest
//! registered; counters, kvmclock and stolen time never go backwards; #GP /
//! UNDEF exactly where KVM's rules say. The rules are written here from
//! KVM's sources (cited at each), not from the models.
//!
//! `PROPTEST_CASES` overrides each test's case count (the default run keeps
//! a few thousand cases in all; `scripts/proptest-campaign.sh` runs many
//! more). A failing case is shrunk and its seed saved under
//! `accel/proptest-regressions/`, which is committed with the fix.

mod arm;
mod x86;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

use crate::host::tests::FakeSched;
use crate::memory::tests::FakeRam;

/// Guest RAM of every machine under test: four 4 KiB pages at GPA 0.
pub const RAM: u64 = 0x4000;

/// The runner's configuration: `default_cases` cases unless
/// `PROPTEST_CASES` says otherwise; failures persisted beside the sources.
pub fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// A guest physical address, biased to the interesting ones: aligned and
/// unaligned inside RAM, the last bytes of RAM, across a page boundary,
/// just past RAM, far beyond it, 0 and all-ones.
pub fn gpa() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0..RAM / 64).prop_map(|i| i * 64),
        2 => 0..RAM,
        2 => (1..=80u64).prop_map(|k| RAM - k),
        2 => (1..RAM / 4096).prop_flat_map(|p| (1..=40u64).prop_map(move |k| p * 4096 - k)),
        1 => (0..64u64).prop_map(|k| RAM + k),
        1 => prop_oneof![Just(0u64), Just(u64::MAX), Just(u64::MAX - 63), Just(1 << 40), Just(1 << 52)],
        1 => any::<u64>(),
    ]
}

/// A 64-bit value biased to edge values: 0, 1, all-ones, the counter wrap
/// points (bit 31, 32, 47, 48), values just below a wrap.
pub fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        2 => prop::sample::select(vec![
            0u64,
            1,
            u64::MAX,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            1 << 32,
            (1 << 47) - 1,
            1 << 47,
            (1 << 48) - 1,
            1 << 48,
            1 << 63,
            i64::MAX as u64,
        ]),
        2 => (1..=64u64, prop::sample::select(vec![32u32, 48, 64]))
            .prop_map(|(k, w)| if w == 64 { k.wrapping_neg() } else { (1u64 << w) - k }),
        1 => 0..64u64,
    ]
}

/// A range of guest RAM some structure occupies (or a buffer a call wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub base: u64,
    /// Bytes.
    pub len: u64,
}

impl Region {
    /// `len` bytes at `base` (a region reaching past 2^64 is cut there).
    pub fn new(base: u64, len: u64) -> Self {
        Region {
            base,
            len: len.min(u64::MAX - base),
        }
    }

    /// Whether the write of `len` bytes at `gpa` lies inside.
    pub fn holds(&self, gpa: u64, len: usize) -> bool {
        gpa >= self.base && gpa.saturating_add(len as u64) <= self.base + self.len
    }

    /// Whether the two share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.base < other.base.saturating_add(other.len)
            && other.base < self.base.saturating_add(self.len)
    }

    /// Whether it is all RAM.
    pub fn in_ram(&self) -> bool {
        self.base.checked_add(self.len).is_some_and(|e| e <= RAM)
    }
}

/// Who registered a region (to tell a structure from the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// vCPU i's x86 steal time.
    Steal(usize),
    /// vCPU i's kvmclock.
    Kvmclock(usize),
    /// The VM's wall clock.
    WallClock,
    /// A KVM_HC_CLOCK_PAIRING buffer.
    Pairing,
    /// vCPU i's arm64 PV time structure.
    PvTime(usize),
}

/// Every region the guest registered so far in a sequence, with its owner:
/// a structure is checked (versions, values) only while no other owner's
/// region ever overlapped it, since the guest may point two at one place.
#[derive(Debug, Default)]
pub struct Registry(Vec<(Owner, Region)>);

impl Registry {
    /// Remember that `owner` registered `region`.
    pub fn add(&mut self, owner: Owner, region: Region) {
        if !self.0.contains(&(owner, region)) {
            self.0.push((owner, region));
        }
    }

    /// Whether `region` of `owner` never overlapped another owner's region.
    pub fn exclusive(&self, owner: Owner, region: Region) -> bool {
        self.0
            .iter()
            .all(|(o, r)| *o == owner || !r.overlaps(&region))
    }
}

/// Fail unless every write to `ram` after the first `skip` lies inside one
/// of `allowed`: the structures registered before or after the step, and
/// what the step itself asked to be written.
pub fn check_writes(
    ram: &FakeRam,
    skip: usize,
    allowed: &[Region],
    step: &dyn std::fmt::Debug,
) -> Result<(), TestCaseError> {
    for (gpa, len) in ram.writes_since(skip) {
        prop_assert!(
            allowed.iter().any(|r| r.holds(gpa, len)),
            "{step:?} wrote {len} bytes at {gpa:#x}, outside the registered {allowed:x?}"
        );
    }
    Ok(())
}

/// Fail unless a counter read as `now` after reading `then`, with at most
/// `budget` events since, moved forward modulo 2^`width` by no more than
/// the budget: it never goes backwards, and wraps only once it counted
/// past its top.
pub fn check_counter(
    what: &dyn std::fmt::Debug,
    then: u64,
    now: u64,
    width: u32,
    budget: u64,
) -> Result<(), TestCaseError> {
    let mask = if width == 64 {
        u64::MAX
    } else {
        (1 << width) - 1
    };
    let moved = now.wrapping_sub(then) & mask;
    prop_assert!(
        moved <= budget,
        "{what:?}: read {then:#x} then {now:#x} ({width} bits): moved {moved:#x}, \
         more than the {budget} events since (backwards?)"
    );
    Ok(())
}

/// A machine's host: fake RAM with a VM clock, a fake scheduler.
pub struct Host {
    /// Guest RAM.
    pub ram: Arc<FakeRam>,
    /// QEMU's virtual clock (ns).
    pub vm_ns: Arc<AtomicU64>,
    /// The host scheduler.
    pub sched: Arc<FakeSched>,
}

impl Host {
    /// A host at time 1 ms with zeroed RAM and the VM clock at 0.
    pub fn new() -> Self {
        let vm_ns = Arc::new(AtomicU64::new(0));
        Host {
            ram: Arc::new(FakeRam::with_clock(RAM as usize, Arc::clone(&vm_ns))),
            vm_ns,
            sched: FakeSched::at(1_000_000),
        }
    }
}

/// The host thread that runs vCPU `i`.
pub fn tid(i: usize) -> i32 {
    100 + i as i32
}

#[test]
fn regions_hold_overlap_and_stay_in_ram() {
    let r = Region::new(0x1000, 64);
    assert!(r.holds(0x1000, 64) && r.holds(0x103f, 1));
    assert!(!r.holds(0x103f, 2) && !r.holds(0xfff, 1));
    assert!(r.overlaps(&Region::new(0x103f, 8)));
    assert!(!r.overlaps(&Region::new(0x1040, 8)));
    assert!(!Region::new(u64::MAX - 3, 64).in_ram());
    assert!(Region::new(RAM - 64, 64).in_ram());
    assert!(check_counter(&"c", (1 << 48) - 2, 3, 48, 5).is_ok(), "wrap");
    assert!(check_counter(&"c", 10, 9, 48, 5).is_err(), "backwards");
}
