#!/usr/bin/env bash
# Build Linux's KVM selftests (tools/testing/selftests/kvm) from Debian's
# linux-source-6.12, at the version of the kernel the L1 images boot
# (scripts/build-linux-guests.sh), static, for x86_64 and arm64 (cross-built
# with Debian's aarch64-linux-gnu toolchain and arm64 libc): issue 48.
#
#   scripts/build-kvm-selftests.sh [x86_64|aarch64]...   (default: both)
#
# Cached under $RUSTKVM_CACHE/kvm-selftests, rebuilt only when the source
# version or this script changes:
#   src-VERSION/            linux-source-6.12 VERSION, unpacked
#   VERSION/ARCH/bin/       one static executable per selftest
#   VERSION/ARCH/LIST       their names (the selftest's path under kvm/,
#                           e.g. x86_64/tsc_msrs_test, steal_time)
# and prints each architecture's directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

L="$RUSTKVM_CACHE/linux"
K="$RUSTKVM_CACHE/kvm-selftests"
mkdir -p "$K" "$L/debs"
arches=("$@")
[ "${#arches[@]}" -gt 0 ] || arches=(x86_64 aarch64)
for a in "${arches[@]}"; do
    case "$a" in x86_64|aarch64) ;; *) die "usage: $0 [x86_64|aarch64]..." ;; esac
done

step "the L1 kernel's version (scripts/build-linux-guests.sh)"
kdeb=$(ls "$L"/debs/linux-image-6.12.*-amd64_*_amd64.deb 2>/dev/null | sort -V | tail -n1 || true)
if [ -z "$kdeb" ]; then
    bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh"
    kdeb=$(ls "$L"/debs/linux-image-6.12.*-amd64_*_amd64.deb 2>/dev/null | sort -V | tail -n1 || true)
fi
[ -n "$kdeb" ] || die "no linux-image-6.12 .deb under $L/debs"
ver=$(dpkg-deb -f "$kdeb" Version)
ok "linux $ver"

step "build tools (make, gcc, the arm64 cross toolchain and libc)"
need=(make gcc bc flex bison rsync xz-utils)
for a in "${arches[@]}"; do
    [ "$a" = aarch64 ] && need+=(gcc-aarch64-linux-gnu libc6-dev:arm64)
done
missing=()
for p in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if printf '%s\n' "${missing[@]}" | grep -q ':arm64$' && ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64 && apt-get update -qq || die "adding Debian's arm64 architecture failed"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
fi
ok "${need[*]}"

src="$K/src-$ver"
step "linux-source-6.12 $ver"
if [ ! -f "$src/.unpacked" ]; then
    sdeb=$(ls "$L"/debs/linux-source-6.12_"${ver//:/%3a}"_all.deb 2>/dev/null | head -n1 || true)
    if [ -z "$sdeb" ]; then
        (cd "$L/debs" && apt-get download -q "linux-source-6.12=$ver" >/dev/null 2>&1) \
            || die "apt-get download linux-source-6.12=$ver failed"
        sdeb=$(ls "$L"/debs/linux-source-6.12_*_all.deb | head -n1)
    fi
    tmp="$K/unpack.$$"
    rm -rf "$tmp" "$src"
    mkdir -p "$tmp" "$src"
    dpkg-deb -x "$sdeb" "$tmp" || die "dpkg-deb -x $sdeb failed"
    tar -C "$src" --strip-components=1 -xf "$tmp"/usr/src/linux-source-6.12.tar.xz \
        || die "unpacking the kernel source failed"
    rm -rf "$tmp"
    : >"$src/.unpacked"
fi
ok "$src"

# This script's own text is part of the key: a change to how the tests are
# built builds them again.
key=$( { echo "$ver"; cat "$0"; } | sha256sum | cut -d' ' -f1)
for a in "${arches[@]}"; do
    out="$K/$ver/$a"
    case "$a" in
        x86_64) karch=x86 cross= ;;
        aarch64) karch=arm64 cross=aarch64-linux-gnu- ;;
    esac
    step "$a: the KVM selftests, static"
    if [ "$(cat "$out/.key" 2>/dev/null)" = "$key" ]; then
        ok "up to date ($(wc -l <"$out/LIST") selftests)"
        continue
    fi
    rm -rf "$out"
    mkdir -p "$out/build" "$out/bin"
    # The UAPI headers the selftests include (usr/include in the tree),
    # for this architecture.
    make -C "$src" ARCH="$karch" headers_install >"$out/headers.log" 2>&1 \
        || { tail -n 20 "$out/headers.log" >&2; die "$a: make headers_install failed (log: $out/headers.log)"; }
    make -C "$src/tools/testing/selftests/kvm" -j"$(nproc)" ARCH="$karch" \
        ${cross:+CROSS_COMPILE=$cross} LDFLAGS=-static OUTPUT="$out/build" >"$out/build.log" 2>&1 \
        || { tail -n 30 "$out/build.log" >&2; die "$a: building the selftests failed (log: $out/build.log)"; }
    # Every static executable the build made (not its objects or libraries).
    (cd "$out/build" && find . -type f -perm -u+x ! -name '*.o' ! -name '*.a' | sed 's|^\./||' | sort) >"$out/all"
    : >"$out/LIST"
    while read -r t; do
        file -b "$out/build/$t" | grep -q '^ELF .*statically linked' || continue
        mkdir -p "$out/bin/$(dirname "$t")"
        cp "$out/build/$t" "$out/bin/$t"
        echo "$t" >>"$out/LIST"
    done <"$out/all"
    rm -f "$out/all"
    [ -s "$out/LIST" ] || die "$a: the build made no static selftest (log: $out/build.log)"
    echo "$key" >"$out/.key"
    ok "$(wc -l <"$out/LIST") selftests in $out/bin"
done
for a in "${arches[@]}"; do
    echo "$K/$ver/$a"
done
