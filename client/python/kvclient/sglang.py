"""kvclient.sglang: kvcached as SGLang's HiCache storage backend (its L3).

    python -m sglang.launch_server --model-path M --enable-hierarchical-cache \\
        --hicache-mem-layout page_first_direct \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvcached",
            "module_path": "kvclient.sglang", "class_name": "KvcachedStorage",
            "interface_v1": 1, "socket": "/run/kvcached/kvcached.sock", "tenant": "t"}'

"interface_v1": 1 is what makes SGLang call the zero-copy batch_get_v1 /
batch_set_v1 of a dynamic backend (without it SGLang uses the deprecated
get/batch_get/batch_set on flat page copies, which work too).
"hicache_storage_pass_prefix_keys": true (SGLang's own key, taken out of
the extra config by SGLang) passes each node's preceding page hashes, so
the first page of a node gets the page before it as its parent.

Interface followed: SGLang 0.5.23 as installed (its Python code), and the
tests (tests/test_sglang.py) run that code rather than a copy of it:
  - sglang/srt/mem_cache/hicache_storage.py: HiCacheStorage (v1 and v2
    calls, register_mem_pool_host, register_mem_host_pool_v2,
    on_host_pools_registered), HiCacheStorageConfig,
    HiCacheStorageExtraInfo, PoolName, PoolTransfer, PoolHitPolicy,
    PoolTransferResult;
  - sglang/srt/mem_cache/storage/backend_factory.py: StorageBackendFactory
    builds the dynamic backend as class(storage_config, kwargs);
  - sglang/srt/managers/cache_controller.py (HiCacheController) and
    sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py
    (HybridCacheController, which every UnifiedRadixCache uses, a dense
    model's too): attach_storage_backend (the factory, then
    register_mem_pool_host(the KV host pool), register_mem_host_pool_v2 for
    every pool of the host pool group, on_host_pools_registered), the hit
    query (batch_exists over all the request's page hashes at once in
    HybridCacheController, STORAGE_BATCH_SIZE = 128 at a time in
    HiCacheController; batch_exists_v2 when the request has other pools),
    the prefetch, 128 pages a call (batch_get_v1 with host_indices = the
    pages' token slots in the host pool, len(keys) * page_size of them,
    page-aligned; batch_get_v2 for the other pools), the backup, 128 pages
    a call (batch_set_v1; batch_set_v2 for the other pools), get_stats()
    for --enable-hicache-storage-metrics, and close() on detach;
  - the host pools: sglang/srt/mem_cache/pool_host/mha.py
    MHATokenToKVPoolHost and pool_host/mla.py MLATokenToKVPoolHost
    (kv_buffer by --hicache-mem-layout, page_size, get_data_page /
    get_dummy_flat_data_page / set_from_flat_data_page).

Pools: the dense KV pool only, MHATokenToKVPoolHost (K and V of one head
dim) or MLATokenToKVPoolHost (the latent cache), in the layouts
layer_first, page_first_direct or page_first. Any other host pool
registered as the KV pool (hybrid and MXFP8 pools, page_head,
page_unified, DCP) is refused by register_mem_pool_host with an error
saying so. The v2 calls hold the KV pool (PoolName.KV) alone: another pool
(Mamba or SWA state, an indexer, a draft model's KV, DeepSeek V4's
compressed pools) registered with the KV pool at attach makes
on_host_pools_registered raise (SGLang's contract: the attach fails, the
server does not start with a backend that cannot keep its pools); one
registered later (a draft sidecar) is logged once and answered False in
batch_get_v2 / batch_set_v2, and batch_exists_v2 answers no hit for a
request that needs it, so SGLang recomputes. HiCacheStorageConfig:
should_split_heads (SGLang sets it for page_head pools with tp_lcm_size >
tp_size: each rank's heads split in tp_lcm_size / tp_size shares) is
refused; tp_lcm_size alone is accepted and has no effect: an MHA page is
kept per TP rank and size (HELLO's layout), so only ranks of the same TP
size share it (others miss, never read another split's bytes), and an MLA
page is shared by every rank of any TP size.

One SGLang page is one kvcached block, in the block format of
kvclient.paged ([layers][K, V][page_tokens][heads][dim]; MLA: the latent
vectors), so a block stored through batch_set_v1 from a layer_first host
pool loads into a page_first_direct one, and into any engine using
kvclient.paged with the same geometry. The key of a page is SGLang's page
hash (a SHA-256 hex digest chained over the pages' token ids: 32 bytes),
the parent of each page the page before it, so kvcached's LOOKUP answers
batch_exists (consecutive hits from the start) and evicts chains from the
end. Namespaces: HELLO's layout (geometry, dtype, TP rank and size: MLA
pools, replicated on every rank, declare TP 1 so every rank reads rank
0's blocks), the tenant, and a salt made of extra_config "salt", the
model name (with the host pool's format tag, as SGLang gives it) and, when
used, the PP and attention-CP rank.

Fail closed: batch_get_v1 answers True for a page only when its block was
found, passed its committed CRC (checked on the CPU in place before the
copy, kvc_verify) and was copied into the host page; every other page is
False, so SGLang's prefetch stops at it and recomputes. A block that fails
its CRC is reported to the daemon (which checks its copy and drops it).
batch_set_v1 answers True for a page stored now or already stored (and
committed) by another worker, False for one that could not be stored or
that another worker is still writing (it may abort: one LOOKUP tells).

Holes (a page missing or failed in the middle of a prefix): batch_get_v1
loads every page it is asked for, past a failed one too, and answers
each page for itself, so an engine able to use the pages after a hole
has them. SGLang 0.5.23 does not: batch_exists answers one count of
leading pages (its interface), HiCacheController._page_get_zero_copy
counts the pages up to the first False, _page_transfer asks for no later
batch, and the radix cache inserts only that leading run and frees the
host pages after it (client/python/ENGINES.md, "Holes in a cached
prefix").

Extra config keys: socket (default $KVCACHED_SOCKET, else
/run/kvcached/kvcached.sock), tenant ("default"), salt (a string), group
(the TP group's name; default one per model, DP rank and PP rank when
tp_size > 1), prio (0..255, the stored blocks' priority, default 128),
verify (default true), timeout_ms, reconnect_s (default 1: after the daemon
went away, how often a call tries to open the session again; meanwhile
every page is answered as failed).

Engine hints (protocol 1.3; tiers/EVICTION.md): SGLang's HiCacheStorage
interface does not tell a backend which request or session a page is for,
nor when a request or session ends (no callback; the controller's
terminate_prefetch and the radix tree's frees stay inside SGLang), so with
SGLang as it is (0.5.23) no hint reaches the daemon and eviction runs on
what the daemon sees alone. Where the caller's
HiCacheStorageExtraInfo.extra_info carries {"session": name or id,
"retain_s": seconds}, the pages batch_set_v1 stored and batch_get_v1 loaded
are named the session's (SESSION, after their COMMIT or LOAD).
hint_finished(session, stop) and hint_end(session) are there for an engine
that learns when a request or a session ends; set_priority(keys, prio)
lowers (or raises) stored pages' priority through SET_PRIORITY.

Threads: SGLang calls the backend from its prefetch, prefetch-IO and
backup threads at once; one libkvclient handle is used by one thread at a
time, so the calls are serialised on a lock.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import threading
import time
from typing import Any, List, Optional

try:
    from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                      HiCacheStorageExtraInfo)
except ImportError as e:  # noqa: F841 - named in the message
    raise ImportError("kvclient.sglang needs SGLang (sglang.srt.mem_cache.hicache_storage "
                      f"could not be imported: {e}); `import kvclient` works without it") from e
try:  # the v2 interface's types (SGLang 0.5.23)
    from sglang.srt.mem_cache.hicache_storage import (PoolHitPolicy, PoolName,
                                                      PoolTransferResult)
except ImportError:  # an SGLang before the v2 interface never calls it
    PoolHitPolicy = PoolName = PoolTransferResult = None

from . import _lib
from .client import G2, TIER_NONE, Client, Layout, _blocks
from .errors import CODES, KvError
from .paged import PagedKV, PagedLayout, dtype_name

KV_EEXISTS = CODES["KV_EEXISTS"]
KV_ECORRUPT = CODES["KV_ECORRUPT"]
# a session the daemon is gone from (stopped, restarted)
_LOST = {-errno.EPIPE, -errno.ECONNRESET, -errno.ENOTCONN, -errno.ECONNREFUSED, -errno.ENOENT,
         -errno.EBADF}

logger = logging.getLogger(__name__)

__all__ = ["KvcachedStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo", "page_key"]

# the host layouts whose pages this backend copies (--hicache-mem-layout)
LAYOUTS = ("layer_first", "page_first", "page_first_direct")
_KV = "kv"  # PoolName.KV's value


def page_key(key: str) -> bytes:
    """The kvcached key of an SGLang page key: its SHA-256 digest's 32 bytes
    (SGLang's get_hash_str), or the SHA-256 of any other string."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


class KvcachedStorage(HiCacheStorage):
    """SGLang's L3 in kvcached (see the module's docstring).

    storage_config: SGLang's HiCacheStorageConfig (extra_config holds the
    options); kwargs: what the factory passes (unused). The session opens
    when SGLang registers its host pool (register_mem_pool_host), whose
    layout decides the blocks' geometry.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        _check_config(storage_config)
        x = dict(storage_config.extra_config or {})
        self.socket = x.get("socket")
        self.tenant = str(x.get("tenant", "default"))
        self.prio = int(x.get("prio", 128))
        self.verify = bool(x.get("verify", True))
        self.timeout_ms = int(x.get("timeout_ms", 0))
        self.reconnect_s = float(x.get("reconnect_s", 1.0))
        self._lost, self._tried = False, 0.0
        c = storage_config
        salt = [str(x.get("salt", "")), c.model_name or ""]
        if c.pp_size > 1:
            salt.append(f"pp{c.pp_rank}/{c.pp_size}")
        if getattr(c, "attn_cp_size", 1) > 1:
            salt.append(f"cp{c.attn_cp_rank}/{c.attn_cp_size}")
        self.salt = "\0".join(salt).encode() if any(salt) else b""
        self.replicated = bool(c.is_mla_model)
        self.tp = (0, 1) if self.replicated else (c.tp_rank, c.tp_size)
        group = x.get("group")
        if group is None and self.tp[1] > 1:
            group = f"sglang:{c.model_name or ''}:dp{getattr(c, 'dp_rank', 0)}:pp{c.pp_rank}"
        self.group = group
        self.client: Client | None = None
        self.layout: PagedLayout | None = None
        self.pk: PagedKV | None = None
        self.mem_pool_host = None
        self.refused: dict[str, str] = {}   # pools SGLang registered that this backend cannot hold
        self._attached = False              # on_host_pools_registered came
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.stats = {"exists_calls": 0, "exists_pages": 0, "exists_hits": 0,
                      "get_pages": 0, "get_ok": 0, "get_missing": 0, "get_corrupt": 0,
                      "get_failed": 0, "set_pages": 0, "set_stored": 0, "set_existed": 0,
                      "set_failed": 0, "get_seconds": 0.0, "set_seconds": 0.0, "reconnects": 0,
                      "hints": 0, "set_inflight": 0}
        # SGLang's StorageMetrics samples since the last get_stats()
        self._samples = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []}

    # --- life ------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Opens the session for SGLang's KV host pool (MHATokenToKVPoolHost or
        MLATokenToKVPoolHost; layer_first, page_first or page_first_direct).
        Any other pool is refused (ValueError / NotImplementedError: SGLang's
        attach fails and says why)."""
        pool = mem_pool_host
        mla = _pool_kind(pool) == "mla"
        if pool.layout not in LAYOUTS:
            raise NotImplementedError(
                f"kvcached: SGLang host layout {pool.layout!r} is not supported "
                f"(--hicache-mem-layout {' / '.join(LAYOUTS)})")
        if getattr(pool, "dcp_size", 1) != 1:
            raise NotImplementedError("kvcached: a decode-context-parallel (DCP) host pool is "
                                      "not supported")
        if getattr(pool, "kv_buffer", None) is None:
            raise NotImplementedError("kvcached: the host pool has no KV buffer (an "
                                      "allocator-only pool) to copy pages from")
        if mla != bool(self.config.is_mla_model):
            raise ValueError(f"kvcached: {type(pool).__name__} does not match "
                             f"HiCacheStorageConfig.is_mla_model={self.config.is_mla_model}")
        super().register_mem_pool_host(pool)
        buf = pool.kv_buffer
        self.mla = mla
        self.page_tokens = P = int(pool.page_size)
        if pool.layout == "page_first":
            # one layer's page is not contiguous here: no kernel description
            # (kvclient.paged), so pages are copied by torch, slot to page
            layout = None
            L = int(buf.shape[1] if mla else buf.shape[2])
            H, D = (1, int(buf.shape[-1])) if mla else (int(buf.shape[3]), int(buf.shape[4]))
            E = buf.element_size()
            cl = Layout(block_bytes=(1 if mla else 2) * L * P * H * D * E, tokens_per_block=P,
                        layers=L, kv_heads=H, head_dim=D, dtype=dtype_name(buf.dtype),
                        tp_rank=self.tp[0], tp_size=self.tp[1])
        else:
            layout = PagedLayout.sglang_host(buf, pool.layout, P, mla=mla)
            cl = layout.client_layout(1, self.tp[0], self.tp[1])
        with self._lock:
            self.layout, self.client_layout, self.block_bytes = layout, cl, cl.block_bytes
            self._open()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """SGLang's HybridCacheController registers every pool of its host
        pool group here (the KV pool, registered before through
        register_mem_pool_host, and Mamba, SWA, indexer, draft pools). This
        backend holds the KV pool alone: any other is refused at
        on_host_pools_registered, or, registered after it (a draft
        sidecar), logged once and answered False."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        if _pool_name(host_pool_name) == _KV and host_pool is self.mem_pool_host:
            return
        name = _pool_name(host_pool_name)
        self.refused[name] = type(host_pool).__name__
        if self._attached:
            self._refuse_once(name, "registered")

    def on_host_pools_registered(self) -> None:
        """The end of SGLang's attach: raises (the attach fails) when a pool
        this backend cannot hold came with the KV pool."""
        self._attached = True
        if self.refused:
            pools = ", ".join(f"{n} ({t})" for n, t in self.refused.items())
            raise NotImplementedError(
                f"kvcached stores SGLang's dense KV pool only (MHA or MLA); this model's HiCache "
                f"also has {pools}, which it cannot store: run it without "
                "--hicache-storage-backend or with a backend that stores those pools")

    def _holds(self, name) -> bool:
        return _pool_name(name) == _KV and _pool_name(name) not in self.refused

    def _refuse_once(self, name: str, what: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            logger.warning("kvcached stores SGLang's dense KV pool only: pool %r (%s, %s) is not "
                           "stored; its pages are answered False and a prefix that needs it is "
                           "recomputed", name, self.refused.get(name, "not registered"), what)

    def _open(self) -> None:
        """(Re)opens the session (under the lock)."""
        client = Client(self.socket, tenant=self.tenant, layout=self.client_layout,
                        salt=self.salt, group=self.group, timeout_ms=self.timeout_ms, g1=False)
        if self.client is not None:
            self.client.close()
        self.client = client
        self.pk = (PagedKV(client, self.layout, pages_per_block=1, verify=self.verify)
                   if self.layout is not None else None)

    def close(self) -> None:
        """Closes the session (SGLang calls it when the backend is detached)."""
        with self._lock:
            if self.client is not None:
                self.client.close()
            self.client = self.pk = None

    def _need(self) -> Client:
        """The session (under the lock); a lost one is opened again first, at
        most once per reconnect_s (a failed attempt leaves the dead session,
        whose calls fail and are answered as failed pages)."""
        if self.client is None:
            raise RuntimeError("KvcachedStorage: no host pool registered "
                               "(register_mem_pool_host opens the session)")
        if self._lost and time.monotonic() - self._tried >= self.reconnect_s:
            self._tried = time.monotonic()
            try:
                self._open()
                self._lost = False
                self.stats["reconnects"] += 1
                logger.warning("kvcached session opened again")
            except KvError as e:
                logger.warning("kvcached still unreachable: %s", e)
        return self.client

    def _note(self, e: KvError) -> None:
        """Marks the session lost when e says the daemon went away."""
        if e.code in _LOST:
            self._lost = True

    def _hint(self, c: Client, extra_info, kk, res) -> None:
        """SESSION for the pages that came through, when the caller named a
        session in extra_info.extra_info. Best effort (a daemon before 1.3
        takes none)."""
        info = getattr(extra_info, "extra_info", None)
        if not isinstance(info, dict) or info.get("session") in (None, ""):
            return
        done = [k for k, ok in zip(kk, res) if ok]
        if not done:
            return
        try:
            for lo in range(0, len(done), _lib.BATCH_MAX):
                c.hint_session(info["session"], done[lo:lo + _lib.BATCH_MAX],
                               int(info.get("retain_s", 0) or 0))
            self.stats["hints"] += 1
        except KvError as e:
            self._note(e)
            logger.debug("kvcached session hint: %s", e)

    def _pages(self, host_indices, n: int) -> list[int]:
        """Host pool page ids of the n pages whose token slots are host_indices."""
        P = self.page_tokens
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) < n * P:
            raise ValueError(f"{len(idx)} host indices for {n} pages of {P} tokens")
        pages = []
        for i in range(n):
            first = int(idx[i * P])
            if first % P:
                raise ValueError(f"host index {first} of page {i} is not page-aligned")
            pages.append(first // P)
        return pages

    # --- the zero-copy interface -------------------------------------------------
    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many of keys, from the first, are stored (one LOOKUP per 4096)."""
        kk = [page_key(k) for k in keys]
        hit = 0
        with self._lock:
            c = self._need()
            try:
                for lo in range(0, len(kk), _lib.BATCH_MAX):
                    h, _ = c.lookup(kk[lo:lo + _lib.BATCH_MAX])
                    hit += h
                    if h < min(_lib.BATCH_MAX, len(kk) - lo):
                        break
            except KvError as e:  # an exception would end SGLang's prefetch thread
                self._note(e)
                logger.warning("kvcached lookup failed, answering %d pages: %s", hit, e)
            self.stats["exists_calls"] += 1
            self.stats["exists_pages"] += len(kk)
            self.stats["exists_hits"] += hit
        return hit

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Loads each page's block into its host page: LOAD, check, copy,
        RELEASE. One boolean per page: True only for a page now in the pool."""
        n = len(keys)
        res = [False] * n
        if n == 0:
            return res
        t0 = time.perf_counter()
        pages = self._pages(host_indices, n)
        kk = [page_key(k) for k in keys]
        with self._lock:
            c = self._need()
            for lo in range(0, n, _lib.BATCH_MAX):
                hi = min(lo + _lib.BATCH_MAX, n)
                self._get_batch(c, kk[lo:hi], pages[lo:hi], res, lo)
            self._hint(c, extra_info, kk, res)
            self.stats["get_pages"] += n
            self.stats["get_ok"] += sum(res)
            self._sample("prefetch", sum(res), time.perf_counter() - t0)
        return res

    def _get_batch(self, c: Client, kk, pages, res, lo: int) -> None:
        m = len(kk)
        ka = _lib.keys_array(kk)
        try:
            out = c._load_raw(ka, m, G2)
        except KvError as e:
            logger.warning("kvcached load of %d pages failed: %s", m, e)
            self._note(e)
            self.stats["get_failed"] += m
            return
        got = _blocks(out, m)  # [(status, tier, ptr, length)]
        bb = self.block_bytes
        L = _lib.lib()
        ok = []
        try:
            for j, (st, _, ptr, ln) in enumerate(got):
                if st != 0:
                    self.stats["get_missing" if st == CODES["KV_ENOTFOUND"] else "get_failed"] += 1
                    continue
                if ln < bb:
                    self.stats["get_failed"] += 1
                    continue
                if self.verify:
                    rc = L.kvc_verify(c._handle(), ctypes.byref(ka[j]),
                                      ctypes.byref(out[j]))
                    if rc != 0:
                        self.stats["get_corrupt" if rc == KV_ECORRUPT else "get_failed"] += 1
                        continue
                ok.append(j)
            if ok:
                try:
                    if self.pk is None:
                        for j in ok:
                            self._page_view(pages[j]).copy_(self._slot(got[j][2]))
                    else:
                        self.pk._into_pages([(G2, got[j][2]) for j in ok],
                                            [pages[j] for j in ok], 0)
                except KvError:
                    self.stats["get_failed"] += len(ok)
                    ok = []
            for j in ok:
                res[lo + j] = True
        finally:  # every pin this LOAD took (a CRC report took its own)
            pinned = [kk[j] for j in range(m) if out[j].status == 0]
            if pinned:
                try:
                    c.release(pinned)
                except KvError as e:  # the session's end drops them anyway
                    self._note(e)
                    logger.warning("kvcached release failed: %s", e)

    def batch_set_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Stores each host page as a block: ALLOC (parent: the page before;
        for the first, the last of extra_info.prefix_keys), copy, COMMIT.
        One boolean per page: True when the page is stored (by this call or
        already by another worker)."""
        n = len(keys)
        res = [False] * n
        if n == 0:
            return res
        t0 = time.perf_counter()
        pages = self._pages(host_indices, n)
        kk = [page_key(k) for k in keys]
        prefix = extra_info.prefix_keys if extra_info is not None else None
        parent = page_key(prefix[-1]) if prefix else None
        with self._lock:
            c = self._need()
            for lo in range(0, n, _lib.BATCH_MAX):
                hi = min(lo + _lib.BATCH_MAX, n)
                parents = [kk[i - 1] if i else parent for i in range(lo, hi)]
                self._set_batch(c, kk[lo:hi], parents, pages[lo:hi], res, lo)
            self._hint(c, extra_info, kk, res)
            self.stats["set_pages"] += n
            self._sample("backup", sum(res), time.perf_counter() - t0)
        return res

    def _set_batch(self, c: Client, kk, parents, pages, res, lo: int) -> None:
        try:
            a = c.alloc(kk, parents=parents, prio=self.prio)
        except KvError as e:
            logger.warning("kvcached alloc of %d pages failed: %s", len(kk), e)
            self._note(e)
            self.stats["set_failed"] += len(kk)
            return
        with a:
            got, exist = [], []
            for j, b in enumerate(a.blocks):
                if b.status == KV_EEXISTS:
                    exist.append(j)
                elif b.ok:
                    got.append((j, b))
                else:
                    self.stats["set_failed"] += 1
            if exist:
                self._existing(c, kk, exist, res, lo)
            if not got:
                return
            try:
                if self.pk is None:
                    for j, b in got:
                        self._slot(b.ptr).copy_(self._page_view(pages[j]))
                else:
                    self.pk._from_pages([b for _, b in got], [pages[j] for j, _ in got],
                                        range(len(got)))
            except KvError:
                self.stats["set_failed"] += len(got)
                a.abort()
                return
            try:
                st = a.commit([j for j, _ in got])
            except KvError as e:
                logger.warning("kvcached commit of %d pages failed: %s", len(got), e)
                self._note(e)
                self.stats["set_failed"] += len(got)
                return
            for (j, _), s in zip(got, st):
                if s == 0 or s == KV_EEXISTS:
                    res[lo + j] = True
                    self.stats["set_stored" if s == 0 else "set_existed"] += 1
                else:
                    self.stats["set_failed"] += 1

    def _existing(self, c: Client, kk, exist, res, lo: int) -> None:
        """Pages whose ALLOC found the key (KV_EEXISTS): stored already, or
        being written by another worker, which may still abort. One LOOKUP
        tells them apart; only a committed block answers True (fail closed:
        SGLang backs the other pages up again later)."""
        try:
            _, tiers = c.lookup([kk[j] for j in exist])
        except KvError as e:
            self._note(e)
            tiers = [TIER_NONE] * len(exist)
        for j, t in zip(exist, tiers):
            if t != TIER_NONE:
                res[lo + j] = True
                self.stats["set_existed"] += 1
            else:
                self.stats["set_inflight"] += 1

    def _page_view(self, hp: int):
        """Host page hp of a page_first pool, in the block's order (a view)."""
        buf, P = self.mem_pool_host.kv_buffer, self.page_tokens
        if self.mla:
            return buf[hp * P:(hp + 1) * P].transpose(0, 1)      # [L, P, 1, D]
        return buf[:, hp * P:(hp + 1) * P].permute(2, 0, 1, 3, 4)  # [L, 2, P, H, D]

    def _slot(self, ptr: int):
        """A G2 slot as a tensor of the page's block shape (no copy)."""
        torch = _torch()
        buf = self.mem_pool_host.kv_buffer
        raw = (ctypes.c_uint8 * self.block_bytes).from_address(ptr)
        t = torch.frombuffer(raw, dtype=torch.uint8).view(buf.dtype)
        return t.view(tuple(self._page_view(0).shape))

    # --- the v2 interface (per pool) --------------------------------------------
    def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """SGLang's hit query for a request with other pools (PoolTransfer
        each): the KV prefix batch_exists finds, cut to nothing when a pool
        this backend does not hold must be present too (hit policies
        ALL_PAGES and TRAILING_PAGES; BLOCK_GROUPS never gates the KV hit)."""
        kv = self.batch_exists(keys, extra_info)
        final = kv
        hits = {PoolName.KV: kv} if kv else {}
        for t in pool_transfers or ():
            if self._holds(t.name):
                continue
            self._refuse_once(_pool_name(t.name), "batch_exists_v2")
            if t.hit_policy != PoolHitPolicy.BLOCK_GROUPS:
                final = 0
        return PoolTransferResult(final, hits, list(range(1, final + 1)))

    def batch_get_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict:
        """Per pool, one boolean per key: the KV pool's pages as batch_get_v1
        loads them (keys, host_indices of the transfer); False for every
        page of another pool."""
        return self._v2(transfers, extra_info, self.batch_get_v1, "batch_get_v2")

    def batch_set_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict:
        """Per pool, one boolean per key: the KV pool's pages as batch_set_v1
        stores them; False for every page of another pool."""
        return self._v2(transfers, extra_info, self.batch_set_v1, "batch_set_v2")

    def _v2(self, transfers, extra_info, op, what: str) -> dict:
        out: dict = {}
        for t in transfers:
            keys = list(t.keys or [])
            res = [False] * len(keys)
            hidx = t.host_indices
            if not self._holds(t.name):
                self._refuse_once(_pool_name(t.name), what)
            elif hidx is None or int(hidx.numel()) != len(keys) * self.page_tokens:
                logger.error("kvcached %s: %s host indices for %d pages of %d tokens", what,
                             None if hidx is None else int(hidx.numel()), len(keys),
                             self.page_tokens)
            elif keys:
                res = list(op(keys, hidx, extra_info))
            # two transfers of one pool (each its own keys): one list, in order
            out.setdefault(t.name, []).extend(res)
        return out

    # --- the generic interface (flat page copies) --------------------------------
    def _block_view(self, flat):
        """A view of one flat page (get_data_page / get_dummy_flat_data_page of
        the registered host pool) in the block's order: MHA [layers, 2,
        page_tokens, heads, dim], MLA [layers, page_tokens, 1, dim]."""
        torch = _torch()
        pool = self.mem_pool_host
        buf = pool.kv_buffer
        t = flat.contiguous() if not flat.is_contiguous() else flat
        if t.dtype != buf.dtype:
            t = t.view(torch.uint8).view(buf.dtype)
        P = self.page_tokens
        if self.mla:  # [L, tokens, 1, D] (layer_first), [tokens, L, 1, D] (page_first),
            if pool.layout == "page_first_direct":  # [pages, L, P, 1, D]
                L, rest = int(buf.shape[1]), tuple(buf.shape[3:])
            elif pool.layout == "page_first":
                L, rest = int(buf.shape[1]), tuple(buf.shape[2:])
            else:
                L, rest = int(buf.shape[0]), tuple(buf.shape[2:])
            if pool.layout == "page_first":
                return t.view(P, L, *rest).permute(1, 0, *range(2, 2 + len(rest)))
            return t.view(L, P, *rest)
        if pool.layout == "page_first_direct":  # [2, pages, L, P, H, D]
            L, rest = int(buf.shape[2]), tuple(buf.shape[4:])
            return t.view(2, L, P, *rest).transpose(0, 1)
        if pool.layout == "page_first":         # [2, tokens, L, H, D]
            L, rest = int(buf.shape[2]), tuple(buf.shape[3:])
            return t.view(2, P, L, *rest).permute(2, 0, 1, 3, 4)
        L, rest = int(buf.shape[1]), tuple(buf.shape[3:])  # layer_first [2, L, tokens, H, D]
        return t.view(2, L, P, *rest).transpose(0, 1)

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Stores one flat page (the host pool's get_data_page)."""
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat pages; True when every page is stored (now or before)."""
        torch = _torch()
        kk = [page_key(k) for k in keys]
        stored = 0
        with self._lock:
            c = self._need()
            self.stats["set_pages"] += len(kk)
            try:
                with c.alloc(kk, parents=[kk[i - 1] if i else None for i in range(len(kk))],
                             prio=self.prio) as a:
                    todo = []
                    for j, b in enumerate(a.blocks):
                        if b.status == KV_EEXISTS:
                            self.stats["set_existed"] += 1
                            stored += 1
                        elif b.ok:
                            blk = self._block_view(values[j]).contiguous().view(torch.uint8)
                            b.write(blk.numpy().tobytes())
                            todo.append(j)
                    for s in (a.commit(todo) if todo else []):
                        if s in (0, KV_EEXISTS):
                            stored += 1
                            self.stats["set_stored" if s == 0 else "set_existed"] += 1
            except KvError as e:
                logger.warning("kvcached store of %d pages failed: %s", len(kk), e)
                self._note(e)
            self.stats["set_failed"] += len(kk) - stored
        return stored == len(kk)

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        """One page into target_location (a flat page of the host pool, as
        get_dummy_flat_data_page makes); None when it is not stored or fails
        its CRC."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        """Flat pages into target_locations (or new ones); None for each page
        that is missing or failed its check."""
        torch = _torch()
        out = [None] * len(keys)
        with self._lock:
            c = self._need()
            self.stats["get_pages"] += len(keys)
            try:
                got = c.load([page_key(k) for k in keys])
            except KvError as e:
                logger.warning("kvcached load of %d pages failed: %s", len(keys), e)
                self._note(e)
                self.stats["get_failed"] += len(keys)
                return out
            with got:
                for j, b in enumerate(got.blocks):
                    if not b.ok:
                        self.stats["get_missing" if b.status == CODES["KV_ENOTFOUND"]
                                   else "get_failed"] += 1
                        continue
                    try:
                        data = b.read()  # a verified copy
                    except KvError as e:
                        self.stats["get_corrupt" if e.code == KV_ECORRUPT else "get_failed"] += 1
                        continue
                    dst = (target_locations[j] if target_locations is not None
                           else self.mem_pool_host.get_dummy_flat_data_page())
                    view = self._block_view(dst)
                    src = torch.frombuffer(bytearray(data[:self.block_bytes]), dtype=torch.uint8)
                    view.copy_(src.view(view.dtype).view(tuple(view.shape)))
                    out[j] = dst
                    self.stats["get_ok"] += 1
        return out

    # --- the rest -------------------------------------------------------------------
    def set_priority(self, keys: List[str], prio: int) -> List[int]:
        """Stored pages' eviction priority (0..255, lower goes first): the
        hint an engine gives when a request or session ends. Per-key statuses."""
        with self._lock:
            return self._need().set_priority([page_key(k) for k in keys], prio)

    def hint_finished(self, session, stop="unknown", retain_s: int = 0) -> None:
        """A request of `session` finished with stop reason `stop`
        ("end_turn", "tool_use", OpenAI's "stop", "tool_calls", ...)."""
        with self._lock:
            self._need().hint_finished(session, stop, retain_s=retain_s)

    def hint_end(self, session) -> None:
        """`session` is over: its pages may go first."""
        with self._lock:
            self._need().hint_end(session)

    def clear(self) -> None:
        """Deletes every block of this backend's namespace (pinned blocks stay)."""
        with self._lock:
            self._need().delete()

    def _sample(self, what: str, pages: int, seconds: float) -> None:
        self.stats[("get" if what == "prefetch" else "set") + "_seconds"] += seconds
        if self.config.enable_storage_metrics:
            self._samples[what + "_pgs"].append(pages)
            self._samples[what + "_bandwidth"].append(
                pages * self.block_bytes / max(seconds, 1e-9) / 1e9)

    def counters(self) -> dict:
        """Counters since start: pages asked, found, loaded, missing, corrupt,
        stored, already stored, failed, and seconds spent in get/set."""
        with self._lock:
            return dict(self.stats)

    def get_stats(self):
        """With --enable-hicache-storage-metrics: SGLang's StorageMetrics (pages
        and GB/s of each batch_get_v1 / batch_set_v1 since the last call),
        which its metrics collector requires (UnifiedRadixCache gives it a
        prefetch_stats attribute and logs it). Otherwise counters()."""
        if self.config.enable_storage_metrics:
            try:  # SGLang 0.5.23; before: sglang.srt.metrics.collector
                from sglang.srt.observability.metrics_collector import StorageMetrics
            except ImportError:
                try:
                    from sglang.srt.metrics.collector import StorageMetrics
                except ImportError:
                    return None  # SGLang takes None as no samples
            m = StorageMetrics()
            with self._lock:
                for k, v in self._samples.items():
                    getattr(m, k).extend(v)
                    v.clear()
            return m
        return self.counters()


def _torch():
    import torch
    return torch


def _pool_name(name) -> str:
    """A PoolName (a str enum) or a plain string, as its value."""
    return str(getattr(name, "value", name))


def _check_config(c: HiCacheStorageConfig) -> None:
    """Refuses what the backend cannot honour (the factory's error reaches
    SGLang's attach, which fails and says why)."""
    if getattr(c, "should_split_heads", False):
        raise NotImplementedError(
            "kvcached does not split a rank's KV heads into tp_lcm_size / tp_size shares "
            f"(HiCacheStorageConfig.should_split_heads, tp_lcm_size={c.tp_lcm_size}, "
            f"tp_size={c.tp_size}; SGLang sets it for --hicache-mem-layout page_head, which "
            "kvcached does not take): drop tp_lcm_size from the extra config")
    if getattr(c, "dcp_size", 1) != 1:
        raise NotImplementedError("kvcached does not support decode context parallelism "
                                  f"(dcp_size={c.dcp_size})")
    lcm = getattr(c, "tp_lcm_size", None)
    if lcm and lcm != c.tp_size and not c.is_mla_model:
        logger.info("kvcached: tp_lcm_size %d is not used: an MHA page is kept per TP rank and "
                    "size, so only ranks of TP size %d share it (ranks of another TP size miss)",
                    lcm, c.tp_size)


def _pool_kind(pool) -> str:
    """"mha" or "mla" for SGLang's dense KV host pools; anything else (a
    subclass with other buffers included) is refused."""
    try:
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    except ImportError:  # an SGLang before pool_host/
        from sglang.srt.mem_cache.memory_pool_host import (MHATokenToKVPoolHost,
                                                           MLATokenToKVPoolHost)
    t = type(pool)
    if t is MHATokenToKVPoolHost:
        return "mha"
    if t is MLATokenToKVPoolHost:
        return "mla"
    raise NotImplementedError(
        f"kvcached stores SGLang's dense KV host pools only (MHATokenToKVPoolHost, "
        f"MLATokenToKVPoolHost); got {t.__module__}.{t.__qualname__}")
