#!/usr/bin/env bash
# The soak (docs/testing.md "Soak"): an 8-vCPU x86 guest and an 8-vCPU
# arm64 guest at once under `-accel rustkvm,thread=multi` for MINUTES, every
# vCPU reading its PMU counters, clocks (TSC and kvmclock / CNTVCT) and steal
# time and checking none goes backwards, while the host polls x-query-rustkvm
# at 50 Hz and stops/continues and migrates each VM to a file every few
# seconds. Prints a summary; exit status 1 on any violation, crash, QMP
# error, guest failure or stall.
# Usage: scripts/soak.sh MINUTES [--arch x86_64|aarch64]...
# Uses the QEMU scripts/build-qemu.sh built (it does not build it).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
minutes=${1:-}
[[ "$minutes" =~ ^[0-9]+(\.[0-9]+)?$ ]] && [ "$minutes" != 0 ] \
    || die "usage: scripts/soak.sh MINUTES [--arch x86_64|aarch64]... (MINUTES > 0, not '$minutes')"
shift
cd "$RUSTKVM_ROOT"
step "check the patched QEMU is built"
for a in x86_64 aarch64; do
    bash scripts/qemu-path "$a" >/dev/null || die "run scripts/build-qemu.sh first"
done
bash scripts/build-guests.sh >/dev/null
step "cargo build --release the soak driver (rustkvm-soak)"
cargo build --release --quiet -p rustkvm-tests --bin rustkvm-soak || die "building rustkvm-soak failed"
step "soak for $minutes min"
exec target/release/rustkvm-soak "$minutes" "$@"
