#!/usr/bin/env bash
# Hypercall round trip under -accel rustkvm: guest TSC cycles per VMCALL
# (KVM_HC_VAPIC_POLL_IRQ) against per CPUID, interleaved inside one guest
# run (tests/guests/src/bin/x86-hypercall-cost.rs: the two loops alternate
# there, best of 5 rounds each), one run per round; every run must PASS.
# Usage: scripts/bench-hypercall.sh [ROUNDS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
bench_one() {
    bench_rustkvm_run x86_64 rustkvm x86-hypercall-cost
    echo "vmcall_cycles $(bench_value cycles.vmcall)"
    echo "cpuid_cycles $(bench_value cycles.cpuid)"
}
bench_begin "scripts/bench-hypercall.sh $rounds"
bench_alternate "$rounds" rustkvm
bench_report --ratio vmcall/cpuid=rustkvm.vmcall_cycles/rustkvm.cpuid_cycles
