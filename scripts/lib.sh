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
#       QEMU build) and scripts/build-linux-guests.sh, and only take what is
#       there: wait (up to ten minutes) for both emulators and QEMU's
#       libinsn.so with no ninja running in their build directory, and fail
#       without the Linux images. The clone's own guests, rustkvm-run and
#       plugin are still built (cargo: a no-op when up to date, and nothing
#       outside the clone changes).
#   RUSTKVM_BENCH_ORDER=shuffle   each round runs its configurations in a
#       random order instead of the fixed one (default: fixed, A B C A B C).
#   RUSTKVM_BENCH_BASELINE=DIR   another QEMU build directory (e.g. one
#       scripts/build-qemu.sh made from an earlier commit, with
#       RUSTKVM_QEMU_SRC/RUSTKVM_QEMU_BUILD pointing at a private pair): the
#       scripts that support it (bench-pmu.sh) then compare this build with
#       that one, configuration by configuration, in the same rounds.
#
# The QEMU build (and the Linux images) are shared by every clone and may be
# rebuilt while a benchmark runs, which would then compare different
# emulators across its rounds. So once built (or found), the emulators,
# libinsn.so and the images are copied into the benchmark's scratch
# directory and every run uses the copies (RUSTKVM_CACHE points there; the
# firmware and data directories are linked). The header prints when the
# copied emulators were built and the key of the patch set they came from.

bench_no_build() { [ "${RUSTKVM_BENCH_NO_BUILD:-0}" = 1 ]; }

# The shared cache, whatever RUSTKVM_CACHE points at later.
BENCH_SHARED_CACHE=$RUSTKVM_CACHE

# The benchmark's scratch directory, removed at exit.
bench_scratch() {
    [ -n "${BENCH_DIR:-}" ] && return
    BENCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rustkvm-bench.XXXXXX")
    BENCH_DATA="$BENCH_DIR/data"
    : >"$BENCH_DATA"
    # shellcheck disable=SC2064
    trap "rm -rf '$BENCH_DIR'" EXIT
    export BENCH_DIR BENCH_DATA
}

# QEMU (both emulators and QEMU's contrib insn plugin) in the build
# directory scripts/build-qemu.sh uses (RUSTKVM_QEMU_BUILD or the shared
# one): built, or with RUSTKVM_BENCH_NO_BUILD=1 found; then copied, with
# RUSTKVM_QEMU_BUILD and RUSTKVM_CACHE pointed at the copy (scripts/qemu-path
# and rustkvm-run find it there).
bench_prepare_qemu() {
    local b="${RUSTKVM_QEMU_BUILD:-$BENCH_SHARED_CACHE/qemu/build}" a try
    [ "${RUSTKVM_SANITIZE:-0}" != 1 ] || die "RUSTKVM_SANITIZE=1: a sanitizer build is no thing to benchmark"
    bench_no_build || bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null || die "building QEMU failed"
    bench_scratch
    local snap="$BENCH_DIR/cache/qemu/build"
    mkdir -p "$snap/tests/tcg/plugins"
    ln -s "$b/qemu-bundle" "$snap/qemu-bundle"
    ln -s "$b/pc-bios" "$snap/pc-bios"
    # Another clone may be building there: wait until no ninja runs in that
    # build directory and the emulators and libinsn.so are all there, and
    # take the copy only if the build's stamp is the same before and after
    # copying (not torn, not two builds mixed).
    for try in $(seq 1 40); do
        BENCH_STAMP=$(bench_build_stamp "$b" full)
        if ! pgrep -f -- "ninja -C $b " >/dev/null \
            && cp "$b/qemu-system-x86_64" "$b/qemu-system-aarch64" "$snap/" 2>/dev/null \
            && cp "$b/tests/tcg/plugins/libinsn.so" "$snap/tests/tcg/plugins/" 2>/dev/null \
            && { [ ! -f "$b/tests/tcg/plugins/libbb.so" ] || cp "$b/tests/tcg/plugins/libbb.so" "$snap/tests/tcg/plugins/"; } \
            && cp "$BENCH_SHARED_CACHE/qemu/src.key" "$BENCH_DIR/cache/qemu/" 2>/dev/null \
            && [ "$(bench_build_stamp "$b" full)" = "$BENCH_STAMP" ]; then
            break
        fi
        [ "$try" = 40 ] && die "no complete, unchanging QEMU build in $b for 10 minutes (scripts/build-qemu.sh builds it)"
        [ "$try" = 1 ] && echo "# $b is being built: waiting to copy the emulators" >&2
        sleep 15
    done
    BENCH_STAMP=$(bench_build_stamp "$b")
    for a in x86_64 aarch64; do
        "$snap/qemu-system-$a" -accel help 2>/dev/null | grep -qx rustkvm \
            || die "the copy of qemu-system-$a does not list the rustkvm accelerator"
    done
    RUSTKVM_CACHE="$BENCH_DIR/cache" RUSTKVM_QEMU_BUILD="$snap"
    export RUSTKVM_CACHE RUSTKVM_QEMU_BUILD
}

# bench_prepare_baseline ARCH: with RUSTKVM_BENCH_BASELINE set, a copy of
# that build's ARCH emulator in the scratch directory (beside links to its
# firmware), checked to list rustkvm; sets `baseline_qemu` to it. The build
# must not change while it is copied (its emulator's time is the same
# before and after), and is named in the header (BENCH_BASELINE_STAMP).
bench_prepare_baseline() {
    local b=${RUSTKVM_BENCH_BASELINE:?} dir t
    bench_scratch
    dir="$BENCH_DIR/baseline"
    mkdir -p "$dir"
    ln -sfn "$b/qemu-bundle" "$dir/qemu-bundle"
    ln -sfn "$b/pc-bios" "$dir/pc-bios"
    t=$(stat -c '%y' "$b/qemu-system-$1" 2>/dev/null) || die "no qemu-system-$1 in RUSTKVM_BENCH_BASELINE=$b"
    pgrep -f -- "ninja -C $b " >/dev/null && die "RUSTKVM_BENCH_BASELINE=$b is being built"
    cp "$b/qemu-system-$1" "$dir/" || die "copying $b/qemu-system-$1 failed"
    [ "$(stat -c '%y' "$b/qemu-system-$1")" = "$t" ] || die "RUSTKVM_BENCH_BASELINE=$b changed while it was copied"
    "$dir/qemu-system-$1" -accel help 2>/dev/null | grep -qx rustkvm \
        || die "the baseline's qemu-system-$1 does not list the rustkvm accelerator"
    baseline_qemu="$dir/qemu-system-$1"
    BENCH_BASELINE_STAMP="$b (qemu-system-$1 built ${t%.*})"
}

# Benchmarks over the bundled guests: QEMU, the guests and the guest runner
# (quietly: the benchmark's own output is the table).
bench_prepare_guests() {
    bench_prepare_qemu
    bash "$RUSTKVM_ROOT/scripts/build-guests.sh" >/dev/null 2>&1 || die "building the guests failed"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run) \
        || die "building rustkvm-run failed"
}

# bench_bare_machine ARCH: how a bundled bare guest boots on ARCH (as
# tests/src/qemu.rs boots it): sets `target` (its Rust target), `pass` (the
# exit status of a guest that passed: x86 isa-debug-exit's (0 << 1) | 1,
# arm64 semihosting's 0) and the array `machine` (QEMU's machine
# arguments).
bench_bare_machine() {
    case "$1" in
        x86_64) target=x86_64-unknown-none pass=1
            machine=(-M pc -device isa-debug-exit,iobase=0xf4,iosize=4) ;;
        aarch64) target=aarch64-unknown-none pass=0
            machine=(-M virt -cpu max -semihosting-config enable=on,target=native) ;;
        *) die "arch: x86_64 or aarch64" ;;
    esac
}

# bench_prepare_plugin ARCH: the guests (bench_prepare_guests) and
# rustkvm's plugin (release build); sets `qemu` (ARCH's emulator, the
# benchmark's copy), `ours` (the plugin) and bench_bare_machine's variables.
bench_prepare_plugin() {
    bench_prepare_guests
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-plugin) \
        || die "building the plugin failed"
    qemu=$(bash "$RUSTKVM_ROOT/scripts/qemu-path" "$1")
    ours="$RUSTKVM_ROOT/target/release/librustkvm_plugin.so"
    bench_bare_machine "$1"
}

# The Linux kernel and initramfs (scripts/build-linux-guests.sh), copied
# beside the emulators' copy (after bench_prepare_qemu).
bench_prepare_linux() { # arch
    local l="$BENCH_SHARED_CACHE/linux/$1" f
    if ! bench_no_build; then
        RUSTKVM_CACHE="$BENCH_SHARED_CACHE" bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh" >/dev/null 2>&1 \
            || die "building the Linux images failed (run scripts/build-linux-guests.sh)"
    fi
    mkdir -p "$RUSTKVM_CACHE/linux/$1"
    for f in vmlinuz initramfs.cpio.gz; do
        cp "$l/$f" "$RUSTKVM_CACHE/linux/$1/" 2>/dev/null || die "no $l/$f (run scripts/build-linux-guests.sh)"
    done
}

# bench_build_stamp BUILD_DIR [full]: a QEMU build's identity: both
# emulators' modification times (to the second, or with `full` to the
# nanosecond) and the key of the patch set the shared source tree holds
# (scripts/build-qemu.sh's qemu/src.key).
bench_build_stamp() {
    local cut=(cut -d. -f1)
    [ "${2:-}" = full ] && cut=(cat)
    stat -c '%y' "$1/qemu-system-x86_64" "$1/qemu-system-aarch64" 2>/dev/null | "${cut[@]}" | cut -d' ' -f1-2 | tr '\n' ' '
    cut -c1-12 "$BENCH_SHARED_CACHE/qemu/src.key" 2>/dev/null || echo '?'
}

# bench_begin "COMMAND": the header saying what ran where and when.
bench_begin() {
    bench_scratch
    _step=$1
    printf '# %s\n# %s, %s, %s CPUs, load %s\n' \
        "$1" "$(date '+%Y-%m-%d %H:%M')" "$(hostname)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
    if [ -n "${BENCH_STAMP:-}" ]; then
        local t
        read -ra t <<<"$BENCH_STAMP"
        printf '# emulators: a copy of the build (x86_64 built %s %s, aarch64 %s %s; patch set key %s)\n' "${t[@]}"
    fi
    [ -z "${BENCH_BASELINE_STAMP:-}" ] || printf '# baseline: a copy of %s\n' "$BENCH_BASELINE_STAMP"
    printf '# order: %s\n' "${RUSTKVM_BENCH_ORDER:-fixed}"
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

# bench_ratios QUANTITY BASE CONFIG...: bench_report's arguments for
# CONFIG.QUANTITY / BASE.QUANTITY of each CONFIG, one per line (mapfile).
bench_ratios() {
    local q=$1 base=$2 c
    shift 2
    for c in "$@"; do
        printf '%s\n' --ratio "$c/$base ($q)=$c.$q/$base.$q"
    done
}

# bench_run WHAT STATUS CMD...: run CMD with its standard output and error in
# $BENCH_DIR/run.log (carriage returns removed), its wall time in seconds in
# BENCH_SECS and the CPU time it and its children used (user + system) in
# BENCH_CPU; an exit status other than STATUS fails the benchmark. On a
# machine shared with other work, wall time also measures the neighbours;
# CPU time much less so (and it counts every thread's work).
bench_run() {
    BENCH_WHAT=$1
    local want=$2 st=0 TIMEFORMAT='%3R %3U %3S' t
    shift 2
    { time { "$@" </dev/null >"$BENCH_DIR/run.raw" 2>&1 || st=$?; }; } 2>"$BENCH_DIR/run.time"
    tr -d '\r' <"$BENCH_DIR/run.raw" >"$BENCH_DIR/run.log"
    read -ra t <"$BENCH_DIR/run.time"
    BENCH_SECS=${t[0]}
    BENCH_CPU=$(awk -v u="${t[1]}" -v s="${t[2]}" 'BEGIN { printf "%.3f", u + s }')
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

# The QEMU release to build: RUSTKVM_QEMU=10.0 (the default: Debian 13's,
# from trixie's deb-src) or 10.2 (upstream 10.2.2, from sid's deb-src, the
# newest release Debian's archive serves here). Each release has its own
# source tree and build directory: qemu/ for 10.0 (the paths of before),
# qemu-10.2/ for 10.2 (qemu_dir).
qemu_release() {
    case "${RUSTKVM_QEMU:-10.0}" in
        10.0|10.2) echo "${RUSTKVM_QEMU:-10.0}" ;;
        *) die "RUSTKVM_QEMU=${RUSTKVM_QEMU}: rustkvm builds QEMU 10.0 (the default) or 10.2" ;;
    esac
}
# qemu_host: the host a build runs on, RUSTKVM_QEMU_HOST: x86_64 (this
# machine, the default) or aarch64 (cross-built: build-qemu.sh).
qemu_host() {
    case "${RUSTKVM_QEMU_HOST:-x86_64}" in
        x86_64|aarch64) echo "${RUSTKVM_QEMU_HOST:-x86_64}" ;;
        *) die "RUSTKVM_QEMU_HOST=$RUSTKVM_QEMU_HOST: rustkvm builds QEMU for an x86_64 (the default) or an aarch64 host" ;;
    esac
}

qemu_dir() {
    case "$(qemu_release)" in
        10.0) echo "$RUSTKVM_CACHE/qemu" ;;
        *) echo "$RUSTKVM_CACHE/qemu-$(qemu_release)" ;;
    esac
}

# qemu_orig: the path of the release's orig tarball in $RUSTKVM_CACHE/src,
# fetched with its Debian tarball the first time. 10.0: the newest 10.0.x
# of the apt sources deps.sh sets up (trixie deb-src). 10.2: upstream
# 10.2.2 (pinned; the newest Debian revision of it), through an apt state
# of its own under $RUSTKVM_CACHE/apt-sid with only sid's deb-src in it, so
# the machine's apt sources (and what `apt-get source qemu` means there)
# stay as they are.
# qemu_orig_cached: that path if it is there already, else nothing (no fetch).
qemu_orig_cached() {
    case "$(qemu_release)" in
        10.0) ls "$RUSTKVM_CACHE"/src/qemu_10.0.*+ds.orig.tar.xz 2>/dev/null | sort -V | tail -n1 || true ;;
        10.2) ls "$RUSTKVM_CACHE"/src/qemu_10.2.2+ds.orig.tar.xz 2>/dev/null || true ;;
    esac
}
qemu_orig() {
    local rel orig v o
    rel=$(qemu_release)
    mkdir -p "$RUSTKVM_CACHE/src"
    orig=$(qemu_orig_cached)
    if [ -n "$orig" ]; then echo "$orig"; return; fi
    case "$rel" in
        10.0)
            (cd "$RUSTKVM_CACHE/src" && apt-get source --download-only qemu >/dev/null 2>&1) \
                || die "apt-get source qemu failed (is the deb-src entry for trixie reachable?)"
            orig=$(qemu_orig_cached)
            ;;
        10.2)
            local a="$RUSTKVM_CACHE/apt-sid"
            mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
            echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" \
                >"$a/sources.list"
            o=(-o "Dir::Etc::SourceList=$a/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache")
            apt-get "${o[@]}" update >"$a/update.log" 2>&1 \
                || die "apt-get update of sid's deb-src failed (log: $a/update.log)"
            v=$(apt-cache "${o[@]}" showsrc qemu 2>/dev/null | sed -n 's/^Version: \(1:10\.2\.2+ds-.*\)$/\1/p' | sort -V | tail -n1)
            [ -n "$v" ] || die "sid's deb-src has no qemu 10.2.2 (apt-cache showsrc qemu)"
            (cd "$RUSTKVM_CACHE/src" && apt-get "${o[@]}" source --download-only "qemu=$v" >"$a/source.log" 2>&1) \
                || die "apt-get source qemu=$v failed (log: $a/source.log)"
            orig=$(qemu_orig_cached)
            ;;
    esac
    [ -n "$orig" ] || die "fetching QEMU $rel's source gave no orig tarball"
    echo "$orig"
}

# qemu_patches: the release's patches in the order they apply: Debian's
# build fixes (qemu-patches/debian/), then the series (qemu-patches/*.patch).
# The series is shared by both releases; a file of the same name under
# qemu-patches/RELEASE/ (or RELEASE/debian/) replaces the shared one for
# that release, and one with a new name is added in name order.
# qemu_patches [DIR]: of the series in DIR (default: qemu-patches/).
qemu_patches() {
    local rel d sub f name
    rel=$(qemu_release)
    d="${1:-$RUSTKVM_ROOT/qemu-patches}"
    for sub in debian/ ""; do
        {
            for f in "$d/$sub"*.patch "$d/$rel/$sub"*.patch; do
                if [ -f "$f" ]; then basename "$f"; fi
            done
        } | sort -u | while read -r name; do
            if [ -f "$d/$rel/$sub$name" ]; then echo "$d/$rel/$sub$name"; else echo "$d/$sub$name"; fi
        done
    done
}

# qemu_apply DIR PATCH: apply one patch of the series to the tree DIR as
# every script here does (build-qemu.sh, qemu-series.sh: a tree it makes
# is the build's); patch(1)'s report on its standard output.
qemu_apply() {
    patch -d "$1" -p1 --batch --forward --quiet --no-backup-if-mismatch <"$2"
}

# qemu_port_sha PATCH: the sha256 a port names its shared patch by
# (Ported-from-sha256, below).
qemu_port_sha() {
    sha256sum <"$1" | cut -d' ' -f1
}

# qemu_ports_check: every patch of qemu-patches/RELEASE/ that replaces a
# shared one says which version of it it was ported from (a
# `Ported-from-sha256:` line, the sha256 of the shared file, in the notes
# after its `---`); a shared patch changed since is a stale port, refused:
# the change must be ported to the release first.
# qemu_ports_stale: the same, as a status (1: some port is stale, each
# named on stderr) for a caller that goes on (qemu-series.sh import).
qemu_ports_check() {
    qemu_ports_stale || die "QEMU $(qemu_release)'s versions of the series are stale (docs/building.md, \"The 10.2 port\")"
}
qemu_ports_stale() {
    local rel d f name want have bad=0
    rel=$(qemu_release)
    d="$RUSTKVM_ROOT/qemu-patches"
    for f in "$d/$rel"/*.patch; do
        [ -f "$f" ] || continue
        name=$(basename "$f")
        [ -f "$d/$name" ] || continue
        want=$(qemu_port_sha "$d/$name")
        have=$(sed -n 's/^Ported-from-sha256: \([0-9a-f]\{64\}\)$/\1/p' "$f")
        if [ -z "$have" ]; then
            echo "qemu-patches/$rel/$name has no Ported-from-sha256: line" >&2
            bad=1
        elif [ "$have" != "$want" ]; then
            echo "qemu-patches/$rel/$name was ported from another version of qemu-patches/$name (sha256 $have, now $want): port the change" >&2
            bad=1
        fi
    done
    return "$bad"
}

# qemu_series_checkout NAME: the release's series as a git repository
# (scripts/qemu-series.sh import, tagged `series` at its tip) in
# $RUSTKVM_CACHE/NAME/src for QEMU 10.0, NAME-RELEASE/src for another
# release, imported again only when the release's patches change; its ABI
# header must be accel/include/rustkvm.h. Then this tree's accelerator
# library, built and copied beside it. Sets `top` (the directory), `repo`,
# `logs` (top/logs) and `lib` (the library's copy). For the scripts that
# build the series in other ways than build-qemu.sh
# (build-qemu-series.sh, check-build-configs.sh).
qemu_series_checkout() {
    local key
    case "$(qemu_release)" in
    10.0) top="$RUSTKVM_CACHE/$1" ;;
    *) top="$RUSTKVM_CACHE/$1-$(qemu_release)" ;;
    esac
    repo="$top/src"   # X/src beside X/build-*: ccache hits (qemu_ccache_env)
    logs="$top/logs"
    lib="$top/librustkvm_accel.a"
    mkdir -p "$top" "$logs"
    step "QEMU $(qemu_release)'s series as commits ($repo)"
    qemu_ports_check
    key=$( (qemu_release; qemu_patches | xargs cat) | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$top/repo.key" 2>/dev/null)" != "$key" ]; then
        rm -rf "$repo" "$top/repo.key"
        bash "$RUSTKVM_ROOT/scripts/qemu-series.sh" import "$repo" >/dev/null
        git -C "$repo" tag series
        echo "$key" >"$top/repo.key"
    fi
    git -C "$repo" show series:include/system/rustkvm-abi.h | check_series_header -
    step "cargo build --release (rustkvm accelerator library)"
    (cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-accel) || die "cargo build failed"
    cmp -s "$RUSTKVM_ROOT/target/release/librustkvm_accel.a" "$lib" 2>/dev/null \
        || cp "$RUSTKVM_ROOT/target/release/librustkvm_accel.a" "$lib"
}

# qemu_series_build DIR LOG [TARGET...] -- CONFIGURE_ARG...: configure
# $repo (qemu_series_checkout) into DIR when DIR has no build or was
# configured with other arguments, then ninja the targets (none: all);
# output in LOG. 0 on success, else 1 with `why` set to "configure" or
# the log's first error.
qemu_series_build() {
    local dir=$1 log=$2 cfgkey targets=()
    shift 2
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do targets+=("$1"); shift; done
    shift
    cfgkey=$(printf '%s\n' "$@" | sha256sum | cut -d' ' -f1)
    : >"$log"
    if [ ! -f "$dir/build.ninja" ] || [ "$(cat "$dir/configure.key" 2>/dev/null)" != "$cfgkey" ]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        if ! (cd "$dir" && "$repo/configure" "$@") >"$log" 2>&1; then
            why="configure"
            return 1
        fi
        echo "$cfgkey" >"$dir/configure.key"
    fi
    if ! ninja -C "$dir" -j"$(nproc)" "${targets[@]}" >>"$log" 2>&1; then
        why=$(grep -m1 -E 'error:|undefined reference' "$log" | sed -E 's#^.*/src/##' | cut -c1-100)
        [ -n "$why" ] || why="ninja failed, no error line (a killed compiler?): $log"
        return 1
    fi
}

# The compiler cache every QEMU build here shares (build-qemu.sh,
# build-qemu-series.sh).
qemu_ccache_env() {
    export CCACHE_DIR="$RUSTKVM_CACHE/ccache"
    export CCACHE_MAXSIZE=5G
    # QEMU compiles with -g, and ccache then hashes the build directory
    # unless told not to: without this a fresh build directory never hits.
    export CCACHE_NOHASHDIR=true
    # Meson gives the compiler absolute paths into the source tree: relative
    # to the cache, a pair X/src + X/build (RUSTKVM_QEMU_SRC, _BUILD, the
    # series prefixes) compiles to the same hashes as qemu/src + qemu/build.
    export CCACHE_BASEDIR="$RUSTKVM_CACHE"
    # QEMU's configure pins CC=cc, so meson never adds ccache itself: use
    # Debian's ccache masquerade directory instead.
    export PATH="/usr/lib/ccache:$PATH"
}

# The series' copy of the C ABI header, include/system/rustkvm-abi.h (its
# link patch carries accel/include/rustkvm.h, which accel/build.rs checks
# against the Rust side), must be the library's: check_series_header FILE
# (or - for stdin).
check_series_header() {
    cmp -s "$RUSTKVM_ROOT/accel/include/rustkvm.h" "$1" \
        || die "the series' include/system/rustkvm-abi.h is not accel/include/rustkvm.h: run scripts/qemu-series.sh header"
}

# QEMU's configure arguments for the two emulators rustkvm builds
# (build-qemu.sh adds the library and sanitizers, build-qemu-series.sh the
# library from the link patch on).
# For an arm64 host (RUSTKVM_QEMU_HOST=aarch64): the arm64 emulator alone,
# for -accel rustkvm,backend=kvm in the arm64 L1 (docs/nested.md): KVM and
# TCG, the device tree (libfdt from build-qemu.sh's extracted package), no
# plugins, capstone, slirp or 9p.
QEMU_CROSS_AARCH64_ARGS=(
    --cross-prefix=aarch64-linux-gnu-
    --target-list=aarch64-softmmu
    --without-default-features
    --enable-system --disable-user --disable-tools
    --enable-tcg --enable-kvm --enable-fdt=system
    --disable-docs --disable-install-blobs --disable-download
    --python=/usr/bin/python3
)

QEMU_CONFIGURE_ARGS=(
    --target-list=x86_64-softmmu,aarch64-softmmu
    --without-default-features
    --enable-system --disable-user --disable-tools
    --enable-tcg --enable-kvm --enable-plugins
    --enable-capstone --enable-slirp --enable-fdt=system
    --enable-virtfs --enable-attr
    --disable-docs --disable-install-blobs --disable-download
    --python=/usr/bin/python3
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu
)
