#!/usr/bin/env python3
"""Plot the rustkvm plugin's counter timeline (its `timeline=FILE`, trace-event
JSON) as an SVG: one panel per counter track, one line per vCPU.

  scripts/plot-timeline.py TIMELINE.json OUT.svg [--x instructions|time]
                           [--tracks NAME,NAME...]

--x instructions (default): against the vCPU's instructions executed (the
`at_instructions` the plugin records on its `instructions` track); --x time:
against host time since the plugin was loaded. --tracks: which counter
tracks, by name (default: every track in the file, e.g. "instructions",
"branches", "branches per instruction"). No dependencies beyond Python 3.
The same file opens in Perfetto's UI (https://ui.perfetto.dev) as is.
"""
import argparse
import json
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
           "#e377c2", "#17becf"]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        sys.exit(f"{path}: no traceEvents array: not a trace-event JSON")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    counters = [e for e in events if e.get("ph") == "C"]
    # (pid, ts) -> cumulative instructions, from the instructions track.
    at = {(e["pid"], e["ts"]): e["args"].get("at_instructions")
          for e in counters if e["name"] == "instructions"}
    series = {}  # track -> pid -> [(x_time, x_insns, y)]
    for e in counters:
        (value,) = [v for k, v in e["args"].items() if k != "at_instructions"]
        series.setdefault(e["name"], {}).setdefault(e["pid"], []).append(
            (e["ts"], at.get((e["pid"], e["ts"])), value))
    return doc.get("otherData", {}), names, series


def nice(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e9:
        return f"{v / 1e9:.3g}G"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def svg(meta, names, series, tracks, x_axis):
    width, panel_h, left, right, top, gap = 900, 170, 80, 150, 60, 50
    height = top + len(tracks) * (panel_h + gap)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="15">rustkvm plugin timeline '
           f'({escape(str(meta.get("target", "?")))}, interval '
           f'{escape(str(meta.get("interval", "?")))} instructions)</text>']
    xi = 1 if x_axis == "instructions" else 0
    xlabel = "instructions executed (per vCPU)" if xi else "host time since load (µs)"
    for k, track in enumerate(tracks):
        y0 = top + k * (panel_h + gap)
        pts = [p for pid in series[track] for p in series[track][pid]
               if p[xi] is not None]
        if not pts:
            continue
        xmin, xmax = min(p[xi] for p in pts), max(p[xi] for p in pts)
        ymin, ymax = min(0, min(p[2] for p in pts)), max(p[2] for p in pts)
        xmax = xmax if xmax > xmin else xmin + 1
        ymax = ymax if ymax > ymin else ymin + 1
        pw = width - left - right

        def sx(x):
            return left + (x - xmin) / (xmax - xmin) * pw

        def sy(y):
            return y0 + panel_h - (y - ymin) / (ymax - ymin) * panel_h
        out.append(f'<rect x="{left}" y="{y0}" width="{pw}" height="{panel_h}" '
                   f'fill="none" stroke="#888"/>')
        out.append(f'<text x="{left}" y="{y0 - 6}" font-weight="bold">'
                   f'{escape(track)}</text>')
        for frac in (0, 0.5, 1):
            yv = ymin + frac * (ymax - ymin)
            out.append(f'<text x="{left - 6}" y="{sy(yv) + 4:.1f}" '
                       f'text-anchor="end">{nice(yv)}</text>')
            xv = xmin + frac * (xmax - xmin)
            out.append(f'<text x="{sx(xv):.1f}" y="{y0 + panel_h + 15}" '
                       f'text-anchor="middle">{nice(xv)}</text>')
        out.append(f'<text x="{left + pw / 2}" y="{y0 + panel_h + 30}" '
                   f'text-anchor="middle" fill="#555">{escape(xlabel)}</text>')
        for n, pid in enumerate(sorted(series[track])):
            colour = COLOURS[n % len(COLOURS)]
            line = [p for p in series[track][pid] if p[xi] is not None]
            line.sort(key=lambda p: p[xi])
            coords = " ".join(f"{sx(p[xi]):.1f},{sy(p[2]):.1f}" for p in line)
            out.append(f'<polyline points="{coords}" fill="none" '
                       f'stroke="{colour}" stroke-width="1.5"/>')
            out.append(f'<text x="{width - right + 10}" y="{y0 + 15 + 16 * n}" '
                       f'fill="{colour}">{escape(names.get(pid, f"pid {pid}"))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline")
    ap.add_argument("out")
    ap.add_argument("--x", choices=["instructions", "time"], default="instructions")
    ap.add_argument("--tracks", default="")
    a = ap.parse_args()
    meta, names, series = load(a.timeline)
    tracks = [t for t in a.tracks.split(",") if t] or sorted(series)
    missing = [t for t in tracks if t not in series]
    if missing:
        sys.exit(f"no track {', '.join(missing)} in {a.timeline} "
                 f"(it has: {', '.join(sorted(series))})")
    if not tracks:
        sys.exit(f"{a.timeline}: no counter events (was interval= too large?)")
    with open(a.out, "w") as f:
        f.write(svg(meta, names, series, tracks, a.x))
    print(f"{a.out}: {len(tracks)} panels, "
          f"{len({p for t in series.values() for p in t})} vCPUs")


if __name__ == "__main__":
    main()
