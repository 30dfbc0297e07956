/* test_scale.c - what a block costs: the index and the default eviction
 * policy allocate at most 128 bytes of metadata per block (measured through
 * the metadata allocator, not computed), lookups still hit and miss at that
 * size, and the narrowed record fields (16-bit namespaces, pins and
 * child counts) refuse or recover rather than wrap. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "tiers/core.h"
#include "tiers/evict.h"
#include "tiers/index.h"

/* 32 key bytes: v, then bytes that vary with v. */
static void key_of(uint64_t v, uint8_t k[KV_KEY_MAX]) {
  uint64_t x = v * 0x9E3779B97F4A7C15ull;
  for (int i = 8; i < KV_KEY_MAX; i++) k[i] = (uint8_t)(x >> (8 * (i % 8)));
  memcpy(k, &v, sizeof v);
}

Test(scale, metadata_per_block_is_at_most_128_bytes_at_100k_blocks) {
  enum { N = 100000 };
  size_t base = kv_meta_bytes();
  kv_index ix;
  cr_assert_eq(kv_index_init(&ix, 1024), 0);
  kv_evict e = {.capacity = N};
  cr_assert_eq(kv_evict_init(&e, kv_evict_lookup(kv_evict_default), &ix, KV_G2), 0);
  uint8_t k[KV_KEY_MAX];
  for (uint64_t i = 0; i < N; i++) {
    kv_block *b;
    key_of(i, k);
    cr_assert_eq(kv_index_insert(&ix, 3, k, KV_KEY_MAX, &b), 0);
    b->state = KV_BS_READY;
    b->tiers = (uint8_t)KV_TIER_BIT(KV_G2);
    b->atime = i + 1;
    b->hits = 1;
    cr_assert_eq(e.ops->add(&e, b), 0);
    b->inpol = (uint8_t)KV_TIER_BIT(KV_G2);
  }
  cr_assert_eq(e.count, N);
  size_t bytes = kv_meta_bytes() - base;
  double per = (double)bytes / N;
  cr_log_info("%zu metadata bytes for %d blocks: %.1f per block", bytes, N, per);
  cr_assert_geq(bytes, (size_t)N * sizeof(kv_block), "the count must see the records");
  cr_assert_leq(per, 128.0, "%.1f bytes of metadata per block", per);

  for (uint64_t i = 0; i < N; i++) {
    key_of(i, k);
    kv_block *b = kv_index_find(&ix, 3, k, KV_KEY_MAX);
    cr_assert_not_null(b, "block %llu not found", (unsigned long long)i);
    cr_assert_eq(kv_block_keylen(b), KV_KEY_MAX);
    cr_assert_eq(memcmp(b->key, k, KV_KEY_MAX), 0);
    cr_assert_null(kv_index_find(&ix, 4, k, KV_KEY_MAX), "another namespace must miss");
    key_of(i + N, k);
    cr_assert_null(kv_index_find(&ix, 3, k, KV_KEY_MAX), "absent key %llu found",
                   (unsigned long long)(i + N));
  }
  /* The policy still offers the least recently used first. */
  key_of(0, k);
  cr_assert_eq(e.ops->peek(&e), kv_index_find(&ix, 3, k, KV_KEY_MAX));
  kv_evict_fini(&e);
  kv_index_fini(&ix);
  cr_assert_eq(kv_meta_bytes(), base, "everything counted is freed");
}

Test(scale, a_namespace_beyond_16_bits_is_refused_not_aliased) {
  kv_index ix;
  cr_assert_eq(kv_index_init(&ix, 0), 0);
  uint8_t k[KV_KEY_MAX] = {7};
  kv_block *b;
  cr_assert_eq(kv_index_insert(&ix, 0, k, 8, &b), 0);
  /* 65536 would be namespace 0 in a 16-bit field. */
  cr_assert_null(kv_index_find(&ix, KV_NS_MAX + 1, k, 8));
  cr_assert_null(kv_index_find(&ix, KV_NS_MAX, k, 8));
  cr_assert_eq(kv_index_insert(&ix, KV_NS_MAX + 1, k, 8, &b), -EINVAL);
  cr_assert_eq(kv_index_insert(&ix, KV_NS_MAX, k, 8, &b), -EINVAL);
  cr_assert_eq(ix.count, 1);
  kv_index_fini(&ix);
}

/* ---- through the core ---------------------------------------------------- */

#define SLOT 4096u /* never written: the memfd pages stay untouched */

typedef struct fixture {
  kv_arena arena;
  kv_core *core;
  uint32_t ns;
} fixture;

static void setup(fixture *f, uint32_t blocks) {
  kv_arena_opts ao = {.capacity = (size_t)blocks * SLOT, .page_bytes = SLOT, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&f->arena, &ao), 0);
  cr_assert_eq(kv_core_new(&f->core, NULL), 0);
  int ns = kv_core_ns_register(f->core, &f->arena, SLOT);
  cr_assert_geq(ns, 0);
  f->ns = (uint32_t)ns;
}

static kv_block *store(fixture *f, uint64_t v, uint64_t p) {
  kv_key k = {.len = 8}, pk = {.len = 8};
  memcpy(k.b, &v, 8);
  memcpy(pk.b, &p, 8);
  kv_block *b;
  int rc = kv_core_alloc(f->core, f->ns, &k, p ? &pk : NULL, KV_PRIO_DEFAULT, &b);
  cr_assert_eq(rc, 0, "alloc %llu: %s", (unsigned long long)v, kv_strerror(rc));
  cr_assert_eq(kv_core_commit(f->core, b, 0), 0);
  return b;
}

Test(scale, pins_stop_at_16_bits_with_eoverflow) {
  fixture f;
  setup(&f, 2);
  kv_block *b = store(&f, 1, 0);
  for (uint32_t i = 0; i < UINT16_MAX; i++) cr_assert_eq(kv_core_pin(f.core, b), 0);
  cr_assert_eq(kv_core_pin(f.core, b), -EOVERFLOW);
  cr_assert_eq(b->pins, UINT16_MAX);
  for (uint32_t i = 0; i < UINT16_MAX; i++) cr_assert_eq(kv_core_unpin(f.core, b), 0);
  cr_assert_eq(kv_core_unpin(f.core, b), KV_EPINUNDERFLOW);
  cr_assert(b->inpol & KV_TIER_BIT(KV_G2), "unpinned: evictable again");
  kv_core_free(f.core);
  kv_arena_fini(&f.arena);
}

/* A block with more children valid in G2 than a 16-bit count holds: the
 * count sticks, and the parent stays unevictable until its last child goes
 * (a wrapping count would call it a leaf at 65536 children). */
Test(scale, a_parent_of_65536_children_stays_until_the_last_goes) {
  enum { KIDS = 65536 + 2 };
  fixture f;
  setup(&f, KIDS + 1);
  kv_block *p = store(&f, 1, 0);
  kv_block **kids = malloc(KIDS * sizeof *kids);
  cr_assert_not_null(kids);
  for (uint32_t i = 0; i < KIDS; i++) kids[i] = store(&f, 100 + i, 1);
  kv_core_stats_t st;
  kv_core_stats(f.core, &st);
  cr_assert_eq(st.evictions[KV_G2], 0);
  cr_assert_eq(p->rchild[KV_G2], KV_RCHILD_STUCK);
  cr_assert_not(p->inpol & KV_TIER_BIT(KV_G2), "a parent with children is not a leaf");
  for (uint32_t i = 0; i < KIDS; i++) {
    cr_assert_eq(kv_core_delete(f.core, kids[i]), 0);
    if (i + 1 < KIDS)
      cr_assert_not(p->inpol & KV_TIER_BIT(KV_G2), "%u children left, parent offered",
                    KIDS - i - 1);
  }
  cr_assert_eq(p->rchild[KV_G2], 0);
  cr_assert(p->inpol & KV_TIER_BIT(KV_G2), "no child left: the parent is a leaf");
  free(kids);
  kv_core_free(f.core);
  kv_arena_fini(&f.arena);
}
