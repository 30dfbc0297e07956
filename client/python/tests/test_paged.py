"""kvclient.paged against a real kvcached, torch on CPU: every layout writes
the block format of cuda/kernels.h byte for byte, a block written through
one layout is read through another, loads fail closed, saves count what
others stored.

The vLLM and SGLang layouts are tensors of the shapes those engines keep
(vLLM: AttentionBackend.get_kv_cache_shape, FlashAttention's (2, blocks,
block_size, kv_heads, head_size) and FlashInfer's (blocks, 2, ...); SGLang:
mem_cache/memory_pool.py and memory_pool_host.py), built here: neither
engine runs in these tests."""
import pytest

torch = pytest.importorskip("torch")

from kvclient import G2, Client  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402

L, T, H, D, NP = 3, 4, 2, 8, 16  # layers, page tokens, kv heads, head dim, pages


def vllm_caches(dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, NP, T, H, D, generator=g).to(dtype) for _ in range(L)]


def block_ref(k_of, v_of, pages):
    """The kernels.h format for a block of `pages` (pages_per_block of them):
    per page, per layer, K then V, each [T][H][D] contiguous."""
    out = []
    for p in pages:
        for l in range(L):
            out += [k_of(l, p).contiguous().view(torch.uint8).flatten(),
                    v_of(l, p).contiguous().view(torch.uint8).flatten()]
    return torch.cat(out)


def open_for(daemon, layout, ppb=1, **kw):
    return Client(daemon.socket, tenant="t", layout=layout.client_layout(ppb), **kw)


def tokens(n, base=0):
    return list(range(base, base + n))


@pytest.mark.parametrize("ppb", [1, 2])
def test_vllm_save_writes_the_kernels_h_block_format(daemon, ppb):
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    assert lay.page_block_bytes == L * 2 * T * H * D * 2
    pages = [5, 2, 9, 0, 11, 3, 7, 1]  # shuffled: a real page table
    toks = tokens(8 * T)
    with open_for(daemon, lay, ppb) as c:
        pk = PagedKV(c, lay, pages_per_block=ppb)
        r = pk.save(toks, pages)
        assert (r.blocks, r.stored, r.existed, r.failed) == (8 // ppb, 8 // ppb, 0, [])
        with c.load(pk.keys(toks)) as got:
            for i, b in enumerate(got.blocks):
                want = block_ref(lambda l, p: kv[l][0, p], lambda l, p: kv[l][1, p],
                                 pages[i * ppb:(i + 1) * ppb])
                assert torch.equal(b.torch(), want), f"block {i}"


def test_every_layout_reads_what_another_wrote(daemon):
    """vLLM writes; page-major, SGLang and a from_pages view of separate K/V
    allocations read the same blocks into their own page tables."""
    kv = vllm_caches(torch.bfloat16)
    src = PagedLayout.vllm(kv)
    pages = [3, 8, 1, 12]
    toks = tokens(4 * T + 1)
    with open_for(daemon, src) as c:
        assert PagedKV(c, src).save(toks, pages).stored == 4
    pm = [torch.zeros(NP, 2, T, H, D, dtype=torch.bfloat16) for _ in range(L)]
    kb = [torch.zeros(NP * T, H, D, dtype=torch.bfloat16) for _ in range(L)]
    vb = [torch.zeros(NP * T, H, D, dtype=torch.bfloat16) for _ in range(L)]
    for lay, k_of, v_of in (
            (PagedLayout.page_major(pm), lambda l, p: pm[l][p, 0], lambda l, p: pm[l][p, 1]),
            (PagedLayout.sglang(kb, vb, T), lambda l, p: kb[l][p * T:(p + 1) * T],
             lambda l, p: vb[l][p * T:(p + 1) * T])):
        assert lay.client_layout() == src.client_layout()
        dst_pages = [15, 0, 7, 4]
        with open_for(daemon, lay) as c:
            r = PagedKV(c, lay).load(toks, dst_pages)
        assert (r.tokens, r.blocks, r.hit, r.failed) == (4 * T, 4, 4, [])
        assert r.tiers == [G2] * 4
        for i in range(4):
            for l in range(L):
                assert torch.equal(k_of(l, dst_pages[i]), kv[l][0, pages[i]])
                assert torch.equal(v_of(l, dst_pages[i]), kv[l][1, pages[i]])


def cpu_caches(dtype=torch.float32, seed=1):
    """vLLM's CPU backend (vLLM 0.32, CPUAttentionBackend): per layer
    [pages, heads, T, 2*D], read as [pages, heads, 2*T, D] with each
    head's K rows first, then its V rows."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(NP, H, T, 2 * D, generator=g).to(dtype) for _ in range(L)]


def cpu_k(c, l, p):
    """[T, H, D] of layer l's K in page p, as the CPU backend reads it."""
    return c[l][p].view(H, 2 * T, D)[:, :T].transpose(0, 1)


def cpu_v(c, l, p):
    return c[l][p].view(H, 2 * T, D)[:, T:].transpose(0, 1)


@pytest.mark.parametrize("ppb", [1, 2])
def test_vllm_cpu_layout_is_the_same_block_format_both_ways(daemon, ppb):
    """A block saved from the CPU backend's heads-major pages is the
    kernels.h format and scatters into a FlashAttention-layout cache of the
    same model byte for byte; a block saved from that cache scatters back
    into CPU pages, whole and one layer at a time."""
    cpu = cpu_caches()
    lay = PagedLayout.vllm_cpu(cpu)
    gpu_like = [torch.zeros(2, NP, T, H, D) for _ in range(L)]
    glay = PagedLayout.vllm(gpu_like)
    assert lay.client_layout(ppb) == glay.client_layout(ppb)
    pages, dst = [5, 2, 9, 0, 11, 3, 7, 1], [1, 3, 5, 7, 9, 11, 13, 15]
    toks = tokens(8 * T + 1)
    with open_for(daemon, lay, ppb) as c:
        pk = PagedKV(c, lay, pages_per_block=ppb)
        assert pk.save(toks, pages).stored == 8 // ppb
        with c.load(pk.keys(toks)) as got:
            for i, b in enumerate(got.blocks):
                want = block_ref(lambda l, p: cpu_k(cpu, l, p), lambda l, p: cpu_v(cpu, l, p),
                                 pages[i * ppb:(i + 1) * ppb])
                assert torch.equal(b.torch(), want), f"block {i}"
        r = PagedKV(c, glay, pages_per_block=ppb).load(toks, dst)
        assert r.tokens == 8 * T
        for l in range(L):
            for s, d in zip(pages, dst):
                assert torch.equal(gpu_like[l][0, d], cpu_k(cpu, l, s)), (l, s)
                assert torch.equal(gpu_like[l][1, d], cpu_v(cpu, l, s)), (l, s)
        # and back: into fresh CPU pages, whole, then layer by layer
        back = [torch.zeros_like(t) for t in cpu]
        blay = PagedLayout.vllm_cpu(back)
        bk = PagedKV(c, blay, pages_per_block=ppb)
        assert bk.load(toks, dst).tokens == 8 * T
        for l in range(L):
            for s, d in zip(pages, dst):
                assert torch.equal(back[l][d], cpu[l][s]), (l, s)
        one = [torch.zeros_like(t) for t in cpu]
        ok = PagedKV(c, PagedLayout.vllm_cpu(one), pages_per_block=ppb)
        p = ok.load_pinned(ok.keys(toks), 0, 8 // ppb, dst)
        ok.into_pages(p, dst, layer=1)
        ok.release(p)
        for s, d in zip(pages, dst):
            assert torch.equal(one[1][d], cpu[1][s]) and not one[0][d].any(), s


def test_vllm_cpu_layout_refuses_other_shapes():
    with pytest.raises(ValueError, match="2\\*D"):
        PagedLayout.vllm_cpu([torch.zeros(NP, H, T, 2 * D + 1)])
    with pytest.raises(ValueError, match="2\\*D"):
        PagedLayout.vllm_cpu([torch.zeros(2, NP, T, H, D)])


def test_sglang_host_layouts_read_what_vllm_wrote(daemon):
    """SGLang's HiCache host pools: layer_first [2, L, tokens, H, D] and
    page_first_direct [2, pages, L, T, H, D] read the blocks a vLLM layout
    wrote; page_first (layers inside each token) is refused with the reason."""
    kv = vllm_caches(torch.bfloat16, seed=4)
    src = PagedLayout.vllm(kv)
    pages = [2, 7, 11]
    toks = tokens(3 * T + 1, 900)
    with open_for(daemon, src) as c:
        assert PagedKV(c, src).save(toks, pages).stored == 3
    lf = torch.zeros(2, L, NP * T, H, D, dtype=torch.bfloat16)
    pfd = torch.zeros(2, NP, L, T, H, D, dtype=torch.bfloat16)
    for lay, k_of, v_of in (
            (PagedLayout.sglang_host(lf, "layer_first", T),
             lambda l, p: lf[0, l, p * T:(p + 1) * T], lambda l, p: lf[1, l, p * T:(p + 1) * T]),
            (PagedLayout.sglang_host(pfd, "page_first_direct", T),
             lambda l, p: pfd[0, p, l], lambda l, p: pfd[1, p, l])):
        assert lay.client_layout() == src.client_layout()
        with open_for(daemon, lay) as c:
            assert PagedKV(c, lay).load(toks, [5, 0, 9]).tokens == 3 * T
        for i, p in enumerate([5, 0, 9]):
            for l in range(L):
                assert torch.equal(k_of(l, p), kv[l][0, pages[i]])
                assert torch.equal(v_of(l, p), kv[l][1, pages[i]])
    with pytest.raises(ValueError, match="page_first_direct"):
        PagedLayout.sglang_host(torch.zeros(2, NP * T, L, H, D), "page_first", T)


def test_mla_in_sglang_host_layouts(daemon):
    lat = 16
    g = torch.Generator().manual_seed(6)
    src = [torch.randn(NP, T, lat, generator=g).half() for _ in range(L)]
    a = PagedLayout.mla(src)
    pfd = torch.zeros(NP, L, T, 1, lat).half()  # SGLang MLA page_first_direct
    lf = torch.zeros(L, NP * T, 1, lat).half()  # SGLang MLA layer_first
    toks = tokens(2 * T + 3, 77)
    with open_for(daemon, a) as c:
        assert PagedKV(c, a).save(toks, [3, 12]).stored == 2
    for lay, got in ((PagedLayout.sglang_host(pfd, "page_first_direct", T, mla=True),
                      lambda l, p: pfd[p, l, :, 0]),
                     (PagedLayout.sglang_host(lf, "layer_first", T, mla=True),
                      lambda l, p: lf[l, p * T:(p + 1) * T, 0])):
        assert lay.client_layout() == a.client_layout()
        with open_for(daemon, lay) as c:
            assert PagedKV(c, lay).load(toks, [1, 8]).tokens == 2 * T
        for l in range(L):
            assert torch.equal(got(l, 1), src[l][3]) and torch.equal(got(l, 8), src[l][12])


def test_separate_k_v_allocations_use_split_halves():
    """K and V in allocations at different distances per layer (SGLang's
    per-layer buffers): the layout still describes them, with 2L kernel
    layers whose halves are the first and second half of each part."""
    kb = [torch.zeros(NP * T, H, D) for _ in range(L)]
    vb = [torch.zeros(NP * T, H, D) for _ in range(L)]
    lay = PagedLayout.sglang(kb, vb, T)
    assert len(lay.bases) in (L, 2 * L)
    assert lay.page_block_bytes == L * 2 * T * H * D * 4


def test_mla_latent_blocks_round_trip(daemon):
    lat = 24
    g = torch.Generator().manual_seed(3)
    src = [torch.randn(NP, T, lat, generator=g).half() for _ in range(L)]
    dst = [torch.zeros(NP, T, 1, lat).half() for _ in range(L)]
    a, b = PagedLayout.mla(src), PagedLayout.mla(dst)
    assert a.client_layout().kv_heads == 1 and a.client_layout().head_dim == lat
    assert a.page_block_bytes == L * T * lat * 2
    toks = tokens(3 * T + 2)
    with open_for(daemon, a) as c:
        pk = PagedKV(c, a)
        assert pk.save(toks, [4, 9, 2]).stored == 3
        with c.load(pk.keys(toks)) as got:  # per layer, the page's latents
            assert torch.equal(got.blocks[1].torch(),
                               torch.cat([src[l][9].reshape(-1).view(torch.uint8) for l in range(L)]))
    with open_for(daemon, b) as c:
        r = PagedKV(c, b).load(toks, [0, 1, 2])
    assert r.tokens == 3 * T
    for l in range(L):
        for i, p in enumerate([4, 9, 2]):
            assert torch.equal(dst[l][i, :, 0], src[l][p])


def test_load_leaves_the_last_token_and_respects_max_tokens(daemon):
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    toks = tokens(4 * T)
    with open_for(daemon, lay) as c:
        pk = PagedKV(c, lay)
        pk.save(toks, [0, 1, 2, 3])
        assert pk.load(toks, [4, 5, 6, 7]).tokens == 3 * T  # the engine computes the last
        assert pk.load(toks, [4, 5, 6, 7], max_tokens=4 * T).tokens == 4 * T
        assert pk.load(toks, [4, 5, 6, 7], max_tokens=2 * T - 1).tokens == T
        assert pk.load(tokens(4 * T, 1), [4, 5, 6, 7]).tokens == 0  # other tokens: no hit


def test_a_block_gone_between_lookup_and_load_ends_the_prefix(daemon):
    """Fail closed: the block evicted (here: deleted by another worker) after
    LOOKUP comes back KV_ENOTFOUND from LOAD; the engine gets the blocks
    before it, the failed block's pages, and its later pages untouched."""
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    toks = tokens(6 * T + 1)
    with open_for(daemon, lay) as c, open_for(daemon, lay) as other:
        pk = PagedKV(c, lay)
        pk.save(toks, [0, 1, 2, 3, 4, 5])
        keys = pk.keys(toks)
        look = c.lookup

        def lookup_then_lose_block_3(ks):
            r = look(ks)
            assert other.delete([keys[3]]) == 1
            return r
        c.lookup = lookup_then_lose_block_3
        for t in kv:
            t[:, 6:].fill_(-7.0)  # poison the destination pages
        dst = [6, 7, 8, 9, 10, 11]
        r = pk.load(toks, dst)
        assert (r.hit, r.blocks, r.tokens) == (6, 3, 3 * T)
        assert [i for i, _ in r.failed] == [3]
        assert r.failed[0][1].name == "KV_ENOTFOUND"
        assert r.failed_pages == [9]
        for l in range(L):
            for i in range(3):
                assert torch.equal(kv[l][:, dst[i]], kv[l][:, i])
            assert bool((kv[l][:, 9:12] == -7.0).all())  # nothing written past the failure
        assert daemon.metric("kvcached_pinned_blocks") == 0  # every pin released
        assert other.status()["g2"]["blocks"] == 5


@pytest.mark.parametrize("load_batch", [4096, 2])
def test_holes_load_every_block_found_and_report_the_rest(daemon, load_batch):
    """load(holes=True): block 1 deleted before the LOOKUP (a hole it
    sees), block 4 lost between LOOKUP and LOAD (KV_ENOTFOUND) and block 6
    scribbled (KV_ECORRUPT): every other block lands in its own pages, the
    three holes' pages stay untouched, filled and holes say which tokens
    are which, and every pin is released. In LOADs of 2 blocks too."""
    kv = vllm_caches(seed=3)
    lay = PagedLayout.vllm(kv)
    toks = tokens(8 * T + 1)
    with open_for(daemon, lay) as c, open_for(daemon, lay) as other:
        pk = PagedKV(c, lay, load_batch=load_batch)
        assert pk.save(toks, list(range(8))).stored == 8
        keys = pk.keys(toks)
        assert other.delete([keys[1]]) == 1
        scribble(daemon, lay, keys[6])
        look = c.lookup

        def lookup_then_lose_block_4(ks, **kw):
            r = look(ks, **kw)
            assert other.delete([keys[4]]) == 1
            return r
        c.lookup = lookup_then_lose_block_4
        for t in kv:
            t[:, 8:].fill_(-5.0)
        dst = list(range(8, 16))
        r = pk.load(toks, dst, holes=True)
        assert (r.hit, r.blocks, r.tokens, r.loaded) == (1, 1, T, 5)
        assert sorted((i, e.name) for i, e in r.failed) == [(4, "KV_ENOTFOUND"),
                                                            (6, "KV_ECORRUPT")]
        assert r.filled == [(0, T), (2 * T, 4 * T), (5 * T, 6 * T), (7 * T, 8 * T)]
        assert r.holes == [(T, 2 * T), (4 * T, 5 * T), (6 * T, 7 * T)]
        for l in range(L):
            for i in (0, 2, 3, 5, 7):
                assert torch.equal(kv[l][:, dst[i]], kv[l][:, i])
            for i in (1, 4, 6):
                assert bool((kv[l][:, dst[i]] == -5.0).all())
        assert daemon.metric("kvcached_pinned_blocks") == 0
        c.lookup = look
        # without holes: the leading run, as before
        r = pk.load(toks, dst)
        assert (r.blocks, r.loaded, r.filled, r.holes) == (1, 1, [], [])


def scribble(daemon, lay, key, at=10):
    """A worker of the tenant writes into a committed block through its own
    G2 mapping: nothing in the daemon can stop it."""
    import ctypes
    with open_for(daemon, lay) as w, w.load([key]) as got:
        ctypes.memset(got.blocks[0].ptr + at, 0x7f, 4)


@pytest.mark.parametrize("threads", [1, 4])
def test_a_scribbled_block_ends_the_prefix_and_is_reported(daemon, threads):
    """Fail closed on bytes a worker changed after the commit: the block is
    checked before it is copied into the pages, ends the usable prefix like
    a missing block, is reported (the daemon confirms and drops it), and no
    page from it on is written. With one verify thread and with several
    (block 2 then lies in the second thread's share)."""
    kv = vllm_caches(seed=2)
    lay = PagedLayout.vllm(kv)
    toks = tokens(5 * T + 1)
    with open_for(daemon, lay) as c:
        pk = PagedKV(c, lay, verify_threads=threads)
        assert pk.save(toks, [0, 1, 2, 3, 4]).stored == 5
        keys = pk.keys(toks)
        scribble(daemon, lay, keys[2])
        for t in kv:
            t[:, 5:].fill_(-3.0)
        dst = [5, 6, 7, 8, 9]
        r = pk.load(toks, dst)
        assert (r.hit, r.blocks, r.tokens) == (5, 2, 2 * T)
        assert [(i, e.name) for i, e in r.failed] == [(2, "KV_ECORRUPT")]
        assert r.failed_pages == [7]
        for l in range(L):
            for i in range(2):
                assert torch.equal(kv[l][:, dst[i]], kv[l][:, i])
            assert bool((kv[l][:, 7:10] == -3.0).all())  # nothing from the bad block on
        assert daemon.metric("kvcached_pinned_blocks") == 0
        assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1
        assert c.lookup(keys)[0] == 2  # dropped: the engine recomputes and saves it again
        assert pk.save(toks, [0, 1, 2, 3, 4]).stored == 1
        assert pk.load(toks, dst).blocks == 5


def test_verify_shares_the_pass_among_threads(daemon):
    """verify_threads > 1: the CRCs of a LOAD's G2 blocks are computed by
    pool threads, not the caller's, and each run of blocks that passed is
    copied into the pages while later runs are checked; two scribbled
    blocks in different runs: the first ends the prefix, nothing from it
    on is copied, and only it is reported."""
    import threading
    kv = vllm_caches(seed=4)
    lay = PagedLayout.vllm(kv)
    toks = tokens(8 * T + 1)
    with open_for(daemon, lay) as c:
        pk = PagedKV(c, lay, verify_threads=4)
        assert pk.save(toks, list(range(8))).stored == 8
        seen, lock = set(), threading.Lock()
        both = threading.Barrier(2, timeout=10)

        class Lib:  # the library; the first two threads of kvc_crc32c meet
            def __init__(self, lib):  # (one thread doing it all times out)
                self._lib = lib

            def kvc_crc32c(self, *a):
                with lock:
                    new = threading.get_ident() not in seen
                    seen.add(threading.get_ident())
                    k = len(seen)
                if new and k <= 2:
                    both.wait()
                return self._lib.kvc_crc32c(*a)

            def __getattr__(self, name):
                return getattr(self._lib, name)

        pk._L = Lib(pk._L)
        runs = []  # the copies, started run by run as runs pass
        into = pk._into_pages
        pk._into_pages = lambda blocks, pages, first: (runs.append((first, len(blocks))),
                                                       into(blocks, pages, first))
        r = pk.load(toks, list(range(8, 16)))
        assert (r.blocks, r.failed) == (8, [])
        assert len(seen) >= 2 and threading.get_ident() not in seen
        assert len(runs) > 1 and [f for f, _ in runs] == \
            [sum(k for _, k in runs[:i]) for i in range(len(runs))] and sum(k for _, k in runs) == 8
        for l in range(L):
            for i in range(8):
                assert torch.equal(kv[l][:, 8 + i], kv[l][:, i])
        keys = pk.keys(toks)
        scribble(daemon, lay, keys[6])
        scribble(daemon, lay, keys[3])
        runs.clear()
        r = pk.load(toks, list(range(8, 16)))
        assert (r.blocks, [(i, e.name) for i, e in r.failed]) == (3, [(3, "KV_ECORRUPT")])
        assert sum(k for _, k in runs) == 3  # nothing copied from the failed block on
        assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1
        assert daemon.metric("kvcached_pinned_blocks") == 0


def test_verify_false_uses_blocks_as_found(daemon):
    """The documented opt-out: no CPU pass, the bytes are used as they are."""
    kv = vllm_caches(seed=3)
    lay = PagedLayout.vllm(kv)
    toks = tokens(2 * T + 1)
    with open_for(daemon, lay) as c:
        assert PagedKV(c, lay).save(toks, [0, 1]).stored == 2
        scribble(daemon, lay, PagedKV(c, lay).keys(toks)[1])
        r = PagedKV(c, lay, verify=False).load(toks, [2, 3])
        assert (r.blocks, r.failed) == (2, [])
        assert "verify" in r.timings and r.timings["verify"] == 0.0
        assert daemon.metric("kvcached_corrupt_reported_total") == 0


def test_save_counts_what_is_present_and_what_others_store(daemon):
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    toks = tokens(4 * T)
    with open_for(daemon, lay) as a, open_for(daemon, lay) as b:
        pa, pb = PagedKV(a, lay), PagedKV(b, lay)
        assert pa.save(toks[:2 * T], [0, 1]).stored == 2
        keys = pa.keys(toks)
        # b is writing block 3 (allocated, not committed) while a saves all
        with b.alloc([keys[3]], parents=[keys[2]]) as pending:
            r = pa.save(toks, [0, 1, 2, 3])
            assert (r.blocks, r.present, r.stored, r.existed, r.failed) == (4, 2, 1, 1, [])
            pending.abort()
        r = pa.save(toks, [0, 1, 2, 3])  # block 3 is free again
        assert (r.present, r.stored) == (3, 1)
        assert pa.save(toks, [0, 1, 2, 3]).stored == 0
        assert pb.load(toks, [4, 5, 6, 7], max_tokens=4 * T).tokens == 4 * T


def test_blocks_map_to_their_pages_and_kernel_blocks(daemon):
    """The mapping every copy path uses (CPU, G1, zero-copy and staged G2):
    sequence block i covers pages page_ids[i*ppb .. (i+1)*ppb), each a
    kernels.h block at its offset inside the kvcached block, for blocks
    that need not be consecutive (a save skips what others stored)."""
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    pages = [9, 4, 7, 1, 12, 0, 3, 5]
    with open_for(daemon, lay, 2) as c:
        pk = PagedKV(c, lay, pages_per_block=2)
        pb = lay.page_block_bytes
        assert pk._page_ptrs([1000, 5000], pages, [1, 3]) == \
            ([7, 1, 3, 5], [1000, 1000 + pb, 5000, 5000 + pb])
    with open_for(daemon, lay) as c:
        assert PagedKV(c, lay)._page_ptrs([10, 20, 30], pages, range(2, 5)) == \
            ([7, 1, 12], [10, 20, 30])


def test_layouts_and_arguments_are_checked(daemon):
    kv = vllm_caches()
    lay = PagedLayout.vllm(kv)
    with pytest.raises(ValueError):
        PagedLayout.vllm([torch.zeros(NP, 2, T, H, D)])
    with pytest.raises(ValueError):  # pages not contiguous
        PagedLayout.from_pages([kv[0][0].transpose(1, 2)], [kv[0][1].transpose(1, 2)])
    with open_for(daemon, lay, 2) as c:
        with pytest.raises(ValueError):
            PagedKV(c, lay)  # the client says 2 pages per block
    with open_for(daemon, lay) as c:
        pk = PagedKV(c, lay)
        with pytest.raises(ValueError):
            pk.save(tokens(3 * T), [0, 1])  # too few pages
        with pytest.raises(ValueError):
            pk.save(tokens(T), [NP])  # no such page
        with pytest.raises(ValueError):
            pk.load(tokens(3 * T), [0, 1, 2], tier=0)  # G1 with an engine on the CPU


def test_a_worker_killed_mid_save_leaves_nothing_visible(daemon, tmp_root):
    """A worker that dies between ALLOC and COMMIT (kill -9, mid-gather):
    none of its blocks is visible, and the keys can be stored again."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    from conftest import HERE
    code = textwrap.dedent(f"""
        import os, sys, time, torch
        sys.path.insert(0, {os.path.join(HERE, '..')!r})
        from kvclient import Client
        from kvclient.paged import PagedKV, PagedLayout
        kv = [torch.ones(2, {NP}, {T}, {H}, {D}, dtype=torch.float16) for _ in range({L})]
        lay = PagedLayout.vllm(kv)
        c = Client({daemon.socket!r}, tenant="t", layout=lay.client_layout())
        pk = PagedKV(c, lay)
        real = pk._from_pages
        def stuck(*a):
            real(*a)                       # half the work: bytes written, no COMMIT
            print("written", flush=True)
            time.sleep(60)
        pk._from_pages = stuck
        pk.save(list(range({4 * T})), [0, 1, 2, 3])
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "written"
    lay = PagedLayout.vllm(vllm_caches())
    with open_for(daemon, lay) as c:
        pk = PagedKV(c, lay)
        keys = pk.keys(tokens(4 * T))
        assert c.lookup(keys)[0] == 0
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert c.lookup(keys)[0] == 0
        # the slots are freed with the connection; the daemon sees the
        # hang-up on its loop, so until then the keys are "being written"
        import time
        deadline = time.monotonic() + 5
        while True:
            r = pk.save(tokens(4 * T), [0, 1, 2, 3])
            if r.present + r.stored == 4:
                break
            assert time.monotonic() < deadline and not r.failed, r
            time.sleep(0.01)
        assert c.lookup(keys)[0] == 4


def _layouts(NP=8, H=2, D=8, L=3, T=4):
    g = torch.Generator().manual_seed(5)
    vl = [torch.randn(2, NP, T, H, D, generator=g) for _ in range(L)]
    pm = [torch.randn(NP, 2, T, H, D, generator=g) for _ in range(L)]
    big = torch.randn(4 * L, NP, T, H, D, generator=g)  # K to V: 1 region in even layers, 2 in odd
    ml = [torch.randn(NP, T, 24, generator=g) for _ in range(L)]
    cpu = [torch.randn(NP, H, T, 2 * D, generator=g) for _ in range(L)]
    split = PagedLayout.from_pages([big[3 * l] for l in range(L)],
                                   [big[3 * l + 1 + l % 2] for l in range(L)])
    assert len(split.bases) == 2 * L
    return {"vllm": (PagedLayout.vllm(vl), vl), "page_major": (PagedLayout.page_major(pm), pm),
            "split": (split, [big]), "mla": (PagedLayout.mla(ml), ml),
            "vllm_cpu": (PagedLayout.vllm_cpu(cpu), cpu)}


@pytest.mark.parametrize("ppb", [1, 2])
@pytest.mark.parametrize("kind", ["vllm", "page_major", "split", "mla", "vllm_cpu"])
def test_layer_into_pages_is_the_whole_block_copy_layer_by_layer(daemon, kind, ppb):
    """kvclient.paged's per-layer copy (what kvclient.vllm's
    wait_for_layer_load uses): for every layout the connector may get, layer l of a block lands in layer
    l's pages and nowhere else, and all layers together give the bytes of
    the whole-block copy."""
    lay, tensors = _layouts()[kind]
    nblk = 3
    g = torch.Generator().manual_seed(7)
    # floats, not random bytes (a NaN would not equal itself)
    blocks = torch.randn(nblk, lay.page_block_bytes * ppb // 4, generator=g).view(torch.uint8)
    bl = [(G2, int(blocks[i].data_ptr())) for i in range(nblk)]
    pages = [5, 1, 7, 0, 3, 6, 2, 4][:(nblk + 1) * ppb]
    with Client(daemon.socket, tenant="t", layout=lay.client_layout(ppb)) as c:
        pk = PagedKV(c, lay, pages_per_block=ppb)
        assert pk.can_copy_layers(bl)
        for t in tensors:
            t.zero_()
        pk._into_pages(bl, pages, 1)  # blocks 1..3 of the sequence
        whole = [t.clone() for t in tensors]
        for t in tensors:
            t.zero_()
        for l in range(lay.model_layers):
            before = [t.clone() for t in tensors]
            pk.layer_into_pages(bl, pages, 1, l)
            changed = [not torch.equal(a, b) for a, b in zip(before, tensors)]
            if kind not in ("split",):  # one tensor per layer: only layer l's moved
                assert changed == [i == l for i in range(len(tensors))]
    for a, b in zip(whole, tensors):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
