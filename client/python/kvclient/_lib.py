"""Loading libkvclient and declaring its C ABI (client/kvclient.h) for ctypes.

Internal: the rest of the package uses `lib()` and the structures below.
Every structure here mirrors its C counterpart field for field; a test
(tests/test_client.py::test_struct_sizes_match_the_header) compiles the
header and compares sizes and offsets, so a change on one side without the
other fails in CI.

Where the library is found, first match wins:
  1. $KVCLIENT_LIB: a path to libkvclient.so (or to a directory holding it);
     when set, nothing else is tried, and failing to load it is an error;
  2. the copy inside the package (kvclient/lib/libkvclient.so*): what a
     wheel carries (client/python/README.md, "Wheel"; CMake's component
     "python" installs it there);
  3. only when the package runs from a checkout (client/python of it): the
     checkout's build tree (<repo>/build/lib, then any <repo>/build*/lib);
     an installed package never looks beside itself for one;
  4. the system's library path (an installed copy: ldconfig, LD_LIBRARY_PATH).

A wheel's kvclient/lib also holds the shared libraries libkvclient needs
beyond the base system (libsodium; the CUDA runtime when it was built with
CUDA), which the library finds beside it (RUNPATH $ORIGIN). One exception:
a CUDA runtime of the same soname that the environment already has in an
NVIDIA wheel (nvidia/*/lib, torch's) is loaded first, so that the process
holds the one copy torch uses, not two.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int32, c_int64, c_size_t,
                    c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

KEY_MAX = 32
DIGEST_BYTES = 32
BATCH_MAX = 4096


class KvcKey(Structure):
    _fields_ = [("len", c_uint8), ("b", c_uint8 * KEY_MAX)]


class KvcLayout(Structure):
    _fields_ = [("block_bytes", c_uint32), ("tokens_per_block", c_uint32), ("layers", c_uint32),
                ("kv_heads", c_uint32), ("head_dim", c_uint32), ("tp_rank", c_uint16),
                ("tp_size", c_uint16), ("dtype", c_char_p)]


class KvcOpts(Structure):
    _fields_ = [("socket_path", c_char_p), ("tenant", c_char_p), ("group", c_char_p),
                ("salt", c_void_p), ("salt_len", c_size_t), ("layout", KvcLayout),
                ("timeout_ms", c_int), ("no_g1", c_int), ("g1_uuid", c_void_p)]


class KvcG1(Structure):
    _fields_ = [("available", c_int), ("reason", c_char * 320), ("uuid", c_uint8 * 16),
                ("backend", c_int), ("kind", c_uint8), ("base", c_void_p), ("bytes", c_uint64),
                ("dev", c_void_p)]


class KvcG2(Structure):
    _fields_ = [("base", c_void_p), ("bytes", c_uint64), ("registered", c_int),
                ("reason", c_char * 256)]


class KvcBlock(Structure):
    _fields_ = [("status", c_int32), ("tier", c_uint8), ("has_crc", c_uint8), ("ptr", c_void_p),
                ("length", c_uint32), ("crc", c_uint32)]


class KvcLookupInfo(Structure):
    _fields_ = [("mode", c_int), ("mapped", c_int), ("bytes", c_uint64), ("local", c_uint64),
                ("daemon", c_uint64), ("maps", c_uint64), ("retired", c_uint64),
                ("reason", c_char * 160)]


class KvcCompletion(Structure):
    _fields_ = [("id", c_uint64), ("op", c_int), ("result", c_int), ("user", c_void_p)]


class KvcPageLayout(Structure):
    _fields_ = [("layers", c_uint32), ("page_tokens", c_uint32), ("kv_heads", c_uint32),
                ("head_dim", c_uint32), ("elem_bytes", c_uint32), ("num_pages", c_uint32),
                ("page_stride", c_uint64), ("kv_stride", c_uint64)]


class KvcCopy(Structure):
    _fields_ = [("dst", c_void_p), ("src", c_void_p), ("bytes", c_size_t)]


_P = POINTER
# name: (restype, argtypes). Functions the loaded library lacks (an older
# build) are left out; calling one raises KvError(-ENOSYS) (see need()).
_SIGS = {
    "kvc_open": (c_int, [_P(KvcOpts), _P(c_void_p)]),
    "kvc_close": (None, [c_void_p]),
    "kvc_session_id": (c_uint64, [c_void_p]),
    "kvc_slot_bytes": (c_uint32, [c_void_p]),
    "kvc_g1_info": (c_int, [c_void_p, _P(KvcG1)]),
    "kvc_g1_ptr": (c_int, [c_void_p, c_uint64, c_uint64, _P(c_void_p)]),
    "kvc_lookup": (c_int, [c_void_p, _P(KvcKey), c_uint32, _P(c_uint8)]),
    "kvc_lookup_all": (c_int, [c_void_p, _P(KvcKey), c_uint32, _P(c_uint8)]),
    "kvc_set_lookup": (c_int, [c_void_p, c_int]),
    "kvc_lookup_stats": (c_int, [c_void_p, _P(KvcLookupInfo)]),
    "kvc_load": (c_int, [c_void_p, c_uint8, _P(KvcKey), c_uint32, _P(KvcBlock)]),
    "kvc_release": (c_int, [c_void_p, _P(KvcKey), c_uint32, _P(c_int32)]),
    "kvc_alloc": (c_int, [c_void_p, c_uint8, c_uint8, _P(KvcKey), _P(KvcKey), c_uint32,
                          _P(KvcBlock)]),
    "kvc_commit": (c_int, [c_void_p, _P(KvcKey), c_uint32, _P(c_int32)]),
    "kvc_commit_crc": (c_int, [c_void_p, _P(KvcKey), _P(c_uint32), c_uint32, _P(c_int32)]),
    "kvc_commit_shared": (c_int, [c_void_p, _P(KvcKey), _P(c_uint32), c_uint32, _P(c_int32)]),
    "kvc_copy_crc": (c_uint32, [c_void_p, c_void_p, c_size_t]),
    "kvc_crc32c": (c_uint32, [c_uint32, c_void_p, c_size_t]),
    "kvc_read": (c_int, [c_void_p, _P(KvcKey), _P(KvcBlock), c_void_p]),
    "kvc_verify": (c_int, [c_void_p, _P(KvcKey), _P(KvcBlock)]),
    "kvc_abort": (c_int, [c_void_p, _P(KvcKey), c_uint32, _P(c_int32)]),
    "kvc_prefetch": (c_int, [c_void_p, c_uint8, _P(KvcKey), c_uint32]),
    "kvc_delete": (c_int, [c_void_p, _P(KvcKey), c_uint32]),
    "kvc_set_priority": (c_int, [c_void_p, c_uint8, _P(KvcKey), c_uint32, _P(c_int32)]),
    "kvc_hint_session": (c_int, [c_void_p, c_uint64, _P(KvcKey), c_uint32, c_uint32,
                                 _P(c_int32)]),
    "kvc_hint_finished": (c_int, [c_void_p, c_uint64, c_int, _P(KvcKey), c_uint32, c_uint32,
                                  _P(c_int32)]),
    "kvc_hint_end": (c_int, [c_void_p, c_uint64]),
    "kvc_hint_session_id": (c_uint64, [c_void_p, c_size_t]),
    "kvc_put": (c_int, [c_void_p, _P(KvcKey), _P(KvcKey), c_uint8, c_void_p, c_uint32]),
    "kvc_get": (c_int, [c_void_p, _P(KvcKey), c_void_p, c_uint32]),
    "kvc_status": (c_int, [c_void_p, _P(c_void_p)]),
    "kvc_fd": (c_int, [c_void_p]),
    "kvc_submit_lookup": (c_int64, [c_void_p, _P(KvcKey), c_uint32, _P(c_uint8), c_void_p]),
    "kvc_submit_load": (c_int64, [c_void_p, c_uint8, _P(KvcKey), c_uint32, _P(KvcBlock),
                                  c_void_p]),
    "kvc_submit_release": (c_int64, [c_void_p, _P(KvcKey), c_uint32, _P(c_int32), c_void_p]),
    "kvc_submit_alloc": (c_int64, [c_void_p, c_uint8, c_uint8, _P(KvcKey), _P(KvcKey),
                                   c_uint32, _P(KvcBlock), c_void_p]),
    "kvc_submit_commit": (c_int64, [c_void_p, _P(KvcKey), c_uint32, _P(c_int32), c_void_p]),
    "kvc_submit_commit_crc": (c_int64, [c_void_p, _P(KvcKey), _P(c_uint32), c_uint32,
                                        _P(c_int32), c_void_p]),
    "kvc_submit_hint": (c_int64, [c_void_p, c_int, c_uint64, c_int, c_uint32, _P(KvcKey),
                                  c_uint32, _P(c_int32), c_void_p]),
    "kvc_poll": (c_int, [c_void_p, _P(KvcCompletion), c_int]),
    "kvc_pending": (c_int, [c_void_p]),
    "kvc_strerror": (c_char_p, [c_int]),
    "kvc_version": (c_char_p, []),
    "kvc_chain_hash": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t,
                               c_void_p, c_size_t]),
    "kvc_chain_keys": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_size_t, c_uint32,
                               c_void_p, c_size_t, c_void_p, c_size_t]),
    # for engines (kvclient.h, "for engines")
    "kvc_g2_register_cuda": (c_int, [c_void_p]),
    "kvc_g2_info": (c_int, [c_void_p, _P(KvcG2)]),
    "kvc_page_block_bytes": (c_uint64, [_P(KvcPageLayout)]),
    "kvc_pages_gather": (c_int, [c_void_p, _P(KvcPageLayout), _P(c_void_p), _P(c_uint32),
                                 _P(c_void_p), c_size_t, c_int, c_void_p]),
    "kvc_pages_scatter": (c_int, [c_void_p, _P(KvcPageLayout), _P(c_void_p), _P(c_uint32),
                                  _P(c_void_p), c_size_t, c_int, c_void_p]),
    "kvc_memcpy_batch": (c_int, [c_void_p, _P(KvcCopy), c_size_t, c_int, c_void_p]),
    "kvc_cuda_error": (c_char_p, []),
}

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("KVCLIENT_LIB")
    if env:
        if os.path.isdir(env):
            found = sorted(glob.glob(os.path.join(env, "libkvclient.so*")))
            return [found[0] if found else os.path.join(env, "libkvclient.so")], True
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = sorted(glob.glob(os.path.join(here, "lib", "libkvclient.so*")))
    pkgroot = os.path.dirname(here)                       # <repo>/client/python, or site-packages
    repo = os.path.dirname(os.path.dirname(pkgroot))
    if (pkgroot == os.path.join(repo, "client", "python")
            and os.path.exists(os.path.join(repo, "client", "kvclient.h"))):
        out.append(os.path.join(repo, "build", "lib", "libkvclient.so"))
        out += sorted(p for p in glob.glob(os.path.join(repo, "build*", "lib", "libkvclient.so"))
                      if p not in out)
    sysname = ctypes.util.find_library("kvclient")
    out += [sysname] if sysname else []
    out.append("libkvclient.so.0")
    return out, False


def _prefer_environment_runtime(libdir):
    """Before the package's own library loads: for each CUDA runtime bundled
    beside it (libcudart.so.N), the environment's copy of that soname from
    an NVIDIA wheel on sys.path (torch's), when there is one. Loaded first,
    it is the copy libkvclient binds to (one soname, one copy), and the one
    torch binds to when imported later; without it, the bundled copy."""
    for bundled in glob.glob(os.path.join(libdir, "libcudart.so.*")):
        soname = os.path.basename(bundled)
        for d in sys.path:
            if not d or not os.path.isdir(os.path.join(d, "nvidia")):
                continue
            for p in sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", soname))):
                try:
                    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                    return
                except OSError:
                    continue


def lib():
    """The loaded library (loaded once, on first use). Raises OSError with
    every place tried when none loads."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        cands, strict = _candidates()
        errors = []
        for p in cands:
            if os.path.sep in p and not os.path.exists(p):
                errors.append(f"{p}: no such file")
                continue
            try:
                if not strict and os.path.sep in p:
                    _prefer_environment_runtime(os.path.dirname(p))
                handle = ctypes.CDLL(p)
            except OSError as e:
                errors.append(f"{p}: {e}")
                if strict:
                    break
                continue
            for name, (res, args) in _SIGS.items():
                fn = getattr(handle, name, None)
                if fn is not None:
                    fn.restype, fn.argtypes = res, args
            _lib, _path = handle, p
            return _lib
        where = "$KVCLIENT_LIB" if strict else "the package, the checkout's build tree and the system"
        raise OSError(f"libkvclient not found in {where} (set KVCLIENT_LIB to the library's "
                      "path, or build it: cmake --build build):\n  " + "\n  ".join(errors))


def path() -> str | None:
    """The file the library was loaded from (None before the first load)."""
    return _path


def has(name: str) -> bool:
    """Whether the loaded library exports `name` (an older build may not)."""
    return getattr(lib(), name, None) is not None


def keys_array(keys) -> "ctypes.Array":
    """A kvc_key[n] from an iterable of bytes-like keys (1..32 bytes, one length).
    Built with one copy (kvc_key is a length byte and 32 key bytes)."""
    keys = [bytes(k) for k in keys]
    arr = (KvcKey * len(keys))()
    if not keys:
        return arr
    klen = len(keys[0])
    if not 1 <= klen <= KEY_MAX:
        raise ValueError(f"key 0: {klen} bytes; a key is 1..{KEY_MAX} bytes")
    for i, k in enumerate(keys):
        if len(k) != klen:
            raise ValueError(f"key {i}: {len(k)} bytes, key 0 has {klen}: one length per call")
    pad = bytes(KEY_MAX - klen)
    head = bytes([klen])
    ctypes.memmove(arr, b"".join(head + k + pad for k in keys), ctypes.sizeof(arr))
    return arr


# kvc_block as struct.iter_unpack reads it (int32 status, u8 tier, u8 has_crc,
# padding, void *ptr, u32 length, u32 crc), checked against the header by the
# tests.
BLOCK_FORMAT = "=iBB2xQII" if ctypes.sizeof(c_void_p) == 8 else "=iBB2xIII"
