#!/usr/bin/env bash
# Measure rustkvm's QEMU build times. Each round, in this order:
#   clean   fresh build directory, every compile a real one
#           (CCACHE_RECACHE: compiled, then stored, which also warms the cache)
#   warm    another fresh build directory, warm ccache
#   noop    scripts/build-qemu.sh again on the warm directory, nothing changed
#   rust    a Rust-only change in the warm directory (accel/src/vm.rs touched:
#           cargo rebuild of the accelerator library + relink of both emulators)
# Every step must succeed and leave both emulators listing -accel rustkvm;
# prints each step's seconds and warm/clean per round, then min / median /
# max. All of it happens in bench build directories beside the main one
# (same relative paths to the source, so ccache can hit), removed
# afterwards: the shared build directory is never touched. The source tree
# is shared too, so the bench refuses to run when this clone's
# qemu-patches/ differ from the ones it was patched with (build-qemu.sh would
# re-patch it under everyone else).
# Usage: scripts/bench-build.sh [ROUNDS] [--skip-clean]   (default 1: a clean
#        build takes minutes)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=1 skip_clean=0
for a in "$@"; do
    case "$a" in
        --skip-clean) skip_clean=1 ;;
        [0-9]*) rounds=$a ;;
        *) die "usage: scripts/bench-build.sh [ROUNDS] [--skip-clean]" ;;
    esac
done
QDIR="$RUSTKVM_CACHE/qemu"
orig=$(qemu_orig_cached)
[ -n "$orig" ] || die "no QEMU source yet (run scripts/build-qemu.sh once)"
key=$( { basename "$orig"; cat "$RUSTKVM_ROOT"/qemu-patches/debian/*.patch "$RUSTKVM_ROOT"/qemu-patches/*.patch; } | sha256sum | cut -d' ' -f1)
[ "$(cat "$QDIR/src.key" 2>/dev/null)" = "$key" ] \
    || die "$QDIR/src is patched with another qemu-patches/ than this clone's: building here would re-patch the shared source tree"
# The main build first (as scripts/build-qemu.sh always does: source patched,
# ccache filled), unless told to build nothing shared.
bench_no_build || bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null 2>&1 || die "initial build failed"

build() { # DIR: scripts/build-qemu.sh into DIR, then check what it left there
    bench_run "scripts/build-qemu.sh into $1" 0 \
        env RUSTKVM_QEMU_BUILD="$1" bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
    emulators_ok "$1"
}
emulators_ok() { # DIR
    local a
    for a in x86_64 aarch64; do
        "$1/qemu-system-$a" -accel help 2>/dev/null | grep -qx rustkvm \
            || bench_fail "$1/qemu-system-$a missing or without -accel rustkvm"
    done
}
warm_dir="$QDIR/build-bench-warm"
bench_one() {
    case "$1" in
        clean)
            rm -rf "$QDIR/build-bench-clean"
            CCACHE_RECACHE=1 build "$QDIR/build-bench-clean"
            rm -rf "$QDIR/build-bench-clean"
            ;;
        warm)
            rm -rf "$warm_dir"
            build "$warm_dir"
            ;;
        noop)
            build "$warm_dir"
            ;;
        rust)
            touch "$RUSTKVM_ROOT/accel/src/vm.rs"
            # A touched file is recompiled; the library differs only if the
            # code did, so force the relink the way a real change would:
            # bump the library's mtime.
            bench_run "Rust-only change, relink in $warm_dir" 0 bash -c "
                cd '$RUSTKVM_ROOT' && cargo build --release --quiet -p rustkvm-accel &&
                touch target/release/librustkvm_accel.a &&
                cp target/release/librustkvm_accel.a '$warm_dir/rustkvm/librustkvm_accel.a' &&
                ninja -C '$warm_dir' qemu-system-x86_64 qemu-system-aarch64"
            emulators_ok "$warm_dir"
            ;;
        *) die "unknown step $1" ;;
    esac
    echo "s $BENCH_SECS"
}
steps=(warm noop rust)
[ "$skip_clean" = 1 ] || steps=(clean "${steps[@]}")
bench_begin "scripts/bench-build.sh $* (on $(nproc) cores)"
trap 'rm -rf "$BENCH_DIR" "$QDIR/build-bench-clean" "$warm_dir"' EXIT
bench_alternate "$rounds" "${steps[@]}"
if [ "$skip_clean" = 1 ]; then
    bench_report
else
    bench_report --ratio warm/clean=warm.s/clean.s
fi
