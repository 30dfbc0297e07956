/* index.c - the block index (see index.h). */
#include "tiers/index.h"
#include "tiers/probe.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/errors.h"

#define MIN_TABLE 64u
#define MAX_TABLE UINT32_MAX

/* ---- the metadata allocator ------------------------------------------- */

static _Atomic size_t meta_bytes;

static void *meta_count(void *p) {
  if (p) atomic_fetch_add_explicit(&meta_bytes, malloc_usable_size(p), memory_order_relaxed);
  return p;
}
static void meta_uncount(void *p) {
  if (p) atomic_fetch_sub_explicit(&meta_bytes, malloc_usable_size(p), memory_order_relaxed);
}

void *kv_meta_malloc(size_t n) { return meta_count(malloc(n)); }
void *kv_meta_calloc(size_t n, size_t each) { return meta_count(calloc(n, each)); }
void kv_meta_free(void *p) {
  meta_uncount(p);
  free(p);
}
void *kv_meta_realloc(void *p, size_t n) {
  size_t was = p ? malloc_usable_size(p) : 0;
  void *q = realloc(p, n);
  if (!q) return NULL; /* p is untouched and still counted */
  atomic_fetch_sub_explicit(&meta_bytes, was, memory_order_relaxed);
  return meta_count(q);
}
size_t kv_meta_bytes(void) { return atomic_load_explicit(&meta_bytes, memory_order_relaxed); }

/* ---- the table -------------------------------------------------------- */

static inline uint64_t key_hash(uint32_t ns, const uint8_t *key, unsigned len) {
  return XXH3_64bits_withSeed(key, len, ns);
}

/* The tag: the hash's top byte, never 0 (which marks an empty slot). */
static inline uint8_t tag_of(uint64_t h) {
  uint8_t t = (uint8_t)(h >> 56);
  return t ? t : 1;
}

/* The home slot: the low half of the hash scaled to the table (Lemire's
 * multiply-shift), so the table can be any size. */
static inline uint32_t home_of(uint64_t h, uint32_t size) {
  return (uint32_t)(((uint64_t)(uint32_t)h * size) >> 32);
}

static inline uint32_t next_slot(uint32_t i, uint32_t size) { return ++i == size ? 0 : i; }

/* Slots for n records at a load of at most 4/5; 0 if too many. */
static uint32_t size_for(uint64_t n) {
  uint64_t s = n * 5 / 4 + 1;
  if (s < MIN_TABLE) s = MIN_TABLE;
  return s > MAX_TABLE ? 0 : (uint32_t)s;
}

int kv_index_init(kv_index *ix, uint32_t hint) {
  memset(ix, 0, sizeof *ix);
  ix->free_head = KV_BID_NONE;
  uint32_t n = size_for(hint);
  if (!n) return -ENOMEM;
  ix->tab = kv_meta_calloc(n, sizeof *ix->tab);
  if (!ix->tab) return -ENOMEM;
  ix->size = n;
  return 0;
}

void kv_index_fini(kv_index *ix) {
  for (uint32_t i = 0; i < ix->nchunks; i++) kv_meta_free(ix->chunks[i]);
  kv_meta_free(ix->chunks);
  kv_meta_free(ix->tab);
  kv_meta_free(ix->owner);
  memset(ix, 0, sizeof *ix);
  ix->free_head = KV_BID_NONE;
}

static inline int rec_matches(const kv_block *b, uint32_t ns, const uint8_t *key, unsigned len) {
  return b->ns == ns && kv_block_keylen(b) == len && memcmp(b->key, key, len) == 0;
}

/* Position of (ns,key) in the table, or of the empty slot ending its run. */
static inline uint32_t probe(const kv_index *ix, uint64_t h, uint32_t ns, const uint8_t *key,
                             unsigned len, int *found) {
  uint8_t tag = tag_of(h);
  uint32_t i = home_of(h, ix->size);
  for (;; i = next_slot(i, ix->size)) {
    const kv_index_slot *s = &ix->tab[i];
    if (s->tag == 0) {
      *found = 0;
      return i;
    }
    if (s->tag == tag && rec_matches(kv_index_at(ix, s->bid), ns, key, len)) {
      *found = 1;
      return i;
    }
  }
}

kv_block *kv_index_find(const kv_index *ix, uint32_t ns, const uint8_t *key, unsigned keylen) {
  if (keylen == 0 || keylen > KV_KEY_MAX || ns >= KV_NS_MAX || !ix->tab) return NULL;
  int found;
  uint32_t i = probe(ix, key_hash(ns, key, keylen), ns, key, keylen, &found);
  return found ? kv_index_at(ix, ix->tab[i].bid) : NULL;
}

/* Grows the table by a quarter (doubling would leave it half empty: the
 * point of a table of any size is to stay between 64% and 80% full). */
static int table_grow(kv_index *ix) {
  uint64_t want = (uint64_t)ix->size + ix->size / 4;
  if (want > MAX_TABLE) want = MAX_TABLE;
  uint32_t n = (uint32_t)want;
  if (n <= ix->size) return -ENOMEM;
  kv_index_slot *t = kv_meta_calloc(n, sizeof *t);
  if (!t) return -ENOMEM;
  for (uint32_t i = 0; i < ix->size; i++) {
    if (ix->tab[i].tag == 0) continue;
    kv_bid id = ix->tab[i].bid;
    const kv_block *b = kv_index_at(ix, id);
    uint32_t j = home_of(key_hash(b->ns, b->key, kv_block_keylen(b)), n);
    while (t[j].tag != 0) j = next_slot(j, n);
    t[j] = ix->tab[i];
  }
  kv_meta_free(ix->tab);
  ix->tab = t;
  ix->size = n;
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
      if (c == ix->capchunks) {
        uint32_t cap = ix->capchunks ? ix->capchunks * 2 : 16;
        kv_block **nc = kv_meta_realloc(ix->chunks, (size_t)cap * sizeof *nc);
        if (!nc) return -ENOMEM;
        ix->chunks = nc;
        ix->capchunks = cap;
      }
      ix->chunks[c] = kv_meta_malloc((size_t)KV_INDEX_CHUNK * sizeof(kv_block));
      if (!ix->chunks[c]) return -ENOMEM;
      ix->nchunks = c + 1;
    }
  }
  kv_bid id = ix->hiwater++;
  *out = &ix->chunks[id >> KV_INDEX_CHUNK_SHIFT][id & (KV_INDEX_CHUNK - 1)];
  (*out)->id = id;
  return 0;
}

int kv_index_insert(kv_index *ix, uint32_t ns, const uint8_t *key, unsigned keylen,
                    kv_block **out) {
  if (keylen == 0 || keylen > KV_KEY_MAX || ns >= KV_NS_MAX) return -EINVAL;
  uint64_t h = key_hash(ns, key, keylen);
  int found;
  uint32_t i = probe(ix, h, ns, key, keylen, &found);
  if (found) {
    *out = kv_index_at(ix, ix->tab[i].bid);
    return KV_EEXISTS;
  }
  /* Keep the load factor at or under 4/5. */
  if ((uint64_t)(ix->count + 1) * 5 > (uint64_t)ix->size * 4) {
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
  kv_block_set_keylen(b, keylen);
  b->ns = (uint16_t)ns;
  b->state = KV_BS_WRITING;
  b->prio = KV_PRIO_DEFAULT;
  for (int t = 0; t < KV_NTIERS; t++) b->slot[t] = b->hpos[t] = KV_SLOT_NONE;
  b->parent = b->child = b->next = b->prev = KV_BID_NONE;
  ix->tab[i].tag = tag_of(h);
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
  if (b->parent != KV_BID_NONE || parent == b || parent->ns != b->ns || parent->state == KV_BS_FREE)
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
  uint32_t i = probe(ix, key_hash(b->ns, b->key, kv_block_keylen(b)), b->ns, b->key,
                     kv_block_keylen(b), &found);
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
    j = next_slot(j, ix->size);
    kv_index_slot *s = &ix->tab[j];
    if (s->tag == 0) break;
    const kv_block *o = kv_index_at(ix, s->bid);
    uint32_t home = home_of(key_hash(o->ns, o->key, kv_block_keylen(o)), ix->size);
    if (!kv_probe_stays(hole, j, home)) {
      ix->tab[hole] = *s;
      hole = j;
    }
  }
  ix->tab[hole].tag = 0;
  ix->tab[hole].bid = KV_BID_NONE;

  if (b->id < ix->nowner) ix->owner[b->id] = 0; /* the id may name another block next */
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
  return (size_t)ix->size * sizeof(kv_index_slot) +
         (size_t)ix->nchunks * KV_INDEX_CHUNK * sizeof(kv_block) +
         (size_t)ix->capchunks * sizeof(kv_block *);
}
