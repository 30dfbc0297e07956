"""kvclient.aio: the same session, for engines with their own asyncio loop.

    c = Client(socket=..., tenant=..., layout=...)
    ac = AsyncClient(c)                      # registers kvc_fd with loop.add_reader
    hit, tiers = await ac.lookup(keys)
    got = await ac.load(keys[:hit])          # a Loaded, as Client.load returns
    ...
    await ac.release(got)                    # or got.release() (a blocking call)
    a = await ac.alloc(keys, parents)
    await ac.commit(a)
    ac.close()                               # removes the reader (the Client stays open)

Requests go out without blocking the loop (libkvclient's kvc_submit_*; a
request blocks only while the socket's send buffer is full); replies are
read when the socket is readable (kvc_poll), in any order, and each
resolves its own future. Many requests may be in flight at once.

Blocking calls of the underlying Client may be mixed in: they can read
replies meant for pending futures, so every call of this class, and the
reader, drain what the library has collected.
"""
from __future__ import annotations

import asyncio
import errno
import ctypes

from . import _lib
from .client import (G2, Allocation, Client, Loaded, _new_blocks, _parents_array, session_id,
                     stop_code)
from .errors import KvError

_OP_LOOKUP, _OP_LOAD, _OP_RELEASE, _OP_ALLOC, _OP_COMMIT = 2, 3, 4, 5, 6


class AsyncClient:
    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop | None = None):
        self.client = client
        self._loop = loop or asyncio.get_running_loop()  # made inside the loop
        self._L = _lib.lib()
        self._fd = client.fileno()
        self._pending: dict[int, tuple] = {}  # id -> (future, finish, keep-alive)
        self._loop.add_reader(self._fd, self._drain)
        self._closed = False

    def close(self):
        """Stops reading; pending futures fail with EBADF. The Client stays open."""
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
            for fut, _, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(KvError(-errno.EBADF, "aio", "closed"))
            self._pending.clear()

    def _drain(self):
        out = (_lib.KvcCompletion * 64)()
        while True:
            n = self._L.kvc_poll(self.client._handle(), out, 64)
            if n < 0:  # the connection is dead: every pending request fails
                err = KvError(n, "poll")
                for fut, _, _ in self._pending.values():
                    if not fut.done():
                        fut.set_exception(err)
                self._pending.clear()
                self._loop.remove_reader(self._fd)
                self._closed = True
                return
            for i in range(n):
                ent = self._pending.pop(int(out[i].id), None)
                if ent is None:
                    continue
                fut, finish, _ = ent
                if fut.done():
                    continue
                try:
                    fut.set_result(finish(int(out[i].result)))
                except Exception as e:  # KvError for a failed request
                    fut.set_exception(e)
            if n < 64:
                return

    def _submit(self, rid: int, op: str, finish, keep) -> "asyncio.Future":
        if self._closed:
            raise KvError(-errno.EBADF, op, "AsyncClient closed")
        if rid < 0:
            raise KvError(rid, op)
        fut = self._loop.create_future()
        self._pending[rid] = (fut, finish, keep)
        self._loop.call_soon(self._drain)  # a blocking call may have read it already
        return fut

    @staticmethod
    def _result(op):
        def check(r):
            if r < 0:
                raise KvError(r, op)
            return r
        return check

    async def lookup(self, keys) -> tuple[int, list[int]]:
        keys = Client._keys(keys)
        ka = _lib.keys_array(keys)
        tiers = (ctypes.c_uint8 * max(len(keys), 1))()
        rid = self._L.kvc_submit_lookup(self.client._handle(), ka, len(keys), tiers, None)
        chk = self._result("lookup")
        return await self._submit(rid, "lookup", lambda r: (chk(r), list(tiers[:len(keys)])),
                                  (ka, tiers))

    async def load(self, keys, tier: int = G2) -> Loaded:
        keys = Client._keys(keys)
        ka = _lib.keys_array(keys)
        out = (_lib.KvcBlock * max(len(keys), 1))()
        rid = self._L.kvc_submit_load(self.client._handle(), tier, ka, len(keys), out, None)
        chk = self._result("load")

        def finish(r):
            chk(r)
            return Loaded(self.client, keys, _new_blocks(self.client, keys, out, False))
        return await self._submit(rid, "load", finish, (ka, out))

    async def _status(self, fn, op, keys) -> list[int]:
        keys = Client._keys(keys)
        ka = _lib.keys_array(keys)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        rid = fn(self.client._handle(), ka, len(keys), st, None)
        chk = self._result(op)
        return await self._submit(rid, op, lambda r: (chk(r), list(st[:len(keys)]))[1], (ka, st))

    async def release(self, what) -> list[int]:
        """Releases a Loaded's usable blocks (or a list of keys)."""
        keys = what._take("release", again_ok=True) if isinstance(what, Loaded) else list(what)
        if not keys:
            return []
        return await self._status(self._L.kvc_submit_release, "release", keys)

    async def alloc(self, keys, parents=None, prio: int = 128, tier: int = G2) -> Allocation:
        keys = Client._keys(keys)
        ka = _lib.keys_array(keys)
        pa = _parents_array(keys, parents)
        out = (_lib.KvcBlock * max(len(keys), 1))()
        rid = self._L.kvc_submit_alloc(self.client._handle(), tier, prio, ka, pa, len(keys), out,
                                       None)
        chk = self._result("alloc")

        def finish(r):
            chk(r)
            return Allocation(self.client, keys, _new_blocks(self.client, keys, out, True))
        return await self._submit(rid, "alloc", finish, (ka, pa, out))

    async def commit(self, what, crcs=None) -> list[int]:
        """Commits an Allocation's usable blocks, with their CRCs (as
        Allocation.commit), or a list of keys (with `crcs`, one per key, or
        without: the daemon computes them)."""
        if isinstance(what, Allocation):
            by_key = what._crcs() if not what.done else {}
            keys = what._take("commit", again_ok=False)
            crcs = [by_key[k] for k in keys]
        else:
            keys = Client._keys(what)
        if not keys:
            return []
        if crcs is None:
            return await self._status(self._L.kvc_submit_commit, "commit", keys)
        if len(crcs) != len(keys):
            raise ValueError(f"{len(crcs)} CRCs for {len(keys)} keys")
        ka = _lib.keys_array(keys)
        ca = (ctypes.c_uint32 * len(keys))(*crcs)
        st = (ctypes.c_int32 * len(keys))()
        rid = self._L.kvc_submit_commit_crc(self.client._handle(), ka, ca, len(keys), st, None)
        chk = self._result("commit")
        return await self._submit(rid, "commit", lambda r: (chk(r), list(st[:len(keys)]))[1],
                                  (ka, ca, st))

    async def hint(self, kind: str, session, keys=(), stop="unknown", retain_s: int = 0) -> list[int]:
        """An engine hint without blocking the loop (Client.hint_session,
        hint_finished, hint_end): kind "session", "finished" or "end".
        Per-key statuses."""
        kinds = {"session": 1, "finished": 2, "end": 3}
        if kind not in kinds:
            raise ValueError(f"hint kind {kind!r}: session, finished or end")
        keys = Client._keys(keys)
        ka = _lib.keys_array(keys) if keys else None
        st = (ctypes.c_int32 * max(len(keys), 1))()
        rid = self._L.kvc_submit_hint(self.client._handle(), kinds[kind], session_id(session),
                                      stop_code(stop) if kind == "finished" else 0, retain_s,
                                      ka, len(keys), st, None)
        chk = self._result("hint")
        return await self._submit(rid, "hint", lambda r: (chk(r), list(st[:len(keys)]))[1],
                                  (ka, st))
