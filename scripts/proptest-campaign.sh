#!/usr/bin/env bash
# A long campaign of the accel crate's property tests (accel/src/proptests,
# docs/testing.md "Property tests"): each property runs CASES random cases
# instead of the default run's 1500. A failure is shrunk and its seed saved
# in accel/proptest-regressions/ (commit it with the fix). Prints each
# property's verdict and the campaign's result; exit status 1 on a failure.
# Usage: scripts/proptest-campaign.sh [CASES]   (default 100000)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cases=${1:-${PROPTEST_CASES:-100000}}
[[ "$cases" =~ ^[1-9][0-9]*$ ]] || die "CASES must be a positive number, not '$cases'"
cd "$RUSTKVM_ROOT"
step "build the accel crate's tests"
cargo test --quiet -p rustkvm-accel --no-run 2>/dev/null || die "building the tests failed"
step "run the property tests, $cases cases each"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
status=0
PROPTEST_CASES=$cases cargo test -p rustkvm-accel proptests:: >"$log" 2>&1 || status=$?
secs=$(( $(date +%s) - start ))
grep -E "^test proptests::" "$log" || true
if [ "$status" -ne 0 ]; then
    grep -E "Test failed|minimal failing input" -A3 "$log" | sed 's/^/    /' >&2 || true
fi
summary=$(grep -E "^test result:" "$log" | tail -1)
printf 'proptest-campaign: %s cases per property, %ss: %s\n' "$cases" "$secs" "${summary:-no result (build or run failed)}"
[ "$status" -eq 0 ]
