/* test_index.c - the block index: keys, namespaces, growth, backward-shift
 * deletion against a reference model, prefix links, and no allocation on a
 * lookup. */
#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "tiers/index.h"

static void key_of(uint64_t v, uint8_t k[8]) {
  for (int i = 0; i < 8; i++) k[i] = (uint8_t)(v >> (8 * i));
}

Test(index, rejects_empty_and_oversized_keys) {
  kv_index ix;
  cr_assert_eq(kv_index_init(&ix, 0), 0);
  uint8_t k[40] = {1};
  kv_block *b = NULL;
  cr_assert_eq(kv_index_insert(&ix, 0, k, 0, &b), -EINVAL);
  cr_assert_eq(kv_index_insert(&ix, 0, k, KV_KEY_MAX + 1, &b), -EINVAL);
  cr_assert_null(kv_index_find(&ix, 0, k, 0));
  cr_assert_null(kv_index_find(&ix, 0, k, KV_KEY_MAX + 1));
  cr_assert_eq(kv_index_insert(&ix, 0, k, KV_KEY_MAX, &b), 0);
  cr_assert_eq(ix.count, 1);
  kv_index_fini(&ix);
}

Test(index, duplicate_key_returns_existing_and_changes_nothing) {
  kv_index ix;
  kv_index_init(&ix, 4);
  uint8_t k[8];
  key_of(42, k);
  kv_block *a, *b;
  cr_assert_eq(kv_index_insert(&ix, 7, k, 8, &a), 0);
  a->size = 1234;
  cr_assert_eq(kv_index_insert(&ix, 7, k, 8, &b), KV_EEXISTS);
  cr_assert_eq(a, b);
  cr_assert_eq(b->size, 1234);
  cr_assert_eq(ix.count, 1);
  kv_index_fini(&ix);
}

Test(index, namespaces_are_disjoint) {
  kv_index ix;
  kv_index_init(&ix, 4);
  uint8_t k[8];
  key_of(1, k);
  kv_block *a, *b;
  cr_assert_eq(kv_index_insert(&ix, 1, k, 8, &a), 0);
  cr_assert_null(kv_index_find(&ix, 2, k, 8));
  cr_assert_eq(kv_index_insert(&ix, 2, k, 8, &b), 0);
  cr_assert_neq(a, b);
  cr_assert_eq(kv_index_find(&ix, 1, k, 8), a);
  cr_assert_eq(kv_index_find(&ix, 2, k, 8), b);
  /* A key that is a prefix of another is a different key. */
  cr_assert_null(kv_index_find(&ix, 1, k, 7));
  kv_index_fini(&ix);
}

Test(index, remove_refuses_resident_or_pinned_blocks) {
  kv_index ix;
  kv_index_init(&ix, 4);
  uint8_t k[8];
  key_of(9, k);
  kv_block *b;
  kv_index_insert(&ix, 0, k, 8, &b);
  b->tiers = KV_TIER_BIT(KV_G2);
  cr_assert_eq(kv_index_remove(&ix, b), -EBUSY);
  b->tiers = 0;
  b->pins = 1;
  cr_assert_eq(kv_index_remove(&ix, b), -EBUSY);
  b->pins = 0;
  cr_assert_eq(kv_index_remove(&ix, b), 0);
  cr_assert_null(kv_index_find(&ix, 0, k, 8));
  cr_assert_eq(ix.count, 0);
  kv_index_fini(&ix);
}

/* Random inserts and removes against a reference array, across many table
 * growths: catches any probe run broken by deletion. */
Test(index, random_operations_match_a_model) {
  enum { N = 50000 };
  kv_index ix;
  kv_index_init(&ix, 16);
  kv_block **model = calloc(N, sizeof *model);
  srand(12345);
  for (int step = 0; step < 400000; step++) {
    uint64_t v = (uint64_t)rand() % N;
    uint8_t k[8];
    key_of(v * 2654435761u, k);
    kv_block *b = kv_index_find(&ix, 3, k, 8);
    cr_assert_eq(b, model[v], "step %d key %llu: index and model disagree", step,
                 (unsigned long long)v);
    if (b && rand() % 2) {
      cr_assert_eq(kv_index_remove(&ix, b), 0);
      model[v] = NULL;
    } else if (!b) {
      cr_assert_eq(kv_index_insert(&ix, 3, k, 8, &b), 0);
      b->size = (uint32_t)v;
      model[v] = b;
    }
  }
  uint32_t live = 0;
  for (int v = 0; v < N; v++) {
    uint8_t k[8];
    key_of((uint64_t)v * 2654435761u, k);
    kv_block *b = kv_index_find(&ix, 3, k, 8);
    cr_assert_eq(b, model[v]);
    if (b) {
      live++;
      cr_assert_eq(b->size, (uint32_t)v);
    }
  }
  cr_assert_eq(live, ix.count);
  free(model);
  kv_index_fini(&ix);
}

Test(index, records_do_not_move_when_the_index_grows) {
  kv_index ix;
  kv_index_init(&ix, 1);
  uint8_t k[8];
  key_of(0, k);
  kv_block *first;
  kv_index_insert(&ix, 0, k, 8, &first);
  for (uint64_t v = 1; v < 20000; v++) {
    kv_block *b;
    key_of(v, k);
    cr_assert_eq(kv_index_insert(&ix, 0, k, 8, &b), 0);
  }
  key_of(0, k);
  cr_assert_eq(kv_index_find(&ix, 0, k, 8), first);
  cr_assert_eq(kv_index_at(&ix, first->id), first);
  kv_index_fini(&ix);
}

Test(index, lookup_allocates_nothing) {
  kv_index ix;
  kv_index_init(&ix, 1024);
  uint8_t k[8];
  for (uint64_t v = 0; v < 1000; v++) {
    kv_block *b;
    key_of(v, k);
    kv_index_insert(&ix, 0, k, 8, &b);
  }
  struct mallinfo2 before = mallinfo2();
  size_t found = 0;
  for (uint64_t v = 0; v < 200000; v++) {
    key_of(v % 2000, k);
    found += kv_index_find(&ix, 0, k, 8) != NULL;
  }
  struct mallinfo2 after = mallinfo2();
  cr_assert_eq(found, 100000);
  cr_assert_eq(before.uordblks, after.uordblks, "lookups changed the heap");
  cr_assert_eq(before.hblkhd, after.hblkhd);
  kv_index_fini(&ix);
}

Test(index, links_refuse_cycles_and_foreign_namespaces) {
  kv_index ix;
  kv_index_init(&ix, 8);
  uint8_t k[8];
  kv_block *a, *b, *c, *x;
  key_of(1, k);
  kv_index_insert(&ix, 0, k, 8, &a);
  key_of(2, k);
  kv_index_insert(&ix, 0, k, 8, &b);
  key_of(3, k);
  kv_index_insert(&ix, 0, k, 8, &c);
  key_of(4, k);
  kv_index_insert(&ix, 1, k, 8, &x);
  cr_assert_eq(kv_index_link(&ix, b, a), 0);
  cr_assert_eq(kv_index_link(&ix, c, b), 0);
  cr_assert_eq(kv_index_link(&ix, c, a), -EINVAL, "a second parent");
  cr_assert_eq(kv_index_link(&ix, a, c), -EINVAL, "a cycle");
  cr_assert_eq(kv_index_link(&ix, a, a), -EINVAL, "its own parent");
  cr_assert_eq(kv_index_link(&ix, x, a), -EINVAL, "another namespace");
  cr_assert_eq(b->parent, a->id);
  cr_assert_eq(a->child, b->id);
  kv_index_fini(&ix);
}

Test(index, removing_a_parent_orphans_its_children) {
  kv_index ix;
  kv_index_init(&ix, 8);
  uint8_t k[8];
  kv_block *p, *c1, *c2, *c3;
  key_of(1, k);
  kv_index_insert(&ix, 0, k, 8, &p);
  key_of(2, k);
  kv_index_insert(&ix, 0, k, 8, &c1);
  key_of(3, k);
  kv_index_insert(&ix, 0, k, 8, &c2);
  key_of(4, k);
  kv_index_insert(&ix, 0, k, 8, &c3);
  kv_index_link(&ix, c1, p);
  kv_index_link(&ix, c2, p);
  kv_index_link(&ix, c3, p);
  cr_assert_eq(kv_index_remove(&ix, c2), 0); /* a middle sibling */
  cr_assert_eq(c1->next == c3->id || c3->next == c1->id, 1);
  cr_assert_eq(kv_index_remove(&ix, p), 0);
  cr_assert_eq(c1->parent, KV_BID_NONE);
  cr_assert_eq(c3->parent, KV_BID_NONE);
  cr_assert_eq(c1->next, KV_BID_NONE);
  cr_assert_eq(c3->prev, KV_BID_NONE);
  /* The freed record is reused; the orphans stay orphans. */
  kv_block *n;
  key_of(5, k);
  kv_index_insert(&ix, 0, k, 8, &n);
  cr_assert_eq(c1->parent, KV_BID_NONE);
  kv_index_fini(&ix);
}
