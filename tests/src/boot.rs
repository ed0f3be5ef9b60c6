//! Booting a user's kernel with a command to run (`rustkvm-linux --kernel
//! PATH --run CMD`): the architecture read from the image, a userland from
//! Debian's packages (`scripts/build-userland.sh`), the user's initramfs,
//! modules and files on top, and the command's output and exit status read
//! back from the console beside the probe's report.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::linux::{self, Config, Images, LinuxRun};
use crate::qemu::Arch;
use crate::HarnessError;

/// Line before the command's output (tests/linux/init).
pub const RUN_BEGIN: &str = "===RUSTKVM-RUN-BEGIN===";
/// Line after it, followed by ` status=N`.
pub const RUN_END: &str = "===RUSTKVM-RUN-END===";

/// x86 boot protocol: "HdrS" at offset 0x202 of a bzImage
/// (Documentation/arch/x86/boot.rst, the real-mode kernel header).
const BZIMAGE_MAGIC: (usize, &[u8]) = (0x202, b"HdrS");
/// arm64 Image header: "ARM\x64" at offset 0x38
/// (Documentation/arch/arm64/booting.rst).
const ARM64_IMAGE_MAGIC: (usize, &[u8]) = (0x38, b"ARM\x64");
/// ELF e_machine values (System V gABI): EM_X86_64, EM_AARCH64.
const EM_X86_64: u16 = 62;
/// See [`EM_X86_64`].
const EM_AARCH64: u16 = 183;

/// The architecture of a kernel image, from its header: a bzImage, an arm64
/// Image or an ELF vmlinux. Anything else is an error that says what it is.
pub fn kernel_arch(path: &Path) -> Result<Arch, HarnessError> {
    let data = std::fs::read(path).map_err(|source| HarnessError::Io {
        what: format!("reading {}", path.display()),
        source,
    })?;
    let at = |(off, magic): (usize, &[u8])| data.get(off..off + magic.len()) == Some(magic);
    if at(BZIMAGE_MAGIC) {
        return Ok(Arch::X86_64);
    }
    if at(ARM64_IMAGE_MAGIC) {
        return Ok(Arch::Aarch64);
    }
    if data.starts_with(b"\x7fELF") && data.len() > 20 {
        return match u16::from_le_bytes([data[18], data[19]]) {
            EM_X86_64 => Ok(Arch::X86_64),
            EM_AARCH64 => Ok(Arch::Aarch64),
            m => Err(usage(format!(
                "{}: an ELF for machine {m}, neither x86_64 nor aarch64",
                path.display()
            ))),
        };
    }
    let what = if data.starts_with(&[0x1f, 0x8b]) {
        "gzip-compressed (an arm64 Image.gz?): its header is inside the compression; pass --arch, or the uncompressed Image"
    } else if data.starts_with(b"MZ") && data.get(4..8) == Some(b"zimg") {
        "an EFI zboot image (vmlinuz.efi): its header is inside the compression; pass --arch, or arch/arm64/boot/Image"
    } else {
        "not a bzImage, an arm64 Image or an ELF vmlinux"
    };
    Err(usage(format!("{}: {what}", path.display())))
}

fn usage(msg: String) -> HarnessError {
    HarnessError::Usage(msg)
}

/// A newc cpio archive (the kernel's initramfs format,
/// Documentation/driver-api/early-userspace/buffer-format.rst), built in
/// memory.
#[derive(Debug, Default)]
pub struct Cpio {
    data: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, body: &[u8]) {
        self.ino += 1;
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            body.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0, // check
        );
        self.data.extend_from_slice(header.as_bytes());
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(body);
        self.pad();
    }

    fn pad(&mut self) {
        while self.data.len() % 4 != 0 {
            self.data.push(0);
        }
    }

    /// A directory (and its parents).
    pub fn dir(&mut self, path: &str) {
        let mut so_far = String::new();
        for part in path.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
            so_far.push('/');
            so_far.push_str(part);
            self.entry(&so_far, 0o040_755, &[]);
        }
    }

    /// A regular file with `mode` (permission bits), its parents made.
    pub fn file(&mut self, path: &str, perm: u32, body: &[u8]) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o100_000 | (perm & 0o7777), body);
    }

    /// A symbolic link to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.entry(path, 0o120_777, target.as_bytes());
    }

    /// Everything under host directory `src`, as `dest` in the archive
    /// (files keep their permission bits, symlinks their targets).
    pub fn tree(&mut self, src: &Path, dest: &str) -> Result<(), HarnessError> {
        let io = |what: String| move |source| HarnessError::Io { what, source };
        self.dir(dest);
        let mut entries: Vec<_> = std::fs::read_dir(src)
            .map_err(io(format!("reading {}", src.display())))?
            .collect::<Result<_, _>>()
            .map_err(io(format!("reading {}", src.display())))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let name = format!(
                "{}/{}",
                dest.trim_end_matches('/'),
                e.file_name().to_string_lossy()
            );
            let meta = std::fs::symlink_metadata(&p).map_err(io(format!("{}", p.display())))?;
            if meta.file_type().is_symlink() {
                let t = std::fs::read_link(&p).map_err(io(format!("{}", p.display())))?;
                self.symlink(&name, &t.to_string_lossy());
            } else if meta.is_dir() {
                self.tree(&p, &name)?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let body = std::fs::read(&p).map_err(io(format!("reading {}", p.display())))?;
                self.file(&name, meta.permissions().mode(), &body);
            }
        }
        Ok(())
    }

    /// The archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        while self.data.len() % 512 != 0 {
            self.data.push(0);
        }
        self.data
    }
}

/// What to boot and run, whatever the configuration.
#[derive(Debug, Clone, Default)]
pub struct BootSpec {
    /// The user's kernel.
    pub kernel: PathBuf,
    /// The user's initramfs, unpacked over ours.
    pub initrd: Option<PathBuf>,
    /// A `make modules_install INSTALL_MOD_PATH=DIR` tree (DIR holding
    /// `lib/modules/VERSION`), or a `lib/modules` or `lib/modules/VERSION`
    /// directory itself.
    pub modules: Option<PathBuf>,
    /// Host files or directories to add: (source, path in the guest).
    pub add: Vec<(PathBuf, String)>,
    /// Debian packages for the userland (`scripts/build-userland.sh`).
    pub packages: Vec<String>,
    /// The shell command to run as root.
    pub run: String,
    /// Boot it as a hypervisor ([`Images::hypervisor`]: on arm64 at EL2
    /// with a GICv3), for KVM in it (`--hypervisor`).
    pub hypervisor: bool,
    /// More kernel command line, after the harness's own (`--append`).
    pub append: String,
    /// Load the project's L1 kernel's KVM modules before `run`
    /// (`--kvm-modules`: x86's kvm_amd and what it needs, decompressed;
    /// nothing on arm64, whose KVM is built in).
    pub kvm_modules: bool,
}

/// Where `modules` puts its `lib/modules` directory in the guest.
fn modules_dest(modules: &Path) -> Result<(PathBuf, String), HarnessError> {
    if modules.join("lib/modules").is_dir() {
        return Ok((modules.join("lib/modules"), "/lib/modules".into()));
    }
    let name = modules
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    match name.as_deref() {
        Some("modules") => Ok((modules.to_path_buf(), "/lib/modules".into())),
        Some(version) if modules.join("modules.dep").exists() || modules.join("kernel").is_dir() => {
            Ok((modules.to_path_buf(), format!("/lib/modules/{version}")))
        }
        _ => Err(usage(format!(
            "--modules {}: expected a modules_install tree (DIR/lib/modules/VERSION), lib/modules or lib/modules/VERSION",
            modules.display()
        ))),
    }
}

/// The userland, the user's initramfs and an archive of the run script,
/// modules and added files, concatenated into one initramfs in `dir`.
pub fn initramfs(spec: &BootSpec, arch: Arch, dir: &Path) -> Result<PathBuf, HarnessError> {
    let script = crate::repo_root().join("scripts/build-userland.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(arch.name())
        .args(&spec.packages)
        .output()
        .map_err(|source| HarnessError::Io {
            what: format!("running {}", script.display()),
            source,
        })?;
    if !out.status.success() {
        return Err(usage(format!(
            "scripts/build-userland.sh {} {}: {}",
            arch.name(),
            spec.packages.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let userland = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim(),
    );
    let mut overlay = Cpio::default();
    let mut run = String::new();
    if spec.kvm_modules {
        let mods = dir.join("kvm-modules");
        for m in crate::nested::kvm_modules(arch, &mods)? {
            run += &format!("insmod {m} || echo 'rustkvm-linux: insmod {m} failed'\n");
        }
        if mods.is_dir() {
            overlay.tree(&mods, crate::nested::KVM_MODULES_DEST)?;
        }
    }
    run += &spec.run;
    overlay.file("/rustkvm/run.sh", 0o755, format!("{run}\n").as_bytes());
    if let Some(m) = &spec.modules {
        let (src, dest) = modules_dest(m)?;
        overlay.tree(&src, &dest)?;
    }
    for (src, dest) in &spec.add {
        if src.is_dir() {
            overlay.tree(src, dest)?;
        } else {
            use std::os::unix::fs::PermissionsExt;
            let io = |source| HarnessError::Io {
                what: format!("reading {}", src.display()),
                source,
            };
            let body = std::fs::read(src).map_err(io)?;
            let perm = std::fs::metadata(src).map_err(io)?.permissions().mode();
            overlay.file(dest, perm, &body);
        }
    }
    let path = dir.join(format!("initramfs-{}.cpio", arch.name()));
    let io = |source| HarnessError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    let mut f = std::fs::File::create(&path).map_err(io)?;
    // Each part starts on a 4-byte boundary; the kernel unpacks them in
    // order, later files replacing earlier ones.
    for part in std::iter::once(&userland).chain(spec.initrd.as_ref()) {
        let mut bytes = std::fs::read(part).map_err(|source| HarnessError::Io {
            what: format!("reading {}", part.display()),
            source,
        })?;
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        f.write_all(&bytes).map_err(io)?;
    }
    f.write_all(&overlay.finish()).map_err(io)?;
    Ok(path)
}

/// The command's output and exit status on `console`, if it ran to its end.
pub fn command_result(console: &str) -> Option<(String, i32)> {
    let console: String = console.chars().filter(|c| *c != '\r').collect();
    let start = console.find(RUN_BEGIN)? + RUN_BEGIN.len();
    let end = console[start..].find(RUN_END)? + start;
    let status = console[end + RUN_END.len()..]
        .lines()
        .next()?
        .trim()
        .strip_prefix("status=")?
        .parse()
        .ok()?;
    Some((console[start..end].trim_matches('\n').to_string(), status))
}

/// One configuration's boot of a [`BootSpec`].
#[derive(Debug)]
pub struct BootRun {
    /// The boot, with the probe's report.
    pub linux: LinuxRun,
    /// The command's output and exit status (None: it never finished).
    pub command: Option<(String, i32)>,
}

/// Boot `spec` in `config` from the concatenated `initrd`.
pub fn boot(config: Config, spec: &BootSpec, initrd: &Path, timeout: Duration) -> BootRun {
    let images = Images {
        kernel: spec.kernel.clone(),
        initrd: initrd.to_path_buf(),
        // Room for the packages' files, which live in the initramfs.
        mem_mib: if spec.packages.is_empty() { 512 } else { 2048 },
        append: if spec.append.is_empty() {
            " rustkvm.run=1".into()
        } else {
            format!(" rustkvm.run=1 {}", spec.append)
        },
        hypervisor: spec.hypervisor,
    };
    let linux = linux::run_images(config, timeout, Some(&images));
    let command = command_result(&linux.console);
    BootRun { linux, command }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_result_reads_output_and_status() {
        let c = "boot\r\n===RUSTKVM-RUN-BEGIN===\r\nhello\r\nworld\r\n===RUSTKVM-RUN-END=== status=3\r\n";
        assert_eq!(command_result(c), Some(("hello\nworld".into(), 3)));
        assert_eq!(command_result("===RUSTKVM-RUN-BEGIN===\nhalf"), None);
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut c = Cpio::default();
        c.file("/a/b", 0o644, b"xyz");
        let data = c.finish();
        assert!(data.starts_with(b"070701"));
        assert_eq!(data.len() % 512, 0);
        let text = String::from_utf8_lossy(&data);
        for name in ["a\0", "a/b\0", "TRAILER!!!\0"] {
            assert!(text.contains(name), "{name}");
        }
    }

    #[test]
    fn kernel_arch_reads_the_headers() {
        let dir = std::env::temp_dir().join(format!("rustkvm-karch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, off: usize, magic: &[u8]| {
            let mut d = vec![0u8; 0x400];
            d[off..off + magic.len()].copy_from_slice(magic);
            let p = dir.join(name);
            std::fs::write(&p, d).unwrap();
            p
        };
        assert_eq!(
            kernel_arch(&write("bz", 0x202, b"HdrS")).unwrap(),
            Arch::X86_64
        );
        assert_eq!(
            kernel_arch(&write("img", 0x38, b"ARM\x64")).unwrap(),
            Arch::Aarch64
        );
        let gz = write("gz", 0, &[0x1f, 0x8b]);
        assert!(kernel_arch(&gz).unwrap_err().to_string().contains("--arch"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
