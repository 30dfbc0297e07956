/* core_g1.c - the cache core's GPU tier: slots of the device pool, G2 -> G1
 * loads, and G1 victims written back to G2 (see core.h, "the GPU tier"). */
#include <errno.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/log.h"
#include "tiers/core_int.h"

/* One copy in flight; its address is the tag the mover gets back. */
typedef struct g1_op {
  kv_bid bid;       /* the block copied */
  int to_g1;        /* 1: a load (G2 -> G1); 0: a write-back (G1 -> G2) */
  kv_bid waiter;    /* write-back: the block whose load waits for the slot */
  unsigned pool;    /* the pool of the copy (and of the waiter's load) */
  kv_promote_cb cb; /* the load's (or the waiter's) completion */
  void *arg;
  uint64_t t0; /* start, for kv_core_admin.on_copy */
} g1_op;

#define BUSY_BOTH ((uint8_t)(KV_TIER_BIT(KV_G1) | KV_TIER_BIT(KV_G2)))

int kv_core_attach_g1(kv_core *c, kv_arena *pool, kv_g1_copy_fn copy, void *arg) {
  if (!pool || !copy || (c->g1_copy && c->g1_copy != copy)) return -EINVAL;
  if (c->ng1 == KV_G1_POOLS_MAX) return -ENOSPC;
  /* The last slot of pool 7 would read as KV_SLOT_NONE. */
  if (pool->capacity / KV_ARENA_ALIGN >= (1ull << KV_G1_SLOT_BITS) - 1) return -EFBIG;
  c->g1[c->ng1] = pool;
  c->g1_arg[c->ng1] = arg;
  c->g1_copy = copy;
  return (int)c->ng1++;
}

/* n's class in pool p (and its policy), made on first use. */
static int g1_class(kv_core *c, kv_core_ns *n, unsigned p) {
  if (n->g1cls1[p]) return n->g1cls1[p] - 1;
  int cls = kv_core__class(c, c->g1[p], n->block_bytes, KV_G1);
  if (cls < 0) return cls;
  n->g1cls1[p] = cls + 1;
  return cls;
}

static void set_busy(kv_core *c, kv_block *b, int on) {
  if (on) b->busy |= BUSY_BOTH;
  else b->busy &= (uint8_t)~BUSY_BOTH;
  kv_core__sync_all(c, b);
}

/* Starts op's copy of b; both of b's slots are busy until it is over. */
static int start_copy(kv_core *c, kv_block *b, g1_op *op) {
  g1_op *o = malloc(sizeof *o);
  if (!o) return -ENOMEM;
  *o = *op;
  o->t0 = kv_now_ns();
  int rc = c->g1_copy(c->g1_arg[o->pool], o->to_g1, kv_core_g1_ptr(c, b), kv_core_g2_ptr(c, b),
                      b->size, (uint64_t)(uintptr_t)o);
  if (rc) {
    free(o);
    return rc;
  }
  set_busy(c, b, 1);
  return 0;
}

/* Makes room in G1 for w (cb, arg: its load's completion) with one victim
 * of policy e. A victim G2 still holds loses its G1 copy at once: 0, the
 * room is there. Otherwise a write-back to a new G2 slot starts and w's
 * load is chained to it (KV_DEMOTE_ASYNC): the slot it frees goes to w, so
 * no other load takes it and no second victim goes for w. Else
 * KV_EALLPINNED, or G2's -EAGAIN when G2 room for the write-back is on its
 * way (from a demotion to G3), or the mover's error. */
static int make_room(kv_core *c, unsigned pool, kv_evict *e, kv_block *w, kv_promote_cb cb,
                     void *arg) {
  kv_block *v = e->ops->peek(e);
  if (!v) return KV_EALLPINNED;
  if (v->tiers & KV_TIER_BIT(KV_G2)) {
    c->st.evictions[KV_G1]++;
    kv_core__drop_tier(c, v, KV_G1);
    return 0;
  }
  kv_core_ns *n = &c->ns[v->ns];
  if (!n->arena) return -EINVAL; /* cannot happen: G1 blocks come from G2 */
  uint32_t slot;
  int rc = kv_core__alloc_g2_slot(c, n, &slot);
  if (rc) return rc;
  v->slot[KV_G2] = slot;
  g1_op op = {.bid = v->id, .to_g1 = 0, .waiter = w->id, .pool = pool, .cb = cb, .arg = arg};
  if ((rc = start_copy(c, v, &op))) {
    kv_arena_free(n->arena, slot);
    v->slot[KV_G2] = KV_SLOT_NONE;
    return rc;
  }
  c->st.evictions[KV_G1]++;
  c->g1_writing++;
  set_busy(c, w, 1); /* its load is on its way: no second one, no eviction */
  return KV_DEMOTE_ASYNC;
}

int kv_core_promote_g1(kv_core *c, kv_block *b, unsigned pool, kv_promote_cb cb, void *arg) {
  if (pool >= c->ng1 || b->ns >= c->nns || !c->ns[b->ns].arena) return -EINVAL;
  if (b->slot[KV_G1] != KV_SLOT_NONE && kv_g1_pool_of(b->slot[KV_G1]) != pool &&
      (b->tiers & KV_TIER_BIT(KV_G1)))
    return -EXDEV;
  if (b->tiers & KV_TIER_BIT(KV_G1)) return 1;
  if (b->busy || b->slot[KV_G1] != KV_SLOT_NONE) return -EBUSY;
  if (b->state != KV_BS_READY || !(b->tiers & KV_TIER_BIT(KV_G2))) return KV_ENOTFOUND;
  int cls = g1_class(c, &c->ns[b->ns], pool);
  if (cls < 0) return cls;
  kv_arena *a = c->g1[pool];
  uint32_t slot;
  int rc;
  while ((rc = kv_arena_alloc(a, cls, &slot)) == -ENOSPC) {
    rc = make_room(c, pool, a->cls[cls].user, b, cb, arg);
    if (rc == KV_DEMOTE_ASYNC) return 0;
    if (rc) return rc;
  }
  if (rc) return rc;
  b->slot[KV_G1] = (uint32_t)pool << KV_G1_SLOT_BITS | slot;
  g1_op op = {.bid = b->id, .to_g1 = 1, .waiter = KV_BID_NONE, .pool = pool, .cb = cb, .arg = arg};
  if ((rc = start_copy(c, b, &op))) {
    kv_arena_free(a, slot);
    b->slot[KV_G1] = KV_SLOT_NONE;
  }
  return rc;
}

/* A write-back made room for w: its load goes on (or ends with status). */
static void resume(kv_core *c, kv_bid wid, unsigned pool, kv_promote_cb cb, void *arg, int status) {
  kv_block *w = kv_index_at(&c->ix, wid);
  set_busy(c, w, 0);
  int rc = status ? status : kv_core_promote_g1(c, w, pool, cb, arg);
  if (rc == 0 && !status) return; /* started: cb comes with its copy */
  if (cb) cb(c, w, rc == 1 ? 0 : rc, arg);
  kv_core__reap(c, w);
}

void kv_core_g1_done(kv_core *c, uint64_t tag, int status) {
  g1_op *op = (g1_op *)(uintptr_t)tag;
  g1_op o = *op;
  free(op);
  kv_block *b = kv_index_at(&c->ix, o.bid);
  b->busy &= (uint8_t)~BUSY_BOTH;
  kv_core__copied(c, o.to_g1 ? KV_G2 : KV_G1, o.to_g1 ? KV_G1 : KV_G2, b->size, o.t0, status);
  if (o.to_g1) {
    if (status == 0) {
      c->st.g1_loads++;
      kv_core__set_valid(c, b, KV_G1);
    } else {
      c->st.g1_load_failed++;
      kv_core__drop_tier(c, b, KV_G1); /* frees the slot; the G2 copy is intact */
    }
    kv_core__sync_all(c, b);
    if (o.cb) o.cb(c, b, status, o.arg);
  } else {
    c->g1_writing--;
    if (status == 0) {
      c->st.g1_writebacks++;
      kv_core__set_valid(c, b, KV_G2);
      if (b->pins == 0) kv_core__drop_tier(c, b, KV_G1); /* the waiter's room */
    } else {
      /* The G1 copy is still good: it stays, and the G2 slot goes. */
      c->st.g1_writeback_failed++;
      kv_core__drop_tier(c, b, KV_G2);
      kv_warn("core", "writing a G1 block back to G2 failed: %s (it stays in G1)",
              kv_strerror(status));
    }
    kv_core__sync_all(c, b);
    resume(c, o.waiter, o.pool, o.cb, o.arg, status);
  }
  kv_core__reap(c, b);
}
