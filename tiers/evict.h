/*
 * evict.h - eviction policies: which block of a tier goes next.
 *
 * One policy instance orders the *evictable* blocks of one tier's size
 * class. The core (core.h) decides what is evictable - resident and valid
 * in the tier, committed, not pinned, no copy in flight, and no child whose
 * bytes are valid in the same tier (leaf-first: a prefix chain is cut from
 * its end) - and tells the policy as blocks enter and leave that set. The
 * policy only ranks: priority class first (lower goes first), then its own
 * order. So every policy keeps chains whole and never offers a pinned block.
 *
 * A policy may use b->hpos[tier] as its own per-block word, and reads the
 * access history the core keeps in every record (atime, atime2, hits).
 *
 * Adding a policy: write one kv_evict_ops table and list it in evict.c.
 */
#ifndef KV_TIERS_EVICT_H
#define KV_TIERS_EVICT_H

#include <stdint.h>

#include "tiers/block.h"
#include "tiers/index.h"

typedef struct kv_evict kv_evict;

typedef struct kv_evict_ops {
  const char *name;
  const char *summary;
  int (*init)(kv_evict *e);                 /* 0 or -ENOMEM */
  void (*fini)(kv_evict *e);
  /* b became evictable; may fail only with -ENOMEM (b then stays out). */
  int (*add)(kv_evict *e, kv_block *b);
  void (*remove)(kv_evict *e, kv_block *b); /* b is no longer evictable */
  void (*touch)(kv_evict *e, kv_block *b);  /* evictable b was accessed */
  kv_block *(*peek)(kv_evict *e);           /* next victim, or NULL */
} kv_evict_ops;

struct kv_evict {
  const kv_evict_ops *ops;
  kv_index *ix;
  kv_tier tier;
  uint32_t count; /* blocks held */
  void *priv;
};

/* Finds a policy by name; NULL if there is none of that name. */
const kv_evict_ops *kv_evict_lookup(const char *name);
/* The policies compiled in, NULL-terminated. */
extern const kv_evict_ops *const kv_evict_policies[];
/* The default policy's name. */
extern const char kv_evict_default[];

int kv_evict_init(kv_evict *e, const kv_evict_ops *ops, kv_index *ix, kv_tier tier);
void kv_evict_fini(kv_evict *e);

#endif
