//! `trace=`: the executed-instruction trace, its binary format, and the
//! reader `rustkvm-trace` converts it with.
//!
//! # Format (version 2, all integers little-endian)
//!
//! The file starts with the 8 bytes `RKVMTRC2`, then records, each starting
//! with a one-byte type:
//!
//! | type | record | fields |
//! |---|---|---|
//! | 1 | instruction | `u32 id`, `u64 vaddr`, `u8 len`, `len` bytes of code, `u16 n`, `n` bytes of disassembly (UTF-8) |
//! | 2 | execution | `u32 vcpu`, `u32 id`, `u64 index` (the vCPU's counted-instruction index, from 0) |
//! | 3 | memory access | `u32 vcpu`, `u64 vaddr`, `u8 info` (bits 0–3: log2 of the size in bytes; bit 4: store), `u64 value` (the low 64 bits) |
//! | 4 | end | `u64 records` (the records before it), `u64 lost` (records the plugin could not write: a stalled writer's, and executions of instructions past the id table's cap) |
//!
//! An instruction record comes before the first execution naming its id
//! (ids are given at translation, one per distinct address and bytes). A
//! memory access belongs to the execution record before it on the same
//! vCPU. Records of different vCPUs interleave in chunks. The end record
//! is the last: a trace without it, or whose count differs, is truncated
//! (QEMU was killed, the disk filled, the writer stalled). Version 1 (magic
//! `RKVMTRC1`) had no end record.
//!
//! The trace ends when QEMU's exit begins (or `limit=` stops the run):
//! vCPUs still running then (a guest's own exit on one vCPU) are not
//! traced further.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::report::json_str;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"RKVMTRC2";
/// Version 1's first bytes (no end record).
pub const MAGIC_V1: &[u8; 8] = b"RKVMTRC1";
/// Record type: an instruction's description.
pub const REC_INSN: u8 = 1;
/// Record type: an execution.
pub const REC_EXEC: u8 = 2;
/// Record type: a memory access.
pub const REC_MEM: u8 = 3;
/// Record type: the end (the last record).
pub const REC_END: u8 = 4;
/// Memory access `info`: store.
pub const MEM_STORE: u8 = 1 << 4;

/// The end record's bytes.
pub fn end_record(records: u64, lost: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(17);
    r.push(REC_END);
    r.extend_from_slice(&records.to_le_bytes());
    r.extend_from_slice(&lost.to_le_bytes());
    r
}

/// An instruction record's bytes.
pub fn insn_record(id: u32, vaddr: u64, code: &[u8], disas: &str) -> Vec<u8> {
    let code = &code[..code.len().min(255)];
    let disas = &disas.as_bytes()[..disas.len().min(u16::MAX as usize)];
    let mut r = Vec::with_capacity(16 + code.len() + disas.len());
    r.push(REC_INSN);
    r.extend_from_slice(&id.to_le_bytes());
    r.extend_from_slice(&vaddr.to_le_bytes());
    r.push(code.len() as u8);
    r.extend_from_slice(code);
    r.extend_from_slice(&(disas.len() as u16).to_le_bytes());
    r.extend_from_slice(disas);
    r
}

/// Append an execution record.
pub fn push_exec(buf: &mut Vec<u8>, vcpu: u32, id: u32, index: u64) {
    buf.push(REC_EXEC);
    buf.extend_from_slice(&vcpu.to_le_bytes());
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
}

/// Append a memory-access record.
pub fn push_mem(buf: &mut Vec<u8>, vcpu: u32, vaddr: u64, info: u8, value: u64) {
    buf.push(REC_MEM);
    buf.extend_from_slice(&vcpu.to_le_bytes());
    buf.extend_from_slice(&vaddr.to_le_bytes());
    buf.push(info);
    buf.extend_from_slice(&value.to_le_bytes());
}

/// A vCPU's buffer is handed to the writer at this size.
pub const CHUNK: usize = 64 * 1024;
/// Chunks queued for the writer at most: a vCPU waits when the writer
/// lags, so memory stays bounded (about `QUEUE` × `CHUNK` plus a chunk per
/// vCPU).
pub const QUEUE: usize = 64;
/// Distinct instructions a trace describes at most (ids 1 to this): the
/// id table's memory stays bounded (about 120 bytes an id: 120 MiB) and
/// ids never wrap. Executions of instructions past it are counted as lost.
pub const MAX_IDS: u32 = 1 << 20;

/// `trace=`'s writer: a thread streaming chunks of records to the file,
/// fed by a bounded queue from the vCPUs' buffers, and the trace's id
/// table.
///
/// Every hand-over happens under the lock of what is handed over (a
/// vCPU's buffer, the id table), and [`TraceWriter::finish`] closes each
/// under its lock: a chunk is either in the file before the end record or
/// was never taken from its buffer. The end record counts the records
/// written, so a reader tells a complete trace from a truncated one.
#[derive(Debug)]
pub struct TraceWriter {
    queue: Mutex<Option<SyncSender<Vec<u8>>>>,
    writer: Mutex<Option<std::thread::JoinHandle<io::Result<()>>>>,
    /// Chunks the writer thread has written.
    progress: Arc<AtomicU64>,
    ids: Mutex<Ids>,
    vcpus: Box<[Mutex<VcpuTrace>]>,
    /// Records queued for the file.
    records: AtomicU64,
    /// Executions and accesses seen but not recorded.
    lost: AtomicU64,
    /// The writer made no progress for `wait`: nothing more is queued.
    stalled: AtomicBool,
    /// How long a hand-over waits for a writer that makes no progress
    /// (None: for ever).
    wait: Option<Duration>,
    /// Ids given at most ([`MAX_IDS`]).
    max_ids: u32,
}

/// The id table: instruction ids by address and bytes.
#[derive(Debug, Default)]
struct Ids {
    map: std::collections::HashMap<(u64, Vec<u8>), u32>,
    closed: bool,
}

/// One vCPU's part of the trace.
#[derive(Debug, Default)]
pub struct VcpuTrace {
    buf: Vec<u8>,
    /// Records in `buf`.
    n: u64,
    /// The trace is finished: nothing more is recorded.
    closed: bool,
    /// The vCPU's last execution was traced (its memory accesses are too).
    pub traced: bool,
    /// The vCPU is past its window.
    pub past: bool,
}

impl VcpuTrace {
    /// Record an execution; false once the trace is finished.
    pub fn exec(&mut self, vcpu: u32, id: u32, index: u64) -> bool {
        if !self.closed {
            push_exec(&mut self.buf, vcpu, id, index);
            self.n += 1;
        }
        !self.closed
    }

    /// Record a memory access of the last execution.
    pub fn mem(&mut self, vcpu: u32, vaddr: u64, info: u8, value: u64) {
        if !self.closed {
            push_mem(&mut self.buf, vcpu, vaddr, info, value);
            self.n += 1;
        }
    }
}

impl TraceWriter {
    /// Start the writer thread on `out` (the magic first), with a buffer for
    /// each of `vcpus` vCPUs; a hand-over waits at most `wait` for a writer
    /// that makes no progress. The thread blocks every signal but the
    /// synchronous ones, as QEMU's own helper threads do: QEMU's signals
    /// (SIGTERM, SIG_IPI, SIGALRM) are for its threads.
    pub fn start(
        out: impl Write + Send + 'static,
        vcpus: usize,
        wait: Option<Duration>,
    ) -> io::Result<TraceWriter> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let progress = Arc::new(AtomicU64::new(0));
        let done = Arc::clone(&progress);
        let writer = spawn_with_signals_blocked(move || {
            let mut w = io::BufWriter::new(out);
            // The magic at once: a trace cut short early is then still
            // recognisably a trace.
            w.write_all(MAGIC)?;
            w.flush()?;
            for chunk in rx {
                w.write_all(&chunk)?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            w.flush()
        })?;
        Ok(TraceWriter {
            queue: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            progress,
            ids: Mutex::new(Ids::default()),
            vcpus: (0..vcpus)
                .map(|_| Mutex::new(VcpuTrace::default()))
                .collect(),
            records: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            wait,
            max_ids: MAX_IDS,
        })
    }

    /// Queue `chunk` of `n` records, waiting while the queue is full and
    /// the writer makes progress. After `wait` without progress the trace
    /// stops here (said once on stderr) and what is not queued is lost.
    fn send(&self, chunk: Vec<u8>, n: u64) {
        let tx = self.queue.lock().ok().and_then(|q| q.clone());
        let Some(tx) = tx else {
            self.lost.fetch_add(n, Ordering::Relaxed);
            return;
        };
        let mut chunk = chunk;
        let mut seen = (self.progress.load(Ordering::Relaxed), Instant::now());
        loop {
            if self.stalled.load(Ordering::Relaxed) {
                self.lost.fetch_add(n, Ordering::Relaxed);
                return;
            }
            match tx.try_send(chunk) {
                Ok(()) => {
                    self.records.fetch_add(n, Ordering::Relaxed);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {
                    // The writer failed; finish() says how.
                    self.lost.fetch_add(n, Ordering::Relaxed);
                    return;
                }
                Err(TrySendError::Full(c)) => chunk = c,
            }
            let now = self.progress.load(Ordering::Relaxed);
            if now != seen.0 {
                seen = (now, Instant::now());
            } else if self.wait.is_some_and(|w| seen.1.elapsed() >= w) {
                if !self.stalled.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "rustkvm plugin: trace: the writer made no progress for {} s (a FIFO nobody reads?): the trace stops here, truncated",
                        self.wait.map_or(0, |w| w.as_secs())
                    );
                }
                self.lost.fetch_add(n, Ordering::Relaxed);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The id of the instruction at `vaddr` with bytes `code`, given (and
    /// its description queued, `disas` read) the first time. None once the
    /// trace is finished or [`MAX_IDS`] ids are given.
    pub fn id(&self, vaddr: u64, code: &[u8], disas: impl FnOnce() -> String) -> Option<u32> {
        let mut ids = self.ids.lock().ok()?;
        if let Some(&id) = ids.map.get(&(vaddr, code.to_vec())) {
            return Some(id);
        }
        let next = u32::try_from(ids.map.len()).ok()?.checked_add(1)?;
        if ids.closed || next > self.max_ids {
            return None;
        }
        ids.map.insert((vaddr, code.to_vec()), next);
        // Queued under the ids lock: the description is in the file before
        // any vCPU can queue an execution of it.
        self.send(insn_record(next, vaddr, code, &disas()), 1);
        Some(next)
    }

    /// An execution (or access) the trace cannot record: counted as lost.
    pub fn lose(&self, n: u64) {
        self.lost.fetch_add(n, Ordering::Relaxed);
    }

    /// Run `f` on vCPU `vcpu`'s part of the trace (None: not traced), then
    /// hand its buffer over if full, under its lock.
    pub fn vcpu<R>(&self, vcpu: u32, f: impl FnOnce(&mut VcpuTrace) -> R) -> Option<R> {
        let mut v = self.vcpus.get(vcpu as usize)?.lock().ok()?;
        let r = f(&mut v);
        if v.buf.len() >= CHUNK {
            let chunk = std::mem::take(&mut v.buf);
            let n = std::mem::take(&mut v.n);
            self.send(chunk, n);
        }
        Some(r)
    }

    /// End the trace: close the id table and every vCPU's buffer (each
    /// under its lock, its records queued), queue the end record, close
    /// the queue and wait for the file, as long as the writer makes
    /// progress (at most `wait` without).
    pub fn finish(&self) -> End {
        if let Ok(mut ids) = self.ids.lock() {
            ids.closed = true;
        }
        for v in self.vcpus.iter() {
            if let Ok(mut v) = v.lock() {
                v.closed = true;
                let chunk = std::mem::take(&mut v.buf);
                let n = std::mem::take(&mut v.n);
                if !chunk.is_empty() {
                    self.send(chunk, n);
                }
            }
        }
        let (records, lost) = (
            self.records.load(Ordering::Relaxed),
            self.lost.load(Ordering::Relaxed),
        );
        let stalled = || self.stalled.load(Ordering::Relaxed);
        if !stalled() {
            self.send(end_record(records, lost), 0);
        }
        let queue = self.queue.lock().ok().and_then(|mut q| q.take());
        drop(queue);
        let Some(w) = self.writer.lock().ok().and_then(|mut w| w.take()) else {
            return End::Truncated("the trace was finished before".into());
        };
        let mut seen = (self.progress.load(Ordering::Relaxed), Instant::now());
        while !w.is_finished() {
            let now = self.progress.load(Ordering::Relaxed);
            if now != seen.0 {
                seen = (now, Instant::now());
            } else if stalled() || self.wait.is_some_and(|t| seen.1.elapsed() >= t) {
                return End::Truncated(
                    "the writer made no progress (a FIFO nobody reads?): QEMU exits without waiting for it".into(),
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match w.join() {
            Ok(Ok(())) if stalled() => End::Truncated("the writer stalled".into()),
            Ok(Ok(())) => End::Complete { lost },
            Ok(Err(e)) => End::Truncated(format!("writing it: {e}")),
            Err(_) => End::Truncated("the writer thread failed".into()),
        }
    }
}

/// Spawn `f` on a thread that blocks every signal but SIGSEGV, SIGFPE and
/// SIGILL, as the accelerator's sampler thread does (accel/src/host.rs;
/// QEMU's own threads block SIGBUS too: its handler is for vCPUs). The
/// mask is set in this thread around the spawn, so the new thread starts
/// with it: no signal can reach it first.
fn spawn_with_signals_blocked<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<std::thread::JoinHandle<T>> {
    let builder = std::thread::Builder::new().name("rustkvm-trace".into());
    if cfg!(miri) {
        return builder.spawn(f);
    }
    // SAFETY: sigset_t is plain data, initialised by sigfillset below.
    let mut block: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, filled by pthread_sigmask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `block` is a set we own, for these calls to fill and edit.
    unsafe {
        libc::sigfillset(&mut block);
        for s in [libc::SIGSEGV, libc::SIGFPE, libc::SIGILL] {
            libc::sigdelset(&mut block, s);
        }
    }
    // SAFETY: valid sets; only the calling thread's mask changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &block, &mut old) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    let spawned = builder.spawn(f);
    // SAFETY: restores the mask saved above, for this thread only.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An instruction's description.
    Insn {
        /// Its id.
        id: u32,
        /// Guest virtual address.
        vaddr: u64,
        /// Its bytes.
        code: Vec<u8>,
        /// Its disassembly.
        disas: String,
    },
    /// An execution.
    Exec {
        /// The vCPU.
        vcpu: u32,
        /// The instruction's id.
        id: u32,
        /// The vCPU's counted-instruction index.
        index: u64,
    },
    /// The end of the trace.
    End {
        /// Records before it.
        records: u64,
        /// Executions and accesses seen but not recorded.
        lost: u64,
    },
    /// A memory access of the vCPU's last execution.
    Mem {
        /// The vCPU.
        vcpu: u32,
        /// Guest virtual address.
        vaddr: u64,
        /// Size in bytes.
        size: u32,
        /// Store (else load).
        store: bool,
        /// The value (low 64 bits).
        value: u64,
    },
}

/// Reads records from a trace.
#[derive(Debug)]
pub struct Reader<R> {
    input: R,
    /// Version 1 (no end record).
    v1: bool,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("rustkvm trace: {what}"))
}

impl<R: Read> Reader<R> {
    /// A reader of `input`, after checking its magic.
    pub fn new(mut input: R) -> io::Result<Self> {
        let mut m = [0u8; 8];
        input.read_exact(&mut m)?;
        if &m != MAGIC && &m != MAGIC_V1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "rustkvm trace: not a trace (no RKVMTRC2 magic)",
            ));
        }
        Ok(Reader {
            input,
            v1: &m == MAGIC_V1,
        })
    }

    /// A version 1 trace (which has no end record).
    pub fn is_v1(&self) -> bool {
        self.v1
    }

    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.input.read_exact(&mut b)?;
        Ok(b)
    }

    /// The next record; None at the end.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        let mut t = [0u8; 1];
        if self.input.read(&mut t)? == 0 {
            return Ok(None);
        }
        let u32_ = |b: [u8; 4]| u32::from_le_bytes(b);
        let u64_ = |b: [u8; 8]| u64::from_le_bytes(b);
        Ok(Some(match t[0] {
            REC_INSN => {
                let id = u32_(self.bytes()?);
                let vaddr = u64_(self.bytes()?);
                let [len] = self.bytes()?;
                let mut code = vec![0u8; len as usize];
                self.input.read_exact(&mut code)?;
                let n = u16::from_le_bytes(self.bytes()?);
                let mut d = vec![0u8; n as usize];
                self.input.read_exact(&mut d)?;
                Record::Insn {
                    id,
                    vaddr,
                    code,
                    disas: String::from_utf8_lossy(&d).into_owned(),
                }
            }
            REC_EXEC => Record::Exec {
                vcpu: u32_(self.bytes()?),
                id: u32_(self.bytes()?),
                index: u64_(self.bytes()?),
            },
            REC_MEM => {
                let vcpu = u32_(self.bytes()?);
                let vaddr = u64_(self.bytes()?);
                let [info] = self.bytes()?;
                Record::Mem {
                    vcpu,
                    vaddr,
                    size: 1 << (info & 0xf),
                    store: info & MEM_STORE != 0,
                    value: u64_(self.bytes()?),
                }
            }
            REC_END => Record::End {
                records: u64_(self.bytes()?),
                lost: u64_(self.bytes()?),
            },
            other => return Err(bad(&format!("unknown record type {other}"))),
        }))
    }
}

/// Output formats of `rustkvm-trace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// One line per execution, memory accesses indented below it.
    Text,
    /// One JSON object per execution (JSON Lines).
    JsonLines,
}

fn hex(code: &[u8]) -> String {
    code.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// How a trace ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Its end record, with the count of executions and accesses the
    /// plugin saw but could not record.
    Complete {
        /// Not recorded.
        lost: u64,
    },
    /// No end record, a record cut short, or an end record whose count
    /// differs: what was found.
    Truncated(String),
    /// A version 1 trace (no end record: completeness unknown).
    V1,
}

/// What [`convert`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Executions converted.
    pub execs: u64,
    /// Records read (the end record not counted).
    pub records: u64,
    /// How the trace ended.
    pub end: End,
}

/// Convert a whole trace to `out` in `format`; a truncated trace is
/// converted up to where it breaks off, and the summary says so.
pub fn convert(input: impl Read, out: &mut impl io::Write, format: Output) -> io::Result<Summary> {
    use std::collections::HashMap;
    let mut r = match Reader::new(input) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Ok(Summary {
                execs: 0,
                records: 0,
                end: End::Truncated("the file ends before its magic".into()),
            })
        }
        Err(e) => return Err(e),
    };
    let mut insns: HashMap<u32, (u64, Vec<u8>, String)> = HashMap::new();
    // JSON Lines: an execution is written once its memory accesses are in.
    let mut pending: HashMap<u32, (String, Vec<String>)> = HashMap::new();
    let mut execs = 0u64;
    let mut records = 0u64;
    let flush = |out: &mut dyn io::Write, line: String, mem: Vec<String>| {
        writeln!(out, "{}, \"mem\": [{}]}}", line, mem.join(", "))
    };
    let end = loop {
        let rec = match r.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) if r.is_v1() => break End::V1,
            Ok(None) => break End::Truncated(format!("no end record after {records} records")),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                break End::Truncated(format!("record {} cut short", records + 1))
            }
            Err(e) => return Err(e),
        };
        if !matches!(rec, Record::End { .. }) {
            records += 1;
        }
        match rec {
            Record::End { records: n, lost } => {
                if n != records {
                    break End::Truncated(format!(
                        "the end record counts {n} records, the file has {records}"
                    ));
                }
                if r.next_record()?.is_some() {
                    return Err(bad("records after the end record"));
                }
                break End::Complete { lost };
            }
            Record::Insn {
                id,
                vaddr,
                code,
                disas,
            } => {
                insns.insert(id, (vaddr, code, disas));
            }
            Record::Exec { vcpu, id, index } => {
                execs += 1;
                let (vaddr, code, disas) = insns
                    .get(&id)
                    .ok_or_else(|| bad(&format!("execution of undescribed instruction {id}")))?;
                match format {
                    Output::Text => writeln!(
                        out,
                        "vcpu {vcpu} #{index} {vaddr:#x}: {:<20} {disas}",
                        hex(code)
                    )?,
                    Output::JsonLines => {
                        if let Some((line, mem)) = pending.remove(&vcpu) {
                            flush(out, line, mem)?;
                        }
                        let line = format!(
                            "{{\"vcpu\": {vcpu}, \"index\": {index}, \"vaddr\": \"{vaddr:#x}\", \"bytes\": \"{}\", \"disas\": {}",
                            hex(code),
                            json_str(disas)
                        );
                        pending.insert(vcpu, (line, Vec::new()));
                    }
                }
            }
            Record::Mem {
                vcpu,
                vaddr,
                size,
                store,
                value,
            } => match format {
                Output::Text => writeln!(
                    out,
                    "    {} {size} @ {vaddr:#x}: {value:#x}",
                    if store { "store" } else { "load " }
                )?,
                Output::JsonLines => {
                    if let Some((_, mem)) = pending.get_mut(&vcpu) {
                        mem.push(format!(
                            "{{\"vaddr\": \"{vaddr:#x}\", \"size\": {size}, \"store\": {store}, \"value\": \"{value:#x}\"}}"
                        ));
                    }
                }
            },
        }
    };
    let mut rest: Vec<_> = pending.into_iter().collect();
    rest.sort_by_key(|(v, _)| *v);
    for (_, (line, mem)) in rest {
        flush(out, line, mem)?;
    }
    Ok(Summary {
        execs,
        records,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut t = MAGIC.to_vec();
        t.extend(insn_record(1, 0x1000, &[0x48, 0xff, 0xc8], "dec rax"));
        t.extend(insn_record(
            2,
            0x1003,
            &[0x89, 0x07],
            "mov dword ptr [rdi], eax",
        ));
        push_exec(&mut t, 0, 1, 41);
        push_exec(&mut t, 0, 2, 42);
        push_mem(&mut t, 0, 0x8000, 2 | MEM_STORE, 7);
        t.extend(end_record(5, 0));
        t
    }

    #[test]
    fn records_round_trip() {
        let data = sample();
        let mut r = Reader::new(&data[..]).unwrap();
        let mut all = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            all.push(rec);
        }
        assert_eq!(all.len(), 6);
        assert_eq!(
            all[5],
            Record::End {
                records: 5,
                lost: 0
            }
        );
        assert_eq!(
            all[4],
            Record::Mem {
                vcpu: 0,
                vaddr: 0x8000,
                size: 4,
                store: true,
                value: 7
            }
        );
    }

    #[test]
    fn text_and_json_lines() {
        let mut text = Vec::new();
        assert_eq!(
            convert(&sample()[..], &mut text, Output::Text).unwrap(),
            Summary {
                execs: 2,
                records: 5,
                end: End::Complete { lost: 0 }
            }
        );
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("vcpu 0 #41 0x1000: 48ffc8"), "{text}");
        assert!(text.contains("    store 4 @ 0x8000: 0x7"), "{text}");
        let mut jl = Vec::new();
        convert(&sample()[..], &mut jl, Output::JsonLines).unwrap();
        let jl = String::from_utf8(jl).unwrap();
        let lines: Vec<&str> = jl.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].contains("\"mem\": [{\"vaddr\": \"0x8000\", \"size\": 4, \"store\": true"),
            "{jl}"
        );
        assert!(Reader::new(&b"garbage!"[..]).is_err());
    }

    fn ends(t: &[u8]) -> End {
        convert(t, &mut Vec::new(), Output::Text).unwrap().end
    }

    #[test]
    fn a_truncated_trace_is_reported_as_truncated() {
        let t = sample();
        let body = t.len() - 17;
        assert_eq!(
            ends(&t[..body]),
            End::Truncated("no end record after 5 records".into())
        );
        assert_eq!(
            ends(&t[..body - 3]),
            End::Truncated("record 5 cut short".into())
        );
        let mut short = t[..body].to_vec();
        short.extend(end_record(6, 0));
        assert_eq!(
            ends(&short),
            End::Truncated("the end record counts 6 records, the file has 5".into())
        );
        assert_eq!(
            ends(&t[..4]),
            End::Truncated("the file ends before its magic".into())
        );
        let mut v1 = t[..body].to_vec();
        v1[..8].copy_from_slice(MAGIC_V1);
        assert_eq!(ends(&v1), End::V1);
        let mut after = t.clone();
        push_exec(&mut after, 0, 1, 43);
        assert!(convert(&after[..], &mut Vec::new(), Output::Text).is_err());
    }

    /// A `Write` into a shared buffer.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// vCPU threads record while the trace is finished under them: the
    /// file is complete, its end record counts every record in it, and
    /// each vCPU's records are, without a gap, every one it recorded
    /// before its buffer was closed (no chunk lost around the close).
    #[test]
    fn finishing_under_running_vcpus_loses_no_chunk() {
        for round in 0..20u64 {
            let out = Shared::default();
            let t = Arc::new(
                TraceWriter::start(out.clone(), 4, Some(Duration::from_secs(60))).unwrap(),
            );
            let id = t.id(0x1000, &[0x90], || "nop".into()).unwrap();
            let vcpus: Vec<_> = (0..4u32)
                .map(|v| {
                    let t = Arc::clone(&t);
                    std::thread::spawn(move || {
                        (0..200_000u64)
                            .filter(|&index| t.vcpu(v, |b| b.exec(v, id, index)) == Some(true))
                            .count() as u64
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_micros(round * 500));
            let fin = t.finish();
            let recorded: Vec<u64> = vcpus.into_iter().map(|h| h.join().unwrap()).collect();
            let data = out.0.lock().unwrap().clone();
            let mut r = Reader::new(&data[..]).unwrap();
            let mut next = [0u64; 4];
            let mut n = 0;
            let mut end = None;
            while let Some(rec) = r.next_record().unwrap() {
                match rec {
                    Record::Exec { vcpu, index, .. } => {
                        assert_eq!(index, next[vcpu as usize], "vCPU {vcpu}: a gap");
                        next[vcpu as usize] += 1;
                        n += 1;
                    }
                    Record::Insn { .. } => n += 1,
                    Record::End { records, lost } => end = Some((records, lost)),
                    Record::Mem { .. } => unreachable!(),
                }
            }
            assert_eq!(end, Some((n, 0)), "round {round}");
            assert_eq!(
                next.to_vec(),
                recorded,
                "round {round}: every record before the close is in"
            );
            assert_eq!(fin, End::Complete { lost: 0 });
        }
    }

    /// A writer that never gets to write (a FIFO nobody reads).
    struct Stuck;

    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            loop {
                std::thread::park();
            }
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A writer that makes no progress stops the trace after the wait: the
    /// vCPU goes on (its records counted as lost) and finish returns,
    /// saying the trace is truncated.
    #[test]
    fn a_stalled_writer_neither_holds_the_vcpus_nor_the_exit() {
        let t = TraceWriter::start(Stuck, 1, Some(Duration::from_millis(50))).unwrap();
        let id = t.id(0x1000, &[0x90], || "nop".into()).unwrap();
        let per_chunk = (CHUNK / 17 + 1) as u64;
        let total = per_chunk * (QUEUE as u64 + 4);
        for index in 0..total {
            t.vcpu(0, |b| b.exec(0, id, index));
        }
        assert!(t.stalled.load(Ordering::Relaxed));
        assert!(t.lost.load(Ordering::Relaxed) >= per_chunk);
        assert!(matches!(t.finish(), End::Truncated(_)));
    }

    #[test]
    fn ids_stop_at_the_cap_and_after_the_end() {
        let t = TraceWriter {
            max_ids: 2,
            ..TraceWriter::start(Shared::default(), 1, None).unwrap()
        };
        assert_eq!(t.id(0, &[0], String::new), Some(1));
        assert_eq!(t.id(0, &[1], String::new), Some(2));
        assert_eq!(t.id(0, &[2], String::new), None, "past the cap");
        assert_eq!(t.id(0, &[1], String::new), Some(2), "known ids stay");
        t.finish();
        assert_eq!(t.id(1, &[1], String::new), None, "after the end");
    }
}
