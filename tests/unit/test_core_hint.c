/* test_core_hint.c - engine hints in the core: the checks, the session
 * table (bounded, scoped by namespace, retention capped, owners by block
 * id that die with their record or their session), and the gap statistics
 * it keeps. Includes core_int.h: the tests read the table. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "base/errors.h"
#include "tests/lib/keys.h"
#include "tiers/core_int.h"

#define SLOT 4096u

typedef struct fixture {
  kv_arena arena;
  kv_core *core;
  int ns, ns2;
} fixture;

static void setup_opts(fixture *f, uint32_t blocks, const kv_core_opts *co) {
  kv_arena_opts ao = {.capacity = (size_t)blocks * SLOT, .page_bytes = SLOT, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&f->arena, &ao), 0);
  cr_assert_eq(kv_core_new(&f->core, co), 0);
  f->ns = kv_core_ns_register(f->core, &f->arena, SLOT);
  f->ns2 = kv_core_ns_register(f->core, &f->arena, SLOT);
  cr_assert_geq(f->ns, 0);
  cr_assert_geq(f->ns2, 0);
}
static void setup(fixture *f, uint32_t blocks) {
  kv_core_opts co = {0};
  setup_opts(f, blocks, &co);
}
static void teardown(fixture *f) {
  kv_core_free(f->core);
  kv_arena_fini(&f->arena);
}

static kv_block *store_in(fixture *f, int ns, uint64_t v, uint64_t p) {
  kv_key k = K(v), pk = K(p);
  kv_block *b;
  int rc = kv_core_alloc(f->core, (uint32_t)ns, &k, p ? &pk : NULL, KV_PRIO_DEFAULT, &b);
  cr_assert_eq(rc, 0, "alloc %llu: %s", (unsigned long long)v, kv_strerror(rc));
  cr_assert_eq(kv_core_commit(f->core, b, 0), 0);
  return b;
}
static kv_block *store(fixture *f, uint64_t v, uint64_t p) { return store_in(f, f->ns, v, p); }

static const kv_session *owner(fixture *f, const kv_block *b) {
  return kv_sessions_owner(&f->core->sess, &f->core->ix, b->id);
}

Test(core_hint, bad_hints_are_refused) {
  fixture f;
  setup(&f, 8);
  kv_block *b = store(&f, 1, 0);
  uint32_t ns = (uint32_t)f.ns;
  cr_assert_eq(kv_core_hint_session(f.core, ns, 0, b, 0), -EINVAL, "session 0");
  cr_assert_eq(kv_core_hint_session(f.core, ns, 5, NULL, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns2, 5, b, 0), -EINVAL,
               "a block of another namespace");
  cr_assert_eq(kv_core_hint_session(f.core, 77, 5, b, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_finished(f.core, ns, 0, KV_STOP_END_TURN, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_finished(f.core, ns, 5, KV_STOP_COUNT, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_finished(f.core, 77, 5, KV_STOP_END_TURN, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_end(f.core, ns, 0), -EINVAL);
  cr_assert_eq(kv_core_hint_end(f.core, ns, 12345), 0, "an unknown session: nothing to do");
  cr_assert_null(owner(&f, b), "no refused hint left a trace");
  kv_core_hint_stats st;
  kv_core_hint_stats_get(f.core, &st);
  cr_assert_eq(st.hints, 0);
  cr_assert_eq(st.sessions, 0);
  teardown(&f);
}

/* A request starts at a session's first hint after its last FINISHED; the
 * gap between them is filed under that FINISHED's stop reason. */
Test(core_hint, requests_gaps_and_stop_reasons) {
  fixture f;
  setup(&f, 8);
  uint32_t ns = (uint32_t)f.ns;
  kv_block *a = store(&f, 1, 0), *b = store(&f, 2, 1);
  kv_core_set_now(f.core, 1000);
  cr_assert_eq(kv_core_hint_session(f.core, ns, 42, a, 0), 0);
  cr_assert_eq(kv_core_hint_session(f.core, ns, 42, b, 0), 0);
  const kv_session *x = owner(&f, a);
  cr_assert_not_null(x);
  cr_assert_eq(owner(&f, b), x);
  cr_assert_eq(x->nreq, 1, "two blocks of one request");
  cr_assert(x->flags & KV_SESS_ACTIVE);
  kv_core_set_now(f.core, 3000);
  cr_assert_eq(kv_core_hint_finished(f.core, ns, 42, KV_STOP_TOOL_USE, 0), 0);
  cr_assert_eq(x->stop, KV_STOP_TOOL_USE);
  cr_assert_eq(x->fin_ms, 3000);
  cr_assert_not(x->flags & KV_SESS_ACTIVE);
  kv_core_set_now(f.core, 2000); /* the clock never goes back */
  cr_assert_eq(f.core->sess.now_ms, 3000);
  kv_core_set_now(f.core, 3000 + 17000);
  cr_assert_eq(kv_core_hint_session(f.core, ns, 42, b, 0), 0);
  cr_assert_eq(x->nreq, 2);
  cr_assert_eq(x->ngaps, 1);
  const kv_sess_ns *st = kv_sessions_ns(&f.core->sess, ns);
  cr_assert_not_null(st);
  cr_assert_eq(st->hist[KV_STOP_TOOL_USE][kv_gap_bucket(17000)], 1, "the gap, after tool_use");
  cr_assert_eq(st->total[KV_STOP_END_TURN], 0);
  cr_assert_null(kv_sessions_ns(&f.core->sess, (uint32_t)f.ns2),
                 "the other namespace learns nothing");
  cr_assert_eq(x->lgap / 256, 14, "log2(17000) = 14.05");
  teardown(&f);
}

Test(core_hint, gap_buckets_are_half_octaves) {
  cr_assert_eq(kv_gap_bucket(0), 0);
  cr_assert_eq(kv_gap_bucket(1), 0);
  for (unsigned k = 1; k < KV_GAP_BUCKETS; k++) {
    uint64_t lo = kv_gap_bucket_lo(k);
    cr_assert_eq(kv_gap_bucket(lo), k, "bucket %u starts at %llu", k, (unsigned long long)lo);
    cr_assert_eq(kv_gap_bucket(lo - 1), k - 1);
    cr_assert_gt(lo, kv_gap_bucket_lo(k - 1));
  }
  cr_assert_eq(kv_gap_bucket(UINT64_MAX), KV_GAP_BUCKETS - 1);
}

/* The same session id in two namespaces is two sessions; a block is only
 * ever given to a session of its own namespace. */
Test(core_hint, sessions_are_scoped_by_namespace) {
  fixture f;
  setup(&f, 8);
  kv_block *a = store_in(&f, f.ns, 1, 0), *b = store_in(&f, f.ns2, 1, 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 7, a, 0), 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns2, 7, b, 0), 0);
  cr_assert_neq(owner(&f, a), owner(&f, b));
  cr_assert_eq(owner(&f, a)->ns, f.ns);
  cr_assert_eq(owner(&f, b)->ns, f.ns2);
  /* Ending one namespace's session 7 leaves the other's alone. */
  cr_assert_eq(kv_core_hint_end(f.core, (uint32_t)f.ns2, 7), 0);
  cr_assert(owner(&f, b)->flags & KV_SESS_ENDED);
  cr_assert_not(owner(&f, a)->flags & KV_SESS_ENDED);
  teardown(&f);
}

/* At most sessions_max sessions: the least recently hinted are forgotten,
 * and their blocks have no owner any more. */
Test(core_hint, the_table_is_bounded) {
  fixture f;
  kv_core_opts co = {.sessions_max = 4};
  setup_opts(&f, 64, &co);
  kv_block *b[10];
  for (int i = 0; i < 10; i++) {
    b[i] = store(&f, (uint64_t)i + 1, 0);
    kv_core_set_now(f.core, (uint64_t)i * 10);
    cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 100 + (uint64_t)i, b[i], 0), 0);
  }
  kv_core_hint_stats st;
  kv_core_hint_stats_get(f.core, &st);
  cr_assert_eq(st.sessions, 4);
  cr_assert_eq(st.forgotten, 6);
  cr_assert_leq(f.core->sess.cap, 4, "slots allocated past the bound");
  for (int i = 0; i < 6; i++) cr_assert_null(owner(&f, b[i]), "block %d kept a forgotten owner", i);
  for (int i = 6; i < 10; i++) cr_assert_eq(owner(&f, b[i])->id, 100 + (uint64_t)i);
  /* A hint keeps a session recent: 106 is hinted again, so 107 goes next. */
  cr_assert_eq(kv_core_hint_finished(f.core, (uint32_t)f.ns, 106, KV_STOP_END_TURN, 0), 0);
  kv_block *n = store(&f, 99, 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 200, n, 0), 0);
  cr_assert_not_null(owner(&f, b[6]));
  cr_assert_null(owner(&f, b[7]));
  teardown(&f);
}

/* Retention is capped at retain_max_s (the core's option, 3600 by default),
 * and kv_core_set_retain_max applies to sessions that asked before. */
Test(core_hint, retention_is_capped) {
  fixture f;
  setup(&f, 8);
  kv_block *a = store(&f, 1, 0);
  kv_core_set_now(f.core, 5000);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 9, a, 1000000), 0);
  const kv_session *x = owner(&f, a);
  cr_assert_eq(kv_sessions_retain_until(&f.core->sess, x), 5000 + 3600 * 1000ull);
  kv_core_set_retain_max(f.core, 60);
  cr_assert_eq(kv_sessions_retain_until(&f.core->sess, x), 5000 + 60 * 1000ull);
  kv_core_set_retain_max(f.core, 0);
  cr_assert_eq(kv_sessions_retain_until(&f.core->sess, x), 0, "no retention granted");
  kv_core_set_retain_max(f.core, 3600);
  cr_assert_eq(kv_core_hint_end(f.core, (uint32_t)f.ns, 9), 0);
  cr_assert_eq(kv_sessions_retain_until(&f.core->sess, x), 0, "an ended session keeps nothing");
  teardown(&f);

  kv_core_opts co = {.retain_max_s = 10};
  setup_opts(&f, 8, &co);
  a = store(&f, 1, 0);
  cr_assert_eq(kv_core_hint_finished(f.core, (uint32_t)f.ns, 9, KV_STOP_END_TURN, 300), 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 9, a, 0), 0);
  cr_assert_eq(kv_sessions_retain_until(&f.core->sess, owner(&f, a)), 10 * 1000ull);
  teardown(&f);
}

/* A record's id is used again by a later block: the new block starts with
 * no owner. */
Test(core_hint, a_record_id_used_again_has_no_owner) {
  fixture f;
  setup(&f, 8);
  kv_block *a = store(&f, 1, 0);
  kv_bid id = a->id;
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 9, a, 0), 0);
  cr_assert_not_null(owner(&f, a));
  cr_assert_eq(kv_core_delete(f.core, a), 0);
  kv_block *b = store(&f, 2, 0);
  cr_assert_eq(b->id, id, "the index hands the freed id out again");
  cr_assert_null(owner(&f, b));
  teardown(&f);
}

/* The latest session to name a block owns it. */
Test(core_hint, the_latest_session_owns_a_block) {
  fixture f;
  setup(&f, 8);
  kv_block *a = store(&f, 1, 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 9, a, 0), 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 10, a, 0), 0);
  cr_assert_eq(owner(&f, a)->id, 10);
  teardown(&f);
}

/* Predictions: an idle session is expected back after the median of its
 * namespace's gaps after the same stop reason, among those at least as
 * long as it has waited; one that has waited past every gap seen, or that
 * ended, is not expected back; a running request holds on for about as
 * long again as it has run. */
Test(core_hint, predictions_follow_the_gaps_seen) {
  fixture f;
  setup(&f, 64);
  uint32_t ns = (uint32_t)f.ns;
  kv_sessions *s = &f.core->sess;
  kv_block *b = store(&f, 1, 0);
  /* Session 1 teaches the namespace: gaps of 10 s after tool_use (9 of
   * them) and one of 1000 s. */
  uint64_t t = 1000;
  for (int i = 0; i < 11; i++) {
    kv_core_set_now(f.core, t);
    cr_assert_eq(kv_core_hint_session(f.core, ns, 1, b, 0), 0);
    cr_assert_eq(kv_core_hint_finished(f.core, ns, 1, KV_STOP_TOOL_USE, 0), 0);
    t += i == 9 ? 1000000 : 10000;
  }
  const kv_sess_ns *st = kv_sessions_ns(s, ns);
  cr_assert_eq(st->total[KV_STOP_TOOL_USE], 10);
  kv_block *c = store(&f, 2, 0);
  kv_core_set_now(f.core, t);
  cr_assert_eq(kv_core_hint_session(f.core, ns, 2, c, 0), 0);
  const kv_session *x = kv_sessions_owner(s, &f.core->ix, c->id);
  uint64_t until, p = kv_sessions_predict(s, x, &until);
  cr_assert_eq(p, t, "a request that has just started holds on now");
  cr_assert_eq(until, t + kv_gap_bucket_lo(1));
  kv_core_set_now(f.core, t + 4000);
  p = kv_sessions_predict(s, x, &until);
  cr_assert_eq(p, t + 2 * kv_gap_bucket_lo(kv_gap_bucket(4000)),
               "running for 4 s: about as long again");
  cr_assert_eq(kv_core_hint_finished(f.core, ns, 2, KV_STOP_TOOL_USE, 0), 0);
  uint64_t fin = t + 4000;
  p = kv_sessions_predict(s, x, &until);
  cr_assert_geq(p, fin + 8000, "the median gap after tool_use: about 10 s");
  cr_assert_leq(p, fin + 12000);
  /* Waited 20 s: only the 1000 s gap was that long. */
  kv_core_set_now(f.core, fin + 20000);
  p = kv_sessions_predict(s, x, &until);
  cr_assert_geq(p, fin + 700000, "overdue: expected with the long gap");
  cr_assert_leq(p, fin + 1300000);
  cr_assert_eq(until, fin + kv_gap_bucket_lo(kv_gap_bucket(20000) + 1));
  kv_core_set_now(f.core, fin + 3000000);
  cr_assert_eq(kv_sessions_predict(s, x, &until), KV_PREDICT_NEVER, "past every gap seen");
  /* A stop reason with no gap yet borrows every reason's gaps. */
  cr_assert_eq(kv_core_hint_session(f.core, ns, 2, c, 0), 0);
  kv_core_set_now(f.core, fin + 3000001);
  cr_assert_eq(kv_core_hint_finished(f.core, ns, 2, KV_STOP_END_TURN, 0), 0);
  p = kv_sessions_predict(s, x, &until);
  cr_assert_neq(p, KV_PREDICT_NEVER);
  cr_assert_eq(kv_core_hint_end(f.core, ns, 2), 0);
  cr_assert_eq(kv_sessions_predict(s, x, &until), KV_PREDICT_NEVER, "ended");
  cr_assert_eq(until, UINT64_MAX);
  teardown(&f);
}
