#!/usr/bin/env bash
# Run the test command (scripts/test.sh) N times in a row while busy loops
# compete for the cores, and report each run's closing line and duration:
# the test command must not depend on host timing (docs/testing.md).
#
#   scripts/test-loaded.sh [RUNS [LOOPS]]     default: 10 runs, 2 busy loops
#
# Every run is reported; the script exits non-zero when any run failed.
# Not part of the test command (it takes RUNS times as long).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-10}
loops=${2:-2}
log_dir="$RUSTKVM_CACHE/test-loaded"
mkdir -p "$log_dir"

pids=()
stop_loops() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_loops EXIT
for _ in $(seq "$loops"); do
    # A plain shell loop at the default priority: nothing of it sleeps.
    bash -c 'while :; do :; done' &
    pids+=($!)
done
step "$loops busy loops running (pids ${pids[*]}); $runs runs of scripts/test.sh"

failed=0
for i in $(seq "$runs"); do
    start=$(date +%s)
    log="$log_dir/run-$i.log"
    if bash "$RUSTKVM_ROOT/scripts/test.sh" >"$log" 2>&1; then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
    took=$(( $(date +%s) - start ))
    closing=$(grep -E '^tests: [0-9]+ passed' "$log" | tail -n1 || true)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    printf 'run %2d/%d: %s in %dm%02ds, load %s; %s (log: %s)\n' \
        "$i" "$runs" "$verdict" $((took / 60)) $((took % 60)) "$load" "${closing:-no closing line}" "$log"
done
echo "test-loaded: $runs runs under $loops busy loops: $((runs - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
