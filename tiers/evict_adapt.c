/*
 * evict_adapt.c - the default policy, "adapt": blocks used once and blocks
 * used again, each in LRU order, a block used again ranked as if its last
 * use were H accesses later; H moves, as ARC moves its target, toward the
 * queue whose victims come back; and, once engine hints come, the hints'
 * order within the namespace that order names, for as long as chain-aware
 * miniature simulations do not find the order without hints better.
 * "aged" and "aged0" are the same order with H fixed: at 4 capacities (the
 * default before H moved) and at 0 (LRU's order, with the rule for the
 * newest block): the two ends adapt is measured against.
 *
 *   blocks   two heaps by (priority class, last access): blocks used once,
 *            and blocks used again (hits >= 2, or evicted lately and back:
 *            reuse's kv_seen history of its last 2C..4C victims, 8 bytes
 *            per block of capacity C). Each block is in one of them
 *            (b->hpos[tier]: the heap in bit 31, the position below), 4
 *            bytes per held block.
 *   order    the older of the two heads, the used-again head's last access
 *            taken H accesses later. H = 0 is LRU's order; the larger H,
 *            the longer a block used again outlives one used once (reuse,
 *            evict_reuse.c, is H infinite). Which is right depends on the
 *            workload: where most blocks come back once, soon (chat), H = 0;
 *            where popular documents come back far apart (a long tail), H
 *            of many capacities.
 *   H        starts at 0 and moves, within 0..HMAX capacities, when a
 *            victim comes back within the history's reach (a block added
 *            whose key the history holds): the history keeps with each key
 *            the heap it was evicted from, and counts the keys of each. A
 *            victim used once that comes back says H was too long (it went
 *            for a block used again), one used again that H was too short.
 *            Each moves H as ARC (Megiddo & Modha, FAST'03) moves its
 *            target: by one block's worth - the accesses per victim lately
 *            (over the last C..2C victims), the time in which one more
 *            block of the other queue goes - times the ratio of the other
 *            heap's victims to its own when that is above 1, so what is
 *            compared is how often each queue's victims come back, not how
 *            many it has. No constant of its own: from LRU's order, H grows
 *            only on evidence, and as fast where victims are few (a large
 *            cache) as where they are many. HMAX bounds it (a cap: no
 *            figure measured moved with it; EVICTION.md).
 *   series   tiers in series as one cache (G2, then G3: evict.h, lead and
 *            reach). The lead, the last tier's instance, whose victims are
 *            the whole cache's (a victim of G2 mostly stays in G3), decides
 *            what the cache keeps: in its own order, and at the boundary
 *            (admit, below). It counts H, and its steps, in the whole
 *            cache's capacity, as one tier of that size would, and in the
 *            whole cache's accesses per victim: the accesses an instance
 *            that follows it is told of count in the lead too, and the
 *            blocks that enter the lead from above do not (their accesses
 *            were counted there). An instance that follows a lead ranks by
 *            recency alone (H 0, the newest rule kept): the tier above
 *            holds the blocks used last, a window in front of the lead as
 *            W-TinyLFU's LRU window is in front of its main cache (Einziger
 *            et al., ACM ToS 2017), and each block it lets go meets the
 *            lead's order at the boundary. Ranked with the lead's H, the
 *            tier above sent its blocks used once down first, fronts of
 *            chains just stored among them, and the lead decided among the
 *            leftovers of two orders: the agentic trace at 1% 0.38 points
 *            under one tier (tiers/EVICTION.md, "G2 as the lead's window").
 *            A lead's victim comes back through the tier above: a block
 *            new there whose key the lead's history holds (stored again)
 *            is counted back by the lead at once, as one tier counts it
 *            (by the heap it left), and is used again; it is not counted
 *            again when it enters the lead.
 *   admit    a victim of the tier above that ranks before this tier's
 *            next victim would be the next to go: declined (the core drops
 *            it instead of writing it; G3.md), and remembered in the
 *            history as this tier's victim; a leaf of a chain being stored
 *            (the newest above) always enters.
 *   newest   reuse's rule: the block added last (the leaf a chain being
 *            stored grows from) goes only when no other block of its
 *            class is held.
 *   hints    at the first hint (kv_evict_ops.hinted), a ranking by the
 *            hints (evict_hint.h: within the namespace lru's victim names,
 *            the block of the session expected back last) and miniature
 *            simulations (evict_mini.h) of two experts: this order without
 *            hints ("adapt" alone), and the hints' ("hints"). The hints are
 *            followed from then on, until the order without them leads by
 *            the clustered McNemar test; then that one, until the hints
 *            lead again. Wrong hints cost what the simulations take to see
 *            it; no hints cost nothing (no ranking, no simulation).
 *
 * Cost: without hints, reuse's (4-5 bytes per held block, 8 per block of
 * capacity: INDEX.md), and H. With hints: the owner array (4 bytes per
 * record id, kv_index.owner), the ranking's two links per record id and
 * its per-session state, and the miniatures (a fixed ~1.5 MB: up to 8192
 * sampled blocks each).
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict_hint.h"
#include "tiers/evict_impl.h"
#include "tiers/evict_mini.h"

extern const kv_evict_ops kv_evict_hints_ops;
static const kv_evict_ops kv_evict_unhinted_ops, kv_evict_aged_unhinted_ops,
    kv_evict_aged0_unhinted_ops;

/* The judge's experts: the order without hints, and the hints' */
enum { X_PLAIN = 0, X_HINTS = 1, NX = 2 };
static const kv_evict_ops *const experts[NX] = {&kv_evict_unhinted_ops, &kv_evict_hints_ops};
static const kv_evict_ops *const aged_experts[NX] = {&kv_evict_aged_unhinted_ops,
                                                     &kv_evict_hints_ops};
static const kv_evict_ops *const aged0_experts[NX] = {&kv_evict_aged0_unhinted_ops,
                                                      &kv_evict_hints_ops};

#define QBIT      (1u << 31) /* hpos: in the used-again heap */
#define EVICTED   (QBIT - 1) /* hpos: out of the tier as this policy's victim (no heap is that big) */
#define COUNTED   (QBIT - 2) /* hpos in a lead's tier: back in the tier above, counted there */
#define TIME_MASK ((1ull << 55) - 1)
#define AGE_CAPS  4  /* aged's H in capacities: the history's reach, 2C..4C victims */
#define HMAX      16 /* adapt's H at most, in capacities: a cap (tiers/EVICTION.md) */
/* Blocks a hints' miniature holds at most: as fixed-size SHARDS keeps 8K
 * samples (Waldspurger et al., FAST'15). The judge weighs trees, not
 * blocks, so it needs many sampled trees: with 1024 (auto's) the agentic
 * trace's few hundred sessions gave it a dozen, too few to tell. */
#define MINI_CAP  8192

typedef struct aheap {
  kv_bid *v;
  uint32_t n, cap;
} aheap;

typedef struct adapt {
  aheap q[2];   /* [0] used once, [1] used again; by (class, last access) */
  kv_seen seen; /* the last 2C..4C victims */
  kv_bid offered;
  kv_newest newest; /* the newest rule's block (evict_impl.h) */
  double h;     /* H, in capacities */
  int fixed;    /* aged: H stays */
  double acc, vic; /* accesses and victims lately (halved every C victims) */
  kv_minis mm;  /* the judge, from the first hint */
  kv_hrank *hr; /* the hints' order; NULL until the first hint */
} adapt;

/* ---- the two heaps ------------------------------------------------------------ */

static inline uint64_t lru_key(const kv_block *b) {
  return ((uint64_t)b->prio << 56) | (b->atime & TIME_MASK);
}

static inline void hput(kv_evict *e, adapt *a, int qi, uint32_t i, kv_bid id) {
  a->q[qi].v[i] = id;
  kv_index_at(e->ix, id)->hpos[e->tier] = (qi ? QBIT : 0) | i;
}

static void hfix(kv_evict *e, adapt *a, int qi, uint32_t i) {
  aheap *q = &a->q[qi];
  kv_bid x = q->v[i];
  uint64_t k = lru_key(kv_index_at(e->ix, x));
  while (i > 0) {
    uint32_t p = (i - 1) / 2;
    if (lru_key(kv_index_at(e->ix, q->v[p])) <= k) break;
    hput(e, a, qi, i, q->v[p]);
    i = p;
  }
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = k;
    if (l < q->n) {
      uint64_t lk = lru_key(kv_index_at(e->ix, q->v[l]));
      if (lk < mk) m = l, mk = lk;
    }
    if (l + 1 < q->n && lru_key(kv_index_at(e->ix, q->v[l + 1])) < mk) m = l + 1;
    if (m == i) break;
    hput(e, a, qi, i, q->v[m]);
    i = m;
  }
  hput(e, a, qi, i, x);
}

static int hpush(kv_evict *e, adapt *a, int qi, kv_block *b) {
  aheap *q = &a->q[qi];
  if (kv_meta_grow((void **)&q->v, &q->cap, (uint64_t)q->n + 1, sizeof *q->v)) return -ENOMEM;
  hput(e, a, qi, q->n++, b->id);
  hfix(e, a, qi, q->n - 1);
  return 0;
}

/* Takes b out of its heap; its hpos keeps a value other than KV_SLOT_NONE,
 * so a block that comes back is known not to be new. */
static void hdel(kv_evict *e, adapt *a, kv_block *b) {
  int qi = (b->hpos[e->tier] & QBIT) != 0;
  uint32_t i = b->hpos[e->tier] & ~QBIT;
  aheap *q = &a->q[qi];
  if (--q->n != i) {
    hput(e, a, qi, i, q->v[q->n]);
    hfix(e, a, qi, i);
  }
}

/* ---- the orders ---------------------------------------------------------------- */

/* The tier's capacity, or while that is unknown, what the history is
 * sized for. */
static inline double capacity(const kv_evict *e, const adapt *a) {
  return e->capacity ? e->capacity : a->seen.n;
}

/* The capacity H counts in: the whole cache's where this instance leads
 * tiers in series (evict.h: reach), else the tier's. */
static inline double span(const kv_evict *e, const adapt *a) {
  return e->reach > capacity(e, a) ? e->reach : capacity(e, a);
}

static kv_block *adapt_peek(kv_evict *e);

/* The instance whose evidence e counts in: its lead when that is of this
 * family (the last tier of a series sees the whole cache's victims), else e. */
static inline kv_evict *leader(const kv_evict *e) {
  kv_evict *l = e->lead;
  return l && l != e && l->ops && l->ops->peek == adapt_peek && l->priv ? l : (kv_evict *)e;
}

/* The H e ranks with, in capacities: its own, or 0 where it follows a lead
 * (the window in front of it: "series" above). */
static inline double ranked_h(const kv_evict *e) {
  return leader(e) != e ? 0 : ((const adapt *)e->priv)->h;
}

/* That H, in accesses. */
static inline uint64_t age_bonus(const kv_evict *e) {
  return (uint64_t)(ranked_h(e) * span(e, e->priv));
}

/* An access, counted by e and by the lead e follows: the lead's steps are in
 * the whole cache's accesses per victim. */
static void accessed(const kv_evict *e, adapt *a) {
  a->acc++;
  const kv_evict *r = leader(e);
  if (r != e) ((adapt *)r->priv)->acc++;
}

/* A victim of heap cls is back (the history held its key): H moves away
 * from the order that let it go, by a block's worth (see the top); not in
 * an instance that follows a lead, which ranks with H 0 (ranked_h). */
static void victim_back(kv_evict *e, adapt *a, int cls) {
  double c = span(e, a);
  if (a->fixed || c <= 0 || leader(e) != e) return;
  double n0 = kv_seen_count(&a->seen, 0), n1 = kv_seen_count(&a->seen, 1);
  if (n0 < 1) n0 = 1;
  if (n1 < 1) n1 = 1;
  double step = (a->vic >= 1 ? a->acc / a->vic : 1) / c; /* accesses per victim, in capacities */
  if (cls == 0) a->h -= step * (n1 > n0 ? n1 / n0 : 1);
  else a->h += step * (n0 > n1 ? n0 / n1 : 1);
  if (a->h < 0) a->h = 0;
  if (a->h > HMAX) a->h = HMAX;
}

/* b's key in the order: a block used again (heap 1) H accesses younger;
 * lru (the hints' base) with H = 0. */
static inline uint64_t order_key(const kv_block *b, int qi, uint64_t h) {
  return lru_key(b) + (qi ? h : 0);
}

/* The first block in the order with bonus h, but not the newest while
 * another block of its class is held: the smallest of the heads, or, when
 * that is the newest, of the other head and the newest's two children. */
static kv_block *first_in(kv_evict *e, adapt *a, uint64_t h) {
  kv_block *best = NULL, *alt = NULL;
  uint64_t bk = UINT64_MAX, ak = UINT64_MAX;
  for (int qi = 0; qi < 2; qi++) {
    aheap *q = &a->q[qi];
    for (uint32_t i = 0; i < q->n && i < 3; i++) {
      kv_block *b = kv_index_at(e->ix, q->v[i]);
      uint64_t k = order_key(b, qi, h);
      if (i == 0 && k < bk) bk = k, best = b;
      if (b->id != a->newest.id && (i == 0 || q->v[0] == a->newest.id) && k < ak)
        ak = k, alt = b;
    }
  }
  if (best && best->id == a->newest.id && alt && alt->prio == best->prio) return alt;
  return best;
}

/* ---- the policy ------------------------------------------------------------------ */

/* The history is sized by the tier's capacity, or while that is unknown by
 * the most blocks held (as reuse's); where this instance leads tiers in
 * series, by the whole cache's (reach): its victims are the whole cache's,
 * and one tier of that size remembers as many (sized on G3's slots alone,
 * the lead forgot victims one tier recognised when they came back:
 * tiers/EVICTION.md, "G2 + G3 as one cache", 2026-11-29). */
static void size_history(kv_evict *e, adapt *a) {
  uint32_t want = e->reach > e->capacity ? e->reach : e->capacity;
  if (!want) {
    if (e->count <= a->seen.n * 2 && a->seen.n) return;
    want = e->count > 1024 ? e->count : 1024;
  }
  if (want != a->seen.n) (void)kv_seen_size(&a->seen, want);
}

static int adapt_init(kv_evict *e) {
  adapt *a = kv_meta_calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->offered = KV_BID_NONE;
  kv_newest_init(&a->newest);
  e->priv = a;
  return 0;
}

static int fixed_init(kv_evict *e, double h) {
  int rc = adapt_init(e);
  if (rc) return rc;
  adapt *a = e->priv;
  a->h = h;
  a->fixed = 1;
  return 0;
}
static int aged_init(kv_evict *e) { return fixed_init(e, AGE_CAPS); }
static int aged0_init(kv_evict *e) { return fixed_init(e, 0); }

static void adapt_fini(kv_evict *e) {
  adapt *a = e->priv;
  if (!a) return;
  kv_minis_fini(&a->mm);
  kv_hrank_free(a->hr);
  kv_seen_free(&a->seen);
  kv_meta_free(a->q[0].v);
  kv_meta_free(a->q[1].v);
  kv_meta_free(a);
  e->priv = NULL;
}

/* b is new to e, which follows a lead: if the lead's history holds its key
 * it was the whole cache's victim lately, and it is back now (stored
 * again), as one tier would count it: the lead counts it, and not again
 * when b enters the lead's tier (COUNTED). */
static void back_above(kv_evict *e, kv_block *b) {
  kv_evict *l = leader(e);
  if (l == e || b->hpos[l->tier] != KV_SLOT_NONE) return; /* already in the lead's tier */
  adapt *la = l->priv;
  int cls = kv_seen_class(&la->seen, kv_fingerprint(b));
  if (cls < 0) return;
  victim_back(l, la, cls);
  if (b->hits < 2) b->hits = 2;
  b->hpos[l->tier] = COUNTED;
}

static int adapt_add(kv_evict *e, kv_block *b) {
  adapt *a = e->priv;
  if (!e->reach) accessed(e, a); /* a lead's blocks enter from above, their accesses counted */
  int fresh = b->hpos[e->tier] == KV_SLOT_NONE;
  int again = fresh || b->hpos[e->tier] == EVICTED; /* not back from a pin, or from inside a chain */
  size_history(e, a);
  if (fresh) back_above(e, b);
  int back = again || b->hits < 2 ? kv_seen_class(&a->seen, kv_fingerprint(b)) : -1;
  if (again && back >= 0) victim_back(e, a, back);
  if (b->hits < 2 && back >= 0) b->hits = 2; /* evicted lately, and back: its second use */
  if (hpush(e, a, b->hits >= 2, b)) return -ENOMEM;
  e->count++;
  kv_newest_added(&a->newest, e, b);
  if (a->hr) (void)kv_hrank_add(a->hr, b); /* out of memory: ranked without its session */
  if (fresh && a->hr) kv_minis_observe(&a->mm, e->ix, b);
  return 0;
}

/* A victim went, from heap cls: counted, and its key remembered. */
static void victim_gone(kv_evict *e, adapt *a, uint32_t fp, int cls) {
  if (++a->vic >= 2 * capacity(e, a)) a->vic /= 2, a->acc /= 2; /* the last C..2C */
  kv_seen_add(&a->seen, fp, cls);
}

static void adapt_remove(kv_evict *e, kv_block *b) {
  adapt *a = e->priv;
  int victim = b->id == a->offered;
  if (victim) { /* the victim peek offered: remember its key, and its heap */
    victim_gone(e, a, kv_fingerprint(b), (b->hpos[e->tier] & QBIT) != 0);
    a->offered = KV_BID_NONE;
  }
  if (a->hr) kv_hrank_remove(a->hr, b);
  hdel(e, a, b);
  if (victim) b->hpos[e->tier] = EVICTED; /* its record may live on (another tier holds it) */
  e->count--;
}

static void adapt_touch(kv_evict *e, kv_block *b) {
  adapt *a = e->priv;
  accessed(e, a);
  if (!(b->hpos[e->tier] & QBIT) && b->hits >= 2) { /* used again: to the other heap */
    hdel(e, a, b);
    if (hpush(e, a, 1, b)) (void)hpush(e, a, 0, b); /* no room there: stays where it was */
  } else {
    hfix(e, a, (b->hpos[e->tier] & QBIT) != 0, b->hpos[e->tier] & ~QBIT);
  }
  if (!a->hr) return;
  kv_hrank_touch(a->hr, b);
  kv_minis_observe(&a->mm, e->ix, b);
}

static void adapt_seen(kv_evict *e, kv_block *b) {
  adapt *a = e->priv;
  accessed(e, a);
  if (a->hr) kv_minis_observe(&a->mm, e->ix, b);
}

static kv_block *adapt_peek(kv_evict *e) {
  adapt *a = e->priv;
  kv_block *v;
  if (a->hr && a->mm.cur == X_HINTS) v = kv_hrank_pick(a->hr, first_in(e, a, 0), a->newest.id);
  else v = first_in(e, a, age_bonus(e));
  a->offered = v ? v->id : KV_BID_NONE;
  return v;
}

/* A victim of the tier above enters unless it ranks before this tier's
 * next victim in the order without hints (with hints: always), as it
 * would rank on adding it (its class by its hits or the history); the
 * newest block of an instance of this family above (the leaf a chain
 * being stored grows from, which goes there only when alone) enters. */
static int adapt_admit(kv_evict *e, kv_evict *from, const kv_block *b) {
  adapt *a = e->priv;
  if (a->hr) return 1;
  if (from && from->ops && from->ops->peek == adapt_peek && from->priv &&
      ((adapt *)from->priv)->newest.id == b->id)
    return 1;
  uint64_t h = age_bonus(e);
  kv_block *v = first_in(e, a, h);
  if (!v) return 1;
  int qi = b->hits >= 2 || kv_seen_has(&a->seen, kv_fingerprint(b));
  if (order_key(b, qi, h) >= order_key(v, (v->hpos[e->tier] & QBIT) != 0, h)) return 1;
  victim_gone(e, a, kv_fingerprint(b), qi); /* the cache's victim: remembered as this tier's */
  return 0;
}

/* The first hint: the hints' ranking and the judge start, and the hints
 * are followed (out of memory: they are not, and the order goes on
 * without them). */
static void start_hints(kv_evict *e, adapt *a) {
  a->hr = kv_hrank_new(e);
  if (!a->hr) return;
  const kv_evict_ops *const *xs = !a->fixed ? experts : a->h > 0 ? aged_experts : aged0_experts;
  if (kv_minis_init(&a->mm, xs, NX, e->capacity, MINI_CAP, (1u << NX) - 1, e->ix) ||
      kv_minis_cluster(&a->mm)) {
    kv_minis_fini(&a->mm);
    kv_hrank_free(a->hr);
    a->hr = NULL;
    return;
  }
  kv_minis_follow(&a->mm, X_HINTS);
}

static void adapt_hinted(kv_evict *e, kv_block *b, uint32_t old_ref) {
  adapt *a = e->priv;
  if (!a->hr) start_hints(e, a);
  if (!a->hr) return;
  kv_hrank_hinted(a->hr, b, old_ref);
  kv_minis_hinted(&a->mm, e->ix, b);
}

static void adapt_session(kv_evict *e, uint32_t slot) {
  adapt *a = e->priv;
  if (!a->hr) return;
  kv_hrank_session(a->hr, slot);
  kv_minis_session(&a->mm, slot);
}

double kv_evict_adapt_bonus(const kv_evict *e) {
  const adapt *a = e->priv;
  return a ? a->h : 0;
}

double kv_evict_adapt_ranked_bonus(const kv_evict *e) { return e->priv ? ranked_h(e) : 0; }

const char *kv_evict_adapt_following(const kv_evict *e, uint64_t *switches) {
  const adapt *a = e->priv;
  if (switches) *switches = a ? a->mm.switches : 0;
  if (!a) return "adapt";
  if (a->hr) return a->mm.ops[a->mm.cur]->name;
  return !a->fixed ? "adapt" : a->h > 0 ? "aged" : "aged0";
}

/* The family's tables: one order (adapt, or H fixed: aged, aged0), with
 * hints (hinted, session) or without them (NULL, NULL). */
#define ADAPT_OPS(name, doc, init, hinted, session)                                          \
  {name, doc, init, adapt_fini, adapt_add, adapt_remove, adapt_touch, adapt_peek, adapt_seen, \
   hinted, session, adapt_admit}

const kv_evict_ops kv_evict_adapt_ops = ADAPT_OPS(
    "adapt",
    "blocks used once before blocks used again, that protection aging out after H accesses, H "
    "moving toward the queue whose victims come back; with engine hints, the block of the "
    "session expected back last, while miniature simulations do not find that worse",
    adapt_init, adapt_hinted, adapt_session);

const kv_evict_ops kv_evict_aged_ops = ADAPT_OPS(
    "aged",
    "adapt's order with H fixed at 4 capacities of accesses (the default before H moved); "
    "hints as adapt's",
    aged_init, adapt_hinted, adapt_session);

const kv_evict_ops kv_evict_aged0_ops = ADAPT_OPS(
    "aged0",
    "adapt's order with H fixed at 0: LRU's order, with the rule for the newest block; hints as "
    "adapt's",
    aged0_init, adapt_hinted, adapt_session);

/* The orders without hints, as the judge's experts: adapt, aged and aged0
 * that ignore hints (so a miniature of one starts no miniatures of its own). */
static const kv_evict_ops kv_evict_unhinted_ops =
    ADAPT_OPS("adapt", "adapt without hints", adapt_init, NULL, NULL);
static const kv_evict_ops kv_evict_aged_unhinted_ops =
    ADAPT_OPS("aged", "aged without hints", aged_init, NULL, NULL);
static const kv_evict_ops kv_evict_aged0_unhinted_ops =
    ADAPT_OPS("aged0", "aged0 without hints", aged0_init, NULL, NULL);
