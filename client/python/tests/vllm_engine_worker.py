"""A vLLM-like engine process of test_vllm.py: the reference engine
(kvclient.examples.llama) behind vllm_shim.Engine, with
kvclient.vllm.KvcachedConnector loaded as vLLM loads it.

    python vllm_engine_worker.py SPEC.json OUT.pt

SPEC: socket, extra (kv_connector_extra_config beyond the socket), preset,
page_tokens, num_pages, new_tokens, requests ([[request id, token ids,
cache_salt or null], ...], run one after another).
OUT (torch.save): {request id: {"logits": the prompt's last-token logits,
"tokens": greedy tokens}, "stats": the worker connector's counters,
"invalid": engine blocks reported by get_block_ids_with_load_errors}.
"""
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import vllm_shim  # noqa: E402
from kvclient.examples.llama import Llama, LlamaConfig, PagedKVCache  # noqa: E402


def main(spec_path, out_path):
    with open(spec_path) as f:
        s = json.load(f)
    vllm_shim.install()
    # what vLLM's KVConnectorFactory does with kv_connector_module_path
    conn_cls = getattr(importlib.import_module("kvclient.vllm"), "KvcachedConnector")
    cfg = LlamaConfig.preset(s.get("preset", "tiny"))
    model = Llama(cfg, seed=0)
    cache = PagedKVCache(cfg, num_pages=s.get("num_pages", 24), page_tokens=s["page_tokens"],
                         dtype=torch.float32, device="cpu")
    cache.alloc(3)  # so this engine's pages are not 0.. like another's
    eng = vllm_shim.Engine(model, cache, {"socket": s["socket"], **s.get("extra", {})}, conn_cls)
    out = {}
    for rid, toks, salt in s["requests"]:
        eng.add(vllm_shim.Request(rid, toks, s["new_tokens"], cache_salt=salt))
        eng.run()
        req = eng.requests[rid]
        out[rid] = {"logits": eng.first_logits[rid], "tokens": list(req.output_token_ids)}
    out["stats"] = dict(eng.worker_conn.stats)
    out["invalid"] = sorted(eng.invalid_seen)
    eng.worker_conn.shutdown()
    eng.sched_conn.shutdown()
    torch.save(out, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
