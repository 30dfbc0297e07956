#!/usr/bin/env python3
"""tracegen.py - synthetic request traces in the Mooncake JSONL format.

Named workload shapes meant to break eviction policies, each a plausible
kind of traffic for a KV cache. One JSON object per request, in time order:

    {"timestamp": ms, "input_length": tokens, "output_length": tokens,
     "hash_ids": [block ids of the prompt, in order]}

plus "session", "agent" and "stop" where the shape has sessions (as the
agentic trace: tools/trace.h). A block is 512 tokens; ids form a true
prefix tree (an id always follows the same ids). Deterministic: the same
shape, seed and scale give the same bytes on any machine and Python 3.

usage: tracegen.py SHAPE [--seed N] [--scale X] [-o FILE]
       tracegen.py --list

Shapes (their parameters are round numbers of the kind of traffic each
stands for, not fitted to any policy):
  chat      short reuse: conversations of a few turns (1 + geometric, mean
            2 more), a minute apart; most blocks come back once, soon
  zipf      long tail: 8,000 documents of 4-64 blocks, Zipf(0.9)
            popularity, each request a document and a question of its own
  shift     zipf whose popularity is reshuffled five times
  scan      a hot set of 400 documents (Zipf 1.0) served between scans
            that walk a cold corpus once, a third of the requests
  loop      documents read in the same cyclic order, the loop 55% of the
            unique blocks (slightly larger than a cache of half of them),
            with one-off requests between
  tenants   chat and zipf traffic of two tenants, interleaved
  sessions  agentic sessions: contexts that grow turn by turn, tool calls
            (seconds apart) and turns that wait on a person (minutes to
            hours), with session ids and stop reasons for hints
"""
import argparse
import bisect
import json
import math
import random
import sys

BLOCK = 512


class Ids:
    """Fresh block ids."""

    def __init__(self):
        self.next = 0

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def zipf_cdf(n, alpha):
    w = [1.0 / (i + 1) ** alpha for i in range(n)]
    s = sum(w)
    cdf, acc = [], 0.0
    for x in w:
        acc += x / s
        cdf.append(acc)
    cdf[-1] = 1.0
    return cdf


def draw(rng, cdf):
    return bisect.bisect_left(cdf, rng.random())


def expo(rng, mean):
    return -mean * math.log(1.0 - rng.random())


def geometric(rng, mean):
    """0, 1, 2, ... with the given mean."""
    p = 1.0 / (1.0 + mean)
    return int(math.log(1.0 - rng.random()) / math.log(1.0 - p))


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def request(ts, blocks, out_tokens, rng, **extra):
    # the last block partly filled, as real prompts end mid-block
    tokens = len(blocks) * BLOCK - rng.randrange(BLOCK)
    r = {"timestamp": int(ts), "input_length": tokens, "output_length": out_tokens,
         "hash_ids": blocks}
    r.update(extra)
    return r


def docs_corpus(rng, ids, n, lo=4, hi=64):
    return [ids.take(log_uniform(rng, lo, hi)) for _ in range(n)]


# ---- shapes: each yields requests (not necessarily in time order) ---------------------


def chat(rng, ids, scale, t0=0.0, rate=4.0, tag=None):
    """Conversations arriving at `rate` a second; a shared system prompt
    (one of 16, Zipf), turns a minute apart, each adding the answer and the
    next message (1-6 blocks)."""
    systems = [ids.take(log_uniform(rng, 2, 12)) for _ in range(16)]
    scdf = zipf_cdf(len(systems), 1.0)
    nconv = int(6000 * scale)
    t = t0
    for _ in range(nconv):
        t += expo(rng, 1000.0 / rate)
        ctx = list(systems[draw(rng, scdf)]) + ids.take(1 + rng.randrange(6))
        ts = t
        for turn in range(1 + geometric(rng, 2.0)):
            if turn:
                ts += expo(rng, 60000.0)
                ctx = ctx + ids.take(1 + rng.randrange(6))
            yield request(ts, ctx, 200, rng)


def zipf_docs(rng, ids, scale, t0=0.0, shifts=0, ndocs=8000, nreq=30000, rate=20.0):
    """Requests for documents of Zipf(0.9) popularity, each with a question
    of its own; with shifts, the popularity reshuffled that many times."""
    docs = docs_corpus(rng, ids, int(ndocs * scale))
    cdf = zipf_cdf(len(docs), 0.9)
    order = list(range(len(docs)))
    rng.shuffle(order)
    n = int(nreq * scale)
    t = t0
    for i in range(n):
        if shifts and i and i % (n // (shifts + 1)) == 0:
            rng.shuffle(order)
        t += expo(rng, 1000.0 / rate)
        d = docs[order[draw(rng, cdf)]]
        yield request(t, d + ids.take(1 + rng.randrange(2)), 100, rng)


def zipf(rng, ids, scale):
    return zipf_docs(rng, ids, scale)


def shift(rng, ids, scale):
    return zipf_docs(rng, ids, scale, shifts=5)


def scan(rng, ids, scale):
    """Two requests in three for a hot set; the rest walk a cold corpus
    in order, each cold document once."""
    hot = docs_corpus(rng, ids, int(400 * scale))
    cdf = zipf_cdf(len(hot), 1.0)
    n = int(30000 * scale)
    t = 0.0
    for i in range(n):
        t += expo(rng, 50.0)
        if i % 3 == 2:
            yield request(t, ids.take(log_uniform(rng, 4, 64)), 100, rng)
        else:
            yield request(t, hot[draw(rng, cdf)] + ids.take(1), 100, rng)


def loop(rng, ids, scale):
    """The same documents over and over in one order, with a one-off
    request between every two, sized so the loop is 55% of the unique
    blocks."""
    docs = docs_corpus(rng, ids, int(400 * scale))
    loop_blocks = sum(len(d) for d in docs)
    passes = 6
    once_total = loop_blocks * 45 // 55
    per_once = max(1, once_total // (passes * len(docs) // 2))
    t = 0.0
    for p in range(passes):
        for i, d in enumerate(docs):
            t += expo(rng, 50.0)
            yield request(t, d, 100, rng)
            if i % 2:
                t += expo(rng, 50.0)
                yield request(t, ids.take(per_once), 100, rng)


def tenants(rng, ids, scale):
    """A chat tenant and a document tenant at once."""
    a = list(chat(rng, ids, scale * 0.5, rate=2.0))
    b = list(zipf_docs(rng, ids, scale * 0.5, nreq=30000, rate=10.0))
    return a + b


def sessions(rng, ids, scale):
    """Agentic sessions (about one a minute): a tool prompt (one of 3),
    then turns of 1-8 blocks each; after a tool call the next request comes
    in seconds, after an answer to the person in minutes, and a session
    ends after an answer with probability 0.3. Session ids and stop reasons
    in the trace, for hints."""
    tools = [ids.take(log_uniform(rng, 8, 24)) for _ in range(3)]
    nsess = int(600 * scale)
    t = 0.0
    for s in range(1, nsess + 1):
        t += expo(rng, 60000.0)
        ctx = list(tools[rng.randrange(3)]) + ids.take(1 + rng.randrange(8))
        ts = t
        turns = 0
        while turns < 400:
            turns += 1
            stop = "tool_use" if rng.random() < 0.8 else "end_turn"
            yield request(ts, list(ctx), 200, rng, session=s, agent="", stop=stop)
            if stop == "end_turn" and rng.random() < 0.3:
                break
            # a tool's answer in seconds; a person's in minutes (log-normal,
            # median 3 minutes)
            ts += expo(rng, 8000.0) if stop == "tool_use" else \
                180000.0 * math.exp(rng.gauss(0.0, 1.2))
            ctx = ctx + ids.take(1 + rng.randrange(8))


SHAPES = {"chat": chat, "zipf": zipf, "shift": shift, "scan": scan, "loop": loop,
          "tenants": tenants, "sessions": sessions}


def generate(shape, seed=1, scale=1.0):
    rng = random.Random(seed)
    reqs = list(SHAPES[shape](rng, Ids(), scale))
    reqs.sort(key=lambda r: r["timestamp"])  # stable: ties keep their order
    return reqs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiplies the number of requests and documents")
    ap.add_argument("-o", "--output", help="file to write (default: standard output)")
    ap.add_argument("--list", action="store_true", help="the shapes, one a line")
    a = ap.parse_args()
    if a.list:
        print("\n".join(sorted(SHAPES)))
        return 0
    if not a.shape:
        ap.error("a shape is needed (--list names them)")
    if a.scale <= 0:
        ap.error("--scale must be positive")
    out = open(a.output, "w") if a.output else sys.stdout
    with out:
        for r in generate(a.shape, a.seed, a.scale):
            out.write(json.dumps(r, separators=(", ", ": ")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
