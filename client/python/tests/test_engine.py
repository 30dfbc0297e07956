"""The reference engine's KV through a real kvcached, judged by the model's
own output: a worker process stores a prompt's KV, another loads the shared
prefix and computes only the rest, and its logits must equal a full
recompute (fp32: 1e-5 relative) with the same greedy tokens. Then the same
from G3, after a restart, with a corrupted SSD block, with blocks evicted
between LOOKUP and LOAD, across a TP group, and with a block changed in G2
after COMMIT (which the output shows)."""
import ctypes
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import HERE, Daemon, http_post  # noqa: E402
from kvclient import G3, Client  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402

T = 16                       # tokens per page (= per block)
PREFIX = 6 * T               # shared prefix: 6 blocks
CFG = LlamaConfig.preset("tiny")
NEW = 4                      # greedy tokens compared


def prompt(suffix_seed: int, n_suffix: int = 21):
    g = torch.Generator().manual_seed(1234)
    prefix = torch.randint(0, CFG.vocab_size, (PREFIX,), generator=g).tolist()
    g = torch.Generator().manual_seed(suffix_seed)
    return prefix + torch.randint(0, CFG.vocab_size, (n_suffix,), generator=g).tolist()


_model = None


def reference_model() -> Llama:
    """The reference engine's model (CFG, seed 0), made once per process."""
    global _model
    if _model is None:
        _model = Llama(CFG, seed=0)
    return _model


def recompute(p):
    """Full prefill of p in this process: (last logits, greedy tokens)."""
    _model = reference_model()
    cache = PagedKVCache(CFG, num_pages=cache_pages(len(p) + NEW), page_tokens=T,
                         dtype=torch.float32, device="cpu")
    pages = cache.alloc(cache.pages_for(len(p) + NEW))
    logits = _model.prefill(cache, pages, p)
    return logits, _model.generate(cache, pages, p, NEW, start=len(p))


def cache_pages(n):
    return -(-n // T)


def run_worker(tmp, script, spec, timeout=120):
    """Runs tests/SCRIPT SPEC.json OUT.pt in a process of its own (the
    engine workers of this file, test_vllm and test_sglang); its result."""
    n = len(os.listdir(tmp))
    sp, out = os.path.join(tmp, f"spec{n}.json"), os.path.join(tmp, f"out{n}.pt")
    with open(sp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([sys.executable, os.path.join(HERE, script), sp, out],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.load(out)


def worker(tmp, daemon, **spec):
    """Runs engine_worker.py in a process of its own; its result dict."""
    spec = {"socket": daemon.socket, "preset": "tiny", "page_tokens": T, "new_tokens": NEW, **spec}
    return run_worker(tmp, "engine_worker.py", spec)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def assert_exact(res, p):
    ref_logits, ref_tokens = recompute(p)
    assert rel(res["logits"], ref_logits) < 1e-5
    assert res["tokens"] == ref_tokens


@pytest.fixture
def work(tmp_root):
    d = os.path.join(tmp_root, "work")
    os.makedirs(d)
    return d


@pytest.fixture
def g3daemon(tmp_root):
    g3 = os.path.join(tmp_root, "g3")
    os.makedirs(g3)
    d = Daemon(tmp_root, g2="16M", g3=g3, g3_block="64K").start()
    yield d
    d.stop()


def test_second_worker_loads_the_prefix_and_matches_recompute(daemon, work):
    a = worker(work, daemon, prompt=prompt(1), save=True)
    assert a["save"] == [0, 7, 0, 0]  # 117 tokens: 7 full blocks stored
    assert_exact(a, prompt(1))
    b = worker(work, daemon, prompt=prompt(2), load=True)
    assert (b["hit"], b["loaded"], b["failed"]) == (6, PREFIX, [])  # the shared prefix only
    assert_exact(b, prompt(2))
    # the same prompt again: all but the last, partial, block
    c = worker(work, daemon, prompt=prompt(1), load=True)
    assert c["loaded"] == 7 * T
    assert_exact(c, prompt(1))


def test_two_pages_per_block(daemon, work):
    a = worker(work, daemon, prompt=prompt(1), save=True, pages_per_block=2)
    assert a["save"][1] == 3  # 117 tokens: 3 blocks of 32
    b = worker(work, daemon, prompt=prompt(2), load=True, pages_per_block=2)
    assert b["loaded"] == PREFIX
    assert_exact(b, prompt(2))


def push_to_g3(d, keys):
    """Evicts from G2 until every key is on the SSD only."""
    with Client(d.socket, tenant="t", layout=layout_of()) as c:
        d.evict_g2(c, keys, timeout=20)
        assert c.lookup(keys)[1] == [G3] * len(keys)


def test_from_g3_and_warm_after_a_restart(g3daemon, work):
    d = g3daemon
    worker(work, d, prompt=prompt(1), save=True)
    with Client(d.socket, tenant="t", layout=layout_of()) as c:
        keys = c.chain_keys(prompt(1))
    assert len(keys) == 7
    push_to_g3(d, keys)
    b = worker(work, d, prompt=prompt(2), load=True)
    assert b["loaded"] == PREFIX
    assert_exact(b, prompt(2))
    d.restart()  # SIGTERM, then a new daemon on the same G3
    c = worker(work, d, prompt=prompt(3), load=True)
    assert (c["loaded"], c["failed"]) == (PREFIX, [])
    assert_exact(c, prompt(3))


def layout_of():
    cache = PagedKVCache(CFG, num_pages=1, page_tokens=T, dtype=torch.float32, device="cpu")
    return PagedLayout.vllm(cache.kv).client_layout()


def block_bytes_of(d, key):
    with Client(d.socket, tenant="t", layout=layout_of()) as c:
        return c.get(key)


def corrupt_on_disk(g3dir, payload):
    """Flips one byte in the middle of the record holding `payload`."""
    probe = payload[:512]
    for root, _, files in os.walk(g3dir):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "r+b") as fh:
                data = fh.read()
                at = data.find(probe)
                if at < 0:
                    continue
                fh.seek(at + len(payload) // 2)
                b = fh.read(1)
                fh.seek(at + len(payload) // 2)
                fh.write(bytes([b[0] ^ 0x5A]))
                fh.flush()
                os.fsync(fh.fileno())
                return path
    raise AssertionError("block payload not found in the G3 files")


def block_3_corrupt_on_the_ssd(d, tmp_root, work):
    """prompt(1) stored through d, pushed to its SSD, and block 3's bytes
    there corrupted while d is stopped; d started again."""
    worker(work, d, prompt=prompt(1), save=True)
    with Client(d.socket, tenant="t", layout=layout_of()) as c:
        keys = c.chain_keys(prompt(1))
    victim = block_bytes_of(d, keys[3])
    push_to_g3(d, keys)
    d.stop()
    corrupt_on_disk(os.path.join(tmp_root, "g3"), victim)
    d.start()


def test_a_corrupted_ssd_block_shortens_the_prefix_and_output_stays_exact(g3daemon, tmp_root,
                                                                          work):
    d = g3daemon
    block_3_corrupt_on_the_ssd(d, tmp_root, work)
    b = worker(work, d, prompt=prompt(2), load=True)
    assert b["loaded"] == 3 * T  # blocks 0..2; block 3 failed its checksum
    assert b["failed"][0] == [3, "KV_ECORRUPT"]
    assert_exact(b, prompt(2))
    assert d.metric('kvcached_misses_total{reason="corrupt"}') >= 1
    # the corrupt copy was dropped: the next worker recomputes and stores it
    # again (blocks 4 and 5 are still on the SSD: counted, not written)
    c = worker(work, d, prompt=prompt(2), load=True, save=True)
    assert c["loaded"] == 3 * T and c["save"] == [3, 2, 2, 0]
    e = worker(work, d, prompt=prompt(4), load=True)
    assert e["loaded"] == PREFIX
    assert_exact(e, prompt(4))


def test_a_corrupted_ssd_block_is_a_hole_computed_alone(g3daemon, tmp_root, work):
    """Block 3 corrupt on the SSD: a worker loading past holes gets blocks
    0..2 and 4..5, block 3 fails its checksum and is the only block it
    computes, and the output is a full recompute's."""
    d = g3daemon
    block_3_corrupt_on_the_ssd(d, tmp_root, work)
    p = prompt(2)
    b = worker(work, d, prompt=p, load=True, holes=True)
    assert b["hit"] == 6  # LOOKUP found it: the check on the way up failed
    assert b["failed"] == [[3, "KV_ECORRUPT"]]
    assert b["filled"] == [(0, 3 * T), (4 * T, 6 * T)]
    assert b["computed"] == T + len(p) - PREFIX
    assert_exact(b, p)


@pytest.mark.parametrize("holes", [[0], [2], [5], [1, 3, 4]],
                         ids=["start", "middle", "end", "several"])
def test_holes_are_computed_alone_and_output_stays_exact(daemon, work, holes):
    """Blocks of the stored prefix deleted (holes): a worker that loads
    past holes gets every other block, computes only the holes' tokens
    (and the prompt's own tail), and its logits and greedy tokens equal a
    full recompute; one that stops at the first hole computes from there."""
    worker(work, daemon, prompt=prompt(1), save=True)
    with Client(daemon.socket, tenant="t", layout=layout_of()) as c:
        keys = c.chain_keys(prompt(1))
        assert c.delete([keys[i] for i in holes]) == len(holes)
    p = prompt(2)
    tail = len(p) - PREFIX  # the tokens past the shared prefix, never stored for p
    b = worker(work, daemon, prompt=p, load=True, holes=True)
    kept = [i for i in range(6) if i not in holes]
    assert b["filled"] == merged([(i * T, (i + 1) * T) for i in kept])
    assert b["loaded"] == (holes[0] * T)
    assert b["computed"] == len(holes) * T + tail
    assert not b["failed"]
    assert_exact(b, p)
    a = worker(work, daemon, prompt=p, load=True)
    assert a["loaded"] == holes[0] * T and a["computed"] == len(p) - holes[0] * T
    assert_exact(a, p)


def merged(ranges):
    out = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def test_blocks_evicted_between_lookup_and_load(daemon, work):
    """In-process worker: between its LOOKUP and its LOAD the operator
    evicts blocks; the LOAD answers them as missing, the engine recomputes
    from the first one, and the output is still exact."""
    worker(work, daemon, prompt=prompt(1), save=True)
    p = prompt(2)
    model = Llama(CFG, seed=0)
    cache = PagedKVCache(CFG, num_pages=20, page_tokens=T, dtype=torch.float32, device="cpu")
    pages = cache.alloc(cache.pages_for(len(p) + NEW))
    layout = PagedLayout.vllm(cache.kv)
    with Client(daemon.socket, tenant="t", layout=layout.client_layout()) as c:
        pk = PagedKV(c, layout)
        real = c.lookup

        def lookup_then_evict(keys):
            r = real(keys)
            code, body = http_post(daemon.admin, "/evict?tier=g2&count=3")
            assert code == 200 and json.loads(body)["evicted"] == 3, body
            return r
        c.lookup = lookup_then_evict
        r = pk.load(p, pages)
    assert r.hit == 6 and 0 < r.blocks < 6 and r.failed
    assert all(e.name == "KV_ENOTFOUND" for _, e in r.failed)
    logits = model.prefill(cache, pages, p, start=r.tokens)
    ref, ref_tokens = recompute(p)
    assert rel(logits, ref) < 1e-5
    assert model.generate(cache, pages, p, NEW, start=len(p)) == ref_tokens
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_tp_group_gets_one_hit_length_and_namespaces_do_not_mix(tmp_root, work):
    d = Daemon(tmp_root, tenants=("t", "u")).start()
    try:
        p = prompt(1)
        r0 = worker(work, d, prompt=p, save=True, tp=[0, 2, "g"])
        r1 = worker(work, d, prompt=p[:3 * T + 1], save=True, tp=[1, 2, "g"])
        assert r0["save"][1] == 7 and r1["save"][1] == 3
        # rank 0 holds 7 blocks, rank 1 three: each rank's LOOKUP answers the
        # group's minimum (the group remembers its ranks' namespaces)
        a = worker(work, d, prompt=p, load=True, tp=[0, 2, "g"])
        assert a["hit"] == 3 and a["loaded"] == 3 * T
        assert worker(work, d, prompt=p, load=True, tp=[1, 2, "g"])["hit"] == 3
        # another tenant, another salt, another layout: nothing
        assert worker(work, d, prompt=p, load=True, tp=[0, 2, "g"], tenant="u")["hit"] == 0
        assert worker(work, d, prompt=p, load=True, tp=[0, 2, "g"], salt="aa")["hit"] == 0
        assert worker(work, d, prompt=p, load=True)["hit"] == 0  # no TP: another layout
    finally:
        d.stop()


def scale_block_2(daemon):
    """A worker writes into committed block 2 of prompt(1) through its G2
    mapping (nothing in the daemon can stop that)."""
    with Client(daemon.socket, tenant="t", layout=layout_of()) as c:
        keys = c.chain_keys(prompt(1))
        with c.load(keys[2:3]) as got:
            b = got.blocks[0]
            n = b.length // 4
            vals = (ctypes.c_float * n).from_address(b.ptr)
            for i in range(0, n, 7):
                vals[i] = vals[i] * 3.0 + 1.0


def test_a_block_changed_in_g2_after_commit_changes_the_output(daemon, work):
    """The check the tests above rely on: were a load to serve other bytes,
    the logits would show it. A worker writes into a committed block through
    its G2 mapping; the next worker, loading without PagedKV's check
    (verify=False: the daemon does not re-read G2 bytes on a LOAD), gets an
    output that differs from the recompute."""
    worker(work, daemon, prompt=prompt(1), save=True)
    scale_block_2(daemon)
    b = worker(work, daemon, prompt=prompt(2), load=True, verify=False)
    assert b["loaded"] == PREFIX
    ref, _ = recompute(prompt(2))
    assert rel(b["logits"], ref) > 1e-3


def test_a_block_changed_in_g2_after_commit_is_caught_and_recomputed(daemon, work):
    """The same change, loaded as engines load by default: the block fails
    its CRC, ends the usable prefix and is reported; the engine recomputes
    from there and its output is exact."""
    worker(work, daemon, prompt=prompt(1), save=True)
    scale_block_2(daemon)
    b = worker(work, daemon, prompt=prompt(2), load=True)
    assert b["loaded"] == 2 * T
    assert b["failed"] == [[2, "KV_ECORRUPT"]]
    assert_exact(b, prompt(2))
    assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1
    assert daemon.metric("kvcached_pinned_blocks") == 0


def test_holes_ttft_benchmark_runs(tmp_root):
    """tools/bench/holes_ttft.py end to end at a small size: its JSON says
    the hole's block and the last one were all it computed, and every way
    gave the recompute's greedy token."""
    out = os.path.join(tmp_root, "holes.json")
    script = os.path.join(HERE, "..", "..", "..", "tools", "bench", "holes_ttft.py")
    r = subprocess.run([sys.executable, script, "--device", "cpu", "--preset", "tiny",
                        "--lengths", "512", "--runs", "1", "--json", out],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| 512 |" in r.stdout
    with open(out) as f:
        row = json.load(f)["rows"][0]
    assert row["hole_block"] == 15 and row["stored_blocks"] == 31
    assert row["holes"]["computed_tokens"] == 2 * T
    assert row["from_hole"]["computed_tokens"] == 512 - 15 * T
    assert row["recompute"]["computed_tokens"] == 512
    for way in ("holes", "from_hole"):
        assert row[way]["same_argmax"] and row[way]["max_rel_logit_diff"] < 1e-5
