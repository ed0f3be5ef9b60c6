//! Installing rustkvm (issue 20.1): `scripts/install.sh` into a prefix and
//! `scripts/package.sh`'s Debian package through apt, each then running a
//! bundled guest on both architectures through the installed emulators
//! (and the installed plugin in Debian's own QEMU), and each removed again
//! with nothing left behind.
//!
//! Needs `scripts/build-qemu.sh` and `scripts/build-guests.sh`; the package
//! test needs root and apt (a fresh Debian machine as the README says).
//! A `rustkvm` package installed before the test is not touched: the test
//! fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustkvm_tests::run::{self, RunOptions};
use rustkvm_tests::{guest, Arch, Backend, Status, Variant};

fn script(name: &str, args: &[&str]) -> String {
    let root = rustkvm_tests::repo_root();
    let out = Command::new("bash")
        .arg(root.join("scripts").join(name))
        .args(args)
        .output()
        .expect("bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "scripts/{name} {args:?}:\n{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hello` (and, on x86_64, `pmu-oracle`'s rustkvm features) through the
/// emulators installed in `bin`: must pass as under the build's emulators.
fn guests_pass_with(bin: &Path) {
    let hello = guest::discover()
        .expect("guest tests")
        .into_iter()
        .find(|t| t.name == "hello")
        .expect("hello");
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let exe = bin.join(format!("rustkvm-qemu-system-{arch}"));
        let opts = RunOptions {
            emulator: Some(exe.clone()),
            ..Default::default()
        };
        let r =
            run::run_with(&hello, arch, Variant::Default, Backend::Rustkvm, &opts).expect("ran");
        assert_eq!(
            r.outcome.status,
            Status::Pass,
            "{}: {}\n{}",
            exe.display(),
            r.outcome.serial,
            r.outcome.stderr
        );
    }
}

/// Regular files and symlinks under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn install_sh_installs_into_a_prefix_and_uninstalls_cleanly() {
    let prefix = std::env::temp_dir().join(format!("rustkvm-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let p = prefix.to_str().expect("utf-8");
    script("install.sh", &["--no-build", "--prefix", p]);
    for f in [
        "bin/rustkvm-qemu-system-x86_64",
        "bin/rustkvm-qemu-system-aarch64",
        "lib/rustkvm/librustkvm_plugin.so",
        "share/doc/rustkvm/README.md",
        "share/doc/rustkvm/docs/testing.md",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    guests_pass_with(&prefix.join("bin"));
    script("install.sh", &["--uninstall", "--prefix", p]);
    let left = files_under(&prefix);
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&prefix);
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn apt(args: &[&str]) {
    let out = Command::new("apt-get")
        // Another apt (another test command's deps.sh, say) may hold dpkg's
        // lock for a while: wait for it rather than fail.
        .args(["-o", "DPkg::Lock::Timeout=600"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .expect("apt-get");
    assert!(
        out.status.success(),
        "apt-get {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Held while the package test has `rustkvm` installed: two test commands
/// on one machine (CI beside `scripts/test-loaded.sh`) take turns.
fn package_test_lock() -> std::fs::File {
    let path = rustkvm_tests::linux::cache_dir().join("package-test.lock");
    let f = std::fs::File::create(&path).expect("the package test's lock file");
    // SAFETY: flock on a descriptor we own; it blocks until we hold it.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {}", path.display());
    f
}

#[test]
fn the_debian_package_installs_beside_debians_qemu_runs_and_removes_cleanly() {
    let _turn = package_test_lock();
    assert!(
        !dpkg_installed("rustkvm"),
        "a rustkvm package is installed already: remove it (apt-get remove rustkvm) to run this test"
    );
    // Debian's own emulators (scripts/deps.sh installs them) stay installed
    // throughout: nothing clashes.
    for debian in ["qemu-system-x86", "qemu-system-arm"] {
        assert!(dpkg_installed(debian), "{debian} not installed");
    }
    let out = std::env::temp_dir().join(format!("rustkvm-deb-{}", std::process::id()));
    let deb = script(
        "package.sh",
        &["--no-build", "--out", out.to_str().expect("utf-8")],
    );
    let deb = deb
        .lines()
        .last()
        .expect("the .deb's path")
        .trim()
        .to_string();
    apt(&["install", "-y", "-q", &deb]);
    let listed = Command::new("dpkg")
        .args(["-L", "rustkvm"])
        .output()
        .expect("dpkg -L");
    let files: Vec<PathBuf> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    let result = std::panic::catch_unwind(|| {
        assert!(
            files.contains(&PathBuf::from("/usr/bin/rustkvm-qemu-system-x86_64")),
            "{files:?}"
        );
        guests_pass_with(Path::new("/usr/bin"));
        // The installed plugin in Debian's own QEMU (it loads into stock
        // QEMU 10.0).
        let hello = rustkvm_tests::repo_root()
            .join("tests/guests/target/x86_64-unknown-none/release/hello");
        let report = out.join("plugin.json");
        let o = Command::new("timeout")
            .args(["120", "/usr/bin/qemu-system-x86_64", "-M", "pc", "-device"])
            .arg("isa-debug-exit,iobase=0xf4,iosize=4")
            .args([
                "-nodefaults",
                "-display",
                "none",
                "-serial",
                "none",
                "-m",
                "128",
            ])
            .arg("-plugin")
            .arg(format!(
                "/usr/lib/rustkvm/librustkvm_plugin.so,outfile={}",
                report.display()
            ))
            .arg("-kernel")
            .arg(&hello)
            .output()
            .expect("stock QEMU");
        let text = std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&o.stderr)));
        assert!(text.contains("\"instructions\""), "{text}");
    });
    apt(&["remove", "--purge", "-y", "-q", "rustkvm"]);
    let _ = std::fs::remove_dir_all(&out);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert!(!dpkg_installed("rustkvm"), "still installed");
    let left: Vec<_> = files.iter().filter(|f| f.exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    for d in ["/usr/lib/rustkvm", "/usr/share/doc/rustkvm"] {
        assert!(!Path::new(d).exists(), "{d} left behind");
    }
    for debian in ["qemu-system-x86", "qemu-system-arm"] {
        assert!(dpkg_installed(debian), "{debian} removed with rustkvm");
    }
}
