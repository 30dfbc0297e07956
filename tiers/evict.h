/*
 * evict.h - eviction policies: which block of a tier goes next.
 *
 * One policy instance orders the *evictable* blocks of one tier's size
 * class. The core (core.h) decides what is evictable - resident and valid
 * in the tier, committed, not pinned, no copy in flight, no child whose
 * bytes are valid in the same tier (leaf-first: a prefix chain is cut from
 * its end; G3's copy of a block G2 holds too is exempt, the chain staying
 * whole through G2), and, in the last tier a block can go to, no child in a faster
 * tier unless the block has another copy (a chain is not cut above G2) and,
 * when that tier is G2, no child being written (it would be committed under
 * no parent) - and tells the policy as blocks enter and leave that set. The
 * policy only ranks: priority class first (lower goes first), then its own
 * order. So every policy keeps chains whole and never offers a pinned block.
 *
 * A policy may use b->hpos[tier] as its own per-block word, and reads the
 * access history the core keeps in every record (atime, hits). The
 * word keeps its value while the block is out of the policy (pinned, or an
 * interior block of a chain), so a policy may remember there what it knew
 * when the block comes back; the index sets it to KV_SLOT_NONE at insert.
 * One exception: G2 and G3 rank the blocks the other tier holds too in an
 * instance of their own (the copies, kv_core__policy_of), which keeps its
 * heap position in the same word: a block back from there comes back with
 * KV_SLOT_NONE, as a new one (tiers/EVICTION.md, "The copies' word").
 * The core calls remove() for the victim peek() offered once it evicts it:
 * a policy that keeps ghosts of its victims tells the two cases apart by
 * remembering what it offered.
 *
 * This is what the core and the daemon use: the table of operations, the
 * registry of policies by name, and the default (evict_policies.c), and an
 * instance's life (evict.c). Writing a policy takes evict_impl.h as well.
 */
#ifndef KV_TIERS_EVICT_H
#define KV_TIERS_EVICT_H

#include <stdint.h>

#include "tiers/block.h"
#include "tiers/index.h"

typedef struct kv_evict kv_evict;

typedef struct kv_evict_ops {
  const char *name;
  const char *summary;
  int (*init)(kv_evict *e); /* 0 or -ENOMEM */
  void (*fini)(kv_evict *e);
  /* b became evictable; may fail only with -ENOMEM (b then stays out). */
  int (*add)(kv_evict *e, kv_block *b);
  void (*remove)(kv_evict *e, kv_block *b); /* b is no longer evictable */
  void (*touch)(kv_evict *e, kv_block *b);  /* evictable b was accessed */
  kv_block *(*peek)(kv_evict *e);           /* next victim, or NULL */
  /* Optional (NULL: not told): b, valid in the tier but not evictable (an
   * interior block of a chain, pinned, or being copied), was accessed. */
  void (*seen)(kv_evict *e, kv_block *b);
  /* Optional (NULL: not told): engine hints (tiers/sessions.h, the table in
   * e->ix->sessions). hinted: evictable b was named by a hint; its owner
   * reference in e->ix->owner was old_ref before (KV_SESS_NONE: none).
   * session: the state of the session in slot `slot` changed (a request
   * started or finished, it ended, it asked for retention). */
  void (*hinted)(kv_evict *e, kv_block *b, uint32_t old_ref);
  void (*session)(kv_evict *e, uint32_t slot);
  /* Optional (NULL: every one enters): whether b, the victim of instance
   * `from` in the tier above, should enter this tier, taking the room of
   * this tier's next victim: 1, or 0 when the policy ranks b before that
   * victim (b would be the next to go anyway). b is not in the tier yet
   * and is still in `from`; nothing changes. */
  int (*admit)(kv_evict *e, kv_evict *from, const kv_block *b);
} kv_evict_ops;

struct kv_evict {
  const kv_evict_ops *ops;
  kv_index *ix;
  kv_tier tier;
  uint32_t count;    /* blocks held */
  uint32_t capacity; /* blocks the tier's class can hold; 0 unknown. Set by
                      * the owner before kv_evict_init; policies that size
                      * ghosts or segments use it (else their peak count). */
  /* Tiers in series as one cache (set by the owner, kept by kv_evict_init;
   * 0 and NULL: an instance on its own). lead: an instance of the same
   * policy in the last tier the victims go to, which decides what the
   * whole cache keeps and counts this one's evidence (adapt: H, which only
   * the lead ranks with); ignored when its policy is another. reach:
   * blocks the whole cache holds when this instance is such a lead (its
   * capacity and the tiers' above it); what adapt sizes its H on. */
  kv_evict *lead;
  uint32_t reach;
  void *priv;
};

/* Finds a policy by name; NULL if there is none of that name. */
const kv_evict_ops *kv_evict_lookup(const char *name);
/* The policies compiled in, NULL-terminated. */
extern const kv_evict_ops *const kv_evict_policies[];
/* The default policy's name. */
extern const char kv_evict_default[];

int kv_evict_init(kv_evict *e, const kv_evict_ops *ops, kv_index *ix, kv_tier tier);
void kv_evict_fini(kv_evict *e);

#endif
