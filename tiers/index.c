/* index.c - the block index (see index.h). */
#include "tiers/index.h"
#include "tiers/probe.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "proto/errors.h"

#define MIN_TABLE 64u

static inline uint64_t key_hash(uint32_t ns, const uint8_t *key, unsigned len) {
  return XXH3_64bits_withSeed(key, len, ns);
}

static uint32_t pow2_at_least(uint64_t n) {
  uint64_t p = MIN_TABLE;
  while (p < n) p <<= 1;
  return p > (1u << 31) ? (1u << 31) : (uint32_t)p;
}

static void table_clear(kv_index_slot *t, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) t[i].bid = KV_BID_NONE, t[i].tag = 0;
}

int kv_index_init(kv_index *ix, uint32_t hint) {
  memset(ix, 0, sizeof *ix);
  uint32_t n = pow2_at_least((uint64_t)hint * 4 / 3 + 1);
  ix->tab = malloc((size_t)n * sizeof *ix->tab);
  if (!ix->tab) return -ENOMEM;
  table_clear(ix->tab, n);
  ix->mask = n - 1;
  ix->free_head = KV_BID_NONE;
  return 0;
}

void kv_index_fini(kv_index *ix) {
  for (uint32_t i = 0; i < ix->nchunks; i++) free(ix->chunks[i]);
  free(ix->chunks);
  free(ix->tab);
  memset(ix, 0, sizeof *ix);
  ix->free_head = KV_BID_NONE;
}

static inline int rec_matches(const kv_block *b, uint32_t ns, const uint8_t *key,
                              unsigned len) {
  return b->ns == ns && b->keylen == len && memcmp(b->key, key, len) == 0;
}

/* Position of (ns,key) in the table, or of the empty slot ending its run. */
static inline uint32_t probe(const kv_index *ix, uint64_t h, uint32_t ns,
                             const uint8_t *key, unsigned len, int *found) {
  uint32_t tag = (uint32_t)(h >> 32);
  uint32_t i = (uint32_t)h & ix->mask;
  for (;;) {
    const kv_index_slot *s = &ix->tab[i];
    if (s->bid == KV_BID_NONE) { *found = 0; return i; }
    if (s->tag == tag && rec_matches(kv_index_at(ix, s->bid), ns, key, len)) {
      *found = 1;
      return i;
    }
    i = (i + 1) & ix->mask;
  }
}

kv_block *kv_index_find(const kv_index *ix, uint32_t ns, const uint8_t *key,
                        unsigned keylen) {
  if (keylen == 0 || keylen > KV_KEY_MAX || !ix->tab) return NULL;
  int found;
  uint32_t i = probe(ix, key_hash(ns, key, keylen), ns, key, keylen, &found);
  return found ? kv_index_at(ix, ix->tab[i].bid) : NULL;
}

static int table_grow(kv_index *ix) {
  uint32_t n = (ix->mask + 1) * 2;
  if (n == 0) return -ENOMEM;
  kv_index_slot *t = malloc((size_t)n * sizeof *t);
  if (!t) return -ENOMEM;
  table_clear(t, n);
  for (uint32_t i = 0; i <= ix->mask; i++) {
    kv_bid id = ix->tab[i].bid;
    if (id == KV_BID_NONE) continue;
    const kv_block *b = kv_index_at(ix, id);
    uint64_t h = key_hash(b->ns, b->key, b->keylen);
    uint32_t j = (uint32_t)h & (n - 1);
    while (t[j].bid != KV_BID_NONE) j = (j + 1) & (n - 1);
    t[j].tag = (uint32_t)(h >> 32);
    t[j].bid = id;
  }
  free(ix->tab);
  ix->tab = t;
  ix->mask = n - 1;
  return 0;
}

static int record_alloc(kv_index *ix, kv_block **out) {
  if (ix->free_head != KV_BID_NONE) {
    kv_block *b = kv_index_at(ix, ix->free_head);
    ix->free_head = b->next;
    *out = b;
    return 0;
  }
  if (ix->hiwater == KV_BID_NONE - 1) return -ENOMEM;
  if ((ix->hiwater & (KV_INDEX_CHUNK - 1)) == 0) {
    uint32_t c = ix->hiwater >> KV_INDEX_CHUNK_SHIFT;
    if (c == ix->nchunks) {
      kv_block **nc = realloc(ix->chunks, (size_t)(c + 1) * sizeof *nc);
      if (!nc) return -ENOMEM;
      ix->chunks = nc;
      nc[c] = malloc((size_t)KV_INDEX_CHUNK * sizeof(kv_block));
      if (!nc[c]) return -ENOMEM;
      ix->nchunks = c + 1;
    }
  }
  kv_bid id = ix->hiwater++;
  *out = &ix->chunks[id >> KV_INDEX_CHUNK_SHIFT][id & (KV_INDEX_CHUNK - 1)];
  (*out)->id = id;
  return 0;
}

int kv_index_insert(kv_index *ix, uint32_t ns, const uint8_t *key,
                    unsigned keylen, kv_block **out) {
  if (keylen == 0 || keylen > KV_KEY_MAX) return -EINVAL;
  uint64_t h = key_hash(ns, key, keylen);
  int found;
  uint32_t i = probe(ix, h, ns, key, keylen, &found);
  if (found) {
    *out = kv_index_at(ix, ix->tab[i].bid);
    return KV_EEXISTS;
  }
  /* Keep the load factor at or under 3/4. */
  if ((uint64_t)(ix->count + 1) * 4 > (uint64_t)(ix->mask + 1) * 3) {
    int rc = table_grow(ix);
    if (rc) return rc;
    i = probe(ix, h, ns, key, keylen, &found);
  }
  kv_block *b;
  int rc = record_alloc(ix, &b);
  if (rc) return rc;
  kv_bid id = b->id;
  memset(b, 0, sizeof *b);
  b->id = id;
  memcpy(b->key, key, keylen);
  b->keylen = (uint8_t)keylen;
  b->ns = ns;
  b->state = KV_BS_WRITING;
  b->prio = KV_PRIO_DEFAULT;
  for (int t = 0; t < KV_NTIERS; t++) b->slot[t] = b->hpos[t] = KV_SLOT_NONE;
  b->parent = b->child = b->next = b->prev = KV_BID_NONE;
  ix->tab[i].tag = (uint32_t)(h >> 32);
  ix->tab[i].bid = id;
  ix->count++;
  *out = b;
  return 0;
}

static void unlink_from_parent(kv_index *ix, kv_block *b) {
  kv_block *p = kv_index_at(ix, b->parent);
  if (!p) return;
  if (b->prev != KV_BID_NONE) kv_index_at(ix, b->prev)->next = b->next;
  else p->child = b->next;
  if (b->next != KV_BID_NONE) kv_index_at(ix, b->next)->prev = b->prev;
  b->parent = b->next = b->prev = KV_BID_NONE;
}

int kv_index_link(kv_index *ix, kv_block *b, kv_block *parent) {
  if (b->parent != KV_BID_NONE || parent == b || parent->ns != b->ns ||
      parent->state == KV_BS_FREE)
    return -EINVAL;
  /* Refuse a cycle: b must not be an ancestor of parent. */
  for (kv_block *a = parent; a; a = kv_index_at(ix, a->parent))
    if (a == b) return -EINVAL;
  b->parent = parent->id;
  b->prev = KV_BID_NONE;
  b->next = parent->child;
  if (parent->child != KV_BID_NONE) kv_index_at(ix, parent->child)->prev = b->id;
  parent->child = b->id;
  return 0;
}

int kv_index_remove(kv_index *ix, kv_block *b) {
  if (b->tiers || b->busy || b->pins || b->inpol) return -EBUSY;
  int found;
  uint32_t i = probe(ix, key_hash(b->ns, b->key, b->keylen), b->ns, b->key,
                     b->keylen, &found);
  if (!found || ix->tab[i].bid != b->id) return -ENOENT;

  unlink_from_parent(ix, b);
  for (kv_bid c = b->child; c != KV_BID_NONE;) {
    kv_block *cb = kv_index_at(ix, c);
    c = cb->next;
    cb->parent = cb->next = cb->prev = KV_BID_NONE;
  }
  b->child = KV_BID_NONE;

  /* Backward-shift deletion keeps every probe run unbroken. */
  uint32_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & ix->mask;
    kv_index_slot *s = &ix->tab[j];
    if (s->bid == KV_BID_NONE) break;
    const kv_block *o = kv_index_at(ix, s->bid);
    uint32_t home = (uint32_t)key_hash(o->ns, o->key, o->keylen) & ix->mask;
    if (!kv_probe_stays(hole, j, home)) {
      ix->tab[hole] = *s;
      hole = j;
    }
  }
  ix->tab[hole].bid = KV_BID_NONE;
  ix->tab[hole].tag = 0;

  b->state = KV_BS_FREE;
  b->next = ix->free_head;
  ix->free_head = b->id;
  ix->count--;
  return 0;
}

int kv_index_foreach(kv_index *ix, int (*fn)(kv_block *b, void *arg), void *arg) {
  for (kv_bid id = 0; id < ix->hiwater; id++) {
    kv_block *b = kv_index_at(ix, id);
    if (b->state == KV_BS_FREE) continue;
    int rc = fn(b, arg);
    if (rc) return rc;
  }
  return 0;
}

size_t kv_index_memory(const kv_index *ix) {
  return (size_t)(ix->mask + 1) * sizeof(kv_index_slot) +
         (size_t)ix->nchunks * (KV_INDEX_CHUNK * sizeof(kv_block) + sizeof(kv_block *));
}
