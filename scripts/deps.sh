#!/usr/bin/env bash
# Install everything rustkvm needs on a Debian 12 machine (as root): apt sources,
# build dependencies for QEMU, firmware packages, Rust targets.
# Idempotent: a second run with everything present takes a second or two.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

step "apt sources (deb-src trixie for QEMU 10.0, bookworm-backports for meson)"
SRC=/etc/apt/sources.list.d/rustkvm.sources
want_src='Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg'
stamp="$RUSTKVM_CACHE/apt-updated"
if [ ! -f "$SRC" ] || [ "$(cat "$SRC")" != "$want_src" ]; then
    printf '%s\n' "$want_src" > "$SRC"
    rm -f "$stamp"
fi

PKGS=(
    build-essential git pkg-config ninja-build ccache flex bison
    python3 python3-venv python3-pip python3-setuptools python3-wheel
    libglib2.0-dev libpixman-1-dev libslirp-dev libfdt-dev libcapstone-dev
    zlib1g-dev libzstd-dev dpkg-dev xz-utils rsync libclang-dev
    seabios qemu-system-data ipxe-qemu qemu-efi-aarch64 qemu-utils
    gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu
    linux-perf busybox-static kmod udev
    mmdebstrap cpio gzip
)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
meson_ok() {
    local v
    v=$(/usr/bin/python3 -c 'import mesonbuild.coredata as c; print(c.version)' 2>/dev/null) || return 1
    dpkg --compare-versions "$v" ge 1.5
}
if [ ${#missing[@]} -gt 0 ] || ! meson_ok || [ ! -f "$stamp" ]; then
    step "apt-get update"
    apt-get update -qq || die "apt-get update failed"
    touch "$stamp"
fi
if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        || die "apt-get install failed for: ${missing[*]}"
fi
if ! meson_ok; then
    step "meson >= 1.5 from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports meson \
        || die "could not install meson from bookworm-backports"
    meson_ok || die "meson >= 1.5 still not importable by /usr/bin/python3"
fi

# Debian's stock QEMU 10.0 (bookworm-backports): the TCG plugin is tested in
# it too. /usr/bin/qemu-system-* only; rustkvm's own build is separate.
stock_ok() {
    local v
    for e in qemu-system-x86_64 qemu-system-aarch64; do
        v=$(/usr/bin/$e --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
        [[ "$v" == 10.0.* ]] || return 1
    done
}
if ! stock_ok; then
    step "stock QEMU 10.0 from bookworm-backports (TCG plugin tests)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
        qemu-system-x86 qemu-system-arm \
        || die "could not install qemu-system-x86/qemu-system-arm from bookworm-backports"
    stock_ok || die "/usr/bin/qemu-system-{x86_64,aarch64} are not QEMU 10.0.x after installing them"
fi

# From PyPI, in a venv of the cache: a real JUnit consumer for the tests of
# the runners' --junit output (tests/tests/junit.rs), and virtme-ng, the
# kernel developers' runner, booted on our QEMU (tests/tests/vng.rs; it runs
# the host's own perf and busybox, linux-perf and busybox above).
venv="$RUSTKVM_CACHE/venv"
VNG_VERSION=1.42
if ! "$venv/bin/python" -c 'import junitparser' 2>/dev/null \
    || [ "$("$venv/bin/vng" --version 2>/dev/null | awk '{print $2}')" != "$VNG_VERSION" ]; then
    step "python venv with junitparser and virtme-ng $VNG_VERSION (PyPI)"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv" || die "python3 -m venv failed"
    "$venv/bin/pip" install --quiet --disable-pip-version-check junitparser "virtme-ng==$VNG_VERSION" \
        || die "pip install junitparser virtme-ng failed"
fi

step "Rust targets and components"
need_targets=(x86_64-unknown-none aarch64-unknown-none)
installed=$(rustup target list --installed)
for t in "${need_targets[@]}"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t" || die "rustup target add $t failed"
done
if [ "${RUSTKVM_QEMU_HOST:-x86_64}" = aarch64 ]; then
    # QEMU for an arm64 host (build-qemu.sh): the Rust library's target,
    # arm64 multiarch -dev packages beside the amd64 ones, and libfdt,
    # whose -dev package is not co-installable across architectures:
    # its arm64 package unpacked into the cache, linked statically.
    grep -qx aarch64-unknown-linux-gnu <<<"$installed" || rustup target add aarch64-unknown-linux-gnu \
        || die "rustup target add aarch64-unknown-linux-gnu failed"
    dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64 \
        || die "dpkg --add-architecture arm64 failed"
    arm=(libglib2.0-dev:arm64 libpixman-1-dev:arm64 zlib1g-dev:arm64 libc6-dev:arm64)
    missing=()
    for p in "${arm[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        step "apt-get install ${missing[*]} (arm64 multiarch)"
        apt-get update -qq || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
            || die "apt-get install failed for: ${missing[*]}"
    fi
    fdt="$RUSTKVM_CACHE/arm64-libfdt"
    if [ ! -f "$fdt/usr/lib/aarch64-linux-gnu/libfdt.a" ]; then
        step "libfdt-dev:arm64, unpacked into $fdt"
        tmp=$(mktemp -d)
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root libfdt-dev:arm64) || die "apt-get download libfdt-dev:arm64 failed"
        rm -rf "$fdt.new" && mkdir -p "$fdt.new"
        dpkg-deb -x "$tmp"/libfdt-dev_*_arm64.deb "$fdt.new" || die "cannot unpack libfdt-dev:arm64"
        # The static library only: no libfdt.so for the L1 to carry.
        rm -f "$fdt.new"/usr/lib/aarch64-linux-gnu/libfdt.so*
        rm -rf "$tmp" "$fdt" && mv "$fdt.new" "$fdt"
    fi
fi
comps=$(rustup component list --installed)
for c in clippy rustfmt; do
    grep -q "^$c" <<<"$comps" || rustup component add "$c" || die "rustup component add $c failed"
done
ok "dependencies present"
