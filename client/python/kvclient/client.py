"""Client: one connection and one session with kvcached (a kvc handle).

    layout = Layout(block_bytes=..., tokens_per_block=16, layers=32, kv_heads=8,
                    head_dim=128, dtype="bf16")
    with Client(tenant="llama-8b", layout=layout) as c:
        keys = c.chain_keys(token_ids)              # one 32-byte key per full block
        hit, tiers = c.lookup(keys)
        with c.load(keys[:hit]) as got:             # pins; released on exit
            for b in got.blocks:
                if not b.ok: break                  # b.error says why; the rest is recomputed
                use(b.read())                       # a verified copy of the committed bytes
        with c.alloc(new_keys, parents=...) as a:   # two-phase store
            for b in a.blocks:
                if b.ok: b.write(data)              # copied in and checksummed in one pass
            a.commit()                              # visible from now on; abort() if not

Verification (daemon/OPS.md, "Trust model"): every worker of a tenant can
write any block of the tenant's G2 arena, so a loaded block's bytes are
only as good as the last worker that touched them. `Block.read()` copies a
block out and checks the copy against the CRC it was committed with, in
the same pass: the only way to get bytes known to be the committed ones.
A block that fails raises KvError(KV_ECORRUPT), is reported to the daemon
(which checks its own copy and drops the block) and stops being usable.
Writers checksum what they store: `Block.write()` copies and checksums in
one pass, and commit() sends the CRCs (computed over the slot for blocks
written in place).

Zero-copy views are not verified: `Block.view` is a memoryview over the
daemon's shared G2 mapping, `Block.numpy()`/`Block.torch()` are views of
it, and a G1 block's `Block.torch()` is a CUDA tensor over the imported
device pool (through __cuda_array_interface__). `Block.verify()` checks a
G2 block in place first, which is weaker: another worker of the tenant may
change the bytes after the check. A view is valid while the block is
pinned (load) or allocated (alloc) and the client is open; after release
the slot may hold another block. The package drops its own views at
release; views derived from them (numpy, torch) are the caller's to drop.

Errors of a whole request raise KvError (code, name, the library's text);
per-block results stay per block (Block.status / Block.ok / Block.error).

A Client is used by one thread at a time (libkvclient has no internal
lock); use one Client per thread. For an asyncio loop see kvclient.aio.
"""
from __future__ import annotations

import array
import ctypes
import errno
import json
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from . import _lib
from .errors import CODES, KvError, check

KV_ECORRUPT = CODES["KV_ECORRUPT"]

G1, G2, G3 = 0, 1, 2
TIER_NONE = 0xFF
TIER_NAMES = {G1: "G1", G2: "G2", G3: "G3", TIER_NONE: "none"}
G1_CUDA, G1_SIM = 1, 2
BATCH_MAX = _lib.BATCH_MAX


@dataclass(frozen=True)
class Layout:
    """What HELLO declares: together with the tenant and the salt it names the
    namespace, so two engines share blocks only when all of it agrees."""
    block_bytes: int
    tokens_per_block: int
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tp_rank: int = 0
    tp_size: int = 1

    def _c(self) -> _lib.KvcLayout:
        for f in ("block_bytes", "tokens_per_block", "layers", "kv_heads", "head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or not 0 < v < 2 ** 32:
                raise ValueError(f"Layout.{f} = {v!r}: a positive 32-bit integer")
        if not 0 <= self.tp_rank < self.tp_size < 2 ** 16:
            raise ValueError(f"Layout: tp_rank {self.tp_rank} must be < tp_size {self.tp_size}")
        d = self.dtype.encode()
        if not 1 <= len(d) <= 16:
            raise ValueError(f"Layout.dtype {self.dtype!r}: 1..16 bytes")
        return _lib.KvcLayout(self.block_bytes, self.tokens_per_block, self.layers, self.kv_heads,
                              self.head_dim, self.tp_rank, self.tp_size, d)


def chain_hash(tokens: Sequence[int], parent: bytes | None = None, extra: bytes = b"",
               salt: bytes = b"") -> bytes:
    """kvc_chain_hash: the canonical chained block key (BLAKE2b-256, keyed by
    `salt`) of one block's token ids after `parent` (the previous block's
    digest; None for the first block). `extra` carries whatever else decides
    the KV (a LoRA id, multimodal input hashes)."""
    L = _lib.lib()
    n = len(tokens)
    toks = (ctypes.c_int32 * n)(*tokens) if n else None
    out = (ctypes.c_uint8 * _lib.DIGEST_BYTES)()
    if parent is not None and len(parent) != _lib.DIGEST_BYTES:
        raise ValueError(f"parent: {len(parent)} bytes, a digest is {_lib.DIGEST_BYTES}")
    extra, salt = bytes(extra), bytes(salt)
    check(L.kvc_chain_hash(out, parent, toks, n, extra or None, len(extra), salt or None,
                           len(salt)), "chain_hash")
    return bytes(out)


def _int32_buffer(tokens):
    """(ctypes pointer, count, keep-alive) of tokens as contiguous int32,
    without a per-element Python loop for lists, arrays and tensors."""
    mod = type(tokens).__module__
    if mod.startswith("torch"):
        import torch
        t = tokens.detach().to(device="cpu", dtype=torch.int32).contiguous()
        return ctypes.c_void_p(t.data_ptr()), t.numel(), t
    if mod.startswith("numpy"):
        import numpy as np
        a = np.ascontiguousarray(tokens, dtype=np.int32)
        return ctypes.c_void_p(a.ctypes.data), a.size, a
    a = array.array("i", tokens)  # C int: 32 bits on every platform kvcached runs on
    if a.itemsize != 4:
        raise OSError(f"array('i') has {a.itemsize}-byte items here; token ids are int32")
    addr, n = a.buffer_info()
    return ctypes.c_void_p(addr), n, a


def chain_keys(tokens: Sequence[int], tokens_per_block: int, extra: bytes = b"",
               salt: bytes = b"", parent: bytes | None = None) -> list[bytes]:
    """One chained key per FULL block of `tokens` (a partial last block has
    no key: its KV is not complete). Key i covers tokens
    [i*tokens_per_block, (i+1)*tokens_per_block) and depends on every token
    before it: chain_hash block by block, in one call (kvc_chain_keys)."""
    if tokens_per_block <= 0:
        raise ValueError("tokens_per_block must be > 0")
    if parent is not None and len(parent) != _lib.DIGEST_BYTES:
        raise ValueError(f"parent: {len(parent)} bytes, a digest is {_lib.DIGEST_BYTES}")
    ptr, n, keep = _int32_buffer(tokens)
    nblocks = n // tokens_per_block
    if nblocks == 0:
        return []
    out = (ctypes.c_uint8 * (nblocks * _lib.DIGEST_BYTES))()
    extra, salt = bytes(extra), bytes(salt)
    got = check(_lib.lib().kvc_chain_keys(out, nblocks, parent, ptr, n, tokens_per_block,
                                          extra or None, len(extra), salt or None, len(salt)),
                "chain_keys")
    raw = bytes(out)
    del keep
    return [raw[i * 32:(i + 1) * 32] for i in range(got)]


# Stop reasons of a finished request (base/hint.h; PROTOCOL.md, HINT).
STOP_UNKNOWN, STOP_END_TURN, STOP_TOOL_USE, STOP_MAX_TOKENS = 0, 1, 2, 3
STOP_STOP_SEQUENCE, STOP_ABORTED, STOP_OTHER = 4, 5, 6
_STOP_NAMES = {"unknown": 0, "end_turn": 1, "stop": 1, "tool_use": 2, "tool_calls": 2,
               "function_call": 2, "max_tokens": 3, "length": 3, "stop_sequence": 4,
               "aborted": 5, "abort": 5}


def stop_code(stop) -> int:
    """The STOP_* number of a stop reason: a number 0..6 as it is, a name
    as libkvclient's kvc_stop_parse reads it (an unknown name is
    STOP_OTHER; None or "" STOP_UNKNOWN)."""
    if stop is None or stop == "":
        return STOP_UNKNOWN
    if isinstance(stop, int):
        if not 0 <= stop <= STOP_OTHER:
            raise ValueError(f"stop reason {stop} out of range 0..{STOP_OTHER}")
        return stop
    return _STOP_NAMES.get(str(stop), STOP_OTHER)


def session_id(session) -> int:
    """A hint session's 64-bit id: an int (non-zero) as it is; a str
    (UTF-8) or bytes through FNV-1a 64, 0 becoming 1 (libkvclient's
    kvc_hint_session_id), so engines that name a session alike agree."""
    if isinstance(session, int):
        if not 0 < session < 1 << 64:
            raise ValueError("a session id is a non-zero 64-bit number")
        return session
    if isinstance(session, str):
        session = session.encode()
    h = 0xcbf29ce484222325
    for b in bytes(session):
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h or 1


class _CudaArray:
    """__cuda_array_interface__ over device memory, so torch/cupy can view a
    G1 block without a copy."""

    def __init__(self, ptr: int, nbytes: int, owner):
        self._owner = owner  # keeps the client (and its pool mapping) alive
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


class Block:
    """One block of a load or alloc: its status and, when ok, its bytes.

    crc: a loaded block's committed CRC-32C (None when the daemon sent
    none: before protocol 1.2, and for allocations)."""

    __slots__ = ("key", "status", "tier", "ptr", "length", "crc", "_client", "_view", "_writable",
                 "_wcrc")

    def __init__(self, client: "Client", key: bytes, res: tuple, writable: bool,
                 crc: int | None = None):
        """res: (status, tier, ptr, length), as _blocks() reads them."""
        self._client = client
        self.key = key
        self.status, self.tier, self.ptr, self.length = res
        self.ptr = self.ptr or 0
        self.crc = crc
        self._view = None
        self._writable = writable
        self._wcrc = None  # an allocation's CRC from write(), while nothing else wrote it

    @property
    def ok(self) -> bool:
        """True when the block's bytes are usable (status 0)."""
        return self.status == 0

    @property
    def error(self) -> KvError | None:
        """Why the block is not usable (None when it is)."""
        return None if self.ok else KvError(self.status, "block", self.key.hex())

    def _need(self, want_tier: int | None = None):
        if not self.ok:
            raise self.error
        if self.ptr == 0:
            raise KvError(-errno.EBADF, "block", "released: its pin or allocation is gone")
        if want_tier is not None and self.tier != want_tier:
            raise ValueError(f"block is in {TIER_NAMES.get(self.tier)}, "
                             f"not {TIER_NAMES[want_tier]}")

    def _c(self) -> _lib.KvcBlock:
        return _lib.KvcBlock(self.status, self.tier, self.crc is not None, self.ptr, self.length,
                             self.crc or 0)

    def _checked(self, rc: int, cb: _lib.KvcBlock, op: str):
        """After kvc_read/kvc_verify: a corrupt block is no longer usable
        (the library reported it and its pin went with the report)."""
        if rc == KV_ECORRUPT:
            self._drop()
            self.status = int(cb.status)
        if rc < 0:
            raise KvError(rc, op, self.key.hex())

    def read(self, out=None):
        """A verified copy of the block's bytes (kvc_read: copied out and
        checked against the committed CRC in the same pass). Into `out` (a
        writable buffer of at least `length` bytes; returns a memoryview of
        the part written) or a new bytearray. Raises KvError: KV_ECORRUPT
        when the bytes are not the committed ones (the block is reported
        and no longer usable, `out` holds garbage), EOPNOTSUPP when there is
        no CRC to check (a daemon before protocol 1.2, an allocation, a G1
        block on a real GPU)."""
        self._need()
        fresh = out is None
        if fresh:
            out = bytearray(self.length)
        mv = memoryview(out).cast("B")
        if mv.readonly or len(mv) < self.length:
            raise ValueError(f"read: want a writable buffer of {self.length} bytes")
        dst = (ctypes.c_char * self.length).from_buffer(mv)
        cb = self._c()
        ka = _lib.keys_array([self.key])
        rc = self._client._L.kvc_read(self._client._handle(), ka, ctypes.byref(cb), dst)
        del dst
        self._checked(rc, cb, "read")
        return out if fresh else mv[:self.length]

    def verify(self) -> None:
        """Checks the block's bytes in place against the committed CRC
        (kvc_verify), for a reader about to use a zero-copy view. Weaker
        than read(): another worker of the tenant may change the bytes
        after the check. Raises KvError as read() does."""
        self._need()
        cb = self._c()
        ka = _lib.keys_array([self.key])
        rc = self._client._L.kvc_verify(self._client._handle(), ka, ctypes.byref(cb))
        self._checked(rc, cb, "verify")

    def write(self, data) -> int:
        """Fills an allocated block with `data` (exactly `length` bytes) and
        checksums it in the same pass (kvc_copy_crc); commit() sends that
        CRC. Returns the CRC."""
        self._need(G2)
        if not self._writable:
            raise ValueError("write: a loaded block is read-only")
        mv = memoryview(data).cast("B")
        if len(mv) != self.length:
            raise ValueError(f"write: {len(mv)} bytes for a block of {self.length}")
        if isinstance(data, bytes):
            src = ctypes.c_char_p(data)  # its own buffer, no copy
        elif not mv.readonly:
            src = (ctypes.c_char * self.length).from_buffer(mv)
        else:
            src = (ctypes.c_char * self.length).from_buffer_copy(mv)
        self._wcrc = int(self._client._L.kvc_copy_crc(self.ptr, src, self.length))
        return self._wcrc

    def _commit_crc(self) -> int:
        """The CRC to commit: write()'s, or the slot's as it is now."""
        if self._wcrc is not None:
            return self._wcrc
        return int(self._client._L.kvc_crc32c(0, self.ptr, self.length))

    @property
    def view(self) -> memoryview:
        """A memoryview of the block's bytes in G2 (no copy; writable for an
        allocation, read-only for a load). Not verified: see verify() and
        read()."""
        self._need(G2)
        self._wcrc = None  # may be written through: commit() checksums the slot
        if self._view is None:
            buf = (ctypes.c_char * self.length).from_address(self.ptr)
            mv = memoryview(buf).cast("B")
            self._view = mv if self._writable else mv.toreadonly()
        return self._view

    def numpy(self, dtype="uint8"):
        """A numpy view of a G2 block (no copy; not verified: see verify())."""
        import numpy as np
        return np.frombuffer(self.view, dtype=dtype)

    def torch(self, dtype=None):
        """A torch view of the block (no copy): a CPU tensor over G2, or a
        CUDA tensor over the imported G1 pool. dtype reinterprets the bytes.
        Not verified: see verify() (G2) and daemon/OPS.md on G1."""
        import torch
        self._wcrc = None
        if self.tier == G1:
            self._need(G1)
            t = torch.as_tensor(_CudaArray(self.ptr, self.length, self._client), device="cuda")
        else:
            mv = self.view
            if not self._writable:  # torch warns on read-only buffers; the
                mv = (ctypes.c_char * self.length).from_address(self.ptr)  # caller must not write
            t = torch.frombuffer(mv, dtype=torch.uint8)
        return t if dtype is None else t.view(dtype)

    def _drop(self):
        if self._view is not None:
            try:
                self._view.release()
            except (BufferError, ValueError):
                pass  # exported further (numpy/torch): those are the caller's
        self._view = None
        self.ptr = 0

    def __repr__(self):
        state = "ok" if self.ok else self.error.name
        return (f"Block({self.key.hex()[:16]}.., {state}, {TIER_NAMES.get(self.tier, self.tier)}, "
                f"{self.length} B)")


class _Blocks:
    """What Loaded and Allocation share: per-block results, in key order."""

    def __init__(self, client: "Client", keys: list[bytes], blocks: list[Block]):
        self._client = client
        self.keys = keys
        self.blocks = blocks
        self.done = False

    @property
    def usable(self) -> int:
        """How many blocks are usable."""
        return sum(b.ok for b in self.blocks)

    def _take(self, op: str, again_ok: bool) -> list[bytes]:
        """Finishes the result once: drops the views, returns the usable
        keys (what the daemon must be told about). A second time: [] when
        again_ok, else KvError(EINVAL)."""
        if self.done:
            if again_ok:
                return []
            raise KvError(-errno.EINVAL, op, "already finished")
        self.done = True
        keys = [b.key for b in self.blocks if b.ok]
        for b in self.blocks:
            b._drop()
        return keys

    def __iter__(self):
        return iter(self.blocks)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return self.blocks[i]


class Loaded(_Blocks):
    """The result of Client.load: per-block results, pinned until release()
    (or the end of a `with` block)."""

    @property
    def released(self) -> bool:
        return self.done

    @property
    def prefix(self) -> int:
        """How many LEADING blocks are usable: the prefix an engine may use
        (a failed block ends it: what follows depends on it)."""
        n = 0
        for b in self.blocks:
            if not b.ok:
                break
            n += 1
        return n

    def release(self) -> list[int]:
        """Drops the pins of the usable blocks (once); returns their
        statuses. The views are dropped first."""
        pinned = self._take("release", again_ok=True)
        if not pinned or self._client._h is None:
            return []
        return self._client.release(pinned)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Allocation(_Blocks):
    """The result of Client.alloc: writable slots, invisible until commit().
    Leaving a `with` block without commit() aborts what is left (so an
    exception never publishes half-written blocks)."""

    def commit(self, which: Iterable[int] | None = None, shared: bool = False) -> list[int]:
        """Makes the allocated blocks (or those at indices `which`; the others
        are aborted) visible, with their CRCs (write()'s, or computed here
        over the slot for blocks written in place). Per-key statuses.
        shared: see Client.commit."""
        idx = None if which is None else sorted(set(which))
        for i in idx or []:
            if not self.blocks[i].ok:
                raise ValueError(f"block {i} was not allocated ({self.blocks[i].error.name})")
        chosen = {self.blocks[i].key for i in idx} if idx is not None else None
        crcs = {} if self.done else self._crcs(chosen)
        usable = self._take("commit", again_ok=False)
        keys = usable if chosen is None else [k for k in usable if k in chosen]
        rest = [] if chosen is None else [k for k in usable if k not in chosen]
        st = self._client.commit(keys, [crcs[k] for k in keys], shared=shared) if keys else []
        if rest:  # the ones the caller chose not to commit: give their slots back
            self._client.abort(rest)
        return st

    def _crcs(self, chosen=None) -> dict:
        """key -> the CRC to commit, for the usable blocks (in `chosen`)."""
        return {b.key: b._commit_crc() for b in self.blocks
                if b.ok and b.ptr and (chosen is None or b.key in chosen)}

    def abort(self) -> list[int]:
        """Drops every allocated slot; nothing becomes visible."""
        keys = self._take("abort", again_ok=False)
        return self._client.abort(keys) if keys else []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.done and self._client._h is not None:
            self.abort()


def _parents_array(keys: list[bytes], parents):
    """kvc_key[n] of parents (None, or one parent key or None per key), or None."""
    if parents is None:
        return None
    parents = list(parents)
    if len(parents) != len(keys):
        raise ValueError(f"{len(parents)} parents for {len(keys)} keys")
    pa = (_lib.KvcKey * max(len(keys), 1))()
    klen = len(keys[0]) if keys else 0
    for i, p in enumerate(parents):
        if p is None:
            continue
        p = bytes(p)
        if len(p) != klen:
            raise ValueError(f"parent {i}: {len(p)} bytes, the keys have {klen}")
        pa[i].len = len(p)
        ctypes.memmove(pa[i].b, p, len(p))
    return pa


@dataclass(frozen=True)
class G1Info:
    available: bool
    reason: str
    uuid: str
    backend: int
    kind: int
    base: int
    bytes: int


@dataclass(frozen=True)
class G2Info:
    base: int
    bytes: int
    registered: int  # 0, G1_CUDA or G1_SIM
    reason: str


_libc = ctypes.CDLL(None)
_libc_free = _libc.free
_libc_free.argtypes, _libc_free.restype = [ctypes.c_void_p], None


def _unpack(out, n: int) -> list:
    """(status, tier, has_crc, ptr, length, crc) of each of the first n
    kvc_block of out, unpacked in one pass."""
    if n == 0:
        return []
    raw = ctypes.string_at(out, n * ctypes.sizeof(_lib.KvcBlock))
    return list(struct.iter_unpack(_lib.BLOCK_FORMAT, raw))


def _blocks(out, n: int) -> list:
    """(status, tier, ptr, length) of each of the first n kvc_block of out."""
    return [(s, t, p, ln) for s, t, _, p, ln, _ in _unpack(out, n)]


def _new_blocks(client: "Client", keys: list, out, writable: bool) -> list:
    """The Blocks of a load or alloc reply, committed CRCs included."""
    return [Block(client, k, (s, t, p, ln), writable, c if h else None)
            for k, (s, t, h, p, ln, c) in zip(keys, _unpack(out, len(keys)))]


def _uuid_str(b: bytes) -> str:
    h = b.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Client:
    """A session with kvcached (see the module's docstring).

    socket: the worker socket (default $KVCACHED_SOCKET, else
    /run/kvcached/kvcached.sock); tenant: 1..64 bytes; layout: Layout;
    salt: bytes keying the namespace (two salts never share blocks);
    group: TP group name (ranks of one group get one hit length);
    timeout_ms: for every call (0: the library's 10 s, -1: none);
    g1: False to not import the daemon's G1 pool; g1_uuid: the 16-byte
    uuid of the device this worker computes on (default: the current CUDA
    device, if any); lookup: "auto" answers lookups from the namespace's
    presence table where it can (protocol 1.5, no round trip), "daemon"
    always asks the daemon (as KVCACHED_LOOKUP=daemon does).
    """

    def __init__(self, socket: str | os.PathLike | None = None, tenant: str = "default",
                 layout: Layout | None = None, salt: bytes = b"", group: str | None = None,
                 timeout_ms: int = 0, g1: bool = True, g1_uuid: bytes | None = None,
                 lookup: str = "auto"):
        if layout is None:
            raise ValueError("Client needs a layout (kvclient.Layout)")
        L = _lib.lib()
        self._h = None
        self.layout = layout
        self.tenant = tenant
        self.salt = bytes(salt)
        self.group = group
        self._salt_buf = ctypes.create_string_buffer(self.salt, len(self.salt)) if self.salt else None
        uuid_buf = None
        if g1_uuid is not None:
            if len(g1_uuid) != 16:
                raise ValueError("g1_uuid: 16 bytes")
            uuid_buf = ctypes.create_string_buffer(bytes(g1_uuid), 16)
        o = _lib.KvcOpts()
        o.socket_path = os.fsencode(socket) if socket is not None else None
        o.tenant = tenant.encode()
        o.group = group.encode() if group else None
        o.salt = ctypes.cast(self._salt_buf, ctypes.c_void_p) if self._salt_buf else None
        o.salt_len = len(self.salt)
        o.layout = layout._c()
        o.timeout_ms = timeout_ms
        o.no_g1 = 0 if g1 else 1
        o.g1_uuid = ctypes.cast(uuid_buf, ctypes.c_void_p) if uuid_buf else None
        h = ctypes.c_void_p()
        where = os.fsdecode(socket) if socket else os.environ.get("KVCACHED_SOCKET",
                                                                  "/run/kvcached/kvcached.sock")
        check(L.kvc_open(ctypes.byref(o), ctypes.byref(h)), "open", where)
        self._h = h
        self._L = L
        if lookup not in ("auto", "daemon"):
            self.close()
            raise ValueError(f"lookup={lookup!r}: 'auto' or 'daemon'")
        if lookup == "daemon":
            check(L.kvc_set_lookup(h, 1), "open", "lookup='daemon'")

    # --- life ----------------------------------------------------------------
    def close(self):
        """Closes the session: the daemon drops every pin and allocation of
        it at once; views into G2/G1 become invalid."""
        if self._h is not None:
            self._L.kvc_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if self._h is None:
            raise KvError(-errno.EBADF, "client", "closed")
        return self._h

    @property
    def session_id(self) -> int:
        return int(self._L.kvc_session_id(self._handle()))

    @property
    def slot_bytes(self) -> int:
        return int(self._L.kvc_slot_bytes(self._handle()))

    def fileno(self) -> int:
        """The socket (kvc_fd), for select/poll/asyncio."""
        return int(self._L.kvc_fd(self._handle()))

    @property
    def g1(self) -> G1Info:
        """The daemon's G1 pool as this process sees it (available or why not)."""
        g = _lib.KvcG1()
        check(self._L.kvc_g1_info(self._handle(), ctypes.byref(g)), "g1_info")
        return G1Info(bool(g.available), g.reason.decode("utf-8", "replace"),
                      _uuid_str(bytes(g.uuid)), int(g.backend), int(g.kind), int(g.base or 0),
                      int(g.bytes))

    @property
    def g2(self) -> G2Info:
        """The G2 mapping in this process and whether it is registered with CUDA."""
        if not _lib.has("kvc_g2_info"):
            raise KvError(-errno.ENOSYS, "g2_info", f"{_lib.path()} predates it")
        g = _lib.KvcG2()
        check(self._L.kvc_g2_info(self._handle(), ctypes.byref(g)), "g2_info")
        return G2Info(int(g.base or 0), int(g.bytes), int(g.registered),
                      g.reason.decode("utf-8", "replace"))

    def register_cuda(self) -> None:
        """Registers the G2 mapping with CUDA in this process (cudaHostRegister),
        so copies between G2 blocks and device tensors are DMA. Raises
        KvError (ENODEV with the reason when there is no device)."""
        if not _lib.has("kvc_g2_register_cuda"):
            raise KvError(-errno.ENOSYS, "register_cuda", f"{_lib.path()} predates it")
        rc = self._L.kvc_g2_register_cuda(self._handle())
        if rc < 0:
            raise KvError(rc, "register_cuda", self.g2.reason)

    # --- keys ------------------------------------------------------------------
    def chain_hash(self, tokens: Sequence[int], parent: bytes | None = None, extra: bytes = b"",
                   salt: bytes | None = None) -> bytes:
        """chain_hash() of one block, keyed by this client's salt unless
        `salt` is given."""
        return chain_hash(tokens, parent, extra, self.salt if salt is None else salt)

    def chain_keys(self, tokens: Sequence[int], extra: bytes = b"",
                   parent: bytes | None = None) -> list[bytes]:
        """chain_keys() with this client's tokens_per_block and salt."""
        return chain_keys(tokens, self.layout.tokens_per_block, extra, self.salt, parent)

    @staticmethod
    def _keys(keys) -> list[bytes]:
        keys = [bytes(k) for k in keys]
        if len(keys) > BATCH_MAX:
            raise KvError(-errno.E2BIG, "batch", f"{len(keys)} keys; at most {BATCH_MAX} per call")
        return keys

    # --- operations --------------------------------------------------------------
    def lookup(self, keys, past_holes: bool = False) -> tuple[int, list[int]]:
        """(hit, tiers): the longest resident prefix of keys, and each key's
        tier (G1, G2, G3 or TIER_NONE), past the prefix too. past_holes: a
        daemon with G4 asks it past its first miss as well, for a caller that
        loads the blocks after a hole (kvc_lookup_all)."""
        keys = self._keys(keys)
        ka = _lib.keys_array(keys)
        tiers = (ctypes.c_uint8 * max(len(keys), 1))()
        fn = self._L.kvc_lookup_all if past_holes else self._L.kvc_lookup
        hit = check(fn(self._handle(), ka, len(keys), tiers), "lookup")
        return hit, list(tiers[:len(keys)])

    def lookup_stats(self) -> dict:
        """How this client's lookups were answered: mode ('auto' or
        'daemon'), mapped (a presence table is mapped: protocol 1.5), bytes
        (its size), local (lookups answered from it), daemon (lookups asked
        of the daemon), maps (tables mapped), retired (answers the daemon's
        replacing its table sent back), reason (why no table is mapped)."""
        info = _lib.KvcLookupInfo()
        check(self._L.kvc_lookup_stats(self._handle(), ctypes.byref(info)), "lookup_stats")
        return {"mode": "daemon" if info.mode else "auto", "mapped": bool(info.mapped),
                "bytes": info.bytes, "local": info.local, "daemon": info.daemon,
                "maps": info.maps, "retired": info.retired,
                "reason": info.reason.decode(errors="replace")}

    def load(self, keys, tier: int = G2) -> Loaded:
        """Pins each block in `tier` (G2, or G1 when self.g1.available) and
        returns per-block results; use as a context manager, or call
        .release(). A block that could not be brought up has .ok False and
        .error set; the others are usable."""
        keys = self._keys(keys)
        out = self._load_raw(_lib.keys_array(keys), len(keys), tier)
        return Loaded(self, keys, _new_blocks(self, keys, out, False))

    def _load_raw(self, ka, n: int, tier: int):
        """LOAD of a prebuilt kvc_key array: the kvc_block array filled
        (_blocks() reads it; kvc_verify takes its entries)."""
        out = (_lib.KvcBlock * max(n, 1))()
        check(self._L.kvc_load(self._handle(), tier, ka, n, out), "load")
        return out

    def _release_raw(self, ka, n: int) -> int:
        """RELEASE of a prebuilt kvc_key array; how many were released."""
        return check(self._L.kvc_release(self._handle(), ka, n, None), "release")

    def release(self, keys) -> list[int]:
        """Drops this session's pins on keys; per-key statuses."""
        return self._status_op("kvc_release", "release", keys)

    def alloc(self, keys, parents=None, prio: int = 128, tier: int = G2) -> Allocation:
        """Reserves a G2 slot per key (parents: None, or one parent key or
        None per key). Per-key statuses: KV_EEXISTS for a block that exists
        or that another worker is writing, KV_EALLPINNED, -EAGAIN. Use as a
        context manager: what is not committed is aborted."""
        keys = self._keys(keys)
        ka = _lib.keys_array(keys)
        pa = _parents_array(keys, parents)
        out = (_lib.KvcBlock * max(len(keys), 1))()
        check(self._L.kvc_alloc(self._handle(), tier, prio, ka, pa, len(keys), out), "alloc")
        return Allocation(self, keys, _new_blocks(self, keys, out, True))

    def commit(self, keys, crcs=None, shared: bool = False) -> list[int]:
        """Makes allocated blocks visible; per-key statuses. crcs: the
        CRC-32C of each key's block as written (the daemon keeps it without
        reading the bytes); None: the daemon computes them. shared: answered
        once each block is in the fleet's tier (G4) too, so that another
        node finds it (kvc_commit_shared, protocol 1.4): status 0 there and
        here, KV_EDEGRADED committed here only."""
        if crcs is None and not shared:
            return self._status_op("kvc_commit", "commit", keys)
        keys = self._keys(keys)
        if crcs is not None and len(crcs) != len(keys):
            raise ValueError(f"{len(crcs)} CRCs for {len(keys)} keys")
        ca = None if crcs is None else (ctypes.c_uint32 * max(len(keys), 1))(*crcs)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        fn = self._L.kvc_commit_shared if shared else self._L.kvc_commit_crc
        check(fn(self._handle(), _lib.keys_array(keys), ca, len(keys), st), "commit")
        return list(st[:len(keys)])

    def abort(self, keys) -> list[int]:
        return self._status_op("kvc_abort", "abort", keys)

    def set_priority(self, keys, prio: int) -> list[int]:
        """Priority 0..255 (lower is evicted first); per-key statuses."""
        keys = self._keys(keys)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        check(self._L.kvc_set_priority(self._handle(), prio, _lib.keys_array(keys), len(keys), st),
              "set_priority")
        return list(st[:len(keys)])

    # --- engine hints (protocol 1.3): advice for eviction -----------------
    def hint_session(self, session, keys, retain_s: int = 0) -> list[int]:
        """These blocks belong to `session` (a name or an id: session_id());
        say it once they are allocated (before their commit: they then come
        in with their session, which eviction weighs at once) or loaded.
        retain_s asks that the session's blocks be kept that long after its
        last request (the daemon caps it). Per-key statuses: 0, or
        KV_ENOTFOUND (no block of this namespace committed or being
        written). Raises KvError(-EOPNOTSUPP) with a daemon before protocol
        1.3."""
        keys = self._keys(keys)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        check(self._L.kvc_hint_session(self._handle(), session_id(session),
                                       _lib.keys_array(keys), len(keys), retain_s, st),
              "hint_session")
        return list(st[:len(keys)])

    def hint_finished(self, session, stop="unknown", keys=(), retain_s: int = 0) -> list[int]:
        """A request of `session` finished with stop reason `stop` (a name,
        "end_turn", "tool_use", ... or OpenAI's "stop", "tool_calls",
        "length"; or a STOP_* number); keys, if any, are that request's
        blocks. Per-key statuses as hint_session's."""
        keys = self._keys(keys)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        check(self._L.kvc_hint_finished(self._handle(), session_id(session), stop_code(stop),
                                        _lib.keys_array(keys) if keys else None, len(keys),
                                        retain_s, st),
              "hint_finished")
        return list(st[:len(keys)])

    def hint_end(self, session) -> None:
        """`session` is over: its blocks may go first."""
        check(self._L.kvc_hint_end(self._handle(), session_id(session)), "hint_end")

    def prefetch(self, keys, tier: int = G2) -> int:
        """A hint to bring blocks up to `tier`; how many were queued."""
        keys = self._keys(keys)
        return check(self._L.kvc_prefetch(self._handle(), tier, _lib.keys_array(keys), len(keys)),
                     "prefetch")

    def delete(self, keys=None) -> int:
        """Deletes blocks (keys None: every block of this namespace); how
        many were deleted (pinned or in-flight blocks are skipped)."""
        if keys is None:
            return check(self._L.kvc_delete(self._handle(), None, 0), "delete")
        keys = self._keys(keys)
        if not keys:
            return 0
        return check(self._L.kvc_delete(self._handle(), _lib.keys_array(keys), len(keys)), "delete")

    def put(self, key: bytes, data, parent: bytes | None = None, prio: int = 128) -> None:
        """The slow inline path (tools, tests): the bytes travel in the frame."""
        ka = _lib.keys_array([key])
        pa = _lib.keys_array([parent]) if parent else None
        mv = memoryview(data).cast("B")
        buf = (ctypes.c_char * len(mv)).from_buffer_copy(mv)
        check(self._L.kvc_put(self._handle(), ka, pa, prio, buf, len(mv)), "put")

    def get(self, key: bytes) -> bytes:
        """The slow inline path: a verified copy of one block's bytes."""
        ka = _lib.keys_array([key])
        cap = self.layout.block_bytes
        buf = ctypes.create_string_buffer(cap)
        n = check(self._L.kvc_get(self._handle(), ka, buf, cap), "get")
        return buf.raw[:min(n, cap)]

    def status(self) -> dict:
        """The daemon's worker-socket STATUS, parsed."""
        p = ctypes.c_void_p()
        check(self._L.kvc_status(self._handle(), ctypes.byref(p)), "status")
        try:
            return json.loads(ctypes.string_at(p).decode("utf-8", "replace"))
        finally:
            _libc_free(p)

    def _status_op(self, fn: str, op: str, keys) -> list[int]:
        keys = self._keys(keys)
        st = (ctypes.c_int32 * max(len(keys), 1))()
        check(getattr(self._L, fn)(self._handle(), _lib.keys_array(keys), len(keys), st), op)
        return list(st[:len(keys)])
