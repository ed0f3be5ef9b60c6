#!/usr/bin/env bash
# rustkvm's main job: build everything (apt packages, Rust targets, QEMU 10.0.x
# with -accel rustkvm, the bundled guests, the Linux guest images), then
#  1. boot every bundled guest under -accel rustkvm and plain tcg on x86_64 and
#     aarch64 (rustkvm-run), and
#  2. boot Debian's Linux 6.12 on x86_64 and aarch64 under tcg, rustkvm and kvm
#     (where the host can) and print, side by side, what the guest-side probe
#     saw: PMU events, clocksource, steal time, clocks (rustkvm-linux).
# Extra arguments go to rustkvm-linux (e.g. --arch aarch64, --smp 1, --json).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || die "cargo not found: rustkvm needs a Rust toolchain installed with rustup"
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
# A Linux image that cannot be built is reported by rustkvm-linux as ERROR for
# its configurations; everything else still runs.
bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh" || echo "rustkvm: continuing without some Linux images" >&2
cd "$RUSTKVM_ROOT"
cargo build --release --quiet -p rustkvm-tests --bins || die "building the runners failed"
step "boot the bundled guests (rustkvm-run)"
status=0
"$RUSTKVM_ROOT/target/release/rustkvm-run" --quiet || status=1
step "boot Linux and run the probe (rustkvm-linux)"
"$RUSTKVM_ROOT/target/release/rustkvm-linux" "$@" || status=1
exit $status
