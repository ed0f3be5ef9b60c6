# Shared helpers for rustkvm's scripts. Sourced, not run.
# shellcheck shell=bash
RUSTKVM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything built or downloaded lives outside the clone, so a fresh clone reuses it.
: "${RUSTKVM_CACHE:=/var/cache/rustkvm}"
mkdir -p "$RUSTKVM_CACHE"
export RUSTKVM_ROOT RUSTKVM_CACHE
_step=""
step() { _step="$*"; printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
ok() { printf '    %s\n' "$*" >&2; }
die() { printf 'rustkvm: step "%s" failed: %s\n' "${_step:-?}" "$*" >&2; exit 1; }

# Benchmarks over the bundled guests: build QEMU, the guests and the guest
# runner (quietly: the benchmark's own output is the table).
bench_prepare_guests() {
    bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null
    bash "$RUSTKVM_ROOT/scripts/build-guests.sh" >/dev/null
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run) \
        || die "building rustkvm-run failed"
}
