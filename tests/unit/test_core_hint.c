/* test_core_hint.c - engine hints in the core: the checks, the session
 * table (bounded, shared fairly by tenant, scoped by namespace, retention
 * capped, owners by block id that die with their record or their session
 * and never resolve to another namespace's session), and the gap
 * statistics it keeps; a freed namespace's sessions and statistics go
 * with it. Includes core_int.h: the tests read the table. */
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

/* At most sessions_max sessions: one namespace alone may use them all,
 * its least recently hinted are forgotten, and their blocks have no owner
 * any more. */
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

/* A block stored after a block of a session is that session's until a
 * hint says otherwise: engines hint a request's blocks after storing them
 * all, and the stores in between evict as if the session had them
 * (tiers/EVICTION.md, "Through the daemon"). A parent without a session,
 * or whose session was forgotten, gives none. */
Test(core_hint, a_block_stored_after_a_sessions_block_is_that_sessions) {
  fixture f;
  setup(&f, 8);
  kv_block *a = store(&f, 1, 0);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 9, a, 0), 0);
  kv_block *b = store(&f, 2, 1), *c = store(&f, 3, 2);
  cr_assert_not_null(owner(&f, b), "the parent's session");
  cr_assert_eq(owner(&f, b)->id, 9);
  cr_assert_eq(owner(&f, c)->id, 9, "down the chain");
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 10, c, 0), 0);
  cr_assert_eq(owner(&f, c)->id, 10, "a hint still decides");
  cr_assert_eq(owner(&f, b)->id, 9);
  kv_block *d = store(&f, 4, 0), *e = store(&f, 5, 4);
  cr_assert_null(owner(&f, d));
  cr_assert_null(owner(&f, e), "no session above: none");
  cr_assert_eq(kv_core_hint_end(f.core, (uint32_t)f.ns, 9), 0);
  teardown(&f);
}

/* A hint may name a block allocated and not yet committed (an engine names
 * the blocks of its request as it allocates them): the block has its
 * session when it comes in, and keeps it. The daemon finds such blocks for
 * a hint (kv_core_find_hintable), not for a lookup. */
Test(core_hint, a_block_being_written_takes_its_session_in) {
  fixture f;
  setup(&f, 8);
  kv_key k = K(7);
  kv_block *b;
  cr_assert_eq(kv_core_alloc(f.core, (uint32_t)f.ns, &k, NULL, KV_PRIO_DEFAULT, &b), 0);
  cr_assert_null(kv_core_find(f.core, (uint32_t)f.ns, &k), "not visible yet");
  cr_assert_eq(kv_core_find_hintable(f.core, (uint32_t)f.ns, &k), b);
  cr_assert_eq(kv_core_hint_session(f.core, (uint32_t)f.ns, 11, b, 0), 0);
  cr_assert_eq(kv_core_commit(f.core, b, 0), 0);
  cr_assert_eq(owner(&f, b)->id, 11);
  kv_key none = K(8);
  cr_assert_null(kv_core_find_hintable(f.core, (uint32_t)f.ns, &none));
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

/* ---- shares: one tenant's hints never make the table forget another's ---- */

static int resident(fixture *f, int ns, uint64_t v) {
  kv_key k = K(v);
  return kv_core_find(f->core, (uint32_t)ns, &k) != NULL;
}

/* Issue 34: namespace A keeps four blocks of a session that asked for
 * retention and five of one that did not; namespace B sends 70,000
 * FINISHED hints of new sessions without keys, more than the table holds
 * (65,536). A's sessions are still known after, and its retention still
 * holds: evicting four of A's blocks takes the session without retention,
 * not the four retained blocks (older, which lru would take). Before, the
 * one table-wide recency list forgot A's sessions, and the four retained
 * blocks went. */
Test(core_hint, a_flood_of_another_namespaces_sessions_forgets_none_of_its_own) {
  fixture f;
  setup(&f, 16);
  uint32_t a = (uint32_t)f.ns, b = (uint32_t)f.ns2;
  kv_block *kept[4], *other[5];
  kv_core_set_now(f.core, 1000);
  for (int i = 0; i < 4; i++) {
    kept[i] = store_in(&f, f.ns, 100 + (uint64_t)i, 0);
    cr_assert_eq(kv_core_hint_session(f.core, a, 1, kept[i], 3600), 0);
  }
  cr_assert_eq(kv_core_hint_finished(f.core, a, 1, KV_STOP_END_TURN, 3600), 0);
  kv_core_set_now(f.core, 2000);
  for (int i = 0; i < 5; i++) {
    other[i] = store_in(&f, f.ns, 200 + (uint64_t)i, 0);
    cr_assert_eq(kv_core_hint_session(f.core, a, 2, other[i], 0), 0);
  }
  cr_assert_eq(kv_core_hint_finished(f.core, a, 2, KV_STOP_END_TURN, 0), 0);
  /* The flood: 70,000 hints in a second. */
  for (uint64_t i = 0; i < 70000; i++) {
    kv_core_set_now(f.core, 3000 + i / 70);
    cr_assert_eq(kv_core_hint_finished(f.core, b, 1000000 + i, KV_STOP_END_TURN, 0), 0);
  }
  kv_core_hint_stats st;
  kv_core_hint_stats_get(f.core, &st);
  cr_assert_eq(st.sessions, KV_SESSIONS_MAX_DEFAULT, "the table is full");
  cr_assert_eq(st.forgotten, 70000 + 2 - KV_SESSIONS_MAX_DEFAULT, "B forgot its own");
  cr_assert_not_null(kv_sessions_find(&f.core->sess, a, 1), "A's retained session forgotten");
  cr_assert_not_null(kv_sessions_find(&f.core->sess, a, 2), "A's other session forgotten");
  for (int i = 0; i < 4; i++) cr_assert_not_null(owner(&f, kept[i]), "kept[%d] lost its owner", i);
  for (int i = 0; i < 5; i++) cr_assert_not_null(owner(&f, other[i]));
  /* Pressure on A: four blocks go, none of them retained. */
  kv_core_set_now(f.core, 5000);
  for (int i = 0; i < 4; i++) cr_assert_eq(kv_core_evict_g2(f.core, a), 0);
  for (int i = 0; i < 4; i++)
    cr_assert(resident(&f, f.ns, 100 + (uint64_t)i), "retained block %d evicted", i);
  int left = 0;
  for (int i = 0; i < 5; i++) left += resident(&f, f.ns, 200 + (uint64_t)i);
  cr_assert_eq(left, 1, "the session without retention gave up the four");
  teardown(&f);
}

/* Shares are tenants: tenant 0's namespace A holds 4 sessions of a table
 * of 8; tenant 1 floods from two namespaces at once and forgets only its
 * own (two namespaces do not make it two shares). Then the shares even
 * out: a tenant holding most of the table gives sessions, its least
 * recently hinted first, to one arriving, down to an even part. */
Test(core_hint, shares_are_tenants_and_even_out) {
  fixture f;
  kv_core_opts co = {.sessions_max = 8};
  setup_opts(&f, 16, &co);
  int b2 = kv_core_ns_register(f.core, &f.arena, SLOT);
  cr_assert_geq(b2, 0);
  uint32_t a = (uint32_t)f.ns, b = (uint32_t)f.ns2;
  cr_assert_eq(kv_core_ns_owner(f.core, a, 0), 0);
  cr_assert_eq(kv_core_ns_owner(f.core, b, 1), 0);
  cr_assert_eq(kv_core_ns_owner(f.core, (uint32_t)b2, 1), 0);
  for (uint64_t s = 1; s <= 4; s++)
    cr_assert_eq(kv_core_hint_finished(f.core, a, s, KV_STOP_TOOL_USE, 0), 0);
  for (uint64_t i = 0; i < 5000; i++)
    cr_assert_eq(kv_core_hint_finished(f.core, i % 2 ? b : (uint32_t)b2, 100 + i,
                                       KV_STOP_TOOL_USE, 0),
                 0);
  for (uint64_t s = 1; s <= 4; s++)
    cr_assert_not_null(kv_sessions_find(&f.core->sess, a, s), "A forgot session %llu",
                       (unsigned long long)s);
  cr_assert_not_null(kv_sessions_find(&f.core->sess, b, 100 + 4999), "B keeps its latest");
  teardown(&f);

  /* Evening out, namespaces without owners: A alone fills 7 of 8. */
  setup_opts(&f, 16, &co);
  a = (uint32_t)f.ns, b = (uint32_t)f.ns2;
  for (uint64_t s = 1; s <= 7; s++)
    cr_assert_eq(kv_core_hint_finished(f.core, a, s, KV_STOP_TOOL_USE, 0), 0);
  for (uint64_t s = 1; s <= 10; s++)
    cr_assert_eq(kv_core_hint_finished(f.core, b, s, KV_STOP_TOOL_USE, 0), 0);
  int ka = 0, kb = 0;
  for (uint64_t s = 1; s <= 10; s++) {
    ka += kv_sessions_find(&f.core->sess, a, s) != NULL;
    kb += kv_sessions_find(&f.core->sess, b, s) != NULL;
  }
  cr_assert_eq(ka, 4, "A kept %d", ka);
  cr_assert_eq(kb, 4, "B holds %d", kb);
  for (uint64_t s = 4; s <= 7; s++)
    cr_assert_not_null(kv_sessions_find(&f.core->sess, a, s), "A's most recent kept");
  /* A hint keeps a session recent within its share: A's 4 is hinted
   * again, A's next new session forgets 5. */
  cr_assert_eq(kv_core_hint_finished(f.core, a, 4, KV_STOP_TOOL_USE, 0), 0);
  cr_assert_eq(kv_core_hint_finished(f.core, a, 99, KV_STOP_TOOL_USE, 0), 0);
  cr_assert_not_null(kv_sessions_find(&f.core->sess, a, 4));
  cr_assert_null(kv_sessions_find(&f.core->sess, a, 5));
  for (uint64_t s = 7; s <= 10; s++) cr_assert_not_null(kv_sessions_find(&f.core->sess, b, s));
  teardown(&f);
}

/* Issue 34: a slot's generation has 10 bits. With a table of one session,
 * namespace B's sessions take A's slot over and over; after 1024 of them
 * the generation of A's block's reference comes round again. The block is
 * never credited to B's session, and an eviction in B, whose ranking
 * would then list A's block under B's session, takes B's block. */
Test(core_hint, a_wrapped_generation_never_credits_another_namespace) {
  fixture f;
  kv_core_opts co = {.sessions_max = 1};
  setup_opts(&f, 8, &co);
  uint32_t a = (uint32_t)f.ns, b = (uint32_t)f.ns2;
  kv_core_set_now(f.core, 1000);
  kv_block *bb = store_in(&f, f.ns2, 50, 0); /* B's, the oldest */
  kv_block *x = store_in(&f, f.ns, 1, 0);
  cr_assert_eq(kv_core_hint_session(f.core, a, 7, x, 0), 0);
  cr_assert_eq(owner(&f, x)->ns, a);
  uint64_t sid = 0;
  for (uint64_t i = 0; i < 2 * 1024; i++) {
    sid = 1000 + i;
    cr_assert_eq(kv_core_hint_finished(f.core, b, sid, KV_STOP_TOOL_USE, 0), 0);
    const kv_session *o = owner(&f, x);
    cr_assert(!o || o->ns == a, "after %llu sessions of B, A's block is B's session's",
              (unsigned long long)i + 1);
    if (i + 1 == 1024) break; /* the generation has come round */
  }
  kv_core_set_now(f.core, 2000);
  store_in(&f, f.ns, 2, 0);             /* the newest, which the ranking spares */
  kv_core_touch(f.core, x);             /* A's block ranked again */
  cr_assert_eq(kv_core_hint_session(f.core, b, sid, bb, 0), 0);
  cr_assert_eq(owner(&f, bb)->ns, b);
  cr_assert_eq(kv_core_evict_g2(f.core, b), 0);
  cr_assert(resident(&f, f.ns, 1), "B's eviction took A's block");
  cr_assert_not(resident(&f, f.ns2, 50));
  teardown(&f);
}

/* The table's bookkeeping under random hints from five namespaces (two
 * of one tenant, one of another, two without): each share's list holds
 * its count of sessions, the counts add up to the sessions known, the
 * lists by count and the largest count agree, and a new session made a
 * share other than its own forget one only when that share held the most
 * and at least two more. */
static void check_table(const kv_sessions *s) {
  uint32_t total = 0, maxc = 0;
  for (uint32_t u = 0; u < s->nsh; u++) {
    uint32_t n = 0;
    for (uint32_t i = s->sh[u].lru; i; i = s->v[i - 1].lnext, n++) {
      cr_assert_eq(s->v[i - 1].share, u);
      cr_assert_neq(s->v[i - 1].id, 0);
      cr_assert_leq(n, s->max, "a loop in share %u's list", u);
    }
    cr_assert_eq(n, s->sh[u].count, "share %u: %u listed, %u counted", u, n, s->sh[u].count);
    total += n;
    if (n > maxc) maxc = n;
    if (n) { /* in the list of its count */
      uint32_t j = s->bycount[n];
      while (j && j != u + 1) j = s->sh[j - 1].cnext;
      cr_assert_eq(j, u + 1, "share %u is not in the list of %u", u, n);
    }
  }
  cr_assert_eq(total, s->live);
  cr_assert_eq(maxc, s->maxc);
  for (uint32_t k = 1; k <= s->cap; k++)
    for (uint32_t j = s->bycount[k]; j; j = s->sh[j - 1].cnext)
      cr_assert_eq(s->sh[j - 1].count, k);
  /* every session is found by its (namespace, id); the other slots are
   * free, each in the free list once */
  uint32_t nfree = 0;
  for (uint32_t i = s->free1; i; i = s->v[i - 1].lnext, nfree++) {
    cr_assert_eq(s->v[i - 1].id, 0, "slot %u is free and used", i - 1);
    cr_assert_leq(nfree, s->n, "a loop in the free list");
  }
  uint32_t used = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    if (!s->v[i].id) continue;
    used++;
    cr_assert_eq(kv_sessions_find(s, s->v[i].ns, s->v[i].id), &s->v[i]);
  }
  cr_assert_eq(used, s->live);
  cr_assert_eq(used + nfree, s->n, "%u slots, %u used, %u free", s->n, used, nfree);
}

Test(core_hint, shares_keep_their_books) {
  fixture f;
  kv_core_opts co = {.sessions_max = 16};
  setup_opts(&f, 32, &co);
  int ns[5] = {f.ns, f.ns2, kv_core_ns_register(f.core, &f.arena, SLOT),
               kv_core_ns_register(f.core, &f.arena, SLOT),
               kv_core_ns_register(f.core, &f.arena, SLOT)};
  cr_assert_eq(kv_core_ns_owner(f.core, (uint32_t)ns[0], 3), 0);
  cr_assert_eq(kv_core_ns_owner(f.core, (uint32_t)ns[1], 3), 0);
  cr_assert_eq(kv_core_ns_owner(f.core, (uint32_t)ns[2], 5), 0);
  kv_block *blk[5];
  for (int i = 0; i < 5; i++) blk[i] = store_in(&f, ns[i], 1 + (uint64_t)i, 0);
  kv_sessions *s = &f.core->sess;
  srand(34);
  for (int step = 0; step < 20000; step++) {
    int k = rand() % 5;
    /* namespace 4 floods from step 5000 on, with new sessions */
    if (step > 5000 && rand() % 2) k = 4;
    uint32_t n = (uint32_t)ns[k];
    uint64_t sid = k == 4 && step > 5000 ? 100000 + (uint64_t)step : 1 + (uint64_t)(rand() % 12);
    uint32_t before[64] = {0}, nsh = s->nsh < 64 ? s->nsh : 64;
    for (uint32_t u = 0; u < nsh; u++) before[u] = s->sh[u].count;
    uint64_t forgot = s->forgotten;
    int op = rand() % 4;
    if (op == 0) cr_assert_eq(kv_core_hint_session(f.core, n, sid, blk[k], 0), 0);
    else if (op == 3) cr_assert_eq(kv_core_hint_end(f.core, n, sid), 0);
    else cr_assert_eq(kv_core_hint_finished(f.core, n, sid, KV_STOP_TOOL_USE, 0), 0);
    check_table(s);
    if (s->forgotten == forgot) continue;
    const kv_session *x = kv_sessions_find(s, n, sid);
    cr_assert_not_null(x);
    uint32_t me = x->share, maxb = 0;
    for (uint32_t u = 0; u < nsh; u++) maxb = before[u] > maxb ? before[u] : maxb;
    for (uint32_t u = 0; u < nsh; u++) {
      if (u == me || s->sh[u].count >= before[u]) continue;
      cr_assert_eq(before[u], maxb, "share %u lost a session without holding the most", u);
      cr_assert_geq(before[u], before[me] + 2, "share %u lost one to share %u holding %u", u, me,
                    before[me]);
    }
  }
  /* Namespace 4's flood left each of the other three shares about an even
   * part: 16 / 4 sessions, less one. */
  for (int k = 1; k < 4; k++) {
    uint32_t u = k == 1 ? 3 : k == 2 ? 5 : KV_CORE_OWNERS_MAX + (uint32_t)ns[k];
    cr_log_info("share %u: %u sessions", u, s->sh[u].count);
    cr_assert_geq(s->sh[u].count, 16 / 4 - 1, "share %u holds %u", u, s->sh[u].count);
  }
  teardown(&f);
}

/* A namespace's id is used again once it is freed, perhaps by another
 * tenant's namespace. The new namespace finds none of the old one's
 * sessions: a hint of the same session id starts a session of its own,
 * without the old one's retention, and its gap statistics start empty.
 * The slots the old sessions leave are taken before the table forgets
 * anyone's. */
Test(core_hint, a_freed_namespace_id_inherits_no_session) {
  fixture f;
  kv_core_opts co = {.sessions_max = 4};
  setup_opts(&f, 16, &co);
  kv_sessions *s = &f.core->sess;
  uint32_t a = (uint32_t)f.ns, o = (uint32_t)f.ns2;
  cr_assert_eq(kv_core_ns_owner(f.core, a, 3), 0);
  kv_block *x = store_in(&f, f.ns, 1, 0), *y = store_in(&f, f.ns, 2, 0);
  kv_block *z = store_in(&f, f.ns2, 3, 0);
  /* A: session 7 retains 600 s and teaches A gaps of 10 s; session 8 too */
  kv_core_set_now(f.core, 1000);
  cr_assert_eq(kv_core_hint_session(f.core, a, 7, x, 600), 0);
  cr_assert_eq(kv_core_hint_session(f.core, a, 8, y, 600), 0);
  for (int r = 0; r < 3; r++) {
    kv_core_set_now(f.core, s->now_ms + 1000);
    cr_assert_eq(kv_core_hint_finished(f.core, a, 7, KV_STOP_TOOL_USE, 0), 0);
    kv_core_set_now(f.core, s->now_ms + 10000);
    cr_assert_eq(kv_core_hint_session(f.core, a, 7, x, 0), 0);
  }
  cr_assert_eq(kv_sessions_find(s, a, 7)->nreq, 4);
  cr_assert_eq(kv_sessions_ns(s, a)->total[KV_STOP_TOOL_USE], 3);
  /* another namespace's two sessions fill the table */
  cr_assert_eq(kv_core_hint_session(f.core, o, 20, z, 0), 0);
  cr_assert_eq(kv_core_hint_finished(f.core, o, 21, KV_STOP_END_TURN, 0), 0);
  cr_assert_eq(s->live, 4);
  check_table(s);

  /* A goes: its blocks, then its id */
  cr_assert_eq(kv_core_delete(f.core, x), 0);
  cr_assert_eq(kv_core_delete(f.core, y), 0);
  cr_assert_eq(kv_core_ns_free(f.core, a), 0);
  kv_core_hint_stats st;
  kv_core_hint_stats_get(f.core, &st);
  cr_assert_eq(st.sessions, 2, "A's sessions are still known");
  check_table(s);

  /* B, another tenant's, gets A's id */
  int nb = kv_core_ns_register(f.core, &f.arena, SLOT);
  cr_assert_eq(nb, f.ns, "the core hands A's id out again");
  uint32_t b = (uint32_t)nb;
  cr_assert_eq(kv_core_ns_owner(f.core, b, 5), 0);
  cr_assert_null(kv_sessions_find(s, b, 7), "B finds A's session 7");
  cr_assert_null(kv_sessions_find(s, b, 8), "B finds A's session 8");
  cr_assert_null(kv_sessions_ns(s, b), "B starts with A's gap statistics");

  kv_core_set_now(f.core, s->now_ms + 5000);
  kv_block *w = store_in(&f, nb, 4, 0);
  cr_assert_eq(kv_core_hint_session(f.core, b, 7, w, 0), 0);
  const kv_session *n7 = owner(&f, w);
  cr_assert_not_null(n7);
  cr_assert_eq(n7->ns, b);
  cr_assert_eq(n7->share, 5, "counts against B's tenant");
  cr_assert_eq(n7->nreq, 1, "a new session, not A's 7 continued");
  cr_assert_eq(n7->ngaps, 0);
  cr_assert_eq(n7->fin_ms, 0);
  cr_assert_eq(n7->retain_s, 0, "A's retention inherited");
  cr_assert_eq(kv_sessions_retain_until(s, n7), 0);
  const kv_sess_ns *gs = kv_sessions_ns(s, b);
  cr_assert_not_null(gs);
  for (unsigned r = 0; r <= KV_STOP_COUNT; r++)
    cr_assert_eq(gs->total[r], 0, "B's gap statistics hold A's gaps (row %u)", r);
  /* idle 1 s after a tool_use: with no gap seen in B, predicted as a
   * running request from its end, not from A's 10 s gaps */
  uint64_t t = s->now_ms, until;
  cr_assert_eq(kv_core_hint_finished(f.core, b, 7, KV_STOP_TOOL_USE, 0), 0);
  kv_core_set_now(f.core, t + 1000);
  cr_assert_eq(kv_sessions_predict(s, n7, &until), t + 2 * kv_gap_bucket_lo(kv_gap_bucket(1000)),
               "B's prediction made from A's gaps");
  /* B's second session takes the other free slot: nobody is forgotten */
  cr_assert_eq(kv_core_hint_finished(f.core, b, 8, KV_STOP_END_TURN, 0), 0);
  cr_assert_eq(kv_sessions_find(s, b, 8)->retain_s, 0);
  kv_core_hint_stats_get(f.core, &st);
  cr_assert_eq(st.sessions, 4);
  cr_assert_eq(st.forgotten, 0, "a session was forgotten while slots were free");
  cr_assert_not_null(kv_sessions_find(s, o, 20));
  cr_assert_not_null(kv_sessions_find(s, o, 21));
  cr_assert_eq(owner(&f, z)->id, 20);
  check_table(s);
  teardown(&f);
}
