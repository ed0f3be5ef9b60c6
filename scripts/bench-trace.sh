#!/usr/bin/env bash
# trace= cost: wall and CPU time of the same guest workload
# (tests/guests/src/bin/plugin-counted.rs with 400000 iterations on each of
# two vCPUs, about 2 million instructions each: a full trace stays under
# 100 MB; plain -accel tcg in rustkvm's QEMU build) under rustkvm's plugin,
# every configuration once per round, alternating:
#   count       counters=instructions (no trace: the baseline)
#   trace       trace=FILE, every instruction
#   trace_mem   trace=FILE,trace-mem=on, every instruction and its memory
#               accesses
#   window      trace=FILE,trace-start=1000000,trace-count=10000 (the
#               callbacks still run after the window: what that costs)
# Every run must pass; the trace runs must trace what they say (every
# instruction, or 10000 per vCPU that got that far: rustkvm-trace counts
# them). Prints per run the seconds, CPU seconds, CPU ns per instruction
# and the trace's bytes per traced instruction; then ratios to count, per
# round (a traced instruction costs the difference of the ns per
# instruction).
# Usage: scripts/bench-trace.sh [ROUNDS] [ARCH]   (default 5 x86_64)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
arch=${2:-x86_64}
bench_prepare_plugin "$arch"
cd "$RUSTKVM_ROOT"
tool="$RUSTKVM_ROOT/target/release/rustkvm-trace"
kernel="$RUSTKVM_ROOT/tests/guests/target/$target/release/plugin-counted"
bench_one() {
    local report="$BENCH_DIR/plugin.json" trace="$BENCH_DIR/trace.bin" n traced bytes args
    rm -f "$report" "$trace"
    args="counters=instructions,quiet=on,outfile=$report"
    case "$1" in
        count) ;;
        trace) args+=",trace=$trace" ;;
        trace_mem) args+=",trace=$trace,trace-mem=on" ;;
        window) args+=",trace=$trace,trace-start=1000000,trace-count=10000" ;;
        *) die "unknown configuration $1" ;;
    esac
    bench_run "plugin-counted on $arch, $1" "$pass" \
        "$qemu" "${machine[@]}" -accel tcg -smp 2 -display none -serial stdio -monitor none -nodefaults \
        -kernel "$kernel" -fw_cfg name=opt/rustkvm/plugin-iterations,string=400000 -plugin "$ours,$args"
    bench_guest_passed
    n=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["total"]["instructions"])' \
        "$report" 2>/dev/null) || bench_fail "no plugin report with a total instruction count"
    # (The guest's warm-up spins on the other vCPU, so the count varies from
    # run to run with the host: costs are per instruction.)
    echo "instructions $n"
    echo "cpu_ns_per_insn $(awk -v c="$BENCH_CPU" -v n="$n" 'BEGIN { printf "%.2f", c * 1e9 / n }')"
    if [ "$1" != count ]; then
        traced=$("$tool" "$trace" | grep -c '^vcpu ') || bench_fail "rustkvm-trace could not read the trace"
        case "$1" in
            window) [ "$traced" -eq 20000 ] || bench_fail "the window traced $traced instructions, not 10000 on each of 2 vCPUs" ;;
            *) [ "$traced" -eq "$n" ] || bench_fail "traced $traced of $n instructions" ;;
        esac
        bytes=$(stat -c %s "$trace")
        echo "traced $traced"
        echo "bytes_per_insn $(awk -v b="$bytes" -v t="$traced" 'BEGIN { printf "%.2f", b / t }')"
    fi
    echo "s $BENCH_SECS"
    echo "cpu_s $BENCH_CPU"
}
bench_begin "scripts/bench-trace.sh $rounds $arch"
bench_alternate "$rounds" count trace trace_mem window
ratios=()
for q in cpu_ns_per_insn s; do
    mapfile -t -O "${#ratios[@]}" ratios < <(bench_ratios "$q" count trace trace_mem window)
done
bench_report "${ratios[@]}"
