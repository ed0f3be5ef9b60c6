//! virtme-ng (PyPI `virtme-ng`, the runner kernel developers use) boots a
//! kernel under our QEMU with `-accel rustkvm` on both architectures (issue
//! 20.4, docs/boot.md): Debian's 6.12 kernel packages (unpacked by
//! `scripts/build-linux-guests.sh`); on x86_64 the host's root filesystem
//! over 9p, as vng shares it, with the host's `perf` (Debian's linux-perf);
//! on arm64 a root directory of Debian's arm64 packages the project builds
//! (`scripts/build-userland.sh --vng-root`). perf counts a loop whose
//! instruction and branch counts the test knows by construction: the oracle
//! is the program's own arithmetic, not our code.
//!
//! Needs what `scripts/deps.sh` installs (virtme-ng in the cache's venv;
//! linux-perf, busybox-static, kmod and udev on the host, which vng's guest
//! runs) and `scripts/build-qemu.sh` (`--enable-virtfs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use rustkvm_tests::{linux, qemu, record_verdict, Arch, Status};

/// Loop iterations of the counted programs.
const N: u64 = 1_000_000;

/// One architecture's run: vng's name for it, the program and what it
/// counts by construction.
struct Case {
    arch: Arch,
    /// vng's `--arch`, for a foreign architecture (None: the host's).
    vng_arch: Option<&'static str>,
    /// The host's binutils for the architecture.
    binutils: &'static str,
    /// A static program that loops N times and exits 0.
    loop_s: &'static str,
    /// Its user instructions and branches retired.
    instructions: u64,
    branches: u64,
}

const CASES: [Case; 2] = [
    // 1 (mov) + 2N (dec, jnz) + 3 (mov, xor, syscall) instructions; N (jnz)
    // + 1 (SYSCALL, a far branch in AMD's count: `-cpu max`) branches.
    Case {
        arch: Arch::X86_64,
        vng_arch: None,
        binutils: "",
        loop_s: "
    .globl _start
_start:
    mov $1000000, %ecx
1:  dec %ecx
    jnz 1b
    mov $60, %eax
    xor %edi, %edi
    syscall
",
        instructions: 2 * N + 4,
        branches: N + 1,
    },
    // 2 (movz, movk) + 2N (subs, b.ne) + 3 (mov, mov, svc) instructions;
    // N branches (b.ne, taken or not: BR_RETIRED).
    Case {
        arch: Arch::Aarch64,
        vng_arch: Some("arm64"),
        binutils: "aarch64-linux-gnu-",
        loop_s: "
    .globl _start
_start:
    movz x1, #0x4240
    movk x1, #0xf, lsl #16
1:  subs x1, x1, #1
    b.ne 1b
    mov x8, #93
    mov x0, #0
    svc #0
",
        instructions: 2 * N + 5,
        branches: N,
    },
];

/// Assemble the case's program with the host's binutils into `dir/loop`.
fn build_loop(case: &Case, dir: &Path) {
    std::fs::create_dir_all(dir).expect("temp dir");
    let (s, o, bin) = (dir.join("loop.s"), dir.join("loop.o"), dir.join("loop"));
    std::fs::write(&s, case.loop_s).expect("write loop.s");
    for (tool, args) in [
        ("as", vec!["-o", o.to_str().unwrap(), s.to_str().unwrap()]),
        (
            "ld",
            vec!["-static", "-o", bin.to_str().unwrap(), o.to_str().unwrap()],
        ),
    ] {
        let tool = format!("{}{tool}", case.binutils);
        let st = Command::new(&tool).args(&args).status().expect(&tool);
        assert!(st.success(), "{tool} failed");
    }
}

/// The root directory vng runs an arm64 guest in: Debian's arm64 packages
/// (linux-perf among them), `scripts/build-userland.sh --vng-root`.
fn arm64_root() -> PathBuf {
    let script = rustkvm_tests::repo_root().join("scripts/build-userland.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(["--vng-root", "aarch64", "linux-perf"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("scripts/build-userland.sh");
    assert!(
        out.status.success(),
        "scripts/build-userland.sh --vng-root failed"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().expect("a path").trim())
}

/// `vng` on Debian's kernel for the case's architecture with `-accel
/// ACCEL`, `dir` as the guest's /root, running `cmd`: (exit code, stdout,
/// stderr).
fn vng(
    case: &Case,
    root: Option<&Path>,
    accel: &str,
    dir: &Path,
    cmd: &str,
) -> (Option<i32>, String, String) {
    let cache = linux::cache_dir();
    let kdir = cache.join("linux").join(case.arch.name()).join("kernel");
    let kernel = std::fs::read_dir(kdir.join("boot"))
        .expect("scripts/build-linux-guests.sh unpacks the kernel package")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .expect("boot/vmlinuz-* in the kernel package");
    let venv = cache.join("venv/bin");
    let path = format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let qemu = qemu::emulator(case.arch).expect("scripts/build-qemu.sh");
    let mut c = Command::new("timeout");
    // A hang guard only (a boot takes seconds): never a verdict on time.
    c.arg("600")
        .arg(venv.join("vng"))
        .args(case.vng_arch.iter().flat_map(|a| ["--arch", a]))
        .args(["--disable-kvm", "--force-9p", "--qemu"])
        .arg(&qemu)
        .arg(format!("--qemu-opts=-accel {accel}"))
        .arg(format!("--rodir=/root={}", dir.display()));
    if let Some(root) = root {
        c.arg("--root").arg(root);
    }
    let out = c
        .arg("--run")
        .arg(&kernel)
        .args(["--exec", cmd])
        .env("PATH", path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("vng (scripts/deps.sh installs it)");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// perf stat's CSV count of `event` in `text`, if it printed a number.
fn count(text: &str, event: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.split_once(&format!(",,{event},")))
        .and_then(|(n, _)| n.trim().parse().ok())
}

#[test]
fn vng_boots_a_kernel_under_rustkvm_and_perf_counts_a_known_loop_exactly() {
    let cmd = "perf stat -e instructions:u,branches:u -x, /root/loop; echo vng-ran; exit 3";
    for case in &CASES {
        let name = case.arch.name();
        let dir = std::env::temp_dir().join(format!("rustkvm-vng-{name}-{}", std::process::id()));
        build_loop(case, &dir);
        // x86_64: the host's root, as vng shares it; arm64: ours.
        let root = (case.arch == Arch::Aarch64).then(arm64_root);

        // rustkvm: the PMU counts the loop exactly; the command's exit
        // status is vng's.
        let (code, out, err) = vng(case, root.as_deref(), "rustkvm", &dir, cmd);
        let all = format!("{name}: exit {code:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert_eq!(code, Some(3), "{all}");
        assert!(out.contains("vng-ran"), "{all}");
        assert_eq!(
            count(&err, "instructions:u"),
            Some(case.instructions),
            "{all}"
        );
        assert_eq!(count(&err, "branches:u"), Some(case.branches), "{all}");
        record_verdict(&format!("vng {name}/rustkvm perf stat"), &Status::Pass);

        // tcg: the same boot; no PMU that counts (declared).
        let (code, out, err) = vng(case, root.as_deref(), "tcg", &dir, cmd);
        let all = format!("{name}: exit {code:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert_eq!(code, Some(3), "{all}");
        assert!(
            err.contains("<not supported>,,instructions:u"),
            "tcg counts nothing: {all}"
        );
        assert_eq!(count(&err, "instructions:u"), None, "{all}");
        record_verdict(
            &format!("vng {name}/tcg perf stat (not supported, declared)"),
            &Status::Pass,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
