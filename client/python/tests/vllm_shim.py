"""A stand-in for the parts of vLLM that kvclient.vllm touches, and a small
engine that makes vLLM's connector calls in vLLM's order, around the
reference engine (kvclient.examples.llama). vLLM cannot be installed here.

Followed (vllm-project/vllm main, commit 003df29; the KV connector v1 API
of vLLM 0.11-0.12):
  - vllm/distributed/kv_transfer/kv_connector/v1/base.py: KVConnectorRole,
    KVConnectorMetadata, KVConnectorBase_V1 (its __init__, the metadata
    binding, the abstract methods and the defaults), installed by install()
    as that module, with vllm.distributed.parallel_state's
    get_tensor_model_parallel_rank;
  - vllm/v1/core/sched/scheduler.py (Scheduler.schedule,
    update_from_output, _update_waiting_for_remote_kv,
    _update_requests_with_invalid_blocks with kv_load_failure_policy
    "recompute", _connector_finished, _update_from_kv_xfer_finished) and
    vllm/v1/core/sched/output.py (SchedulerOutput, NewRequestData,
    CachedRequestData): Engine.schedule() and update();
  - vllm/v1/worker/kv_connector_model_runner_mixin.py: Engine.execute()
    (bind_connector_metadata, start_load_kv, the forward, wait_for_save
    (not when no token is scheduled: kv_connector_no_forward),
    get_finished(finished_req_ids), get_block_ids_with_load_errors,
    clear_connector_metadata);
  - vllm/attention/utils/kv_transfer_utils.py (maybe_transfer_kv_layer,
    around each attention layer's op in vllm/attention/layer.py):
    wait_for_layer_load(layer_name) as a layer's attention starts, before
    it reads its cache, and save_kv_layer(layer_name, kv_cache,
    attn_metadata) as it ends; _LayerHooks makes those calls from inside
    the reference engine's forward, layer by layer, in layer order.
Checks vLLM does not make: newly allocated pages are filled with NaN
(poison), and as each layer starts the shim asserts that the layer's
pages of the prefix the forward reads ([0, num_computed_tokens)) hold no
NaN, so a layer read before the connector copied it fails the step.
Simplified: one forward per request per step (the reference engine runs
one sequence at a time: the second forward of a step finds its layers
already copied), no local prefix cache (vLLM's num_computed_tokens from
its own cache is 0), chunked prefill as a fixed number of tokens per
request per step, greedy sampling.
"""
from __future__ import annotations

import abc
import enum
import sys
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any

TP_RANK = [0]


# ---- vllm/distributed/kv_transfer/kv_connector/v1/base.py -------------------------
class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(abc.ABC):  # noqa: B024
    pass


class KVConnectorBase_V1(abc.ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_kv_caches(self, kv_caches):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    @abc.abstractmethod
    def start_load_kv(self, forward_context, **kwargs): ...

    @abc.abstractmethod
    def wait_for_layer_load(self, layer_name): ...

    @abc.abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...

    @abc.abstractmethod
    def wait_for_save(self): ...

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    @abc.abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens): ...

    @abc.abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens): ...

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output): ...

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None


def install():
    """Puts the stand-in modules into sys.modules (as `vllm...`)."""
    if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "_kvclient_shim", False):
        raise RuntimeError("a real vLLM is imported: the shim would shadow it")
    names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
             "vllm.distributed.kv_transfer.kv_connector",
             "vllm.distributed.kv_transfer.kv_connector.v1",
             "vllm.distributed.kv_transfer.kv_connector.v1.base",
             "vllm.distributed.parallel_state"]
    for n in names:
        m = sys.modules.get(n) or types.ModuleType(n)
        m._kvclient_shim = True
        sys.modules[n] = m
    base = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.base"]
    base.KVConnectorRole = KVConnectorRole
    base.KVConnectorMetadata = KVConnectorMetadata
    base.KVConnectorBase_V1 = KVConnectorBase_V1
    sys.modules["vllm.distributed.parallel_state"].get_tensor_model_parallel_rank = \
        lambda: TP_RANK[0]


# ---- vllm/config: the fields the connector reads ---------------------------------
@dataclass
class KVTransferConfig:
    kv_connector: str = "KvcachedConnector"
    kv_connector_module_path: str = "kvclient.vllm"
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)
    engine_id: str = "e0"

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class CacheConfig:
    block_size: int
    cache_dtype: str = "auto"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


class ModelConfig:
    def __init__(self, cfg, dtype):
        self.cfg, self.dtype = cfg, dtype

    def get_num_layers(self, parallel_config):
        return self.cfg.num_layers

    def get_num_kv_heads(self, parallel_config):
        return max(1, self.cfg.num_kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self):
        return self.cfg.head_dim


@dataclass
class VllmConfig:
    model_config: Any
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    kv_transfer_config: KVTransferConfig


# ---- vllm/v1/request.py, vllm/v1/core/sched/output.py, vllm/v1/outputs.py ---------
WAITING, WAITING_FOR_REMOTE_KVS, RUNNING, PREEMPTED = \
    "WAITING", "WAITING_FOR_REMOTE_KVS", "RUNNING", "PREEMPTED"
# vLLM's RequestStatus.FINISHED_* (the connector reads their names)
FINISHED_STOPPED, FINISHED_LENGTH_CAPPED, FINISHED_ABORTED = \
    "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED"
FINISHED = (FINISHED_STOPPED, FINISHED_LENGTH_CAPPED, FINISHED_ABORTED)


class Request:
    def __init__(self, request_id, prompt_token_ids, max_tokens, cache_salt=None,
                 lora_request=None, mm_features=(), kv_transfer_params=None, stop_token_ids=()):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self.output_token_ids = []
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.mm_features = list(mm_features)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.status = WAITING
        self.kv_transfer_params = kv_transfer_params  # vllm/v1/request.py: from the API request
        self.stop_token_ids = set(stop_token_ids)      # SamplingParams.stop_token_ids
        self.stop_reason = None

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def num_tokens(self):
        return len(self._all_token_ids)


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any = None


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_token_ids: list = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    finished_req_ids: set
    preempted_req_ids: set = field(default_factory=set)
    kv_connector_metadata: Any = None


@dataclass
class KVConnectorOutput:
    finished_sending: set | None = None
    finished_recving: set | None = None
    invalid_block_ids: set = field(default_factory=set)


class ForwardContext:
    def __init__(self, attn_metadata=None):
        self.attn_metadata = attn_metadata
        self.no_compile_layers = {}


# ---- the engine ---------------------------------------------------------------
class _LayerHooks:
    """The reference engine's cache as its forward sees it, with vLLM's
    per-layer connector calls: the forward iterates .kv once, layer by
    layer; before a layer is handed out, the previous layer ends
    (after(l - 1)) and this one starts (before(l)). The last layer's end
    is called by the engine when the forward returns (end())."""

    def __init__(self, cache, before, after):
        self._cache, self._before, self._after = cache, before, after
        self.page_tokens = cache.page_tokens
        self._open = None

    def pages_for(self, ntok):
        return self._cache.pages_for(ntok)

    @property
    def kv(self):
        for l, t in enumerate(self._cache.kv):
            self.end()
            self._before(l)
            self._open = l
            yield t

    def end(self):
        if self._open is not None:
            l, self._open = self._open, None
            self._after(l)


class Engine:
    """vLLM's scheduler, model runner and connector calls around the
    reference model: one process holding the scheduler-side and the
    worker-side connector, as vLLM's uniprocess executor does."""

    def __init__(self, model, cache, extra_config, connector_cls, chunk=None, poison=True):
        import torch
        self.poison = poison  # NaN in new pages, checked as each layer starts
        self.chunk = chunk  # long_prefill_token_threshold: tokens per request per step
        self.model, self.cache = model, cache
        self.bs = cache.page_tokens
        vc = VllmConfig(ModelConfig(model.cfg, cache.kv[0].dtype), CacheConfig(self.bs),
                        ParallelConfig(), KVTransferConfig(kv_connector_extra_config=extra_config))
        self.sched_conn = connector_cls(vc, KVConnectorRole.SCHEDULER, None)
        self.worker_conn = connector_cls(vc, KVConnectorRole.WORKER, None)
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(len(cache.kv))]
        self.worker_conn.register_kv_caches(dict(zip(self.layer_names, cache.kv)))
        self.torch = torch
        self.requests: dict[str, Request] = {}
        self.tables: dict[str, list] = {}
        self.waiting: deque = deque()
        self.running: list = []
        self.finished_req_ids: set = set()        # for the next SchedulerOutput
        self.finished_recving: set = set()
        self.failed_recving: set = set()
        self.held: set = set()                    # finished, blocks kept for the connector
        self.first_logits: dict = {}
        self.invalid_seen: set = set()
        self.log: list = []                       # (step, event)
        self.layer_calls: list = []               # ("load" | "save", layer name) of the last step

    # -- requests --
    def add(self, req: Request):
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def _alloc(self, rid, ntok):
        table = self.tables.setdefault(rid, [])
        need = self.cache.pages_for(ntok) - len(table)
        new = self.cache.alloc(need) if need > 0 else []
        if new and self.poison:
            for t in self.cache.kv:
                t[:, new] = float("nan")
        table += new
        return new

    def _free(self, rid):
        self.cache.free(self.tables.pop(rid, []))

    def preempt(self, rid):
        req = self.requests[rid]
        self.running.remove(req)
        self._free(rid)
        req.num_computed_tokens = 0
        req.status = PREEMPTED
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req, status=FINISHED_ABORTED):
        req.status = status
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        delay, _ = self.sched_conn.request_finished(req, list(self.tables.get(req.request_id, [])))
        if delay:
            self.held.add(req.request_id)
        else:
            self._free(req.request_id)
        self.finished_req_ids.add(req.request_id)

    def abort(self, rid):
        self._finish(self.requests[rid])

    # -- one step --
    def schedule(self) -> SchedulerOutput:
        new, cached, nsched = [], CachedRequestData(), {}
        for req in self.running:
            n = self._budget(req.num_tokens - req.num_computed_tokens)
            newb = self._alloc(req.request_id, req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.new_token_ids.append([])
            cached.new_block_ids.append((newb,) if newb else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            nsched[req.request_id] = n
        skipped = deque()
        while self.waiting:
            req = self.waiting.popleft()
            rid = req.request_id
            if req.status == WAITING_FOR_REMOTE_KVS:
                if rid not in self.finished_recving:
                    skipped.append(req)
                    continue
                self._update_waiting_for_remote_kv(req)
                self.finished_recving.discard(rid)
                req.status = PREEMPTED if req.num_preemptions else WAITING
            ext, load_async = 0, False
            if req.num_computed_tokens == 0:
                ext, load_async = self.sched_conn.get_num_new_matched_tokens(req, 0)
                ext = ext or 0
            if load_async:
                self._alloc(rid, ext)
                self.sched_conn.update_state_after_alloc(req, KVCacheBlocks(self.tables[rid]), ext)
                req.num_computed_tokens = ext
                req.status = WAITING_FOR_REMOTE_KVS
                skipped.append(req)
                continue
            computed = req.num_computed_tokens + ext
            n = self._budget(req.num_tokens - computed)
            self._alloc(rid, computed + n)
            self.sched_conn.update_state_after_alloc(req, KVCacheBlocks(self.tables[rid]), ext)
            req.num_computed_tokens = computed
            if req.status == PREEMPTED:
                cached.req_ids.append(rid)
                cached.resumed_req_ids.add(rid)
                cached.new_token_ids.append([])
                cached.new_block_ids.append((list(self.tables[rid]),))
                cached.num_computed_tokens.append(computed)
            else:
                new.append(NewRequestData(rid, req.prompt_token_ids, req.mm_features,
                                          (list(self.tables[rid]),), computed, req.lora_request))
            req.status = RUNNING
            self.running.append(req)
            nsched[rid] = n
        self.waiting.extend(skipped)
        out = SchedulerOutput(new, cached, nsched, sum(nsched.values()),
                              set(self.finished_req_ids))
        self.finished_req_ids.clear()
        out.kv_connector_metadata = self.sched_conn.build_connector_meta(out)
        return out

    def _budget(self, n):
        return n if self.chunk is None else min(n, self.chunk)

    def execute(self, out: SchedulerOutput):
        w = self.worker_conn
        w.bind_connector_metadata(out.kv_connector_metadata)
        w.start_load_kv(ForwardContext())
        sampled = {}
        self.layer_calls = []
        try:
            for rid, n in out.num_scheduled_tokens.items():
                req = self.requests[rid]
                start = req.num_computed_tokens
                table = self.tables[rid]

                def before(l, table=table, start=start):
                    name = self.layer_names[l]
                    w.wait_for_layer_load(name)
                    self.layer_calls.append(("load", name))
                    self._check_layer(l, table, start)

                def after(l):
                    name = self.layer_names[l]
                    w.save_kv_layer(name, self.cache.kv[l], None)
                    self.layer_calls.append(("save", name))

                hooks = _LayerHooks(self.cache, before, after)
                logits = self.model.prefill(hooks, table, req.all_token_ids[:start + n],
                                            start=start)
                hooks.end()
                sampled[rid] = logits
        finally:
            if out.total_num_scheduled_tokens:  # kv_connector_no_forward does not wait
                w.wait_for_save()
            sending, recving = w.get_finished(out.finished_req_ids)
            kv_out = KVConnectorOutput(sending, recving, w.get_block_ids_with_load_errors())
            w.clear_connector_metadata()
        return sampled, kv_out

    def _check_layer(self, l, table, start):
        """The layer's pages of tokens [0, start), which its attention is
        about to read, were filled (computed, or copied by the connector)."""
        if not self.poison or start == 0:
            return
        kv = self.cache.kv[l]
        pages = table[:self.cache.pages_for(start)]
        got = kv[:, pages].reshape(2, -1, *kv.shape[3:])[:, :start]
        if bool(self.torch.isnan(got).any()):
            raise AssertionError(f"layer {self.layer_names[l]} read before its KV was in its "
                                 f"pages (tokens [0, {start}))")

    def update(self, out: SchedulerOutput, sampled, kv_out: KVConnectorOutput):
        self.sched_conn.update_connector_output(kv_out)
        if kv_out.invalid_block_ids:
            self.invalid_seen |= kv_out.invalid_block_ids
            self._update_requests_with_invalid_blocks(kv_out.invalid_block_ids)
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            if req.status != RUNNING:
                continue  # aborted after scheduling
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                logits = sampled[rid]
                self.first_logits.setdefault(rid, logits)
                tok = int(self.torch.argmax(logits))
                req.output_token_ids.append(tok)
                req._all_token_ids.append(tok)
                if tok in req.stop_token_ids:  # vllm/v1/core/sched/utils.py check_stop
                    req.stop_reason = tok
                    self._finish(req, FINISHED_STOPPED)
                elif len(req.output_token_ids) >= req.max_tokens:
                    self._finish(req, FINISHED_LENGTH_CAPPED)
        for rid in kv_out.finished_recving or ():
            self.finished_recving.add(rid)
        for rid in kv_out.finished_sending or ():
            assert self.requests[rid].status in FINISHED and rid in self.held, rid
            self.held.discard(rid)
            self._free(rid)

    def _update_waiting_for_remote_kv(self, req):
        rid = req.request_id
        if rid in self.failed_recving:
            self.failed_recving.discard(rid)  # num_computed_tokens already truncated
            if req.num_computed_tokens == 0:
                self._free(rid)  # nothing valid: the blocks go back
            return
        req.num_computed_tokens = min(len(self.tables[rid]) * self.bs, req.num_tokens)
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens -= 1

    def _update_requests_with_invalid_blocks(self, invalid):
        """kv_load_failure_policy "recompute": a request waiting for its
        load restarts from its first invalid block."""
        for req in self.waiting:
            if req.status != WAITING_FOR_REMOTE_KVS:
                continue
            table = self.tables.get(req.request_id, [])
            idx = [i for i, b in enumerate(table) if b in invalid]
            if idx and idx[0] * self.bs < req.num_computed_tokens:
                req.num_computed_tokens = idx[0] * self.bs
                self.failed_recving.add(req.request_id)

    def step(self):
        out = self.schedule()
        sampled, kv_out = self.execute(out)
        self.update(out, sampled, kv_out)
        return out, kv_out

    def run(self, max_steps=200):
        for _ in range(max_steps):
            if not (self.waiting or self.running or self.held):
                return
            self.step()
        raise RuntimeError("requests did not finish")
