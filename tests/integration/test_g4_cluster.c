/* test_g4_cluster.c - the G4 Redis Cluster client against real clusters
 * (tests/lib/redis_cluster.sh, on loopback): hash slots as Redis computes
 * them; binary values on every slot and node; MOVED and ASK during a slot
 * migration; a master killed (errors within the timeout, then the promoted
 * replica serves what was written before, replicated with WAIT); a hung
 * node (timeouts, never a hang); the whole cluster killed (errors, state
 * down) and started again (back by itself); AUTH with a password and an
 * ACL user; callbacks never from inside the submitting call; close with
 * commands in flight. Skips when redis-server is not installed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "base/clock.h"
#include "tests/lib/redis_cluster.h"
#include "tiers/g4_cluster.h"
#include "tiers/g4_format.h"

#define TIMEOUT_MS 500

/* ---- the cluster and admin commands ----------------------------------- */

static kvt_rc rc;
static const char *password; /* of the running cluster, or NULL */

static void start_cluster(const char *opts) {
  int r = kvt_rc_start(&rc, KV_SOURCE_DIR, opts);
  if (r == 77) cr_skip_test("%s", rc.why);
  cr_assert_eq(r, 0, "%s", rc.why);
}

static void stop_cluster(void) { kvt_rc_stop(&rc); }

/* A command on one node (of the running cluster, its password). */
#define adm(port, ...) kvt_rc_adm(port, password, __VA_ARGS__)

static void adm_ok(int port, const char *fmt, const char *a, const char *b) {
  redisReply *r = adm(port, fmt, a, b);
  cr_assert_neq(r->type, REDIS_REPLY_ERROR, "%d: %s", port, r->str);
  freeReplyObject(r);
}

static void node_id(int port, char *out) {
  redisReply *r = adm(port, "CLUSTER MYID");
  cr_assert_eq(r->type, REDIS_REPLY_STRING);
  snprintf(out, 64, "%s", r->str);
  freeReplyObject(r);
}

/* The port of the master serving slot, as the cluster says. */
static int slot_owner(unsigned slot) { return kvt_rc_slot_owner(rc.ports[0], password, slot); }

/* ---- the client, driven synchronously ---------------------------------- */

static uv_loop_t loop;
static int submitting; /* set around kv_g4c_command: no callback may come */

typedef struct res {
  int done;
  kv_g4c_kind kind;
  kv_g4c_reason reason;
  int err;
  char *val;
  size_t len;
  long long integer;
  int64_t at; /* when the callback came */
} res;

static void on_res(kv_g4c *c, const kv_g4c_reply *r, void *arg) {
  res *x = arg;
  cr_assert(!submitting, "a callback from inside kv_g4c_command");
  cr_assert(!x->done, "a second callback for one command");
  x->done = 1;
  x->kind = r->kind;
  x->reason = r->reason;
  x->err = r->err;
  x->integer = r->integer;
  x->at = kv_now_ms();
  cr_assert_eq(r->kind == KV_G4C_ERROR, r->err != 0);
  if (r->str) {
    x->val = malloc(r->len + 1);
    memcpy(x->val, r->str, r->len);
    x->val[r->len] = 0;
    x->len = r->len;
  }
}

static void res_clear(res *x) {
  free(x->val);
  memset(x, 0, sizeof *x);
}

/* Runs the loop until *flag is set or ms pass; whether it was set. */
static int run_until(const int *flag, int ms) {
  int64_t end = kv_now_ms() + ms;
  while (!*flag && kv_now_ms() < end) uv_run(&loop, UV_RUN_ONCE);
  return *flag;
}

static void submit(kv_g4c *c, const void *key, size_t keylen, int argc, const char *const *argv,
                   const size_t *lens, res *x) {
  memset(x, 0, sizeof *x);
  submitting = 1;
  int r = kv_g4c_command(c, key, keylen, 0, argc, argv, lens, on_res, x);
  submitting = 0;
  cr_assert_eq(r, 0);
}

/* One command, waited for (at most the timeout and a margin). */
static void cmd(kv_g4c *c, res *x, const char *key, int argc, const char *const *argv, const size_t *lens) {
  submit(c, key, strlen(key), argc, argv, lens, x);
  cr_assert(run_until(&x->done, TIMEOUT_MS + 1000), "no callback within the timeout");
}

static void set(kv_g4c *c, const char *key, const void *val, size_t len) {
  const char *argv[] = {"SET", key, val};
  size_t lens[] = {3, strlen(key), len};
  res x;
  cmd(c, &x, key, 3, argv, lens);
  cr_assert_eq(x.kind, KV_G4C_VALUE, "SET %s: %s %s", key, kv_g4c_reason_name(x.reason), x.val);
  res_clear(&x);
}

static void get(kv_g4c *c, const char *key, res *x) {
  const char *argv[] = {"GET", key};
  cmd(c, x, key, 2, argv, NULL);
}

static kv_g4c_opts base_opts(const char *const *seeds, unsigned n) {
  kv_g4c_opts o = {.seeds = seeds,
                   .nseeds = n,
                   .timeout_ms = TIMEOUT_MS,
                   .backoff_min_ms = 50,
                   .backoff_max_ms = 400,
                   .password = password};
  return o;
}

static char seed_buf[4][32];
static const char *seeds[4];

static kv_g4c *open_client(int nseeds) {
  for (int i = 0; i < nseeds; i++) {
    snprintf(seed_buf[i], sizeof seed_buf[i], "127.0.0.1:%d", rc.ports[i]);
    seeds[i] = seed_buf[i];
  }
  kv_g4c_opts o = base_opts(seeds, (unsigned)nseeds);
  kv_g4c *c;
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
  return c;
}

static int closed;
static void on_closed(kv_g4c *c, void *arg) { closed++; }

static void close_client(kv_g4c *c) {
  closed = 0;
  kv_g4c_close(c, on_closed, NULL);
  cr_assert(run_until(&closed, 3000), "close callback");
  cr_assert_eq(uv_run(&loop, UV_RUN_NOWAIT), 0, "a handle is left on the loop");
}

static int state_is(kv_g4c *c, kv_g4c_state want, int ms) {
  int64_t end = kv_now_ms() + ms;
  while (kv_g4c_get_state(c) != want && kv_now_ms() < end) uv_run(&loop, UV_RUN_ONCE);
  return kv_g4c_get_state(c) == want;
}

static void setup(void) {
  uv_loop_init(&loop);
  password = NULL;
}

static void teardown(void) {
  stop_cluster();
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
}

/* The secrets G4 values are signed and checked with here. */
static kv_g4_keys g4_keys(void) {
  kv_g4_keys s = {0};
  static const char secret[] = "a secret of 32 bytes, or more...";
  cr_assert_eq(kv_g4_secret_init(&s.cur, (const uint8_t *)secret, 32), 0);
  return s;
}

/* A G4 value (binary, zeros inside) for key name i, into out; its length. */
static size_t g4_value(unsigned i, uint8_t *out, size_t payload) {
  kv_g4_keys secrets = g4_keys();
  kv_g4_key k = {.len = 8};
  memcpy(k.ns, "namespace-digest-of-32-bytes....", 32);
  memcpy(k.b, &i, sizeof i);
  uint8_t p[4096];
  for (size_t j = 0; j < payload; j++) p[j] = (uint8_t)(i * 7 + j * (j & 1));
  return (size_t)kv_g4_encode(&k, &secrets.cur, p, (uint32_t)payload, out);
}

/* ---- without a cluster ------------------------------------------------- */

Test(g4_cluster, crc16_and_hash_tags) {
  cr_assert_eq(kv_g4c_crc16("123456789", 9), 0x31C3);
  /* the examples of the Redis Cluster specification */
  cr_assert_eq(kv_g4c_slot("{user1000}.following", 20), kv_g4c_slot("{user1000}.followers", 20));
  cr_assert_eq(kv_g4c_slot("{user1000}.following", 20), kv_g4c_slot("user1000", 8));
  cr_assert_eq(kv_g4c_slot("foo{}{bar}", 10), kv_g4c_crc16("foo{}{bar}", 10) & 16383);
  cr_assert_eq(kv_g4c_slot("foo{{bar}}zap", 13), kv_g4c_slot("{bar", 4));
  cr_assert_eq(kv_g4c_slot("foo{bar}{zap}", 13), kv_g4c_slot("bar", 3));
  cr_assert_eq(kv_g4c_slot("foo{bar", 7), kv_g4c_crc16("foo{bar", 7) & 16383);
  cr_assert_eq(kv_g4c_slot("a\0{x}", 5), kv_g4c_slot("x", 1));
}

Test(g4_cluster, nothing_listening_fails_fast_from_the_loop, .init = setup, .fini = teardown) {
  const char *dead[] = {"127.0.0.1:1"}; /* a port nothing listens on */
  kv_g4c_opts o = base_opts(dead, 1);
  kv_g4c *c;
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
  res x[20];
  for (int i = 0; i < 20; i++) {
    const char *argv[] = {"GET", "k"};
    submit(c, "k", 1, 2, argv, NULL, &x[i]);
    cr_assert(!x[i].done);
  }
  int64_t t0 = kv_now_ms();
  for (int i = 0; i < 20; i++) {
    cr_assert(run_until(&x[i].done, TIMEOUT_MS + 500));
    cr_assert_eq(x[i].kind, KV_G4C_ERROR);
    cr_assert(x[i].reason == KV_G4C_R_CONN || x[i].reason == KV_G4C_R_DOWN, "%s",
              kv_g4c_reason_name(x[i].reason));
    res_clear(&x[i]);
  }
  cr_assert_lt(kv_now_ms() - t0, TIMEOUT_MS, "refused connections fail at once, not at the timeout");
  cr_assert(state_is(c, KV_G4C_DOWN, 1000));
  /* bad arguments: refused, no callback */
  const char *argv[] = {"GET", "k"};
  cr_assert_eq(kv_g4c_command(c, "k", 0, 0, 2, argv, NULL, on_res, &x[0]), -EINVAL);
  cr_assert_eq(kv_g4c_command(c, "k", 1, 0, 0, argv, NULL, on_res, &x[0]), -EINVAL);
  const char *bad[] = {"nohost"};
  o.seeds = bad;
  kv_g4c *c2;
  cr_assert_eq(kv_g4c_open(&loop, &o, &c2), -EINVAL);
  close_client(c);
  cr_assert_str_eq(kv_g4c_reason_name(KV_G4C_R_TIMEOUT), "timeout");
  cr_assert_str_eq(kv_g4c_state_name(KV_G4C_DEGRADED), "degraded");
}

/* ---- one cluster: values everywhere, redirections ----------------------- */

#define NKEYS KV_G4C_SLOTS
static char keys[NKEYS][16]; /* keys[s] hashes to slot s */

static void keys_for_every_slot(void) {
  unsigned found = 0;
  for (unsigned i = 0; found < NKEYS; i++) {
    char k[16];
    snprintf(k, sizeof k, "k%u", i);
    unsigned s = kv_g4c_slot(k, strlen(k));
    if (!keys[s][0]) {
      memcpy(keys[s], k, sizeof k);
      found++;
    }
  }
}

static res many[NKEYS];

Test(g4_cluster, values_on_every_slot_and_redirections, .init = setup, .fini = teardown, .timeout = 120) {
  start_cluster("--masters 3 --replicas 0");
  kv_g4c *c = open_client(1);

  /* our slots are the server's, tags and binary keys included */
  const char *probe[] = {"a", "kv:00ff", "{tag}x", "x{tag}", "{}x", "a\377\001b", "foo{{bar}}zap"};
  for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
    redisReply *r = adm(rc.ports[0], "CLUSTER KEYSLOT %b", probe[i], strlen(probe[i]));
    cr_assert_eq(r->integer, (long long)kv_g4c_slot(probe[i], strlen(probe[i])), "%s", probe[i]);
    freeReplyObject(r);
  }

  /* one binary value on every slot, all in flight at once */
  keys_for_every_slot();
  static uint8_t vals[NKEYS][KV_G4_HDR_LEN + 64];
  size_t vlen = 0;
  int64_t t0 = kv_now_ms();
  for (unsigned s = 0; s < NKEYS; s++) {
    vlen = g4_value(s, vals[s], 64);
    const char *argv[] = {"SET", keys[s], (const char *)vals[s]};
    size_t lens[] = {3, strlen(keys[s]), vlen};
    submit(c, keys[s], strlen(keys[s]), 3, argv, lens, &many[s]);
  }
  for (unsigned s = 0; s < NKEYS; s++) {
    cr_assert(run_until(&many[s].done, 5000), "SET on slot %u", s);
    cr_assert_eq(many[s].kind, KV_G4C_VALUE, "slot %u: %s %s", s, kv_g4c_reason_name(many[s].reason),
                 many[s].val);
    res_clear(&many[s]);
  }
  for (unsigned s = 0; s < NKEYS; s++) {
    const char *argv[] = {"GET", keys[s]};
    submit(c, keys[s], strlen(keys[s]), 2, argv, NULL, &many[s]);
  }
  kv_g4_key k = {.len = 8};
  memcpy(k.ns, "namespace-digest-of-32-bytes....", 32);
  for (unsigned s = 0; s < NKEYS; s++) {
    cr_assert(run_until(&many[s].done, 5000));
    cr_assert_eq(many[s].kind, KV_G4C_VALUE);
    cr_assert_eq(many[s].len, vlen);
    cr_assert_eq(memcmp(many[s].val, vals[s], vlen), 0, "slot %u", s);
    memcpy(k.b, &s, sizeof s);
    kv_g4_view v;
    kv_g4_keys secrets = g4_keys();
    cr_assert_eq(kv_g4_check(many[s].val, many[s].len, &k, 64, &secrets, 0, &v, NULL), 0);
    res_clear(&many[s]);
  }
  kv_g4c_stats st;
  kv_g4c_get_stats(c, &st);
  cr_log_info("%u SET + GET on every slot: %lld ms", NKEYS, (long long)(kv_now_ms() - t0));
  cr_assert_eq(st.values, 2 * NKEYS);
  cr_assert_eq(st.masters, 3);
  cr_assert_eq(st.slots, KV_G4C_SLOTS);
  cr_assert_eq(st.state, KV_G4C_OK);
  cr_assert_geq(st.bytes_out, (uint64_t)NKEYS * vlen);
  cr_assert_geq(st.bytes_in, (uint64_t)NKEYS * vlen);
  /* every master holds its third */
  for (int i = 0; i < 3; i++) {
    redisReply *r = adm(rc.ports[i], "DBSIZE");
    cr_assert_gt(r->integer, NKEYS / 4, "node %d holds %lld keys", rc.ports[i], r->integer);
    freeReplyObject(r);
  }

  /* absent: nil; a server error: OTHER with its message */
  res x;
  get(c, "no-such-key", &x);
  cr_assert_eq(x.kind, KV_G4C_NIL);
  res_clear(&x);
  const char *incr[] = {"INCR", keys[5]};
  cmd(c, &x, keys[5], 2, incr, NULL);
  cr_assert_eq(x.kind, KV_G4C_ERROR);
  cr_assert_eq(x.reason, KV_G4C_R_OTHER);
  cr_assert_eq(x.err, -EPROTO);
  cr_assert(x.val && strstr(x.val, "not an integer"), "%s", x.val);
  res_clear(&x);

  /* Migrate one slot from its master A to another master B, by hand. */
  unsigned slot = kv_g4c_slot("moving", 6);
  int a = slot_owner(slot), b = a == rc.ports[0] ? rc.ports[1] : rc.ports[0];
  char ida[64], idb[64], sl[8];
  node_id(a, ida);
  node_id(b, idb);
  snprintf(sl, sizeof sl, "%u", slot);
  set(c, "moving", "before", 6);
  kv_g4c_get_stats(c, &st);
  uint64_t moved0 = st.moved; /* the first SETs, sent before the map came, were moved */
  adm_ok(b, "CLUSTER SETSLOT %s IMPORTING %s", sl, ida);
  adm_ok(a, "CLUSTER SETSLOT %s MIGRATING %s", sl, idb);

  /* ASK: a key of the slot that A does not have is B's to take */
  char newkey[32];
  for (unsigned i = 0;; i++) {
    snprintf(newkey, sizeof newkey, "new%u{moving}", i);
    if (kv_g4c_slot(newkey, strlen(newkey)) == slot) break;
  }
  set(c, newkey, "asked", 5);
  get(c, newkey, &x);
  cr_assert_eq(x.kind, KV_G4C_VALUE);
  cr_assert_str_eq(x.val, "asked");
  res_clear(&x);
  kv_g4c_get_stats(c, &st);
  cr_assert_geq(st.ask, 2);
  cr_assert_eq(st.moved, moved0);
  redisReply *r = adm(a, "EXISTS %s", newkey);
  cr_assert_eq(r->integer, 0, "the new key went to B, not A");
  freeReplyObject(r);

  /* the rest of the slot moves; then the slot is B's */
  r = adm(a, "CLUSTER GETKEYSINSLOT %s 1000", sl);
  for (size_t i = 0; i < r->elements; i++) {
    redisReply *m = adm(a, "MIGRATE 127.0.0.1 %d %s 0 5000", b, r->element[i]->str);
    cr_assert_neq(m->type, REDIS_REPLY_ERROR, "%s", m->str);
    freeReplyObject(m);
  }
  freeReplyObject(r);
  for (int i = 0; i < 3; i++) adm_ok(rc.ports[i], "CLUSTER SETSLOT %s NODE %s", sl, idb);

  /* MOVED: the client still thinks A; it follows, and learns */
  get(c, "moving", &x);
  cr_assert_eq(x.kind, KV_G4C_VALUE, "%s %s", kv_g4c_reason_name(x.reason), x.val);
  cr_assert_str_eq(x.val, "before");
  res_clear(&x);
  kv_g4c_get_stats(c, &st);
  cr_assert_eq(st.moved, moved0 + 1);
  get(c, "moving", &x);
  cr_assert_str_eq(x.val, "before");
  res_clear(&x);
  get(c, newkey, &x);
  cr_assert_str_eq(x.val, "asked");
  res_clear(&x);
  kv_g4c_get_stats(c, &st);
  cr_assert_eq(st.moved, moved0 + 1, "the map was updated: no second MOVED");
  cr_assert_eq(st.errors[KV_G4C_R_OTHER], 1);

  /* close with commands in flight: each gets exactly one callback, CLOSED
   * or its answer, before the close callback */
  for (unsigned s = 0; s < 100; s++) {
    const char *argv[] = {"GET", keys[s]};
    submit(c, keys[s], strlen(keys[s]), 2, argv, NULL, &many[s]);
  }
  submitting = 1; /* nothing from inside kv_g4c_close either */
  closed = 0;
  kv_g4c_close(c, on_closed, NULL);
  submitting = 0;
  cr_assert(run_until(&closed, 3000));
  for (unsigned s = 0; s < 100; s++) {
    cr_assert(many[s].done, "command %u had its callback before the close callback", s);
    cr_assert(many[s].kind == KV_G4C_VALUE || many[s].reason == KV_G4C_R_CLOSED);
    res_clear(&many[s]);
  }
  cr_assert_eq(uv_run(&loop, UV_RUN_NOWAIT), 0);
}

/* ---- failover ------------------------------------------------------------ */

#define NF 300

/* Values of many sizes on one connection (one hash tag), their GETs all in flight at
 * once: the rest of a value over 16 KiB is read in one call straight into
 * the reader's buffer (read_rest), at most 2 MiB a call, the small ones
 * and the first 16 KiB of each by hiredis. Every byte comes back. */
Test(g4_cluster, large_values_pipelined_come_back_whole, .init = setup, .fini = teardown,
     .timeout = 120) {
  start_cluster("--masters 3 --replicas 0");
  kv_g4c *c = open_client(1);
  static const size_t sizes[] = {5, 16385, 32769, 300001, 70, 1048583, 3 * 1048576 + 5, 16384};
  enum { N = sizeof sizes / sizeof *sizes };
  static res got[N];
  uint8_t *vals[N];
  char names[N][16];
  for (unsigned i = 0; i < N; i++) {
    vals[i] = malloc(sizes[i]);
    cr_assert_not_null(vals[i]);
    for (size_t j = 0; j < sizes[i]; j++) vals[i][j] = (uint8_t)(j * 31 + i + (j >> 11));
    snprintf(names[i], sizeof names[i], "{big}:%u", i); /* one slot: one connection */
    set(c, names[i], vals[i], sizes[i]);
  }
  for (int round = 0; round < 2; round++) {
    for (unsigned i = 0; i < N; i++) {
      const char *argv[] = {"GET", names[i]};
      submit(c, names[i], strlen(names[i]), 2, argv, NULL, &got[i]);
    }
    for (unsigned i = 0; i < N; i++) {
      cr_assert(run_until(&got[i].done, 10000), "GET %u", i);
      cr_assert_eq(got[i].kind, KV_G4C_VALUE, "GET %u: %s", i,
                   kv_g4c_reason_name(got[i].reason));
      cr_assert_eq(got[i].len, sizes[i], "GET %u: %zu bytes", i, got[i].len);
      cr_assert_eq(memcmp(got[i].val, vals[i], sizes[i]), 0, "GET %u: other bytes", i);
      res_clear(&got[i]);
    }
  }
  for (unsigned i = 0; i < N; i++) free(vals[i]);
  close_client(c);
}

Test(g4_cluster, master_killed_then_replica_serves, .init = setup, .fini = teardown, .timeout = 120) {
  start_cluster("--masters 3 --replicas 1");
  kv_g4c *c = open_client(3);
  char k[NF][16], v[NF][16];
  int owner[NF]; /* before the kill: the victim cannot be asked after it */
  for (int i = 0; i < NF; i++) {
    snprintf(k[i], sizeof k[i], "f%d", i);
    snprintf(v[i], sizeof v[i], "v%d", i * 3);
    set(c, k[i], v[i], strlen(v[i]));
    owner[i] = slot_owner(kv_g4c_slot(k[i], strlen(k[i])));
  }
  /* replicated before the kill: WAIT on each master (routed by a key) */
  int victim = owner[0];
  for (int i = 0; i < 3; i++) {
    const char *key = NULL;
    for (int j = 0; j < NF && !key; j++)
      if (owner[j] == rc.ports[i]) key = k[j];
    cr_assert(key);
    /* WAIT blocks for up to its own timeout: below the client's (a slow
     * replica link then answers 0, and we ask again, up to 10 s) */
    const char *argv[] = {"WAIT", "1", "300"};
    res x = {0};
    int64_t wait_until = kv_now_ms() + 10000;
    do {
      res_clear(&x);
      cmd(c, &x, key, 3, argv, NULL);
      cr_assert_eq(x.kind, KV_G4C_VALUE, "WAIT on %d: reason %d", rc.ports[i], x.reason);
    } while (x.integer != 1 && kv_now_ms() < wait_until);
    cr_assert_eq(x.integer, 1, "the replica of %d has the writes", rc.ports[i]);
    res_clear(&x);
  }
  cr_assert_eq(kv_g4c_get_state(c), KV_G4C_OK);

  /* replica reads: READONLY commands go to replicas once they are connected.
   * CLUSTER SLOTS lists a replica only once it has replicated something, as
   * gossip tells: wait until every node lists all three (the client reads
   * its map from any of them). */
  int64_t until = kv_now_ms() + 10000;
  for (int n = 0; n < rc.nports;) {
    redisReply *r = adm(rc.ports[n], "CLUSTER SLOTS");
    size_t listed = 0;
    for (size_t i = 0; i < r->elements; i++) listed += r->element[i]->elements > 3;
    freeReplyObject(r);
    if (listed == 3) {
      n++;
      continue;
    }
    cr_assert_lt(kv_now_ms(), until, "%d: CLUSTER SLOTS lists %zu replicas", rc.ports[n], listed);
    usleep(50000);
  }
  kv_g4c_opts o = base_opts(seeds, 3);
  o.read_replicas = 1;
  kv_g4c *rd;
  cr_assert_eq(kv_g4c_open(&loop, &o, &rd), 0);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 50; i++) {
      const char *argv[] = {"GET", k[i]};
      res x;
      memset(&x, 0, sizeof x);
      cr_assert_eq(kv_g4c_command(rd, k[i], strlen(k[i]), KV_G4C_READONLY, 2, argv, NULL, on_res, &x), 0);
      cr_assert(run_until(&x.done, TIMEOUT_MS + 1000));
      cr_assert_eq(x.kind, KV_G4C_VALUE, "%s: %s %s", k[i], kv_g4c_reason_name(x.reason), x.val);
      cr_assert_str_eq(x.val, v[i]);
      res_clear(&x);
    }
  closed = 0;
  kv_g4c_close(rd, on_closed, NULL); /* c stays open: its handles remain */
  cr_assert(run_until(&closed, 3000));
  long long replica_gets = 0;
  for (int i = 3; i < 6; i++) {
    redisReply *r = adm(rc.ports[i], "INFO commandstats");
    const char *g = strstr(r->str, "cmdstat_get:calls=");
    if (g) replica_gets += strtoll(g + 18, NULL, 10);
    freeReplyObject(r);
  }
  cr_assert_geq(replica_gets, 90, "replicas served %lld of 150 reads", replica_gets);

  cr_assert_eq(kvt_rc_do(&rc, "kill", victim), 0);
  int64_t t0 = kv_now_ms();
  /* the keys of the dead master: an error each, within the timeout */
  int on_victim = 0;
  for (int i = 0; i < NF && on_victim < 20; i++) {
    if (owner[i] != victim) continue;
    on_victim++;
    res x;
    int64_t t = kv_now_ms();
    get(c, k[i], &x);
    cr_assert(x.kind == KV_G4C_ERROR || x.kind == KV_G4C_VALUE, "never a wrong nil");
    if (x.kind == KV_G4C_VALUE) cr_assert_str_eq(x.val, v[i], "a value is the right one");
    if (x.kind == KV_G4C_ERROR)
      cr_assert_leq(x.at - t, TIMEOUT_MS + 200, "%s after %lld ms", kv_g4c_reason_name(x.reason),
                    (long long)(x.at - t));
    res_clear(&x);
  }
  cr_assert_gt(on_victim, 0);
  kv_g4c_stats st;
  kv_g4c_get_stats(c, &st);
  cr_assert_gt(st.errors[KV_G4C_R_CONN] + st.errors[KV_G4C_R_TIMEOUT] + st.errors[KV_G4C_R_DOWN], 0);

  /* the replica takes over; the client finds it (map refresh) and reads
   * every value written before */
  res x = {0};
  int64_t end = kv_now_ms() + 20000;
  while (kv_now_ms() < end) {
    get(c, k[0], &x);
    if (x.kind == KV_G4C_VALUE) break;
    res_clear(&x);
    run_until(&x.done, 100); /* wait a little: x.done is 0 */
  }
  cr_assert_eq(x.kind, KV_G4C_VALUE, "no new master within 20 s");
  res_clear(&x);
  cr_log_info("failover: served again %lld ms after the kill", (long long)(kv_now_ms() - t0));
  for (int i = 0; i < NF; i++) {
    get(c, k[i], &x);
    cr_assert_eq(x.kind, KV_G4C_VALUE, "%s: %s %s", k[i], kv_g4c_reason_name(x.reason), x.val);
    cr_assert_str_eq(x.val, v[i]);
    res_clear(&x);
  }
  cr_assert(state_is(c, KV_G4C_OK, 5000), "state %s", kv_g4c_state_name(kv_g4c_get_state(c)));
  kv_g4c_get_stats(c, &st);
  cr_assert_eq(st.masters, 3);
  close_client(c);
}

/* ---- a hung node, the whole cluster down and back ----------------------- */

static pid_t node_pid(int port) { return kvt_rc_node_pid(&rc, port); }

Test(g4_cluster, hung_node_and_whole_cluster_down_then_back, .init = setup, .fini = teardown,
     .timeout = 120) {
  start_cluster("--masters 3 --replicas 0");
  kv_g4c *c = open_client(3);
  set(c, "a", "1", 1);

  /* a node that stops answering: TIMEOUT at the deadline, never a hang */
  int hung = slot_owner(kv_g4c_slot("a", 1));
  pid_t pid = node_pid(hung);
  cr_assert_eq(kill(pid, SIGSTOP), 0);
  res x;
  int64_t t = kv_now_ms();
  get(c, "a", &x);
  cr_assert_eq(x.kind, KV_G4C_ERROR);
  cr_assert_eq(x.reason, KV_G4C_R_TIMEOUT);
  cr_assert_eq(x.err, -ETIMEDOUT);
  cr_assert_geq(x.at - t, TIMEOUT_MS - 50);
  cr_assert_leq(x.at - t, TIMEOUT_MS + 200);
  res_clear(&x);
  cr_assert_eq(kill(pid, SIGCONT), 0);
  int64_t end = kv_now_ms() + 5000;
  for (;;) { /* reconnected after its backoff */
    get(c, "a", &x);
    if (x.kind == KV_G4C_VALUE || kv_now_ms() > end) break;
    res_clear(&x);
    run_until(&x.done, 50);
  }
  cr_assert_eq(x.kind, KV_G4C_VALUE, "after SIGCONT: %s", kv_g4c_reason_name(x.reason));
  res_clear(&x);

  /* every node killed: errors, not hangs; state down */
  cr_assert_eq(kvt_rc_do(&rc, "kill-all", 0), 0);
  for (int i = 0; i < 10; i++) {
    char key[8];
    snprintf(key, sizeof key, "d%d", i);
    t = kv_now_ms();
    get(c, key, &x);
    cr_assert_eq(x.kind, KV_G4C_ERROR);
    cr_assert_leq(x.at - t, TIMEOUT_MS + 200);
    res_clear(&x);
  }
  cr_assert(state_is(c, KV_G4C_DOWN, 2000), "state %s", kv_g4c_state_name(kv_g4c_get_state(c)));

  /* started again (nodes.conf kept, data not: no persistence): the client
   * comes back by itself, without traffic */
  for (int i = 0; i < rc.nports; i++) cr_assert_eq(kvt_rc_do(&rc, "start-node", rc.ports[i]), 0);
  cr_assert(state_is(c, KV_G4C_OK, 10000), "state %s", kv_g4c_state_name(kv_g4c_get_state(c)));
  end = kv_now_ms() + 15000;
  int ok = 0;
  while (!ok && kv_now_ms() < end) { /* until the cluster itself says ok */
    const char *argv[] = {"SET", "b", "2"};
    cmd(c, &x, "b", 3, argv, NULL);
    ok = x.kind == KV_G4C_VALUE;
    if (!ok) cr_assert(x.reason == KV_G4C_R_DOWN || x.reason == KV_G4C_R_CONN, "%s", kv_g4c_reason_name(x.reason));
    res_clear(&x);
    if (!ok) run_until(&x.done, 100);
  }
  cr_assert(ok, "SET after the restart");
  get(c, "b", &x);
  cr_assert_str_eq(x.val, "2");
  res_clear(&x);
  close_client(c);
}

/* ---- AUTH ------------------------------------------------------------------ */

Test(g4_cluster, auth_password_and_acl_user, .init = setup, .fini = teardown, .timeout = 120) {
  start_cluster("--masters 3 --replicas 0 --password s3cret");
  password = "s3cret";
  for (int i = 0; i < rc.nports; i++) adm_ok(rc.ports[i], "ACL SETUSER g4 on >%s ~* +@all", "pw2", NULL);

  kv_g4c *c = open_client(1); /* AUTH s3cret */
  set(c, "x", "1", 1);
  res x;
  get(c, "x", &x);
  cr_assert_str_eq(x.val, "1");
  res_clear(&x);
  close_client(c);

  kv_g4c_opts o = base_opts(seeds, 1);
  o.user = "g4";
  o.password = "pw2";
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
  get(c, "x", &x);
  cr_assert_eq(x.kind, KV_G4C_VALUE, "%s %s", kv_g4c_reason_name(x.reason), x.val);
  res_clear(&x);
  close_client(c);

  const char *wrong[] = {NULL, "nope"};
  for (int i = 0; i < 2; i++) {
    o = base_opts(seeds, 1);
    o.password = wrong[i];
    cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
    get(c, "x", &x);
    cr_assert_eq(x.kind, KV_G4C_ERROR);
    cr_assert_eq(x.reason, KV_G4C_R_AUTH, "%s: %s", kv_g4c_reason_name(x.reason), x.val);
    cr_assert_eq(x.err, -EACCES);
    res_clear(&x);
    close_client(c);
  }
  o = base_opts(seeds, 1);
  o.user = "g4";
  o.password = NULL;
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), -EINVAL, "a user without a password");

  /* The least an ACL user needs (README, "The shared tier"): the daemon's
   * commands on its own key names, and nothing else. */
  for (int i = 0; i < rc.nports; i++)
    adm_ok(rc.ports[i],
           "ACL SETUSER kvd on >%s ~kv:* -@all +get +set +del +cluster|slots +readonly +asking",
           "pw3", NULL);
  o = base_opts(seeds, 1);
  o.user = "kvd";
  o.password = "pw3";
  cr_assert_eq(kv_g4c_open(&loop, &o, &c), 0);
  for (int k = 0; k < 32; k++) { /* keys on every master */
    char key[32];
    snprintf(key, sizeof key, "kv:least:%d", k);
    const char *sv[] = {"SET", key, "v", "EX", "60"};
    cmd(c, &x, key, 5, sv, NULL);
    cr_assert_eq(x.kind, KV_G4C_VALUE, "SET %s: %s %s", key, kv_g4c_reason_name(x.reason), x.val);
    res_clear(&x);
    get(c, key, &x);
    cr_assert_str_eq(x.val, "v");
    res_clear(&x);
    const char *dv[] = {"DEL", key};
    cmd(c, &x, key, 2, dv, NULL);
    cr_assert_eq(x.kind, KV_G4C_VALUE, "DEL %s: %s", key, kv_g4c_reason_name(x.reason));
    res_clear(&x);
  }
  kv_g4c_stats st;
  kv_g4c_get_stats(c, &st);
  cr_assert_eq(st.masters, 3, "the slot map was read (CLUSTER SLOTS allowed)");
  get(c, "x", &x); /* not a kv: key: refused */
  cr_assert_eq(x.kind, KV_G4C_ERROR, "a key outside kv:* was served");
  res_clear(&x);
  close_client(c);
}

/* kv_g4c_resp frames a command as hiredis does (byte for byte), and with
 * a hole leaves the argument's place at *hole_at, its framing around it:
 * the daemon builds a value there instead of copying it in. */
Test(g4_resp, frames_as_hiredis_and_leaves_the_hole_in_place) {
  static char val[70000];
  for (size_t i = 0; i < sizeof val; i++) val[i] = (char)(i * 7 + 1);
  const char *argv[] = {"SET", "kv:{ab}x", val, "EX", "86400"};
  size_t lens[] = {3, 8, sizeof val, 2, 5};
  char *ref = NULL;
  int rl = redisFormatCommandArgv(&ref, 5, argv, lens);
  cr_assert_gt(rl, 0);
  size_t n = kv_g4c_resp(NULL, 5, argv, lens, -1, NULL);
  cr_assert_eq(n, (size_t)rl);
  char *out = malloc(n);
  cr_assert_eq(kv_g4c_resp(out, 5, argv, lens, -1, NULL), n);
  cr_assert_eq(memcmp(out, ref, n), 0);
  size_t at = 0;
  memset(out, 0, n);
  cr_assert_eq(kv_g4c_resp(out, 5, argv, lens, 2, &at), n);
  cr_assert_eq(memcmp(out + at - 8, "$70000\r\n", 8), 0, "the hole's length line precedes it");
  for (size_t i = 0; i < sizeof val; i++) cr_assert_eq(out[at + i], 0, "byte %zu written", i);
  memcpy(out + at, val, sizeof val);
  cr_assert_eq(memcmp(out, ref, n), 0, "filled, it is the command");
  const char *nul[] = {"GET", "k"};
  cr_assert_eq(kv_g4c_resp(NULL, 2, nul, NULL, -1, NULL), strlen("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"));
  free(out);
  free(ref);
}
