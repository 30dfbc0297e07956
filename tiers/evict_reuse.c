/*
 * evict_reuse.c - the default policy, reuse: blocks used once go first,
 * then blocks used again, each class in LRU order (score: priority class,
 * a used-again bit, last access), on evict_heap.h's score heap.
 *
 * A block counts as used again when its record has seen two uses, or when
 * its key is one the policy evicted lately and it comes back: the policy
 * remembers the fingerprints of its last victims in a kv_seen history
 * sized by the tier's capacity (8 bytes per block of capacity). So a block
 * used once (most of a prompt's tail) cannot push out one that is used
 * again and again (a shared system prompt), even when the tier was too
 * small to keep it until its second use. The newest block is offered last
 * in its class, so a chain being stored is not cut at its first block.
 * See EVICTION.md for the measurements.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict_heap.h"

static uint64_t score_reuse(const kv_heap *h, const kv_block *b) {
  uint64_t again = b->hits >= 2;
  return ((uint64_t)b->prio << 56) | (again << 55) | (b->atime & KV_HEAP_TIME_MASK);
}

static int init_reuse(kv_evict *e) {
  if (kv_heap_init(e, score_reuse)) return -ENOMEM;
  kv_heap *h = e->priv;
  h->offered = KV_BID_NONE;
  kv_newest_init(&h->newest);
  h->seen = kv_meta_calloc(1, sizeof *h->seen);
  if (!h->seen) {
    kv_meta_free(h);
    e->priv = NULL;
    return -ENOMEM;
  }
  return 0;
}

/* reuse: the history is sized by the tier's capacity, or while that is
 * unknown by the most blocks held (resized, and so forgotten, as that
 * doubles). A failed resize leaves it empty: the policy is then lru2-like
 * on the core's counts alone, never wrong, only forgetful. */
static void reuse_size(kv_evict *e, kv_heap *h) {
  uint32_t want = e->capacity;
  if (!want) {
    if (e->count <= h->seen->n * 2 && h->seen->n) return;
    want = e->count > 1024 ? e->count : 1024;
  }
  if (want != h->seen->n) (void)kv_seen_size(h->seen, want);
}

static int reuse_add(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  reuse_size(e, h);
  if (b->hits < 2 && kv_seen_has(h->seen, kv_fingerprint(b)))
    b->hits = 2; /* evicted lately, and back: this is its second use */
  int rc = kv_heap_add(e, b);
  if (rc == 0) kv_newest_added(&h->newest, e, b);
  return rc;
}

static void reuse_remove(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  if (b->id == h->offered) { /* the victim peek offered: remember its key */
    kv_seen_add(h->seen, kv_fingerprint(b), 0);
    h->offered = KV_BID_NONE;
  }
  kv_heap_remove(e, b);
}

/* The newest block is offered only when no other block of its priority
 * class is held: it is the leaf a chain being stored grows from (the core
 * stores a chain a block at a time), and once-used blocks rank first, so
 * without this rule a tier full of blocks used again would cut every new
 * chain at its first block. The next best is the smaller of the root's
 * children, if it is of the same priority class (a lower class always goes
 * first). */
static kv_block *reuse_peek(kv_evict *e) {
  kv_heap *h = e->priv;
  kv_block *b = kv_heap_peek(e);
  if (b && b->id == h->newest.id && h->n > 1) {
    uint32_t i = h->n > 2 && kv_heap_key(e, h, 2) < kv_heap_key(e, h, 1) ? 2 : 1;
    if (kv_heap_key(e, h, i) >> 56 == b->prio)
      b = kv_index_at(e->ix, h->v[i]); /* same class only */
  }
  h->offered = b ? b->id : KV_BID_NONE;
  return b;
}

const kv_evict_ops kv_evict_reuse_ops = {
    "reuse",
    "blocks used once go first, then blocks used again (or evicted lately and back), each in LRU "
    "order",
    init_reuse,
    kv_heap_fini,
    reuse_add,
    reuse_remove,
    kv_heap_touch,
    reuse_peek,
    NULL,
    NULL,
    NULL,
    NULL,
};
