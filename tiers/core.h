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
 *
 * The core is opaque: made by kv_core_new(), read through the accessors
 * below ("what the core shows its owner"). Its structure and the helpers
 * its files share (core.c, core_g1.c, core_g3.c, core_admin.c) are in
 * core_int.h, for those files only.
 */
#ifndef KV_TIERS_CORE_H
#define KV_TIERS_CORE_H

#include <stdint.h>

#include "tiers/arena.h"
#include "tiers/block.h"
#include "tiers/g3.h"
#include "tiers/index.h"

typedef struct kv_core kv_core;

/* Return values of a demotion callback, besides a negative error. */
#define KV_DEMOTE_DONE  0 /* bytes are safe elsewhere (or not wanted): free */
#define KV_DEMOTE_ASYNC 1 /* a copy reads the slot; wait for demote_done */

typedef int (*kv_demote_fn)(kv_core *c, kv_block *b, kv_tier from, void *arg);

/* G1's mover (kv_core_attach_g1); arg is the one given with the pool. */
typedef int (*kv_g1_copy_fn)(void *arg, int to_g1, void *g1, void *g2, uint32_t bytes,
                             uint64_t tag);

/* G1 pools: one per device. A block's G1 slot names its pool in the top
 * bits and the slot in that pool's arena below (kv_g1_pool_of,
 * kv_g1_slot_of): a pool holds at most 2^29 - 1 slots (2 TiB). */
#define KV_G1_POOLS_MAX 8
#define KV_G1_SLOT_BITS 29
static inline unsigned kv_g1_pool_of(uint32_t s) { return s >> KV_G1_SLOT_BITS; }
static inline uint32_t kv_g1_slot_of(uint32_t s) { return s & ((1u << KV_G1_SLOT_BITS) - 1); }

typedef struct kv_core_opts {
  const char *policy;  /* eviction policy name; NULL: kv_evict_default */
  uint32_t index_hint; /* expected number of blocks */
  kv_demote_fn demote; /* NULL: victims are dropped */
  void *demote_arg;
  /* Engine hints ("engine hints" below): the retention a session may be
   * granted at most, in seconds (0: KV_RETAIN_MAX_S_DEFAULT, 3600; set 0
   * itself with kv_core_set_retain_max), and the sessions remembered at
   * most (0: KV_SESSIONS_MAX_DEFAULT, 65536). */
  uint32_t retain_max_s;
  uint32_t sessions_max;
} kv_core_opts;

/* Which G2 victims deserve the SSD (each write wears it). */
typedef enum {
  KV_ADMIT_ALWAYS = 0, /* every victim */
  KV_ADMIT_SECOND_USE, /* victims used at least twice (a commit is one use) */
  KV_ADMIT_MIN_PRIO,   /* victims whose priority is at least min_prio */
} kv_admit;

typedef struct kv_core_g3_opts {
  kv_admit admit;
  uint8_t min_prio;   /* for KV_ADMIT_MIN_PRIO */
  uint32_t low_water; /* free G3 slots kept ready by evicting ahead (slots
                           * being retired count: they are on their way); 0: 64;
                           * at most 1/64 of the store's slots (and that at
                           * least 2): a small store is not left partly empty;
                           * at a demotion, at most the G2 victim's class's
                           * g2 headroom + 1 (and that at least 2): the
                           * demotions that start before the next poll */
  /* G2 slots kept free (or being freed by a demotion in flight) per size
   * class, so that a store finds room at once instead of waiting for the
   * SSD write (and its group commit) that frees a victim's slot: 1/64 of
   * the class's share of the arena (none in arenas of fewer than 64 slots),
   * at most g2_headroom if that is not 0. Measured with `kvbench replay`
   * (tools/bench/replay_scaling.sh, G2 1G + G3 4G): 1/64 serves about 10%
   * more requests/s than a cap of 32 at the same hit rate. */
  uint32_t g2_headroom;
} kv_core_g3_opts;

typedef struct kv_core_stats_t {
  uint64_t lookups;         /* keys looked up */
  uint64_t hits[KV_NTIERS]; /* keys found, by the best tier holding them (kv_core_lookup;
                               * the daemon adds the blocks its LOADs and GETs serve) */
  uint64_t misses;          /* kv_core_lookup's */
  uint64_t evictions[KV_NTIERS];
  uint64_t demotions;     /* victims handed to the demotion callback */
  uint64_t demote_failed; /* ... that it refused: dropped */
  uint64_t allocs, commits, aborts, alloc_failed;
  uint64_t deletes;
  uint64_t g3_admitted;      /* demotions written to G3 */
  uint64_t g3_refused;       /* victims not admitted (policy, state, space) */
  uint64_t g3_share_refused; /* ... of those, because their owner held its G3 share */
  uint64_t g3_outranked;     /* ... because G3's policy ranked them before its own next
                              * victim (kv_evict_ops.admit): they would have gone next */
  uint64_t ns_freed;         /* namespace ids freed (kv_core_ns_free, empty dormant ones) */
  uint64_t g3_write_failed;
  uint64_t g3_too_large;   /* victims refused (in g3_refused) as larger than a G3 slot:
                            * raw, or coded where their namespace's are */
  uint64_t promotions;     /* G3 -> G2 reads that verified */
  uint64_t promote_failed; /* ... that did not: corrupt or I/O error */
  uint64_t warm_blocks;    /* blocks learned from G3 at attach */
  uint64_t g1_loads;       /* G2 -> G1 copies done */
  uint64_t g1_load_failed; /* ... that the device failed */
  uint64_t g1_writebacks;  /* G1 victims copied down to G2 (G1 -> G2) */
  uint64_t g1_writeback_failed;
} kv_core_stats_t;

/* --- operator operations (tiers/core_admin.c) ---------------------------
 *
 * What the daemon's admin socket asks of the core: live policy switch, soft
 * capacity limits, eviction and flush on demand, and a walk over the index.
 * Like the rest of the core, single-threaded: the loop's thread only.
 */

/* Observer of copies between tiers: from, to, bytes, nanoseconds from start
 * to completion, and the status (0 or the error). Called on the loop. */
typedef void (*kv_copy_fn)(void *arg, kv_tier from, kv_tier to, uint32_t bytes, uint64_t ns,
                           int status);

/* Observer of what lookups see (kv_core_find): called on the loop right
 * after block b's valid tiers changed, so that b may now be found in
 * another fastest tier (the lowest bit of b->tiers), or not at all (no
 * tier left, or not KV_BS_READY). The daemon's presence tables follow the
 * core through it (daemon/presence.h). */
typedef void (*kv_visible_fn)(void *arg, const kv_block *b);
void kv_core_on_visible(kv_core *c, kv_visible_fn fn, void *arg);

#define KV_NS_ANY UINT32_MAX /* filter: every namespace */

/* Switches the eviction policy of every tier: each evictable block moves,
 * with its place in no particular order, into a fresh instance of the new
 * policy; nothing is evicted. 0, -EINVAL (unknown name), -ENOMEM (nothing
 * changed). */
int kv_core_set_policy(kv_core *c, const char *name);

/* Sets a soft limit on a tier's bytes (G2: each arena; G3: the store;
 * 0 = none) and evicts down to it at once (G2 victims are demoted as on
 * alloc). Returns the number of blocks evicted, or -EINVAL (bad tier). */
int kv_core_set_limit(kv_core *c, kv_tier t, uint64_t bytes);

/* Evicts, while a tier is over its soft limit, until it is not or nothing
 * more can go. Returns the number evicted. Called by the daemon before a
 * G2 allocation and from a timer. */
int kv_core_enforce_limits(kv_core *c);

/* Evicts up to n (UINT64_MAX: all that can go) evictable blocks of tier t
 * (G2 or G3), of namespace ns (KV_NS_ANY: any). Without a namespace filter
 * victims come in the policies' order; with one, in index order. G2
 * victims are demoted to G3 per the admission policy. Returns the number
 * evicted, or -EINVAL, -ENOMEM. */
int64_t kv_core_evict_n(kv_core *c, kv_tier t, uint32_t ns, uint64_t n);

/* Drops every unpinned, committed block of namespace ns (KV_NS_ANY: all)
 * from tier t (KV_TIER_NONE: G2 and G3) with no demotion; blocks in a copy
 * stay. Returns the number of tier copies dropped, or -EINVAL, -ENOMEM. */
int64_t kv_core_flush(kv_core *c, uint8_t t, uint32_t ns);

/* Drops b's copies in the tiers whose KV_TIER_BIT is in mask, with no
 * demotion, as kv_core_flush does for a whole namespace: for copies that
 * must never be served again (bytes that failed their checksum). The record
 * goes once no copy of it is left. 0; -EBUSY, with nothing changed, when b
 * is pinned, not committed, or a copy in one of those tiers is in flight;
 * -EINVAL for a bit that names no tier. */
int kv_core_drop(kv_core *c, kv_block *b, uint8_t mask);

/* Calls fn on every committed, resident block of namespace ns (KV_NS_ANY:
 * any) valid in tier t (KV_TIER_NONE: any) until fn returns non-zero.
 * Returns the number of blocks that matched, counted to the end. fn must
 * not change the index. */
typedef int (*kv_sample_fn)(const kv_block *b, void *arg);
uint64_t kv_core_sample(kv_core *c, uint8_t t, uint32_t ns, kv_sample_fn fn, void *arg);

/* --- G3 shares ----------------------------------------------------------
 *
 * The namespaces of one owner (the daemon: a tenant) may hold at most a
 * share of the SSD tier together. An owner with a share has a G3 policy
 * instance of its own: when a G2 victim of its namespaces is to be written
 * to G3 and the owner holds its share, the owner's own G3 victims go first
 * (through its policy, as g3.capacity's eviction goes through G3's), or,
 * when none can go, the victim is not admitted (counted in g3_refused and
 * g3_share_refused). Namespaces with no owner (the default, and dormant
 * ones learned from G3 at attach until they are registered again) share
 * the rest; eviction for room across owners (free-slot low water, soft
 * limit, evict on demand) takes such blocks first, then the victims of
 * the owner holding the largest part of its share. */
#define KV_CORE_OWNERS_MAX 32

/* Gives owner (< KV_CORE_OWNERS_MAX) a share of `bytes` of G3 (rounded
 * down to slots; 0: it may keep nothing there). After kv_core_attach_g3.
 * 0, -EINVAL (no G3, bad owner, share set already), -ENOMEM. */
int kv_core_g3_share(kv_core *c, unsigned owner, uint64_t bytes);

/* Makes namespace ns owner's: its G3 blocks move to the owner's policy and
 * count against its share (evicting down to it). 0, or -EINVAL (no such
 * namespace or owner, or ns has an owner already). */
int kv_core_ns_owner(kv_core *c, uint32_t ns, unsigned owner);

/* How namespace ns's blocks are written to G3: kv_g3_write_ex's flags, 0
 * (raw, the default), KV_G3_CODE (lossless; blocks of 16-bit elements,
 * tiers/codec.h) or KV_G3_FP8 / KV_G3_INT8 with their dtype and group
 * (lossy, tiers/quant.h: a tenant's cold_precision). Reads need nothing
 * but this: each record says how it is stored, and a lossy one is
 * promoted only while ns's flags are lossy (an engine that asks for exact
 * blocks never gets a lossy one), its G2 copy then carrying the CRC of
 * its decoded bytes. 0, or -EINVAL for no such namespace. */
int kv_core_ns_g3_code(kv_core *c, uint32_t ns, unsigned flags);

/* --- the GPU tier (tiers/core_g1.c) -------------------------------------
 *
 * G1 is one pool per device, whose slots the core hands out like G2's (an
 * arena made with kv_arena_opts.memory = the pool, so it never touches the
 * bytes). A block is in at most one pool at a time: the one of the device
 * whose worker loaded it; each pool has its own policies and victims. The core moves blocks with a copy function its owner gives (the
 * daemon: cuda/dev.h's copy engine): to_g1 1 copies bytes from g2 to g1,
 * 0 from g1 to g2; the owner calls kv_core_g1_done(tag, status) on the
 * loop's thread when the copy is over. A copy function that fails returns
 * -errno and never calls back. While a copy runs, both slots are busy: no
 * eviction, no reuse (cuda/dev.h's reuse rule).
 *
 * G1 is inclusive of nothing: a block comes up to G1 from G2 and keeps its
 * G2 copy while that lasts. G1's victims, in the order of the same policy
 * module as the other tiers, lose their G1 copy at once when G2 still
 * holds the block, else are written back to a G2 slot first (a G1 -> G2
 * copy; G2 makes room as a store would, demoting to G3). */
/* Attaches one G1 pool: an arena over a device's pool, the mover (the same
 * for every pool) and its arg for this pool. Returns the pool's index (0
 * for the first, in order), -EINVAL (NULL, another mover), -ENOSPC
 * (KV_G1_POOLS_MAX pools already) or -EFBIG (more slots than a G1 slot
 * can name). */
int kv_core_attach_g1(kv_core *c, kv_arena *pool, kv_g1_copy_fn copy, void *arg);

/* Brings a block valid in G2 up to G1 pool `pool`: a slot there (evicting
 * as above), then a G2 -> G1 copy; cb(status) runs from kv_core_g1_done.
 * Returns 0 when started, 1 when b is already valid in that pool (no
 * callback), or at once: -EXDEV (b is in another pool's G1: read it from
 * G2 when it is valid there; it moves when that pool evicts it),
 * KV_ENOTFOUND (not valid in G2: promote it there first), -EBUSY (a copy
 * of b is in flight, or its load waits for a write-back), -EAGAIN (a
 * write-back needs G2 room that a demotion to G3 in flight will free),
 * KV_EALLPINNED (G1 full of pinned blocks), KV_ETOOBIG (block larger than
 * a pool page), -EINVAL (no such pool, dormant namespace), or the copy
 * function's error. When G1 is full and its victim must be written back,
 * b's load is chained to that write-back (0: started) and takes the slot
 * it frees; cb then reports the load. The caller should hold a pin on b. */
typedef void (*kv_promote_cb)(kv_core *c, kv_block *b, int status, void *arg);
int kv_core_promote_g1(kv_core *c, kv_block *b, unsigned pool, kv_promote_cb cb, void *arg);

/* A copy started through kv_g1_copy_fn is over (status 0 or -errno). */
void kv_core_g1_done(kv_core *c, uint64_t tag, int status);

/* The device address of b's G1 slot (in its pool), or NULL. */
void *kv_core_g1_ptr(const kv_core *c, const kv_block *b);
/* b's offset in its G1 pool (b must have a G1 slot). */
static inline uint64_t kv_core_g1_offset(const kv_block *b) {
  return kv_arena_offset(kv_g1_slot_of(b->slot[KV_G1]));
}

/* Makes a core into *out. 0, -EINVAL (unknown policy name) or -ENOMEM. */
int kv_core_new(kv_core **out, const kv_core_opts *o);
/* Frees the core, its index and its policies (NULL: nothing). Arenas
 * belong to the caller. */
void kv_core_free(kv_core *c);

/* Registers a namespace whose blocks are `block_bytes` long and live in
 * `arena`. Returns its id (>= 0; an id freed by kv_core_ns_free may come
 * again), or -EINVAL, KV_ETOOBIG, -ENOSPC (arena has no class left, or
 * KV_NS_MAX namespaces: kv_core_ns_room), -ENOMEM. */
int kv_core_ns_register(kv_core *c, kv_arena *arena, uint32_t block_bytes);

/* Frees namespace ns, which has no block left (in any tier or state): its
 * id may be given to a new namespace, so its engine-hint sessions and gap
 * statistics go with it (kv_sessions_ns_drop): the next namespace of that
 * id, maybe another tenant's, inherits none. A namespace learned from G3
 * and never registered is freed by the core itself once its last block
 * goes. 0, -EINVAL (no such namespace), -EBUSY (it still has blocks). */
int kv_core_ns_free(kv_core *c, uint32_t ns);

/* Index records of namespace ns (0 for an id not in use). */
uint32_t kv_core_ns_blocks(const kv_core *c, uint32_t ns);

/* Whether a new namespace id is free (KV_NS_MAX ids, freed ones reused). */
int kv_core_ns_room(const kv_core *c);

/* As kv_core_ns_register(), for a namespace with a stable identity: G3
 * records carry the digest, so blocks found on the SSD at start-up are
 * served to the namespace again. If a dormant namespace with this digest
 * exists (learned from G3 by kv_core_attach_g3), it is bound to the arena
 * and its id returned; block_bytes must then match (-EINVAL). */
int kv_core_ns_register_digest(kv_core *c, kv_arena *arena, uint32_t block_bytes,
                               const uint8_t digest[KV_G3_NS_BYTES]);

/*
 * Attaches the SSD tier. From now on G2 victims are written to G3 when the
 * admission policy admits them (kv_core_opts.demote must be NULL), G3 keeps
 * its own eviction order through the same policy module, and every block
 * the store holds (kv_g3_foreach) becomes resident in G3: a warm restart.
 * G2 and G3 act as one cache (tiers/G3.md): a block promoted to G2 keeps
 * its SSD copy, and each tier gives up first its copy of a block the other
 * holds too - G2's (least recently used first) costs no write, G3's (most
 * recently used first, when G2 cannot give its copy up) loses no block; G2
 * writes a block back to G3 when it evicts it and the SSD copy is gone.
 * Blocks of namespaces not registered yet wait under dormant namespaces.
 * Returns the number of blocks learned, or -EINVAL / -ENOMEM.
 * Completions arrive through kv_g3_poll() on the loop's thread.
 */
int kv_core_attach_g3(kv_core *c, kv_g3 *g3, const kv_core_g3_opts *o);

/*
 * Brings a block that is in G3 only into G2: a G2 slot (evicting as alloc
 * does), then a verified read. cb(status) runs from kv_g3_poll(): 0 when
 * the bytes are in G2; KV_ECORRUPT or -EIO when they failed verification
 * (the block is then dropped from G3 and counted, never served). Returns 0
 * when started, 1 if b is already valid in G2 (no callback), or at once:
 * KV_ENOTFOUND (not in G3), -EBUSY (a promotion of b is in flight),
 * KV_EALLPINNED / -EAGAIN (no G2 room), -EINVAL (dormant namespace).
 * The caller should hold a pin on b, so it stays put meanwhile.
 */
int kv_core_promote(kv_core *c, kv_block *b, kv_promote_cb cb, void *arg);

/* The visible (committed) block for a key, or NULL. No side effect. */
kv_block *kv_core_find(kv_core *c, uint32_t ns, const kv_key *key);
/* The block a hint may name for a key: committed, or allocated and not
 * yet committed (an engine names a request's blocks as it allocates them,
 * so that they have their session when they come in). NULL otherwise. */
kv_block *kv_core_find_hintable(kv_core *c, uint32_t ns, const kv_key *key);

/* Looks up a chain of keys. tier_out[i] (if not NULL) is the fastest tier
 * holding key i, or KV_TIER_NONE. Returns the length of the longest leading
 * run of keys that are all resident, or -EINVAL for an unknown namespace.
 * Touches nothing. */
int kv_core_lookup(kv_core *c, uint32_t ns, const kv_key *keys, uint32_t n, uint8_t *tier_out);

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
int kv_core_alloc(kv_core *c, uint32_t ns, const kv_key *key, const kv_key *parent, uint8_t prio,
                  kv_block **out);

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

/* --- engine hints (base/hint.h) -------------------------------------------
 *
 * Advice for eviction, scoped by namespace: a hint names a session of
 * namespace ns and reaches only that namespace's blocks. Wrong, missing or
 * hostile hints never make eviction worse than without hints by more than
 * the policy's own margin (tiers/EVICTION.md), and never let one namespace
 * keep blocks at another's expense (retention is capped and bounded per
 * namespace). The session table is bounded and shared fairly: a
 * namespace's sessions count against its owner's share (kv_core_ns_owner),
 * or a share of its own without one; when the table is full a new session
 * makes its own share forget its least recently hinted session, unless
 * another share holds at least two more (tiers/sessions.h), so one
 * tenant's hints never make the core forget another tenant's sessions
 * below an even part of the table.
 */

/* The clock hints are measured on, in milliseconds: the daemon sets the
 * wall clock once per loop turn, a replay sets the trace's timestamps.
 * Never goes back (a smaller value is ignored). */
void kv_core_set_now(kv_core *c, uint64_t now_ms);

/* b (of namespace ns) belongs to session `session` (non-zero); the latest
 * session to name a block owns it. retain_s > 0 asks that the session's
 * blocks be kept that long after its last request (capped). 0, or -EINVAL
 * (session 0, b not of ns). */
int kv_core_hint_session(kv_core *c, uint32_t ns, uint64_t session, kv_block *b, uint32_t retain_s);

/* A request of session `session` of namespace ns finished with stop reason
 * `stop` (kv_stop) at the core's clock. 0, -EINVAL (session 0, stop out of
 * range, unknown namespace) or -ENOMEM. */
int kv_core_hint_finished(kv_core *c, uint32_t ns, uint64_t session, unsigned stop,
                          uint32_t retain_s);

/* Session `session` of namespace ns is over. 0 (also when the session is
 * not known), or -EINVAL. */
int kv_core_hint_end(kv_core *c, uint32_t ns, uint64_t session);

/* Sets the retention granted at most (seconds; 0: none is granted), for
 * every session from now on, those that asked before included. */
void kv_core_set_retain_max(kv_core *c, uint32_t retain_max_s);

/* What the core knows from hints, for statistics and tests. */
typedef struct kv_core_hint_stats {
  uint64_t hints;     /* hints taken */
  uint32_t sessions;  /* sessions remembered now */
  uint64_t forgotten; /* sessions forgotten to make room */
  uint64_t now_ms;    /* the hints' clock */
} kv_core_hint_stats;
void kv_core_hint_stats_get(const kv_core *c, kv_core_hint_stats *out);

/* Ends an asynchronous demotion from `from`: if ok, the copy there is
 * dropped unless the block was pinned meanwhile. */
void kv_core_demote_done(kv_core *c, kv_block *b, kv_tier from, int ok);

/* Evicts one block from the G2 class of namespace ns, as alloc would.
 * 0, KV_EALLPINNED (nothing evictable) or -EAGAIN (demotion started). */
int kv_core_evict_g2(kv_core *c, uint32_t ns);

/* The address of b's G2 slot, or NULL. */
void *kv_core_g2_ptr(const kv_core *c, const kv_block *b);

/* --- what the core shows its owner ---------------------------------------
 *
 * Read-only views for statistics and the operator surface, plus the few
 * settings the daemon changes while running.
 */

/* A snapshot of the core's counters. */
void kv_core_stats(const kv_core *c, kv_core_stats_t *out);

/* Counts a hit of tier t that the caller served (kv_core_stats_t.hits). */
void kv_core_count_hit(kv_core *c, kv_tier t);

/* The block index: records by key or id, and its counts (index.h). */
kv_index *kv_core_index(kv_core *c);

/* The name of the eviction policy in use. */
const char *kv_core_policy_name(const kv_core *c);

/* What tier t's eviction policy does now, for operators: read from its
 * instance holding the most blocks (one per size class, or per tenant in
 * G3). following: the order it follows ("hints" while the default follows
 * engine hints, else the policy's own name or, for "auto", its expert);
 * switches: how often that changed; bonus: the adapt H it ranks with, in
 * capacities (evict_adapt.c; with G3, G2's is 0), -1 for a policy
 * without one. 0, or -ENOENT (the tier
 * has no policy). */
typedef struct kv_core_policy_view {
  const char *following;
  double bonus;
  uint64_t switches;
  uint32_t instances;
} kv_core_policy_view;
int kv_core_policy_view_get(kv_core *c, kv_tier t, kv_core_policy_view *out);

/* The soft limit on tier t's bytes (kv_core_set_limit; 0: none). */
uint64_t kv_core_limit(const kv_core *c, kv_tier t);

/* Sets the observer of copies between tiers (NULL: none). */
void kv_core_on_copy(kv_core *c, kv_copy_fn fn, void *arg);

/* G3's options (kv_core_attach_g3, kv_core_set_admit). */
kv_core_g3_opts kv_core_g3_options(const kv_core *c);

/* Changes G3's admission policy (kv_core_g3_opts.admit, .min_prio). */
void kv_core_set_admit(kv_core *c, kv_admit admit, uint8_t min_prio);

/* Times a namespace's last block went: it changes when a namespace may
 * have become empty. */
uint64_t kv_core_ns_emptied(const kv_core *c);

/* Namespace ids given out so far, freed ones included: ids are below it. */
uint32_t kv_core_ns_count(const kv_core *c);

typedef struct kv_core_ns_info {
  kv_arena *arena; /* NULL while dormant (known from G3, no HELLO yet) */
  int cls;         /* arena size class of its blocks */
  uint32_t block_bytes;
  int live;              /* 0: the id is free */
  int owner;             /* its G3 share's owner; -1: none */
  uint32_t g3_slots;     /* G3 slots its blocks hold (written or being written) */
  uint32_t nblocks;      /* index records of its blocks, in any state and tier */
  const uint8_t *digest; /* identity across restarts (KV_G3_NS_BYTES), or NULL */
} kv_core_ns_info;

/* What the core knows of namespace ns. 0, or -EINVAL (id never given). */
int kv_core_ns_info_get(const kv_core *c, uint32_t ns, kv_core_ns_info *out);

/* G1 pools attached (0: no GPU tier), and pool p's arena (NULL past them). */
uint32_t kv_core_g1_pools(const kv_core *c);
kv_arena *kv_core_g1_arena(const kv_core *c, unsigned p);

/* Owner's G3 share and the G3 slots its namespaces hold, in slots. 0, or
 * -ENOENT when owner has no share (or there is no G3). */
int kv_core_g3_share_get(const kv_core *c, unsigned owner, uint64_t *limit_slots,
                         uint64_t *used_slots);

#endif
