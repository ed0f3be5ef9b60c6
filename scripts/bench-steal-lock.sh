#!/usr/bin/env bash
# Overcommit benchmark for steal time / the preempted hint: a 4-vCPU x86_64
# Linux guest (-cpu max, one PV feature on or off: the same model
# otherwise) on fewer host CPUs runs a contended workload for SECONDS with
# THREADS threads in three overcommit setups:
#   rr      all vCPUs on one thread (-accel rustkvm,thread=single)
#   mttcg   a thread per vCPU, all pinned to host CPU 0 (taskset -c 0): 4x
#   mttcg2  a thread per vCPU on host CPUs 0 and 1 (taskset -c 0,1): 2x
# WORKLOAD:
#   lock    threads creating and unlinking files in one directory
#           (rustkvm-probe --lockbench), kvm-steal-time=on against =off
#   tlb     threads of one process writing a page each and taking write
#           access away again, so every mprotect flushes the other CPUs'
#           TLBs (rustkvm-probe --tlbbench), kvm-pv-tlb-flush=on against
#           =off (steal time on)
# Each round boots every setup with the feature on and off, alternating
# (rr_on rr_off mttcg_on mttcg_off ...); every boot must end with the probe's
# report and exit status 0. Prints ops/s and on/off per setup and round, then
# min / median / max.
# Usage: scripts/bench-steal-lock.sh [ROUNDS] [SECONDS] [THREADS] [SETUPS] [WORKLOAD]
#        (3 5 8 "rr mttcg mttcg2" lock)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-3} secs=${2:-5} threads=${3:-8} setups=${4:-rr mttcg mttcg2} workload=${5:-lock}
case "$workload" in
    lock) feature=kvm-steal-time bench=lockbench ;;
    tlb) feature=kvm-pv-tlb-flush bench=tlbbench ;;
    *) die "unknown workload $workload (lock or tlb)" ;;
esac
bench_prepare_qemu
bench_prepare_linux x86_64
qemu=$("$RUSTKVM_ROOT/scripts/qemu-path" x86_64)
L="$RUSTKVM_CACHE/linux/x86_64"
bench_one() { # SETUP_on or SETUP_off
    local setup=${1%_*} on=${1##*_} pin=() thread=single ops
    case "$setup" in
        rr) ;;
        mttcg) pin=(taskset -c 0) thread=multi ;;
        mttcg2) pin=(taskset -c 0,1) thread=multi ;;
        *) die "unknown setup $setup" ;;
    esac
    bench_run "Linux $bench, $setup, $feature=$on" 0 \
        timeout 300 "${pin[@]}" "$qemu" -M pc -cpu "max,$feature=$on" \
        -accel "rustkvm,thread=$thread" -smp 4 -m 512 \
        -nodefaults -display none -serial stdio -no-reboot \
        -kernel "$L/vmlinuz" -initrd "$L/initramfs.cpio.gz" \
        -append "console=ttyS0 loglevel=1 panic=-1 rdinit=/init rustkvm.$bench=$secs,$threads"
    bench_expect '^===RUSTKVM-PROBE-BEGIN===$' '^rustkvm-init: probe exited with status 0$'
    ops=$(sed -n '/^===RUSTKVM-PROBE-BEGIN===$/{n;p;q}' "$BENCH_DIR/run.log" \
        | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["lockbench"]["ops_per_s"]))' 2>/dev/null) \
        || bench_fail "the probe's report has no lockbench.ops_per_s"
    [ "$ops" -gt 0 ] || bench_fail "no $bench operations done"
    echo "ops_per_s $ops"
}
configs=() ratios=()
for s in $setups; do
    configs+=("${s}_on" "${s}_off")
    ratios+=(--ratio "$s:on/off=${s}_on.ops_per_s/${s}_off.ops_per_s")
done
bench_begin "scripts/bench-steal-lock.sh $rounds $secs $threads \"$setups\" $workload"
bench_alternate "$rounds" "${configs[@]}"
bench_report "${ratios[@]}"
