"""Prefill on one node, decode on another: two kvcached daemons on one
Redis Cluster (two "nodes" on this machine, kvclient.testing.Fleet), the
reference engine (kvclient.examples.llama) in a worker process on each. The
prefill worker on node A computes a prompt and stores it with COMMITs that
are answered once the blocks are in G4 (PagedKV.save(shared=True)); the
decode worker on node B, which never saw the prompt, loads it through G4
and generates: its logits equal a single worker's full recompute (fp32,
1e-5 relative) and its greedy tokens are the same."""
import os

import pytest

torch = pytest.importorskip("torch")

from test_engine import CFG, T, assert_exact, worker  # noqa: E402
from kvclient.testing import Fleet  # noqa: E402


@pytest.fixture
def fleet(tmp_root):
    f = Fleet(tmp_root)
    try:
        f.start()
    except RuntimeError as e:
        if getattr(e, "returncode", None) == Fleet.SKIP:
            pytest.skip(f"no Redis to make a cluster of: {e}")
        raise
    yield f
    # What each node's G4 missed, and its log's end: pytest shows this
    # output with a failing test only.
    for d in f.nodes:
        try:
            misses = {k: v for k, v in d.metrics().items()
                      if k.startswith("kvcached_g4_misses_total") and v}
        except (OSError, RuntimeError) as e:
            misses = f"/metrics: {e}"
        print(f"--- {d.log}: G4 misses {misses}\n{d.log_text()}")
    f.stop()


def prompt(n: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist()


def test_prefill_here_decode_there(fleet, tmp_root):
    a, b = fleet.node("a"), fleet.node("b")
    work = os.path.join(tmp_root, "work")
    os.makedirs(work)
    p = prompt(40 * T + 5)  # 40 full blocks (the last one the decode's own)
    pre = worker(work, a, prompt=p, save=True, shared=True)
    stored = pre["save"][1]
    assert stored == 40 and pre["shared"] == 40, pre["save"]
    # B has never seen it: everything it loads came through G4
    dec = worker(work, b, prompt=p, load=True, lookups=4)
    assert dec["loaded"] == 40 * T and not dec["failed"]
    assert b.metric("kvcached_g4_hits_total") == 40
    assert dec["computed"] == 5
    assert_exact(dec, p)


def test_a_long_prompt_needs_more_than_one_lookup(fleet, tmp_root):
    """g4.lookup_blocks of 16 on node B: one LOOKUP brings 16 blocks in;
    PagedKV.load(lookups=) asks again from the end of the run."""
    a = fleet.node("a")
    b = fleet.node("b", sets=("g4.lookup_blocks=16",))
    work = os.path.join(tmp_root, "work")
    os.makedirs(work)
    p = prompt(40 * T + 1, seed=6)
    assert worker(work, a, prompt=p, save=True, shared=True)["shared"] == 40
    one = worker(work, b, prompt=p, load=True)
    assert one["loaded"] == 16 * T
    more = worker(work, b, prompt=p, load=True, lookups=8)
    assert more["loaded"] == 40 * T
    assert b.metric("kvcached_g4_hits_total") == 40
    assert_exact(more, p)
