/* test_core_g1.c - the cache core's GPU tier with a mover the test drives:
 * loads from G2, slots busy while a copy runs, G1 victims dropped when G2
 * still holds them and written back when it does not, device failures,
 * pinned blocks, and a live policy switch that takes G1 along. Includes
 * core_int.h: it reads the core's counters. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "tests/lib/keys.h"
#include "tiers/core_int.h"

#define BLK 8192u

typedef struct copy_req {
  int to_g1;
  void *g1, *g2;
  uint32_t bytes;
  uint64_t tag;
} copy_req;

typedef struct fx {
  kv_arena g2, g1;
  uint8_t *pool; /* the "device" memory G1's arena hands out */
  kv_core *core;
  int ns;
  copy_req q[64];
  unsigned nq;
  int fail_submit, fail_copy;
} fx;

static int mover(void *arg, int to_g1, void *g1, void *g2, uint32_t bytes, uint64_t tag) {
  fx *f = arg;
  if (f->fail_submit) return -EIO;
  cr_assert_lt(f->nq, 64);
  cr_assert(g1 && g2);
  f->q[f->nq++] = (copy_req){to_g1, g1, g2, bytes, tag};
  return 0;
}

/* Runs every queued copy and delivers its completion; returns the count. */
static unsigned run_copies(fx *f) {
  unsigned n = 0;
  while (f->nq) {
    copy_req r = f->q[0];
    memmove(f->q, f->q + 1, --f->nq * sizeof r);
    if (!f->fail_copy) memcpy(r.to_g1 ? r.g1 : r.g2, r.to_g1 ? r.g2 : r.g1, r.bytes);
    kv_core_g1_done(f->core, r.tag, f->fail_copy ? -EIO : 0);
    n++;
  }
  return n;
}

static void setup(fx *f, uint32_t g2_blocks, uint32_t g1_blocks) {
  memset(f, 0, sizeof *f);
  kv_arena_opts o2 = {.capacity = (size_t)g2_blocks * BLK, .page_bytes = BLK, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&f->g2, &o2), 0);
  f->pool = calloc(g1_blocks, BLK);
  kv_arena_opts o1 = {.capacity = (size_t)g1_blocks * BLK, .page_bytes = BLK, .memory = f->pool};
  cr_assert_eq(kv_arena_init(&f->g1, &o1), 0);
  kv_core_opts co = {.policy = "lru"};
  cr_assert_eq(kv_core_new(&f->core, &co), 0);
  cr_assert_eq(kv_core_attach_g1(f->core, &f->g1, mover, f), 0);
  f->ns = kv_core_ns_register(f->core, &f->g2, BLK);
  cr_assert_geq(f->ns, 0);
}

static void teardown(fx *f) {
  run_copies(f);
  kv_core_free(f->core);
  kv_arena_fini(&f->g1);
  kv_arena_fini(&f->g2);
  free(f->pool);
}

static kv_block *find(fx *f, uint64_t v) {
  kv_key k = K(v);
  return kv_core_find(f->core, (uint32_t)f->ns, &k);
}

static void store(fx *f, uint64_t v) {
  kv_key k = K(v);
  kv_block *b;
  int rc = kv_core_alloc(f->core, (uint32_t)f->ns, &k, NULL, KV_PRIO_DEFAULT, &b);
  cr_assert_eq(rc, 0, "alloc %llu: %s", (unsigned long long)v, kv_strerror(rc));
  memset(kv_core_g2_ptr(f->core, b), (int)v, BLK);
  cr_assert_eq(kv_core_commit(f->core, b, 0), 0);
}

static uint8_t tier_of(fx *f, uint64_t v) {
  kv_key k = K(v);
  uint8_t t;
  kv_core_lookup(f->core, (uint32_t)f->ns, &k, 1, &t);
  return t;
}

typedef struct done {
  int called, status;
} done;
static void on_done(kv_core *c, kv_block *b, int status, void *arg) {
  done *d = arg;
  d->called++;
  d->status = status;
}

/* Loads v into G1 and runs the copies; asserts it got there. */
static void load_to(fx *f, uint64_t v, unsigned pool) {
  done d = {0, 0};
  cr_assert_eq(kv_core_promote_g1(f->core, find(f, v), pool, on_done, &d), 0, "load %llu",
               (unsigned long long)v);
  run_copies(f);
  cr_assert_eq(d.called, 1);
  cr_assert_eq(d.status, 0);
  cr_assert_eq(tier_of(f, v), KV_G1);
  cr_assert_eq(kv_g1_pool_of(find(f, v)->slot[KV_G1]), pool);
}
static void load_up(fx *f, uint64_t v) { load_to(f, v, 0); }

static int all_bytes(const uint8_t *p, uint8_t v) {
  for (uint32_t i = 0; i < BLK; i++)
    if (p[i] != v) return 0;
  return 1;
}

Test(core_g1, a_load_copies_from_g2_and_keeps_both_copies) {
  fx f;
  setup(&f, 4, 2);
  store(&f, 7);
  kv_block *b = find(&f, 7);
  done d = {0, 0};
  cr_assert_eq(kv_core_promote_g1(f.core, b, 0, on_done, &d), 0);
  cr_assert_eq(f.nq, 1);
  cr_assert(f.q[0].to_g1);
  cr_assert_eq(tier_of(&f, 7), KV_G2, "not valid in G1 before the copy is over");
  cr_assert(!(b->inpol & KV_TIER_BIT(KV_G2)), "the source is not evictable while read");
  cr_assert_eq(kv_core_promote_g1(f.core, b, 0, on_done, &d), -EBUSY);
  cr_assert_eq(run_copies(&f), 1);
  cr_assert_eq(d.called, 1);
  cr_assert_eq(d.status, 0);
  cr_assert_eq(tier_of(&f, 7), KV_G1, "the fastest tier is reported");
  cr_assert(b->tiers & KV_TIER_BIT(KV_G2), "the G2 copy stays");
  cr_assert(all_bytes(kv_core_g1_ptr(f.core, b), 7));
  cr_assert(b->inpol & KV_TIER_BIT(KV_G1));
  cr_assert(b->inpol & KV_TIER_BIT(KV_G2));
  cr_assert_eq(kv_core_promote_g1(f.core, b, 0, on_done, &d), 1, "already there");
  cr_assert_eq(f.core->st.g1_loads, 1);
  teardown(&f);
}

Test(core_g1, a_victim_still_in_g2_loses_its_g1_copy_without_a_copy) {
  fx f;
  setup(&f, 4, 2);
  for (uint64_t v = 1; v <= 3; v++) {
    store(&f, v);
    load_up(&f, v); /* the third evicts 1 from G1 with no write-back */
  }
  cr_assert_eq(tier_of(&f, 1), KV_G2, "the least recent left G1");
  cr_assert_eq(tier_of(&f, 2), KV_G1);
  cr_assert_eq(tier_of(&f, 3), KV_G1);
  cr_assert_eq(f.core->st.evictions[KV_G1], 1);
  cr_assert_eq(f.core->st.g1_writebacks, 0);
  teardown(&f);
}

Test(core_g1, a_victim_in_g1_only_is_written_back_to_g2_first) {
  fx f;
  setup(&f, 2, 1);
  store(&f, 1);
  done d = {0, 0};
  load_up(&f, 1);
  store(&f, 2);
  store(&f, 3); /* G2 holds 2 blocks: 1 leaves G2 and lives in G1 only */
  cr_assert_eq(tier_of(&f, 1), KV_G1);
  cr_assert(!(find(&f, 1)->tiers & KV_TIER_BIT(KV_G2)));
  kv_block *b2 = find(&f, 2);
  kv_core_pin(f.core, b2);
  /* G1's one slot holds 1: it must go down to G2 (where 3 makes room),
   * and 2's load waits for exactly that slot. */
  d.called = 0;
  cr_assert_eq(kv_core_promote_g1(f.core, b2, 0, on_done, &d), 0);
  cr_assert_eq(f.nq, 1);
  cr_assert(!f.q[0].to_g1, "a write-back first");
  cr_assert_eq(tier_of(&f, 1), KV_G1, "readable in G1 while written back");
  cr_assert_eq(kv_core_promote_g1(f.core, b2, 0, on_done, &d), -EBUSY, "its load is under way");
  cr_assert(!(b2->inpol & KV_TIER_BIT(KV_G2)), "the waiting load's source stays put");
  cr_assert_eq(run_copies(&f), 2, "the write-back, then the load into the slot it freed");
  cr_assert_eq(d.called, 1);
  cr_assert_eq(d.status, 0);
  cr_assert_eq(f.core->st.g1_writebacks, 1);
  kv_block *b1 = find(&f, 1);
  cr_assert_eq(tier_of(&f, 1), KV_G2);
  cr_assert(all_bytes(kv_core_g2_ptr(f.core, b1), 1), "the bytes came down");
  cr_assert_eq(b1->slot[KV_G1], KV_SLOT_NONE);
  cr_assert_eq(tier_of(&f, 2), KV_G1);
  cr_assert(all_bytes(kv_core_g1_ptr(f.core, b2), 2));
  kv_core_unpin(f.core, b2);
  teardown(&f);
}

Test(core_g1, device_failures_lose_nothing) {
  fx f;
  setup(&f, 4, 2);
  store(&f, 5);
  kv_block *b = find(&f, 5);
  done d = {0, 0};
  f.fail_submit = 1;
  cr_assert_eq(kv_core_promote_g1(f.core, b, 0, on_done, &d), -EIO);
  cr_assert_eq(b->slot[KV_G1], KV_SLOT_NONE, "the slot was given back");
  cr_assert_eq(b->busy, 0);
  f.fail_submit = 0;
  f.fail_copy = 1;
  cr_assert_eq(kv_core_promote_g1(f.core, b, 0, on_done, &d), 0);
  run_copies(&f);
  cr_assert_eq(d.status, -EIO);
  cr_assert_eq(tier_of(&f, 5), KV_G2, "still served from G2");
  cr_assert_eq(b->slot[KV_G1], KV_SLOT_NONE);
  cr_assert(b->inpol & KV_TIER_BIT(KV_G2), "evictable again");
  cr_assert_eq(f.core->st.g1_load_failed, 1);
  cr_assert_eq(kv_arena_room(&f.g1, 0), 2, "no G1 slot leaked");
  teardown(&f);
}

Test(core_g1, pinned_blocks_stay_in_g1) {
  fx f;
  setup(&f, 4, 1);
  store(&f, 1);
  store(&f, 2);
  done d = {0, 0};
  kv_block *b1 = find(&f, 1);
  load_up(&f, 1);
  kv_core_pin(f.core, b1);
  cr_assert_eq(kv_core_promote_g1(f.core, find(&f, 2), 0, on_done, &d), KV_EALLPINNED);
  kv_core_unpin(f.core, b1);
  load_up(&f, 2);
  teardown(&f);
}

Test(core_g1, delete_and_policy_switch_cover_g1) {
  fx f;
  setup(&f, 4, 2);
  store(&f, 1);
  store(&f, 2);
  load_up(&f, 1);
  load_up(&f, 2);
  cr_assert_eq(kv_core_set_policy(f.core, "s3fifo"), 0);
  cr_assert(find(&f, 1)->inpol & KV_TIER_BIT(KV_G1), "still evictable from G1");
  cr_assert_eq(kv_core_delete(f.core, find(&f, 1)), 0);
  cr_assert_eq(tier_of(&f, 1), KV_TIER_NONE);
  cr_assert_eq(kv_arena_room(&f.g1, 0), 1, "its G1 slot is free");
  /* A new block fills it; the next one evicts 2 from G1 through the new policy. */
  store(&f, 3);
  store(&f, 4);
  load_up(&f, 3);
  load_up(&f, 4);
  cr_assert_eq(f.core->st.evictions[KV_G1], 1);
  cr_assert_eq(tier_of(&f, 4), KV_G1);
  teardown(&f);
}

static int other_mover(void *arg, int to_g1, void *g1, void *g2, uint32_t bytes, uint64_t tag) {
  return -EIO;
}

/* Two devices, two pools: a block goes to the pool it is loaded to, each
 * pool evicts among its own blocks only, a block in one pool is not
 * loaded to the other (-EXDEV), and delete and a policy switch cover both. */
Test(core_g1, one_pool_per_device) {
  fx f;
  setup(&f, 16, 2);
  uint8_t *mem2 = calloc(2, BLK);
  kv_arena p2;
  kv_arena_opts o = {.capacity = 2 * BLK, .page_bytes = BLK, .memory = mem2};
  cr_assert_eq(kv_arena_init(&p2, &o), 0);
  cr_assert_eq(kv_core_attach_g1(f.core, &p2, other_mover, &f), -EINVAL, "one mover");
  cr_assert_eq(kv_core_attach_g1(f.core, &p2, mover, &f), 1, "the second pool's index");
  cr_assert_eq(f.core->ng1, 2);
  done d = {0, 0};
  for (uint64_t v = 1; v <= 6; v++) store(&f, v);
  cr_assert_eq(kv_core_promote_g1(f.core, find(&f, 1), 2, on_done, &d), -EINVAL, "no pool 2");
  load_to(&f, 1, 0);
  load_to(&f, 2, 0);
  load_to(&f, 3, 1);
  load_to(&f, 4, 1);
  uint8_t *p3 = kv_core_g1_ptr(f.core, find(&f, 3));
  cr_assert(p3 >= mem2 && p3 < mem2 + 2 * BLK, "block 3 is not in the second pool's memory");
  cr_assert(all_bytes(p3, 3));
  cr_assert(all_bytes(kv_core_g1_ptr(f.core, find(&f, 1)), 1));
  cr_assert_eq(kv_core_g1_offset(find(&f, 4)) + (uint64_t)mem2,
               (uint64_t)kv_core_g1_ptr(f.core, find(&f, 4)));
  cr_assert_eq(kv_core_promote_g1(f.core, find(&f, 1), 1, on_done, &d), -EXDEV);
  cr_assert_eq(kv_core_promote_g1(f.core, find(&f, 3), 1, on_done, &d), 1, "already there");
  /* Pool 1 is full: its victim is 3, its least recent; pool 0 keeps 1 and 2. */
  load_to(&f, 5, 1);
  cr_assert_eq(f.core->st.evictions[KV_G1], 1);
  cr_assert_eq(tier_of(&f, 3), KV_G2);
  cr_assert_eq(tier_of(&f, 1), KV_G1);
  cr_assert_eq(tier_of(&f, 2), KV_G1);
  /* 3 may now go to pool 0, whose victim is 1. */
  load_to(&f, 3, 0);
  cr_assert_eq(tier_of(&f, 1), KV_G2);
  cr_assert_eq(tier_of(&f, 4), KV_G1);
  cr_assert_eq(kv_core_set_policy(f.core, "arc"), 0);
  cr_assert(find(&f, 5)->inpol & KV_TIER_BIT(KV_G1), "pool 1's blocks are still evictable");
  cr_assert_eq(kv_core_delete(f.core, find(&f, 5)), 0);
  cr_assert_eq(kv_arena_room(&p2, 0), 1, "its slot in pool 1 is free");
  cr_assert_eq(kv_arena_room(&f.g1, 0), 0, "pool 0 untouched");
  load_to(&f, 6, 1);
  load_to(&f, 1, 1); /* pool 1 evicts (4) through the new policy */
  cr_assert_eq(tier_of(&f, 4), KV_G2);
  teardown(&f);
  kv_arena_fini(&p2);
  free(mem2);
}
