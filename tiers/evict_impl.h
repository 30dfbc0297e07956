/*
 * evict_impl.h - what an eviction policy is written with, beside the
 * interface of evict.h: the shared toolkit of evict_util.c (priority queues
 * that keep the class-first rule, metadata arrays, bounded ghost sets, a
 * compact victim history and a frequency sketch), and the hooks through
 * which tests look into particular policies.
 *
 * Adding a policy: write one kv_evict_ops table with these and list it in
 * evict.c. Included by the policy files and the tests that need the hooks.
 */
#ifndef KV_TIERS_EVICT_IMPL_H
#define KV_TIERS_EVICT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tiers/evict.h"

/* W-TinyLFU's window share (0..1) as its hill climber has set it; e must
 * be a "tinylfu" policy. For tests and statistics. */
double kv_evict_tinylfu_window(const kv_evict *e);
/* The expert an "auto" policy follows now ("lru" or "tinylfu") and, in
 * *switches if not NULL, how often it has changed; e must be an "auto"
 * policy. For tests and statistics. */
const char *kv_evict_auto_following(const kv_evict *e, uint64_t *switches);
/* The order an "adapt" policy follows now: "hints" while it follows engine
 * hints, else its name (its order without them); in *switches if not NULL,
 * how often the judge has changed it since the first hint. e must be an
 * "adapt" policy. For tests and statistics. */
const char *kv_evict_adapt_following(const kv_evict *e, uint64_t *switches);
/* H of an "adapt" (or "aged", "aged0") policy now: how much later than
 * its last use a block used again ranks, in capacities of accesses
 * (evict_adapt.c). For tests and statistics. */
double kv_evict_adapt_bonus(const kv_evict *e);
/* The H e ranks with: 0 where it follows a lead of its family (tiers in
 * series as one cache, evict.h: the tier above ranks by recency alone,
 * evict_adapt.c), else its own. For statistics. */
double kv_evict_adapt_ranked_bonus(const kv_evict *e);

/* ---- for policy implementations (evict_util.c) ---------------------------
 *
 * kv_pq: a min-heap of blocks keyed by a 64-bit key whose top byte must be
 * the block's priority class (KV_PQ_KEY). A policy may keep up to 15 queues;
 * b->hpos[tier] holds (queue id << 28 | heap index) while the block is in
 * one, so remove and touch are O(log n). */
typedef struct kv_pq_ent {
  uint64_t key;
  kv_bid bid;
  uint32_t aux; /* the policy's per-block word while queued */
} kv_pq_ent;

typedef struct kv_pq {
  kv_pq_ent *v;
  uint32_t n, cap;
  uint32_t id; /* 1..15 */
} kv_pq;

#define KV_PQ_SHIFT            28
#define KV_PQ_IDX(w)           ((w) & ((1u << KV_PQ_SHIFT) - 1))
#define KV_PQ_ID(w)            ((w) >> KV_PQ_SHIFT)
#define KV_PQ_KEY(prio, order) (((uint64_t)(prio) << 56) | ((order) & ((1ull << 56) - 1)))

/* Grows the array *v, of *n elements of `each` bytes, to at least `want`
 * elements: by a quarter and at least 256, through kv_meta_realloc (so the
 * bytes are counted), *n updated; new elements are not initialised.
 * 0 or -ENOMEM (then *v and *n unchanged). */
int kv_meta_grow(void **v, uint32_t *n, uint64_t want, size_t each);

/* 0 or -ENOMEM. */
int kv_pq_push(kv_evict *e, kv_pq *q, kv_block *b, uint64_t key, uint32_t aux);
/* Takes b (which must be in q) out; returns its aux word. */
uint32_t kv_pq_del(kv_evict *e, kv_pq *q, kv_block *b);
/* Changes b's key in q. */
void kv_pq_rekey(kv_evict *e, kv_pq *q, kv_block *b, uint64_t key);
static inline kv_pq_ent *kv_pq_top(kv_pq *q) { return q->n ? &q->v[0] : (kv_pq_ent *)0; }
static inline kv_pq_ent *kv_pq_ent_of(kv_pq *q, const kv_block *b, kv_tier t) {
  return &q->v[KV_PQ_IDX(b->hpos[t])];
}
void kv_pq_free(kv_pq *q);
/* The lowest priority class at the top of any of the n queues (256: all empty). */
unsigned kv_pq_min_class(kv_pq *const *qs, int n);
static inline int kv_pq_top_in(kv_pq *q, unsigned cls) {
  return q->n && (q->v[0].key >> 56) == cls;
}

/* kv_ghost: a bounded set of 32-bit key fingerprints, oldest forgotten
 * first (FIFO): what a policy evicted recently, without the blocks. About
 * 9-14 bytes per remembered key; never more than `cap` keys. */
typedef struct kv_ghost {
  uint32_t *ring; /* fingerprints in insertion order */
  uint32_t *tab;  /* open addressing, 0 = empty */
  uint32_t cap, head, n, mask, live;
} kv_ghost;

/* The fingerprint of a block's (ns, key); never 0. */
uint32_t kv_fingerprint(const kv_block *b);
/* Sets the bound (forgets everything when it changes). 0 or -ENOMEM. */
int kv_ghost_size(kv_ghost *g, uint32_t cap);
void kv_ghost_add(kv_ghost *g, uint32_t fp);
/* 1 if fp was remembered (and forgets it), else 0. */
int kv_ghost_take(kv_ghost *g, uint32_t fp);
void kv_ghost_free(kv_ghost *g);

/* kv_seen: which keys were added lately - a compact, approximate history
 * of a policy's victims for as long as it takes the policy to evict 2n..4n
 * more blocks (n set by kv_seen_size). Two generations, each a
 * set-associative table of 16-bit tags (8 ways) sized for 2n keys: keys
 * go into the current one, which is retired once 2n keys went in (the
 * older is then cleared and becomes current); a key is known while either
 * generation holds its tag. A key goes in with a class, 0 or 1 (the
 * policy's: adapt's is the queue its victim left), kept in its tag's
 * lowest bit and returned by a lookup; each generation counts the keys of
 * each class it took. 2 bytes per remembered key, 8 per block of n; a key
 * not added answers "known" about 1 time in 2,000 (16 tags compared against
 * the 15 bits beside the class); a full set forgets one of its tags early
 * (at the end of a generation about 1 key in 7 is lost that way). */
typedef struct kv_seen {
  uint16_t *gen[2]; /* [0] current, [1] previous; nsets * 8 tags each */
  uint32_t nsets;   /* sets per generation */
  uint32_t adds, per_gen;
  uint32_t n;           /* what it was sized for */
  uint32_t count[2][2]; /* [generation][class]: keys added */
} kv_seen;

/* Sized for victims of a cache of n blocks (forgets everything when n
 * changes; n = 0 frees it). 0 or -ENOMEM (then empty, and remembers nothing). */
int kv_seen_size(kv_seen *s, uint32_t n);
void kv_seen_add(kv_seen *s, uint32_t fp, int cls);
/* The class fp was added with, or -1 if it is not known. */
int kv_seen_class(const kv_seen *s, uint32_t fp);
static inline int kv_seen_has(const kv_seen *s, uint32_t fp) { return kv_seen_class(s, fp) >= 0; }
/* Keys of class cls the history holds (both generations). */
static inline uint32_t kv_seen_count(const kv_seen *s, int cls) {
  return s->count[0][cls] + s->count[1][cls];
}
void kv_seen_free(kv_seen *s);

/* kv_sketch: TinyLFU's frequency filter (Einziger et al., ACM ToS 2017):
 * a doorkeeper Bloom filter in front of a count-min sketch of 4-bit
 * counters (Cormode & Muthukrishnan). A key's first access in a sample only
 * sets its doorkeeper bits; later ones count in the sketch (conservative
 * update), so one-time keys - a scan - never load the counters. The
 * estimate is the sketch's count plus one if the doorkeeper has the key,
 * saturating at 15. After `sample` accesses (TinyLFU's W: 10 per entry of
 * the cache) every counter is halved and the doorkeeper cleared, so old
 * popularity fades. Sized as Caffeine sizes it: 4 rows of the power of two
 * >= 4n counters for a cache of n entries (16 counters, 8 bytes, per
 * entry); the doorkeeper has 8 bits per access of a sample, 3 hashes (~3%
 * false positives even when every access of a sample is a new key). */
typedef struct kv_sketch {
  uint64_t *rows; /* 4 * width/16 words, 16 counters per word */
  uint64_t *door; /* doorkeeper: door_mask + 1 bits */
  uint32_t width; /* counters per row, a power of two */
  uint32_t door_mask;
  uint32_t adds, sample;
} kv_sketch;

/* Sized for a cache of n entries (counts reset when the size changes).
 * 0 or -ENOMEM (the sketch is then unchanged). */
int kv_sketch_size(kv_sketch *s, uint32_t n);
void kv_sketch_add(kv_sketch *s, uint32_t fp);
unsigned kv_sketch_get(const kv_sketch *s, uint32_t fp);
void kv_sketch_free(kv_sketch *s);

/* kv_newest: the block that the "newest" rule of reuse, adapt and hints
 * keeps while another block of its class is held, the leaf a chain being
 * stored grows from. For an instance on its own (no tier in series: no
 * lead, no reach), of the blocks added, the one accessed last; not simply
 * the one added last: a parent that becomes a leaf because its child was
 * evicted comes back with its old access, and an ALLOC of many slots
 * evicts many victims before its blocks are committed. A parent taken for
 * the newest there was kept while the next victim came from another chain,
 * and the victims alternated between two chains, cutting both
 * (tiers/EVICTION.md, "Through the daemon", 2026-11-29). An instance in
 * series above another (G2 before G3) keeps the block added last: there
 * the rule by access moved `kvbench core-replay --g3-dir` figures both
 * ways by up to 0.2 points on the Mooncake trace at 1% and 2% (where that
 * replay repeats its figures run to run), and no batched ALLOC was
 * measured. The last tier of a series (G3: the lead, its reach set) has
 * none: its blocks are the victims of the tier above, none of them a leaf
 * a chain being stored grows from (that one is in the tier above, kept
 * there), and the block it was sent last, kept, made its victims
 * alternate between two chains (tiers/EVICTION.md, "G2 + G3 as one
 * cache", 2026-11-29). */
typedef struct kv_newest {
  kv_bid id; /* KV_BID_NONE: none yet */
  uint64_t at;
} kv_newest;

static inline void kv_newest_init(kv_newest *n) {
  n->id = KV_BID_NONE;
  n->at = 0;
}
/* b was added to e: the newest, unless e is on its own and b was accessed
 * before the newest was, or e is the last tier of a series (none). */
static inline void kv_newest_added(kv_newest *n, const kv_evict *e, const kv_block *b) {
  if (e->reach) return;
  if (n->id != KV_BID_NONE && !e->lead && b->atime < n->at) return;
  n->id = b->id;
  n->at = b->atime;
}

#endif
