#!/usr/bin/env bash
# Build a guest userland initramfs for `rustkvm-linux --kernel`: busybox,
# rustkvm-probe, the project's /init, and Debian packages for the guest's
# architecture with their dependencies, unpacked (no maintainer scripts run).
#
#   scripts/build-userland.sh ARCH [PACKAGE...]      ARCH: x86_64 | aarch64
#   scripts/build-userland.sh --vng-root ARCH [PACKAGE...]
#
# Prints the path of the initramfs (cpio, gzip). With --vng-root it builds a
# root directory for virtme-ng instead (`vng --arch arm64 --root DIR`,
# docs/boot.md): the packages plus what vng's shell init runs (bash, mount,
# udev, ...), /bin/sh, a root account, and prints its path. Cached under
# $RUSTKVM_CACHE/linux/userland/, keyed by the architecture, the package
# list, /init and the probe: a second call with the same inputs is instant.
# Without packages it is scripts/build-linux-guests.sh's initramfs. Packages
# come from this machine's apt sources (Debian 12: e.g. linux-perf gives
# /usr/bin/perf), resolved and unpacked by mmdebstrap's `extract` variant;
# documentation, manual pages and translations are left out.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

vng_root=0
if [ "${1:-}" = --vng-root ]; then vng_root=1; shift; fi
arch=${1:?usage: scripts/build-userland.sh [--vng-root] x86_64|aarch64 [PACKAGE...]}
shift
case "$arch" in
    x86_64) debarch=amd64; rust=x86_64-unknown-linux-musl ;;
    aarch64) debarch=arm64; rust=aarch64-unknown-linux-musl ;;
    *) die "unknown architecture $arch (x86_64 or aarch64)" ;;
esac
if [ $# -eq 0 ] && [ "$vng_root" = 0 ]; then
    # This clone's (rebuilt only when /init or the probe changed).
    bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh" >&2 || die "scripts/build-linux-guests.sh failed"
    base=$(cat "$RUSTKVM_ROOT/target/linux-images/$arch.initrd")
    echo "$base"
    exit 0
fi
for p in "$@"; do
    case "$p" in
        *[!a-z0-9.+-]*|"") die "not a Debian package name: '$p'" ;;
    esac
done

step "$arch userland: busybox-static $* (Debian $debarch)"
# (scripts/deps.sh installs them; run alone, this script does, waiting for
# dpkg's lock: two tests may build userlands at once.)
for p in mmdebstrap cpio gzip; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "$p" >/dev/null \
        || die "apt-get install $p failed"
done
(cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-probe --target "$rust") \
    || die "building rustkvm-probe for $rust failed"
probe="$RUSTKVM_ROOT/target/$rust/release/rustkvm-probe"
init="$RUSTKVM_ROOT/tests/linux/init"
# What virtme-ng's bash init (virtme/guest/virtme-init) runs in a foreign
# architecture's root.
vng_pkgs=()
[ "$vng_root" = 1 ] && vng_pkgs=(bash coreutils mount util-linux udev kmod grep sed findutils)
pkgs=$(printf '%s\n' busybox-static "${vng_pkgs[@]}" "$@" | LC_ALL=C sort -u | paste -sd, -)
key=$( { echo "$debarch $pkgs $vng_root"; sha256sum < "$probe"; sha256sum < "$init"; sha256sum < "$0"; } | sha256sum | cut -c1-16)
out="$RUSTKVM_CACHE/linux/userland/$arch-$key.cpio.gz"
[ "$vng_root" = 1 ] && out="$RUSTKVM_CACHE/linux/userland/$arch-vng-$key"
if [ -e "$out" ]; then
    ok "cached: $out"
    echo "$out"
    exit 0
fi
mkdir -p "$(dirname "$out")"
work=$(mktemp -d "${TMPDIR:-/tmp}/rustkvm-userland.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
mmdebstrap --quiet --variant=extract --include="$pkgs" --architectures="$debarch" \
    --skip=essential/unlink --format=directory bookworm "$root" >"$work/mmdebstrap.log" 2>&1 \
    || { tail -n 20 "$work/mmdebstrap.log" >&2; die "mmdebstrap could not fetch or unpack: $pkgs"; }
rm -rf "$root"/usr/share/{doc,man,info,locale} "$root"/var/cache/apt "$root"/var/lib/apt/lists
mkdir -p "$root"/{proc,sys,dev,tmp,root}
install -m 755 "$init" "$root/init"
install -m 755 "$probe" "$root/rustkvm-probe"
if [ "$vng_root" = 1 ]; then
    # What the maintainer scripts the extract variant skips would have made,
    # as far as vng's init needs it.
    ln -sf bash "$root/bin/sh"
    mkdir -p "$root"/{run,sbin,etc/lvm}
    printf 'root:x:0:0:root:/root:/bin/bash\n' > "$root/etc/passwd"
    printf 'root::0:0:99999:7:::\n' > "$root/etc/shadow"
    printf 'root:x:0:\n' > "$root/etc/group"
    for a in poweroff ip; do ln -sf /bin/busybox "$root/sbin/$a"; done
    rm -rf "$out.new.$$" && mv "$root" "$out.new.$$" && mv "$out.new.$$" "$out"
    ok "$out ($(du -sh "$out" | cut -f1))"
    echo "$out"
    exit 0
fi
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1n) > "$out.new.$$" \
    || die "cpio failed"
mv "$out.new.$$" "$out"
ok "$out ($(du -h "$out" | cut -f1), unpacked $(du -sh "$root" | cut -f1))"
echo "$out"
