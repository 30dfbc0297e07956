"""The reference engine (kvclient.examples.llama): paged attention against a
dense reference written here, prefill in pieces, a prefix moved to other pages
(as a load from kvcached does), greedy decoding, seeds, both attention paths.
Tiny preset, fp32, CPU."""

import math
from typing import List

import pytest
import torch
import torch.nn.functional as F

from kvclient.examples.llama import (HAVE_SDPA, Llama, LlamaConfig, PagedKVCache,
                                     causal_attention, gaps)

CFG = LlamaConfig.preset("tiny")
PAGE_TOKENS = 8
NUM_PAGES = 40  # 320 tokens


@pytest.fixture(scope="module")
def model() -> Llama:
    return Llama(CFG, seed=0)


def new_cache() -> PagedKVCache:
    return PagedKVCache(CFG, NUM_PAGES, PAGE_TOKENS, dtype=torch.float32, device="cpu")


def tokens(n: int, seed: int = 1) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist()


def shuffled_pages(n: int, seed: int) -> List[int]:
    """n distinct page ids in a random order (never 0..n-1 in order)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(NUM_PAGES, generator=g)[:n].tolist()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def seq_kv(cache: PagedKVCache, pages: List[int], n: int) -> torch.Tensor:
    """K/V of the first n tokens of a sequence: [layers, 2, n, kv_heads, head_dim]."""
    return torch.stack([kv[:, pages].reshape(2, -1, CFG.num_kv_heads, CFG.head_dim)[:, :n]
                        for kv in cache.kv])


def dense_logits(m: Llama, toks: List[int]) -> torch.Tensor:
    """Straightforward non-paged forward over the whole sequence: [len, vocab]."""
    c = m.cfg
    n, H, KVH, D = len(toks), c.num_heads, c.num_kv_heads, c.head_dim

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_eps) * w

    inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [n, D/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

    def rot(t: torch.Tensor) -> torch.Tensor:  # dims i and i + D/2 rotated by ang[:, i]
        t1, t2 = t[..., :D // 2], t[..., D // 2:]
        return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1)

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    x = m.embed[torch.tensor(toks)]
    for L in m.layers:
        q, k, v = (norm(x, L.attn_norm) @ L.wqkv).split([H * D, KVH * D, KVH * D], dim=-1)
        q, k = rot(q.reshape(n, H, D)), rot(k.reshape(n, KVH, D))
        k = k.repeat_interleave(H // KVH, dim=1)
        v = v.reshape(n, KVH, D).repeat_interleave(H // KVH, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(n, H * D) @ L.wo
        g, u = (norm(x, L.mlp_norm) @ L.w_gate_up).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ L.w_down
    return norm(x, m.norm) @ m.embed.t()


@pytest.mark.parametrize("n,seed", [(75, 1), (64, 2), (5, 3)])
def test_paged_matches_dense(model: Llama, n: int, seed: int) -> None:
    toks = tokens(n, seed)
    cache = new_cache()
    pages = shuffled_pages(cache.pages_for(n), seed)
    ref = dense_logits(model, toks)
    out = model.prefill(cache, pages, toks, logits="all")
    assert out.shape == (n, CFG.vocab_size) and out.dtype == torch.float32
    assert rel(out, ref) < 1e-5
    last = model.prefill(new_cache(), pages, toks)
    assert last.shape == (CFG.vocab_size,)
    assert rel(last, ref[-1]) < 1e-5


@pytest.mark.parametrize("split", [1, 37, 48, 99])
def test_prefill_in_two_pieces(model: Llama, split: int) -> None:
    toks = tokens(100)
    full_cache, part_cache = new_cache(), new_cache()
    full_pages, part_pages = shuffled_pages(13, 4), shuffled_pages(13, 5)
    full = model.prefill(full_cache, full_pages, toks)
    model.prefill(part_cache, part_pages, toks[:split])
    rest = model.prefill(part_cache, part_pages, toks, start=split, logits="all")
    assert rest.shape == (100 - split, CFG.vocab_size)
    assert rel(rest[-1], full) < 1e-5
    a, b = seq_kv(full_cache, full_pages, 100), seq_kv(part_cache, part_pages, 100)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_prefix_copied_to_other_pages(model: Llama) -> None:
    """Prefix computed in one cache, its pages copied into another page set of
    another cache (what a load from kvcached does), the rest computed there."""
    toks = tokens(90, seed=7)
    prefix_pages = 6  # 48 tokens, whole pages as kvcached blocks hold them
    src, dst = new_cache(), new_cache()
    src_pages = src.alloc(prefix_pages)
    model.prefill(src, src_pages, toks[:prefix_pages * PAGE_TOKENS])
    dst.alloc(3)  # so that dst's pages differ from src's
    dst_pages = dst.alloc(dst.pages_for(len(toks)))[::-1]
    assert set(dst_pages[:prefix_pages]).isdisjoint(src_pages)
    for s, d in zip(src_pages, dst_pages):
        for kv_src, kv_dst in zip(src.kv, dst.kv):
            kv_dst[:, d] = kv_src[:, s]
    out = model.prefill(dst, dst_pages, toks, start=prefix_pages * PAGE_TOKENS)
    assert rel(out, dense_logits(model, toks)[-1]) < 1e-5


@pytest.mark.parametrize("filled", [
    [(8, 48)],                    # a hole at the start (tokens 0..7)
    [(0, 16), (24, 80)],          # one in the middle
    [(0, 64)],                    # one at the end (tokens 64..89: the tail)
    [(0, 8), (16, 24), (40, 88)], # several, the last token loaded
    [(0, 90)],                    # none: the last token is computed again
])
def test_holes_computed_alone(model: Llama, filled) -> None:
    """K/V copied into a second cache for the filled ranges only (what
    PagedKV.load(holes=True) leaves), NaN everywhere else: prefill with
    filled computes the rest alone, each gap before any later one reads it
    (a NaN read would spread to the logits), and its logits, K/V and
    greedy tokens equal a full prefill's."""
    toks = tokens(90, seed=11)
    src, dst = new_cache(), new_cache()
    src_pages, dst_pages = shuffled_pages(12, 6), shuffled_pages(12, 7)
    full = model.prefill(src, src_pages, toks)
    for kv in dst.kv:
        kv.fill_(float("nan"))
    kv_src = seq_kv(src, src_pages, 90)
    for a, b in filled:
        for t in range(a, b):
            for kv_s, kv_d in zip(src.kv, dst.kv):
                kv_d[:, dst_pages[t // PAGE_TOKENS], t % PAGE_TOKENS] = \
                    kv_s[:, src_pages[t // PAGE_TOKENS], t % PAGE_TOKENS]
    out = model.prefill(dst, dst_pages, toks, filled=filled)
    assert rel(out, full) < 1e-5
    assert torch.allclose(seq_kv(dst, dst_pages, 90), kv_src, rtol=1e-5, atol=1e-5)
    ref_tokens = model.generate(src, src_pages, toks, 3, start=90)
    assert model.generate(dst, dst_pages, toks, 3, start=90) == ref_tokens


def test_holes_logits_all_rows_of_computed_tokens(model: Llama) -> None:
    toks = tokens(40, seed=12)
    src, dst = new_cache(), new_cache()
    pages = shuffled_pages(5, 8)
    ref = model.prefill(src, pages, toks, logits="all")
    for s, d in zip(src.kv, dst.kv):
        d.copy_(s)
    out = model.prefill(dst, pages, toks, logits="all", filled=[(8, 16), (24, 39)])
    rows = list(range(0, 8)) + list(range(16, 24)) + [39]
    assert out.shape == (len(rows), CFG.vocab_size)
    assert rel(out, ref[rows]) < 1e-5


def test_gaps() -> None:
    assert gaps(0, 10) == [(0, 10)]
    assert gaps(3, 10, [(0, 5)]) == [(5, 10)]
    assert gaps(0, 10, [(2, 4), (6, 10)]) == [(0, 2), (4, 6), (9, 10)]
    assert gaps(0, 10, [(2, 4), (6, 9)]) == [(0, 2), (4, 6), (9, 10)]
    assert gaps(0, 10, [(0, 10)]) == [(9, 10)]
    assert gaps(0, 10, [(4, 6), (0, 5)]) == [(6, 10)]


def test_greedy_generate(model: Llama) -> None:
    prompt, steps = tokens(30, seed=9), 6
    pages = shuffled_pages(5, 9)
    new = model.generate(new_cache(), pages, prompt, max_new_tokens=steps)
    assert len(new) == steps
    assert model.generate(new_cache(), pages, torch.tensor(prompt), steps) == new
    seq = list(prompt)
    for _ in range(steps):  # full recompute at every step
        seq.append(int(dense_logits(model, seq)[-1].argmax()))
    assert new == seq[len(prompt):]
    # Whole prompt already cached: generate from start=len(prompt).
    cache = new_cache()
    model.prefill(cache, pages, prompt)
    assert model.generate(cache, pages, prompt, steps, start=len(prompt)) == new


def test_seeds(model: Llama) -> None:
    again, other = Llama(CFG, seed=0), Llama(CFG, seed=1)
    assert torch.equal(again.embed, model.embed)
    for a, b in zip(again.layers, model.layers):
        assert torch.equal(a.wqkv, b.wqkv) and torch.equal(a.w_down, b.w_down)
    toks = tokens(20)
    pages = list(range(3))
    x = model.prefill(new_cache(), pages, toks)
    assert torch.equal(again.prefill(new_cache(), pages, toks), x)
    assert rel(other.prefill(new_cache(), pages, toks), x) > 0.1


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    n, H, D = q.shape
    end = k.shape[0]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    visible = torch.ones(n, end, dtype=torch.bool).tril(diagonal=end - n)
    return torch.einsum("hqk,khd->qhd", torch.softmax(s.masked_fill(~visible, float("-inf")), -1), v)


@pytest.mark.parametrize("n,end", [(300, 300), (200, 333), (1, 90), (17, 17)])
def test_chunked_attention(n: int, end: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + end)
    q = torch.randn(n, 4, 32, generator=g)
    k, v = torch.randn(end, 2, 32, generator=g), torch.randn(end, 2, 32, generator=g)
    ref = naive_attention(q, k, v)
    for chunk in (256, 64, 7):  # also chunks smaller than n
        assert rel(causal_attention(q, k, v, use_sdpa=False, chunk=chunk), ref) < 1e-5
    if HAVE_SDPA:
        assert rel(causal_attention(q, k, v, use_sdpa=True), ref) < 1e-5


def test_chunked_path_in_model() -> None:
    """The model on the chunked path, with prompts longer than the chunk."""
    m = Llama(CFG, seed=0)
    m.use_sdpa, m.attn_chunk = False, 16
    toks = tokens(120, seed=11)
    pages = shuffled_pages(15, 11)
    ref = dense_logits(m, toks)
    assert rel(m.prefill(new_cache(), pages, toks, logits="all"), ref) < 1e-5
    cache = new_cache()
    m.prefill(cache, pages, toks[:50])
    assert rel(m.prefill(cache, pages, toks, start=50, logits="all"), ref[50:]) < 1e-5


@pytest.mark.skipif(not HAVE_SDPA, reason="torch.nn.functional.scaled_dot_product_attention "
                    "needs torch >= 2.0 (this is %s)" % torch.__version__)
def test_chunked_equals_sdpa() -> None:
    m = Llama(CFG, seed=0)
    toks = tokens(300, seed=12)
    pages = shuffled_pages(38, 12)
    results = []
    for use_sdpa in (True, False):
        m.use_sdpa = use_sdpa
        cache = new_cache()
        m.prefill(cache, pages, toks[:100])
        results.append(m.prefill(cache, pages, toks, start=100, logits="all"))
    assert rel(results[1], results[0]) < 1e-5


def test_cache_pages() -> None:
    cache = new_cache()
    assert cache.kv[0].shape == (2, NUM_PAGES, PAGE_TOKENS, CFG.num_kv_heads, CFG.head_dim)
    assert all(kv.is_contiguous() for kv in cache.kv) and len(cache.kv) == CFG.num_layers
    assert cache.pages_for(0) == 0 and cache.pages_for(8) == 1 and cache.pages_for(9) == 2
    a = cache.alloc(30)
    assert len(set(a)) == 30
    with pytest.raises(RuntimeError):
        cache.alloc(11)
    cache.free(a[:5])
    with pytest.raises(ValueError):
        cache.free(a[:1])
    assert sorted(cache.alloc(15)) == sorted(set(range(NUM_PAGES)) - set(a[5:]))
