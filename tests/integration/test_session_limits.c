/* test_session_limits.c - what one worker connection may hold: pins (each repeat
 * counted, one pin per connection in the core) and uncommitted
 * allocations, against a real kvcached (tests/lib/fixture.h). */
#include "tests/lib/fixture.h"

#include "base/errors.h"

#define REPEAT 4096u /* one LOAD: the batch limit */

/* Used to fail: the core counted every repeat pin in a 16-bit count, so a
 * worker that loaded one block 65535 times made every other worker's LOAD
 * of it fail with -EOVERFLOW. */
Test(limits, one_session_pinning_a_block_65536_times_does_not_fail_others_loads, .timeout = 120) {
  ops_start(NULL, NULL);
  kvc *a = ops_open("t"), *b = ops_open("t");
  ops_store(a, 1, 1);
  static kvc_key keys[REPEAT];
  static kvc_block out[REPEAT];
  for (uint32_t i = 0; i < REPEAT; i++) keys[i] = KC(1);
  for (int round = 0; round < 16; round++) /* 16 x 4096 = 65536 pins */
    cr_assert_eq(kvc_load(a, KVC_G2, keys, REPEAT, out), (int)REPEAT, "round %d: %s", round,
                 kvc_strerror(out[REPEAT - 1].status));
  kvc_block ob;
  cr_assert_eq(kvc_load(b, KVC_G2, keys, 1, &ob), 1, "another worker's LOAD: %s",
               kvc_strerror(ob.status));
  cr_assert_eq(kvc_release(b, keys, 1, NULL), 1);
  /* Every repeat wants its release; the block stays pinned until the last. */
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "pins"), 1);
  json_decref(o);
  for (int round = 0; round < 16; round++)
    cr_assert_eq(kvc_release(a, keys, REPEAT, NULL), (int)REPEAT);
  int32_t st;
  cr_assert_eq(kvc_release(a, keys, 1, &st), 0);
  cr_assert_eq(st, KV_ENOTOWNER);
  o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "pins"), 0);
  json_decref(o);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

Test(limits, pins_past_the_session_limit_are_refused_per_key) {
  const char *const set[] = {"limits.pins_per_session=10", NULL};
  ops_start(NULL, set);
  kvc *a = ops_open("t"), *b = ops_open("t");
  ops_store(a, 1, 8);
  kvc_key keys[12];
  kvc_block out[12];
  for (int i = 0; i < 8; i++) keys[i] = KC((uint64_t)i + 1);
  for (int i = 8; i < 12; i++) keys[i] = KC(1); /* repeats count too */
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 12, out), 10);
  for (int i = 0; i < 10; i++) cr_assert_eq(out[i].status, 0, "key %d", i);
  for (int i = 10; i < 12; i++) {
    cr_assert_eq(out[i].status, -EDQUOT, "key %d: %s", i, kvc_strerror(out[i].status));
    cr_assert_null(out[i].ptr);
  }
  /* The limit is the connection's: another one loads, and a release makes room. */
  cr_assert_eq(kvc_load(b, KVC_G2, keys, 2, out), 2);
  cr_assert_eq(kvc_load(a, KVC_G2, keys + 7, 1, out), 0);
  cr_assert_eq(out[0].status, -EDQUOT);
  cr_assert_eq(kvc_release(a, keys, 1, NULL), 1);
  cr_assert_eq(kvc_load(a, KVC_G2, keys + 7, 1, out), 1);
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "session_limit_refused.pins"), 3);
  json_decref(o);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

Test(limits, allocations_past_the_session_limit_are_refused_per_key) {
  const char *const set[] = {"limits.allocs_per_session=3", NULL};
  ops_start(NULL, set);
  kvc *a = ops_open("t"), *b = ops_open("t");
  kvc_key keys[6];
  kvc_block out[6];
  for (int i = 0; i < 6; i++) keys[i] = KC((uint64_t)i + 1);
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, keys, NULL, 5, out), 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(out[i].status, 0);
  for (int i = 3; i < 5; i++)
    cr_assert_eq(out[i].status, -EDQUOT, "key %d: %s", i, kvc_strerror(out[i].status));
  /* Another connection is not held back; a commit makes room. */
  cr_assert_eq(kvc_alloc(b, KVC_G2, 128, keys + 3, NULL, 1, out + 3), 1);
  cr_assert_eq(kvc_commit(a, keys, 1, NULL), 1);
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, keys + 4, NULL, 1, out + 4), 1);
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, keys + 5, NULL, 1, out + 5), 0); /* 3 again */
  cr_assert_eq(out[5].status, -EDQUOT);
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "session_limit_refused.allocs"), 3);
  json_decref(o);
  const char *m;
  static char resp[1 << 20];
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &m), 200);
  cr_assert(strstr(m, "kvcached_session_limit_refused_total{limit=\"allocs\"} 3\n"), "%s", m);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

/* Used to happen: the per-session limits (1,048,576 pins, 65,536
 * allocations) were far above the arena's 32 slots, so one connection
 * pinned every block of its tenant's G2 and every other worker of the
 * tenant got KV_EALLPINNED. Now a connection holds at most
 * limits.session_share (50%) of the slots: 16 of 32. */
Test(limits, one_session_cannot_pin_the_whole_arena) {
  ops_start(NULL, NULL);
  kvc *a = ops_open("t"), *b = ops_open("t");
  ops_store(b, 1, 32); /* the arena's 32 slots, committed */
  kvc_key keys[32];
  kvc_block out[32];
  for (int i = 0; i < 32; i++) keys[i] = KC((uint64_t)i + 1);
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 32, out), 16, "a 50%% share of 32 slots");
  for (int i = 0; i < 16; i++) cr_assert_eq(out[i].status, 0, "key %d", i);
  for (int i = 16; i < 32; i++)
    cr_assert_eq(out[i].status, KV_ESHARE, "key %d: %s", i, kvc_strerror(out[i].status));
  /* A repeat of a block it holds is served: it holds nothing more. */
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 1, out), 1);
  cr_assert_eq(kvc_release(a, keys, 1, NULL), 1);
  /* The tenant's other workers still store: room is made from unpinned blocks. */
  kvc_key nk = KC(1000);
  kvc_block ob;
  cr_assert_eq(kvc_alloc(b, KVC_G2, 128, &nk, NULL, 1, &ob), 1, "another worker's ALLOC: %s",
               kvc_strerror(ob.status));
  cr_assert_eq(kvc_commit(b, &nk, 1, NULL), 1);
  cr_assert_eq(ops_stat("session_limit_refused.share"), 16);
  /* A release makes room for one more (block 1 was pinned: still resident). */
  cr_assert_eq(kvc_release(a, keys, 1, NULL), 1);
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 1, out), 1, "%s", kvc_strerror(out[0].status));
  cr_assert_eq(kvc_load(a, KVC_G2, keys + 31, 1, out), 0);
  cr_assert_eq(out[0].status, KV_ESHARE);
  cr_assert_eq(ops_metric("kvcached_session_limit_refused_total{limit=\"share\"}"), 17);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

/* The same with uncommitted allocations: one connection holding an ALLOC
 * on every slot locked the tenant's other workers out. Pins and
 * allocations count together. */
Test(limits, one_session_cannot_allocate_the_whole_arena) {
  ops_start(NULL, NULL);
  kvc *a = ops_open("t"), *b = ops_open("t");
  ops_store(b, 1, 4);
  kvc_key keys[36];
  kvc_block out[36];
  for (int i = 0; i < 36; i++) keys[i] = KC((uint64_t)i + 1);
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 3, out), 3);
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, keys + 4, NULL, 32, out + 4), 13,
               "16 held: 3 pins, 13 allocations");
  for (int i = 17; i < 36; i++)
    cr_assert_eq(out[i].status, KV_ESHARE, "key %d: %s", i, kvc_strerror(out[i].status));
  kvc_key nk = KC(1000);
  kvc_block ob;
  cr_assert_eq(kvc_alloc(b, KVC_G2, 128, &nk, NULL, 1, &ob), 1, "another worker's ALLOC: %s",
               kvc_strerror(ob.status));
  /* A commit makes room. */
  cr_assert_eq(kvc_commit(a, keys + 4, 1, NULL), 1);
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, keys + 17, NULL, 1, out + 17), 1);
  cr_assert_eq(ops_stat("session_limit_refused.share"), 19);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

/* limits.session_share = 100 lifts the share: one connection may hold
 * every slot (the old behaviour, for a single-worker deployment). */
Test(limits, session_share_100_allows_the_whole_arena) {
  const char *const set[] = {"limits.session_share=100", NULL};
  ops_start(NULL, set);
  kvc *a = ops_open("t");
  ops_store(a, 1, 32);
  kvc_key keys[32];
  kvc_block out[32];
  for (int i = 0; i < 32; i++) keys[i] = KC((uint64_t)i + 1);
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 32, out), 32);
  kvc_close(a);
  ops_stop();
}
