//! rustkvm-test: arch=x86_64 cpu=max,pmu=on compare=off needs=pmu
//! rustkvm-expect: tcg=skip
//! rustkvm-test: kvm-vary=host-guest.*
//!   (KVM drops HostOnly/GuestOnly in its guests' selects, amd_pmu_set_msr's
//!   reserved_bits; rustkvm keeps them, as the hardware under a nested
//!   hypervisor does)
//!   (stock TCG has no x86 PMU)
//!
//! The AMD PMU a KVM guest on an AMD host gets with `pmu=on` (AMD APM vol. 2
//! §13.2; Linux `arch/x86/kvm/svm/pmu.c`, `pmu.c`), counted exactly: the
//! legacy K7 MSRs and, with PerfCtrExtCore, the interleaved 0xC0010200 ones
//! aliasing them; retired instructions (C0H) and branches (C2H) of known
//! code, and its loads, stores and load-op-stores (LsDispatch, 29H, each
//! unit mask bit and together: rustkvm's memory classes); RDPMC 0..N-1 and #GP beyond; event-select reserved bits dropped,
//! not faulting (HostOnly/GuestOnly too under KVM; under rustkvm a vCPU with
//! SVM keeps them and they count as on the hardware); with PerfMonV2 the global control
//! gating counting and the status registers as KVM's `kvm_pmu_set_msr`
//! (STATUS ignoring guest writes without #GP, STATUS_SET setting bits and
//! reading 0, STATUS_CLR clearing); an overflow with INT raises exactly one
//! PMI through LVTPC (an NMI) right after the instruction that wrapped the
//! counter, and — unlike Intel — LVTPC stays unmasked. Runs with whatever
//! the CPU model has (the host test also runs it on `EPYC,pmu=on`: no
//! PerfMonV2). SKIPs on Intel models and without a PMU.
#![no_std]
#![no_main]

use guest::Test;

guest::entry!(main);

#[cfg(not(target_arch = "x86_64"))]
fn main(t: &mut Test) {
    t.skip("x86-pmu-amd", "x86_64 only");
}

#[cfg(target_arch = "x86_64")]
mod amd {
    use guest::arch::{self, lapic_reg, nmis, set_lapic_reg, GP_VECTOR};
    use guest::x86_pmu::{
        counted_loop, mem_loop, nop_sled, rd, rep_stos, wr, EN, INT, LVTPC, LVT_MASKED, LVT_NMI,
        OS, SVR, USR,
    };
    use guest::{Test, Tolerance};
    /// How far past the overflowing instruction a PMI may land on hardware
    /// (skid); none in emulation.
    const SKID: Tolerance = Tolerance { hardware: 64 };

    const K7_EVNTSEL0: u32 = 0xc001_0000;
    const K7_PERFCTR0: u32 = 0xc001_0004;
    const F15H_CTL0: u32 = 0xc001_0200;
    const GLOBAL_STATUS: u32 = 0xc000_0300;
    const GLOBAL_CTL: u32 = 0xc000_0301;
    const GLOBAL_STATUS_CLR: u32 = 0xc000_0302;
    const GLOBAL_STATUS_SET: u32 = 0xc000_0303;
    /// Retired instructions, retired branch instructions.
    const INSNS: u64 = 0xc0;
    const BRANCHES: u64 = 0xc2;
    /// LsDispatch (PMCx029): its unit mask bit 0 loads, 1 stores, 2
    /// load-op-stores (PPR for AMD Family 17h).
    const LS_DISPATCH: u64 = 0x29;
    /// GuestOnly (bit 40), HostOnly (41): dropped by KVM for its guests,
    /// kept and honoured by rustkvm for a vCPU with SVM.
    const GUEST_ONLY: u64 = 1 << 40;
    const HOST_ONLY: u64 = 1 << 41;

    /// What the CPU model has.
    #[derive(Clone, Copy)]
    struct Pmu {
        /// PerfCtrExtCore: the 0xC0010200 MSRs, 6 counters.
        ext: bool,
        /// PerfMonV2 with this many counters.
        v2: Option<u32>,
    }

    impl Pmu {
        fn counters(self) -> u32 {
            match (self.v2, self.ext) {
                (Some(n), _) => n,
                (None, true) => 6,
                (None, false) => 4,
            }
        }
        fn ctl(self, i: u32) -> u32 {
            if self.ext {
                F15H_CTL0 + 2 * i
            } else {
                K7_EVNTSEL0 + i
            }
        }
        fn ctr(self, i: u32) -> u32 {
            if self.ext {
                F15H_CTL0 + 2 * i + 1
            } else {
                K7_PERFCTR0 + i
            }
        }
        /// The WRMSR that starts counter `i` counting `sel`: GLOBAL_CTL with
        /// PerfMonV2 (the select already enabled), else its select.
        fn starter(self, i: u32, sel: u64) -> (u32, u64) {
            if self.v2.is_some() {
                wr(GLOBAL_CTL, 0);
                wr(self.ctl(i), sel);
                (GLOBAL_CTL, 1 << i)
            } else {
                wr(self.ctl(i), 0);
                (self.ctl(i), sel)
            }
        }
    }

    pub fn main(t: &mut Test) {
        let v = arch::cpuid(0, 0);
        if &arch::cpuid_string([v[1], v[3], v[2]]) != b"AuthenticAMD" {
            t.skip("x86-pmu-amd", "not an AMD CPU model");
            return;
        }
        let ext_max = arch::cpuid(0x8000_0000, 0)[0];
        let ext = arch::cpuid(0x8000_0001, 0)[2] & (1 << 23) != 0;
        let v2 = (ext_max >= 0x8000_0022 && arch::cpuid(0x8000_0022, 0)[0] & 1 != 0)
            .then(|| arch::cpuid(0x8000_0022, 0)[1] & 0xf);
        let pmu = Pmu { ext, v2 };
        // The legacy select reads back what was written: a PMU is there
        // (a KVM with enable_pmu off reads these as 0 and ignores writes;
        // pmu=off alone does not: patch 0058).
        let _ = arch::wrmsr(K7_EVNTSEL0, 0x76);
        if arch::rdmsr(K7_EVNTSEL0) != Ok(0x76) {
            t.skip("x86-pmu-amd", "the K7 event selects read 0: no PMU");
            return;
        }
        wr(K7_EVNTSEL0, 0);
        t.measure("cpuid.0x80000000.eax", format_args!("{ext_max:#x}"));
        t.measure("perfctr-core", format_args!("{ext}"));
        t.measure("perfmon-v2.counters", format_args!("{v2:?}"));
        let n = pmu.counters();
        if let Some(c) = v2 {
            t.eq("global-ctl.reset", rd(GLOBAL_CTL), (1 << c) - 1);
        }

        // Exact counts, on counter 1 (instructions) and 2 (branches).
        for iters in [1u64, 1000, 100_000] {
            for (i, event, want) in [(1, INSNS, 2 * iters + 5), (2, BRANCHES, iters)] {
                let sel = EN | OS | USR | event;
                let start = pmu.starter(i, sel);
                wr(pmu.ctr(i), 0);
                counted_loop(start, start.0, iters);
                t.eq(
                    "loop.count",
                    (iters, event, rd(pmu.ctr(i))),
                    (iters, event, want),
                );
            }
        }
        // LsDispatch of known code: n stores, n loads, n load-op-stores,
        // each class by its unit mask and together (a deterministic model
        // in emulation, docs/pmu.md; hardware counts speculative dispatches
        // too, and the surrounding code's).
        for iters in [1u64, 1000] {
            for (name, umask, per) in [
                ("ls-dispatch.loads", 1u64, 1),
                ("ls-dispatch.stores", 2, 1),
                ("ls-dispatch.load-op-stores", 4, 1),
                ("ls-dispatch.all", 7, 3),
                ("ls-dispatch.loads-and-stores", 3, 2),
            ] {
                let sel = EN | OS | USR | LS_DISPATCH | umask << 8;
                let start = pmu.starter(1, sel);
                wr(pmu.ctr(1), 0);
                let buf = mem_loop(start, start.0, iters);
                t.eq("ls-dispatch.buf", (iters, buf), (iters, 7 + 1));
                t.count(
                    name,
                    rd(pmu.ctr(1)),
                    per * iters,
                    Tolerance { hardware: 64 },
                );
            }
        }
        // A REP string instruction is one memory instruction, when it
        // retires, however many iterations ran and however often its
        // block was left between them (every iteration under icount).
        let mut buf = [0u8; 4096];
        let sel = EN | OS | USR | LS_DISPATCH | 7 << 8;
        let start = pmu.starter(1, sel);
        wr(pmu.ctr(1), 0);
        t.eq(
            "ls-dispatch.rep-stos.stored",
            rep_stos(start, start.0, &mut buf),
            4096,
        );
        t.count(
            "ls-dispatch.rep-stos",
            rd(pmu.ctr(1)),
            1,
            Tolerance { hardware: 1 << 20 },
        );
        // The K7 MSRs alias counters 0-3; RDPMC reads counters 0..N-1.
        wr(pmu.ctr(1), 0x1234_5678_9abc);
        t.eq("k7-alias.counter", rd(K7_PERFCTR0 + 1), 0x1234_5678_9abc);
        t.eq("k7-alias.select", rd(K7_EVNTSEL0 + 1), rd(pmu.ctl(1)));
        t.eq("rdpmc.1", arch::rdpmc(1), Ok(0x1234_5678_9abc));
        t.check(
            "rdpmc.beyond-gp",
            matches!(arch::rdpmc(n), Err(f) if f.vector == GP_VECTOR),
            format_args!("RDPMC {n}"),
        );
        // GuestOnly: KVM drops it (amd_pmu_refresh's reserved_bits), for
        // every guest; rustkvm keeps it for a vCPU with SVM, as the
        // hardware under a hypervisor in the guest (issue 47), and counts
        // as the hardware: with EFER.SVME clear a GuestOnly or HostOnly
        // counter counts nothing, with it set outside guest mode HostOnly
        // counts and GuestOnly does not.
        let svm = arch::cpuid(0x8000_0001, 0)[2] & (1 << 2) != 0;
        let keeps = svm && guest::backend() != Some(guest::Backend::Kvm);
        t.eq(
            "select.reserved-dropped",
            arch::wrmsr(pmu.ctl(0), EN | GUEST_ONLY | INSNS),
            Ok(()),
        );
        let want = if keeps {
            EN | GUEST_ONLY | INSNS
        } else {
            EN | INSNS
        };
        t.eq("select.reads-back", rd(pmu.ctl(0)), want);
        if keeps {
            const EFER: u32 = 0xc000_0080;
            const SVME: u64 = 1 << 12;
            let efer = rd(EFER);
            for (svme, bits, want) in [
                (false, GUEST_ONLY, 0),
                (false, HOST_ONLY, 0),
                (false, GUEST_ONLY | HOST_ONLY, 205),
                (true, GUEST_ONLY, 0),
                (true, HOST_ONLY, 205),
                (true, GUEST_ONLY | HOST_ONLY, 205),
                (true, 0, 205),
            ] {
                wr(EFER, if svme { efer | SVME } else { efer & !SVME });
                let sel = EN | OS | USR | INSNS | bits;
                let start = pmu.starter(1, sel);
                wr(pmu.ctr(1), 0);
                counted_loop(start, start.0, 100);
                t.eq(
                    "host-guest.outside-guest-mode",
                    (svme, bits >> 40, rd(pmu.ctr(1))),
                    (svme, bits >> 40, want),
                );
                wr(pmu.ctl(1), 0);
            }
            wr(EFER, efer);
        }
        wr(pmu.ctl(0), 0);

        if v2.is_some() {
            // GLOBAL_CTL gates: counter 1 enabled in its select but not
            // globally counts nothing.
            wr(GLOBAL_CTL, 0);
            wr(pmu.ctl(1), EN | OS | USR | INSNS);
            wr(pmu.ctr(1), 0);
            counted_loop((GLOBAL_CTL, 1 << 2), GLOBAL_CTL, 100);
            t.eq("global-ctl.gates", rd(pmu.ctr(1)), 0);
            t.eq(
                "global-status.write-ignored",
                arch::wrmsr(GLOBAL_STATUS, 1),
                Ok(()),
            );
            t.eq("global-status.unchanged", rd(GLOBAL_STATUS), 0);
            wr(GLOBAL_STATUS_SET, 1);
            t.eq("global-status-set.sets", rd(GLOBAL_STATUS), 1);
            t.eq("global-status-set.reads-0", rd(GLOBAL_STATUS_SET), 0);
            wr(GLOBAL_STATUS_CLR, 1);
            t.eq("global-status-set.cleared", rd(GLOBAL_STATUS), 0);
        }

        // Overflow: counter 0 (instructions, INT) wraps on the 10th
        // instruction after the start: the start WRMSR and 9 NOPs; the NMI
        // interrupts the 10th NOP, and LVTPC stays unmasked.
        set_lapic_reg(SVR, 0x1ff);
        set_lapic_reg(LVTPC, LVT_NMI);
        let (n0, _) = nmis();
        let start = pmu.starter(0, EN | OS | USR | INT | INSNS);
        wr(pmu.ctr(0), (1 << 48) - 10);
        let sled = nop_sled(start, start.0);
        let (n1, rip) = nmis();
        t.eq("pmi.count", n1 - n0, 1);
        t.count("pmi.zero-skid", rip.wrapping_sub(sled), 9, SKID);
        t.eq("pmi.lvtpc-unmasked", lapic_reg(LVTPC) & LVT_MASKED, 0);
        if v2.is_some() {
            t.eq("pmi.global-status", rd(GLOBAL_STATUS), 1);
            wr(GLOBAL_STATUS_CLR, 1);
            t.eq("global-status-clr.clears", rd(GLOBAL_STATUS), 0);
        }
        wr(pmu.ctl(0), 0);
    }
}

#[cfg(target_arch = "x86_64")]
fn main(t: &mut Test) {
    amd::main(t);
}
