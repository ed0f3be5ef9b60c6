//! rustkvm-test: arch=x86_64,aarch64 smp=8 compare=off matrix=off timeout=120
//!
//! The soak's guest (`scripts/soak.sh`, `tests/src/bin/rustkvm-soak.rs`):
//! every vCPU turns on what rustkvm gives it — x86: steal time
//! (MSR_KVM_STEAL_TIME), kvmclock (MSR_KVM_SYSTEM_TIME_NEW) and Intel PMU
//! counters (FIXED_CTR0 instructions, FIXED_CTR1 cycles, PMC0 branches);
//! arm64: PV stolen time (PV_TIME_ST) and PMUv3 counters (PMEVCNTR0
//! INST_RETIRED, PMCCNTR cycles) — and then reads, over and over until the
//! host sends a byte on the console, values that must never go backwards:
//! the TSC, kvmclock read as Linux reads it, `steal`, the counters (x86);
//! CNTVCT, the counters, `stolen_time` (arm64). No vCPU writes them after
//! setup, and a counter's step back counts only if its overflow flag is not
//! set (64-bit arm64 counters, 48-bit x86 ones: none is expected). The
//! clocks (TSC, kvmclock, CNTVCT) are also checked across vCPUs: no read
//! may be below a value another vCPU read before it began.
//!
//! A step back prints `not ok cpuN.NAME: ...` with the values (the first
//! few per vCPU and value; all are counted). vCPU 0 prints `# progress
//! reads=R0,...,R7 violations=V` every second of guest time; when stopped
//! it prints `measure reads R0,...,R7`, `measure violations V` and its
//! checks. SKIPs where the features are missing (plain TCG). Not part of
//! the matrix: only the soak boots it.
#![no_std]
#![no_main]

use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use guest::Test;

#[cfg(target_arch = "aarch64")]
use a64 as soak_arch;
#[cfg(target_arch = "x86_64")]
use x86 as soak_arch;

guest::entry!(main);

/// vCPUs (the metadata's `smp`).
const CPUS: usize = 8;
/// Backwards steps printed per vCPU and value (every one is counted).
const PRINTED: u32 = 4;
/// How often vCPU 0 prints its progress line and looks for the host's byte.
const PROGRESS_NS: u64 = 1_000_000_000;
/// See [`PROGRESS_NS`].
const POLL_NS: u64 = 50_000_000;
/// Reads between two publications of a vCPU's clocks for the cross-vCPU
/// check (each is an atomic max on a shared word).
const PUBLISH_EVERY: u64 = 16;

/// Reads each vCPU completed (one read: every value once).
static READS: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Backwards steps each vCPU saw.
static VIOLATIONS: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per vCPU: 0 not yet, 1 set up, 2 set-up failed.
static READY: [AtomicU8; CPUS] = [const { AtomicU8::new(0) }; CPUS];
/// Per vCPU: stopped reading.
static DONE: [AtomicBool; CPUS] = [const { AtomicBool::new(false) }; CPUS];
/// Set by vCPU 0 once every vCPU is set up: start reading.
static GO: AtomicBool = AtomicBool::new(false);
/// Set by vCPU 0 when the host sent its byte: stop reading.
static STOP: AtomicBool = AtomicBool::new(false);
/// The highest value of each cross-checked clock some vCPU has read.
static PUBLISHED: [AtomicU64; soak_arch::CROSS] = [const { AtomicU64::new(0) }; soak_arch::CROSS];

/// Per-vCPU counters printed as `a,b,c`.
struct List<'a>(&'a [AtomicU64]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}", v.load(Ordering::Relaxed))?;
        }
        Ok(())
    }
}

fn total(counters: &[AtomicU64]) -> u64 {
    counters.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// This vCPU's reading loop, until [`STOP`]; vCPU 0 also prints progress
/// and watches the console for the host's byte.
fn read_loop(cpu: usize) {
    use soak_arch::{CROSS, N, NAMES};
    let mut last = [0u64; N];
    let mut v = [0u64; N];
    let mut printed = [0u32; N + CROSS];
    let mut violations = 0u64;
    let mut reads = 0u64;
    let (mut next_poll, mut next_progress) = (0u64, 0u64);
    let mut bad = |i: usize, what: &str, before: u64, now: u64, reads: u64| {
        violations += 1;
        VIOLATIONS[cpu].store(violations, Ordering::Relaxed);
        if printed[i] < PRINTED {
            printed[i] += 1;
            guest::report_failure(
                format_args!("cpu{cpu}.{}", NAMES[i % N]),
                format_args!("{what}: {before} then {now} (read {reads})"),
            );
        }
    };
    while !STOP.load(Ordering::Relaxed) {
        let mut floor = [0u64; CROSS];
        for (f, p) in floor.iter_mut().zip(&PUBLISHED) {
            *f = p.load(Ordering::Acquire);
        }
        soak_arch::sample(cpu, &mut v);
        for i in 0..N {
            if reads > 0 && v[i] < last[i] && !soak_arch::overflowed(i) {
                bad(i, "went backwards on this vCPU", last[i], v[i], reads);
            }
        }
        for i in 0..CROSS {
            if v[i] < floor[i] {
                bad(
                    N + i,
                    "went backwards from another vCPU's earlier read",
                    floor[i],
                    v[i],
                    reads,
                );
            }
        }
        if reads.is_multiple_of(PUBLISH_EVERY) {
            for (p, x) in PUBLISHED.iter().zip(&v) {
                p.fetch_max(*x, Ordering::AcqRel);
            }
        }
        last = v;
        reads += 1;
        READS[cpu].store(reads, Ordering::Relaxed);
        if cpu == 0 {
            let now = soak_arch::now_ns(&v);
            if now >= next_poll {
                next_poll = now + POLL_NS;
                if guest::arch::getc().is_some() {
                    STOP.store(true, Ordering::Relaxed);
                }
            }
            if now >= next_progress {
                next_progress = now + PROGRESS_NS;
                guest::println!(
                    "# progress reads={} violations={}",
                    List(&READS),
                    total(&VIOLATIONS)
                );
            }
        }
    }
    DONE[cpu].store(true, Ordering::Release);
}

/// What vCPUs 1.. run: set up, wait for the go, read until stopped.
fn secondary() {
    let cpu = soak_arch::cpu_index();
    match soak_arch::setup(cpu) {
        Ok(()) => READY[cpu].store(1, Ordering::Release),
        Err(why) => {
            guest::report_failure(format_args!("cpu{cpu}.setup"), format_args!("{why}"));
            READY[cpu].store(2, Ordering::Release);
            return;
        }
    }
    while !GO.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    read_loop(cpu);
}

/// Wait (bounded) until `cond` holds; whether it did.
fn wait(cond: impl Fn() -> bool) -> bool {
    for _ in 0..2_000_000_000u64 {
        if cond() {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

fn main(t: &mut Test) {
    if let Err(why) = soak_arch::available() {
        t.skip("soak", why);
        return;
    }
    let setup = soak_arch::setup(0);
    t.check("cpu0.setup", setup.is_ok(), format_args!("{setup:?}"));
    if setup.is_err() {
        return;
    }
    // One vCPU at a time: each sets itself up (MSR writes with fault
    // catching, whose bookkeeping is shared) before the next starts.
    let mut up = 1;
    for (cpu, ready) in READY.iter().enumerate().skip(1) {
        soak_arch::start(cpu, secondary);
        if wait(|| ready.load(Ordering::Acquire) != 0) && ready.load(Ordering::Acquire) == 1 {
            up += 1;
        }
    }
    t.eq("vcpus-set-up", up, CPUS);
    guest::println!("# soak: {up} vCPUs reading");
    GO.store(true, Ordering::Release);
    read_loop(0);
    let stopped = wait(|| {
        (0..CPUS).all(|c| READY[c].load(Ordering::Acquire) != 1 || DONE[c].load(Ordering::Acquire))
    });
    t.check("every-vcpu-stopped", stopped, format_args!(""));
    t.measure("reads", format_args!("{}", List(&READS)));
    t.measure("violations", format_args!("{}", total(&VIOLATIONS)));
    let idle = (0..CPUS).find(|&c| READS[c].load(Ordering::Relaxed) == 0);
    t.check(
        "every-vcpu-read",
        idle.is_none(),
        format_args!("vCPU {idle:?} read nothing"),
    );
    t.eq("violations", total(&VIOLATIONS), 0);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use guest::arch::{self, has_kvm_signature, rdmsr, rdpmc, rdtsc, wrmsr, KvmStealTime};
    use guest::kvmclock::{self, Pvti, FEATURE_CLOCKSOURCE2, MSR_SYSTEM_TIME};
    use guest::x86_pmu::{
        EN, EVTSEL0, FIXED_CTR0, FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS, OS,
        PMC0, USR,
    };

    use super::CPUS;

    /// Values read: the clocks first (the cross-checked ones).
    pub const NAMES: [&str; N] = [
        "tsc",
        "kvmclock",
        "steal",
        "instructions",
        "cycles",
        "branches",
    ];
    /// See [`NAMES`].
    pub const N: usize = 6;
    /// The first CROSS values are clocks checked across vCPUs.
    pub const CROSS: usize = 2;

    /// KVM_FEATURE_STEAL_TIME (CPUID 0x40000001 EAX).
    const FEATURE_STEAL_TIME: u32 = 1 << 5;
    /// BR_INST_RETIRED.ALL_BRANCHES (C4H, umask 0).
    const BRANCHES: u64 = 0xc4;
    /// RDPMC's ECX for fixed counter `i`.
    const RDPMC_FIXED: u32 = 1 << 30;
    /// GLOBAL_STATUS / GLOBAL_CTRL bits of the counters read
    /// (instructions: fixed 0, cycles: fixed 1, branches: PMC0), by value
    /// index - 3.
    const COUNTER_BITS: [u64; 3] = [1 << 32, 1 << 33, 1];

    static mut STEAL: [KvmStealTime; CPUS] = [const { KvmStealTime::new() }; CPUS];
    static mut CLOCK: [Pvti; CPUS] = [const { Pvti::new() }; CPUS];

    /// vCPU `cpu`'s steal-time structure.
    fn steal(cpu: usize) -> *const KvmStealTime {
        (&raw const STEAL)
            .cast::<KvmStealTime>()
            .wrapping_add(cpu % CPUS)
    }

    /// vCPU `cpu`'s kvmclock structure.
    fn clock(cpu: usize) -> *const Pvti {
        (&raw const CLOCK).cast::<Pvti>().wrapping_add(cpu % CPUS)
    }

    /// Why the soak cannot run here, if it cannot.
    pub fn available() -> Result<(), &'static str> {
        if !has_kvm_signature() {
            return Err("no KVM signature at CPUID 0x40000000");
        }
        let f = arch::cpuid(0x4000_0001, 0)[0];
        if f & FEATURE_CLOCKSOURCE2 == 0 || f & FEATURE_STEAL_TIME == 0 {
            return Err("no kvmclock or steal time in CPUID 0x40000001");
        }
        let a = arch::cpuid(0xa, 0);
        if a[0] & 0xff < 2 || (a[0] >> 8) & 0xff == 0 || a[3] & 0x1f < 2 {
            return Err("CPUID 0xA: no version 2 PMU with a GP and two fixed counters");
        }
        Ok(())
    }

    /// This vCPU's index (its APIC ID).
    pub fn cpu_index() -> usize {
        (arch::cpuid(1, 0)[1] >> 24) as usize % CPUS
    }

    /// Start vCPU `cpu` (APIC ID `cpu`) running `work`.
    pub fn start(cpu: usize, work: fn()) {
        arch::start_ap(cpu as u8, work);
    }

    /// Steal time, kvmclock and the counters on for this vCPU.
    pub fn setup(cpu: usize) -> Result<(), &'static str> {
        let steal = steal(cpu) as u64;
        wrmsr(arch::MSR_KVM_STEAL_TIME, steal | 1).map_err(|_| "MSR_KVM_STEAL_TIME #GP")?;
        let clock = clock(cpu) as u64;
        wrmsr(MSR_SYSTEM_TIME, clock | 1).map_err(|_| "MSR_KVM_SYSTEM_TIME_NEW #GP")?;
        let pmu = [
            (GLOBAL_CTRL, 0),
            (EVTSEL0, EN | OS | USR | BRANCHES),
            (FIXED_CTR_CTRL, 0x33), // fixed 0 and 1: OS | USR
            (PMC0, 0),
            (FIXED_CTR0, 0),
            (FIXED_CTR0 + 1, 0),
            (GLOBAL_CTRL, COUNTER_BITS.iter().fold(0, |a, b| a | b)),
        ];
        for (msr, value) in pmu {
            wrmsr(msr, value).map_err(|_| "a PMU MSR write #GP")?;
        }
        Ok(())
    }

    /// One read of every value, in [`NAMES`] order.
    pub fn sample(cpu: usize, v: &mut [u64; N]) {
        v[0] = rdtsc();
        // SAFETY: this vCPU's structures, statics the hypervisor updates.
        unsafe {
            v[1] = kvmclock::read(clock(cpu)).0;
            v[2] = KvmStealTime::read_steal(steal(cpu));
        }
        v[3] = rdpmc(RDPMC_FIXED).unwrap_or(0);
        v[4] = rdpmc(RDPMC_FIXED | 1).unwrap_or(0);
        v[5] = rdpmc(0).unwrap_or(0);
    }

    /// Whether value `i` is a counter whose overflow flag is set (then
    /// cleared: its step back is the wrap).
    pub fn overflowed(i: usize) -> bool {
        let Some(&bit) = i.checked_sub(3).and_then(|c| COUNTER_BITS.get(c)) else {
            return false;
        };
        let set = rdmsr(GLOBAL_STATUS).unwrap_or(0) & bit != 0;
        if set {
            let _ = wrmsr(GLOBAL_OVF_CTRL, bit);
        }
        set
    }

    /// Nanoseconds of guest time in a sample (kvmclock).
    pub fn now_ns(v: &[u64; N]) -> u64 {
        v[1]
    }
}

#[cfg(target_arch = "aarch64")]
mod a64 {
    use guest::arch::{self, hvc, PV_TIME_FEATURES, PV_TIME_ST, SMCCC_VERSION};
    use guest::{read_sysreg, write_sysreg};

    use super::CPUS;

    /// Values read: the clock first (the cross-checked one).
    pub const NAMES: [&str; N] = ["cntvct", "instructions", "cycles", "stolen"];
    /// See [`NAMES`].
    pub const N: usize = 4;
    /// The first CROSS values are clocks checked across vCPUs.
    pub const CROSS: usize = 1;

    /// SMCCC_ARCH_FEATURES.
    const ARCH_FEATURES: u32 = 0x8000_0001;
    /// Common events: INST_RETIRED, CPU_CYCLES.
    const INST_RETIRED: u64 = 0x08;
    const CPU_CYCLES: u64 = 0x11;
    /// PMCR_EL0: E, P (reset event counters), C (reset the cycle counter),
    /// LC (64-bit cycle counter overflow), LP (64-bit event counters).
    const PMCR_E: u64 = 1;
    const PMCR_P: u64 = 1 << 1;
    const PMCR_C: u64 = 1 << 2;
    const PMCR_LC: u64 = 1 << 6;
    const PMCR_LP: u64 = 1 << 7;
    /// PMCNTENSET/PMOVSSET bits of the counters read (event counter 0,
    /// the cycle counter), by value index - 1.
    const COUNTER_BITS: [u64; 2] = [1, 1 << 31];

    /// Each vCPU's PV time structure.
    static mut STOLEN: [u64; CPUS] = [0; CPUS];

    /// Why the soak cannot run here, if it cannot.
    pub fn available() -> Result<(), &'static str> {
        let call = |f: u32, a: u64| hvc(f, [a, 0, 0])[0];
        if call(SMCCC_VERSION, 0) != 0x1_0001 {
            return Err("SMCCC is not 1.1 (plain TCG: 1.0, no PV time)");
        }
        if call(ARCH_FEATURES, PV_TIME_FEATURES.into()) != 0
            || call(PV_TIME_FEATURES, PV_TIME_ST.into()) != 0
        {
            return Err("no PV_TIME_ST");
        }
        let ceid0 = read_sysreg!("pmceid0_el0");
        if ceid0 & (1 << INST_RETIRED) == 0 || ceid0 & (1 << CPU_CYCLES) == 0 {
            return Err("PMCEID0: no INST_RETIRED or CPU_CYCLES");
        }
        Ok(())
    }

    /// This vCPU's index (Aff0).
    pub fn cpu_index() -> usize {
        (arch::mpidr() & 0xff) as usize % CPUS
    }

    /// Start vCPU `cpu` (Aff0 `cpu`) running `work`.
    pub fn start(cpu: usize, work: fn()) {
        let status = arch::cpu_on(cpu as u64, work);
        if status != 0 {
            guest::report_failure(
                format_args!("cpu{cpu}.cpu-on"),
                format_args!("PSCI status {status}"),
            );
        }
    }

    /// PV time and the counters on for this vCPU.
    pub fn setup(cpu: usize) -> Result<(), &'static str> {
        let base = arch::pv_time_st().ok_or("PV_TIME_ST not supported")?;
        // SAFETY: this vCPU's own slot, read by nobody else.
        unsafe { (&raw mut STOLEN[cpu]).write_volatile(base) };
        arch::pmu_clear();
        let pmuver = read_sysreg!("id_aa64dfr0_el1") >> 8 & 0xf;
        let lp = if (6..0xf).contains(&pmuver) {
            PMCR_LP
        } else {
            0
        };
        write_sysreg!("pmevtyper0_el0", INST_RETIRED);
        write_sysreg!("pmccfiltr_el0", 0);
        write_sysreg!("pmcr_el0", PMCR_E | PMCR_P | PMCR_C | PMCR_LC | lp);
        write_sysreg!("pmcntenset_el0", COUNTER_BITS[0] | COUNTER_BITS[1]);
        Ok(())
    }

    /// One read of every value, in [`NAMES`] order.
    pub fn sample(cpu: usize, v: &mut [u64; N]) {
        v[0] = arch::cntvct();
        v[1] = read_sysreg!("pmevcntr0_el0");
        v[2] = read_sysreg!("pmccntr_el0");
        // SAFETY: written once by this vCPU in setup.
        v[3] = arch::stolen_time(unsafe { (&raw const STOLEN[cpu]).read_volatile() });
    }

    /// Whether value `i` is a counter whose overflow flag is set (then
    /// cleared: its step back is the wrap).
    pub fn overflowed(i: usize) -> bool {
        let Some(&bit) = i.checked_sub(1).and_then(|c| COUNTER_BITS.get(c)) else {
            return false;
        };
        let set = read_sysreg!("pmovsset_el0") & bit != 0;
        if set {
            write_sysreg!("pmovsclr_el0", bit);
        }
        set
    }

    /// Nanoseconds of guest time in a sample (the virtual counter).
    pub fn now_ns(v: &[u64; N]) -> u64 {
        (u128::from(v[0]) * 1_000_000_000 / u128::from(arch::cntfrq().max(1))) as u64
    }
}
