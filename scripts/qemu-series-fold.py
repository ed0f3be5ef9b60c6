#!/usr/bin/env python3
"""Fold the series' last commit (a change spread over the series' code, such
as gating) into the commits that introduced the code it changes.

usage: scripts/qemu-series-fold.py REPO [--plan] [PATH[:A[-B]]=N ...]
                                   [--extra=PATH:L:FIRST-LAST:TEXT ...]

REPO: a repository from `scripts/qemu-series.sh import` whose commits
base..HEAD are the series; HEAD is the commit to fold. Writes the folded
series as branch `folded` (base..folded, one commit fewer), prints where
each change went, and whether folded's tree equals HEAD's (it must).
--plan: print the placement only.

Each change of the last commit (T45 -> T46 below: its parent's tree and its
own; a change is a run of deleted and inserted lines) goes to a commit i:
  * a run that deletes lines: the newest commit that wrote one of them
    (git blame of the parent);
  * an inserted #if/#ifdef/#ifndef: the oldest commit of the lines it
    encloses up to its inserted #endif, and that #else/#endif and what is
    inserted between them with it (an #if that replaces a deleted #if takes
    its inserted #endif along);
  * other inserted lines: the newer of the commits that wrote the lines
    around them (none but upstream's: unplaced, an error).
PATH:A-B=N places the changes at lines A..B of T46 in commit N by hand (the
whole run if it deletes, else the lines alone; PATH=N: the whole file).
--extra inserts TEXT after T46 line L in commits FIRST..LAST only: an
#endif that closes a block until a later commit extends it.
Commit i's new tree is its old tree with every change placed at or before i,
positioned by the T45 lines around it that commit i has: an #if before the
next such line, anything else after the previous one. Check the result with
`scripts/qemu-series.sh check` and the prefix builds.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

repo = sys.argv[1]
plan_only = '--plan' in sys.argv
overrides = {}
extras = defaultdict(list)   # path -> [(after T46 line, first, last, text)]
for a in sys.argv[2:]:
    m = re.match(r'^--extra=(.+?):(\d+):(\d+)-(\d+):(.*)$', a)
    if m:
        extras[m.group(1)].append((int(m.group(2)), int(m.group(3)),
                                   int(m.group(4)), m.group(5)))
        continue
    m = re.match(r'^(.+?)(?::(\d+)(?:-(\d+))?)?=(\d+)$', a)
    if m:
        lo = int(m.group(2) or 0)
        for ln in range(lo, int(m.group(3) or lo) + 1):
            overrides[(m.group(1), ln)] = int(m.group(4))


def git(*a, input=None, check=True):
    r = subprocess.run(['git', '-C', repo, *a], capture_output=True,
                       input=input, check=False)
    if check and r.returncode:
        sys.exit(f"git {' '.join(a)}: {r.stderr.decode()}")
    return r.stdout


def show(rev, path):
    r = subprocess.run(['git', '-C', repo, 'show', f'{rev}:{path}'],
                       capture_output=True)
    if r.returncode:
        return None
    return r.stdout.decode('utf-8', 'surrogateescape').split('\n')


commits = git('rev-list', '--reverse', 'base..HEAD').decode().split()
last = commits.pop()
index = {c: n for n, c in enumerate(commits, 1)}  # 1..45; upstream: 0
files = git('diff', '--name-only', f'{last}~1', last).decode().split()


def hunks(a_rev, b_rev, path):
    """[(a_start, a_len, b_start, b_len)] of git diff -U0, 0-based starts."""
    out = git('diff', '-U0', '--histogram', '--no-renames', a_rev, b_rev,
              '--', path).decode('utf-8', 'surrogateescape')
    res = []
    for m in re.finditer(r'^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@', out, re.M):
        a, al, b, bl = (int(m.group(1)), int(m.group(2) or 1),
                        int(m.group(3)), int(m.group(4) or 1))
        # for an empty side, the start names the line before
        res.append((a - 1 if al else a, al, b - 1 if bl else b, bl))
    return res


def line_map(a_rev, b_rev, path, a_len):
    """For each line of a_rev:path, its index in b_rev:path, or None."""
    m, ai, bi = [None] * a_len, 0, 0
    for a, al, b, bl in hunks(a_rev, b_rev, path):
        while ai < a:
            m[ai] = bi
            ai, bi = ai + 1, bi + 1
        ai, bi = a + al, b + bl
    while ai < a_len:
        m[ai] = bi
        ai, bi = ai + 1, bi + 1
    return m


def blame(rev, path, n):
    if n == 0:
        return []
    out = git('blame', '--porcelain', rev, '--', path).decode('utf-8', 'surrogateescape')
    who = [0] * n
    for m in re.finditer(r'^([0-9a-f]{40}) \d+ (\d+)', out, re.M):
        who[int(m.group(2)) - 1] = index.get(m.group(1), 0)
    return who


IF = re.compile(r'\s*#\s*if')
ELSE = re.compile(r'\s*#\s*(else|elif)')
ENDIF = re.compile(r'\s*#\s*endif')

plan = {}      # path -> (t45, ops, targets)
unplaced = []
for path in files:
    t45 = show(f'{last}~1', path) or []
    t46 = show(last, path) or []
    if t45 and t45[-1] == '':
        t45 = t45[:-1]
    if t46 and t46[-1] == '':
        t46 = t46[:-1]
    who = blame(f'{last}~1', path, len(t45))
    # ops in T46 order: ('k', j45) kept, ('d', j45) deleted, ('i', j46) inserted;
    # runs: each change run's ops share a run id
    ops, runs = [], []
    ai = bi = 0
    run = 0
    for a, al, b, bl in hunks(f'{last}~1', last, path):
        while ai < a:
            ops.append(('k', ai, bi))
            runs.append(None)
            ai, bi = ai + 1, bi + 1
        run += 1
        for x in range(a, a + al):
            ops.append(('d', x, None))
            runs.append(run)
        for y in range(b, b + bl):
            ops.append(('i', None, y))
            runs.append(run)
        ai, bi = a + al, b + bl
    while ai < len(t45):
        ops.append(('k', ai, bi))
        runs.append(None)
        ai, bi = ai + 1, bi + 1
    target = [None] * len(ops)
    # runs that delete: the newest introducer of what they delete
    by_run = defaultdict(list)
    for n, r in enumerate(runs):
        if r is not None:
            by_run[r].append(n)
    for r, ns in by_run.items():
        dels = [who[ops[n][1]] for n in ns if ops[n][0] == 'd']
        if dels:
            for n in ns:
                target[n] = max(dels)
    # inserted #if pairs: the #if's commit (a run's, else the oldest enclosed
    # line's), for its inserted #else/#endif and what is inserted between
    is_c = re.search(r'\.(c|h|inc|hx)$', path)
    # (the inserted directives pair among themselves: an #if that replaces
    # a deleted #if, or an #endif a deleted #endif, is not one of them)
    def replaces(n, pat):
        return any(ops[y][0] == 'd' and pat.match(t45[ops[y][1]])
                   for y in by_run[runs[n]])
    stack = []
    for n, (kind, j45, j46) in enumerate(ops):
        if kind != 'i' or not is_c:
            continue
        text = t46[j46]
        if IF.match(text) and not replaces(n, IF):
            stack.append(n)
        elif ENDIF.match(text) and stack and not replaces(n, ENDIF):
            o = stack.pop()
            t = target[o]
            if t is None:
                inner = [who[ops[x][1]] for x in range(o + 1, n)
                         if ops[x][0] == 'k' and who[ops[x][1]]]
                t = min(inner) if inner else None
            target[o] = t
            for x in range(o + 1, n + 1):
                if ops[x][0] != 'i':
                    continue
                if target[x] is None:
                    target[x] = t
                elif (x == n or ELSE.match(t46[ops[x][2]])) and target[x] != t:
                    if any(ops[y][0] == 'd' for y in by_run[runs[x]]):
                        print(f'warning: {path}:{ops[x][2] + 1} stays at {target[x]}, '
                              f'its #if at {t}', file=sys.stderr)
                    else:
                        target[x] = t
    # an #if that replaces one: its inserted #endif (matched in T46) with it
    stack = []
    for n, (kind, j45, j46) in enumerate(ops):
        if kind == 'd' or not is_c:
            continue
        text = t46[j46]
        if IF.match(text):
            stack.append(n)
        elif ENDIF.match(text) and stack:
            o = stack.pop()
            if (ops[o][0] == 'i' and replaces(o, IF) and ops[n][0] == 'i'
                    and not any(ops[y][0] == 'd' for y in by_run[runs[n]])):
                target[n] = target[o]
    # other insertions: the newer neighbour
    for n, (kind, j45, j46) in enumerate(ops):
        if kind != 'i' or target[n] is not None:
            continue
        p = next((who[ops[x][1]] for x in range(n - 1, -1, -1) if ops[x][0] != 'i'), 0)
        q = next((who[ops[x][1]] for x in range(n + 1, len(ops)) if ops[x][0] != 'i'), 0)
        target[n] = max(p, q) or None
    for n, (kind, j45, j46) in enumerate(ops):
        if kind == 'i' and (path, j46 + 1) in overrides:
            run_ops = by_run[runs[n]]
            if not any(ops[y][0] == 'd' for y in run_ops):
                run_ops = [n]      # a pure insertion: the line alone
            for x in run_ops:
                target[x] = overrides[(path, j46 + 1)]
    for n, (kind, j45, j46) in enumerate(ops):
        if kind != 'k' and (path, 0) in overrides:
            target[n] = overrides[(path, 0)]
        if target[n] is None and kind != 'k':
            unplaced.append((path, j46 + 1 if kind == 'i' else None,
                             t46[j46] if kind == 'i' else t45[j45]))
    # transient lines: ('x', None, (first, last, text)), in commits
    # first..last only, after T46 line `after`
    for after, first, last_, text in sorted(extras.get(path, []), reverse=True):
        at = next(n for n, op in enumerate(ops) if op[0] != 'd' and op[2] == after - 1)
        ops.insert(at + 1, ('x', None, (first, last_, text)))
        target.insert(at + 1, first)
    plan[path] = (t45, t46, ops, target)

for path, (t45, t46, ops, target) in plan.items():
    print(f'== {path}')
    for n, (kind, j45, j46) in enumerate(ops):
        if kind == 'k':
            continue
        if kind == 'x':
            print(f'  {j46[0]}-{j46[1]}       +{j46[2]}')
            continue
        text = t46[j46] if kind == 'i' else t45[j45]
        where = f'{j46 + 1:5d}' if kind == 'i' else '     '
        print(f'  {target[n] or "??":>2} {where} {"+" if kind == "i" else "-"}{text}')
if unplaced:
    print(f'{len(unplaced)} unplaced lines (use --override PATH:LINE=N):', file=sys.stderr)
    for u in unplaced:
        print(f'  {u[0]}:{u[1]} {u[2]}', file=sys.stderr)
    sys.exit(1)
if plan_only:
    sys.exit(0)


def tree_of(i, path, t45, t46, ops, target):
    """Commit i's version of path with the changes placed at or before i."""
    rev = commits[i - 1]
    ti = show(rev, path)
    had = ti is not None
    ti = ti or []
    if ti and ti[-1] == '':
        ti = ti[:-1]
    mine = [n for n in range(len(ops)) if ops[n][0] in 'di' and target[n] <= i
            or ops[n][0] == 'x' and ops[n][2][0] <= i <= ops[n][2][1]]
    if not mine:
        return None if not had else ti
    m = line_map(f'{last}~1', rev, path, len(t45)) if had else [None] * len(t45)
    drop = set()
    before = defaultdict(list)   # gap g: inserted before ti[g]; (order, side, text)
    for n in mine:
        kind, j45, j46 = ops[n]
        if kind == 'd':
            if m[j45] is not None:
                drop.add(m[j45])
            continue
        text = j46[2] if kind == 'x' else t46[j46]
        # the T45 lines around it that commit i has
        prev = next((m[ops[x][1]] for x in range(n - 1, -1, -1)
                     if ops[x][0] in 'kd' and m[ops[x][1]] is not None), None)
        nxt = next((m[ops[x][1]] for x in range(n + 1, len(ops))
                    if ops[x][0] in 'kd' and m[ops[x][1]] is not None), None)
        if IF.match(text) and nxt is not None:
            before[nxt].append((n, text))
        elif prev is not None:
            before[prev + 1].append((n, text))
        elif nxt is not None:
            before[nxt].append((n, text))
        else:
            before[len(ti)].append((n, text))
    out = []
    for g in range(len(ti) + 1):
        out.extend(t for _, t in sorted(before.get(g, [])))
        if g < len(ti) and g not in drop:
            out.append(ti[g])
    return out


subprocess.run(['git', '-C', repo, 'checkout', '-q', '-B', 'folded', 'base'], check=True)
for i, c in enumerate(commits, 1):
    git('read-tree', '--reset', '-u', c)
    for path, (t45, t46, ops, target) in plan.items():
        new = tree_of(i, path, t45, t46, ops, target)
        full = f'{repo}/{path}'
        if new is None:
            continue
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, 'w', encoding='utf-8', errors='surrogateescape') as f:
            f.write('\n'.join(new) + '\n')
        git('add', '-f', path)
    env = dict(os.environ)
    fmt = git('log', '-1', '--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI', c).decode().split('\0')
    env.update(GIT_AUTHOR_NAME=fmt[0], GIT_AUTHOR_EMAIL=fmt[1], GIT_AUTHOR_DATE=fmt[2],
               GIT_COMMITTER_NAME=fmt[3], GIT_COMMITTER_EMAIL=fmt[4].strip(),
               GIT_COMMITTER_DATE=fmt[5].strip())
    msg = git('log', '-1', '--format=%B', c)
    subprocess.run(['git', '-C', repo, 'commit', '-q', '--allow-empty', '-F', '-'],
                   input=msg, env=env, check=True)
diff = git('diff', '--stat', last, 'folded').decode()
print('folded vs the unfolded tip:', diff.strip() or 'identical')
