/*
 * evict_tinylfu.c - W-TinyLFU (Einziger, Friedman & Manes, "TinyLFU: A
 * Highly Efficient Cache Admission Policy", ACM ToS 2017; the policy of
 * Caffeine), over the evictable blocks the core hands it.
 *
 *   W  window: new arrivals, LRU; 1% of the held blocks at first (the
 *      paper's and Caffeine's start), then moved by Caffeine's hill
 *      climber toward the share that raises the hit rate: a workload that
 *      rewards recency grows it (W-TinyLFU tends to LRU), one that rewards
 *      frequency shrinks it. It always keeps the newest block: that is the
 *      leaf a chain being stored grows from, and evicting it would leave
 *      its child without a parent.
 *   P  probation and R protected: the main cache, a segmented LRU (Karedla
 *      et al. 1994); a block used while in P moves to R; R keeps at most
 *      80% of the main cache (SLRU's usual split, also Caffeine's).
 *   F  TinyLFU's frequency filter (kv_sketch: doorkeeper and count-min
 *      sketch, sized and aged as Caffeine does) over every access.
 *
 * When W is over its share, W's LRU block (the candidate) moves to P and
 * duels the main cache's victim (P's LRU, else R's): the candidate is
 * evicted if F estimates it used less often than the victim, else the
 * victim goes and the candidate stays admitted. On a tie the more recent
 * block (the candidate) stays: equal evidence of frequency, and recency
 * is the better predictor then (TinyLFU admits only on strictly greater;
 * measured on the Mooncake trace, the tie rule is worth +0.3 to +0.8
 * points at 2-20% of capacity, see EVICTION.md). A block used once - most
 * of a prompt's tail - cannot push out a shared prefix used by many
 * requests, yet a block that becomes popular gets in.
 *
 * Prefix chains: the core hands only leaves to a policy and tells it (by
 * seen()) of every access to an interior block, so F counts every block of
 * a chain each time the chain is used: a block's count is at least the sum
 * of its children's (up to saturation and ageing), and the duel between
 * two leaves is a duel between the least popular ends of two chains.
 * Queues are ordered by the core's last access (atime), which a parent
 * shares with its most recent descendant.
 *
 * Contract: all three queues are keyed class-first and only heads of the
 * lowest class present are considered. A block that comes back (unpinned,
 * or a parent whose last child left) goes to the window again unless it
 * was in the main cache when it left (remembered in b->hpos), by its old
 * last access: a parent back in the window is the next candidate and must
 * win its duel to stay, so an unpopular chain is peeled to its popular
 * prefix.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict_impl.h"

enum { Q_W = 1, Q_P = 2, Q_R = 3, Q_REMEMBERED = 14 };
#define WINDOW_START        0.01 /* W: 1% of the held blocks at first */
#define PROTECTED_PER_MILLE 800  /* R: at most 80% of the main cache */
/* Caffeine's hill climber (BoundedLocalCache.climb): after every sample of
 * accesses (the sketch's: 10 per block of capacity) the window moves by
 * `step` (6.25% of the cache at first) in the direction that raised the
 * hit rate, the step shrinking by 2% each time and restarting at 6.25%
 * when the hit rate moves by 5 points or more (the workload changed). */
#define CLIMB_STEP          0.0625
#define CLIMB_DECAY         0.98
#define CLIMB_RESTART       0.05

typedef struct tlfu {
  kv_pq w, p, r;
  kv_sketch f;
  uint32_t peak, sized;  /* most blocks held; the capacity the sketch is sized for */
  kv_bid cand;           /* the window's block on probation, to duel */
  kv_bid offered;        /* the last victim peek() offered */
  double window;         /* W's share of the held blocks, 0..1 */
  double step;           /* the climber's next move, signed */
  double last_rate;      /* the previous sample's hit rate */
  uint32_t hits, misses; /* in the current sample */
} tlfu;

static uint32_t cap_of(kv_evict *e, tlfu *t) {
  return e->capacity ? e->capacity : t->peak > 64 ? t->peak : 64;
}

static int tlfu_init(kv_evict *e) {
  tlfu *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  t->w.id = Q_W, t->p.id = Q_P, t->r.id = Q_R;
  t->cand = t->offered = KV_BID_NONE;
  t->window = WINDOW_START;
  t->step = -CLIMB_STEP; /* Caffeine starts by trying a smaller window */
  t->sized = cap_of(e, t);
  if (kv_sketch_size(&t->f, t->sized)) {
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

/* The key of a block entering a queue's most recent end now. */
static inline uint64_t lru_key(const kv_block *b) { return KV_PQ_KEY(b->prio, b->atime); }

static kv_pq *queue(tlfu *t, uint32_t id) { return id == Q_W ? &t->w : id == Q_P ? &t->p : &t->r; }

/* Moves b from `from` to `to`; if `to` cannot grow, b stays in `from`.
 * 0 or -ENOMEM. */
static int move(kv_evict *e, kv_pq *from, kv_pq *to, kv_block *b) {
  kv_pq_del(e, from, b);
  if (kv_pq_push(e, to, b, lru_key(b), 0) == 0) return 0;
  kv_pq_push(e, from, b, lru_key(b), 0); /* it fitted there a moment ago */
  return -ENOMEM;
}

/* Counts one access (a hit or a miss) and, at the end of a sample, moves
 * the window toward the share that raised the hit rate. */
static void climb(tlfu *t, int hit) {
  if (hit) t->hits++;
  else t->misses++;
  uint64_t n = (uint64_t)t->hits + t->misses;
  if (n < t->f.sample) return;
  double rate = (double)t->hits / (double)n, change = rate - t->last_rate;
  double amount = change >= 0 ? t->step : -t->step;
  t->step = (change >= CLIMB_RESTART || change <= -CLIMB_RESTART)
                ? (amount >= 0 ? CLIMB_STEP : -CLIMB_STEP)
                : CLIMB_DECAY * amount;
  t->window += amount;
  if (t->window < 0) t->window = 0;
  if (t->window > 1) t->window = 1;
  t->last_rate = rate;
  t->hits = t->misses = 0;
}

static int tlfu_add(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  if (++e->count > t->peak) {
    t->peak = e->count;
    if (!e->capacity && t->peak > t->sized && kv_sketch_size(&t->f, t->peak) == 0)
      t->sized = t->peak;
  }
  uint32_t w = b->hpos[e->tier];
  kv_pq *q = &t->w;
  if (w == KV_SLOT_NONE) { /* a new block: it was a miss */
    kv_sketch_add(&t->f, kv_fingerprint(b));
    climb(t, 0);
  } else if (KV_PQ_ID(w) == Q_REMEMBERED) {
    /* Back after a while out (a parent whose last child left, or
     * unpinned): as recent as when it left, so at the least recent end -
     * of the window, to duel for admission next, if it never got into the
     * main cache; of probation otherwise. */
    if ((w & 3) != Q_W) q = &t->p;
  }
  int rc = kv_pq_push(e, q, b, lru_key(b), 0);
  if (rc) e->count--;
  return rc;
}

static void tlfu_remove(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  uint32_t id = KV_PQ_ID(b->hpos[e->tier]);
  kv_pq_del(e, queue(t, id), b);
  e->count--;
  /* The duel is over: the candidate lost (it goes), or won (the victim
   * goes, and the candidate stays on probation as an admitted block). */
  if (b->id == t->cand || b->id == t->offered) t->cand = KV_BID_NONE;
  b->hpos[e->tier] = ((uint32_t)Q_REMEMBERED << KV_PQ_SHIFT) | id;
}

static void tlfu_touch(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  kv_pq *q = queue(t, KV_PQ_ID(b->hpos[e->tier]));
  kv_sketch_add(&t->f, kv_fingerprint(b));
  climb(t, 1);
  if (q != &t->p) {
    kv_pq_rekey(e, q, b, lru_key(b));
    return;
  }
  if (b->id == t->cand) t->cand = KV_BID_NONE; /* used again: admitted */
  move(e, &t->p, &t->r, b);                    /* used while on probation: protect it */
  uint64_t main = (uint64_t)t->p.n + t->r.n;
  while ((uint64_t)t->r.n * 1000 > main * PROTECTED_PER_MILLE && t->r.n > 1)
    if (move(e, &t->r, &t->p, kv_index_at(e->ix, kv_pq_top(&t->r)->bid))) break;
}

/* How often b was used lately, as the sketch estimates it. */
static unsigned freq(tlfu *t, const kv_block *b) { return kv_sketch_get(&t->f, kv_fingerprint(b)); }

/* An access to a block valid in the tier that the policy does not hold
 * (an interior block of a chain, or a pinned one): counted all the same. */
static void tlfu_seen(kv_evict *e, kv_block *b) {
  tlfu *t = e->priv;
  kv_sketch_add(&t->f, kv_fingerprint(b));
  climb(t, 1);
}

static kv_block *tlfu_peek(kv_evict *e) {
  tlfu *t = e->priv;
  kv_pq *qs[3] = {&t->w, &t->p, &t->r};
  unsigned cls = kv_pq_min_class(qs, 3);
  if (cls > 255) return NULL;
  /* The window's excess goes to probation; the last one moved is the
   * candidate that must beat probation's LRU block to stay. */
  uint64_t wmax = (uint64_t)((double)e->count * t->window);
  if (wmax < 1) wmax = 1;
  while (t->w.n > wmax && kv_pq_top_in(&t->w, cls)) {
    kv_block *b = kv_index_at(e->ix, kv_pq_top(&t->w)->bid);
    if (move(e, &t->w, &t->p, b)) break; /* out of memory: stays */
    t->cand = b->id;
  }
  kv_pq *mq = kv_pq_top_in(&t->p, cls) ? &t->p : kv_pq_top_in(&t->r, cls) ? &t->r : NULL;
  kv_block *victim = kv_index_at(e->ix, kv_pq_top(mq ? mq : &t->w)->bid);
  kv_block *cand = kv_index_at(e->ix, t->cand);
  if (mq && cand && cand != victim && cand->prio == cls && KV_PQ_ID(cand->hpos[e->tier]) == Q_P &&
      freq(t, cand) < freq(t, victim))
    victim = cand;
  t->offered = victim->id;
  return victim;
}

double kv_evict_tinylfu_window(const kv_evict *e) {
  const tlfu *t = e->priv;
  return t ? t->window : 0;
}

const kv_evict_ops kv_evict_tinylfu_ops = {
    "tinylfu",  "W-TinyLFU: 1% LRU window, SLRU main, frequency-sketch admission",
    tlfu_init,  tlfu_fini,
    tlfu_add,   tlfu_remove,
    tlfu_touch, tlfu_peek,
    tlfu_seen,  NULL,
    NULL,
    NULL,
};
