//! `backend=kvm`, nested: the bundled guests on real KVM — Linux's own
//! `kvm_amd` — inside an L1 Linux that runs under rustkvm (`-cpu max`: an
//! AMD model with TCG's SVM), one L1 boot for the whole run (issue 47).
//!
//! The L1 is Debian's kernel (`scripts/build-linux-guests.sh`) with the
//! probe's initramfs and, on top ([`crate::boot::initramfs`]): this build's
//! QEMU (stripped) with the shared libraries it links and the firmware it
//! loads, Debian's KVM modules (decompressed: `insmod` of a `.ko` is about
//! a second, where `modprobe` of the `.ko.xz` took minutes under TCG), the
//! guests, and a script that loads the modules and runs each guest with
//! exactly the arguments [`crate::run::guest_args`] gives the kvm backend.
//! Each guest's output comes back on L1's console between markers, and is
//! judged and held to the guest's declared kvm outcome as a run on the
//! host's KVM is.
//!
//! x86_64 only so far: an arm64 L1 needs this QEMU built for arm64.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::boot::{self, BootSpec};
use crate::guest::GuestTest;
use crate::linux::{self, Config, Images};
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

/// The shared libraries `exe` loads (ldd), with the dynamic loader.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>, HarnessError> {
    let out = Command::new("ldd")
        .arg(exe)
        .output()
        .map_err(io(format!("running ldd {}", exe.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    if !out.status.success() || libs.is_empty() {
        return Err(usage(format!(
            "ldd {}: no libraries found ({})",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
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

/// `module` and what it depends on (modules.dep), in load order.
pub fn load_order(modules_dep: &str, module: &str) -> Option<Vec<String>> {
    let line = modules_dep
        .lines()
        .find_map(|l| l.strip_prefix(module)?.strip_prefix(':'))?;
    let mut order: Vec<String> = line.split_whitespace().rev().map(String::from).collect();
    order.push(module.to_string());
    Some(order)
}

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
        names.push(format!("{L1_ROOT}/mods/{name}"));
    }
    Ok(names)
}

/// One guest run the L1 script makes.
struct Job<'a> {
    test: &'a GuestTest,
    variant: Variant,
    label: String,
}

/// The L1 script: load `modules`, then run each job, its output between
/// markers that [`parse`] reads.
fn script(arch: Arch, modules: &[String], jobs: &[Job]) -> String {
    let mut s = String::from(
        "# rustkvm nested runner (tests/src/nested.rs)\n\
         up() { cut -d' ' -f1 /proc/uptime; }\n",
    );
    for m in modules {
        s += &format!("insmod {m} || echo \"===NESTED-L1 insmod {m} failed===\"\n");
    }
    s += "[ -c /dev/kvm ] && echo \"===NESTED-L1 kvm ready at $(up)===\" \
          || echo \"===NESTED-L1 no /dev/kvm===\"\n";
    // A job: QEMU in the background, a watchdog that kills it after its
    // time (and says so first: an x86 guest's exit status can be any odd
    // number, so the status alone cannot tell; a guest that exits as the
    // watchdog fires is timed out only if SIGKILL ended it).
    s += &format!(
        "job() {{ label=$1; t=$2; shift 2; start=$(up); rm -f /tmp/timedout; \
         {L1_ROOT}/qemu -L {L1_ROOT}/fw \"$@\" </dev/null >/tmp/out 2>/tmp/err & pid=$!; \
         ( sleep \"$t\"; : > /tmp/timedout; kill -KILL $pid 2>/dev/null ) & w=$!; \
         wait $pid; rc=$?; kill $w 2>/dev/null; to=0; \
         [ -e /tmp/timedout ] && [ $rc -eq 137 ] && to=1; \
         echo \"===NESTED-BEGIN $label rc=$rc timedout=$to start=$start end=$(up)===\"; cat /tmp/out; \
         echo \"===NESTED-STDERR===\"; cat /tmp/err; echo \"===NESTED-END===\"; }}\n"
    );
    for j in jobs {
        let kernel = PathBuf::from(format!("{L1_ROOT}/guests/{}", j.test.name));
        let mut args = run::guest_args(
            j.test,
            arch,
            j.variant,
            Backend::Kvm,
            &RunOptions::default(),
            &kernel,
        );
        // The host's kvm_cpu() adapts -cpu to the host's KVM (kvm_pvm);
        // inside L1 it is Linux's own KVM: the guest's model as declared.
        if let (Some(i), Some(cpu)) = (args.iter().position(|a| a == "-cpu"), &j.test.cpu) {
            args[i + 1] = cpu.clone();
        }
        let secs = (j.test.timeout * run::timeout_scale()).as_secs().max(1);
        let argv: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
        s += &format!("job {} {secs} {}\n", sh_quote(&j.label), argv.join(" "));
    }
    s
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
        let (mut serial, mut stderr, mut in_err) = (String::new(), String::new(), false);
        for l in lines.by_ref() {
            let t = l.trim_end_matches('\r');
            match t {
                "===NESTED-STDERR===" => in_err = true,
                "===NESTED-END===" => break,
                _ => {
                    let buf = if in_err { &mut stderr } else { &mut serial };
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
            stderr,
        });
    }
    jobs
}

/// Run `cells` (a guest and a variant each) on real KVM nested in one
/// rustkvm L1 of `arch`; each held to its declared kvm outcome and its
/// verdict recorded as `guest NAME/ARCH/VARIANT/kvm-nested`.
pub fn run_nested(
    cells: &[(&GuestTest, Variant)],
    arch: Arch,
) -> Result<Vec<RunResult>, HarnessError> {
    if arch != Arch::X86_64 {
        return Err(usage(format!(
            "nested backend=kvm runs x86_64 guests for now: an {arch} L1 needs this QEMU built for {arch} (issue 47)"
        )));
    }
    let dir = std::env::temp_dir().join(format!("rustkvm-nested-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("guests"))
        .map_err(io(format!("creating {}", dir.display())))?;
    let result = run_in(cells, arch, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(
    cells: &[(&GuestTest, Variant)],
    arch: Arch,
    dir: &Path,
) -> Result<Vec<RunResult>, HarnessError> {
    let exe = qemu::emulator(arch)?;
    let stripped = dir.join("qemu");
    let ok = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&exe)
        .status()
        .map_err(io("running strip (binutils)".into()))?;
    if !ok.success() {
        return Err(usage(format!(
            "strip -o {} {}: failed",
            stripped.display(),
            exe.display()
        )));
    }
    let mut add: Vec<(PathBuf, String)> = vec![(stripped, format!("{L1_ROOT}/qemu"))];
    for lib in shared_libraries(&exe)? {
        let dest = lib.display().to_string();
        add.push((lib, dest));
    }
    for fw in X86_FIRMWARE {
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
    let mdir = modules_dir(arch)?;
    let dep = std::fs::read_to_string(mdir.join("modules.dep")).map_err(io(format!(
        "reading {}",
        mdir.join("modules.dep").display()
    )))?;
    let order = load_order(&dep, X86_KVM_MODULE)
        .ok_or_else(|| usage(format!("{X86_KVM_MODULE} is not in {}", mdir.display())))?;
    let modules = decompress_modules(&mdir, &order, &dir.join("mods"))?;
    add.push((dir.join("mods"), format!("{L1_ROOT}/mods")));
    let mut jobs = Vec::new();
    let mut added = std::collections::BTreeSet::new();
    for &(t, variant) in cells {
        let bin = t.binary(arch);
        if !bin.exists() {
            return Err(HarnessError::NotBuilt(bin, "scripts/build-guests.sh"));
        }
        if added.insert(t.name.clone()) {
            add.push((bin, format!("{L1_ROOT}/guests/{}", t.name)));
        }
        jobs.push(Job {
            test: t,
            variant,
            label: format!("{}/{variant}", t.name),
        });
    }
    let (kernel, _) = linux::images(arch)?;
    let spec = BootSpec {
        kernel: kernel.clone(),
        initrd: None,
        modules: None,
        add,
        packages: Vec::new(),
        run: script(arch, &modules, &jobs),
    };
    let initrd = boot::initramfs(&spec, arch, dir)?;
    let config = Config::new(arch, Backend::Rustkvm, 2);
    let budget: Duration = jobs
        .iter()
        .map(|j| j.test.timeout * run::timeout_scale() + Duration::from_secs(10))
        .sum::<Duration>()
        + L1_BOOT;
    let images = Images {
        kernel,
        initrd,
        mem_mib: L1_MEM_MIB,
        append: " rustkvm.run=1".into(),
    };
    let l1 = linux::run_images(config, budget, Some(&images));
    let output = boot::command_result(&l1.console).map(|(out, _)| out);
    let outputs = output.as_deref().map(parse).unwrap_or_default();
    let l1_tail = || {
        let tail: Vec<&str> = l1.console.lines().rev().take(15).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    let no_kvm = output
        .as_deref()
        .is_some_and(|o| o.contains("===NESTED-L1 no /dev/kvm==="));
    let mut results = Vec::new();
    for j in &jobs {
        let outcome = match outputs.iter().find(|o| o.label == j.label) {
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
                out.status = Status::Fail(if no_kvm {
                    "L1 has no /dev/kvm (kvm_amd did not load)".into()
                } else {
                    format!("L1 never ran it; L1's console ends:\n{}", l1_tail())
                });
                out
            }
        };
        let outcome =
            run::hold_to_declaration_on(j.test, arch, j.variant, Backend::Kvm, true, outcome);
        crate::record_verdict(
            &format!("guest {}/{arch}/{}/kvm-nested", j.test.name, j.variant),
            &outcome.status,
        );
        results.push(RunResult {
            test: j.test.name.clone(),
            arch,
            variant: j.variant,
            backend: Backend::Kvm,
            outcome,
        });
    }
    Ok(results)
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
                   # hello\nsummary checks=1 passed=1 failed=0 skipped=0\n===NESTED-STDERR===\n\
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
        assert!((jobs[0].elapsed.as_secs_f64() - 1.59).abs() < 1e-6);
        assert_eq!(
            (jobs[1].rc, jobs[1].timed_out, jobs[1].serial.as_str()),
            (137, true, "")
        );
        assert!(!jobs[0].timed_out);
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }
}
