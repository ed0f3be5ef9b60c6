//! `backend=kvm`, nested: the bundled guests on real KVM — Linux's own
//! `kvm_amd` on x86, KVM/arm64 on arm64 — inside an L1 Linux that runs
//! under rustkvm (x86: `-cpu max`, an AMD model with TCG's SVM; arm64:
//! `virt,virtualization=on,gic-version=3`, the kernel at EL2 in VHE), one
//! L1 boot for the whole run (issue 47).
//!
//! The L1 is Debian's kernel (`scripts/build-linux-guests.sh`) with the
//! probe's initramfs and, on top ([`crate::boot::initramfs`]): this
//! project's QEMU for the L1's architecture (stripped; for arm64 the
//! cross-built one, [`qemu::native_emulator`]) with the shared libraries
//! it links and the firmware it loads, on x86 Debian's KVM modules
//! (decompressed: `insmod` of a `.ko` is about a second, where `modprobe`
//! of the `.ko.xz` took minutes under TCG; arm64's KVM is built in), the
//! guests, and a script that loads the modules and runs each guest with
//! exactly the arguments [`crate::run::guest_args`] gives the kvm backend.
//! Each guest's output comes back on L1's console between markers, and is
//! judged and held to the guest's declared kvm outcome as a run on the
//! host's KVM is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::boot::{self, BootSpec};
use crate::guest::GuestTest;
use crate::linux::{self, Config, Images, LinuxRun};
use crate::run::{self, Outcome, RunOptions, RunResult, Status};
use crate::{qemu, Arch, Backend, HarnessError, Variant};

/// Where the guests' QEMU and its files live in the L1.
const L1_ROOT: &str = "/root/nested";
/// L1's memory: its initramfs (QEMU, libraries, guests) and a guest of
/// 128 MiB at a time.
const L1_MEM_MIB: u32 = 1024;
/// Time for L1 to boot, run the probe and load the modules.
const L1_BOOT: Duration = Duration::from_secs(240);
/// The firmware the x86 guests' QEMU loads (`-L`), from Debian's packages
/// (seabios, qemu-system-data), as scripts/build-qemu.sh links them.
const X86_FIRMWARE: &[&str] = &[
    "/usr/share/seabios/bios-256k.bin",
    "/usr/share/qemu/kvmvapic.bin",
    "/usr/share/qemu/linuxboot_dma.bin",
    "/usr/share/qemu/multiboot_dma.bin",
    "/usr/share/qemu/pvh.bin",
];
/// The module that gives L1 its `/dev/kvm`.
const X86_KVM_MODULE: &str = "kernel/arch/x86/kvm/kvm-amd.ko.xz";

/// What the L1 of an architecture needs besides its QEMU.
struct L1Parts {
    /// The module that gives L1 its `/dev/kvm` (none: built in).
    kvm_module: Option<&'static str>,
    /// The firmware its guests' QEMU loads.
    firmware: &'static [&'static str],
    /// Debian's multiarch triplet (its libraries' directories).
    triplet: &'static str,
    /// binutils' strip for its executables.
    strip: &'static str,
}

fn l1_parts(arch: Arch) -> L1Parts {
    match arch {
        Arch::X86_64 => L1Parts {
            kvm_module: Some(X86_KVM_MODULE),
            firmware: X86_FIRMWARE,
            triplet: "x86_64-linux-gnu",
            strip: "strip",
        },
        // Debian's arm64 kernel has CONFIG_KVM=y; its guests boot with
        // -kernel, no firmware.
        Arch::Aarch64 => L1Parts {
            kvm_module: None,
            firmware: &[],
            triplet: "aarch64-linux-gnu",
            strip: "aarch64-linux-gnu-strip",
        },
    }
}

fn usage(m: String) -> HarnessError {
    HarnessError::Usage(m)
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> HarnessError {
    move |source| HarnessError::Io { what, source }
}

/// `s` quoted for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// An ELF file's `DT_NEEDED` names and its interpreter (`PT_INTERP`), by
/// GNU readelf, which reads any architecture's ELF.
fn elf_deps(file: &Path) -> Result<(Vec<String>, Option<String>), HarnessError> {
    let out = Command::new("readelf")
        .args(["-d", "-l", "-W"])
        .arg(file)
        .output()
        .map_err(io(format!("running readelf -d -l {}", file.display())))?;
    if !out.status.success() {
        return Err(usage(format!(
            "readelf -d -l {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let bracketed = |l: &str, key: &str| {
        let rest = &l[l.find(key)? + key.len()..];
        rest.split(']').next().map(|v| v.trim().to_string())
    };
    let needed = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| bracketed(l, "Shared library: ["))
        .collect();
    let interp = text
        .lines()
        .find_map(|l| bracketed(l, "Requesting program interpreter:"));
    Ok((needed, interp))
}

/// The shared libraries `exe` (an executable for `arch`) loads, found in
/// Debian's multiarch directories for `arch` as its dynamic loader finds
/// them, and the loader itself: what the L1 needs to run it.
fn shared_libraries(exe: &Path, arch: Arch) -> Result<Vec<PathBuf>, HarnessError> {
    let t = l1_parts(arch).triplet;
    let dirs = [
        format!("/lib/{t}"),
        format!("/usr/lib/{t}"),
        "/lib".into(),
        "/usr/lib".into(),
    ];
    let (mut queue, interp) = elf_deps(exe)?;
    let interp = interp.ok_or_else(|| {
        usage(format!(
            "{}: no program interpreter (not a dynamic executable)",
            exe.display()
        ))
    })?;
    let interp = PathBuf::from(interp);
    // By name, as the loader resolves them: the loader itself is also one
    // of the names (ld-linux-*.so.*), already carried at its own path.
    let mut seen: std::collections::BTreeSet<std::ffi::OsString> =
        interp.file_name().map(Into::into).into_iter().collect();
    let mut libs = vec![interp];
    while let Some(name) = queue.pop() {
        if !seen.insert(name.clone().into()) {
            continue;
        }
        let found = dirs
            .iter()
            .map(|d| Path::new(d).join(&name))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                usage(format!(
                    "{name} (needed by {}): not in {} (scripts/deps.sh installs {arch}'s libraries)",
                    exe.display(),
                    dirs.join(", ")
                ))
            })?;
        queue.extend(elf_deps(&found)?.0);
        libs.push(found);
    }
    Ok(libs)
}

/// The L1 kernel's modules directory (`lib/modules/VERSION`).
fn modules_dir(arch: Arch) -> Result<PathBuf, HarnessError> {
    let base = linux::cache_dir()
        .join("linux")
        .join(arch.name())
        .join("kernel/lib/modules");
    std::fs::read_dir(&base)
        .map_err(io(format!(
            "{} (scripts/build-linux-guests.sh)",
            base.display()
        )))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.join("modules.dep").is_file())
        .ok_or(HarnessError::NotBuilt(
            base,
            "scripts/build-linux-guests.sh",
        ))
}

/// Why the L1's KVM cannot run `test` at all, if it cannot, decided from
/// what the L1 is before it boots: a guest that needs EL2 on an arm64 L1
/// whose kernel's KVM gives guests none (KVM_CAP_ARM_EL2: Linux 6.16 and
/// later; QEMU refuses `virtualization=on` without it).
fn l1_skip(test: &GuestTest, arch: Arch) -> Option<String> {
    if arch != Arch::Aarch64 || !test.needs.iter().any(|n| n == "el2") {
        return None;
    }
    let release = modules_dir(arch)
        .ok()
        .and_then(|d| Some(d.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".into());
    (!crate::host::linux_at_least(&release, crate::host::KVM_ARM_EL2_SINCE)).then(|| {
        let (major, minor) = crate::host::KVM_ARM_EL2_SINCE;
        format!(
            "L1's KVM (Linux {release}) gives guests no EL2 (KVM_CAP_ARM_EL2: Linux {major}.{minor} and later)"
        )
    })
}

/// `module` and what it depends on (modules.dep), in load order.
pub fn load_order(modules_dep: &str, module: &str) -> Option<Vec<String>> {
    let line = modules_dep
        .lines()
        .find_map(|l| l.strip_prefix(module)?.strip_prefix(':'))?;
    let mut order: Vec<String> = line.split_whitespace().rev().map(String::from).collect();
    order.push(module.to_string());
    Some(order)
}

/// What gives the L1 kernel (`scripts/build-linux-guests.sh`'s) of `arch`
/// its `/dev/kvm`: on x86 kvm_amd and the modules it needs (modules.dep),
/// decompressed into `out` (`insmod` of a `.ko` takes a second in a
/// TCG-run L1, `modprobe` of the `.ko.xz` minutes), their paths in the L1
/// (`/root/nested/mods/N.ko`) in load order; none on arm64 (built in).
/// The directory `out` goes to `/root/nested/mods`.
pub fn kvm_modules(arch: Arch, out: &Path) -> Result<Vec<String>, HarnessError> {
    let Some(module) = l1_parts(arch).kvm_module else {
        return Ok(Vec::new());
    };
    let mdir = modules_dir(arch)?;
    let dep = std::fs::read_to_string(mdir.join("modules.dep")).map_err(io(format!(
        "reading {}",
        mdir.join("modules.dep").display()
    )))?;
    let order = load_order(&dep, module)
        .ok_or_else(|| usage(format!("{module} is not in {}", mdir.display())))?;
    decompress_modules(&mdir, &order, out)
}

/// The guest directory [`kvm_modules`]' `out` goes to.
pub const KVM_MODULES_DEST: &str = "/root/nested/mods";

/// Decompress `modules` (paths in `dir`, `.ko.xz`) into `out`, named
/// `N.ko` in load order; their guest paths.
fn decompress_modules(
    dir: &Path,
    modules: &[String],
    out: &Path,
) -> Result<Vec<String>, HarnessError> {
    std::fs::create_dir_all(out).map_err(io(format!("creating {}", out.display())))?;
    let mut names = Vec::new();
    for (i, m) in modules.iter().enumerate() {
        let src = dir.join(m);
        let data = Command::new("xz")
            .arg("-dc")
            .arg(&src)
            .output()
            .map_err(io(format!("xz -dc {}", src.display())))?;
        if !data.status.success() {
            return Err(usage(format!("xz -dc {}: failed", src.display())));
        }
        let name = format!("{i}.ko");
        std::fs::write(out.join(&name), &data.stdout)
            .map_err(io(format!("writing {}", out.join(&name).display())))?;
        names.push(format!("{KVM_MODULES_DEST}/{name}"));
    }
    Ok(names)
}

/// One guest run the L1 script makes.
struct Job<'a> {
    work: Work<'a>,
    label: String,
}

/// What a job runs.
enum Work<'a> {
    /// A bundled guest, in a variant.
    Guest(&'a GuestTest, Variant),
    /// Linux with the probe ([`crate::linux`]), on the kvm backend.
    Linux(Config),
}

/// Where the nested Linux's kernel and probe initramfs are in the L1.
const L1_LINUX_KERNEL: &str = "/root/nested/linux/vmlinuz";
/// See [`L1_LINUX_KERNEL`].
const L1_LINUX_INITRD: &str = "/root/nested/linux/initramfs.cpio.gz";

impl Job<'_> {
    /// Whether the script queries `x-query-rustkvm` at the guest's `ready`
    /// and then releases it with a byte on its console (`host-query=on`).
    fn host_query(&self) -> bool {
        matches!(self.work, Work::Guest(t, _) if t.host_query)
    }

    /// Its QEMU arguments inside the L1, and its time limit.
    fn command(&self, arch: Arch, linux_timeout: Duration) -> (Vec<String>, Duration) {
        match self.work {
            Work::Guest(test, variant) => {
                let kernel = PathBuf::from(format!("{L1_ROOT}/guests/{}", test.name));
                let mut args = run::guest_args(
                    test,
                    arch,
                    variant,
                    Backend::Kvm,
                    &RunOptions::default(),
                    &kernel,
                );
                // The host's kvm_cpu() adapts -cpu to the host's KVM
                // (kvm_pvm); inside L1 it is Linux's own KVM: the guest's
                // model as declared.
                if let (Some(i), Some(cpu)) = (args.iter().position(|a| a == "-cpu"), &test.cpu) {
                    args[i + 1] = cpu.clone();
                }
                (args, test.timeout * run::timeout_scale())
            }
            Work::Linux(config) => {
                let images = Images {
                    kernel: L1_LINUX_KERNEL.into(),
                    initrd: L1_LINUX_INITRD.into(),
                    mem_mib: linux::DEFAULT_MEM_MIB,
                    append: String::new(),
                    hypervisor: false,
                };
                (linux::command_args_for(config, &images), linux_timeout)
            }
        }
    }
}

/// The L1 script: load `modules`, then run each job (with its QEMU
/// arguments and time limit), its output between markers that [`parse`]
/// reads.
fn script(modules: &[String], jobs: &[(&Job, Vec<String>, Duration)]) -> String {
    let mut s = String::from(
        "# rustkvm nested runner (tests/src/nested.rs)\n\
         up() { cut -d' ' -f1 /proc/uptime; }\n",
    );
    for m in modules {
        s += &format!("insmod {m} || echo \"===NESTED-L1 insmod {m} failed===\"\n");
    }
    s += "[ -c /dev/kvm ] && echo \"===NESTED-L1 kvm ready at $(up)===\" \
          || echo \"===NESTED-L1 no /dev/kvm===\"\n";
    // What a timed-out job was doing: each QEMU thread's state, CPU
    // ticks and kernel wait channel, and KVM's exit counts (debugfs).
    s += "mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug 2>/dev/null\n\
          diag() { echo \"nested watchdog: QEMU threads (name state utime stime wchan):\"; \
          for t in /proc/$1/task/*; do echo \"  $(cat $t/comm) $(cut -d' ' -f3,14,15 $t/stat) $(cat $t/wchan 2>/dev/null)\"; done; \
          for f in /sys/kernel/debug/kvm/*/exits /sys/kernel/debug/kvm/*/halt_exits /sys/kernel/debug/kvm/*/io_exits /sys/kernel/debug/kvm/*/irq_exits; do \
          [ -e \"$f\" ] && echo \"  ${f#/sys/kernel/debug/kvm/} $(cat $f)\"; done; \
          T=/sys/kernel/debug/tracing; if [ -e $T/events/kvm/kvm_exit/enable ]; then \
          echo \"nested watchdog: KVM exits for a moment (ftrace kvm_exit):\"; : > $T/trace; \
          for e in kvm_exit kvm_emulate_insn kvm_inj_exception; do echo 1 > $T/events/kvm/$e/enable; done; sleep 1; \
          for e in kvm_exit kvm_emulate_insn kvm_inj_exception; do echo 0 > $T/events/kvm/$e/enable; done; \
          grep kvm_ $T/trace | head -n 24; fi; \
          echo \"nested watchdog: the guest's registers (QEMU monitor):\"; \
          ( printf 'info registers\\nx/16xb $pc\\nx/80gx $sp\\n'; sleep 2 ) > /tmp/mon.in & timeout 3 cat /tmp/mon.out | tr -d '\\r' | grep -v '^(qemu)\\|^QEMU ' ; }\n";
    // A job: QEMU in the background, a watchdog that kills it after its
    // time (and says so first: an x86 guest's exit status can be any odd
    // number, so the status alone cannot tell; a guest that exits as the
    // watchdog fires is timed out only if SIGKILL ended it).
    s += &format!(
        "job() {{ label=$1; t=$2; q=$3; shift 3; start=$(up); rm -f /tmp/timedout /tmp/diag /tmp/qmp; \
         rm -f /tmp/mon.in /tmp/mon.out; mkfifo /tmp/mon.in /tmp/mon.out; \
         if [ $q = 1 ]; then rm -f /tmp/in /tmp/qmp.in /tmp/qmp.out; mkfifo /tmp/in /tmp/qmp.in /tmp/qmp.out; exec 7<>/tmp/in; \
         {L1_ROOT}/qemu -L {L1_ROOT}/fw -monitor pipe:/tmp/mon -qmp pipe:/tmp/qmp \"$@\" <&7 >/tmp/out 2>/tmp/err & pid=$!; \
         else {L1_ROOT}/qemu -L {L1_ROOT}/fw -monitor pipe:/tmp/mon \"$@\" </dev/null >/tmp/out 2>/tmp/err & pid=$!; fi; \
         ( sleep \"$t\"; : > /tmp/timedout; diag $pid >/tmp/diag 2>&1; kill -KILL $pid 2>/dev/null ) & w=$!; \
         if [ $q = 1 ]; then n=0; while kill -0 $pid 2>/dev/null && ! grep -q '^ready' /tmp/out && [ $n -lt $t ]; do sleep 1; n=$((n+1)); done; \
         if grep -q '^ready' /tmp/out; then \
         printf '%s\\n' '{{\"execute\":\"qmp_capabilities\"}}' '{{\"execute\":\"x-query-rustkvm\"}}' > /tmp/qmp.in; \
         timeout 3 cat /tmp/qmp.out > /tmp/qmp; printf x >&7; fi; fi; \
         wait $pid; rc=$?; kill $w 2>/dev/null; [ $q = 1 ] && exec 7>&-; to=0; \
         [ -e /tmp/timedout ] && [ $rc -eq 137 ] && to=1; \
         echo \"===NESTED-BEGIN $label rc=$rc timedout=$to start=$start end=$(up)===\"; cat /tmp/out; \
         echo \"===NESTED-QMP===\"; cat /tmp/qmp 2>/dev/null; \
         echo \"===NESTED-STDERR===\"; cat /tmp/err; [ $to = 1 ] && cat /tmp/diag; echo \"===NESTED-END===\"; }}\n"
    );
    for (j, args, time) in jobs {
        let secs = time.as_secs().max(1);
        let argv: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
        let q = u8::from(j.host_query());
        s += &format!("job {} {secs} {q} {}\n", sh_quote(&j.label), argv.join(" "));
    }
    s
}

/// The L1's uptime (seconds) when its `/dev/kvm` was there, from the
/// script's `output`.
fn kvm_ready_at(output: &str) -> Option<f64> {
    output.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix("===NESTED-L1 kvm ready at ")?
            .strip_suffix("===")?
            .parse()
            .ok()
    })
}

/// One guest's part of the L1 console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutput {
    /// Its label.
    pub label: String,
    /// QEMU's exit status (the shell's 128 + signal if killed).
    pub rc: i32,
    /// Killed after its time.
    pub timed_out: bool,
    /// L1 uptime at its start and end, in seconds.
    pub elapsed: Duration,
    /// Its serial console (QEMU's stdout).
    pub serial: String,
    /// What its QMP monitor answered the host's query, one JSON object a
    /// line (empty: not queried).
    pub qmp: String,
    /// QEMU's stderr.
    pub stderr: String,
}

/// The jobs' outputs in the L1 script's output.
pub fn parse(output: &str) -> Vec<JobOutput> {
    let mut jobs = Vec::new();
    let mut lines = output.lines();
    while let Some(l) = lines.next() {
        let Some(head) = l
            .trim_end()
            .strip_prefix("===NESTED-BEGIN ")
            .and_then(|h| h.strip_suffix("==="))
        else {
            continue;
        };
        let mut words = head.rsplitn(5, ' ');
        let (Some(end), Some(start), Some(to), Some(rc), Some(label)) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            continue;
        };
        let num = |w: &str, k: &str| w.strip_prefix(k).and_then(|v| v.parse::<f64>().ok());
        let (Some(rc), Some(to), Some(start), Some(end)) = (
            num(rc, "rc="),
            num(to, "timedout="),
            num(start, "start="),
            num(end, "end="),
        ) else {
            continue;
        };
        let (mut serial, mut qmp, mut stderr) = (String::new(), String::new(), String::new());
        let mut part = 0;
        for l in lines.by_ref() {
            let t = l.trim_end_matches('\r');
            match t {
                "===NESTED-QMP===" => part = 1,
                "===NESTED-STDERR===" => part = 2,
                "===NESTED-END===" => break,
                _ => {
                    let buf = match part {
                        0 => &mut serial,
                        1 => &mut qmp,
                        _ => &mut stderr,
                    };
                    buf.push_str(t);
                    buf.push('\n');
                }
            }
        }
        jobs.push(JobOutput {
            label: label.to_string(),
            rc: rc as i32,
            timed_out: to != 0.0,
            elapsed: Duration::from_secs_f64((end - start).max(0.0)),
            serial,
            qmp,
            stderr,
        });
    }
    jobs
}

/// `x-query-rustkvm`'s return value among a job's QMP replies, or what it
/// answered instead.
pub fn query_return(qmp: &str) -> Result<serde_json::Value, String> {
    qmp.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| {
            v.get("return")
                .filter(|r| r.get("vcpus").is_some())
                .cloned()
        })
        .ok_or_else(|| format!("no x-query-rustkvm answer; QMP said:\n{qmp}"))
}

/// What the L1's watchdog saw of a timed-out job (its part of the job's
/// stderr), without the FPU and vector registers.
fn watchdog_report(stderr: &str) -> String {
    let Some(at) = stderr.find("nested watchdog:") else {
        return String::new();
    };
    stderr[at..]
        .lines()
        .filter(|l| {
            !["FPR", "XMM", "YMM", "ZMM", "Opmask", "FCW", "DR"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .take(60)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Run `cells` (a guest and a variant each) on real KVM nested in one
/// rustkvm L1 of `arch`; each held to its declared kvm outcome and its
/// verdict recorded as `guest NAME/ARCH/VARIANT/kvm-nested`.
pub fn run_nested(
    cells: &[(&GuestTest, Variant)],
    arch: Arch,
) -> Result<Vec<RunResult>, HarnessError> {
    Ok(run_l1(cells, &[], arch, linux::DEFAULT_TIMEOUT)?.guests)
}

/// What one L1 ran.
#[derive(Debug)]
pub struct L1Results {
    /// The bundled guests', in order.
    pub guests: Vec<RunResult>,
    /// The Linux boots', in order (their configurations marked nested).
    pub linux: Vec<LinuxRun>,
    /// Each `host-query=on` guest's `x-query-rustkvm` answer (guest
    /// name, the return value or why there is none), in order.
    pub queries: Vec<(String, Result<serde_json::Value, String>)>,
}

/// [`run_nested`], and Linux boots of `linux` (kvm configurations) with
/// the probe, each within `linux_timeout`, in the same L1 after the
/// guests; each boot's verdict recorded as `linux LABEL` (its label says
/// `kvm,nested`).
pub fn run_l1(
    cells: &[(&GuestTest, Variant)],
    linux: &[Config],
    arch: Arch,
    linux_timeout: Duration,
) -> Result<L1Results, HarnessError> {
    if let Some(c) = linux
        .iter()
        .find(|c| c.backend != Backend::Kvm || c.arch != arch)
    {
        return Err(usage(format!(
            "a nested Linux boot runs the kvm backend on the L1's architecture ({arch}): not {}",
            c.label()
        )));
    }
    // One directory per L1: a process may run several (one per test).
    static L1S: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = L1S.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("rustkvm-nested-{}-{arch}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("guests"))
        .map_err(io(format!("creating {}", dir.display())))?;
    let linux: Vec<Config> = linux
        .iter()
        .map(|c| Config { nested: true, ..*c })
        .collect();
    let result = run_in(cells, &linux, arch, linux_timeout, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(
    cells: &[(&GuestTest, Variant)],
    linux: &[Config],
    arch: Arch,
    linux_timeout: Duration,
    dir: &Path,
) -> Result<L1Results, HarnessError> {
    let parts = l1_parts(arch);
    let exe = qemu::native_emulator(arch)?;
    let stripped = dir.join("qemu");
    let ok = Command::new(parts.strip)
        .arg("-o")
        .arg(&stripped)
        .arg(&exe)
        .status()
        .map_err(io(format!("running {} (binutils)", parts.strip)))?;
    if !ok.success() {
        return Err(usage(format!(
            "{} -o {} {}: failed",
            parts.strip,
            stripped.display(),
            exe.display()
        )));
    }
    let mut add: Vec<(PathBuf, String)> = vec![(stripped, format!("{L1_ROOT}/qemu"))];
    for lib in shared_libraries(&exe, arch)? {
        let dest = lib.display().to_string();
        add.push((lib, dest));
    }
    for fw in parts.firmware {
        let p = PathBuf::from(fw);
        if !p.is_file() {
            return Err(usage(format!(
                "{fw}: missing (Debian's seabios and qemu-system-data: scripts/deps.sh)"
            )));
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        add.push((p, format!("{L1_ROOT}/fw/{name}")));
    }
    let modules = kvm_modules(arch, &dir.join("mods"))?;
    if !modules.is_empty() {
        add.push((dir.join("mods"), KVM_MODULES_DEST.into()));
    }
    let mut jobs = Vec::new();
    let mut added = std::collections::BTreeSet::new();
    let mut skipped = Vec::new();
    for &(t, variant) in cells {
        if let Some(why) = l1_skip(t, arch) {
            skipped.push((t, variant, why));
            continue;
        }
        let bin = t.binary(arch);
        if !bin.exists() {
            return Err(HarnessError::NotBuilt(bin, "scripts/build-guests.sh"));
        }
        if added.insert(t.name.clone()) {
            add.push((bin, format!("{L1_ROOT}/guests/{}", t.name)));
        }
        jobs.push(Job {
            work: Work::Guest(t, variant),
            label: format!("{}/{variant}", t.name),
        });
    }
    let (kernel, probe_initrd) = linux::images(arch)?;
    if !linux.is_empty() {
        add.push((kernel.clone(), L1_LINUX_KERNEL.into()));
        add.push((probe_initrd, L1_LINUX_INITRD.into()));
    }
    for &c in linux {
        jobs.push(Job {
            work: Work::Linux(c),
            label: format!("linux:{}", c.label()),
        });
    }
    // Each job's QEMU arguments and time limit, for the script and the
    // L1's budget.
    let commands: Vec<(&Job, Vec<String>, Duration)> = jobs
        .iter()
        .map(|j| {
            let (args, time) = j.command(arch, linux_timeout);
            (j, args, time)
        })
        .collect();
    let spec = BootSpec {
        kernel: kernel.clone(),
        initrd: None,
        modules: None,
        add,
        packages: Vec::new(),
        run: script(&modules, &commands),
        hypervisor: true,
        append: String::new(),
        kvm_modules: false,
    };
    let initrd = boot::initramfs(&spec, arch, dir)?;
    let config = Config::new(arch, Backend::Rustkvm, 2);
    let budget: Duration = commands
        .iter()
        .map(|(_, _, time)| *time + Duration::from_secs(10))
        .sum::<Duration>()
        + L1_BOOT;
    // One guest at a time: room for one nested Linux's RAM on top.
    let mem_mib = L1_MEM_MIB
        + if linux.is_empty() {
            0
        } else {
            linux::DEFAULT_MEM_MIB
        };
    let images = Images {
        kernel,
        initrd,
        mem_mib,
        append: " rustkvm.run=1".into(),
        hypervisor: true,
    };
    let l1 = linux::run_images(config, budget, Some(&images));
    let output = boot::command_result(&l1.console).map(|(out, _)| out);
    let outputs = output.as_deref().map(parse).unwrap_or_default();
    eprintln!(
        "rustkvm nested: the {arch} L1 ran {} of {} jobs in {:.1} s; /dev/kvm {}",
        outputs.len(),
        jobs.len(),
        l1.elapsed.as_secs_f64(),
        output
            .as_deref()
            .and_then(kvm_ready_at)
            .map_or("never came".to_string(), |t| format!(
                "at {t:.2} s of its uptime"
            ))
    );
    let l1_tail = || {
        let tail: Vec<&str> = l1.console.lines().rev().take(15).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    let no_kvm = output
        .as_deref()
        .is_some_and(|o| o.contains("===NESTED-L1 no /dev/kvm==="));
    let never_ran = || {
        if no_kvm {
            match arch {
                Arch::X86_64 => "L1 has no /dev/kvm (kvm_amd did not load)".to_string(),
                Arch::Aarch64 => {
                    "L1 has no /dev/kvm (KVM/arm64 did not initialize at EL2)".to_string()
                }
            }
        } else {
            format!(
                "L1 never ran it ({}); L1's console ends:\n{}",
                l1.ending,
                l1_tail()
            )
        }
    };
    let mut results = L1Results {
        guests: Vec::new(),
        linux: Vec::new(),
        queries: Vec::new(),
    };
    for j in &jobs {
        let out = outputs.iter().find(|o| o.label == j.label);
        let (test, variant) = match j.work {
            Work::Guest(test, variant) => (test, variant),
            Work::Linux(config) => {
                let run = match out {
                    Some(o) => linux::from_output(
                        config,
                        o.serial.clone(),
                        &o.stderr,
                        o.elapsed,
                        Some(if o.timed_out {
                            format!(
                                "timed out in L1 after {} s\n{}",
                                o.elapsed.as_secs(),
                                watchdog_report(&o.stderr)
                            )
                        } else {
                            format!(
                                "its QEMU in L1 exited with status {} after {:.1} s",
                                o.rc,
                                o.elapsed.as_secs_f64()
                            )
                        }),
                    ),
                    None => linux::from_output(
                        config,
                        String::new(),
                        "",
                        Duration::ZERO,
                        Some(never_ran()),
                    ),
                };
                linux::record(config, &run.outcome);
                results.linux.push(run);
                continue;
            }
        };
        if j.host_query() {
            let answer = out.map_or_else(|| Err(never_ran()), |o| query_return(&o.qmp));
            results.queries.push((test.name.clone(), answer));
        }
        let outcome = match out {
            Some(o) if o.timed_out => {
                let mut out = Outcome::skipped(String::new());
                out.status =
                    Status::Fail(format!("timed out in L1 after {} s", o.elapsed.as_secs()));
                out.serial = o.serial.clone();
                out.stderr = o.stderr.clone();
                out
            }
            Some(o) => run::judge(
                arch,
                Some(o.rc),
                None,
                o.serial.clone(),
                o.stderr.clone(),
                o.elapsed,
            ),
            None => {
                let mut out = Outcome::skipped(String::new());
                out.status = Status::Fail(never_ran());
                out
            }
        };
        let outcome = run::hold_to_declaration_on(test, arch, variant, Backend::Kvm, true, outcome);
        results.guests.push(recorded(test, arch, variant, outcome));
    }
    for (test, variant, why) in skipped {
        results
            .guests
            .push(recorded(test, arch, variant, Outcome::skipped(why)));
    }
    Ok(results)
}

/// A nested kvm run of `test` ended with `outcome`: its verdict recorded
/// (`guest NAME/ARCH/VARIANT/kvm-nested`), its result.
fn recorded(test: &GuestTest, arch: Arch, variant: Variant, outcome: Outcome) -> RunResult {
    crate::record_verdict(
        &format!("guest {}/{arch}/{variant}/kvm-nested", test.name),
        &outcome.status,
    );
    RunResult {
        test: test.name.clone(),
        arch,
        variant,
        backend: Backend::Kvm,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_after_their_dependencies() {
        let dep = "kernel/arch/x86/kvm/kvm.ko.xz: kernel/virt/lib/irqbypass.ko.xz\n\
                   kernel/arch/x86/kvm/kvm-amd.ko.xz: kernel/drivers/crypto/ccp/ccp.ko.xz kernel/arch/x86/kvm/kvm.ko.xz kernel/virt/lib/irqbypass.ko.xz\n";
        assert_eq!(
            load_order(dep, X86_KVM_MODULE).unwrap(),
            [
                "kernel/virt/lib/irqbypass.ko.xz",
                "kernel/arch/x86/kvm/kvm.ko.xz",
                "kernel/drivers/crypto/ccp/ccp.ko.xz",
                X86_KVM_MODULE
            ]
        );
        assert_eq!(load_order(dep, "kernel/none.ko.xz"), None);
    }

    #[test]
    fn job_outputs_are_read_between_their_markers() {
        let out = "noise\n===NESTED-BEGIN hello/default rc=1 timedout=0 start=6.80 end=8.39===\r\n\
                   # hello\nsummary checks=1 passed=1 failed=0 skipped=0\n===NESTED-QMP===\n{\"QMP\": {}}\n\
                   {\"return\": {\"arch\": \"aarch64\", \"vcpus\": []}}\n===NESTED-STDERR===\n\
                   warn\n===NESTED-END===\n===NESTED-BEGIN smp/default rc=137 timedout=1 start=9 end=39===\n";
        let jobs = parse(out);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].label, "hello/default");
        assert_eq!(jobs[0].rc, 1);
        assert_eq!(
            jobs[0].serial,
            "# hello\nsummary checks=1 passed=1 failed=0 skipped=0\n"
        );
        assert_eq!(jobs[0].stderr, "warn\n");
        assert_eq!(
            query_return(&jobs[0].qmp),
            Ok(serde_json::json!({"arch": "aarch64", "vcpus": []}))
        );
        assert!(query_return(&jobs[1].qmp).is_err());
        assert!((jobs[0].elapsed.as_secs_f64() - 1.59).abs() < 1e-6);
        assert_eq!(
            (jobs[1].rc, jobs[1].timed_out, jobs[1].serial.as_str()),
            (137, true, "")
        );
        assert!(!jobs[0].timed_out);
        assert_eq!(
            kvm_ready_at("x\n===NESTED-L1 kvm ready at 6.53===\r\n"),
            Some(6.53)
        );
        assert_eq!(kvm_ready_at("===NESTED-L1 no /dev/kvm===\n"), None);
    }

    #[test]
    fn the_watchdog_report_keeps_threads_exits_and_registers() {
        let err = "qemu: warning\nnested watchdog: QEMU threads (name state utime stime wchan):\n  qemu R 10 2 0\n\
                   EIP=00000210 EFL=00000057\nFPR0=0 0000\nXMM00=0 0\nDR0=0\nCS =f502 000f5020\n";
        assert_eq!(
            watchdog_report(err),
            "nested watchdog: QEMU threads (name state utime stime wchan):\n  qemu R 10 2 0\n\
             EIP=00000210 EFL=00000057\nCS =f502 000f5020"
        );
        assert_eq!(watchdog_report("just stderr\n"), "");
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }
}
