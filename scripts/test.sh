#!/usr/bin/env bash
# Run all of rustkvm's tests: builds what they need first (as scripts/run.sh),
# then formatting and lint checks, then `cargo test` over the workspace, whose
# guest tests boot the bundled guests on every backend and Linux on both
# architectures.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || die "cargo not found: rustkvm needs a Rust toolchain installed with rustup"
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh"
cd "$RUSTKVM_ROOT"

step "cargo fmt --check"
cargo fmt --all --check || die "run cargo fmt"
(cd tests/guests && cargo fmt --check) || die "run cargo fmt in tests/guests"

step "cargo clippy -D warnings (workspace, and guests for both targets)"
cargo clippy --quiet --all-targets -- -D warnings || die "clippy found problems in the workspace"
for t in x86_64-unknown-none aarch64-unknown-none; do
    (cd tests/guests && cargo clippy --quiet --release --target "$t" -- -D warnings) \
        || die "clippy found problems in the guests ($t)"
done

step "build the TCG plugin (cargo build -p rustkvm-plugin)"
cargo build --quiet -p rustkvm-plugin || die "building the TCG plugin failed"

step "cargo test --workspace"
cargo test --workspace 2>&1 | tee "$RUSTKVM_CACHE/last-test.log"
status=${PIPESTATUS[0]}
# One closing line over every test binary, for people and CI alike.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' \
    "$RUSTKVM_CACHE/last-test.log"
[ "$status" -eq 0 ] || die "cargo test failed (log: $RUSTKVM_CACHE/last-test.log)"
