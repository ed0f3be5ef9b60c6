#!/usr/bin/env bash
# arm64 HVC round trip: counter ns per SMCCC call that rustkvm answers
# (SMCCC_VERSION) under -accel rustkvm against per PSCI_VERSION under stock
# tcg (the baseline: QEMU's own PSCI code), and PSCI_VERSION under both (the
# cost of rustkvm's routing point for calls it leaves to QEMU). Each round
# boots tests/guests/src/bin/arm-hvc-cost.rs once per backend, alternating
# (rustkvm-run, default variant: -M virt -cpu max on both); every run must
# PASS.
# Usage: scripts/bench-hvc.sh [ROUNDS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
bench_one() {
    bench_rustkvm_run aarch64 "$1" arm-hvc-cost
    [ "$1" = tcg ] || echo "smccc_ns $(bench_value ns.smccc-version)"
    echo "psci_ns $(bench_value ns.psci-version)"
}
bench_begin "scripts/bench-hvc.sh $rounds"
bench_alternate "$rounds" rustkvm tcg
bench_report \
    --ratio smccc_rustkvm/psci_tcg=rustkvm.smccc_ns/tcg.psci_ns \
    --ratio psci_rustkvm/psci_tcg=rustkvm.psci_ns/tcg.psci_ns
