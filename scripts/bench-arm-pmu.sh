#!/usr/bin/env bash
# arm64 PMU overhead (issue 7): wall time of the same CPU-bound guest
# workload (tests/guests/src/workload.rs, aarch64, -M virt -cpu max) under,
# in each run side by side:
#   tcg           -accel tcg (the reference)
#   idle          -accel rustkvm, the guest never enables a counter
#   counting      -accel rustkvm, 2 event counters (instructions, branches)
#                 and the cycle counter count throughout (arm-pmu-workload)
#   tcg_icount    -accel tcg -icount shift=0: stock QEMU's only way to count
#                 instructions on arm64
# printed as ratios to tcg.
# Usage: scripts/bench-arm-pmu.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
qemu=$(bash scripts/qemu-path aarch64)
bin="$RUSTKVM_ROOT/tests/guests/target/aarch64-unknown-none/release"
run() { # guest accel [args...]
    local guest=$1 accel=$2 t0 t1 out
    shift 2
    t0=$(date +%s.%N)
    out=$("$qemu" -M virt -cpu max -accel "$accel" -display none -serial stdio -monitor none \
        -nodefaults -semihosting-config enable=on,target=native -kernel "$bin/$guest" "$@" 2>&1 || true)
    t1=$(date +%s.%N)
    grep -q '^ok ' <<<"$out" || die "$guest under $accel failed: $out"
    echo "$t1 - $t0" | bc -l
}
printf '%-4s %8s %9s %9s %11s\n' run tcg_s idle counting tcg_icount
for i in $(seq 1 "$runs"); do
    t=$(run plugin-workload tcg)
    idle=$(run plugin-workload rustkvm)
    cnt=$(run arm-pmu-workload rustkvm)
    ic=$(run plugin-workload tcg -icount shift=0)
    printf '%-4s %8.3f %8.3fx %8.3fx %10.3fx\n' "$i" "$t" \
        "$(echo "$idle / $t" | bc -l)" "$(echo "$cnt / $t" | bc -l)" "$(echo "$ic / $t" | bc -l)"
done
