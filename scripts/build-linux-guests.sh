#!/usr/bin/env bash
# Build the Linux guest images: Debian's 6.12 kernels (bookworm-backports,
# amd64 and arm64) and an initramfs per architecture with busybox-static and
# rustkvm-probe. Everything is cached under $RUSTKVM_CACHE/linux and rebuilt
# only when an input changes:
#   linux/debs/                     the downloaded .debs (first fetched stays)
#   linux/<arch>/vmlinuz            the kernel
#   linux/<arch>/kernel/            its package unpacked (boot/, lib/modules/)
#   linux/<arch>/initramfs-KEY.cpio.gz  busybox + /init + /rustkvm-probe, KEY
#                                   from those inputs: clones at other commits
#                                   (two test commands at once) keep their own
#   linux/<arch>/initramfs.cpio.gz  a link to the last one built
# and, in the clone, target/linux-images/<arch>.initrd: the path of this
# clone's initramfs, which the runners read (tests/src/linux.rs).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

L="$RUSTKVM_CACHE/linux"
mkdir -p "$L/debs"

step "Debian arm64 packages available (dpkg --add-architecture arm64)"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
    apt-get update -qq || die "apt-get update failed"
fi
for p in cpio gzip kmod; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null || die "apt-get install $p failed"
done
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    rustup target list --installed | grep -qx "$t" || rustup target add "$t" || die "rustup target add $t failed"
done

# fetch DEBARCH PATTERN-GLOB APT-NAME: the cached .deb, or download APT-NAME.
fetch() {
    local have
    have=$(ls "$L"/debs/$2 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$have" ]; then
        (cd "$L/debs" && apt-get download -q "$3" >/dev/null 2>&1) || die "apt-get download $3 failed"
        have=$(ls "$L"/debs/$2 2>/dev/null | sort -V | tail -n1 || true)
        [ -n "$have" ] || die "apt-get download $3 left no $2"
    fi
    echo "$have"
}
# The versioned kernel package the backports meta package points at.
kernel_pkg() {
    apt-cache depends -t bookworm-backports "linux-image-$1${2:+:$2}" 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ && !p { sub(":.*", "", $2); p = $2 } END { print p }'
}

build_arch() {
    local arch=$1 debarch=$2 rust=$3 out="$L/$1"
    mkdir -p "$out"
    step "$arch: kernel and busybox-static from Debian"
    local kdeb bdeb
    kdeb=$(ls "$L"/debs/linux-image-6.12.*-"$debarch"_*_"$debarch".deb 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$kdeb" ]; then
        local pkg
        pkg=$(kernel_pkg "$debarch" "$([ "$debarch" = arm64 ] && echo arm64)")
        [ -n "$pkg" ] || die "no 6.12 kernel package for $debarch in bookworm-backports"
        kdeb=$(fetch "$debarch" "${pkg}_*_${debarch}.deb" "$pkg:$debarch")
    fi
    bdeb=$(fetch "$debarch" "busybox-static_*_${debarch}.deb" "busybox-static:$debarch")
    if [ ! -f "$out/vmlinuz" ] || [ "$(cat "$out/vmlinuz.src" 2>/dev/null)" != "$(basename "$kdeb")" ]; then
        rm -rf "$out/kx" && mkdir -p "$out/kx"
        dpkg-deb --fsys-tarfile "$kdeb" | tar -x -C "$out/kx" --wildcards './boot/vmlinuz-*' \
            || die "cannot unpack $kdeb"
        mv "$out"/kx/boot/vmlinuz-* "$out/vmlinuz" && rm -rf "$out/kx"
        basename "$kdeb" > "$out/vmlinuz.src"
    fi
    ok "$(cat "$out/vmlinuz.src")"
    # The whole package, for runners that load the kernel's modules
    # (virtme-ng: tests/tests/vng.rs, docs/boot.md).
    if [ "$(cat "$out/kernel.src" 2>/dev/null)" != "$(basename "$kdeb")" ]; then
        rm -rf "$out/kernel" "$out/kernel.src" && mkdir -p "$out/kernel"
        dpkg-deb -x "$kdeb" "$out/kernel" || die "cannot unpack $kdeb"
        basename "$kdeb" > "$out/kernel.src"
    fi
    # The package ships no modules.dep (its postinst runs depmod): make it,
    # for modprobe in the nested L1 (tests/src/nested.rs) and virtme-ng.
    local kver
    for kver in "$out"/kernel/lib/modules/*/; do
        kver=$(basename "$kver")
        [ -f "$out/kernel/lib/modules/$kver/modules.dep" ] \
            || depmod -b "$out/kernel" "$kver" || die "depmod -b $out/kernel $kver failed"
    done

    step "$arch: rustkvm-probe ($rust)"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-probe --target "$rust") \
        || die "building rustkvm-probe for $rust failed"
    local probe="$RUSTKVM_ROOT/target/$rust/release/rustkvm-probe"

    step "$arch: initramfs"
    local key
    key=$( { basename "$bdeb"; sha256sum < "$probe"; sha256sum < "$RUSTKVM_ROOT/tests/linux/init"; } | sha256sum | cut -d' ' -f1)
    local initrd="$out/initramfs-${key:0:16}.cpio.gz"
    if [ ! -f "$initrd" ]; then
        # (Per process: two test commands at once may both rebuild it.)
        local root="$out/root.$$"
        rm -rf "$root" && mkdir -p "$root"/{bin,proc,sys,dev,tmp}
        dpkg-deb --fsys-tarfile "$bdeb" | tar -x -O ./bin/busybox > "$root/bin/busybox" \
            || die "cannot unpack busybox from $bdeb"
        chmod 755 "$root/bin/busybox"
        install -m 755 "$RUSTKVM_ROOT/tests/linux/init" "$root/init"
        install -m 755 "$probe" "$root/rustkvm-probe"
        (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -9n) > "$initrd.new.$$" \
            || die "cpio failed"
        mv "$initrd.new.$$" "$initrd"
        rm -rf "$root"
    fi
    ln -sfn "$(basename "$initrd")" "$out/initramfs.cpio.gz.$$" && mv -T "$out/initramfs.cpio.gz.$$" "$out/initramfs.cpio.gz"
    mkdir -p "$RUSTKVM_ROOT/target/linux-images"
    echo "$initrd" > "$RUSTKVM_ROOT/target/linux-images/$arch.initrd"
    ok "$out/vmlinuz, $initrd"
}

# One architecture failing (a download, say) does not stop the other; the
# runner then reports the missing one as ERROR.
failed=()
(build_arch x86_64 amd64 x86_64-unknown-linux-musl) || failed+=(x86_64)
(build_arch aarch64 arm64 aarch64-unknown-linux-musl) || failed+=(aarch64)
[ ${#failed[@]} -eq 0 ] || { echo "rustkvm: Linux guest images not built for: ${failed[*]}" >&2; exit 1; }
