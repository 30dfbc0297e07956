/*
 * evict_policies.c - the registry of eviction policies (see evict.h): the
 * table of every policy compiled in, the lookup by name and the default.
 * It names every policy's ops, so it sits above them all; an instance's
 * life (kv_evict_init/fini), which policies use too, is evict.c's.
 */
#include "tiers/evict.h"

#include <string.h>

extern const kv_evict_ops kv_evict_lru_ops;
extern const kv_evict_ops kv_evict_lru2_ops;
extern const kv_evict_ops kv_evict_lfuda_ops;
extern const kv_evict_ops kv_evict_arc_ops;
extern const kv_evict_ops kv_evict_s3fifo_ops;
extern const kv_evict_ops kv_evict_tinylfu_ops;
extern const kv_evict_ops kv_evict_auto_ops;
extern const kv_evict_ops kv_evict_reuse_ops;
extern const kv_evict_ops kv_evict_adapt_ops;
extern const kv_evict_ops kv_evict_aged_ops;
extern const kv_evict_ops kv_evict_aged0_ops;

const kv_evict_ops *const kv_evict_policies[] = {
    &kv_evict_lru_ops,    &kv_evict_lru2_ops,
    &kv_evict_lfuda_ops,  &kv_evict_arc_ops,
    &kv_evict_s3fifo_ops, &kv_evict_tinylfu_ops,
    &kv_evict_auto_ops,   &kv_evict_reuse_ops,
    &kv_evict_adapt_ops,  &kv_evict_aged_ops,
    &kv_evict_aged0_ops,  NULL,
};

/* Chosen by `kvbench core-replay` on both traces of bench/traces
 * (tiers/EVICTION.md, "The default: adapt"). */
const char kv_evict_default[] = "adapt";

const kv_evict_ops *kv_evict_lookup(const char *name) {
  for (int i = 0; kv_evict_policies[i]; i++)
    if (strcmp(kv_evict_policies[i]->name, name) == 0) return kv_evict_policies[i];
  return NULL;
}
