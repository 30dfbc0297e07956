"""Errors: every failure of a whole request is a KvError carrying the
library's code and its message (kvc_strerror). Per-block results are not
exceptions: they stay per block (Block.status, Block.error), so a failed
block is never hidden inside a success.

Codes are the library's: a negative errno (-errno.ENOENT, ...) or a
kvcached domain error (base/errors.h, below; values are part of the wire
protocol and never change).
"""
from __future__ import annotations

import errno as _errno

ERR_BASE = 10000
# name -> value, as base/errors.h's KV_ERRNO_MAP (a test checks they agree).
_DOMAIN = {
    "KV_EEXISTS": 1, "KV_ENOTFOUND": 2, "KV_EALLPINNED": 3, "KV_EPINUNDERFLOW": 4,
    "KV_EBADSTATE": 5, "KV_ETOOBIG": 6, "KV_ECORRUPT": 7, "KV_EBADFRAME": 8,
    "KV_EBADVERSION": 9, "KV_EBADOP": 10, "KV_ENOTOWNER": 11, "KV_ENOSESSION": 12,
    "KV_EDEGRADED": 13, "KV_ENOTSHAREABLE": 14, "KV_EBADFD": 15,
    "KV_ESHARE": 16,
}
CODES = {name: -(ERR_BASE + off) for name, off in _DOMAIN.items()}
globals().update(CODES)  # kvclient.errors.KV_ENOTFOUND, ...
_NAMES = {v: k for k, v in CODES.items()}


def err_name(code: int) -> str:
    """'KV_ENOTFOUND', 'ENOENT', ... for a code; 'E?<n>' when unknown."""
    if code in _NAMES:
        return _NAMES[code]
    if code < 0 and -code in _errno.errorcode:
        return _errno.errorcode[-code]
    return f"E?{code}"


def strerror(code: int) -> str:
    """The library's message for a code (kvc_strerror)."""
    from ._lib import lib
    return lib().kvc_strerror(int(code)).decode("utf-8", "replace")


class KvError(Exception):
    """A failed request: .code (negative), .name ('KV_ECORRUPT', 'ENOENT'),
    .message (the library's text), .op (what was being done)."""

    def __init__(self, code: int, op: str = "", detail: str = ""):
        self.code = int(code)
        self.name = err_name(self.code)
        try:
            self.message = strerror(self.code)
        except OSError:  # the library itself is what failed to load
            self.message = self.name
        self.op = op
        self.detail = detail
        text = f"{op}: " if op else ""
        text += f"{self.message} ({self.name})"
        if detail:
            text += f": {detail}"
        super().__init__(text)

    @property
    def errno(self) -> int | None:
        """The errno value for a system error, None for a kvcached one."""
        return -self.code if -ERR_BASE < self.code < 0 else None


def check(rc: int, op: str, detail: str = "") -> int:
    """rc when it is >= 0, else raise KvError(rc)."""
    if rc < 0:
        raise KvError(rc, op, detail)
    return rc
