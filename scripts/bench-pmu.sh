#!/usr/bin/env bash
# x86 PMU overhead (issue 6): wall time of the same CPU-bound guest workload
# (tests/guests/src/workload.rs) under, in each run side by side:
#   tcg         -accel tcg (the reference)
#   pmu_off     -accel rustkvm, -cpu ...,pmu=off
#   pmu_idle    -accel rustkvm, -cpu ...,pmu=on, the guest never enables a counter
#   counting    -accel rustkvm, -cpu ...,pmu=on, 2 GP + 3 fixed counters count
#               throughout (x86-pmu-workload)
#   amd_idle    -accel rustkvm, -cpu max,pmu=on (AMD PMU), never enabled
#   amd_count   -accel rustkvm, -cpu max,pmu=on, 3 counters (instructions,
#               branches, cycles) count throughout (x86-pmu-workload)
#   insn_plugin -accel tcg with QEMU's contrib insn plugin inline (what
#               counting instructions costs stock QEMU)
# printed as ratios to tcg; then the guest-measured cost of a WRMSR to a PMU
# MSR against a WRMSR TCG handles (x86-wrmsr-cost).
# Usage: scripts/bench-pmu.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
qemu=$(bash scripts/qemu-path x86_64)
insn="$(dirname "$qemu")/tests/tcg/plugins/libinsn.so"
bin="$RUSTKVM_ROOT/tests/guests/target/x86_64-unknown-none/release"
cpu=qemu64,vendor=GenuineIntel
run() { # guest accel cpu [args...]
    local guest=$1 accel=$2 cpu=$3 t0 t1 out
    shift 3
    t0=$(date +%s.%N)
    out=$("$qemu" -M pc -cpu "$cpu" -accel "$accel" -display none -serial stdio -monitor none \
        -nodefaults -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$bin/$guest" "$@" 2>&1 || true)
    t1=$(date +%s.%N)
    grep -q '^ok ' <<<"$out" || die "$guest under $accel ($cpu) failed: $out"
    echo "$t1 - $t0" | bc -l
}
printf '%-4s %8s %9s %9s %9s %9s %10s %12s\n' run tcg_s pmu_off pmu_idle counting amd_idle amd_count insn_plugin
for i in $(seq 1 "$runs"); do
    t=$(run plugin-workload tcg "$cpu")
    off=$(run plugin-workload rustkvm "$cpu,pmu=off")
    idle=$(run plugin-workload rustkvm "$cpu,pmu=on")
    cnt=$(run x86-pmu-workload rustkvm "$cpu,pmu=on")
    aidle=$(run plugin-workload rustkvm max,pmu=on)
    acnt=$(run x86-pmu-workload rustkvm max,pmu=on)
    plug=$(run plugin-workload tcg "$cpu" -plugin "$insn,inline=on")
    printf '%-4s %8.3f %8.3fx %8.3fx %8.3fx %8.3fx %9.3fx %11.3fx\n' "$i" "$t" \
        "$(echo "$off / $t" | bc -l)" "$(echo "$idle / $t" | bc -l)" \
        "$(echo "$cnt / $t" | bc -l)" "$(echo "$aidle / $t" | bc -l)" \
        "$(echo "$acnt / $t" | bc -l)" "$(echo "$plug / $t" | bc -l)"
done
echo
printf '%-4s %15s %15s %10s\n' run wrmsr_pmu_cyc wrmsr_tcg_cyc pmu/tcg
for i in $(seq 1 "$runs"); do
    out=$(target/release/rustkvm-run --arch x86_64 --backend rustkvm --variant default x86-wrmsr-cost 2>/dev/null)
    p=$(awk '$1 == "cycles.wrmsr-pmu" { print $2 }' <<<"$out")
    c=$(awk '$1 == "cycles.wrmsr-tcg" { print $2 }' <<<"$out")
    [ -n "$p" ] && [ -n "$c" ] || die "run $i: no measurement (guest failed?)"
    printf '%-4s %15s %15s %10.3f\n' "$i" "$p" "$c" "$(echo "$p / $c" | bc -l)"
done
