#!/usr/bin/env bash
# How long the kvm column takes for real (issue 47 item 5): real KVM nested
# in a rustkvm L1 (docs/nested.md), per architecture, alternating x86_64
# and aarch64 each round:
#   - the L1 with one bundled guest (`rustkvm-run --nested hello`): the
#     whole run's wall time, the L1's uptime when its /dev/kvm was there
#     (kernel boot, the probe, the modules) and the guest's own time in L1;
#   - the L1 with one Linux boot (`rustkvm-linux --nested --backend kvm`,
#     the probe, 2 vCPUs): wall time and the nested boot's time in L1;
#   - with --matrix, every bundled guest of the architecture in one L1
#     (`rustkvm-run --nested --backend kvm`): wall time. Every cell must
#     PASS or SKIP (x86-pam-flip's L2 triple fault, a stock TCG SVM bug,
#     was fixed by patch 0056: docs/nested.md).
# Every run's verdicts are checked. Needs QEMU for both hosts
# (scripts/build-qemu.sh, RUSTKVM_QEMU_HOST=aarch64 scripts/build-qemu.sh)
# and the Linux images (scripts/build-linux-guests.sh); builds the guests
# and the runners. Not a test: times depend on the machine and its load.
# Usage: scripts/bench-nested.sh [ROUNDS] [--matrix]   (default 3 rounds)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=3 matrix=0
for a in "$@"; do
    case "$a" in
        --matrix) matrix=1 ;;
        [0-9]*) rounds=$a ;;
        *) die "usage: scripts/bench-nested.sh [ROUNDS] [--matrix]" ;;
    esac
done
cd "$RUSTKVM_ROOT"
bash scripts/build-guests.sh >/dev/null 2>&1 || die "building the guests failed"
cargo build --release --quiet -p rustkvm-tests --bin rustkvm-run --bin rustkvm-linux \
    || die "building the runners failed"
bench_scratch
run_bin="$RUSTKVM_ROOT/target/release/rustkvm-run"
linux_bin="$RUSTKVM_ROOT/target/release/rustkvm-linux"

# The L1's own line (tests/src/nested.rs): "/dev/kvm at S s of its uptime".
l1_ready() {
    local v
    v=$(sed -n 's/^rustkvm nested: .*\/dev\/kvm at \([0-9.]*\) s of its uptime$/\1/p' "$BENCH_DIR/run.log" | head -n 1)
    [ -n "$v" ] || bench_fail "no L1 '/dev/kvm at' line"
    printf '%s' "$v"
}

bench_one() {
    local arch=${1%-matrix} v
    case "$1" in
        *-matrix)
            bench_run "every guest nested on $arch" 0 "$run_bin" --nested --backend kvm --arch "$arch" --quiet
            bench_expect '^[0-9]+ passed, 0 failed, [0-9]+ skipped$'
            echo "matrix_wall_s $BENCH_SECS"
            ;;
        *)
            bench_run "hello nested on $arch" 0 "$run_bin" --nested --backend kvm --arch "$arch" hello
            bench_expect "^hello/$arch/default +PASS"
            echo "l1_and_hello_wall_s $BENCH_SECS"
            echo "l1_kvm_ready_s $(l1_ready)"
            v=$(sed -n "s|^hello/$arch/default \{1,\}PASS \([0-9.]*\)s *$|\1|p" "$BENCH_DIR/run.log")
            [ -n "$v" ] || bench_fail "no time in hello's cell"
            echo "hello_in_l1_s $v"
            bench_run "Linux nested on $arch" 0 "$linux_bin" --nested --backend kvm --arch "$arch"
            v=$(sed -n "s|^$arch/kvm,nested/smp2 \{1,\}\([0-9.]*\)s OK$|\1|p" "$BENCH_DIR/run.log")
            [ -n "$v" ] || bench_fail "the nested Linux boot did not end OK"
            echo "l1_and_linux_wall_s $BENCH_SECS"
            echo "linux_in_l1_s $v"
            ;;
    esac
}

configs=(x86_64 aarch64)
[ "$matrix" = 0 ] || configs+=(x86_64-matrix aarch64-matrix)
bench_begin "scripts/bench-nested.sh $*"
bench_alternate "$rounds" "${configs[@]}"
bench_report
