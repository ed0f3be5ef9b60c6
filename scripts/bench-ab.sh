#!/usr/bin/env bash
# Compare two QEMU builds with one benchmark script, alternating A B A B:
#
#   scripts/bench-ab.sh [--times K] BUILD_A BUILD_B -- BENCH [ARGS...]
#       e.g. scripts/bench-ab.sh /var/cache/rustkvm/qemu/build \
#                /var/cache/rustkvm/qemu-eng/build -- \
#                scripts/bench-perf-stat.sh 3 1000000000 600000 "x86_64 aarch64" rustkvm
#
# BUILD_A and BUILD_B are QEMU build directories, built already (each run
# gets RUSTKVM_QEMU_BUILD=<it> and RUSTKVM_BENCH_NO_BUILD=1, so BENCH
# copies that build's emulators instead of building). K (default 2)
# alternations run A then B; every run must exit 0 (BENCH checks its own
# runs' output). Prints each run's rows labelled A1, B1, A2, ..., then, per
# ratio row of BENCH's summary (a line with a colon, then numbers: its
# rounds, min, median, max), the min of the mins, the median of the
# medians and the max of the maxes over A's runs and over B's, side by
# side. The comparison is within each run (BENCH's ratios come from one
# boot); A and B are never mixed in a ratio.
#
# Not part of the test command. Results in docs/benchmarks.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
times=2
if [ "${1:-}" = --times ]; then times=$2; shift 2; fi
[ $# -ge 4 ] && [ "$3" = -- ] || die "usage: scripts/bench-ab.sh [--times K] BUILD_A BUILD_B -- BENCH [ARGS...]"
case "$times" in ''|*[!0-9]*|0) die "--times takes a positive number (got '$times')" ;; esac
build_a=$1 build_b=$2
shift 3
for b in "$build_a" "$build_b"; do
    [ -x "$b/qemu-system-x86_64" ] && [ -x "$b/qemu-system-aarch64" ] \
        || die "$b: no built qemu-system-x86_64 and qemu-system-aarch64"
done
out=$(mktemp -d "${TMPDIR:-/tmp}/rustkvm-bench-ab.XXXXXX")
trap 'rm -rf "$out"' EXIT
echo "# scripts/bench-ab.sh --times $times $build_a $build_b -- $*"
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
for k in $(seq 1 "$times"); do
    for side in A B; do
        if [ "$side" = A ]; then b=$build_a; else b=$build_b; fi
        echo "== $side$k ($b)"
        RUSTKVM_QEMU_BUILD=$b RUSTKVM_BENCH_NO_BUILD=1 "$@" >"$out/$side$k.log" 2>&1 \
            || { cat "$out/$side$k.log"; die "run $side$k failed"; }
        sed "s/^/$side$k  /" "$out/$side$k.log"
    done
done
echo "== over the runs: min of mins, median of medians, max of maxes"
printf '%-48s %-26s %s\n' "row" "A" "B"
# A summary row: LABEL (with a colon) then numbers; the last three are min,
# median, max.
awk '
    function med(s,   n, a, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    FNR == 1 { match(FILENAME, /[AB][0-9]+\.log$/); side = substr(FILENAME, RSTART, 1) }
    /^[^#].*:/ && $NF ~ /^[0-9.]+$/ {
        label = $0; sub(/[ \t]+[0-9. \t]+$/, "", label)
        n = NF
        if (!(label in seen)) { seen[label] = 1; order[++rows] = label }
        k = side SUBSEP label
        if (!(k in lo) || $(n - 2) < lo[k]) lo[k] = $(n - 2)
        if (!(k in hi) || $n > hi[k]) hi[k] = $n
        meds[k] = meds[k] " " $(n - 1)
    }
    END {
        for (i = 1; i <= rows; i++) {
            l = order[i]; a = "A" SUBSEP l; b = "B" SUBSEP l
            printf "%-48s %.3f %.3f %.3f        %.3f %.3f %.3f\n", l, lo[a], med(meds[a]), hi[a], lo[b], med(meds[b]), hi[b]
        }
    }' $(for k in $(seq 1 "$times"); do echo "$out/A$k.log" "$out/B$k.log"; done)
