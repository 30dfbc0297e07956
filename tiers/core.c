/* core.c - the cache core (see core.h). */
#include "tiers/core_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/log.h"

int kv_core_new(kv_core **out, const kv_core_opts *o) {
  const char *name = o && o->policy ? o->policy : kv_evict_default;
  const kv_evict_ops *policy = kv_evict_lookup(name);
  if (!policy) return -EINVAL;
  kv_core *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->policy = policy;
  c->storing_parent = KV_BID_NONE;
  if (o) {
    c->demote = o->demote;
    c->demote_arg = o->demote_arg;
  }
  int rc = kv_index_init(&c->ix, o && o->index_hint ? o->index_hint : 1024);
  if (rc < 0) {
    free(c);
    return rc;
  }
  kv_sessions_init(&c->sess, o ? o->sessions_max : 0,
                   o && o->retain_max_s ? o->retain_max_s : KV_RETAIN_MAX_S_DEFAULT);
  c->ix.sessions = &c->sess;
  *out = c;
  return 0;
}

/* Frees the policies the core made for a's classes (NULL: none). */
static void free_class_policies(kv_arena *a) {
  for (uint32_t k = 0; a && k < a->nclasses; k++) {
    kv_evict *e = a->cls[k].user;
    if (!e) continue;
    kv_evict_fini(&e[0]);
    kv_evict_fini(&e[1]);
    free(e);
    a->cls[k].user = NULL;
  }
}

void kv_core_free(kv_core *c) {
  if (!c) return;
  if (c->g3) {
    kv_evict_fini(&c->g3_evict);
    kv_evict_fini(&c->g3_dup);
  }
  for (unsigned o = 0; o < KV_CORE_OWNERS_MAX; o++) {
    if (!c->g3_own[o]) continue;
    kv_evict_fini(&c->g3_own[o][0]);
    kv_evict_fini(&c->g3_own[o][1]);
    free(c->g3_own[o]);
  }
  for (uint32_t p = 0; p < c->ng1; p++) free_class_policies(c->g1[p]);
  for (uint32_t i = 0; i < c->ng2a; i++) free_class_policies(c->g2a[i]);
  free(c->g2a);
  free(c->ns);
  kv_index_fini(&c->ix);
  kv_sessions_fini(&c->sess);
  free(c);
}

/* Remembers a G2 arena the core makes policies in (they outlive its
 * namespaces, which may all be freed). 0 or -ENOMEM. */
static int note_g2_arena(kv_core *c, kv_arena *arena) {
  for (uint32_t i = 0; i < c->ng2a; i++)
    if (c->g2a[i] == arena) return 0;
  if (c->ng2a == c->capg2a) {
    uint32_t cap = c->capg2a ? c->capg2a * 2 : 4;
    kv_arena **v = realloc(c->g2a, cap * sizeof *v);
    if (!v) return -ENOMEM;
    c->g2a = v;
    c->capg2a = cap;
  }
  c->g2a[c->ng2a++] = arena;
  return 0;
}

/* G2 policy e follows G3's (kv_evict.lead: the tiers as one cache),
 * whose reach counts e's capacity. */
static void follow_g3(kv_core *c, kv_evict *e) {
  e->lead = &c->g3_evict;
  c->g3_evict.reach += e->capacity;
}

void kv_core__follow_g3(kv_core *c) {
  for (uint32_t i = 0; i < c->ng2a; i++)
    for (uint32_t k = 0; k < c->g2a[i]->nclasses; k++)
      if (c->g2a[i]->cls[k].user) follow_g3(c, c->g2a[i]->cls[k].user);
}

/* Makes sure the arena class for block_bytes has its policy for tier t
 * (G2's arenas, G1's pool). Returns the class or an error. */
int kv_core__class(kv_core *c, kv_arena *arena, uint32_t block_bytes, kv_tier t) {
  int cls = kv_arena_class_for(arena, block_bytes);
  if (cls < 0) return cls;
  kv_arena_class *k = &arena->cls[cls];
  if (!k->user && t == KV_G2 && note_g2_arena(c, arena)) return -ENOMEM;
  if (!k->user) {
    /* The policy, then (G2) the instance for blocks G3 holds too. */
    kv_evict *e = calloc(2, sizeof *e);
    if (!e) return -ENOMEM;
    e->capacity = (uint32_t)(arena->capacity / k->slot_bytes);
    int rc = kv_evict_init(e, c->policy, &c->ix, t);
    if (rc == 0 && t == KV_G2 && (rc = kv_evict_init(&e[1], kv_evict_lookup("lru"), &c->ix, t)))
      kv_evict_fini(e);
    if (rc) {
      free(e);
      return rc;
    }
    if (t == KV_G2 && c->g3) follow_g3(c, e);
    k->user = e;
  }
  return cls;
}

static int ns_add(kv_core *c, kv_core_ns *proto) {
  if (c->ns_free1) { /* a freed id first */
    uint32_t i = c->ns_free1 - 1;
    c->ns_free1 = c->ns[i].next_free1;
    c->nfree--;
    c->ns[i] = *proto;
    c->ns[i].owner = -1;
    return (int)i;
  }
  if (c->nns >= KV_NS_MAX) return -ENOSPC; /* records keep 16-bit namespaces */
  if (c->nns == c->capns) {
    uint32_t cap = c->capns ? c->capns * 2 : 8;
    kv_core_ns *n = realloc(c->ns, cap * sizeof *n);
    if (!n) return -ENOMEM;
    c->ns = n;
    c->capns = cap;
  }
  c->ns[c->nns] = *proto;
  c->ns[c->nns].owner = -1;
  return (int)c->nns++;
}

/* Frees id ns for the next namespace (ns_add), which inherits nothing of
 * it: no block (it has none left), no session, no gap statistics. */
static void ns_release(kv_core *c, uint32_t ns) {
  kv_sessions_ns_drop(&c->sess, ns);
  memset(&c->ns[ns], 0, sizeof c->ns[ns]);
  c->ns[ns].cls = -1;
  c->ns[ns].owner = -1;
  c->ns[ns].next_free1 = c->ns_free1;
  c->ns_free1 = ns + 1;
  c->nfree++;
  c->st.ns_freed++;
}

int kv_core_ns_free(kv_core *c, uint32_t ns) {
  if (ns >= c->nns || !c->ns[ns].live) return -EINVAL;
  if (c->ns[ns].nblocks) return -EBUSY;
  ns_release(c, ns);
  return 0;
}

int kv_core_ns_register(kv_core *c, kv_arena *arena, uint32_t block_bytes) {
  if (!arena) return -EINVAL;
  int cls = kv_core__class(c, arena, block_bytes, KV_G2);
  if (cls < 0) return cls;
  kv_core_ns n = {.arena = arena, .cls = cls, .block_bytes = block_bytes, .live = 1};
  return ns_add(c, &n);
}

int kv_core_ns_register_digest(kv_core *c, kv_arena *arena, uint32_t block_bytes,
                               const uint8_t digest[KV_G3_NS_BYTES]) {
  if (!arena) return -EINVAL;
  for (uint32_t i = 0; i < c->nns; i++) {
    kv_core_ns *n = &c->ns[i];
    if (!n->has_digest || memcmp(n->digest, digest, KV_G3_NS_BYTES)) continue;
    if (n->arena) return n->arena == arena && n->block_bytes == block_bytes ? (int)i : -EINVAL;
    if (n->block_bytes != block_bytes) return -EINVAL;
    int cls = kv_core__class(c, arena, block_bytes, KV_G2);
    if (cls < 0) return cls;
    n->arena = arena;
    n->cls = cls;
    return (int)i;
  }
  int cls = kv_core__class(c, arena, block_bytes, KV_G2);
  if (cls < 0) return cls;
  kv_core_ns n = {
      .arena = arena, .cls = cls, .block_bytes = block_bytes, .live = 1, .has_digest = 1};
  memcpy(n.digest, digest, KV_G3_NS_BYTES);
  return ns_add(c, &n);
}

kv_evict *kv_core__policy(kv_core *c, uint32_t ns, kv_tier t, unsigned pool) {
  kv_core_ns *n = &c->ns[ns];
  if (t == KV_G3) {
    if (!c->g3) return NULL;
    return n->owner >= 0 && c->g3_own[n->owner] ? c->g3_own[n->owner] : &c->g3_evict;
  }
  if (t == KV_G1)
    return pool < c->ng1 && n->g1cls1[pool] ? c->g1[pool]->cls[n->g1cls1[pool] - 1].user : NULL;
  return n->arena && n->cls >= 0 ? n->arena->cls[n->cls].user : NULL;
}

kv_evict *kv_core__policy_of(kv_core *c, const kv_block *b, kv_tier t) {
  unsigned pool = t == KV_G1 && b->slot[KV_G1] != KV_SLOT_NONE ? kv_g1_pool_of(b->slot[KV_G1]) : 0;
  kv_evict *e = kv_core__policy(c, b->ns, t, pool);
  /* G2 and G3 rank the blocks the other holds too apart: they go first. */
  if (e && t == KV_G2 && (b->tiers & KV_TIER_BIT(KV_G3))) return e + 1;
  return e && t == KV_G3 && (b->tiers & KV_TIER_BIT(KV_G2)) ? kv_core__g3_dups(c, e) : e;
}

static kv_evict *policy_of(kv_core *c, const kv_block *b, kv_tier t) {
  return kv_core__policy_of(c, b, t);
}

/* --- a block's G3 slot (the core's files share these) --- */

void kv_core__g3_key_of(kv_core *c, const kv_block *b, kv_g3_key *k) {
  memcpy(k->ns, c->ns[b->ns].digest, KV_G3_NS_BYTES);
  k->len = (uint8_t)kv_block_keylen(b);
  memcpy(k->b, b->key, k->len);
}

void kv_core__set_g3_slot(kv_core *c, kv_block *b, uint32_t slot) {
  kv_core_ns *n = &c->ns[b->ns];
  int had = b->slot[KV_G3] != KV_SLOT_NONE, has = slot != KV_SLOT_NONE;
  b->slot[KV_G3] = slot;
  if (had == has) return;
  n->g3_slots += has ? 1 : (uint32_t)-1;
  if (n->owner >= 0) c->g3_own_slots[n->owner] += has ? 1 : (uint64_t)-1;
}

uint64_t kv_core__g3_free(kv_core *c) {
  if (!c->g3) return 0;
  kv_g3_stats gs;
  kv_g3_get_stats(c->g3, &gs);
  return gs.slots_free;
}

/* Whether evicting b from tier t would leave children of b in a faster
 * tier with no parent anywhere: t is the last tier a copy of b can go to
 * (G3, or G2 with nothing to demote into), b has no copy in another tier,
 * and a child of b is valid in a faster tier. Such a copy stays: with a
 * small G2 in front of G3, dropping the SSD copy of a block whose child
 * was just promoted would cut the chain at that block, and every block
 * after it would be stored but never reached by a prefix lookup. */
static int strands_children(kv_core *c, const kv_block *b, kv_tier t) {
  if (t == KV_G1 || (t == KV_G2 && (c->g3 || c->demote))) return 0; /* demoted, not dropped */
  if (b->tiers & (uint8_t)~KV_TIER_BIT(t)) return 0;
  for (int u = 0; u < (int)t; u++)
    if (b->rchild[u]) return 1;
  /* G2 with nothing below: a child being written would be committed under
   * no parent. A request that allocates its blocks after its loaded prefix
   * at once would otherwise make room by evicting that prefix from its end
   * (its last block is a leaf until a child is committed), and every block
   * it then commits would be cut off (tiers/EVICTION.md, "Through the
   * daemon"). Only a G2 leaf's children are walked here: none is valid in
   * G2 or G1, so they are being written or gone. */
  if (t == KV_G2)
    for (kv_block *ch = kv_index_at(&c->ix, b->child); ch; ch = kv_index_at(&c->ix, ch->next))
      if (ch->state == KV_BS_WRITING) return 1;
  return 0;
}

/* Puts b into, or takes it out of, tier t's policy to match the rule in
 * evict.h. Every change to what that rule reads ends here. */
static void sync_evictable(kv_core *c, kv_block *b, kv_tier t) {
  uint8_t bit = (uint8_t)KV_TIER_BIT(t);
  /* Leaf-first, except for the SSD copy of a block G2 holds too: the chain
   * stays whole through the G2 copy (written back to G3 when G2 evicts it),
   * so that copy may go before its children (tiers/G3.md). */
  int leaf = b->rchild[t] == 0 || (t == KV_G3 && (b->tiers & KV_TIER_BIT(KV_G2)));
  int want = (b->tiers & bit) && b->state == KV_BS_READY && b->pins == 0 && !(b->busy & bit) &&
             leaf && !strands_children(c, b, t);
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
void kv_core__sync_all(kv_core *c, kv_block *b) { sync_all(c, b); }

/* p gained a child valid in tier t (already linked, its bit already set). A
 * count at KV_RCHILD_STUCK stays there: only a recount can lower it. */
static void rchild_inc(kv_core *c, kv_block *p, kv_tier t) {
  if (p->rchild[t] == KV_RCHILD_STUCK) return;
  if (p->rchild[t]++ == 0) sync_all(c, p);
}

/* p lost a child valid in tier t (its bit already cleared). A stuck count
 * is recounted from the children: the cost of a 16-bit count, paid only by
 * a block with 65535 or more children valid in one tier. */
static void rchild_dec(kv_core *c, kv_block *p, kv_tier t) {
  if (p->rchild[t] == KV_RCHILD_STUCK) {
    uint32_t n = 0;
    for (kv_block *ch = kv_index_at(&c->ix, p->child); ch && n < KV_RCHILD_STUCK;
         ch = kv_index_at(&c->ix, ch->next))
      n += (ch->tiers & KV_TIER_BIT(t)) != 0;
    p->rchild[t] = (uint16_t)n;
  } else {
    p->rchild[t]--;
  }
  if (p->rchild[t] == 0) sync_all(c, p);
}

/* b's copy in tier t (G2 or G3) is about to come or go, which moves b
 * between the other tier's two instances (kv_core__policy_of: each ranks
 * apart the blocks the other holds too): b leaves the one it is in, and the
 * sync that follows the change puts it in the other. */
static void other_leave(kv_core *c, kv_block *b, kv_tier t) {
  if (t != KV_G2 && t != KV_G3) return;
  kv_tier other = t == KV_G2 ? KV_G3 : KV_G2;
  uint8_t bit = (uint8_t)KV_TIER_BIT(other);
  if (!(b->inpol & bit)) return;
  kv_evict *e = policy_of(c, b, other);
  e->ops->remove(e, b);
  b->inpol &= (uint8_t)~bit;
}

/* b's bytes became valid (or stopped being valid) in tier t. */
void kv_core__set_valid(kv_core *c, kv_block *b, kv_tier t) {
  other_leave(c, b, t);
  b->tiers |= (uint8_t)KV_TIER_BIT(t);
  kv_block *p = kv_index_at(&c->ix, b->parent);
  if (p) rchild_inc(c, p, t);
  sync_all(c, b);
  if (c->adm.on_visible) c->adm.on_visible(c->adm.on_visible_arg, b);
}

static void clear_valid(kv_core *c, kv_block *b, kv_tier t) {
  other_leave(c, b, t);
  b->tiers &= (uint8_t)~KV_TIER_BIT(t);
  kv_block *p = kv_index_at(&c->ix, b->parent);
  if (p) rchild_dec(c, p, t);
  sync_all(c, b);
  if (c->adm.on_visible) c->adm.on_visible(c->adm.on_visible_arg, b);
}

static void link_parent(kv_core *c, kv_block *b, kv_block *p) {
  if (kv_index_link(&c->ix, b, p) != 0) return;
  for (int t = 0; t < KV_NTIERS; t++)
    if (b->tiers & KV_TIER_BIT(t)) rchild_inc(c, p, (kv_tier)t);
}

/* Removes b's record once nothing holds it: no tier, no slot, no pin, no
 * copy in flight. */
void kv_core__reap(kv_core *c, kv_block *b) {
  if (b->state != KV_BS_READY && b->state != KV_BS_WRITING) return;
  int held = b->tiers || b->busy || b->pins;
  for (int t = 0; t < KV_NTIERS; t++) held |= b->slot[t] != KV_SLOT_NONE;
  if (held) return;
  uint32_t ns = b->ns;
  if (kv_index_remove(&c->ix, b) || --c->ns[ns].nblocks) return;
  c->ns_emptied++;
  /* A namespace learned from G3 that nobody registered: nothing is left of it. */
  if (!c->ns[ns].arena) ns_release(c, ns);
}

/* Frees b's slot in tier t (its bytes there are gone) and reaps b. */
static void drop_tier(kv_core *c, kv_block *b, kv_tier t) {
  if (b->tiers & KV_TIER_BIT(t)) clear_valid(c, b, t);
  if (b->slot[t] != KV_SLOT_NONE) {
    int rc = 0;
    if (t == KV_G2) {
      rc = kv_arena_free(c->ns[b->ns].arena, b->slot[KV_G2]);
    } else if (t == KV_G1) {
      rc = kv_arena_free(c->g1[kv_g1_pool_of(b->slot[KV_G1])], kv_g1_slot_of(b->slot[KV_G1]));
    } else if (t == KV_G3) {
      kv_g3_key k;
      kv_core__g3_key_of(c, b, &k);
      rc = kv_g3_remove(c->g3, b->slot[KV_G3], &k);
    }
    if (rc)
      kv_error("core", "tier %d slot %u of a block would not free: %s", (int)t, b->slot[t],
               kv_strerror(rc));
    if (t == KV_G3) kv_core__set_g3_slot(c, b, KV_SLOT_NONE);
    else b->slot[t] = KV_SLOT_NONE;
  }
  kv_core__reap(c, b);
}

static void drop_g2(kv_core *c, kv_block *b) { drop_tier(c, b, KV_G2); }

kv_block *kv_core_find(kv_core *c, uint32_t ns, const kv_key *key) {
  kv_block *b = kv_index_find(&c->ix, ns, key->b, key->len);
  return b && b->state == KV_BS_READY && b->tiers ? b : NULL;
}

kv_block *kv_core_find_hintable(kv_core *c, uint32_t ns, const kv_key *key) {
  kv_block *b = kv_index_find(&c->ix, ns, key->b, key->len);
  return b && (b->state == KV_BS_WRITING || (b->state == KV_BS_READY && b->tiers)) ? b : NULL;
}

int kv_core_lookup(kv_core *c, uint32_t ns, const kv_key *keys, uint32_t n, uint8_t *tier_out) {
  if (!kv_core__ns_get(c, ns)) return -EINVAL;
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
  b->atime = ++c->clock;
  if (b->hits != KV_HITS_MAX) b->hits++;
  for (int t = 0; t < KV_NTIERS; t++) {
    kv_evict *e = (b->tiers & KV_TIER_BIT(t)) ? policy_of(c, b, (kv_tier)t) : NULL;
    if (!e) continue;
    if (b->inpol & KV_TIER_BIT(t)) e->ops->touch(e, b);
    else if (e->ops->seen) e->ops->seen(e, b);
  }
}

/* Evicts G2 victim v: demoted (maybe asynchronously) or dropped. */
static int evict_victim(kv_core *c, kv_block *v) {
  c->st.evictions[KV_G2]++;
  if (c->demote) { /* the caller's (kv_core_opts) or G3's (kv_core_attach_g3) */
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

kv_block *kv_core__g2_peek(kv_evict *e) {
  kv_block *v = e[1].ops->peek(&e[1]); /* a block G3 holds too: no write, no loss */
  return v ? v : e->ops->peek(e);
}

static int evict_one(kv_core *c, kv_evict *e) {
  kv_block *v = kv_core__g2_peek(e);
  if (!v) return c->demoting ? -EAGAIN : KV_EALLPINNED;
  return evict_victim(c, v);
}

int kv_core_evict_g2(kv_core *c, uint32_t ns) {
  kv_core_ns *n = kv_core__ns_get(c, ns);
  if (!n) return -EINVAL;
  return evict_one(c, n->arena->cls[n->cls].user);
}

/* The G2 room kept ready for n's class while G3 is attached: free slots
 * plus demotions in flight (kv_core_g3_opts.g2_headroom). */
uint64_t kv_core__g2_headroom(const kv_core *c, const kv_core_ns *n) {
  if (!c->g3 || !n->arena || n->block_bytes == 0) return 0;
  uint64_t cap = n->arena->capacity / n->block_bytes / 64;
  return c->g3o.g2_headroom && c->g3o.g2_headroom < cap ? c->g3o.g2_headroom : cap;
}

/* Starts demotions until n's class has its headroom, so that the next
 * stores find free slots while the SSD writes that make room go on. These
 * demotions are ahead of need: each takes a G3 slot that is free now
 * (slots G3 evicts for room come free only when their index delete
 * commits), and they leave the last one to a demotion a store needs (one
 * at a time: such a store waits for it), so a burst of them never has G3
 * refuse, and drop, a block. */
static void keep_g2_room(kv_core *c, kv_core_ns *n) {
  uint64_t want = kv_core__g2_headroom(c, n);
  while (kv_arena_room(n->arena, n->cls) + c->demoting < want && kv_core__g3_free(c) > 1)
    if (evict_one(c, n->arena->cls[n->cls].user)) break;
}

/* A G2 slot of n's class, evicting as needed. 0, KV_EALLPINNED, -EAGAIN
 * (a demotion started: room comes when it completes), -ENOMEM. */
int kv_core__alloc_g2_slot(kv_core *c, kv_core_ns *n, uint32_t *slot) {
  int rc;
  while ((rc = kv_arena_alloc(n->arena, n->cls, slot)) == -ENOSPC) {
    uint32_t before = c->demoting;
    rc = evict_one(c, n->arena->cls[n->cls].user);
    if (rc) break;
    if (c->demoting != before) {
      rc = -EAGAIN;
      break;
    }
  }
  if (rc == 0) keep_g2_room(c, n);
  return rc;
}

int kv_core_alloc(kv_core *c, uint32_t ns, const kv_key *key, const kv_key *parent, uint8_t prio,
                  kv_block **out) {
  kv_core_ns *n = kv_core__ns_get(c, ns);
  if (!n || !key || key->len == 0 || key->len > KV_KEY_MAX) return -EINVAL;
  kv_block *b = kv_index_find(&c->ix, ns, key->b, key->len);
  if (b) {
    *out = b;
    return KV_EEXISTS;
  }
  uint32_t slot;
  if (c->g3 && parent && parent->len) {
    kv_block *p = kv_index_find(&c->ix, ns, parent->b, parent->len);
    c->storing_parent = p ? p->id : KV_BID_NONE;
  }
  int rc = kv_core__alloc_g2_slot(c, n, &slot);
  c->storing_parent = KV_BID_NONE;
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
  n->nblocks++;
  b->slot[KV_G2] = slot;
  b->size = n->block_bytes;
  b->prio = prio;
  if (parent && parent->len) {
    kv_block *p = kv_index_find(&c->ix, ns, parent->b, parent->len);
    if (p) {
      link_parent(c, b, p);
      sync_evictable(c, p, KV_G2); /* a child being written: strands_children */
      /* Engine hints: until a hint names b's session, b is its parent's (a
       * request stores the blocks after its prefix; an engine that hints
       * them after their COMMIT leaves them none meanwhile: tiers/
       * EVICTION.md, "Through the daemon"). Out of memory: no owner, as
       * before any hint. */
      if (kv_sessions_owner_slot(&c->sess, &c->ix, p->id) != UINT32_MAX)
        (void)kv_sessions_set_owner(&c->ix, b->id, c->ix.owner[p->id]);
    }
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
  kv_core__set_valid(c, b, KV_G2);
  c->st.commits++;
  return 0;
}

int kv_core_abort(kv_core *c, kv_block *b) {
  if (b->state != KV_BS_WRITING) return KV_EBADSTATE;
  c->st.aborts++;
  kv_block *p = kv_index_at(&c->ix, b->parent);
  drop_g2(c, b); /* reaps b: p no longer has it as a child */
  if (p) sync_evictable(c, p, KV_G2);
  return 0;
}

int kv_core_pin(kv_core *c, kv_block *b) {
  if (b->pins == UINT16_MAX) return -EOVERFLOW;
  if (b->pins++ == 0) sync_all(c, b);
  return 0;
}

int kv_core_unpin(kv_core *c, kv_block *b) {
  if (b->pins == 0) return KV_EPINUNDERFLOW;
  if (--b->pins == 0) {
    sync_all(c, b);
    kv_core__reap(c, b); /* its bytes may have gone while it was pinned (a failed read) */
  }
  return 0;
}

int kv_core_delete(kv_core *c, kv_block *b) {
  if (b->pins || b->busy || b->state != KV_BS_READY) return -EBUSY;
  c->st.deletes++;
  /* Each drop may reap the record (its state turns free): stop then. G2
   * goes last. */
  static const kv_tier order[] = {KV_G1, KV_G3, KV_G2};
  for (unsigned i = 0; i < 3 && b->state == KV_BS_READY; i++)
    if (b->slot[order[i]] != KV_SLOT_NONE || order[i] == KV_G2) drop_tier(c, b, order[i]);
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

void kv_core__copied(kv_core *c, kv_tier from, kv_tier to, uint32_t bytes, uint64_t t0,
                     int status) {
  if (c->adm.on_copy) c->adm.on_copy(c->adm.on_copy_arg, from, to, bytes, kv_now_ns() - t0, status);
}

/* --- for tiers/core_admin.c ------------------------------------------------- */

int kv_core__evict_block(kv_core *c, kv_block *v, kv_tier t) {
  if (t == KV_G2) return evict_victim(c, v);
  c->st.evictions[t]++;
  drop_tier(c, v, t);
  return 0;
}

void kv_core__drop_tier(kv_core *c, kv_block *b, kv_tier t) { drop_tier(c, b, t); }

void kv_core__clear_valid(kv_core *c, kv_block *b, kv_tier t) { clear_valid(c, b, t); }

int kv_core__ns_add(kv_core *c, kv_core_ns *proto) { return ns_add(c, proto); }

void *kv_core_g1_ptr(const kv_core *c, const kv_block *b) {
  if (b->slot[KV_G1] == KV_SLOT_NONE || kv_g1_pool_of(b->slot[KV_G1]) >= c->ng1) return 0;
  return kv_arena_ptr(c->g1[kv_g1_pool_of(b->slot[KV_G1])], kv_g1_slot_of(b->slot[KV_G1]));
}

void *kv_core_g2_ptr(const kv_core *c, const kv_block *b) {
  if (b->slot[KV_G2] == KV_SLOT_NONE) return 0;
  return kv_arena_ptr(c->ns[b->ns].arena, b->slot[KV_G2]);
}

uint32_t kv_core_ns_blocks(const kv_core *c, uint32_t ns) {
  return ns < c->nns ? c->ns[ns].nblocks : 0;
}

int kv_core_ns_room(const kv_core *c) { return c->nfree || c->nns < KV_NS_MAX; }

void kv_core_stats(const kv_core *c, kv_core_stats_t *out) { *out = c->st; }

void kv_core_count_hit(kv_core *c, kv_tier t) { c->st.hits[t]++; }

kv_index *kv_core_index(kv_core *c) { return &c->ix; }

const char *kv_core_policy_name(const kv_core *c) { return c->policy->name; }

uint64_t kv_core_limit(const kv_core *c, kv_tier t) { return c->adm.limit[t]; }

void kv_core_on_copy(kv_core *c, kv_copy_fn fn, void *arg) {
  c->adm.on_copy = fn;
  c->adm.on_copy_arg = arg;
}

void kv_core_on_visible(kv_core *c, kv_visible_fn fn, void *arg) {
  c->adm.on_visible = fn;
  c->adm.on_visible_arg = arg;
}

kv_core_g3_opts kv_core_g3_options(const kv_core *c) { return c->g3o; }

void kv_core_set_admit(kv_core *c, kv_admit admit, uint8_t min_prio) {
  c->g3o.admit = admit;
  c->g3o.min_prio = min_prio;
}

uint64_t kv_core_ns_emptied(const kv_core *c) { return c->ns_emptied; }

uint32_t kv_core_ns_count(const kv_core *c) { return c->nns; }

int kv_core_ns_info_get(const kv_core *c, uint32_t ns, kv_core_ns_info *out) {
  if (ns >= c->nns) return -EINVAL;
  const kv_core_ns *n = &c->ns[ns];
  *out = (kv_core_ns_info){.arena = n->arena,
                           .cls = n->cls,
                           .block_bytes = n->block_bytes,
                           .live = n->live,
                           .owner = n->owner,
                           .g3_slots = n->g3_slots,
                           .nblocks = n->nblocks,
                           .digest = n->has_digest ? n->digest : NULL};
  return 0;
}

uint32_t kv_core_g1_pools(const kv_core *c) { return c->ng1; }

kv_arena *kv_core_g1_arena(const kv_core *c, unsigned p) { return p < c->ng1 ? c->g1[p] : NULL; }

int kv_core_g3_share_get(const kv_core *c, unsigned owner, uint64_t *limit_slots,
                         uint64_t *used_slots) {
  if (owner >= KV_CORE_OWNERS_MAX || !c->g3 || !c->g3_own[owner]) return -ENOENT;
  *limit_slots = c->g3_own_limit[owner];
  *used_slots = c->g3_own_slots[owner];
  return 0;
}
