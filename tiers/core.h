/*
 * core.h - the cache core: blocks, their residency per tier, and eviction.
 *
 * The core owns the block index and one eviction policy instance per
 * (G2 arena, size class). It is what the daemon's loop calls for every
 * operation, and what `kvbench core-replay` drives with no daemon at all.
 * Single-threaded by design: the daemon's loop is its only caller, so a
 * lookup takes no lock.
 *
 * Namespaces: the caller registers each namespace with the arena that holds
 * its G2 blocks and its block size (one size per namespace); the core hands
 * back a small integer id. Blocks of one namespace are invisible to another.
 *
 * Writes are two-phase: kv_core_alloc() reserves a G2 slot and an invisible
 * record (KV_BS_WRITING); kv_core_commit() makes it visible, or
 * kv_core_abort() drops it. When G2 is full, alloc evicts: the victim goes
 * to the demotion callback (the G3 tier, when there is one), which either
 * finishes at once, starts an asynchronous copy (the slot stays busy until
 * kv_core_demote_done()), or refuses, and then the block is dropped.
 */
#ifndef KV_TIERS_CORE_H
#define KV_TIERS_CORE_H

#include <stdint.h>

#include "tiers/arena.h"
#include "tiers/block.h"
#include "tiers/evict.h"
#include "tiers/index.h"

typedef struct kv_core kv_core;

/* Return values of a demotion callback, besides a negative error. */
#define KV_DEMOTE_DONE 0  /* bytes are safe elsewhere (or not wanted): free */
#define KV_DEMOTE_ASYNC 1 /* a copy reads the slot; wait for demote_done */

typedef int (*kv_demote_fn)(kv_core *c, kv_block *b, kv_tier from, void *arg);

typedef struct kv_core_opts {
  const char *policy;   /* eviction policy name; NULL: kv_evict_default */
  uint32_t index_hint;  /* expected number of blocks */
  kv_demote_fn demote;  /* NULL: victims are dropped */
  void *demote_arg;
} kv_core_opts;

typedef struct kv_core_stats {
  uint64_t lookups;           /* keys looked up */
  uint64_t hits[KV_NTIERS];   /* keys found, by the best tier holding them */
  uint64_t misses;
  uint64_t evictions[KV_NTIERS];
  uint64_t demotions;         /* victims handed to the demotion callback */
  uint64_t demote_failed;     /* ... that it refused: dropped */
  uint64_t allocs, commits, aborts, alloc_failed;
  uint64_t deletes;
} kv_core_stats;

typedef struct kv_core_ns {
  kv_arena *arena;
  int cls;              /* arena size class of its blocks */
  uint32_t block_bytes;
  int live;
} kv_core_ns;

struct kv_core {
  kv_index ix;
  const kv_evict_ops *policy;
  uint64_t clock;       /* logical time: one tick per access */
  kv_core_ns *ns;
  uint32_t nns, capns;
  kv_demote_fn demote;
  void *demote_arg;
  uint32_t demoting;    /* asynchronous demotions in flight */
  kv_core_stats st;
};

/* 0, -EINVAL (unknown policy name) or -ENOMEM. */
int kv_core_init(kv_core *c, const kv_core_opts *o);
/* Frees the index and the policies. Arenas belong to the caller. */
void kv_core_fini(kv_core *c);

/* Registers a namespace whose blocks are `block_bytes` long and live in
 * `arena`. Returns its id (>= 0), or -EINVAL, KV_ETOOBIG, -ENOSPC (arena has
 * no class left), -ENOMEM. */
int kv_core_ns_register(kv_core *c, kv_arena *arena, uint32_t block_bytes);

/* The visible (committed) block for a key, or NULL. No side effect. */
kv_block *kv_core_find(kv_core *c, uint32_t ns, const kv_key *key);

/* Looks up a chain of keys. tier_out[i] (if not NULL) is the fastest tier
 * holding key i, or KV_TIER_NONE. Returns the length of the longest leading
 * run of keys that are all resident, or -EINVAL for an unknown namespace.
 * Touches nothing. */
int kv_core_lookup(kv_core *c, uint32_t ns, const kv_key *keys, uint32_t n,
                   uint8_t *tier_out);

/* Records an access to b: its recency and frequency, in every tier. */
void kv_core_touch(kv_core *c, kv_block *b);

/*
 * Reserves a G2 slot and an invisible record for (ns, key). parent (may be
 * NULL) names the previous block of the chain; it links the two if the
 * parent is known (in any state). On success *out is the new block in state
 * KV_BS_WRITING. Errors, with nothing changed:
 *   KV_EEXISTS     the key exists (committed or being written); *out is it
 *   KV_EALLPINNED  G2 is full and nothing in it can be evicted
 *   -EAGAIN        G2 is full and demotions in flight will free room
 *   -EINVAL        unknown namespace or bad key
 *   -ENOMEM
 */
int kv_core_alloc(kv_core *c, uint32_t ns, const kv_key *key,
                  const kv_key *parent, uint8_t prio, kv_block **out);

/* Makes a written block visible, with the checksum of its bytes. Counts as
 * its first access. KV_EBADSTATE if b is not being written. */
int kv_core_commit(kv_core *c, kv_block *b, uint32_t crc);
/* Drops a block being written. KV_EBADSTATE if b is not being written. */
int kv_core_abort(kv_core *c, kv_block *b);

/* Pins keep a block where it is: never evicted while pinned.
 * pin: 0 or -EOVERFLOW. unpin: 0 or KV_EPINUNDERFLOW. */
int kv_core_pin(kv_core *c, kv_block *b);
int kv_core_unpin(kv_core *c, kv_block *b);

/* Removes a committed block from every tier. -EBUSY if it is pinned, being
 * written or being copied. */
int kv_core_delete(kv_core *c, kv_block *b);

/* Changes a block's priority class (0..255, lower is evicted first). */
void kv_core_set_priority(kv_core *c, kv_block *b, uint8_t prio);

/* Ends an asynchronous demotion from `from`: if ok, the copy there is
 * dropped unless the block was pinned meanwhile. */
void kv_core_demote_done(kv_core *c, kv_block *b, kv_tier from, int ok);

/* Evicts one block from the G2 class of namespace ns, as alloc would.
 * 0, KV_EALLPINNED (nothing evictable) or -EAGAIN (demotion started). */
int kv_core_evict_g2(kv_core *c, uint32_t ns);

static inline void *kv_core_g2_ptr(const kv_core *c, const kv_block *b) {
  if (b->slot[KV_G2] == KV_SLOT_NONE) return 0;
  return kv_arena_ptr(c->ns[b->ns].arena, b->slot[KV_G2]);
}

#endif
