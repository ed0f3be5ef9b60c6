#!/usr/bin/env bash
# Measure rustkvm's QEMU build times side by side, in one run:
#   1. clean build: fresh build directory, every compile a real one
#      (CCACHE_RECACHE: compiled, then stored, which also warms the cache)
#   2. fresh build directory, warm ccache
#   3. re-running scripts/build-qemu.sh with nothing changed
#   4. a Rust-only change (relink of both emulators)
# The bench build directories sit beside the main one (same relative paths
# to the source, so ccache can hit) and are removed afterwards.
# Usage: scripts/bench-build.sh [--skip-clean]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null 2>&1 || die "initial build failed"
QDIR="$RUSTKVM_CACHE/qemu"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || die "$* failed"; t1=$(date +%s.%N); printf '%.1f' "$(echo "$t1 - $t0" | bc)"; }
build() { RUSTKVM_QEMU_BUILD="$1" bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"; }
command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null

clean="(skipped)"
if [ "${1:-}" != "--skip-clean" ]; then
    step "clean build (CCACHE_RECACHE=1, fresh build dir)"
    rm -rf "$QDIR/build-bench-clean"
    clean=$(CCACHE_RECACHE=1 secs build "$QDIR/build-bench-clean")
    rm -rf "$QDIR/build-bench-clean"
fi
step "fresh build dir, warm ccache"
rm -rf "$QDIR/build-bench-warm"
warm=$(secs build "$QDIR/build-bench-warm")
rm -rf "$QDIR/build-bench-warm"
step "nothing changed"
noop=$(secs build "$QDIR/build")
step "Rust-only change (accel/src/vm.rs touched: cargo rebuild + relink)"
touch "$RUSTKVM_ROOT/accel/src/vm.rs"
# A touched file is recompiled; the library differs only if the code did, so
# force the relink the way a real change would: bump the library's mtime.
rust=$(secs bash -c "cd '$RUSTKVM_ROOT' && cargo build --release --quiet -p rustkvm-accel && touch target/release/librustkvm_accel.a && cp target/release/librustkvm_accel.a '$QDIR/build/rustkvm/librustkvm_accel.a' && ninja -C '$QDIR/build' qemu-system-x86_64 qemu-system-aarch64")

printf '\nrustkvm QEMU build times on %s (%s cores):\n' "$(hostname)" "$(nproc)"
printf '  %-44s %8s s\n' "clean build (no ccache hits)" "$clean" \
    "fresh build dir, warm ccache" "$warm" \
    "scripts/build-qemu.sh, nothing changed" "$noop" \
    "Rust-only change (cargo + relink both)" "$rust"
if [ "$clean" != "(skipped)" ]; then
    printf '  warm/clean ratio: %.3f\n' "$(echo "$warm / $clean" | bc -l)"
fi
