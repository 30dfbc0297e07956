#!/usr/bin/env python3
"""gpu_test_pyclient.py - the Python package's Client on a CUDA device,
against a real kvcached with a G1 pool: blocks stored through G2 (written
through torch CPU views), loaded to G1, where Block.torch() is a CUDA tensor
over the imported pool with no copy (its data_ptr is the block's device
address) holding the committed bytes; the G2 mapping registered with CUDA,
and a G2 block's torch view copied to the device with a non-blocking copy.
Exit 0 passed, 1 failed, 77 no CUDA device (the reason).
"""
import os
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

try:
    import torch
except ImportError as e:
    print(f"gpu_test_pyclient: skipped, no torch: {e}")
    sys.exit(77)
if not torch.cuda.is_available() and os.environ.get("KV_GPU_PYCLIENT_SIM") != "1":
    print("gpu_test_pyclient: skipped, torch sees no CUDA device")
    sys.exit(77)

from kvclient import G1, G1_CUDA, G2, Client, Layout  # noqa: E402
from kvclient.testing import Daemon  # noqa: E402

BLOCK = 1 << 20
N = 16


def main():
    fails = []

    def check(ok, what):
        print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            fails.append(what)

    sim = not torch.cuda.is_available()  # KV_GPU_PYCLIENT_SIM=1: the G2 half, on the CPU
    print(f"gpu_test_pyclient: {'CPU (simulated G1)' if sim else torch.cuda.get_device_name(0)}")
    tmp = tempfile.mkdtemp(prefix="kvgpu-py-")
    lay = Layout(BLOCK, 16, 1, 1, 1, "u8")
    with Daemon(tmp, g2="64M", page="4M", g1="32M", g1_backend="sim" if sim else "auto",
                log_level="warn") as d, Client(d.socket, tenant="py", layout=lay) as c:
        g = c.g1
        check(g.available and (sim or g.backend == G1_CUDA),
              f"G1 pool imported ({g.uuid}, backend {g.backend}, {g.bytes >> 20} MiB) {g.reason}")
        keys = [bytes([i]) * 32 for i in range(N)]
        want = [torch.full((BLOCK,), i + 1, dtype=torch.uint8) for i in range(N)]
        with c.alloc(keys) as a:
            for b, w in zip(a.blocks, want):
                b.torch().copy_(w)
            check(a.commit() == [0] * N, "16 blocks of 1 MiB stored through torch views of G2")
        if not sim:
            c.register_cuda()
            check(c.g2.registered == G1_CUDA, f"G2 mapping registered with CUDA ({c.g2.bytes >> 20} MiB)")
            with c.load(keys, tier=G2) as got:
                dev = torch.empty(BLOCK, dtype=torch.uint8, device="cuda")
                dev.copy_(got.blocks[3].torch(), non_blocking=True)
                torch.cuda.synchronize()
                check(torch.equal(dev.cpu(), want[3]), "a G2 block copied to the device (DMA)")
            with c.load(keys, tier=G1) as got:
                ok = all(b.ok and b.tier == G1 for b in got.blocks)
                check(ok, "LOAD to G1: every block in G1")
                t = got.blocks[5].torch()
                check(t.is_cuda and t.data_ptr() == got.blocks[5].ptr and t.numel() == BLOCK,
                      "Block.torch() of a G1 block: a CUDA tensor over the pool, no copy")
                check(all(torch.equal(b.torch().cpu(), w) for b, w in zip(got.blocks, want)),
                      "every G1 block holds the committed bytes")
                v = got.blocks[7].torch(torch.float16)
                check(v.dtype == torch.float16 and v.numel() == BLOCK // 2, "a dtype view of it")
        else:
            with c.load(keys, tier=G2) as got:
                check(all(torch.equal(b.torch(), w) for b, w in zip(got.blocks, want)),
                      "G2 blocks hold the committed bytes")
    print(f"gpu_test_pyclient: {'passed' if not fails else f'{len(fails)} failed'}")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
