#!/usr/bin/env bash
# Run all of rustkvm's tests: builds what they need first (as scripts/run.sh),
# then formatting and lint checks, then `cargo test` over the workspace, whose
# guest tests boot the bundled guests on every backend and Linux on both
# architectures, on QEMU 10.0 (RUSTKVM_QEMU); then the bundled guests again on
# the other release, 10.2, with the host tests that exercise the series.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || die "cargo not found: rustkvm needs a Rust toolchain installed with rustup"
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
# The other release (10.2, or 10.0 when RUSTKVM_QEMU=10.2 chose 10.2 for
# the full suite; issue 19): its build here, its bundled-guest matrix after
# the full suite. A build that fails is counted as a failure at the end,
# after the full suite has run.
case "$(qemu_release)" in
    10.0) other=10.2 ;;
    *) other=10.0 ;;
esac
# RUSTKVM_QEMU_SRC/_BUILD name a private pair for the full suite's release
# (scripts/test-loaded.sh): the other release builds in its own directory.
other_env=(env -u RUSTKVM_QEMU_SRC -u RUSTKVM_QEMU_BUILD "RUSTKVM_QEMU=$other")
other_built=1
"${other_env[@]}" bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" || other_built=0
# qemu-system-aarch64 for an arm64 host, cross-built: the arm64 L1 of the
# nested tests runs its guests with it (tests/tests/nested.rs).
env -u RUSTKVM_QEMU_SRC -u RUSTKVM_QEMU_BUILD RUSTKVM_QEMU_HOST=aarch64 bash "$RUSTKVM_ROOT/scripts/build-qemu.sh"
bash "$RUSTKVM_ROOT/scripts/build-guests.sh"
bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh"
# Linux's KVM selftests, both architectures (tests/tests/kvm_selftests.rs).
bash "$RUSTKVM_ROOT/scripts/build-kvm-selftests.sh" >/dev/null
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

step "cargo test --workspace --no-fail-fast"
# Every run a runner judges (a bundled guest, a Linux boot) is logged with its
# own verdict, so a run that SKIPped is counted as a skip, not as the pass of
# the cargo test around it.
# One log and one verdict file per run of this script, so that two test
# commands at once (CI beside scripts/test-loaded.sh, say) never count each
# other's verdicts; the last one's are linked as last-test.log and
# last-verdicts.tsv.
runs="$RUSTKVM_CACHE/test-runs"
mkdir -p "$runs"
find "$runs" -type f -mtime +7 -delete 2>/dev/null || true
run_id="$(date +%Y%m%d-%H%M%S)-$$"
verdicts="$runs/$run_id.verdicts.tsv"
log="$runs/$run_id.log"
: > "$verdicts"
ln -sfn "$verdicts" "$RUSTKVM_CACHE/last-verdicts.tsv"
ln -sfn "$log" "$RUSTKVM_CACHE/last-test.log"
set +e
RUSTKVM_VERDICT_LOG="$verdicts" cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# On the other release: the bundled-guest matrix and the host tests that
# exercise the series itself (migration, the PMU oracle, the plugin in
# QEMU), about a minute more than the matrix alone (issue 46).
other_tests=(--test guests --test migration --test pmu_oracle --test plugin)
step "QEMU $other: the bundled-guest matrix and the series' host tests (RUSTKVM_QEMU=$other cargo test ${other_tests[*]})"
other_status=1
if [ "$other_built" = 1 ]; then
    set +e
    "${other_env[@]}" RUSTKVM_VERDICT_LOG="$verdicts" RUSTKVM_VERDICT_PREFIX="qemu-$other:" \
        cargo test -p rustkvm-tests "${other_tests[@]}" --no-fail-fast 2>&1 | tee -a "$log"
    other_status=${PIPESTATUS[0]}
    set -e
else
    echo "QEMU $other did not build (RUSTKVM_QEMU=$other scripts/build-qemu.sh): its matrix and host tests did not run"
fi
read -r cp cf ci < <(awk '/^test result:/ { p += $4; f += $6; i += $8 } END { print p+0, f+0, i+0 }' \
    "$log")
# Each run a runner judged counts once, by its label: a guest a host test
# runs again under the same label is not a second pass (a FAIL of either
# is a failure; a PASS beats a SKIP). A cargo test whose runs are counted
# (the verdict log's fourth column names it) is not counted again itself.
read -r rp rf rs < <(awk -F'\t' '
    { l = $2; r = ($1 == "FAIL") ? 3 : ($1 == "PASS") ? 2 : ($1 == "SKIP") ? 1 : 0
      if (r > st[l]) st[l] = r }
    END { for (l in st) { if (st[l] == 3) f++; else if (st[l] == 2) p++; else if (st[l] == 1) s++ }
          print p+0, f+0, s+0 }' "$verdicts")
wrapped=$(awk -F'\t' 'NR == FNR { if ($4 != "") t[$4] = 1; next }
    /^test .* \.\.\. ok$/ { split($0, w, " "); if (w[2] in t) c++ } END { print c+0 }' "$verdicts" "$log")
cp=$((cp - wrapped))
# A release that did not build is one failed case (its matrix never ran).
if [ "$other_built" = 0 ]; then
    cf=$((cf + 1))
fi
if [ "$rs" -gt 0 ]; then
    echo "skipped runs (each a host limit detected before the run, or declared in the guest):"
    awk -F'\t' '$1=="SKIP" { printf "%s: %s\n", $2, $3 }' "$verdicts" | sort | uniq -c \
        | awk '{ c = $1; sub(/^ *[0-9]+ /, ""); printf "  %s%s\n", $0, (c > 1 ? " (" c " runs)" : "") }'
fi
if [ "$rf" -gt 0 ]; then
    echo "failed runs:"
    awk -F'\t' '$1=="FAIL" { printf "  %s: %s\n", $2, $3 }' "$verdicts"
fi
echo "cargo test functions: $cp passed (besides $wrapped whose runs are counted below), $cf failed, $ci ignored (host statistics, run by the soak scripts); runner verdicts, one per run: $rp passed, $rf failed, $rs skipped (log: $verdicts)"
# One closing line, for people and CI alike: a case is a cargo test function
# or one run a runner judged; skips are counted apart from passes.
echo "tests: $((cp + rp)) passed, $((cf + rf)) failed, $rs skipped"
[ "$status" -eq 0 ] && [ "$other_status" -eq 0 ] && [ "$cf" -eq 0 ] && [ "$rf" -eq 0 ] \
    || die "tests failed (log: $log)"
