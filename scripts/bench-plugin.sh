#!/usr/bin/env bash
# TCG plugin overhead: wall time of the same guest workload
# (tests/guests/src/bin/plugin-workload.rs, x86_64, plain TCG in rustkvm's
# QEMU build) with no plugin, QEMU's contrib insn plugin inline, and
# rustkvm's plugin counting instructions only / instructions + branches +
# memory accesses / everything, alternating in each run; ratios to no plugin.
# Usage: scripts/bench-plugin.sh [RUNS] [ARCH]   (default 5 x86_64)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
arch=${2:-x86_64}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
cargo build --release --quiet -p rustkvm-plugin || die "building the plugin failed"
qemu=$(bash scripts/qemu-path "$arch")
insn="$(dirname "$qemu")/tests/tcg/plugins/libinsn.so"
ours="$RUSTKVM_ROOT/target/release/librustkvm_plugin.so"
case "$arch" in
    x86_64) target=x86_64-unknown-none; machine=(-M pc -device isa-debug-exit,iobase=0xf4,iosize=4) ;;
    aarch64) target=aarch64-unknown-none; machine=(-M virt -cpu max -semihosting-config enable=on,target=native) ;;
    *) die "arch: x86_64 or aarch64" ;;
esac
kernel="$RUSTKVM_ROOT/tests/guests/target/$target/release/plugin-workload"
run() { # plugin args...
    local t0 t1
    t0=$(date +%s.%N)
    "$qemu" "${machine[@]}" -accel tcg -display none -serial none -monitor none -nodefaults \
        -kernel "$kernel" "$@" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}
printf '%-4s %9s %12s %12s %14s %12s\n' run none_s insn_inline ours_insns ours_insns+br+mem ours_all
for i in $(seq 1 "$runs"); do
    n=$(run)
    a=$(run -plugin "$insn,inline=on")
    b=$(run -plugin "$ours,counters=instructions,quiet=on")
    c=$(run -plugin "$ours,counters=instructions+branches+mem,quiet=on")
    d=$(run -plugin "$ours,counters=all,quiet=on")
    printf '%-4s %9.3f %11.2fx %11.2fx %13.2fx %11.2fx\n' "$i" "$n" \
        "$(echo "$a / $n" | bc -l)" "$(echo "$b / $n" | bc -l)" \
        "$(echo "$c / $n" | bc -l)" "$(echo "$d / $n" | bc -l)"
done
