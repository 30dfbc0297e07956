"""kvclient.testing: a kvcached of your own, for tests and benchmarks.

    with Daemon(tmpdir, g2="256M", g3=tmpdir + "/g3") as d:
        c = Client(d.socket, tenant="t", layout=...)
        d.evict_g2()                 # the admin socket's /evict, repeated
        d.metric("kvcached_misses_total")

The daemon runs on a private socket directory under `root`, logs to
root/kvcached.log, and is stopped (SIGTERM) by stop() or at the end of the
`with` block. The binary: `binary`, else $KVCACHED_BIN, else the checkout's
build/bin/kvcached.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def kvcached_bin() -> str:
    return os.environ.get("KVCACHED_BIN", os.path.join(_REPO, "build", "bin", "kvcached"))


def http(sock_path: str, path: str, method: str = "GET", timeout: float = 10.0) -> tuple[int, str]:
    """One HTTP/1.1 request without a body over a Unix socket (the daemon's
    stats or admin socket): (status, body)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: kvcached\r\nContent-Length: 0\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


class Daemon:
    """A kvcached of a test's own.

    g2: G2 capacity; page: G2 page size (the largest block must fit);
    g3: None (no SSD tier) or a directory; g3_capacity, g3_block: its size and
    slot size (the largest block it takes); g1: None (G1 off) or a pool
    capacity per device (G1 on: start fails without a device), g1_backend:
    "auto" or "sim"; tenants: () for the one default tenant (every peer acts
    as it, whatever tenant it names), or tenant names, each configured
    ([tenant.NAME]) for this process's uid, with a G2 arena of its own;
    sets: more `--set NAME=VALUE`.
    """

    def __init__(self, root: str, g2: str = "64M", g3: str | None = None,
                 g3_capacity: str = "256M", g3_block: str = "1M", page: str = "4M",
                 g1: str | None = None, g1_backend: str = "auto", tenants: tuple = (),
                 sets: tuple = (), binary: str | None = None, log_level: str = "info"):
        self.root = root
        self.dir = os.path.join(root, "sock")
        self.socket = os.path.join(self.dir, "kvcached.sock")
        self.stats = os.path.join(self.dir, "kvcached-stats.sock")
        self.admin = os.path.join(self.dir, "kvcached-admin.sock")
        self.log = os.path.join(root, "kvcached.log")
        self.args = [binary or kvcached_bin(), "--socket-dir", self.dir, "--g2-capacity", g2,
                     "--set", f"g2.page_size={page}", "--set", "g2.lock=no",
                     "--g3-path", g3 or "", "--log-level", log_level]
        for t in tenants:
            self.args += ["--set", f"tenant.{t}.uids={os.getuid()}"]
        if g3:
            self.args += ["--g3-capacity", g3_capacity, "--set", f"g3.block_bytes={g3_block}"]
        if g1:
            self.args += ["--set", "g1.enable=on", "--set", f"g1.capacity={g1}",
                          "--set", f"g1.backend={g1_backend}"]
        else:
            self.args += ["--set", "g1.enable=off"]
        for s in sets:
            self.args += ["--set", s]
        self.proc = None

    def start(self, timeout: float = 30.0) -> "Daemon":
        if not os.path.exists(self.args[0]):
            raise RuntimeError(f"{self.args[0]} not found (build it: cmake --build build; "
                               "or set KVCACHED_BIN)")
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(self.args, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvcached exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                if http(self.stats, "/health", timeout=1.0)[0] in (200, 503):
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"kvcached did not serve within {timeout} s:\n{self.log_text()}")

    def stop(self, sig=signal.SIGTERM):
        """Stops the daemon (SIGTERM: clean; SIGKILL: a crash); its exit status."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def restart(self, sig=signal.SIGTERM) -> "Daemon":
        self.stop(sig)
        return self.start()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()

    def log_text(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def post(self, path: str) -> dict:
        """POST to the admin socket; the JSON answer (raises on an HTTP error)."""
        code, body = http(self.admin, path, "POST", timeout=60.0)
        if code != 200:
            raise RuntimeError(f"POST {path}: {code} {body}")
        return json.loads(body)

    def evict_g2(self, client, keys, timeout: float = 120.0) -> None:
        """Pushes `keys` out of G2 (down to G3, when there is one): /evict
        until LOOKUP shows none of them in G2. A chain is cut from its end
        (a block goes after its children), so each /evict takes what may go
        at that moment, and the SSD writes finish in the background."""
        from .client import G1, G2
        deadline = time.monotonic() + timeout
        while True:
            self.post("/evict?tier=g2")
            tiers = client.lookup(keys)[1]
            if not any(t in (G1, G2) for t in tiers):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"blocks still in G2 after {timeout} s: {tiers}")
            time.sleep(0.002)

    def metrics(self) -> dict:
        """/metrics as {'name{labels}': value}."""
        code, body = http(self.stats, "/metrics")
        if code != 200:
            raise RuntimeError(f"/metrics: {code} {body}")
        out = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, _, val = line.rpartition(" ")
                out[name] = float(val)
        return out

    def metric(self, prefix: str) -> float:
        """The sum of every series whose name (with labels) starts with prefix."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))
