#!/usr/bin/env python3
"""eviction.py - the eviction report (tiers/EVICTION.md): per trace and
capacity, plain LRU, each candidate policy, the default with and without
engine hints, and Belady's MIN, as prefix token hit %, with the share of
the LRU-to-Belady gap the default closes; and the check the suite holds
the default to.

Traces: the synthetic shapes of tools/tracegen.py (generated into a
temporary directory) and any Mooncake-format files given with --trace.
Every figure comes from `kvbench core-replay --json` (the replay through
the cache core; deterministic: any machine gives the same figures).

usage: eviction.py [--kvbench BIN] [--shapes all|none|a,b,...] [--trace FILE]...
                   [--default NAME] [--candidates a,b,...] [--others a,b,...]
                   [--hints] [--check] [--json FILE]

--candidates: the orders the default moves between (aged0: H = 0, LRU's
  order; aged: H = 4 capacities, the default before H moved); --others:
  policies reported beside them (the core's lru, reuse).
--check: exits 1, naming each cell, where the default is more than
  --lru-margin points (0.3) below plain LRU, or more than --best-margin
  points (0.5) below the best of the candidates.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tracegen  # noqa: E402


def replay(kvbench, trace, policies, hints):
    args = [kvbench, "core-replay", "--trace", trace, "--json"]
    for p in policies:
        args += ["--policy", p]
    if hints:
        args.append("--hints")
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"eviction.py: {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def rates(d, policy, key="prefix_token_hit_rate", sub=None):
    rows = (d.get("by_policy") or {d["policy"]: d["results"]})[policy]
    return [100.0 * ((r[sub] if sub else r)[key]) for r in rows]


def measure(kvbench, name, path, default, candidates, others, hints):
    """One trace: a dict of rows (name -> six rates) and the capacities."""
    policies = [default] + [c for c in candidates + others if c != default]
    d = replay(kvbench, path, policies, False)
    res = d.get("results")
    rows = {"LRU": rates(d, default, sub="reference_lru")}
    for p in policies:
        rows[p] = rates(d, p)
    with_hints = None
    if hints:
        h = replay(kvbench, path, [default], True)
        with_hints = rates(h, default, sub="hints")
    rows["Belady"] = [100.0 * r["belady_prefix_token_hit_rate"] for r in res]
    return {
        "trace": name,
        "requests": d["requests"],
        "block_refs": d["block_refs"],
        "unique_blocks": d["unique_blocks"],
        "capacities": [r["capacity_fraction"] for r in res],
        "capacity_blocks": [r["capacity_blocks"] for r in res],
        "rows": rows,
        "hints": with_hints,
        "default": default,
        "candidates": candidates,
        "others": others,
    }


def gap_closed(m, row, i):
    """The share of plain LRU's gap to Belady closed, %; None where the gap
    is under half a point (a share of nothing says nothing)."""
    lru, bel = m["rows"]["LRU"][i], m["rows"]["Belady"][i]
    return 100.0 * (row[i] - lru) / (bel - lru) if bel - lru >= 0.5 else None


def violations(m, lru_margin, best_margin):
    out = []
    r = m["rows"]
    d = r[m["default"]]
    for i, f in enumerate(m["capacities"]):
        if d[i] < r["LRU"][i] - lru_margin:
            out.append(f"{m['trace']} {f:.0%}: {m['default']} {d[i]:.2f} is "
                       f"{r['LRU'][i] - d[i]:.2f} below plain LRU {r['LRU'][i]:.2f}")
        cands = [c for c in m["candidates"] if c != m["default"]]
        if cands:
            best = max(cands, key=lambda c: r[c][i])
            if d[i] < r[best][i] - best_margin:
                out.append(f"{m['trace']} {f:.0%}: {m['default']} {d[i]:.2f} is "
                           f"{r[best][i] - d[i]:.2f} below the best candidate, "
                           f"{best} {r[best][i]:.2f}")
    return out


def markdown(m):
    caps = " | ".join(f"{f:.0%}" for f in m["capacities"])
    lines = [f"**{m['trace']}** ({m['requests']} requests, {m['block_refs']} block references, "
             f"{m['unique_blocks']} unique blocks; prefix token hit %)", "",
             f"| policy | {caps} |", "|---" * (len(m["capacities"]) + 1) + "|"]
    order = ["LRU"] + [c for c in m["others"] + m["candidates"] if c != m["default"]] + \
        [m["default"]]
    for name in order:
        label = {"LRU": "plain LRU (reference)"}.get(name, f"`{name}`")
        if name == m["default"]:
            label += " (default)"
        lines.append(f"| {label} | " + " | ".join(f"{x:.2f}" for x in m["rows"][name]) + " |")
    if m["hints"]:
        lines.append(f"| `{m['default']}` with hints | " +
                     " | ".join(f"{x:.2f}" for x in m["hints"]) + " |")
    lines.append("| Belady | " + " | ".join(f"{x:.2f}" for x in m["rows"]["Belady"]) + " |")
    def pct(x):
        return "-" if x is None else f"{x:.1f}"

    closed = [gap_closed(m, m["rows"][m["default"]], i) for i in range(len(m["capacities"]))]
    lines.append("| LRU-to-Belady gap closed, % | " + " | ".join(map(pct, closed)) + " |")
    if m["hints"]:
        closed = [gap_closed(m, m["hints"], i) for i in range(len(m["capacities"]))]
        lines.append("| ... with hints | " + " | ".join(map(pct, closed)) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "build", "bin", "kvbench"))
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--default", default="adapt")
    ap.add_argument("--candidates", default="aged0,aged")
    ap.add_argument("--others", default="lru,reuse")
    ap.add_argument("--hints", action="store_true",
                    help="also the default with hints, on traces with sessions")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--lru-margin", type=float, default=0.3)
    ap.add_argument("--best-margin", type=float, default=0.5)
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    shapes = sorted(tracegen.SHAPES) if a.shapes == "all" else \
        [] if a.shapes == "none" else a.shapes.split(",")
    for s in shapes:
        if s not in tracegen.SHAPES:
            ap.error(f"no shape {s!r} (tools/tracegen.py --list)")
    candidates = [c for c in a.candidates.split(",") if c]
    others = [c for c in a.others.split(",") if c and c not in candidates]
    results, bad = [], []
    with tempfile.TemporaryDirectory(prefix="kv-eviction-") as tmp:
        todo = []
        for s in shapes:
            path = os.path.join(tmp, s + ".jsonl")
            with open(path, "w") as f:
                for r in tracegen.generate(s):
                    f.write(json.dumps(r) + "\n")
            todo.append((s, path, s == "sessions"))
        for t in a.trace:
            with open(t) as f:
                first = json.loads(f.readline() or "{}")
            todo.append((os.path.basename(t), t, "session" in first))
        for name, path, sessions in todo:
            m = measure(a.kvbench, name, path, a.default, candidates, others,
                        a.hints and sessions)
            results.append(m)
            print(markdown(m), flush=True)
            if a.check:
                bad += violations(m, a.lru_margin, a.best_margin)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.check:
        for v in bad:
            print("FAIL " + v)
        print(f"check: {len(bad)} cells out of bounds" if bad else "check: every cell within bounds")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
