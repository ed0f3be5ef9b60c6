#!/usr/bin/env bash
# Overcommit benchmark for steal time / the preempted hint: a 4-vCPU x86_64
# Linux guest on fewer host CPUs runs a lock-heavy workload (THREADS threads
# creating and unlinking files in one directory for SECONDS, rustkvm-probe
# --lockbench) with kvm-steal-time=on and =off, alternating, ROUNDS times;
# prints ops/s of each and the ratio on/off, for two overcommit setups:
#   rr     all vCPUs on one thread (-accel rustkvm,thread=single)
#   mttcg   a thread per vCPU, all pinned to host CPU 0 (taskset -c 0): 4x
#   mttcg2  a thread per vCPU on host CPUs 0 and 1 (taskset -c 0,1): 2x
# Usage: scripts/bench-steal-lock.sh [ROUNDS] [SECONDS] [THREADS] [SETUPS]
#        (3 5 8 "rr mttcg mttcg2")
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-3} secs=${2:-5} threads=${3:-8} setups=${4:-rr mttcg mttcg2}
bash "$RUSTKVM_ROOT/scripts/build-qemu.sh" >/dev/null
bash "$RUSTKVM_ROOT/scripts/build-linux-guests.sh" >/dev/null 2>&1 || die "building the Linux images failed (run scripts/build-linux-guests.sh)"
qemu=$("$RUSTKVM_ROOT/scripts/qemu-path" x86_64)
L="$RUSTKVM_CACHE/linux/x86_64"
run() { # steal-time on|off, rr|mttcg
    local pin=() thread=single
    case "$2" in
        mttcg) pin=(taskset -c 0); thread=multi ;;
        mttcg2) pin=(taskset -c 0,1); thread=multi ;;
    esac
    timeout 300 "${pin[@]}" "$qemu" -M pc -cpu "max,kvm-steal-time=$1" -accel "rustkvm,thread=$thread" -smp 4 -m 512 \
        -nodefaults -display none -serial stdio -no-reboot \
        -kernel "$L/vmlinuz" -initrd "$L/initramfs.cpio.gz" \
        -append "console=ttyS0 loglevel=1 panic=-1 rdinit=/init rustkvm.lockbench=$secs,$threads" 2>/dev/null \
        | sed -n '/===RUSTKVM-PROBE-BEGIN===/{n;p}' \
        | /usr/bin/python3 -c 'import json,sys; print(round(json.load(sys.stdin)["lockbench"]["ops_per_s"]))'
}
printf '%-6s %-6s %14s %14s %8s\n' setup round "on ops/s" "off ops/s" on/off
for setup in $setups; do
    for i in $(seq 1 "$rounds"); do
        on=$(run on "$setup") off=$(run off "$setup")
        [ -n "$on" ] && [ -n "$off" ] || die "$setup round $i: no result"
        printf '%-6s %-6s %14s %14s %8.3f\n' "$setup" "$i" "$on" "$off" "$(echo "$on / $off" | bc -l)"
    done
done
