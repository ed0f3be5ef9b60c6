#!/usr/bin/env bash
# The kvm column for real: every bundled guest on Linux's own KVM (kvm_amd
# on x86, KVM/arm64 on arm64) inside one rustkvm L1 per architecture
# (tests/src/nested.rs, docs/nested.md), each held to its declared kvm /
# kvm-nested outcome, with the table and measures of `rustkvm-run`.
# Needs QEMU (also RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh) and the
# Linux images built (scripts/build-linux-guests.sh); builds the guests and
# the runner.
# Usage: scripts/test-nested.sh [FILTER]     exit status 1 if any guest fails
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$RUSTKVM_ROOT"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
step "cargo build the runner"
cargo build --quiet -p rustkvm-tests --bin rustkvm-run || die "building rustkvm-run failed"
status=0
if [ -z "${1:-}" ]; then
    step "the nested subset (cargo test --test nested)"
    cargo test --quiet -p rustkvm-tests --test nested || status=1
fi
for arch in x86_64 aarch64; do
    step "rustkvm-run --arch $arch --backend kvm --nested ${1:-}"
    "$RUSTKVM_ROOT/target/debug/rustkvm-run" --arch "$arch" --backend kvm --nested ${1:+"$1"} || status=1
done
exit "$status"
