#!/usr/bin/env bash
# The differential check (issue 47 item 4): every bundled guest and the
# Linux probe on rustkvm and on real KVM (Linux's own KVM nested in a
# rustkvm L1: kvm_amd on x86, KVM/arm64 at EL2 on arm64), side by side,
# field by field (tests/src/differential.rs). Fails on any difference a
# guest does not declare host-dependent (`kvm-vary`) and on any probe row
# outside differential::LINUX_HOST_DEPENDENT. Needs what
# scripts/test-nested.sh needs; builds the guests and the runners.
# Usage: scripts/differential.sh [ARCH...]   (default: x86_64 aarch64)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$RUSTKVM_ROOT"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
step "cargo build the runners"
cargo build --quiet -p rustkvm-tests --bin rustkvm-run --bin rustkvm-linux \
    || die "building the runners failed"
status=0
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(x86_64 aarch64)
for arch in "${arches[@]}"; do
    step "rustkvm-run --differential --nested --arch $arch --quiet"
    "$RUSTKVM_ROOT/target/debug/rustkvm-run" --differential --nested --arch "$arch" --quiet || status=1
    step "rustkvm-linux --differential --nested --arch $arch"
    "$RUSTKVM_ROOT/target/debug/rustkvm-linux" --differential --nested --arch "$arch" || status=1
done
exit "$status"
