/*
 * index.h - the block index: (namespace, key) -> block record.
 *
 * An open-addressing hash table (linear probing, backward-shift deletion,
 * no tombstones) over records kept in fixed chunks, so a record's address
 * never changes while it exists. Expected O(1) insert, find and remove;
 * find allocates nothing and takes no lock. Not thread-safe: one owner
 * (the daemon's loop) calls it.
 *
 * Memory (tiers/INDEX.md has the measured figures): a table slot is 5
 * bytes - a 32-bit record id and an 8-bit tag from the key's hash, so a
 * probe reads a record only when the tags agree (1 in 255 otherwise). The
 * table is any size, not a power of two: it is kept at most 4/5 full and
 * grows by a quarter, so it costs 6.25-7.8 bytes per record. Records come
 * in chunks of KV_INDEX_CHUNK.
 *
 * The index also keeps the prefix tree: a record may name a parent record
 * and lists its children, so eviction can keep chains whole. Removing a
 * record orphans its children (their parent becomes KV_BID_NONE).
 */
#ifndef KV_TIERS_INDEX_H
#define KV_TIERS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "tiers/block.h"

typedef struct __attribute__((packed)) kv_index_slot {
  uint8_t tag; /* 0: empty; else 1..255 from the key's hash */
  kv_bid bid;
} kv_index_slot;

typedef struct kv_index {
  kv_index_slot *tab;
  uint32_t size;     /* table slots (any number >= 64) */
  uint32_t count;    /* records in use */
  kv_block **chunks; /* KV_INDEX_CHUNK records each */
  uint32_t nchunks, capchunks;
  uint32_t hiwater; /* records ever carved from chunks */
  kv_bid free_head; /* free records, linked through ->next */
  /* Engine hints (tiers/sessions.h): the session table, set by the index's
   * owner (the core; NULL: none), and by record id the reference of the
   * session that owns the record, allocated at the first hint (4 bytes per
   * id up to the highest hinted; NULL before) and cleared as a record goes.
   * Eviction policies read both through their kv_evict.ix. */
  struct kv_sessions *sessions;
  uint32_t *owner;
  uint32_t nowner;
} kv_index;

#define KV_INDEX_CHUNK_SHIFT 7
#define KV_INDEX_CHUNK       (1u << KV_INDEX_CHUNK_SHIFT)

/* Prepares an empty index sized for about `hint` records. 0 or -ENOMEM. */
int kv_index_init(kv_index *ix, uint32_t hint);
/* Frees everything the index holds. Records become invalid. */
void kv_index_fini(kv_index *ix);

/* The record for (ns, key), or NULL. No allocation, no side effect. */
kv_block *kv_index_find(const kv_index *ix, uint32_t ns, const uint8_t *key, unsigned keylen);

/*
 * Adds a record for (ns, key) in state KV_BS_WRITING with no slot, no pin and
 * no parent, and returns it in *out. If the key exists, returns KV_EEXISTS
 * with the existing record in *out and changes nothing. -EINVAL for a key
 * of length 0 or more than KV_KEY_MAX, -ENOMEM when memory runs out (the
 * index is unchanged).
 */
int kv_index_insert(kv_index *ix, uint32_t ns, const uint8_t *key, unsigned keylen, kv_block **out);

/*
 * Removes a record: unlinks it from its parent and orphans its children.
 * The caller must have released its slots; -EBUSY (nothing changed) if the
 * record is still resident in a tier, pinned or busy.
 */
int kv_index_remove(kv_index *ix, kv_block *b);

/* Makes `parent` the parent of `b` (b must have none). -EINVAL if it has one,
 * if they are the same record, or if they are in different namespaces. */
int kv_index_link(kv_index *ix, kv_block *b, kv_block *parent);

static inline kv_block *kv_index_at(const kv_index *ix, kv_bid id) {
  if (id == KV_BID_NONE || id >= ix->hiwater) return NULL;
  return &ix->chunks[id >> KV_INDEX_CHUNK_SHIFT][id & (KV_INDEX_CHUNK - 1)];
}

/* Calls fn on every record in use (any state) until fn returns non-zero,
 * which is then returned. fn must not insert or remove. */
int kv_index_foreach(kv_index *ix, int (*fn)(kv_block *b, void *arg), void *arg);

/* Bytes of memory the index holds (table, record chunks, chunk array), as
 * requested from the allocator. */
size_t kv_index_memory(const kv_index *ix);

/*
 * The allocator of block metadata: the index and the eviction policies
 * allocate through these, which keep a process-wide count of the bytes the
 * allocator really handed out (malloc_usable_size), so a benchmark or a
 * test can measure what metadata costs per block rather than compute it.
 * Same contracts as malloc, calloc, realloc and free.
 */
void *kv_meta_malloc(size_t n);
void *kv_meta_calloc(size_t n, size_t each);
void *kv_meta_realloc(void *p, size_t n);
void kv_meta_free(void *p);
/* Bytes currently allocated through the functions above. */
size_t kv_meta_bytes(void);

#endif
