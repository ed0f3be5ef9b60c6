#!/usr/bin/env bash
# x86 local APIC timer latency: deadline to pending, median ns over 15
# trials (tests/guests/src/bin/x86-timer-latency.rs), under -accel rustkvm
# (TSC-deadline and one-shot) and stock tcg (one-shot; TCG has no
# TSC-deadline mode), booted back to back in each run.
# Usage: scripts/bench-timer.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
get() { awk -v k="$1" '$1 == k { print $2; exit }'; }
printf '%-4s %22s %20s %22s %24s\n' run rustkvm_deadline_ns tcg_oneshot_ns rustkvm_oneshot_ns deadline/tcg_oneshot
for i in $(seq 1 "$runs"); do
    rk=$(target/release/rustkvm-run --arch x86_64 --backend rustkvm --variant default x86-timer-latency 2>/dev/null)
    tc=$(target/release/rustkvm-run --arch x86_64 --backend tcg --variant default x86-timer-latency 2>/dev/null)
    d=$(get latency.deadline-ns <<<"$rk")
    o=$(get latency.oneshot-ns <<<"$rk")
    t=$(get latency.oneshot-ns <<<"$tc")
    [ -n "$d" ] && [ -n "$o" ] && [ -n "$t" ] || die "run $i: no measurement (guest failed?)"
    printf '%-4s %22s %20s %22s %24.3f\n' "$i" "$d" "$t" "$o" "$(echo "$d / $t" | bc -l)"
done
