#!/usr/bin/env bash
# Build rustkvm's Debian package: what scripts/install.sh installs, under
# /usr, with its dependencies on Debian's library and firmware packages.
#
#   scripts/package.sh [--no-build] [--out DIR]
#
# Prints the path of the .deb (default DIR: $RUSTKVM_CACHE/package). Install
# it beside Debian's QEMU with `apt-get install ./rustkvm_*.deb`; nothing in
# it clashes with qemu-system-x86 or qemu-system-arm (its emulators are
# /usr/bin/rustkvm-qemu-system-{x86_64,aarch64}, its plugin
# /usr/lib/rustkvm/librustkvm_plugin.so, its docs /usr/share/doc/rustkvm).
# Depends: what dpkg-shlibdeps finds the binaries linked against, plus the
# firmware the emulators load (seabios, ipxe-qemu, qemu-system-data: Debian's
# QEMU data, not its emulators). Version: the workspace's version and the
# QEMU release it is built on, e.g. 0.1.0+qemu10.0.2.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

build=--build
out="$RUSTKVM_CACHE/package"
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=--no-build; shift ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
for p in dpkg-dev binutils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null \
        || die "apt-get install $p failed"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/rustkvm-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
if [ "$build" = --build ]; then
    bash "$RUSTKVM_ROOT/scripts/install.sh" --prefix /usr --destdir "$stage"
else
    bash "$RUSTKVM_ROOT/scripts/install.sh" --no-build --prefix /usr --destdir "$stage"
fi

step "Debian package metadata"
rust_version=$(awk -F'"' '/^version *=/ { print $2; exit }' "$RUSTKVM_ROOT/Cargo.toml")
qemu_orig=$(qemu_orig_cached)
qemu_version=$(basename "$qemu_orig" | sed -E 's/^qemu_([0-9.]+)\+ds\.orig\.tar\.xz$/\1/')
version="$rust_version+qemu$qemu_version"
arch=$(dpkg --print-architecture)

# dpkg-shlibdeps wants a source tree's debian/control around it.
mkdir -p "$work/src/debian"
printf 'Source: rustkvm\n\nPackage: rustkvm\nArchitecture: any\n' > "$work/src/debian/control"
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O \
    -e"$stage/usr/bin/rustkvm-qemu-system-x86_64" \
    -e"$stage/usr/bin/rustkvm-qemu-system-aarch64" \
    -e"$stage/usr/lib/rustkvm/librustkvm_plugin.so" 2>"$work/shlibdeps.err") \
    || { cat "$work/shlibdeps.err" >&2; die "dpkg-shlibdeps failed"; }
shlibs=${shlibs#shlibs:Depends=}
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no libraries"

mkdir -p "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<EOF
Package: rustkvm
Version: $version
Architecture: $arch
Maintainer: rustkvm maintainers <rustkvm@localhost>
Installed-Size: $size
Depends: $shlibs, seabios, ipxe-qemu, qemu-system-data (>= 1:10.0)
Recommends: qemu-efi-aarch64
Section: misc
Priority: optional
Homepage: https://localhost/rustkvm
Description: QEMU with -accel rustkvm: KVM's guest view on TCG
 rustkvm-qemu-system-x86_64 and rustkvm-qemu-system-aarch64 are QEMU
 $qemu_version with the rustkvm accelerator: guests run on TCG but see what a
 KVM guest on real hardware sees (a virtual PMU, steal time with the vCPU
 preempted hint, KVM hypercalls, kvmclock, KVM's timer semantics). Also the
 rustkvm TCG plugin for exact instruction and counter tracing, which loads
 into Debian's own QEMU too. Installs beside Debian's qemu-system-* packages.
EOF
(cd "$stage" && find usr -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum) > "$stage/DEBIAN/md5sums"

step "dpkg-deb --build"
mkdir -p "$out"
deb="$out/rustkvm_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip --build "$stage" "$deb" >/dev/null || die "dpkg-deb failed"
ok "Depends: $shlibs, seabios, ipxe-qemu, qemu-system-data (>= 1:10.0)"
echo "$deb"
