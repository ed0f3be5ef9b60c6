#!/usr/bin/env bash
# TCG plugin overhead: wall time of the same guest workload
# (tests/guests/src/bin/plugin-workload.rs, plain -accel tcg in rustkvm's
# QEMU build, the same machine and CPU in every configuration) under, every
# configuration once per round, alternating:
#   none          no plugin (the baseline)
#   insn_inline   QEMU's contrib insn plugin, inline=on
#   ours_insns    rustkvm's plugin, counters=instructions
#   ours_ibm      rustkvm's plugin, counters=instructions+branches+mem
#   ours_all      rustkvm's plugin, counters=all
# Every run must pass (guest summary, exit status) with the workload's usual
# checksum, and every plugin must report the whole run's instructions (contrib
# insn's "total insns" under -d plugin, ours from its JSON report, written
# once at exit), all within 0.1 per mille of each other (x86 firmware's
# timer waits vary by a few thousand). Each run's CPU time (QEMU's user +
# system) and wall time; ratios of both to none, per round.
# Usage: scripts/bench-plugin.sh [ROUNDS] [ARCH]   (default 5 x86_64)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
arch=${2:-x86_64}
bench_prepare_plugin "$arch"
cd "$RUSTKVM_ROOT"
insn="$(dirname "$qemu")/tests/tcg/plugins/libinsn.so"
kernel="$RUSTKVM_ROOT/tests/guests/target/$target/release/plugin-workload"
bench_one() {
    local plugin=() report="$BENCH_DIR/plugin.json" n
    rm -f "$report"
    case "$1" in
        none) ;;
        insn_inline) plugin=(-d plugin -plugin "$insn,inline=on") ;;
        ours_insns) plugin=(-plugin "$ours,counters=instructions,quiet=on,outfile=$report") ;;
        ours_ibm) plugin=(-plugin "$ours,counters=instructions+branches+mem,quiet=on,outfile=$report") ;;
        ours_all) plugin=(-plugin "$ours,counters=all,quiet=on,outfile=$report") ;;
        *) die "unknown configuration $1" ;;
    esac
    bench_run "plugin-workload on $arch, $1" "$pass" \
        "$qemu" "${machine[@]}" -accel tcg -display none -serial stdio -monitor none -nodefaults \
        -kernel "$kernel" "${plugin[@]}"
    bench_guest_passed
    bench_same checksum "$(awk '$1 == "measure" && $2 == "checksum" { print $3 }' "$BENCH_DIR/run.log")"
    case "$1" in
        none) ;;
        insn_inline) bench_near instructions "$(awk '$1 == "total" && $2 == "insns:" { print $3 }' "$BENCH_DIR/run.log")" 0.1 ;;
        *)
            n=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["total"]["instructions"])' \
                "$report" 2>/dev/null) || bench_fail "no plugin report with a total instruction count"
            bench_near instructions "$n" 0.1
            ;;
    esac
    echo "s $BENCH_SECS"
    echo "cpu_s $BENCH_CPU"
}
bench_begin "scripts/bench-plugin.sh $rounds $arch"
bench_alternate "$rounds" none insn_inline ours_insns ours_ibm ours_all
ratios=()
for q in cpu_s s; do
    mapfile -t -O "${#ratios[@]}" ratios < <(bench_ratios "$q" none insn_inline ours_insns ours_ibm ours_all)
done
bench_report "${ratios[@]}"
printf '# instructions counted (first plugin run): %s\n' "$(cat "$BENCH_DIR/near.instructions")"
