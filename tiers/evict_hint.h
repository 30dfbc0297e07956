/*
 * evict_hint.h - eviction by engine hints: which of a namespace's blocks
 * goes, from what its sessions are expected to do (tiers/sessions.h).
 *
 * A kv_hrank sits beside a policy's own order (its "base": the policy it
 * serves decides which namespace gives up a block; the hints decide which
 * of that namespace's blocks it is):
 *   - the base's victim v0 names the namespace (and the priority class);
 *   - a block without a session (no hint, or its session forgotten) keeps
 *     its place: v0 without a session goes as v0;
 *   - otherwise the victim is a block of the namespace's session expected
 *     back last (kv_sessions_predict): an ended session's first, then
 *     sessions overdue beyond every gap seen, then by the predicted time
 *     of their next request, latest first; sessions whose retention runs
 *     (kv_sessions_retain_until) after every other. Within a session, its
 *     least recently used block (a leaf: the core offers only leaves, so a
 *     session's context is cut from its end and its prefix stays longest).
 * So hints never move a block of one namespace ahead of another
 * namespace's: every eviction takes a block from the namespace the base
 * order names, hints or none; a namespace's share of the tier is what the
 * base order leaves it, and retention is kept within that share.
 *
 * Structure: per session (by its slot in the table), the list of its
 * blocks held, least recently used first (two 32-bit links per record id,
 * allocated with the first hinted block); per namespace, a max-heap of its
 * sessions by the key of their prediction; and one min-heap of sessions by
 * the time their prediction is to be made again (it changes as the elapsed
 * time crosses a half octave, a retention ends, or a hint comes). Costs per
 * eviction O(log sessions); per hint O(log sessions).
 *
 * "hints" (kv_evict_hints_ops): a kv_hrank over an lru base - the expert
 * that the default policy's miniature simulations run to tell whether the
 * hints help (evict_adapt.c). Not in the registry of named policies.
 */
#ifndef KV_TIERS_EVICT_HINT_H
#define KV_TIERS_EVICT_HINT_H

#include <stdint.h>

#include "tiers/evict.h"

typedef struct kv_hrank kv_hrank;

/* A ranking for policy e's blocks (e->ix, e->tier); NULL when out of
 * memory. Blocks already held by e are not known to it: a policy makes it
 * at the first hint and adds its held blocks as they are touched or
 * hinted (kv_hrank_add ignores a block it holds). */
kv_hrank *kv_hrank_new(kv_evict *e);
void kv_hrank_free(kv_hrank *h);

/* b became evictable in e (after the base added it); b's owner is read
 * from the index. 0, or -ENOMEM (then b is ranked without its session). */
int kv_hrank_add(kv_hrank *h, kv_block *b);
/* b is no longer evictable (before the index forgets its owner). */
void kv_hrank_remove(kv_hrank *h, kv_block *b);
/* b was accessed: the most recently used of its session. */
void kv_hrank_touch(kv_hrank *h, kv_block *b);
/* b's owner changed from old_ref (sessions.h reference, 0: none). */
void kv_hrank_hinted(kv_hrank *h, kv_block *b, uint32_t old_ref);
/* The state of the session in slot `slot` changed. */
void kv_hrank_session(kv_hrank *h, uint32_t slot);
/* The victim in place of the base's v0 (see above), never the block
 * `newest` (the leaf a chain being stored grows from) while its session
 * holds another; v0 itself when hints have nothing to say. */
kv_block *kv_hrank_pick(kv_hrank *h, kv_block *v0, kv_bid newest);

/* Bytes it holds (per-record links, per-session state, heaps). */
uint64_t kv_hrank_bytes(const kv_hrank *h);

#endif
