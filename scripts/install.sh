#!/usr/bin/env bash
# Install rustkvm: both emulators, the TCG plugin and the docs, under names
# that never clash with Debian's own QEMU.
#
#   scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build]
#   scripts/install.sh --uninstall [--prefix DIR]
#
#   PREFIX/bin/rustkvm-qemu-system-x86_64     QEMU 10.0 with -accel rustkvm
#   PREFIX/bin/rustkvm-qemu-system-aarch64
#   PREFIX/lib/rustkvm/librustkvm_plugin.so   the TCG plugin (docs/plugin.md;
#                                             it also loads into Debian's QEMU)
#   PREFIX/share/doc/rustkvm/                 README.md, COPYING, docs/*.md
#   PREFIX/share/rustkvm/installed-files      what this script installed
#                                             (read by --uninstall)
#
# --prefix: default /usr/local. --destdir: stage under DIR instead of /
# (scripts/package.sh; no list of installed files is kept then: dpkg keeps
# it). --no-build: install the emulators scripts/build-qemu.sh built last
# (the plugin is still built, a no-op when up to date).
# The emulators find their firmware in Debian's packages (seabios,
# qemu-system-data, ipxe-qemu; scripts/deps.sh installs them), as the build
# configures. Debug information is stripped: run from the build directory
# to debug.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

prefix=/usr/local
destdir=
build=1
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
        --destdir=*) destdir=${1#--destdir=}; shift ;;
        --no-build) build=0; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
case "$prefix" in /*) ;; *) die "--prefix must be an absolute path: $prefix" ;; esac
prefix=${prefix%/}
manifest="$prefix/share/rustkvm/installed-files"

if [ "$uninstall" = 1 ]; then
    step "uninstall rustkvm from $prefix"
    [ -f "$manifest" ] || die "no $manifest: nothing installed there by scripts/install.sh"
    if dpkg -S "$manifest" >/dev/null 2>&1; then
        die "$manifest belongs to a Debian package: remove it with apt-get remove rustkvm"
    fi
    while IFS= read -r f; do
        rm -f "$f"
    done < "$manifest"
    rm -f "$manifest"
    # The directories this script made, if now empty.
    for d in "$prefix/lib/rustkvm" "$prefix/share/doc/rustkvm/docs" \
             "$prefix/share/doc/rustkvm" "$prefix/share/rustkvm"; do
        rmdir "$d" 2>/dev/null || true
    done
    ok "removed"
    exit 0
fi

if [ "$build" = 1 ]; then
    bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
fi
# (A no-op when it is up to date.)
step "cargo build --release -p rustkvm-plugin"
(cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-plugin) \
    || die "building the TCG plugin failed"
qbuild=$(dirname "$("$RUSTKVM_ROOT/scripts/qemu-path" x86_64)")
plugin="$RUSTKVM_ROOT/target/release/librustkvm_plugin.so"
for f in "$qbuild/qemu-system-x86_64" "$qbuild/qemu-system-aarch64" "$plugin"; do
    [ -f "$f" ] || die "$f missing: run without --no-build"
done

root="${destdir%/}$prefix"
step "install into ${destdir:+$destdir }$prefix"
installed=()
# put MODE SRC DEST: DEST relative to the prefix.
put() {
    install -D -m "$1" "$2" "$root/$3" || die "installing $3 failed"
    installed+=("$prefix/$3")
}
for a in x86_64 aarch64; do
    put 755 "$qbuild/qemu-system-$a" "bin/rustkvm-qemu-system-$a"
    strip --strip-debug "$root/bin/rustkvm-qemu-system-$a" || die "strip failed"
done
put 644 "$plugin" lib/rustkvm/librustkvm_plugin.so
strip --strip-debug "$root/lib/rustkvm/librustkvm_plugin.so" || die "strip failed"
put 644 "$RUSTKVM_ROOT/README.md" share/doc/rustkvm/README.md
put 644 "$RUSTKVM_ROOT/COPYING" share/doc/rustkvm/COPYING
for d in "$RUSTKVM_ROOT"/docs/*.md; do
    put 644 "$d" "share/doc/rustkvm/docs/$(basename "$d")"
done
if [ -z "$destdir" ]; then
    mkdir -p "$(dirname "$manifest")"
    printf '%s\n' "${installed[@]}" "$manifest" > "$manifest"
fi
for f in "${installed[@]}"; do ok "$f"; done
ok "run: $prefix/bin/rustkvm-qemu-system-x86_64 -accel rustkvm,help"
