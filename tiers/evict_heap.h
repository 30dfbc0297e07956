/*
 * evict_heap.h - the score heap that evict_heap.c's policies (lru, lru2,
 * lfuda) and evict_reuse.c's (reuse) are built on: a binary min-heap of
 * block ids ordered by a score whose top byte is the priority class, with
 * b->hpos[tier] the block's position. O(log n) add, remove and touch, O(1)
 * peek. A policy gives the score function to kv_heap_init and keeps its
 * own state beside the heap's fields.
 */
#ifndef KV_TIERS_EVICT_HEAP_H
#define KV_TIERS_EVICT_HEAP_H

#include <stdint.h>

#include "tiers/evict_impl.h"

#define KV_HEAP_TIME_MASK ((1ull << 55) - 1) /* the bits of a score below the class and one flag */

typedef struct kv_heap kv_heap;
struct kv_heap {
  kv_bid *v;     /* the heap, by block id */
  uint64_t *key; /* lfuda: the stored score of v[i]; NULL: scored from the record */
  uint32_t n, cap;
  uint64_t age; /* lfuda: the score of the last block offered as victim */
  uint64_t (*score)(const kv_heap *h, const kv_block *b);
  kv_seen *seen; /* reuse: its victims lately; NULL for the others */
  struct lru2_times {
    uint64_t last, prev;
  } * t;          /* lru2: by block id, the last two access times */
  uint32_t nids;  /* lru2: ids covered by t */
  kv_bid offered; /* reuse: the last block peek offered */
  kv_newest newest; /* reuse: the newest rule's block (evict_impl.h) */
};

/* The score of the entry at i. */
static inline uint64_t kv_heap_key(const kv_evict *e, const kv_heap *h, uint32_t i) {
  return h->key ? h->key[i] : h->score(h, kv_index_at(e->ix, h->v[i]));
}

/* Makes e's heap (e->priv), scored by score. 0 or -ENOMEM. */
int kv_heap_init(kv_evict *e, uint64_t (*score)(const kv_heap *, const kv_block *));
/* Frees e's heap and what its policy kept in it. */
void kv_heap_fini(kv_evict *e);
/* The kv_evict_ops entries of a policy that is the heap alone. */
int kv_heap_add(kv_evict *e, kv_block *b);
void kv_heap_remove(kv_evict *e, kv_block *b);
void kv_heap_touch(kv_evict *e, kv_block *b);
kv_block *kv_heap_peek(kv_evict *e);

#endif
