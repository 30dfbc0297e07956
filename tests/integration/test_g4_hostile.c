/* test_g4_hostile.c - the G4 Redis Cluster client against a hostile node
 * (tests/lib/fake_redis.h): CLUSTER SLOTS replies of 90,000 ranges, with a
 * range outside 0..16383, with overlapping ranges (each refused whole: no
 * map, no node added, and a 10 ms timer on the loop never waits 1 s);
 * replies over the limits, refused while hiredis reads them (the
 * connection dropped, its commands failed as conn "... over the limits"):
 * CLUSTER SLOTS of 5,000,000 elements, flat and nested (the loop never
 * waits 500 ms, the process grows by less than 100 MB, the next good map
 * is taken), a GET answered by a string announcing 4 GiB then trickled
 * (refused once its length is in: less than 1 MiB sent), an error line of
 * 1 MiB, a reply to no command;
 * kv_g4c_get_state called 100,000 times on a 16384-range map over 1000
 * masters, and a map naming more nodes than the table holds; 20,000 GETs
 * MOVED to 20,000 new addresses (the node table stays under its cap, a
 * MOVED it has no room for fails with its reason, the nodes go after the
 * next map read, the heap does not grow); host names in CLUSTER SLOTS and
 * in MOVED behind a resolver that takes 3 s ("*.invalid", interposed
 * below): looked up off the loop, the command fails by its own timeout;
 * "localhost" as seed and in the map behind a resolver taking 1.5 s, end
 * to end.
 *
 * What used to go wrong: the map was built with a quadratic loop and no
 * cap, kv_g4c_get_state was quadratic on every call (200,000 ranges: the
 * loop stopped for minutes); every MOVED to a new address added a node
 * for good, found by a linear search; hiredis resolved host names with a
 * blocking getaddrinfo on the loop; hiredis built a reply of any size on
 * the loop (5,000,000 elements: 300 MB and seconds to build and free; a
 * string was buffered whole, 4 GiB announced meant 4 GiB held), and a
 * reply to no command tripped an assert in hiredis (the process aborted). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/clock.h"
#include "tests/lib/fake_redis.h"
#include "tiers/g4_cluster.h"

#define TIMEOUT_MS 500

/* ---- a slow resolver --------------------------------------------------------
 * This program's getaddrinfo (hiredis and libuv call it, not libc's):
 * names under .invalid take 3 s and do not exist, "localhost" takes 1.5 s,
 * the rest (addresses) go to libc at once. */

static atomic_int slow_lookups, localhost_lookups;
static int (*real_getaddrinfo)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void find_real(void) { *(void **)&real_getaddrinfo = dlsym(RTLD_NEXT, "getaddrinfo"); }

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
  pthread_once(&real_once, find_real);
  size_t len = node ? strlen(node) : 0;
  if (len >= 8 && !strcmp(node + len - 8, ".invalid")) {
    atomic_fetch_add(&slow_lookups, 1);
    sleep_ms(3000);
    return EAI_NONAME;
  }
  if (node && !strcmp(node, "localhost")) {
    atomic_fetch_add(&localhost_lookups, 1);
    sleep_ms(1500);
  }
  return real_getaddrinfo(node, service, hints, res);
}

/* ---- the loop, the fake node, a stall detector ------------------------------- */

static uv_loop_t loop;
static kvt_fake *fake;
static uv_timer_t tick;
static int64_t last_tick, max_gap;
static long rss_peak; /* KiB: the most seen by the timer since gap_start */

/* The process's resident memory, in KiB. */
static long rss_kb(void) {
  long size = 0, res = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  cr_assert(f);
  cr_assert_eq(fscanf(f, "%ld %ld", &size, &res), 2);
  fclose(f);
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static void on_tick(uv_timer_t *t) {
  int64_t now = kv_now_ms();
  if (now - last_tick > max_gap) max_gap = now - last_tick;
  last_tick = now;
  long rss = rss_kb();
  if (rss > rss_peak) rss_peak = rss;
}

/* From now on, the longest wait of a 10 ms timer (and the most memory) is
 * measured ... */
static void gap_start(void) {
  max_gap = 0;
  rss_peak = rss_kb();
  last_tick = kv_now_ms();
  uv_timer_start(&tick, on_tick, 10, 10);
}

/* ... until now: that wait, in ms. */
static int64_t gap_stop(void) {
  on_tick(&tick);
  uv_timer_stop(&tick);
  return max_gap;
}

static void setup(void) {
  uv_loop_init(&loop);
  uv_timer_init(&loop, &tick);
  cr_assert_eq(kvt_fake_start(&fake), 0);
}

static void teardown(void) {
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  kvt_fake_stop(fake);
}

/* ---- the client, driven synchronously (as in test_g4_cluster.c) -------------- */

static int submitting;

typedef struct res {
  int done;
  kv_g4c_kind kind;
  kv_g4c_reason reason;
  char msg[128];
  int64_t at;
} res;

static void on_res(kv_g4c *c, const kv_g4c_reply *r, void *arg) {
  res *x = arg;
  cr_assert(!submitting, "a callback from inside kv_g4c_command");
  cr_assert(!x->done, "a second callback for one command");
  x->done = 1;
  x->kind = r->kind;
  x->reason = r->reason;
  x->at = kv_now_ms();
  snprintf(x->msg, sizeof x->msg, "%.*s", r->str ? (int)r->len : 0, r->str ? r->str : "");
}

/* Runs the loop until *flag is set or ms pass; whether it was set. */
static int run_until(const int *flag, int ms) {
  int64_t end = kv_now_ms() + ms;
  while (!*flag && kv_now_ms() < end) uv_run(&loop, UV_RUN_ONCE);
  return *flag;
}

static void submit(kv_g4c *c, const char *key, int argc, const char *const *argv, res *x) {
  memset(x, 0, sizeof *x);
  submitting = 1;
  int r = kv_g4c_command(c, key, strlen(key), 0, argc, argv, NULL, on_res, x);
  submitting = 0;
  cr_assert_eq(r, 0);
}

static kv_g4c_stats stats(kv_g4c *c) {
  kv_g4c_stats st;
  kv_g4c_get_stats(c, &st);
  return st;
}

/* Runs the loop until cond(c) or ms pass; whether it held. */
static int run_while_not(kv_g4c *c, int (*cond)(kv_g4c *), int ms) {
  int64_t end = kv_now_ms() + ms;
  while (!cond(c) && kv_now_ms() < end) uv_run(&loop, UV_RUN_ONCE);
  return cond(c);
}

static int has_map(kv_g4c *c) { return stats(c).refreshes > 0; }
static int refused_twice(kv_g4c *c) { return stats(c).refresh_fails >= 2; }
static int one_node(kv_g4c *c) { return stats(c).nodes == 1; }

static char seed[64];

static kv_g4c *open_client(const char *host, int timeout_ms, int refresh_ms) {
  snprintf(seed, sizeof seed, "%s:%d", host, kvt_fake_port(fake));
  const char *seeds[] = {seed};
  kv_g4c_opts o = {.seeds = seeds,
                   .nseeds = 1,
                   .timeout_ms = timeout_ms,
                   .backoff_min_ms = 50,
                   .backoff_max_ms = 400,
                   .refresh_ms = refresh_ms};
  kv_g4c *c;
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
  return c;
}

static int closed;
static void on_closed(kv_g4c *c, void *arg) { closed++; }

/* Closes c; a host name lookup still running is waited for (up to 3 s). */
static void close_client(kv_g4c *c) {
  closed = 0;
  kv_g4c_close(c, on_closed, NULL);
  cr_assert(run_until(&closed, 5000), "close callback");
  cr_assert_eq(uv_run(&loop, UV_RUN_NOWAIT), 0, "a handle is left on the loop");
}

/* ---- CLUSTER SLOTS ------------------------------------------------------------ */

/* 90,000 ranges of 7 objects: as many as the reply limits let through
 * (KV_G4C_REPLY_ELEMENTS_MAX), 5.5 MB; refused by the map's own check. */
Test(g4_hostile, slot_map_of_90000_ranges_refused_without_stalling, .init = setup, .fini = teardown,
     .timeout = 120) {
  _Static_assert(1 + 90000 * 7 <= KV_G4C_REPLY_ELEMENTS_MAX, "within the reply limits");
  kvt_fake_set(fake, &(kvt_fake_script){.ranges = 90000, .nodes = 90000});
  kv_g4c *c = open_client("127.0.0.1", 10000, 0);
  gap_start();
  cr_assert(run_while_not(c, refused_twice, 20000), "two map reads refused within 20 s");
  int64_t gap = gap_stop();
  kv_g4c_stats st = stats(c);
  cr_assert_eq(st.refreshes, 0, "a map of 90,000 ranges was taken");
  cr_assert_eq(st.replies_refused, 0, "refused by the map's check, not by the reply limits");
  cr_assert_eq(st.conn_fails, 0, "refused, not timed out");
  cr_assert_eq(st.nodes, 1, "%u nodes: a refused map adds none", st.nodes);
  cr_assert_eq(st.slots, 0);
  cr_assert_eq(st.state, KV_G4C_DOWN);
  cr_assert_geq(kvt_fake_count(fake, "CLUSTER"), 2);
  cr_assert_lt(gap, 1000, "the loop stalled for %lld ms", (long long)gap);
  cr_log_info("90,000 ranges, twice: the loop waited at most %lld ms", (long long)gap);

  /* a sane map after that is taken */
  kvt_fake_set(fake, &(kvt_fake_script){0});
  cr_assert(run_while_not(c, has_map, 3000));
  cr_assert_eq(stats(c).slots, KV_G4C_SLOTS);
  close_client(c);
}

Test(g4_hostile, slot_ranges_outside_or_overlapping_refused, .init = setup, .fini = teardown,
     .timeout = 120) {
  for (int bad = 1; bad <= 2; bad++) {
    kvt_fake_set(fake, &(kvt_fake_script){.bad_range = bad});
    kv_g4c *c = open_client("127.0.0.1", TIMEOUT_MS, 0);
    cr_assert(run_while_not(c, refused_twice, 3000), "bad %d: not refused", bad);
    kv_g4c_stats st = stats(c);
    cr_assert_eq(st.refreshes, 0, "%s", bad == 1 ? "a range 0..16384 was taken" : "overlapping ranges were taken");
    cr_assert_eq(st.slots, 0);
    cr_assert_eq(st.state, KV_G4C_DOWN);
    close_client(c);
  }
}

static int full_map(kv_g4c *c) { return stats(c).slots == KV_G4C_SLOTS; }
static int table_full(kv_g4c *c) { return stats(c).nodes == KV_G4C_NODES_MAX; }

Test(g4_hostile, state_is_cheap_and_a_map_of_too_many_nodes_is_cut, .init = setup, .fini = teardown,
     .timeout = 120) {
  /* 16384 one-slot ranges over 1000 masters (never connected to) */
  kvt_fake_set(fake, &(kvt_fake_script){.ranges = KV_G4C_SLOTS, .nodes = 1000});
  kv_g4c *c = open_client("127.0.0.1", TIMEOUT_MS, 200);
  cr_assert(run_while_not(c, full_map, 5000));
  kv_g4c_stats st = stats(c);
  cr_assert_eq(st.masters, 1000);
  cr_assert_eq(st.nodes, 1001);
  cr_assert_eq(st.state, KV_G4C_OK);
  int64_t t0 = kv_now_ms();
  unsigned ok = 0;
  for (int i = 0; i < 100000; i++) ok += kv_g4c_get_state(c) == KV_G4C_OK;
  for (int i = 0; i < 100000; i++) kv_g4c_get_stats(c, &st);
  int64_t ms = kv_now_ms() - t0;
  cr_assert_eq(ok, 100000);
  cr_assert_lt(ms, 2000, "100,000 kv_g4c_get_state and get_stats: %lld ms", (long long)ms);
  cr_log_info("100,000 kv_g4c_get_state + kv_g4c_get_stats, 16384 ranges: %lld ms", (long long)ms);

  /* 16384 masters: the table holds KV_G4C_NODES_MAX nodes, the rest of the
   * map is left out */
  kvt_fake_set(fake, &(kvt_fake_script){.ranges = KV_G4C_SLOTS, .nodes = KV_G4C_SLOTS});
  cr_assert(run_while_not(c, table_full, 5000), "%u nodes", stats(c).nodes);
  gap_start();
  uint64_t reads = stats(c).refreshes;
  while (stats(c).refreshes < reads + 3) uv_run(&loop, UV_RUN_ONCE); /* the same map, again */
  cr_assert_lt(gap_stop(), 1000);
  st = stats(c);
  cr_assert_eq(st.nodes, KV_G4C_NODES_MAX);
  cr_assert_eq(st.masters, KV_G4C_NODES_MAX - 1, "the seed, and as many masters as there is room for");
  cr_assert_eq(st.slots, KV_G4C_NODES_MAX - 1);
  cr_assert_eq(st.state, KV_G4C_DEGRADED);
  close_client(c);
}

/* ---- replies over the limits ------------------------------------------------------
 * hiredis builds a reply whole before the client sees it; the client's
 * reader functions refuse one over the limits as it is read, and drop the
 * connection: its commands fail (conn, "... over the limits"), the node
 * comes back after its backoff. */

static int map_read_failed(kv_g4c *c) { return stats(c).refresh_fails >= 1; }

static void set_get(kv_g4c *c, const char *key, const char *val) {
  res x;
  const char *sv[] = {"SET", key, val};
  submit(c, key, 3, sv, &x);
  cr_assert(run_until(&x.done, 3000));
  cr_assert_eq(x.kind, KV_G4C_VALUE, "SET: %s %s", kv_g4c_reason_name(x.reason), x.msg);
  const char *gv[] = {"GET", key};
  submit(c, key, 2, gv, &x);
  cr_assert(run_until(&x.done, 3000));
  cr_assert_eq(x.kind, KV_G4C_VALUE, "GET: %s %s", kv_g4c_reason_name(x.reason), x.msg);
  cr_assert_str_eq(x.msg, val);
}

static int is_ok(kv_g4c *c) { return kv_g4c_get_state(c) == KV_G4C_OK; }

Test(g4_hostile, slot_map_of_5000000_elements_refused_as_read, .init = setup, .fini = teardown,
     .timeout = 120) {
  for (int nested = 0; nested <= 1; nested++) {
    const char *what = nested ? "5,000,000 elements in arrays of 320" : "5,000,000 elements";
    kvt_fake_set(fake, &(kvt_fake_script){.flood = 5000000, .flood_nested = nested});
    kv_g4c *c = open_client("127.0.0.1", 10000, 0);
    gap_start();
    long rss0 = rss_peak;
    cr_assert(run_while_not(c, map_read_failed, 20000), "%s: no map read failed within 20 s", what);
    kvt_fake_set(fake, &(kvt_fake_script){0});
    int64_t gap = gap_stop();
    long grew = rss_peak - rss0;
    kv_g4c_stats st = stats(c);
    cr_log_info("%s: the loop waited at most %lld ms, the process grew by %ld KiB at most", what,
                (long long)gap, grew);
    cr_assert_lt(gap, 500, "%s: the loop stalled for %lld ms", what, (long long)gap);
    cr_assert_lt(grew, 100 << 10, "%s: the process grew by %ld KiB", what, grew);
    cr_assert_geq(st.replies_refused, 1, "%s: not refused by the reply limits", what);
    cr_assert_geq(st.conn_fails, 1, "%s: the connection stayed", what);
    cr_assert_eq(st.refreshes, 0);
    cr_assert_eq(st.slots, 0);
    /* the next map read, on a new connection, takes the good map */
    cr_assert(run_while_not(c, has_map, 5000), "%s: no map after", what);
    cr_assert_eq(stats(c).slots, KV_G4C_SLOTS);
    cr_assert(run_while_not(c, is_ok, 5000));
    set_get(c, "after", "flood");
    close_client(c);
  }
}

Test(g4_hostile, get_of_a_4_gib_string_refused_once_its_length_is_in, .init = setup,
     .fini = teardown, .timeout = 120) {
  kv_g4c *c = open_client("127.0.0.1", 3000, 0);
  cr_assert(run_while_not(c, has_map, 3000));
  set_get(c, "k", "v");
  kvt_fake_set(fake, &(kvt_fake_script){.huge_bulk = 4ull << 30}); /* then 16 KiB every 5 ms */
  res x;
  const char *gv[] = {"GET", "k"};
  gap_start();
  submit(c, "k", 2, gv, &x);
  cr_assert(run_until(&x.done, 5000));
  unsigned long long sent = kvt_fake_streamed(fake);
  cr_assert_lt(gap_stop(), 500);
  cr_assert_eq(x.kind, KV_G4C_ERROR);
  cr_assert_eq(x.reason, KV_G4C_R_CONN, "%s: %s", kv_g4c_reason_name(x.reason), x.msg);
  cr_assert(strstr(x.msg, "over the limits") && strstr(x.msg, "4294967296"), "%s", x.msg);
  cr_assert_lt(sent, 1 << 20, "%llu bytes sent before the refusal", sent);
  kv_g4c_stats st = stats(c);
  cr_assert_eq(st.replies_refused, 1);
  cr_assert_geq(st.conn_fails, 1, "the connection stayed");
  cr_log_info("4 GiB announced: refused with %llu bytes sent: %s", sent, x.msg);
  /* the node comes back by itself */
  kvt_fake_set(fake, &(kvt_fake_script){0});
  cr_assert(run_while_not(c, is_ok, 5000));
  set_get(c, "k", "v");
  close_client(c);
}

Test(g4_hostile, error_lines_of_1_mib_and_replies_to_no_command_refused, .init = setup,
     .fini = teardown, .timeout = 120) {
  kv_g4c *c = open_client("127.0.0.1", 3000, 0);
  cr_assert(run_while_not(c, has_map, 3000));
  res x;
  const char *gv[] = {"GET", "k"};
  /* an error line within the limits is an error reply */
  kvt_fake_set(fake, &(kvt_fake_script){.long_error = 1000});
  submit(c, "k", 2, gv, &x);
  cr_assert(run_until(&x.done, 3000));
  cr_assert_eq(x.reason, KV_G4C_R_OTHER, "%s: %s", kv_g4c_reason_name(x.reason), x.msg);
  cr_assert_eq(stats(c).replies_refused, 0);
  /* one of 1 MiB is not */
  kvt_fake_set(fake, &(kvt_fake_script){.long_error = 1 << 20});
  submit(c, "k", 2, gv, &x);
  cr_assert(run_until(&x.done, 3000));
  cr_assert_eq(x.reason, KV_G4C_R_CONN, "%s: %s", kv_g4c_reason_name(x.reason), x.msg);
  cr_assert(strstr(x.msg, "over the limits"), "%s", x.msg);
  cr_assert_eq(stats(c).replies_refused, 1);
  /* "+OK" after each answer: the answer is taken, the reply to no command
   * refused (hiredis 0.14 asserts on it) */
  kvt_fake_set(fake, &(kvt_fake_script){.unsolicited = 1});
  cr_assert(run_while_not(c, is_ok, 5000));
  uint64_t fails = stats(c).conn_fails;
  const char *sv[] = {"SET", "k", "v"};
  submit(c, "k", 3, sv, &x);
  cr_assert(run_until(&x.done, 3000));
  cr_assert_eq(x.kind, KV_G4C_VALUE, "SET: %s %s", kv_g4c_reason_name(x.reason), x.msg);
  for (int i = 0; i < 100 && stats(c).conn_fails == fails; i++) uv_run(&loop, UV_RUN_ONCE);
  cr_assert_eq(stats(c).replies_refused, 2);
  cr_assert_eq(stats(c).conn_fails, fails + 1, "the connection stayed");
  kvt_fake_set(fake, &(kvt_fake_script){0});
  cr_assert(run_while_not(c, is_ok, 5000));
  set_get(c, "k", "v");
  close_client(c);
}

/* ---- MOVED -------------------------------------------------------------------- */

#define BATCHES 10
#define BATCH   2000

static res moved[BATCH];

Test(g4_hostile, moved_to_20000_new_addresses_keeps_the_table_bounded, .init = setup, .fini = teardown,
     .timeout = 120) {
  kv_g4c *c = open_client("127.0.0.1", TIMEOUT_MS, 0);
  cr_assert(run_while_not(c, has_map, 3000));
  kvt_fake_set(fake, &(kvt_fake_script){.moved = 1});
  size_t heap0 = 0;
  unsigned max_nodes = 0, full = 0, conn = 0;
  for (int b = 0; b < BATCHES; b++) {
    for (int i = 0; i < BATCH; i++) {
      char key[32];
      snprintf(key, sizeof key, "m%d-%d", b, i);
      const char *argv[] = {"GET", key};
      submit(c, key, 2, argv, &moved[i]);
    }
    /* all in flight: each MOVED to an address never seen, refused there */
    for (int i = 0; i < BATCH; i++) {
      int64_t end = kv_now_ms() + TIMEOUT_MS + 1000;
      while (!moved[i].done && kv_now_ms() < end) {
        uv_run(&loop, UV_RUN_ONCE);
        unsigned n = stats(c).nodes;
        if (n > max_nodes) max_nodes = n;
      }
      cr_assert(moved[i].done, "GET %d of batch %d: no callback", i, b);
      cr_assert_eq(moved[i].kind, KV_G4C_ERROR);
      if (moved[i].reason == KV_G4C_R_MOVED) {
        cr_assert(strstr(moved[i].msg, "node table is full"), "%s", moved[i].msg);
        full++;
      } else {
        cr_assert_eq(moved[i].reason, KV_G4C_R_CONN, "%s: %s", kv_g4c_reason_name(moved[i].reason),
                     moved[i].msg);
        conn++;
      }
    }
    cr_assert_leq(max_nodes, KV_G4C_NODES_MAX);
    /* the next map read names the fake alone: the other nodes go */
    cr_assert(run_while_not(c, one_node, 3000), "batch %d: %u nodes left", b, stats(c).nodes);
    if (b == 0) heap0 = mallinfo2().uordblks;
  }
  size_t heap1 = mallinfo2().uordblks;
  kv_g4c_stats st = stats(c);
  cr_log_info("%d GETs MOVED: %u nodes at most, %u refused (table full), %u conn; heap %zu -> %zu",
              BATCHES * BATCH, max_nodes, full, conn, heap0, heap1);
  cr_assert_eq(kvt_fake_count(fake, "GET"), BATCHES * BATCH, "each GET was MOVED once");
  cr_assert_gt(full, 0, "the table was never full");
  cr_assert_gt(conn, (unsigned)BATCHES * (KV_G4C_NODES_MAX / 2), "redirections were followed");
  cr_assert_eq(st.moved, conn);
  cr_assert_eq(st.errors[KV_G4C_R_MOVED], full);
  cr_assert_lt(heap1, heap0 + (1 << 20), "the heap grew from %zu to %zu bytes", heap0, heap1);
  close_client(c);
}

/* ---- host names ---------------------------------------------------------------- */

static void get_fails_by_its_timeout(kv_g4c *c, const char *key) {
  res x;
  const char *argv[] = {"GET", key};
  int64_t t = kv_now_ms();
  submit(c, key, 2, argv, &x);
  cr_assert(run_until(&x.done, TIMEOUT_MS + 1000));
  cr_assert_eq(x.kind, KV_G4C_ERROR);
  cr_assert(x.reason == KV_G4C_R_TIMEOUT || x.reason == KV_G4C_R_CONN, "%s: %s",
            kv_g4c_reason_name(x.reason), x.msg);
  cr_assert_leq(x.at - t, TIMEOUT_MS + 200, "%s after %lld ms", kv_g4c_reason_name(x.reason),
                (long long)(x.at - t));
}

Test(g4_hostile, host_names_in_the_map_and_in_moved_resolved_off_the_loop, .init = setup,
     .fini = teardown, .timeout = 120) {
  /* the map names the fake "slow.invalid": 3 s to learn it does not exist */
  kvt_fake_set(fake, &(kvt_fake_script){.slots_host = "slow.invalid"});
  kv_g4c *c = open_client("127.0.0.1", TIMEOUT_MS, 200);
  gap_start();
  cr_assert(run_while_not(c, has_map, 3000));
  get_fails_by_its_timeout(c, "a");
  get_fails_by_its_timeout(c, "b");

  /* the map names 127.0.0.1 again; GET is MOVED to "moved.slow.invalid" */
  kvt_fake_set(fake, &(kvt_fake_script){.moved_host = "moved.slow.invalid"});
  uint64_t reads = stats(c).refreshes;
  while (stats(c).refreshes < reads + 2) uv_run(&loop, UV_RUN_ONCE);
  unsigned long gets = kvt_fake_count(fake, "GET");
  get_fails_by_its_timeout(c, "c");
  cr_assert_eq(kvt_fake_count(fake, "GET"), gets + 1, "the GET reached the fake and was MOVED");
  cr_assert_geq(stats(c).moved, 1);
  int64_t gap = gap_stop();
  cr_assert_geq(atomic_load(&slow_lookups), 2, "the resolver was not asked");
  cr_assert_lt(gap, 1000, "the loop stalled for %lld ms", (long long)gap);
  close_client(c);
}

Test(g4_hostile, localhost_as_seed_and_in_the_map_end_to_end, .init = setup, .fini = teardown,
     .timeout = 120) {
  kvt_fake_set(fake, &(kvt_fake_script){.slots_host = "localhost"});
  kv_g4c *c = open_client("localhost", 5000, 0); /* a lookup takes 1.5 s */
  gap_start();
  res x;
  const char *sv[] = {"SET", "k", "v"};
  submit(c, "k", 3, sv, &x);
  cr_assert(run_until(&x.done, 6000));
  cr_assert_eq(x.kind, KV_G4C_VALUE, "SET: %s %s", kv_g4c_reason_name(x.reason), x.msg);
  const char *gv[] = {"GET", "k"};
  submit(c, "k", 2, gv, &x);
  cr_assert(run_until(&x.done, 6000));
  cr_assert_eq(x.kind, KV_G4C_VALUE, "GET: %s %s", kv_g4c_reason_name(x.reason), x.msg);
  cr_assert_str_eq(x.msg, "v");
  cr_assert(run_while_not(c, is_ok, 5000));
  int64_t gap = gap_stop();
  kv_g4c_stats st = stats(c);
  cr_assert_eq(st.nodes, 1, "the seed and the map's \"localhost\" are one node");
  cr_assert_eq(st.slots, KV_G4C_SLOTS);
  cr_assert_geq(atomic_load(&localhost_lookups), 1, "the resolver was not asked");
  cr_assert_lt(gap, 1000, "the loop stalled for %lld ms", (long long)gap);
  close_client(c);
}
