"""kvclient.sglang.KvcachedStorage, SGLang's HiCache storage backend, run by
SGLang's own code (SGLang 0.5.23 as installed; its Python code, on the CPU).

What is SGLang's and runs here:
  - the backend is built by sglang/srt/mem_cache/storage/backend_factory.py
    StorageBackendFactory.create_backend("dynamic", ...) from the extra
    config a user writes (module_path "kvclient.sglang", class_name
    "KvcachedStorage"), inside the attach of
    sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py
    HybridCacheController (the controller every UnifiedRadixCache uses, a
    dense model's too: hybrid_pool_assembler.build_kv_only_stack), whose
    base is sglang/srt/managers/cache_controller.py HiCacheController:
    attach_storage_backend -> _generate_storage_config -> the factory ->
    register_mem_pool_host -> register_mem_host_pool_v2 ->
    on_host_pools_registered; detach_storage_backend -> close();
  - the host pools are SGLang's: pool_host/mha.py MHATokenToKVPoolHost and
    pool_host/mla.py MLATokenToKVPoolHost (layer_first, page_first_direct,
    page_first), built from the buffer info of SGLang's device pools
    (memory_pool.py MHATokenToKVPool, MLATokenToKVPool) on CPU tensors
    (pin_memory off), in the HostPoolGroup of one KV entry that
    build_kv_only_group makes; pages are written and read with the pools'
    own set_from_flat_data_page / get_data_page;
  - the storage paths are the controller's threads: write_storage ->
    backup_thread_func -> _page_backup -> _page_set_zero_copy ->
    batch_set_v1 (or _generic_page_set -> batch_set without
    "interface_v1"); prefetch -> prefetch_thread_func -> _storage_hit_query
    -> batch_exists (batch_exists_v2 when the request has other pools) ->
    prefetch_hit_queue; prefetch_io_aux_func -> _page_transfer ->
    _page_transfer_kv_batch -> _page_get_zero_copy -> batch_get_v1 (or
    _generic_page_get -> batch_get) -> prefetch_sync_thread_func ->
    ack_prefetch_queue. Between the hit query and the transfer the tests do
    what unified_radix_cache.py's _try_alloc_storage_hit does for the
    scheduler: allocate_storage_hit (the controller's), then set
    host_indices, storage_hit_count and hash_value and queue the operation.
    Page hashes are SGLang's get_storage_hash_str.

What is not SGLang's code here, and why:
  - the scheduler and radix tree around the controller (a model, requests);
    the tests stand in for _try_alloc_storage_hit, as said above;
  - the device <-> host copies (L2): SGLang does them with sgl_kernel /
    JIT CUDA kernels (transfer_kv_*), which need a GPU; the engine tests copy
    between the reference engine's pages and the host pool with torch
    (l2_copy below, the only stand-in), and the reference engine
    (kvclient.examples.llama) is the model whose logits judge the bytes;
  - TP ranks as processes: the controller's rank agreement (_all_reduce over
    gloo groups of a torch.distributed job) needs one process per rank;
    here two controllers of one process play the ranks (their storage
    configs come from get_parallel(), overridden per rank) and the hit
    length agreed by kvcached's TP group is what is checked.
The tests where a call's per-page answers matter (every failed page
reported False) call the backend as _page_get_zero_copy does
(batch_get_v1(hashes, host_indices, HiCacheStorageExtraInfo(prefix_keys))),
since the controller keeps only the leading run of True; the KV pool
through batch_get_v2 / batch_set_v2 is called directly too (SGLang 0.5.23's
controllers send only the other pools there, and those calls run for real).
"""
import ctypes
import os
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from conftest import HERE  # noqa: E402

try:  # SGLang's code (the tests skip without it; the import test runs anyway)
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorageConfig,
                                                      HiCacheStorageExtraInfo, PoolHitPolicy,
                                                      PoolName, PoolTransfer)
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.srt.observability.metrics_collector import StorageMetrics
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    NO_SGLANG = None
except ImportError as e:
    NO_SGLANG = f"SGLang's code is not importable here ({e}): these tests run it"

from kvclient import Client  # noqa: E402
from kvclient.examples.llama import LlamaConfig, PagedKVCache  # noqa: E402

if NO_SGLANG is None:
    from kvclient.sglang import KvcachedStorage, page_key

T = 16                        # tokens per page
CFG = LlamaConfig.preset("tiny")   # the reference engine: 2 layers, 2 KV heads, dim 32
PREFIX = 6 * T                # the engine tests' shared prefix: 6 pages
NEW = 4                       # greedy tokens compared
MLA_RANK, MLA_ROPE = 16, 8    # MLA latent: kv_lora_rank + qk_rope_head_dim


@pytest.fixture(scope="module", autouse=True)
def sglang_process():
    """What SGLang's scheduler sets up before it builds its caches (server
    args; no torch.distributed: the rank is given per controller)."""
    if NO_SGLANG is not None:
        yield
        return
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=T))
    yield


def extra_config(socket: str, **more) -> dict:
    """--hicache-storage-backend-extra-config for kvclient.sglang."""
    return {"backend_name": "kvcached", "module_path": "kvclient.sglang",
            "class_name": "KvcachedStorage", "interface_v1": 1, "socket": socket, "tenant": "t",
            **more}


class Stack:
    """One SGLang rank's HiCache with kvcached as its L3, as SGLang builds it
    for a dense model (hybrid_pool_assembler.build_kv_only_stack, on the
    CPU): device pool, allocator, host pool, host pool group, controller."""

    def __init__(self, daemon, kind="mha", layout="layer_first", pages=24, tp=(0, 1),
                 metrics=False, extra_pools=(), **more):
        self.kind = kind
        if kind == "mha":
            self.dtype, L = torch.float32, CFG.num_layers
            dev = MHATokenToKVPool(size=pages * T, page_size=T, dtype=self.dtype,
                                   head_num=CFG.num_kv_heads, head_dim=CFG.head_dim, layer_num=L,
                                   device="cpu", enable_memory_saver=False)
        else:
            self.dtype, L = torch.bfloat16, 3
            dev = MLATokenToKVPool(size=pages * T, page_size=T, dtype=self.dtype,
                                   kv_lora_rank=MLA_RANK, qk_rope_head_dim=MLA_ROPE, layer_num=L,
                                   device="cpu", enable_memory_saver=False)
        self.host = host_pool(dev, layout)
        alloc = TokenToKVPoolAllocator(size=dev.size, dtype=self.dtype, device="cpu",
                                       kvcache=dev, need_sort=False)
        entries = [PoolEntry(name=PoolName.KV, host_pool=self.host, device_pool=dev,
                             layer_mapper=lambda i: i, is_primary_index_anchor=True)]
        entries += [PoolEntry(name=n, host_pool=p, device_pool=dev, layer_mapper=lambda i: i)
                    for n, p in extra_pools]
        rank = dict(tp_rank=tp[0], tp_size=tp[1], attn_tp_size=tp[1], moe_tp_size=tp[1],
                    pp_rank=0, pp_size=1)
        self.ctl = HybridCacheController(
            alloc, HostPoolGroup(entries), T, None, load_cache_event=threading.Event(),
            io_backend="direct", transfer_layer_id_max=L, enable_storage_metrics=metrics)
        # the attach HybridCacheController.__init__ makes for
        # --hicache-storage-backend (and the runtime attach API makes later)
        try:
            with get_parallel().override(**rank):
                self.ctl.attach_storage_backend(
                    storage_backend="dynamic", prefetch_threshold=T, model_name="tiny",
                    storage_backend_extra_config=extra_config(daemon.socket, **more),
                    host_pools=entries)
        except BaseException:
            self.ctl.detach_storage_backend()  # what an attach that failed late leaves
            raise
        self.backend = self.ctl.storage_backend
        assert isinstance(self.backend, KvcachedStorage)
        self.calls = spy(self.backend)
        self._rid = 0

    def close(self):
        self.ctl.detach_storage_backend()  # stops the threads, then backend.close()

    # --- the controller's paths ---------------------------------------------------
    def backup(self, hidx, hashes, prefix_keys=None, extra_pools=None) -> int:
        """write_storage (as UnifiedRadixCache.write_backup_storage) and its
        ack: the tokens the backup thread stored."""
        op_id = self.ctl.write_storage(hidx, [0] * (len(hashes) * T), hash_value=list(hashes),
                                       prefix_keys=prefix_keys, extra_pools=extra_pools)
        op = self.ctl.ack_backup_queue.get(timeout=60)
        assert op.id == op_id
        return op.completed_tokens

    def prefetch(self, tokens, last_hash=None, prefix_keys=None, extra_pools=None,
                 between=None):
        """prefetch, the hit query, the host allocation the scheduler makes
        (_try_alloc_storage_hit) and the transfer; (hit tokens, tokens
        loaded, host indices). between(), when given, runs after the hit
        query and before the transfer."""
        self._rid += 1
        op = self.ctl.prefetch(CacheRequestHandle(rid=f"r{self._rid}", attempt_id=0), tokens,
                               last_hash, prefix_keys, extra_pools=extra_pools)
        got = self.ctl.prefetch_hit_queue.get(timeout=60)
        assert got is op
        hit = op.storage_hit_count
        if hit == 0:
            return 0, 0, None
        hidx, alloc_len = self.ctl.allocate_storage_hit(op, hit, allow_partial=True,
                                                        min_tokens=T, evict_host=lambda n: 0)
        assert hidx is not None and alloc_len == hit
        op.storage_hit_count = alloc_len
        op.hash_value = op.hash_value[:alloc_len // T]
        op.host_indices = hidx
        if between is not None:
            between()
        self.ctl.prefetch_buffer.put(op)
        done = 0
        while True:
            ack = self.ctl.ack_prefetch_queue.get(timeout=60)
            assert ack.operation is op
            if ack.completed_tokens is not None:
                done = ack.completed_tokens
            if ack.completed_req:
                return hit, done, hidx

    # --- pages --------------------------------------------------------------------
    def alloc(self, npages):
        return self.host.alloc(npages * T)

    def fill(self, hidx, seed):
        """Random pages at hidx (set_from_flat_data_page); their canonical views."""
        g = torch.Generator().manual_seed(seed)
        out = []
        for i in range(len(hidx) // T):
            flat = self.host.get_dummy_flat_data_page()
            flat.copy_(torch.randn(flat.shape, generator=g).to(self.dtype))
            self.host.set_from_flat_data_page(int(hidx[i * T]), flat)
            out.append(self.page(hidx, i))
        return out

    def page(self, hidx, i):
        """Page i of hidx in one order for every layout (a copy): MHA
        [layers, 2, T, heads, dim], MLA [layers, T, 1, dim]."""
        p = self.host.get_data_page(int(hidx[i * T]), flat=False)
        lay = self.host.layout
        if self.kind == "mha":
            p = {"layer_first": lambda t: t.transpose(0, 1),
                 "page_first_direct": lambda t: t[:, 0].transpose(0, 1),
                 "page_first": lambda t: t.permute(2, 0, 1, 3, 4)}[lay](p)
        else:
            p = {"layer_first": lambda t: t, "page_first_direct": lambda t: t[0],
                 "page_first": lambda t: t.transpose(0, 1)}[lay](p)
        return p.contiguous().clone()

    def mark(self, hidx):
        """A sentinel in the pages at hidx (to see which ones a load left alone)."""
        for i in range(len(hidx) // T):
            flat = self.host.get_dummy_flat_data_page()
            flat.fill_(7)
            self.host.set_from_flat_data_page(int(hidx[i * T]), flat)


def host_pool(dev, layout):
    """SGLang's host pool for a device pool, as build_kv_host_pool builds it
    (pin_memory off: no CUDA here)."""
    info = dev.get_device_pool_infos()[0].buffer_info
    common = dict(pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                  start_layer=dev.start_layer, end_layer=dev.end_layer)
    if isinstance(dev, MLATokenToKVPool):
        return MLATokenToKVPoolHost(info, 1.0, 0, T, layout, target_layer_num=dev.layer_num,
                                    override_kv_cache_dim=dev.kv_cache_dim, **common)
    return MHATokenToKVPoolHost(info, 1.0, 0, T, layout, **common)


def spy(backend):
    """Records the storage calls SGLang makes (name, args, answer); the
    backend is called unchanged."""
    calls = []
    for name in ("batch_exists", "batch_get_v1", "batch_set_v1", "batch_exists_v2",
                 "batch_get_v2", "batch_set_v2", "batch_get", "batch_set"):
        real = getattr(backend, name)

        def wrapped(*a, _real=real, _name=name, **k):
            r = _real(*a, **k)
            calls.append((_name, a, k, r))
            return r
        setattr(backend, name, wrapped)
    return calls


def answers(calls, name):
    return [list(r) if isinstance(r, list) else r for n, _, _, r in calls if n == name]


def same(a, b) -> bool:
    """Byte for byte."""
    return len(a) == len(b) and all(
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b))


def hashes_of(n, seed=7, last_hash=None):
    """n full pages of random tokens and their SGLang page hashes."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 500, (n * T,), generator=g).tolist()
    return tokens, get_storage_hash_str(tokens, last_hash, page_size=T)


@pytest.fixture
def stacks(daemon):
    """Builds Stacks on the test's daemon, detached at the end."""
    if NO_SGLANG is not None:
        pytest.skip(NO_SGLANG)
    made = []

    def make(**kw):
        s = Stack(daemon, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        try:
            s.close()
        except Exception:  # a controller whose daemon is gone still stops its threads
            pass


def scale_block(c: Client, key: bytes):
    """Writes into a committed block through the G2 mapping (any worker of
    the tenant can): its bytes no longer match the committed CRC."""
    with c.load([key]) as got:
        b = got.blocks[0]
        assert b.ok
        vals = (ctypes.c_float * (b.length // 4)).from_address(b.ptr)
        for i in range(0, b.length // 4, 5):
            vals[i] = vals[i] * 3.0 + 1.0


# --- the import -------------------------------------------------------------------
def test_import_without_sglang_names_the_engine():
    code = ("import sys\nsys.modules['sglang'] = None  # SGLang not installed\n"
            "import kvclient\n"
            "try:\n    import kvclient.sglang\nexcept ImportError as e:\n    print('IE', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.join(HERE, ".."), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("IE") and "SGLang" in r.stdout


# --- built by SGLang, refused where it cannot hold the pools -------------------------
def test_sglang_builds_the_backend_and_it_refuses_what_it_cannot_hold(daemon, stacks):
    s = stacks()
    b = s.backend
    assert b.mem_pool_host is s.host and b.registered_pools == {PoolName.KV: s.host}
    assert s.ctl.page_get_func == s.ctl._page_get_zero_copy  # "interface_v1": 1
    assert (b.tp, b.client_layout.layers, b.client_layout.kv_heads) == ((0, 1), 2, 2)
    # tp_lcm_size (taken out of the extra config by SGLang) on a layer_first
    # pool: SGLang splits nothing, the backend runs (pages per TP size)
    s2 = stacks(layout="page_first_direct", tp_lcm_size=2)
    assert s2.ctl.storage_config.tp_lcm_size == 2
    assert not s2.ctl.storage_config.should_split_heads
    # page_head with tp_lcm_size > tp_size: SGLang asks for split heads
    with pytest.raises(NotImplementedError, match="should_split_heads"):
        stacks(layout="page_head", tp_lcm_size=2)
    with pytest.raises(NotImplementedError, match="page_head"):
        stacks(layout="page_head")
    # a hybrid model's other pool (an SWA pool beside the KV pool): the
    # attach fails at on_host_pools_registered
    swa = host_pool(MHATokenToKVPool(size=8 * T, page_size=T, dtype=torch.float32, head_num=2,
                                     head_dim=32, layer_num=1, device="cpu",
                                     enable_memory_saver=False), "layer_first")
    with pytest.raises(NotImplementedError, match="swa"):
        stacks(extra_pools=[(PoolName.SWA, swa)])
    # the factory alone, as SGLang calls it, with a config a controller
    # would not make: the error comes out of create_backend
    conf = HiCacheStorageConfig(tp_rank=0, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name="tiny", tp_lcm_size=4,
                                should_split_heads=True, extra_config=extra_config(daemon.socket))
    with pytest.raises(NotImplementedError, match="split"):
        StorageBackendFactory.create_backend("dynamic", conf, s.host)


def test_v2_holds_the_kv_pool_and_answers_false_for_a_late_sidecar(daemon, stacks, caplog):
    """A draft sidecar registered after the attach (register_host_pool_entry,
    as SGLang registers draft KV pools): one log line, its pages False, and
    a request that needs it gets no hit (batch_exists_v2 from the hit
    query); the KV pool itself goes through the v2 calls too."""
    caplog.set_level("WARNING", logger="kvclient.sglang")
    s = stacks(pages=24)
    draft = host_pool(MHATokenToKVPool(size=24 * T, page_size=T, dtype=torch.float32,
                                       head_num=2, head_dim=32, layer_num=1, device="cpu",
                                       enable_memory_saver=False), "layer_first")
    s.ctl.register_host_pool_entry(PoolEntry(name=PoolName.DRAFT, host_pool=draft,
                                             device_pool=None, layer_mapper=lambda i: i))
    tokens, keys = hashes_of(4, seed=3)
    src = s.alloc(4)
    data = s.fill(src, 3)
    # the backup of a request with the draft pool: SGLang writes the draft
    # pages (batch_set_v2: all False), then the KV pages (batch_set_v1)
    side = PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV)
    assert s.backup(src, keys, extra_pools=[side]) == 4 * T
    assert answers(s.calls, "batch_set_v2") == [{PoolName.DRAFT: [False] * 4}]
    assert answers(s.calls, "batch_set_v1") == [[True] * 4]
    # the hit query of a request that needs the draft pool: no hit
    need = PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV,
                        hit_policy=PoolHitPolicy.ALL_PAGES)
    assert s.prefetch(tokens, extra_pools=[need]) == (0, 0, None)
    (r,) = answers(s.calls, "batch_exists_v2")
    assert (r.kv_hit_pages, r.extra_pool_hit_pages, r.restorable_prefix_pages) == \
        (0, {PoolName.KV: 4}, [])
    # without it the KV prefix is there
    hit, done, dst = s.prefetch(tokens)
    assert (hit, done) == (4 * T, 4 * T)
    assert same([s.page(dst, i) for i in range(4)], data)
    # the KV pool through v2 (SGLang 0.5.23's controllers send only other
    # pools there; the contract covers the KV pool too)
    b = s.backend
    dst = s.alloc(4)
    kv = PoolTransfer(name=PoolName.KV, host_indices=dst, keys=keys)
    got = b.batch_get_v2([kv, PoolTransfer(name=PoolName.DRAFT, host_indices=dst, keys=keys)],
                         HiCacheStorageExtraInfo(prefix_keys=None))
    assert got == {PoolName.KV: [True] * 4, PoolName.DRAFT: [False] * 4}
    assert same([s.page(dst, i) for i in range(4)], data)
    r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT,
                                              hit_policy=PoolHitPolicy.BLOCK_GROUPS)])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [1, 2, 3, 4])  # never gates
    tokens2, keys2 = hashes_of(2, seed=4, last_hash=keys[-1])
    assert b.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=src[:2 * T],
                                        keys=keys2)],
                          HiCacheStorageExtraInfo(prefix_keys=keys)) == {PoolName.KV: [True] * 2}
    before = b.client.lookup_stats()
    assert b.batch_exists(keys + keys2) == 6
    st = b.client.lookup_stats()  # answered from the presence table (protocol 1.5)
    assert st["mapped"] and st["local"] > before["local"] and st["daemon"] == before["daemon"], st
    # host indices that do not match the keys: every page False
    assert b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=dst[:T], keys=keys)]) == \
        {PoolName.KV: [False] * 4}
    # one log line for the draft pool, whatever the calls that met it
    refusals = [m for m in caplog.messages if "'draft'" in m]
    assert len(refusals) == 1 and "answered False" in refusals[0]


# --- round trips through the controller ----------------------------------------------
@pytest.mark.parametrize("kind,src_layout,dst_layout", [
    ("mha", "layer_first", "page_first_direct"),
    ("mha", "page_first_direct", "layer_first"),
    ("mha", "page_first", "layer_first"),
    ("mla", "layer_first", "page_first_direct"),
    ("mla", "page_first_direct", "layer_first"),
])
def test_a_prefix_stored_by_one_rank_loads_into_another_byte_for_byte(stacks, kind, src_layout,
                                                                        dst_layout):
    """The backup thread stores 5 pages from one host pool; another
    controller (another backend, another kvcached session, another layout)
    finds them in its hit query and its prefetch loads them, byte for byte.
    MLA: the two are TP ranks 0 and 1 (the latent cache is every rank's);
    rank 1 stores nothing (SGLang's backup_skip), rank 0's pages serve it."""
    tp_a, tp_b = ((0, 2), (1, 2)) if kind == "mla" else ((0, 1), (0, 1))
    a = stacks(kind=kind, layout=src_layout, tp=tp_a)
    b = stacks(kind=kind, layout=dst_layout, tp=tp_b)
    a.alloc(3)  # the pages of one pool are not where the other's are
    tokens, keys = hashes_of(5, seed=11)
    src = a.alloc(5)
    data = a.fill(src, 11)
    assert a.backup(src, keys) == 5 * T
    assert answers(a.calls, "batch_set_v1") == [[True] * 5]
    if kind == "mla":
        assert b.ctl.backup_skip and b.backup(b.alloc(5), keys) == 0
        assert answers(b.calls, "batch_set_v1") == []
    hit, done, dst = b.prefetch(tokens)
    assert (hit, done) == (5 * T, 5 * T)
    assert answers(b.calls, "batch_exists") == [5]
    assert answers(b.calls, "batch_get_v1") == [[True] * 5]
    assert same([b.page(dst, i) for i in range(5)], data)
    assert b.backend.counters()["get_ok"] == 5


def test_flat_pages_without_interface_v1_are_the_same_blocks(stacks):
    """Without "interface_v1" SGLang uses the flat-page calls (_generic_page_set:
    batch_set of get_data_page; _generic_page_get: batch_get into
    get_dummy_flat_data_page, then set_from_flat_data_page): the blocks are
    the ones batch_get_v1 loads into another layout, and back."""
    a = stacks(layout="page_first", interface_v1=0)
    assert a.ctl.page_set_func == a.ctl._generic_page_set
    b = stacks(layout="page_first_direct")
    tokens, keys = hashes_of(3, seed=12)
    src = a.alloc(3)
    data = a.fill(src, 12)
    assert a.backup(src, keys) == 3 * T
    assert answers(a.calls, "batch_set") == [True]
    hit, done, dst = b.prefetch(tokens)
    assert done == 3 * T and same([b.page(dst, i) for i in range(3)], data)
    hit, done, dst = a.prefetch(tokens)
    assert done == 3 * T and same([a.page(dst, i) for i in range(3)], data)
    assert a.backup(src, keys) == 3 * T  # stored already: fine


# --- every failed page is False ----------------------------------------------------------
@pytest.mark.parametrize("kind,layout", [("mha", "layer_first"), ("mha", "page_first_direct"),
                                         ("mha", "page_first"), ("mla", "page_first_direct")])
def test_batch_get_v1_reports_every_failed_page(daemon, stacks, kind, layout):
    """Seven pages stored; page 4 deleted, pages 2 and 5 changed after
    COMMIT. The hit query stops at page 4; the prefetch's batch_get_v1
    answers page 2 False (its CRC; the daemon then drops it) and SGLang
    takes the 2 pages before it. Called as _page_get_zero_copy calls it over
    all seven: the missing pages 2 and 4 and the changed page 5 False and
    their host pages left alone, every other page True with its bytes."""
    s = stacks(kind=kind, layout=layout)
    tokens, keys = hashes_of(7, seed=1)
    src = s.alloc(7)
    data = s.fill(src, 1)
    assert s.backup(src, keys) == 7 * T
    c = s.backend.client
    assert c.delete([page_key(keys[4])]) == 1
    scale_block(c, page_key(keys[2]))
    scale_block(c, page_key(keys[5]))
    hit, done, _ = s.prefetch(tokens)
    assert (hit, done) == (4 * T, 2 * T)
    assert answers(s.calls, "batch_get_v1") == [[True, True, False, True]]
    dst = s.alloc(7)
    s.mark(dst)
    before = [s.page(dst, i) for i in range(7)]
    res = s.backend.batch_get_v1(keys, dst, HiCacheStorageExtraInfo(prefix_keys=None))
    assert res == [True, True, False, True, False, False, True]
    for i in range(7):
        assert same([s.page(dst, i)], [data[i] if res[i] else before[i]])
    st = s.backend.counters()
    assert (st["get_ok"], st["get_missing"], st["get_corrupt"]) == (3 + 4, 2, 2)
    assert s.backend.batch_exists(keys) == 2  # the daemon dropped the changed blocks
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_a_stopped_daemon_answers_failed_pages_not_exceptions(daemon, stacks):
    """SGLang's storage threads call on when the daemon is gone: every page
    is answered as missing or failed (an exception would be logged by the
    controller and lose the whole batch); the controller sees no hit and
    no backup."""
    s = stacks()
    tokens, keys = hashes_of(3, seed=12)
    src = s.alloc(3)
    s.fill(src, 12)
    assert s.backup(src, keys) == 3 * T
    daemon.stop()
    assert s.prefetch(tokens) == (0, 0, None)
    assert s.backup(src, keys) == 0
    b = s.backend
    info = HiCacheStorageExtraInfo(prefix_keys=None)
    assert b.batch_get_v1(keys, s.alloc(3), info) == [False] * 3
    assert b.batch_set_v1(keys, src, info) == [False] * 3
    assert b.batch_get(keys, [s.host.get_dummy_flat_data_page() for _ in keys]) == [None] * 3
    assert not b.batch_set(keys, [s.host.get_data_page(int(src[i * T])) for i in range(3)])
    assert b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=src, keys=keys)]) == \
        {PoolName.KV: [False] * 3}
    st = b.counters()
    assert st["get_failed"] == 9 and st["set_failed"] == 9


def test_the_session_comes_back_after_a_daemon_restart(daemon, stacks):
    """After a restart the first call finds the session lost (a miss); the
    next opens it again and the controller stores and loads as before."""
    s = stacks(reconnect_s=0)
    tokens, keys = hashes_of(2, seed=14)
    src = s.alloc(2)
    data = s.fill(src, 14)
    assert s.backup(src, keys) == 2 * T
    daemon.restart()
    assert s.prefetch(tokens) == (0, 0, None)
    assert s.backup(src, keys) == 2 * T
    hit, done, dst = s.prefetch(tokens)
    assert done == 2 * T and same([s.page(dst, i) for i in range(2)], data)
    assert s.backend.counters()["reconnects"] == 1


# --- the controller's batches and prefix keys --------------------------------------------
def test_many_pages_in_sglang_batches_of_128(stacks):
    """300 pages: the backup and the prefetch go STORAGE_BATCH_SIZE (128)
    pages a call, prefix_keys growing (hicache_storage_pass_prefix_keys);
    HybridCacheController's hit query asks for all 300 at once (the base
    HiCacheController asks 128 at a time). A page deleted in the third batch
    ends the hit there, and the prefetch loads exactly the pages before it."""
    n = 300
    s = stacks(pages=2 * n + 8)
    tokens, keys = hashes_of(n, seed=5)
    src = s.alloc(n)
    data = s.fill(src, 13)
    assert s.backup(src, keys, prefix_keys=["x" * 64]) == n * T
    sets = [(a[0], a[2].prefix_keys) for name, a, _, _ in s.calls if name == "batch_set_v1"]
    assert [len(k) for k, _ in sets] == [128, 128, 44]
    assert [len(p) for _, p in sets] == [1, 129, 257] and sets[2][1][1:] == keys[:256]
    s.backend.client.delete([page_key(keys[260])])
    s.calls.clear()
    hit, done, dst = s.prefetch(tokens)
    assert (hit, done) == (260 * T, 260 * T)
    assert answers(s.calls, "batch_exists") == [260]
    assert len(s.calls[0][1][0]) == n and STORAGE_BATCH_SIZE == 128
    assert [len(r) for r in answers(s.calls, "batch_get_v1")] == [128, 128, 4]
    assert same([s.page(dst, i) for i in (0, 127, 128, 259)],
                [data[i] for i in (0, 127, 128, 259)])
    # the hit query of the rest, continuing the chain from the last page
    # (last_hash, prefix_keys, as the radix tree asks for a node's suffix)
    more = get_storage_hash_str(tokens[261 * T:], keys[260], page_size=T)
    assert more == keys[261:]
    assert s.prefetch(tokens[261 * T:], last_hash=keys[260], prefix_keys=keys[:261])[0] == 39 * T


def test_a_hole_after_the_hit_query_ends_what_sglang_takes(stacks):
    """A hole in a prefix: page 5 of 300 deleted after SGLang's hit query
    found all 300, before the prefetch. batch_get_v1 loads every other page
    of its 128 (the backend passes on every page that came: True, bytes
    right); SGLang 0.5.23 takes the 5 before the hole
    (HiCacheController._page_get_zero_copy counts up to the first False),
    and asks no later batch (_page_transfer stops after a short one). Its
    radix cache (not run here) then inserts host pages [0, completed_tokens)
    and frees the rest (UnifiedRadixCache._handle_prefetch_result,
    _drain_ack_prefetch): the 122 pages that came past the hole are not
    used."""
    n = 300
    s = stacks(pages=2 * n + 8)
    tokens, keys = hashes_of(n, seed=21)
    src = s.alloc(n)
    data = s.fill(src, 21)
    assert s.backup(src, keys) == n * T
    s.calls.clear()
    hit, done, dst = s.prefetch(tokens, between=lambda: s.backend.client.delete(
        [page_key(keys[5])]))
    assert (hit, done) == (n * T, 5 * T)
    got = answers(s.calls, "batch_get_v1")
    assert got == [[True] * 5 + [False] + [True] * 122]  # one call: no later batch
    assert same([s.page(dst, i) for i in (0, 4, 6, 127)], [data[i] for i in (0, 4, 6, 127)])
    assert s.backend.counters()["get_missing"] == 1


def test_exists_counts_from_the_start_and_pages_stored_twice_are_stored(stacks):
    s = stacks()
    b = s.backend
    tokens, keys = hashes_of(5, seed=2)
    assert b.batch_exists(keys) == 0 and not b.exists(keys[0])
    src = s.alloc(5)
    s.fill(src, 2)
    # a node of three pages, then its child of two, parented on the third
    assert s.backup(src[:3 * T], keys[:3]) == 3 * T
    assert b.batch_exists(keys) == 3
    assert s.backup(src[3 * T:], keys[3:], prefix_keys=keys[:3]) == 2 * T
    assert b.batch_exists(keys) == 5 and b.exists(keys[4])
    b.client.delete([page_key(keys[1])])
    assert b.batch_exists(keys) == 1
    assert s.backup(src, keys) == 5 * T  # already stored pages count as stored
    st = b.counters()
    assert st["set_existed"] == 4 and st["set_stored"] == 6
    s.ctl.clear_storage_backend()
    assert b.batch_exists(keys) == 0


def test_a_page_another_worker_is_still_writing_is_not_reported_stored(stacks):
    """ALLOC answers KV_EEXISTS both for a stored key and for one another
    worker is writing (which may still abort): only the stored one is True,
    so the controller's backup of the batch fails and SGLang writes it again
    later."""
    s = stacks()
    tokens, keys = hashes_of(3, seed=21)
    src = s.alloc(3)
    s.fill(src, 8)
    assert s.backup(src[:T], keys[:1]) == T
    other = stacks()
    a = other.backend.client.alloc([page_key(keys[1])], parents=[page_key(keys[0])])  # held
    assert s.backup(src, keys) == 0
    assert answers(s.calls, "batch_set_v1")[-1] == [True, False, True]
    st = s.backend.counters()
    assert (st["set_existed"], st["set_inflight"], st["set_stored"]) == (1, 1, 2)
    a.abort()
    assert s.backup(src, keys) == 3 * T


def test_tp_ranks_get_one_hit_length(stacks):
    """Two TP ranks (each its own KV heads, its own namespace) of one
    group: each rank's hit query gets the group's minimum, so both prefetch
    the same prefix (what SGLang's all_reduce would agree on)."""
    r0, r1 = stacks(tp=(0, 2)), stacks(tp=(1, 2))
    assert r0.backend.group == r1.backend.group
    tokens, keys = hashes_of(4, seed=6)
    s0, s1 = r0.alloc(4), r1.alloc(4)
    d0 = r0.fill(s0, 5)
    r1.fill(s1, 6)
    assert r0.backup(s0, keys) == 4 * T
    assert r1.backup(s1[:2 * T], keys[:2]) == 2 * T
    h0, done0, dst0 = r0.prefetch(tokens)
    h1, done1, _ = r1.prefetch(tokens)
    assert (h0, done0, h1, done1) == (2 * T, 2 * T, 2 * T, 2 * T)
    assert same([r0.page(dst0, i) for i in range(2)], d0[:2])
    # a backend outside the TP group (TP 1) has another namespace: nothing
    assert stacks().prefetch(tokens) == (0, 0, None)


# --- what the backend adds ------------------------------------------------------------------
def test_get_stats_gives_sglang_storage_metrics(stacks):
    """--enable-hicache-storage-metrics: get_stats() is SGLang's StorageMetrics
    (pages and GB/s per call since the last get_stats), which SGLang's
    collector logs; counters() the totals."""
    s = stacks(metrics=True)
    tokens, keys = hashes_of(3, seed=8)
    src = s.alloc(3)
    s.fill(src, 8)
    s.backup(src, keys)
    s.prefetch(tokens)
    m = s.backend.get_stats()
    assert isinstance(m, StorageMetrics)
    assert (m.backup_pgs, m.prefetch_pgs) == ([3], [3])
    assert m.prefetch_bandwidth[0] > 0 and m.backup_bandwidth[0] > 0
    m.prefetch_stats = {}  # what UnifiedRadixCache adds before logging it
    try:
        from sglang.srt.observability.metrics_collector import StorageMetricsCollector
        StorageMetricsCollector(labels={"storage_backend": "kvcached"}).log_storage_metrics(m)
    except ImportError:  # prometheus_client is not installed: the type is checked above
        pass
    assert s.backend.get_stats().prefetch_pgs == []
    assert s.backend.counters()["get_ok"] == 3


def test_session_hints_follow_extra_info_and_name_only_pages_that_came_through(daemon, stacks):
    """SGLang 0.5.23 passes no extra_info.extra_info; where a caller does
    ({"session", "retain_s"}), the pages batch_set_v1 stored and
    batch_get_v1 loaded are named the session's, never a failed page."""
    s = stacks()
    b = s.backend
    tokens, keys = hashes_of(4, seed=5)
    src = s.alloc(4)
    s.fill(src, 6)
    assert s.backup(src[:2 * T], keys[:2]) == 2 * T
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 0
    info = HiCacheStorageExtraInfo(prefix_keys=keys[:2],
                                   extra_info={"session": "conv-7", "retain_s": 60})
    assert b.batch_set_v1(keys[2:], src[2 * T:], info) == [True] * 2
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 1
    b.client.delete([page_key(keys[3])])
    assert b.batch_get_v1(keys, s.alloc(4), info) == [True, True, True, False]
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 2
    assert daemon.metric("kvcached_hint_keys_unmatched_total") == 0
    b.hint_finished("conv-7", "tool_calls")
    b.hint_end("conv-7")
    assert daemon.metric('kvcached_hint_finished_total{stop="tool_use"}') == 1
    assert daemon.metric('kvcached_hints_total{kind="end"}') == 1
    assert b.set_priority(keys[:2], 10) == [0, 0]


# --- the reference engine as the judge ------------------------------------------------------


def engine(stack, p, load=False, save=False):
    """The reference engine as an SGLang worker: prefetch the stored prefix
    through the controller (the whole pages before the last token, as
    prefetch_from_storage page-aligns its key), copy it host -> device,
    prefill the rest, back the prompt's full pages up (device -> host, then
    the controller). The two copies stand in for SGLang's L2 kernels."""
    model = reference_model()
    cache = PagedKVCache(CFG, num_pages=-(-(len(p) + NEW) // T) + 3, page_tokens=T)
    cache.alloc(3)  # this worker's pages are not 0.. like another's
    pages = cache.alloc(cache.pages_for(len(p) + NEW))
    out = {"hit": 0, "loaded": 0, "stored": 0}
    start = 0
    if load:
        aligned = (len(p) - 1) // T * T
        hit, done, hidx = stack.prefetch(p[:aligned])
        if done:
            l2_copy(stack.host, cache.kv, pages[:done // T], hidx, to_device=True)
        out.update(hit=hit, loaded=done)
        start = done
    out["logits"] = model.prefill(cache, pages, p, start=start)
    if save:
        hashes = get_storage_hash_str(p[:len(p) // T * T], None, page_size=T)  # full pages
        hidx = stack.alloc(len(hashes))
        l2_copy(stack.host, cache.kv, pages[:len(hashes)], hidx, to_device=False)
        out["stored"] = stack.backup(hidx, hashes)
    out["tokens"] = model.generate(cache, pages, p, NEW, start=len(p))
    return out


def l2_copy(host, kv, device_pages, hidx, to_device):
    """The stand-in for SGLang's device <-> host KV copies (load_to_device_per_layer /
    backup_from_device_all_layer run sgl_kernel transfer_kv_* on a GPU):
    engine page ep of layer l [2, T, H, D] <-> the host page's [2, T, H, D]."""
    for i, ep in enumerate(device_pages):
        p = host.get_data_page(int(hidx[i * T]), flat=False)
        for l, t in enumerate(kv):
            h = {"layer_first": lambda: p[:, l], "page_first_direct": lambda: p[:, 0, l],
                 "page_first": lambda: p[:, :, l]}[host.layout]()
            if to_device:
                t[:, ep].copy_(h)
            else:
                h.copy_(t[:, ep])


# the reference engine and its judge, as the other engine tests use them
from test_engine import assert_exact, prompt, recompute, reference_model, rel  # noqa: E402,F401


def test_a_prefix_moves_between_two_workers_and_output_matches_recompute(stacks):
    """Worker A stores a prompt's KV; worker B (another layout, another
    session) loads the shared 6-page prefix through SGLang's prefetch,
    computes only the rest, and its logits and greedy tokens equal a full
    recompute. (Whole prefix pages swapped would not show here: attention
    over the prefix does not depend on the order of its pages, RoPE being
    in K; the byte-for-byte tests above catch that.)"""
    a = stacks(layout="layer_first")
    ra = engine(a, prompt(1), save=True)
    assert ra["stored"] == 7 * T  # 117 tokens: 7 full pages
    assert_exact(ra, prompt(1))
    b = stacks(layout="page_first_direct")
    b.alloc(5)
    rb = engine(b, prompt(2), load=True)
    assert (rb["hit"], rb["loaded"]) == (PREFIX, PREFIX)
    assert_exact(rb, prompt(2))


def test_a_corrupted_block_is_recomputed_and_output_stays_exact(daemon, stacks):
    """A block changed after COMMIT: loaded unchecked (verify off), the
    output shows it; checked (the default), batch_get_v1 answers it False,
    SGLang's prefetch stops there and the engine recomputes the rest."""
    a = stacks()
    engine(a, prompt(1), save=True)
    keys = get_storage_hash_str(prompt(1)[:PREFIX], None, page_size=T)
    scale_block(a.backend.client, page_key(keys[2]))
    u = stacks(verify=False)
    ru = engine(u, prompt(2), load=True)
    assert ru["loaded"] == PREFIX and rel(ru["logits"], recompute(prompt(2))[0]) > 1e-3
    b = stacks(layout="page_first_direct")
    rb = engine(b, prompt(2), load=True)
    assert (rb["hit"], rb["loaded"]) == (PREFIX, 2 * T)
    assert answers(b.calls, "batch_get_v1") == [[True, True, False, True, True, True]]
    assert b.backend.counters()["get_corrupt"] == 1
    assert_exact(rb, prompt(2))
    assert daemon.metric("kvcached_pinned_blocks") == 0
