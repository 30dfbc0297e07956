/* test_defer.c - requests that wait for room (daemon/defer.h): the queue
 * alone, with waiters of its own: retry order, expiry on the deadline,
 * cancellation when the session goes, registration during a walk. LOAD
 * and ALLOC waiting in the daemon: test_get_g3.c. */
#include <criterion/criterion.h>

#include "base/log.h"
#include "daemon/defer.h"

/* --- the queue alone ------------------------------------------------------------ */

typedef struct fake {
  kvd_waiter w; /* first */
  int id;
  int tries_left; /* retries before it stops waiting */
  int gone;       /* answered: expired, cancelled, or done */
} fake;

static char order[64];
static size_t norder;
static kvd_defer *again_q; /* retry_fake registers again_w with it, once */
static kvd_waiter *again_w;

static void note(char what, int id) {
  if (norder + 2 < sizeof order) {
    order[norder++] = what;
    order[norder++] = (char)('0' + id);
    order[norder] = 0;
  }
}

static int retry_fake(kvd_waiter *w) {
  fake *f = (fake *)w;
  note('r', f->id);
  if (again_w) {
    kvd_defer_wait(again_q, again_w, 99);
    again_w = NULL;
  }
  if (--f->tries_left > 0) return 1;
  f->gone = 'd';
  return 0;
}
static uint32_t expire_fake(kvd_waiter *w) {
  fake *f = (fake *)w;
  note('e', f->id);
  f->gone = 'e';
  return 2; /* blocks */
}
static void cancel_fake(kvd_waiter *w) {
  fake *f = (fake *)w;
  note('c', f->id);
  f->gone = 'c';
}
static const kvd_defer_ops fake_ops = {"test", "answered", retry_fake, expire_fake, cancel_fake};

static kvd_session live_sess;
static kvd_sink live = {.sess = &live_sess}, dead = {.sess = NULL};

static void fake_init(fake *f, int id, kvd_sink *sink, int tries) {
  kvd_waiter_init(&f->w, sink);
  f->id = id;
  f->tries_left = tries;
  f->gone = 0;
}

static void reset(void) {
  norder = 0;
  order[0] = 0;
  again_w = NULL;
  kv_log_threshold = KV_LOG_ERROR;
}

TestSuite(defer, .init = reset);

Test(defer, retries_oldest_first_and_keeps_the_order_of_those_still_waiting) {
  kvd_defer q;
  kvd_defer_init(&q, &fake_ops);
  fake a, b, c;
  fake_init(&a, 1, &live, 2);
  fake_init(&b, 2, &live, 1);
  fake_init(&c, 3, &live, 3);
  kvd_defer_wait(&q, &a.w, 10);
  kvd_defer_wait(&q, &b.w, 20);
  kvd_defer_wait(&q, &c.w, 30);
  kvd_defer_wait(&q, &a.w, 40); /* queued already: nothing changes */
  cr_assert_eq(q.n, 3);
  cr_assert_eq(a.w.since, 10);
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1r2r3");
  cr_assert_eq(b.gone, 'd');
  cr_assert_not(kvd_waiter_queued(&b.w));
  cr_assert(kvd_waiter_queued(&a.w) && kvd_waiter_queued(&c.w));
  cr_assert_eq(q.n, 2);
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1r2r3r1r3", "the waiters kept stay in their order");
  cr_assert_eq(a.gone, 'd');
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1r2r3r1r3r3");
  cr_assert_eq(q.n, 0);
  cr_assert_null(q.head);
  kvd_defer_retry(&q); /* empty: nothing */
  cr_assert_eq(q.waits, 3);
  cr_assert_eq(q.retries, 6);
}

Test(defer, expires_on_the_deadline_from_the_first_wait) {
  kvd_defer q;
  kvd_defer_init(&q, &fake_ops);
  fake a, b;
  fake_init(&a, 1, &live, 100);
  fake_init(&b, 2, &live, 100);
  kvd_defer_wait(&q, &a.w, 1000);
  kvd_defer_wait(&q, &b.w, 1500);
  kvd_defer_retry(&q); /* both still wait: a's first wait stays 1000 */
  cr_assert_eq(a.w.since, 1000);
  cr_assert_eq(kvd_defer_expire(&q, 1999, 1000), 0, "before the deadline");
  cr_assert_eq(kvd_defer_expire(&q, 2000, 1000), 2, "a's deadline: its blocks");
  cr_assert_eq(a.gone, 'e');
  cr_assert_eq(b.gone, 0);
  cr_assert_eq(q.n, 1);
  cr_assert_eq(kvd_defer_expire(&q, 2500, 1000), 2);
  cr_assert_eq(b.gone, 'e');
  cr_assert_eq(q.n, 0);
  cr_assert_eq(q.expired, 2);
}

Test(defer, a_waiter_whose_session_went_is_cancelled_not_retried_or_expired) {
  kvd_defer q;
  kvd_defer_init(&q, &fake_ops);
  fake a, b, c;
  fake_init(&a, 1, &live, 100);
  fake_init(&b, 2, &dead, 100);
  fake_init(&c, 3, &dead, 100);
  kvd_defer_wait(&q, &a.w, 0);
  kvd_defer_wait(&q, &b.w, 0);
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1c2");
  cr_assert_eq(b.gone, 'c');
  kvd_defer_wait(&q, &c.w, 0);
  cr_assert_eq(kvd_defer_expire(&q, 10000, 1), 2, "a expires; c is cancelled, no blocks");
  cr_assert_str_eq(order, "r1c2e1c3");
  cr_assert_eq(q.cancelled, 2);
  cr_assert_eq(q.n, 0);
}

Test(defer, cancel_all_at_shutdown) {
  kvd_defer q;
  kvd_defer_init(&q, &fake_ops);
  fake a, b;
  fake_init(&a, 1, &live, 100);
  fake_init(&b, 2, &live, 100);
  kvd_defer_wait(&q, &a.w, 0);
  kvd_defer_wait(&q, &b.w, 0);
  kvd_defer_cancel_all(&q);
  cr_assert_str_eq(order, "c1c2");
  cr_assert_eq(q.n, 0);
  cr_assert_null(q.head);
  kvd_defer_wait(&q, &a.w, 5); /* the queue is usable again */
  cr_assert_eq(q.n, 1);
}

Test(defer, a_waiter_registered_during_a_walk_waits_for_the_next_one) {
  kvd_defer q;
  kvd_defer_init(&q, &fake_ops);
  fake a, b, late;
  fake_init(&a, 1, &live, 100);
  fake_init(&b, 2, &live, 100);
  fake_init(&late, 3, &live, 1);
  kvd_defer_wait(&q, &a.w, 0);
  kvd_defer_wait(&q, &b.w, 0);
  again_q = &q;
  again_w = &late.w;
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1r2", "not retried in the walk it came in");
  cr_assert_eq(q.n, 3);
  cr_assert_eq(late.w.since, 99);
  kvd_defer_retry(&q);
  cr_assert_str_eq(order, "r1r2r1r2r3", "after those that were waiting before it");
  cr_assert_eq(late.gone, 'd');
}
