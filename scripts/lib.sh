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

# ---------------------------------------------------------------- benchmarks
# What every scripts/bench-*.sh does (the project's rule): the runs it
# compares alternate (A B A B ...: every configuration once per round), every
# run's output is checked (a crashed or short run fails the benchmark with
# its output's tail instead of being timed), and it prints each round's
# values and ratios (a ratio only ever between runs of the same round), then
# min / median / max of every quantity and ratio (scripts/bench-stats.py).
#
# Environment:
#   RUSTKVM_BENCH_NO_BUILD=1   build nothing shared: skip scripts/build-qemu.sh
#       (which would copy this clone's accelerator library into the shared
#       QEMU build) and scripts/build-linux-guests.sh, and only check that the
#       emulators, QEMU's libinsn.so and the Linux images exist. The clone's
#       own guests, rustkvm-run and plugin are still built (cargo: a no-op
#       when up to date, and nothing outside the clone changes). The bench
#       then measures whatever the shared build holds: its header prints the
#       emulators' build times and the key of the patch set they were built
#       from, and it stops if they change while it runs.
#   RUSTKVM_BENCH_ORDER=shuffle   each round runs its configurations in a
#       random order instead of the fixed one (default: fixed, A B C A B C).

bench_no_build() { [ "${RUSTKVM_BENCH_NO_BUILD:-0}" = 1 ]; }

# QEMU (both emulators and QEMU's contrib insn plugin).
bench_prepare_qemu() {
    if bench_no_build; then
        local a q
        for a in x86_64 aarch64; do
            q=$(bash "$RUSTKVM_ROOT/scripts/qemu-path" "$a") || die "RUSTKVM_BENCH_NO_BUILD=1 but qemu-system-$a is not built"
        done
        [ -f "$(dirname "$q")/tests/tcg/plugins/libinsn.so" ] \
            || die "RUSTKVM_BENCH_NO_BUILD=1 but QEMU's libinsn.so is not built"
    else
        bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null || die "building QEMU failed"
    fi
}

# Benchmarks over the bundled guests: QEMU, the guests and the guest runner
# (quietly: the benchmark's own output is the table).
bench_prepare_guests() {
    bench_prepare_qemu
    bash "$RUSTKVM_ROOT/scripts/build-guests.sh" >/dev/null 2>&1 || die "building the guests failed"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run) \
        || die "building rustkvm-run failed"
}

# The Linux kernel and initramfs (scripts/build-linux-guests.sh).
bench_prepare_linux() { # arch
    if bench_no_build; then
        local f
        for f in vmlinuz initramfs.cpio.gz; do
            [ -f "$RUSTKVM_CACHE/linux/$1/$f" ] || die "RUSTKVM_BENCH_NO_BUILD=1 but $RUSTKVM_CACHE/linux/$1/$f does not exist"
        done
    else
        bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh" >/dev/null 2>&1 \
            || die "building the Linux images failed (run scripts/build-linux-guests.sh)"
    fi
}

# The shared QEMU build's identity: both emulators' modification times and
# the patch set's key (scripts/build-qemu.sh's qemu/src.key).
bench_build_stamp() {
    local b="$RUSTKVM_CACHE/qemu/build"
    stat -c '%y' "$b/qemu-system-x86_64" "$b/qemu-system-aarch64" 2>/dev/null | cut -d. -f1 | tr '\n' ' '
    cut -c1-12 "$RUSTKVM_CACHE/qemu/src.key" 2>/dev/null || echo '?'
}

# bench_begin "COMMAND": a scratch directory for the runs' output and the
# measurements, and a header saying what ran where and when.
bench_begin() {
    BENCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rustkvm-bench.XXXXXX")
    BENCH_DATA="$BENCH_DIR/data"
    : >"$BENCH_DATA"
    # shellcheck disable=SC2064
    trap "rm -rf '$BENCH_DIR'" EXIT
    export BENCH_DIR BENCH_DATA
    _step=$1
    BENCH_STAMP=$(bench_build_stamp)
    printf '# %s\n# %s, %s, %s CPUs, load %s\n# emulators (x86_64, aarch64 built; patch set key) %s; order %s\n' \
        "$1" "$(date '+%Y-%m-%d %H:%M')" "$(hostname)" "$(nproc)" \
        "$(cut -d' ' -f1-3 /proc/loadavg)" "$BENCH_STAMP" "${RUSTKVM_BENCH_ORDER:-fixed}"
}

# bench_alternate ROUNDS CONFIG...: ROUNDS rounds, each running every CONFIG
# once (in the order given, or shuffled with RUSTKVM_BENCH_ORDER=shuffle)
# through the script's `bench_one CONFIG`, which runs it, checks it and
# prints one `QUANTITY VALUE` line per measured value (bench_run and the
# checks below). Recorded in $BENCH_DATA as `ROUND CONFIG QUANTITY VALUE`.
bench_alternate() {
    local rounds=$1 i c out q v
    shift
    local order=("$@")
    for i in $(seq 1 "$rounds"); do
        if [ "${RUSTKVM_BENCH_ORDER:-fixed}" = shuffle ]; then
            mapfile -t order < <(printf '%s\n' "$@" | shuf)
        fi
        for c in "${order[@]}"; do
            out=$(bench_one "$c") || exit 1
            # The build is shared: a rebuild mid-benchmark would have rounds
            # compare different emulators.
            [ "$(bench_build_stamp)" = "$BENCH_STAMP" ] \
                || die "the shared QEMU build changed during the benchmark (was $BENCH_STAMP, now $(bench_build_stamp)): run it again"
            [ -n "$out" ] || die "round $i, $c: measured nothing"
            while read -r q v; do
                [ -n "$q" ] || continue
                printf '%s %s %s %s\n' "$i" "$c" "$q" "$v" >>"$BENCH_DATA"
            done <<<"$out"
        done
        printf '# round %s/%s done (%s)\n' "$i" "$rounds" "${order[*]}" >&2
    done
}

# bench_report [--ratio LABEL=CONFIG.QUANTITY/CONFIG.QUANTITY]...: the table.
bench_report() {
    python3 "$RUSTKVM_ROOT/scripts/bench-stats.py" "$BENCH_DATA" "$@" || die "summarising failed"
}

# bench_run WHAT STATUS CMD...: run CMD with its standard output and error in
# $BENCH_DIR/run.log (carriage returns removed) and its wall time in seconds
# in BENCH_SECS; an exit status other than STATUS fails the benchmark.
bench_run() {
    BENCH_WHAT=$1
    local want=$2 st=0 t0 t1
    shift 2
    t0=$EPOCHREALTIME
    "$@" </dev/null >"$BENCH_DIR/run.raw" 2>&1 || st=$?
    t1=$EPOCHREALTIME
    tr -d '\r' <"$BENCH_DIR/run.raw" >"$BENCH_DIR/run.log"
    BENCH_SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    [ "$st" = "$want" ] || bench_fail "exit status $st, expected $want"
}

# bench_fail MESSAGE: fail the benchmark, with the tail of the last run's output.
bench_fail() {
    {
        printf -- '--- %s: last 30 lines of its output (%s):\n' "${BENCH_WHAT:-run}" "$BENCH_DIR/run.log"
        tail -n 30 "$BENCH_DIR/run.log" 2>/dev/null
        printf -- '---\n'
    } >&2
    die "${BENCH_WHAT:-run}: $*"
}

# bench_expect REGEX...: each (extended) regular expression matches a line of
# the last run's output.
bench_expect() {
    local re
    for re in "$@"; do
        grep -Eq -- "$re" "$BENCH_DIR/run.log" || bench_fail "no line matching /$re/ in its output"
    done
}

# bench_guest_passed: the last run was a bundled guest that passed by the
# result protocol (docs/testing.md): a summary with checks passed and none
# failed or skipped, and no `not ok` line.
bench_guest_passed() {
    bench_expect '^summary checks=[0-9]+ passed=[1-9][0-9]* failed=0 skipped=0$'
    ! grep -q '^not ok' "$BENCH_DIR/run.log" || bench_fail "a check failed"
}

# bench_value KEY: the number a `measure KEY VALUE` (guest protocol) or
# `KEY VALUE` (rustkvm-run's listing) line of the last run's output gives.
bench_value() {
    local v
    v=$(awk -v k="$1" '($1 == "measure" && $2 == k) { print $3; exit } ($1 == k) { print $2; exit }' \
        "$BENCH_DIR/run.log")
    [[ "$v" =~ ^-?[0-9]+(\.[0-9]+)?$ ]] || bench_fail "no number for $1 in its output (got '$v')"
    printf '%s' "$v"
}

# bench_same KEY VALUE: VALUE is what every run so far gave for KEY (e.g. the
# workload's checksum: every configuration did the same work).
bench_same() {
    local f="$BENCH_DIR/same.$1"
    [ -n "$2" ] || bench_fail "no $1 in its output"
    if [ -f "$f" ]; then
        [ "$(cat "$f")" = "$2" ] || bench_fail "$1 is $2, other runs gave $(cat "$f")"
    else
        printf '%s' "$2" >"$f"
    fi
}

# bench_near KEY VALUE PERMILLE: VALUE is within PERMILLE per mille of what
# the first run gave for KEY (for counts that vary by a few, e.g. the
# instructions x86 firmware spends waiting on a timer).
bench_near() {
    local f="$BENCH_DIR/near.$1"
    [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] || bench_fail "no number for $1 in its output (got '$2')"
    if [ -f "$f" ]; then
        awk -v a="$2" -v b="$(cat "$f")" -v p="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d * 1000 <= p * b) }' \
            || bench_fail "$1 is $2, the first run gave $(cat "$f") (more than $3 per mille apart)"
    else
        printf '%s' "$2" >"$f"
    fi
}

# bench_rustkvm_run ARCH BACKEND GUEST: one bundled guest under rustkvm-run
# (default variant), which must PASS; its listing is then in the run log.
bench_rustkvm_run() {
    bench_run "$3 on $1/$2" 0 "$RUSTKVM_ROOT/target/release/rustkvm-run" \
        --arch "$1" --backend "$2" --variant default "$3"
    bench_expect "^$3/$1/default +PASS"
}
