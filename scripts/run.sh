#!/usr/bin/env bash
# rustkvm's main job: build everything (apt packages, Rust targets, QEMU 10.0.x
# with -accel rustkvm, the bundled guests), then boot every bundled guest under
# -accel rustkvm and plain tcg on x86_64 and aarch64 and print what they report.
# Extra arguments go to rustkvm-run (e.g. --arch aarch64, --tap, a name filter).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || die "cargo not found: rustkvm needs a Rust toolchain installed with rustup"
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
step "boot the bundled guests (rustkvm-run)"
cd "$RUSTKVM_ROOT"
cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run || die "building rustkvm-run failed"
exec "$RUSTKVM_ROOT/target/release/rustkvm-run" "$@"
