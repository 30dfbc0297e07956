/* test_core_admin.c - the core's operator operations: a live policy switch
 * keeps every block and stays evictable, a soft G2 limit evicts down to it,
 * evict_n and flush never touch pinned blocks, namespace filters, the index
 * walk, and the copy observer over a real G3. Includes core_int.h: it reads
 * the policy instances and the counters. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "tests/lib/keys.h"
#include "tests/lib/tmpdir.h"
#include "tiers/core_int.h"

#define SLOT 4096u

typedef struct fixture {
  kv_arena arena;
  kv_core *core;
  int ns, ns2;
} fixture;

static void setup(fixture *f, uint32_t blocks, const char *policy) {
  kv_arena_opts ao = {.capacity = (size_t)blocks * SLOT, .page_bytes = SLOT, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&f->arena, &ao), 0);
  kv_core_opts co = {.policy = policy};
  cr_assert_eq(kv_core_new(&f->core, &co), 0);
  f->ns = kv_core_ns_register(f->core, &f->arena, SLOT);
  f->ns2 = kv_core_ns_register(f->core, &f->arena, SLOT);
  cr_assert_geq(f->ns, 0);
  cr_assert_geq(f->ns2, 0);
}
static void teardown(fixture *f) {
  kv_core_free(f->core);
  kv_arena_fini(&f->arena);
}

static kv_block *store_ns(fixture *f, int ns, uint64_t v, uint64_t p) {
  kv_key k = K(v), pk = K(p);
  kv_block *b;
  int rc = kv_core_alloc(f->core, (uint32_t)ns, &k, p ? &pk : NULL, KV_PRIO_DEFAULT, &b);
  cr_assert_eq(rc, 0, "alloc %llu: %s", (unsigned long long)v, kv_strerror(rc));
  cr_assert_eq(kv_core_commit(f->core, b, 0), 0);
  return b;
}
static kv_block *store(fixture *f, uint64_t v, uint64_t p) { return store_ns(f, f->ns, v, p); }
static int resident_ns(fixture *f, int ns, uint64_t v) {
  kv_key k = K(v);
  return kv_core_find(f->core, (uint32_t)ns, &k) != NULL;
}
static int resident(fixture *f, uint64_t v) { return resident_ns(f, f->ns, v); }
static uint32_t count_resident(fixture *f, uint64_t from, uint64_t to) {
  uint32_t n = 0;
  for (uint64_t v = from; v <= to; v++) n += (uint32_t)resident(f, v);
  return n;
}

Test(core_admin, policy_switch_keeps_every_block_and_they_stay_evictable) {
  const char *names[] = {"lru2", "lfuda", "lru"};
  fixture f;
  setup(&f, 16, "lru");
  for (uint64_t v = 1; v <= 12; v++)
    store(&f, v, v > 6 ? v - 1 : 0); /* 1..6 alone, 7..12 a chain */
  cr_assert_eq(kv_core_pin(f.core, store(&f, 13, 0)), 0);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(kv_core_set_policy(f.core, names[i]), 0);
    cr_assert_str_eq(f.core->policy->name, names[i]);
    cr_assert_eq(count_resident(&f, 1, 13), 13, "a block was lost switching to %s", names[i]);
  }
  cr_assert_eq(kv_core_set_policy(f.core, "no-such"), -EINVAL);
  cr_assert_str_eq(f.core->policy->name, "lru");
  /* Every unpinned block can still go, chains from their end: 12 of 13. */
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, KV_NS_ANY, UINT64_MAX), 12);
  cr_assert(resident(&f, 13), "the pinned block went");
  cr_assert_eq(count_resident(&f, 1, 12), 0);
  teardown(&f);
}

Test(core_admin, policy_switch_moves_blocks_out_of_the_old_instance) {
  fixture f;
  setup(&f, 8, "lru");
  for (uint64_t v = 1; v <= 8; v++) store(&f, v, 0);
  kv_evict *e = f.arena.cls[f.core->ns[f.ns].cls].user;
  cr_assert_eq(e->count, 8);
  cr_assert_eq(kv_core_set_policy(f.core, "lfuda"), 0);
  cr_assert_eq(e->count, 8, "the new instance holds the 8 evictable blocks");
  cr_assert_str_eq(e->ops->name, "lfuda");
  /* The new policy decides the next victims (G2 full: alloc evicts one). */
  store(&f, 9, 0);
  cr_assert_eq(count_resident(&f, 1, 9), 8);
  teardown(&f);
}

Test(core_admin, shrinking_the_g2_limit_evicts_down_to_it_and_alloc_keeps_it) {
  fixture f;
  setup(&f, 16, "lru");
  for (uint64_t v = 1; v <= 16; v++) store(&f, v, 0);
  cr_assert_eq(f.arena.used_bytes, 16 * SLOT);
  cr_assert_eq(kv_core_set_limit(f.core, KV_G2, 6 * SLOT), 10);
  cr_assert_eq(f.arena.used_bytes, 6 * SLOT);
  cr_assert_eq(count_resident(&f, 11, 16), 6, "the most recent stay");
  cr_assert_eq(f.core->st.evictions[KV_G2], 10);
  /* New blocks: the arena has room, the soft limit is kept by enforcing. */
  for (uint64_t v = 17; v <= 20; v++) {
    store(&f, v, 0);
    kv_core_enforce_limits(f.core);
  }
  cr_assert_eq(f.arena.used_bytes, 6 * SLOT);
  cr_assert_eq(kv_core_set_limit(f.core, KV_G2, 0), 0, "no limit: nothing goes");
  cr_assert_eq(kv_core_set_limit(f.core, KV_G1, 1), -EINVAL);
  cr_assert_eq(kv_core_set_limit(f.core, KV_G3, 1), -EINVAL, "no G3 attached");
  teardown(&f);
}

Test(core_admin, pinned_blocks_survive_evict_and_flush) {
  fixture f;
  setup(&f, 16, "lru");
  kv_block *p = store(&f, 1, 0);
  for (uint64_t v = 2; v <= 8; v++) store(&f, v, 0);
  cr_assert_eq(kv_core_pin(f.core, p), 0);
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, KV_NS_ANY, 3), 3);
  cr_assert_eq(count_resident(&f, 1, 8), 5);
  cr_assert_eq(kv_core_flush(f.core, KV_TIER_NONE, KV_NS_ANY), 4);
  cr_assert(resident(&f, 1));
  cr_assert_eq(count_resident(&f, 1, 8), 1);
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, KV_NS_ANY, UINT64_MAX), 0);
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, (uint32_t)f.ns, UINT64_MAX), 0);
  cr_assert(resident(&f, 1));
  kv_core_unpin(f.core, p);
  cr_assert_eq(kv_core_flush(f.core, KV_G2, KV_NS_ANY), 1);
  cr_assert_eq(f.core->ix.count, 0, "records of dropped blocks are reaped");
  teardown(&f);
}

Test(core_admin, namespace_filters_touch_only_their_namespace) {
  fixture f;
  setup(&f, 16, "lru");
  for (uint64_t v = 1; v <= 4; v++) store_ns(&f, f.ns, v, v > 1 ? v - 1 : 0); /* chain */
  for (uint64_t v = 1; v <= 4; v++) store_ns(&f, f.ns2, v, 0);
  /* The chain goes from its end, each eviction freeing the next parent. */
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, (uint32_t)f.ns, UINT64_MAX), 4);
  for (uint64_t v = 1; v <= 4; v++) {
    cr_assert(!resident_ns(&f, f.ns, v));
    cr_assert(resident_ns(&f, f.ns2, v));
  }
  cr_assert_eq(kv_core_evict_n(f.core, KV_G2, (uint32_t)f.ns2, 1), 1);
  cr_assert_eq(kv_core_flush(f.core, KV_G2, (uint32_t)f.ns), 0);
  cr_assert_eq(kv_core_flush(f.core, KV_G2, (uint32_t)f.ns2), 3);
  cr_assert_eq(kv_core_flush(f.core, KV_G2, 999), -EINVAL);
  cr_assert_eq(kv_core_evict_n(f.core, KV_G1, KV_NS_ANY, 1), -EINVAL);
  cr_assert_eq(kv_core_evict_n(f.core, KV_G3, KV_NS_ANY, 1), -EINVAL, "no G3 attached");
  teardown(&f);
}

typedef struct sample_ctx {
  uint32_t seen, stop_after;
} sample_ctx;
static int sample_one(const kv_block *b, void *arg) {
  sample_ctx *s = arg;
  return ++s->seen >= s->stop_after;
}

Test(core_admin, sample_counts_all_matches_and_stops_the_callback_when_asked) {
  fixture f;
  setup(&f, 16, "lru");
  for (uint64_t v = 1; v <= 5; v++) store_ns(&f, f.ns, v, 0);
  for (uint64_t v = 1; v <= 3; v++) store_ns(&f, f.ns2, v, 0);
  kv_block *w;
  kv_key k = K(99);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, 1, &w), 0); /* invisible */
  sample_ctx s = {0, 2};
  cr_assert_eq(kv_core_sample(f.core, KV_TIER_NONE, KV_NS_ANY, sample_one, &s), 8);
  cr_assert_eq(s.seen, 2);
  s = (sample_ctx){0, 100};
  cr_assert_eq(kv_core_sample(f.core, KV_G2, (uint32_t)f.ns2, sample_one, &s), 3);
  cr_assert_eq(s.seen, 3);
  cr_assert_eq(kv_core_sample(f.core, KV_G3, KV_NS_ANY, NULL, NULL), 0);
  kv_core_abort(f.core, w);
  teardown(&f);
}

/* --- with a real SSD tier ---------------------------------------------------- */

typedef struct copies {
  uint32_t n[KV_NTIERS][KV_NTIERS];
  uint64_t bytes;
} copies;
static void on_copy(void *arg, kv_tier from, kv_tier to, uint32_t bytes, uint64_t ns, int st) {
  copies *c = arg;
  if (st == 0) c->n[from][to]++;
  c->bytes += bytes;
}

Test(core_admin, g3_evict_limit_flush_and_the_copy_observer) {
  char dir[64];
  cr_assert_eq(kvt_mkdtemp(dir, sizeof dir, "kvcore-adm"), 0);
  kv_arena a;
  kv_arena_opts ao = {.capacity = 8 * SLOT, .page_bytes = SLOT, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&a, &ao), 0);
  kv_g3_dir d = {dir, (1u << 20) + 16 * SLOT};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = SLOT,
                  .queue_depth = 4,
                  .backend = KV_G3_BACKEND_THREADS,
                  .arena = &a,
                  .commit_window_us = -1};
  kv_g3_open_info info;
  kv_g3 *g3;
  cr_assert_eq(kv_g3_open(&g3, &o, &info), 0);
  kv_core *c;
  kv_core_opts co = {.policy = "lru"};
  cr_assert_eq(kv_core_new(&c, &co), 0);
  kv_core_g3_opts go = {.admit = KV_ADMIT_ALWAYS, .low_water = 1};
  cr_assert_geq(kv_core_attach_g3(c, g3, &go), 0);
  copies cp = {0};
  kv_core_on_copy(c, on_copy, &cp);
  const uint8_t digest[KV_G3_NS_BYTES] = {9, 9, 9};
  int ns = kv_core_ns_register_digest(c, &a, SLOT, digest);
  cr_assert_geq(ns, 0);
  for (uint64_t v = 1; v <= 6; v++) {
    kv_key k = K(v);
    kv_block *b;
    cr_assert_eq(kv_core_alloc(c, (uint32_t)ns, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
    memset(kv_core_g2_ptr(c, b), (int)v, SLOT);
    cr_assert_eq(kv_core_commit(c, b, kv_crc32c(0, kv_core_g2_ptr(c, b), SLOT)), 0);
  }
  /* Evicting G2 demotes to G3: six writes, observed on completion. */
  cr_assert_eq(kv_core_evict_n(c, KV_G2, KV_NS_ANY, UINT64_MAX), 6);
  kv_g3_drain(g3);
  cr_assert_eq(cp.n[KV_G2][KV_G3], 6);
  cr_assert_eq(cp.bytes, 6 * SLOT);
  cr_assert_eq(kv_core_sample(c, KV_G3, KV_NS_ANY, NULL, NULL), 6);
  cr_assert_eq(kv_core_sample(c, KV_G2, KV_NS_ANY, NULL, NULL), 0);
  /* A G3 limit of 4 slots drops the two oldest; evict_n and flush the rest. */
  cr_assert_eq(kv_core_set_limit(c, KV_G3, 4 * SLOT), 2);
  cr_assert_eq(kv_core_sample(c, KV_G3, KV_NS_ANY, NULL, NULL), 4);
  cr_assert_eq(kv_core_evict_n(c, KV_G3, (uint32_t)ns, 1), 1);
  cr_assert_eq(kv_core_flush(c, KV_G3, KV_NS_ANY), 3);
  cr_assert_eq(kv_core_sample(c, KV_TIER_NONE, KV_NS_ANY, NULL, NULL), 0);
  cr_assert_eq(c->st.evictions[KV_G3], 3);
  kv_g3_drain(g3);
  kv_core_free(c);
  kv_g3_close(g3);
  kv_arena_fini(&a);
  kvt_rmtree(dir);
}
