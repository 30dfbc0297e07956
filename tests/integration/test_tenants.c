/* test_tenants.c - tenants bound to credentials: who may act as which
 * tenant ([tenant.NAME] uids and gids, checked at HELLO with SO_PEERCRED
 * and SO_PEERGROUPS), the default single tenant, refusals counted, and each
 * tenant's share of the tiers; against a real kvcached (tests/lib/fixture.h),
 * with workers of other uids forked by this (root) test. */
#include "tests/lib/fixture.h"
#include "tests/lib/tmpdir.h"

#include <grp.h>
#include <sys/stat.h>

#include "base/errors.h"

#define NOBODY   65534u
#define SUPP_GID 4242u /* a supplementary group no user has */

static kvc_opts worker_opts(const char *tenant) {
  kvc_opts o = {.socket_path = ops_d.sock,
                .tenant = tenant,
                .no_g1 = 1,
                .layout = {.block_bytes = OPS_BLOCK,
                           .tokens_per_block = 16,
                           .layers = 2,
                           .kv_heads = 2,
                           .head_dim = 64,
                           .tp_rank = 0,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  return o;
}

/* What a worker running as uid/gid (with supplementary group `sup`, or
 * none when sup is -1) got: kvc_open's result and, when it opened, how many
 * blocks of keys 1..4 it could load. */
typedef struct peer_result {
  int open_rc, loaded;
} peer_result;

static peer_result as_peer(const char *tenant, uid_t uid, gid_t gid, int sup) {
  /* The socket is 0660 in a directory only its owner may enter: let the
   * socket's group (root's) in, as an operator would for a worker group. */
  cr_assert_eq(chmod(ops_d.dir, 0750), 0);
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(p[0]);
    gid_t g = (gid_t)sup;
    peer_result r = {-1000, 0};
    if (setgroups(sup >= 0 ? 1 : 0, &g) || setgid(gid) || setuid(uid)) _exit(3);
    kvc_opts o = worker_opts(tenant);
    kvc *c = NULL;
    r.open_rc = kvc_open(&o, &c);
    if (r.open_rc == 0) {
      kvc_key k[4] = {KC(1), KC(2), KC(3), KC(4)};
      kvc_block b[4];
      r.loaded = kvc_load(c, KVC_G2, k, 4, b);
      kvc_close(c);
    }
    _exit(write(p[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 4);
  }
  close(p[1]);
  peer_result r = {-2000, 0};
  ssize_t n = read(p[0], &r, sizeof r);
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(n == (ssize_t)sizeof r && WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "the worker as uid %u did not report (exit %d)", (unsigned)uid, WEXITSTATUS(st));
  return r;
}

/* Used to work: any process that could reach the socket named itself
 * "alice" in HELLO and read alice's blocks. */
Test(tenants, a_peer_not_listed_for_a_tenant_cannot_act_as_it) {
  const char *const set[] = {"tenant.alice.uids=0", NULL};
  ops_start(NULL, set);
  kvc *a = ops_open("alice");
  ops_store(a, 1, 4);
  peer_result r = as_peer("alice", NOBODY, 0, -1); /* another uid, in the socket's group */
  cr_assert_eq(r.open_rc, -EPERM, "uid %u opened alice's session: %s", NOBODY,
               kvc_strerror(r.open_rc));
  cr_assert_eq(r.loaded, 0);
  cr_assert_eq(ops_stat("hello_refused.not_allowed"), 1);
  /* Alice's own worker goes on. */
  kvc_key k = KC(1);
  cr_assert_eq(kvc_lookup(a, &k, 1, NULL), 1);
  kvc_close(a);
  ops_stop();
}

/* Used to work: with g2.tenants = 2, one HELLO naming "squatter" bound an
 * arena to that name and locked a real tenant out until restart. */
Test(tenants, a_tenant_nobody_configured_gets_no_arena) {
  ops_start("alice,bob", NULL);
  kvc_opts o = worker_opts("squatter");
  kvc *c = NULL;
  for (int i = 0; i < 3; i++) cr_assert_eq(kvc_open(&o, &c), -EPERM);
  kvc *a = ops_open("alice"), *b = ops_open("bob");
  ops_store(a, 1, 2);
  kvc_key k = KC(1);
  cr_assert_eq(kvc_lookup(b, &k, 1, NULL), 0, "bob saw alice's block");
  json_t *o2 = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o2, "hello_refused.unknown_tenant"), 3);
  json_t *ts = json_object_get(o2, "tenants");
  cr_assert_eq(json_array_size(ts), 2, "one arena per configured tenant, none for the squatter");
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ts, 0), "name")), "alice");
  cr_assert_eq(json_integer_value(json_object_get(json_array_get(ts, 0), "g2_capacity_bytes")),
               1 << 20);
  json_decref(o2);
  static char resp[1 << 20];
  const char *m;
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &m), 200);
  cr_assert(strstr(m, "kvcached_hello_refused_total{reason=\"unknown_tenant\"} 3\n"), "%s", m);
  kvc_close(a);
  kvc_close(b);
  ops_stop();
}

Test(tenants, gids_admit_the_peers_primary_and_supplementary_groups) {
  char g[64];
  snprintf(g, sizeof g, "tenant.workers.gids=%u", SUPP_GID);
  const char *const set[] = {g, "tenant.ops.gids=0", "tenant.root-only.uids=0", NULL};
  ops_start(NULL, set);
  cr_assert_eq(as_peer("workers", NOBODY, 0, (int)SUPP_GID).open_rc, 0, "a supplementary group");
  cr_assert_eq(as_peer("workers", NOBODY, 0, -1).open_rc, -EPERM, "without that group");
  cr_assert_eq(as_peer("ops", NOBODY, 0, -1).open_rc, 0, "the primary group");
  cr_assert_eq(as_peer("ops", NOBODY, NOBODY, -1).open_rc, -EACCES,
               "outside the socket's group the socket itself refuses");
  cr_assert_eq(as_peer("root-only", NOBODY, 0, (int)SUPP_GID).open_rc, -EPERM);
  cr_assert_eq(ops_stat("hello_refused.not_allowed"), 2);
  ops_stop();
}

Test(tenants, uid_0_is_not_implied) {
  char u[64];
  snprintf(u, sizeof u, "tenant.alice.uids=%u", NOBODY);
  const char *const set[] = {u, NULL};
  ops_start(NULL, set);
  kvc_opts o = worker_opts("alice");
  kvc *c = NULL;
  cr_assert_eq(getuid(), 0, "this test runs as root");
  cr_assert_eq(kvc_open(&o, &c), -EPERM, "root acted as a tenant that does not list uid 0");
  cr_assert_eq(as_peer("alice", NOBODY, 0, -1).open_rc, 0);
  ops_stop();
}

/* No [tenant.NAME] section: one tenant, one arena; every peer that can
 * reach the socket acts as it, and tenant names still keep blocks apart. */
Test(tenants, without_sections_every_peer_is_the_one_default_tenant) {
  ops_start(NULL, NULL);
  kvc *a = ops_open("alice");
  ops_store(a, 1, 4);
  peer_result r = as_peer("alice", NOBODY, 0, -1);
  cr_assert_eq(r.open_rc, 0);
  cr_assert_eq(r.loaded, 4, "the same tenant name is the same namespace");
  r = as_peer("mallory", NOBODY, 0, -1);
  cr_assert_eq(r.open_rc, 0);
  cr_assert_eq(r.loaded, 0, "another name is another namespace");
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  json_t *ts = json_object_get(o, "tenants");
  cr_assert_eq(json_array_size(ts), 1);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ts, 0), "name")), "");
  json_decref(o);
  kvc_close(a);
  ops_stop();
}

Test(tenants, g2_tenants_above_1_is_refused_at_start) {
  const char *const set[] = {"g2.tenants=2", NULL};
  cr_assert_eq(ops_try_start(NULL, set), 2, "kvcached started with g2.tenants = 2");
}

Test(tenants, shares_size_each_tenants_arena) {
  const char *const set[] = {"tenant.small.g2_share=25%", "tenant.big.g2_share=1M",
                             "limits.session_share=100", NULL};
  ops_start("small,big,rest", set);
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  json_t *ts = json_object_get(o, "tenants");
  cr_assert_eq(json_array_size(ts), 3);
  long long want[3] = {512 << 10, 1 << 20, 512 << 10}; /* of 2M; the rest to "rest" */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(
        json_integer_value(json_object_get(json_array_get(ts, (size_t)i), "g2_capacity_bytes")),
        want[i], "tenant %d", i);
  json_decref(o);
  kvc *s = ops_open("small");
  kvc_key keys[9];
  kvc_block out[9];
  for (int i = 0; i < 9; i++) keys[i] = KC((uint64_t)i + 1);
  cr_assert_eq(kvc_alloc(s, KVC_G2, 128, keys, NULL, 9, out), 8, "512K holds eight 64K blocks");
  kvc_close(s);
  ops_stop();
}

/* Stores first..first+n-1 (unrelated blocks), retrying keys that wait for
 * G2 room while victims are written to the SSD. */
static void store_retry(kvc *c, uint64_t first, uint32_t n) {
  for (uint64_t v = first; v < first + n; v++) {
    kvc_key k = KC(v), none = {0};
    kvc_block out;
    int r = 0;
    for (int t = 0; t < 400; t++) {
      r = kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out);
      if (r == 1 || (out.status != -EAGAIN && out.status != KV_EALLPINNED)) break;
      usleep(5000);
    }
    cr_assert_eq(r, 1, "alloc %llu: %s", (unsigned long long)v, kvc_strerror(out.status));
    memset(out.ptr, (int)v, OPS_BLOCK);
    cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
  }
}

static json_t *tenant_stats(size_t i) {
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  json_t *t = json_incref(json_array_get(json_object_get(o, "tenants"), i));
  json_decref(o);
  return t;
}

static long long jnum(json_t *o, const char *k) {
  return (long long)json_integer_value(json_object_get(o, k));
}

/* Used to happen: the SSD tier was one pool for everybody, so one tenant
 * storing more than the SSD holds evicted every other tenant's blocks. */
Test(tenants, one_tenant_flooding_the_ssd_stays_within_its_share, .timeout = 120) {
  char g3dir[64] = "/tmp/kvops-g3-XXXXXX", g3path[96];
  cr_assert_not_null(mkdtemp(g3dir));
  snprintf(g3path, sizeof g3path, "g3.path=%s", g3dir);
  const char *const set[] = {g3path,
                             "g3.capacity=12M",
                             "g3.block_bytes=64K",
                             "g3.backend=threads",
                             "tenant.alice.g3_share=25%",
                             NULL};
  ops_start("alice,bob", set);
  json_t *ta = tenant_stats(0), *tb = tenant_stats(1);
  long long share_a = jnum(ta, "g3_share_bytes"), share_b = jnum(tb, "g3_share_bytes");
  json_decref(ta);
  json_decref(tb);
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  long long g3cap = ops_num(o, "tiers.g3.capacity_bytes");
  json_decref(o);
  cr_assert(share_a > 0 && share_a <= g3cap / 4 && share_b >= g3cap * 3 / 4 - (64 << 10),
            "shares %lld and %lld of %lld", share_a, share_b, g3cap);
  kvc *a = ops_open("alice"), *b = ops_open("bob");
  store_retry(b, 1, 40); /* bob's 1M arena holds 16: most go to the SSD */
  uint32_t flood = (uint32_t)(g3cap / OPS_BLOCK) + 64;
  store_retry(a, 10000, flood); /* more than the whole SSD tier */
  /* Every write alice started is done once her share holds still. */
  long long used_a = 0, prev = -1;
  for (int i = 0; i < 200 && used_a != prev; i++) {
    prev = used_a;
    usleep(20000);
    ta = tenant_stats(0);
    used_a = jnum(ta, "g3_used_bytes");
    json_decref(ta);
  }
  cr_assert_eq(ops_resident(b, 1, 40), 40, "alice's flood evicted bob's blocks");
  cr_assert(used_a > 0 && used_a <= share_a, "alice holds %lld bytes of G3, her share is %lld",
            used_a, share_a);
  /* bob's blocks come back from the SSD intact. */
  for (uint64_t v = 1; v <= 40; v++) {
    kvc_key k = KC(v);
    kvc_block out;
    cr_assert_eq(kvc_load(b, KVC_G2, &k, 1, &out), 1, "load %llu: %s", (unsigned long long)v,
                 kvc_strerror(out.status));
    cr_assert_eq(((uint8_t *)out.ptr)[OPS_BLOCK - 1], (uint8_t)v);
    kvc_release(b, &k, 1, NULL);
  }
  kvc_close(a);
  kvc_close(b);
  ops_stop();
  kvt_rmtree(g3dir);
}

/* Blocks found on the SSD at start count against their tenant's share
 * once its namespace says HELLO again: a smaller share then evicts down
 * to it, and what stays is served. */
Test(tenants, ssd_blocks_from_before_a_restart_join_their_tenants_share, .timeout = 120) {
  char g3dir[64] = "/tmp/kvops-g3-XXXXXX", g3path[96];
  cr_assert_not_null(mkdtemp(g3dir));
  snprintf(g3path, sizeof g3path, "g3.path=%s", g3dir);
  const char *const set[] = {g3path,
                             "g3.capacity=12M",
                             "g3.block_bytes=64K",
                             "g3.backend=threads",
                             "tenant.alice.g3_share=50%",
                             NULL};
  ops_start("alice,bob", set);
  kvc *a = ops_open("alice");
  store_retry(a, 1, 60);
  kvc_close(a);
  ops_stop();
  const char *const set2[] = {g3path,
                              "g3.capacity=12M",
                              "g3.block_bytes=64K",
                              "g3.backend=threads",
                              "tenant.alice.g3_share=10%",
                              NULL};
  ops_start("alice,bob", set2);
  json_t *t = tenant_stats(0);
  long long share = jnum(t, "g3_share_bytes");
  cr_assert_eq(jnum(t, "g3_used_bytes"), 0,
               "blocks from before count once their namespace is back");
  json_decref(t);
  a = ops_open("alice");
  t = tenant_stats(0);
  long long used = jnum(t, "g3_used_bytes");
  json_decref(t);
  cr_assert(used > 0 && used <= share,
            "alice holds %lld bytes of G3 after HELLO, her share is %lld", used, share);
  int resident = ops_resident(a, 1, 60);
  cr_assert(resident >= (int)(used / OPS_BLOCK), "%d resident", resident);
  for (uint64_t v = 1; v <= 60; v++) {
    kvc_key k = KC(v);
    kvc_block out;
    if (kvc_load(a, KVC_G2, &k, 1, &out) != 1) continue;
    cr_assert_eq(((uint8_t *)out.ptr)[0], (uint8_t)v);
    kvc_release(a, &k, 1, NULL);
  }
  /* New stores stay within the share, under another eviction policy too. */
  store_retry(a, 1000, 60);
  json_decref(ops_json(ops_d.admin, "POST", "/config?name=cache.policy&value=lru", 200));
  store_retry(a, 2000, 60);
  t = tenant_stats(0);
  used = jnum(t, "g3_used_bytes");
  json_decref(t);
  cr_assert(used > 0 && used <= share, "alice holds %lld bytes of G3, her share is %lld", used,
            share);
  kvc_close(a);
  ops_stop();
  kvt_rmtree(g3dir);
}
