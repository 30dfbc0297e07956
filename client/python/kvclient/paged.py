"""kvclient.paged: between an engine's paged KV cache and kvcached blocks.

An engine keeps its KV in pages of `page_tokens` tokens; kvcached keeps
blocks. One block holds `pages_per_block` consecutive pages of one sequence
in the format of cuda/kernels.h, page after page:

    block = pages_per_block x [layers][2 (K, V)][page_tokens][kv_heads][head_dim]

so a block written by the CPU path is read by the GPU path of the same
layout, and by any engine that declares the same layout (MLA: the latent
vector's bytes take the place of [2][page_tokens][kv_heads][head_dim];
see PagedLayout.mla).

    layout = PagedLayout.vllm(kv_caches)             # per layer [2, pages, T, H, D]
    with Client(tenant=..., layout=layout.client_layout()) as c:
        kv = PagedKV(c, layout)
        r = kv.load(token_ids, page_ids)            # -> LoadResult: r.tokens are valid
        model.prefill(..., start=r.tokens)          # compute the rest
        kv.save(token_ids, page_ids)                # -> SaveResult

Keys are kvc_chain_hash over the tokens of each full block (with the
client's salt and `extra`, e.g. a LoRA id or hashes of multimodal inputs),
so engines and nodes agree without sharing a hash seed.

Fail closed: load() uses a block only when its status is 0 and its bytes
pass their committed CRC, and the first block that does not ends the usable
prefix (a later block depends on it); the engine recomputes from there. A
block whose bytes fail is reported to the daemon (which checks its own copy
and drops it) and listed in LoadResult.failed. A block that another worker
already stored is counted by save(), not an error. A worker that dies
between ALLOC and COMMIT leaves nothing visible.

Verification is a CPU pass over each loaded block before it is copied into
the pages (kvc_verify; daemon/OPS.md, "Trust model"): on the host path a
read of the block just before the scatter reads it again; on the GPU path a
read of the G2 block by the CPU before the device copy. Threads share the
pass (verify_threads), and load() copies each run of blocks that passed
while the next is checked. It checks the bytes
in place, so a worker of the tenant that changes them between the check
and the copy is not caught. G1 blocks on a real GPU cannot be read by the
CPU and are used unverified (in the host simulation they are checked).
PagedKV(verify=False) skips the pass: every block is then used as found,
trusting every worker of the tenant. save() commits each block with the CRC
of its slot, computed after the gather (a CPU pass over the slot).

Engine layouts (tests/test_vllm.py and test_sglang.py run them inside the
installed engines, vLLM 0.32.0 and SGLang 0.5.23, on the CPU; the rest are
built from the engines' shapes in test_paged.py):
  - vLLM: the per-layer KV cache of its attention backends,
    AttentionBackend.get_kv_cache_shape() = (2, num_blocks, block_size,
    num_kv_heads, head_size) for FlashAttention and most others (vllm),
    (num_blocks, 2, ...) for FlashInfer (page_major), MLA's (num_blocks,
    block_size, head_size) (mla), and the CPU backend's heads-major
    (num_blocks, num_kv_heads, block_size, 2 * head_size) (vllm_cpu, copied
    by torch);
  - SGLang: mem_cache/memory_pool.py (MHATokenToKVPool's per-layer
    k_buffer / v_buffer of [tokens, head_num, head_dim]: sglang) and the
    HiCache host pools, mem_cache/pool_host/mha.py and mla.py
    (MHATokenToKVPoolHost, MLATokenToKVPoolHost, by --hicache-mem-layout:
    sglang_host).
A Hugging Face DynamicCache, packed into pages, ran on a GPU
(tests/gpu/gpu_test_hf.py).

Copies: torch on CPU: kvc_pages_gather/scatter (memcpy). Torch on CUDA:
the project's gather/scatter kernels; G1 blocks are read in place (device to
device); G2 blocks either through a device staging buffer filled by the copy
engine (kvc_memcpy_batch, DMA: g2_path="stage") or read/written in place by
the kernel over the bus (g2_path="direct"). The G2 mapping is registered
with CUDA (Client.register_cuda) on first use.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import _lib
from .client import G1, G2, TIER_NONE, Client, Layout, _blocks
from .errors import CODES, KvError

log = logging.getLogger("kvclient.paged")

KV_EEXISTS = CODES["KV_EEXISTS"]
KV_EDEGRADED = CODES["KV_EDEGRADED"]
KV_ECORRUPT = CODES["KV_ECORRUPT"]

MEM_HOST, MEM_CUDA = 0, 1
_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4m3",
                "float8_e5m2": "fp8e5m2", "uint8": "u8", "int8": "i8"}


def _torch():
    import torch
    return torch


def dtype_name(dtype) -> str:
    """The dtype string HELLO carries for a torch dtype ("bf16", ...)."""
    return _DTYPE_NAMES.get(str(dtype).replace("torch.", ""), str(dtype).replace("torch.", ""))


class PagedLayout:
    """Where an engine's pages are, as the kernels of cuda/kernels.h see them.

    Build it with a constructor for the engine's layout: vllm(),
    page_major(), from_pages() (any layout whose K (and V) part of one page
    of one layer is contiguous: SGLang's per-layer K/V buffers, its host
    pools' layer-first and page-first-direct layouts, a Hugging Face cache
    packed into pages), or mla(). The tensors must outlive the layout (it
    holds references).
    """

    def __init__(self, *, bases, page_tokens, kernel_tokens, kv_heads, head_dim, elem_bytes, num_pages,
                 page_stride, kv_stride, half_bytes, model_layers, model_kv_heads,
                 model_head_dim, dtype, device, keep):
        self.bases = list(bases)            # one per kernel layer
        self.page_tokens = page_tokens      # tokens per engine page
        self.num_pages = num_pages
        self.model_layers = model_layers    # what HELLO declares
        self.model_kv_heads = model_kv_heads
        self.model_head_dim = model_head_dim
        self.dtype = dtype                  # HELLO's dtype string
        self.device = device                # torch.device
        self.half_bytes = half_bytes
        self._keep = keep
        # the kernel's geometry: any factorisation of a half's elements
        self.c = _lib.KvcPageLayout(len(self.bases), kernel_tokens, kv_heads, head_dim, elem_bytes,
                                    num_pages, page_stride, kv_stride)
        self._bases_c = (ctypes.c_void_p * len(self.bases))(*self.bases)
        self.page_block_bytes = 2 * half_bytes * model_layers  # one page of every layer
        got = int(_lib.lib().kvc_page_block_bytes(ctypes.byref(self.c)))
        if got != self.page_block_bytes:
            raise ValueError(f"layout rejected by libkvclient (kvc_page_block_bytes = {got}, "
                             f"expected {self.page_block_bytes}): strides or sizes are off")

    def layer_kernel(self, layer: int):
        """(kernel layout, kernel bases, byte offset in a page block) of model
        layer `layer` alone: its part of each page of a block is one
        contiguous range (cuda/kernels.h's page block is [layers][2][...]),
        so one layer can be copied by itself (PagedKV.layer_into_pages)."""
        if not 0 <= layer < self.model_layers:
            raise ValueError(f"layer {layer} outside 0..{self.model_layers - 1}")
        cache = self.__dict__.setdefault("_layer_c", {})
        if layer not in cache:
            k = len(self.bases) // self.model_layers  # kernel layers per model layer (1, or 2: K, V apart)
            c = self.c
            lc = _lib.KvcPageLayout(k, c.page_tokens, c.kv_heads, c.head_dim, c.elem_bytes,
                                    c.num_pages, c.page_stride, c.kv_stride)
            bases = (ctypes.c_void_p * k)(*self.bases[layer * k:(layer + 1) * k])
            got = int(_lib.lib().kvc_page_block_bytes(ctypes.byref(lc)))
            if got != 2 * self.half_bytes:
                raise ValueError(f"layer {layer}: kernel layout of {got} B, want {2 * self.half_bytes}")
            cache[layer] = (lc, bases, layer * 2 * self.half_bytes)
        return cache[layer]

    @property
    def mem(self) -> int:
        return MEM_CUDA if self.device.type == "cuda" else MEM_HOST

    def client_layout(self, pages_per_block: int = 1, tp_rank: int = 0, tp_size: int = 1) -> Layout:
        """The Layout to open a Client with (HELLO's namespace)."""
        return Layout(block_bytes=self.page_block_bytes * pages_per_block,
                      tokens_per_block=self.page_tokens * pages_per_block,
                      layers=self.model_layers, kv_heads=self.model_kv_heads,
                      head_dim=self.model_head_dim, dtype=self.dtype, tp_rank=tp_rank,
                      tp_size=tp_size)

    # --- constructors ------------------------------------------------------
    @classmethod
    def from_pages(cls, k_pages, v_pages, kv_heads: int | None = None, head_dim: int | None = None,
                   dtype: str | None = None, page_tokens: int | None = None) -> "PagedLayout":
        """k_pages[l], v_pages[l]: views [num_pages, page_tokens, ...] of layer
        l's K and V, each page's part contiguous (strides between pages are
        free). kv_heads/head_dim: what HELLO declares (default: the views'
        dims 2 and 3 when they have them)."""
        L = len(k_pages)
        if L == 0 or len(v_pages) != L:
            raise ValueError("one K and one V view per layer, at least one layer")
        k0 = k_pages[0]
        if k0.dim() < 2:
            raise ValueError("a page view is [num_pages, page_tokens, ...]")
        num_pages = int(k0.shape[0])
        page_tokens = int(page_tokens or k0.shape[1])
        E = k0.element_size()
        half_elems = 1
        for s in k0.shape[1:]:
            half_elems *= int(s)
        half = half_elems * E
        pstride = int(k0.stride(0)) * E
        dev = k0.device
        for l, (k, v) in enumerate(zip(k_pages, v_pages)):
            for name, t in (("K", k), ("V", v)):
                if t.shape != k0.shape or t.dtype != k0.dtype or t.device != dev:
                    raise ValueError(f"layer {l} {name}: shape/dtype/device differ from layer 0 K")
                if int(t.stride(0)) * E != pstride:
                    raise ValueError(f"layer {l} {name}: page stride differs from layer 0 K")
                if not t[0].is_contiguous():
                    raise ValueError(f"layer {l} {name}: one page's part is not contiguous")
        if kv_heads is None:
            kv_heads = int(k0.shape[2]) if k0.dim() >= 4 else 1
        if head_dim is None:
            head_dim = int(k0.shape[3]) if k0.dim() >= 4 else half_elems // page_tokens
        dname = dtype or dtype_name(k0.dtype)
        kvs = {v.data_ptr() - k.data_ptr() for k, v in zip(k_pages, v_pages)}
        kstride = kvs.pop() if len(kvs) == 1 else -1
        ok_interleaved = kstride >= half and pstride >= kstride + half
        ok_kfirst = kstride >= 0 and pstride >= half and kstride >= (num_pages - 1) * pstride + half
        if (ok_interleaved or ok_kfirst) and L <= 256:
            bases = [k.data_ptr() for k in k_pages]
            kh, kd, pt = _kernel_geom(half_elems, page_tokens)
            return cls(bases=bases, page_tokens=page_tokens, kernel_tokens=pt, kv_heads=kh,
                       head_dim=kd,
                       elem_bytes=E, num_pages=num_pages, page_stride=pstride, kv_stride=kstride,
                       half_bytes=half, model_layers=L, model_kv_heads=kv_heads,
                       model_head_dim=head_dim, dtype=dname, device=dev,
                       keep=(list(k_pages), list(v_pages)))
        # K and V apart (e.g. separate allocations per layer): each of them
        # becomes a kernel "layer" whose two halves are the first and the
        # second half of its page part - the same bytes in the same order.
        if half_elems % 2 or 2 * L > 256:
            raise ValueError("K and V views of this layout are not at one distance in every "
                             "layer, and cannot be split (odd page size or over 128 layers)")
        bases = [p for k, v in zip(k_pages, v_pages) for p in (k.data_ptr(), v.data_ptr())]
        kh, kd, pt = _kernel_geom(half_elems // 2, page_tokens)
        return cls(bases=bases, page_tokens=page_tokens, kernel_tokens=pt, kv_heads=kh, head_dim=kd,
                   elem_bytes=E,
                   num_pages=num_pages, page_stride=pstride, kv_stride=half // 2, half_bytes=half,
                   model_layers=L, model_kv_heads=kv_heads, model_head_dim=head_dim, dtype=dname,
                   device=dev, keep=(list(k_pages), list(v_pages)))

    @classmethod
    def vllm(cls, kv_caches) -> "PagedLayout":
        """vLLM's flash-attention layout: per layer [2, num_pages, page_tokens,
        kv_heads, head_dim]."""
        for l, t in enumerate(kv_caches):
            if t.dim() != 5 or t.shape[0] != 2:
                raise ValueError(f"layer {l}: shape {tuple(t.shape)}, want [2, pages, T, H, D]")
        return cls.from_pages([t[0] for t in kv_caches], [t[1] for t in kv_caches])

    @classmethod
    def vllm_cpu(cls, kv_caches) -> "PagedLayout":
        """vLLM's CPU attention backend (CPUAttentionBackend, vLLM 0.32's
        "LBHNC" layout): per layer [num_pages, kv_heads, page_tokens,
        2*head_dim], which the backend reads as [pages, heads,
        2*page_tokens, head_dim]: per head, the page's K rows then its V
        rows. Heads-major, so one page's K is not [tokens][heads][dim] in
        one piece and the kernels cannot describe it: the copies go through
        torch, between the blocks and a strided view of each layer as
        [pages, 2, page_tokens, heads, head_dim]. The blocks are the same
        as every other layout's (a block saved from these pages scatters
        into a vllm() cache of the same model byte for byte)."""
        views = []
        for l, t in enumerate(kv_caches):
            if t.dim() != 4 or t.shape[3] % 2 or not t.is_contiguous():
                raise ValueError(f"layer {l}: shape {tuple(t.shape)}, want a contiguous "
                                 "[pages, heads, T, 2*D] (vLLM's CPU backend)")
            n, h, T, d2 = (int(x) for x in t.shape)
            views.append(t.view(n, h, 2, T, d2 // 2).permute(0, 2, 3, 1, 4))
        return _TorchLayout(views, keep=list(kv_caches))

    @classmethod
    def page_major(cls, kv_caches) -> "PagedLayout":
        """Per layer [num_pages, 2, page_tokens, kv_heads, head_dim] (FlashInfer's
        NHD, TensorRT-LLM's): the layout cuda/kernels.h calls dense."""
        for l, t in enumerate(kv_caches):
            if t.dim() != 5 or t.shape[1] != 2:
                raise ValueError(f"layer {l}: shape {tuple(t.shape)}, want [pages, 2, T, H, D]")
        return cls.from_pages([t[:, 0] for t in kv_caches], [t[:, 1] for t in kv_caches])

    @classmethod
    def sglang(cls, k_buffers, v_buffers, page_tokens: int) -> "PagedLayout":
        """SGLang's MHATokenToKVPool: per layer K and V buffers [tokens,
        kv_heads, head_dim]; page p is tokens [p*page_tokens, (p+1)*page_tokens)."""
        def pages(t):
            n = int(t.shape[0]) // page_tokens
            return t[:n * page_tokens].view(n, page_tokens, *t.shape[1:])
        return cls.from_pages([pages(k) for k in k_buffers], [pages(v) for v in v_buffers])

    @classmethod
    def mla(cls, caches, dtype: str | None = None) -> "PagedLayout":
        """MLA's single latent tensor per layer: [num_pages, page_tokens,
        latent] (or [num_pages, page_tokens, 1, latent]), each page
        contiguous. The block holds, per layer, one page's latent vectors
        (their bytes split in two halves where other layouts have K and V).
        HELLO: kv_heads 1, head_dim latent."""
        ks, vs = [], []
        for l, t in enumerate(caches):
            if t.dim() == 4 and t.shape[2] == 1:
                t = t[:, :, 0]
            if t.dim() != 3 or not t[0].is_contiguous():
                raise ValueError(f"layer {l}: shape {tuple(t.shape)}, want [pages, T, latent] "
                                 "with each page contiguous")
            n, T, lat = (int(s) for s in t.shape)
            if (T * lat) % 2:
                raise ValueError("MLA page with an odd number of elements")
            h, ps, off = T * lat // 2, int(t.stride(0)), t.storage_offset()
            # each page's first and second half, in place (a copy would
            # detach the layout from the cache)
            ks.append(t.as_strided((n, 1, h), (ps, h, 1), off))
            vs.append(t.as_strided((n, 1, h), (ps, h, 1), off + h))
        lay = cls.from_pages(ks, vs, kv_heads=1, head_dim=int(caches[0].shape[-1]), dtype=dtype,
                             page_tokens=int(caches[0].shape[1]))
        lay._keep = (list(caches), lay._keep)
        return lay

    @classmethod
    def sglang_host(cls, kv_buffer, layout: str, page_tokens: int,
                    mla: bool = False) -> "PagedLayout":
        """SGLang's HiCache host pool (MHATokenToKVPoolHost, or with mla=True
        MLATokenToKVPoolHost) by its --hicache-mem-layout:
          layer_first        MHA [2, layers, tokens, heads, dim]; MLA [layers, tokens, 1, dim]
          page_first_direct  MHA [2, pages, layers, page_tokens, heads, dim];
                             MLA [pages, layers, page_tokens, 1, dim]
        page_first ([2, tokens, layers, ...]) interleaves the layers inside
        each token, so one layer's page is not contiguous: it has no kernel
        description and is refused (use page_first_direct)."""
        t = kv_buffer
        if layout == "page_first":
            raise ValueError("SGLang's page_first layout interleaves layers inside each token: "
                             "a page of one layer is not contiguous; use page_first_direct")
        if layout == "layer_first":
            if mla:
                L, n = int(t.shape[0]), int(t.shape[1]) // page_tokens
                return cls.mla([t[l, :n * page_tokens].view(n, page_tokens, *t.shape[2:])
                                for l in range(L)])
            L, n = int(t.shape[1]), int(t.shape[2]) // page_tokens
            pages = [t[kv, l, :n * page_tokens].view(n, page_tokens, *t.shape[3:])
                     for kv in (0, 1) for l in range(L)]
            return cls.from_pages(pages[:L], pages[L:])
        if layout == "page_first_direct":
            if mla:
                if t.dim() != 5 or int(t.shape[2]) != page_tokens:
                    raise ValueError(f"shape {tuple(t.shape)}: want [pages, layers, {page_tokens}, 1, dim]")
                return cls.mla([t[:, l] for l in range(int(t.shape[1]))])
            if t.dim() != 6 or int(t.shape[3]) != page_tokens:
                raise ValueError(f"shape {tuple(t.shape)}: want [2, pages, layers, {page_tokens}, heads, dim]")
            L = int(t.shape[2])
            return cls.from_pages([t[0, :, l] for l in range(L)], [t[1, :, l] for l in range(L)])
        raise ValueError(f"unknown SGLang host layout {layout!r}")


def _kernel_geom(half_elems: int, page_tokens: int):
    """(kv_heads, head_dim, page_tokens) for the kernel: any factorisation of
    the half's elements works (the copy is byte-exact)."""
    if half_elems % page_tokens == 0:
        return 1, half_elems // page_tokens, page_tokens
    return 1, half_elems, 1


class _TorchLayout(PagedLayout):
    """A layout whose pages no kernel layout describes: per layer a view
    [num_pages, 2, page_tokens, kv_heads, head_dim] of the engine's cache
    (any strides), copied to and from the blocks by torch on the host
    (PagedLayout.vllm_cpu). Everything else (HELLO's geometry, the block
    format) is PagedLayout's."""

    def __init__(self, views, keep):
        v0 = views[0]
        n, _, T, H, D = (int(x) for x in v0.shape)
        for l, v in enumerate(views):
            if tuple(v.shape) != tuple(v0.shape) or v.dtype != v0.dtype or v.device != v0.device:
                raise ValueError(f"layer {l}: shape/dtype/device differ from layer 0")
        if v0.device.type != "cpu":
            raise ValueError("a torch-copied layout is for caches in host memory")
        self.views = list(views)
        self.bases = []
        self.page_tokens = T
        self.num_pages = n
        self.model_layers = len(views)
        self.model_kv_heads = H
        self.model_head_dim = D
        self.dtype = dtype_name(v0.dtype)
        self.device = v0.device
        self.half_bytes = T * H * D * v0.element_size()
        self._keep = keep
        self.c = None
        self._bases_c = None
        self.page_block_bytes = 2 * self.half_bytes * self.model_layers

    def layer_kernel(self, layer: int):
        raise ValueError("a torch-copied layout has no kernel description")

    def torch_copy(self, scatter: bool, page_ids, ptrs, layer: int | None = None) -> None:
        """Page page_ids[i] <-> the page block at ptrs[i] ([layers][2][T][H][D]):
        into the pages (scatter) or out of them, every layer or one."""
        torch = _torch()
        v0 = self.views[0]
        shape = (self.model_layers,) + tuple(v0.shape[1:])
        nbytes = self.page_block_bytes
        layers = range(self.model_layers) if layer is None else (layer,)
        for pid, ptr in zip(page_ids, ptrs):
            if not 0 <= int(pid) < self.num_pages:
                raise ValueError(f"page id {pid} outside 0..{self.num_pages - 1}")
            buf = (ctypes.c_char * nbytes).from_address(int(ptr))
            blk = torch.frombuffer(buf, dtype=torch.uint8).view(v0.dtype).view(shape)
            for l in layers:
                if scatter:
                    self.views[l][int(pid)].copy_(blk[l])
                else:
                    blk[l].copy_(self.views[l][int(pid)])


@dataclass
class SaveResult:
    blocks: int = 0        # full blocks in the sequence
    present: int = 0       # already stored before this call (the lookup's prefix)
    stored: int = 0        # written and committed by this call
    existed: int = 0       # another worker had stored or was storing them (KV_EEXISTS)
    shared: int = 0        # with save(shared=True): stored blocks now in G4 too
    failed: list = field(default_factory=list)  # [(block index, KvError)]
    timings: dict = field(default_factory=dict)
    keys: list = field(default_factory=list)    # the full blocks' keys


@dataclass
class LoadResult:
    tokens: int = 0        # leading tokens whose KV is now in the pages
    blocks: int = 0        # leading blocks loaded
    hit: int = 0           # blocks LOOKUP found resident (before LOAD)
    tiers: list = field(default_factory=list)   # the loaded blocks' tiers
    failed: list = field(default_factory=list)  # [(block index, KvError)] of blocks that failed
    failed_pages: list = field(default_factory=list)  # the engine pages those blocks were for
    timings: dict = field(default_factory=dict)  # seconds: lookup, load, verify, copy, release
    # With load(holes=True): every block that came, the leading run or not.
    loaded: int = 0        # blocks loaded in all
    filled: list = field(default_factory=list)  # [(first token, end token)] now in the pages
    holes: list = field(default_factory=list)   # [(first token, end token)] of the keys' span not


@dataclass
class Pinned:
    """The leading blocks of one LOAD that came and passed their check,
    still pinned for this connection (PagedKV.load_pinned): copy them
    (into_pages, whole or a layer at a time), then release them."""
    keys: list             # their keys
    blocks: list           # [(tier, ptr)]
    first: int             # the sequence index of the first


class PagedKV:
    """Saves and loads one engine layout's pages through a Client.

    pages_per_block: engine pages per kvcached block (the client's layout
    must be layout.client_layout(pages_per_block)). batch: blocks per
    ALLOC round of save() (each round holds that many G2 slots at once);
    load_batch: blocks per LOAD round of load() (the whole prefix in one
    round, up to the protocol's 4096, by default). g2_path, when the
    engine's tensors are on CUDA: "direct" (the kernel reads and writes G2
    in place, over the bus) or "stage" (the copy
    engine moves the blocks through a device staging buffer). "direct" is
    the default: on an H100 it moved 512 KiB blocks 1.11x as fast as
    "stage" both ways (tests/gpu/gpu_bench_client, BENCHMARKS.md). On CUDA
    the client's G2 mapping is registered here (Client.register_cuda), once,
    as an engine would at start-up. verify: check each loaded block against
    its committed CRC on the CPU before it is copied into the pages (the
    module's docstring says what that covers); False uses blocks unverified.
    verify_threads: threads that share that pass for G2 blocks (default
    min(8, CPUs)); a 32k-token prefix of the Llama-3.2-1B shape is 0.97 GB,
    about 74 ms for one thread of an H100 host against 20 ms for its copy
    over the bus (BENCHMARKS.md, "On a GPU").
    """

    def __init__(self, client: Client, layout: PagedLayout, pages_per_block: int = 1,
                 batch: int = 1024, g2_path: str = "direct", load_batch: int = _lib.BATCH_MAX,
                 verify: bool = True, verify_threads: int | None = None):
        want = layout.client_layout(pages_per_block, client.layout.tp_rank, client.layout.tp_size)
        if (client.layout.block_bytes, client.layout.tokens_per_block) != \
                (want.block_bytes, want.tokens_per_block):
            raise ValueError(f"client layout {client.layout} does not match the paged layout "
                             f"({want.block_bytes} B, {want.tokens_per_block} tokens per block)")
        if g2_path not in ("stage", "direct"):
            raise ValueError("g2_path: 'stage' or 'direct'")
        self.client = client
        self.layout = layout
        self.ppb = pages_per_block
        self._hint_warned = False
        self.block_tokens = layout.page_tokens * pages_per_block
        self.block_bytes = want.block_bytes
        self.batch = max(1, min(batch, _lib.BATCH_MAX))
        self.load_batch = max(1, min(load_batch, _lib.BATCH_MAX))
        self.g2_path = g2_path
        self.verify = verify
        self.verify_threads = max(1, verify_threads if verify_threads is not None
                                  else min(8, os.cpu_count() or 1))
        self._staging = None
        self._L = _lib.lib()
        if self._cuda():  # G2 <-> device copies are DMA, and kernels reach G2
            client.register_cuda()

    # --- helpers ---------------------------------------------------------------
    def keys(self, token_ids, extra: bytes = b"") -> list[bytes]:
        """The chain keys of token_ids' full blocks."""
        return self.client.chain_keys(_tolist(token_ids), extra)

    def _cuda(self) -> bool:
        return self.layout.mem == MEM_CUDA

    @property
    def on_cuda(self) -> bool:
        """Whether the engine's pages are CUDA memory."""
        return self._cuda()

    def _stream(self):
        torch = _torch()
        return ctypes.c_void_p(torch.cuda.current_stream(self.layout.device).cuda_stream)

    def _sync(self):
        if self._cuda():
            _torch().cuda.current_stream(self.layout.device).synchronize()

    def _stage(self, nbytes: int) -> int:
        torch = _torch()
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = torch.empty(nbytes, dtype=torch.uint8, device=self.layout.device)
        return self._staging.data_ptr()

    def _page_ptrs(self, block_ptrs: list[int], page_ids: list[int], idx):
        """(page ids, kernel block pointers) for the blocks at block_ptrs,
        sequence blocks idx: block i's pages page_ids[i*ppb .. (i+1)*ppb),
        each a kernels.h block inside it."""
        pb = self.layout.page_block_bytes
        if self.ppb == 1:
            return [int(page_ids[i]) for i in idx], list(block_ptrs)
        pids, ptrs = [], []
        for bp, i in zip(block_ptrs, idx):
            for q in range(self.ppb):
                pids.append(int(page_ids[i * self.ppb + q]))
                ptrs.append(bp + q * pb)
        return pids, ptrs

    def _kern(self, scatter: bool, pids: list[int], ptrs: list[int], mem: int, kl=None,
              layer: int | None = None):
        n = len(pids)
        if n == 0:
            return
        if self.layout.c is None:  # no kernel describes it: torch on the host
            self.layout.torch_copy(scatter, pids, ptrs, layer)
            return
        pa = (ctypes.c_uint32 * n)(*pids)
        ba = (ctypes.c_void_p * n)(*ptrs)
        fn = self._L.kvc_pages_scatter if scatter else self._L.kvc_pages_gather
        stream = self._stream() if mem == MEM_CUDA else None
        lc, bases = kl if kl is not None else (self.layout.c, self.layout._bases_c)
        rc = fn(self.client._handle(), ctypes.byref(lc), bases, pa, ba, n, mem, stream)
        if rc < 0:
            detail = self._L.kvc_cuda_error().decode("utf-8", "replace") if mem == MEM_CUDA else ""
            raise KvError(rc, "scatter" if scatter else "gather", detail)

    def _memcpy(self, pairs: list[tuple[int, int]], nbytes: int):
        n = len(pairs)
        if n == 0:
            return
        v = (_lib.KvcCopy * n)()
        for i, (d, s) in enumerate(pairs):
            v[i].dst, v[i].src, v[i].bytes = d, s, nbytes
        rc = self._L.kvc_memcpy_batch(self.client._handle(), v, n, MEM_CUDA, self._stream())
        if rc < 0:
            raise KvError(rc, "memcpy_batch", self._L.kvc_cuda_error().decode("utf-8", "replace"))

    def _into_pages(self, blocks, page_ids, first: int):
        """Scatter blocks [(tier, ptr)] (all usable, consecutive from block
        index `first`) into the pages."""
        bb = self.block_bytes
        idx = range(first, first + len(blocks))
        if not self._cuda():
            if any(t != G2 for t, _ in blocks):
                raise KvError(-errno.EINVAL, "load", "a G1 block for an engine on the CPU")
            pids, ptrs = self._page_ptrs([p for _, p in blocks], page_ids, idx)
            self._kern(True, pids, ptrs, MEM_HOST)
            return
        if self.g2_path == "stage" and any(t != G1 for t, _ in blocks):
            g2 = [(j, p) for j, (t, p) in enumerate(blocks) if t != G1]
            base = self._stage(len(g2) * bb)
            self._memcpy([(base + k * bb, p) for k, (_, p) in enumerate(g2)], bb)
            blocks = list(blocks)
            for k, (j, _) in enumerate(g2):
                blocks[j] = (G1, base + k * bb)  # now a device address, like a G1 block
        # G1 blocks (and staged ones) are device memory; G2 blocks the kernel
        # reaches in place through the registered mapping
        pids, ptrs = self._page_ptrs([p for _, p in blocks], page_ids, idx)
        self._kern(True, pids, ptrs, MEM_CUDA)

    def can_copy_layers(self, blocks) -> bool:
        """Whether blocks [(tier, ptr)] can go into the pages one layer at a
        time (layer_into_pages): on the host, or on CUDA where the kernel
        reads them in place (G1, or G2 with g2_path "direct"); a G2 block
        staged through the device buffer is copied whole."""
        return not self._cuda() or self.g2_path == "direct" or all(t == G1 for t, _ in blocks)

    def layer_into_pages(self, blocks, page_ids, first: int, layer: int):
        """Scatter model layer `layer` of blocks [(tier, ptr)] (consecutive
        from sequence block `first`, block i into pages page_ids[i*ppb ..
        (i+1)*ppb)) into that layer's pages; the other layers are left
        alone. Asynchronous on CUDA (the current stream, as the attention
        that reads the layer): the blocks must stay pinned until _sync()."""
        if not self.can_copy_layers(blocks):
            raise ValueError("blocks staged through the device buffer are copied whole")
        if not self._cuda() and any(t != G2 for t, _ in blocks):
            raise KvError(-errno.EINVAL, "load", "a G1 block for an engine on the CPU")
        idx = range(first, first + len(blocks))
        pids, ptrs = self._page_ptrs([p for _, p in blocks], page_ids, idx)
        if self.layout.c is None:
            self._kern(True, pids, ptrs, MEM_HOST, layer=layer)
            return
        lc, bases, off = self.layout.layer_kernel(layer)
        self._kern(True, pids, [p + off for p in ptrs], self.layout.mem, (lc, bases))

    def _from_pages(self, blocks, page_ids, idx):
        """Gather pages into the allocated blocks (block j is sequence block idx[j])."""
        bb = self.block_bytes
        mem = self.layout.mem
        if mem == MEM_HOST or self.g2_path == "direct":
            pids, ptrs = self._page_ptrs([b.ptr for b in blocks], page_ids, idx)
            self._kern(False, pids, ptrs, mem)
            return
        base = self._stage(len(blocks) * bb)
        pids, ptrs = self._page_ptrs([base + k * bb for k in range(len(blocks))], page_ids, idx)
        self._kern(False, pids, ptrs, MEM_CUDA)
        self._memcpy([(b.ptr, base + k * bb) for k, b in enumerate(blocks)], bb)

    def _check_pages(self, ntok: int, page_ids):
        need = -(-ntok // self.layout.page_tokens)
        if len(page_ids) < need:
            raise ValueError(f"{len(page_ids)} pages for {ntok} tokens: {need} needed")
        for p in page_ids[:need]:
            if not 0 <= int(p) < self.layout.num_pages:
                raise ValueError(f"page id {p} outside 0..{self.layout.num_pages - 1}")

    # --- the two operations ------------------------------------------------------
    def save(self, token_ids, page_ids, extra: bytes = b"", prio: int = 128, session=None,
             retain_s: int = 0, shared: bool = False) -> SaveResult:
        """Stores the full blocks of token_ids (their KV in pages page_ids)
        that kvcached does not hold yet: ALLOC, gather, COMMIT. With a
        session (a name or id: kvclient.session_id), every full block of
        the sequence is then hinted as the session's (hint()). shared: each
        COMMIT is answered once its blocks are in the fleet's tier (G4)
        too, so that when save returns another node's LOOKUP finds them (a
        prefill node handing the prompt to a decode node): res.shared of
        res.stored made it (the others are stored here only: G4 off, down
        or failing; blocks already held, res.present, went to G4 when they
        were stored)."""
        tokens, page_ids = _tolist(token_ids), _tolist(page_ids)
        keys = self.keys(tokens, extra)
        res = SaveResult(blocks=len(keys), keys=keys)
        if not keys:
            return res
        self._check_pages(len(keys) * self.block_tokens, page_ids)
        t0 = time.perf_counter()
        hit, _ = self.client.lookup(keys)
        res.present = hit
        t_copy = 0.0
        for lo in range(hit, len(keys), self.batch):
            hi = min(lo + self.batch, len(keys))
            parents = [keys[i - 1] if i else None for i in range(lo, hi)]
            with self.client.alloc(keys[lo:hi], parents=parents, prio=prio) as a:
                got = [(j, b) for j, b in enumerate(a.blocks) if b.ok]
                for j, b in enumerate(a.blocks):
                    if b.status == KV_EEXISTS:
                        res.existed += 1
                    elif not b.ok:
                        res.failed.append((lo + j, b.error))
                if not got:
                    a.abort()
                    continue
                t1 = time.perf_counter()
                self._from_pages([b for _, b in got], page_ids, [lo + j for j, _ in got])
                self._sync()  # commit() checksums the slots: the bytes must be there
                t_copy += time.perf_counter() - t1
                st = a.commit([j for j, _ in got], shared=shared)
                for (j, b), s in zip(got, st):
                    if s == 0 or (shared and s == KV_EDEGRADED):  # EDEGRADED: here, not in G4
                        res.stored += 1
                        res.shared += shared and s == 0
                    elif s == KV_EEXISTS:
                        res.existed += 1
                    else:
                        res.failed.append((lo + j, KvError(s, "commit", b.key.hex())))
        self.hint(session, keys, retain_s)
        res.timings = {"total": time.perf_counter() - t0, "copy": t_copy}
        return res

    def hint(self, session, keys, retain_s: int = 0) -> bool:
        """Tells the daemon that these blocks belong to `session` (engine
        hints, protocol 1.3: advice for eviction). Best effort: nothing for
        session None or no keys; False when the daemon could not take it
        (one before 1.3, a closed connection), which never fails a store or
        a load."""
        if session is None or not keys:
            return False
        try:
            for lo in range(0, len(keys), _lib.BATCH_MAX):
                self.client.hint_session(session, keys[lo:lo + _lib.BATCH_MAX], retain_s)
            return True
        except KvError as e:
            if not self._hint_warned:
                self._hint_warned = True
                log.info("kvcached hints not taken (%s); stores and loads go on without them", e)
            return False

    def load(self, token_ids, page_ids, extra: bytes = b"", tier: int = G2,
             max_tokens: int | None = None, session=None, retain_s: int = 0,
             holes: bool = False, lookups: int = 1) -> LoadResult:
        """Loads the longest stored prefix of token_ids into pages page_ids:
        LOOKUP, LOAD, scatter, RELEASE. At most max_tokens tokens (default:
        all but the last token, which the engine computes for its logits).
        Returns how many leading tokens are now valid; a failed block ends
        the prefix and is reported with its pages. With a session, the
        loaded blocks are then hinted as the session's (hint()).

        holes: load every block found, past a missing or failed one too
        (a block's key names its whole prefix, so a block after a hole is
        still the KV of this sequence at its place; Llama.prefill(filled=)
        computes the holes alone). The LOOKUP asks G4 past its first miss
        too (Client.lookup(past_holes=True)). res.filled and res.holes say
        which token ranges of the keys' span came and which did not;
        res.tokens and res.blocks still count the leading run.

        lookups: LOOKUPs at most. A daemon with G4 brings at most
        g4.lookup_blocks blocks in per LOOKUP, so a node loading a long
        prompt that another node stored (decode after a remote prefill)
        asks again from the end of the run while a LOOKUP extends it (each
        further one starts at the run's last block, which keeps the chain
        whole). Not with holes."""
        tokens, page_ids = _tolist(token_ids), _tolist(page_ids)
        if max_tokens is None:
            max_tokens = max(len(tokens) - 1, 0)
        keys = self.keys(tokens[:max_tokens], extra)
        res = LoadResult()
        if not keys:
            return res
        self._check_pages(len(keys) * self.block_tokens, page_ids)
        if tier == G1 and not self._cuda():
            raise ValueError("tier G1 needs an engine on CUDA")
        if tier == G1 and not self.client.g1.available:
            tier = G2  # no pool in this process: the blocks come through G2
        t0 = time.perf_counter()
        look = self.client.lookup
        hit, tiers = look(keys, past_holes=True) if holes else look(keys)
        for _ in range(lookups - 1):
            if holes or not 0 < hit < len(keys):
                break
            more, t2 = self.client.lookup(keys[hit - 1:])
            if more <= 1:
                break
            tiers[hit - 1:] = t2
            hit += more - 1
        res.hit = hit
        t1 = time.perf_counter()
        res.timings = {"lookup": t1 - t0, "load": 0.0, "verify": 0.0, "copy": 0.0, "release": 0.0}
        # Each run of blocks goes into the pages as soon as it is verified,
        # while the verify threads check the next (not through the staging
        # buffer, which one round's copies share).
        piped = not self._cuda() or self.g2_path == "direct"

        def ready(first: int, blocks) -> None:
            self._into_pages(blocks, page_ids, first)

        # Runs of blocks found, load_batch at most each: the leading run
        # alone, or with holes every run, a block that fails ending its run
        # (the rest of it is asked for again, less what failed with it).
        found = [t != TIER_NONE for t in tiers] if holes else [True] * hit + [False] * (
            len(keys) - hit)
        got = []  # sequence indices of the blocks now in the pages
        lo = 0
        while lo < len(keys):
            if not found[lo]:
                lo += 1
                continue
            hi = lo
            while hi < len(keys) and found[hi] and hi - lo < self.load_batch:
                hi += 1
            nfailed = len(res.failed)
            p = self.load_pinned(keys, lo, hi, page_ids, tier, res, ready if piped else None)
            tc = time.perf_counter()
            try:
                if p.blocks:
                    if not piped:
                        self.into_pages(p, page_ids)
                    self.sync()  # the pins must outlive the copies
            finally:
                td = time.perf_counter()
                self.release(p)
            res.timings["copy"] += td - tc
            res.timings["release"] += time.perf_counter() - td
            res.tiers += [t for t, _ in p.blocks]
            got += range(lo, lo + len(p.blocks))
            if len(p.blocks) < hi - lo:
                if not holes:
                    break
                for i, _ in res.failed[nfailed:]:
                    found[i] = False
                lo += len(p.blocks) + 1  # past the first that failed
            else:
                lo = hi
        res.loaded = len(got)
        res.blocks = next((j for j, i in enumerate(got) if i != j), len(got))
        res.tokens = res.blocks * self.block_tokens
        if holes:
            res.filled, res.holes = _ranges(got, len(keys), self.block_tokens)
        self.hint(session, [keys[i] for i in got] if holes else keys[:res.blocks], retain_s)
        res.timings["total"] = time.perf_counter() - t0
        return res


    def load_pinned(self, keys, lo: int, hi: int, page_ids, tier: int = G2,
                    res: LoadResult | None = None, ready=None) -> Pinned:
        """One LOAD of keys[lo:hi] (sequence blocks lo..hi-1, into pages
        page_ids), each block checked against its committed CRC (verify)
        before anything is copied. The leading blocks that came and passed
        stay pinned and are returned; every other pin this LOAD took is
        released, and the blocks that failed are listed in res (failed,
        failed_pages). Raises KvError when the LOAD fails as a whole
        (nothing is pinned then). ready(first, blocks), when given, is
        called in order with each run of blocks that passed, as soon as it
        has (first: its first sequence block; blocks: [(tier, ptr)]), so
        that copies can start while later blocks are checked; the copies
        it starts must be done before release() (an error here waits for
        the current stream before dropping the pins)."""
        res = res if res is not None else LoadResult()
        res.timings.setdefault("load", 0.0)
        res.timings.setdefault("verify", 0.0)
        ta = time.perf_counter()
        ka = _lib.keys_array(keys[lo:hi])
        out = self.client._load_raw(ka, hi - lo, tier)
        got = _blocks(out, hi - lo)  # [(status, tier, ptr, length)]
        tb = time.perf_counter()
        n = next((j for j, g in enumerate(got) if g[0] != 0), len(got))
        keep = 0
        tv = tb
        try:
            if self.verify:
                n = self._verify(ka, out, got, n, lo, keys, page_ids, res, ready)
                tv = time.perf_counter()
            elif ready is not None and n:
                ready(lo, [(g[1], g[2]) for g in got[:n]])
            for j in range(n, len(got)):
                if got[j][0] != 0:
                    res.failed.append((lo + j, KvError(got[j][0], "block", keys[lo + j].hex())))
                    res.failed_pages += page_ids[(lo + j) * self.ppb:(lo + j + 1) * self.ppb]
            keep = n
        except BaseException:
            if ready is not None:
                self._sync()  # copies ready() started still read the pinned blocks
            raise
        finally:  # every pin not handed back (a CRC report took its own)
            rest = [keys[lo + j] for j in range(keep, hi - lo) if out[j].status == 0]
            if rest:
                self.client.release(rest)
            res.timings["load"] += tb - ta
            res.timings["verify"] += tv - tb
        return Pinned(list(keys[lo:lo + n]), [(g[1], g[2]) for g in got[:n]], lo)

    def into_pages(self, p: Pinned, page_ids, layer: int | None = None) -> None:
        """Copies the pinned blocks into their pages (block i of the
        sequence into pages page_ids[i*ppb .. (i+1)*ppb)): whole, or only
        model layer `layer` (can_copy_layers must hold). Asynchronous on
        CUDA (the current stream): release() waits for it."""
        if layer is None:
            self._into_pages(p.blocks, page_ids, p.first)
        else:
            self.layer_into_pages(p.blocks, page_ids, p.first, layer)

    def release(self, p: Pinned) -> None:
        """Drops the pins of p once the copies that read the blocks are
        done (on CUDA: waits for the current stream). A connection already
        gone took its pins with it: logged, not raised."""
        if not p.keys:
            return
        self.sync()
        try:
            self.client.release(p.keys)
        except KvError as e:
            log.warning("kvcached release of %d blocks: %s", len(p.keys), e)

    def sync(self) -> None:
        """Waits for this layout's copies in flight (CUDA: the current
        stream; nothing on the host)."""
        self._sync()

    def _verify(self, ka, out, got, n: int, lo: int, keys, page_ids, res: LoadResult,
                ready=None) -> int:
        """Checks blocks [0, n) of a LOAD (kvc_verify: each against its
        committed CRC, in place, on the CPU). Returns how many leading
        blocks passed; the first that failed was reported (its pin went
        with the report) and is listed in res.failed. ready: see
        load_pinned."""
        h = self.client._handle()
        for a, b, passed in self._crc_chunks(out, n):
            for j in range(a, b):
                if passed[j - a]:
                    continue
                rc = self._L.kvc_verify(h, ctypes.byref(ka[j]), ctypes.byref(out[j]))
                if rc == 0 or (rc == -errno.EOPNOTSUPP and got[j][1] == G1):
                    continue  # G1 on a real GPU: device memory the CPU cannot check
                if rc == KV_ECORRUPT:
                    res.failed.append((lo + j, KvError(rc, "verify", keys[lo + j].hex())))
                    res.failed_pages += page_ids[(lo + j) * self.ppb:(lo + j + 1) * self.ppb]
                    if ready is not None and j > a:
                        ready(lo + a, [(g[1], g[2]) for g in got[a:j]])
                    return j
                raise KvError(rc, "verify", "the daemon sent no CRC to check (before protocol "
                              "1.2): PagedKV(verify=False) uses blocks unverified"
                              if rc == -errno.EOPNOTSUPP else keys[lo + j].hex())
            if ready is not None:
                ready(lo + a, [(g[1], g[2]) for g in got[a:b]])
        return n

    def _crc_chunks(self, out, n: int):
        """Yields (a, b, passed) for consecutive runs [a, b) of blocks
        [0, n) of a LOAD, in order: passed[j - a] when block j is a G2 block
        whose bytes match its committed CRC. With verify_threads > 1 the
        runs (about four per thread) are computed by pool threads, the
        first ones first (kvc_crc32c is a pure function, and ctypes lets go
        of the GIL while it runs). A block not passed here (another tier,
        no CRC, a mismatch) goes through kvc_verify, which checks it again
        and reports a failure."""
        rows = [(out[j].ptr, out[j].length, out[j].crc)
                if out[j].status == 0 and out[j].tier == G2 and out[j].has_crc and out[j].ptr
                else None for j in range(n)]
        crc = self._L.kvc_crc32c

        def scan(a: int, b: int) -> list[bool]:
            return [r is not None and crc(0, r[0], r[1]) == r[2] for r in rows[a:b]]

        t = min(self.verify_threads, n)
        if t <= 1:
            yield 0, n, scan(0, n)
            return
        step = -(-n // (4 * t))
        pool = _pool(t)
        runs = [(a, min(a + step, n), pool.submit(scan, a, min(a + step, n)))
                for a in range(0, n, step)]
        try:
            for a, b, f in runs:
                yield a, b, f.result()
        finally:  # a failure ends the prefix: what is not started is not needed
            for _, _, f in runs:
                f.cancel()


_pool_lock = threading.Lock()
_pool_exec: ThreadPoolExecutor | None = None
_pool_size = 0


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool of verify threads for the process, grown to the largest
    verify_threads asked for (a replaced pool finishes what it was given)."""
    global _pool_exec, _pool_size
    with _pool_lock:
        if _pool_size < threads:
            old, _pool_exec, _pool_size = _pool_exec, ThreadPoolExecutor(threads, "kvclient-verify"), threads
            if old is not None:
                old.shutdown(wait=False)
        return _pool_exec


def _ranges(got, n: int, per: int):
    """(filled, holes): the token ranges [a, b) of blocks 0..n-1 (per tokens
    each) that are in got (sorted block indices), and those that are not."""
    filled, holes, at = [], [], 0
    for i in got:
        if i > at:
            holes.append((at * per, i * per))
        if filled and filled[-1][1] == i * per:
            filled[-1] = (filled[-1][0], (i + 1) * per)
        else:
            filled.append((i * per, (i + 1) * per))
        at = i + 1
    if at < n:
        holes.append((at * per, n * per))
    return filled, holes


def _tolist(x):
    return x.tolist() if hasattr(x, "tolist") else list(x)
