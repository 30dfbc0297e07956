"""Tenants and namespace limits seen from Python: refusals surface as KvError
with the errno's name, and the daemon logs them at most once a second with a
count of those it did not log, so that every refusal is told exactly once."""
import re
import time

import pytest

from kvclient import Client, KvError, Layout

from conftest import Daemon

LAYOUT = Layout(block_bytes=4096, tokens_per_block=16, layers=2, kv_heads=2, head_dim=64,
                dtype="fp16")
REFUSALS = 50


def told(log: str, what: str) -> tuple[int, int]:
    """(refusals the log tells of, its lines about them) for HELLO ("HELLO")
    or namespace ("new namespace") refusals."""
    n = lines = 0
    for line in log.splitlines():
        if f"{what} refused:" in line:
            lines += 1
            m = re.search(r"\(and (\d+) more refused", line)
            n += 1 + (int(m.group(1)) if m else 0)
        else:
            m = re.search(rf"(\d+) more {what}\(s\) refused", line)
            if m:
                lines += 1
                n += int(m.group(1))
    return n, lines


def wait_told(d: Daemon, what: str, want: int) -> tuple[int, int]:
    got = (0, 0)
    for _ in range(500):  # the tick tells the rest once a second has passed
        got = told(d.log_text(), what)
        if got[0] >= want:
            break
        time.sleep(0.02)
    return got


def test_refused_hellos_are_counted_and_logged_at_most_once_a_second(tmp_root):
    d = Daemon(tmp_root, tenants=("t",)).start()
    try:
        t0 = time.monotonic()
        for _ in range(REFUSALS):
            with pytest.raises(KvError) as e:
                Client(d.socket, tenant="squatter", layout=LAYOUT)
            assert e.value.name == "EPERM"
        took = time.monotonic() - t0
        n, lines = wait_told(d, "HELLO", REFUSALS)
        assert n == REFUSALS
        assert lines <= 2 + int(took), (lines, took)
        assert d.metric('kvcached_hello_refused_total{reason="unknown_tenant"}') == REFUSALS
        with Client(d.socket, tenant="t", layout=LAYOUT) as c:
            assert c.lookup([b"k" * 32])[0] == 0
    finally:
        d.stop()


def test_a_tenant_at_its_namespace_limit_gets_edquot(tmp_root):
    d = Daemon(tmp_root, sets=("limits.namespaces_per_tenant=2",)).start()
    try:
        with Client(d.socket, tenant="t", layout=LAYOUT, salt=b"a"), \
             Client(d.socket, tenant="t", layout=LAYOUT, salt=b"b"):
            for _ in range(REFUSALS):
                with pytest.raises(KvError) as e:
                    Client(d.socket, tenant="t", layout=LAYOUT, salt=b"c")
                assert e.value.name == "EDQUOT"
            assert wait_told(d, "new namespace", REFUSALS)[0] == REFUSALS
        # both closed: room again
        for _ in range(500):
            if d.metrics()["kvcached_namespaces"] == 0:
                break
            time.sleep(0.01)
        with Client(d.socket, tenant="t", layout=LAYOUT, salt=b"c"):
            pass
        assert d.metric('kvcached_namespaces_refused_total{reason="tenant_limit"}') == REFUSALS
    finally:
        d.stop()
