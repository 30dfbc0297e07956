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
 *   judge    chain-aware miniature simulations (evict_mini.h) of the two
 *            experts, sampled by prefix tree, with votes that decay; the
 *            followed expert changes when the other's lead passes McNemar's
 *            test (hysteresis by significance, no tuned margin). lru is
 *            followed first (it was the default, and knows nothing it must
 *            learn).
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
#include "tiers/evict_mini.h"

extern const kv_evict_ops kv_evict_lru_ops;
extern const kv_evict_ops kv_evict_tinylfu_ops;

enum { X_LRU = 0, X_TLFU = 1, NX = 2 };
static const kv_evict_ops *const experts[NX] = {&kv_evict_lru_ops, &kv_evict_tinylfu_ops};

typedef struct autop {
  /* expert lru over the real blocks: a min-heap of ids by (class, atime) */
  kv_bid *heap;
  uint32_t *pos; /* pos[id]: heap index of held block id */
  uint32_t n, cap, npos;
  kv_evict tl; /* expert tinylfu over the real blocks */
  kv_minis mm; /* the judge */
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

/* ---- the policy -------------------------------------------------------------- */

static int auto_init(kv_evict *e) {
  autop *a = kv_meta_calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->tl.capacity = e->capacity;
  if (kv_evict_init(&a->tl, &kv_evict_tinylfu_ops, e->ix, e->tier)) goto err;
  if (kv_minis_init(&a->mm, experts, NX, e->capacity, KV_MINI_CAP, (1u << NX) - 1, e->ix)) {
    kv_evict_fini(&a->tl);
    goto err;
  }
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
  kv_minis_fini(&a->mm);
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
  if (fresh) kv_minis_observe(&a->mm, e->ix, b);
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
  kv_minis_observe(&a->mm, e->ix, b);
}

static void auto_seen(kv_evict *e, kv_block *b) {
  autop *a = e->priv;
  a->tl.ops->seen(&a->tl, b);
  kv_minis_observe(&a->mm, e->ix, b);
}

static kv_block *auto_peek(kv_evict *e) {
  autop *a = e->priv;
  if (a->mm.cur == X_TLFU) return a->tl.ops->peek(&a->tl);
  return a->n ? kv_index_at(e->ix, a->heap[0]) : NULL;
}

const char *kv_evict_auto_following(const kv_evict *e, uint64_t *switches) {
  const autop *a = e->priv;
  if (switches) *switches = a ? a->mm.switches : 0;
  return a ? experts[a->mm.cur]->name : NULL;
}

const kv_evict_ops kv_evict_auto_ops = {
    "auto",     "follows lru or tinylfu, whichever miniature simulations find better now",
    auto_init,  auto_fini,
    auto_add,   auto_remove,
    auto_touch, auto_peek,
    auto_seen,  NULL,
    NULL,
    NULL,
};
