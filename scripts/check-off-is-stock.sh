#!/usr/bin/env bash
# Issue 19 point 2: with the build option rustkvm off, the series' tip must
# be stock QEMU. Builds stock QEMU and the series' tip with the option off,
# one after the other, from the same source path and in sibling build
# directories, then compares every object and the stripped emulators
# (docs/series-plan.md §3.6).
#
# Stock is the orig tarball with Debian's fixes and the series' standalone
# fixes (meant for upstream, not gated: the commits whose subject does not
# name rustkvm), i.e. the parent of the first `rustkvm:` commit with the
# later standalone fixes cherry-picked onto it in order. Both builds use -g0 and a forced include, a system header, that
# defines __LINE__ as 0: a line the series inserts shifts __LINE__ in every
# later assert of its file. (-D__LINE__=0 warned "redefined" whatever -W
# said, and configure's probes then took PIE for unsupported and linked a
# PIE of -fno-pie objects.)
#
#   scripts/check-off-is-stock.sh                   # QEMU 10.0 (the default)
#   RUSTKVM_QEMU=10.2 scripts/check-off-is-stock.sh # QEMU 10.2
#
# One difference is allowed, and checked for what it is: QAPI. The series'
# schema module (qapi/rustkvm.json) is under `if: CONFIG_RUSTKVM_ANY`, so
# with the option off nothing of it is compiled in, but QAPI's
# introspection names types by numbers it assigns in schema order, and
# rustkvm's types, numbered even where they are compiled out, renumber
# others: qapi-introspect.c.o differs, and the rustkvm module's (empty)
# objects exist in the series' build only. That is allowed when the two
# emulators introspect the same schema once masked names are canonical
# (scripts/qmp-schema-canon.py) and the series' emulators link no symbol
# named rustkvm, and each emulator linked again with stock's
# qapi-introspect.c.o is stock's, byte for byte once stripped: the
# emulators then differ by that data alone. An object
# whose only difference is the names of local symbols (which the stripped
# emulators do not have) is the same code and data: reported, allowed.
#
# Prints each object that differs or exists on one side only, and a
# summary; exits 1 if anything else differs. Slow (two full
# builds of both emulators; ccache helps the second time): not part of the
# test command or CI. Record its result in docs/building.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# RUSTKVM_QEMU=10.2 checks QEMU 10.2's series (its own directory).
case "$(qemu_release)" in
    10.0) top="$RUSTKVM_CACHE/off-check" ;;
    *) top="$RUSTKVM_CACHE/off-check-$(qemu_release)" ;;
esac
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
mapfile -t patches < <(qemu_patches)
key=$({ cat "${patches[@]}"; echo "$(qemu_release) $cflags $PYTHONHASHSEED"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$top/repo.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$repo" "$top/repo.key" "$top"/build-*
    bash "$RUSTKVM_ROOT/scripts/qemu-series.sh" import "$repo" >/dev/null
    git -C "$repo" tag series
    echo "$key" >"$top/repo.key"
fi

# Stock is upstream with the fixes meant for it (0001-0003 and 0056
# today): the parent of the first rustkvm: commit, then every later commit
# whose subject does not name rustkvm, cherry-picked in order (a fix found
# after the series was written comes at its end, not renumbering it).
# (awk reads to the end: an early exit would end git with SIGPIPE, which
# pipefail makes the script's exit status once the log passes a pipe's
# first write, as 47 patches' subjects did.)
first=$(git -C "$repo" log --reverse --format='%H %s' base..series | awk '$2 == "rustkvm:" && !c { c = $1 } END { print c }')
[ -n "$first" ] || die "no rustkvm: commit in the series"
mapfile -t later < <(git -C "$repo" log --reverse --format='%H %s' "$first^..series" | awk 'tolower($0) !~ /rustkvm/ { print $1 }')
if [ "${#later[@]}" -eq 0 ]; then
    stock=$(git -C "$repo" rev-parse "$first^")
else
    git -C "$repo" checkout -q -f -B stock "$first^"
    git -C "$repo" -c user.name=check-off-is-stock -c user.email=check@localhost \
        cherry-pick "${later[@]}" >/dev/null \
        || die "a later standalone fix (${later[*]}) does not apply to stock without the rustkvm patches"
    stock=$(git -C "$repo" rev-parse stock)
fi
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
# The QAPI objects allowed to differ (see the top), as find prints them.
# (10.0 compiles the introspection data per target, 10.2 once.)
qapi_introspect='^\./lib(qemu-[a-z0-9_]+-softmmu|qemuutil)\.a\.p/meson-generated_\.\._qapi_qapi-introspect\.c\.o$'
qapi_rustkvm='^\./libqemuutil\.a\.p/meson-generated_\.\._(qapi_qapi-[a-z]+-rustkvm|trace_trace-qapi_[a-z]+_rustkvm_trace_events)\.c\.o$'
differ=0 only=0 qapi=0 names=0 introspect=()
(cd "$top/build-stock" && find . -name '*.o' | sort) >"$top/objects-stock"
(cd "$top/build-series" && find . -name '*.o' | sort) >"$top/objects-series"
while read -r o; do
    if ! cmp -s "$top/build-stock/$o" "$top/build-series/$o"; then
        if [[ "$o" =~ $qapi_introspect ]]; then
            echo "    differs (QAPI's numbering): $o"
            qapi=$((qapi + 1))
            introspect+=("$o")
        elif objcopy --discard-all "$top/build-stock/$o" "$top/x.stock.o" \
            && objcopy --discard-all "$top/build-series/$o" "$top/x.series.o" \
            && cmp -s "$top/x.stock.o" "$top/x.series.o"; then
            # e.g. GCC's switch tables CSWTCH.<n>: n counts the
            # declarations before them, and rustkvm.h adds some.
            echo "    differs in local symbols' names only: $o"
            names=$((names + 1))
        else
            echo "    differs: $o"
            differ=$((differ + 1))
        fi
    fi
done < <(comm -12 "$top/objects-stock" "$top/objects-series")
while read -r side o; do
    if [ "$side" = series ] && [[ "$o" =~ $qapi_rustkvm ]]; then
        echo "    only in series (the QAPI module): $o"
        qapi=$((qapi + 1))
    else
        echo "    only in $side: $o"
        only=$((only + 1))
    fi
done < <(comm -3 "$top/objects-stock" "$top/objects-series" | sed -E 's/^\t(.*)$/series \1/; t; s/^/stock /')
# off_relinked_is_stock EMULATOR: the series' EMULATOR built again with
# stock's qapi-introspect.c.o in place of its own is, stripped, stock's:
# then the introspection data is all that differs. The object is swapped
# with its time kept (a newer one would be compiled again), and the
# emulator and the object's archive are removed, so that ninja archives
# and links again and compiles nothing; the series' objects are put back
# the same way after, and the emulator built again.
off_relinked_is_stock() {
    local e=$1 o st=0
    off_swap() { # FROM: each introspection object from FROM, time kept
        for o in "${introspect[@]}"; do
            cp "$1/$o" "$top/build-series/$o.new"
            touch -r "$top/build-series/$o" "$top/build-series/$o.new"
            mv "$top/build-series/$o.new" "$top/build-series/$o"
            rm -f "$top/build-series/${o%%.p/*}"
        done
        rm -f "$top/build-series/$e"
    }
    mkdir -p "$top/keep"
    for o in "${introspect[@]}"; do
        mkdir -p "$top/keep/$(dirname "$o")"
        cp -p "$top/build-series/$o" "$top/keep/$o"
    done
    off_swap "$top/build-stock"
    if ninja -C "$top/build-series" "$e" >"$top/relink-$e.log" 2>&1 \
        && ! grep -q 'Compiling' "$top/relink-$e.log"; then
        strip -o "$top/$e.relinked" "$top/build-series/$e"
        cmp -s "$top/$e.relinked" "$top/$e.stock" || st=1
    else
        echo "    building $e with stock's introspection failed or compiled (log: $top/relink-$e.log)"
        st=1
    fi
    off_swap "$top/keep"
    rm -rf "$top/keep"
    ninja -C "$top/build-series" "$e" >>"$top/relink-$e.log" 2>&1 || die "building $e back failed (log: $top/relink-$e.log)"
    return "$st"
}
bins=0 schema=0
for e in qemu-system-x86_64 qemu-system-aarch64; do
    strip -o "$top/$e.stock" "$top/build-stock/$e"
    strip -o "$top/$e.series" "$top/build-series/$e"
    if nm "$top/build-series/$e" | grep -qi rustkvm; then
        echo "    links rustkvm symbols: $e ($(nm "$top/build-series/$e" | grep -ci rustkvm))"
        bins=$((bins + 1))
    fi
    python3 "$RUSTKVM_ROOT/scripts/qmp-schema-canon.py" "$top/build-stock/$e" "$top/$e.schema-stock"
    python3 "$RUSTKVM_ROOT/scripts/qmp-schema-canon.py" "$top/build-series/$e" "$top/$e.schema-series"
    if ! cmp -s "$top/$e.schema-stock" "$top/$e.schema-series"; then
        echo "    introspects another schema: $e (diff $top/$e.schema-stock $top/$e.schema-series)"
        schema=$((schema + 1))
    fi
    if cmp -s "$top/$e.stock" "$top/$e.series"; then
        echo "    same: $e (stripped)"
    elif [ "${#introspect[@]}" -gt 0 ] && off_relinked_is_stock "$e"; then
        echo "    differs: $e (stripped), by QAPI's introspection data alone (linked with stock's, it is stock's)"
    else
        echo "    differs: $e (stripped)"
        bins=$((bins + 1))
    fi
done
total=$(comm -12 "$top/objects-stock" "$top/objects-series" | wc -l)
rm -f "$top/x.stock.o" "$top/x.series.o"
echo "check-off-is-stock: $total objects compared, $differ differ and $only on one side only" \
    "(besides $qapi of QAPI's and $names in local symbols' names only)," \
    "emulators: $bins of 2 differ otherwise, $schema of 2 introspect another schema"
[ "$differ" -eq 0 ] && [ "$only" -eq 0 ] && [ "$bins" -eq 0 ] && [ "$schema" -eq 0 ]
