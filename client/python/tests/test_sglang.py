"""kvclient.sglang.KvcachedStorage, SGLang's HiCache storage backend, driven
as SGLang drives it, with the reference engine's logits as the judge.

SGLang is not installed here: tests/sglang_shim.py stands in for the parts
of SGLang the backend meets, following sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44 (hicache_storage.py,
storage/backend_factory.py, managers/cache_controller.py, pool_host/mha.py;
the shim's docstring says what each part mirrors). The calls are SGLang's:
the dynamic factory's class(storage_config, kwargs) then
register_mem_pool_host(host pool); batch_exists over batches of 128 page
hashes; batch_get_v1 / batch_set_v1 with the host pool's token indices
(page-aligned, len(keys) * page_size) and prefix_keys; the flat-page
get/batch_get/batch_set when "interface_v1" is off. What was not run: the
backend inside a real SGLang server.
"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import HERE  # noqa: E402
from test_engine import NEW, PREFIX, T, assert_exact, prompt, recompute, rel, run_worker  # noqa: E402

import sglang_shim  # noqa: E402

sglang_shim.install()

from kvclient import Client  # noqa: E402
from kvclient.sglang import KvcachedStorage, page_key  # noqa: E402

CFG_L, CFG_H, CFG_D = 2, 2, 32   # the tiny preset's layers, KV heads, head dim


def sg_worker(tmp, daemon, **spec):
    """Runs sglang_worker.py in a process of its own; its result dict."""
    spec = {"socket": daemon.socket, "page_tokens": T, "new_tokens": NEW, **spec}
    return run_worker(tmp, "sglang_worker.py", spec)


@pytest.fixture
def work(tmp_root):
    d = os.path.join(tmp_root, "work")
    os.makedirs(d)
    return d


def backend_for(daemon, layout="layer_first", size_pages=32, tp=(0, 1), metrics=False, **more):
    pool = sglang_shim.HostPool(CFG_L, CFG_H, CFG_D, size=size_pages * T, page_size=T,
                                layout=layout)
    conf = sglang_shim.storage_config(sglang_shim.extra_config(daemon.socket, **more),
                                      layout=layout, tp_rank=tp[0], tp_size=tp[1],
                                      metrics=metrics)
    backend, zero_copy = sglang_shim.create_dynamic_backend(conf, pool)
    assert isinstance(backend, KvcachedStorage) and zero_copy == bool(more.get("interface_v1", 1))
    return backend, pool


def fill(pool, hidx, seed):
    """Random KV in the host pages at hidx; their contents, page by page."""
    g = torch.Generator().manual_seed(seed)
    got = []
    for i in range(0, len(hidx), T):
        hp = int(hidx[i]) // T
        page = []
        for kv in (0, 1):
            for l in range(CFG_L):
                v = pool.page(kv, l, hp)
                v.copy_(torch.randn(v.shape, generator=g))
                page.append(v.clone())
        got.append(page)
    return got


def page_data(pool, hp):
    return [pool.page(kv, l, hp).clone() for kv in (0, 1) for l in range(CFG_L)]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def keys_of(n, seed=7):
    g = torch.Generator().manual_seed(seed)
    return sglang_shim.get_hash_str(torch.randint(0, 500, (n * T,), generator=g).tolist(), None, T)


# --- the import -------------------------------------------------------------------
def test_import_without_sglang_names_the_engine():
    code = ("import kvclient\n"
            "try:\n    import kvclient.sglang\nexcept ImportError as e:\n    print('IE', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.join(HERE, ".."), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("IE") and "SGLang" in r.stdout


# --- the prefix between two engine processes ------------------------------------------
def test_prefix_moves_between_two_workers_and_matches_recompute(daemon, work):
    a = sg_worker(work, daemon, prompt=prompt(1), save=True, layout="layer_first")
    assert a["stored"] == 7 * T  # 117 tokens: 7 full pages
    assert_exact(a, prompt(1))
    # another worker, another host layout: the shared prefix of 6 pages
    b = sg_worker(work, daemon, prompt=prompt(2), load=True, layout="page_first_direct",
                  host_skip=5)
    assert (b["hit"], b["loaded"]) == (6, PREFIX)
    assert b["get_results"] == [[True] * 6]
    assert_exact(b, prompt(2))
    # the flat-page interface (interface_v1 off), a page_first pool
    c = sg_worker(work, daemon, prompt=prompt(1), load=True, layout="page_first",
                  interface_v1=0)
    assert c["loaded"] == 7 * T
    assert_exact(c, prompt(1))


def test_a_corrupted_block_is_recomputed_and_output_stays_exact(daemon, work):
    sg_worker(work, daemon, prompt=prompt(1), save=True)
    backend, _ = backend_for(daemon)
    key = page_key(sglang_shim.get_hash_str(prompt(1), None, T)[2])
    scale_block(backend.client, key)
    # the judge sees it: loaded unchecked, the changed page changes the output
    u = sg_worker(work, daemon, prompt=prompt(2), load=True, verify=False)
    assert u["loaded"] == PREFIX and rel(u["logits"], recompute(prompt(2))[0]) > 1e-3
    # checked (the default): False for that page, and SGLang recomputes from it
    b = sg_worker(work, daemon, prompt=prompt(2), load=True)
    assert b["hit"] == 6 and b["loaded"] == 2 * T
    assert b["get_results"] == [[True, True, False, True, True, True]]
    assert b["stats"]["get_corrupt"] == 1
    assert_exact(b, prompt(2))
    assert daemon.metric("kvcached_pinned_blocks") == 0


def scale_block(c: Client, key: bytes):
    """Writes into a committed block through the G2 mapping (any worker of
    the tenant can)."""
    import ctypes
    with c.load([key]) as got:
        b = got.blocks[0]
        assert b.ok
        vals = (ctypes.c_float * (b.length // 4)).from_address(b.ptr)
        for i in range(0, b.length // 4, 5):
            vals[i] = vals[i] * 3.0 + 1.0


# --- the backend's calls, one by one ------------------------------------------------
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_batch_get_v1_reports_every_failed_page(daemon, layout):
    """Six pages stored; page 2 deleted, page 4 changed after COMMIT: both are
    False and their host pages untouched, every other page True with its
    bytes. SGLang's prefetch takes the two pages before the first False."""
    backend, pool = backend_for(daemon, layout=layout)
    keys = keys_of(6)
    src = pool.alloc(6 * T)
    data = fill(pool, src, 1)
    assert backend.batch_set_v1(keys, src) == [True] * 6
    assert backend.batch_exists(keys) == 6
    c = backend.client
    assert c.delete([page_key(keys[2])]) == 1
    scale_block(c, page_key(keys[4]))
    dst = pool.alloc(6 * T)
    res = backend.batch_get_v1(keys, dst, sglang_shim.HiCacheStorageExtraInfo(prefix_keys=None))
    assert res == [True, True, False, True, False, True]
    for i in range(6):
        hp = int(dst[i * T]) // T
        if res[i]:
            assert same(page_data(pool, hp), data[i])
        else:
            assert all(float(t.abs().sum()) == 0 for t in page_data(pool, hp))
    st = backend.get_stats()
    assert (st["get_ok"], st["get_missing"], st["get_corrupt"]) == (4, 1, 1)
    ctl = sglang_shim.Controller(backend, pool, True)
    assert ctl.page_transfer(keys, pool.alloc(6 * T)) == 2
    assert daemon.metric("kvcached_pinned_blocks") == 0
    backend.close()


def test_batch_exists_and_exists_count_from_the_start(daemon):
    backend, pool = backend_for(daemon)
    keys = keys_of(5)
    assert backend.batch_exists(keys) == 0 and not backend.exists(keys[0])
    src = pool.alloc(5 * T)
    fill(pool, src, 2)
    # the first three pages, then the last two with the third as parent
    assert backend.batch_set_v1(keys[:3], src[:3 * T]) == [True] * 3
    assert backend.batch_exists(keys) == 3
    extra = sglang_shim.HiCacheStorageExtraInfo(prefix_keys=keys[:3])
    assert backend.batch_set_v1(keys[3:], src[3 * T:], extra) == [True] * 2
    assert backend.batch_exists(keys) == 5 and backend.exists(keys[4])
    backend.client.delete([page_key(keys[1])])
    assert backend.batch_exists(keys) == 1
    # stored again: already stored pages count as stored
    assert backend.batch_set_v1(keys, src) == [True] * 5
    st = backend.get_stats()
    assert st["set_existed"] == 4 and st["set_stored"] == 6
    backend.clear()
    assert backend.batch_exists(keys) == 0
    backend.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_flat_pages_and_host_pages_are_one_block_format(daemon, layout):
    """A page stored through set() from a flat page of one layout loads
    through batch_get_v1 into another layout's pool, and back through get()."""
    backend, pool = backend_for(daemon, layout=layout, interface_v1=0)
    keys = keys_of(3, seed=11)
    src = pool.alloc(3 * T)
    data = fill(pool, src, 3)
    flat = [pool.get_data_page(int(src[i * T])) for i in range(3)]
    assert backend.batch_set(keys, flat)
    assert backend.set(keys[0], flat[0])  # already stored: fine
    other_layout = "page_first_direct" if layout != "page_first_direct" else "layer_first"
    other, opool = backend_for(daemon, layout=other_layout)
    dst = opool.alloc(3 * T)
    assert other.batch_get_v1(keys, dst) == [True] * 3
    for i in range(3):
        assert same(page_data(opool, int(dst[i * T]) // T), data[i])
    # back through the flat path of the first layout
    got = backend.get(keys[1], pool.get_dummy_flat_data_page())
    assert got is not None and torch.equal(got, flat[1])
    assert backend.batch_get([keys[2], keys_of(1, seed=99)[0]],
                             [pool.get_dummy_flat_data_page() for _ in range(2)])[1] is None
    backend.close()
    other.close()


def test_a_page_another_worker_is_still_writing_is_not_reported_stored(daemon):
    """ALLOC answers KV_EEXISTS both for a stored key and for one another
    worker is writing (which may still abort): only the stored one is True."""
    backend, pool = backend_for(daemon)
    keys = keys_of(3, seed=21)
    src = pool.alloc(3 * T)
    fill(pool, src, 8)
    assert backend.batch_set_v1(keys[:1], src[:T]) == [True]
    other = backend_for(daemon)[0]
    a = other.client.alloc([page_key(keys[1])], parents=[page_key(keys[0])])  # held, uncommitted
    assert backend.batch_set_v1(keys, src) == [True, False, True]
    st = backend.get_stats()
    assert (st["set_existed"], st["set_inflight"], st["set_stored"]) == (1, 1, 2)
    a.abort()
    assert backend.batch_set_v1(keys[1:2], src[T:2 * T],
                                sglang_shim.HiCacheStorageExtraInfo(prefix_keys=keys[:1])) == [True]
    backend.close()
    other.close()


def test_set_priority_is_the_hint_an_engine_can_give(daemon):
    backend, pool = backend_for(daemon)
    keys = keys_of(2)
    src = pool.alloc(2 * T)
    fill(pool, src, 4)
    backend.batch_set_v1(keys, src)
    assert backend.set_priority(keys, 10) == [0, 0]
    backend.close()


def test_session_hints_follow_extra_info_and_name_only_pages_that_came_through(daemon):
    """With a session in HiCacheStorageExtraInfo.extra_info, the pages
    batch_set_v1 stored and batch_get_v1 loaded are named the session's,
    after their COMMIT (no hinted key missing) and never a failed page;
    without one, no hint is sent."""
    backend, pool = backend_for(daemon)
    keys = keys_of(4, seed=5)
    src = pool.alloc(4 * T)
    fill(pool, src, 6)
    assert backend.batch_set_v1(keys[:2], src[:2 * T]) == [True] * 2
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 0
    info = sglang_shim.HiCacheStorageExtraInfo(prefix_keys=keys[:2],
                                               extra_info={"session": "conv-7", "retain_s": 60})
    assert backend.batch_set_v1(keys[2:], src[2 * T:], info) == [True] * 2
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 1
    backend.client.delete([page_key(keys[3])])
    res = backend.batch_get_v1(keys, pool.alloc(4 * T), info)
    assert res == [True, True, True, False]
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 2
    assert daemon.metric("kvcached_hint_keys_unmatched_total") == 0
    backend.hint_finished("conv-7", "tool_calls")
    backend.hint_end("conv-7")
    assert daemon.metric('kvcached_hint_finished_total{stop="tool_use"}') == 1
    assert daemon.metric('kvcached_hints_total{kind="end"}') == 1
    assert backend.get_stats()["hints"] == 2
    backend.close()


def test_tp_ranks_get_one_hit_length(daemon):
    """Two TP ranks (each its own KV heads, its own namespace) of one group:
    batch_exists answers the group's minimum on both."""
    r0, p0 = backend_for(daemon, tp=(0, 2))
    r1, p1 = backend_for(daemon, tp=(1, 2))
    assert r0.group == r1.group
    keys = keys_of(4)
    s0, s1 = p0.alloc(4 * T), p1.alloc(4 * T)
    fill(p0, s0, 5)
    fill(p1, s1, 6)
    assert r0.batch_set_v1(keys, s0) == [True] * 4
    assert r1.batch_set_v1(keys[:2], s1[:2 * T]) == [True] * 2
    assert r0.batch_exists(keys) == 2 and r1.batch_exists(keys) == 2
    # a backend outside the TP group (TP 1) has another namespace: nothing
    solo, _ = backend_for(daemon)
    assert solo.batch_exists(keys) == 0
    for b in (r0, r1, solo):
        b.close()


def test_get_stats_gives_sglang_storage_metrics(daemon):
    """--enable-hicache-storage-metrics: get_stats() is SGLang's StorageMetrics
    (pages and GB/s per call since the last get_stats), counters() the totals."""
    backend, pool = backend_for(daemon, metrics=True)
    keys = keys_of(3)
    src = pool.alloc(3 * T)
    fill(pool, src, 8)
    backend.batch_set_v1(keys, src)
    backend.batch_get_v1(keys, pool.alloc(3 * T))
    m = backend.get_stats()
    assert isinstance(m, sglang_shim.StorageMetrics)
    assert (m.backup_pgs, m.prefetch_pgs) == ([3], [3])
    assert m.prefetch_bandwidth[0] > 0 and m.backup_bandwidth[0] > 0
    assert backend.get_stats().prefetch_pgs == []
    assert backend.counters()["get_ok"] == 3
    backend.close()


class MLAPool:
    """MLATokenToKVPoolHost's kv_buffer (pool_host/mla.py init_kv_buffer):
    layer_first [layers, tokens, 1, dim], page_first [tokens, layers, 1, dim],
    page_first_direct [pages, layers, page_size, 1, dim]."""

    def __init__(self, layout, pages=16, layers=3, dim=24):
        self.layout, self.page_size, self.dtype = layout, T, torch.float32
        self.L = layers
        shape = {"layer_first": (layers, pages * T, 1, dim), "page_first": (pages * T, layers, 1, dim),
                 "page_first_direct": (pages, layers, T, 1, dim)}[layout]
        self.kv_buffer = torch.zeros(shape)

    def page(self, l, hp):
        if self.layout == "layer_first":
            return self.kv_buffer[l, hp * T:(hp + 1) * T]
        if self.layout == "page_first":
            return self.kv_buffer[hp * T:(hp + 1) * T, l]
        return self.kv_buffer[hp, l]


@pytest.mark.parametrize("src_layout,dst_layout", [("layer_first", "page_first_direct"),
                                                   ("page_first_direct", "page_first"),
                                                   ("page_first", "layer_first")])
def test_mla_pages_are_shared_by_every_tp_rank(daemon, src_layout, dst_layout):
    """MLA (is_mla_model: the latent cache is the same on every rank): rank 0
    stores, rank 1 loads what rank 0 stored, whatever the host layouts."""
    def mla_backend(layout, rank):
        pool = MLAPool(layout)
        conf = sglang_shim.storage_config(sglang_shim.extra_config(daemon.socket),
                                          tp_rank=rank, tp_size=2, is_mla_model=True,
                                          layout=layout)
        return sglang_shim.create_dynamic_backend(conf, pool)[0], pool
    b0, p0 = mla_backend(src_layout, 0)
    b1, p1 = mla_backend(dst_layout, 1)
    keys = keys_of(3, seed=21)
    g = torch.Generator().manual_seed(9)
    for hp in (2, 3, 4):
        for l in range(p0.L):
            v = p0.page(l, hp)
            v.copy_(torch.randn(v.shape, generator=g))
    src = torch.arange(2 * T, 5 * T)
    assert b0.batch_set_v1(keys, src) == [True] * 3
    assert b1.batch_exists(keys) == 3
    dst = torch.arange(7 * T, 10 * T)
    assert b1.batch_get_v1(keys, dst) == [True] * 3
    for i in range(3):
        for l in range(p0.L):
            assert torch.equal(p1.page(l, 7 + i), p0.page(l, 2 + i))
    b0.close()
    b1.close()


def test_a_stopped_daemon_answers_failed_pages_not_exceptions(daemon):
    """SGLang never restarts its prefetch and backup threads: a daemon gone
    must be answered as misses and failed pages, not raised."""
    backend, pool = backend_for(daemon)
    keys = keys_of(3)
    src = pool.alloc(3 * T)
    fill(pool, src, 12)
    assert backend.batch_set_v1(keys, src) == [True] * 3
    daemon.stop()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, pool.alloc(3 * T)) == [False] * 3
    assert backend.batch_set_v1(keys, src) == [False] * 3
    assert backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys]) == [None] * 3
    assert not backend.batch_set(keys, [pool.get_data_page(int(src[0]))] * 3)
    st = backend.counters()
    assert st["get_failed"] == 6 and st["set_failed"] == 6
    backend.close()


def test_many_pages_in_sglang_batches_of_128(daemon):
    """300 pages: the controller's backup, hit query and prefetch go 128 pages
    a call, with prefix_keys growing; a page deleted in the third batch ends
    the hit there, and the prefetch loads exactly the pages before it."""
    n = 300
    backend, pool = backend_for(daemon, size_pages=2 * n + 8)
    ctl = sglang_shim.Controller(backend, pool, True)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 500, (n * T + 3,), generator=g).tolist()
    hashes = sglang_shim.get_hash_str(tokens, None, T)
    src = pool.alloc(n * T)
    data = fill(pool, src, 13)
    assert ctl.page_backup(hashes, src, prefix_keys=["x"]) == n * T
    assert len(ctl.hit_query(tokens)) == n
    backend.client.delete([page_key(hashes[260])])
    hit = ctl.hit_query(tokens)
    assert len(hit) == 260
    dst = pool.alloc(n * T)
    assert ctl.page_transfer(hit, dst) == 260
    assert [len(r) for r in ctl.get_results] == [128, 128, 4]
    for i in (0, 127, 128, 259):
        assert same(page_data(pool, int(dst[i * T]) // T), data[i])
    backend.close()


def test_the_session_comes_back_after_a_daemon_restart(daemon):
    """After a restart the first call finds the session lost (a miss); the
    next opens it again and the backend stores and loads as before."""
    backend, pool = backend_for(daemon, reconnect_s=0)
    keys = keys_of(2)
    src = pool.alloc(2 * T)
    data = fill(pool, src, 14)
    assert backend.batch_set_v1(keys, src) == [True] * 2
    daemon.restart()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, src) == [True] * 2
    assert backend.batch_exists(keys) == 2
    dst = pool.alloc(2 * T)
    assert backend.batch_get_v1(keys, dst) == [True] * 2
    assert same(page_data(pool, int(dst[T]) // T), data[1])
    assert backend.counters()["reconnects"] == 1
    backend.close()
