"""kvclient.vllm.KvcachedConnector driven as vLLM drives a KV connector
(v1), with the reference engine's logits against a full recompute as the
judge.

vLLM cannot be installed here. These tests follow vllm-project/vllm main
(commit 003df29; the connector API of vLLM 0.11-0.12):
vllm/distributed/kv_transfer/kv_connector/v1/base.py (the base class,
stood in for by vllm_shim.install()), vllm/v1/core/sched/scheduler.py and
vllm/v1/worker/kv_connector_model_runner_mixin.py and
vllm/attention/utils/kv_transfer_utils.py (the call sequence, down to
wait_for_layer_load and save_kv_layer around each attention layer:
vllm_shim.Engine). What they do not cover: a run inside the real vLLM (its
attention backends, CUDA graphs, several workers of one TP group).
"""
import importlib
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import HERE  # noqa: E402
import vllm_shim  # noqa: E402
from test_engine import (CFG, NEW, PREFIX, T, assert_exact, prompt, recompute, rel,  # noqa: E402
                         run_worker, scale_block_2)
from kvclient import G2, Client  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.examples.llama import Llama, PagedKVCache  # noqa: E402


def connector_cls():
    vllm_shim.install()
    return importlib.import_module("kvclient.vllm").KvcachedConnector


def engine_proc(tmp, daemon, requests, **extra):
    """An engine in a process of its own; its result dict."""
    spec = {"socket": daemon.socket, "page_tokens": T, "new_tokens": NEW,
            "extra": {"tenant": "t", **extra},
            "requests": requests}
    return run_worker(tmp, "vllm_engine_worker.py", spec, timeout=180)


_model = None


def engine(daemon, num_pages=24, chunk=None, **extra):
    """An engine in this process (for tests that step it by hand)."""
    global _model
    if _model is None:
        _model = Llama(CFG, seed=0)
    cache = PagedKVCache(CFG, num_pages=num_pages, page_tokens=T, dtype=torch.float32,
                         device="cpu")
    return vllm_shim.Engine(_model, cache, {"socket": daemon.socket, "tenant": "t", **extra},
                            connector_cls(), chunk=chunk)


@pytest.fixture
def work(tmp_root):
    d = os.path.join(tmp_root, "work")
    os.makedirs(d)
    return d


def test_import_without_vllm_names_vllm():
    code = ("import sys; sys.path.insert(0, %r)\nimport kvclient\n"
            "assert 'vllm' not in sys.modules\n"
            "try:\n    import kvclient.vllm\nexcept ImportError as e:\n    print(e)\n"
            "else:\n    raise SystemExit('imported without vLLM')\n") % os.path.join(HERE, "..")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vLLM" in r.stdout


def test_prefix_moves_between_two_engine_processes(daemon, work):
    a = engine_proc(work, daemon, [["a", prompt(1), None]])
    assert_exact(a["a"], prompt(1))
    assert a["stats"]["saved_blocks"] == 7 and a["stats"]["loaded_blocks"] == 0
    b = engine_proc(work, daemon, [["b", prompt(2), None]])
    assert b["stats"]["loaded_blocks"] == PREFIX // T and b["invalid"] == []
    assert b["stats"]["saved_blocks"] == 1  # its own 7th block; the 6 shared ones exist
    assert_exact(b["b"], prompt(2))
    # a request with another cache_salt shares nothing
    c = engine_proc(work, daemon, [["c", prompt(2), "tenant-x"]])
    assert c["stats"]["loaded_blocks"] == 0
    assert_exact(c["c"], prompt(2))


def test_two_vllm_blocks_per_kvcached_block(daemon, work):
    """tokens_per_block 2 x block_size: a kvcached block holds two vLLM
    blocks; the shared prefix is 3 kvcached blocks."""
    a = engine_proc(work, daemon, [["a", prompt(1), None]], tokens_per_block=2 * T)
    assert a["stats"]["saved_blocks"] == 3
    b = engine_proc(work, daemon, [["b", prompt(2), None]], tokens_per_block=2 * T)
    assert b["stats"]["loaded_blocks"] == 3 and b["invalid"] == []
    assert_exact(b["b"], prompt(2))


def test_call_sequence_scheduler_then_worker(daemon, work):
    """Step by step: the hit is whole blocks and the load is asynchronous
    (the request waits a step), then the request runs from the loaded
    prefix and stores the block it completes."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out, kv = eng.step()
    req = eng.requests["b"]
    assert out.num_scheduled_tokens == {} and req.status == vllm_shim.WAITING_FOR_REMOTE_KVS
    (load,) = out.kv_connector_metadata.loads
    assert (load.start, load.end, load.is_async) == (0, PREFIX // T, True)
    assert kv.finished_recving == {"b"} and not kv.invalid_block_ids
    out, kv = eng.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == PREFIX
    assert out.num_scheduled_tokens == {"b": len(p) - PREFIX}
    (save,) = out.kv_connector_metadata.saves
    assert len(save.token_ids) == 7 * T
    eng.run()
    assert rel(eng.first_logits["b"], recompute(p)[0]) < 1e-5
    assert eng.requests["b"].output_token_ids == recompute(p)[1]
    assert len(eng.cache._free) == eng.cache.num_pages  # every page back
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_load_failure_reports_every_failed_block_and_output_stays_exact(daemon, work):
    """Block 2 of the stored prefix is changed in G2 after its COMMIT: the
    load fails its CRC there, and every engine block the load was to fill
    from block 2 on is reported; vLLM recomputes them; output exact."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    scale_block_2(daemon)
    eng = engine(daemon)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out, kv = eng.step()
    table = list(eng.tables["b"])
    assert kv.finished_recving == {"b"}
    invalid = kv.invalid_block_ids
    out, kv = eng.step()
    computed = out.scheduled_new_reqs[0].num_computed_tokens
    eng.run()
    # the output first: a failed block left out is garbage served
    assert rel(eng.first_logits["b"], recompute(p)[0]) < 1e-5
    assert eng.requests["b"].output_token_ids == recompute(p)[1]
    assert invalid == set(table[2:PREFIX // T])  # blocks 2..5, none left out
    assert computed == 2 * T  # vLLM recomputed from block 2
    assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_preempted_request_resumes_from_kvcached(daemon, work):
    """A request is preempted after its prefill (its pages freed and taken
    by another request), then resumes: its blocks come back from kvcached
    into other pages and its output equals a recompute."""
    eng = engine(daemon, num_pages=16)
    p1, p2 = prompt(1), prompt(3, n_suffix=40)[PREFIX - 2 * T:]
    eng.add(vllm_shim.Request("r", p1, NEW))
    eng.step()  # prefill (and save of its 7 full blocks)
    assert len(eng.requests["r"].output_token_ids) == 1
    old = list(eng.tables["r"])
    eng.preempt("r")
    eng.add(vllm_shim.Request("q", p2, NEW))
    eng.waiting.rotate(-1)  # q first: it takes r's freed pages
    eng.step()  # q: no hit (other tokens); r: its lookup hits, async load
    assert eng.requests["r"].status == vllm_shim.WAITING_FOR_REMOTE_KVS
    assert set(old) & set(eng.tables["q"])  # r's pages were reused
    out, kv = eng.step()
    assert "r" in out.scheduled_cached_reqs.resumed_req_ids
    eng.run()
    r = eng.requests["r"]
    assert rel(eng.first_logits["r"], recompute(p1)[0]) < 1e-5
    assert r.output_token_ids == recompute(p1)[1]
    assert eng.requests["q"].output_token_ids == recompute(p2)[1]


def test_request_finished_before_its_save_keeps_its_pages(daemon, work):
    """The request is aborted after the step that saves it was scheduled
    and before the worker ran it: request_finished answers True, the pages
    stay until the worker reports the save, and what was stored is exact
    (another engine process loads it and matches a recompute)."""
    eng = engine(daemon)
    p = prompt(1)
    eng.add(vllm_shim.Request("a", p, NEW))
    out = eng.schedule()
    assert out.kv_connector_metadata.saves
    pages = list(eng.tables["a"])
    eng.abort("a")  # request_finished, before the worker ran the step
    assert "a" in eng.held and eng.tables["a"] == pages
    sampled, kv = eng.execute(out)
    eng.update(out, sampled, kv)
    assert "a" in eng.held  # the worker is told in the next step's finished ids
    out, kv = eng.step()
    assert out.finished_req_ids == {"a"} and kv.finished_sending == {"a"}
    assert "a" not in eng.held and "a" not in eng.tables
    b = engine_proc(work, daemon, [["b", prompt(2), None]])
    assert b["stats"]["loaded_blocks"] == PREFIX // T
    assert_exact(b["b"], prompt(2))


def test_hints_name_the_session_after_each_commit_and_the_stop_reason_at_finish(daemon, work):
    """A request with a session in its kv_transfer_params: the worker names
    its blocks as the session's after storing (or loading) them, never
    before their COMMIT (no hinted key is missing); request_finished sends
    FINISHED with the stop reason vLLM knows, and END on session_end. A
    request without a session sends no hint."""
    engine_proc(work, daemon, [["a", prompt(1), None]])  # no session: no hint
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 0
    eng = engine(daemon, tool_stop_token_ids=[])
    eng.add(vllm_shim.Request("b", prompt(2), NEW, kv_transfer_params={"session": "chat-9"}))
    eng.run()
    # b loaded blocks 0..5 (one SESSION hint) and stored its block 6 (one more)
    assert daemon.metric('kvcached_hints_total{kind="session"}') == 2
    assert daemon.metric('kvcached_hint_finished_total{stop="max_tokens"}') == 1
    assert daemon.metric("kvcached_hint_keys_unmatched_total") == 0
    assert daemon.metric('kvcached_hints_total{kind="end"}') == 0
    # its last request: finished by its stop token (the shim's model picks
    # the first sampled token), then the session ends
    tok = eng.requests["b"].output_token_ids[0]
    eng.add(vllm_shim.Request("c", prompt(2), NEW, stop_token_ids=[tok],
                              kv_transfer_params={"session": "chat-9", "session_end": True}))
    eng.run()
    assert eng.requests["c"].status == vllm_shim.FINISHED_STOPPED
    assert daemon.metric('kvcached_hint_finished_total{stop="end_turn"}') == 1
    assert daemon.metric('kvcached_hints_total{kind="end"}') == 1
    # the same stop token named as a tool call's
    eng2 = engine(daemon, tool_stop_token_ids=[tok])
    eng2.add(vllm_shim.Request("d", prompt(2), NEW, stop_token_ids=[tok],
                               kv_transfer_params={"session": "agent-1"}))
    eng2.run()
    assert daemon.metric('kvcached_hint_finished_total{stop="tool_use"}') == 1
    eng2.add(vllm_shim.Request("e", prompt(3), NEW, kv_transfer_params={"session": "agent-1"}))
    eng2.schedule()
    eng2.abort("e")
    assert daemon.metric('kvcached_hint_finished_total{stop="aborted"}') == 1


def test_request_stop_follows_vllms_finished_statuses():
    connector_cls()
    m = importlib.import_module("kvclient.vllm")
    r = vllm_shim.Request("r", [1, 2], 1)
    for status, why, want in [("FINISHED_LENGTH_CAPPED", None, 3), ("FINISHED_ABORTED", None, 5),
                              ("FINISHED_IGNORED", None, 5), ("FINISHED_STOPPED", "###", 4),
                              ("FINISHED_STOPPED", 7, 2), ("FINISHED_STOPPED", 8, 1),
                              ("RUNNING", None, 0)]:
        r.status, r.stop_reason = status, why
        assert m.request_stop(r, {7}) == want, (status, why)
    assert m.request_session(r) == (None, 0, False)
    r.kv_transfer_params = {"session": "s", "retain_s": 300}
    assert m.request_session(r) == ("s", 300, False)
    r.kv_transfer_params = {"conv": "s2", "session_end": True}
    assert m.request_session(r, "conv", 60) == ("s2", 60, True)


def test_synchronous_load(daemon, work):
    """load_async false: the load runs in the step that schedules the
    request (start_load_kv before its forward)."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon, load_async=False)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out, kv = eng.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == PREFIX
    (load,) = out.kv_connector_metadata.loads
    assert not load.is_async and kv.finished_recving is None
    eng.run()
    assert rel(eng.first_logits["b"], recompute(p)[0]) < 1e-5
    assert eng.requests["b"].output_token_ids == recompute(p)[1]


def test_blocks_evicted_between_lookup_and_load_are_reported(daemon, work):
    """The scheduler's LOOKUP saw 6 blocks; before the worker's LOAD the
    operator evicts some: the LOAD answers them missing, and every engine
    block from the first missing one is reported; output exact."""
    from conftest import http_post
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out = eng.schedule()
    assert out.kv_connector_metadata.loads[0].end == PREFIX // T
    code, body = http_post(daemon.admin, "/evict?tier=g2&count=3")
    assert code == 200 and json.loads(body)["evicted"] == 3, body
    sampled, kv = eng.execute(out)
    eng.update(out, sampled, kv)
    table = list(eng.tables["b"])
    k = min(table.index(b) for b in kv.invalid_block_ids)
    assert 0 < k < PREFIX // T and kv.invalid_block_ids == set(table[k:PREFIX // T])
    eng.run()
    assert rel(eng.first_logits["b"], recompute(p)[0]) < 1e-5
    assert eng.requests["b"].output_token_ids == recompute(p)[1]
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_tp_ranks_and_scheduler_share_one_hit_length(tmp_root):
    """Two TP ranks store different lengths of one prompt; the ranks name
    one group at HELLO, so the scheduler (on rank 0's namespace) answers the
    group's hit: the shorter. (Without the group it answers rank 0's 7.)"""
    from conftest import Daemon
    d = Daemon(tmp_root, tenants=("t",)).start()
    try:
        cls = connector_cls()
        vc = vllm_shim.VllmConfig(
            vllm_shim.ModelConfig(CFG, torch.float32), vllm_shim.CacheConfig(T),
            vllm_shim.ParallelConfig(tensor_parallel_size=2),
            vllm_shim.KVTransferConfig(kv_connector_extra_config={
                "socket": d.socket, "tenant": "t", "tp_group": "g"}))
        p = prompt(1)
        heads = CFG.num_kv_heads // 2
        for rank, nblocks in ((0, 7), (1, 3)):
            vllm_shim.TP_RANK[0] = rank
            w = cls(vc, vllm_shim.KVConnectorRole.WORKER, None)
            caches = {f"l{i}": torch.randn(2, 10, T, heads, CFG.head_dim)
                      for i in range(CFG.num_layers)}
            w.register_kv_caches(caches)
            meta = importlib.import_module("kvclient.vllm").KvcachedConnectorMetadata()
            meta.saves.append(importlib.import_module("kvclient.vllm").SaveSpec(
                "r", p[:nblocks * T], list(range(nblocks)), b""))
            w.bind_connector_metadata(meta)
            w.wait_for_save()
            assert w.stats["saved_blocks"] == nblocks
            w.clear_connector_metadata()
            w.shutdown()
        s = cls(vc, vllm_shim.KVConnectorRole.SCHEDULER, None)
        assert s.get_num_new_matched_tokens(vllm_shim.Request("r", p, NEW), 0) == (3 * T, True)
        s.shutdown()
    finally:
        vllm_shim.TP_RANK[0] = 0
        d.stop()


def test_caches_that_disagree_with_the_model_config_are_refused():
    """The scheduler computes the layout from the model config; a worker
    whose caches differ would never be hit, so it refuses to start."""
    cls = connector_cls()
    vc = vllm_shim.VllmConfig(vllm_shim.ModelConfig(CFG, torch.float32), vllm_shim.CacheConfig(T),
                              vllm_shim.ParallelConfig(), vllm_shim.KVTransferConfig())
    w = cls(vc, vllm_shim.KVConnectorRole.WORKER, None)
    caches = {f"l{i}": torch.zeros(2, 4, T, CFG.num_kv_heads, CFG.head_dim // 2)
              for i in range(CFG.num_layers)}
    with pytest.raises(ValueError, match="never hit"):
        w.register_kv_caches(caches)


def test_request_extras_separate_keys():
    """cache_salt, the LoRA (by name: ids are per instance) and multimodal
    identifiers each change the keys; a plain request's keys are
    kvclient.paged's."""
    from types import SimpleNamespace as NS
    connector_cls()
    request_extra = importlib.import_module("kvclient.vllm").request_extra
    p = prompt(1)
    plain = vllm_shim.Request("a", p, NEW)
    assert request_extra(plain) == b""
    variants = [vllm_shim.Request("b", p, NEW, cache_salt="s1"),
                vllm_shim.Request("c", p, NEW, cache_salt="s2"),
                vllm_shim.Request("d", p, NEW, lora_request=NS(lora_name="sql", lora_int_id=3)),
                vllm_shim.Request("e", p, NEW, lora_request=NS(lora_name="sql", lora_int_id=9)),
                vllm_shim.Request("f", p, NEW, mm_features=[NS(identifier="img-1")])]
    extras = [request_extra(r) for r in variants]
    assert extras[2] == extras[3]  # one LoRA, two instances' ids: one key
    assert len({b""} | set(extras)) == 5


def test_request_aborted_while_its_load_is_in_flight_keeps_its_pages(daemon, work):
    """Aborted after the step that loads it was scheduled: the worker still
    writes into its blocks, so they stay until the worker names it."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon)
    eng.add(vllm_shim.Request("b", prompt(2), NEW))
    out = eng.schedule()
    assert out.kv_connector_metadata.loads
    pages = list(eng.tables["b"])
    eng.abort("b")
    assert "b" in eng.held and eng.tables["b"] == pages
    sampled, kv = eng.execute(out)
    eng.update(out, sampled, kv)
    out, kv = eng.step()
    assert kv.finished_sending == {"b"} and "b" not in eng.tables
    assert len(eng.cache._free) == eng.cache.num_pages
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_chunked_prefill_saves_blocks_as_they_complete(daemon, work):
    """A prompt prefilled 40 tokens a step: each step saves the full blocks
    its chunk completed; another engine process loads them."""
    eng = engine(daemon, chunk=40)
    p = prompt(1)
    eng.add(vllm_shim.Request("a", p, NEW))
    saved = []
    for _ in range(3):
        out, _ = eng.step()
        saved.append([len(s.token_ids) for s in out.kv_connector_metadata.saves])
    assert saved == [[2 * T], [5 * T], [7 * T]]
    eng.run()
    assert rel(eng.first_logits["a"], recompute(p)[0]) < 1e-5
    assert eng.requests["a"].output_token_ids == recompute(p)[1]
    assert eng.worker_conn.stats["saved_blocks"] == 7
    b = engine_proc(work, daemon, [["b", prompt(2), None]])
    assert b["stats"]["loaded_blocks"] == PREFIX // T
    assert_exact(b["b"], prompt(2))


def test_load_after_vllms_own_prefix_hit_leaves_its_blocks_alone(daemon, work):
    """vLLM had the first 2 blocks in its own prefix cache: the connector
    answers the 4 after them, and the load writes those 4 blocks only."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon)
    p = prompt(2)
    req = vllm_shim.Request("b", p, NEW)
    s, w = eng.sched_conn, eng.worker_conn
    assert s.get_num_new_matched_tokens(req, 2 * T) == (PREFIX - 2 * T, True)
    table = eng._alloc("b", PREFIX)
    for kv in eng.cache.kv:
        kv[:, table[:2]] = 7.0  # vLLM's own (here: a marker)
    s.update_state_after_alloc(req, vllm_shim.KVCacheBlocks(table), PREFIX - 2 * T)
    out = vllm_shim.SchedulerOutput([], vllm_shim.CachedRequestData(), {}, 0, set())
    meta = s.build_connector_meta(out)
    (load,) = meta.loads
    assert (load.start, load.end) == (2, PREFIX // T)
    w.bind_connector_metadata(meta)
    w.start_load_kv(vllm_shim.ForwardContext())
    assert w.get_finished(set()) == (None, {"b"}) and not w.get_block_ids_with_load_errors()
    w.clear_connector_metadata()
    ref = PagedKVCache(CFG, num_pages=8, page_tokens=T, dtype=torch.float32, device="cpu")
    Llama(CFG, seed=0).prefill(ref, list(range(8)), p)
    for kv, rkv in zip(eng.cache.kv, ref.kv):
        assert bool((kv[:, table[:2]] == 7.0).all())
        assert torch.allclose(kv[:, table[2:PREFIX // T]], rkv[:, 2:PREFIX // T], rtol=1e-5,
                              atol=1e-6)


def _nan_layers(eng, table, lo, hi):
    """Per layer: whether its pages table[lo:hi] still hold the shim's NaN poison
    (None: partly)."""
    out = []
    for kv in eng.cache.kv:
        nan = torch.isnan(kv[:, table[lo:hi]])
        out.append(True if bool(nan.all()) else False if not bool(nan.any()) else None)
    return out


def _finish_step(eng, out):
    """The rest of vLLM's step after the worker connector's loads: the
    forward (every layer already copied), wait_for_save, get_finished,
    get_block_ids_with_load_errors, update."""
    w = eng.worker_conn
    sampled = {}
    for rid, n in out.num_scheduled_tokens.items():
        req = eng.requests[rid]
        start = req.num_computed_tokens
        for l in range(len(eng.layer_names)):
            eng._check_layer(l, eng.tables[rid], start)
        sampled[rid] = eng.model.prefill(eng.cache, eng.tables[rid],
                                         req.all_token_ids[:start + n], start=start)
    w.wait_for_save()
    sending, recving = w.get_finished(out.finished_req_ids)
    kv = vllm_shim.KVConnectorOutput(sending, recving, w.get_block_ids_with_load_errors())
    w.clear_connector_metadata()
    eng.update(out, sampled, kv)
    return kv


@pytest.mark.parametrize("ppb", [1, 2])
def test_layers_are_copied_one_at_a_time_and_pins_go_after_the_last(daemon, work, ppb):
    """load_async false, the worker's calls made by hand in vLLM's order:
    start_load_kv verifies and pins the blocks and copies nothing;
    wait_for_layer_load(layer l) fills layer l's pages of every loaded
    block and no other layer's; the pins are released right after the last
    layer (before wait_for_save); the output is exact."""
    tpb = ppb * T
    engine_proc(work, daemon, [["a", prompt(1), None]], tokens_per_block=tpb)
    eng = engine(daemon, load_async=False, tokens_per_block=tpb)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out = eng.schedule()
    (load,) = out.kv_connector_metadata.loads
    nblk = PREFIX // tpb
    assert not load.is_async and (load.start, load.end) == (0, nblk)
    table = list(eng.tables["b"])
    w = eng.worker_conn
    w.bind_connector_metadata(out.kv_connector_metadata)
    w.start_load_kv(vllm_shim.ForwardContext())
    L = len(eng.layer_names)
    assert _nan_layers(eng, table, 0, nblk * ppb) == [True] * L  # nothing copied yet
    assert daemon.metric("kvcached_pinned_blocks") == nblk
    assert w.stats["layerwise_blocks"] == nblk
    for l, name in enumerate(eng.layer_names):
        w.wait_for_layer_load(name)
        assert _nan_layers(eng, table, 0, nblk * ppb) == [False] * (l + 1) + [True] * (L - l - 1)
        w.wait_for_layer_load(name)  # a second forward of the step: nothing more
        assert daemon.metric("kvcached_pinned_blocks") == (0 if l == L - 1 else nblk)
    kv = _finish_step(eng, out)
    assert not kv.invalid_block_ids
    eng.run()
    assert rel(eng.first_logits["b"], recompute(p)[0]) < 1e-5
    assert eng.requests["b"].output_token_ids == recompute(p)[1]
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_forward_calls_each_layer_in_order_between_load_and_save(daemon, work):
    """Through the shim's forward: per layer wait_for_layer_load, then
    save_kv_layer, in layer order (vLLM's maybe_transfer_kv_layer), and
    each layer found its prefix in its pages (the shim checks it)."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon, load_async=False)
    eng.add(vllm_shim.Request("b", prompt(2), NEW))
    eng.step()
    want = [(k, n) for n in eng.layer_names for k in ("load", "save")]
    assert eng.layer_calls == want
    assert eng.worker_conn.stats["layerwise_blocks"] == PREFIX // T
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_a_failed_block_is_never_partly_copied(daemon, work):
    """Block 2 fails its CRC in start_load_kv: blocks 0 and 1 are copied
    layer by layer, block 2 and after never (their pages keep the poison in
    every layer) and every one of them is reported; no pin is left."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    scale_block_2(daemon)
    eng = engine(daemon, load_async=False)
    p = prompt(2)
    eng.add(vllm_shim.Request("b", p, NEW))
    out = eng.schedule()
    table = list(eng.tables["b"])
    w = eng.worker_conn
    w.bind_connector_metadata(out.kv_connector_metadata)
    w.start_load_kv(vllm_shim.ForwardContext())
    assert daemon.metric("kvcached_pinned_blocks") == 2
    for name in eng.layer_names:
        w.wait_for_layer_load(name)
    L = len(eng.layer_names)
    assert _nan_layers(eng, table, 0, 2) == [False] * L
    assert _nan_layers(eng, table, 2, PREFIX // T) == [True] * L
    assert daemon.metric("kvcached_pinned_blocks") == 0
    assert w.get_block_ids_with_load_errors() == set(table[2:PREFIX // T])
    w.clear_connector_metadata()


def _layouts(NP=8, H=2, D=8, L=3):
    g = torch.Generator().manual_seed(5)
    vl = [torch.randn(2, NP, T, H, D, generator=g) for _ in range(L)]
    pm = [torch.randn(NP, 2, T, H, D, generator=g) for _ in range(L)]
    big = torch.randn(4 * L, NP, T, H, D, generator=g)  # K to V: 1 region in even layers, 2 in odd
    ml = [torch.randn(NP, T, 24, generator=g) for _ in range(L)]
    split = PagedLayout.from_pages([big[3 * l] for l in range(L)],
                                   [big[3 * l + 1 + l % 2] for l in range(L)])
    assert len(split.bases) == 2 * L
    return {"vllm": (PagedLayout.vllm(vl), vl), "page_major": (PagedLayout.page_major(pm), pm),
            "split": (split, [big]), "mla": (PagedLayout.mla(ml), ml)}


@pytest.mark.parametrize("ppb", [1, 2])
@pytest.mark.parametrize("kind", ["vllm", "page_major", "split", "mla"])
def test_layer_into_pages_is_the_whole_block_copy_layer_by_layer(daemon, kind, ppb):
    """kvclient.paged's per-layer copy (what wait_for_layer_load uses): for
    every layout the connector may get, layer l of a block lands in layer
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


def test_async_load_is_copied_during_another_requests_forward(daemon, work):
    """An asynchronous load in a step that runs another request: its
    layers are copied as that request's forward reaches them, its pins go
    after the last layer (before wait_for_save), it is reported in
    get_finished's second set, and both outputs are exact."""
    engine_proc(work, daemon, [["a", prompt(1), None]])
    eng = engine(daemon, num_pages=32)
    other = list(reversed(prompt(3)))  # shares no block with prompt(1)
    eng.add(vllm_shim.Request("c", other, NEW))
    eng.add(vllm_shim.Request("b", prompt(2), NEW))
    w = eng.worker_conn
    seen = []
    orig = w.wait_for_save

    def wait_for_save():
        seen.append(daemon.metric("kvcached_pinned_blocks"))
        return orig()
    w.wait_for_save = wait_for_save
    out, kv = eng.step()
    assert set(out.num_scheduled_tokens) == {"c"}
    assert [ld.req_id for ld in out.kv_connector_metadata.loads] == ["b"]
    assert kv.finished_recving == {"b"} and not kv.invalid_block_ids
    assert w.stats["layerwise_blocks"] == PREFIX // T
    assert seen == [0]  # released when c's forward passed the last layer
    assert [k for k, _ in eng.layer_calls] == ["load", "save"] * len(eng.layer_names)
    eng.run()
    for rid, p in (("b", prompt(2)), ("c", other)):
        assert rel(eng.first_logits[rid], recompute(p)[0]) < 1e-5
        assert eng.requests[rid].output_token_ids == recompute(p)[1]
    assert daemon.metric("kvcached_pinned_blocks") == 0
