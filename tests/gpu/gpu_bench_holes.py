#!/usr/bin/env python3
"""gpu_bench_holes.py - tools/bench/holes_ttft.py on the CUDA device: the
reference engine of the Llama-3.2-1B shape in bf16, prompts of 8k, 16k and
32k tokens whose cached prefix misses one block in the middle: the hole
computed alone, against computing from the hole and a full recompute.
Environment: KV_HOLES_LENGTHS, KV_HOLES_RUNS, KV_GPU_OUT (writes
holes.json there). Exit 77 without a CUDA device."""
import os
import subprocess
import sys

try:
    import torch
except ImportError as e:
    print(f"gpu_bench_holes: skipped, no torch: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("gpu_bench_holes: skipped, torch sees no CUDA device")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
args = [sys.executable, os.path.join(here, "..", "..", "tools", "bench", "holes_ttft.py"),
        "--device", "cuda", "--preset", "1b", "--dtype", "bf16",
        "--lengths", os.environ.get("KV_HOLES_LENGTHS", "8192,16384,32768"),
        "--runs", os.environ.get("KV_HOLES_RUNS", "3")]
if os.environ.get("KV_GPU_OUT"):
    args += ["--json", os.path.join(os.environ["KV_GPU_OUT"], "holes.json")]
sys.exit(subprocess.call(args))
