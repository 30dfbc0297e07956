/* test_evict.c - every eviction policy, driven directly: the victim it
 * offers is always one it holds, priority classes order first, and its
 * heap survives random add/remove/touch against a brute-force model. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/evict.h"

static kv_block *mk(kv_index *ix, uint64_t v) {
  uint8_t k[8];
  for (int i = 0; i < 8; i++) k[i] = (uint8_t)(v >> (8 * i));
  kv_block *b;
  cr_assert_eq(kv_index_insert(ix, 0, k, 8, &b), 0);
  return b;
}

Test(evict, every_policy_has_a_unique_name_and_the_default_exists) {
  int n = 0;
  for (int i = 0; kv_evict_policies[i]; i++, n++) {
    cr_assert_eq(kv_evict_lookup(kv_evict_policies[i]->name), kv_evict_policies[i]);
    cr_assert_not_null(kv_evict_policies[i]->summary);
  }
  cr_assert_geq(n, 2);
  cr_assert_not_null(kv_evict_lookup(kv_evict_default));
  cr_assert_null(kv_evict_lookup("nope"));
}

Test(evict, lower_priority_class_always_first) {
  for (int p = 0; kv_evict_policies[p]; p++) {
    kv_index ix;
    kv_index_init(&ix, 16);
    kv_evict e;
    cr_assert_eq(kv_evict_init(&e, kv_evict_policies[p], &ix, KV_G2), 0);
    kv_block *old = mk(&ix, 1), *young = mk(&ix, 2);
    old->atime = 1, old->hits = 5, old->atime2 = 0, old->prio = 200;
    young->atime = 1000, young->hits = 1, young->prio = 100;
    e.ops->add(&e, old);
    e.ops->add(&e, young);
    cr_assert_eq(e.ops->peek(&e), young, "%s", kv_evict_policies[p]->name);
    e.ops->remove(&e, young);
    cr_assert_eq(e.ops->peek(&e), old);
    e.ops->remove(&e, old);
    cr_assert_null(e.ops->peek(&e));
    cr_assert_eq(e.count, 0);
    kv_evict_fini(&e);
    kv_index_fini(&ix);
  }
}

Test(evict, lru2_prefers_blocks_seen_once) {
  kv_index ix;
  kv_index_init(&ix, 16);
  kv_evict e;
  kv_evict_init(&e, kv_evict_lookup("lru2"), &ix, KV_G2);
  kv_block *reused = mk(&ix, 1), *once = mk(&ix, 2);
  reused->hits = 2, reused->atime2 = 1, reused->atime = 2;
  once->hits = 1, once->atime = 50;
  e.ops->add(&e, reused);
  e.ops->add(&e, once);
  cr_assert_eq(e.ops->peek(&e), once);
  kv_evict_fini(&e);
  kv_index_fini(&ix);
}

/* The brute-force minimum of the score each policy implies is hard to state
 * generically, so the model checks the weaker, policy-independent facts:
 * peek returns a held block, count matches, and after a touch that makes a
 * block the oldest under lru it is the one offered. */
Test(evict, random_operations_keep_the_heap_consistent) {
  enum { N = 2000 };
  for (int p = 0; kv_evict_policies[p]; p++) {
    kv_index ix;
    kv_index_init(&ix, N);
    kv_evict e;
    kv_evict_init(&e, kv_evict_policies[p], &ix, KV_G2);
    kv_block *b[N];
    int in[N] = {0}, held = 0;
    uint64_t clock = 1;
    for (int i = 0; i < N; i++) b[i] = mk(&ix, (uint64_t)i);
    srand(5 + p);
    for (int step = 0; step < 50000; step++) {
      int i = rand() % N;
      int op = rand() % 3;
      if (!in[i]) {
        b[i]->atime2 = b[i]->atime;
        b[i]->atime = clock++;
        b[i]->hits = (uint16_t)(1 + rand() % 3);
        b[i]->prio = (uint8_t)(rand() % 2 ? 128 : 64);
        cr_assert_eq(e.ops->add(&e, b[i]), 0);
        in[i] = 1, held++;
      } else if (op == 0) {
        e.ops->remove(&e, b[i]);
        in[i] = 0, held--;
      } else {
        b[i]->atime2 = b[i]->atime;
        b[i]->atime = clock++;
        if (b[i]->hits < 100) b[i]->hits++;
        e.ops->touch(&e, b[i]);
      }
      cr_assert_eq(e.count, (uint32_t)held);
      kv_block *v = e.ops->peek(&e);
      if (held) {
        cr_assert_not_null(v);
        cr_assert(in[v->id], "%s: victim not held", kv_evict_policies[p]->name);
        /* No held block of a lower class may exist. */
        for (int j = 0; j < N; j++)
          if (in[j]) cr_assert_geq(b[j]->prio, v->prio);
      } else {
        cr_assert_null(v);
      }
    }
    /* Drain: lru must drain in (prio, atime) order. */
    if (!strcmp(kv_evict_policies[p]->name, "lru")) {
      uint64_t last = 0;
      kv_block *v;
      while ((v = e.ops->peek(&e))) {
        uint64_t key = ((uint64_t)v->prio << 56) | v->atime;
        cr_assert_geq(key, last);
        last = key;
        e.ops->remove(&e, v);
      }
    }
    kv_evict_fini(&e);
    kv_index_fini(&ix);
  }
}

/* ---- a small cache driven the way the core drives a policy ------------------
 * Capacity `cap` blocks, every block a leaf (evictable): an access to a
 * held block touches it; a new key evicts peek()'s victim when full. */
typedef struct sim {
  kv_index ix;
  kv_evict e;
  uint64_t clock;
  uint32_t cap;
} sim;

static void sim_open(sim *s, const char *policy, uint32_t cap) {
  kv_index_init(&s->ix, cap * 2);
  memset(&s->e, 0, sizeof s->e);
  s->e.capacity = cap;
  cr_assert_eq(kv_evict_init(&s->e, kv_evict_lookup(policy), &s->ix, KV_G2), 0, "%s", policy);
  s->clock = 0;
  s->cap = cap;
}

static void sim_close(sim *s) {
  kv_evict_fini(&s->e);
  kv_index_fini(&s->ix);
}

static kv_block *sim_find(sim *s, uint64_t v) {
  uint8_t k[8];
  for (int i = 0; i < 8; i++) k[i] = (uint8_t)(v >> (8 * i));
  return kv_index_find(&s->ix, 0, k, 8);
}

static void sim_evict(sim *s) {
  kv_block *v = s->e.ops->peek(&s->e);
  cr_assert_not_null(v);
  s->e.ops->remove(&s->e, v);
  cr_assert_eq(kv_index_remove(&s->ix, v), 0);
}

static void sim_access(sim *s, uint64_t key) {
  kv_block *b = sim_find(s, key);
  if (b) {
    b->atime2 = b->atime;
    b->atime = ++s->clock;
    b->hits++;
    s->e.ops->touch(&s->e, b);
    return;
  }
  if (s->e.count >= s->cap) sim_evict(s);
  b = mk(&s->ix, key);
  b->state = KV_BS_READY;
  b->hits = 1;
  b->atime = ++s->clock;
  cr_assert_eq(s->e.ops->add(&s->e, b), 0);
}

/* A set used again and again survives one pass over many blocks used once
 * under the scan-resistant policies; plain LRU (the control) loses it. */
static int hot_left_after_scan(const char *policy) {
  enum { CAP = 50, HOT = 10, SCAN = 500 };
  sim s;
  sim_open(&s, policy, CAP);
  for (int round = 0; round < 6; round++)
    for (uint64_t h = 0; h < HOT; h++) sim_access(&s, h);
  for (uint64_t i = 0; i < SCAN; i++) sim_access(&s, 1000 + i);
  int left = 0;
  for (uint64_t h = 0; h < HOT; h++) left += sim_find(&s, h) != NULL;
  cr_assert_leq(s.e.count, CAP);
  sim_close(&s);
  return left;
}

Test(evict, a_one_pass_scan_does_not_flush_a_frequently_used_set) {
  static const char *const resistant[] = {"arc", "s3fifo"};
  for (size_t i = 0; i < sizeof resistant / sizeof resistant[0]; i++)
    cr_assert_eq(hot_left_after_scan(resistant[i]), 10, "%s lost hot blocks to a scan", resistant[i]);
  cr_assert_eq(hot_left_after_scan("lru"), 0, "the control: LRU is flushed by the scan");
}

/* A block evicted from S3-FIFO's small queue and asked for again comes back
 * straight into the main queue: newer one-time blocks in S go before it. */
Test(evict, s3fifo_ghost_hit_enters_the_main_queue) {
  sim s;
  sim_open(&s, "s3fifo", 100);
  sim_access(&s, 7);
  sim_evict(&s); /* 7 was the only block: the victim, remembered as a ghost */
  cr_assert_null(sim_find(&s, 7));
  sim_access(&s, 7);
  for (uint64_t i = 0; i < 20; i++) sim_access(&s, 100 + i);
  kv_block *v = s.e.ops->peek(&s.e);
  cr_assert_neq(v, sim_find(&s, 7), "the ghost hit was not promoted");
  cr_assert_eq(v, sim_find(&s, 100));
  sim_close(&s);
}

/* ARC: a block evicted from T1 and asked for again returns into T2, and
 * the target size of T1 grows, so T1's blocks go before it. */
Test(evict, arc_ghost_hit_enters_the_frequent_list) {
  sim s;
  sim_open(&s, "arc", 100);
  sim_access(&s, 7);
  sim_evict(&s);
  sim_access(&s, 7); /* ghost hit in B1 */
  for (uint64_t i = 0; i < 5; i++) sim_access(&s, 100 + i);
  /* Without the ghost, 7 would be T1's least recently used block. */
  kv_block *v = s.e.ops->peek(&s.e);
  cr_assert_eq(v, sim_find(&s, 100), "victim %p, 7 is %p", (void *)v, (void *)sim_find(&s, 7));
  sim_close(&s);
}

/* The ghost set never holds more than its bound, and forgets oldest first. */
Test(evict, ghost_set_is_bounded_and_fifo) {
  kv_ghost g = {0};
  cr_assert_eq(kv_ghost_size(&g, 8), 0);
  for (uint32_t i = 1; i <= 20; i++) kv_ghost_add(&g, i);
  cr_assert_leq(g.live, 8);
  cr_assert_eq(kv_ghost_take(&g, 3), 0, "old entries are forgotten");
  cr_assert_eq(kv_ghost_take(&g, 20), 1);
  cr_assert_eq(kv_ghost_take(&g, 20), 0, "a take forgets the entry");
  kv_ghost_free(&g);
}

/* The sketch counts, saturates at 15 and halves after its sample. */
Test(evict, sketch_counts_and_ages) {
  kv_sketch s = {0};
  cr_assert_eq(kv_sketch_size(&s, 64), 0);
  for (int i = 0; i < 20; i++) kv_sketch_add(&s, 42);
  cr_assert_eq(kv_sketch_get(&s, 42), 15);
  cr_assert_leq(kv_sketch_get(&s, 43), 1);
  for (uint32_t i = 0; i < s.sample; i++) kv_sketch_add(&s, 1000 + i);
  cr_assert_leq(kv_sketch_get(&s, 42), 7, "halving ages old counts");
  kv_sketch_free(&s);
}
