#!/usr/bin/env bash
# Linux's KVM selftests on real KVM inside an L1 (issue 48): the L1 is the
# project's Debian 6.12 kernel booted as a hypervisor (x86: an AMD model with
# TCG's SVM, kvm_amd loaded; arm64: virt,virtualization=on, gic-version=3,
# KVM/arm64 at EL2) under each column's accelerator, the same CPU model and
# machine, and every selftest of scripts/build-kvm-selftests.sh runs in it in
# turn. Prints one table, selftest x column: PASS, FAIL (exit status), SKIP
# (kselftest's 4, with its reason), TIMEOUT.
#
#   scripts/kvm-selftests.sh ARCH [COLUMN...]    ARCH x86_64|aarch64
#
# A COLUMN is an L1 configuration in rustkvm-linux's --backend syntax: tcg or
# rustkvm, with ,icount (-icount shift=0,sleep=off: the L1's time counts its
# instructions, so a selftest's timing margins no longer depend on how fast
# the host runs TCG) and, x86, ,pmu=epyc (-cpu EPYC,pmu=on: family 17h, the
# Zen family pmu_event_filter_test knows; no PerfMonV2), ,pmu=epyc-v2 (the
# same with perfmon-v2=on) or the default -cpu max (PerfMonV2 on rustkvm, a
# family below 17h). Default columns: tcg rustkvm. The x86 L1 boots
# with clocksource=tsc tsc=reliable, as a KVM host on hardware runs (KVM's
# clock selftests require a TSC clocksource; an L1 on rustkvm would take
# kvm-clock).
#   KST_FILTER=REGEX   only the selftests whose name matches (grep -E)
#   KST_TIMEOUT=S      each selftest's limit in the L1 (default 120 s)
#   KST_JUNIT=FILE     also a JUnit file (one testcase per selftest and column)
#   KST_EXPECT=FILE    the declared verdicts (default tests/kvm-selftests.expect)
#   KST_LOGS=DIR       judge the logs of an earlier run (its runs/ directory)
#                      again instead of booting: after editing KST_EXPECT
#
# Every verdict is declared: a selftest passes on every column unless
# KST_EXPECT says otherwise (ARCH SELFTEST-GLOB COLUMN-GLOB VERDICT REASON;
# the first matching line wins; VERDICT ANY: not judged, for a column whose
# outcome depends on how fast the host runs it). Exit status 1 if a verdict is not the declared
# one, or if a selftest passes on a tcg column and not on its rustkvm
# counterpart (the issue's first goal). Logs: $RUSTKVM_CACHE/kvm-selftests/runs/.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

arch=${1:-}
case "$arch" in x86_64|aarch64) shift ;; *) die "usage: $0 x86_64|aarch64 [COLUMN]..." ;; esac
accels=("$@")
[ "${#accels[@]}" -gt 0 ] || accels=(tcg rustkvm)
for a in "${accels[@]}"; do
    case "$a" in
        tcg|rustkvm|tcg,icount|rustkvm,icount) ;;
        tcg,pmu=epyc|rustkvm,pmu=epyc|tcg,icount,pmu=epyc|rustkvm,icount,pmu=epyc) ;&
        tcg,pmu=epyc-v2|rustkvm,pmu=epyc-v2|tcg,icount,pmu=epyc-v2|rustkvm,icount,pmu=epyc-v2)
            [ "$arch" = x86_64 ] || die "column $a: pmu=${a##*pmu=} is an x86 model" ;;
        *) die "column $a: tcg or rustkvm, with ,icount and (x86) ,pmu=epyc or ,pmu=epyc-v2" ;;
    esac
done
per=${KST_TIMEOUT:-120}
filter=${KST_FILTER:-.}
expect=${KST_EXPECT:-$RUSTKVM_ROOT/tests/kvm-selftests.expect}
[ -f "$expect" ] || die "no declared verdicts: $expect"

dir=$(bash "$RUSTKVM_ROOT/scripts/build-kvm-selftests.sh" "$arch" | tail -n1)
[ -d "$dir/bin" ] || die "no selftests built in $dir"
mapfile -t tests < <(grep -E -- "$filter" "$dir/LIST" || true)
[ "${#tests[@]}" -gt 0 ] || die "no selftest matches KST_FILTER=$filter"
L="$RUSTKVM_CACHE/linux/$arch"
kernel="$L/vmlinuz"
[ -f "$kernel" ] || die "$kernel: run scripts/build-linux-guests.sh"
step "runners"
(cd "$RUSTKVM_ROOT" && cargo build --quiet -p rustkvm-tests --bin rustkvm-linux) || die "cargo build rustkvm-linux failed"
linux_bin="$RUSTKVM_ROOT/target/debug/rustkvm-linux"
runs=${KST_LOGS:-$RUSTKVM_CACHE/kvm-selftests/runs/$(date +%Y%m%d-%H%M%S)-$arch}
mkdir -p "$runs"

# The L1's KVM: rustkvm-linux --kvm-modules loads x86's kvm_amd and what it
# needs (arm64's is built in).
add=(--add "$dir/bin:/root/kst")
# In the L1: each selftest with its limit, its output, then one result line.
run='[ -c /dev/kvm ] || echo "KST-L1 no /dev/kvm"; cd /root/kst; '
run+="for t in ${tests[*]}; do echo \"KST-BEGIN \$t\"; timeout $per ./\$t >/tmp/kst.out 2>&1; rc=\$?; tail -n 40 /tmp/kst.out; echo \"KST-END \$t rc=\$rc\"; done"
budget=$(( ${#tests[@]} * (per + 5) + 600 ))
append=()
[ "$arch" = x86_64 ] && append=(--append "clocksource=tsc tsc=reliable")
logof() { echo "$runs/${1//[,=]/_}.log"; }

for accel in "${accels[@]}"; do
    log=$(logof "$accel")
    if [ -n "${KST_LOGS:-}" ]; then
        [ -f "$log" ] || die "KST_LOGS: no $log"
        continue
    fi
    step "$arch L1 on $accel: ${#tests[@]} selftests (at most ${per} s each)"
    "$linux_bin" --kernel "$kernel" --arch "$arch" --backend "$accel" --hypervisor --kvm-modules \
        "${append[@]}" "${add[@]}" --run "$run" --timeout "$budget" >"$log" 2>&1 || true
    grep -q 'KST-L1 no /dev/kvm' "$log" && die "$accel: the L1 has no /dev/kvm (log: $log)"
    grep -q '^KST-END ' "$log" || die "$accel: the L1 ran no selftest (log: $log)"
    ok "log: $log"
done

# The declared verdict of selftest $1 on column $2: the first line of
# $expect (ARCH SELFTEST-GLOB COLUMN-GLOB VERDICT REASON) that matches,
# else PASS.
declared() {
    local a t c v _
    while read -r a t c v _; do
        case "$a" in ''|'#'*) continue ;; esac
        [ "$a" = "$arch" ] || continue
        # shellcheck disable=SC2254
        case "$1" in $t) ;; *) continue ;; esac
        # shellcheck disable=SC2254
        case "$2" in $c) echo "$v"; return ;; esac
    done <"$expect"
    echo PASS
}
# The tcg column that $1 (a rustkvm column) is held to: the same options
# on tcg if that column ran, else plain tcg if it ran.
counterpart() {
    local t=tcg${1#rustkvm} c
    for c in "${accels[@]}"; do [ "$c" = "$t" ] && { echo "$t"; return; }; done
    for c in "${accels[@]}"; do [ "$c" = tcg ] && { echo tcg; return; }; done
    return 0
}

# The verdict of selftest $2 in log $1: PASS, FAIL(rc), SKIP: reason,
# TIMEOUT, or "not run" (the L1 stopped before it).
verdict() {
    awk -v t="$2" '
        $1 == "KST-BEGIN" && $2 == t { on = 1; skip = ""; next }
        on && $1 == "KST-END" && $2 == t {
            rc = $3; sub("rc=", "", rc)
            if (rc == 0) print "PASS"
            else if (rc == 4) print "SKIP" (skip != "" ? ": " skip : "")
            else if (rc == 124 || rc == 143) print "TIMEOUT"
            else print "FAIL(" rc ")"
            found = 1; exit
        }
        on && /SKIP/ { s = $0; sub(/^.*SKIP[^A-Za-z0-9]*/, "", s); if (s != "") skip = substr(s, 1, 70) }
        END { if (!found) print "not run" }' "$1"
}

step "selftest x column"
printf '%-40s' selftest
for accel in "${accels[@]}"; do printf ' %-40s' "$accel"; done
echo
regress=0
undeclared=0
junit=()
US=$'\x1f' # junit's field separator (a skip reason may hold '|')
for t in "${tests[@]}"; do
    printf '%-40s' "$t"
    declare -A v=() w=()
    notes=()
    for accel in "${accels[@]}"; do
        v[$accel]=$(verdict "$(logof "$accel")" "$t")
        printf ' %-40s' "${v[$accel]}"
        want=$(declared "$t" "$accel")
        w[$accel]=$want
        case "${v[$accel]}" in
            "$want"|"$want("*|"$want:"*) as=1 ;;
            *) [ "$want" = ANY ] && as=1 || as=0 ;;
        esac
        case "$as" in
            1) ;;
            *) as=0; notes+=("$accel: declared $want"); undeclared=$((undeclared + 1)) ;;
        esac
        junit+=("$t$US$accel$US${v[$accel]}$US$as$US$want")
    done
    for accel in "${accels[@]}"; do
        case "$accel" in rustkvm*) ;; *) continue ;; esac
        c=$(counterpart "$accel")
        # (not for a column whose outcome is not judged)
        [ "${w[$accel]}" = ANY ] && continue
        if [ -n "$c" ] && [ "${v[$c]}" = PASS ] && [ "${v[$accel]}" != PASS ]; then
            notes+=("passes on $c, not on $accel")
            regress=$((regress + 1))
        fi
    done
    [ "${#notes[@]}" = 0 ] || printf '  <- %s' "$(IFS=';'; echo "${notes[*]}")"
    echo
    unset v w
done
# The counts, from the verdicts the table computed (junit:
# TEST COLUMN VERDICT AS-DECLARED DECLARED, separated by US).
for accel in "${accels[@]}"; do
    of=$(printf '%s\n' "${junit[@]}" | awk -F"$US" -v a="$accel" '$2 == a { print $3 }')
    count() { grep -c "^$1" <<<"$of" || true; }
    printf '%s: %s passed, %s failed, %s skipped, %s timed out, %s not run\n' "$accel" \
        "$(count PASS)" "$(count FAIL)" "$(count SKIP)" "$(count TIMEOUT)" "$(count 'not run')"
done
if [ -n "${KST_JUNIT:-}" ]; then
    {
        echo '<?xml version="1.0" encoding="UTF-8"?>'
        echo "<testsuite name=\"kvm-selftests-$arch\" tests=\"${#junit[@]}\">"
        for j in "${junit[@]}"; do
            IFS=$US read -r t accel v as want <<<"$j"
            v=${v//&/&amp;}; v=${v//</&lt;}; v=${v//>/&gt;}; v=${v//\"/&quot;}
            printf '  <testcase classname="kvm-selftests.%s.%s" name="%s">' "$arch" "$accel" "$t"
            if [ "$as" = 0 ]; then
                printf '<failure message="%s (declared %s)"/>' "$v" "$want"
            elif [ "$want" = ANY ]; then
                printf '<skipped message="%s (not judged: host timing)"/>' "$v"
            elif [ "$v" != PASS ]; then
                printf '<skipped message="%s (as declared)"/>' "$v"
            fi
            echo '</testcase>'
        done
        echo '</testsuite>'
    } >"$KST_JUNIT"
    ok "JUnit: $KST_JUNIT"
fi
status=0
[ "$regress" = 0 ] || { echo "kvm-selftests: $regress selftest(s) pass with the L1 on tcg and not on rustkvm"; status=1; }
[ "$undeclared" = 0 ] || { echo "kvm-selftests: $undeclared verdict(s) other than declared in $expect"; status=1; }
exit "$status"
