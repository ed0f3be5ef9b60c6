#!/usr/bin/env bash
# The QEMU series (qemu-patches/) as a git repository and back: edit the
# series as commits (fixups, rebases, rewording), then write it out again
# as `git format-patch` files (docs/building.md, "Working on the series").
#
#   scripts/qemu-series.sh import DIR   DIR: a new git repository holding
#                                       the orig tarball as the commit
#                                       tagged `upstream`, Debian's build
#                                       fixes (qemu-patches/debian/) as the
#                                       commit tagged `base`, then one commit
#                                       per qemu-patches/*.patch
#   scripts/qemu-series.sh export DIR   qemu-patches/*.patch := DIR's commits
#                                       after `base` (format-patch)
#   scripts/qemu-series.sh check DIR    every file each commit of DIR after
#                                       `base` touches has its #if/#endif
#                                       balanced at that commit (a cheap
#                                       bisectability check before the
#                                       prefix builds; exits 1 if not)
#   scripts/qemu-series.sh stat [REV]   what the series at REV (a commit of
#                                       this repository; default: the work
#                                       tree) changes in QEMU, net, by
#                                       subsystem: lines added and removed
#                                       in upstream's files, lines of new
#                                       files (Debian's build fixes and the
#                                       ABI header copy counted apart)
#   scripts/qemu-series.sh header       the link patch's copy of the ABI
#                                       header (include/system/rustkvm-abi.h)
#                                       := accel/include/rustkvm.h (import
#                                       into a scratch repository, amend the
#                                       patch that adds it, rebase, export)
#
#   With RUSTKVM_QEMU=10.2 (scripts/lib.sh qemu_release), import takes that
#   release's orig tarball and series (its own version of a patch where
#   qemu-patches/10.2/ has one; a stale one is imported as it is and named),
#   and export writes qemu-patches/10.2/: the commits the shared patches do
#   not make exactly, each with the Ported-from-sha256 of the shared patch
#   it ports. Porting a change of a shared patch: import 10.2, make the
#   change in that patch's commit, rebase, export (docs/building.md, "The
#   10.2 port").
#
# Not part of the build: scripts/build-qemu.sh applies qemu-patches/ with
# patch(1), which reads format-patch files as they are.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

cmd=${1:-}
dir=${2:-}
patches_dir="$RUSTKVM_ROOT/qemu-patches"
if [ "$cmd" = header ]; then
    header="$RUSTKVM_ROOT/accel/include/rustkvm.h"
    self="$RUSTKVM_ROOT/scripts/qemu-series.sh"
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    bash "$self" import "$scratch/series" >/dev/null
    cd "$scratch/series"
    branch=$(git symbolic-ref --short HEAD)
    # the one commit that adds the header (later patches never touch it)
    copy=include/system/rustkvm-abi.h
    adds=$(git log --format=%H --diff-filter=A base..HEAD -- "$copy")
    [ -n "$adds" ] && [ "$(git log --format=%H base..HEAD -- "$copy" | wc -l)" -eq 1 ] \
        || die "the series must add $copy in one patch and never change it"
    if git show "HEAD:$copy" | cmp -s - "$header"; then
        ok "the series' $copy is accel/include/rustkvm.h already"
        exit 0
    fi
    git -c advice.detachedHead=false checkout -q "$adds"
    cp "$header" "$copy"
    git add -f "$copy"
    git -c user.name=rustkvm -c user.email=rustkvm@invalid commit -q --amend --no-edit
    git -c user.name=rustkvm -c user.email=rustkvm@invalid rebase -q --onto HEAD "$adds" "$branch" \
        || die "rebasing the series on the new header failed"
    bash "$self" export "$scratch/series"
    ok "\"$(git log -1 --format=%s "$adds")\" now carries accel/include/rustkvm.h"
    exit 0
fi
if [ "$cmd" = stat ]; then
    rev=${2:-}
    orig=$(qemu_orig_cached)
    [ -n "$orig" ] || die "no QEMU orig tarball in $RUSTKVM_CACHE/src (run scripts/build-qemu.sh once)"
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    mkdir -p "$scratch/patches" "$scratch/a" "$scratch/b"
    if [ -n "$rev" ]; then
        git -C "$RUSTKVM_ROOT" rev-parse -q --verify "$rev^{commit}" >/dev/null || die "no commit $rev"
        git -C "$RUSTKVM_ROOT" archive "$rev" qemu-patches | tar -x -C "$scratch/patches"
    else
        cp -r "$patches_dir" "$scratch/patches/"
    fi
    tar --no-same-owner -C "$scratch/a" --strip-components=1 -xf "$orig"
    cp -a "$scratch/a/." "$scratch/b/"
    n=0
    mapfile -t series < <(qemu_patches "$scratch/patches/qemu-patches")
    for p in "${series[@]}"; do
        qemu_apply "$scratch/b" "$p" >/dev/null \
            || die "$(basename "$p") does not apply"
        case "$p" in */debian/*) ;; *) n=$((n + 1)) ;; esac
    done
    echo "# scripts/qemu-series.sh stat ${rev:-(work tree)}: $n patches on $(basename "$orig")"
    (cd "$scratch" && diff -ruN a b >diff || true)
    python3 - "$scratch/diff" <<'EOF'
import sys
# Debian's build fixes for its blob-less tarball, and the copy of the ABI
# header (accel/include/rustkvm.h), are counted apart.
APART = {"pc-bios/meson.build": "(Debian's fixes)", "pythondeps.toml": "(Debian's fixes)",
         "include/system/rustkvm-abi.h": "(ABI header copy)"}
def area(f):
    if f in APART:
        return APART[f]
    parts = f.split("/")
    if parts[0] in ("target", "hw", "include") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else "top level"
rows, f, new = {}, None, False
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("diff "):
        f = None
    elif f is None and line.startswith("--- "):
        # diff -N: a file that is new has the epoch as its old time
        new = "\t1970-01-01 " in line
    elif f is None and line.startswith("+++ "):
        f = line[4:].split("\t")[0].split("/", 1)[1]
        r = rows.setdefault(area(f), {"files": set(), "new": set(), "add": 0, "del": 0, "newlines": 0})
        (r["new"] if new else r["files"]).add(f)
    elif f and line.startswith("+"):
        rows[area(f)]["newlines" if new else "add"] += 1
    elif f and line.startswith("-"):
        rows[area(f)]["del"] += 1
cols = ("upstream files", "+lines", "-lines", "new files", "their lines")
print(f"| area | {' | '.join(cols)} |")
print("|---" * (len(cols) + 1) + "|")
tot = [0] * 5
for k in sorted(rows, key=lambda k: (k.startswith("("), -(rows[k]["add"] + rows[k]["del"] + rows[k]["newlines"]))):
    r = rows[k]
    v = [len(r["files"]), r["add"], r["del"], len(r["new"]), r["newlines"]]
    print(f"| {k} | {' | '.join(map(str, v))} |")
    if not k.startswith("("):
        tot = [a + b for a, b in zip(tot, v)]
print(f"| total (without the rows in parentheses) | {' | '.join(map(str, tot))} |")
EOF
    exit 0
fi
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: scripts/qemu-series.sh import|export|check DIR, stat [REV], or header"

case "$cmd" in
check)
    step "#if/#endif balance of each file each commit after base touches ($dir)"
    python3 - "$dir" <<'EOF'
import re, subprocess, sys
repo = sys.argv[1]
def git(*a):
    return subprocess.run(['git', '-C', repo, *a], capture_output=True, text=True)
commits = git('rev-list', '--reverse', 'base..HEAD').stdout.split()
bad = 0
for n, c in enumerate(commits, 1):
    for f in git('diff-tree', '--no-commit-id', '--name-only', '-r', c).stdout.split():
        if not re.search(r'\.(c|h|inc|hx)$', f):
            continue
        r = git('show', f'{c}:{f}')
        if r.returncode:
            continue                  # deleted by this commit
        depth, low = 0, 0
        for line in r.stdout.split('\n'):
            if re.match(r'\s*#\s*if(n?def)?\b', line):
                depth += 1
            elif re.match(r'\s*#\s*endif\b', line):
                depth -= 1
                low = min(low, depth)
        if depth or low:
            bad += 1
            subj = git('log', '-1', '--format=%s', c).stdout.strip()
            print(f'    {n:04d} {f}: #if depth {depth:+d} at the end ({subj})')
print(f'    {len(commits)} commits, {bad} unbalanced file states')
sys.exit(1 if bad else 0)
EOF
    ;;
import)
    step "import qemu-patches/ into $dir"
    [ ! -e "$dir" ] || die "$dir exists"
    orig=$(qemu_orig_cached)
    [ -n "$orig" ] || die "no QEMU orig tarball in $RUSTKVM_CACHE/src (run scripts/build-qemu.sh once)"
    ver=$(basename "$orig" | sed -E 's/^qemu_([0-9.]+)\+ds\.orig\.tar\.xz$/\1/')
    mkdir -p "$dir"
    tar --no-same-owner -C "$dir" --strip-components=1 -xf "$orig"
    git -C "$dir" init -q
    git -C "$dir" -c core.autocrlf=false add -A -f
    GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
        git -C "$dir" -c user.name=upstream -c user.email=upstream@invalid \
        commit -q -m "QEMU $ver ($(basename "$orig"))"
    git -C "$dir" tag upstream
    # The release's series (scripts/lib.sh qemu_patches: a file of
    # qemu-patches/RELEASE/ replaces the shared one of its name).
    mapfile -t series < <(qemu_patches)
    last_debian=
    for p in "${series[@]}"; do
        case "$p" in */debian/*) last_debian=$p ;; esac
    done
    for p in "${series[@]}"; do
        # The patch's author, date, subject and message: its mail header
        # (format-patch), or else the text before its first diff.
        python3 - "$p" "$dir/.git/rustkvm-msg" "$dir/.git/rustkvm-env" <<'EOF'
import re, subprocess, sys
path, msg_out, env_out = sys.argv[1:4]
text = open(path, encoding='utf-8').read()
head = re.split(r'^(?:---\n|diff --git )', text, maxsplit=1, flags=re.M)[0]
author, date, subject, body = None, None, None, head
if re.match(r'^(From [0-9a-f]{40} |From: )', head):
    lines = head.split('\n')
    hdr = {}
    i, key = 0, None
    while i < len(lines) and lines[i] != '':
        l = lines[i]
        if l.startswith((' ', '\t')) and key:
            hdr[key] += ' ' + l.strip()
        elif ': ' in l:
            key, val = l.split(': ', 1)
            hdr[key] = val
        i += 1
    author = hdr.get('From')
    date = hdr.get('Date')
    subject = re.sub(r'^\[PATCH[^\]]*\]\s*', '', hdr.get('Subject', ''))
    body = '\n'.join(lines[i + 1:])
body = body.strip('\n')
if not subject:
    para = body.split('\n\n', 1)
    subject = ' '.join(para[0].split())
    body = para[1].strip('\n') if len(para) > 1 else ''
    # a long first paragraph: its first sentence is the subject
    m = re.match(r'^(.{10,}?[.:])\s+(\S.*)$', subject)
    if len(subject) > 72 and m:
        import textwrap
        rest = textwrap.fill(m.group(2), 72, break_on_hyphens=False)
        subject = m.group(1).rstrip('.:')
        body = rest + ('\n\n' + body if body else '')
if not date:
    # when the patch came into this repository
    import os
    added = subprocess.run(['git', 'log', '--diff-filter=A', '--format=%aI', '--', path],
                           cwd=os.path.dirname(path), capture_output=True,
                           text=True).stdout.split()
    date = added[-1] if added else '2026-11-01T00:00:00Z'
author = author or 'rustkvm maintainers <maintainers@users.noreply.a-seed-bdf2a2de.example>'
name, email = re.match(r'^(.*?)\s*<(.*)>$', author).groups()
if 'Signed-off-by:' not in body:
    body = (body + '\n\n' if body else '') + f'Signed-off-by: {author}'
open(msg_out, 'w').write(subject + '\n\n' + body + '\n')
with open(env_out, 'w') as f:
    for k, v in (('GIT_AUTHOR_NAME', name), ('GIT_AUTHOR_EMAIL', email),
                 ('GIT_AUTHOR_DATE', date), ('GIT_COMMITTER_NAME', name),
                 ('GIT_COMMITTER_EMAIL', email), ('GIT_COMMITTER_DATE', date)):
        f.write(f"export {k}='{v}'\n")
EOF
        qemu_apply "$dir" "$p" >/dev/null \
            || die "$(basename "$p") does not apply"
        git -C "$dir" add -A -f
        # shellcheck disable=SC1091
        (. "$dir/.git/rustkvm-env" && git -C "$dir" commit -q --allow-empty -F .git/rustkvm-msg)
        if [ "$p" = "$last_debian" ]; then
            git -C "$dir" tag base
        fi
    done
    rm -f "$dir/.git/rustkvm-msg" "$dir/.git/rustkvm-env"
    ok "$(git -C "$dir" rev-list --count base..HEAD) commits on QEMU $ver (and Debian's fixes) in $dir"
    # A stale port is imported as it is, for the change to be ported there.
    qemu_ports_stale || ok "imported as they are: port the changes named above into $dir's commits, then export"
    ;;
export)
    git -C "$dir" rev-parse -q --verify base >/dev/null || die "$dir has no base tag"
    out=$(mktemp -d)
    git -C "$dir" format-patch -q --zero-commit --no-signature --abbrev=12 \
        -o "$out" base..HEAD
    rel=$(qemu_release)
    if [ "$rel" = "$(RUSTKVM_QEMU='' qemu_release)" ]; then
        step "export $dir's commits after base to qemu-patches/"
        rm -f "$patches_dir"/*.patch
        mv "$out"/*.patch "$patches_dir"/
        rmdir "$out"
        ok "$(ls "$patches_dir"/*.patch | wc -l) patches in qemu-patches/"
        exit 0
    fi
    # Another release: DIR holds that release's series, a commit for each
    # shared patch, in order. A commit that the shared patch, applied with
    # patch(1) to the commit's parent, makes exactly is that patch; any
    # other is written to qemu-patches/RELEASE/ under the shared patch's
    # name, with the sha256 of the shared patch it ports after its `---`
    # (Ported-from-sha256: scripts/lib.sh qemu_ports_check).
    step "export $dir's commits after base as QEMU $rel's versions of the series (qemu-patches/$rel/)"
    mapfile -t exported < <(ls "$out"/*.patch)
    mapfile -t shared < <(ls "$patches_dir"/*.patch)
    [ "${#exported[@]}" = "${#shared[@]}" ] \
        || die "$dir has ${#exported[@]} commits after base, the shared series ${#shared[@]} patches"
    mapfile -t commits < <(git -C "$dir" rev-list --reverse base..HEAD)
    wt=$(mktemp -d)
    rmdir "$wt"
    trap 'git -C "$dir" worktree remove --force "$wt" 2>/dev/null; rm -rf "$out"' EXIT
    git -C "$dir" worktree add -q --detach "$wt" base
    mkdir -p "$patches_dir/$rel"
    rm -f "$patches_dir/$rel"/*.patch
    ported=0
    for i in "${!commits[@]}"; do
        c=${commits[$i]}
        p=${shared[$i]}
        name=$(basename "$p")
        git -C "$wt" checkout -q --detach "$c^"
        same=0
        if qemu_apply "$wt" "$p" >/dev/null 2>&1; then
            git -C "$wt" add -A -f
            if git -C "$wt" diff --cached --quiet "$c"; then same=1; fi
        fi
        git -C "$wt" reset -q --hard
        git -C "$wt" clean -qfdx
        if [ "$same" = 0 ]; then
            sha=$(qemu_port_sha "$p")
            python3 - "${exported[$i]}" "$patches_dir/$rel/$name" "$sha" <<'EOF'
import sys
src, dst, sha = sys.argv[1:4]
s = open(src).read()
i = s.index("\n---\n") + 5
open(dst, "w").write(s[:i] + f"Ported-from-sha256: {sha}\n" + s[i:])
EOF
            ported=$((ported + 1))
            echo "    ${name%%-*}: QEMU $rel's own version"
        fi
    done
    ok "$ported of ${#shared[@]} patches have QEMU $rel versions in qemu-patches/$rel/; the others are shared"
    ;;
*) die "unknown command $cmd (import or export)" ;;
esac
