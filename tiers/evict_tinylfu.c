/*
 * evict_tinylfu.c - W-TinyLFU (Einziger, Friedman & Manes, "TinyLFU: A
 * Highly Efficient Cache Admission Policy", ACM ToS 2017; the policy of
 * Caffeine), over the evictable blocks the core hands it.
 *
 *   W  window: new arrivals, LRU, 1% of the held blocks (the paper's and
 *      Caffeine's default: enough to absorb bursts of brand-new blocks).
 *   P  probation and R protected: the main cache, a segmented LRU (Karedla
 *      et al. 1994); a block used while in P moves to R; R keeps at most
 *      80% of the main cache (SLRU's usual split, also Caffeine's).
 *   F  a count-min sketch of 4-bit counters over the fingerprints of every
 *      access, one counter per block of the tier's capacity, halved after
 *      10 x that many accesses (TinyLFU's reset: popularity fades).
 *
 * When W is over its share, W's LRU block (the candidate) and the main
 * cache's victim (P's LRU, else R's) duel: the candidate is admitted to P
 * only if F estimates it used more often, else it is the one evicted. A
 * block used once - most of a prompt's tail - cannot push out a shared
 * prefix used by many requests, yet a block that becomes popular gets in.
 *
 * Prefix chains: the core hands only leaves to a policy, and every access
 * to a chain passes through its root, so F sees a shared prefix's blocks
 * as often as the requests that share it: the chain structure reaches the
 * duel through the frequencies without a separate signal.
 *
 * Contract: all three queues are keyed class-first and only heads of the
 * lowest class present are considered. A block that comes back (unpinned,
 * or a parent whose last child left) goes to the window again unless it
 * was in the main cache when it left (remembered in b->hpos): the window
 * then holds it by its old last access, so it is the next candidate and
 * must win its duel to stay.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict.h"

enum { Q_W = 1, Q_P = 2, Q_R = 3, Q_REMEMBERED = 14 };
#define WINDOW_PER_MILLE 10     /* W: 1% of the held blocks */
#define PROTECTED_PER_MILLE 800 /* R: at most 80% of the main cache */

typedef struct tlfu {
  kv_pq w, p, r;
  kv_sketch f;
  uint32_t peak;
  kv_bid cand; /* the block last moved from the window to probation */
} tlfu;

static uint32_t cap_of(kv_evict *e, tlfu *t) {
  return e->capacity ? e->capacity : t->peak > 64 ? t->peak : 64;
}

static int tlfu_init(kv_evict *e) {
  tlfu *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  t->w.id = Q_W, t->p.id = Q_P, t->r.id = Q_R;
  t->cand = KV_BID_NONE;
  if (kv_sketch_size(&t->f, cap_of(e, t))) {
    free(t);
    return -ENOMEM;
  }
  e->priv = t;
  return 0;
}

static void tlfu_fini(kv_evict *e) {
  tlfu *t = e->priv;
  if (!t) return;
  kv_pq_free(&t->w);
  kv_pq_free(&t->p);
  kv_pq_free(&t->r);
  kv_sketch_free(&t->f);
  free(t);
  e->priv = NULL;
}

static inline uint64_t lru_key(const kv_block *b) { return KV_PQ_KEY(b->prio, b->atime); }

static kv_pq *queue(tlfu *t, uint32_t id) {
  return id == Q_W ? &t->w : id == Q_P ? &t->p : &t->r;
}

/* Moves b from `from` to `to`; if `to` cannot grow, b stays in `from`. */
static void move(kv_evict *e, kv_pq *from, kv_pq *to, kv_block *b) {
  kv_pq_del(e, from, b);
  if (kv_pq_push(e, to, b, lru_key(b), 0)) kv_pq_push(e, from, b, lru_key(b), 0);
}

static int tlfu_add(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  if (++e->count > t->peak) {
    t->peak = e->count;
    if (!e->capacity && t->peak > t->f.width) kv_sketch_size(&t->f, t->peak);
  }
  uint32_t w = b->hpos[e->tier];
  kv_pq *q = &t->w;
  if (w != KV_SLOT_NONE && KV_PQ_ID(w) == Q_REMEMBERED && (w & 3) != Q_W) q = &t->p;
  else if (b->hits <= 1 && w == KV_SLOT_NONE) kv_sketch_add(&t->f, kv_fingerprint(b));
  int rc = kv_pq_push(e, q, b, lru_key(b), 0);
  if (rc) e->count--;
  return rc;
}

static void tlfu_remove(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  uint32_t id = KV_PQ_ID(b->hpos[e->tier]);
  kv_pq_del(e, queue(t, id), b);
  e->count--;
  b->hpos[e->tier] = ((uint32_t)Q_REMEMBERED << KV_PQ_SHIFT) | id;
}

static void tlfu_touch(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  kv_pq *q = queue(t, KV_PQ_ID(b->hpos[e->tier]));
  kv_sketch_add(&t->f, kv_fingerprint(b));
  if (q != &t->p) {
    kv_pq_rekey(e, q, b, lru_key(b));
    return;
  }
  move(e, &t->p, &t->r, b); /* used while on probation: protect it */
  uint64_t main = (uint64_t)t->p.n + t->r.n;
  while ((uint64_t)t->r.n * 1000 > main * PROTECTED_PER_MILLE && t->r.n > 1)
    move(e, &t->r, &t->p, kv_index_at(e->ix, kv_pq_top(&t->r)->bid));
}

/* How often b was used lately, as the sketch estimates it. */
static unsigned freq(tlfu *t, const kv_block *b) {
  return kv_sketch_get(&t->f, kv_fingerprint(b));
}

/* An access to a block valid in the tier that the policy does not hold
 * (an interior block of a chain, or a pinned one): counted all the same. */
static void tlfu_seen(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  kv_sketch_add(&t->f, kv_fingerprint(b));
}

static kv_block *tlfu_peek(kv_evict *e) {
  tlfu *t = e->priv;
  kv_pq *qs[3] = {&t->w, &t->p, &t->r};
  unsigned cls = kv_pq_min_class(qs, 3);
  if (cls > 255) return NULL;
  /* The window's excess goes to probation; the last one moved is the
   * candidate that must beat probation's LRU block to stay. */
  uint64_t wmax = (uint64_t)e->count * WINDOW_PER_MILLE / 1000;
  if (!wmax) wmax = 1;
  while (t->w.n > wmax && kv_pq_top_in(&t->w, cls)) {
    kv_block *b = kv_index_at(e->ix, kv_pq_top(&t->w)->bid);
    move(e, &t->w, &t->p, b);
    if (KV_PQ_ID(b->hpos[e->tier]) != Q_P) break; /* out of memory: stays */
    t->cand = b->id;
  }
  kv_pq *mq = kv_pq_top_in(&t->p, cls) ? &t->p : kv_pq_top_in(&t->r, cls) ? &t->r : NULL;
  if (!mq) return kv_index_at(e->ix, kv_pq_top(&t->w)->bid);
  kv_block *victim = kv_index_at(e->ix, kv_pq_top(mq)->bid);
  kv_block *cand = kv_index_at(e->ix, t->cand);
  if (!cand || cand == victim || cand->prio != cls ||
      KV_PQ_ID(cand->hpos[e->tier]) != Q_P)
    return victim;
  return freq(t, cand) > freq(t, victim) ? victim : cand;
}

const kv_evict_ops kv_evict_tinylfu_ops = {
    "tinylfu", "W-TinyLFU: 1% LRU window, SLRU main, frequency-sketch admission",
    tlfu_init, tlfu_fini, tlfu_add, tlfu_remove, tlfu_touch, tlfu_peek, tlfu_seen,
};
