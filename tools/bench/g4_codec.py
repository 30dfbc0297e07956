#!/usr/bin/env python3
"""g4_codec.py - G4 with and without its lossless codec (g4.codec, tiers/G4.md
"Coded values"), on real KV: the blocks of bench/kv (SmolLM2-135M's keys and
values on English text, BF16 and FP16), cut into whole blocks of the block
size (never cycled for the ratio).

For each dtype, block size and g4.codec (off, auto), in one run on one
throwaway Redis Cluster (kvclient.testing.Fleet: 3 masters, no replicas):
node A stores the blocks --rounds times under new keys (the same bytes, so
the run lasts long enough to time; each block is coded alone), each COMMIT
answered once G4 holds the blocks (shared=True); node B, which holds
nothing, LOOKUPs them (bringing them from G4, decoded and checked) and
LOADs them, and their bytes are compared (equal; for int8, a tenant with
cold_precision = int8 on both nodes, different but verified against the
CRC of their decoding). Printed: the bytes G4 received
per block (the SET commands as sent, RESP and the 128-byte header
included), the stored ratio (the codec's metric: block bytes / stored
bytes), the blocks written coded, and store and load GB/s of block bytes.

  python3 tools/bench/g4_codec.py                    # 64 KiB and 256 KiB
  python3 tools/bench/g4_codec.py --blocks 262144 --rounds 8
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

from kvclient import Client, Layout  # noqa: E402
from kvclient.testing import Fleet  # noqa: E402

FILES = {"bf16": "smollm2-135m.bf16.safetensors", "fp16": "smollm2-135m.f16.safetensors"}


def tensor_bytes(path: str) -> bytes:
    """The data section of a safetensors file whose tensors are all 16-bit."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    head = json.loads(raw[8:8 + n])
    for name, t in head.items():
        if name != "__metadata__" and t["dtype"] not in ("F16", "BF16"):
            raise SystemExit(f"{path}: tensor {name} is {t['dtype']}, not 16-bit")
    return raw[8 + n:]


def run(fleet: Fleet, codec: str, dtype: str, blocks: list, rounds: int, tag: str) -> dict:
    """codec: off, auto (g4.codec), or fp8/int8 (the tenant's cold_precision)."""
    bs = len(blocks[0])
    g2 = f"{max(64, 2 * bs * len(blocks) * rounds // (1 << 20) + 16)}M"
    tenant = "default"
    sets = (f"g4.codec={codec}",)
    if codec in ("fp8", "int8"):
        tenant = "t"
        sets = (f"tenant.t.uids={os.getuid()}", f"tenant.t.cold_precision={codec}")
    a = fleet.node(f"a-{tag}", g2=g2, sets=sets)
    b = fleet.node(f"b-{tag}", g2=g2, sets=sets)
    layout = Layout(block_bytes=bs, tokens_per_block=16, layers=30, kv_heads=3, head_dim=64,
                    dtype=dtype)
    salt = tag.encode()
    ca = Client(a.socket, tenant=tenant, layout=layout, salt=salt, g1=False)
    cb = Client(b.socket, tenant=tenant, layout=layout, salt=salt, g1=False)
    keys = [hashlib.blake2b(f"{tag}:{r}:{i}".encode(), digest_size=32).digest()
            for r in range(rounds) for i in range(len(blocks))]
    data = [blocks[i % len(blocks)] for i in range(len(keys))]
    out0 = a.metric('kvcached_g4_bytes_total{dir="out"}')
    per = 16  # blocks per request, as an engine's request
    t0 = time.perf_counter()
    for s in range(0, len(keys), per):
        with ca.alloc(keys[s:s + per]) as al:
            for blk, d in zip(al, data[s:s + per]):
                blk.write(d)
            st = al.commit(shared=True)
            if any(st):
                raise SystemExit(f"commit: {st}")
    t_store = time.perf_counter() - t0
    sent = a.metric('kvcached_g4_bytes_total{dir="out"}') - out0
    t0 = time.perf_counter()
    lossy = codec in ("fp8", "int8")
    for s in range(0, len(keys), per):
        ks = keys[s:s + per]
        hit, _ = cb.lookup(ks)
        if hit != len(ks):
            raise SystemExit(f"node B found {hit} of {len(ks)}")
        with cb.load(ks) as ld:
            for blk, d in zip(ld, data[s:s + per]):
                got = blk.read()  # verified against the CRC of what was decoded
                if (got != d) != lossy:
                    raise SystemExit(f"node B read {'other' if not lossy else 'exact'} bytes")
    t_load = time.perf_counter() - t0
    blk_b = a.metric('kvcached_g4_codec_bytes_total{side="block"}')
    sto_b = a.metric('kvcached_g4_codec_bytes_total{side="stored"}')
    r = {"dtype": dtype, "block": bs, "codec": codec, "blocks": len(keys),
         "unique": len(blocks), "g4_bytes_per_block": sent / len(keys),
         "ratio": blk_b / sto_b if sto_b else 1.0,
         "coded": a.metric('kvcached_g4_codec_blocks_total{result="coded"}'),
         "decoded": b.metric('kvcached_g4_codec_blocks_total{result="decoded"}'),
         "store_gbps": bs * len(keys) / t_store / 1e9, "load_gbps": bs * len(keys) / t_load / 1e9}
    ca.close()
    cb.close()
    a.stop()
    b.stop()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="65536,262144", help="block sizes, bytes")
    ap.add_argument("--rounds", type=int, default=0,
                    help="times each block is stored (default: about 32 MiB a run)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="g4codec.") as root:
        fleet = Fleet(root)
        try:
            fleet.start()
        except RuntimeError as e:
            if getattr(e, "returncode", 0) == Fleet.SKIP:
                print(f"skipped: {e}")
                return Fleet.SKIP
            raise
        try:
            for dtype, name in FILES.items():
                raw = tensor_bytes(os.path.join(ROOT, "bench", "kv", name))
                for bs in (int(x) for x in a.blocks.split(",")):
                    blocks = [raw[i:i + bs] for i in range(0, len(raw) - bs + 1, bs)]
                    rounds = a.rounds or max(1, (32 << 20) // (bs * len(blocks)))
                    for codec in ("off", "auto", "int8"):
                        results.append(run(fleet, codec, dtype, blocks, rounds,
                                           f"{dtype}-{bs}-{codec}"))
        finally:
            fleet.stop()
    print("| dtype | block | g4.codec | blocks (unique) | G4 bytes per block | stored ratio "
          "| written coded | decoded on B | store GB/s | load GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['dtype']} | {r['block'] // 1024} KiB | {r['codec']} | {r['blocks']} "
              f"({r['unique']}) | {r['g4_bytes_per_block']:.0f} | {r['ratio']:.3f} "
              f"| {r['coded']:.0f} | {r['decoded']:.0f} | {r['store_gbps']:.3f} "
              f"| {r['load_gbps']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
