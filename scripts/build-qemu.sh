#!/usr/bin/env bash
# Build rustkvm's patched QEMU (qemu-system-x86_64 and qemu-system-aarch64)
# with the Rust accelerator library linked in.
#
#   scripts/build-qemu.sh            fetch, patch, configure (when needed), build
#   RUSTKVM_QEMU=10.2 scripts/build-qemu.sh
#                                    the same for QEMU 10.2.2 (default: 10.0,
#                                    Debian 13's; scripts/lib.sh qemu_release)
#   RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh
#                                    qemu-system-aarch64 for an arm64 host,
#                                    cross-built (Debian's aarch64-linux-gnu
#                                    toolchain, arm64 multiarch libraries, the
#                                    library for aarch64-unknown-linux-gnu):
#                                    the arm64 L1's QEMU (docs/nested.md)
#
# Everything lives under $RUSTKVM_CACHE (default /var/cache/rustkvm), outside the
# clone, so every clone shares one source tree, one build directory and one ccache
# per release:
#   src/                 Debian's qemu source packages (orig tarball, debian/ tarball)
#   qemu/src/            10.0: the upstream tree with qemu-patches/ applied
#   qemu/build/          10.0: the meson/ninja build directory
#   qemu/build-aarch64-host/  10.0 built to run on arm64 (RUSTKVM_QEMU_HOST)
#   qemu-10.2/{src,build}/  the same for 10.2
#   ccache/              the compiler cache
# Nothing is rebuilt when nothing changed; a Rust-only change just relinks.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bash "$RUSTKVM_ROOT/scripts/deps.sh"

release=$(qemu_release)
QDIR=$(qemu_dir)
host=$(qemu_host)
# RUSTKVM_QEMU_SRC: another patched source tree (with RUSTKVM_QEMU_BUILD, a
# private pair: a clone at other patches builds there without rewriting the
# shared tree under a test run of another clone).
QSRC="${RUSTKVM_QEMU_SRC:-$QDIR/src}"
# RUSTKVM_QEMU_BUILD: another build directory (scripts/bench-build.sh uses one).
# RUSTKVM_SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer build
# (QEMU's --enable-asan --enable-ubsan) in its own directory, qemu/build-san
# (scripts/sanitize.sh; scripts/qemu-path finds it under the same variable).
if [ "$host" = aarch64 ]; then
    [ "${RUSTKVM_SANITIZE:-0}" = 1 ] && die "RUSTKVM_SANITIZE=1 builds for this host only, not with RUSTKVM_QEMU_HOST=aarch64"
    QBUILD="${RUSTKVM_QEMU_BUILD:-$QDIR/build-aarch64-host}"
elif [ "${RUSTKVM_SANITIZE:-0}" = 1 ]; then
    QBUILD="${RUSTKVM_QEMU_BUILD:-$QDIR/build-san}"
else
    QBUILD="${RUSTKVM_QEMU_BUILD:-$QDIR/build}"
fi
mkdir -p "$QDIR" "$RUSTKVM_CACHE/src" "$(dirname "$QBUILD")"
qemu_ccache_env
# One build at a time per source tree and build directory: two clones (a
# CI run beside a test run) would otherwise patch, configure and link over
# each other.
exec 8>"$QSRC.lock" 9>"$QBUILD.lock"
flock 8
flock 9

# ---------------------------------------------------------------- source
step "QEMU $release source from Debian (apt-get source qemu)"
orig=$(qemu_orig)
ver=$(basename "$orig" | sed -E 's/^qemu_([0-9.]+)\+ds\.orig\.tar\.xz$/\1/')
case "$ver" in
    "$release".*) ok "upstream QEMU $ver ($(basename "$orig"))" ;;
    *) die "Debian's source package is QEMU $ver; RUSTKVM_QEMU asks for $release" ;;
esac

# ---------------------------------------------------------------- patches
step "apply qemu-patches/*.patch"
# Debian's own build fixes for its blob-less tarball first (not part of
# the series), then the series; a release's own versions of a patch
# replace the shared one (scripts/lib.sh qemu_patches).
qemu_ports_check
mapfile -t patches < <(qemu_patches)
shared=("$RUSTKVM_ROOT"/qemu-patches/debian/*.patch "$RUSTKVM_ROOT"/qemu-patches/*.patch)
[ "${#patches[@]}" -ge "${#shared[@]}" ] || die "qemu_patches listed ${#patches[@]} patches, fewer than qemu-patches/ holds"
key=$( { basename "$orig"; cat "${patches[@]}"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$QSRC.key" 2>/dev/null)" != "$key" ]; then
    tmp="$QSRC.new"
    rm -rf "$tmp"; mkdir -p "$tmp"
    tar --no-same-owner -C "$tmp" -xf "$orig" || die "cannot unpack $orig"
    top="$tmp/qemu-$ver"
    [ -d "$top" ] || die "unexpected layout in $orig (no qemu-$ver/)"
    for p in "${patches[@]}"; do
        qemu_apply "$top" "$p" >"$tmp/patch.log" 2>&1 \
            || { cat "$tmp/patch.log" >&2; die "patch $(basename "$p") does not apply to QEMU $ver"; }
    done
    # Copy only what differs, so unchanged files keep their mtimes and ninja rebuilds
    # just what a patch touched.
    mkdir -p "$QSRC"
    rsync -rlc --delete "$top/" "$QSRC/" \
        || die "rsync into $QSRC failed"
    rm -rf "$tmp"
    echo "$key" > "$QSRC.key"
    ok "patched tree at $QSRC"
else
    ok "patched tree up to date"
fi

# ---------------------------------------------------------------- rust
# The sanitizer build links a library with debug assertions (the callbacks'
# lock rules, ffi.rs HostMemory) and overflow checks on, built apart so the
# release library stays as it is.
if [ "${RUSTKVM_SANITIZE:-0}" = 1 ]; then
    step "cargo build --release with debug assertions and overflow checks (rustkvm accelerator library)"
    lib_target="$RUSTKVM_ROOT/target/checked"
    (cd "$RUSTKVM_ROOT" && CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
        CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true \
        cargo build --release --quiet -p rustkvm-accel --target-dir "$lib_target") \
        || die "cargo build failed"
    lib_src="$lib_target/release/librustkvm_accel.a"
elif [ "$host" = aarch64 ]; then
    step "cargo build --release --target aarch64-unknown-linux-gnu (rustkvm accelerator library for an arm64 host)"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-accel --target aarch64-unknown-linux-gnu) \
        || die "cargo build --target aarch64-unknown-linux-gnu failed"
    lib_src="$RUSTKVM_ROOT/target/aarch64-unknown-linux-gnu/release/librustkvm_accel.a"
else
    step "cargo build --release (rustkvm accelerator library)"
    lib_target="$RUSTKVM_ROOT/target"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-accel) || die "cargo build failed"
    lib_src="$lib_target/release/librustkvm_accel.a"
fi
mkdir -p "$QBUILD/rustkvm"
lib_dst="$QBUILD/rustkvm/librustkvm_accel.a"
# Copy only on change: ninja relinks when this file's mtime moves. Two
# clones of one commit build libraries that differ only in the paths
# compiled into them; a copy would relink QEMU while the other clone's
# tests start it (a half-written emulator). So what counts is what the
# library is built from: the toolchain and the accel crate's sources.
lib_key() {
    (
        cd "$RUSTKVM_ROOT" || exit 1
        rustc -V
        echo "sanitize=${RUSTKVM_SANITIZE:-0} host=$host"
        git rev-parse HEAD:accel HEAD:Cargo.lock HEAD:Cargo.toml || exit 1
        git diff HEAD -- accel Cargo.lock Cargo.toml
        git ls-files --others --exclude-standard -- accel | sort | xargs -r sha256sum
    ) 2>/dev/null | sha256sum | cut -d' ' -f1
}
libkey=$(set -o pipefail; lib_key) || libkey="no-git-$(sha256sum <"$lib_src" | cut -d' ' -f1)"
if [ -f "$lib_dst" ] && [ "$(cat "$lib_dst.key" 2>/dev/null)" = "$libkey" ]; then
    ok "library up to date (the same sources as the one QEMU is linked with)"
elif ! cmp -s "$lib_src" "$lib_dst"; then
    cp "$lib_src" "$lib_dst.new" && mv "$lib_dst.new" "$lib_dst"
fi
echo "$libkey" >"$lib_dst.key"

check_series_header "$QSRC/include/system/rustkvm-abi.h"

# ---------------------------------------------------------------- configure
if [ "$host" = aarch64 ]; then
    # Debian's pkgconf has no aarch64-linux-gnu wrapper: one that reads
    # the arm64 multiarch .pc files only.
    pc="$QBUILD/aarch64-linux-gnu-pkg-config"
    printf '%s\n' '#!/bin/sh' \
        'PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig exec pkg-config "$@"' >"$pc.new"
    chmod +x "$pc.new" && mv "$pc.new" "$pc"
    export PKG_CONFIG="$pc"
    fdt="$RUSTKVM_CACHE/arm64-libfdt"
    CONFIGURE_ARGS=(
        "${QEMU_CROSS_AARCH64_ARGS[@]}"
        "--extra-cflags=-I$fdt/usr/include" "--extra-ldflags=-L$fdt/usr/lib/aarch64-linux-gnu"
        -Drustkvm=enabled "-Drustkvm_lib=$lib_dst"
    )
    targets=(qemu-system-aarch64)
else
    CONFIGURE_ARGS=(
        "${QEMU_CONFIGURE_ARGS[@]}"
        -Drustkvm=enabled "-Drustkvm_lib=$lib_dst"
    )
    targets=(qemu-system-x86_64 qemu-system-aarch64 tests/tcg/plugins/libinsn.so tests/tcg/plugins/libbb.so)
fi
if [ "${RUSTKVM_SANITIZE:-0}" = 1 ]; then
    CONFIGURE_ARGS+=(--enable-asan --enable-ubsan)
fi
cfgkey=$(printf '%s\n' "$ver" "${CONFIGURE_ARGS[@]}" | sha256sum | cut -d' ' -f1)
step "configure QEMU"
if [ ! -f "$QBUILD/build.ninja" ] || [ "$(cat "$QBUILD/configure.key" 2>/dev/null)" != "$cfgkey" ]; then
    rm -f "$QBUILD/configure.key"
    (cd "$QBUILD" && "$QSRC/configure" "${CONFIGURE_ARGS[@]}" >configure.log 2>&1) \
        || { tail -n 30 "$QBUILD/configure.log" >&2; die "QEMU configure failed (log: $QBUILD/configure.log)"; }
    echo "$cfgkey" > "$QBUILD/configure.key"
    ok "configured ($QBUILD)"
else
    ok "configuration up to date"
fi

# ---------------------------------------------------------------- build
step "ninja ${targets[*]}"
ninja -C "$QBUILD" -j"$(nproc)" "${targets[@]}" >"$QBUILD/ninja.log" 2>&1 \
    || { grep -E 'error|FAILED' -A5 "$QBUILD/ninja.log" | head -n 60 >&2; die "QEMU build failed (log: $QBUILD/ninja.log)"; }
if [ "$host" = aarch64 ]; then
    # It cannot run here: check what it is and what it needs instead.
    exe="$QBUILD/qemu-system-aarch64"
    aarch64-linux-gnu-readelf -h "$exe" | grep -q 'Machine:.*AArch64' || die "$exe is not an arm64 executable"
    # (grep -c, not -q: an early grep exit would fail nm under pipefail)
    [ "$(aarch64-linux-gnu-nm "$exe" | grep -c ' T rustkvm_arm_')" -gt 0 ] \
        || die "$exe has no rustkvm library linked in"
    ok "$exe (arm64; libraries: $(aarch64-linux-gnu-readelf -d "$exe" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' '))"
    exit 0
fi
# Run from the build directory, QEMU looks for its data and firmware under
# build/qemu-bundle/<configured path>: point those at Debian's firmware packages
# (seabios, qemu-system-data, ipxe-qemu) so no -L is needed.
for fw in /usr/share/qemu /usr/share/seabios /usr/lib/ipxe/qemu; do
    link="$QBUILD/qemu-bundle$fw"
    [ -L "$link" ] && continue
    [ -e "$link" ] && die "$link exists and is not a symlink to $fw"
    mkdir -p "$(dirname "$link")" && ln -s "$fw" "$link"
done
for arch in x86_64 aarch64; do
    "$QBUILD/qemu-system-$arch" -accel help 2>/dev/null | grep -qx rustkvm \
        || die "$QBUILD/qemu-system-$arch does not list the rustkvm accelerator"
    ok "$QBUILD/qemu-system-$arch"
done
