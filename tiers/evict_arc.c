/*
 * evict_arc.c - ARC, the adaptive replacement cache (Megiddo & Modha,
 * FAST'03), over the evictable blocks the core hands it.
 *
 *   T1  blocks seen once lately          (LRU order, by last access)
 *   T2  blocks seen at least twice       (LRU order)
 *   B1  ghosts of T1's victims, B2 ghosts of T2's victims: fingerprints
 *       only (kv_ghost), each bounded by the tier's capacity c.
 *   p   the target size of T1: a ghost hit in B1 says T1 was too small
 *       (p grows by max(|B2|/|B1|, 1)); one in B2 says T2 was (p shrinks
 *       by max(|B1|/|B2|, 1)), exactly as in the paper.
 *
 * Eviction takes T1's LRU block when |T1| > p, else T2's. Two departures,
 * both forced by the core's contract: the lowest priority class present
 * goes first whatever the lists say, and only evictable blocks (leaves of
 * their chains, unpinned) are in T1/T2, so |T1| + |T2| is at most c rather
 * than exactly c. A block that comes back to the policy (unpinned, or a
 * parent whose last child left) is not a new arrival: it returns to T2 if
 * the core has seen it used twice (b->hits >= 2), else to T1.
 * Per block: the heap entry (16 bytes) while held; ghosts ~9-14 bytes per
 * remembered key, at most 2c of them.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict_impl.h"

enum { Q_T1 = 1, Q_T2 = 2 };

typedef struct arc {
  kv_pq t1, t2;
  kv_ghost b1, b2;
  uint32_t p, c, peak;
  kv_bid offered;
} arc;

static uint32_t arc_cap(kv_evict *e, arc *a) {
  if (e->capacity) return e->capacity;
  uint32_t c = 64;
  while (c < a->peak) c <<= 1;
  return c;
}

static int arc_init(kv_evict *e) {
  arc *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->t1.id = Q_T1;
  a->t2.id = Q_T2;
  a->offered = KV_BID_NONE;
  e->priv = a;
  a->c = arc_cap(e, a);
  if (kv_ghost_size(&a->b1, a->c) || kv_ghost_size(&a->b2, a->c)) {
    kv_ghost_free(&a->b1);
    free(a);
    e->priv = NULL;
    return -ENOMEM;
  }
  return 0;
}

static void arc_fini(kv_evict *e) {
  arc *a = e->priv;
  if (!a) return;
  kv_pq_free(&a->t1);
  kv_pq_free(&a->t2);
  kv_ghost_free(&a->b1);
  kv_ghost_free(&a->b2);
  free(a);
  e->priv = NULL;
}

static inline uint64_t lru_key(const kv_block *b) { return KV_PQ_KEY(b->prio, b->atime); }

static kv_pq *queue_of(arc *a, const kv_block *b, kv_tier t) {
  return KV_PQ_ID(b->hpos[t]) == Q_T1 ? &a->t1 : &a->t2;
}

static int arc_add(kv_evict *e, kv_block *b) {
  arc *a = e->priv;
  if (++e->count > a->peak) a->peak = e->count;
  uint32_t c = arc_cap(e, a);
  if (c != a->c) { /* capacity learnt from the peak: resize (forgets ghosts) */
    a->c = c;
    if (kv_ghost_size(&a->b1, c) || kv_ghost_size(&a->b2, c)) { /* ghosts off */
    }
    if (a->p > c) a->p = c;
  }
  kv_pq *q = b->hits >= 2 ? &a->t2 : &a->t1;
  if (b->hits <= 1) { /* a new arrival: was it a recent victim? */
    uint32_t fp = kv_fingerprint(b);
    uint32_t n1 = a->b1.live, n2 = a->b2.live;
    if (kv_ghost_take(&a->b1, fp)) {
      uint32_t d = n2 > n1 ? n2 / (n1 ? n1 : 1) : 1;
      a->p = a->p + d > c ? c : a->p + d;
      q = &a->t2;
    } else if (kv_ghost_take(&a->b2, fp)) {
      uint32_t d = n1 > n2 ? n1 / (n2 ? n2 : 1) : 1;
      a->p = a->p > d ? a->p - d : 0;
      q = &a->t2;
    }
  }
  int rc = kv_pq_push(e, q, b, lru_key(b), 0);
  if (rc) e->count--;
  return rc;
}

static void arc_remove(kv_evict *e, kv_block *b) {
  arc *a = e->priv;
  kv_pq *q = queue_of(a, b, e->tier);
  kv_pq_del(e, q, b);
  e->count--;
  if (b->id == a->offered) { /* evicted: remember it */
    kv_ghost_add(q == &a->t1 ? &a->b1 : &a->b2, kv_fingerprint(b));
    a->offered = KV_BID_NONE;
  }
}

static void arc_touch(kv_evict *e, kv_block *b) {
  arc *a = e->priv;
  kv_pq *q = queue_of(a, b, e->tier);
  if (q == &a->t1 && b->hits >= 2) { /* second use: T1 -> T2 */
    kv_pq_del(e, q, b);
    if (kv_pq_push(e, &a->t2, b, lru_key(b), 0) == 0) return;
    kv_pq_push(e, q, b, lru_key(b), 0); /* t1 just shrank: has room */
    return;
  }
  kv_pq_rekey(e, q, b, lru_key(b));
}

static kv_block *arc_peek(kv_evict *e) {
  arc *a = e->priv;
  kv_pq *qs[2] = {&a->t1, &a->t2};
  unsigned cls = kv_pq_min_class(qs, 2);
  if (cls > 255) return NULL;
  kv_pq *q;
  if (!kv_pq_top_in(&a->t2, cls)) q = &a->t1;
  else if (!kv_pq_top_in(&a->t1, cls)) q = &a->t2;
  else q = a->t1.n > a->p ? &a->t1 : &a->t2;
  a->offered = kv_pq_top(q)->bid;
  return kv_index_at(e->ix, a->offered);
}

const kv_evict_ops kv_evict_arc_ops = {
    "arc",     "ARC: recency and frequency lists sized by ghost hits (Megiddo & Modha)",
    arc_init,  arc_fini,
    arc_add,   arc_remove,
    arc_touch, arc_peek,
    NULL,      NULL,
    NULL,
    NULL,
};
