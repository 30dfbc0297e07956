"""A stand-in for the parts of SGLang that kvclient.sglang touches, for
tests on machines where SGLang cannot be installed. It follows
sgl-project/sglang at commit 001067fffe33427bee0ed2f007fb7551a1d76b44:

  - python/sglang/srt/mem_cache/hicache_storage.py: HiCacheStorage (the
    abstract get/batch_get/set/batch_set/exists, batch_exists' default,
    batch_get_v1/batch_set_v1 raising NotImplementedError,
    register_mem_pool_host, clear, get_stats), HiCacheStorageConfig,
    HiCacheStorageExtraInfo, STORAGE_BATCH_SIZE;
  - python/sglang/srt/mem_cache/storage/backend_factory.py:
    _create_dynamic_backend (import module_path, take class_name, check it
    subclasses HiCacheStorage, build it as class(storage_config, kwargs));
  - python/sglang/srt/managers/cache_controller.py: attach_storage_backend
    (register_mem_pool_host after creation; the zero-copy v1 calls for a
    dynamic backend only with extra_config "interface_v1"),
    _storage_hit_query, _page_transfer/_page_get_zero_copy,
    _page_backup/_page_set_zero_copy and the generic (flat page) variants;
  - python/sglang/srt/metrics/collector.py StorageMetrics (the four lists
    StorageMetricsCollector.log_storage_metrics reads);
  - python/sglang/srt/mem_cache/utils.py get_hash_str (page hashes,
    chained SHA-256 over 4-byte little-endian token ids);
  - python/sglang/srt/mem_cache/pool_host/mha.py MHATokenToKVPoolHost:
    init_kv_buffer's shapes per layout, get_data_page,
    get_dummy_flat_data_page, set_from_flat_data_page.

install() puts the module sglang.srt.mem_cache.hicache_storage into
sys.modules (with its parents), so `import kvclient.sglang` finds it.
"""
from __future__ import annotations

import hashlib
import importlib
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        pass

    @abstractmethod
    def exists(self, key) -> bool:
        pass

    def batch_exists(self, keys, extra_info=None) -> int:
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


def install():
    """Registers the stand-in as sglang.srt.mem_cache.hicache_storage."""
    names = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.metrics"]
    for n in names:
        if n not in sys.modules:
            m = types.ModuleType(n)
            m.__path__ = []
            sys.modules[n] = m
    mod = types.ModuleType("sglang.srt.mem_cache.hicache_storage")
    for name in ("HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo",
                 "STORAGE_BATCH_SIZE"):
        setattr(mod, name, globals()[name])
    sys.modules[mod.__name__] = mod
    col = types.ModuleType("sglang.srt.metrics.collector")
    col.StorageMetrics = StorageMetrics
    sys.modules[col.__name__] = col
    return mod


def storage_config(extra_config: dict, tp_rank=0, tp_size=1, model_name="tiny",
                   is_mla_model=False, layout="layer_first",
                   metrics=False) -> HiCacheStorageConfig:
    """What HiCacheController._generate_storage_config builds (no PP, CP, DP)."""
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=is_mla_model,
                                enable_storage_metrics=metrics,
                                is_page_first_layout=layout == "page_first",
                                model_name=model_name, extra_config=dict(extra_config))


def create_dynamic_backend(config: HiCacheStorageConfig, host_pool):
    """StorageBackendFactory.create_backend("dynamic", ...) then, as
    attach_storage_backend does, register_mem_pool_host. Returns (backend,
    zero_copy): whether the controller uses the v1 calls."""
    x = config.extra_config
    for f in ("backend_name", "module_path", "class_name"):
        if f not in x:
            raise ValueError(f"Missing required field '{f}' in backend config for 'dynamic' backend")
    cls = getattr(importlib.import_module(x["module_path"]), x["class_name"])
    base = sys.modules["sglang.srt.mem_cache.hicache_storage"].HiCacheStorage
    if not issubclass(cls, base):
        raise TypeError(f"Backend class {x['class_name']} must inherit from HiCacheStorage")
    backend = cls(config, {})
    backend.register_mem_pool_host(host_pool)
    return backend, bool(x.get("interface_v1", 0))


def get_hash_str(token_ids, prior_hash: Optional[str] = None, page_size: int = 16) -> List[str]:
    """The page hashes of the full pages of token_ids."""
    out = []
    for i in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256()
        if prior_hash:
            h.update(bytes.fromhex(prior_hash))
        for t in token_ids[i:i + page_size]:
            h.update(int(t).to_bytes(4, byteorder="little", signed=False))
        prior_hash = h.hexdigest()
        out.append(prior_hash)
    return out


class HostPool:
    """MHATokenToKVPoolHost's buffer and flat-page methods (CPU; pin_memory off)."""

    def __init__(self, layer_num, head_num, head_dim, size, page_size, layout,
                 dtype=torch.float32):
        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        self.size, self.page_size, self.layout, self.dtype = size, page_size, layout, dtype
        self.page_num = size // page_size
        self.device = "cpu"
        if layout == "layer_first":
            dims = (2, layer_num, size, head_num, head_dim)
        elif layout == "page_first":
            dims = (2, size, layer_num, head_num, head_dim)
        elif layout == "page_first_direct":
            dims = (2, self.page_num, layer_num, page_size, head_num, head_dim)
        else:
            raise ValueError(f"Unsupported layout: {layout}")
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.free_pages = list(range(self.page_num))

    def alloc(self, need_size: int) -> torch.Tensor:
        """Page-aligned token slots (HostKVCache.alloc)."""
        n = need_size // self.page_size
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return torch.tensor([p * self.page_size + t for p in pages for t in range(self.page_size)],
                            dtype=torch.int64)

    def get_data_page(self, index, flat: bool = True):
        P = self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + P]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + P]
        else:
            page = self.kv_buffer[:, index // P:index // P + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        P, L, H, D = self.page_size, self.layer_num, self.head_num, self.head_dim
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index:index + P] = data_page.reshape(2, L, P, H, D)
        elif self.layout == "page_first":
            self.kv_buffer[:, index:index + P] = data_page.reshape(2, P, L, H, D)
        else:
            self.kv_buffer[:, index // P:index // P + 1] = data_page.reshape(2, 1, L, P, H, D)

    # the device <-> host copies (backup_from_device_all_layer,
    # load_to_device_per_layer), here between the reference engine's pages
    # (per layer [2, pages, page_size, heads, dim]) and host pages
    def page(self, kv: int, layer: int, host_page: int):
        P = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[kv, layer, host_page * P:(host_page + 1) * P]
        if self.layout == "page_first":
            return self.kv_buffer[kv, host_page * P:(host_page + 1) * P, layer]
        return self.kv_buffer[kv, host_page, layer]

    def backup_from_device(self, engine_kv, device_pages, host_indices):
        for i, ep in enumerate(device_pages):
            hp = int(host_indices[i * self.page_size]) // self.page_size
            for l, t in enumerate(engine_kv):
                for kv in (0, 1):
                    self.page(kv, l, hp).copy_(t[kv, ep])

    def load_to_device(self, engine_kv, device_pages, host_indices):
        for i, ep in enumerate(device_pages):
            hp = int(host_indices[i * self.page_size]) // self.page_size
            for l, t in enumerate(engine_kv):
                for kv in (0, 1):
                    t[kv, ep].copy_(self.page(kv, l, hp))


class Controller:
    """HiCacheController's storage paths, run synchronously."""

    def __init__(self, backend, host_pool, zero_copy: bool):
        self.backend, self.pool, self.page_size = backend, host_pool, host_pool.page_size
        self.zero_copy = zero_copy
        self.get_results = []   # what batch_get_v1 answered, call after call

    def hit_query(self, token_ids, last_hash=None, prefix_keys=None) -> List[str]:
        """_storage_hit_query: the hashes of the stored pages, from the start."""
        prefix_keys = list(prefix_keys) if prefix_keys else None
        hashes, out = get_hash_str(token_ids, last_hash, self.page_size), []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            hit = self.backend.batch_exists(batch, HiCacheStorageExtraInfo(prefix_keys=prefix_keys))
            out.extend(batch[:hit])
            if hit < len(batch):
                break
            if prefix_keys:
                prefix_keys += batch
        return out

    def page_transfer(self, hash_value, host_indices, prefix_keys=None) -> int:
        """_page_transfer: pages loaded into the host pool, from the start."""
        done = 0
        for i in range(0, len(hash_value), STORAGE_BATCH_SIZE):
            batch = hash_value[i:i + STORAGE_BATCH_SIZE]
            hidx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys, extra_info=None)
            hit = (self._get_zero_copy if self.zero_copy else self._generic_get)(batch, hidx, extra)
            done += hit
            if hit != len(batch):
                break
            if prefix_keys:
                prefix_keys += batch
        return done

    def _get_zero_copy(self, hashes, hidx, extra) -> int:
        results = self.backend.batch_get_v1(hashes, hidx, extra)
        self.get_results.append(list(results))
        inc = 0
        for i in range(len(hashes)):
            if not results[i]:
                break
            inc += 1
        return inc

    def _generic_get(self, hashes, hidx, extra) -> int:
        dst = [self.pool.get_dummy_flat_data_page() for _ in hashes]
        data = self.backend.batch_get(hashes, dst)
        if data is None:
            return 0
        n = 0
        for i in range(len(hashes)):
            if data[i] is None:
                break
            self.pool.set_from_flat_data_page(int(hidx[i * self.page_size]), data[i])
            n += 1
        return n

    def page_backup(self, hash_value, host_indices, prefix_keys=None) -> int:
        """_page_backup: tokens stored, batch by batch, until a batch fails."""
        done = 0
        for i in range(0, len(hash_value), STORAGE_BATCH_SIZE):
            batch = hash_value[i:i + STORAGE_BATCH_SIZE]
            hidx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if self.zero_copy:
                ok = all(self.backend.batch_set_v1(batch, hidx, extra))
            else:
                ok = self.backend.batch_set(batch, [self.pool.get_data_page(
                    int(hidx[j * self.page_size])) for j in range(len(batch))])
            if not ok:
                break
            if prefix_keys:
                prefix_keys += batch
            done += self.page_size * len(batch)
        return done


def extra_config(socket: str, **more: Any) -> dict:
    """--hicache-storage-backend-extra-config for kvclient.sglang."""
    return {"backend_name": "kvcached", "module_path": "kvclient.sglang",
            "class_name": "KvcachedStorage", "interface_v1": 1, "socket": socket, "tenant": "t",
            **more}
