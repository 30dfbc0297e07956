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
