#!/usr/bin/env python3
"""disagg_ttft.py - prefill on one node, decode on another, in one run: two
kvcached daemons on one throwaway Redis Cluster (kvclient.testing.Fleet),
the reference engine (kvclient.examples.llama) on each "node" of this
machine.

For each prompt length N, node A computes the prompt's KV and stores its
blocks with COMMITs answered once the blocks are in G4
(PagedKV.save(shared=True)); from the moment that save returns (the
prefill's last COMMIT answered), node B, which holds nothing of it, loads
the prompt through G4 (PagedKV.load: LOOKUP brings the blocks from G4
into B's G2, LOAD, copy into B's pages) and computes the first token:
  hand-off   save returned on A -> first token's logits on B;
  recompute  B computes the whole prompt (the engine without kvcached).
Also timed: A's save itself (with shared=True, and a plain save for
reference). Every figure is the median of --runs runs; each run stores
under a salt of its own, so B never holds a block before its run. The
hand-off's logits are compared with the recompute's.

Starts its own Redis Cluster and daemons (temporary directory) and stops
them at the end; needs redis-server and redis-cli (deploy/install-deps.sh).

  python3 tools/bench/disagg_ttft.py                     # CPU, "small" model
  python3 tools/bench/disagg_ttft.py --lengths 1024,4096 --runs 5
"""
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ttft import bench_args, dump, model_args, sync, timed_prefill  # noqa: E402

import torch  # noqa: E402

from kvclient import Client  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.testing import Fleet  # noqa: E402


def settle(node, timeout=60.0):
    """Waits until node has no G4 command in flight."""
    end = time.monotonic() + timeout
    while node.metric("kvcached_g4_commands_in_flight") > 0 and time.monotonic() < end:
        time.sleep(0.01)


def main():
    ap = bench_args(__doc__)
    ap.add_argument("--lengths", default="1024,4096,16384", help="prompt lengths")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    dev, preset, dtype = model_args(a)
    cuda = dev.type == "cuda"
    lengths = [int(x) for x in a.lengths.split(",")]
    cfg = LlamaConfig.preset(preset)
    T = a.page_tokens
    E = torch.tensor([], dtype=dtype).element_size()
    tok_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * E
    maxlen = max(lengths)
    model = Llama(cfg, seed=0, dtype=dtype, device=dev)
    npages = -(-maxlen // T) + 2
    cache_a = PagedKVCache(cfg, num_pages=npages, page_tokens=T, dtype=dtype, device=dev)
    cache_b = PagedKVCache(cfg, num_pages=npages, page_tokens=T, dtype=dtype, device=dev)
    pages = list(range(npages))
    lay_a, lay_b = PagedLayout.vllm(cache_a.kv), PagedLayout.vllm(cache_b.kv)
    block_bytes = lay_a.page_block_bytes
    # G2 of each node: every run's prompt (each under its salt) and room
    g2 = str(max((a.runs + 2) * maxlen * tok_bytes, 256 << 20))
    lookup_blocks = 1024  # the most a LOOKUP may ask G4 for (PagedKV.load repeats)
    tmp = tempfile.mkdtemp(prefix="kvdisagg-")
    fleet = Fleet(tmp, timeout_ms=5000).start()
    env = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
           "preset": preset, "dtype": str(dtype).split(".")[-1], "page_tokens": T,
           "block_bytes": block_bytes, "kv_bytes_per_token": tok_bytes,
           "threads": torch.get_num_threads(), "runs": a.runs, "redis_masters": fleet.masters,
           "g4_lookup_blocks": lookup_blocks}
    print(json.dumps(env), flush=True)
    rows = []
    try:
        sets = ("g2.page_size=" + str(max(64 << 20, block_bytes)),
                f"g4.lookup_blocks={lookup_blocks}", "limits.session_share=100")
        node_a = fleet.node("a", g2=g2, sets=sets, log_level="warn")
        node_b = fleet.node("b", g2=g2, sets=sets, log_level="warn")
        gen = torch.Generator().manual_seed(11)

        def prefill(cache, tokens, start=0):
            return timed_prefill(model, cache, pages, tokens, start)

        for n in lengths:
            prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
            prefill(cache_a, prompt)  # node A's prefill: the KV it hands over, computed once
            t_rec, ref = zip(*[prefill(cache_b, prompt) for _ in range(a.runs)])
            ref = ref[-1].float()
            runs = []
            for r in range(a.runs + 1):  # the first run warms up (untimed)
                salt = f"n{n}r{r}".encode()
                with Client(node_a.socket, tenant="fleet", salt=salt,
                            layout=lay_a.client_layout()) as ca, \
                        Client(node_b.socket, tenant="fleet", salt=salt,
                               layout=lay_b.client_layout()) as cb, \
                        Client(node_a.socket, tenant="fleet", salt=salt + b"-plain",
                               layout=lay_a.client_layout()) as cp:
                    pa, pb = PagedKV(ca, lay_a), PagedKV(cb, lay_b)
                    t = time.perf_counter()
                    sv = pa.save(prompt, pages, shared=True)
                    t_save = time.perf_counter() - t
                    t0 = time.perf_counter()  # the prefill's last COMMIT is answered
                    ld = pb.load(prompt, pages, lookups=64)
                    sync(dev)
                    t_load = time.perf_counter() - t0
                    t_pre, lg = prefill(cache_b, prompt, ld.tokens)
                    t_hand = time.perf_counter() - t0
                    err = float((lg.float() - ref).abs().max() / ref.abs().max())
                    want = min(sv.blocks, (n - 1) // T) * T  # load leaves the last token
                    if ld.tokens != want or sv.shared != sv.stored:
                        print(f"warning: stored {sv.stored} (in G4 {sv.shared}), B loaded "
                              f"{ld.tokens} of {want} tokens (failed {ld.failed[:3]})",
                              flush=True)
                    # the reference: a plain save on A (its G4 writes in the background,
                    # let finish before the next run)
                    t = time.perf_counter()
                    plain = PagedKV(cp, lay_a).save(prompt, pages)
                    t_plain = time.perf_counter() - t
                    settle(node_a)
                    if r:
                        runs.append({"handoff_s": t_hand, "load_s": t_load, "prefill_s": t_pre,
                                     "save_shared_s": t_save, "save_plain_s": t_plain,
                                     "stored": sv.stored, "shared": sv.shared,
                                     "plain_stored": plain.stored, "loaded_tokens": ld.tokens,
                                     "lookup_s": ld.timings.get("lookup", 0.0),
                                     "rel_logit_diff": err,
                                     "same_argmax": int(lg.argmax()) == int(ref.argmax())})
            med = {k: statistics.median(x[k] for x in runs)
                   for k in ("handoff_s", "load_s", "prefill_s", "save_shared_s", "save_plain_s",
                             "lookup_s")}
            row = {"tokens": n, "kv_bytes": (n // T) * T * tok_bytes,
                   "recompute_s": statistics.median(t_rec), **med,
                   "loaded_tokens": min(x["loaded_tokens"] for x in runs),
                   "shared_blocks": min(x["shared"] for x in runs),
                   "max_rel_logit_diff": max(x["rel_logit_diff"] for x in runs),
                   "same_argmax": all(x["same_argmax"] for x in runs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"Prefill on node A, decode on node B through G4 ({env['redis_masters']}-master Redis "
          f"Cluster on loopback), {env['device']}, model {preset} {env['dtype']}, "
          f"{T}-token blocks of {block_bytes // 1024} KiB, median of {a.runs}")
    print("| tokens | KV | recompute on B | hand-off (commit -> first token) | of which load "
          "| load GB/s | speedup | A: save shared / plain | logit diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['kv_bytes'] / 2**20:.0f} MiB "
              f"| {r['recompute_s'] * 1e3:.0f} ms | {r['handoff_s'] * 1e3:.0f} ms "
              f"| {r['load_s'] * 1e3:.0f} ms | {r['kv_bytes'] / r['load_s'] / 1e9:.2f} "
              f"| {r['recompute_s'] / r['handoff_s']:.1f}x "
              f"| {r['save_shared_s'] * 1e3:.0f} / {r['save_plain_s'] * 1e3:.0f} ms "
              f"| {r['max_rel_logit_diff']:.1e}{'' if r['same_argmax'] else ' (argmax differs)'} |")
    dump(a.json, env, rows)


if __name__ == "__main__":
    main()
