"""Fixtures of the Python tests: the package from this checkout, and a real
kvcached started on a private socket directory (stopped after each test).

Environment: KVCACHED_BIN (the daemon; default <repo>/build/bin/kvcached),
KVCLIENT_LIB (the library; default: the checkout's build tree). ctest sets
both to the build it runs in.
"""
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
# Import kvclient from this checkout (client/python), not from an installed
# copy; except where tests/sh/wheel.sh runs a test against the installed wheel.
if not os.environ.get("KVCLIENT_WHEEL_VENV"):
    sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))


from kvclient.testing import Daemon, http  # noqa: E402


def http_get(sock_path: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    return http(sock_path, path, "GET", timeout)


def http_post(sock_path: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
    return http(sock_path, path, "POST", timeout)


@pytest.fixture
def tmp_root():
    with tempfile.TemporaryDirectory(prefix="kvpy-") as d:
        yield d


@pytest.fixture
def daemon(tmp_root):
    """A running kvcached, G2 64 MiB, no G3."""
    d = Daemon(tmp_root).start()
    yield d
    d.stop()


@pytest.fixture
def daemon_g3(tmp_root):
    """A running kvcached with G2 of 16 MiB and a G3 of 256 MiB in the test's directory."""
    g3 = os.path.join(tmp_root, "g3")
    os.makedirs(g3)
    d = Daemon(tmp_root, g2="16M", g3=g3).start()
    yield d
    d.stop()
