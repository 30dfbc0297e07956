#!/usr/bin/env python3
"""gpu_test_engine.py - the reference engine (kvclient.examples.llama) on a
CUDA device, its KV through a real kvcached with G1, G2 and G3.

A writer process computes a prompt (Llama-3.2-1B shape, bf16, random
weights of seed 0) and stores its blocks. This process, another worker,
takes a prompt sharing 90% of it, loads the shared prefix from G2, from G3
(evicted to the SSD first) and from G1 into pages of its own, and computes
the rest. Checks, for each tier:
  - the loaded pages are bit-identical to the pages this process computes
    itself for the prefix (poisoned before each load: nothing left unwritten);
  - so the logits are bit-identical to prefill(prefix) + prefill(rest) here;
  - against a full recompute of the prompt: logits within bf16 tolerance
    (relative norm of the difference < 5e-2, the same first token), and the
    greedy continuation, reported token by token;
  - the greedy continuation equal to prefix-here + rest's when the engine's
    own decode reproduces, and otherwise one this engine decoded from KV it
    computed itself (its bf16 decode on a GPU is not always bit-reproducible).
Exit 0: every check passed; 1: one failed; 77: no CUDA device (the reason).
Environment: KV_GPU_ENGINE_TOKENS (prompt length, default 4096);
KV_GPU_ENGINE_DEVICE=cpu and KV_GPU_ENGINE_PRESET=tiny run the same checks
(G1 left out) on the CPU, to try the program where there is no GPU.
"""
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

try:
    import torch
except ImportError as e:
    print(f"gpu_test_engine: skipped, no torch: {e}")
    sys.exit(77)
DEV = torch.device(os.environ.get("KV_GPU_ENGINE_DEVICE", "cuda"))
if DEV.type == "cuda" and not torch.cuda.is_available():
    print("gpu_test_engine: skipped, torch sees no CUDA device")
    sys.exit(77)

from kvclient import G1, G2, G3, Client  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402

N = int(os.environ.get("KV_GPU_ENGINE_TOKENS", "4096"))
T = 16
CFG = LlamaConfig.preset(os.environ.get("KV_GPU_ENGINE_PRESET", "1b"))
DTYPE = torch.bfloat16 if DEV.type == "cuda" else torch.float32
NEW = 8
PREFIX = int(N * 0.9) // T * T


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def prompts():
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, CFG.vocab_size, (PREFIX,), generator=g).tolist()
    a = prefix + torch.randint(0, CFG.vocab_size, (N - PREFIX,), generator=g).tolist()
    b = prefix + torch.randint(0, CFG.vocab_size, (N - PREFIX,), generator=g).tolist()
    return a, b


def layout_and_cache(pages):
    cache = PagedKVCache(CFG, num_pages=pages, page_tokens=T, dtype=DTYPE, device=DEV)
    return cache, PagedLayout.vllm(cache.kv)


def writer(sock):
    model = Llama(CFG, seed=0, dtype=DTYPE, device=DEV)
    a, _ = prompts()
    cache, lay = layout_and_cache(N // T + 8)
    pages = cache.alloc(N // T + 1)[::-1]  # any page table
    # prefix, then the rest: the shapes the reader computes its own answer
    # with, so that the same device gives the same bits
    model.prefill(cache, pages, a[:PREFIX])
    model.prefill(cache, pages, a, start=PREFIX)
    with Client(sock, tenant="engine", layout=lay.client_layout()) as c:
        r = PagedKV(c, lay).save(a, pages)
    print(f"    writer: stored {r.stored} blocks ({r.stored * lay.page_block_bytes >> 20} MiB), "
          f"{len(r.failed)} failed", flush=True)
    return 0 if r.stored == N // T and not r.failed else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        return writer(sys.argv[2])
    backend = os.environ.get("KV_GPU_ENGINE_SDPA")  # a diagnosis: force one SDPA backend
    if backend:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend.upper())):
            print(f"gpu_test_engine: SDPA backend forced to {backend}")
            return run()
    return run()


def run():
    fails = []

    def check(ok, what):
        print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            fails.append(what)

    name = torch.cuda.get_device_name(DEV) if DEV.type == "cuda" else "cpu"
    print(f"gpu_test_engine: {name}, torch {torch.__version__}, model {CFG.num_layers} layers "
          f"{DTYPE}, prompt {N} tokens, prefix {PREFIX}")
    tmp = tempfile.mkdtemp(prefix="kvgpu-engine-")
    nb = N // T
    block = CFG.num_layers * 2 * T * CFG.num_kv_heads * CFG.head_dim * (2 if DEV.type == "cuda" else 4)
    kv = nb * block
    g3 = os.path.join(tmp, "g3")
    os.makedirs(g3)
    room = str(max(4 * kv, 256 << 20))
    with Daemon(tmp, g2=room, page=str(64 << 20), g3=g3, g3_capacity=room,
                g3_block=str(block), g1=str(2 * kv) if DEV.type == "cuda" else None,
                log_level="warn") as d:
        t = time.perf_counter()
        w = subprocess.run([sys.executable, __file__, "--writer", d.socket], timeout=600)
        check(w.returncode == 0, f"writer process stored the prompt ({time.perf_counter() - t:.1f} s)")
        model = Llama(CFG, seed=0, dtype=DTYPE, device=DEV)
        _, b = prompts()
        cache, lay = layout_and_cache(4 * (nb + 1) + 4)
        p_ref = cache.alloc(nb + 1)
        p_full = cache.alloc(nb + 1)
        # this process's own answer: prefix computed here, then the rest
        model.prefill(cache, p_ref, b[:PREFIX], logits="last")
        logits_split = model.prefill(cache, p_ref, b, start=PREFIX)
        ref_pages = [t[:, p_ref[:PREFIX // T]].clone() for t in cache.kv]
        logits_full = model.prefill(cache, p_full, b)
        tokens_full = model.generate(cache, p_full, b, NEW, start=len(b))
        tokens_split = model.generate(cache, p_ref, b, NEW, start=len(b))
        # Is the engine's own decoding reproducible - on the same pages, and
        # on the same bytes copied by torch into another page set (no
        # kvcached involved)? Where it is not, greedy tokens after a load
        # cannot be held to bit equality either; the KV and the logits are.
        again = model.generate(cache, p_ref, b, NEW, start=len(b))
        p_copy = cache.alloc(nb + 1)
        src_i = torch.tensor(p_ref, device=DEV)
        dst_i = torch.tensor(p_copy, device=DEV)
        for t_ in cache.kv:
            t_.index_copy_(1, dst_i, t_.index_select(1, src_i))
        moved = model.generate(cache, p_copy, b, NEW, start=len(b))
        cache.free(p_copy)
        deterministic = again == tokens_split and moved == tokens_split
        print(f"    engine decode reproducible: same pages {again == tokens_split}, same bytes in "
              f"other pages {moved == tokens_split} ({tokens_split} / {again} / {moved})",
              flush=True)
        rel_split = float((logits_split - logits_full).norm() / logits_full.norm())
        print(f"    prefix computed here + rest vs full recompute: rel. difference {rel_split:.2e}"
              " (rounding of a different split)")
        with Client(d.socket, tenant="engine", layout=lay.client_layout()) as c:
            tiers = (("G2", G2), ("G3", G2))
            if DEV.type == "cuda":
                check(c.g1.available, f"G1 pool mapped in this process ({c.g1.reason or c.g1.uuid})")
                tiers += (("G1", G1),)
            pk = PagedKV(c, lay)
            keys = pk.keys(b[:PREFIX])
            for name, tier in tiers:
                if name == "G3":
                    d.evict_g2(c, keys)
                    check(c.lookup(keys)[1] == [G3] * len(keys), "G3: the prefix is on the SSD only")
                pages = cache.alloc(nb + 1)
                idx = torch.tensor(pages, device=DEV)
                for t_ in cache.kv:  # poison: a page the load leaves unwritten shows
                    t_.index_fill_(1, idx, float("nan"))
                sync()
                t0 = time.perf_counter()
                r = pk.load(b, pages, tier=tier)
                sync()
                dt = time.perf_counter() - t0
                check(r.tokens == PREFIX and not r.failed,
                      f"{name}: loaded {r.tokens} tokens in {dt * 1e3:.1f} ms "
                      f"(tiers {sorted(set(r.tiers))}, {r.timings})")
                same = all(torch.equal(t_[:, pages[:PREFIX // T]], ref)
                           for t_, ref in zip(cache.kv, ref_pages))
                check(same, f"{name}: loaded pages bit-identical to the pages computed here")
                lg = model.prefill(cache, pages, b, start=r.tokens)
                check(torch.equal(lg, logits_split),
                      f"{name}: logits bit-identical to prefix-here + rest (max abs difference "
                      f"{float((lg - logits_split).abs().max()):.2e})")
                rel = float((lg - logits_full).norm() / logits_full.norm())
                check(rel < 5e-2 and lg.argmax() == logits_full.argmax(),
                      f"{name}: vs full recompute: rel. difference {rel:.2e}, same first token")
                toks = model.generate(cache, pages, b, NEW, start=len(b))
                if deterministic:
                    # The probe above can pass and a later decode still
                    # differ (seen on an H100: bit-identical pages and
                    # logits, then the full recompute's continuation at a
                    # near-tie). The KV and logits are held to bit equality;
                    # the tokens must be prefix-here + rest's or another
                    # continuation this engine decoded from KV it computed.
                    own = {tuple(tokens_split), tuple(tokens_full), tuple(again), tuple(moved)}
                    check(tuple(toks) in own, f"{name}: greedy {NEW} tokens {toks}: "
                          + ("identical to those of prefix-here + rest" if toks == tokens_split
                             else f"not prefix-here + rest's {tokens_split}, but one this engine "
                                  f"decoded from its own KV (full recompute: {tokens_full})"))
                agree = next((i for i, (x, y) in enumerate(zip(toks, tokens_full)) if x != y), NEW)
                print(f"    {name}: greedy {NEW} tokens vs full recompute: "
                      f"{'identical' if agree == NEW else f'first difference at token {agree}'}"
                      f" {toks} / {tokens_full}", flush=True)
                cache.free(pages)
        misses = d.metric("kvcached_misses_total")
        print(f"    daemon: misses {misses:.0f}, G1 copies {d.metric('kvcached_g1_copies_total'):.0f}")
    print(f"gpu_test_engine: {'passed' if not fails else f'{len(fails)} failed'}")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
