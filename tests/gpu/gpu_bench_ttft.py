#!/usr/bin/env python3
"""gpu_bench_ttft.py - tools/bench/ttft.py on the CUDA device with the GPU
issue's settings: the reference engine of the Llama-3.2-1B shape in bf16,
prompts of 4k, 16k and 32k tokens with a 90% shared prefix, recompute
against the prefix loaded from G1, G2 and G3, beside the floor.
Environment: KV_TTFT_LENGTHS, KV_TTFT_SHARES, KV_TTFT_RUNS, KV_TTFT_G2_PATH
(stage or direct), KV_TTFT_VERIFY_THREADS (the CRC pass's threads), KV_GPU_OUT
(writes ttft.json there). Exit 77 without a
CUDA device."""
import os
import subprocess
import sys

try:
    import torch
except ImportError as e:
    print(f"gpu_bench_ttft: skipped, no torch: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("gpu_bench_ttft: skipped, torch sees no CUDA device")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
args = [sys.executable, os.path.join(here, "..", "..", "tools", "bench", "ttft.py"),
        "--device", "cuda", "--preset", "1b", "--dtype", "bf16",
        "--lengths", os.environ.get("KV_TTFT_LENGTHS", "4096,16384,32768"),
        "--shares", os.environ.get("KV_TTFT_SHARES", "0.9"), "--tiers", "g1,g2,g3",
        "--runs", os.environ.get("KV_TTFT_RUNS", "3"),
        "--g2-path", os.environ.get("KV_TTFT_G2_PATH", "direct")]
if os.environ.get("KV_TTFT_VERIFY_THREADS"):
    args += ["--verify-threads", os.environ["KV_TTFT_VERIFY_THREADS"]]
if os.environ.get("KV_GPU_OUT"):
    args += ["--json", os.path.join(os.environ["KV_GPU_OUT"], "ttft.json")]
sys.exit(subprocess.call(args))
