#!/usr/bin/env bash
# x86 local APIC timer latency: deadline to pending, median ns over 15
# trials (tests/guests/src/bin/x86-timer-latency.rs), under -accel rustkvm
# (TSC-deadline and one-shot) and stock tcg (one-shot; TCG has no
# TSC-deadline mode), each round booting it once per backend, alternating
# (rustkvm-run, default variant: the same machine and CPU model on both);
# every run must PASS.
# Usage: scripts/bench-timer.sh [ROUNDS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
bench_one() {
    bench_rustkvm_run x86_64 "$1" x86-timer-latency
    [ "$1" = tcg ] || echo "deadline_ns $(bench_value latency.deadline-ns)"
    echo "oneshot_ns $(bench_value latency.oneshot-ns)"
}
bench_begin "scripts/bench-timer.sh $rounds"
bench_alternate "$rounds" rustkvm tcg
bench_report \
    --ratio deadline_rustkvm/oneshot_tcg=rustkvm.deadline_ns/tcg.oneshot_ns \
    --ratio oneshot_rustkvm/oneshot_tcg=rustkvm.oneshot_ns/tcg.oneshot_ns
