//! `rustkvm-linux --kernel PATH --run CMD` (issue 20.2): Debian's own 6.12
//! kernels, as a user's kernel, booted on both architectures under tcg and
//! rustkvm with `linux-perf` from Debian in the userland; `perf stat`
//! counts instructions under rustkvm and cannot under tcg (declared with
//! `--expect tcg=fail`); a command that fails where it should pass makes the
//! runner fail and say so; the JUnit file carries one case per
//! configuration with the command's output.
//!
//! Needs `scripts/build-qemu.sh` and `scripts/build-linux-guests.sh`
//! (`scripts/test.sh` runs both); the userland is built on first use
//! (`scripts/build-userland.sh`, cached).

use std::process::Command;

use rustkvm_tests::linux;

/// The runner with `args`: (exit code, stdout + stderr).
fn runner(args: &[&str], record: bool) -> (Option<i32>, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rustkvm-linux"));
    c.args(args);
    if !record {
        // A failure this test asks for is not a failed run of the suite.
        c.env_remove(rustkvm_tests::VERDICT_LOG_ENV);
    }
    let out = c.output().expect("rustkvm-linux");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// The runner's report of the configuration whose label starts with
/// `label` (from its "== LABEL" header to the next); empty if none.
fn section<'a>(text: &'a str, label: &str) -> &'a str {
    text.split("== ")
        .find(|s| s.starts_with(label))
        .unwrap_or_default()
}

fn kernel(arch: &str) -> String {
    let arch = rustkvm_tests::Arch::ALL
        .into_iter()
        .find(|a| a.name() == arch)
        .expect("arch");
    let (k, _) = linux::images(arch).expect("scripts/build-linux-guests.sh");
    k.display().to_string()
}

#[test]
fn a_users_kernel_runs_perf_stat_from_debians_linux_perf_on_both_architectures() {
    // perf prints "<not supported>" without a PMU that counts the event;
    // the command fails then.
    let cmd = "perf stat -e instructions:u -x, busybox true >/tmp/o 2>&1; cat /tmp/o; \
               ! grep -q 'not supported' /tmp/o";
    for arch in ["x86_64", "aarch64"] {
        let junit =
            std::env::temp_dir().join(format!("rustkvm-boot-{arch}-{}.xml", std::process::id()));
        let k = kernel(arch);
        let (code, text) = runner(
            &[
                "--kernel",
                &k,
                "--backend",
                "tcg",
                "--backend",
                "rustkvm",
                "--packages",
                "linux-perf",
                "--run",
                cmd,
                "--expect",
                "tcg=fail",
                "--junit",
                junit.to_str().expect("utf-8"),
            ],
            true,
        );
        assert_eq!(code, Some(0), "{arch}:\n{text}");
        assert!(
            text.contains(&format!("== {arch}/rustkvm/smp2")) && text.contains("PASS: exit 0"),
            "{arch}:\n{text}"
        );
        assert!(
            text.contains("PASS: exit 1, expected a failure"),
            "{arch}:\n{text}"
        );
        // The count itself, the line after rustkvm's header:
        // "N,,instructions:u,...", N > 0.
        let count = text
            .lines()
            .skip_while(|l| !l.starts_with(&format!("== {arch}/rustkvm/smp2")))
            .nth(1)
            .and_then(|l| l.split_once(",,instructions:u"))
            .and_then(|(n, _)| n.trim().parse::<u64>().ok());
        assert!(count.is_some_and(|n| n > 0), "{arch}: no count\n{text}");
        let xml = std::fs::read_to_string(&junit).expect("JUnit file");
        let _ = std::fs::remove_file(&junit);
        assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
        assert!(xml.contains("instructions:u"), "{xml}");
        assert!(!xml.contains("<failure"), "{xml}");
    }
}

#[test]
fn x86_ptp_kvm_and_pv_eoi_work_under_rustkvm_only() {
    // One boot with two of the kernel package's own modules (busybox
    // modprobe), for two of KVM's PV features:
    // - Debian builds ptp_kvm as a module. Under rustkvm it registers "KVM
    //   virtual PTP" through KVM_HC_CLOCK_PAIRING; under tcg (no KVM) it
    //   cannot load, and the command fails there.
    // - Linux's kvm_guest_cpu_init writes MSR_KVM_PV_EOI_EN (0x4b564d04)
    //   with its per-CPU word's address and bit 0 on every CPU when CPUID
    //   offers KVM_FEATURE_PV_EOI; the msr module reads it back at that
    //   offset of /dev/cpu/N/msr.
    let k = kernel("x86_64");
    let modules = just_these_modules(&["ptp_kvm", "msr"]);
    let pv_eoi = |cpu: u32| {
        format!(
            "{{ v=$(dd if=/dev/cpu/{cpu}/msr bs=8 count=1 skip=$((0x4b564d04)) \
             iflag=skip_bytes 2>/dev/null | od -An -tx8 | tr -d ' '); \
             echo cpu{cpu} MSR_KVM_PV_EOI_EN=0x$v; [ $((0x${{v:-0}} & 1)) = 1 ]; }}"
        )
    };
    let cmd = format!(
        "modprobe ptp_kvm && grep -x 'KVM virtual PTP' /sys/class/ptp/ptp*/clock_name \
         && modprobe msr && {} && {}",
        pv_eoi(0),
        pv_eoi(1)
    );
    let (code, text) = runner(
        &[
            "--kernel",
            &k,
            "--modules",
            modules.to_str().expect("utf-8"),
            "--backend",
            "tcg",
            "--backend",
            "rustkvm",
            "--run",
            &cmd,
            "--expect",
            "tcg=fail",
        ],
        true,
    );
    assert_eq!(code, Some(0), "{text}");
    let rustkvm = section(&text, "x86_64/rustkvm/");
    assert!(
        rustkvm.contains("PASS: exit 0") && rustkvm.contains("KVM virtual PTP"),
        "{text}"
    );
    assert!(
        rustkvm.contains("cpu0 MSR_KVM_PV_EOI_EN=0x")
            && rustkvm.contains("cpu1 MSR_KVM_PV_EOI_EN=0x"),
        "both vCPUs: {text}"
    );
    assert!(text.contains("PASS: exit 1, expected a failure"), "{text}");
    let _ = std::fs::remove_dir_all(&modules);
}

/// A modules_install tree with only the kernel package's modules `names`
/// (and its lists of built-in modules), for `--modules`: the whole
/// package's 100 MB made an initramfs TCG took about 3 minutes to unpack,
/// which the default 180 s hang guard was seen to cut short. busybox
/// modprobe finds them without a modules.dep, as in the whole tree.
fn just_these_modules(names: &[&str]) -> std::path::PathBuf {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir)
            .expect("read the modules tree")
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let root = linux::cache_dir().join("linux/x86_64/kernel/lib/modules");
    let version = std::fs::read_dir(&root)
        .expect("the kernel package's lib/modules")
        .flatten()
        .next()
        .expect("one kernel version")
        .path();
    let tree = std::env::temp_dir().join(format!("rustkvm-modules-{}", std::process::id()));
    let mut files = Vec::new();
    walk(&version, &mut files);
    let mut found = Vec::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let module = name.split(".ko").next().unwrap_or_default();
        let keep = name.starts_with("modules.builtin")
            || (name.contains(".ko") && names.contains(&module));
        if keep {
            let rel = f.strip_prefix(&root).expect("under the tree");
            let dest = tree.join("lib/modules").join(rel);
            std::fs::create_dir_all(dest.parent().expect("a parent")).expect("mkdir");
            std::fs::copy(&f, &dest).expect("copy a module");
            found.push(module.to_string());
        }
    }
    for n in names {
        assert!(
            found.iter().any(|f| f == n),
            "no module {n} in {}",
            version.display()
        );
    }
    tree
}

#[test]
fn x86_perf_finds_the_tsc_rate_in_cpuid_on_an_intel_model_under_rustkvm_only() {
    // perf's expression parser test wants #system_tsc_freq > 0 on Intel
    // (tools/perf/tests/expr.c); perf reads it from CPUID 0x15, else from
    // "@ x.xxGHz" in /proc/cpuinfo's model name (tools/perf/arch/x86/util/
    // tsc.c). rustkvm fills 0x15 from the VM's TSC rate; under tcg the
    // leaf is out of range and QEMU's model name has no rate: it fails.
    let k = kernel("x86_64");
    let (code, text) = runner(
        &[
            "--kernel",
            &k,
            "--backend",
            "tcg,pmu=intel",
            "--backend",
            "rustkvm,pmu=intel",
            "--packages",
            "linux-perf",
            "--run",
            "perf test -v 'Simple expression parser' >/tmp/o 2>&1; cat /tmp/o; \
             grep -q 'Simple expression parser *: Ok' /tmp/o",
            "--expect",
            "tcg,pmu=intel=fail",
        ],
        true,
    );
    assert_eq!(code, Some(0), "{text}");
    let rustkvm = section(&text, "x86_64/rustkvm,pmu=intel/");
    assert!(
        rustkvm.contains("PASS: exit 0") && rustkvm.contains(": Ok"),
        "{text}"
    );
    assert!(text.contains("PASS: exit 1, expected a failure"), "{text}");
}

#[test]
fn a_command_that_fails_where_it_should_pass_fails_the_run() {
    let k = kernel("x86_64");
    let (code, text) = runner(
        &[
            "--kernel",
            &k,
            "--backend",
            "rustkvm",
            "--run",
            "echo about to fail; exit 3",
        ],
        false,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL: exit 3, expected exit 0"), "{text}");
    assert!(text.contains("about to fail"), "{text}");
    assert!(
        text.contains("boot: 1 configurations, 1 not as expected"),
        "{text}"
    );
}

#[test]
fn the_architecture_comes_from_the_image() {
    let k = kernel("x86_64");
    let (code, text) = runner(
        &["--kernel", &k, "--arch", "aarch64", "--run", "true"],
        false,
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("is an x86_64 kernel"), "{text}");
    let (code, text) = runner(&["--kernel", "/etc/hostname", "--run", "true"], false);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("not a bzImage, an arm64 Image or an ELF vmlinux"),
        "{text}"
    );
    let (code, text) = runner(&["--kernel", &k], false);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--kernel needs --run CMD"), "{text}");
}

/// Linux lowers `kernel.perf_event_max_sample_rate`, and then throttles
/// sampling events, when a PMI handler seems to take too long
/// (`kernel.perf_cpu_time_max_percent`, measured in the guest's clock): an
/// emulated vCPU the host descheduled in the handler looks slow at random,
/// so a sample goes missing on a loaded host. The perf tests turn that off,
/// as `tests/linux/init` does.
const NO_TIME_THROTTLING: &str = "echo 0 > /proc/sys/kernel/perf_cpu_time_max_percent || exit 1;";

/// `cmd` with Debian's perf on `-cpu Icelake-Server,pdcm=on,ds=on,dtes64=on,pmu=on`
/// (`rustkvm-linux --backend ...,pmu=icelake`) under tcg, where it must fail
/// (no PMU), and rustkvm: the runner's whole report and rustkvm's section.
fn on_icelake_with_perf(cmd: &str) -> (String, String) {
    let k = kernel("x86_64");
    let (code, text) = runner(
        &[
            "--kernel",
            &k,
            "--backend",
            "tcg,pmu=icelake",
            "--backend",
            "rustkvm,pmu=icelake",
            "--packages",
            "linux-perf",
            "--run",
            cmd,
            "--expect",
            "tcg,pmu=icelake=fail",
        ],
        true,
    );
    assert_eq!(code, Some(0), "{text}");
    let rustkvm = section(&text, "x86_64/rustkvm,pmu=icelake/").to_string();
    (text, rustkvm)
}

/// `perf record -b` and `perf record --call-graph lbr` (Debian's perf, Linux
/// 6.12's LBR driver) over the probe's known call chain
/// (`rustkvm-probe --call-chain`: `rustkvm_chain_a` calls
/// `rustkvm_chain_b` calls `rustkvm_chain_c`, whose loop takes fewer
/// branches than the stack holds), on `-cpu Icelake-Server,pdcm=on,pmu=on`,
/// a model whose LBR Linux's driver uses: every call graph sampled in the
/// chain is c, b, a, main; every full branch stack of a sample taken in
/// the chain (at least 100 of the about 246) holds the calls a to b and b
/// to c and c's return into b. Under tcg there is no PMU: perf fails.
#[test]
fn x86_perf_record_branch_stacks_and_lbr_call_graphs_give_the_known_chain() {
    let cmd = format!(
        "{NO_TIME_THROTTLING}{}",
        r#"
dmesg | grep -o '[0-9]*-deep LBR' || exit 1
perf record -q --call-graph lbr -e instructions:u -c 100003 -o /tmp/cg /rustkvm-probe --call-chain 300000 >/dev/null || exit 1
perf script -i /tmp/cg -F ip,sym | awk '
function done() {
    if (s == "") return
    n++
    if (s ~ /^ rustkvm_chain_[bc] /) {
        if (s ~ /^( rustkvm_chain_c)? rustkvm_chain_b rustkvm_chain_a rustkvm_probe::main /) ok++
        else { bad++; print "not the chain:" s }
    }
    s = ""
}
/^[ \t]*$/ { done(); next }
{ s = s " " $2 }
END { done(); printf "callgraph samples=%d in-chain=%d other=%d\n", n, ok, bad; exit !(ok > 0 && bad == 0) }' || exit 1
perf record -q -b -e instructions:u -c 100003 -o /tmp/b /rustkvm-probe --call-chain 300000 >/dev/null || exit 1
perf script -i /tmp/b -F brstacksym 2>/dev/null | grep . > /tmp/all.txt
# The full stacks (32 records: Linux empties the LBR when it schedules the
# task back in) of samples taken in the chain (newest record from it; one
# taken in the probe's start-up or exit code holds other branches).
grep '^ *rustkvm_chain_' /tmp/all.txt | awk 'NF >= 32' > /tmp/b.txt
all=$(grep -c . /tmp/all.txt)
n=$(grep -c . /tmp/b.txt)
ab=$(grep -c 'rustkvm_chain_a+0x[0-9a-f]*/rustkvm_chain_b+0x0/' /tmp/b.txt)
bc=$(grep -c 'rustkvm_chain_b+0x[0-9a-f]*/rustkvm_chain_c+0x0/' /tmp/b.txt)
cb=$(grep -c 'rustkvm_chain_c+0x[0-9a-f]*/rustkvm_chain_b+0x[1-9a-f][0-9a-f]*/' /tmp/b.txt)
echo "branch stacks=$all in-chain=$n a-calls-b=$ab b-calls-c=$bc c-returns-to-b=$cb"
[ "$n" -ge 100 ] && [ "$ab" = "$n" ] && [ "$bc" = "$n" ] && [ "$cb" = "$n" ]
"#
    );
    let (text, rustkvm) = on_icelake_with_perf(&cmd);
    let rustkvm = rustkvm.as_str();
    assert!(
        rustkvm.contains("PASS: exit 0")
            && rustkvm.contains("32-deep LBR")
            && rustkvm.contains("other=0"),
        "{text}"
    );
}

/// `perf record -e instructions:uppp -c 100003` (PEBS, precise level 3 on
/// fixed counter 0: Linux 6.12's Ice Lake driver) over a loop of three
/// instructions (`rustkvm-probe --three-instruction-loop`, which prints
/// their addresses), on `-cpu Icelake-Server,pdcm=on,ds=on,dtes64=on,pmu=on`:
/// Linux finds "PEBS fmt4+-baseline"; every sample from the loop is one of
/// its three instructions, and since the period is 1 modulo 3, exact
/// N-spaced samples walk them in order, which each consecutive pair must
/// do. Under tcg there is no PMU: perf fails.
///
/// The event is CPU 1's (`perf record -C 1`), with the probe pinned there
/// and everything else on CPU 0. A task's event is stopped when the task is
/// switched out and restarted when it comes back, and x86's restart
/// (`x86_perf_event_set_period`, arch/x86/events/core.c: "certain CPUs
/// dont like it if just 1 hw_event is left") makes a period that had one
/// event left two long, which shifts every later sample by one
/// instruction, on hardware as here. A CPU's event is never restarted for a
/// switch, and the kernel threads that take CPU 1 meanwhile retire no user
/// instructions. (CI found it: the probe was switched out with one event
/// left, and the walk skipped an instruction.)
#[test]
fn x86_perf_precise_samples_land_on_the_exact_instructions_n_apart() {
    let cmd = format!(
        "{NO_TIME_THROTTLING} \
         taskset -pc 0 $$ >/dev/null || exit 1; \
         perf record -q -C 1 -e instructions:uppp -c 100003 -o /tmp/p \
         /rustkvm-probe --three-instruction-loop 3000000 1 | grep loop-ips || exit 1; \
         perf script -i /tmp/p -F ip | sed 's/^ */sample /'; \
         perf report -i /tmp/p --stats 2>/dev/null | grep -E 'THROTTLE|LOST' | sed 's/^ */stats /'"
    );
    let (text, rustkvm) = on_icelake_with_perf(&cmd);
    let rustkvm = rustkvm.as_str();
    assert!(
        rustkvm.contains("PASS: exit 0") && rustkvm.contains("PEBS fmt4+-baseline"),
        "{text}"
    );
    // Nothing throttled or lost: a gap in the samples below is then ours.
    let stats: Vec<&str> = rustkvm
        .lines()
        .filter_map(|l| l.strip_prefix("stats "))
        .collect();
    assert!(
        stats.is_empty(),
        "perf throttled or lost samples: {stats:?}"
    );
    let hex = |s: &str| u64::from_str_radix(s.trim(), 16).expect("hex");
    let loop_ips: Vec<u64> = rustkvm
        .lines()
        .find_map(|l| l.strip_prefix("loop-ips "))
        .expect("loop-ips line")
        .split_whitespace()
        .map(hex)
        .collect();
    let samples: Vec<u64> = rustkvm
        .lines()
        .filter_map(|l| l.strip_prefix("sample "))
        .map(hex)
        .collect();
    let pos = |ip: u64| loop_ips.iter().position(|&a| a == ip);
    let in_loop: Vec<usize> = samples.iter().filter_map(|&ip| pos(ip)).collect();
    // 3 000 000 rounds of 3 instructions: about 90 samples in the loop.
    assert!(in_loop.len() >= 80, "{} in the loop: {text}", in_loop.len());
    let first = samples.iter().position(|&ip| pos(ip).is_some()).unwrap();
    assert!(
        samples[first..first + in_loop.len()]
            .iter()
            .all(|&ip| pos(ip).is_some()),
        "a sample outside the loop among its samples: {samples:x?}"
    );
    for w in in_loop.windows(2) {
        assert_eq!(
            w[1],
            (w[0] + 1) % 3,
            "not 100003 instructions apart: {samples:x?} (loop {loop_ips:x?})"
        );
    }
}
