/*
 * evict_heap.c - policies that rank evictable blocks by a score kept in a
 * binary min-heap: O(log n) add, remove and touch, O(1) peek.
 *
 *   lru   least recently used: score = last access time.
 *   lru2  LRU-K with K = 2 (O'Neil et al.): blocks seen once go first, in
 *         LRU order; then blocks by the time of their second-to-last access.
 *         The record keeps only the last access, so lru2 keeps, by block
 *         id, the last two access times it was told of (add, touch, seen:
 *         16 bytes per id up to the highest held).
 *         A block used once (most of a prompt's tail) cannot push out a
 *         block that is used again and again (a shared system prompt).
 *
 * All put the priority class in the top byte of the score, so a lower
 * class always goes first. b->hpos[tier] is the block's heap position.
 * The heap itself (evict_heap.h) is also the base of reuse (evict_reuse.c).
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

#include "tiers/evict_heap.h"

static uint64_t score_lru(const kv_heap *h, const kv_block *b) {
  return ((uint64_t)b->prio << 56) | (b->atime & KV_HEAP_TIME_MASK);
}

static uint64_t score_lru2(const kv_heap *h, const kv_block *b) {
  uint64_t seen_twice = b->hits >= 2;
  uint64_t t = seen_twice ? h->t[b->id].prev : b->atime;
  return ((uint64_t)b->prio << 56) | (seen_twice << 55) | (t & KV_HEAP_TIME_MASK);
}

/* LFU with dynamic aging (Arlitt et al.): hits plus the age of the cache
 * when the block was last used, so old popularity fades. */
static uint64_t score_lfuda(const kv_heap *h, const kv_block *b) {
  return ((uint64_t)b->prio << 56) | ((h->age + b->hits) & KV_HEAP_TIME_MASK);
}

static inline void place(kv_evict *e, kv_heap *h, uint32_t i, kv_bid bid, uint64_t key) {
  h->v[i] = bid;
  if (h->key) h->key[i] = key;
  kv_index_at(e->ix, bid)->hpos[e->tier] = i;
}

/* Moves the entry at i (score k) up to its place. */
static uint32_t sift_up(kv_evict *e, kv_heap *h, uint32_t i, uint64_t k) {
  kv_bid x = h->v[i];
  while (i > 0) {
    uint32_t p = (i - 1) / 2;
    uint64_t pk = kv_heap_key(e, h, p);
    if (pk <= k) break;
    place(e, h, i, h->v[p], pk);
    i = p;
  }
  place(e, h, i, x, k);
  return i;
}

/* Moves the entry at i (score k) down to its place. */
static void sift_down(kv_evict *e, kv_heap *h, uint32_t i, uint64_t k) {
  kv_bid x = h->v[i];
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = k;
    if (l < h->n) {
      uint64_t lk = kv_heap_key(e, h, l);
      if (lk < mk) m = l, mk = lk;
    }
    if (l + 1 < h->n) {
      uint64_t rk = kv_heap_key(e, h, l + 1);
      if (rk < mk) m = l + 1, mk = rk;
    }
    if (m == i) break;
    place(e, h, i, h->v[m], mk);
    i = m;
  }
  place(e, h, i, x, k);
}

/* Restores the heap around i, whose score is now k (either way). */
static void resift(kv_evict *e, kv_heap *h, uint32_t i, uint64_t k) {
  uint32_t j = sift_up(e, h, i, k);
  if (j == i) sift_down(e, h, i, k);
}

int kv_heap_init(kv_evict *e, uint64_t (*score)(const kv_heap *, const kv_block *)) {
  kv_heap *h = kv_meta_calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->score = score;
  e->priv = h;
  return 0;
}
static int init_lru(kv_evict *e) { return kv_heap_init(e, score_lru); }
static int init_lru2(kv_evict *e) { return kv_heap_init(e, score_lru2); }
static int init_lfuda(kv_evict *e) { return kv_heap_init(e, score_lfuda); }

void kv_heap_fini(kv_evict *e) {
  kv_heap *h = e->priv;
  if (h) {
    kv_meta_free(h->v), kv_meta_free(h->key);
    kv_meta_free(h->t);
    if (h->seen) kv_seen_free(h->seen), kv_meta_free(h->seen);
  }
  kv_meta_free(h);
  e->priv = NULL;
}

/* Room for one more entry: grows by a quarter (at least 256), so a heap
 * is never more than a fifth empty once it has grown. */
static int heap_reserve(kv_heap *h) {
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

int kv_heap_add(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  if (heap_reserve(h)) return -ENOMEM;
  uint32_t i = h->n++;
  h->v[i] = b->id;
  sift_up(e, h, i, h->score(h, b));
  e->count++;
  return 0;
}

void kv_heap_remove(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  uint32_t i = b->hpos[e->tier];
  b->hpos[e->tier] = KV_SLOT_NONE;
  e->count--;
  if (--h->n == i) return;
  uint64_t k = kv_heap_key(e, h, h->n);
  h->v[i] = h->v[h->n];
  if (h->key) h->key[i] = k;
  resift(e, h, i, k);
}

void kv_heap_touch(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  resift(e, h, b->hpos[e->tier], h->score(h, b));
}

kv_block *kv_heap_peek(kv_evict *e) {
  kv_heap *h = e->priv;
  if (!h->n) return NULL;
  h->age = kv_heap_key(e, h, 0) & KV_HEAP_TIME_MASK;
  return kv_index_at(e->ix, h->v[0]);
}

/* lru2: records b's access at b->atime, if it is new to the policy.
 * 0 or -ENOMEM. */
static int lru2_note(kv_heap *h, const kv_block *b) {
  uint32_t had = h->nids;
  if (kv_meta_grow((void **)&h->t, &h->nids, (uint64_t)b->id + 1, sizeof *h->t)) return -ENOMEM;
  for (uint32_t i = had; i < h->nids; i++) h->t[i].last = h->t[i].prev = 0;
  struct lru2_times *t = &h->t[b->id];
  if (t->last != b->atime) {
    t->prev = t->last ? t->last : b->atime;
    t->last = b->atime;
  }
  return 0;
}

static int lru2_add(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  if (b->hits < 2 && b->id < h->nids) h->t[b->id].last = h->t[b->id].prev = 0; /* a new record */
  return lru2_note(h, b) ? -ENOMEM : kv_heap_add(e, b);
}

static void lru2_touch(kv_evict *e, kv_block *b) {
  (void)lru2_note(e->priv, b); /* b was added, so its id is covered */
  kv_heap_touch(e, b);
}

static void lru2_seen(kv_evict *e, kv_block *b) {
  kv_heap *h = e->priv;
  if (b->id < h->nids) (void)lru2_note(h, b); /* never grows: b was held once, or is new */
}

const kv_evict_ops kv_evict_lru_ops = {
    "lru",         "least recently used (leaf-first, by priority class)",
    init_lru,      kv_heap_fini,
    kv_heap_add,   kv_heap_remove,
    kv_heap_touch, kv_heap_peek,
    NULL,          NULL,
    NULL,
    NULL,
};

const kv_evict_ops kv_evict_lru2_ops = {
    "lru2",     "LRU-2: once-used blocks first, then by second-to-last use",
    init_lru2,  kv_heap_fini,
    lru2_add,   kv_heap_remove,
    lru2_touch, kv_heap_peek,
    lru2_seen,  NULL,
    NULL,
    NULL,
};

const kv_evict_ops kv_evict_lfuda_ops = {
    "lfuda",       "LFU with dynamic aging: by use count, old popularity fading",
    init_lfuda,    kv_heap_fini,
    kv_heap_add,   kv_heap_remove,
    kv_heap_touch, kv_heap_peek,
    NULL,          NULL,
    NULL,
    NULL,
};
