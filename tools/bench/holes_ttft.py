#!/usr/bin/env python3
"""holes_ttft.py - time to first token of the reference engine when one
block in the middle of a cached prefix is missing (a hole), in one run:

  holes       the blocks on both sides of the hole loaded (PagedKV.load
              with holes=True), the hole's tokens and the prompt's last
              block computed alone (Llama.prefill with filled=);
  from hole   the leading run loaded (PagedKV.load), everything from the
              hole on computed, as an engine that stops at the first
              missing block does;
  recompute   the whole prompt computed, the engine without kvcached.

For each prompt length N: another request (other pages) computes and
stores the prompt's first N - T tokens (T tokens a block), then the block
at the middle of them is deleted from kvcached. Every figure is the median
of --runs runs after one untimed warm-up per length; TTFT runs from the
request to the first token's logits on the host side of a synchronised
device. The logits of each run are compared with the recompute's (max
relative difference; the greedy token must agree).

Starts its own kvcached (temporary socket directory) and stops it at the end.

  python3 tools/bench/holes_ttft.py                         # CPU, "small" model
  python3 tools/bench/holes_ttft.py --device cuda --preset 1b --dtype bf16 \\
      --lengths 8192,16384,32768
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
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache, gaps  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402

WAYS = ("holes", "from_hole", "recompute")


def main():
    ap = bench_args(__doc__)
    ap.add_argument("--lengths", default=None,
                    help="prompt lengths (default 8192 CPU; 8192,16384,32768 CUDA)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--kvcached", default=None,
                    help="the daemon (default $KVCACHED_BIN, else <repo>/build/bin/kvcached)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    dev, preset, dtype = model_args(a)
    cuda = dev.type == "cuda"
    lengths = [int(x) for x in (a.lengths or ("8192,16384,32768" if cuda else "8192")).split(",")]
    cfg = LlamaConfig.preset(preset)
    T = a.page_tokens
    E = torch.tensor([], dtype=dtype).element_size()
    tok_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * E
    maxlen = max(lengths)
    model = Llama(cfg, seed=0, dtype=dtype, device=dev)
    npages = 2 * (-(-maxlen // T)) + 4
    cache = PagedKVCache(cfg, num_pages=npages, page_tokens=T, dtype=dtype, device=dev)
    layout = PagedLayout.vllm(cache.kv)
    tmp = tempfile.mkdtemp(prefix="kvholes-")
    d = Daemon(tmp, g2=str(max(2 * maxlen * tok_bytes, 256 << 20)),
               page=str(max(64 << 20, layout.page_block_bytes)), binary=a.kvcached,
               log_level="warn").start()
    gen = torch.Generator().manual_seed(7)
    rows = []
    env = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
           "preset": preset, "dtype": str(dtype).split(".")[-1], "page_tokens": T,
           "threads": torch.get_num_threads(), "runs": a.runs}
    print(json.dumps(env), flush=True)
    try:
        client = Client(d.socket, tenant="holes", layout=layout.client_layout())
        pk = PagedKV(client, layout)
        set_a, set_b = list(range(npages // 2)), list(range(npages // 2, npages))

        def prefill(tokens, pages, start=0, filled=()):
            return timed_prefill(model, cache, pages, tokens, start, filled)

        def timed(way, prompt):
            sync(dev)
            t = time.perf_counter()
            if way == "recompute":
                r, start, filled = None, 0, ()
            else:
                r = pk.load(prompt, set_b, holes=way == "holes")
                start, filled = r.tokens, r.filled
            sync(dev)
            t_load = time.perf_counter() - t
            t_pre, lg = prefill(prompt, set_b, start, filled)
            computed = sum(y - x for x, y in gaps(start, len(prompt), filled))
            return t_load + t_pre, t_load, t_pre, computed, lg

        for n in lengths:
            prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
            prefix_blocks = (n - 1) // T  # the stored blocks: all but the prompt's last
            hole = prefix_blocks // 2
            prefill(prompt, set_a)  # the earlier request: computes and stores the prefix
            sv = pk.save(prompt[:prefix_blocks * T], set_a)
            assert client.delete([sv.keys[hole]]) == 1
            timed("recompute", prompt)  # warm-up at this length
            row = {"tokens": n, "stored_blocks": sv.stored, "hole_block": hole}
            ref = None
            for way in reversed(WAYS):  # recompute first: the reference logits
                runs = [timed(way, prompt) for _ in range(a.runs)]
                if ref is None:
                    ref = runs[-1][4].float()
                med = sorted(runs, key=lambda x: x[0])[len(runs) // 2]
                row[way] = {"ttft_s": med[0], "load_s": med[1], "prefill_s": med[2],
                            "computed_tokens": med[3],
                            "max_rel_logit_diff": max(float((x[4].float() - ref).abs().max() /
                                                            ref.abs().max()) for x in runs),
                            "same_argmax": all(int(x[4].argmax()) == int(ref.argmax())
                                               for x in runs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            client.delete()  # the next length starts empty
        client.close()
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"TTFT with one missing block in the middle of the cached prefix, {env['device']}, "
          f"model {preset} {env['dtype']}, {T}-token blocks, median of {a.runs}")
    print("| tokens | recompute | from the hole | holes alone | holes: tokens computed "
          "| speedup vs recompute | vs from the hole | max logit diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        h, f, c = r["holes"], r["from_hole"], r["recompute"]
        print(f"| {r['tokens']} | {c['ttft_s'] * 1e3:.1f} ms | {f['ttft_s'] * 1e3:.1f} ms "
              f"| {h['ttft_s'] * 1e3:.1f} ms | {h['computed_tokens']} "
              f"| {c['ttft_s'] / h['ttft_s']:.1f}x | {f['ttft_s'] / h['ttft_s']:.1f}x "
              f"| {max(h['max_rel_logit_diff'], f['max_rel_logit_diff']):.1e}"
              f"{'' if h['same_argmax'] and f['same_argmax'] else ' (argmax differs)'} |")
    dump(a.json, env, rows)


if __name__ == "__main__":
    main()
