/* test_core_ns.c - the cache core's namespace ids: counted blocks, freed
 * when empty and reused, namespaces learned from G3 freed once their last
 * block goes, and more than KV_NS_MAX namespaces over time. Includes
 * core_int.h: it reads the id table. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "tests/lib/keys.h"
#include "tests/lib/tmpdir.h"
#include "tiers/core_int.h"

#define BLK 16384u

Test(core_ns, ids_are_freed_when_empty_and_reused) {
  kv_arena a;
  kv_arena_opts ao = {.capacity = 16 * BLK, .page_bytes = BLK, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&a, &ao), 0);
  kv_core *c;
  cr_assert_eq(kv_core_new(&c, NULL), 0);
  int n0 = kv_core_ns_register(c, &a, BLK), n1 = kv_core_ns_register(c, &a, BLK);
  cr_assert_eq(n0, 0);
  cr_assert_eq(n1, 1);
  kv_key k = K(1);
  kv_block *b;
  cr_assert_eq(kv_core_alloc(c, (uint32_t)n0, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
  cr_assert_eq(kv_core_ns_blocks(c, (uint32_t)n0), 1, "a block being written counts");
  cr_assert_eq(kv_core_ns_free(c, (uint32_t)n0), -EBUSY);
  cr_assert_eq(kv_core_commit(c, b, 0), 0);
  cr_assert_eq(kv_core_pin(c, b), 0);
  cr_assert_eq(kv_core_delete(c, b), -EBUSY);
  cr_assert_eq(kv_core_unpin(c, b), 0);
  cr_assert_eq(kv_core_delete(c, b), 0);
  cr_assert_eq(kv_core_ns_blocks(c, (uint32_t)n0), 0);
  cr_assert_eq(kv_core_ns_free(c, (uint32_t)n0), 0);
  cr_assert_eq(kv_core_ns_free(c, (uint32_t)n0), -EINVAL, "freed twice");
  cr_assert_eq(kv_core_lookup(c, (uint32_t)n0, &k, 1, NULL), -EINVAL, "a freed id serves nothing");
  cr_assert_eq(kv_core_ns_register(c, &a, BLK), n0, "the freed id comes first");
  cr_assert_eq(kv_core_ns_register(c, &a, BLK), 2);
  for (uint32_t i = 0; i < 3; i++) cr_assert_eq(kv_core_ns_free(c, i), 0);
  /* Over time, more namespaces than ids: each freed when done. */
  for (uint32_t i = 0; i < KV_NS_MAX + 100; i++) {
    int n = kv_core_ns_register(c, &a, BLK);
    cr_assert_geq(n, 0, "namespace %u: %s", i, kv_strerror(n));
    cr_assert_eq(kv_core_ns_free(c, (uint32_t)n), 0);
  }
  cr_assert_lt(c->nns, 8u, "ids were reused, not piled up");
  /* A policy switch reaches the classes of freed namespaces too (none is left). */
  cr_assert_eq(kv_core_set_policy(c, "lfuda"), 0);
  kv_evict *e = a.cls[0].user;
  cr_assert_not_null(e);
  cr_assert_eq(e->ops, kv_evict_lookup("lfuda"));
  kv_core_free(c);
  cr_assert_null(a.cls[0].user, "the core's policies go with it");
  kv_arena_fini(&a);
}

/* A namespace learned from G3 at attach, that nobody registers again,
 * is freed by the core when its last block leaves G3. */
Test(core_ns, namespaces_learned_from_g3_go_with_their_last_block) {
  char dir[64];
  cr_assert_eq(kvt_mkdtemp(dir, sizeof dir, "kvcore-ns"), 0);
  kv_arena a;
  kv_arena_opts ao = {.capacity = 4 * BLK, .page_bytes = BLK, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&a, &ao), 0);
  kv_g3_dir d = {dir, (1u << 20) + 16 * BLK};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = BLK,
                  .queue_depth = 4,
                  .backend = KV_G3_BACKEND_THREADS,
                  .commit_window_us = -1};
  kv_g3 *g3;
  kv_g3_open_info info;
  cr_assert_eq(kv_g3_open(&g3, &o, &info), 0);
  kv_core *c;
  cr_assert_eq(kv_core_new(&c, NULL), 0);
  cr_assert_geq(kv_core_attach_g3(c, g3, NULL), 0);
  static const uint8_t D[KV_G3_NS_BYTES] = {9, 9, 9};
  int ns = kv_core_ns_register_digest(c, &a, BLK, D);
  cr_assert_geq(ns, 0);
  for (uint64_t v = 1; v <= 2; v++) {
    kv_key k = K(v);
    kv_block *b;
    cr_assert_eq(kv_core_alloc(c, (uint32_t)ns, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
    cr_assert_eq(kv_core_commit(c, b, 0), 0);
  }
  cr_assert_eq(kv_core_evict_n(c, KV_G2, KV_NS_ANY, UINT64_MAX), 2);
  kv_g3_drain(g3);
  kv_core_free(c);
  /* A restart: the namespace is dormant, with its two blocks. */
  cr_assert_eq(kv_core_new(&c, NULL), 0);
  cr_assert_eq(kv_core_attach_g3(c, g3, NULL), 2);
  cr_assert_eq(c->nns, 1);
  cr_assert_eq(kv_core_ns_blocks(c, 0), 2);
  cr_assert_eq(kv_core_flush(c, KV_G3, KV_NS_ANY), 2);
  cr_assert_eq(c->nfree, 1, "the dormant namespace went with its blocks");
  cr_assert_eq(c->st.ns_freed, 1);
  /* Made again, the digest is a new, empty namespace on the reused id. */
  cr_assert_eq(kv_core_ns_register_digest(c, &a, BLK, D), 0);
  kv_key k = K(1);
  cr_assert_eq(kv_core_lookup(c, 0, &k, 1, NULL), 0);
  kv_core_free(c);
  kv_g3_close(g3);
  kv_arena_fini(&a);
  kvt_rmtree(dir);
}
