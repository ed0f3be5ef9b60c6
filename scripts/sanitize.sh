#!/usr/bin/env bash
# QEMU with AddressSanitizer and UndefinedBehaviorSanitizer (QEMU's own
# --enable-asan --enable-ubsan, in its own build directory qemu/build-san),
# then the bundled-guest matrix and the Linux guests under it. Any sanitizer
# report fails the run; so does a guest that does not pass (the time limits
# are 4 times the usual ones: sanitized code is slower).
#
#   scripts/sanitize.sh            build what is needed, run both, summarise
#   scripts/sanitize.sh --subset   instead: the host tests of what a guest or
#                                  QMP can do to the host's heap (CPU hotplug
#                                  and unplug, kicks and IPIs at a vCPU being
#                                  unplugged, reboot, INIT, migration), within
#                                  CI's budget after the build
#
# Not part of scripts/test.sh: a cold sanitizer build takes longer than CI
# allows with the rest. The last result is in docs/testing.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
export RUSTKVM_SANITIZE=1 RUSTKVM_TIMEOUT_SCALE=4
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh"
cd "$RUSTKVM_ROOT"
cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run --bin rustkvm-linux \
    || die "building the runners failed"

logs="$RUSTKVM_CACHE/sanitize"
rm -rf "$logs"
mkdir -p "$logs"
# Reports go to files, one per QEMU process (pid suffix); QEMU frees much
# at exit that it never needed to, so leaks are not reported.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=0:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$logs/ubsan"

start=$(date +%s)
if [ "${1:-}" = --subset ]; then
    step "the heap-facing host tests under the sanitizer build"
    set +e
    cargo test -p rustkvm-tests --test guests --test migration --no-fail-fast -- \
        --test-threads=1 hotplug kick_and_ipi reboot x86_init migrat stream injected_steal \
        > "$logs/subset.txt" 2>&1
    subset=$?
    set -e
    grep -E '^test .* \.\.\. |^test result' "$logs/subset.txt" || true
    shopt -s nullglob
    files=("$logs"/asan.* "$logs"/ubsan.*)
    bad=()
    [ ${#files[@]} -eq 0 ] || mapfile -t bad < <(grep -l -E 'ERROR: AddressSanitizer|runtime error:' "${files[@]}")
    for f in "${bad[@]}"; do
        echo "--- $f"
        grep -m3 -E 'ERROR: AddressSanitizer|runtime error:|#[0-3] ' "$f"
    done
    echo "sanitize --subset: cargo test exit $subset, ${#bad[@]} sanitizer reports, $(( $(date +%s) - start )) s (logs: $logs)"
    [ "${#bad[@]}" -eq 0 ] && [ "$subset" -eq 0 ] || die "not clean"
    exit 0
fi
step "bundled-guest matrix under the sanitizer build"
set +e
target/release/rustkvm-run --tap > "$logs/matrix.tap" 2> "$logs/matrix.err"
matrix=$?
step "Linux guests under the sanitizer build"
target/release/rustkvm-linux --timeout 900 > "$logs/linux.txt" 2> "$logs/linux.err"
linux=$?
set -e

# The report files that hold a report (grep exits 2 for a glob that matched
# no file, 1 for no match: neither is a failure here).
reported() {
    shopt -s nullglob
    local files=("$logs"/asan.* "$logs"/ubsan.*)
    [ ${#files[@]} -eq 0 ] || grep -l -E 'ERROR: AddressSanitizer|runtime error:' "${files[@]}" || true
}
reports=$(reported | wc -l)
if [ "$reports" -gt 0 ]; then
    echo "sanitizer reports (first lines of each):"
    for f in $(reported); do
        echo "--- $f"
        grep -m3 -E 'ERROR: AddressSanitizer|runtime error:|#[0-3] ' "$f"
    done
fi
runs=$(grep -c -E '^(not )?ok ' "$logs/matrix.tap" || true)
fails=$(grep -c '^not ok ' "$logs/matrix.tap" || true)
echo "sanitize: $runs guest runs ($fails failed, matrix exit $matrix), Linux runner exit $linux, $reports sanitizer reports, $(( $(date +%s) - start )) s (logs: $logs)"
[ "$reports" -eq 0 ] && [ "$matrix" -eq 0 ] && [ "$linux" -eq 0 ] || die "not clean"
