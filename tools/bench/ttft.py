#!/usr/bin/env python3
"""ttft.py - time to first token of the reference engine with kvcached,
against full recompute, in one run on one machine.

For each prompt length and shared-prefix fraction: a prompt whose first
`share` of tokens (whole blocks) was computed and stored before by another
request is
  recompute   prefilled from scratch (the engine without kvcached);
  G1/G2/G3    its prefix loaded from that tier (LOOKUP, LOAD, copy into the
              engine's pages, RELEASE) and only the rest prefilled.
TTFT runs from the request to the first token's logits on the host side of
a synchronised device. Beside them, the floor: the suffix's prefill time
(measured in the same run) plus the prefix's KV bytes over the reference
copy bandwidth measured in the same run (pinned host -> device on CUDA,
memcpy on the CPU); and for G3 the disk floor: the same with the bytes
over the bandwidth of O_DIRECT reads (8 in flight) of a file of that size
in the G3 directory. Each figure is the median of --runs runs after one
untimed warm-up per length; the loaded runs' logits are compared with the
recompute's (max relative difference printed).

G3 runs evict the prefix from G2 to the SSD (the admin socket's /evict)
before each run; G1 runs (CUDA only) load to G1 once untimed first, so the
blocks sit in the daemon's device pool.

Starts its own kvcached (temporary socket directory; G3 files under
--g3-dir, default a temporary directory) and stops it at the end.

  python3 tools/bench/ttft.py                                 # CPU, "small" model
  python3 tools/bench/ttft.py --device cuda --preset 1b --dtype bf16 \
      --lengths 4096,16384,32768 --shares 0.9 --tiers g1,g2,g3
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

from kvclient import G1, G2, Client  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402
from kvclient.paged import PagedKV, PagedLayout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402

TIERS = {"g1": G1, "g2": G2, "g3": G2}  # G3 blocks are loaded "to G2" from the SSD


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench_args(doc):
    """An argument parser described by doc's first paragraph, with the
    model's --device, --preset and --dtype (model_args reads them)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default=None, help="model shape (default: small on CPU, 1b on CUDA)")
    ap.add_argument("--dtype", default=None, help="fp32 or bf16 (default: fp32 CPU, bf16 CUDA)")
    return ap


def model_args(a):
    """(device, preset, dtype) from the arguments --device, --preset and
    --dtype, the defaults filled in: "small" fp32 on the CPU, "1b" bf16 on
    CUDA."""
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        a.dtype or ("bf16" if cuda else "fp32")]
    return dev, a.preset or ("1b" if cuda else "small"), dtype


def timed_prefill(model, cache, pages, tokens, start=0, filled=()):
    """(seconds, logits) of model.prefill, the device synchronised around it
    (the benchmarks of this folder time every prefill so)."""
    sync(model.device)
    t = time.perf_counter()
    lg = model.prefill(cache, pages, tokens, start=start, filled=filled)
    sync(model.device)
    return time.perf_counter() - t, lg


def dump(path, env, rows):
    """Writes {"env": env, "rows": rows} as JSON to path (None: nothing)."""
    if path:
        with open(path, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)


def ref_bandwidth(dev, nbytes, runs=5):
    """Bytes/s of the reference copy: pinned host -> device (CUDA), memcpy (CPU)."""
    nbytes = max(nbytes, 64 << 20)
    if dev.type == "cuda":
        src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    else:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)
    ts = []
    for _ in range(runs + 1):
        sync(dev)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(dev)
        ts.append(time.perf_counter() - t)
    return nbytes / statistics.median(ts[1:])


def ref_disk_bandwidth(directory, nbytes, threads=8, chunk=1 << 20):
    """Bytes/s of O_DIRECT reads of nbytes from a file in `directory`
    (threads x chunk-sized reads in flight, as G3 keeps several), or None
    where O_DIRECT is refused."""
    import mmap
    import threading
    path = os.path.join(directory, "ttft-disk-ref.bin")
    n = max(threads, nbytes // chunk)
    try:
        with open(path, "wb") as f:
            blk = os.urandom(chunk)
            for _ in range(n):
                f.write(blk)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        errs = []

        def reader(k):
            buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
            try:
                for i in range(k, n, threads):
                    if os.preadv(fd, [buf], i * chunk) != chunk:
                        errs.append(i)
            except OSError as e:
                errs.append(e)
        ts = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        dt = time.perf_counter() - t
        return None if errs else n * chunk / dt
    finally:
        os.close(fd)
        os.remove(path)


def main():
    ap = bench_args(__doc__)
    ap.add_argument("--lengths", default=None, help="prompt lengths (default 1024,4096,16384 CPU; "
                                                    "4096,16384,32768 CUDA)")
    ap.add_argument("--shares", default=None, help="shared prefix fractions (default 0.5,0.9 CPU; 0.9 CUDA)")
    ap.add_argument("--tiers", default=None, help="g1,g2,g3 (default g2,g3 CPU; g1,g2,g3 CUDA)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--pages-per-block", type=int, default=1)
    ap.add_argument("--g2", default=None, help="G2 capacity (default: 3x the largest prompt's KV)")
    ap.add_argument("--g3-dir", default=None, help="directory for G3 (default: a temporary one)")
    ap.add_argument("--g2-path", default="direct", choices=["stage", "direct"],
                    help="how G2 blocks reach a CUDA engine (kvclient.paged.PagedKV; default direct)")
    ap.add_argument("--verify-threads", type=int, default=None,
                    help="threads of the CRC pass over loaded G2 blocks (PagedKV's verify_threads; "
                         "default min(8, CPUs))")
    ap.add_argument("--kvcached", default=None,
                    help="the daemon (default $KVCACHED_BIN, else <repo>/build/bin/kvcached)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    dev, preset, dtype = model_args(a)
    cuda = dev.type == "cuda"
    lengths = [int(x) for x in (a.lengths or ("4096,16384,32768" if cuda else "1024,4096,16384")).split(",")]
    shares = [float(x) for x in (a.shares or ("0.9" if cuda else "0.5,0.9")).split(",")]
    tiers = (a.tiers or ("g1,g2,g3" if cuda else "g2,g3")).split(",")
    if "g1" in tiers and not cuda:
        sys.exit("G1 needs --device cuda")

    cfg = LlamaConfig.preset(preset)
    T = a.page_tokens
    E = torch.tensor([], dtype=dtype).element_size()
    tok_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * E
    maxlen = max(lengths)
    t0 = time.perf_counter()
    model = Llama(cfg, seed=0, dtype=dtype, device=dev)
    build_s = time.perf_counter() - t0
    # two page sets: the request that stored the prefix, and the measured one
    npages = 2 * (-(-maxlen // T)) + 4
    cache = PagedKVCache(cfg, num_pages=npages, page_tokens=T, dtype=dtype, device=dev)
    layout = PagedLayout.vllm(cache.kv)
    block_bytes = layout.page_block_bytes * a.pages_per_block
    kv_max = maxlen * tok_bytes
    g2 = a.g2 or str(max(3 * kv_max, 256 << 20))
    g3dir = None
    tmp = tempfile.mkdtemp(prefix="kvttft-")
    if "g3" in tiers:
        g3dir = a.g3_dir or os.path.join(tmp, "g3")
        os.makedirs(g3dir, exist_ok=True)
    d = Daemon(tmp, g2=g2, page=str(max(64 << 20, block_bytes)), g3=g3dir,
               g3_capacity=str(3 * kv_max + (256 << 20)), g3_block=str(block_bytes),
               g1=str(2 * kv_max + (64 << 20)) if "g1" in tiers else None, binary=a.kvcached,
               log_level="warn").start()
    gen = torch.Generator().manual_seed(7)
    rows = []
    try:
        client = Client(d.socket, tenant="ttft", layout=layout.client_layout(a.pages_per_block))
        pk = PagedKV(client, layout, pages_per_block=a.pages_per_block, g2_path=a.g2_path,
                     verify_threads=a.verify_threads)
        if "g1" in tiers and not client.g1.available:
            sys.exit(f"no G1 in this process: {client.g1.reason}")
        ref_bw = ref_bandwidth(dev, kv_max)
        disk_bw = ref_disk_bandwidth(g3dir, int(max(shares) * kv_max)) if g3dir else None
        env = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu",
               "torch": torch.__version__, "preset": preset, "dtype": str(dtype).split(".")[-1],
               "page_tokens": T, "block_bytes": block_bytes, "kv_bytes_per_token": tok_bytes,
               "model_build_s": round(build_s, 1), "ref_copy_gbps": round(ref_bw / 1e9, 2),
               "ref_disk_gbps": round(disk_bw / 1e9, 2) if disk_bw else None,
               "g2_path": a.g2_path, "threads": torch.get_num_threads(),
               "verify_threads": pk.verify_threads}
        print(json.dumps(env), flush=True)
        set_a = list(range(npages // 2))
        set_b = list(range(npages // 2, npages))

        def prefill(tokens, pages, start):
            return timed_prefill(model, cache, pages, tokens, start)

        for n in lengths:
            # warm-up at this length (allocator, kernels, caches)
            warm = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
            prefill(warm, set_b, 0)
            for share in shares:
                nb = int(n * share) // pk.block_tokens
                prefix_len = nb * pk.block_tokens
                prefix = torch.randint(0, cfg.vocab_size, (prefix_len,), generator=gen).tolist()
                other = prefix + torch.randint(0, cfg.vocab_size, (n - prefix_len,), generator=gen).tolist()
                prompt = prefix + torch.randint(0, cfg.vocab_size, (n - prefix_len,), generator=gen).tolist()
                # the earlier request: computes and stores the shared prefix
                prefill(other, set_a, 0)
                sv = pk.save(other, set_a)
                rec = [prefill(prompt, set_b, 0) for _ in range(a.runs)]
                t_rec = statistics.median(t for t, _ in rec)
                ref_logits = rec[-1][1].float()
                row = {"tokens": n, "share": share, "prefix_tokens": prefix_len,
                       "prefix_bytes": prefix_len * tok_bytes, "stored_blocks": sv.stored,
                       "recompute_s": t_rec}
                # untimed: the prefill of a suffix after a loaded prefix, the
                # shape the timed runs meet (allocator, kernel selection)
                w = pk.load(prompt, set_b)
                prefill(prompt, set_b, w.tokens)
                suffix_times = []
                # G1 last: evicting G2 must not meet blocks the G1 pool holds
                for tname in sorted(tiers, key=["g2", "g3", "g1"].index):
                    tier = TIERS[tname]
                    if tname == "g1":  # bring the blocks into the daemon's device pool
                        pk.load(prompt, set_b, tier=G1)
                    runs = []
                    for _ in range(a.runs):
                        if tname == "g3":
                            d.evict_g2(client, pk.keys(prefix))
                        sync(dev)
                        t = time.perf_counter()
                        r = pk.load(prompt, set_b, tier=tier)
                        sync(dev)
                        t_load = time.perf_counter() - t
                        t_pre, lg = prefill(prompt, set_b, r.tokens)
                        err = float((lg.float() - ref_logits).abs().max() / ref_logits.abs().max())
                        runs.append((t_load + t_pre, t_load, t_pre, r, err,
                                     lg.argmax().item() == ref_logits.argmax().item()))
                        if r.tokens != prefix_len:
                            print(f"warning: {tname} loaded {r.tokens} of {prefix_len} tokens "
                                  f"(failed: {r.failed[:3]}, tiers {set(r.tiers)})", flush=True)
                    runs.sort(key=lambda x: x[0])
                    med = runs[len(runs) // 2]
                    suffix_times += [x[2] for x in runs]
                    row[tname] = {"ttft_s": med[0], "load_s": med[1], "prefill_s": med[2],
                                  "loaded_tokens": med[3].tokens,
                                  "breakdown_s": {k: round(v, 6) for k, v in med[3].timings.items()},
                                  "max_rel_logit_diff": max(x[4] for x in runs),
                                  "same_argmax": all(x[5] for x in runs)}
                t_suffix = statistics.median(suffix_times) if suffix_times else 0.0
                row["floor_s"] = t_suffix + row["prefix_bytes"] / ref_bw
                if disk_bw:
                    row["disk_floor_s"] = t_suffix + row["prefix_bytes"] / disk_bw
                rows.append(row)
                print(json.dumps(row), flush=True)
                client.delete()  # the next length starts empty
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"TTFT, {env['device']}, model {preset} {env['dtype']}, {T}-token pages, "
          f"reference copy {env['ref_copy_gbps']} GB/s, disk {env['ref_disk_gbps']} GB/s, "
          f"{env['verify_threads']} verify thread(s), median of {a.runs}")
    disk = any("disk_floor_s" in r for r in rows)
    head = "| tokens | prefix | recompute |" + "".join(f" {t.upper()} |" for t in tiers) + \
        " floor |" + "".join(f" {t.upper()}/floor |" for t in tiers) + \
        (" G3/disk floor |" if disk and "g3" in tiers else "") + " speedup (best) | max logit diff |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        best = min(r[t]["ttft_s"] for t in tiers)
        cells = [f"{r['tokens']}", f"{r['share']:.0%}", f"{r['recompute_s'] * 1e3:.1f} ms"]
        cells += [f"{r[t]['ttft_s'] * 1e3:.1f} ms" for t in tiers]
        cells += [f"{r['floor_s'] * 1e3:.1f} ms"]
        cells += [f"{r[t]['ttft_s'] / r['floor_s']:.2f}" for t in tiers]
        if disk and "g3" in tiers:
            cells += [f"{r['g3']['ttft_s'] / r['disk_floor_s']:.2f}"]
        cells += [f"{r['recompute_s'] / best:.1f}x",
                  f"{max(r[t]['max_rel_logit_diff'] for t in tiers):.1e}"]
        print("| " + " | ".join(cells) + " |")
    dump(a.json, env, rows)


if __name__ == "__main__":
    main()
