/* core_g3.c - the cache core's SSD tier: G2 victims admitted and written to
 * G3, G3's own eviction and its shares per owner, the warm restart that
 * learns what G3 holds, and promotion back to G2 (see core.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/log.h"
#include "tiers/core_int.h"
#include "tiers/evict_heap.h"

/* --- the SSD copies of blocks G2 holds too -------------------------------------
 *
 * Dropping one loses no block, so they are G3's first victims (tiers/G3.md).
 * They go most recently used first: G2 keeps that block longest, and while
 * the copies of the blocks G2 evicts sooner are still there, G2's evictions
 * need no write. */
static uint64_t score_mru(const kv_heap *h, const kv_block *b) {
  (void)h;
  return ~b->atime & KV_HEAP_TIME_MASK;
}
static int init_dups(kv_evict *e) { return kv_heap_init(e, score_mru); }

static const kv_evict_ops g3_dup_ops = {
    .name = "g3-copies",
    .summary = "SSD copies of blocks G2 holds too, most recently used first",
    .init = init_dups,
    .fini = kv_heap_fini,
    .add = kv_heap_add,
    .remove = kv_heap_remove,
    .touch = kv_heap_touch,
    .peek = kv_heap_peek,
};

typedef struct g3_op {
  kv_core *c;
  kv_bid bid;
  uint32_t slot;
  kv_promote_cb cb;
  void *arg;
  uint64_t t0;  /* start, for kv_core_admin.on_copy */
  uint32_t crc; /* a promotion: the CRC of the bytes read (a lossy record's own) */
} g3_op;

static int admitted(kv_core *c, const kv_block *b) {
  switch (c->g3o.admit) {
  case KV_ADMIT_SECOND_USE: return b->hits >= 2;
  case KV_ADMIT_MIN_PRIO: return b->prio >= c->g3o.min_prio;
  default: return 1;
  }
}

/* The next G3 victim of owner o's blocks: a copy G2 also holds first. */
static kv_block *own_victim(kv_core *c, unsigned o) {
  kv_block *x = c->g3_own[o][1].ops->peek(&c->g3_own[o][1]);
  return x ? x : c->g3_own[o][0].ops->peek(&c->g3_own[o][0]);
}

static int evict_g3_one(kv_core *c) {
  kv_block *v = kv_core__g3_victim(c);
  if (!v) return KV_EALLPINNED;
  c->st.evictions[KV_G3]++;
  kv_core__drop_tier(c, v, KV_G3);
  return 0;
}

static void g3_written(int status, void *arg) {
  g3_op *op = arg;
  kv_core *c = op->c;
  kv_block *b = kv_index_at(&c->ix, op->bid);
  kv_core__copied(c, KV_G2, KV_G3, b->size, op->t0, status);
  free(op);
  b->busy &= (uint8_t)~KV_TIER_BIT(KV_G3);
  if (status == 0) {
    c->st.g3_admitted++;
    kv_core__set_valid(c, b, KV_G3);
  } else {
    if (status == -EMSGSIZE) { /* coded, still larger than a slot */
      c->st.g3_refused++;
      c->st.g3_too_large++;
    } else {
      c->st.g3_write_failed++;
    }
    kv_g3_free(c->g3, b->slot[KV_G3]);
    kv_core__set_g3_slot(c, b, KV_SLOT_NONE);
  }
  kv_core_demote_done(c, b, KV_G2, status == 0);
}

/* G2 victim v would take the room of G3's next victim, which the shared
 * policy ranks (no copy G2 holds too goes first, v's namespace has no
 * share), and that policy ranks v before it (kv_evict_ops.admit): v would
 * be the next to go anyway. Only a leaf of the whole cache (no child in
 * any tier, nor on its way to one), and not the parent of the block whose
 * G2 slot this demotion makes (it gets its child next; G2's newest block,
 * which always enters, is the one added last: not that parent when it is
 * the end of a request's found prefix, or a promotion landed since):
 * dropping a parent would cut a chain. */
static int outranked(kv_core *c, const kv_block *v) {
  kv_evict *e = &c->g3_evict;
  if (!e->ops->admit || v->child != KV_BID_NONE || v->id == c->storing_parent ||
      kv_core__policy(c, v->ns, KV_G3, 0) != e)
    return 0;
  kv_block *x = kv_core__g3_victim(c);
  return x && kv_core__policy_of(c, x, KV_G3) == e &&
         !e->ops->admit(e, kv_core__policy_of(c, v, KV_G2), v);
}

/* The free G3 slots kept ready (free or retiring) when G2 victim v is
 * demoted: they take the demotions that start before the next poll, which
 * are G2's ahead of need (at most its headroom, keep_g2_room) and the one a
 * store waits for. More would hold no block: a slot kept free is a slot of
 * the one cache that G2 + G3 are, lost (with G2 a tenth of G3, 1/64 of G3
 * is ten times G2's headroom). The configured mark (kv_core_g3_opts) when
 * smaller; at least 2. */
static uint64_t low_water(kv_core *c, const kv_block *v) {
  uint64_t need = kv_core__g2_headroom(c, &c->ns[v->ns]) + 1;
  if (need < 2) need = 2;
  return c->g3o.low_water < need ? c->g3o.low_water : need;
}

/* The demotion callback when G3 is attached: the G2 victim's bytes are
 * written to an SSD slot, and its G2 slot is freed when they are durable. */
int kv_core__g3_demote(kv_core *c, kv_block *v, kv_tier from, void *unused) {
  if (v->tiers & KV_TIER_BIT(KV_G3)) return KV_DEMOTE_DONE; /* already there */
  unsigned code = c->ns[v->ns].g3_code;
  if (!admitted(c, v) || !kv_g3_writable(c->g3) || !c->ns[v->ns].has_digest) {
    c->st.g3_refused++;
    return KV_DEMOTE_DONE;
  }
  /* Raw, a block must fit a slot; coded, its stored form (known once
   * coded, off the loop: g3_written counts a refusal then). */
  if (v->size > (code ? kv_g3_block_max(c->g3) : kv_g3_slot_bytes(c->g3))) {
    c->st.g3_refused++;
    c->st.g3_too_large++;
    return KV_DEMOTE_DONE;
  }
  int o = c->ns[v->ns].owner;
  if (o >= 0 && c->g3_own[o]) {
    /* The owner holds its share: its own victims make the room. */
    while (c->g3_own_slots[o] >= c->g3_own_limit[o]) {
      kv_block *x = own_victim(c, (unsigned)o);
      if (!x) {
        c->st.g3_refused++;
        c->st.g3_share_refused++;
        return KV_DEMOTE_DONE;
      }
      c->st.evictions[KV_G3]++;
      kv_core__drop_tier(c, x, KV_G3);
    }
  }
  /* Slots being retired come back free when their index delete commits:
   * counting them keeps a burst of demotions (no kv_g3_poll in between)
   * from evicting low_water blocks each. */
  kv_g3_stats gs;
  kv_g3_get_stats(c->g3, &gs);
  uint64_t f = gs.slots_free + gs.slots_retiring, lw = low_water(c, v);
  if (f < lw && outranked(c, v)) {
    c->st.g3_refused++;
    c->st.g3_outranked++;
    return KV_DEMOTE_DONE;
  }
  for (; f < lw; f++)
    if (evict_g3_one(c)) break;
  uint32_t slot;
  g3_op *op = malloc(sizeof *op);
  if (!op || kv_g3_alloc(c->g3, &slot)) {
    free(op);
    c->st.g3_refused++;
    return KV_DEMOTE_DONE;
  }
  *op = (g3_op){c, v->id, slot, NULL, NULL, kv_now_ns(), v->crc};
  kv_g3_key k;
  kv_core__g3_key_of(c, v, &k);
  kv_core__set_g3_slot(c, v, slot);
  v->busy |= (uint8_t)KV_TIER_BIT(KV_G3);
  int rc = kv_g3_write_ex(c->g3, slot, &k, ++c->g3_seq, kv_core_g2_ptr(c, v), v->size, v->crc,
                          code, g3_written, op);
  if (rc) {
    v->busy &= (uint8_t)~KV_TIER_BIT(KV_G3);
    kv_core__set_g3_slot(c, v, KV_SLOT_NONE);
    kv_g3_free(c->g3, slot);
    free(op);
    c->st.g3_refused++;
    return KV_DEMOTE_DONE;
  }
  return KV_DEMOTE_ASYNC;
}

typedef struct warm_ctx {
  kv_core *c;
  int rc;
} warm_ctx;

static int dormant_ns(kv_core *c, const uint8_t digest[KV_G3_NS_BYTES], uint32_t bytes) {
  for (uint32_t i = 0; i < c->nns; i++)
    if (c->ns[i].has_digest && !memcmp(c->ns[i].digest, digest, KV_G3_NS_BYTES)) return (int)i;
  kv_core_ns n = {.arena = NULL, .cls = -1, .block_bytes = bytes, .live = 1, .has_digest = 1};
  memcpy(n.digest, digest, KV_G3_NS_BYTES);
  return kv_core__ns_add(c, &n);
}

static int learn_entry(const kv_g3_entry *e, void *arg) {
  warm_ctx *w = arg;
  kv_core *c = w->c;
  int ns = dormant_ns(c, e->key.ns, e->len);
  if (ns < 0) return w->rc = ns;
  kv_block *b;
  int rc = kv_index_insert(&c->ix, (uint32_t)ns, e->key.b, e->key.len, &b);
  if (rc) return w->rc = rc == KV_EEXISTS ? 0 : rc;
  c->ns[ns].nblocks++;
  b->state = KV_BS_READY;
  b->size = e->len;
  b->crc = e->crc;
  kv_core__set_g3_slot(c, b, e->slot);
  b->atime = ++c->clock;
  kv_core__set_valid(c, b, KV_G3);
  c->st.warm_blocks++;
  return 0;
}

int kv_core_attach_g3(kv_core *c, kv_g3 *g3, const kv_core_g3_opts *o) {
  if (!g3 || c->g3 || c->demote) return -EINVAL;
  kv_g3_stats gs;
  kv_g3_get_stats(g3, &gs);
  c->g3_evict.capacity = (uint32_t)gs.slots;
  int rc = kv_evict_init(&c->g3_evict, c->policy, &c->ix, KV_G3);
  if (rc) return rc;
  if ((rc = kv_evict_init(&c->g3_dup, &g3_dup_ops, &c->ix, KV_G3))) {
    kv_evict_fini(&c->g3_evict);
    return rc;
  }
  c->g3 = g3;
  c->demote = kv_core__g3_demote; /* G2's victims come here (kv_demote_fn) */
  c->g3_evict.reach = c->g3_evict.capacity; /* and G2's: the tiers as one cache */
  kv_core__follow_g3(c);
  if (o) c->g3o = *o;
  uint64_t most = gs.slots / 64 > 2 ? gs.slots / 64 : 2; /* a small store not left empty */
  uint32_t lw = c->g3o.low_water ? c->g3o.low_water : 64;
  c->g3o.low_water = lw < most ? lw : (uint32_t)most;
  c->g3_seq = kv_g3_max_seq(g3);
  warm_ctx w = {c, 0};
  rc = kv_g3_foreach(g3, learn_entry, &w);
  if (rc < 0 || w.rc < 0) return rc < 0 ? rc : w.rc;
  return (int)c->st.warm_blocks;
}

int kv_core_ns_g3_code(kv_core *c, uint32_t ns, unsigned flags) {
  if (ns >= c->nns || !c->ns[ns].live) return -EINVAL;
  c->ns[ns].g3_code = flags;
  return 0;
}

/* --- G3 shares ----------------------------------------------------------------- */

int kv_core_g3_share(kv_core *c, unsigned owner, uint64_t bytes) {
  if (!c->g3 || owner >= KV_CORE_OWNERS_MAX || c->g3_own[owner]) return -EINVAL;
  uint64_t sb = kv_g3_slot_bytes(c->g3);
  kv_evict *e = calloc(2, sizeof *e); /* its policy, and its copies G2 holds too */
  if (!e) return -ENOMEM;
  uint64_t limit = sb ? bytes / sb : 0;
  e[0].capacity = (uint32_t)(limit < UINT32_MAX ? limit : UINT32_MAX);
  int rc = kv_evict_init(&e[0], c->policy, &c->ix, KV_G3);
  if (rc == 0 && (rc = kv_evict_init(&e[1], &g3_dup_ops, &c->ix, KV_G3))) kv_evict_fini(&e[0]);
  if (rc) {
    free(e);
    return rc;
  }
  c->g3_own_limit[owner] = limit;
  c->g3_own[owner] = e;
  return 0;
}

/* Evicts owner's G3 blocks down to its share (as far as they can go). */
static void g3_share_enforce(kv_core *c, unsigned owner) {
  while (c->g3_own[owner] && c->g3_own_slots[owner] > c->g3_own_limit[owner]) {
    kv_block *x = own_victim(c, owner);
    if (!x) break;
    c->st.evictions[KV_G3]++;
    kv_core__drop_tier(c, x, KV_G3);
  }
}

int kv_core_ns_owner(kv_core *c, uint32_t ns, unsigned owner) {
  if (ns >= c->nns || !c->ns[ns].live || owner >= KV_CORE_OWNERS_MAX) return -EINVAL;
  kv_core_ns *n = &c->ns[ns];
  if (n->owner == (int)owner) return 0;
  if (n->owner >= 0) return -EINVAL;
  int moves = c->g3_own[owner] != NULL;
  /* Blocks G3 can evict leave the shared policy (or its instance for
   * copies G2 holds too), then join the owner's (the others are told when
   * they become evictable, by then the owner's). */
  uint64_t seen = 0, moved = 0;
  uint8_t bit = (uint8_t)KV_TIER_BIT(KV_G3);
  if (moves && n->g3_slots) {
    for (kv_bid id = 0; id < c->ix.hiwater && seen < c->ix.count; id++) {
      kv_block *b = kv_index_at(&c->ix, id);
      if (b->state == KV_BS_FREE) continue;
      seen++;
      if (b->ns != ns || !(b->inpol & bit)) continue;
      kv_evict *from = kv_core__policy_of(c, b, KV_G3);
      from->ops->remove(from, b);
      b->hpos[KV_G3] = KV_SLOT_NONE;
      moved++;
    }
  }
  n->owner = (int)owner;
  c->g3_own_slots[owner] += n->g3_slots;
  seen = 0;
  for (kv_bid id = 0; moved && id < c->ix.hiwater && seen < c->ix.count; id++) {
    kv_block *b = kv_index_at(&c->ix, id);
    if (b->state == KV_BS_FREE) continue;
    seen++;
    if (b->ns != ns || !(b->inpol & bit)) continue;
    kv_evict *to = kv_core__policy_of(c, b, KV_G3);
    if (to->ops->add(to, b)) {
      b->inpol &= (uint8_t)~bit;
      kv_warn("core", "eviction policy out of memory: a G3 block stays unevictable");
    }
  }
  g3_share_enforce(c, owner);
  return 0;
}

/* Which of two owners holds more of its share: a's part > b's part. */
static int fuller(const kv_core *c, unsigned a, unsigned b) {
  unsigned __int128 x =
      (unsigned __int128)c->g3_own_slots[a] * (c->g3_own_limit[b] ? c->g3_own_limit[b] : 1);
  unsigned __int128 y =
      (unsigned __int128)c->g3_own_slots[b] * (c->g3_own_limit[a] ? c->g3_own_limit[a] : 1);
  return x > y;
}

/* The victim of the owner holding the largest part of its share among
 * those whose instance `which` (0: the policy, 1: copies G2 holds too) has
 * one, or NULL. */
static kv_block *fullest_owner_victim(kv_core *c, int which) {
  kv_block *v = NULL;
  int best = -1;
  for (unsigned o = 0; o < KV_CORE_OWNERS_MAX; o++) {
    if (!c->g3_own[o] || !c->g3_own[o][which].count) continue;
    if (best < 0 || fuller(c, o, (unsigned)best)) {
      kv_block *x = c->g3_own[o][which].ops->peek(&c->g3_own[o][which]);
      if (x) {
        best = (int)o;
        v = x;
      }
    }
  }
  return v;
}

kv_block *kv_core__g3_victim(kv_core *c) {
  if (!c->g3) return NULL;
  /* An SSD copy of a block G2 holds too first: dropping it loses no block. */
  kv_block *v = c->g3_dup.ops->peek(&c->g3_dup);
  if (!v) v = fullest_owner_victim(c, 1);
  if (!v) v = c->g3_evict.ops->peek(&c->g3_evict); /* no owner's share holds it */
  return v ? v : fullest_owner_victim(c, 0);
}

uint32_t kv_core__g3_policies(kv_core *c, kv_evict **out, uint32_t max) {
  uint32_t n = 0;
  if (!c->g3) return 0;
  if (n < max) out[n++] = &c->g3_evict;
  for (unsigned o = 0; o < KV_CORE_OWNERS_MAX && n < max; o++)
    if (c->g3_own[o]) out[n++] = &c->g3_own[o][0];
  return n;
}

static void g3_read_done(int status, void *arg) {
  g3_op *op = arg;
  kv_core *c = op->c;
  kv_block *b = kv_index_at(&c->ix, op->bid);
  kv_promote_cb cb = op->cb;
  void *cbarg = op->arg;
  uint32_t op_crc = op->crc;
  kv_core__copied(c, KV_G3, KV_G2, b->size, op->t0, status);
  free(op);
  b->busy &= (uint8_t)~KV_TIER_BIT(KV_G2);
  if (status == 0) {
    c->st.promotions++;
    b->crc = op_crc; /* the block's, or what a lossy record decoded to */
    kv_core__set_valid(c, b, KV_G2);
  } else {
    /* Never served: the store dropped its index entry; free both slots. */
    c->st.promote_failed++;
    kv_arena_free(c->ns[b->ns].arena, b->slot[KV_G2]);
    b->slot[KV_G2] = KV_SLOT_NONE;
    if (b->tiers & KV_TIER_BIT(KV_G3)) kv_core__clear_valid(c, b, KV_G3);
    kv_g3_free(c->g3, b->slot[KV_G3]);
    kv_core__set_g3_slot(c, b, KV_SLOT_NONE);
  }
  if (cb) cb(c, b, status, cbarg);
  kv_core__reap(c, b);
}

int kv_core_promote(kv_core *c, kv_block *b, kv_promote_cb cb, void *arg) {
  if (b->tiers & KV_TIER_BIT(KV_G2)) return 1;
  if (b->slot[KV_G2] != KV_SLOT_NONE) return -EBUSY;
  if (!c->g3 || !(b->tiers & KV_TIER_BIT(KV_G3)) || b->state != KV_BS_READY) return KV_ENOTFOUND;
  kv_core_ns *n = kv_core__ns_get(c, b->ns);
  if (!n) return -EINVAL;
  uint32_t slot;
  int rc = kv_core__alloc_g2_slot(c, n, &slot);
  if (rc) return rc;
  g3_op *op = malloc(sizeof *op);
  if (!op) {
    kv_arena_free(n->arena, slot);
    return -ENOMEM;
  }
  *op = (g3_op){c, b->id, slot, cb, arg, kv_now_ns(), b->crc};
  b->slot[KV_G2] = slot;
  b->busy |= (uint8_t)KV_TIER_BIT(KV_G2);
  /* A lossy record only for a namespace whose blocks are lossy now, and
   * not under a G1 copy of the exact bytes (two copies, two CRCs). */
  int lossy = (n->g3_code & (KV_G3_FP8 | KV_G3_INT8)) && !(b->tiers & KV_TIER_BIT(KV_G1));
  kv_g3_expect ex = {.len = b->size,
                     .crc = b->crc,
                     .flags = KV_G3_EXPECT_CRC | (lossy ? KV_G3_EXPECT_LOSSY : 0),
                     .crc_out = &op->crc};
  kv_core__g3_key_of(c, b, &ex.key);
  rc = kv_g3_read(c->g3, b->slot[KV_G3], &ex, kv_arena_ptr(n->arena, slot), g3_read_done, op);
  if (rc) {
    b->busy &= (uint8_t)~KV_TIER_BIT(KV_G2);
    b->slot[KV_G2] = KV_SLOT_NONE;
    kv_arena_free(n->arena, slot);
    free(op);
  }
  return rc;
}
