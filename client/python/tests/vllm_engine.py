"""One real vLLM engine in a process of its own, for test_vllm.py and
tools/bench/vllm_ttft.py: vllm.LLM (the V1 engine, CPU backend) over a model
directory that model_dir() writes (a tiny Llama with seeded weights: no hub,
no tokenizer), with or without kvclient.vllm.KvcachedConnector loaded by
vLLM's own connector factory (kv_connector_module_path).

    python vllm_engine.py SPEC.json OUT.json

SPEC: model (directory), connector (null, or {"module": ..., "class": ...,
"extra": kv_connector_extra_config}), policy (kv_load_failure_policy),
max_tokens, requests ([{"id", "tokens", "params" (kv_transfer_params or
null)}], served in order, one generate() each, unless "batch": true),
engine (more vllm.LLM arguments), env (more environment, set before vLLM
is imported), timing (true: each request's time to its
first token, measured as a generate() of max_tokens=1 before the full one).
OUT: {"outputs": {id: {"tokens", "logprobs" (the sampled tokens'),
"cached" (num_cached_tokens), "finish", "error"}}, "metrics": {vLLM's
Prometheus series whose names start with vllm:external_prefix_cache,
vllm:prefix_cache or vllm:kvcached_: value}, "ttft": {id: seconds},
"vllm": version, "kvclient": where it was imported from}.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set
by launch()): the same scheduler, worker and connector code as vLLM's
default of a second process, one process less to start on a 2-core machine.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Llama's architecture at two sizes: "tiny" for the tests (small enough to
# run on 2 cores, big enough that a wrong KV block changes its greedy
# tokens), "small" for tools/bench/vllm_ttft.py (prefill compute per KV byte
# nearer a real model's)
MODELS = {
    "tiny": dict(hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2, head_dim=32,
                 vocab=512),
    "small": dict(hidden=512, intermediate=2048, layers=4, heads=8, kv_heads=2, head_dim=64,
                  vocab=512),
}
MODEL = MODELS["tiny"]


def model_dir(path: str, seed: int = 1234, size: str = "tiny") -> str:
    """Writes config.json and model.safetensors of a Llama of MODELS[size]
    (weights from torch's generator with `seed`, scaled as a trained
    model's so the logits are far from uniform) into path; returns path."""
    import torch
    from safetensors.torch import save_file
    m = MODELS[size]
    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": m["hidden"], "intermediate_size": m["intermediate"],
           "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
           "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"],
           "vocab_size": m["vocab"], "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    g = torch.Generator().manual_seed(seed)
    H, I, D, V = m["hidden"], m["intermediate"], m["head_dim"], m["vocab"]

    def lin(o, i):
        return torch.randn(o, i, generator=g) / i ** 0.5

    w = {"model.embed_tokens.weight": torch.randn(V, H, generator=g),
         "model.norm.weight": torch.ones(H), "lm_head.weight": lin(V, H) * 4}
    for l in range(m["layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = torch.ones(H)
        w[p + "post_attention_layernorm.weight"] = torch.ones(H)
        w[p + "self_attn.q_proj.weight"] = lin(m["heads"] * D, H) * 2
        w[p + "self_attn.k_proj.weight"] = lin(m["kv_heads"] * D, H) * 2
        w[p + "self_attn.v_proj.weight"] = lin(m["kv_heads"] * D, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, m["heads"] * D)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    save_file(w, os.path.join(path, "model.safetensors"))
    return path


def block_bytes(tokens_per_block: int, size: str = "tiny") -> int:
    """One kvcached block of MODELS[size] (fp32): every layer's K and V."""
    m = MODELS[size]
    return 2 * m["layers"] * tokens_per_block * m["kv_heads"] * m["head_dim"] * 4


class Launched:
    """An engine process started by launch(): wait() for its result."""

    def __init__(self, proc, out_path, log_path, log):
        self.proc, self.out_path, self.log_path, self._log = proc, out_path, log_path, log

    def wait(self, timeout=None):
        """(exit status, OUT as a dict or None); killed past timeout."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        if rc != 0:
            return rc, None
        with open(self.out_path) as f:
            return rc, json.load(f)

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def launch(spec: dict, directory: str, tag: str, pythonpath: str | None = None,
           extra_env: dict | None = None) -> Launched:
    """Starts this script on `spec` in a process of its own, its files
    (TAG.json, TAG.out, TAG.log) in `directory`: the engine core in that
    process (VLLM_ENABLE_V1_MULTIPROCESSING=0), vLLM's logging at warnings,
    `pythonpath` (where kvclient is imported from) first on PYTHONPATH,
    and `extra_env`."""
    sp, op, lp = (os.path.join(directory, f"{tag}.{x}") for x in ("json", "out", "log"))
    with open(sp, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="WARNING",
               PYTHONDONTWRITEBYTECODE="1", **(extra_env or {}))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    log = open(lp, "w")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), sp, op], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    return Launched(proc, op, lp, log)


def _metrics(llm) -> dict:
    out = {}
    try:
        snap = llm.get_metrics()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"error": repr(e)}
    for m in snap:
        name = getattr(m, "name", "")
        if name.startswith(("vllm:external_prefix_cache", "vllm:prefix_cache", "vllm:kvcached_")):
            v = getattr(m, "value", None)
            if isinstance(v, (int, float)):
                out[name] = out.get(name, 0) + v
    return out


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    sys.path.insert(0, HERE)  # a connector module of the tests (faults, mutants)
    os.environ.update(spec.get("env") or {})
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt
    import vllm

    kw = dict(model=spec["model"], skip_tokenizer_init=True, dtype="float32",
              max_model_len=16384, enforce_eager=True, seed=0, block_size=32, max_num_seqs=4,
              kv_cache_memory_bytes=256 << 20, disable_log_stats=False)
    kw.update(spec.get("engine") or {})
    conn = spec.get("connector")
    if conn:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=conn.get("class", "KvcachedConnector"),
            kv_connector_module_path=conn.get("module", "kvclient.vllm"),  # None: vLLM's own
            kv_role="kv_both", kv_connector_extra_config=conn.get("extra") or {},
            kv_load_failure_policy=spec.get("policy", "recompute"))
    llm = LLM(**kw)
    import kvclient
    result = {"outputs": {}, "ttft": {}, "vllm": vllm.__version__, "kvclient": kvclient.__file__}

    def sp(req, n):
        extra = {"kv_transfer_params": req["params"]} if req.get("params") else None
        return SamplingParams(max_tokens=n, temperature=0.0, logprobs=1, detokenize=False,
                              extra_args=extra)

    def record(req, out):
        o = out.outputs[0] if out.outputs else None
        lps = []
        if o is not None and o.logprobs:
            for tok, lp in zip(o.token_ids, o.logprobs):
                lps.append(lp[tok].logprob)
        result["outputs"][req["id"]] = {
            "tokens": list(o.token_ids) if o is not None else [], "logprobs": lps,
            "cached": out.num_cached_tokens, "finish": getattr(o, "finish_reason", None),
            "error": None}

    n = int(spec.get("max_tokens", 8))
    reqs = spec["requests"]
    if spec.get("batch"):
        outs = llm.generate([TokensPrompt(prompt_token_ids=r["tokens"]) for r in reqs],
                            [sp(r, n) for r in reqs], use_tqdm=False)
        for r, o in zip(reqs, outs):
            record(r, o)
    else:
        for r in reqs:
            try:
                if spec.get("timing"):
                    t0 = time.perf_counter()
                    llm.generate([TokensPrompt(prompt_token_ids=r["tokens"])], [sp(r, 1)],
                                 use_tqdm=False)
                    result["ttft"][r["id"]] = time.perf_counter() - t0
                else:
                    out = llm.generate([TokensPrompt(prompt_token_ids=r["tokens"])], [sp(r, n)],
                                       use_tqdm=False)
                    record(r, out[0])
            except Exception as e:  # noqa: BLE001 - the test judges it
                result["outputs"][r["id"]] = {"tokens": [], "logprobs": [], "cached": 0,
                                              "finish": None, "error": f"{type(e).__name__}: {e}"}
    result["metrics"] = _metrics(llm)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
