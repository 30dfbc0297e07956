/*
 * sessions.h - the session table of engine hints (base/hint.h; the core's
 * "engine hints" in core.h): per (namespace, session), what hints said of
 * it - when its requests came and how many, the gaps between them, how the
 * last one ended, whether the session is over, how long it asked its
 * blocks to be kept - and, per block, the session that owns it.
 *
 * Bounded: at most `max` sessions (kv_sessions_init); a new session takes
 * the slot of the least recently hinted one, which is forgotten.
 *
 * Owners: a block's owner is a reference (slot and generation) in a side
 * array indexed by block id (4 bytes per record id up to the highest one
 * hinted), allocated at the first hint, so kv_block stays as it is. A
 * forgotten session's blocks lose their owner without a walk: its slot's
 * generation moves on. The core clears a block's reference when its record
 * goes (kv_sessions_forget_block), so a record id used again starts with
 * no owner.
 *
 * Scope: a session is found by (namespace, id); a block is given only to a
 * session of its own namespace; the gap statistics predictions are made
 * from are kept per namespace. One tenant's hints never reach another
 * tenant's sessions, blocks or predictions.
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

#define KV_SESSIONS_MAX_DEFAULT 65536u /* sessions remembered */
#define KV_RETAIN_MAX_S_DEFAULT 3600u  /* retention granted at most (seconds) */
#define KV_SESS_SLOT_BITS       22     /* slots 0 .. 2^22 - 2 */
#define KV_SESS_GEN_BITS        (32 - KV_SESS_SLOT_BITS)
#define KV_GAP_BUCKETS          64 /* of a histogram: half octaves of ms */
#define KV_SESS_NONE            0u /* the reference of no session */

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
  uint32_t lprev, lnext; /* recency list of hinted sessions: slot + 1, 0 none */
  uint32_t hnext;        /* hash chain: slot + 1, 0 none */
} kv_session;

/* Per namespace: the gaps seen after each stop reason. Counts halve once a
 * stop reason's total reaches KV_GAP_HALVE, so the histogram follows the
 * workload. */
#define KV_GAP_HALVE 4096u
typedef struct kv_sess_ns {
  uint32_t hist[KV_STOP_COUNT][KV_GAP_BUCKETS];
  uint32_t total[KV_STOP_COUNT];
} kv_sess_ns;

typedef struct kv_sessions {
  kv_session *v;     /* slots */
  uint32_t n, cap;   /* slots in use (ever), allocated */
  uint32_t max;      /* bound on slots */
  uint32_t *heads;   /* hash buckets: slot + 1, 0 none */
  uint32_t nheads;   /* a power of two */
  uint32_t lru, mru; /* recency list ends: slot + 1 */
  uint32_t live;     /* sessions known now */
  uint32_t *owner;   /* by block id: reference of its session (KV_SESS_NONE: none) */
  uint32_t nowner;
  kv_sess_ns **nss; /* by namespace, NULL until hinted */
  uint32_t nnss;
  uint64_t now_ms;
  uint32_t retain_max_s;
  uint64_t hints;     /* hints taken (any kind): 0 until the first */
  uint64_t forgotten; /* sessions forgotten to make room */
  uint64_t epoch;     /* moves on every change a policy should re-read */
} kv_sessions;

/* An empty table for at most max sessions (0: the default; at most 2^22 - 1)
 * granting at most retain_max_s of retention. Allocates nothing yet. */
void kv_sessions_init(kv_sessions *s, uint32_t max, uint32_t retain_max_s);
void kv_sessions_fini(kv_sessions *s);

/* Sets the clock; a smaller value is ignored. */
void kv_sessions_set_now(kv_sessions *s, uint64_t now_ms);

/* Block b (of namespace ns: the caller checks) belongs to session id from
 * now on; a request of that session starts if none is active. retain_s
 * (0: none) asks that its blocks be kept that long past its last request,
 * capped at retain_max_s. 0 or -ENOMEM (nothing changed). */
int kv_sessions_hint_block(kv_sessions *s, uint32_t ns, uint64_t id, kv_block *b,
                           uint32_t retain_s);

/* A request of session id finished with stop reason stop (< KV_STOP_COUNT).
 * A session not known yet is made. 0 or -ENOMEM. */
int kv_sessions_finished(kv_sessions *s, uint32_t ns, uint64_t id, unsigned stop,
                         uint32_t retain_s);

/* Session id is over (its retention ends); nothing if it is not known. */
void kv_sessions_end(kv_sessions *s, uint32_t ns, uint64_t id);

/* Until when (ms) x's blocks are to be kept: its last hint plus the
 * retention it asked for, capped at s->retain_max_s now; 0 when it asked
 * none or has ended. */
static inline uint64_t kv_sessions_retain_until(const kv_sessions *s, const kv_session *x) {
  uint32_t r = x->retain_s < s->retain_max_s ? x->retain_s : s->retain_max_s;
  return r && !(x->flags & KV_SESS_ENDED) ? x->last_ms + (uint64_t)r * 1000u : 0;
}

/* The session owning block id, or NULL (no hint, or a forgotten session). */
const kv_session *kv_sessions_owner(const kv_sessions *s, kv_bid id);
/* The slot index of that session (for a policy's per-session state), or
 * UINT32_MAX. */
uint32_t kv_sessions_owner_slot(const kv_sessions *s, kv_bid id);

/* The record id is free again: it has no owner. */
static inline void kv_sessions_forget_block(kv_sessions *s, kv_bid id) {
  if (id < s->nowner) s->owner[id] = KV_SESS_NONE;
}

/* The session (ns, id), or NULL. */
const kv_session *kv_sessions_find(const kv_sessions *s, uint32_t ns, uint64_t id);

/* The namespace's gap statistics, or NULL (never hinted). */
static inline const kv_sess_ns *kv_sessions_ns(const kv_sessions *s, uint32_t ns) {
  return ns < s->nnss ? s->nss[ns] : (const kv_sess_ns *)0;
}

/* The bucket of a gap of ms milliseconds: half octaves, [0] below 2 ms,
 * the last one from 2^31.5 ms (25 days) up. */
unsigned kv_gap_bucket(uint64_t ms);
/* The smallest gap (ms) of bucket k. */
uint64_t kv_gap_bucket_lo(unsigned k);

#endif
