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
 * All put the priority class in the top byte of the score, so a lower
 * class always goes first. b->hpos[tier] is the block's heap position.
 *
 * The heap of lru and lru2 is 4 bytes per held block, the block's id: their
 * score is a function of the record (class, access times, hits), so it is
 * read from there when two entries are compared, and the core changes
 * those fields only before it calls touch. lfuda's score also holds the
 * cache's age when the block was last scored, which no record keeps, so
 * its heap stores the score beside the id (12 bytes).
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict.h"

typedef struct heap heap;
struct heap {
  kv_bid *v;     /* the heap, by block id */
  uint64_t *key; /* lfuda: the stored score of v[i]; NULL: scored from the record */
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

/* The score of the entry at i. */
static inline uint64_t key_at(const kv_evict *e, const heap *h, uint32_t i) {
  return h->key ? h->key[i] : h->score(h, kv_index_at(e->ix, h->v[i]));
}

static inline void place(kv_evict *e, heap *h, uint32_t i, kv_bid bid, uint64_t key) {
  h->v[i] = bid;
  if (h->key) h->key[i] = key;
  kv_index_at(e->ix, bid)->hpos[e->tier] = i;
}

/* Moves the entry at i (score k) up to its place. */
static uint32_t sift_up(kv_evict *e, heap *h, uint32_t i, uint64_t k) {
  kv_bid x = h->v[i];
  while (i > 0) {
    uint32_t p = (i - 1) / 2;
    uint64_t pk = key_at(e, h, p);
    if (pk <= k) break;
    place(e, h, i, h->v[p], pk);
    i = p;
  }
  place(e, h, i, x, k);
  return i;
}

/* Moves the entry at i (score k) down to its place. */
static void sift_down(kv_evict *e, heap *h, uint32_t i, uint64_t k) {
  kv_bid x = h->v[i];
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = k;
    if (l < h->n) {
      uint64_t lk = key_at(e, h, l);
      if (lk < mk) m = l, mk = lk;
    }
    if (l + 1 < h->n) {
      uint64_t rk = key_at(e, h, l + 1);
      if (rk < mk) m = l + 1, mk = rk;
    }
    if (m == i) break;
    place(e, h, i, h->v[m], mk);
    i = m;
  }
  place(e, h, i, x, k);
}

/* Restores the heap around i, whose score is now k (either way). */
static void resift(kv_evict *e, heap *h, uint32_t i, uint64_t k) {
  uint32_t j = sift_up(e, h, i, k);
  if (j == i) sift_down(e, h, i, k);
}

static int heap_init(kv_evict *e, uint64_t (*score)(const heap *, const kv_block *)) {
  heap *h = kv_meta_calloc(1, sizeof *h);
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
  if (h) kv_meta_free(h->v), kv_meta_free(h->key);
  kv_meta_free(h);
  e->priv = NULL;
}

/* Room for one more entry: grows by a quarter (at least 256), so a heap
 * is never more than a fifth empty once it has grown. */
static int heap_reserve(heap *h) {
  if (h->n < h->cap) return 0;
  uint64_t want = (uint64_t)h->cap + (h->cap / 4 > 256 ? h->cap / 4 : 256);
  if (want > UINT32_MAX) return -ENOMEM;
  uint32_t cap = (uint32_t)want;
  kv_bid *v = kv_meta_realloc(h->v, (size_t)cap * sizeof *v);
  if (!v) return -ENOMEM;
  h->v = v;
  if (h->score == score_lfuda) {
    uint64_t *k = kv_meta_realloc(h->key, (size_t)cap * sizeof *k);
    if (!k) return -ENOMEM; /* v is larger, cap unchanged: nothing lost */
    h->key = k;
  }
  h->cap = cap;
  return 0;
}

static int heap_add(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  if (heap_reserve(h)) return -ENOMEM;
  uint32_t i = h->n++;
  h->v[i] = b->id;
  sift_up(e, h, i, h->score(h, b));
  e->count++;
  return 0;
}

static void heap_remove(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  uint32_t i = b->hpos[e->tier];
  b->hpos[e->tier] = KV_SLOT_NONE;
  e->count--;
  if (--h->n == i) return;
  uint64_t k = key_at(e, h, h->n);
  h->v[i] = h->v[h->n];
  if (h->key) h->key[i] = k;
  resift(e, h, i, k);
}

static void heap_touch(kv_evict *e, kv_block *b) {
  heap *h = e->priv;
  resift(e, h, b->hpos[e->tier], h->score(h, b));
}

static kv_block *heap_peek(kv_evict *e) {
  heap *h = e->priv;
  if (!h->n) return NULL;
  h->age = key_at(e, h, 0) & TIME_MASK;
  return kv_index_at(e->ix, h->v[0]);
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
