"""A small Llama-style decoder in plain torch, with a paged KV cache.

This is the reference engine of kvclient's tests and an example to read: it
keeps its K/V the way vLLM does (per layer one tensor of pages, see
PagedKVCache), so that a prefix computed once can be stored in kvcached,
loaded back into other pages, and the rest of the prompt computed from there.

What it is: the Llama architecture (RMSNorm, rotary embeddings with the
rotate-half convention, grouped-query attention, SwiGLU MLP, final RMSNorm, LM
head tied to the embedding as in Llama 3.2 1B/3B), in the shapes of real
models (presets "1b", "3b"), with random weights from a fixed seed and greedy
decoding. Prefill of a 32k-token prompt of the "1b" preset in bf16 fits an
80 GB GPU.

What it is not: a real model (no weights are loaded, so the text it produces
means nothing; no Llama 3 RoPE frequency scaling), nor a serving engine (one
sequence at a time, no batching, no sampling, no CUDA graphs or fused
kernels).

    cfg = LlamaConfig.preset("tiny")
    model = Llama(cfg, seed=0)
    cache = PagedKVCache(cfg, num_pages=64, page_tokens=16, dtype=torch.float32, device="cpu")
    pages = cache.alloc(cache.pages_for(len(prompt) + 8))
    new_tokens = model.generate(cache, pages, prompt, max_new_tokens=8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

# torch >= 2.0 has a fused attention; 1.13 does not (then: chunked matmul/softmax).
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
try:  # torch >= 2.2: a causal mask aligned to the end, without materialising it.
    from torch.nn.attention.bias import causal_lower_right as _causal_lower_right
except ImportError:
    _causal_lower_right = None

TokenIds = Union[Sequence[int], torch.Tensor]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # K/V heads; num_heads / num_kv_heads query heads share one
    head_dim: int
    intermediate_size: int  # of the SwiGLU MLP
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5

    @classmethod
    def preset(cls, name: str) -> "LlamaConfig":
        """"tiny" (unit tests), "small" (CPU benchmarks), "1b" (the shape of
        Llama-3.2-1B), "3b" (the shape of Llama-3.2-3B)."""
        presets = {
            "tiny": cls(vocab_size=512, hidden_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=32, intermediate_size=256),
            "small": cls(vocab_size=4096, hidden_size=512, num_layers=8, num_heads=8,
                         num_kv_heads=4, head_dim=64, intermediate_size=1536),
            "1b": cls(vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                      num_kv_heads=8, head_dim=64, intermediate_size=8192),
            "3b": cls(vocab_size=128256, hidden_size=3072, num_layers=28, num_heads=24,
                      num_kv_heads=8, head_dim=128, intermediate_size=8192),
        }
        if name not in presets:
            raise ValueError(f"unknown preset {name!r} (have: {', '.join(presets)})")
        return presets[name]


class PagedKVCache:
    """vLLM's layout: per layer one tensor [2, num_pages, page_tokens, num_kv_heads, head_dim].

    kv[layer][0] holds K, kv[layer][1] holds V (K after the rotary embedding).
    The token at position p of a sequence with pages page_ids lives in page
    page_ids[p // page_tokens], slot p % page_tokens. In cuda/kernels.h terms:
    page_stride = one half (page_tokens * kv_heads * head_dim elements),
    kv_stride = num_pages halves.
    """

    def __init__(self, cfg: LlamaConfig, num_pages: int, page_tokens: int,
                 dtype: torch.dtype = torch.float32, device: Union[str, torch.device] = "cpu"):
        if num_pages <= 0 or page_tokens <= 0:
            raise ValueError("num_pages and page_tokens must be positive")
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        shape = (2, num_pages, page_tokens, cfg.num_kv_heads, cfg.head_dim)
        self.kv: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device)
                                       for _ in range(cfg.num_layers)]
        self._free: List[int] = list(range(num_pages - 1, -1, -1))  # pop() gives low ids first
        self._is_free = [True] * num_pages

    def alloc(self, n: int) -> List[int]:
        """n free page ids (their contents are whatever was there before)."""
        if n < 0 or n > len(self._free):
            raise RuntimeError(f"cannot allocate {n} pages: {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: List[int]) -> None:
        for p in pages:
            if not 0 <= p < self.num_pages or self._is_free[p]:
                raise ValueError(f"page {p} is not allocated")
            self._is_free[p] = True
            self._free.append(p)

    def pages_for(self, ntokens: int) -> int:
        return -(-ntokens // self.page_tokens)


@dataclass
class _Layer:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [hidden, (heads + 2 * kv_heads) * head_dim]: Q, K, V projections side by side
    wo: torch.Tensor  # [heads * head_dim, hidden]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [hidden, 2 * intermediate]: gate, then up
    w_down: torch.Tensor  # [intermediate, hidden]


def gaps(start: int, end: int, filled: Sequence[Tuple[int, int]] = ()) -> List[Tuple[int, int]]:
    """The ranges [a, b) of [start, end) outside every range of filled (in
    order), the last token always in the last one (its logits are wanted)."""
    out, at = [], start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in filled):
        if a >= b:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at >= end:  # filled to the end: the last token again, for its logits
        at = end - 1
        if out and out[-1][1] == end - 1:
            at = out.pop()[0]
    out.append((at, end))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention: x [n, heads, head_dim], cos/sin [n, 1, head_dim] (fp32)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     use_sdpa: bool = HAVE_SDPA, chunk: int = 256) -> torch.Tensor:
    """Attention of the LAST n positions of a sequence over all of it.

    q [n, heads, head_dim]: queries of positions end-n .. end-1; k, v [end,
    kv_heads, head_dim]: keys and values of positions 0 .. end-1. Query i sees
    keys 0 .. end-n+i (the causal mask is aligned to the end). Returns [n,
    heads, head_dim], computed in q's dtype.
    """
    n, heads, head_dim = q.shape
    end, kv_heads = k.shape[0], k.shape[1]
    group = heads // kv_heads  # query head h reads kv head h // group
    if use_sdpa:
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        kh = k.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        vh = v.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        if n == end:
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        elif n == 1:  # one query at the end sees everything
            out = F.scaled_dot_product_attention(qh, kh, vh)
        elif _causal_lower_right is not None:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=_causal_lower_right(n, end))
        else:
            mask = torch.ones(n, end, dtype=torch.bool, device=q.device).tril(diagonal=end - n)
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return out[0].transpose(0, 1)

    # Plain matmul/softmax, `chunk` queries at a time so that the scores
    # ([heads, chunk, end]) stay bounded on long prompts. Query heads are
    # grouped by their kv head: [kv_heads, group, ...] against [kv_heads, 1, ...].
    start = end - n
    qg = q.reshape(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [kvh, g, n, d]
    kt = k.permute(1, 2, 0).unsqueeze(1)  # [kvh, 1, d, end]
    vg = v.transpose(0, 1).unsqueeze(1)  # [kvh, 1, end, d]
    out = torch.empty_like(qg)
    scale = 1.0 / math.sqrt(head_dim)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        visible = start + b  # keys the last query of this chunk sees
        scores = torch.matmul(qg[:, :, a:b], kt[..., :visible]) * scale  # [kvh, g, b-a, visible]
        qpos = torch.arange(start + a, start + b, device=q.device)
        kpos = torch.arange(visible, device=q.device)
        scores.masked_fill_(kpos[None, :] > qpos[:, None], float("-inf"))
        out[:, :, a:b] = torch.matmul(torch.softmax(scores, dim=-1), vg[:, :, :visible])
    return out.permute(2, 0, 1, 3).reshape(n, heads, head_dim)


class Llama:
    """The model. Weights are drawn on the CPU from a torch.Generator seeded with
    `seed` and then moved to `device`, so a CPU and a CUDA model of one seed hold
    the same weights (up to the rounding to `dtype`). Building "1b" draws 1.2e9
    numbers: 10-20 s on one CPU core.

    Attributes a caller may change: use_sdpa (torch's fused attention, where
    torch >= 2 has it; otherwise the chunked matmul/softmax path), attn_chunk
    (queries per chunk on that path).
    """

    def __init__(self, cfg: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: Union[str, torch.device] = "cpu"):
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)
        self.use_sdpa = HAVE_SDPA
        self.attn_chunk = 256
        gen = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int, fan_in: int) -> torch.Tensor:
            # std 1/sqrt(fan_in): each projection keeps unit-scale activations.
            w = torch.randn(rows, cols, generator=gen).mul_(1.0 / math.sqrt(fan_in))
            return w.to(device=self.device, dtype=dtype)

        def ones(size: int) -> torch.Tensor:
            return torch.ones(size, device=self.device, dtype=dtype)

        c = cfg
        hidden, qkv = c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        # [vocab, hidden], rows of norm ~1: as the tied LM head it gives logits of std ~1.
        self.embed = weight(c.vocab_size, hidden, fan_in=hidden)
        self.layers: List[_Layer] = []
        for _ in range(c.num_layers):
            self.layers.append(_Layer(
                attn_norm=ones(hidden),
                wqkv=weight(hidden, qkv, fan_in=hidden),
                wo=weight(c.num_heads * c.head_dim, hidden, fan_in=c.num_heads * c.head_dim),
                mlp_norm=ones(hidden),
                w_gate_up=weight(hidden, 2 * c.intermediate_size, fan_in=hidden),
                w_down=weight(c.intermediate_size, hidden, fan_in=c.intermediate_size),
            ))
        self.norm = ones(c.hidden_size)
        half = torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim
        self.inv_freq = (1.0 / (c.rope_theta ** half)).to(self.device)  # [head_dim / 2], fp32

    @torch.no_grad()
    def prefill(self, cache: PagedKVCache, page_ids: List[int], token_ids: TokenIds,
                start: int = 0, logits: str = "last",
                filled: Sequence[Tuple[int, int]] = ()) -> torch.Tensor:
        """Compute tokens [start, len(token_ids)) of the sequence token_ids.

        K/V of tokens [0, start) must already be in the pages (computed
        earlier, or loaded from kvcached); those of the computed tokens are
        written there. Returns fp32 logits: of the last token ([vocab]), or
        with logits="all" of every computed position ([len - start, vocab]).

        filled: token ranges [a, b) past start whose K/V are in the pages
        too (blocks loaded after a hole: PagedKV.load(holes=True)). Only
        the tokens in neither are computed, each gap attending to all
        before it, loaded or computed: the K/V of a position depend on the
        tokens up to it alone, so the result is a full prefill's. The last
        token is always computed, for its logits; logits="all" has the
        rows of the computed positions, in order.
        """
        if logits not in ("last", "all"):
            raise ValueError(f"logits must be 'last' or 'all', not {logits!r}")
        if not 0 <= start < len(token_ids):
            raise ValueError(f"nothing to compute: start {start}, {len(token_ids)} tokens")
        out = [self._forward(cache, page_ids, token_ids, a, b, logits if b == len(token_ids)
                             else "all" if logits == "all" else None)
               for a, b in gaps(start, len(token_ids), filled)]
        return out[-1] if logits == "last" else torch.cat(out)

    def _forward(self, cache: PagedKVCache, page_ids: List[int], token_ids: TokenIds,
                 start: int, end: int, logits) -> torch.Tensor:
        """Tokens [start, end) of token_ids, the K/V of [0, start) in the
        pages: writes theirs; logits "last", "all" or None (none)."""
        c, T = self.cfg, cache.page_tokens
        ids = torch.as_tensor(token_ids[start:end], dtype=torch.long)
        n = ids.numel()
        if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
            raise ValueError("token id out of range")
        if len(page_ids) < cache.pages_for(end):
            raise ValueError(f"{len(page_ids)} pages of {T} tokens cannot hold {end} tokens")
        ids = ids.to(self.device)
        pages = torch.tensor(page_ids[:cache.pages_for(end)], dtype=torch.long, device=self.device)
        pos = torch.arange(start, end, device=self.device)
        slots = pages[pos // T] * T + pos % T  # where each new token's K/V goes in [num_pages * T]
        angles = pos.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat((angles, angles), dim=-1).cos()[:, None, :]  # [n, 1, head_dim]
        sin = torch.cat((angles, angles), dim=-1).sin()[:, None, :]
        # Attention in fp32 on the CPU (bf16 matmuls are slow and inexact there), in the model dtype on CUDA.
        attn_dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        H, KVH, D = c.num_heads, c.num_kv_heads, c.head_dim

        x = self.embed[ids]  # [n, hidden]: the residual stream
        for layer, kv in zip(self.layers, cache.kv):
            h = rms_norm(x, layer.attn_norm, c.rms_eps)
            q, k, v = torch.matmul(h, layer.wqkv).split([H * D, KVH * D, KVH * D], dim=-1)
            q = rope(q.reshape(n, H, D), cos, sin)
            k = rope(k.reshape(n, KVH, D), cos, sin)
            kv[0].view(-1, KVH, D)[slots] = k.to(kv.dtype)
            kv[1].view(-1, KVH, D)[slots] = v.reshape(n, KVH, D).to(kv.dtype)
            # K/V of positions [0, end) from the sequence's pages: [end, kv_heads, head_dim].
            k_all = kv[0][pages].reshape(-1, KVH, D)[:end]
            v_all = kv[1][pages].reshape(-1, KVH, D)[:end]
            a = causal_attention(q.to(attn_dtype), k_all.to(attn_dtype), v_all.to(attn_dtype),
                                 use_sdpa=self.use_sdpa, chunk=self.attn_chunk)
            x = x + torch.matmul(a.to(self.dtype).reshape(n, H * D), layer.wo)
            h = rms_norm(x, layer.mlp_norm, c.rms_eps)
            gate, up = torch.matmul(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + torch.matmul(F.silu(gate) * up, layer.w_down)

        if logits is None:
            return None
        if logits == "last":
            x = x[-1:]  # never [n, vocab] when one row is asked for
        out = torch.matmul(rms_norm(x, self.norm, c.rms_eps), self.embed.t()).float()
        return out[0] if logits == "last" else out

    @torch.no_grad()
    def generate(self, cache: PagedKVCache, page_ids: List[int], token_ids: TokenIds,
                 max_new_tokens: int, start: int = 0) -> List[int]:
        """Prefill token_ids from `start`, then greedy decoding, one token per step.

        Returns the new tokens. Their K/V go into the pages, all but the last
        one's (it was never fed back): page_ids must cover len(token_ids) +
        max_new_tokens - 1 tokens. start == len(token_ids) (every K/V already
        cached) recomputes the last prompt token for its logits.
        """
        seq = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
        start = min(start, len(seq) - 1)
        logits = self.prefill(cache, page_ids, seq, start)
        new: List[int] = []
        for _ in range(max_new_tokens):
            tok = int(torch.argmax(logits))
            new.append(tok)
            if len(new) == max_new_tokens:
                break
            seq.append(tok)
            logits = self.prefill(cache, page_ids, seq, start=len(seq) - 1)
        return new
