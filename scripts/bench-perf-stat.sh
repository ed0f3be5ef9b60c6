#!/usr/bin/env bash
# What counting costs a user (issue 19 point 3): Debian's 6.12 kernel with
# Debian's perf, under each architecture and backend, times in one boot
#   loop_bare   rustkvm-probe --spin N: a two-instruction user loop N times
#               (x86_64 `dec; jnz`, aarch64 `subs; b.ne`: tiny blocks)
#   loop_perf   the same under `perf stat -e instructions:u,branches:u`
#   work_bare   busybox gzip -9 of a fixed text (`seq 1 M`): ordinary code,
#               ordinary block sizes
#   work_perf   the same under the same perf stat
# alternating (loop_bare loop_perf work_bare work_perf, ROUNDS times), each
# timed in the guest by `rustkvm-probe --time` (monotonic, spawn to exit),
# which also gives the steal time the guest accounted meanwhile: under
# rustkvm (steal time on, as under KVM) the time the vCPU waited for a host
# CPU, so `run_s` = time - steal is what a neighbour on the host took less
# of (tcg has no steal time: its run_s is its s).
# Backends: rustkvm (the events count) and tcg (x86: the events are
# unsupported; arm64: a PMU that counts nothing without -icount), which
# prices the perf tool alone. tcg-bb (not by default) is tcg with QEMU's
# own test plugin libbb.so,inline=on loaded: every block adds one to a
# per-vCPU block total and its instruction count to another, inline (two
# loads, adds and stores; no test), stock QEMU's cheapest way of counting
# per block (its report at exit must count blocks). Its bare times
# against tcg's (rows "tcg-bb/tcg", across boots) price per-block counting
# in TCG as QEMU does it: the yardstick for rustkvm's perf/bare. Every run
# must exit 0; under rustkvm the
# loop's counts are checked against the loop's own arithmetic (2N
# instructions and N branches, plus at most 10^6 of the process's start
# and exit), the workload's must be non-zero; under tcg x86 perf must say
# `<not supported>`. Prints each time and the per-round ratios perf/bare
# (measured in the same boot), then min / median / max.
#
#   scripts/bench-perf-stat.sh [ROUNDS [N [M [ARCHS [BACKENDS]]]]]
#       defaults: 3 1000000000 600000 "x86_64 aarch64" "rustkvm tcg"
#       (BACKENDS: rustkvm, tcg, tcg-bb)
#
# Not part of the test command. Results in docs/benchmarks.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-3} n=${2:-1000000000} m=${3:-600000} archs=${4:-x86_64 aarch64} backends=${5:-rustkvm tcg}
for v in "$rounds" "$n" "$m"; do
    case "$v" in ''|*[!0-9]*) die "ROUNDS, N and M are numbers (got '$v')" ;; esac
done
for b in $backends; do
    case "$b" in rustkvm|tcg|tcg-bb) ;; *) die "BACKENDS are rustkvm, tcg and tcg-bb (got '$b')" ;; esac
done
bench_prepare_qemu
# tcg-bb: the emulators, through a wrapper that loads libbb.so,inline=on
bbdir="$BENCH_DIR/tcg-bb"
case " $backends " in
*" tcg-bb "*)
    bb="$RUSTKVM_QEMU_BUILD/tests/tcg/plugins/libbb.so"
    [ -f "$bb" ] || die "no $bb (scripts/build-qemu.sh builds it)"
    mkdir -p "$bbdir"
    ln -s "$RUSTKVM_QEMU_BUILD/qemu-bundle" "$bbdir/qemu-bundle"
    ln -s "$RUSTKVM_QEMU_BUILD/pc-bios" "$bbdir/pc-bios"
    for a in x86_64 aarch64; do
        printf '#!/bin/sh\nexec %q -plugin %q,inline=on -d plugin -D %q "$@"\n' \
            "$RUSTKVM_QEMU_BUILD/qemu-system-$a" "$bb" "$bbdir/bb-$a.log" >"$bbdir/qemu-system-$a"
        chmod +x "$bbdir/qemu-system-$a"
    done
    ;;
esac
for a in $archs; do bench_prepare_linux "$a"; done
(cd "$RUSTKVM_ROOT" && cargo build --release --quiet -p rustkvm-tests --bin rustkvm-linux) \
    || die "building rustkvm-linux failed"
linux="$RUSTKVM_ROOT/target/release/rustkvm-linux"

script="$BENCH_DIR/bench.sh"
cat >"$script" <<EOF
# scripts/bench-perf-stat.sh's guest side (busybox sh).
P=/rustkvm-probe
busybox seq 1 $m >/tmp/data
timed() { # LABEL CMD...: one timed run; its perf output (if any) after
    label=\$1; shift
    if ! \$P --time "\$@" >/dev/null 2>/tmp/t; then
        cat /tmp/t; echo "rustkvm-bench-failed \$r \$label"; exit 1
    fi
    echo "rustkvm-bench \$r \$label \$(sed -n 's/^time-ns \([0-9]*\) steal-ns \([0-9]*\) status 0\$/\1 \2/p' /tmp/t)"
    if [ -f /tmp/ps ]; then sed "s/^/rustkvm-bench-perf \$r \$label /" /tmp/ps; rm -f /tmp/ps; fi
}
stat="perf stat -x, -o /tmp/ps -e instructions:u,branches:u"
r=0
while [ \$r -lt $rounds ]; do
    r=\$((r + 1))
    timed loop_bare \$P --spin $n
    timed loop_perf \$stat \$P --spin $n
    timed work_bare busybox gzip -9 -c /tmp/data
    timed work_perf \$stat busybox gzip -9 -c /tmp/data
done
echo rustkvm-bench-done
EOF

bench_begin "scripts/bench-perf-stat.sh $rounds $n $m \"$archs\" \"$backends\""
printf '# kernel: Debian %s; perf: Debian linux-perf (this machine'"'"'s apt sources)\n' \
    "$(cat "$BENCH_SHARED_CACHE/linux/x86_64/vmlinuz.src" 2>/dev/null || echo '?')"
# count ROUND WORK EVENT: the count perf printed for it (its CSV:
# COUNT,UNIT,EVENT,...), "<not supported>" included.
count() {
    awk -F, -v r="$1" -v w="$2" -v e="$3" \
        '{ split($1, f, " "); v = $1; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", v) }
         f[1] == "rustkvm-bench-perf" && f[2] == r && f[3] == w && $3 == e { print v }' \
        "$BENCH_DIR/run.log"
}
ratios=()
for a in $archs; do
    for b in $backends; do
        c="${a}_$b" qb=$RUSTKVM_QEMU_BUILD backend=$b
        if [ "$b" = tcg-bb ]; then qb=$bbdir backend=tcg; fi
        bench_run "$a $b" 0 env RUSTKVM_CACHE="$BENCH_SHARED_CACHE" RUSTKVM_QEMU_BUILD="$qb" "$linux" \
            --kernel "$BENCH_SHARED_CACHE/linux/$a/vmlinuz" --arch "$a" --backend "$backend" \
            --packages linux-perf --add "$script:/root/bench.sh" --run 'sh /root/bench.sh' \
            --timeout 3600
        bench_expect '^rustkvm-bench-done$'
        if [ "$b" = tcg-bb ]; then
            grep -Eq "^Total: bb's: [1-9][0-9]*, insns: [1-9]" "$bbdir/bb-$a.log" 2>/dev/null \
                || bench_fail "libbb.so reported no count (its log: $bbdir/bb-$a.log)"
        fi
        ! grep -q '^rustkvm-bench-failed' "$BENCH_DIR/run.log" || bench_fail "a timed run failed"
        cp "$BENCH_DIR/run.log" "$BENCH_DIR/run-$c.log"
        for r in $(seq 1 "$rounds"); do
            for w in loop_bare loop_perf work_bare work_perf; do
                read -r ns st < <(awk -v r="$r" -v w="$w" '$1 == "rustkvm-bench" && $2 == r && $3 == w { print $4, $5 }' "$BENCH_DIR/run.log")
                case "$ns:$st" in :*|*:|*[!0-9:]*) bench_fail "round $r, $w: no time and steal (got '$ns' '$st')" ;; esac
                awk -v ns="$ns" -v st="$st" -v r="$r" -v c="$c" -v w="$w" 'BEGIN {
                    printf "%s %s_%s s %.4f\n", r, c, w, ns / 1e9
                    printf "%s %s_%s run_s %.4f\n", r, c, w, (ns - st) / 1e9 }' >>"$BENCH_DATA"
            done
            for w in loop_perf work_perf; do
                ins=$(count "$r" "$w" instructions:u) br=$(count "$r" "$w" branches:u)
                if [ "$b" = rustkvm ]; then
                    case "$ins$br" in ''|*[!0-9]*) bench_fail "round $r, $w: no counts (instructions '$ins', branches '$br')" ;; esac
                    if [ "$w" = loop_perf ]; then
                        [ "$ins" -ge $((2 * n)) ] && [ "$ins" -le $((2 * n + 1000000)) ] \
                            || bench_fail "round $r: the loop's instructions:u $ins, want 2N = $((2 * n)) (+ at most 10^6)"
                        [ "$br" -ge "$n" ] && [ "$br" -le $((n + 1000000)) ] \
                            || bench_fail "round $r: the loop's branches:u $br, want N = $n (+ at most 10^6)"
                    else
                        [ "$ins" -gt 0 ] && [ "$br" -gt 0 ] || bench_fail "round $r: the workload counted nothing"
                    fi
                elif [ "$a" = x86_64 ] && [ "$ins" != '<not supported>' ]; then
                    bench_fail "round $r, $w: tcg x86 counted instructions:u '$ins' (want <not supported>)"
                fi
            done
        done
        ratios+=(--ratio "$a $b: loop perf/bare=${c}_loop_perf.s/${c}_loop_bare.s"
            --ratio "$a $b: gzip perf/bare=${c}_work_perf.s/${c}_work_bare.s")
        if [ "$b" = tcg-bb ] && [[ " $backends " = *" tcg "* ]]; then
            # across boots: QEMU's per-block counting against none
            ratios+=(--ratio "$a tcg-bb/tcg: loop bare=${c}_loop_bare.s/${a}_tcg_loop_bare.s"
                --ratio "$a tcg-bb/tcg: gzip bare=${c}_work_bare.s/${a}_tcg_work_bare.s")
        fi
        if [ "$b" = rustkvm ]; then
            ratios+=(--ratio "$a $b: loop perf/bare, steal out=${c}_loop_perf.run_s/${c}_loop_bare.run_s"
                --ratio "$a $b: gzip perf/bare, steal out=${c}_work_perf.run_s/${c}_work_bare.run_s")
        fi
        printf '# %s %s: done (%s s wall)\n' "$a" "$b" "$BENCH_SECS" >&2
    done
done
bench_report "${ratios[@]}"
