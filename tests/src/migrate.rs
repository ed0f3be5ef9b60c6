//! Moving a running guest to another QEMU: live migration to a file, or
//! HMP `savevm`/`-loadvm` on a qcow2 image, between any two (emulator,
//! backend) pairs — rustkvm to rustkvm, rustkvm to a QEMU without rustkvm,
//! stock TCG to rustkvm.
//!
//! The protocol with the guest, so that its checks surely span the move
//! whatever the host's speed: the guest prints `ready` and then keeps its
//! feature busy until a byte arrives on its serial console. The source
//! never sends one (its stdin is empty); the destination gets one once its
//! monitor says the VM runs, after the state has loaded.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::guard::HangGuard;
use crate::guest::GuestTest;
use crate::qemu::{self, Arch, Backend, Variant};
use crate::run::{self, Outcome};
use crate::HarnessError;

/// One side of the move: which QEMU binary, running which backend.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The emulator.
    pub exe: PathBuf,
    /// `-accel` as the runner spells it for this backend.
    pub backend: Backend,
}

impl Endpoint {
    /// rustkvm's own build of QEMU for `arch`, running `backend`.
    pub fn ours(arch: Arch, backend: Backend) -> Result<Self, HarnessError> {
        Ok(Endpoint {
            exe: qemu::emulator(arch)?,
            backend,
        })
    }
}

/// How the state travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// `migrate "exec:cat > FILE"` from a running VM, `-incoming` on the
    /// other side.
    Live,
    /// HMP `savevm` into a qcow2 image, `-loadvm` on the other side.
    SaveVm,
}

/// What the destination did with the state.
#[derive(Debug)]
pub struct Resumed {
    /// The destination's exit code (None: killed at the time limit).
    pub code: Option<i32>,
    /// The guest's run on the destination, judged as any run (closing
    /// summary required).
    pub outcome: Outcome,
}

/// Send one HMP command and read up to the next prompt.
pub fn hmp(sock: &mut UnixStream, cmd: &str) -> String {
    let _ = sock.write_all(format!("{cmd}\n").as_bytes());
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&out).contains("(qemu) ") {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Poll the monitor at `sock` until QEMU says the VM is running: false when
/// the process exits first or its hang `guard` fires.
fn wait_until_running(child: &mut Child, sock: &Path, guard: &HangGuard) -> bool {
    let mut mon = None;
    while guard.check().is_none() {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        if mon.is_none() {
            mon = UnixStream::connect(sock).ok().map(|mut m| {
                hmp(&mut m, "");
                m
            });
        }
        if let Some(m) = mon.as_mut() {
            if hmp(m, "info status").contains("VM status: running") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> HarnessError {
    move |source| HarnessError::Io { what, source }
}

/// Boot `test` on `src` with a monitor, wait for the guest's `ready` line,
/// move the VM by `how`, resume it on `dst` and let the guest finish there.
/// Both sides get the same machine; only the emulator and `-accel` differ.
pub fn move_midway(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    src: &Endpoint,
    dst: &Endpoint,
    how: Transfer,
) -> Result<Resumed, HarnessError> {
    move_midway_with(test, arch, variant, &[], src, dst, how)
}

/// [`move_midway`] with extra `-accel` properties on both sides (each side
/// must be started as the other, e.g. `counter-offset=N`).
pub fn move_midway_with(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    accel_opts: &[String],
    src: &Endpoint,
    dst: &Endpoint,
    how: Transfer,
) -> Result<Resumed, HarnessError> {
    move_midway_with_args(test, arch, variant, accel_opts, &[], src, dst, how)
}

/// [`move_midway_with`] with extra QEMU arguments on both sides too (e.g.
/// `-icount shift=0,sleep=off`).
#[allow(clippy::too_many_arguments)]
pub fn move_midway_with_args(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    accel_opts: &[String],
    qemu_args: &[String],
    src: &Endpoint,
    dst: &Endpoint,
    how: Transfer,
) -> Result<Resumed, HarnessError> {
    let dir = std::env::temp_dir().join(format!(
        "rustkvm-move-{}-{}-{:?}",
        std::process::id(),
        test.name,
        how
    ));
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let result = move_in(
        test,
        arch,
        variant,
        (accel_opts, qemu_args),
        (src, dst),
        (how, None),
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A rewrite of a migration stream on its way to the destination.
pub type StreamEdit = dyn Fn(&mut Vec<u8>);

/// [`move_midway_with_args`] from `ours` to `ours` by live migration, with
/// the stream rewritten by `mutate` on its way: a hostile or corrupted
/// stream, which the destination must refuse with an error, not a crash.
pub fn move_midway_mutated(
    test: &GuestTest,
    arch: Arch,
    accel_opts: &[String],
    qemu_args: &[String],
    ours: &Endpoint,
    mutate: &StreamEdit,
) -> Result<Resumed, HarnessError> {
    let dir = std::env::temp_dir().join(format!(
        "rustkvm-move-{}-{}-mutated",
        std::process::id(),
        test.name
    ));
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let result = move_in(
        test,
        arch,
        Variant::Default,
        (accel_opts, qemu_args),
        (ours, ours),
        (Transfer::Live, Some(mutate)),
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn move_in(
    test: &GuestTest,
    arch: Arch,
    variant: Variant,
    (accel_opts, qemu_args): (&[String], &[String]),
    (src, dst): (&Endpoint, &Endpoint),
    (how, mutate): (Transfer, Option<&StreamEdit>),
    dir: &Path,
) -> Result<Resumed, HarnessError> {
    let (sock_path, dst_sock_path, state, disk) = (
        dir.join("mon.sock"),
        dir.join("dst-mon.sock"),
        dir.join("state"),
        dir.join("disk.qcow2"),
    );
    let args = |backend| {
        let mut a = qemu::command_args(
            arch,
            backend,
            variant,
            test.smp,
            test.cpu.as_deref(),
            &test.binary(arch),
        );
        qemu::add_accel_opts(&mut a, accel_opts);
        a.extend(qemu_args.iter().cloned());
        if how == Transfer::SaveVm {
            a.extend([
                "-drive".to_string(),
                format!("if=none,id=snap,format=qcow2,file={}", disk.display()),
            ]);
        }
        a
    };
    if how == Transfer::SaveVm {
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("16M")
            .status()
            .map_err(io("running qemu-img (Debian's qemu-utils)".into()))?;
        if !made.success() {
            return Err(HarnessError::Usage(format!(
                "qemu-img create failed: {made}"
            )));
        }
    }

    // Source: run until the guest is ready, then move the VM.
    let mut source = Command::new(&src.exe)
        .args(args(src.backend))
        .args([
            "-monitor",
            &format!("unix:{},server=on,wait=off", sock_path.display()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io(format!("starting {}", src.exe.display())))?;
    // Everything the source's guest prints up to the move belongs to the
    // run (the destination goes on from there).
    let source_out = run::Capture::spawn(source.stdout.take());
    let guard = HangGuard::new(
        source.id(),
        test.timeout.max(Duration::from_secs(30)),
        Instant::now(),
    );
    while !source_out
        .snapshot()
        .lines()
        .any(|l| l.trim_end() == "ready")
    {
        if guard.check().is_some() || matches!(source.try_wait(), Ok(Some(_))) {
            let _ = source.kill();
            let _ = source.wait();
            return Err(HarnessError::Usage(format!(
                "{}: the guest never printed ready on the source:\n{}",
                test.name,
                source_out.finish()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut mon = UnixStream::connect(&sock_path).map_err(io("monitor".into()))?;
    hmp(&mut mon, "");
    let out = match how {
        // A live migration: a VM stopped first would stay stopped on arrival.
        Transfer::Live => hmp(
            &mut mon,
            &format!("migrate \"exec:cat > {}\"", state.display()),
        ),
        // Stopped first, so the source's guest prints nothing after the
        // snapshot that the destination prints again.
        Transfer::SaveVm => {
            hmp(&mut mon, "stop");
            hmp(&mut mon, "savevm mid")
        }
    };
    let _ = hmp(&mut mon, "quit");
    let _ = source.wait();
    let before = source_out.finish();
    if out.contains("rror") {
        return Err(HarnessError::Usage(format!("moving {}: {out}", test.name)));
    }
    if let Some(mutate) = mutate {
        let mut bytes =
            std::fs::read(&state).map_err(io(format!("reading {}", state.display())))?;
        mutate(&mut bytes);
        std::fs::write(&state, bytes).map_err(io(format!("writing {}", state.display())))?;
    }

    // Destination: resume and let the guest finish its checks.
    let mut dst_args = args(dst.backend);
    match how {
        Transfer::Live => dst_args.extend([
            "-incoming".to_string(),
            format!("exec:cat {}", state.display()),
        ]),
        Transfer::SaveVm => dst_args.extend(["-loadvm".to_string(), "mid".to_string()]),
    }
    dst_args.extend([
        "-monitor".to_string(),
        format!("unix:{},server=on,wait=off", dst_sock_path.display()),
    ]);
    let timeout = test.timeout.max(Duration::from_secs(30));
    let start = Instant::now();
    let mut child = Command::new(&dst.exe)
        .args(&dst_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("starting {}", dst.exe.display())))?;
    let out = run::Capture::spawn(child.stdout.take());
    let err = run::Capture::spawn(child.stderr.take());
    // The guest's "go on", once the loaded VM runs (a byte sent earlier
    // could reach the UART before the incoming state overwrites it). A
    // destination that refuses the state never gets one.
    let mut stdin = child.stdin.take();
    let guard = HangGuard::new(child.id(), timeout, start);
    if wait_until_running(&mut child, &dst_sock_path, &guard) {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(b"g");
            let _ = s.flush();
        }
    }
    let (code, hang) = run::wait_guarded(&mut child, &guard).map_err(io("waiting".into()))?;
    drop(stdin);
    let outcome = run::judge(
        arch,
        code,
        hang,
        before + &out.finish(),
        err.finish(),
        start.elapsed(),
    );
    Ok(Resumed { code, outcome })
}
