/*
 * rustkvm: the C ABI between QEMU and the Rust accelerator library.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 *
 * This file is the single C view of the functions librustkvm_accel.a exports
 * (accel/src/ffi.rs). The Rust build runs bindgen over it and refuses to
 * compile when a declaration here and a Rust definition disagree, so the two
 * cannot drift. The QEMU series carries a copy, include/system/rustkvm-abi.h,
 * whole in its link patch, so every step of the series builds against the
 * final ABI (`scripts/qemu-series.sh header` refreshes that copy;
 * scripts/build-qemu.sh refuses a tree whose copy differs from this file).
 * QEMU's own side (rustkvm_enabled(), RUSTKVM_VCPU(), what the glue
 * defines) is QEMU's include/system/rustkvm.h, which includes this one.
 *
 * Routing functions return a RUSTKVM_* result: UNHANDLED means "do what TCG
 * does", so a hook that Rust does not claim costs one call and changes
 * nothing. No function here panics or unwinds into C.
 */
#ifndef RUSTKVM_H
#define RUSTKVM_H

#include <stdbool.h>
#include <stdint.h>

/* Routing results. */
/** Rust did not claim the access: fall back to TCG's behaviour. */
#define RUSTKVM_UNHANDLED 0u
/** Rust handled the access; out-parameters are filled. */
#define RUSTKVM_HANDLED 1u
/** Rust handled the access and it faults: x86 #GP(0), arm64 UNDEFINED. */
#define RUSTKVM_FAULT 2u

/* Target architectures, as passed to rustkvm_machine_init(). */
#define RUSTKVM_ARCH_X86_64 1u
#define RUSTKVM_ARCH_AARCH64 2u

/* rustkvm_machine_init() return values. */
#define RUSTKVM_OK 0
/** The architecture number is not one of RUSTKVM_ARCH_*. */
#define RUSTKVM_EINVAL_ARCH -1
/** max_cpus is 0 or above RUSTKVM_MAX_VCPUS. */
#define RUSTKVM_EINVAL_CPUS -2
/** A machine was already initialised in this process. */
#define RUSTKVM_EBUSY -3
/** An option the guest architecture does not have (counter-offset on x86). */
#define RUSTKVM_EINVAL_OPTION -4
/** pmu-counters outside 1..8. */
#define RUSTKVM_EINVAL_PMU_COUNTERS -5

/* rustkvm_vcpu_create() errors (rustkvm_strerror() describes them too). */
/** The vCPU index is not below the machine's max_cpus. */
#define RUSTKVM_ERANGE_VCPU -6
/** A live vCPU already has that index. */
#define RUSTKVM_EEXIST_VCPU -7
/** There is no machine (before rustkvm_machine_init(), or after exit). */
#define RUSTKVM_ENOMACHINE -8
/**
 * Refused on purpose: the environment variable RUSTKVM_FAIL_VCPU_CREATE
 * (read at machine init) names this index. Tests use it to check that a
 * refused vCPU fails its device_add and QEMU goes on.
 */
#define RUSTKVM_EREFUSED_VCPU -9

/** Largest vCPU count a rustkvm machine accepts (QEMU's x86 limit). */
#define RUSTKVM_MAX_VCPUS 4096u

/** Opaque per-vCPU state owned by Rust. */
typedef struct RustkvmVcpu RustkvmVcpu;

/** Services QEMU provides to the models (any may be NULL: then refused). */
typedef struct RustkvmHostOps {
    /** Read len bytes of guest RAM at gpa; false (nothing read) unless RAM. */
    bool (*ram_read)(uint64_t gpa, void *buf, uint64_t len);
    /**
     * Write len bytes of guest RAM at gpa; false (nothing written) unless
     * all of it is writable RAM.
     */
    bool (*ram_write)(uint64_t gpa, const void *buf, uint64_t len);
    /**
     * Store `value` (`size` 4 or 8 bytes, little-endian) at `gpa` with one
     * single-copy-atomic store; false, nothing written, unless `gpa` is
     * aligned to `size` and the bytes are writable RAM.
     */
    bool (*ram_store)(uint64_t gpa, uint64_t value, uint32_t size);
    /**
     * Exchange the byte at `gpa` for `value` in one atomic read-modify-write
     * (KVM's xchgb on steal_time.preempted, which the guest may cmpxchg on
     * another vCPU meanwhile); the old byte, or -1, nothing written, unless
     * the byte is writable RAM.
     */
    int (*ram_xchg8)(uint64_t gpa, uint8_t value);
    /**
     * x86: send an IPI to the vCPU with `apic_id` (physical destination);
     * `icr` holds the ICR's vector, delivery mode, level and trigger mode.
     * False if there is no such vCPU.
     */
    bool (*send_ipi)(uint32_t apic_id, uint32_t icr);
    /** QEMU_CLOCK_VIRTUAL in ns: what the guest TSC counts. */
    int64_t (*clock_ns)(void);
    /**
     * x86: vCPU `cpu_index`'s TSC-deadline timer changed; re-arm its local
     * APIC timer from rustkvm_x86_tsc_deadline_ns(). Called without Rust locks.
     */
    void (*tsc_deadline_changed)(uint32_t cpu_index);
    /**
     * A thread of rustkvm's own (not a vCPU thread) starts using guest
     * memory: rcu_register_thread(). Called by that thread, first.
     */
    void (*thread_attach)(void);
    /** That thread is done with guest memory: rcu_unregister_thread(). */
    void (*thread_detach)(void);
    /**
     * Arm the machine's injection timer (QEMU_CLOCK_VIRTUAL) at
     * `deadline_ns`, or disarm it (negative); when it expires, call
     * rustkvm_inject_fire(). BQL held; called under no vCPU lock.
     */
    void (*inject_timer)(int64_t deadline_ns);
    /**
     * vCPU `cpu_index` may run again (its injected preemption ended):
     * qemu_cpu_kick() it. BQL held.
     */
    void (*wake_vcpu)(uint32_t cpu_index);
    /**
     * x86: the guest-physical address vCPU `cpu_index`'s paging maps
     * `linear` to now, or -1 if none (a debug walk: no fault, no A/D bits).
     * On that vCPU's thread.
     */
    int64_t (*x86_linear_to_gpa)(uint32_t cpu_index, uint64_t linear);
    /**
     * Whether the calling thread holds the BQL (bql_locked()): debug builds
     * of the library assert the callbacks' lock rules above with it. Any
     * thread.
     */
    bool (*bql_locked)(void);
} RustkvmHostOps;

/** Machine-wide options, from -accel rustkvm,... properties. */
typedef struct RustkvmConfig {
    /** RUSTKVM_ARCH_*. */
    uint32_t arch;
    /** Highest number of vCPUs the machine can have (-smp maxcpus). */
    uint32_t max_cpus;
    /** -accel rustkvm,stats=on: print per-vCPU routing counts at exit. */
    bool stats;
    /** One host thread per vCPU (MTTCG); false: round-robin on one thread. */
    bool mttcg;
    /**
     * -icount: VM time counts instructions (round-robin), so steal time
     * counts the VM time a runnable vCPU waited for its turn, and not the
     * host's scheduling (deterministic, in the guest's own time).
     */
    bool icount;
    /**
     * arm64: -accel rustkvm,counter-offset=N, subtracted from every counter
     * view of the guest like KVM_ARM_SET_COUNTER_OFFSET (0 on x86).
     */
    uint64_t counter_offset;
    /**
     * x86: -accel rustkvm,pmu-counters=N, general-purpose counters of the
     * PMU a pmu=on vCPU gets (1..8, as KVM; 0: the default, 4).
     */
    uint32_t pmu_counters;
    /** Guest memory access and other services. */
    RustkvmHostOps ops;
} RustkvmConfig;

/* Lifecycle (main thread, BQL held). */
/** Create the machine's Rust state; RUSTKVM_OK or a negative RUSTKVM_E*. */
int32_t rustkvm_machine_init(const RustkvmConfig *config);
/** Human-readable text for a rustkvm_machine_init() error (static string). */
const char *rustkvm_strerror(int32_t err);
/** Called once at QEMU exit: prints statistics when asked for, frees state. */
void rustkvm_machine_exit(void);
/**
 * The VM starts (true) or stops (false) running: a VM change state handler
 * (BQL held). Until the VM runs, and from the moment this returns false on,
 * no thread of rustkvm's own writes guest RAM (a write under way finishes
 * first): nothing changes RAM under savevm or migration's last pass.
 */
void rustkvm_vm_set_running(bool running);
/**
 * Create vCPU `index` (cpu_index); NULL on failure, with a negative
 * RUSTKVM_E* in *err (if `err` is not NULL): index out of range or taken,
 * no machine, or refused (RUSTKVM_EREFUSED_VCPU).
 */
RustkvmVcpu *rustkvm_vcpu_create(uint32_t index, int32_t *err);

/* rustkvm_vcpu_reset() kinds: KVM's kvm_vcpu_reset(vcpu, init_event). */
/** RESET: power-on, system_reset, cpu_reset() (init_event = false). */
#define RUSTKVM_RESET_COLD 0u
/**
 * x86 INIT (init_event = true): steal time, kvmclock and the TSC-deadline
 * timer are reset, the PMU, the TSC and IA32_TSC_ADJUST kept. QEMU emulates
 * an INIT with a cpu_reset(): call this right before it (do_cpu_init); the
 * cold reset and rustkvm_x86_vcpu_setup() of that cpu_reset() then keep what
 * INIT keeps. On arm64 it is a cold reset.
 */
#define RUSTKVM_RESET_INIT 1u
/** Reset a vCPU; `kind` is a RUSTKVM_RESET_* (anything else: cold). */
void rustkvm_vcpu_reset(RustkvmVcpu *vcpu, uint32_t kind);
/**
 * How another thread makes the vCPU leave guest code at its next block:
 * `exit(opaque)`, callable from any thread until replaced, removed (NULL
 * `exit`) or the vCPU destroyed (rustkvm: `cpu_exit(cpu)`, used when steal
 * time marks a descheduled vCPU preempted, so its next entry clears it).
 */
void rustkvm_vcpu_set_exit_request(RustkvmVcpu *vcpu,
                                   void (*exit)(void *opaque), void *opaque);
/** Destroy a vCPU (unplug, or exit); `vcpu` may be NULL. */
void rustkvm_vcpu_destroy(RustkvmVcpu *vcpu);
/**
 * The vCPU thread is about to execute guest code (steal time is folded in).
 * True: flush the vCPU's whole TLB before it does (x86 PV TLB flush:
 * another vCPU asked for it while this one was preempted).
 */
bool rustkvm_vcpu_run_begin(RustkvmVcpu *vcpu);
/** The vCPU thread left guest execution; `halted`: it stopped voluntarily. */
void rustkvm_vcpu_run_end(RustkvmVcpu *vcpu, bool halted);
/**
 * Whether an injected preemption holds the vCPU off its CPU: QEMU must not
 * run it, and counts it idle (AccelOpsClass.cpu_is_held). Any thread.
 */
bool rustkvm_vcpu_held(const RustkvmVcpu *vcpu);

/*
 * Injected steal and preemption (docs/steal-time.md "Injected steal"):
 * at VM time AT, vCPU CPU is held off its CPU for WINDOW ns of VM time
 * (x86: `preempted` set meanwhile), then its steal grows by STEAL ns. BQL
 * held. On a refusal nothing is added and `err` (if not NULL) gets a
 * NUL-terminated message, truncated to `err_len` bytes.
 */
/**
 * -accel rustkvm,inject-steal=SPEC: entries CPU:AT:STEAL[:WINDOW] separated
 * by '/', times in ns or with a unit (ns, us, ms, s). After machine init.
 */
bool rustkvm_inject_spec(const char *spec, char *err, uint32_t err_len);
/** QMP x-rustkvm-inject-steal: one injection; `at_ns` negative: now. */
bool rustkvm_inject_add(uint32_t cpu, int64_t at_ns, uint64_t steal_ns,
                        uint64_t window_ns, char *err, uint32_t err_len);
/** The injection timer (RustkvmHostOps.inject_timer) expired. */
void rustkvm_inject_fire(void);
/** Bytes per injection in the "rustkvm/inject" subsection. */
#define RUSTKVM_INJECT_RECORD_LEN 32u
/**
 * At most this many injections of one vCPU not done yet: rustkvm_inject_add
 * and rustkvm_inject_spec refuse more, and a stream bringing more (a
 * subsection longer than max_cpus * this * RUSTKVM_INJECT_RECORD_LEN bytes)
 * is refused before its buffer is allocated.
 */
#define RUSTKVM_INJECT_MAX_PER_VCPU 1024u
/**
 * The injections not done yet, as vmstate carries them (QEMU's
 * "rustkvm/inject" subsection): copies up to `len` bytes into `buf` (NULL
 * with `len` 0 only asks) and returns how many bytes the schedule takes (0:
 * nothing left). VM stopped, BQL held.
 */
uint32_t rustkvm_inject_save(uint8_t *buf, uint32_t len);
/**
 * Take the schedule of a stream (loadvm, incoming migration) instead of the
 * machine's own; `len` 0: the stream had none, so none is left. The vCPUs of
 * windows in progress are held. False, nothing changed, if the bytes are
 * malformed. VM stopped, BQL held.
 */
bool rustkvm_inject_load(const uint8_t *buf, uint32_t len, char *err,
                         uint32_t err_len);

/* x86 routing points (vCPU thread). */
/**
 * CPUID leaf/subleaf: regs[0..4] = EAX, EBX, ECX, EDX as TCG computed them;
 * Rust may rewrite them and returns HANDLED when it did.
 */
uint32_t rustkvm_x86_cpuid(RustkvmVcpu *vcpu, uint32_t leaf, uint32_t subleaf,
                           uint32_t regs[4]);
/**
 * CPUID leaf 0x15 or 0x16 (Intel models), or 0x40000010 (where QEMU offers
 * its vmware-cpuid-freq leaf), where the leaf is in range: regs[0..4] =
 * EAX, EBX, ECX, EDX from the VM's TSC rate (left alone for a NULL vcpu).
 */
void rustkvm_x86_cpuid_tsc(RustkvmVcpu *vcpu, uint32_t leaf, uint32_t regs[4]);
/** The basic CPUID level Intel models get at least: 0x15 and 0x16 in range. */
#define RUSTKVM_X86_TSC_LEAVES_MIN_LEVEL 0x16u
/** RDMSR `index`: HANDLED fills *value, FAULT raises #GP(0). */
uint32_t rustkvm_x86_rdmsr(RustkvmVcpu *vcpu, uint32_t index, uint64_t *value);
/** WRMSR `index` = value: HANDLED consumes it, FAULT raises #GP(0). */
uint32_t rustkvm_x86_wrmsr(RustkvmVcpu *vcpu, uint32_t index, uint64_t value);
/**
 * The vCPU entered (VMRUN) or left (#VMEXIT) SVM guest mode, with EFER.SVME
 * `svme`: an AMD PMU with RUSTKVM_PMU_SVM counts HostOnly/GuestOnly
 * counters by it. Call on the vCPU's thread.
 */
void rustkvm_x86_svm_mode(RustkvmVcpu *vcpu, bool svme, bool guest);
/** RDPMC with ECX = ecx, after the CR4.PCE/CPL check: HANDLED fills *value. */
uint32_t rustkvm_x86_rdpmc(RustkvmVcpu *vcpu, uint32_t ecx, uint64_t *value);

/* x86 CPUID policy (no vCPU: called while QEMU expands a CPU's features). */
/**
 * The bits of CPUID leaf/subleaf register `reg` (QEMU's numbering: EAX 0,
 * ECX 1, EDX 2, EBX 3) rustkvm can offer, given what TCG offers (`tcg`).
 */
uint32_t rustkvm_x86_cpuid_supported(uint32_t leaf, uint32_t subleaf,
                                     uint32_t reg, uint32_t tcg);
/*
 * Versions of rustkvm's CPUID defaults (-cpu ...,x-rustkvm-cpuid-defaults):
 * part of a versioned machine type's guest ABI, so a released version never
 * changes; a new default comes as a new version, and older machine types
 * keep theirs through a compat property.
 */
/** None: the CPU model's CPUID as TCG gives it. */
#define RUSTKVM_X86_CPUID_DEFAULTS_NONE 0u
/** rustkvm's defaults on QEMU 10.0's machine types. */
#define RUSTKVM_X86_CPUID_DEFAULTS_1 1u
/** The newest version: the property's default. */
#define RUSTKVM_X86_CPUID_DEFAULTS_LATEST RUSTKVM_X86_CPUID_DEFAULTS_1
/**
 * The bits named CPU models get by default in defaults version `version`,
 * as under KVM (0 for a version this library does not know).
 */
uint32_t rustkvm_x86_cpuid_defaults(uint32_t version, uint32_t leaf,
                                    uint32_t subleaf, uint32_t reg);
/**
 * An MSI `address` as the local APICs read it when the guest has
 * KVM_FEATURE_MSI_EXT_DEST_ID: bits 11:5 (destination bits 14:8) moved to
 * the upper half, as QEMU's kvm_swizzle_msi_ext_dest_id does for KVM.
 */
uint64_t rustkvm_x86_msi_ext_dest_id(uint64_t address);
/**
 * The bits every CPU model, `max` included, has off unless the user turns
 * them on, in defaults version `version`, as under KVM (QEMU's
 * kvm_default_props "monitor=off"; 0 for an unknown version).
 */
uint32_t rustkvm_x86_cpuid_default_off(uint32_t version, uint32_t leaf,
                                       uint32_t subleaf, uint32_t reg);

/* The counting engine (x86 PMU): totals the generated code keeps. */
/** RustkvmCounting.events[]: instructions retired at CPL > 0 ... */
#define RUSTKVM_EV_INSNS_USER 0
/** ... instructions retired at CPL 0 ... */
#define RUSTKVM_EV_INSNS_KERNEL 1
/** ... branch instructions retired at CPL > 0 ... */
#define RUSTKVM_EV_BRANCHES_USER 2
/** ... and at CPL 0 ... */
#define RUSTKVM_EV_BRANCHES_KERNEL 3
/** ... arm64: load/store instructions at EL0 ... */
#define RUSTKVM_EV_MEM_USER 4
/** ... and at EL1 (x86 uses none from here on) ... */
#define RUSTKVM_EV_MEM_KERNEL 5
/** ... arm64: instructions that load, at EL0 ... */
#define RUSTKVM_EV_LOADS_USER 6
/** ... and at EL1 ... */
#define RUSTKVM_EV_LOADS_KERNEL 7
/** ... arm64: instructions that store, at EL0 ... */
#define RUSTKVM_EV_STORES_USER 8
/** ... and at EL1 ... */
#define RUSTKVM_EV_STORES_KERNEL 9
/** ... arm64: exceptions taken from EL0 ... */
#define RUSTKVM_EV_EXC_USER 10
/** ... and from EL1. */
#define RUSTKVM_EV_EXC_KERNEL 11
/** How many totals there are. */
#define RUSTKVM_EV_COUNT 12

/* RustkvmCounting.active bits (arm64; x86 uses "nonzero"). */
/** A counter counts instructions, branches or memory events. */
#define RUSTKVM_ACTIVE_RETIRED 1u
/** A counter counts memory events (MEM_ACCESS, LD_RETIRED, ST_RETIRED). */
#define RUSTKVM_ACTIVE_MEM 2u
/** A counter counts exceptions taken (EXC_TAKEN). */
#define RUSTKVM_ACTIVE_EXC 4u
/**
 * x86: the vCPU records taken branches in its LBR (IA32_DEBUGCTL.LBR):
 * blocks report each taken branch with rustkvm_x86_lbr_branch().
 */
#define RUSTKVM_ACTIVE_LBR 8u

/**
 * RustkvmCounting.acc: a block's instructions are added from this bit up,
 * its branches below it, in one add.
 */
#define RUSTKVM_ACC_INSNS_SHIFT 32
/**
 * RustkvmCounting.acc's branch half is armed at this bias, so that taking
 * back a block's branches after the sums were armed again never borrows
 * from the instruction half.
 */
#define RUSTKVM_ACC_BIAS 0x80000000ull
/**
 * The largest budget RustkvmCounting.acc[0] is armed with: a budget of
 * INT64_MAX (no PMI armed) is spent every this many instructions, and
 * Rust arms it again.
 */
#define RUSTKVM_ACC_BUDGET_MAX 0x40000000ll

/**
 * Per-vCPU counting state shared by QEMU's generated code and Rust (it
 * lives in CPUState.neg, where QEMU's counting engine, accel/tcg/translator.c,
 * keeps it; Rust holds a pointer from rustkvm_x86_vcpu_setup() or
 * rustkvm_arm_vcpu_setup()). Only the vCPU's own thread touches it.
 */
typedef struct RustkvmCounting {
    /**
     * Monotonic event totals (RUSTKVM_EV_*) as of the last time Rust armed
     * acc; the instructions and branches since are in acc.  The engine
     * adds memory events and exceptions here directly.
     */
    uint64_t events[RUSTKVM_EV_COUNT];
    /**
     * Instructions that may retire before a PMI can be due (Rust's, armed
     * into acc[0]). INT64_MAX: no PMI armed.
     */
    int64_t budget;
    /** The block being entered: its instruction, branch ... */
    uint32_t tb_insns;
    /** (See tb_insns.) */
    uint32_t tb_branches;
    /** ... and (arm64) load/store instruction counts ... */
    uint32_t tb_mem;
    /** ... of which loading ... */
    uint32_t tb_loads;
    /** ... and storing. */
    uint32_t tb_stores;
    /**
     * ... and whether its events are privileged (x86 CPL 0, arm64 EL1):
     * 1, else 0.
     */
    uint32_t tb_priv;
    /**
     * Nonzero while a counter counts instructions or branches (Rust sets
     * it); arm64: RUSTKVM_ACTIVE_* bits.
     */
    uint32_t active;
    /**
     * x86: nonzero when a PMI is due (Rust sets it, QEMU delivers and clears
     * it). arm64: the level of the PMU's overflow interrupt (QEMU drives
     * the interrupt line with it).
     */
    uint32_t pmi;
    /**
     * When a cycle counter with a PMI may wrap, in QEMU_CLOCK_VIRTUAL ns;
     * -1: none. QEMU arms a timer for it that calls rustkvm_x86_pmu_due()
     * on the vCPU's thread (cycles are time, not instructions).
     */
    int64_t cycles_deadline_ns;
    /**
     * x86: nonzero when PEBS records are owed (Rust sets it; QEMU calls
     * rustkvm_x86_pebs_write() with the vCPU's state and clears it).
     */
    uint32_t pebs_due;
    /**
     * x86: the entered block's last instruction's offset from its first, in
     * bytes, stored with tb_insns (the EventingIP of a PEBS record).
     */
    uint32_t tb_last_ofs;
    /**
     * The engine's running sums of instructions and branches since Rust
     * last armed them: each block adds its instructions shifted by
     * RUSTKVM_ACC_INSNS_SHIFT plus its branches.  acc[0] takes every
     * block and carries the PMI budget: Rust arms it at minus the budget
     * (at most RUSTKVM_ACC_BUDGET_MAX), shifted, plus RUSTKVM_ACC_BIAS; the
     * budget is spent, and the engine calls back, once it is no longer
     * negative as an int64_t.  acc[1] takes privileged blocks only (x86
     * CPL 0, arm64 EL1), armed at RUSTKVM_ACC_BIAS: the user-mode sums are
     * the difference.
     */
    uint64_t acc[2];
    /** acc as Rust last armed it. */
    uint64_t acc_armed[2];
} RustkvmCounting;

/* rustkvm_x86_vcpu_setup() `pmu` values. */
/** No PMU (pmu=off, the default, on a vCPU not of AMD vendor). */
#define RUSTKVM_PMU_NONE 0u
/** Intel architectural PMU version 2 (-cpu <Intel vendor>,pmu=on). */
#define RUSTKVM_PMU_INTEL 1u
/**
 * AMD PMU (-cpu <AMD vendor>, whatever pmu= says, as KVM's amd_pmu_refresh()
 * gives it): the legacy K7 counters ...
 */
#define RUSTKVM_PMU_AMD 2u
/**
 * Or'ed to RUSTKVM_PMU_INTEL: the vCPU has PDCM (CPUID.1:ECX[15]), so
 * IA32_PERF_CAPABILITIES exists and offers full-width counter writes.
 */
#define RUSTKVM_PMU_FULL_WIDTH 0x100u
/** ... or'ed to RUSTKVM_PMU_AMD: PerfCtrExtCore (0x80000001 ECX[23]) ... */
#define RUSTKVM_PMU_PERFCTR_CORE 0x200u
/** ... and PerfMonV2 (CPUID 0x80000022 EAX[0]). */
#define RUSTKVM_PMU_PERFMON_V2 0x400u
/**
 * Or'ed to RUSTKVM_PMU_INTEL | RUSTKVM_PMU_FULL_WIDTH: the vCPU has legacy
 * LBR (PERF_CAPABILITIES.LBR_FMT 5, 32 records), as KVM offers it on an
 * Ice Lake host (-cpu ...,lbr-fmt=0 turns it off).
 */
#define RUSTKVM_PMU_LBR 0x800u

/* rustkvm_x86_lbr_branch() `kind`: what LBR_SELECT filters (lbr.c LBR_*). */
/** Jcc, LOOP, LOOPcc, JCXZ taken. */
#define RUSTKVM_LBR_JCC 1u
/** CALL rel. */
#define RUSTKVM_LBR_NEAR_REL_CALL 2u
/** CALL r/m. */
#define RUSTKVM_LBR_NEAR_IND_CALL 3u
/** RET. */
#define RUSTKVM_LBR_NEAR_RET 4u
/** JMP r/m. */
#define RUSTKVM_LBR_NEAR_IND_JMP 5u
/** JMP rel. */
#define RUSTKVM_LBR_NEAR_REL_JMP 6u
/**
 * Far CALL/JMP/RET, IRET, SYSCALL/SYSRET, SYSENTER/SYSEXIT, and interrupts
 * and exceptions delivered.
 */
#define RUSTKVM_LBR_FAR 7u
/**
 * Or'ed to RUSTKVM_PMU_INTEL | RUSTKVM_PMU_FULL_WIDTH: PEBS, record format
 * 4 with the baseline (the vCPU's CPUID has DS and DTES64).
 */
#define RUSTKVM_PMU_PEBS 0x1000u
/**
 * Or'ed to RUSTKVM_PMU_AMD: the vCPU has SVM (0x80000001 ECX[2]): event
 * selects keep HostOnly/GuestOnly (bits 41, 40), counted against SVM guest
 * mode (rustkvm_x86_svm_mode()), for a hypervisor in the guest.
 */
#define RUSTKVM_PMU_SVM 0x2000u

/** The vCPU's state a PEBS record is made of, at an instruction boundary. */
typedef struct RustkvmX86PebsSample {
    /** The linear address of the instruction that caused the event. */
    uint64_t eventing_ip;
    /** The linear address of the next instruction. */
    uint64_t next_ip;
    /** RFLAGS. */
    uint64_t flags;
    /** RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15. */
    uint64_t gprs[16];
    /** XMM0-15, low and high quadwords. */
    uint64_t xmm[32];
} RustkvmX86PebsSample;

/**
 * PEBS records are owed (RustkvmCounting.pebs_due): write them from
 * `sample` (vCPU thread); a PMI may then be due (RustkvmCounting.pmi).
 */
void rustkvm_x86_pebs_write(RustkvmVcpu *vcpu,
                            const RustkvmX86PebsSample *sample);

/** Records in the LBR stack. */
#define RUSTKVM_LBR_DEPTH 32
/** PERF_CAPABILITIES.LBR_FMT of that LBR (LBR_FORMAT_INFO). */
#define RUSTKVM_LBR_FORMAT 5u

/**
 * A taken branch from linear address `from` to `to`, ending at CPL `cpl`
 * (vCPU thread, while RUSTKVM_ACTIVE_LBR is set): recorded if LBR_SELECT
 * selects it.
 */
void rustkvm_x86_lbr_branch(RustkvmVcpu *vcpu, uint64_t from, uint64_t to,
                            uint32_t kind, uint32_t cpl);

/**
 * The PMI budget ran out with the block that was just entered, or the
 * cycles deadline passed (between blocks): sync the counters (as if the
 * whole block retired), set `pmi` if one is due, and compute the next
 * budget and deadline. The caller has already split blocks so that an
 * instruction or branch overflow is at the block's last instruction.
 */
void rustkvm_x86_pmu_due(RustkvmVcpu *vcpu);

/* x86 time (vCPU thread unless noted). */
/**
 * After each reset of an x86 vCPU: the TSC frequency the CPU model asks for
 * (-cpu ...,tsc-frequency; 0: rustkvm's default, 2 GHz; the first vCPU's
 * choice is the VM's), the KVM feature bits it advertises (CPUID
 * 0x40000001 EAX: kvmclock's stable bit follows them), its PMU
 * (RUSTKVM_PMU_*) and the counting state in its CPUState (reset here,
 * kept after an INIT). The counting state then says what the engine needs
 * (counting blocks, the cycles timer, a PMI): apply it.
 */
void rustkvm_x86_vcpu_setup(RustkvmVcpu *vcpu, uint64_t tsc_khz,
                            uint32_t kvm_features, uint32_t pmu,
                            RustkvmCounting *counting);
/**
 * After rustkvm_x86_vcpu_setup(): `-cpu ...,kvm-pv-enforce-cpuid=on`. PV MSRs
 * and hypercalls whose KVM feature bit the vCPU does not advertise then #GP
 * and return -KVM_ENOSYS, as KVM_CAP_ENFORCE_PV_FEATURE_CPUID.
 */
void rustkvm_x86_vcpu_enforce_pv_cpuid(RustkvmVcpu *vcpu, bool enforce);
/** RDTSC/RDTSCP (and RDMSR IA32_TSC): the guest TSC now. */
uint64_t rustkvm_x86_rdtsc(RustkvmVcpu *vcpu);
/**
 * The local APIC's LVT timer register was written (`restore`: loaded from
 * a saved machine, keep the deadline). Leaving or entering TSC-deadline
 * mode disarms it, as KVM.
 */
void rustkvm_x86_lvtt_write(RustkvmVcpu *vcpu, uint32_t lvt, bool restore);
/**
 * When the TSC-deadline timer is due, in QEMU_CLOCK_VIRTUAL ns; -1 if it is
 * not armed (or the LVT timer is not in TSC-deadline mode). Any thread.
 */
int64_t rustkvm_x86_tsc_deadline_ns(RustkvmVcpu *vcpu);
/**
 * The APIC timer went off in TSC-deadline mode: true if the deadline was
 * reached (it is disarmed; deliver the LVT timer interrupt). Any thread.
 */
bool rustkvm_x86_tsc_deadline_fire(RustkvmVcpu *vcpu);

/* x86 state QEMU saves (savevm/loadvm, migration). */
/** The LBR registers (legacy LBR; all 0 without it). */
typedef struct RustkvmLbrRegs {
    /** IA32_DEBUGCTL. */
    uint64_t debugctl;
    /** MSR_LBR_SELECT. */
    uint64_t select;
    /** MSR_LBR_TOS. */
    uint64_t tos;
    /** MSR_LBR_NHM_FROM + i. */
    uint64_t from[RUSTKVM_LBR_DEPTH];
    /** MSR_LBR_NHM_TO + i. */
    uint64_t to[RUSTKVM_LBR_DEPTH];
    /** MSR_LBR_INFO_0 + i. */
    uint64_t info[RUSTKVM_LBR_DEPTH];
} RustkvmLbrRegs;
/** x86 MSR values Rust owns that have a home in QEMU's CPUX86State. */
typedef struct RustkvmX86Msrs {
    /** MSR_KVM_STEAL_TIME (CPUX86State::steal_time_msr). */
    uint64_t steal_time;
    /** IA32_TSC (CPUX86State::tsc). */
    uint64_t tsc;
    /** IA32_TSC_ADJUST (CPUX86State::tsc_adjust). */
    uint64_t tsc_adjust;
    /** IA32_TSC_DEADLINE (CPUX86State::tsc_deadline). */
    uint64_t tsc_deadline;
    /** MSR_KVM_SYSTEM_TIME(_NEW) (CPUX86State::system_time_msr). */
    uint64_t system_time;
    /** MSR_KVM_WALL_CLOCK(_NEW) (CPUX86State::wall_clock_msr). */
    uint64_t wall_clock;
    /** MSR_KVM_POLL_CONTROL (CPUX86State::poll_control_msr). */
    uint64_t poll_control;
    /** IA32_FIXED_CTR_CTRL (CPUX86State::msr_fixed_ctr_ctrl). */
    uint64_t pmu_fixed_ctr_ctrl;
    /** IA32_PERF_GLOBAL_CTRL (CPUX86State::msr_global_ctrl). */
    uint64_t pmu_global_ctrl;
    /** IA32_PERF_GLOBAL_STATUS (CPUX86State::msr_global_status). */
    uint64_t pmu_global_status;
    /** IA32_FIXED_CTRx values (CPUX86State::msr_fixed_counters). */
    uint64_t pmu_fixed[3];
    /** IA32_PMCx values (CPUX86State::msr_gp_counters). */
    uint64_t pmu_gp[8];
    /** IA32_PERFEVTSELx (CPUX86State::msr_gp_evtsel). */
    uint64_t pmu_evtsel[8];
    /** MSR_KVM_PV_EOI_EN (CPUX86State::pv_eoi_en_msr). */
    uint64_t pv_eoi;
    /**
     * The PV EOI protocol: 0 idle, 1 the guest's bit set by the host, 2 an
     * EOI the guest made in memory still owed to the APIC
     * (CPUX86State::rustkvm_pv_eoi_state).
     */
    uint8_t pv_eoi_state;
    /** LBR (CPUX86State::rustkvm_lbr, vmstate cpu/rustkvm_lbr). */
    RustkvmLbrRegs lbr;
    /** IA32_PEBS_ENABLE (CPUX86State::rustkvm_pebs_enable, cpu/rustkvm_pebs) */
    uint64_t pebs_enable;
    /** MSR_PEBS_DATA_CFG (CPUX86State::rustkvm_pebs_data_cfg). */
    uint64_t pebs_data_cfg;
    /** IA32_DS_AREA (CPUX86State::rustkvm_ds_area). */
    uint64_t ds_area;
} RustkvmX86Msrs;
/** Copy the MSRs out, before QEMU saves the vCPU. */
void rustkvm_x86_save_msrs(RustkvmVcpu *vcpu, RustkvmX86Msrs *msrs);
/**
 * Take them back, after QEMU loaded the vCPU (values KVM would refuse are
 * dropped; the PMU's counters continue from their saved values, and
 * RustkvmCounting.active says whether the vCPU's blocks must count).
 */
void rustkvm_x86_load_msrs(RustkvmVcpu *vcpu, const RustkvmX86Msrs *msrs);

/*
 * x86 PV EOI (KVM_FEATURE_PV_EOI): the TCG local APIC's side, on the vCPU's
 * own thread with the BQL held.
 */
/** The APIC acknowledged `vector` (IRR to ISR); `level`: its TMR bit. */
void rustkvm_x86_apic_acked(RustkvmVcpu *vcpu, uint8_t vector, bool level);
/** The APIC ended its highest in-service interrupt (an EOI of any kind). */
void rustkvm_x86_apic_eoied(RustkvmVcpu *vcpu);
/**
 * The APIC is about to look at its in-service state (a register access,
 * an acknowledgement, a re-evaluation of what to deliver: KVM's exit). The
 * guest's bit is settled and, with `event` (an interrupt event: KVM's
 * entry with KVM_REQ_EVENT), re-armed where KVM would (`irr_pending`: any
 * IRR bit set). True: the guest ended an interrupt in memory, and the APIC
 * must do that EOI now.
 */
bool rustkvm_x86_pv_eoi_sync(RustkvmVcpu *vcpu, bool irr_pending, bool event);

/* x86 hypercalls (VMCALL/VMMCALL, vCPU thread). */
/** Nothing beyond writing RAX. */
#define RUSTKVM_HC_NONE 0u
/** End this vCPU's turn (KVM_HC_SCHED_YIELD). */
#define RUSTKVM_HC_YIELD 1u
/** Unhalt the vCPU whose APIC ID is `target`, then yield (KVM_HC_KICK_CPU). */
#define RUSTKVM_HC_KICK 2u
/** Raise #GP(0) at the instruction instead; RAX is not written. */
#define RUSTKVM_HC_FAULT_GP 3u
/** Raise #UD at the instruction instead; RAX is not written. */
#define RUSTKVM_HC_FAULT_UD 4u

/** Hypercall mode word: bits 0-1 the CPL ... */
#define RUSTKVM_HC_CPL_MASK 3u
/** ... bit 2: 64-bit mode (EFER.LMA and CS.L); otherwise 32-bit operands. */
#define RUSTKVM_HC_LONG_MODE 4u
/** ... bit 3: the instruction is VMMCALL (0F 01 D9), else VMCALL (0F 01 C1). */
#define RUSTKVM_HC_VMMCALL 8u
/** ... bit 4: the vCPU is AMD's (VMMCALL is its own hypercall, VMCALL not). */
#define RUSTKVM_HC_AMD 16u
/** ... bit 5: protected mode (CR0.PE set, EFLAGS.VM clear). */
#define RUSTKVM_HC_PROTECTED 32u

/** What a hypercall returns (in two registers: no memory round trip). */
typedef struct RustkvmHypercallRet {
    /** New RAX. */
    uint64_t rax;
    /** RUSTKVM_HC_*. */
    uint32_t action;
    /** APIC ID for RUSTKVM_HC_KICK. */
    uint32_t target;
} RustkvmHypercallRet;

/**
 * Execute a hypercall with KVM's ABI: `regs` is the vCPU's general-purpose
 * register file in x86 order (RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, ...:
 * the number in RAX, arguments in RBX, RCX, RDX, RSI), `mode` the CPL and
 * the RUSTKVM_HC_* mode bits. The other vendor's instruction reaches KVM
 * through #UD and its emulator, which may fault instead (RUSTKVM_HC_FAULT_*).
 * A NULL vcpu or regs answers -KVM_ENOSYS.
 */
RustkvmHypercallRet rustkvm_x86_hypercall(RustkvmVcpu *vcpu,
                                          const uint64_t *regs, uint32_t mode);
/** A KICK_CPU reached `vcpu`: its next (or current) HLT returns at once. */
void rustkvm_x86_pv_kick(RustkvmVcpu *vcpu);
/** Whether `vcpu` was kicked since it last consumed a kick (consumes it). */
bool rustkvm_x86_take_pv_unhalt(RustkvmVcpu *vcpu);

/* arm64 machine services. */
/**
 * The machine gives `vcpu` its 64-byte PV stolen-time structure at `ipa`
 * (like KVM_ARM_VCPU_PVTIME_IPA); false if misaligned or already set.
 */
bool rustkvm_arm_set_pvtime(RustkvmVcpu *vcpu, uint64_t ipa);
/** Whether the guest uses PV stolen time (saved with the vCPU). */
bool rustkvm_arm_pvtime_active(RustkvmVcpu *vcpu);
/** Restore that after loading the vCPU (loadvm, incoming migration). */
void rustkvm_arm_load_pvtime(RustkvmVcpu *vcpu, bool active);

/* arm64 routing points (vCPU thread). */
/**
 * HVC or SMC from AArch64 with the PSCI conduit's instruction: regs[0..8] =
 * x0..x7 in; on HANDLED, regs[0..4] are written back to x0..x3 (SMCCC 1.1,
 * PV time, KVM's vendor UID). Any other result lets QEMU's PSCI
 * implementation answer.
 */
uint32_t rustkvm_arm_hvc_smc(RustkvmVcpu *vcpu, bool is_smc, uint64_t regs[8]);
/**
 * MRS of an AArch64 PMU system register, encoded as KVM's sys_reg():
 * op0 << 14 | op1 << 11 | crn << 7 | crm << 3 | op2, at exception level
 * `el`. HANDLED fills *value; FAULT: UNDEFINED for the guest; UNHANDLED
 * (no PMUv3 here) runs TCG's accessor. (Constant registers are not routed.)
 */
uint32_t rustkvm_arm_pmu_read(RustkvmVcpu *vcpu, uint32_t encoding,
                              uint32_t el, uint64_t *value);
/**
 * MSR of an AArch64 PMU system register (encoding as for the read) at
 * exception level `el`. HANDLED: done (update the engine from `counting`);
 * FAULT: UNDEFINED for the guest (KVM's answer); UNHANDLED: no PMUv3 here.
 */
uint32_t rustkvm_arm_pmu_write(RustkvmVcpu *vcpu, uint32_t encoding,
                               uint32_t el, uint64_t value);
/**
 * After each reset of an AArch64 vCPU: whether it has PMUv3 (`pmu`), its
 * event counters (PMCR_EL0.N), whether it has PMUv3p5 (64-bit event
 * counters), whether it has EL2 (`el2`: PMEVTYPER<n>_EL0.NSH exists), the
 * counting state in its CPUState (reset here) and the generic timer's
 * counter frequency in Hz (CNTFRQ_EL0; KVM's PTP call). Then tell its
 * exception level (rustkvm_arm_el_change()).
 */
void rustkvm_arm_vcpu_setup(RustkvmVcpu *vcpu, bool pmu, uint32_t counters,
                            bool v3p5, bool el2, RustkvmCounting *counting,
                            uint64_t cntfrq_hz);
/**
 * The AArch64 vCPU is at exception level `el` now: after each exception
 * taken and each exception return of a vCPU with EL2 (its PMU counts EL2
 * apart from EL1: the counting engine's privileged totals are both), and
 * after its setup and before rustkvm_arm_pmu_load(). A repeated report
 * changes nothing.
 */
void rustkvm_arm_el_change(RustkvmVcpu *vcpu, uint32_t el);
/**
 * MDCR_EL2 of an AArch64 vCPU with EL2 := `value` (a write at EL2, and
 * after each reset and each load): the value the register holds, HPMN
 * clamped to PMCR_EL0.N as KVM's access_mdcr() does (`value` unchanged
 * without rustkvm's PMU). The PMU follows its HPMN, HPME, HPMD, HCCD and
 * HLP: update the engine from `counting`.
 */
uint64_t rustkvm_arm_mdcr_el2(RustkvmVcpu *vcpu, uint64_t value);
/**
 * Whether an access at exception level `el` to the AArch64 PMU system
 * register `encoding` (as for rustkvm_arm_pmu_read()) traps to EL2 because
 * it names an event counter MDCR_EL2.HPMN reserves for EL2 (PMEVCNTR<n>,
 * PMEVTYPER<n>, or PMXEV* with PMSELR_EL0.SEL n); QEMU's own access checks
 * come first.
 */
bool rustkvm_arm_pmu_traps_to_el2(RustkvmVcpu *vcpu, uint32_t encoding,
                                  uint32_t el);
/** As rustkvm_x86_pmu_due(), for an AArch64 vCPU's PMU. */
void rustkvm_arm_pmu_due(RustkvmVcpu *vcpu);
/** PMCEID0_EL0 (n = 0) or PMCEID1_EL0 (n = 1): the events counted. */
uint64_t rustkvm_arm_pmceid(uint32_t n);

/*
 * arm64 PMU state QEMU saves (vmstate subsection cpu/rustkvm-pmu):
 * PMCR_EL0, PMCNTENSET, PMINTENSET, PMOVSSET, PMSELR, PMUSERENR, the 32
 * PMEVTYPER<n>/PMCCFILTR and the 32 counter values (n = 31: PMCCNTR).
 */
#define RUSTKVM_ARM_PMU_REGS 70
/** Whether the vCPU has rustkvm's PMUv3 (its state then needs saving). */
bool rustkvm_arm_pmu_present(RustkvmVcpu *vcpu);
/** Copy the PMU registers out (counter values as of now). */
void rustkvm_arm_pmu_save(RustkvmVcpu *vcpu, uint64_t *regs);
/**
 * Take them back after a load (values KVM would not hold are masked); the
 * counters continue from their saved values. Update the engine after.
 */
void rustkvm_arm_pmu_load(RustkvmVcpu *vcpu, const uint64_t *regs);

/*
 * x-query-rustkvm (QMP) and info rustkvm (HMP): what one vCPU reports, the
 * same shape under backend=tcg (from the models) and backend=kvm (QEMU reads
 * KVM's state and Rust decodes it with the same rules). Call on the vCPU's
 * thread (run_on_cpu).
 */
/** Longest counter or register name, with its NUL. */
#define RUSTKVM_INFO_NAME_LEN 16u
/** Most counters a vCPU reports (arm64: 31 event counters + cycles). */
#define RUSTKVM_INFO_COUNTERS 40u
/** Most timer registers a vCPU reports. */
#define RUSTKVM_INFO_TIMER_REGS 8u

/** One PMU counter. */
typedef struct RustkvmInfoCounter {
    /** gpN, fixedN (x86); evtN, cycles (arm64); NUL-terminated. */
    char name[RUSTKVM_INFO_NAME_LEN];
    /** Event select / PMEVTYPER / the fixed counter's control nibble. */
    uint64_t config;
    /** Count now. */
    uint64_t value;
    /** Counting now (its enables and the global ones). */
    bool enabled;
} RustkvmInfoCounter;

/** One named register. */
typedef struct RustkvmInfoReg {
    /** NUL-terminated name, e.g. tsc-deadline, cntv-cval. */
    char name[RUSTKVM_INFO_NAME_LEN];
    /** Its value. */
    uint64_t value;
} RustkvmInfoReg;

/** What one vCPU reports. */
typedef struct RustkvmVcpuInfo {
    /** Steal time enabled (x86 MSR bit 0; arm64: PV_TIME_ST called). */
    bool steal_enabled;
    /** x86 preempted bit 0. */
    bool steal_preempted;
    /** steal_version is known (x86, structure readable). */
    bool has_steal_version;
    /** x86 struct kvm_steal_time.version. */
    uint32_t steal_version;
    /** Guest-physical address of the steal-time structure. */
    uint64_t steal_gpa;
    /** Stolen nanoseconds as the structure says. */
    uint64_t steal_ns;
    /** The architecture has kvmclock (x86). */
    bool has_pvclock;
    /** MSR_KVM_SYSTEM_TIME_NEW bit 0. */
    bool pvclock_enabled;
    /** Its pvclock_vcpu_time_info address. */
    uint64_t pvclock_gpa;
    /** PMU version (x86 KVM pmu->version; arm64 PMUVer); 0: no PMU. */
    uint32_t pmu_version;
    /** pmu_global_* are meaningful (x86 PMU v2). */
    bool has_pmu_global;
    /** IA32_PERF_GLOBAL_CTRL / AMD PerfCntrGlobalCtl. */
    uint64_t pmu_global_ctrl;
    /** IA32_PERF_GLOBAL_STATUS / AMD PerfCntrGlobalStatus. */
    uint64_t pmu_global_status;
    /** Entries of counters[] in use. */
    uint32_t n_counters;
    /** The counters that exist. */
    RustkvmInfoCounter counters[RUSTKVM_INFO_COUNTERS];
    /** Entries of timer[] in use. */
    uint32_t n_timer;
    /** Timer registers. */
    RustkvmInfoReg timer[RUSTKVM_INFO_TIMER_REGS];
} RustkvmVcpuInfo;

/** The CPUID words describing an x86 vCPU's PMU (backend=kvm). */
typedef struct RustkvmX86PmuCpuid {
    /** AMD or Hygon vendor. */
    bool amd;
    /** KVM has a vPMU for it: its enable_pmu, and pmu=on or an AMD vendor. */
    bool pmu;
    /** CPUID 0xA EAX. */
    uint32_t leaf_a_eax;
    /** CPUID 0xA EDX. */
    uint32_t leaf_a_edx;
    /** CPUID 0x80000001 ECX. */
    uint32_t ext1_ecx;
    /** CPUID 0x80000022 EAX. */
    uint32_t ext22_eax;
    /** CPUID 0x80000022 EBX. */
    uint32_t ext22_ebx;
} RustkvmX86PmuCpuid;

/**
 * Reads MSR `index` of the vCPU behind `opaque` (backend=kvm: KVM_GET_MSRS)
 * into *value; false if it cannot.
 */
typedef bool (*RustkvmReadMsr)(void *opaque, uint32_t index, uint64_t *value);
/**
 * backend=kvm, an AMD guest (QEMU 10.0 does not read its PMU MSRs from KVM):
 * read the PMU MSRs KVM holds for a guest with @cpuid -- which and where,
 * as KVM's amd_pmu_refresh derives them -- with @read, into @msrs'
 * pmu_evtsel, pmu_gp and pmu_global_*. All or nothing: when a read fails,
 * @msrs is left as it was. Does nothing for an Intel guest or without a PMU.
 */
void rustkvm_x86_read_amd_pmu(const RustkvmX86PmuCpuid *cpuid,
                              RustkvmReadMsr read, void *opaque,
                              RustkvmX86Msrs *msrs);

/**
 * An x86 vCPU's report from its MSRs (rustkvm_x86_save_msrs() under
 * backend=tcg; QEMU's synchronized CPUX86State under backend=kvm) and the
 * steal-time structure's 64 bytes (NULL if disabled or unreadable). The PMU's
 * shape comes from @vcpu's model, or from @cpuid when @vcpu is NULL.
 */
void rustkvm_x86_info(RustkvmVcpu *vcpu, const RustkvmX86Msrs *msrs,
                      const RustkvmX86PmuCpuid *cpuid, const uint8_t *steal,
                      RustkvmVcpuInfo *out);
/** The arm64 PV time structure's IPA if the guest asked for it, else 0. */
uint64_t rustkvm_arm_pvtime_ipa(RustkvmVcpu *vcpu);
/**
 * An arm64 vCPU's report (backend=tcg): PMU and PV time from the models,
 * the PV time structure's 64 bytes (NULL if unread), and QEMU's timers:
 * timers[4] = CNTV_CTL, CNTV_CVAL, CNTP_CTL, CNTP_CVAL.
 */
void rustkvm_arm_info(RustkvmVcpu *vcpu, const uint64_t *timers,
                      const uint8_t *pvtime, RustkvmVcpuInfo *out);
/**
 * An arm64 vCPU's report under backend=kvm, from what QEMU synchronized
 * from KVM: @pmu the PMU registers in RUSTKVM_ARM_PMU_REGS order (NULL: no
 * PMU), @pmuver ID_AA64DFR0_EL1.PMUVer, @pvtime_ipa the PV time structure's
 * IPA KVM holds (0: none) and @pvtime its 64 bytes (NULL if unread),
 * @timers as for rustkvm_arm_info().
 */
void rustkvm_arm_info_kvm(const uint64_t *pmu, uint32_t pmuver,
                          uint64_t pvtime_ipa, const uint8_t *pvtime,
                          const uint64_t *timers, RustkvmVcpuInfo *out);

#endif /* RUSTKVM_H */
