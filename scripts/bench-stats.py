#!/usr/bin/env python3
"""Summarise a benchmark's alternating runs (scripts/lib.sh: bench_report).

    bench-stats.py DATA [--ratio LABEL=CONFIG.QUANTITY/CONFIG.QUANTITY]...

DATA has one line per measured value, written by bench_alternate:

    ROUND CONFIG QUANTITY VALUE

Prints one row per CONFIG.QUANTITY (in the order first seen), then one per
ratio: its value in each round (a ratio from the two values measured in that
same round), then min / median / max over the rounds. A ratio is never formed across rounds, so each one compares runs made
side by side. Fails on a missing or non-numeric value.
"""
import statistics
import sys


def fail(msg):
    sys.exit(f"bench-stats: {msg}")


def main(argv):
    if not argv:
        fail(__doc__.strip())
    data, ratios = argv[0], []
    args = argv[1:]
    while args:
        if args[0] != "--ratio" or len(args) < 2:
            fail(f"unexpected argument {args[0]!r}")
        label, _, spec = args[1].partition("=")
        num, _, den = spec.partition("/")
        if not (label and num and den):
            fail(f"--ratio wants LABEL=CONFIG.QUANTITY/CONFIG.QUANTITY, not {args[1]!r}")
        ratios.append((label, num, den))
        args = args[2:]

    values = {}  # (round, key) -> float
    keys, rounds = [], []
    with open(data) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                fail(f"{data}:{n}: want ROUND CONFIG QUANTITY VALUE: {line.rstrip()!r}")
            rnd, config, quantity, value = parts
            try:
                v = float(value)
            except ValueError:
                fail(f"{data}:{n}: {config}.{quantity} = {value!r} is not a number")
            key = f"{config}.{quantity}"
            if key not in keys:
                keys.append(key)
            if rnd not in rounds:
                rounds.append(rnd)
            if (rnd, key) in values:
                fail(f"{data}:{n}: {key} measured twice in round {rnd}")
            values[(rnd, key)] = v
    if not rounds:
        fail(f"{data}: no measurements")

    columns = [(k, False, lambda r, k=k: values.get((r, k))) for k in keys]
    for label, num, den in ratios:
        for k in (num, den):
            if k not in keys:
                fail(f"ratio {label}: nothing measured as {k} (have: {' '.join(keys)})")

        def ratio(r, num=num, den=den):
            a, b = values.get((r, num)), values.get((r, den))
            if a is None or b is None:
                return None
            if b == 0:
                fail(f"ratio {num}/{den}: {den} is 0 in round {r}")
            return a / b

        columns.append((label, True, ratio))

    def formatter(vs, ratio):
        """One format per row: integers as such, else decimals by magnitude;
        ratios to 3 places, or 5 when all are within 1 % of 1 (a ratio of
        counts resolves that)."""
        if ratio:
            places = 5 if all(abs(v - 1) < 0.01 for v in vs) else 3
            return lambda v: f"{v:.{places}f}"
        if all(v == int(v) for v in vs):
            return lambda v: f"{v:.0f}"
        top = max(abs(v) for v in vs)
        places = 3 if top < 10 else 1 if top < 1000 else 0
        return lambda v: f"{v:.{places}f}"

    header = ["round " + r for r in rounds] + ["min", "median", "max"]
    rows = []
    for name, is_ratio, get in columns:
        vs = [get(r) for r in rounds]
        got = [v for v in vs if v is not None]
        if len(got) != len(rounds):
            fail(f"{name}: measured in {len(got)} of {len(rounds)} rounds")
        med = statistics.median(got)
        fmt = formatter(got + [med], is_ratio)
        rows.append([name] + [fmt(v) for v in vs] + [fmt(min(got)), fmt(med), fmt(max(got))])
    widths = [max(len(r[0]) for r in rows)]
    for i, h in enumerate(header, 1):
        widths.append(max(len(h), *(len(r[i]) for r in rows)))
    print("  ".join([" " * widths[0]] + [h.rjust(w) for h, w in zip(header, widths[1:])]))
    for r in rows:
        print("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))

if __name__ == "__main__":
    main(sys.argv[1:])
