#!/usr/bin/env bash
# Statistical checks of rustkvm against the host's scheduler and clock, on
# the bundled guests and on Linux: the #[ignore]d tests of
# tests/tests/guests.rs and tests/tests/linux.rs, which the test command
# leaves out because their verdict depends on how the host schedules QEMU's
# threads (MTTCG's preempted hint under overcommit, steal in host time,
# forced run delay, the clocksource watchdog and wall clock against the
# host's). docs/testing.md lists them. Runs them RUNS times and prints, per
# test, how many runs passed and failed. Exit status 1 if any run failed.
# Needs QEMU and the Linux images built (scripts/build-qemu.sh,
# scripts/build-linux-guests.sh); builds the guests and the tests.
# Usage: scripts/soak-guests.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive number, not '$runs'"
cd "$RUSTKVM_ROOT"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
step "build the guest and Linux tests"
cargo test --quiet -p rustkvm-tests --test guests --test linux --no-run 2>/dev/null \
    || die "building the tests failed"
step "run the host statistics $runs times"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
declare -A passed=() failed=()
names=()
bad=0
for i in $(seq 1 "$runs"); do
    for t in guests linux; do
        status=0
        cargo test -p rustkvm-tests --test "$t" -- --ignored >"$log" 2>&1 || status=$?
        # libtest: "test NAME ... ok" / "test NAME ... FAILED".
        while read -r name verdict; do
            [[ -v "passed[$name]" ]] || { names+=("$name"); passed[$name]=0; failed[$name]=0; }
            if [ "$verdict" = ok ]; then
                passed[$name]=$((passed[$name] + 1))
            else
                failed[$name]=$((failed[$name] + 1))
            fi
        done < <(awk '/^test .* \.\.\. (ok|FAILED)$/ { print $2, $4 }' "$log")
        if [ "$status" -ne 0 ]; then
            bad=$((bad + 1))
            ok "run $i ($t) failed:"
            grep -E "panicked at|^test .* FAILED$|^error" -A2 "$log" | sed 's/^/      /' >&2 || true
        fi
    done
done
[ "${#names[@]}" -gt 0 ] || die "no #[ignore]d test ran (log: $(cat "$log"))"
printf 'soak-guests: %d runs\n' "$runs"
for name in "${names[@]}"; do
    printf '  %-90s passed %d/%d, failed %d\n' "$name" "${passed[$name]}" "$runs" "${failed[$name]}"
done
[ "$bad" -eq 0 ]
