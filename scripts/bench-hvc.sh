#!/usr/bin/env bash
# arm64 HVC round trip: counter ns per SMCCC call that rustkvm answers
# (SMCCC_VERSION) under -accel rustkvm against per PSCI_VERSION under stock
# tcg (the baseline: QEMU's own PSCI code), and PSCI_VERSION under both (the
# cost of rustkvm's routing point for calls it leaves to QEMU). Each run boots
# tests/guests/src/bin/arm-hvc-cost.rs once per backend, alternating.
# Usage: scripts/bench-hvc.sh [RUNS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
runs=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
printf '%-4s %18s %15s %15s %22s %20s\n' run rustkvm_smccc_ns tcg_psci_ns rustkvm_psci_ns smccc/tcg_psci psci_rustkvm/tcg
for i in $(seq 1 "$runs"); do
    rk=$(target/release/rustkvm-run --arch aarch64 --backend rustkvm --variant default arm-hvc-cost 2>/dev/null)
    tc=$(target/release/rustkvm-run --arch aarch64 --backend tcg --variant default arm-hvc-cost 2>/dev/null)
    s=$(awk '$1 == "ns.smccc-version" { print $2; exit }' <<<"$rk")
    p=$(awk '$1 == "ns.psci-version" { print $2; exit }' <<<"$rk")
    t=$(awk '$1 == "ns.psci-version" { print $2; exit }' <<<"$tc")
    [ -n "$s" ] && [ -n "$p" ] && [ -n "$t" ] || die "run $i: no measurement (guest failed?)"
    printf '%-4s %18s %15s %15s %22.3f %20.3f\n' "$i" "$s" "$t" "$p" \
        "$(echo "$s / $t" | bc -l)" "$(echo "$p / $t" | bc -l)"
done
