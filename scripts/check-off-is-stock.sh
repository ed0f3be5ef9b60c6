#!/usr/bin/env bash
# Issue 19 point 2: with the build option rustkvm off, the series' tip must
# be stock QEMU. Builds stock QEMU and the series' tip with the option off,
# one after the other, from the same source path and in sibling build
# directories, then compares every object and the stripped emulators
# (docs/series-plan.md §3.6).
#
# Stock is the orig tarball with Debian's fixes and the series' standalone
# fixes (meant for upstream, not gated): the parent of the first `rustkvm:`
# commit. Both builds use -g0 and a forced include, a system header, that
# defines __LINE__ as 0: a line the series inserts shifts __LINE__ in every
# later assert of its file. (-D__LINE__=0 warned "redefined" whatever -W
# said, and configure's probes then took PIE for unsupported and linked a
# PIE of -fno-pie objects.)
#
#   scripts/check-off-is-stock.sh
#
# Prints each object that differs or exists on one side only, and a
# summary; exits 1 if an emulator or an object differs. Slow (two full
# builds of both emulators; ccache helps the second time): not part of the
# test command or CI. Record its result in docs/building.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

top="$RUSTKVM_CACHE/off-check"
repo="$top/src"
mkdir -p "$top"
line0="$top/line0.h"
printf '%s\n' '/* check-off-is-stock.sh: __LINE__ is 0, without a warning */' \
    '#pragma GCC system_header' '#undef __LINE__' '#define __LINE__ 0' >"$line0"
cflags="-g0 -include $line0"
# decodetree iterates Python sets: one hash seed, or its output (the order
# of a decoder's field extractions) differs from run to run.
export PYTHONHASHSEED=0
qemu_ccache_env

step "the series as commits ($repo)"
# The series and the flags: either changed, everything is made again.
key=$({ cat "$RUSTKVM_ROOT"/qemu-patches/debian/*.patch "$RUSTKVM_ROOT"/qemu-patches/*.patch; echo "$cflags $PYTHONHASHSEED"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$top/repo.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$repo" "$top/repo.key" "$top"/build-*
    bash "$RUSTKVM_ROOT/scripts/qemu-series.sh" import "$repo" >/dev/null
    git -C "$repo" tag series
    echo "$key" >"$top/repo.key"
fi

# Stock is upstream with the fixes meant for it (0001-0003 today).
stock=$(git -C "$repo" log --reverse --format='%H %s' base..series | awk '$2 == "rustkvm:" { print $1; exit }')
[ -n "$stock" ] || die "no rustkvm: commit in the series"
stock=$(git -C "$repo" rev-parse "$stock^")
for side in stock series; do
    if [ "$side" = stock ]; then rev=$stock; else rev=series; fi
    build="$top/build-$side"
    step "$side ($rev): configure and build, option off"
    git -C "$repo" checkout -q -f "$rev"
    if [ ! -f "$build/build.ninja" ]; then
        rm -rf "$build"
        mkdir -p "$build"
        (cd "$build" && "$repo/configure" "${QEMU_CONFIGURE_ARGS[@]}" \
            --disable-werror --extra-cflags="$cflags") >"$top/configure-$side.log" 2>&1 \
            || die "configure failed (log: $top/configure-$side.log)"
    fi
    # The checkout changed the sources' times: ninja rebuilds what differs
    # (ccache answers the rest).
    ninja -C "$build" -j"$(nproc)" qemu-system-x86_64 qemu-system-aarch64 >"$top/build-$side.log" 2>&1 \
        || die "build failed (log: $top/build-$side.log)"
    ok "built ($build)"
done
git -C "$repo" checkout -q -f series

step "compare the objects and the stripped emulators"
differ=0
only=0
(cd "$top/build-stock" && find . -name '*.o' | sort) >"$top/objects-stock"
(cd "$top/build-series" && find . -name '*.o' | sort) >"$top/objects-series"
while read -r o; do
    if ! cmp -s "$top/build-stock/$o" "$top/build-series/$o"; then
        echo "    differs: $o"
        differ=$((differ + 1))
    fi
done < <(comm -12 "$top/objects-stock" "$top/objects-series")
while read -r o; do
    echo "    only in $o"
    only=$((only + 1))
done < <(comm -3 "$top/objects-stock" "$top/objects-series" | sed -E 's/^\t(.*)$/series: \1/; t; s/^/stock: /')
bins=0
for e in qemu-system-x86_64 qemu-system-aarch64; do
    strip -o "$top/$e.stock" "$top/build-stock/$e"
    strip -o "$top/$e.series" "$top/build-series/$e"
    if ! cmp -s "$top/$e.stock" "$top/$e.series"; then
        echo "    differs: $e (stripped)"
        bins=$((bins + 1))
    fi
done
total=$(comm -12 "$top/objects-stock" "$top/objects-series" | wc -l)
echo "check-off-is-stock: $total objects compared, $differ differ, $only on one side only; emulators: $bins of 2 differ"
[ "$differ" -eq 0 ] && [ "$bins" -eq 0 ]
