#!/usr/bin/env bash
# Hypercall round trip under -accel rustkvm: guest TSC cycles per VMCALL
# (KVM_HC_VAPIC_POLL_IRQ) against per CPUID, interleaved in one guest run
# (tests/guests/src/bin/x86-hypercall-cost.rs), repeated RUNS times.
# Usage: scripts/bench-hypercall.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
printf '%-4s %14s %13s %16s\n' run vmcall_cycles cpuid_cycles vmcall/cpuid
for i in $(seq 1 "$runs"); do
    out=$(target/release/rustkvm-run --arch x86_64 --backend rustkvm --variant default x86-hypercall-cost 2>/dev/null)
    v=$(awk '$1 == "cycles.vmcall" { print $2 }' <<<"$out")
    c=$(awk '$1 == "cycles.cpuid" { print $2 }' <<<"$out")
    [ -n "$v" ] && [ -n "$c" ] || die "run $i: no measurement (guest failed?)"
    printf '%-4s %14s %13s %16.3f\n' "$i" "$v" "$c" "$(echo "$v / $c" | bc -l)"
done
