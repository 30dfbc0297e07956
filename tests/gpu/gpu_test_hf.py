#!/usr/bin/env python3
"""gpu_test_hf.py - a Hugging Face transformers Llama (built from a config:
Llama-3.2-1B shape, bf16, random weights from seed 0; no weights are
downloaded) whose DynamicCache goes through a real kvcached.

A writer process prefills a prompt's prefix, packs its DynamicCache into
pages ([layers][2][tokens][kv_heads][head_dim], kvclient.paged.PagedLayout.
from_pages) and stores the blocks. This process builds the same model
(checked: the same weight checksum), loads the prefix from G2 and from G1
into pages of its own, turns them into a DynamicCache and computes the
rest of a prompt that shares that prefix. Checks, for each tier:
  - the loaded K/V are bit-identical to the DynamicCache this process
    computes itself for the prefix;
  - the logits are bit-identical to those of that cache + the rest;
  - against a full recompute of the prompt: logits within bf16 tolerance
    (relative norm of the difference < 5e-2, same first token); the greedy
    continuation is reported token by token.
Exit 0 passed, 1 failed, 77 skipped (no CUDA device, or no transformers).
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
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"gpu_test_hf: skipped, {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("gpu_test_hf: skipped, torch sees no CUDA device")
    sys.exit(77)

from kvclient import G1, G2, Client  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402

N = int(os.environ.get("KV_GPU_HF_TOKENS", "4096"))
T = 16
PREFIX = int(N * 0.9) // T * T
NEW = 8
DEV = torch.device("cuda")
L, H, D = 16, 8, 64


def build_model():
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=L, num_attention_heads=32, num_key_value_heads=H,
                      head_dim=D, max_position_embeddings=131072, rope_theta=500000.0,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(DEV):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    s = sum(float(p.float().sum()) for p in model.parameters())
    return model, s


def prompts(vocab=128256):
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, vocab, (PREFIX,), generator=g)
    a = torch.cat([prefix, torch.randint(0, vocab, (N - PREFIX,), generator=g)])
    b = torch.cat([prefix, torch.randint(0, vocab, (N - PREFIX,), generator=g)])
    return a, b


def layer_kv(cache, l):
    """(K, V) of layer l, [batch, kv_heads, tokens, head_dim], across versions."""
    if hasattr(cache, "layers"):
        return cache.layers[l].keys, cache.layers[l].values
    return cache.key_cache[l], cache.value_cache[l]


def pages_buffer(S):
    """[layers][2][S][kv_heads][head_dim] and its page layout."""
    buf = torch.empty(L, 2, S, H, D, dtype=torch.bfloat16, device=DEV)
    lay = PagedLayout.from_pages([buf[l, 0].view(S // T, T, H, D) for l in range(L)],
                                 [buf[l, 1].view(S // T, T, H, D) for l in range(L)])
    return buf, lay


@torch.no_grad()
def forward(model, ids, cache=None):
    out = model(input_ids=ids.view(1, -1).to(DEV), past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[0, -1].float(), out.past_key_values


@torch.no_grad()
def greedy(model, logits, cache, n):
    toks = []
    for _ in range(n):
        t = int(logits.argmax())
        toks.append(t)
        logits, cache = forward(model, torch.tensor([t]), cache)
    return toks


def writer(sock, sum_path):
    model, s = build_model()
    with open(sum_path, "w") as f:
        f.write(repr(s))
    a, _ = prompts()
    _, cache = forward(model, a[:PREFIX])
    buf, lay = pages_buffer(PREFIX)
    for l in range(L):
        k, v = layer_kv(cache, l)
        buf[l, 0].copy_(k[0].transpose(0, 1))  # [heads, tokens, dim] -> [tokens, heads, dim]
        buf[l, 1].copy_(v[0].transpose(0, 1))
    with Client(sock, tenant="hf", layout=lay.client_layout()) as c:
        r = PagedKV(c, lay).save(a[:PREFIX], list(range(PREFIX // T)))
    print(f"    writer: DynamicCache of {PREFIX} tokens stored as {r.stored} blocks, "
          f"{len(r.failed)} failed", flush=True)
    return 0 if r.stored == PREFIX // T and not r.failed else 1


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--writer":
        return writer(sys.argv[2], sys.argv[3])
    fails = []

    def check(ok, what):
        print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            fails.append(what)

    print(f"gpu_test_hf: {torch.cuda.get_device_name(DEV)}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, prompt {N} tokens, prefix {PREFIX}")
    tmp = tempfile.mkdtemp(prefix="kvgpu-hf-")
    kv = PREFIX * L * 2 * H * D * 2
    with Daemon(tmp, g2=str(max(4 * kv, 256 << 20)), page=str(64 << 20), g1=str(2 * kv),
                log_level="warn") as d:
        sums = os.path.join(tmp, "sum")
        t = time.perf_counter()
        w = subprocess.run([sys.executable, __file__, "--writer", d.socket, sums], timeout=600)
        check(w.returncode == 0, f"writer process ({time.perf_counter() - t:.1f} s)")
        model, s = build_model()
        check(open(sums).read() == repr(s), "both processes built the same weights")
        _, b = prompts()
        # this process's own answer: the prefix's cache computed here, then the rest
        _, own = forward(model, b[:PREFIX])
        own_kv = [tuple(x.clone() for x in layer_kv(own, l)) for l in range(L)]
        lg_own, own = forward(model, b[PREFIX:], own)
        full_logits, full_cache = forward(model, b)
        full_tokens = greedy(model, full_logits, full_cache, NEW)
        rel0 = float((lg_own - full_logits).norm() / full_logits.norm())
        print(f"    prefix cache computed here + rest vs full recompute: rel. difference {rel0:.2e}")
        buf, lay = pages_buffer(PREFIX)
        with Client(d.socket, tenant="hf", layout=lay.client_layout()) as c:
            check(c.g1.available, f"G1 pool mapped in this process ({c.g1.reason or c.g1.uuid})")
            pk = PagedKV(c, lay)
            for name, tier in (("G2", G2), ("G1", G1)):
                buf.fill_(float("nan"))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                r = pk.load(b, list(range(PREFIX // T)), tier=tier, max_tokens=PREFIX)
                torch.cuda.synchronize()
                check(r.tokens == PREFIX and not r.failed,
                      f"{name}: loaded {r.tokens} tokens in {(time.perf_counter() - t0) * 1e3:.1f} ms"
                      f" (tiers {sorted(set(r.tiers))})")
                cache = DynamicCache()
                same = True
                for l in range(L):
                    k = buf[l, 0].transpose(0, 1).unsqueeze(0)
                    v = buf[l, 1].transpose(0, 1).unsqueeze(0)
                    same &= torch.equal(k, own_kv[l][0]) and torch.equal(v, own_kv[l][1])
                    cache.update(k, v, l)
                check(same, f"{name}: loaded K/V bit-identical to the DynamicCache computed here")
                lg, cache = forward(model, b[PREFIX:], cache)
                check(torch.equal(lg, lg_own), f"{name}: logits bit-identical to own cache + rest "
                      f"(max abs difference {float((lg - lg_own).abs().max()):.2e})")
                rel = float((lg - full_logits).norm() / full_logits.norm())
                check(rel < 5e-2 and lg.argmax() == full_logits.argmax(),
                      f"{name}: vs full recompute: rel. difference {rel:.2e}, same first token")
                toks = greedy(model, lg, cache, NEW)
                agree = next((i for i, (x, y) in enumerate(zip(toks, full_tokens)) if x != y), NEW)
                print(f"    {name}: greedy {NEW} tokens vs full recompute: "
                      f"{'identical' if agree == NEW else f'first difference at token {agree}'}"
                      f" {toks} / {full_tokens}", flush=True)
    print(f"gpu_test_hf: {'passed' if not fails else f'{len(fails)} failed'}")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
