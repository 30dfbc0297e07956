/*
 * evict.c - a policy instance's life (see evict.h): kv_evict_init binds an
 * instance to its policy, index and tier, kv_evict_fini undoes it. Used by
 * the core and by the policies that run sub-instances (evict_auto.c,
 * evict_mini.c); the table of policies by name is evict_policies.c's.
 */
#include "tiers/evict.h"

int kv_evict_init(kv_evict *e, const kv_evict_ops *ops, kv_index *ix, kv_tier tier) {
  e->ops = ops;
  e->ix = ix;
  e->tier = tier;
  e->count = 0;
  e->priv = NULL; /* e->capacity: the owner's, kept */
  return ops->init(e);
}

void kv_evict_fini(kv_evict *e) {
  if (e->ops) e->ops->fini(e);
  e->ops = NULL;
}
