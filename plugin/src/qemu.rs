//! The plugin's face to QEMU: `qemu_plugin_install`, the translation
//! callback that plants inline operations, and the report at exit (or when
//! `limit=` stops the run).
//!
//! Hot path: nothing runs per executed instruction but QEMU's inline
//! scoreboard adds (no callbacks, no locks, no allocation). The translation
//! callback (per translated block, not per execution) classifies
//! instructions with a per-thread capstone handle and takes a lock only to
//! record a block for the hot-block report.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use qemu_plugin_sys as sys;

use crate::args::{Config, Format, Mode};
use crate::blocks::{bb_line, drcov, BlockTable};
use crate::classify::{groups_of, Arch, Class, Classifier, InsnInfo};
use crate::hot::{BlockInfo, BlockKey, HotTable};
use crate::report::{Interval, PastCap, Report, VcpuCounts};
use crate::resets::{Reason, Resets};
use crate::trace::TraceWriter;

/// The plugin API version QEMU checks before calling `qemu_plugin_install`.
#[unsafe(no_mangle)]
pub static qemu_plugin_version: c_int = crate::PLUGIN_API_VERSION as c_int;

unsafe extern "C" {
    /// glib's allocator's free, for strings the plugin API hands over.
    fn g_free(mem: *mut c_void);
}

/// The loaded plugin.
struct Plugin {
    /// The id QEMU gave this plugin (for `qemu_plugin_reset`).
    id: sys::qemu_plugin_id_t,
    config: Config,
    arch: Arch,
    target: String,
    /// System emulation (else user mode): how `limit=` stops QEMU.
    system: bool,
    /// QEMU's main thread blocks SIGTERM (its parent's mask): `limit=`
    /// cannot stop QEMU through it.
    sigterm_blocked: bool,
    /// One `VcpuCounts` per vCPU.
    score: *mut sys::qemu_plugin_scoreboard,
    /// `hot=`: one scoreboard (a `u64` per vCPU) per distinct block.
    hot: Mutex<HotTable<*mut sys::qemu_plugin_scoreboard>>,
    intervals: Mutex<Vec<Interval>>,
    out: Mutex<Option<File>>,
    /// `timeline=`'s file.
    timeline: Mutex<Option<File>>,
    /// `bbv=`/`drcov=`: per distinct block, its scoreboards.
    blocks: Mutex<BlockTable<BlockScores>>,
    /// `bbv=`: per vCPU, its `.bb` file once it wrote a line.
    bbv_files: Mutex<Vec<Option<std::io::BufWriter<File>>>>,
    /// `drcov=`'s file.
    drcov: Mutex<Option<File>>,
    /// `trace=`: the writer and the vCPUs' buffers.
    tracer: Option<TraceWriter>,
    /// When the plugin was loaded (the timeline's time 0).
    loaded: std::time::Instant,
}

// SAFETY: the scoreboard pointers are handles QEMU lets any vCPU thread use
// (inline ops and u64 getters are thread-safe by the plugin API); the rest is
// plain data or behind a Mutex.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

static PLUGIN: OnceLock<Plugin> = OnceLock::new();

/// vCPUs `trace=` keeps a buffer for (executions on vCPUs above are
/// counted as lost).
const TRACE_VCPUS: usize = 1024;

/// A distinct block's scoreboards (`u64` per vCPU; null when not asked
/// for): `bbv=`'s instructions in the current interval, `drcov=`'s
/// executions.
#[derive(Debug, Clone, Copy)]
struct BlockScores {
    bbv: *mut sys::qemu_plugin_scoreboard,
    seen: *mut sys::qemu_plugin_scoreboard,
}

/// Who wrote the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reported {
    /// No one yet.
    Not,
    /// The exit callback (QEMU exits for another reason).
    AtExit,
    /// The `limit=` stop.
    Limit,
}

/// Set, under its lock, by whichever writes the report first (the exit
/// callback or the `limit=` stop): the report is written once, and the
/// other waits until it is (QEMU can call `exit` while a vCPU writes it:
/// `qemu_wait_io_event_common` counts a vCPU as stopped before it runs its
/// queued work, system/cpus.c).
static REPORTED: Mutex<Reported> = Mutex::new(Reported::Not);

/// `trace=`: every vCPU has passed its `trace-count=` window, and the
/// plugin was reset to retranslate without the trace's callbacks.
static TRACE_DONE: AtomicBool = AtomicBool::new(false);
/// vCPUs past their window.
static TRACE_DONE_VCPUS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The first vCPU that reached `limit=`.
static LIMIT_VCPU: OnceLock<c_uint> = OnceLock::new();

/// The plugin's `qemu_plugin_reset` requests (crate::resets).
static RESETS: Mutex<Resets> = Mutex::new(Resets::new());

/// Ask QEMU for a reset for `why`, unless one of ours is pending (its
/// callback, [`on_reset`], serves `why` too). Called from vCPU callbacks,
/// as the API allows.
fn request_reset(p: &Plugin, why: Reason) {
    if RESETS.lock().is_ok_and(|mut r| r.request(why)) {
        // SAFETY: our own id, from a vCPU callback.
        unsafe { sys::qemu_plugin_reset(p.id, Some(on_reset)) };
    }
}

/// QEMU's reset callback: every vCPU is held out of guest code, the code
/// cache is flushed and our callbacks are gone. Serve every reason asked
/// for: `limit=` stops the run; `trace=`'s end registers the callbacks
/// again (the scoreboards and tables are ours and go on; translation now
/// plants no trace callbacks).
unsafe extern "C" fn on_reset(id: sys::qemu_plugin_id_t) {
    let Some(p) = PLUGIN.get() else { return };
    let wanted = RESETS.lock().map(|mut r| r.run()).unwrap_or_default();
    if let Some(vcpu) = wanted.limit {
        // The callbacks stay unregistered: the vCPUs run on uncounted
        // until QEMU stops them.
        stop_at_limit(p, vcpu);
    } else if wanted.trace_done {
        register_callbacks(id);
    }
}

thread_local! {
    static CLASSIFIER: RefCell<Option<Classifier>> = const { RefCell::new(None) };
}

fn entry(score: *mut sys::qemu_plugin_scoreboard, offset: usize) -> sys::qemu_plugin_u64 {
    sys::qemu_plugin_u64 { score, offset }
}

/// QEMU calls this once when loading the plugin.
///
/// # Safety
/// QEMU passes a valid `info` and `argc` valid C strings in `argv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn qemu_plugin_install(
    id: sys::qemu_plugin_id_t,
    info: *const sys::qemu_info_t,
    argc: c_int,
    argv: *mut *mut c_char,
) -> c_int {
    // SAFETY: forwarded caller contract.
    match unsafe { install(id, info, argc, argv) } {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            -1
        }
    }
}

/// # Safety
/// As `qemu_plugin_install`.
unsafe fn install(
    id: sys::qemu_plugin_id_t,
    info: *const sys::qemu_info_t,
    argc: c_int,
    argv: *mut *mut c_char,
) -> Result<(), String> {
    let mut args = Vec::new();
    for i in 0..usize::try_from(argc).unwrap_or(0) {
        // SAFETY: QEMU passes argc valid, NUL-terminated strings.
        let a = unsafe { CStr::from_ptr(*argv.add(i)) };
        args.push(
            a.to_str()
                .map_err(|_| format!("rustkvm plugin: argument {i} is not UTF-8"))?,
        );
    }
    let config = Config::parse(args).map_err(|e| e.to_string())?;
    // SAFETY: QEMU passes a valid info with a NUL-terminated target name.
    let target = unsafe {
        info.as_ref()
            .and_then(|i| i.target_name.as_ref().map(|t| CStr::from_ptr(t)))
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // SAFETY: as above.
    let system = unsafe { info.as_ref().is_some_and(|i| i.system_emulation) };
    if PLUGIN.get().is_some() {
        return Err(
            "rustkvm plugin: already loaded from this file (copy it to load it twice)".into(),
        );
    }
    let arch = Arch::from_target(&target).ok_or_else(|| {
        format!("rustkvm plugin: target '{target}' is not supported (x86_64, i386, aarch64)")
    })?;
    Classifier::new(arch).ok_or("rustkvm plugin: capstone cannot decode this target")?;
    // Every output file is created now, so that a bad path is refused at
    // load with the argument named.
    let create = |key: &str, path: &Option<std::path::PathBuf>| -> Result<Option<File>, String> {
        path.as_ref()
            .map(|p| {
                File::create(p).map_err(|e| {
                    format!(
                        "rustkvm plugin: bad argument '{key}={}': cannot create it: {e}",
                        p.display()
                    )
                })
            })
            .transpose()
    };
    let out = create("outfile", &config.outfile)?;
    let drcov_out = create("drcov", &config.drcov)?;
    let timeline = create("timeline", &config.timeline)?;
    // The writer thread last: nothing fails after it starts (QEMU unloads a
    // plugin whose install fails).
    let tracer = create("trace", &config.trace)?
        .map(|f| TraceWriter::start(f, TRACE_VCPUS, config.trace_wait))
        .transpose()
        .map_err(|e| format!("rustkvm plugin: trace=: cannot start its writer thread: {e}"))?;
    // SAFETY: plain plugin API call.
    let score = unsafe { sys::qemu_plugin_scoreboard_new(std::mem::size_of::<VcpuCounts>()) };
    let plugin = Plugin {
        id,
        config,
        arch,
        target,
        system,
        sigterm_blocked: sigterm_blocked(),
        score,
        hot: Mutex::new(HotTable::default()),
        intervals: Mutex::new(Vec::new()),
        out: Mutex::new(out),
        timeline: Mutex::new(timeline),
        blocks: Mutex::new(BlockTable::default()),
        bbv_files: Mutex::new(Vec::new()),
        drcov: Mutex::new(drcov_out),
        tracer,
        loaded: std::time::Instant::now(),
    };
    // (Checked above: QEMU installs plugins one at a time.)
    let _ = PLUGIN.set(plugin);
    register_callbacks(id);
    Ok(())
}

/// Whether the calling thread (at install, QEMU's main thread) blocks
/// SIGTERM.
fn sigterm_blocked() -> bool {
    // SAFETY: sigset_t is plain data, filled by pthread_sigmask.
    let mut cur: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a NULL new set only reads the mask into `cur`, which
    // sigismember then reads.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) == 0
            && libc::sigismember(&cur, libc::SIGTERM) == 1
    }
}

/// Register the translation and exit callbacks (at install, and again
/// after `trace=`'s reset).
fn register_callbacks(id: sys::qemu_plugin_id_t) {
    // SAFETY: registering our callbacks with the id QEMU gave us.
    unsafe {
        sys::qemu_plugin_register_vcpu_tb_trans_cb(id, Some(tb_trans));
        sys::qemu_plugin_register_atexit_cb(id, Some(at_exit), std::ptr::null_mut());
    }
}

/// Classify a block's instructions (with this thread's capstone handle).
///
/// # Safety
/// `tb` is the block QEMU is translating.
unsafe fn classify_block(arch: Arch, tb: *mut sys::qemu_plugin_tb, n: usize) -> Vec<InsnInfo> {
    CLASSIFIER.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Classifier::new(arch);
        }
        (0..n)
            .map(|i| {
                // SAFETY: i < n instructions of this block.
                let insn = unsafe { sys::qemu_plugin_tb_get_insn(tb, i) };
                let mut buf = [0u8; 16];
                // SAFETY: insn is valid during translation; buf is writable.
                let size = unsafe { sys::qemu_plugin_insn_size(insn) };
                // SAFETY: as above; QEMU copies at most buf.len() bytes.
                let got =
                    unsafe { sys::qemu_plugin_insn_data(insn, buf.as_mut_ptr().cast(), buf.len()) };
                match c.as_ref() {
                    Some(c) if got == size => c.classify(&buf[..got], size),
                    _ => InsnInfo::UNKNOWN,
                }
            })
            .collect()
    })
}

/// Plant the inline adds of one group (or one instruction, or one block)
/// of counts at `at`.
fn plant(
    score: *mut sys::qemu_plugin_scoreboard,
    config: &Config,
    (insns, branches, classes): (u64, u64, &[u64; 6]),
    bbv: Option<sys::qemu_plugin_u64>,
    add: &mut dyn FnMut(sys::qemu_plugin_u64, u64),
) {
    let c = config.counters;
    if let Some(b) = bbv {
        if insns > 0 {
            add(b, insns);
        }
    }
    // limit=, interval= and trace= watch the instruction count: keep it
    // then too.
    if (c.instructions || config.limit > 0 || config.interval > 0 || config.trace.is_some())
        && insns > 0
    {
        add(entry(score, VcpuCounts::INSTRUCTIONS), insns);
    }
    if config.interval > 0 && insns > 0 {
        add(entry(score, VcpuCounts::SINCE_INTERVAL), insns);
    }
    if c.branches && branches > 0 {
        add(entry(score, VcpuCounts::BRANCHES), branches);
    }
    if c.classes {
        for class in Class::ALL {
            let n = classes[class as usize];
            if n > 0 {
                add(entry(score, VcpuCounts::class(class)), n);
            }
        }
    }
}

unsafe extern "C" fn tb_trans(_id: sys::qemu_plugin_id_t, tb: *mut sys::qemu_plugin_tb) {
    let Some(p) = PLUGIN.get() else { return };
    let op = sys::qemu_plugin_op::QEMU_PLUGIN_INLINE_ADD_U64;
    // SAFETY: tb is the block being translated.
    let n = unsafe { sys::qemu_plugin_tb_n_insns(tb) };
    if n == 0 {
        return;
    }
    let c = p.config.counters;
    let need_classes = p.config.mode == Mode::Exact || c.branches || c.classes;
    let infos = if need_classes {
        // SAFETY: tb is the block being translated.
        unsafe { classify_block(p.arch, tb, n) }
    } else {
        vec![InsnInfo::UNKNOWN; n]
    };
    // filter= and symbol=: which instructions are counted at all.
    let counted: Vec<bool> = (0..n)
        .map(|i| {
            if p.config.range.is_none() && p.config.symbol.is_none() {
                return true;
            }
            // SAFETY: i < n instructions of the block being translated.
            let insn = unsafe { sys::qemu_plugin_tb_get_insn(tb, i) };
            let in_range = p.config.range.is_none_or(|(a, b)| {
                // SAFETY: as above.
                let va = unsafe { sys::qemu_plugin_insn_vaddr(insn) };
                (a..b).contains(&va)
            });
            in_range
                && p.config.symbol.as_deref().is_none_or(|want| {
                    // SAFETY: as above; QEMU returns NULL or a static string.
                    let s = unsafe { sys::qemu_plugin_insn_symbol(insn) };
                    // SAFETY: a non-NULL symbol is a NUL-terminated string
                    // that outlives the translation.
                    !s.is_null() && unsafe { CStr::from_ptr(s) }.to_bytes() == want.as_bytes()
                })
        })
        .collect();
    if !counted.iter().any(|&c| c) {
        return;
    }
    let scores = (p.config.bbv.is_some() || p.config.drcov.is_some())
        // SAFETY: tb is the block being translated, with n instructions.
        .then(|| unsafe { block_scores(p, tb, n) })
        .flatten();
    let bbv = scores.filter(|s| !s.bbv.is_null()).map(|s| entry(s.bbv, 0));
    if let Some(s) = scores.filter(|s| !s.seen.is_null()) {
        // SAFETY: tb is being translated; the scoreboard is ours and never
        // freed.
        unsafe {
            sys::qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, op, entry(s.seen, 0), 1)
        };
    }
    let insn_add = |i: usize| {
        // SAFETY: i < the block's instruction count, during translation.
        let insn = unsafe { sys::qemu_plugin_tb_get_insn(tb, i) };
        // SAFETY: insn is valid during translation; the scoreboard entry
        // `e` lives until exit.
        move |e: sys::qemu_plugin_u64, imm: u64| unsafe {
            sys::qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(insn, op, e, imm)
        }
    };
    match p.config.mode {
        Mode::Exact => {
            for g in groups_of(&infos, |i| counted[i]) {
                plant(
                    p.score,
                    &p.config,
                    (g.insns, g.branches, &g.classes),
                    bbv,
                    &mut insn_add(g.start),
                );
            }
        }
        Mode::Insn => {
            for (i, info) in infos.iter().enumerate().filter(|(i, _)| counted[*i]) {
                let mut classes = [0u64; 6];
                classes[info.class as usize] = 1;
                plant(
                    p.score,
                    &p.config,
                    (1, u64::from(info.branch), &classes),
                    bbv,
                    &mut insn_add(i),
                );
            }
        }
        Mode::Tb => {
            let whole = groups_of(&infos, |i| counted[i]).iter().fold(
                (0, 0, [0u64; 6]),
                |(i, b, mut cl), g| {
                    for (a, x) in cl.iter_mut().zip(g.classes) {
                        *a += x;
                    }
                    (i + g.insns, b + g.branches, cl)
                },
            );
            // SAFETY: tb is valid during translation; the scoreboard entry
            // lives until exit.
            let mut add = |e, imm| unsafe {
                sys::qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, op, e, imm)
            };
            plant(
                p.score,
                &p.config,
                (whole.0, whole.1, &whole.2),
                bbv,
                &mut add,
            );
        }
    }
    // trace=: each traced instruction's callback reads the vCPU's count and
    // takes off what the count is ahead of the instruction's own index. The
    // callbacks are registered after the counting adds, and QEMU runs an
    // instruction's inline operations and callbacks in the order they were
    // registered (plugin-gen's inject_cb): a group's add (mode=exact), an
    // instruction's own (insn) and the block's (tb, at its start) are in
    // when the callback runs. tests/tests/plugin.rs checks that the indices
    // run consecutively in every mode.
    if p.tracer.is_some() && !TRACE_DONE.load(Ordering::Relaxed) {
        let mut ahead = vec![0u64; n];
        match p.config.mode {
            Mode::Exact => {
                for g in groups_of(&infos, |i| counted[i]) {
                    for k in 0..g.insns as usize {
                        ahead[g.start + k] = g.insns - k as u64;
                    }
                }
            }
            Mode::Insn => ahead.iter_mut().for_each(|a| *a = 1),
            Mode::Tb => {
                let total = counted.iter().filter(|&&c| c).count() as u64;
                let mut k = 0;
                for (i, a) in ahead.iter_mut().enumerate() {
                    if counted[i] {
                        *a = total - k;
                        k += 1;
                    }
                }
            }
        }
        for i in (0..n).filter(|&i| counted[i]) {
            // SAFETY: i < n, during translation.
            unsafe { plant_trace(p, tb, i, ahead[i]) };
        }
    }
    // SAFETY: tb is valid during translation; the scoreboard lives until
    // exit; the callbacks are `extern "C"` functions of this plugin.
    let cond = |entry_off: usize, imm: u64, cb: sys::qemu_plugin_vcpu_udata_cb_t| unsafe {
        sys::qemu_plugin_register_vcpu_tb_exec_cond_cb(
            tb,
            cb,
            sys::qemu_plugin_cb_flags::QEMU_PLUGIN_CB_NO_REGS,
            sys::qemu_plugin_cond::QEMU_PLUGIN_COND_GE,
            entry(p.score, entry_off),
            imm,
            std::ptr::null_mut(),
        )
    };
    if p.config.limit > 0 {
        cond(VcpuCounts::INSTRUCTIONS, p.config.limit, Some(on_limit));
    }
    if p.config.interval > 0 {
        cond(
            VcpuCounts::SINCE_INTERVAL,
            p.config.interval,
            Some(on_interval),
        );
    }
    if c.mem {
        for i in (0..n).filter(|i| counted[*i]) {
            // SAFETY: i < the block's instruction count, during translation.
            let insn = unsafe { sys::qemu_plugin_tb_get_insn(tb, i) };
            for (rw, off) in [
                (
                    sys::qemu_plugin_mem_rw::QEMU_PLUGIN_MEM_R,
                    VcpuCounts::MEM_LOADS,
                ),
                (
                    sys::qemu_plugin_mem_rw::QEMU_PLUGIN_MEM_W,
                    VcpuCounts::MEM_STORES,
                ),
            ] {
                // SAFETY: insn is valid during translation; the scoreboard entry
                // lives until exit.
                unsafe {
                    sys::qemu_plugin_register_vcpu_mem_inline_per_vcpu(
                        insn,
                        rw,
                        op,
                        entry(p.score, off),
                        1,
                    )
                };
            }
        }
    }
    if p.config.hot > 0 {
        let key = BlockKey {
            // SAFETY: tb is the block being translated.
            vaddr: unsafe { sys::qemu_plugin_tb_vaddr(tb) },
            insns: n,
        };
        // A block translated again (after a flush, a code write, ...) gets
        // the scoreboard of its first translation: the table grows with
        // distinct blocks only (crate::hot). The scoreboard is allocated
        // under our lock, which then takes QEMU's plugin lock; the limit=
        // stop takes them the other way round, but runs while no vCPU is
        // translating (see on_limit), so the two never wait on each other.
        let Ok(mut hot) = p.hot.lock() else { return };
        // SAFETY: tb is the block being translated, with n > 0 instructions.
        let score = hot.counter(key, || unsafe { describe_block(tb) });
        drop(hot);
        // Past the table's cap: not counted (the report says how often).
        let Some(score) = score else { return };
        // SAFETY: tb is being translated; the scoreboard is ours and never
        // freed.
        unsafe {
            sys::qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, op, entry(score, 0), 1)
        };
    }
}

/// `bbv=`/`drcov=`: the scoreboards of the block being translated (made
/// the first time the block is seen: crate::blocks). None if the table is
/// full (the report says how often) or its lock is poisoned.
///
/// # Safety
/// `tb` is the block being translated, with `n` instructions.
unsafe fn block_scores(p: &Plugin, tb: *mut sys::qemu_plugin_tb, n: usize) -> Option<BlockScores> {
    // SAFETY: tb is the block being translated.
    let vaddr = unsafe { sys::qemu_plugin_tb_vaddr(tb) };
    let bytes: usize = (0..n)
        // SAFETY: i < n instructions of the block being translated.
        .map(|i| unsafe { sys::qemu_plugin_insn_size(sys::qemu_plugin_tb_get_insn(tb, i)) })
        .sum();
    let new = |wanted: bool| {
        if wanted {
            // SAFETY: plain plugin API call.
            unsafe { sys::qemu_plugin_scoreboard_new(8) }
        } else {
            std::ptr::null_mut()
        }
    };
    // (The scoreboards are allocated under our lock, as for hot=.)
    let mut t = p.blocks.lock().ok()?;
    t.counters(BlockKey { vaddr, insns: n }, bytes as u32, || BlockScores {
        bbv: new(p.config.bbv.is_some()),
        seen: new(p.config.drcov.is_some()),
    })
}

/// `trace=`: the callbacks of instruction `i` of the block being
/// translated, whose execution finds the vCPU's instruction count `ahead`
/// past its own index; its description goes to the file the first time.
///
/// # Safety
/// `tb` is the block being translated and `i` one of its instructions.
unsafe fn plant_trace(p: &Plugin, tb: *mut sys::qemu_plugin_tb, i: usize, ahead: u64) {
    let Some(t) = &p.tracer else { return };
    // SAFETY: i is an instruction of the block being translated.
    let insn = unsafe { sys::qemu_plugin_tb_get_insn(tb, i) };
    // SAFETY: insn is valid during translation.
    let vaddr = unsafe { sys::qemu_plugin_insn_vaddr(insn) };
    let mut code = [0u8; 16];
    // SAFETY: as above; QEMU copies at most code.len() bytes.
    let len = unsafe { sys::qemu_plugin_insn_data(insn, code.as_mut_ptr().cast(), code.len()) };
    let code = code[..len.min(16)].to_vec();
    // Id 0: past the id table's cap, executions are counted as lost.
    // SAFETY: insn is valid during translation.
    let id = t
        .id(vaddr, &code, || unsafe { insn_disas(insn) })
        .unwrap_or(0);
    let udata = std::ptr::without_provenance_mut::<c_void>(((id as usize) << 32) | ahead as usize);
    // SAFETY: insn is valid during translation; the callback is ours and
    // reads our scoreboard, which lives until exit.
    unsafe {
        sys::qemu_plugin_register_vcpu_insn_exec_cond_cb(
            insn,
            Some(on_trace_insn),
            sys::qemu_plugin_cb_flags::QEMU_PLUGIN_CB_NO_REGS,
            sys::qemu_plugin_cond::QEMU_PLUGIN_COND_GE,
            entry(p.score, VcpuCounts::INSTRUCTIONS),
            p.config.trace_start.saturating_add(ahead),
            udata,
        );
        if p.config.trace_mem {
            sys::qemu_plugin_register_vcpu_mem_cb(
                insn,
                Some(on_trace_mem),
                sys::qemu_plugin_cb_flags::QEMU_PLUGIN_CB_NO_REGS,
                sys::qemu_plugin_mem_rw::QEMU_PLUGIN_MEM_RW,
                std::ptr::null_mut(),
            );
        }
    }
}

/// `trace=`: an instruction runs on `vcpu` at or after `trace-start=`.
unsafe extern "C" fn on_trace_insn(vcpu: c_uint, udata: *mut c_void) {
    let Some(p) = PLUGIN.get() else { return };
    let Some(t) = &p.tracer else { return };
    let (id, ahead) = (
        (udata.addr() >> 32) as u32,
        (udata.addr() & 0xffff_ffff) as u64,
    );
    // SAFETY: our scoreboard; this vCPU's slot, on its own thread.
    let count = unsafe { sys::qemu_plugin_u64_get(entry(p.score, VcpuCounts::INSTRUCTIONS), vcpu) };
    let index = count.saturating_sub(ahead);
    let (start, c) = (p.config.trace_start, p.config.trace_count);
    let in_window = index >= start && (c == 0 || index - start < c);
    let newly_past = t.vcpu(vcpu, |b| {
        b.traced = in_window && id != 0;
        if in_window {
            if id == 0 {
                t.lose(1);
            } else {
                b.exec(vcpu, id, index);
            }
        }
        let past = !in_window && c > 0 && index >= start && !b.past;
        b.past |= past;
        past
    });
    match newly_past {
        None if in_window => t.lose(1),
        Some(true) => {
            // Past the window. Once every vCPU is, retranslate without the
            // trace's callbacks (they would run, and return, on every
            // instruction to the end).
            let done = TRACE_DONE_VCPUS.fetch_add(1, Ordering::SeqCst) + 1;
            // SAFETY: plain plugin API call.
            let vcpus = unsafe { sys::qemu_plugin_num_vcpus() }.max(1) as u32;
            if done >= vcpus && !TRACE_DONE.swap(true, Ordering::SeqCst) {
                request_reset(p, Reason::TraceDone);
            }
        }
        _ => {}
    }
}

/// `trace-mem=on`: a memory access of a traced instruction.
unsafe extern "C" fn on_trace_mem(
    vcpu: c_uint,
    info: sys::qemu_plugin_meminfo_t,
    vaddr: u64,
    _udata: *mut c_void,
) {
    let Some(p) = PLUGIN.get() else { return };
    let Some(t) = &p.tracer else { return };
    // SAFETY: info is this callback's access.
    let (shift, store, v) = unsafe {
        (
            sys::qemu_plugin_mem_size_shift(info),
            sys::qemu_plugin_mem_is_store(info),
            sys::qemu_plugin_mem_get_value(info),
        )
    };
    use sys::qemu_plugin_mem_value_type as T;
    // SAFETY: the union member the type names.
    let value = unsafe {
        match v.type_ {
            T::QEMU_PLUGIN_MEM_VALUE_U8 => u64::from(v.data.u8_),
            T::QEMU_PLUGIN_MEM_VALUE_U16 => u64::from(v.data.u16_),
            T::QEMU_PLUGIN_MEM_VALUE_U32 => u64::from(v.data.u32_),
            T::QEMU_PLUGIN_MEM_VALUE_U64 => v.data.u64_,
            T::QEMU_PLUGIN_MEM_VALUE_U128 => v.data.u128_.low,
        }
    };
    let info = (shift as u8 & 0xf) | if store { crate::trace::MEM_STORE } else { 0 };
    t.vcpu(vcpu, |b| {
        if b.traced {
            b.mem(vcpu, vaddr, info, value);
        }
    });
}

/// `bbv=`: write vCPU `vcpu`'s line for the interval that ends now (its
/// blocks' counts, reset), to `PATH.vcpu.bb`.
fn write_bbv_line(p: &Plugin, vcpu: c_uint) {
    let Some(path) = &p.config.bbv else { return };
    let Ok(t) = p.blocks.lock() else { return };
    let counts: Vec<(u32, u64)> = t
        .iter()
        .filter(|(_, b)| !b.counters.bbv.is_null())
        .map(|(_, b)| {
            let e = entry(b.counters.bbv, 0);
            // SAFETY: our own scoreboard; this vCPU's slot (on its own
            // thread, or at exit).
            let n = unsafe { sys::qemu_plugin_u64_get(e, vcpu) };
            if n > 0 {
                // SAFETY: as above.
                unsafe { sys::qemu_plugin_u64_set(e, vcpu, 0) };
            }
            (b.id, n)
        })
        .collect();
    drop(t);
    let Some(line) = bb_line(counts) else { return };
    let Ok(mut files) = p.bbv_files.lock() else {
        return;
    };
    let i = vcpu as usize;
    if files.len() <= i {
        files.resize_with(i + 1, || None);
    }
    if files[i].is_none() {
        let name = format!("{}.{vcpu}.bb", path.display());
        match File::create(&name) {
            Ok(f) => files[i] = Some(std::io::BufWriter::new(f)),
            Err(e) => {
                eprintln!("rustkvm plugin: bbv: cannot create {name}: {e}");
                return;
            }
        }
    }
    if let Some(f) = files[i].as_mut() {
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("rustkvm plugin: bbv: writing vCPU {vcpu}'s file: {e}");
        }
    }
}

/// A new scoreboard and the symbol and disassembly of the first
/// instruction, for a block seen for the first time.
///
/// # Safety
/// `tb` is the block being translated and has at least one instruction.
unsafe fn describe_block(
    tb: *mut sys::qemu_plugin_tb,
) -> BlockInfo<*mut sys::qemu_plugin_scoreboard> {
    // SAFETY: instruction 0 of the block being translated.
    let first = unsafe { sys::qemu_plugin_tb_get_insn(tb, 0) };
    // SAFETY: first is valid during translation; QEMU returns NULL or a
    // string it keeps.
    let symbol = unsafe { sys::qemu_plugin_insn_symbol(first) };
    let symbol = if symbol.is_null() {
        String::new()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(symbol) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: as above.
    let disas = unsafe { insn_disas(first) };
    BlockInfo {
        // SAFETY: plain plugin API call.
        counter: unsafe { sys::qemu_plugin_scoreboard_new(8) },
        symbol,
        disas,
    }
}

/// One vCPU's counters now.
fn read_counts(p: &Plugin, i: c_uint) -> VcpuCounts {
    // SAFETY: plugin API getter on our own scoreboard (alive until exit).
    let get = |off: usize| unsafe { sys::qemu_plugin_u64_get(entry(p.score, off), i) };
    VcpuCounts {
        instructions: get(VcpuCounts::INSTRUCTIONS),
        branches: get(VcpuCounts::BRANCHES),
        mem_loads: get(VcpuCounts::MEM_LOADS),
        mem_stores: get(VcpuCounts::MEM_STORES),
        classes: Class::ALL.map(|c| get(VcpuCounts::class(c))),
        since_interval: 0,
    }
}

/// `limit=` reached on `vcpu` (at a block start): ask QEMU to hold every
/// vCPU and call [`on_reset`], which writes the report in that state and
/// stops QEMU ([`stop_at_limit`]).
///
/// Why not `exit` here (what the plugin once did): this runs on one vCPU
/// thread while the others keep executing translated code, and `exit` runs
/// the `atexit` handlers right away, among them QEMU's
/// `qemu_plugin_atexit_cb` (plugins/core.c, registered by its constructor
/// `plugin_init`), which calls every plugin's exit callback — callbacks
/// that free scoreboards (QEMU's own `tests/tcg/plugins/insn.c` and
/// `contrib/plugins/hotblocks.c` do; this plugin freed its `hot=` ones)
/// that the other vCPUs' inline operations still write to.
///
/// What QEMU 10.0 provides instead (plugins/loader.c, cpu-common.c):
/// `qemu_plugin_reset` from a vCPU callback queues the reset with
/// `async_safe_run_on_cpu(current_cpu, plugin_flush_destroy, ..)` and kicks
/// this vCPU, which leaves its block at the next block boundary;
/// `process_queued_cpu_work` then runs `plugin_flush_destroy` between
/// `start_exclusive()` and `end_exclusive()`: `start_exclusive` kicks every
/// other running vCPU and waits until none is inside `cpu_exec`, and
/// `cpu_exec_start` holds any vCPU back until `end_exclusive`.
/// `plugin_flush_destroy` flushes the code cache, unregisters all of this
/// plugin's callbacks (its exit callback too) and calls our callback, still
/// in that exclusive section. A second vCPU reaching the limit before that
/// is served by the same reset ([`request_reset`]), as is `trace=`'s end
/// when it is pending already.
unsafe extern "C" fn on_limit(vcpu: c_uint, _data: *mut c_void) {
    let Some(p) = PLUGIN.get() else { return };
    if LIMIT_VCPU.set(vcpu).is_err() {
        return;
    }
    eprintln!(
        "rustkvm plugin: vCPU {vcpu} reached limit={} instructions: stopping QEMU (exit status {})",
        p.config.limit,
        crate::LIMIT_EXIT_STATUS
    );
    request_reset(p, Reason::Limit(vcpu));
}

/// `limit=`'s stop, in the reset's exclusive section (every vCPU held, see
/// [`on_limit`]): write the report, then stop QEMU.
///
/// System emulation: through QEMU's own shutdown, as a host `SIGTERM`
/// does (`termsig_handler` → `qemu_system_killed`, os-posix.c and
/// system/runstate.c): the main loop shuts the machine down, stops every
/// vCPU and exits, and QEMU prints "terminating on signal 15 from pid" its
/// own. Calling `exit` here instead would run the exit handlers on this
/// thread while the main loop runs on (and may call `exit` itself: the C
/// library gives no order to two `exit`s). The vCPUs leave the exclusive
/// section when this returns and run on, uncounted (the reset removed every
/// callback), until QEMU stops them. The exit status becomes
/// [`crate::LIMIT_EXIT_STATUS`] at the very end ([`exit_with_limit_status`]).
///
/// User mode has no main loop, and a `SIGTERM` would be the guest's: the
/// plugin exits here, with every vCPU held, as a guest's `exit_group` ends
/// QEMU from its vCPU thread.
fn stop_at_limit(p: &Plugin, vcpu: c_uint) {
    let Ok(mut reported) = REPORTED.lock() else {
        return;
    };
    if *reported != Reported::Not {
        // The exit callback already ran: QEMU is exiting for another
        // reason (the guest's own exit); let that finish. Returning is
        // safe: a reset, unlike an uninstall, leaves the plugin loaded.
        return;
    }
    write_report(p, build_report(p, Some(vcpu)));
    *reported = Reported::Limit;
    drop(reported);
    if !p.system || p.sigterm_blocked {
        if p.system {
            eprintln!(
                "rustkvm plugin: QEMU runs with SIGTERM blocked: exiting from the vCPU thread"
            );
        }
        std::process::exit(crate::LIMIT_EXIT_STATUS);
    }
    // SAFETY: our own id and an exit callback of this plugin; getpid and
    // kill have no memory effects.
    unsafe {
        sys::qemu_plugin_register_atexit_cb(
            p.id,
            Some(exit_with_limit_status),
            std::ptr::null_mut(),
        );
        libc::kill(libc::getpid(), libc::SIGTERM);
    }
}

/// QEMU's exit callback after `limit=` stopped the run: QEMU has shut the
/// machine down and `exit` runs its handlers. `exit`'s status is fixed by
/// now; register [`limit_status`] with the C library, which runs a handler
/// registered during `exit` next, after QEMU's `qemu_plugin_atexit_cb` has
/// called every plugin's exit callback (glibc's `__run_exit_handlers`; the
/// handlers registered before QEMU's own, from the C library and the
/// sanitizers, are left out).
unsafe extern "C" fn exit_with_limit_status(_id: sys::qemu_plugin_id_t, _data: *mut c_void) {
    set_limit_status();
}

/// Have `exit` end with [`crate::LIMIT_EXIT_STATUS`] (from an exit
/// handler: see [`exit_with_limit_status`]).
fn set_limit_status() {
    // SAFETY: `limit_status` is code of this plugin, which stays loaded to
    // the end of the process (QEMU unloads a plugin only when it asks to
    // be uninstalled, which this one never does).
    if unsafe { libc::atexit(limit_status) } != 0 {
        eprintln!(
            "rustkvm plugin: cannot set exit status {} after limit=: QEMU's own status stands",
            crate::LIMIT_EXIT_STATUS
        );
    }
}

/// End the process with [`crate::LIMIT_EXIT_STATUS`], the C library's
/// streams flushed.
extern "C" fn limit_status() {
    // SAFETY: fflush(NULL) flushes every stream; _exit ends the process.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(crate::LIMIT_EXIT_STATUS);
    }
}

/// `interval=` crossed on `vcpu`: record its counters, restart the interval.
unsafe extern "C" fn on_interval(vcpu: c_uint, _data: *mut c_void) {
    let Some(p) = PLUGIN.get() else { return };
    let counts = read_counts(p, vcpu);
    // SAFETY: our own scoreboard; this vCPU's slot, on its own thread.
    unsafe { sys::qemu_plugin_u64_set(entry(p.score, VcpuCounts::SINCE_INTERVAL), vcpu, 0) };
    if let Ok(mut v) = p.intervals.lock() {
        let host_ns = u64::try_from(p.loaded.elapsed().as_nanos()).unwrap_or(u64::MAX);
        v.push(Interval {
            vcpu,
            counts,
            host_ns,
        });
    }
    write_bbv_line(p, vcpu);
}

/// The report as the counters stand now.
fn build_report(p: &Plugin, stopped_at_limit: Option<c_uint>) -> Report {
    // SAFETY: plain plugin API call.
    let vcpus = unsafe { sys::qemu_plugin_num_vcpus() }.max(0) as c_uint;
    let counts: Vec<VcpuCounts> = (0..vcpus).map(|i| read_counts(p, i)).collect();
    let hot = p
        .hot
        .lock()
        .map(|t| {
            t.hottest(p.config.hot, |score| {
                // SAFETY: a scoreboard of ours; never freed (see at_exit).
                unsafe { sys::qemu_plugin_u64_sum(entry(score, 0)) }
            })
        })
        .unwrap_or_default();
    Report {
        target: p.target.clone(),
        mode: p.config.mode,
        counters: p.config.counters,
        vcpus: counts,
        hot,
        intervals: p.intervals.lock().map(|v| v.clone()).unwrap_or_default(),
        stopped_at_limit,
        past_cap: PastCap {
            hot: p.hot.lock().map(|t| t.refused()).unwrap_or(0),
            blocks: p.blocks.lock().map(|t| t.refused()).unwrap_or(0),
        },
    }
}

/// Write `report` to `outfile=` and, unless `quiet=on`, the table to stderr.
fn write_report(p: &Plugin, report: Report) {
    if let Ok(mut out) = p.out.lock() {
        if let Some(f) = out.as_mut() {
            let text = match p.config.format {
                Format::Json => report.to_json(),
                Format::Csv => report.to_csv(),
            };
            if let Err(e) = f.write_all(text.as_bytes()).and_then(|()| f.flush()) {
                eprintln!("rustkvm plugin: writing the report: {e}");
            }
        }
    }
    if let Some(t) = &p.tracer {
        match t.finish() {
            crate::trace::End::Complete { lost: 0 } | crate::trace::End::V1 => {}
            crate::trace::End::Complete { lost } => eprintln!(
                "rustkvm plugin: trace: complete, but {lost} executions or accesses were not recorded (see above)"
            ),
            crate::trace::End::Truncated(why) => {
                eprintln!("rustkvm plugin: trace: truncated: {why}")
            }
        }
    }
    // bbv=: each vCPU's partial last interval, then the files flushed.
    if p.config.bbv.is_some() {
        for v in 0..report.vcpus.len() as c_uint {
            write_bbv_line(p, v);
        }
        if let Ok(mut files) = p.bbv_files.lock() {
            for f in files.iter_mut().flatten() {
                if let Err(e) = f.flush() {
                    eprintln!("rustkvm plugin: bbv: {e}");
                }
            }
        }
    }
    if let Ok(mut out) = p.drcov.lock() {
        if let Some(f) = out.as_mut() {
            let executed: Vec<(u64, u32)> = p
                .blocks
                .lock()
                .map(|t| {
                    t.iter()
                        .filter(|(_, b)| {
                            // SAFETY: our own scoreboard, never freed.
                            !b.counters.seen.is_null()
                                && unsafe { sys::qemu_plugin_u64_sum(entry(b.counters.seen, 0)) }
                                    > 0
                        })
                        .map(|(k, b)| (k.vaddr, b.bytes))
                        .collect()
                })
                .unwrap_or_default();
            let bytes = drcov(&executed, &module_name());
            if let Err(e) = f.write_all(&bytes).and_then(|()| f.flush()) {
                eprintln!("rustkvm plugin: writing the drcov file: {e}");
            }
        }
    }
    if let Ok(mut t) = p.timeline.lock() {
        if let Some(f) = t.as_mut() {
            let text = report.to_timeline(p.config.interval);
            if let Err(e) = f.write_all(text.as_bytes()).and_then(|()| f.flush()) {
                eprintln!("rustkvm plugin: writing the timeline: {e}");
            }
        }
    }
    if !p.config.quiet {
        eprint!("{}", report.table());
    }
}

/// QEMU's disassembly of `insn` ("" if none).
///
/// # Safety
/// `insn` is an instruction of the block being translated.
unsafe fn insn_disas(insn: *mut sys::qemu_plugin_insn) -> String {
    // SAFETY: insn is valid during translation; QEMU returns NULL or a
    // string we must g_free.
    let d = unsafe { sys::qemu_plugin_insn_disas(insn) };
    if d.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, ours to free once read.
    unsafe {
        let s = CStr::from_ptr(d).to_string_lossy().into_owned();
        g_free(d.cast());
        s
    }
}

/// The drcov module name: the guest binary QEMU knows of (user mode), else
/// "guest".
fn module_name() -> String {
    // SAFETY: plain plugin API call; NULL or a string we must g_free.
    let p = unsafe { sys::qemu_plugin_path_to_binary() };
    if p.is_null() {
        return "guest".to_string();
    }
    // SAFETY: non-NULL, NUL-terminated, ours to free once read.
    unsafe {
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        g_free(p.cast_mut().cast());
        s
    }
}

/// QEMU's exit callback: write the report.
///
/// Nothing is freed here: QEMU calls this from `exit`'s handlers, and a
/// guest's own exit (x86 `isa-debug-exit`, arm semihosting `SYS_EXIT`)
/// calls `exit` on its vCPU thread while the other vCPUs may still run
/// translated code holding our scoreboards in their inline operations; the
/// process ends right after, which releases everything.
unsafe extern "C" fn at_exit(_id: sys::qemu_plugin_id_t, _data: *mut c_void) {
    let Some(p) = PLUGIN.get() else { return };
    let Ok(mut reported) = REPORTED.lock() else {
        return;
    };
    match *reported {
        Reported::Not => {
            write_report(p, build_report(p, None));
            *reported = Reported::AtExit;
        }
        // The limit's stop wrote the report while QEMU began to exit:
        // its status stands.
        Reported::Limit => set_limit_status(),
        Reported::AtExit => {}
    }
}
