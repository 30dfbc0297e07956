/* test_core.c - the cache core: two-phase writes, prefix lookups, pins,
 * eviction order (priority, recency, leaf-first, never pinned), demotion,
 * a full tier with everything pinned, and invariants under random load.
 * Includes core_int.h: the invariants read the index and the policies. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "tests/lib/keys.h"
#include "tiers/core_int.h"

#define SLOT 4096u

typedef struct fixture {
  kv_arena arena;
  kv_core *core;
  int ns;
} fixture;

static void setup(fixture *f, uint32_t blocks, const char *policy, kv_demote_fn fn, void *arg) {
  kv_arena_opts ao = {.capacity = (size_t)blocks * SLOT, .page_bytes = SLOT, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&f->arena, &ao), 0);
  kv_core_opts co = {.policy = policy, .demote = fn, .demote_arg = arg};
  cr_assert_eq(kv_core_new(&f->core, &co), 0);
  f->ns = kv_core_ns_register(f->core, &f->arena, SLOT);
  cr_assert_geq(f->ns, 0);
}
static void teardown(fixture *f) {
  kv_core_free(f->core);
  kv_arena_fini(&f->arena);
}

/* Stores block v (parent p, or none if p == 0) with its slot filled. */
static kv_block *store(fixture *f, uint64_t v, uint64_t p) {
  kv_key k = K(v), pk = K(p);
  kv_block *b;
  int rc = kv_core_alloc(f->core, (uint32_t)f->ns, &k, p ? &pk : NULL, KV_PRIO_DEFAULT, &b);
  cr_assert_eq(rc, 0, "alloc %llu: %s", (unsigned long long)v, kv_strerror(rc));
  memset(kv_core_g2_ptr(f->core, b), (int)(v & 0xff), SLOT);
  cr_assert_eq(kv_core_commit(f->core, b, (uint32_t)v), 0);
  return b;
}
static int resident(fixture *f, uint64_t v) {
  kv_key k = K(v);
  return kv_core_find(f->core, (uint32_t)f->ns, &k) != NULL;
}

Test(core, unknown_policy_and_namespace_are_refused) {
  kv_core *c;
  kv_core_opts co = {.policy = "no-such-policy"};
  cr_assert_eq(kv_core_new(&c, &co), -EINVAL);
  fixture f;
  setup(&f, 4, NULL, NULL, NULL);
  kv_key k = K(1);
  kv_block *b;
  cr_assert_eq(kv_core_alloc(f.core, 99, &k, NULL, 0, &b), -EINVAL);
  cr_assert_eq(kv_core_lookup(f.core, 99, &k, 1, NULL), -EINVAL);
  kv_key bad = {.len = 0};
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &bad, NULL, 0, &b), -EINVAL);
  teardown(&f);
}

Test(core, a_block_is_invisible_until_committed) {
  fixture f;
  setup(&f, 4, NULL, NULL, NULL);
  kv_key k = K(5);
  kv_block *b, *again;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
  cr_assert_eq(b->state, KV_BS_WRITING);
  cr_assert_null(kv_core_find(f.core, (uint32_t)f.ns, &k));
  uint8_t tier;
  cr_assert_eq(kv_core_lookup(f.core, (uint32_t)f.ns, &k, 1, &tier), 0);
  cr_assert_eq(tier, KV_TIER_NONE);
  /* A second writer of the same key is told it exists. */
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &again),
               KV_EEXISTS);
  cr_assert_eq(again, b);
  cr_assert_eq(kv_core_commit(f.core, b, 77), 0);
  cr_assert_eq(kv_core_commit(f.core, b, 77), KV_EBADSTATE, "double commit");
  cr_assert_eq(kv_core_abort(f.core, b), KV_EBADSTATE, "abort after commit");
  cr_assert_eq(kv_core_lookup(f.core, (uint32_t)f.ns, &k, 1, &tier), 1);
  cr_assert_eq(tier, KV_G2);
  cr_assert_eq(b->crc, 77);
  teardown(&f);
}

Test(core, abort_releases_the_slot_and_the_key) {
  fixture f;
  setup(&f, 1, NULL, NULL, NULL);
  kv_key k = K(5);
  kv_block *b;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
  cr_assert_eq(f.arena.used_bytes, SLOT);
  cr_assert_eq(kv_core_abort(f.core, b), 0);
  cr_assert_eq(f.arena.used_bytes, 0);
  cr_assert_eq(f.core->ix.count, 0);
  store(&f, 5, 0);
  cr_assert(resident(&f, 5));
  teardown(&f);
}

Test(core, lookup_reports_the_leading_run_and_every_tier) {
  fixture f;
  setup(&f, 8, NULL, NULL, NULL);
  store(&f, 1, 0);
  store(&f, 2, 1);
  store(&f, 4, 3); /* 3 missing */
  kv_key keys[4] = {K(1), K(2), K(3), K(4)};
  uint8_t tiers[4];
  cr_assert_eq(kv_core_lookup(f.core, (uint32_t)f.ns, keys, 4, tiers), 2);
  cr_assert_eq(tiers[0], KV_G2);
  cr_assert_eq(tiers[1], KV_G2);
  cr_assert_eq(tiers[2], KV_TIER_NONE);
  cr_assert_eq(tiers[3], KV_G2, "tiers are reported past the run too");
  cr_assert_eq(f.core->st.hits[KV_G2], 3);
  cr_assert_eq(f.core->st.misses, 1);
  teardown(&f);
}

Test(core, namespaces_do_not_see_each_other) {
  fixture f;
  setup(&f, 8, NULL, NULL, NULL);
  int other = kv_core_ns_register(f.core, &f.arena, SLOT);
  cr_assert_geq(other, 0);
  store(&f, 1, 0);
  kv_key k = K(1);
  cr_assert_null(kv_core_find(f.core, (uint32_t)other, &k));
  cr_assert_eq(kv_core_lookup(f.core, (uint32_t)other, &k, 1, NULL), 0);
  teardown(&f);
}

Test(core, pin_underflow_is_an_error_and_changes_nothing) {
  fixture f;
  setup(&f, 2, NULL, NULL, NULL);
  kv_block *b = store(&f, 1, 0);
  cr_assert_eq(kv_core_unpin(f.core, b), KV_EPINUNDERFLOW);
  cr_assert_eq(b->pins, 0);
  cr_assert_eq(kv_core_pin(f.core, b), 0);
  cr_assert_eq(kv_core_unpin(f.core, b), 0);
  cr_assert_eq(kv_core_unpin(f.core, b), KV_EPINUNDERFLOW);
  /* Still evictable once: the failed unpin did not disturb the policy. */
  store(&f, 2, 0);
  store(&f, 3, 0);
  cr_assert(!resident(&f, 1));
  teardown(&f);
}

Test(core, full_tier_with_every_block_pinned_is_a_clear_error) {
  fixture f;
  setup(&f, 4, NULL, NULL, NULL);
  kv_block *b[4];
  for (int i = 0; i < 4; i++) {
    b[i] = store(&f, (uint64_t)i + 1, 0);
    kv_core_pin(f.core, b[i]);
  }
  kv_key k = K(99);
  kv_block *n;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), KV_EALLPINNED);
  cr_assert_eq(f.core->st.alloc_failed, 1);
  /* Nothing was disturbed: every block is there with its bytes. */
  for (int i = 0; i < 4; i++) {
    cr_assert(resident(&f, (uint64_t)i + 1));
    uint8_t *p = kv_core_g2_ptr(f.core, b[i]);
    for (uint32_t j = 0; j < SLOT; j++) cr_assert_eq(p[j], (uint8_t)(i + 1));
  }
  cr_assert_null(kv_index_find(&f.core->ix, (uint32_t)f.ns, k.b, k.len));
  /* Unpinning one makes room again. */
  kv_core_unpin(f.core, b[2]);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), 0);
  cr_assert(!resident(&f, 3));
  teardown(&f);
}

Test(core, least_recently_used_goes_first) {
  fixture f;
  setup(&f, 3, "lru", NULL, NULL);
  kv_block *a = store(&f, 1, 0);
  store(&f, 2, 0);
  store(&f, 3, 0);
  kv_core_touch(f.core, a); /* 2 is now the oldest */
  store(&f, 4, 0);
  cr_assert(resident(&f, 1));
  cr_assert(!resident(&f, 2));
  cr_assert(resident(&f, 3));
  teardown(&f);
}

Test(core, lower_priority_goes_first) {
  fixture f;
  setup(&f, 3, NULL, NULL, NULL);
  store(&f, 1, 0);
  kv_block *b = store(&f, 2, 0);
  store(&f, 3, 0);
  kv_core_set_priority(f.core, b, 10); /* newer, but a lower class */
  store(&f, 4, 0);
  cr_assert(resident(&f, 1));
  cr_assert(!resident(&f, 2));
  teardown(&f);
}

/* A chain 1 <- 2 <- 3: the root is the least recently used, but a child
 * without its parent is useless, so the chain is cut from its end. */
Test(core, chains_are_evicted_leaf_first) {
  const char *pols[] = {"lru", "lru2"};
  for (int p = 0; p < 2; p++) {
    fixture f;
    setup(&f, 4, pols[p], NULL, NULL);
    store(&f, 1, 0);
    store(&f, 2, 1);
    store(&f, 3, 2);
    store(&f, 10, 0);
    store(&f, 11, 0);
    cr_assert(resident(&f, 1), "%s: root of a resident chain evicted", pols[p]);
    cr_assert(resident(&f, 2), "%s", pols[p]);
    cr_assert(!resident(&f, 3), "%s: the leaf goes first", pols[p]);
    store(&f, 12, 0);
    cr_assert(resident(&f, 1), "%s", pols[p]);
    cr_assert(!resident(&f, 2), "%s", pols[p]);
    teardown(&f);
  }
}

Test(core, a_parent_pinned_child_keeps_the_parent) {
  fixture f;
  setup(&f, 2, NULL, NULL, NULL);
  store(&f, 1, 0);
  kv_block *c = store(&f, 2, 1);
  kv_core_pin(f.core, c);
  kv_key k = K(3);
  kv_block *n;
  /* The child is pinned and the parent has a resident child: nothing can go. */
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), KV_EALLPINNED);
  teardown(&f);
}

typedef struct demote_log {
  int calls;
  int mode; /* KV_DEMOTE_DONE, KV_DEMOTE_ASYNC, or < 0 */
  kv_block *last;
  uint8_t first_byte;
} demote_log;

static int demote_cb(kv_core *c, kv_block *b, kv_tier from, void *arg) {
  demote_log *d = arg;
  d->calls++;
  d->last = b;
  d->first_byte = *(uint8_t *)kv_core_g2_ptr(c, b);
  cr_assert_eq(from, KV_G2);
  return d->mode;
}

/* A block being written keeps its parent in G2 when nothing is below G2:
 * committed, it would have no parent anywhere (a request that allocates
 * its blocks after a loaded prefix would make room by evicting the prefix
 * from its end). Its COMMIT makes the parent internal; its ABORT makes it
 * a leaf again. With a tier below G2 the parent may go: it is demoted. */
Test(core, a_child_being_written_keeps_its_parent) {
  fixture f;
  setup(&f, 3, NULL, NULL, NULL);
  store(&f, 1, 0);
  store(&f, 2, 1);
  kv_key k = K(3), pk = K(2), x = K(9);
  kv_block *c, *n;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, &pk, KV_PRIO_DEFAULT, &c), 0);
  /* 1 and 2 are the whole evictable chain, 2 a leaf with a child being
   * written: nothing can go for another block */
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &x, NULL, KV_PRIO_DEFAULT, &n), KV_EALLPINNED);
  cr_assert(resident(&f, 1) && resident(&f, 2), "the prefix stays");
  cr_assert_eq(kv_core_abort(f.core, c), 0);
  store(&f, 9, 0); /* the aborted block's slot */
  cr_assert(resident(&f, 1) && resident(&f, 2));
  kv_key y = K(10);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &y, NULL, KV_PRIO_DEFAULT, &n), 0,
               "aborted: the leaf may go again");
  cr_assert(!resident(&f, 2), "the leaf went");
  cr_assert_eq(kv_core_commit(f.core, n, 0), 0);
  teardown(&f);

  demote_log d = {.mode = KV_DEMOTE_DONE};
  setup(&f, 3, NULL, demote_cb, &d);
  store(&f, 1, 0);
  store(&f, 2, 1);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, &pk, KV_PRIO_DEFAULT, &c), 0);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &x, NULL, KV_PRIO_DEFAULT, &n), 0,
               "with a tier below, the parent is demoted");
  cr_assert_eq(d.calls, 1);
  teardown(&f);
}

Test(core, victims_go_to_the_demotion_callback_with_their_bytes) {
  fixture f;
  demote_log d = {.mode = KV_DEMOTE_DONE};
  setup(&f, 2, NULL, demote_cb, &d);
  store(&f, 1, 0);
  store(&f, 2, 0);
  store(&f, 3, 0);
  cr_assert_eq(d.calls, 1);
  cr_assert_eq(d.first_byte, 1, "the callback saw the victim's bytes");
  cr_assert(!resident(&f, 1));
  d.mode = -EIO; /* a refused demotion drops the block and is counted */
  store(&f, 4, 0);
  cr_assert_eq(f.core->st.demote_failed, 1);
  cr_assert(!resident(&f, 2));
  teardown(&f);
}

Test(core, asynchronous_demotion_keeps_the_slot_until_done) {
  fixture f;
  demote_log d = {.mode = KV_DEMOTE_ASYNC};
  setup(&f, 2, NULL, demote_cb, &d);
  store(&f, 1, 0);
  kv_block *b2 = store(&f, 2, 0);
  kv_key k = K(3);
  kv_block *n;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), -EAGAIN);
  kv_block *victim = d.last;
  cr_assert(victim->busy & KV_TIER_BIT(KV_G2));
  cr_assert(resident(&f, 1), "still readable while the copy runs");
  /* The other block is demoted too; then nothing is left to start. */
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), -EAGAIN);
  cr_assert_eq(d.last, b2);
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), -EAGAIN);
  cr_assert_eq(d.calls, 2);
  kv_core_demote_done(f.core, victim, KV_G2, 1);
  cr_assert(!resident(&f, 1));
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &n), 0);
  teardown(&f);
}

Test(core, delete_refuses_pinned_blocks) {
  fixture f;
  setup(&f, 2, NULL, NULL, NULL);
  kv_block *b = store(&f, 1, 0);
  kv_core_pin(f.core, b);
  cr_assert_eq(kv_core_delete(f.core, b), -EBUSY);
  kv_core_unpin(f.core, b);
  cr_assert_eq(kv_core_delete(f.core, b), 0);
  cr_assert(!resident(&f, 1));
  cr_assert_eq(f.arena.used_bytes, 0);
  teardown(&f);
}

/* Random stores, touches, pins and deletes: after every step the policy
 * holds exactly the evictable blocks, and the arena exactly the slots. */
typedef struct inv {
  fixture *f;
  uint32_t evictable, slots;
} inv;
static int count_cb(kv_block *b, void *arg) {
  inv *v = arg;
  if (b->inpol & KV_TIER_BIT(KV_G2)) {
    v->evictable++;
    cr_assert(b->state == KV_BS_READY && b->pins == 0 && b->rchild[KV_G2] == 0);
  } else if (b->state == KV_BS_READY && b->pins == 0 && b->rchild[KV_G2] == 0 && b->tiers) {
    cr_assert_fail("evictable block %u missing from the policy", b->id);
  }
  if (b->slot[KV_G2] != KV_SLOT_NONE) v->slots++;
  /* rchild counts the children valid in G2. */
  uint32_t n = 0;
  for (kv_bid c = b->child; c != KV_BID_NONE;) {
    kv_block *cb = kv_index_at(&v->f->core->ix, c);
    n += (cb->tiers & KV_TIER_BIT(KV_G2)) != 0;
    c = cb->next;
  }
  cr_assert_eq(n, b->rchild[KV_G2], "block %u: rchild %u, counted %u", b->id, b->rchild[KV_G2], n);
  return 0;
}

Test(core, invariants_hold_under_random_operations) {
  const char *pols[] = {"lru", "lru2"};
  for (int p = 0; p < 2; p++) {
    fixture f;
    setup(&f, 64, pols[p], NULL, NULL);
    kv_block *pinned[16] = {0};
    srand(99 + p);
    for (int step = 0; step < 20000; step++) {
      uint64_t v = 1 + (uint64_t)(rand() % 300);
      kv_key k = K(v);
      kv_block *b = kv_core_find(f.core, (uint32_t)f.ns, &k);
      int op = rand() % 10;
      if (!b) {
        uint64_t parent = v > 1 && rand() % 4 ? v - 1 : 0;
        kv_key pk = K(parent);
        int rc = kv_core_alloc(f.core, (uint32_t)f.ns, &k, parent ? &pk : NULL,
                               (uint8_t)(rand() % 3 * 100), &b);
        if (rc == 0) {
          if (rand() % 8) kv_core_commit(f.core, b, 0);
          else kv_core_abort(f.core, b);
        } else {
          cr_assert(rc == KV_EALLPINNED || rc == KV_EEXISTS, "%s", kv_strerror(rc));
        }
      } else if (op < 6) {
        kv_core_touch(f.core, b);
      } else if (op < 8) {
        int i = rand() % 16;
        if (pinned[i]) {
          kv_key pk = {.len = (uint8_t)kv_block_keylen(pinned[i])};
          memcpy(pk.b, pinned[i]->key, pk.len);
          kv_core_unpin(f.core, pinned[i]);
          pinned[i] = NULL;
        } else {
          kv_core_pin(f.core, b);
          pinned[i] = b;
        }
      } else if (!b->pins) {
        cr_assert_eq(kv_core_delete(f.core, b), 0);
      }
      if (step % 97 == 0) {
        inv v2 = {&f, 0, 0};
        kv_index_foreach(&f.core->ix, count_cb, &v2);
        kv_evict *e = f.arena.cls[f.core->ns[f.ns].cls].user;
        cr_assert_eq(v2.evictable, e->count, "%s step %d", pols[p], step);
        cr_assert_eq((uint64_t)v2.slots * SLOT, f.arena.used_bytes, "%s step %d", pols[p], step);
      }
    }
    teardown(&f);
  }
}
