"""An SGLang-shaped inference worker of test_sglang: the reference engine
(kvclient.examples.llama) with a HiCache host pool (sglang_shim.HostPool,
SGLang's MHATokenToKVPoolHost layout) and kvclient.sglang.KvcachedStorage as
its L3, built and driven as SGLang's HiCacheController does.

    python sglang_worker.py SPEC.json OUT.pt

SPEC: socket, prompt (token ids), layout (the host pool's
--hicache-mem-layout), interface_v1 (1: batch_get_v1/batch_set_v1; 0: the
flat-page get/set), verify (the backend's CRC check, default true), load (prefetch the stored prefix first), save (back up
the prompt's full pages after prefill), new_tokens, page_tokens.
OUT (torch.save): {"hit": pages batch_exists found, "loaded": tokens
loaded, "stored": tokens backed up, "get_results": batch_get_v1's answers,
"stats": get_stats(), "logits", "tokens"}.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import sglang_shim  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402

sglang_shim.install()


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        s = json.load(f)
    cfg = LlamaConfig.preset("tiny")
    T = s.get("page_tokens", 16)
    prompt, new = s["prompt"], s.get("new_tokens", 0)
    model = Llama(cfg, seed=0)
    cache = PagedKVCache(cfg, num_pages=-(-(len(prompt) + new) // T) + 3, page_tokens=T)
    cache.alloc(3)  # this worker's pages are not 0.. like another's
    pages = cache.alloc(cache.pages_for(len(prompt) + new))
    host = sglang_shim.HostPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, size=64 * T,
                                page_size=T, layout=s.get("layout", "layer_first"))
    host.alloc((3 + s.get("host_skip", 0)) * T)  # nor are its host pages
    conf = sglang_shim.storage_config(
        sglang_shim.extra_config(s["socket"], interface_v1=s.get("interface_v1", 1),
                                 verify=s.get("verify", True)),
        layout=host.layout)
    backend, zero_copy = sglang_shim.create_dynamic_backend(conf, host)
    ctl = sglang_shim.Controller(backend, host, zero_copy)
    out = {"hit": 0, "loaded": 0, "stored": 0}
    start = 0
    if s.get("load"):
        # the prefix SGLang may take from storage: whole pages, leaving the last token
        aligned = (len(prompt) - 1) // T * T
        hashes = ctl.hit_query(prompt[:aligned])
        hidx = host.alloc(len(hashes) * T)
        n = ctl.page_transfer(hashes, hidx)
        host.load_to_device(cache.kv, pages[:n], hidx)
        out.update(hit=len(hashes), loaded=n * T)
        start = n * T
    out["logits"] = model.prefill(cache, pages, prompt, start=start)
    if s.get("save"):
        hashes = sglang_shim.get_hash_str(prompt, None, T)
        hidx = host.alloc(len(hashes) * T)
        host.backup_from_device(cache.kv, pages[:len(hashes)], hidx)
        out["stored"] = ctl.page_backup(hashes, hidx)
    if new:
        out["tokens"] = model.generate(cache, pages, prompt, new, start=len(prompt))
    out["get_results"] = ctl.get_results
    out["stats"] = backend.get_stats()
    backend.close()
    torch.save(out, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
