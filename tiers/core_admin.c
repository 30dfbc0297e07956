/*
 * core_admin.c - what the operator may ask of the cache core: switch the
 * eviction policy live, set soft capacity limits, evict or flush on demand,
 * and walk the index (declarations and contracts in core.h, "operator
 * operations").
 *
 * Everything here goes through the public eviction interface (evict.h) and
 * the core's own eviction and drop paths, so the rules of core.h hold: a
 * pinned block, a block being written and a block with a copy in flight
 * are never evicted or dropped.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tiers/core_int.h"
#include "tiers/evict_impl.h"

/* Block ids of every record for which keep(b) holds; *out is malloc'd. */
static int64_t collect(kv_core *c, int (*keep)(const kv_block *b, const void *arg), const void *arg,
                       kv_bid **out) {
  kv_bid *v = malloc(((size_t)c->ix.count + 1) * sizeof *v);
  if (!v) return -ENOMEM;
  int64_t n = 0;
  uint64_t seen = 0;
  for (kv_bid id = 0; id < c->ix.hiwater && seen < c->ix.count; id++) {
    kv_block *b = kv_index_at(&c->ix, id);
    if (b->state == KV_BS_FREE) continue;
    seen++;
    if (keep(b, arg)) v[n++] = id;
  }
  *out = v;
  return n;
}

/* --- what the policies do, for operators ------------------------------------ */

int kv_core_policy_view_get(kv_core *c, kv_tier t, kv_core_policy_view *out) {
  enum { MAXPOL = KV_ARENA_MAX_CLASSES * 64 };
  static kv_evict *pol[MAXPOL]; /* the loop's thread only */
  uint32_t n = kv_core__tier_policies(c, t, pol, MAXPOL);
  kv_evict *e = NULL;
  for (uint32_t i = 0; i < n; i++)
    if (!e || pol[i]->count > e->count) e = pol[i];
  *out = (kv_core_policy_view){.bonus = -1, .instances = n};
  if (!e) return -ENOENT;
  const char *name = e->ops->name;
  out->following = name;
  if (!strcmp(name, "adapt") || !strcmp(name, "aged") || !strcmp(name, "aged0")) {
    out->following = kv_evict_adapt_following(e, &out->switches);
    out->bonus = kv_evict_adapt_ranked_bonus(e); /* G2's is 0 in two tiers */
  } else if (!strcmp(name, "auto")) {
    out->following = kv_evict_auto_following(e, &out->switches);
  }
  return 0;
}

/* --- policy switch -------------------------------------------------------------- */

static int in_policy(const kv_block *b, const void *arg) {
  return (b->inpol & KV_TIER_BIT(*(const kv_tier *)arg)) != 0;
}

uint32_t kv_core__tier_policies(kv_core *c, kv_tier t, kv_evict **out, uint32_t max) {
  if (t == KV_G3) return kv_core__g3_policies(c, out, max); /* owners' too, empty or not */
  uint32_t n = 0;
  if (t == KV_G2) { /* every class's, whether a namespace uses it now or not */
    for (uint32_t i = 0; i < c->ng2a; i++)
      for (uint32_t k = 0; k < c->g2a[i]->nclasses && n < max; k++)
        if (c->g2a[i]->cls[k].user) out[n++] = c->g2a[i]->cls[k].user;
    return n;
  }
  unsigned pools = t == KV_G1 ? c->ng1 : 1;
  for (uint32_t i = 0; i < c->nns; i++) {
    for (unsigned p = 0; p < pools; p++) {
      kv_evict *e = kv_core__policy(c, i, t, p);
      if (!e) continue;
      uint32_t j = 0;
      while (j < n && out[j] != e) j++;
      if (j == n && n < max) out[n++] = e;
    }
  }
  return n;
}

/* Re-creates e in place with ops and puts the blocks v[0..n) into it. */
static int refill(kv_core *c, kv_evict *e, const kv_evict_ops *ops, kv_tier t, const kv_bid *v,
                  int64_t n) {
  kv_tier tier = e->tier;
  for (int64_t i = 0; i < n; i++) { /* a rollback empties an instance already filled */
    kv_block *b = kv_index_at(&c->ix, v[i]);
    if (kv_core__policy_of(c, b, t) == e) b->inpol &= (uint8_t)~KV_TIER_BIT(t);
  }
  kv_evict_fini(e);
  int rc = kv_evict_init(e, ops, &c->ix, tier);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) {
    kv_block *b = kv_index_at(&c->ix, v[i]);
    if (b->inpol & KV_TIER_BIT(t)) continue; /* already moved */
    if (kv_core__policy_of(c, b, t) != e) continue;
    if (e->ops->add(e, b) == 0) b->inpol |= (uint8_t)KV_TIER_BIT(t);
    else kv_warn("core", "eviction policy out of memory: a block stays unevictable");
  }
  return 0;
}

int kv_core_set_policy(kv_core *c, const char *name) {
  const kv_evict_ops *ops = name ? kv_evict_lookup(name) : NULL;
  if (!ops) return -EINVAL;
  if (ops == c->policy) return 0;
  enum { MAXPOL = KV_ARENA_MAX_CLASSES * 64 };
  static kv_evict *pol[KV_NTIERS][MAXPOL]; /* the loop's thread only */
  uint32_t npol[KV_NTIERS];
  kv_bid *v[KV_NTIERS] = {NULL};
  int64_t nv[KV_NTIERS] = {0};
  for (int t = 0; t < KV_NTIERS; t++) {
    kv_tier tt = (kv_tier)t;
    npol[t] = kv_core__tier_policies(c, tt, pol[t], MAXPOL);
    nv[t] = collect(c, in_policy, &tt, &v[t]);
    if (nv[t] < 0) {
      for (int u = 0; u < t; u++) free(v[u]);
      return -ENOMEM;
    }
  }
  /* Take every block out of its old instance, then rebuild each instance
   * in place with the new policy: the pointers the arenas hold stay. */
  for (int t = 0; t < KV_NTIERS; t++) {
    for (int64_t i = 0; i < nv[t]; i++) {
      kv_block *b = kv_index_at(&c->ix, v[t][i]);
      kv_evict *e = kv_core__policy_of(c, b, (kv_tier)t);
      e->ops->remove(e, b);
      b->inpol &= (uint8_t)~KV_TIER_BIT(t);
    }
  }
  const kv_evict_ops *old = c->policy;
  int rc = 0;
  for (int t = 0; t < KV_NTIERS && !rc; t++)
    for (uint32_t i = 0; i < npol[t] && !rc; i++)
      rc = refill(c, pol[t][i], ops, (kv_tier)t, v[t], nv[t]);
  if (rc) {
    /* Out of memory building the new instances: back to the old policy. */
    for (int t = 0; t < KV_NTIERS; t++)
      for (uint32_t i = 0; i < npol[t]; i++) refill(c, pol[t][i], old, (kv_tier)t, v[t], nv[t]);
  } else {
    c->policy = ops;
  }
  /* The blocks of instances that keep their order whatever the policy (G3's
   * copies of blocks G2 holds too) go back where they were. */
  for (int t = 0; t < KV_NTIERS; t++)
    for (int64_t i = 0; i < nv[t]; i++) kv_core__sync_all(c, kv_index_at(&c->ix, v[t][i]));
  for (int t = 0; t < KV_NTIERS; t++) free(v[t]);
  return rc;
}

/* --- eviction ----------------------------------------------------------------- */

/* The next G2 victim among the policies of arena a (NULL: every arena):
 * lowest priority class, then least recently used. */
static kv_block *g2_victim(kv_core *c, const kv_arena *a) {
  kv_block *best = NULL;
  for (uint32_t i = 0; i < c->nns; i++) {
    if (a && c->ns[i].arena != a) continue;
    kv_evict *e = kv_core__policy(c, i, KV_G2, 0);
    kv_block *v = e ? kv_core__g2_peek(e) : NULL;
    if (v && (!best || v->prio < best->prio || (v->prio == best->prio && v->atime < best->atime)))
      best = v;
  }
  return best;
}

static int64_t enforce_g2(kv_core *c) {
  int64_t n = 0;
  uint64_t lim = c->adm.limit[KV_G2];
  if (!lim || c->demoting) return 0; /* demotions in flight: their room comes first */
  for (uint32_t i = 0; i < c->nns; i++) {
    kv_arena *a = c->ns[i].arena;
    if (!a) continue;
    uint32_t j = 0;
    while (j < i && c->ns[j].arena != a) j++;
    if (j < i) continue;  /* arena seen */
    uint64_t pending = 0; /* bytes an asynchronous demotion will free */
    while (a->used_bytes > pending && a->used_bytes - pending > lim) {
      kv_block *v = g2_victim(c, a);
      if (!v) break;
      uint64_t before = a->used_bytes;
      int slot_cls = kv_arena_slot_class(a, v->slot[KV_G2]);
      uint64_t bytes = slot_cls >= 0 ? a->cls[slot_cls].slot_bytes : v->size;
      if (kv_core__evict_block(c, v, KV_G2)) break;
      n++;
      if (a->used_bytes == before) pending += bytes;
    }
  }
  return n;
}

static uint64_t g3_used(kv_core *c) {
  kv_g3_stats gs;
  kv_g3_get_stats(c->g3, &gs);
  return (gs.slots - gs.slots_free) * (uint64_t)kv_g3_slot_bytes(c->g3);
}

static int64_t enforce_g3(kv_core *c) {
  uint64_t lim = c->adm.limit[KV_G3];
  if (!lim || !c->g3) return 0;
  uint64_t used = g3_used(c), sb = kv_g3_slot_bytes(c->g3);
  if (used <= lim || !sb) return 0;
  uint64_t want = (used - lim + sb - 1) / sb;
  int64_t n = 0;
  while ((uint64_t)n < want) {
    kv_block *v = kv_core__g3_victim(c);
    if (!v || kv_core__evict_block(c, v, KV_G3)) break;
    n++;
  }
  return n;
}

int kv_core_enforce_limits(kv_core *c) { return (int)(enforce_g2(c) + enforce_g3(c)); }

int kv_core_set_limit(kv_core *c, kv_tier t, uint64_t bytes) {
  if (t != KV_G2 && t != KV_G3) return -EINVAL;
  if (t == KV_G3 && !c->g3 && bytes) return -EINVAL;
  c->adm.limit[t] = bytes;
  return (int)(t == KV_G2 ? enforce_g2(c) : enforce_g3(c));
}

typedef struct scope {
  uint32_t ns;
  uint8_t tiers; /* tier bits in scope */
} scope;

/* Evictable in tier (inpol) and not being copied anywhere, of the namespace. */
static int evictable_in(const kv_block *b, const void *arg) {
  const scope *s = arg;
  return b->ns == s->ns && (b->inpol & s->tiers) && !b->busy;
}

int64_t kv_core_evict_n(kv_core *c, kv_tier t, uint32_t ns, uint64_t n) {
  if ((t != KV_G2 && t != KV_G3) || (t == KV_G3 && !c->g3)) return -EINVAL;
  if (ns != KV_NS_ANY && ns >= c->nns) return -EINVAL;
  int64_t done = 0;
  if (ns == KV_NS_ANY) {
    while ((uint64_t)done < n) {
      kv_block *v = t == KV_G2 ? g2_victim(c, NULL) : kv_core__g3_victim(c);
      if (!v || kv_core__evict_block(c, v, t)) break;
      done++;
    }
    return done;
  }
  /* One namespace: its evictable blocks in index order, again while an
   * eviction made a parent evictable (chains go from their end). */
  scope s = {ns, (uint8_t)KV_TIER_BIT(t)};
  for (;;) {
    kv_bid *v;
    int64_t m = collect(c, evictable_in, &s, &v);
    if (m < 0) return done ? done : m;
    int64_t before = done;
    for (int64_t i = 0; i < m && (uint64_t)done < n; i++) {
      kv_block *b = kv_index_at(&c->ix, v[i]);
      if (b->state != KV_BS_READY || !evictable_in(b, &s)) continue;
      if (kv_core__evict_block(c, b, t) == 0) done++;
    }
    free(v);
    if (done == before || (uint64_t)done >= n) return done;
  }
}

static int flushable(const kv_block *b, const void *arg) {
  const scope *s = arg;
  return b->state == KV_BS_READY && (s->ns == KV_NS_ANY || b->ns == s->ns) &&
         (b->tiers & s->tiers) && b->pins == 0 && !b->busy;
}

int64_t kv_core_flush(kv_core *c, uint8_t t, uint32_t ns) {
  if (t != KV_G2 && t != KV_G3 && t != KV_TIER_NONE) return -EINVAL;
  if (ns != KV_NS_ANY && ns >= c->nns) return -EINVAL;
  scope s = {ns, t == KV_TIER_NONE ? (uint8_t)(KV_TIER_BIT(KV_G2) | KV_TIER_BIT(KV_G3))
                                   : (uint8_t)KV_TIER_BIT(t)};
  kv_bid *v;
  int64_t m = collect(c, flushable, &s, &v);
  if (m < 0) return m;
  int64_t dropped = 0;
  for (int64_t i = 0; i < m; i++) {
    kv_block *b = kv_index_at(&c->ix, v[i]);
    for (int tt = KV_G3; tt >= KV_G2; tt--) {
      if (!flushable(b, &s) || !(b->tiers & s.tiers & KV_TIER_BIT(tt))) continue;
      kv_core__drop_tier(c, b, (kv_tier)tt);
      dropped++;
    }
  }
  free(v);
  return dropped;
}

int kv_core_drop(kv_core *c, kv_block *b, uint8_t mask) {
  if (mask & (uint8_t) ~(KV_TIER_BIT(KV_NTIERS) - 1)) return -EINVAL;
  if (b->pins || b->state != KV_BS_READY || (b->busy & mask)) return -EBUSY;
  /* Each drop may reap the record (its state turns free): stop then. */
  for (int t = KV_G1; t < KV_NTIERS && b->state == KV_BS_READY; t++)
    if ((mask & KV_TIER_BIT(t)) && (b->slot[t] != KV_SLOT_NONE || (b->tiers & KV_TIER_BIT(t))))
      kv_core__drop_tier(c, b, (kv_tier)t);
  return 0;
}

uint64_t kv_core_sample(kv_core *c, uint8_t t, uint32_t ns, kv_sample_fn fn, void *arg) {
  uint64_t n = 0, seen = 0;
  int stop = fn == NULL;
  for (kv_bid id = 0; id < c->ix.hiwater && seen < c->ix.count; id++) {
    kv_block *b = kv_index_at(&c->ix, id);
    if (b->state == KV_BS_FREE) continue;
    seen++;
    if (b->state != KV_BS_READY || !b->tiers) continue;
    if (ns != KV_NS_ANY && b->ns != ns) continue;
    if (t != KV_TIER_NONE && !(b->tiers & KV_TIER_BIT(t))) continue;
    n++;
    if (!stop) stop = fn(b, arg);
  }
  return n;
}
