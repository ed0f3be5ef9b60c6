#!/usr/bin/env bash
# Build the bundled test guests (tests/guests) for x86_64 and aarch64.
# Output: tests/guests/target/<rust-target>/release/<guest>.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

step "cargo build the bundled guests (x86_64-unknown-none, aarch64-unknown-none)"
for t in x86_64-unknown-none aarch64-unknown-none; do
    rustup target list --installed | grep -qx "$t" || rustup target add "$t" || die "rustup target add $t"
    (cd "$RUSTKVM_ROOT/tests/guests" && cargo build --release --quiet --target "$t") \
        || die "building the guests for $t failed"
done
ok "$(ls "$RUSTKVM_ROOT"/tests/guests/src/bin/*.rs | wc -l) guests per architecture"
