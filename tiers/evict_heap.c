/*
 * evict_heap.c - policies that rank evictable blocks by a score kept in a
 * binary min-heap: O(log n) add, remove and touch, O(1) peek.
 *
 *   lru   least recently used: score = last access time.
 *   lru2  LRU-K with K = 2 (O'Neil et al.): blocks seen once go first, in
 *         LRU order; then blocks by the time of their second-to-last access.
 *         A block used once (most of a prompt's tail) cannot push out a
 *         block that is used again and again (a shared system prompt).
 *
 * Both put the priority class in the top byte of the score, so a lower
 * class always goes first. b->hpos[tier] is the block's heap position.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict.h"

typedef struct heap_ent {
  uint64_t key;
  kv_bid bid;
} heap_ent;

typedef struct heap heap;
struct heap {
  heap_ent *v;
  uint32_t n, cap;
  uint64_t age; /* lfuda: the score of the last block offered as victim */
  uint64_t (*score)(const heap *h, const kv_block *b);
};

#define TIME_MASK ((1ull << 55) - 1)

static uint64_t score_lru(const heap *h, const kv_block *b) {
  return ((uint64_t)b->prio << 56) | (b->atime & TIME_MASK);
}

static uint64_t score_lru2(const heap *h, const kv_block *b) {
  uint64_t seen_twice = b->hits >= 2;
  uint64_t t = seen_twice ? b->atime2 : b->atime;
  return ((uint64_t)b->prio << 56) | (seen_twice << 55) | (t & TIME_MASK);
}

/* LFU with dynamic aging (Arlitt et al.): hits plus the age of the cache
 * when the block was last used, so old popularity fades. */
static uint64_t score_lfuda(const heap *h, const kv_block *b) {
  return ((uint64_t)b->prio << 56) | ((h->age + b->hits) & TIME_MASK);
}

static inline void place(kv_evict *e, heap *h, uint32_t i, heap_ent x) {
  h->v[i] = x;
  kv_index_at(e->ix, x.bid)->hpos[e->tier] = i;
}

static void sift_up(kv_evict *e, heap *h, uint32_t i) {
  heap_ent x = h->v[i];
  while (i > 0) {
    uint32_t p = (i - 1) / 2;
    if (h->v[p].key <= x.key) break;
    place(e, h, i, h->v[p]);
    i = p;
  }
  place(e, h, i, x);
}

static void sift_down(kv_evict *e, heap *h, uint32_t i) {
  heap_ent x = h->v[i];
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = x.key;
    if (l < h->n && h->v[l].key < mk) m = l, mk = h->v[l].key;
    if (l + 1 < h->n && h->v[l + 1].key < mk) m = l + 1;
    if (m == i) break;
    place(e, h, i, h->v[m]);
    i = m;
  }
  place(e, h, i, x);
}

static int heap_init(kv_evict *e, uint64_t (*score)(const heap *, const kv_block *)) {
  heap *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->score = score;
  e->priv = h;
  return 0;
}
static int init_lru(kv_evict *e) { return heap_init(e, score_lru); }
static int init_lru2(kv_evict *e) { return heap_init(e, score_lru2); }
static int init_lfuda(kv_evict *e) { return heap_init(e, score_lfuda); }

static void heap_fini(kv_evict *e) {
  heap *h = e->priv;
  if (h) free(h->v);
  free(h);
  e->priv = NULL;
}

static int heap_add(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  if (h->n == h->cap) {
    uint32_t cap = h->cap ? h->cap * 2 : 256;
    heap_ent *v = realloc(h->v, (size_t)cap * sizeof *v);
    if (!v) return -ENOMEM;
    h->v = v;
    h->cap = cap;
  }
  h->v[h->n] = (heap_ent){h->score(h, b), b->id};
  sift_up(e, h, h->n++);
  e->count++;
  return 0;
}

static void heap_remove(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  uint32_t i = b->hpos[e->tier];
  b->hpos[e->tier] = KV_SLOT_NONE;
  e->count--;
  if (--h->n == i) return;
  uint64_t gone = h->v[i].key;
  h->v[i] = h->v[h->n];
  if (h->v[i].key < gone) sift_up(e, h, i);
  else sift_down(e, h, i);
}

static void heap_touch(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  uint32_t i = b->hpos[e->tier];
  uint64_t k = h->score(h, b);
  uint64_t old = h->v[i].key;
  h->v[i].key = k;
  if (k < old) sift_up(e, h, i);
  else sift_down(e, h, i);
}

static kv_block *heap_peek(kv_evict *e) {
  heap *h = e->priv;
  if (!h->n) return NULL;
  h->age = h->v[0].key & TIME_MASK;
  return kv_index_at(e->ix, h->v[0].bid);
}

const kv_evict_ops kv_evict_lru_ops = {
    "lru", "least recently used (leaf-first, by priority class)",
    init_lru, heap_fini, heap_add, heap_remove, heap_touch, heap_peek, NULL,
};

const kv_evict_ops kv_evict_lru2_ops = {
    "lru2", "LRU-2: once-used blocks first, then by second-to-last use",
    init_lru2, heap_fini, heap_add, heap_remove, heap_touch, heap_peek, NULL,
};

const kv_evict_ops kv_evict_lfuda_ops = {
    "lfuda", "LFU with dynamic aging: by use count, old popularity fading",
    init_lfuda, heap_fini, heap_add, heap_remove, heap_touch, heap_peek, NULL,
};
