#!/usr/bin/env bash
# x86 PMU overhead (issues 6 and 11): wall time of the same CPU-bound guest
# workload (tests/guests/src/workload.rs) under, every configuration once per
# round, alternating:
#   tcg_intel   -accel tcg -cpu qemu64,vendor=GenuineIntel (the Intel rows' baseline)
#   pmu_off     -accel rustkvm, -cpu qemu64,vendor=GenuineIntel,pmu=off
#   intel_idle  -accel rustkvm, -cpu ...,pmu=on, the guest never enables a counter
#   intel_count -accel rustkvm, -cpu ...,pmu=on, 2 GP + 3 fixed counters count
#               throughout (x86-pmu-workload)
#   insn_plugin -accel tcg -cpu qemu64,vendor=GenuineIntel with QEMU's contrib
#               insn plugin inline (what counting instructions costs stock QEMU;
#               -d plugin lets it print its count, which is checked)
#   tcg_max     -accel tcg -cpu max (the AMD rows' baseline: the same model)
#   amd_off     -accel rustkvm, -cpu max,pmu=off
#   amd_idle    -accel rustkvm, -cpu max,pmu=on (AMD PMU), never enabled
#   amd_count   -accel rustkvm, -cpu max,pmu=on, 3 counters (instructions,
#               branches, cycles) count throughout (x86-pmu-workload)
#   tcg_maxi    -accel tcg -cpu max,vendor=GenuineIntel (the LBR rows' baseline)
#   lbr_idle    -accel rustkvm, -cpu max,vendor=GenuineIntel,pmu=on: an Intel
#               PMU with LBR (PDCM), never enabled
#   lbr_record  the same, LBR recording every taken branch throughout
#               (x86-lbr-workload)
#   pebs_sample the same model, PEBS sampling instructions throughout: a
#               basic record every 100 000 (x86-pebs-workload)
# Every run must pass (guest summary, exit status) with the workload's usual
# checksum. Each run's CPU time (QEMU's user + system) and wall time; ratios
# of both to the baseline of the same CPU model, per round (tcg_max/tcg_intel:
# what the model alone changes).
# Then, ROUNDS runs of x86-wrmsr-cost: guest-measured cycles of a WRMSR to a
# PMU MSR against a WRMSR TCG handles itself (interleaved inside the guest).
# With RUSTKVM_BENCH_BASELINE=DIR (another build directory, e.g. the build
# before a change: scripts/lib.sh), each round instead runs tcg_intel,
# pmu_off, intel_idle, intel_count, amd_idle, amd_count and lbr_idle on this
# build and on that one (base_CONFIG), alternating, with ratios
# CONFIG/base_CONFIG: what the change costs each configuration (issue 21
# point 3: LBR and PEBS unused within 1.01x of the build before them).
# RUSTKVM_BENCH_CONFIGS="A B ..." runs only those configurations (and
# without a baseline, no x86-wrmsr-cost).
# RUSTKVM_BENCH_HOST_INSNS=1 runs every QEMU under valgrind's cachegrind
# (no cache simulation) and records the host instructions it executed
# (host_insns) besides the times: a count, so a ratio of it resolves what
# this machine's run-to-run time noise (about +-25 % per run here) cannot,
# at about 25 times the run time.
# Usage: scripts/bench-pmu.sh [ROUNDS]   (default 5)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-5}
bench_prepare_guests
cd "$RUSTKVM_ROOT"
qemu=$(bash scripts/qemu-path x86_64)
insn="$(dirname "$qemu")/tests/tcg/plugins/libinsn.so"
bin="$RUSTKVM_ROOT/tests/guests/target/x86_64-unknown-none/release"
intel=qemu64,vendor=GenuineIntel
[ -z "${RUSTKVM_BENCH_BASELINE:-}" ] || bench_prepare_baseline x86_64
if [ "${RUSTKVM_BENCH_HOST_INSNS:-0}" = 1 ] && ! command -v valgrind >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 valgrind >/dev/null \
        || die "apt-get install valgrind failed"
fi
bench_one() {
    local guest=plugin-workload accel=rustkvm cpu extra=() q=$qemu c=$1
    case "$c" in
        base_*) q=$baseline_qemu c=${c#base_} ;;
    esac
    case "$c" in
        tcg_intel) accel=tcg cpu=$intel ;;
        pmu_off) cpu=$intel,pmu=off ;;
        intel_idle) cpu=$intel,pmu=on ;;
        intel_count) cpu=$intel,pmu=on guest=x86-pmu-workload ;;
        insn_plugin) accel=tcg cpu=$intel extra=(-d plugin -plugin "$insn,inline=on") ;;
        tcg_max) accel=tcg cpu=max ;;
        amd_off) cpu=max,pmu=off ;;
        amd_idle) cpu=max,pmu=on ;;
        amd_count) cpu=max,pmu=on guest=x86-pmu-workload ;;
        tcg_maxi) accel=tcg cpu=max,vendor=GenuineIntel ;;
        lbr_idle) cpu=max,vendor=GenuineIntel,pmu=on ;;
        lbr_record) cpu=max,vendor=GenuineIntel,pmu=on guest=x86-lbr-workload ;;
        pebs_sample) cpu=max,vendor=GenuineIntel,pmu=on guest=x86-pebs-workload ;;
        *) die "unknown configuration $1" ;;
    esac
    # isa-debug-exit: a guest that passes exits with status (0 << 1) | 1.
    local vg=()
    [ "${RUSTKVM_BENCH_HOST_INSNS:-0}" != 1 ] \
        || vg=(valgrind --tool=cachegrind --cache-sim=no --smc-check=all-non-file --cachegrind-out-file=/dev/null)
    bench_run "$guest, -accel $accel -cpu $cpu ${extra[*]} ($q)" 1 \
        "${vg[@]}" "$q" -M pc -cpu "$cpu" -accel "$accel" -display none -serial stdio -monitor none \
        -nodefaults -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$bin/$guest" "${extra[@]}"
    bench_guest_passed
    bench_same checksum "$(awk '$1 == "measure" && $2 == "checksum" { print $3 }' "$BENCH_DIR/run.log")"
    case "$c" in
        insn_plugin) bench_expect '^total insns: [1-9]' ;;
        *_count) bench_value instructions >/dev/null ;;
        lbr_record) bench_value tos >/dev/null ;;
        pebs_sample) bench_value records >/dev/null ;;
    esac
    echo "s $BENCH_SECS"
    echo "cpu_s $BENCH_CPU"
    if [ "${RUSTKVM_BENCH_HOST_INSNS:-0}" = 1 ]; then
        echo "host_insns $(awk '/== I +refs:/ { gsub(",", "", $4); print $4 }' "$BENCH_DIR/run.log" | grep -E '^[0-9]+$' \
            || bench_fail "no cachegrind count in its output")"
    fi
}
bench_begin "scripts/bench-pmu.sh $rounds"
qs=(cpu_s s)
[ "${RUSTKVM_BENCH_HOST_INSNS:-0}" != 1 ] || qs=(host_insns "${qs[@]}")
if [ -n "${RUSTKVM_BENCH_BASELINE:-}" ]; then
    read -ra configs <<<"${RUSTKVM_BENCH_CONFIGS:-tcg_intel pmu_off intel_idle intel_count amd_idle amd_count lbr_idle}"
    order=()
    for c in "${configs[@]}"; do order+=("$c" "base_$c"); done
    bench_alternate "$rounds" "${order[@]}"
    ratios=()
    for q in "${qs[@]}"; do
        for c in "${configs[@]}"; do
            mapfile -t -O "${#ratios[@]}" ratios < <(bench_ratios "$q" "base_$c" "$c")
        done
    done
    bench_report "${ratios[@]}"
    exit 0
fi
read -ra configs <<<"${RUSTKVM_BENCH_CONFIGS:-tcg_intel pmu_off intel_idle intel_count insn_plugin tcg_max amd_off \
    amd_idle amd_count tcg_maxi lbr_idle lbr_record pebs_sample}"
bench_alternate "$rounds" "${configs[@]}"
# ratios_of QUANTITY BASE CONFIG...: bench_ratios for those that ran.
ratios_of() {
    local q=$1 base=$2 c
    shift 2
    [[ " ${configs[*]} " == *" $base "* ]] || return 0
    for c in "$@"; do
        [[ " ${configs[*]} " != *" $c "* ]] || bench_ratios "$q" "$base" "$c"
    done
}
ratios=()
for q in "${qs[@]}"; do
    mapfile -t -O "${#ratios[@]}" ratios < <(ratios_of "$q" tcg_intel pmu_off intel_idle intel_count insn_plugin)
    mapfile -t -O "${#ratios[@]}" ratios < <(ratios_of "$q" tcg_max amd_off amd_idle amd_count)
    mapfile -t -O "${#ratios[@]}" ratios < <(ratios_of "$q" tcg_maxi lbr_idle lbr_record pebs_sample)
    mapfile -t -O "${#ratios[@]}" ratios < <(ratios_of "$q" lbr_idle pebs_sample)
    mapfile -t -O "${#ratios[@]}" ratios < <(ratios_of "$q" tcg_intel tcg_max)
done
bench_report "${ratios[@]}"
# A chosen set of configurations measures those only.
[ -z "${RUSTKVM_BENCH_CONFIGS:-}" ] || exit 0
echo
echo "# x86-wrmsr-cost: guest TSC cycles per WRMSR, PMU MSR vs one TCG handles"
: >"$BENCH_DATA"
bench_one() {
    bench_rustkvm_run x86_64 rustkvm x86-wrmsr-cost
    echo "pmu_cycles $(bench_value cycles.wrmsr-pmu)"
    echo "tcg_cycles $(bench_value cycles.wrmsr-tcg)"
}
bench_alternate "$rounds" wrmsr
bench_report --ratio pmu/tcg=wrmsr.pmu_cycles/wrmsr.tcg_cycles
