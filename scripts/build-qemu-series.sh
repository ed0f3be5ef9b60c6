#!/usr/bin/env bash
# Build every prefix of the QEMU series (issue 19: each step of the series
# must configure and build both emulators). Prefix k is the orig tarball with
# Debian's fixes (qemu-patches/debian/) and patches 1..k; prefix 0 is QEMU
# itself. One build directory is reused from prefix to prefix (incremental,
# and ccache), so a run costs about what the changed files do.
#
#   scripts/build-qemu-series.sh [--option on|off|both] [FIRST [LAST]]
#                                   default: both, every prefix
#   RUSTKVM_QEMU=10.2 scripts/build-qemu-series.sh ...   QEMU 10.2's series
#
# Each prefix is built with the build option rustkvm off (QEMU's default
# configure: nothing of rustkvm may be compiled, so nothing may call the
# library) and on (from the link patch, the one adding the option and the
# whole ABI header: -Drustkvm=enabled with this tree's Rust library, as
# build-qemu.sh does), each in its own build directory. Prints one line per
# prefix and a summary, exits 1 if any build failed; logs in
# $RUSTKVM_CACHE/qemu-series/logs/. Slow (minutes per prefix
# whose patch touches a header many files include): not part of the test
# command or CI. Record a full run's result in docs/building.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

option=both
if [ "${1:-}" = --option ]; then
    option=${2:-}
    shift 2 || true
fi
case "$option" in
on) modes=(on) ;;
off) modes=(off) ;;
both) modes=(off on) ;;
*) die "--option on, off or both" ;;
esac

# One directory per QEMU release: qemu-series/ for 10.0,
# qemu-series-10.2/ for 10.2 (the tag `series` is the whole series,
# whatever prefix is checked out later).
qemu_series_checkout qemu-series
qemu_ccache_env
mapfile -t commits < <(git -C "$repo" rev-list --reverse base..series)
n=${#commits[@]}
first=${1:-0}
last=${2:-$n}
[ "$first" -ge 0 ] && [ "$last" -le "$n" ] && [ "$first" -le "$last" ] \
    || die "prefixes are 0..$n"
ok "$n patches; building prefixes $first..$last"

# build_prefix MODE K: configure (when the arguments change) and build
# prefix K, checked out, in build-MODE; prints the verdict.
build_prefix() {
    local mode=$1 k=$2 args
    args=("${QEMU_CONFIGURE_ARGS[@]}")
    if [ "$mode" = on ]; then
        args+=(-Drustkvm=enabled "-Drustkvm_lib=$lib")
    fi
    if qemu_series_build "$top/build-$mode" "$logs/prefix-$(printf %04d "$k")-$mode.log" \
        qemu-system-x86_64 qemu-system-aarch64 -- "${args[@]}"; then
        echo OK
    else
        echo "FAIL ($why)"
    fi
}

failed=0
for k in $(seq "$first" "$last"); do
    if [ "$k" -eq 0 ]; then rev=base; else rev=${commits[$((k - 1))]}; fi
    subject=$(git -C "$repo" log -1 --format=%s "$rev")
    git -C "$repo" checkout -q -f "$rev"
    verdicts=()
    for mode in "${modes[@]}"; do
        if [ "$mode" = on ] && ! grep -q rustkvm_lib "$repo/meson_options.txt"; then
            verdicts+=("on: -")     # before the link patch: no option yet
            continue
        fi
        start=$(date +%s)
        v=$(build_prefix "$mode" "$k")
        [ "$v" = OK ] || failed=$((failed + 1))
        verdicts+=("$mode: $v ($(( $(date +%s) - start ))s)")
    done
    printf '%04d %-50.50s %s\n' "$k" "$subject" "$(IFS=';'; echo "${verdicts[*]}" | sed 's/;/; /g')"
done
git -C "$repo" checkout -q -f "${commits[$((n - 1))]}"
echo "build-qemu-series: QEMU $(qemu_release), prefixes $first..$last, option ${modes[*]}: $failed builds failed (logs: $logs)"
[ "$failed" -eq 0 ]
