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


class Fleet:
    """Nodes of a fleet on one machine: a throwaway Redis Cluster (the
    checkout's tests/lib/redis_cluster.sh: `masters` masters on loopback,
    no replicas) and kvcached daemons on it, each with G4 on that cluster
    and the fleet's secret (a key file of its own under root).

        with Fleet(tmpdir) as f:
            a, b = f.node("a"), f.node("b")      # started Daemons
            ...

    node(name, **kw): a Daemon (kw as Daemon's) under root/name with
    g4.seeds, g4.key_file and g4.timeout_ms (timeout_ms, default 2000: long
    enough for big blocks on a loaded machine) set. RuntimeError when the
    cluster cannot start; Fleet.SKIP (77) is the script's exit status when
    redis-server or redis-cli is missing (skipped, as the C tests do)."""

    SKIP = 77

    def __init__(self, root: str, masters: int = 3, timeout_ms: int = 2000,
                 script: str | None = None):
        self.root = root
        self.dir = os.path.join(root, "redis")
        self.script = script or os.path.join(_REPO, "tests", "lib", "redis_cluster.sh")
        self.masters = masters
        self.timeout_ms = timeout_ms
        self.ports: list[int] = []
        self.nodes: list[Daemon] = []
        self.key_file = os.path.join(root, "g4.key")

    def start(self) -> "Fleet":
        if not os.path.exists(self.script):
            raise RuntimeError(f"{self.script} not found (a checkout's tests/lib)")
        os.makedirs(self.dir, exist_ok=True)
        r = subprocess.run(["bash", self.script, "start", self.dir, "--masters", str(self.masters),
                            "--replicas", "0", "--owner", str(os.getpid())],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            err = RuntimeError(f"redis_cluster.sh start: exit {r.returncode}: {r.stderr.strip()}")
            err.returncode = r.returncode
            raise err
        words = r.stdout.split()
        self.ports = [int(p) for p in words[words.index("ports") + 1:]]
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        return self

    def node(self, name: str, **kw) -> Daemon:
        seeds = ",".join(f"127.0.0.1:{p}" for p in self.ports[:self.masters])
        sets = tuple(kw.pop("sets", ())) + (f"g4.seeds={seeds}", f"g4.key_file={self.key_file}",
                                            f"g4.timeout_ms={self.timeout_ms}")
        root = os.path.join(self.root, name)
        os.makedirs(root, exist_ok=True)
        d = Daemon(root, sets=sets, **kw).start()
        self.nodes.append(d)
        deadline = time.monotonic() + 30
        while d.metric('kvcached_g4_state{state="ok"}') != 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name}: G4 not ok after 30 s:\n{d.log_text()}")
            time.sleep(0.05)
        return d

    def stop(self) -> None:
        for d in self.nodes:
            d.stop()
        self.nodes = []
        if self.ports:
            subprocess.run(["bash", self.script, "stop", self.dir], capture_output=True,
                           timeout=60)
            self.ports = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
