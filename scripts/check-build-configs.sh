#!/usr/bin/env bash
# The series' tip in the configurations issue 19 point 2 names beyond the
# two emulators build-qemu.sh makes, each with a declared verdict:
#
#   scripts/check-build-configs.sh      # RUSTKVM_QEMU=10.2: QEMU 10.2's series
#
#   other-targets   -Drustkvm=enabled with the library, system targets
#                   x86_64, aarch64, i386, arm and riscv64 and the
#                   user-mode x86_64-linux-user: all six build (-Werror:
#                   the tree is a git checkout; i386 and arm share their
#                   target code with a rustkvm target, on 10.2 arm's
#                   cpu.c is even compiled once for both); the `-accel
#                   help` of qemu-system-i386, -arm and -riscv64 lists no
#                   rustkvm; qemu-system-arm runs guest code under TCG
#                   (its PC leaves the reset vector) and quits cleanly;
#                   qemu-system-riscv64 answers x-query-rustkvm with
#                   "rustkvm is not in use"; qemu-x86_64 runs /bin/true
#   auto-no-tcg     -Drustkvm=auto --disable-tcg with the library, x86_64:
#                   configures with rustkvm off (CONFIG_RUSTKVM_ANY
#                   undefined), builds, `-accel help` lists kvm and no
#                   rustkvm, and `nm` finds no rustkvm symbol
#   on-no-tcg       -Drustkvm=enabled --disable-tcg: configure refuses,
#                   saying "rustkvm needs TCG"
#
# The series is imported (scripts/qemu-series.sh import) into
# $RUSTKVM_CACHE/qemu-configs[-10.2]/src, each configuration built in a
# directory of its own beside it (ccache shared with build-qemu.sh). Prints
# one line per configuration and exits 1 if one is not as declared; logs
# in $RUSTKVM_CACHE/qemu-configs[-10.2]/logs/. Slow (a cold build of the
# arm and riscv64 targets): not part of the test command or CI. Record
# its result in docs/building.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

qemu_series_checkout qemu-configs
qemu_ccache_env
git -C "$repo" checkout -q -f series
ok "QEMU $(qemu_release), $(git -C "$repo" rev-list --count base..series) patches"

# QEMU_CONFIGURE_ARGS with another target list and more arguments
# (without --enable-plugins when they disable TCG: configure refuses
# plugins without it; without --disable-user when they enable it).
configure_args() { # TARGETS ARGS...
    local a targets=$1 notcg= user=
    shift
    case " $* " in *" --disable-tcg "*) notcg=1 ;; esac
    case " $* " in *" --enable-user "*) user=1 ;; esac
    for a in "${QEMU_CONFIGURE_ARGS[@]}"; do
        case "$a" in
        --target-list=*) echo "--target-list=$targets" ;;
        --enable-tcg) ;;    # each configuration says
        --enable-plugins) [ -n "$notcg" ] || echo "$a" ;;
        --disable-user) [ -n "$user" ] || echo "$a" ;;
        *) echo "$a" ;;
        esac
    done
    printf '%s\n' "$@"
}

# build NAME TARGETS ARGS...: configure (when the arguments change) and
# build everything in build-NAME; 0 when both succeed, else 1 with the
# reason in $why.
build() {
    local name=$1 targets=$2
    shift 2
    mapfile -t args < <(configure_args "$targets" "$@")
    qemu_series_build "$top/build-$name" "$logs/$name.log" -- "${args[@]}" && return
    if [ "$why" = configure ]; then
        why="configure: $(grep -m1 -E 'ERROR|error' "$logs/$name.log" | cut -c1-100)"
    else
        why="build: $why"
    fi
    return 1
}

failed=0
verdict() { # NAME OK|FAIL TEXT
    printf '%-14s %s: %s\n' "$1" "$2" "$3"
    [ "$2" = OK ] || failed=$((failed + 1))
}
accels() { "$1" -accel help 2>&1 | sed 1d | tr '\n' ' '; }

step "other-targets: -Drustkvm=enabled, x86_64 aarch64 i386 arm riscv64, x86_64-linux-user"
why=
if build other-targets x86_64-softmmu,aarch64-softmmu,i386-softmmu,arm-softmmu,riscv64-softmmu,x86_64-linux-user \
    --enable-tcg --enable-user -Drustkvm=enabled "-Drustkvm_lib=$lib"; then
    d="$top/build-other-targets" bad=
    for a in x86_64 aarch64; do
        accels "$d/qemu-system-$a" | grep -qw rustkvm || bad+="qemu-system-$a lists no rustkvm ($(accels "$d/qemu-system-$a")); "
    done
    for a in i386 arm riscv64; do
        ! accels "$d/qemu-system-$a" | grep -qw rustkvm || bad+="qemu-system-$a lists rustkvm; "
    done
    q=$(printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"x-query-rustkvm"}' '{"execute":"quit"}' \
        | timeout 60 "$d/qemu-system-riscv64" -M virt -bios none -S -display none -nodefaults -qmp stdio 2>&1 || true)
    grep -q '"desc": "rustkvm is not in use' <<<"$q" || bad+="qemu-system-riscv64's x-query-rustkvm: $(grep -m1 -o '"error".*' <<<"$q" || echo "${q:0:100}"); "
    # qemu-system-arm under TCG: its CPU loop runs the hooks it shares with
    # aarch64 (the stubs on 10.2); without firmware the flash is zeros,
    # `andeq r0, r0, r0`, so the PC walks up from 0 once the vCPU runs.
    rc=0
    q=$( { printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"cont"}'
           sleep 2
           printf '%s\n' '{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}' '{"execute":"quit"}'
         } | timeout 60 "$d/qemu-system-arm" -M virt -S -display none -nodefaults -qmp stdio 2>&1) || rc=$?
    pc=$(grep -m1 -o 'R15=[0-9a-f]*' <<<"$q" || true)
    [ "$rc" = 0 ] && [ -n "$pc" ] && [ "$pc" != R15=00000000 ] \
        || bad+="qemu-system-arm under tcg: exit $rc, ${pc:-no R15 in info registers}: $(grep -m1 -iE 'error|assert' <<<"$q" | cut -c1-100 || true); "
    timeout 60 "$d/qemu-x86_64" /bin/true || bad+="qemu-x86_64 /bin/true exited $?; "
    if [ -z "$bad" ]; then
        verdict other-targets OK "6 emulators build; i386, arm and riscv64 list $(accels "$d/qemu-system-riscv64")and riscv64 says rustkvm is not in use; qemu-system-arm ran to $pc under tcg; qemu-x86_64 runs /bin/true"
    else
        verdict other-targets FAIL "$bad"
    fi
else
    verdict other-targets FAIL "$why"
fi

step "auto-no-tcg: -Drustkvm=auto --disable-tcg, x86_64"
why=
if build auto-no-tcg x86_64-softmmu --disable-tcg -Drustkvm=auto "-Drustkvm_lib=$lib"; then
    d="$top/build-auto-no-tcg" bad=
    grep -q '#undef CONFIG_RUSTKVM_ANY' "$d/config-host.h" || bad+="config-host.h does not #undef CONFIG_RUSTKVM_ANY; "
    accels "$d/qemu-system-x86_64" | grep -qw kvm || bad+="-accel help lists no kvm; "
    ! accels "$d/qemu-system-x86_64" | grep -qw rustkvm || bad+="-accel help lists rustkvm; "
    n=$(nm "$d/qemu-system-x86_64" | grep -ci rustkvm || true)
    [ "$n" = 0 ] || bad+="$n symbols named rustkvm; "
    if [ -z "$bad" ]; then
        verdict auto-no-tcg OK "builds with rustkvm off; -accel help: $(accels "$d/qemu-system-x86_64"); no rustkvm symbol"
    else
        verdict auto-no-tcg FAIL "$bad"
    fi
else
    verdict auto-no-tcg FAIL "$why"
fi

step "on-no-tcg: -Drustkvm=enabled --disable-tcg, x86_64 (configure must refuse)"
why=
if build on-no-tcg x86_64-softmmu --disable-tcg -Drustkvm=enabled "-Drustkvm_lib=$lib"; then
    verdict on-no-tcg FAIL "configured and built; want configure to refuse"
elif grep -q 'rustkvm needs TCG' "$logs/on-no-tcg.log"; then
    verdict on-no-tcg OK "configure refuses: $(grep -m1 -o 'rustkvm needs TCG.*' "$logs/on-no-tcg.log")"
    rm -rf "$top/build-on-no-tcg"
else
    verdict on-no-tcg FAIL "$why"
fi

echo "check-build-configs: QEMU $(qemu_release): $failed of 3 configurations not as declared (logs: $logs)"
[ "$failed" -eq 0 ]
