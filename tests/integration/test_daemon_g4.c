/* test_daemon_g4.c - two kvcached daemons sharing one Redis Cluster as two
 * nodes of a fleet (issue 20, tiers/G4.md "In the daemon"): a block stored
 * through node A is found by LOOKUP and loaded through node B with its
 * bytes intact, and not by another tenant or salt; a value overwritten or
 * damaged in Redis by hand is refused (a miss, counted by reason), never
 * served; a value forged by whoever reaches the cluster, with a correct
 * header and both CRCs but without the fleet's secret, is refused as `mac`
 * (issue 34), a value deleted is a miss; during a key rotation a node
 * reads values of the old secret; the whole cluster stopped leaves both
 * nodes serving G1-G3 without waiting, G4 down in the metrics, then back by
 * itself; a master killed gives misses, never wrong bytes, and hits again
 * after the failover. Each test on its own cluster
 * (tests/lib/redis_cluster.sh); skipped when redis-server is not
 * installed. G4 needs a key file: the nodes share one in a fresh
 * directory, and a node without a valid one does not start. */
#include <hiredis/hiredis.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/half.h"
#include "base/le.h"
#include "ipc/reader.h"
#include "proto/wire.h"
#include "tests/lib/fixture.h"
#include "tests/lib/redis_cluster.h"
#include "tests/lib/tmpdir.h"
#include "tiers/g4_cluster.h"
#include "tiers/g4_format.h"

static kvt_rc rc;
static kvt_daemon na, nb; /* nodes A and B */
static char seeds[256];
static char keydir[128]; /* key files: k1 (the fleet's), k2 (the next one), world (0644) */

/* Writes key file keydir/name with text and mode. */
static void key_file(const char *name, const char *text, mode_t mode) {
  char p[200];
  snprintf(p, sizeof p, "%s/%s", keydir, name);
  FILE *f = fopen(p, "w");
  cr_assert(f, "%s", p);
  fputs(text, f);
  fclose(f);
  cr_assert_eq(chmod(p, mode), 0);
}

static void make_keys(void) {
  cr_assert_eq(kvt_mkdtemp(keydir, sizeof keydir, "kvg4keys"), 0);
  key_file("k1", "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7\n", 0600);
  key_file("k2", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n", 0400);
  key_file("world", "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7\n", 0644);
}

static void start_cluster(void) {
  int r = kvt_rc_start(&rc, KV_SOURCE_DIR, "--masters 3 --replicas 1");
  if (r == 77) cr_skip_test("%s", rc.why);
  cr_assert_eq(r, 0, "%s", rc.why);
  int n = 0;
  for (int i = 0; i < 3; i++)
    n += snprintf(seeds + n, sizeof seeds - (size_t)n, "%s127.0.0.1:%d", i ? "," : "",
                  rc.ports[i]);
}

/* Runs a node on the cluster (G3 off, tenants t1 and t2) with key file
 * keydir/key (NULL: none) and up to two more --set values (or NULL): the
 * launcher's status (0: it serves). */
static int run_node(kvt_daemon *d, const char *key, const char *extra, const char *extra2) {
  static const char *const args[] = {"--g2-capacity", "4M",         "--set",     "g2.page_size=1M",
                                     "--set",         "g2.lock=no", "--g3-path", "",
                                     "--log-level",   "warn",       NULL};
  char t1[64], t2[64], seedset[300], keyset[200];
  snprintf(seedset, sizeof seedset, "g4.seeds=%s", seeds);
  snprintf(t1, sizeof t1, "tenant.t1.uids=%u", (unsigned)getuid());
  snprintf(t2, sizeof t2, "tenant.t2.uids=%u", (unsigned)getuid());
  snprintf(keyset, sizeof keyset, "g4.key_file=%s/%s", keydir, key ? key : "");
  const char *sets[] = {t1, t2, seedset, "g4.timeout_ms=300", "g1.enable=off",
                        key ? keyset : "g4.key_file=", extra, extra2, NULL};
  if (!extra) sets[6] = extra2, sets[7] = NULL;
  kvt_daemon_opts o = {.args = args, .sets = sets};
  return kvt_daemon_start(d, &o);
}

/* Starts a node with the fleet's key (extra: one more --set, or NULL). */
static void start_node_with(kvt_daemon *d, const char *extra) {
  cr_assert_eq(run_node(d, "k1", extra, NULL), 0, "kvcached did not start");
}

static void start_node(kvt_daemon *d) { start_node_with(d, NULL); }

static void setup(void) {
  make_keys();
  start_cluster();
  start_node(&na);
  start_node(&nb);
}

static void teardown(void) {
  if (na.pid) cr_expect_eq(kvt_daemon_stop(&na), 0, "node A did not stop cleanly");
  if (nb.pid) cr_expect_eq(kvt_daemon_stop(&nb), 0, "node B did not stop cleanly");
  kvt_daemon_free(&na);
  kvt_daemon_free(&nb);
  kvt_rc_stop(&rc);
  if (keydir[0]) kvt_rmtree(keydir);
}

static kvc *worker(kvt_daemon *d, const char *tenant, const char *salt) {
  return ops_open_at(d->sock, tenant, salt, 1, NULL);
}

static long long metric(kvt_daemon *d, const char *series) {
  static char resp[1 << 20];
  const char *body;
  cr_assert_eq(kvt_http(d->stats, "GET", "/metrics", resp, sizeof resp, &body), 200);
  return kvt_metric_value(body, series);
}

/* Polls a metric until it is at least want; its last value. */
static long long wait_metric(kvt_daemon *d, const char *series, long long want, int ms) {
  long long v = metric(d, series);
  for (int64_t end = kv_now_ms() + ms; v < want && kv_now_ms() < end; v = metric(d, series))
    usleep(20000);
  return v;
}

/* The bytes of block v of a chain: v's own pattern, so a block served for
 * another key shows. */
static void fill(uint8_t *p, uint64_t v) {
  for (uint32_t i = 0; i < OPS_BLOCK; i++) p[i] = (uint8_t)(v * 131 + i * 7 + (i >> 9));
}

/* Stores the chain KC(first)..KC(last), each block the child of the one
 * before (the first a root). shared: each committed with kvc_commit_shared,
 * its status into st[v - first] (st may be NULL: then each must be 0). */
static void store_chain_as(int shared, kvc *c, uint64_t first, uint64_t last, int32_t *st) {
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = KC(v), parent = v == first ? (kvc_key){0} : KC(v - 1);
    kvc_block out;
    cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &parent, 1, &out), 1, "alloc %llu",
                 (unsigned long long)v);
    fill(out.ptr, v);
    if (!shared) {
      cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
      continue;
    }
    uint32_t crc = kvc_crc32c(0, out.ptr, out.length);
    int32_t one = 1;
    int n = kvc_commit_shared(c, &k, &crc, 1, &one);
    cr_assert_geq(n, 0, "commit_shared %llu: %s", (unsigned long long)v, kvc_strerror(n));
    if (st) st[v - first] = one;
    else cr_assert_eq(one, 0, "key %llu: %s", (unsigned long long)v, kvc_strerror(one));
  }
}
static void store_chain(kvc *c, uint64_t first, uint64_t last) {
  store_chain_as(0, c, first, last, NULL);
}

/* LOOKUP of KC(first)..KC(last) through c (all: kvc_lookup_all): the hit
 * length, and its time in ms in *ms (may be NULL). */
static int lookup_as(int all, kvc *c, uint64_t first, uint64_t last, uint8_t *tiers,
                     int64_t *ms) {
  kvc_key k[64];
  uint32_t n = (uint32_t)(last - first + 1);
  cr_assert_leq(n, 64);
  for (uint32_t i = 0; i < n; i++) k[i] = KC(first + i);
  int64_t t = kv_now_ms();
  int hit = (all ? kvc_lookup_all : kvc_lookup)(c, k, n, tiers);
  if (ms) *ms = kv_now_ms() - t;
  cr_assert_geq(hit, 0, "lookup: %s", kvc_strerror(hit));
  return hit;
}
static int lookup(kvc *c, uint64_t first, uint64_t last, uint8_t *tiers, int64_t *ms) {
  return lookup_as(0, c, first, last, tiers, ms);
}

/* LOADs KC(v) through c and checks its bytes (verified by kvc_read too). */
static void load_check(kvc *c, uint64_t v) {
  static uint8_t want[OPS_BLOCK], got[OPS_BLOCK];
  kvc_key k = KC(v);
  kvc_block b;
  cr_assert_eq(kvc_load(c, KVC_G2, &k, 1, &b), 1, "load %llu: %s", (unsigned long long)v,
               kvc_strerror(b.status));
  cr_assert_eq(b.length, OPS_BLOCK);
  cr_assert_eq(kvc_read(c, &k, &b, got), 0, "read %llu", (unsigned long long)v);
  fill(want, v);
  cr_assert(!memcmp(got, want, OPS_BLOCK), "block %llu: wrong bytes", (unsigned long long)v);
  kvc_release(c, &k, 1, NULL);
}

/* Both nodes see the cluster ok; a worker of tenant t1 on each. */
static void both_ok(kvc **a, kvc **b) {
  cr_assert_eq(wait_metric(&na, "kvcached_g4_state{state=\"ok\"}", 1, 10000), 1);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_state{state=\"ok\"}", 1, 10000), 1);
  *a = worker(&na, "t1", NULL);
  *b = worker(&nb, "t1", NULL);
}

/* --- Redis by hand --------------------------------------------------------- */

/* A command on one node (no password). */
#define adm(port, ...) kvt_rc_adm(port, NULL, __VA_ARGS__)

/* The port of the master serving a key, as the cluster says. */
static int owner_of(const char *key) {
  unsigned slot = kv_g4c_slot(key, strlen(key));
  for (int i = 0; i < rc.nports; i++) {
    int port = kvt_rc_slot_owner(rc.ports[i], NULL, slot);
    if (port) return port;
  }
  cr_assert_fail("no master for slot %u", slot);
  return 0;
}

/* Node port's pid. */
static pid_t node_pid(int port) { return kvt_rc_node_pid(&rc, port); }

/* The Redis key name of block v (of whichever namespace wrote it: the
 * tests write each key under one namespace), found by SCAN on the masters. */
static void rkey_of(uint64_t v, char *out, size_t n) {
  char hex[17], pat[64];
  kvt_key_hex(v, hex);
  snprintf(pat, sizeof pat, "kv:*:%s", hex);
  for (int i = 0; i < 3; i++) {
    redisReply *r = adm(rc.ports[i], "SCAN 0 MATCH %s COUNT 100000", pat);
    redisReply *keys = r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? r->element[1] : NULL;
    if (keys && keys->elements) {
      snprintf(out, n, "%s", keys->element[0]->str);
      freeReplyObject(r);
      return;
    }
    freeReplyObject(r);
  }
  cr_assert_fail("no G4 value for key %llu", (unsigned long long)v);
}

/* No master holds a value of key v. */
static void assert_not_in_cluster(uint64_t v, const char *what) {
  char hex[17], pat[64];
  kvt_key_hex(v, hex);
  snprintf(pat, sizeof pat, "kv:*:%s", hex);
  for (int i = 0; i < 3; i++) {
    redisReply *r = adm(rc.ports[i], "SCAN 0 MATCH %s COUNT 100000", pat);
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    size_t n = r->element[1]->elements;
    freeReplyObject(r);
    cr_assert_eq(n, 0, "%s (master %d)", what, rc.ports[i]);
  }
}

/* --- the tests ---------------------------------------------------------------- */

Test(daemon_g4, stored_on_a_loaded_on_b, .init = setup, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 8);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 8, 5000), 8);
  cr_assert_eq(metric(&na, "kvcached_g4_queued_blocks"), 0, "every write started");

  /* B holds nothing: its LOOKUP asks G4 and brings the chain into G2 */
  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 8, t, NULL), 8);
  for (int i = 0; i < 8; i++) cr_assert_eq(t[i], KVC_G2, "key %d in tier %d", i, t[i]);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 8);
  cr_assert_eq(metric(&nb, "kvcached_lookups_total"), 8, "a LOOKUP that waited is counted once");
  for (uint64_t v = 1; v <= 8; v++) load_check(b, v);
  /* B's presence table (protocol 1.5) had none of them, and with G4 a short
   * run is the daemon's to answer; a whole run is the table's */
  kvc_lookup_info li;
  cr_assert_eq(kvc_lookup_stats(b, &li), 0);
  cr_assert(li.mapped && li.daemon == 1 && li.local == 0, "mapped %d, daemon %llu, local %llu",
            li.mapped, (unsigned long long)li.daemon, (unsigned long long)li.local);
  cr_assert_eq(lookup(b, 1, 8, t, NULL), 8);
  cr_assert_eq(kvc_lookup_stats(b, &li), 0);
  cr_assert(li.local == 1 && li.daemon == 1, "the whole run came from the table");
  /* what follows the chain is absent: a miss, counted, and no wait past it */
  cr_assert_eq(lookup(b, 1, 10, t, NULL), 8);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), 2);

  /* another tenant, or another salt, on B does not see A's blocks */
  kvc *other = worker(&nb, "t2", NULL), *salted = worker(&nb, "t1", "s1");
  cr_assert_eq(lookup(other, 1, 8, t, NULL), 0);
  cr_assert_eq(lookup(salted, 1, 8, t, NULL), 0);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 8);

  /* a DELETE reaches G4: blocks B wrote, one deleted on B, are looked up
   * on A by the same tenant and salt: the deleted one is absent */
  store_chain(salted, 20, 21);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_writes_total{result=\"ok\"}", 2, 5000), 2);
  kvc *sa = worker(&na, "t1", "s1");
  kvc_key k21 = KC(21);
  cr_assert_eq(kvc_delete(salted, &k21, 1), 1);
  cr_assert_geq(wait_metric(&nb, "kvcached_g4_deletes_total{result=\"ok\"}", 1, 5000), 1);
  cr_assert_eq(lookup(sa, 20, 21, t, NULL), 1, "the deleted block is gone from G4");
  load_check(sa, 20);

  /* STATUS and /stats say it */
  char *st = NULL;
  cr_assert_eq(kvc_status(b, &st), 0);
  cr_assert(strstr(st, "\"g4\"") && strstr(st, "\"ok\""), "%s", st);
  free(st);
  kvc_close(sa);
  kvc_close(other);
  kvc_close(salted);
  kvc_close(a);
  kvc_close(b);
}

Test(daemon_g4, overwritten_values_are_refused, .init = setup, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 6);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 6, 5000), 6);
  char k2[160], k3[160], k5[160];
  rkey_of(2, k2, sizeof k2);
  rkey_of(3, k3, sizeof k3);
  rkey_of(5, k5, sizeof k5);
  /* key 2 gets key 3's (valid) value: the header names another key */
  redisReply *v3 = adm(owner_of(k3), "GET %s", k3);
  cr_assert_eq(v3->type, REDIS_REPLY_STRING);
  cr_assert_eq(v3->len, KV_G4_HDR_LEN + OPS_BLOCK);
  redisReply *r = adm(owner_of(k2), "SET %s %b", k2, v3->str, (size_t)v3->len);
  cr_assert_eq(r->type, REDIS_REPLY_STATUS, "SET");
  freeReplyObject(r);
  /* key 5's payload gets one byte changed */
  redisReply *v5 = adm(owner_of(k5), "GET %s", k5);
  cr_assert_eq(v5->type, REDIS_REPLY_STRING);
  v5->str[KV_G4_HDR_LEN + 1000] ^= 0x40;
  r = adm(owner_of(k5), "SET %s %b", k5, v5->str, (size_t)v5->len);
  freeReplyObject(r);
  freeReplyObject(v5);
  freeReplyObject(v3);

  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 6, t, NULL), 1, "key 2 is refused: the run ends there");
  cr_assert_eq(t[1], KVC_TIER_NONE);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"key\"}"), 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"payload_crc\"}"), 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"gap\"}"), 3); /* 3, 4, 6 */
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 1);
  load_check(b, 1);
  kvc_key k = KC(2);
  kvc_block blk;
  cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &blk), 0, "key 2 is never served");

  /* a master that stops answering: a LOOKUP waits g4.timeout_ms at most,
   * a miss (timeout); a session that goes while its LOOKUP waits is owed
   * nothing and leaves nothing behind (ASan's leak check at the stop) */
  store_chain(a, 31, 32);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 8, 5000), 8);
  for (int i = 0; i < 3; i++) freeReplyObject(adm(rc.ports[i], "WAIT 1 2000"));
  char k31[160];
  rkey_of(31, k31, sizeof k31);
  pid_t pid = node_pid(owner_of(k31));
  kvc *gone = worker(&nb, "t1", NULL);
  kvc_key ks[2] = {KC(31), KC(32)};
  uint8_t gt[2];
  cr_assert_eq(kill(pid, SIGSTOP), 0); /* resumed well before cluster-node-timeout */
  cr_assert_gt(kvc_submit_lookup(gone, ks, 2, gt, NULL), 0);
  usleep(20000);
  kvc_close(gone);
  int64_t ms;
  int hit = lookup(b, 31, 32, t, &ms);
  cr_assert_eq(kill(pid, SIGCONT), 0);
  cr_assert_eq(hit, 0);
  cr_assert_geq(ms, 250, "waited %lld ms", (long long)ms);
  cr_assert_lt(ms, 1000, "waited %lld ms", (long long)ms);
  /* timeout, or error when the other LOOKUP's timeout dropped the
   * connection first (tiers/G4.md: a hung node) */
  cr_assert_geq(metric(&nb, "kvcached_g4_misses_total{reason=\"timeout\"}") +
                    metric(&nb, "kvcached_g4_misses_total{reason=\"error\"}"),
                1);
  long long waiting = 1;
  for (int64_t end = kv_now_ms() + 3000; waiting && kv_now_ms() < end; usleep(20000))
    waiting = metric(&nb, "kvcached_g4_lookups_waiting");
  cr_assert_eq(waiting, 0);
  for (int64_t end = kv_now_ms() + 10000; hit < 2 && kv_now_ms() < end; usleep(100000))
    hit = lookup(b, 31, 32, t, NULL); /* the node answers again */
  cr_assert_eq(hit, 2);
  load_check(b, 31);
  kvc_close(a);
  kvc_close(b);
}

Test(daemon_g4, cluster_down_nodes_serve_alone, .init = setup, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  cr_assert_eq(kvt_rc_do(&rc, "kill-all", 0), 0);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_state{state=\"down\"}", 1, 5000), 1);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_state{state=\"down\"}", 1, 5000), 1);

  /* both nodes store and load on their own; a LOOKUP does not wait */
  store_chain(a, 1, 4);
  store_chain(b, 11, 14);
  uint8_t t[64];
  int64_t ms;
  cr_assert_eq(lookup(a, 1, 8, t, &ms), 4);
  cr_assert_lt(ms, 100, "a LOOKUP waited %lld ms for a cluster that is down", (long long)ms);
  cr_assert_eq(lookup(b, 1, 8, t, &ms), 0);
  cr_assert_lt(ms, 100, "a LOOKUP waited %lld ms for a cluster that is down", (long long)ms);
  cr_assert_geq(metric(&nb, "kvcached_g4_misses_total{reason=\"down\"}"), 8);
  cr_assert_geq(metric(&na, "kvcached_g4_writes_total{result=\"skipped\"}"), 4);
  load_check(a, 3);
  load_check(b, 12);
  /* a COMMIT that waits for G4: committed here, answered KV_EDEGRADED at once */
  int32_t st[4];
  int64_t t0 = kv_now_ms();
  store_chain_as(1, a, 31, 34, st);
  cr_assert_lt(kv_now_ms() - t0, 1000);
  for (int i = 0; i < 4; i++) cr_assert_eq(st[i], KV_EDEGRADED, "key %d: %d", 31 + i, st[i]);
  load_check(a, 33);

  /* what each node committed meanwhile is owed to G4 */
  cr_assert_eq(metric(&na, "kvcached_g4_backlog_blocks"), 8); /* 1..4, 31..34 */
  cr_assert_eq(metric(&nb, "kvcached_g4_backlog_blocks"), 4); /* 11..14 */

  /* the cluster back (empty: no persistence): both nodes see it by themselves,
   * and write what they owe */
  for (int i = 0; i < rc.nports; i++) cr_assert_eq(kvt_rc_do(&rc, "start-node", rc.ports[i]), 0);
  cr_assert_eq(kvt_rc_do(&rc, "wait-ok", 20), 0);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_state{state=\"ok\"}", 1, 15000), 1);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_state{state=\"ok\"}", 1, 15000), 1);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 8, 20000), 8);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_writes_total{result=\"ok\"}", 4, 5000), 4);
  cr_assert_geq(metric(&na, "kvcached_g4_backlog_total{result=\"written\"}"), 8); /* retries */
  cr_assert_eq(metric(&na, "kvcached_g4_backlog_blocks"), 0);
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 4, "A's blocks of the outage, written since");
  cr_assert_eq(lookup(a, 11, 14, t, NULL), 4, "B's");
  for (uint64_t v = 1; v <= 4; v++) load_check(b, v);
  store_chain(a, 21, 24);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 12, 5000), 12);
  cr_assert_eq(lookup(b, 21, 24, t, NULL), 4);
  for (uint64_t v = 21; v <= 24; v++) load_check(b, v);
  /* once the COMMIT that waits for G4 is answered 0, node B finds the blocks
   * (no wait for the writes: the answer is the wait) */
  store_chain_as(1, a, 41, 48, NULL);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 20);
  cr_assert_eq(lookup(b, 41, 48, t, NULL), 8);
  for (uint64_t v = 41; v <= 48; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

Test(daemon_g4, master_killed_misses_then_hits, .init = setup, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 24);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 24, 5000), 24);
  /* the replicas have them (asynchronous replication: WAIT on each master) */
  for (int i = 0; i < 3; i++) freeReplyObject(adm(rc.ports[i], "WAIT 1 2000"));
  usleep(300000);
  char k1[160];
  rkey_of(1, k1, sizeof k1);
  int victim = owner_of(k1); /* the chain's first block is on it: the run misses at once */
  cr_assert_eq(kvt_rc_do(&rc, "kill", victim), 0);

  uint8_t t[64];
  int hit = lookup(b, 1, 24, t, NULL);
  cr_assert_eq(hit, 0, "key 1's master is dead: a miss, not a wrong hit");
  /* after the failover (cluster-node-timeout 1 s) the promoted replica serves */
  int64_t end = kv_now_ms() + 20000;
  while (hit < 24 && kv_now_ms() < end) {
    usleep(200000);
    hit = lookup(b, 1, 24, t, NULL);
  }
  cr_assert_eq(hit, 24, "after the failover: %d of 24", hit);
  for (uint64_t v = 1; v <= 24; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* --- issue 34: values nobody without the fleet's secret can forge ---------- */

/* A value of Redis key name `name`, read from its master; freed by the caller. */
static redisReply *get_value(const char *name) {
  redisReply *v = adm(owner_of(name), "GET %s", name);
  cr_assert_eq(v->type, REDIS_REPLY_STRING, "GET %s", name);
  cr_assert_eq(v->len, KV_G4_HDR_LEN + OPS_BLOCK);
  return v;
}

/* Writes val[0..n) as the value of name, with both CRCs made right first:
 * what anyone who reaches the cluster can do, with base/crc32c.h as the
 * format computes them (payload CRC at 16, header CRC over the rest of the
 * header in its last 4 bytes). */
static void forge(const char *name, uint8_t *val, size_t n) {
  kv_st32(val + 16, kv_crc32c(0, val + KV_G4_HDR_LEN, n - KV_G4_HDR_LEN));
  kv_st32(val + KV_G4_HDR_LEN - 4, kv_crc32c(0, val, KV_G4_HDR_LEN - 4));
  redisReply *r = adm(owner_of(name), "SET %s %b", name, val, n);
  cr_assert_eq(r->type, REDIS_REPLY_STATUS, "SET %s", name);
  freeReplyObject(r);
}

/* The issue: an attacker with cluster access (no password by default)
 * lists the key names, rewrites a tenant's value with a correct header and
 * both CRCs, and the other node served those bytes as the tenant's block.
 * Now each forgery is refused as `mac`, the run ends there, and the
 * forged bytes are never served; a deleted value is a miss. */
Test(daemon_g4, forged_values_are_refused_deleted_ones_miss, .init = setup, .fini = teardown,
     .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 6);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 6, 5000), 6);
  char k3[160], k4[160], k5[160];
  rkey_of(3, k3, sizeof k3);
  rkey_of(4, k4, sizeof k4);
  rkey_of(5, k5, sizeof k5);
  /* key 3: its payload replaced by the attacker's bytes */
  redisReply *v3 = get_value(k3);
  memset(v3->str + KV_G4_HDR_LEN, 0xa5, OPS_BLOCK);
  forge(k3, (uint8_t *)v3->str, v3->len);
  freeReplyObject(v3);
  /* key 4: key 5's genuine value (signed), its header rewritten to name key 4 */
  redisReply *v4 = get_value(k4), *v5 = get_value(k5);
  memcpy(v5->str + 56, v4->str + 56, KV_G4_KEY_MAX);
  forge(k4, (uint8_t *)v5->str, v5->len);
  freeReplyObject(v4);
  freeReplyObject(v5);

  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 6, t, NULL), 2, "the run ends at the forged key 3");
  cr_assert_eq(t[2], KVC_TIER_NONE);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"mac\"}"), 2, "keys 3 and 4");
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"gap\"}"), 2); /* 5, 6 */
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"payload_crc\"}"), 0);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"key\"}"), 0);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 2);
  load_check(b, 1);
  load_check(b, 2);
  for (uint64_t v = 3; v <= 4; v++) {
    kvc_key k = KC(v);
    kvc_block blk;
    cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &blk), 0, "forged key %llu is never served",
                 (unsigned long long)v);
  }
  /* each LOAD asked G4 again (a refused value is not "absent") and was refused
   * again; /stats counts them too */
  static char resp[1 << 20];
  const char *body;
  cr_assert_eq(kvt_http(nb.stats, "GET", "/stats", resp, sizeof resp, &body), 200);
  cr_assert(strstr(body, "\"mac\":4"), "%s", body);

  /* deleting a value: a miss (absent), nothing else */
  store_chain(a, 11, 12);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 8, 5000), 8);
  char k11[160];
  rkey_of(11, k11, sizeof k11);
  redisReply *r = adm(owner_of(k11), "DEL %s", k11);
  cr_assert_eq(r->integer, 1);
  freeReplyObject(r);
  cr_assert_eq(lookup(b, 11, 12, t, NULL), 0);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"mac\"}"), 4);
  /* node A, which holds them, still serves its own blocks */
  for (uint64_t v = 1; v <= 6; v++) load_check(a, v);
  kvc_close(a);
  kvc_close(b);
}

/* Holes in G4 (values of a chain gone from the cluster, as when a master
 * fails or evicts): a LOOKUP stops G4 at its first miss, as before; with
 * KV_LOOKUP_ALL it asks for every key no local tier holds and brings in
 * each block G4 still has, with its own bytes; the holes stay misses. */
Test(daemon_g4, lookup_all_brings_in_the_blocks_after_a_hole, .init = setup, .fini = teardown,
     .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 8);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 8, 5000), 8);
  for (uint64_t v = 3; v <= 6; v += 3) {
    char name[160];
    rkey_of(v, name, sizeof name);
    redisReply *r = adm(owner_of(name), "DEL %s", name);
    cr_assert_eq(r->integer, 1);
    freeReplyObject(r);
  }
  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 8, t, NULL), 2, "G4's run ends at the hole");
  for (int i = 2; i < 8; i++) cr_assert_eq(t[i], KVC_TIER_NONE, "key %d", i + 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 2);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"gap\"}"), 4); /* 4, 5, 7, 8 */

  /* keys 3 and 6 were just answered absent: within g4.absent_ms (250) they
   * are not asked again (recent), the others are */
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), 2);
  cr_assert_eq(lookup_as(1, b, 1, 8, t, NULL), 2, "the hit length is still the leading run");
  static const uint8_t want[8] = {KVC_G2, KVC_G2, KVC_TIER_NONE, KVC_G2,
                                  KVC_G2, KVC_TIER_NONE, KVC_G2, KVC_G2};
  for (int i = 0; i < 8; i++) cr_assert_eq(t[i], want[i], "key %d in tier %d", i + 1, t[i]);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 6);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), 2);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"recent\"}"), 2);
  long long asked = 2;
  for (uint64_t v = 1; v <= 8; v++) {
    if (v == 3 || v == 6) {
      kvc_key k = KC(v);
      kvc_block blk;
      cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &blk), 0, "hole %llu", (unsigned long long)v);
      cr_assert_eq(blk.status, KV_ENOTFOUND);
    } else {
      load_check(b, v);
    }
  }
  /* past absent_ms, with 4, 5, 7 and 8 local now: of 4..8 only 6 is asked for again */
  usleep(300000);
  cr_assert_eq(lookup_as(1, b, 4, 8, t, NULL), 2);
  cr_assert_eq(t[2], KVC_TIER_NONE);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), asked + 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 6);
  kvc_close(a);
  kvc_close(b);
}

/* A LOAD or GET of blocks only G4 holds finds them without a LOOKUP first:
 * each block no local tier holds is asked of G4, stored into G2 verified,
 * then served, with its own bytes (forged values: forged_values_... above). */
Test(daemon_g4, load_and_get_find_what_only_g4_holds, .init = setup, .fini = teardown,
     .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 6);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 6, 5000), 6);
  load_check(b, 3); /* no LOOKUP on B before */
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 1);
  kvc_key k[3] = {KC(4), KC(5), KC(9)};
  kvc_block blk[3];
  cr_assert_eq(kvc_load(b, KVC_G2, k, 3, blk), 2, "4 and 5 from G4; 9 nowhere");
  cr_assert_eq(blk[2].status, KV_ENOTFOUND);
  static uint8_t want[OPS_BLOCK], got[OPS_BLOCK];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(kvc_read(b, &k[i], &blk[i], got), 0);
    fill(want, 4 + (uint64_t)i);
    cr_assert(!memcmp(got, want, OPS_BLOCK), "block %d: wrong bytes", 4 + i);
  }
  kvc_release(b, k, 2, NULL);
  kvc_key k6 = KC(6);
  cr_assert_eq(kvc_get(b, &k6, got, sizeof got), (int)OPS_BLOCK, "GET of a G4-only block");
  fill(want, 6);
  cr_assert(!memcmp(got, want, OPS_BLOCK));
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 4);
  /* key 9 was just answered absent: a LOAD of it again does not ask */
  long long absent = metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}");
  cr_assert_eq(kvc_load(b, KVC_G2, &k[2], 1, blk), 0);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), absent);
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"recent\"}"), 1);
  kvc_close(a);
  kvc_close(b);
}

/* The replicas of the cluster (every node whose ROLE says slave). */
static int replicas(int *ports) {
  int n = 0;
  for (int i = 0; i < rc.nports; i++) {
    redisReply *r = adm(rc.ports[i], "ROLE");
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements && !strcmp(r->element[0]->str, "slave"))
      ports[n++] = rc.ports[i];
    freeReplyObject(r);
  }
  return n;
}


/* The values n nodes hold in all. */
static long long dbsize(const int *ports, int n) {
  long long sum = 0;
  for (int i = 0; i < n; i++) {
    redisReply *r = adm(ports[i], "DBSIZE");
    sum += r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
  }
  return sum;
}

/* Node B reads from replicas, and re-reads the slot map every 200 ms:
 * CLUSTER SLOTS lists a replica only once it has replicated something, so
 * the map B read at its start, of an empty cluster, lists none. */
static void setup_replica_reads(void) {
  make_keys();
  start_cluster();
  start_node(&na);
  cr_assert_eq(run_node(&nb, "k1", "g4.replica_reads=yes", "g4.map_refresh_ms=200"), 0);
}

/* Replica reads on, and replicas that lag: stopped (SIGSTOP), they take no
 * replication and answer nothing, while the masters take new values. A
 * LOOKUP on B then misses (timeout) within g4.timeout_ms and a LOAD serves
 * nothing, although the masters hold every value; once the replicas run
 * and catch up, every block is found with its own bytes. */
Test(daemon_g4, replica_reads_from_lagging_replicas_are_misses_never_wrong,
     .init = setup_replica_reads, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  int rep[KVT_RC_NODES_MAX];
  int nrep = replicas(rep);
  cr_assert_eq(nrep, 3);
  /* 24 blocks over every master; B reads them from the replicas, which
   * connects it to each */
  store_chain(a, 1, 24);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 24, 5000), 24);
  for (int64_t end = kv_now_ms() + 15000; dbsize(rep, nrep) < 24; usleep(50000))
    cr_assert_lt(kv_now_ms(), end, "the replicas hold %lld of 24 values", dbsize(rep, nrep));
  for (int64_t end = kv_now_ms() + 15000;; usleep(50000)) { /* replicas in every node's map */
    redisReply *r = adm(rc.ports[0], "CLUSTER SLOTS");
    size_t listed = 0;
    for (size_t i = 0; i < r->elements; i++) listed += r->element[i]->elements > 3;
    freeReplyObject(r);
    if (listed == 3) break;
    cr_assert_lt(kv_now_ms(), end, "CLUSTER SLOTS lists %zu replicas", listed);
  }
  usleep(500000); /* B's next map re-read */
  uint8_t t[64];
  /* a first read of each slot range opens B's connection to its replica (it
   * goes to the master meanwhile): keys no node wrote, all over the slots */
  cr_assert_eq(lookup_as(1, b, 100, 163, t, NULL), 0);
  usleep(200000);
  cr_assert_eq(lookup(b, 1, 24, t, NULL), 24);
  for (uint64_t v = 1; v <= 24; v++) load_check(b, v);

  long long gets = 0; /* B read them from the replicas */
  for (int i = 0; i < nrep; i++) {
    redisReply *r = adm(rep[i], "INFO commandstats");
    const char *g = strstr(r->str, "cmdstat_get:calls=");
    gets += g ? atoll(g + strlen("cmdstat_get:calls=")) : 0;
    freeReplyObject(r);
  }
  cr_assert_eq(gets, 24, "the replicas served %lld GETs", gets);
  for (int i = 0; i < nrep; i++) cr_assert_eq(kill(node_pid(rep[i]), SIGSTOP), 0);
  store_chain(a, 31, 38); /* the masters take them; the replicas do not */
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 32, 5000), 32);
  cr_assert_eq(dbsize(rc.ports, 3), 32, "the masters hold every value");
  int64_t ms;
  cr_assert_eq(lookup(b, 31, 38, t, &ms), 0, "every read went to a stopped replica");
  cr_assert_lt(ms, 2000, "a LOOKUP waited %lld ms", (long long)ms);
  cr_assert_geq(metric(&nb, "kvcached_g4_misses_total{reason=\"timeout\"}"), 1);
  cr_assert_eq(metric(&nb, "kvcached_g4_hits_total"), 24);
  /* a LOAD now: the stopped replica's connection timed out, so the read may
   * go to the master: served, then with its own bytes, or not at all */
  kvc_key k = KC(33);
  kvc_block blk;
  if (kvc_load(b, KVC_G2, &k, 1, &blk) == 1) {
    static uint8_t want[OPS_BLOCK], got[OPS_BLOCK];
    cr_assert_eq(kvc_read(b, &k, &blk, got), 0);
    fill(want, 33);
    cr_assert(!memcmp(got, want, OPS_BLOCK));
    kvc_release(b, &k, 1, NULL);
  }

  /* the replicas run again and catch up: every block found, its own bytes */
  for (int i = 0; i < nrep; i++) cr_assert_eq(kill(node_pid(rep[i]), SIGCONT), 0);
  for (int64_t end = kv_now_ms() + 15000; dbsize(rep, nrep) < 32; usleep(50000))
    cr_assert_lt(kv_now_ms(), end, "the replicas hold %lld of 32 values", dbsize(rep, nrep));
  for (int64_t end = kv_now_ms() + 10000; lookup(b, 31, 38, t, NULL) < 8; usleep(100000))
    cr_assert_lt(kv_now_ms(), end, "B does not find what the replicas hold again");
  for (uint64_t v = 31; v <= 38; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* A COMMIT that waits for G4 is answered with what became of each write:
 * the cluster out of memory (maxmemory reached, noeviction), the blocks
 * are committed on A, answered KV_EDEGRADED, and counted as oom; with
 * room again, answered 0 only once written (the writes are counted by
 * then, and node B finds them). */
Test(daemon_g4, commit_shared_answers_what_became_of_the_writes, .init = setup,
     .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  for (int i = 0; i < rc.nports; i++) {
    redisReply *r = adm(rc.ports[i], "CONFIG SET maxmemory 1");
    cr_assert(r && r->type == REDIS_REPLY_STATUS, "CONFIG SET on %d", rc.ports[i]);
    freeReplyObject(r);
    r = adm(rc.ports[i], "CONFIG SET maxmemory-policy noeviction");
    freeReplyObject(r);
  }
  int32_t st[4];
  store_chain_as(1, a, 1, 4, st);
  for (int i = 0; i < 4; i++) cr_assert_eq(st[i], KV_EDEGRADED, "key %d: %d", 1 + i, st[i]);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"oom\"}"), 4);
  for (uint64_t v = 1; v <= 4; v++) load_check(a, v);
  for (int i = 0; i < rc.nports; i++) {
    redisReply *r = adm(rc.ports[i], "CONFIG SET maxmemory 0");
    freeReplyObject(r);
  }
  store_chain_as(1, a, 11, 18, NULL);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 8);
  uint8_t t[64];
  cr_assert_eq(lookup(b, 11, 18, t, NULL), 8);
  for (uint64_t v = 11; v <= 18; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* A COMMIT with KV_COMMIT_G4 of more bytes than the pump starts in a turn
 * of the loop (KVD_G4_TURN_BYTES: 1 MiB, here 24 blocks of 64 KiB): its
 * writes start over several turns, and it is answered once they have all
 * ended: every block 0, every block in G4, read back on node B (whose
 * LOOKUP copies the run into G2 over two turns as well). */
static void setup_whole_share(void) { /* a session may hold all of its tenant's 32 slots */
  make_keys();
  start_cluster();
  start_node_with(&na, "limits.session_share=100");
  start_node(&nb);
}

Test(daemon_g4, a_shared_commit_larger_than_a_turn_is_answered_once_all_are_in_g4,
     .init = setup_whole_share, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  enum { N = 24, FIRST = 201 };
  kvc_key k[N], parent[N];
  kvc_block out[N];
  uint32_t crc[N];
  int32_t st[N];
  for (int i = 0; i < N; i++) {
    k[i] = KC(FIRST + i);
    parent[i] = i ? KC(FIRST + i - 1) : (kvc_key){0};
  }
  int got = kvc_alloc(a, KVC_G2, 128, k, parent, N, out);
  cr_assert_eq(got, N, "alloc: %d (%d %d)", got, out[0].status, out[N - 1].status);
  for (int i = 0; i < N; i++) {
    fill(out[i].ptr, FIRST + i);
    crc[i] = kvc_crc32c(0, out[i].ptr, out[i].length);
  }
  cr_assert_eq(N * (uint64_t)OPS_BLOCK > (1u << 20), 1, "more than a turn's bytes");
  int n = kvc_commit_shared(a, k, crc, N, st);
  cr_assert_eq(n, N, "commit_shared: %d of %d in G4", n, N);
  for (int i = 0; i < N; i++) cr_assert_eq(st[i], 0, "key %d: %d", FIRST + i, st[i]);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), N);
  cr_assert_eq(metric(&na, "kvcached_g4_queued_blocks"), 0, "every write started");
  uint8_t t[64];
  cr_assert_eq(lookup(b, FIRST, FIRST + N - 1, t, NULL), N);
  cr_assert_eq(metric(&nb, "kvcached_g4_lookups_waiting"), 0, "the LOOKUP answered");
  for (uint64_t v = FIRST; v < FIRST + N; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* A key rotation: node B signs with the new secret and accepts the old one
 * until g4.old_key_until, so it reads what node A (old secret) wrote; node
 * A, not given the new secret yet, refuses B's values (`mac`: a miss). */
static void setup_rotation(void) {
  make_keys();
  start_cluster();
  start_node(&na);
  char old[200];
  snprintf(old, sizeof old, "g4.old_key_file=%s/k1", keydir);
  cr_assert_eq(run_node(&nb, "k2", old, "g4.old_key_until=2099-01-01T00:00:00Z"), 0,
               "node B did not start");
}

Test(daemon_g4, rotation_reads_the_old_secret, .init = setup_rotation, .fini = teardown,
     .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 4);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 4, 5000), 4);
  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 4, "B accepts the old secret in its window");
  for (uint64_t v = 1; v <= 4; v++) load_check(b, v);
  store_chain(b, 11, 12);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_writes_total{result=\"ok\"}", 2, 5000), 2);
  cr_assert_eq(lookup(a, 11, 12, t, NULL), 0, "A does not have B's new secret");
  cr_assert_eq(metric(&na, "kvcached_g4_misses_total{reason=\"mac\"}"), 2);
  kvc_close(a);
  kvc_close(b);
}

/* G4 without a key file, or with one others can read, does not start
 * (status 2: the configuration check); no cluster needed. */
Test(daemon_g4, no_valid_key_file_no_start, .timeout = 60) {
  make_keys();
  snprintf(seeds, sizeof seeds, "127.0.0.1:1");
  static const struct {
    const char *key, *extra, *what;
  } bad[] = {
      {NULL, NULL, "no key file"},
      {"world", NULL, "a world-readable key file"},
      {"missing", NULL, "a missing key file"},
      {"k1", "g4.old_key_file=k2", "an old key without the end of its window"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvt_daemon d;
    cr_assert_eq(run_node(&d, bad[i].key, bad[i].extra, NULL), 2, "%s", bad[i].what);
    kvt_daemon_free(&d);
  }
  kvt_daemon d;
  cr_assert_eq(run_node(&d, "k1", NULL, NULL), 0, "a valid key file: it starts");
  cr_assert_eq(kvt_daemon_stop(&d), 0);
  kvt_daemon_free(&d);
  kvt_rmtree(keydir);
}

/* g4.admit = second-use: a block is written when a LOAD uses it again, not
 * at its commit, and once. */
static void setup_second_use(void) {
  make_keys();
  start_cluster();
  start_node_with(&na, "g4.admit=second-use");
  start_node(&nb);
}

Test(daemon_g4, second_use_admission, .init = setup_second_use, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 4);
  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 0, "used once: not written");
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 0);
  for (uint64_t v = 1; v <= 4; v++) load_check(a, v); /* the second use */
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 4, 5000), 4);
  for (uint64_t v = 1; v <= 4; v++) load_check(a, v); /* a third: not written again */
  usleep(100000);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 4);
  usleep(300000); /* B's first LOOKUP found key 1 absent: not asked again within absent_ms */
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 4);
  for (uint64_t v = 1; v <= 4; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* g4.admit = second-use and blocks back soon after their eviction: a block
 * the policy remembers as a recent victim (adapt keeps the keys it offered)
 * is on its second use at its new commit (hits 2), so it is written then;
 * a LOAD after it takes its count past 2 and writes nothing, so without
 * that it would never reach G4. The others are written at their LOAD. */
Test(daemon_g4, second_use_counts_a_return_after_eviction, .init = setup_second_use,
     .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 4);
  /* 4 MiB of G2 is 64 blocks: 8 chains of 16 push 1..4, the oldest used
   * once, out (G3 is off: they are gone, and remembered) */
  for (uint64_t c = 0; c < 8; c++) store_chain(a, 1000 + c * 100, 1000 + c * 100 + 15);
  uint8_t t[64];
  cr_assert_eq(lookup(a, 1, 4, t, NULL), 0, "1..4 were evicted");
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 0, "all used once");
  store_chain(a, 1, 4); /* back */
  long long w = wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 1, 5000);
  cr_assert(w >= 1 && w <= 4, "the remembered ones written at their commit: %lld", w);
  for (uint64_t v = 1; v <= 4; v++) load_check(a, v); /* the others' second use */
  w = wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 4, 5000);
  cr_assert_eq(w, 4, "each block written once: %lld", w);
  for (uint64_t v = 1; v <= 4; v++) load_check(a, v);
  usleep(100000);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 4, "and only once");
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 4);
  for (uint64_t v = 1; v <= 4; v++) load_check(b, v);
  kvc_close(a);
  kvc_close(b);
}

/* A block's write starts a turn or more after its commit (the pump) and
 * its value is signed off the loop before its SET goes out. A DELETE of
 * the block that comes meanwhile - here a PUT and a DELETE of one key in
 * one write, handled in one turn of the loop - must cancel that SET: sent
 * after the DEL, it would bring the deleted block back into the cluster
 * for every node. The write is not started (gone: the block left G2
 * first) or, started, is skipped. */
Test(daemon_g4, a_delete_while_the_value_is_signed_cancels_its_write, .init = setup,
     .fini = teardown, .timeout = 60) {
  cr_assert_eq(wait_metric(&na, "kvcached_g4_state{state=\"ok\"}", 1, 10000), 1);
  int fd = ops_raw_worker(na.sock, "t1");
  static uint8_t data[OPS_BLOCK];
  fill(data, 77);
  kvc_key k = KC(77);
  kv_buf b;
  kv_buf_init(&b);
  kv_msg put = {.op = KV_OP_PUT, .id = 2};
  put.put = (kv_put_req){.prio = 128, .key = {k.b, k.len}, .data = {data, OPS_BLOCK}};
  cr_assert_eq(kv_msg_encode(&b, &put), 0);
  kv_msg del = {.op = KV_OP_DELETE, .id = 3};
  del.batch = (kv_batch_req){.keys = {.p = k.b, .n = 1, .klen = k.len}};
  cr_assert_eq(kv_msg_encode(&b, &del), 0);
  cr_assert_eq(send(fd, b.p, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
  kv_buf_free(&b);
  kv_reader rd;
  kv_frame f;
  kv_reader_init(&rd, 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(kv_reader_recv(&rd, fd, &f, 3000), 1);
    kv_msg rep;
    cr_assert_eq(kv_msg_decode(f.p, f.len, &rep), 0);
    cr_assert_neq(rep.op, KV_OP_ERROR, "reply %d: %d", i, rep.status);
  }
  kv_reader_free(&rd);
  close(fd);
  cr_assert_geq(wait_metric(&na, "kvcached_g4_deletes_total{result=\"ok\"}", 1, 5000), 1);
  long long skipped = 0, ok = 0, gone = 0;
  for (int t = 0; t < 500 && skipped + ok + gone == 0; t++) { /* the write's end */
    usleep(10000);
    skipped = metric(&na, "kvcached_g4_writes_total{result=\"skipped\"}");
    gone = metric(&na, "kvcached_g4_writes_total{result=\"gone\"}");
    ok = metric(&na, "kvcached_g4_writes_total{result=\"ok\"}");
  }
  usleep(300000); /* a SET sent after the DEL would be in by now */
  assert_not_in_cluster(77, "the deleted block is back in the cluster");
  cr_assert_eq(skipped + gone, 1, "the write cancelled by the DELETE counts as skipped or gone "
               "(ok %lld)", ok);
  cr_assert_eq(metric(&na, "kvcached_g4_writes_total{result=\"ok\"}"), 0);
}

/* A block whose bytes in G2 no longer match its commit's CRC (here: a
 * commit with another CRC, as a worker that wrote the slot after taking
 * it) is not signed into G4: counted as corrupt, nothing in the cluster,
 * and another node misses it. The good blocks around it go as usual. */
Test(daemon_g4, a_block_that_fails_its_crc_is_not_written, .init = setup, .fini = teardown,
     .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 90, 90);
  kvc_key k = KC(91), parent = KC(90);
  kvc_block out;
  cr_assert_eq(kvc_alloc(a, KVC_G2, 128, &k, &parent, 1, &out), 1);
  fill(out.ptr, 91);
  uint32_t wrong = kv_crc32c(0, out.ptr, out.length) ^ 1;
  cr_assert_eq(kvc_commit_crc(a, &k, &wrong, 1, NULL), 1);
  store_chain(a, 92, 92);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"corrupt\"}", 1, 5000), 1);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 2, 5000), 2);
  assert_not_in_cluster(91, "the corrupt block reached the cluster");
  uint8_t t[4];
  cr_assert_eq(lookup(b, 90, 92, t, NULL), 1, "B's run ends where the corrupt block is");
  kvc_close(a);
  kvc_close(b);
}

/* --- issue 30: values of 16-bit namespaces stored coded ------------------------ */

static void setup_coded(void) {
  make_keys();
  start_cluster();
  start_node_with(&na, "g4.codec=auto"); /* writes coded; B (off) reads them */
  start_node(&nb);
}

/* The fleet's secret k1, as the nodes hold it: what signs a forgery that
 * only a fleet member (or a bug) could write. */
static void fleet_keys(kv_g4_keys *keys) {
  uint8_t b[32];
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)(i % 3 == 0 ? 0x5e : i % 3 == 1 ? 0xc7 : 0xe7);
  memset(keys, 0, sizeof *keys);
  cr_assert_eq(kv_g4_secret_init(&keys->cur, b, sizeof b), 0);
}

/* A namespace whose dtype is bf16 (every tenant's here) with g4.codec=auto:
 * its values are coded (version 3, fewer bytes than the block), another
 * node without the option reads them back byte for byte; a value whose
 * stored bytes were damaged is a miss (its MAC, then its stored CRC); one
 * signed with the fleet's secret whose stored bytes do not decode to the
 * block is a `decode` miss; neither is ever served. */
Test(daemon_g4, coded_values_are_smaller_and_read_back_exactly, .init = setup_coded,
     .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  store_chain(a, 1, 6);
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 6, 5000), 6);
  cr_assert_eq(metric(&na, "kvcached_g4_codec_blocks_total{result=\"coded\"}"), 6);
  long long blk = metric(&na, "kvcached_g4_codec_bytes_total{side=\"block\"}");
  long long sto = metric(&na, "kvcached_g4_codec_bytes_total{side=\"stored\"}");
  cr_assert_eq(blk, 6 * (long long)OPS_BLOCK);
  cr_assert(sto > 0 && sto < blk, "stored %lld of %lld", sto, blk);
  char name[6][160];
  for (uint64_t v = 1; v <= 6; v++) {
    rkey_of(v, name[v - 1], sizeof name[0]);
    redisReply *r = adm(owner_of(name[v - 1]), "GET %s", name[v - 1]);
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    cr_assert_eq(kv_ld16((const uint8_t *)r->str + 4), KV_G4_VERSION_CODED, "key %llu",
                 (unsigned long long)v);
    cr_assert_lt(r->len, KV_G4_HDR_LEN + OPS_BLOCK, "key %llu stored whole",
                 (unsigned long long)v);
    freeReplyObject(r);
  }
  /* key 4: one byte of its stored bytes flipped (its CRCs left as they are) */
  redisReply *r = adm(owner_of(name[3]), "GET %s", name[3]);
  r->str[KV_G4_HDR_LEN + 40] ^= 0x10;
  redisReply *w = adm(owner_of(name[3]), "SET %s %b", name[3], r->str, r->len);
  freeReplyObject(w);
  freeReplyObject(r);
  uint8_t t[64];
  cr_assert_eq(lookup(b, 1, 6, t, NULL), 3, "the run ends at the damaged key 4");
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"payload_crc\"}"), 1);
  /* all six were asked at once: the five intact ones decoded (5 and 6 then
   * stored as no part of the run: gap) */
  cr_assert_eq(metric(&nb, "kvcached_g4_codec_blocks_total{result=\"decoded\"}"), 5);
  cr_assert_eq(metric(&na, "kvcached_g4_codec_seconds_count{op=\"code\"}"), 6);
  cr_assert_eq(metric(&nb, "kvcached_g4_codec_seconds_count{op=\"decode\"}"), 5,
               "the damaged key 4 is refused before its decoding");
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"gap\"}"), 2);
  for (uint64_t v = 1; v <= 3; v++) load_check(b, v);

  /* key 5: signed with the fleet's secret, stored bytes that decode to
   * another block (key 6's): the decoded CRC is not key 5's */
  kv_g4_keys keys;
  fleet_keys(&keys);
  redisReply *v6 = adm(owner_of(name[5]), "GET %s", name[5]);
  uint32_t sl = kv_ld32((const uint8_t *)v6->str + 88);
  uint8_t *val = malloc(KV_G4_HDR_LEN + sl);
  kv_g4_key k5 = {.len = 8};
  memcpy(k5.ns, v6->str + 24, KV_G4_NS_BYTES);
  kvc_key kc5 = KC(5);
  memcpy(k5.b, kc5.b, kc5.len);
  k5.len = (uint8_t)kc5.len;
  static uint8_t want5[OPS_BLOCK];
  fill(want5, 5);
  cr_assert_eq(kv_g4_encode_hdr_coded(&k5, &keys.cur, v6->str + KV_G4_HDR_LEN, sl, OPS_BLOCK,
                                      kv_crc32c(0, want5, OPS_BLOCK), KV_G4_CODING_PLANES, 0,
                                      val),
               0);
  memcpy(val + KV_G4_HDR_LEN, v6->str + KV_G4_HDR_LEN, sl);
  w = adm(owner_of(name[4]), "SET %s %b", name[4], val, (size_t)(KV_G4_HDR_LEN + sl));
  freeReplyObject(w);
  freeReplyObject(v6);
  free(val);
  cr_assert_eq(lookup_as(1, b, 5, 6, t, NULL), 0, "key 5 does not decode to its block");
  cr_assert_eq(t[1], KVC_G2, "key 6, past the hole, is brought in");
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"decode\"}"), 1);
  load_check(b, 6);
  kvc_key k = KC(5);
  kvc_block blk5;
  cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &blk5), 0, "key 5 is never served");
  for (uint64_t v = 1; v <= 6; v++) load_check(a, v);
  kvc_close(a);
  kvc_close(b);
}

/* --- issue 30: a tenant's cold precision ---------------------------------------- */

static void setup_int8(void) {
  make_keys();
  start_cluster();
  start_node_with(&na, "tenant.t1.cold_precision=int8");
  start_node_with(&nb, "tenant.t1.cold_precision=int8");
}

/* Block v's BF16 elements: finite, of several magnitudes, v's own. */
static void fill_kv(uint8_t *p, uint64_t v) {
  for (uint32_t i = 0; i < OPS_BLOCK / 2; i++) {
    float f = sinf((float)(i * 0.37 + v)) * (float)(1 + (i / 64) % 7) * (i % 61 == 0 ? 9.0f : 1.0f);
    kv_st16(p + 2 * i, kv_f32_bf16(f));
  }
}

/* A tenant with cold_precision = int8: its bf16 blocks go to G4 as INT8
 * codes (version 3, coding 3, 53% of the bytes), under names of their own;
 * a node of the same configuration reads them back within INT8's bound
 * (per token and head: head_dim 64 elements), verified against the CRC of
 * what they decode to; a node that wants them exact never finds them. */
Test(daemon_g4, a_tenants_cold_precision_stores_int8_and_keeps_exact_readers_apart,
     .init = setup_int8, .fini = teardown, .timeout = 60) {
  kvc *a, *b;
  both_ok(&a, &b);
  static uint8_t data[OPS_BLOCK], got[OPS_BLOCK];
  for (uint64_t v = 1; v <= 4; v++) {
    kvc_key k = KC(v), parent = v == 1 ? (kvc_key){0} : KC(v - 1);
    kvc_block out;
    cr_assert_eq(kvc_alloc(a, KVC_G2, 128, &k, &parent, 1, &out), 1);
    fill_kv(out.ptr, v);
    cr_assert_eq(kvc_commit(a, &k, 1, NULL), 1);
  }
  cr_assert_eq(wait_metric(&na, "kvcached_g4_writes_total{result=\"ok\"}", 4, 5000), 4);
  cr_assert_eq(metric(&na, "kvcached_g4_codec_blocks_total{result=\"coded\"}"), 4);
  char name[160];
  rkey_of(2, name, sizeof name);
  redisReply *r = adm(owner_of(name), "GET %s", name);
  cr_assert_eq(kv_ld16((const uint8_t *)r->str + 4), KV_G4_VERSION_CODED);
  cr_assert_eq(r->str[10], KV_G4_CODING_INT8);
  cr_assert_eq(r->str[11], 1, "bf16");
  size_t n = OPS_BLOCK / 2;
  cr_assert_eq(r->len, KV_G4_HDR_LEN + n + 4 * n / 64, "a byte per element, a scale per 64");
  freeReplyObject(r);

  uint8_t t[8];
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 4);
  cr_assert_eq(metric(&nb, "kvcached_g4_codec_blocks_total{result=\"decoded\"}"), 4);
  for (uint64_t v = 1; v <= 4; v++) {
    kvc_key k = KC(v);
    kvc_block blk;
    cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &blk), 1);
    cr_assert_eq(kvc_read(b, &k, &blk, got), 0, "the CRC of the decoded block holds");
    fill_kv(data, v);
    int same = 1;
    for (size_t grp = 0; grp < n / 64; grp++) {
      float amax = 0;
      for (int i = 0; i < 64; i++)
        amax = fmaxf(amax, fabsf(kv_bf16_f32(kv_ld16(data + 2 * (grp * 64 + i)))));
      for (int i = 0; i < 64; i++) {
        float x = kv_bf16_f32(kv_ld16(data + 2 * (grp * 64 + i)));
        float y = kv_bf16_f32(kv_ld16(got + 2 * (grp * 64 + i)));
        same &= x == y;
        cr_assert_leq(fabsf(x - y), amax / 254 * 1.0001f + fabsf(x) / 256 + 1e-30f,
                      "block %llu elem %zu: %g -> %g", (unsigned long long)v, grp * 64 + i, x, y);
      }
    }
    cr_assert(!same, "block %llu came back exact: not through INT8", (unsigned long long)v);
    kvc_release(b, &k, 1, NULL);
  }
  kvc_close(b);

  /* node B again, wanting t1's blocks exact: the INT8 values are not its */
  cr_assert_eq(kvt_daemon_stop(&nb), 0);
  kvt_daemon_free(&nb);
  start_node(&nb);
  cr_assert_eq(wait_metric(&nb, "kvcached_g4_state{state=\"ok\"}", 1, 10000), 1);
  b = worker(&nb, "t1", NULL);
  cr_assert_eq(lookup(b, 1, 4, t, NULL), 0, "an exact reader never gets a lossy block");
  cr_assert_eq(metric(&nb, "kvcached_g4_misses_total{reason=\"absent\"}"), 4,
               "its names hold nothing: the four asked at once are absent");
  kvc_close(a);
  kvc_close(b);
}
