"""kvclient: Python access to kvcached, the node-level tiered KV-cache daemon.

Built on libkvclient (the C library, through ctypes): no compiled
extension, no dependency beyond the standard library; numpy and torch are
used when installed (zero-copy views of blocks).

    from kvclient import Client, Layout
    with Client(tenant="t", layout=Layout(262144, 16, 32, 8, 128, "bf16")) as c:
        hit, tiers = c.lookup(c.chain_keys(token_ids))

Modules: kvclient.client (Client, blocks, keys), kvclient.paged (between an
engine's paged KV cache and kvcached blocks), kvclient.aio (asyncio),
kvclient.errors (KvError), kvclient.examples.llama (a reference engine).
"""
from ._lib import lib as _load_lib, path as library_path
from .client import (G1, G1_CUDA, G1_SIM, G2, G3, TIER_NAMES, TIER_NONE, Allocation, Block,
                     Client, G1Info, G2Info, Layout, Loaded, chain_hash, chain_keys, session_id,
                     stop_code)
from .errors import KvError

__version__ = "0.1.0"


def library_version() -> str:
    """libkvclient's version (kvc_version)."""
    return _load_lib().kvc_version().decode()


__all__ = ["Client", "Layout", "Block", "Loaded", "Allocation", "G1Info", "G2Info", "KvError",
           "chain_hash", "chain_keys", "G1", "G2", "G3", "TIER_NONE", "TIER_NAMES", "G1_CUDA",
           "G1_SIM", "library_path", "library_version", "session_id", "stop_code", "__version__"]
