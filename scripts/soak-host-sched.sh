#!/usr/bin/env bash
# Statistical checks of the host scheduler that rustkvm's steal time and
# preempted hint rely on (a spinning thread's CPU clock grows and a sleeping
# one's stands still; a sleeping thread is seen off the CPUs): the accel
# crate's #[ignore]d tests, which the test command leaves out because their
# verdict depends on how the host schedules them. Runs them RUNS times and
# prints how many runs passed and failed, and which tests failed how often.
# Exit status 1 if any run failed.
# Usage: scripts/soak-host-sched.sh [RUNS]   (default 20)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-20}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive number, not '$runs'"
cd "$RUSTKVM_ROOT"
step "build the accel crate's tests"
cargo test --quiet -p rustkvm-accel --no-run 2>/dev/null || die "building the tests failed"
step "run the host scheduler checks $runs times"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0 failed=0
declare -A failures=()
for i in $(seq 1 "$runs"); do
    if cargo test -p rustkvm-accel -- --ignored >"$log" 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        while read -r name; do
            failures[$name]=$((${failures[$name]:-0} + 1))
        done < <(awk '/^test .* FAILED$/ { print $2 }' "$log")
        ok "run $i failed:"
        grep -E "panicked at|^test .* FAILED$" "$log" | sed 's/^/      /' >&2 || true
    fi
done
printf 'soak-host-sched: %d runs, %d passed, %d failed\n' "$runs" "$passed" "$failed"
for name in "${!failures[@]}"; do
    printf '  %-80s failed %d/%d\n' "$name" "${failures[$name]}" "$runs"
done
[ "$failed" -eq 0 ]
