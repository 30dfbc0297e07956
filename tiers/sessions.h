/*
 * sessions.h - the session table of engine hints (base/hint.h; the core's
 * "engine hints" in core.h): per (namespace, session), what hints said of
 * it - when its requests came and how many, the gaps between them, how the
 * last one ended, whether the session is over, how long it asked its
 * blocks to be kept - and, per block, the session that owns it.
 *
 * Bounded, in shares: at most `max` sessions (kv_sessions_init). Each
 * session counts against a share the caller names when it makes the
 * session (the core: the namespace's tenant, kv_core_ns_owner, or the
 * namespace alone when it has none), and each share keeps its own recency
 * list. While the table has room any share grows. When it is full, a new
 * session of share S takes the slot of a least recently hinted session:
 * S's own when S holds at least as many as any share less one, otherwise
 * that of the share holding the most sessions (the count of every share
 * is kept in lists by count, so finding the largest is O(1)). So a share
 * loses a session to another only while it holds the most, and at least
 * two more than that one: the shares even out at about max / (shares
 * holding sessions) each, a share holding fewer keeps them all whatever
 * the others hint, and a tenant flooding the table with new sessions
 * forgets its own. A share alone may use the whole table. A session named
 * later with another share (a namespace given a tenant after its first
 * hints) moves to it.
 *
 * Owners: a block's owner is a reference (slot and generation) in its
 * index's side array by record id (kv_index.owner: 4 bytes per record id up
 * to the highest one hinted, allocated at the first hint), so kv_block
 * stays as it is. A forgotten session's blocks lose their owner without a
 * walk: its slot's generation moves on. The index clears a record's
 * reference when the record goes, so an id used again starts with none.
 * Generations are KV_SESS_GEN_BITS (10) bits: after 1024 sessions in one
 * slot a block's stale reference names the slot's session again, so a
 * reference resolves (kv_sessions_owner_slot) only to a session of the
 * block's own namespace; at worst a wrapped reference credits a block to
 * another session of its own namespace (advice, which the judge weighs),
 * never to another namespace's.
 *
 * Scope: a session is found by (namespace, id); a block is given only to a
 * session of its own namespace, and its reference is checked against its
 * namespace; the gap statistics predictions are made from are kept per
 * namespace; sessions are forgotten within shares (above). One tenant's
 * hints never reach another tenant's sessions, blocks or predictions, and
 * never make the table forget another tenant's sessions below its share.
 * A namespace id is used again once freed, perhaps by another tenant: the
 * owner drops the freed namespace's sessions and statistics first
 * (kv_sessions_ns_drop; the core does it when it frees the id), so the
 * new namespace continues none of the old one's sessions, inherits none
 * of their retention, and predicts from its own gaps only. Dropped
 * sessions' slots are free slots, taken before the table counts as full.
 *
 * Time: milliseconds on the clock the owner sets (kv_sessions_set_now: the
 * daemon's wall clock once per loop turn, a replay's trace timestamps);
 * it never goes back.
 *
 * What a request is: the first SESSION hint of a session after its last
 * FINISHED (or the first ever) starts one; FINISHED ends it. Between the
 * two the session is active. The gap of a request is the time from the
 * previous request's FINISHED to its start, filed under that FINISHED's
 * stop reason: per namespace in a histogram of log2-spaced buckets, and
 * per session as a moving average of log2 gaps.
 */
#ifndef KV_TIERS_SESSIONS_H
#define KV_TIERS_SESSIONS_H

#include <stdint.h>

#include "base/hint.h"
#include "tiers/block.h"
#include "tiers/index.h"

#define KV_SESSIONS_MAX_DEFAULT 65536u /* sessions remembered */
#define KV_RETAIN_MAX_S_DEFAULT 3600u  /* retention granted at most (seconds) */
#define KV_SESS_SLOT_BITS       22     /* slots 0 .. 2^22 - 2 */
#define KV_SESS_GEN_BITS        (32 - KV_SESS_SLOT_BITS)
#define KV_GAP_BUCKETS          64 /* of a histogram: half octaves of ms */
#define KV_SESS_NONE            0u /* the reference of no session */
#define KV_SESS_SHARES_MAX      (1u << 17) /* shares 0 .. 2^17 - 1 */

/* Session flags. */
#define KV_SESS_ACTIVE 1u /* a request started and has not finished */
#define KV_SESS_ENDED  2u /* an END hint: not coming back */

typedef struct kv_session {
  uint64_t id;       /* the engine's session id; 0: slot free */
  uint64_t start_ms; /* its last request's start (first SESSION hint after a FINISHED) */
  uint64_t last_ms;  /* its last hint of any kind */
  uint64_t fin_ms;   /* its last request's FINISHED; 0: none yet */
  uint32_t nreq;     /* requests started */
  uint32_t ngaps;    /* gaps measured (requests that followed a FINISHED) */
  uint32_t retain_s; /* retention asked for (kv_sessions_retain_until caps it); 0: none */
  uint16_t lgap;     /* moving average of its log2 gaps, x 256 (kv_sessions_lgap) */
  uint16_t ns;
  uint8_t stop;          /* its last FINISHED's reason (kv_stop) */
  uint8_t flags;         /* KV_SESS_* */
  uint16_t gen;          /* generation of the slot (KV_SESS_GEN_BITS used) */
  uint32_t lprev, lnext; /* its share's recency list: slot + 1, 0 none (free: the next free) */
  uint32_t hnext;        /* hash chain: slot + 1, 0 none */
  uint32_t share;        /* the share it counts against (< KV_SESS_SHARES_MAX) */
} kv_session;

/* A share of the table: its sessions, least recently hinted first. */
typedef struct kv_sess_share {
  uint32_t lru, mru;     /* its recency list's ends: slot + 1, 0 none */
  uint32_t count;        /* its sessions */
  uint32_t cprev, cnext; /* the list of shares with as many sessions: share + 1 */
} kv_sess_share;

/* Per namespace: the gaps seen after each stop reason. Counts halve once a
 * stop reason's total reaches KV_GAP_HALVE, so the histogram follows the
 * workload. */
#define KV_GAP_HALVE 4096u
#define KV_STOP_ANY  KV_STOP_COUNT /* the row of every stop reason together */
typedef struct kv_sess_ns {
  uint32_t hist[KV_STOP_COUNT + 1][KV_GAP_BUCKETS];
  uint32_t total[KV_STOP_COUNT + 1];
  /* kv_sessions_predict's table, made again after the row changes: the
   * median gap (ms) of the gaps at least kv_gap_bucket_lo(k) long */
  uint64_t med[KV_STOP_COUNT + 1][KV_GAP_BUCKETS];
  uint8_t stale[KV_STOP_COUNT + 1];
} kv_sess_ns;

typedef struct kv_sessions {
  kv_session *v;     /* slots */
  uint32_t n, cap;   /* slots in use (ever), allocated */
  uint32_t free1;    /* free slots (kv_sessions_ns_drop), taken first: slot + 1, 0 none */
  uint32_t max;      /* bound on slots */
  uint32_t *heads;   /* hash buckets: slot + 1, 0 none */
  uint32_t nheads;   /* a power of two */
  kv_sess_share *sh; /* by share, unused ones zero */
  uint32_t nsh;
  uint32_t *bycount; /* [k]: the first share holding k sessions (share + 1), 0 none; cap + 1 */
  uint32_t maxc;     /* the most sessions a share holds */
  uint32_t live;     /* sessions known now */
  kv_sess_ns **nss;  /* by namespace, NULL until hinted */
  uint32_t nnss;
  uint64_t now_ms;
  uint32_t retain_max_s;
  uint64_t hints;     /* hints taken (any kind): 0 until the first */
  uint64_t forgotten; /* sessions forgotten to make room */
} kv_sessions;

/* An empty table for at most max sessions (0: the default; at most 2^22 - 1)
 * granting at most retain_max_s of retention. Allocates nothing yet. */
void kv_sessions_init(kv_sessions *s, uint32_t max, uint32_t retain_max_s);
void kv_sessions_fini(kv_sessions *s);

/* Sets the clock; a smaller value is ignored. */
void kv_sessions_set_now(kv_sessions *s, uint64_t now_ms);

/* Block b of index ix (of namespace ns: the caller checks) belongs to
 * session id from now on; a request of that session starts if none is
 * active. The session counts against share (< KV_SESS_SHARES_MAX; see
 * "Bounded, in shares"). retain_s (0: none) asks that its blocks be kept
 * that long past its last request (kv_sessions_retain_until caps it). The
 * session's slot goes to *slot. 1 when the session's state changed beyond
 * its last hint's time (a request started, another retention), 0 when
 * not, -EINVAL (share out of range) or -ENOMEM (nothing changed). */
int kv_sessions_hint_block(kv_sessions *s, kv_index *ix, uint32_t ns, uint32_t share, uint64_t id,
                           kv_block *b, uint32_t retain_s, uint32_t *slot);

/* A request of session id finished with stop reason stop (< KV_STOP_COUNT).
 * A session not known yet is made, counting against share. Its slot,
 * -EINVAL (share out of range) or -ENOMEM. */
int64_t kv_sessions_finished(kv_sessions *s, uint32_t ns, uint32_t share, uint64_t id,
                             unsigned stop, uint32_t retain_s);

/* The sessions share holds now. */
static inline uint32_t kv_sessions_share_count(const kv_sessions *s, uint32_t share) {
  return share < s->nsh ? s->sh[share].count : 0;
}

/* Session id is over (its retention ends). Its slot, or UINT32_MAX when it
 * is not known. */
uint32_t kv_sessions_end(kv_sessions *s, uint32_t ns, uint64_t id);

/* Namespace ns is no more (the core freed its id, which a new namespace
 * may get): its sessions and its gap statistics are dropped, so a
 * namespace given the id later starts with none. Their slots are free,
 * taken before any other by the next new sessions; the generations move
 * on, so references to the sessions never resolve. Walks the slots
 * (nothing when ns was never hinted). */
void kv_sessions_ns_drop(kv_sessions *s, uint32_t ns);

/* Until when (ms) x's blocks are to be kept: its last hint plus the
 * retention it asked for, capped at s->retain_max_s now; 0 when it asked
 * none or has ended. */
static inline uint64_t kv_sessions_retain_until(const kv_sessions *s, const kv_session *x) {
  uint32_t r = x->retain_s < s->retain_max_s ? x->retain_s : s->retain_max_s;
  return r && !(x->flags & KV_SESS_ENDED) ? x->last_ms + (uint64_t)r * 1000u : 0;
}

/* The slot of the session owning record id of index ix (a policy keeps
 * per-session state by slot), or UINT32_MAX (no hint, a forgotten
 * session, or a reference whose generation wrapped into a session of
 * another namespace than the record's). */
static inline uint32_t kv_sessions_owner_slot(const kv_sessions *s, const kv_index *ix, kv_bid id) {
  if (id >= ix->nowner || ix->owner[id] == KV_SESS_NONE) return UINT32_MAX;
  uint32_t r = ix->owner[id], i = (r & ((1u << KV_SESS_SLOT_BITS) - 1)) - 1;
  if (i >= s->n || !s->v[i].id || s->v[i].gen != r >> KV_SESS_SLOT_BITS) return UINT32_MAX;
  if (s->v[i].ns != kv_index_at(ix, id)->ns) return UINT32_MAX;
  return i;
}

/* The session owning record id of index ix, or NULL. */
static inline const kv_session *kv_sessions_owner(const kv_sessions *s, const kv_index *ix,
                                                  kv_bid id) {
  uint32_t i = kv_sessions_owner_slot(s, ix, id);
  return i == UINT32_MAX ? (const kv_session *)0 : &s->v[i];
}

/* Makes record id of index ix owned by the session whose reference is ref
 * (a miniature simulation copying the owner of a real block). 0 or
 * -ENOMEM. */
int kv_sessions_set_owner(kv_index *ix, kv_bid id, uint32_t ref);

/* The session (ns, id), or NULL. */
const kv_session *kv_sessions_find(const kv_sessions *s, uint32_t ns, uint64_t id);

/* The namespace's gap statistics, or NULL (never hinted). */
static inline const kv_sess_ns *kv_sessions_ns(const kv_sessions *s, uint32_t ns) {
  return ns < s->nnss ? s->nss[ns] : (const kv_sess_ns *)0;
}

/* kv_sessions_predict's answer for a session not coming back. */
#define KV_PREDICT_NEVER UINT64_MAX

/*
 * When (ms, on the table's clock) session x is expected to use its blocks
 * next, from what hints said, and in *until the time this prediction holds
 * to (it is made again after; UINT64_MAX: for good). A prediction is made
 * from the elapsed time's half-octave bucket, so it moves only as that
 * bucket does:
 *   ended              KV_PREDICT_NEVER;
 *   a request running  its last hint plus twice the time since (a request
 *                      that has run for t is expected to run about t more:
 *                      the median remaining life of a heavy tail, with no
 *                      constant to fit), so a request that never finishes
 *                      loses its hold over time;
 *   idle               the median of the namespace's gaps after the stop
 *                      reason x's last request ended with, among the gaps
 *                      at least as long as the time since it ended (the
 *                      median remaining time given the time waited so far),
 *                      added to that end: a session overdue for its usual
 *                      pace is expected later and later. No gap that long
 *                      seen yet: KV_PREDICT_NEVER. A stop reason with no gap
 *                      yet: every stop reason's gaps together; none at all:
 *                      as a running request, from its end.
 */
uint64_t kv_sessions_predict(kv_sessions *s, const kv_session *x, uint64_t *until);

/* The bucket of a gap of ms milliseconds: half octaves, [0] below 2 ms,
 * the last one from 2^31.5 ms (25 days) up. */
unsigned kv_gap_bucket(uint64_t ms);
/* The smallest gap (ms) of bucket k. */
uint64_t kv_gap_bucket_lo(unsigned k);

#endif
