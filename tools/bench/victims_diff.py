#!/usr/bin/env python3
"""victims_diff.py - where one tier and G2 + G3 part: the blocks each
replay let go of the whole cache (`kvbench core-replay --victims PREFIX`,
tiers/EVICTION.md, "Looked at again"), compared request by request.

Two tiers hold a few blocks fewer than one tier of the same total (slots
kept free for the SSD's writes, copies in both tiers), so their victims
run a few blocks ahead; the first request where the victims so far differ
by more than --slack blocks (default 32) is where the two orders part. For
that request, and the ones before it, it prints each replay's victims as
runs of consecutive block ids (a chain cut from its end is one run), with
u after a run whose blocks were used again. Standard library only.

  kvbench core-replay --trace T --policy adapt --g3-dir D --tiers-only \\
          --capacity 0.05 --victims /tmp/v
  python3 tools/bench/victims_diff.py /tmp/v [--slack N] [--before K]
"""
import argparse
import collections
import sys


def load(path):
    """The file's victims, by request: {request: [(id, used_again)]}."""
    by_req = collections.defaultdict(list)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 3:
                sys.exit(f"{path}:{n}: not 'REQUEST KEY USED_AGAIN'")
            by_req[int(parts[0])].append((int(parts[1], 16), parts[2] == "1"))
    return by_req


def runs(victims):
    """Consecutive ids falling by one (a chain cut from its end) as runs."""
    out = []
    for key, again in victims:
        if out and key == out[-1][1] - 1 and again == out[-1][3]:
            out[-1][1] = key
            out[-1][2] += 1
        else:
            out.append([key, key, 1, again])
    return " ".join(f"{a:x}..{b:x}({n}){'u' if u else ''}" for a, b, n, u in out) or "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="the --victims PREFIX (reads PREFIX.one and PREFIX.two)")
    ap.add_argument("--slack", type=int, default=32,
                    help="victims so far that may differ before the orders count as parted")
    ap.add_argument("--before", type=int, default=3, help="requests shown before that one")
    a = ap.parse_args()
    one, two = load(a.prefix + ".one"), load(a.prefix + ".two")
    for name, v in (("one tier", one), ("G2 + G3", two)):
        total = sum(len(x) for x in v.values())
        again = sum(u for x in v.values() for _, u in x)
        print(f"{name}: {total} victims, {100.0 * again / max(total, 1):.1f}% used again")
    seen = collections.Counter()
    for req in sorted(set(one) | set(two)):
        seen.update(k for k, _ in one.get(req, []))
        seen.subtract(k for k, _ in two.get(req, []))
        apart = sum(abs(c) for c in seen.values())
        if apart > a.slack:
            print(f"parted at request {req}: {apart} victims so far differ")
            for r in range(max(0, req - a.before), req + 1):
                print(f"  {r} one tier: {runs(one.get(r, []))}")
                print(f"  {r} G2 + G3:  {runs(two.get(r, []))}")
            return 0
    print(f"never parted by more than {a.slack} victims")
    return 0


if __name__ == "__main__":
    sys.exit(main())
