/* core.c - the cache core (see core.h). */
#include "tiers/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "proto/errors.h"

int kv_core_init(kv_core *c, const kv_core_opts *o) {
  memset(c, 0, sizeof *c);
  const char *name = o && o->policy ? o->policy : kv_evict_default;
  c->policy = kv_evict_lookup(name);
  if (!c->policy) return -EINVAL;
  if (o) {
    c->demote = o->demote;
    c->demote_arg = o->demote_arg;
  }
  return kv_index_init(&c->ix, o && o->index_hint ? o->index_hint : 1024);
}

void kv_core_fini(kv_core *c) {
  for (uint32_t i = 0; i < c->nns; i++) {
    kv_arena_class *k = &c->ns[i].arena->cls[c->ns[i].cls];
    kv_evict *e = k->user;
    if (!e) continue;
    kv_evict_fini(e);
    free(e);
    k->user = NULL;
  }
  free(c->ns);
  kv_index_fini(&c->ix);
  memset(c, 0, sizeof *c);
}

int kv_core_ns_register(kv_core *c, kv_arena *arena, uint32_t block_bytes) {
  if (!arena) return -EINVAL;
  int cls = kv_arena_class_for(arena, block_bytes);
  if (cls < 0) return cls;
  kv_arena_class *k = &arena->cls[cls];
  if (!k->user) {
    kv_evict *e = calloc(1, sizeof *e);
    if (!e) return -ENOMEM;
    int rc = kv_evict_init(e, c->policy, &c->ix, KV_G2);
    if (rc) { free(e); return rc; }
    k->user = e;
  }
  if (c->nns == c->capns) {
    uint32_t cap = c->capns ? c->capns * 2 : 8;
    kv_core_ns *n = realloc(c->ns, cap * sizeof *n);
    if (!n) return -ENOMEM; /* the policy stays with the class for later */
    c->ns = n;
    c->capns = cap;
  }
  c->ns[c->nns] = (kv_core_ns){arena, cls, block_bytes, 1};
  return (int)c->nns++;
}

static inline kv_core_ns *ns_get(kv_core *c, uint32_t ns) {
  return ns < c->nns && c->ns[ns].live ? &c->ns[ns] : NULL;
}

static kv_evict *policy_of(kv_core *c, const kv_block *b, kv_tier t) {
  if (t != KV_G2) return NULL; /* G1 and G3 bring their own policies */
  kv_core_ns *n = &c->ns[b->ns];
  return n->arena->cls[n->cls].user;
}

/* Puts b into, or takes it out of, tier t's policy to match the rule in
 * evict.h. Every change to what that rule reads ends here. */
static void sync_evictable(kv_core *c, kv_block *b, kv_tier t) {
  uint8_t bit = (uint8_t)KV_TIER_BIT(t);
  int want = (b->tiers & bit) && b->state == KV_BS_READY && b->pins == 0 &&
             !(b->busy & bit) && b->rchild[t] == 0;
  int have = (b->inpol & bit) != 0;
  if (want == have) return;
  kv_evict *e = policy_of(c, b, t);
  if (!e) return;
  if (want) {
    if (e->ops->add(e, b) == 0) b->inpol |= bit;
    else kv_warn("core", "eviction policy out of memory: a block stays unevictable");
  } else {
    e->ops->remove(e, b);
    b->inpol &= (uint8_t)~bit;
  }
}

static void sync_all(kv_core *c, kv_block *b) {
  for (int t = 0; t < KV_NTIERS; t++) sync_evictable(c, b, (kv_tier)t);
}

/* b's bytes became valid (or stopped being valid) in tier t. */
static void set_valid(kv_core *c, kv_block *b, kv_tier t) {
  b->tiers |= (uint8_t)KV_TIER_BIT(t);
  kv_block *p = kv_index_at(&c->ix, b->parent);
  if (p && p->rchild[t]++ == 0) sync_evictable(c, p, t);
  sync_evictable(c, b, t);
}

static void clear_valid(kv_core *c, kv_block *b, kv_tier t) {
  b->tiers &= (uint8_t)~KV_TIER_BIT(t);
  kv_block *p = kv_index_at(&c->ix, b->parent);
  if (p && --p->rchild[t] == 0) sync_evictable(c, p, t);
  sync_evictable(c, b, t);
}

static void link_parent(kv_core *c, kv_block *b, kv_block *p) {
  if (kv_index_link(&c->ix, b, p) != 0) return;
  for (int t = 0; t < KV_NTIERS; t++)
    if ((b->tiers & KV_TIER_BIT(t)) && p->rchild[t]++ == 0) sync_evictable(c, p, (kv_tier)t);
}

/* Frees b's G2 slot and, when no tier holds it any more, its record. */
static void drop_g2(kv_core *c, kv_block *b) {
  if (b->tiers & KV_TIER_BIT(KV_G2)) clear_valid(c, b, KV_G2);
  if (b->slot[KV_G2] != KV_SLOT_NONE) {
    int rc = kv_arena_free(c->ns[b->ns].arena, b->slot[KV_G2]);
    if (rc) kv_error("core", "G2 slot %u of a block would not free: %s",
                     b->slot[KV_G2], kv_strerror(rc));
    b->slot[KV_G2] = KV_SLOT_NONE;
  }
  int anywhere = b->tiers || b->busy;
  for (int t = 0; t < KV_NTIERS; t++) anywhere |= b->slot[t] != KV_SLOT_NONE;
  if (!anywhere) kv_index_remove(&c->ix, b);
}

kv_block *kv_core_find(kv_core *c, uint32_t ns, const kv_key *key) {
  kv_block *b = kv_index_find(&c->ix, ns, key->b, key->len);
  return b && b->state == KV_BS_READY && b->tiers ? b : NULL;
}

int kv_core_lookup(kv_core *c, uint32_t ns, const kv_key *keys, uint32_t n,
                   uint8_t *tier_out) {
  if (!ns_get(c, ns)) return -EINVAL;
  uint32_t prefix = 0;
  int run = 1;
  for (uint32_t i = 0; i < n; i++) {
    kv_block *b = kv_core_find(c, ns, &keys[i]);
    uint8_t tier = KV_TIER_NONE;
    if (b) {
      tier = (uint8_t)__builtin_ctz(b->tiers);
      c->st.hits[tier]++;
    } else {
      c->st.misses++;
    }
    if (tier_out) tier_out[i] = tier;
    if (run && b) prefix++;
    else run = 0;
  }
  c->st.lookups += n;
  return (int)prefix;
}

void kv_core_touch(kv_core *c, kv_block *b) {
  b->atime2 = b->atime;
  b->atime = ++c->clock;
  if (b->hits != UINT16_MAX) b->hits++;
  for (int t = 0; t < KV_NTIERS; t++) {
    if (!(b->inpol & KV_TIER_BIT(t))) continue;
    kv_evict *e = policy_of(c, b, (kv_tier)t);
    if (e) e->ops->touch(e, b);
  }
}

static int evict_one(kv_core *c, kv_evict *e) {
  kv_block *v = e->ops->peek(e);
  if (!v) return c->demoting ? -EAGAIN : KV_EALLPINNED;
  c->st.evictions[KV_G2]++;
  if (c->demote) {
    c->st.demotions++;
    int r = c->demote(c, v, KV_G2, c->demote_arg);
    if (r == KV_DEMOTE_ASYNC) {
      v->busy |= (uint8_t)KV_TIER_BIT(KV_G2);
      sync_evictable(c, v, KV_G2);
      c->demoting++;
      return 0;
    }
    if (r < 0) c->st.demote_failed++;
  }
  drop_g2(c, v);
  return 0;
}

int kv_core_evict_g2(kv_core *c, uint32_t ns) {
  kv_core_ns *n = ns_get(c, ns);
  if (!n) return -EINVAL;
  return evict_one(c, n->arena->cls[n->cls].user);
}

int kv_core_alloc(kv_core *c, uint32_t ns, const kv_key *key,
                  const kv_key *parent, uint8_t prio, kv_block **out) {
  kv_core_ns *n = ns_get(c, ns);
  if (!n || !key || key->len == 0 || key->len > KV_KEY_MAX) return -EINVAL;
  kv_block *b = kv_index_find(&c->ix, ns, key->b, key->len);
  if (b) {
    *out = b;
    return KV_EEXISTS;
  }
  uint32_t slot;
  int rc;
  while ((rc = kv_arena_alloc(n->arena, n->cls, &slot)) == -ENOSPC) {
    uint32_t before = c->demoting;
    rc = evict_one(c, n->arena->cls[n->cls].user);
    if (rc) break;
    if (c->demoting != before) { rc = -EAGAIN; break; }
  }
  if (rc) {
    c->st.alloc_failed++;
    return rc;
  }
  rc = kv_index_insert(&c->ix, ns, key->b, key->len, &b);
  if (rc) {
    kv_arena_free(n->arena, slot);
    c->st.alloc_failed++;
    return rc;
  }
  b->slot[KV_G2] = slot;
  b->size = n->block_bytes;
  b->prio = prio;
  if (parent && parent->len) {
    kv_block *p = kv_index_find(&c->ix, ns, parent->b, parent->len);
    if (p) link_parent(c, b, p);
  }
  c->st.allocs++;
  *out = b;
  return 0;
}

int kv_core_commit(kv_core *c, kv_block *b, uint32_t crc) {
  if (b->state != KV_BS_WRITING || b->slot[KV_G2] == KV_SLOT_NONE) return KV_EBADSTATE;
  b->crc = crc;
  b->state = KV_BS_READY;
  b->hits = 0;
  kv_core_touch(c, b);
  set_valid(c, b, KV_G2);
  c->st.commits++;
  return 0;
}

int kv_core_abort(kv_core *c, kv_block *b) {
  if (b->state != KV_BS_WRITING) return KV_EBADSTATE;
  c->st.aborts++;
  drop_g2(c, b);
  return 0;
}

int kv_core_pin(kv_core *c, kv_block *b) {
  if (b->pins == UINT32_MAX) return -EOVERFLOW;
  if (b->pins++ == 0) sync_all(c, b);
  return 0;
}

int kv_core_unpin(kv_core *c, kv_block *b) {
  if (b->pins == 0) return KV_EPINUNDERFLOW;
  if (--b->pins == 0) sync_all(c, b);
  return 0;
}

int kv_core_delete(kv_core *c, kv_block *b) {
  if (b->pins || b->busy || b->state != KV_BS_READY) return -EBUSY;
  c->st.deletes++;
  drop_g2(c, b);
  return 0;
}

void kv_core_set_priority(kv_core *c, kv_block *b, uint8_t prio) {
  b->prio = prio;
  for (int t = 0; t < KV_NTIERS; t++) {
    if (!(b->inpol & KV_TIER_BIT(t))) continue;
    kv_evict *e = policy_of(c, b, (kv_tier)t);
    if (e) e->ops->touch(e, b);
  }
}

void kv_core_demote_done(kv_core *c, kv_block *b, kv_tier from, int ok) {
  uint8_t bit = (uint8_t)KV_TIER_BIT(from);
  if (!(b->busy & bit)) return;
  b->busy &= (uint8_t)~bit;
  if (c->demoting) c->demoting--;
  if (!ok) c->st.demote_failed++;
  if (from == KV_G2 && b->pins == 0) drop_g2(c, b);
  else sync_evictable(c, b, from);
}
