#!/usr/bin/env bash
# Run the test command (scripts/test.sh) N times in a row while busy loops
# compete for the cores, and report each run's closing line and duration:
# the test command must not depend on host timing (docs/testing.md).
#
#   scripts/test-loaded.sh [RUNS [LOOPS]]     default: 10 runs, 2 busy loops
#
# The runs belong to the commit checked out (a clean tree): their results
# are kept in $RUSTKVM_CACHE/test-loaded/COMMIT/results.tsv, so a series cut
# short (a session's end) goes on where it stopped when started again on
# the same commit, until RUNS runs have passed. A failed run ends the series
# for that commit: started again, the script prints it and exits 1.
# Every run is reported; the script exits non-zero when any run failed.
# Not part of the test command (it takes RUNS times as long).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-10}
loops=${2:-2}

if [ -n "$(git -C "$RUSTKVM_ROOT" status --porcelain --untracked-files=no)" ]; then
    die "the tree has changes: loaded runs are a commit's (commit or stash them first)"
fi
commit=$(git -C "$RUSTKVM_ROOT" rev-parse --short=12 HEAD)
log_dir="$RUSTKVM_CACHE/test-loaded/$commit"
results="$log_dir/results.tsv"
mkdir -p "$log_dir"
touch "$results"

report() {
    # run, verdict, seconds, load, closing line, log, finished
    awk -F'\t' -v runs="$runs" '{ printf "run %2d/%d: %s in %dm%02ds, load %s; %s (log: %s, %s)\n",
        $1, runs, $2, $3 / 60, $3 % 60, $4, $5, $6, $7 }' "$results"
}
passed=$(awk -F'\t' '$2 == "PASS"' "$results" | wc -l)
failed=$(awk -F'\t' '$2 != "PASS"' "$results" | wc -l)
if [ -s "$results" ]; then
    step "commit $commit: runs so far (from $results)"
    report
fi
if [ "$failed" -gt 0 ]; then
    echo "test-loaded: commit $commit already failed a loaded run; the series for it is over"
    exit 1
fi

pids=()
stop_loops() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_loops EXIT
for _ in $(seq "$loops"); do
    # A plain shell loop at the default priority: nothing of it sleeps.
    bash -c 'while :; do :; done' &
    pids+=($!)
done
step "$loops busy loops running (pids ${pids[*]}); runs $((passed + 1)) to $runs of scripts/test.sh at $commit"

for i in $(seq $((passed + 1)) "$runs"); do
    start=$(date +%s)
    log="$log_dir/run-$i.log"
    if bash "$RUSTKVM_ROOT/scripts/test.sh" >"$log" 2>&1; then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
    took=$(( $(date +%s) - start ))
    closing=$(grep -E '^tests: [0-9]+ passed' "$log" | tail -n1 || true)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '%d\t%s\t%d\t%s\t%s\t%s\t%s\n' "$i" "$verdict" "$took" "$load" \
        "${closing:-no closing line}" "$log" "$(date -u +%FT%TZ)" >>"$results"
    printf 'run %2d/%d: %s in %dm%02ds, load %s; %s (log: %s)\n' \
        "$i" "$runs" "$verdict" $((took / 60)) $((took % 60)) "$load" "${closing:-no closing line}" "$log"
    [ "$verdict" = PASS ] || break
done
passed=$(awk -F'\t' '$2 == "PASS"' "$results" | wc -l)
echo "test-loaded: commit $commit, $loops busy loops: $passed of $runs runs passed in a row, $failed failed"
[ "$failed" -eq 0 ]
