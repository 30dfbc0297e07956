#!/usr/bin/env python3
"""lookups_py.py - what a lookup costs from Python, against a running
kvcached: kvclient.Client.lookup answered from the presence table
(lookup="auto", protocol 1.5) beside the same calls asked of the daemon
(lookup="daemon"), for chains of 1, 16 and 256 resident keys; and the time
the vLLM connector's scheduler side spends in get_num_new_matched_tokens per
request (kvclient.vllm.KvcachedConnector's own method, on a vLLM Request of
the installed vLLM: the chain keys of the prompt and the lookup), both ways.

usage: lookups_py.py SOCKET [--seconds S] [--json]
Prints a markdown table (per call: p50 and p99 of single calls, timed with
perf_counter_ns; calls per second on one thread).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import kvclient  # noqa: E402

TPB = 16


def timed(fn, seconds):
    for _ in range(200):
        fn()
    lat = []
    end = time.perf_counter() + seconds / 2
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns()
        fn()
        lat.append(time.perf_counter_ns() - t0)
    lat.sort()
    n, t0 = 0, time.perf_counter()
    end = t0 + seconds / 2
    while time.perf_counter() < end:
        for _ in range(32):
            fn()
        n += 32
    return lat[len(lat) // 2], lat[len(lat) * 99 // 100], n / (time.perf_counter() - t0)


def vllm_request(tokens):
    """A vLLM Request of the installed vLLM, or None (and why)."""
    try:
        import vllm
        from vllm import SamplingParams
        from vllm.v1.request import Request
        r = Request(request_id="bench", prompt_token_ids=list(tokens),
                    sampling_params=SamplingParams(max_tokens=1), pooling_params=None)
        return r, f"vllm {vllm.__version__}"
    except Exception as e:  # noqa: BLE001 - any reason the engine cannot be used
        return None, f"vLLM's Request not available: {e}"


def connector(client):
    """KvcachedConnector's scheduler side on an open client: the object
    vLLM would build, without a VllmConfig (its __init__ reads one)."""
    from kvclient.vllm import STAT_NAMES, KvcachedConnector
    c = KvcachedConnector.__new__(KvcachedConnector)
    c._client = client
    c.block_tokens = TPB
    c.load_async = True
    c.stats = dict.fromkeys(STAT_NAMES, 0)
    c._trackers = {}
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    layout = kvclient.Layout(block_bytes=4096, tokens_per_block=TPB, layers=1, kv_heads=1,
                             head_dim=64, dtype="bf16")
    auto = kvclient.Client(a.socket, tenant="bench-py", layout=layout, g1=False)
    dmn = kvclient.Client(a.socket, tenant="bench-py", layout=layout, g1=False, lookup="daemon")
    if not auto.lookup_stats()["mapped"]:
        sys.exit(f"no presence table: {auto.lookup_stats()['reason']}")
    tokens = [(i * 7919 + os.getpid()) % 32000 for i in range(256 * TPB + 1)]
    keys = auto.chain_keys(tokens[:256 * TPB])
    for i, k in enumerate(keys):
        with auto.alloc([k], parents=[keys[i - 1]] if i else None) as al:
            al.blocks[0].write(bytes(4096))
            al.commit()
    rows = []
    for n in (1, 16, 256):
        for name, c in (("presence table", auto), ("daemon LOOKUP", dmn)):
            ks = keys[:n]
            assert c.lookup(ks)[0] == n
            p50, p99, rate = timed(lambda: c.lookup(ks), a.seconds)
            rows.append({"what": f"Client.lookup, {name}", "keys": n, "p50_ns": p50,
                         "p99_ns": p99, "calls_per_s": rate})
    req, engine = vllm_request(tokens)
    if req is not None:
        for name, c in (("presence table", auto), ("daemon LOOKUP", dmn)):
            conn = connector(c)
            ext, _ = conn.get_num_new_matched_tokens(req, 0)
            assert ext == 256 * TPB, ext
            p50, p99, rate = timed(lambda: conn.get_num_new_matched_tokens(req, 0), a.seconds)
            rows.append({"what": f"get_num_new_matched_tokens ({engine}, {len(tokens)} tokens), "
                                 f"{name}", "keys": 256, "p50_ns": p50, "p99_ns": p99,
                         "calls_per_s": rate})
    else:
        print(f"# {engine}", file=sys.stderr)
    st = auto.lookup_stats()
    auto.delete(keys)
    auto.close()
    dmn.close()
    if st["daemon"]:
        sys.exit(f"{st['daemon']} lookups of the table's client went to the daemon")
    if a.json:
        print(json.dumps(rows))
        return
    print("| call | keys | p50 | p99 | calls/s (one thread) |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['what']} | {r['keys']} | {r['p50_ns'] / 1e3:.2f} us | "
              f"{r['p99_ns'] / 1e3:.2f} us | {r['calls_per_s']:.3g} |")


if __name__ == "__main__":
    main()
