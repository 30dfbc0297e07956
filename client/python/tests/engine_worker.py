"""An inference worker process of the engine tests: the reference engine
(kvclient.examples.llama) with its paged KV cache in kvcached.

    python engine_worker.py SPEC.json OUT.pt

SPEC: socket, tenant, salt (hex), preset, seed, page_tokens, pages_per_block,
prompt (token ids), new_tokens, load (bool: load the stored prefix first),
save (bool: store the prompt's blocks after prefill), tp (optional
[rank, size, group]: keep only this rank's KV heads in kvcached), verify
(optional bool, default true: PagedKV's check of each loaded block), holes
(optional bool: load every block found, past a hole too, and compute the
holes alone), shared (optional bool: save's COMMITs answered once the
blocks are in G4 too), lookups (optional int: PagedKV.load's LOOKUPs at most).
OUT (torch.save): {"loaded": tokens loaded, "hit": blocks LOOKUP found,
"failed": [[block, error name]], "logits": last-token logits,
"tokens": greedy continuation, "save": [present, stored, existed, failed],
"filled": token ranges loaded, "computed": tokens the prefill computed,
"shared": blocks save put in G4 too}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from kvclient import Client  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache, gaps  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        s = json.load(f)
    cfg = LlamaConfig.preset(s.get("preset", "tiny"))
    torch.manual_seed(0)
    model = Llama(cfg, seed=s.get("seed", 0))
    T, ppb = s.get("page_tokens", 16), s.get("pages_per_block", 1)
    prompt = s["prompt"]
    cache = PagedKVCache(cfg, num_pages=cache_pages(len(prompt) + s.get("new_tokens", 0), T) + 3,
                         page_tokens=T, dtype=torch.float32, device="cpu")
    cache.alloc(3)  # so this worker's pages are not 0.. like the saver's
    pages = cache.alloc(cache.pages_for(len(prompt) + s.get("new_tokens", 0)))
    kv_tensors, heads = cache.kv, None
    if s.get("tp"):
        rank, size, _ = s["tp"]
        heads = slice(rank * cfg.num_kv_heads // size, (rank + 1) * cfg.num_kv_heads // size)
        # this rank's shard: its own contiguous pages of its KV heads
        kv_tensors = [t[:, :, :, heads].contiguous() for t in cache.kv]
    layout = PagedLayout.vllm(kv_tensors)
    rank, size, group = s["tp"] if s.get("tp") else (0, 1, None)
    out = {"loaded": 0, "hit": 0, "failed": []}
    with Client(s["socket"], tenant=s.get("tenant", "t"), salt=bytes.fromhex(s.get("salt", "")),
                layout=layout.client_layout(ppb, rank, size), group=group) as c:
        pk = PagedKV(c, layout, pages_per_block=ppb, verify=s.get("verify", True))
        start, filled = 0, []
        if s.get("load"):
            r = pk.load(prompt, pages, holes=s.get("holes", False), lookups=s.get("lookups", 1))
            out.update(loaded=r.tokens, hit=r.hit,
                       failed=[[i, e.name] for i, e in r.failed], filled=r.filled)
            if heads is None:
                start, filled = r.tokens, r.filled
        out["computed"] = sum(b - a for a, b in gaps(start, len(prompt), filled))
        logits = model.prefill(cache, pages, prompt, start=start, filled=filled)
        out["logits"] = logits
        if s.get("save"):
            if heads is not None:
                for t, shard in zip(cache.kv, kv_tensors):
                    shard.copy_(t[:, :, :, heads])
            r = pk.save(prompt, pages, shared=s.get("shared", False))
            out["save"] = [r.present, r.stored, r.existed, len(r.failed)]
            out["shared"] = r.shared
        if s.get("new_tokens"):
            out["tokens"] = model.generate(cache, pages, prompt, s["new_tokens"], start=len(prompt))
    torch.save(out, out_path)
    return 0


def cache_pages(ntok: int, T: int) -> int:
    return -(-ntok // T)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
