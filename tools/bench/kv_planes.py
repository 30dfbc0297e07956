#!/usr/bin/env python3
"""Lossless compression of real 16-bit KV cache bytes: whole and split into byte planes.

Reads the safetensors samples in bench/kv/ (see bench/kv/README.md) and, for
each dtype, compresses
  raw     the array's bytes as stored (little-endian 16-bit elements), and
  planes  the same bytes split into two planes, the high byte of every
          element (FP16: sign, 5 exponent bits, 2 mantissa bits; BF16: sign
          and 7 exponent bits) and the low byte, each plane compressed alone,
per 256 KiB block (the daemon compresses one block at a time; a block's
planes are that block's bytes split) and over the whole array at once.
Ratios are original bytes / compressed bytes (higher is better; the last,
short block of a file counts as it is). Controls of the same size: random
bytes, and Gaussian noise in the same dtype with each (layer, K|V) slice's
mean and standard deviation, which keeps the float format's redundancy and
drops the data's structure.

Codecs: the zstd and lz4 command-line tools when found (zstd -1, zstd -3,
lz4 -1), else, labelled "(stdlib)", zlib levels 1 and 6 and lzma preset 0.
--codecs stdlib forces the fallback, --codecs both runs the two sets.

Usage: python tools/bench/kv_planes.py [--block KiB] [FILES...]
"""
import argparse
import glob
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import zlib
import lzma

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GLOB = os.path.join(ROOT, "bench", "kv", "*.safetensors")


def read_safetensors(path):
    """One array per file; returns (uint16 array, dtype name, metadata)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        meta = header.pop("__metadata__", {})
        (name, t), = header.items()
        f.seek(base + t["data_offsets"][0])
        raw = f.read(t["data_offsets"][1] - t["data_offsets"][0])
    if t["dtype"] not in ("F16", "BF16"):
        sys.exit("%s: %s is not a 16-bit float" % (path, t["dtype"]))
    arr = np.frombuffer(raw, dtype="<u2").reshape(t["shape"])
    return arr, t["dtype"], meta


def cli_codec(argv):
    def run(data):
        p = subprocess.run(argv, input=data, stdout=subprocess.PIPE, check=True)
        return len(p.stdout)
    return run


def codecs(which):
    cli = []
    if shutil.which("zstd"):
        cli += [("zstd -1", cli_codec(["zstd", "-1", "-q", "-c", "--no-progress"])),
                ("zstd -3", cli_codec(["zstd", "-3", "-q", "-c", "--no-progress"]))]
    if shutil.which("lz4"):
        cli += [("lz4 -1", cli_codec(["lz4", "-1", "-q", "-c"]))]
    std = [("zlib 1 (stdlib)", lambda d: len(zlib.compress(d, 1))),
           ("zlib 6 (stdlib)", lambda d: len(zlib.compress(d, 6))),
           ("lzma 0 (stdlib)", lambda d: len(lzma.compress(d, preset=0)))]
    if which == "stdlib":
        return std
    if which == "both":
        return cli + std
    return cli if len(cli) == 3 else (cli + std if cli else std)


def split_planes(b):
    a = np.frombuffer(b, dtype="<u2")
    return (a >> 8).astype(np.uint8).tobytes(), (a & 0xFF).astype(np.uint8).tobytes()


def measure(data, codec, block):
    """Sizes for one byte string: raw/planes, per block and whole."""
    out = {"n": len(data), "raw_blk": 0, "pl_blk": 0, "hi_blk": 0, "lo_blk": 0,
           "blk_ratios": []}
    for off in range(0, len(data), block):
        b = data[off:off + block]
        c = codec(b)
        hi, lo = split_planes(b)
        ch, cl = codec(hi), codec(lo)
        out["raw_blk"] += c
        out["hi_blk"] += ch
        out["lo_blk"] += cl
        out["pl_blk"] += ch + cl
        out["blk_ratios"].append(len(b) / (ch + cl))
    hi, lo = split_planes(data)
    out["raw_all"] = codec(data)
    out["pl_all"] = codec(hi) + codec(lo)
    return out


def gaussian_like(arr, dtype):
    """Noise with each [layer, K|V] slice's mean and std, cast to dtype."""
    import torch
    t = torch.from_numpy(arr.view(np.int16).copy())
    x = t.view(torch.float16 if dtype == "F16" else torch.bfloat16).float()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(x.shape, generator=g)
    dims = tuple(range(2, x.dim()))
    y = noise * x.std(dim=dims, keepdim=True) + x.mean(dim=dims, keepdim=True)
    y = y.to(torch.float16 if dtype == "F16" else torch.bfloat16)
    return y.view(torch.int16).numpy().astype("<i2").tobytes()


def fmt(x):
    return "%.3f" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--block", type=int, default=256, help="block size in KiB (256)")
    ap.add_argument("--codecs", choices=("auto", "stdlib", "both"), default="auto")
    ap.add_argument("--no-gaussian", action="store_true",
                    help="skip the Gaussian control (needs torch)")
    args = ap.parse_args()
    files = args.files or sorted(glob.glob(DEFAULT_GLOB))
    if not files:
        sys.exit("no samples: run bench/kv/capture.py (bench/kv/README.md)")
    block = args.block * 1024
    cs = codecs(args.codecs)

    rows = []
    for path in files:
        arr, dtype, meta = read_safetensors(path)
        data = arr.tobytes()
        label = "%s %s" % (os.path.basename(path).split(".")[0], dtype)
        full, tail = divmod(len(data), block)
        print("%s: shape %s, %d bytes = %d blocks of %d KiB%s; model: %s"
              % (os.path.relpath(path, ROOT), list(arr.shape), len(data), full,
                 args.block, " + %d B" % tail if tail else "", meta.get("model", "?")))
        inputs = [(label, data)]
        inputs.append(("random bytes, %d B" % len(data),
                       random.Random(0).randbytes(len(data))))
        if not args.no_gaussian:
            inputs.append(("Gaussian %s (control)" % dtype, gaussian_like(arr, dtype)))
        for name, d in inputs:
            for cname, c in cs:
                rows.append((name, cname, measure(d, c, block)))

    print()
    print("Ratio = original / compressed. blk = sum over %d KiB blocks; all = whole array."
          % args.block)
    print("hi/lo = one plane alone, per block (each plane is half the bytes).")
    print()
    print("| data | codec | raw blk | raw all | planes blk | planes all "
          "| hi blk | lo blk | planes blk min/med/max |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name, cname, m in rows:
        n = m["n"]
        r = m["blk_ratios"]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |" % (
            name, cname, fmt(n / m["raw_blk"]), fmt(n / m["raw_all"]),
            fmt(n / m["pl_blk"]), fmt(n / m["pl_all"]),
            fmt(n / 2 / m["hi_blk"]), fmt(n / 2 / m["lo_blk"]),
            fmt(min(r)), fmt(statistics.median(r)), fmt(max(r))))


if __name__ == "__main__":
    main()
