//! Architectures, backends, variants, and the QEMU command line for a run.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;

/// Guest architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// `qemu-system-x86_64`, PC machine.
    X86_64,
    /// `qemu-system-aarch64`, virt machine.
    Aarch64,
}

impl Arch {
    /// Every architecture.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// Parse a QEMU target name.
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// QEMU target name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Rust target the guests are built for.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-none",
            Arch::Aarch64 => "aarch64-unknown-none",
        }
    }

    /// Machine, board devices and exit mechanism for the bundled guests.
    pub fn machine_args(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["-M", "pc", "-device", "isa-debug-exit,iobase=0xf4,iosize=4"],
            Arch::Aarch64 => &[
                "-M",
                "virt",
                "-cpu",
                "max",
                "-semihosting-config",
                "enable=on,target=native",
            ],
        }
    }

    /// Turn QEMU's exit status into the guest's own status, if the guest
    /// set one (x86: `isa-debug-exit` gives `(v << 1) | 1`; arm64:
    /// semihosting SYS_EXIT gives `v`).
    pub fn guest_status(self, qemu_status: i32) -> Option<u32> {
        match self {
            Arch::X86_64 if qemu_status & 1 == 1 => Some((qemu_status as u32) >> 1),
            Arch::X86_64 => None,
            Arch::Aarch64 => u32::try_from(qemu_status).ok(),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What executes the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// Plain TCG: the reference for "behaves like TCG".
    Tcg,
    /// `-accel rustkvm`: TCG with KVM's guest-visible interfaces.
    Rustkvm,
    /// `-accel rustkvm,backend=kvm`: the host's KVM runs the guest and
    /// rustkvm keeps its interface (only for guests of the host's
    /// architecture, with a usable /dev/kvm).
    Kvm,
}

impl Backend {
    /// Every backend, in table order.
    pub const ALL: [Backend; 3] = [Backend::Tcg, Backend::Rustkvm, Backend::Kvm];
    /// The emulated backends, which run on any host.
    pub const EMULATED: [Backend; 2] = [Backend::Tcg, Backend::Rustkvm];

    /// Parse a backend name.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name {
            "tcg" => Some(Backend::Tcg),
            "rustkvm" => Some(Backend::Rustkvm),
            "kvm" => Some(Backend::Kvm),
            _ => None,
        }
    }

    /// Name as on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcg => "tcg",
            Backend::Rustkvm => "rustkvm",
            Backend::Kvm => "kvm",
        }
    }

    /// The `-accel` value (without variant options). rustkvm runs with
    /// `stats=on` so the harness sees which routing points were reached.
    fn accel(self) -> &'static str {
        match self {
            Backend::Tcg => "tcg",
            Backend::Rustkvm => "rustkvm,stats=on",
            Backend::Kvm => "rustkvm,backend=kvm",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the emulator is run, orthogonal to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// QEMU's defaults (MTTCG on both targets), the guest's own `smp`.
    Default,
    /// `thread=multi` with at least 2 vCPUs.
    MttcgSmp2,
    /// `thread=single` (round-robin on one host thread) with at least 2 vCPUs.
    RrSmp2,
    /// `-icount shift=0` (which implies one TCG thread).
    Icount,
}

impl Variant {
    /// Every variant, in table order.
    pub const ALL: [Variant; 4] = [
        Variant::Default,
        Variant::MttcgSmp2,
        Variant::RrSmp2,
        Variant::Icount,
    ];

    /// Whether `backend` has this variant: the TCG threading and icount
    /// variants are TCG's; `kvm` runs the default one (with the test's
    /// vCPUs).
    pub fn applies_to(self, backend: Backend) -> bool {
        backend != Backend::Kvm || self == Variant::Default
    }

    /// Parse a variant name.
    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Default => "default",
            Variant::MttcgSmp2 => "mttcg-smp2",
            Variant::RrSmp2 => "rr-smp2",
            Variant::Icount => "icount",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Path of the patched emulator for `arch`, from `scripts/qemu-path` (the
/// one place that knows where the build lives).
pub fn emulator(arch: Arch) -> Result<PathBuf, HarnessError> {
    emulator_of(arch, None)
}

/// The emulator for guests of `arch` that runs *on* an `arch` host: this
/// machine's [`emulator`] for x86_64, the cross-built one for aarch64
/// (`RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh`): what an L1 of
/// `arch` runs its guests with ([`crate::nested`]).
pub fn native_emulator(arch: Arch) -> Result<PathBuf, HarnessError> {
    if arch.name() == std::env::consts::ARCH {
        return emulator(arch);
    }
    qemu_path(arch, |cmd| {
        cmd.env("RUSTKVM_QEMU_HOST", arch.name())
            .env_remove("RUSTKVM_QEMU_BUILD")
            .env_remove("RUSTKVM_SANITIZE");
    })
    .map_err(|_| {
        HarnessError::NotBuilt(
            PathBuf::from(format!("qemu-system-{arch} for an {arch} host")),
            "RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh",
        )
    })
}

/// [`emulator`] of QEMU `release` ("10.0", "10.2") when given: that
/// release's own build, whatever `RUSTKVM_QEMU` and `RUSTKVM_QEMU_BUILD`
/// select, unless they select that release.
fn emulator_of(arch: Arch, release: Option<&str>) -> Result<PathBuf, HarnessError> {
    let selected = std::env::var("RUSTKVM_QEMU").unwrap_or_else(|_| "10.0".into());
    qemu_path(arch, |cmd| {
        if let Some(r) = release.filter(|r| *r != selected) {
            cmd.env("RUSTKVM_QEMU", r)
                .env_remove("RUSTKVM_QEMU_BUILD")
                .env_remove("RUSTKVM_SANITIZE");
        }
    })
}

/// What `scripts/qemu-path ARCH` prints, its environment set by `env`.
fn qemu_path(arch: Arch, env: impl FnOnce(&mut Command)) -> Result<PathBuf, HarnessError> {
    let script = crate::repo_root().join("scripts").join("qemu-path");
    let mut cmd = Command::new(&script);
    env(&mut cmd);
    let out = cmd
        .arg(arch.name())
        .output()
        .map_err(|source| HarnessError::Io {
            what: format!("running {}", script.display()),
            source,
        })?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || path.as_os_str().is_empty() {
        return Err(HarnessError::NotBuilt(
            PathBuf::from(format!("qemu-system-{arch}")),
            "scripts/build-qemu.sh",
        ));
    }
    Ok(path)
}

/// Every run: no default devices, no display, the serial console on
/// stdout, exit instead of rebooting.
pub const HEADLESS: [&str; 6] = [
    "-nodefaults",
    "-display",
    "none",
    "-serial",
    "stdio",
    "-no-reboot",
];

/// One of QEMU's own test plugins (`tests/tcg/plugins/lib<name>.so`), built
/// beside the emulators by `scripts/build-qemu.sh`.
/// rustkvm's own TCG plugin, `target/{debug,release}/librustkvm_plugin.so`
/// (the newer of the two; `cargo build -p rustkvm-plugin` makes it).
pub fn rustkvm_plugin() -> Result<PathBuf, HarnessError> {
    let target = crate::repo_root().join("target");
    let newest = ["debug", "release"]
        .iter()
        .map(|p| target.join(p).join("librustkvm_plugin.so"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p);
    newest.ok_or_else(|| {
        HarnessError::NotBuilt(
            target.join("debug/librustkvm_plugin.so"),
            "cargo build -p rustkvm-plugin",
        )
    })
}

pub fn plugin(name: &str) -> Result<PathBuf, HarnessError> {
    plugin_of(name, None)
}

/// [`plugin`] from QEMU `release`'s build (see [`emulator_of`]): a plugin
/// for another QEMU of that release, whose plugin API it must match (10.2's
/// need API version 5, which 10.0 refuses).
pub fn plugin_of(name: &str, release: Option<&str>) -> Result<PathBuf, HarnessError> {
    let exe = emulator_of(Arch::X86_64, release)?;
    let path = exe
        .parent()
        .unwrap_or(Path::new("."))
        .join("tests/tcg/plugins")
        .join(format!("lib{name}.so"));
    if path.exists() {
        Ok(path)
    } else {
        Err(HarnessError::NotBuilt(path, "scripts/build-qemu.sh"))
    }
}

/// Append `-accel` properties to an argument list from [`command_args`]
/// (which puts the `-accel` value right after `-accel`).
pub fn add_accel_opts(args: &mut [String], opts: &[String]) {
    if let Some(i) = args.iter().position(|a| a == "-accel") {
        for o in opts {
            args[i + 1] = format!("{},{o}", args[i + 1]);
        }
    }
}

/// The full argument list for booting `kernel` (every run: no display, no
/// default devices, serial on stdout, no reboot, 128 MiB).
pub fn command_args(
    arch: Arch,
    backend: Backend,
    variant: Variant,
    smp: u32,
    cpu: Option<&str>,
    kernel: &Path,
) -> Vec<String> {
    let mut accel = backend.accel().to_string();
    let mut smp = smp;
    let mut extra: Vec<&str> = Vec::new();
    match variant {
        Variant::Default => {}
        Variant::MttcgSmp2 => {
            accel += ",thread=multi";
            smp = smp.max(2);
        }
        Variant::RrSmp2 => {
            accel += ",thread=single";
            smp = smp.max(2);
        }
        Variant::Icount => extra.extend(["-icount", "shift=0"]),
    }
    let mut args: Vec<String> = arch.machine_args().iter().map(|s| s.to_string()).collect();
    args.extend(
        ["-accel", &accel, "-smp", &smp.to_string(), "-m", "128"]
            .iter()
            .chain(HEADLESS.iter())
            .chain(["-kernel"].iter())
            .map(|s| s.to_string()),
    );
    args.push(kernel.display().to_string());
    // Guests read which backend runs them (per-backend tolerances).
    args.extend([
        "-fw_cfg".to_string(),
        format!("name=opt/rustkvm/backend,string={}", backend.name()),
    ]);
    let cpu = match backend {
        Backend::Kvm => crate::host::kvm_cpu(cpu),
        _ => cpu.map(str::to_string),
    };
    if let Some(cpu) = cpu {
        args.extend(["-cpu".to_string(), cpu]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_status_decoding_follows_isa_debug_exit() {
        assert_eq!(Arch::X86_64.guest_status(1), Some(0));
        assert_eq!(Arch::X86_64.guest_status(3), Some(1));
        assert_eq!(Arch::X86_64.guest_status(5), Some(2));
        assert_eq!(Arch::X86_64.guest_status(0), None, "plain QEMU exit");
        assert_eq!(Arch::Aarch64.guest_status(2), Some(2));
        assert_eq!(Arch::Aarch64.guest_status(-1), None);
    }

    #[test]
    fn variants_shape_the_command_line() {
        let k = Path::new("/k");
        let a = command_args(
            Arch::X86_64,
            Backend::Rustkvm,
            Variant::MttcgSmp2,
            1,
            Some("max"),
            k,
        );
        let s = a.join(" ");
        assert!(
            s.contains("-accel rustkvm,stats=on,thread=multi -smp 2"),
            "{s}"
        );
        let a = command_args(Arch::Aarch64, Backend::Tcg, Variant::Icount, 3, None, k);
        let s = a.join(" ");
        assert!(s.contains("-accel tcg -smp 3"), "{s}");
        assert!(
            s.ends_with("-kernel /k -fw_cfg name=opt/rustkvm/backend,string=tcg -icount shift=0"),
            "{s}"
        );
        assert!(s.starts_with("-M virt -cpu max"), "{s}");
    }

    #[test]
    fn names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()), Some(a));
        }
        for b in Backend::ALL {
            assert_eq!(Backend::from_name(b.name()), Some(b));
        }
        for v in Variant::ALL {
            assert_eq!(Variant::from_name(v.name()), Some(v));
        }
    }
}
