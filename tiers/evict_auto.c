/*
 * evict_auto.c - "auto": two expert policies over the same blocks, and the
 * victim of whichever is doing better on the workload of the moment.
 *
 *   experts  lru (recency) and tinylfu (W-TinyLFU: frequency-filtered
 *            admission, evict_tinylfu.c). Both hold every evictable block
 *            of the tier and see every add, remove, touch and seen; only
 *            the one followed is asked for its victim (a peek may move
 *            blocks between a policy's queues, so the other is left alone).
 *            tinylfu keeps its per-block word in b->hpos[tier], as it does
 *            alone; lru keeps its heap positions in a side array indexed
 *            by block id (4 bytes per id up to the highest held).
 *   judge    miniature simulations (Waldspurger et al., "Cache Modeling
 *            and Optimization using Miniature Simulations", USENIX ATC'17):
 *            spatial sampling by hash at rate R = M / C, C the tier's
 *            capacity (kv_evict.capacity) and M = min(C, MINI_CAP) the
 *            miniature capacity; each expert runs, unchanged, as a cache of
 *            M blocks over the sampled accesses only. The unit sampled is
 *            a prefix tree (the hash of its root block), not a block: the
 *            tier evicts leaf-first, so a tree is what it caches, and a
 *            miniature that sampled blocks one by one would see none of
 *            the chains that protect interior blocks (measured: it then
 *            prefers lru where the real tier does better with tinylfu).
 *            A miniature keeps the rule too: only its leaves are offered
 *            to its expert; an access to an interior block is seen().
 *   switch   an access where one miniature hits and the other misses is a
 *            vote (the discordant pairs of McNemar's test); votes decay by
 *            half every 10 sampled accesses per miniature block (TinyLFU's
 *            sample period W = 10 C: the time over which its frequency
 *            history, too, is current). The followed expert changes when
 *            the other's lead passes McNemar's test with continuity
 *            correction, (|b - c| - 1)^2 > Z^2 (b + c), Z = 2 (two-sided
 *            5%, 1.96 rounded): hysteresis by significance, no tuned
 *            margin. lru is followed first (it was the default, and knows
 *            nothing it must learn).
 *
 * MINI_CAP bounds the cost: two miniatures of at most 1024 blocks each,
 * whatever C, their records in an index of their own (miniature i uses
 * hpos[i], rchild[i], bit i of `tiers` for "held" and of `inpol` for
 * "a leaf in its policy"). Below 1024 blocks of capacity R = 1: the
 * miniatures are full-size shadows.
 *
 * Accesses seen: touch and seen (a hit in the tier), and add of a block
 * the tier has never held (hpos NONE: a miss that brought it in). A block
 * that comes back to the policy (unpinned, a parent whose last child left,
 * loaded again from G3) is not counted again.
 *
 * With kv_evict.capacity 0 (unknown) there is nothing to scale the
 * miniatures by: auto then follows lru alone and runs no miniatures.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/evict_impl.h"

extern const kv_evict_ops kv_evict_lru_ops;
extern const kv_evict_ops kv_evict_tinylfu_ops;

enum { X_LRU = 0, X_TLFU = 1, NX = 2 };
static const kv_evict_ops *const experts[NX] = {&kv_evict_lru_ops, &kv_evict_tinylfu_ops};

#define MINI_CAP         1024 /* blocks per miniature cache at most (see EVICTION.md) */
#define PERIOD_PER_BLOCK 10   /* votes halve after 10 sampled accesses per miniature block */
#define SWITCH_Z         2.0  /* standard deviations the other expert must lead by */

typedef struct autop {
  /* expert lru over the real blocks: a min-heap of ids by (class, atime) */
  kv_bid *heap;
  uint32_t *pos; /* pos[id]: heap index of held block id */
  uint32_t n, cap, npos;
  kv_evict tl; /* expert tinylfu over the real blocks */
  /* the miniature simulations */
  int minis;    /* 1 when running */
  kv_index mix; /* records of sampled keys held by some miniature */
  kv_evict mini[NX];
  uint64_t sample;   /* a key is sampled when its hash * 2^-32 < sample * 2^-32 */
  uint32_t held[NX]; /* blocks each miniature holds (leaves or not) */
  uint64_t clock, seen, period;
  double votes[NX]; /* decayed: accesses where miniature i hit and the other missed */
  int cur;          /* the expert followed */
  uint64_t switches;
} autop;

/* ---- expert lru: the heap scored from the record, positions by id ----------- */

static inline uint64_t lru_score(const kv_block *b) {
  return ((uint64_t)b->prio << 56) | (b->atime & KV_ATIME_MASK);
}

static inline uint64_t score_at(kv_evict *e, autop *a, uint32_t i) {
  return lru_score(kv_index_at(e->ix, a->heap[i]));
}

static inline void put(autop *a, uint32_t i, kv_bid id) {
  a->heap[i] = id;
  a->pos[id] = i;
}

static void resift(kv_evict *e, autop *a, uint32_t i) {
  kv_bid x = a->heap[i];
  uint64_t k = lru_score(kv_index_at(e->ix, x));
  while (i > 0 && score_at(e, a, (i - 1) / 2) > k) {
    put(a, i, a->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = k;
    if (l < a->n && score_at(e, a, l) < mk) m = l, mk = score_at(e, a, l);
    if (l + 1 < a->n && score_at(e, a, l + 1) < mk) m = l + 1;
    if (m == i) break;
    put(a, i, a->heap[m]);
    i = m;
  }
  put(a, i, x);
}

static int heap_add(kv_evict *e, autop *a, kv_block *b) {
  if (kv_meta_grow((void **)&a->heap, &a->cap, (uint64_t)a->n + 1, sizeof *a->heap) ||
      kv_meta_grow((void **)&a->pos, &a->npos, (uint64_t)b->id + 1, sizeof *a->pos))
    return -ENOMEM;
  put(a, a->n++, b->id);
  resift(e, a, a->n - 1);
  return 0;
}

static void heap_del(kv_evict *e, autop *a, kv_block *b) {
  uint32_t i = a->pos[b->id];
  if (--a->n == i) return;
  put(a, i, a->heap[a->n]);
  resift(e, a, i);
}

/* ---- the miniature simulations --------------------------------------------- */

/* Spatial sampling by a hash of the key, independent of the fingerprint
 * bits the sketch and ghosts use (splitmix64's finaliser). */
static inline uint64_t sample_hash(const kv_block *b) {
  uint64_t z = kv_fingerprint(b) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) >> 32;
}

static int minis_init(autop *a, uint32_t capacity) {
  uint32_t m = capacity < MINI_CAP ? capacity : MINI_CAP;
  a->sample = ((uint64_t)m << 32) / capacity;
  a->period = (uint64_t)PERIOD_PER_BLOCK * m;
  if (kv_index_init(&a->mix, 2 * m)) return -ENOMEM;
  for (int i = 0; i < NX; i++) {
    a->mini[i].capacity = m;
    if (kv_evict_init(&a->mini[i], experts[i], &a->mix, (kv_tier)i)) {
      while (i-- > 0) kv_evict_fini(&a->mini[i]);
      kv_index_fini(&a->mix);
      return -ENOMEM;
    }
  }
  a->minis = 1;
  return 0;
}

static void minis_fini(autop *a) {
  if (!a->minis) return;
  for (int i = 0; i < NX; i++) kv_evict_fini(&a->mini[i]);
  kv_index_fini(&a->mix);
  a->minis = 0;
}

/* Miniature i stops holding m (evicted; m is a leaf there). Its parent, if
 * m was its last child held, becomes a leaf and comes back to the policy. */
static void mini_drop(autop *a, int i, kv_block *m) {
  kv_evict *me = &a->mini[i];
  me->ops->remove(me, m);
  m->hpos[i] = KV_SLOT_NONE; /* gone from this cache: new if it comes back */
  m->tiers &= (uint8_t) ~(1u << i);
  a->held[i]--;
  kv_block *p = m->parent != KV_BID_NONE ? kv_index_at(&a->mix, m->parent) : NULL;
  if (p && (p->tiers >> i & 1) && --p->rchild[i] == 0 && me->ops->add(me, p) == 0)
    p->inpol |= (uint8_t)(1u << i);
  if (!m->tiers) {
    m->inpol = 0;
    kv_index_remove(&a->mix, m);
  }
}

/* Miniature i holds m from now on, evicting leaves to make room. */
static void mini_hold(autop *a, int i, kv_block *m) {
  kv_evict *me = &a->mini[i];
  while (a->held[i] >= me->capacity) {
    kv_block *v = me->ops->peek(me);
    if (!v) return; /* no leaf offered (out of memory): m stays out */
    v->inpol &= (uint8_t) ~(1u << i);
    mini_drop(a, i, v);
  }
  kv_block *p = m->parent != KV_BID_NONE ? kv_index_at(&a->mix, m->parent) : NULL;
  if (me->ops->add(me, m)) return;
  m->tiers |= (uint8_t)(1u << i);
  m->inpol |= (uint8_t)(1u << i);
  a->held[i]++;
  if (p && (p->tiers >> i & 1) && p->rchild[i]++ == 0 && (p->inpol >> i & 1)) {
    me->ops->remove(me, p); /* no longer a leaf: out of the policy */
    p->inpol &= (uint8_t) ~(1u << i);
  }
}

/* The first block of rb's prefix chain in the real index. */
static const kv_block *root_of(const kv_index *ix, const kv_block *rb) {
  while (rb->parent != KV_BID_NONE) rb = kv_index_at(ix, rb->parent);
  return rb;
}

/* One access to a real block: if its prefix tree is sampled, replays it
 * through every miniature, counts the votes and follows the expert that
 * leads. */
static void observe(kv_evict *e, autop *a, const kv_block *rb) {
  if (!a->minis || sample_hash(root_of(e->ix, rb)) >= a->sample) return;
  kv_block *m = kv_index_find(&a->mix, rb->ns, rb->key, kv_block_keylen(rb));
  if (!m) {
    if (kv_index_insert(&a->mix, rb->ns, rb->key, kv_block_keylen(rb), &m))
      return; /* out of memory: unsampled */
    m->state = KV_BS_READY;
    m->hits = 0;
    m->inpol = 0;
    for (int i = 0; i < NX; i++) m->rchild[i] = 0;
    const kv_block *rp = rb->parent != KV_BID_NONE ? kv_index_at(e->ix, rb->parent) : NULL;
    kv_block *p = rp ? kv_index_find(&a->mix, rp->ns, rp->key, kv_block_keylen(rp)) : NULL;
    if (p) kv_index_link(&a->mix, m, p);
  }
  m->atime = ++a->clock & KV_ATIME_MASK;
  if (m->hits != KV_HITS_MAX) m->hits++;
  m->prio = rb->prio;
  int hit[NX];
  for (int i = 0; i < NX; i++) {
    kv_evict *me = &a->mini[i];
    hit[i] = (m->tiers >> i) & 1;
    if (!hit[i]) mini_hold(a, i, m);
    else if (m->inpol >> i & 1) me->ops->touch(me, m);
    else if (me->ops->seen) me->ops->seen(me, m);
  }
  if (!m->tiers) kv_index_remove(&a->mix, m);
  if (hit[X_LRU] != hit[X_TLFU]) a->votes[hit[X_TLFU] ? X_TLFU : X_LRU] += 1;
  int other = 1 - a->cur;
  double lead = a->votes[other] - a->votes[a->cur];
  if (lead > 1 &&
      (lead - 1) * (lead - 1) > SWITCH_Z * SWITCH_Z * (a->votes[other] + a->votes[a->cur])) {
    a->cur = other;
    a->switches++;
  }
  if (++a->seen < a->period) return;
  a->seen = 0;
  for (int i = 0; i < NX; i++) a->votes[i] *= 0.5;
}

/* ---- the policy -------------------------------------------------------------- */

static int auto_init(kv_evict *e) {
  autop *a = kv_meta_calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->tl.capacity = e->capacity;
  if (kv_evict_init(&a->tl, &kv_evict_tinylfu_ops, e->ix, e->tier)) goto err;
  if (e->capacity && minis_init(a, e->capacity)) {
    kv_evict_fini(&a->tl);
    goto err;
  }
  a->cur = X_LRU;
  e->priv = a;
  return 0;
err:
  kv_meta_free(a);
  return -ENOMEM;
}

static void auto_fini(kv_evict *e) {
  autop *a = e->priv;
  if (!a) return;
  kv_evict_fini(&a->tl);
  minis_fini(a);
  kv_meta_free(a->heap);
  kv_meta_free(a->pos);
  kv_meta_free(a);
  e->priv = NULL;
}

static int auto_add(kv_evict *e, kv_block *b) {
  autop *a = e->priv;
  int fresh = b->hpos[e->tier] == KV_SLOT_NONE;
  if (heap_add(e, a, b)) return -ENOMEM;
  if (a->tl.ops->add(&a->tl, b)) {
    heap_del(e, a, b);
    return -ENOMEM;
  }
  e->count++;
  if (fresh) observe(e, a, b);
  return 0;
}

static void auto_remove(kv_evict *e, kv_block *b) {
  autop *a = e->priv;
  heap_del(e, a, b);
  a->tl.ops->remove(&a->tl, b);
  e->count--;
}

static void auto_touch(kv_evict *e, kv_block *b) {
  autop *a = e->priv;
  resift(e, a, a->pos[b->id]);
  a->tl.ops->touch(&a->tl, b);
  observe(e, a, b);
}

static void auto_seen(kv_evict *e, kv_block *b) {
  autop *a = e->priv;
  a->tl.ops->seen(&a->tl, b);
  observe(e, a, b);
}

static kv_block *auto_peek(kv_evict *e) {
  autop *a = e->priv;
  if (a->cur == X_TLFU) return a->tl.ops->peek(&a->tl);
  return a->n ? kv_index_at(e->ix, a->heap[0]) : NULL;
}

const char *kv_evict_auto_following(const kv_evict *e, uint64_t *switches) {
  const autop *a = e->priv;
  if (switches) *switches = a ? a->switches : 0;
  return a ? experts[a->cur]->name : NULL;
}

const kv_evict_ops kv_evict_auto_ops = {
    "auto",     "follows lru or tinylfu, whichever miniature simulations find better now",
    auto_init,  auto_fini,
    auto_add,   auto_remove,
    auto_touch, auto_peek,
    auto_seen,  NULL,
    NULL,
};
