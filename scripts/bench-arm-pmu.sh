#!/usr/bin/env bash
# arm64 PMU overhead (issue 7): wall time of the same CPU-bound guest
# workload (tests/guests/src/workload.rs, aarch64, -M virt -cpu max in every
# configuration) under, every configuration once per round, alternating:
#   tcg           -accel tcg (the baseline)
#   idle          -accel rustkvm, the guest never enables a counter
#   counting      -accel rustkvm, 2 event counters (instructions, branches)
#                 and the cycle counter count throughout (arm-pmu-workload)
#   tcg_icount    -accel tcg -icount shift=0: stock QEMU's only way to count
#                 instructions on arm64
# Every run must pass (guest summary, semihosting exit status 0) with the
# workload's usual checksum. Each run's CPU time (QEMU's user + system) and
# wall time; ratios of both to tcg, per round.
# Usage: scripts/bench-arm-pmu.sh [ROUNDS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
qemu=$(bash scripts/qemu-path aarch64)
bin="$RUSTKVM_ROOT/tests/guests/target/aarch64-unknown-none/release"
bench_one() {
    local guest=plugin-workload accel=rustkvm extra=()
    case "$1" in
        tcg) accel=tcg ;;
        idle) ;;
        counting) guest=arm-pmu-workload ;;
        tcg_icount) accel=tcg extra=(-icount shift=0) ;;
        *) die "unknown configuration $1" ;;
    esac
    bench_run "$guest, -accel $accel ${extra[*]}" 0 \
        "$qemu" -M virt -cpu max -accel "$accel" -display none -serial stdio -monitor none \
        -nodefaults -semihosting-config enable=on,target=native -kernel "$bin/$guest" "${extra[@]}"
    bench_guest_passed
    bench_same checksum "$(awk '$1 == "measure" && $2 == "checksum" { print $3 }' "$BENCH_DIR/run.log")"
    [ "$1" != counting ] || bench_value instructions >/dev/null
    echo "s $BENCH_SECS"
    echo "cpu_s $BENCH_CPU"
}
bench_begin "scripts/bench-arm-pmu.sh $rounds"
bench_alternate "$rounds" tcg idle counting tcg_icount
ratios=()
for q in cpu_s s; do
    mapfile -t -O "${#ratios[@]}" ratios < <(bench_ratios "$q" tcg idle counting tcg_icount)
done
bench_report "${ratios[@]}"
