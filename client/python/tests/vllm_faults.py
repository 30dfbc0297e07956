"""kvclient.vllm.KvcachedConnector with faults injected, and two mutants of
it, for test_vllm.py: loaded by vLLM's connector factory like the real one
(kv_connector_module_path "vllm_faults").

DeleteAfterLookup  the connector, unchanged, except that a request whose
    kv_transfer_params carry {"kvtest_delete": i} has block i of its chain
    deleted from kvcached right after the scheduler's LOOKUP counted it,
    before the worker's LOAD: the race of an eviction between the two.
NoLoadErrors       a mutant: never reports a block that failed to load.
PageFromNextBlock  a mutant: fills page i from block i + 1 (and leaves the
    last page of a load unfilled).
The tests check that they catch both mutants.
HoleOnly           reports only the engine blocks of the first block that
    failed in a load (the hole), not those after it, whose pages it fills
    with noise: what vLLM does with blocks past a hole that a connector
    says were loaded (test_vllm.py: vLLM 0.32.0 recomputes them too).
"""
from kvclient.vllm import KvcachedConnector, request_extra


class DeleteAfterLookup(KvcachedConnector):
    _deleted: set = set()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        ext, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        i = (getattr(request, "kv_transfer_params", None) or {}).get("kvtest_delete")
        if i is not None and ext > 0 and request.request_id not in self._deleted:
            self._deleted.add(request.request_id)
            c = self._sched_client()
            tokens = list(request.all_token_ids)[:max(request.num_tokens - 1, 0)]
            keys = self._keys(c, tokens, request_extra(request))
            c.delete([keys[int(i)]])
        return ext, is_async


class NoLoadErrors(DeleteAfterLookup):
    def get_block_ids_with_load_errors(self) -> set:
        super().get_block_ids_with_load_errors()
        return set()


class PageFromNextBlock(DeleteAfterLookup):
    def _load_batch(self, keys, lo, hi, page_ids, tier, res):
        # block i into the pages of block i - 1 (block 0 too: block 1 then
        # overwrites it), the last block's pages left as they were; a
        # rotation would only reorder the prefix, which attention cannot
        # see (the keys carry their positions)
        shifted = list(page_ids[:self.ppb]) + list(page_ids[:-self.ppb])
        return super()._load_batch(keys, lo, hi, shifted, tier, res)



class HoleOnly(DeleteAfterLookup):
    """Blocks past the first failed block of a load: not loaded, filled with
    noise, and not reported (extra config "kvtest_report": "hole", the
    default); "none" reports the hole either (the control: the noise in
    the pages changes the output when vLLM uses them)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._past_hole: set = set()
        self._report = self._kv_transfer_config.get_from_extra_config("kvtest_report", "hole")

    def register_kv_caches(self, kv_caches: dict):
        super().register_kv_caches(kv_caches)
        self._caches = list(kv_caches.values())

    def _load(self, spec):
        got = super()._load(spec)
        if got < spec.end:
            ids = [int(b) for b in spec.block_ids[(got + 1) * self.ppb:spec.end * self.ppb]]
            if self._report == "none":
                ids += [int(b) for b in spec.block_ids[got * self.ppb:(got + 1) * self.ppb]]
            self._past_hole.update(ids)
            import torch
            g = torch.Generator().manual_seed(got)
            for t in self._caches:  # [2, blocks, ...] or blocks first (the CPU backend's)
                v = t[:, ids] if t.dim() == 5 and t.shape[0] == 2 else t[ids]
                v = torch.randn(v.shape, generator=g, dtype=torch.float32).to(t.dtype)
                if t.dim() == 5 and t.shape[0] == 2:
                    t[:, ids] = v
                else:
                    t[ids] = v
        return got

    def get_block_ids_with_load_errors(self) -> set:
        bad = super().get_block_ids_with_load_errors()
        out = bad - self._past_hole
        self._past_hole -= bad
        return out
