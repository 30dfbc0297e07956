/* test_namespaces.c - namespaces are freed when nothing holds them (no
 * session, no block in any tier), limited per tenant, and a namespace
 * belongs to one TP group; against a real kvcached (tests/lib/fixture.h). */
#include "tests/lib/fixture.h"
#include "tests/lib/tmpdir.h"

#include "base/errors.h"

/* A worker of tenant with salt "s<salt>" (salt < 0: none), TP rank/size, group. */
static int open_ns(const char *tenant, int salt, uint16_t rank, uint16_t size, const char *group,
                   kvc **out) {
  char s[16];
  int n = salt < 0 ? 0 : snprintf(s, sizeof s, "s%d", salt);
  kvc_opts o = {.socket_path = ops_d.sock,
                .tenant = tenant,
                .no_g1 = 1,
                .group = group,
                .salt = (const uint8_t *)s,
                .salt_len = (size_t)n,
                .layout = {.block_bytes = OPS_BLOCK,
                           .tokens_per_block = 16,
                           .layers = 2,
                           .kv_heads = 2,
                           .head_dim = 64,
                           .tp_rank = rank,
                           .tp_size = size,
                           .dtype = "bf16"}};
  *out = NULL;
  return kvc_open(&o, out);
}

static kvc *must_open(const char *tenant, int salt) {
  kvc *c;
  int rc = open_ns(tenant, salt, 0, 1, NULL, &c);
  cr_assert_eq(rc, 0, "open %s/s%d: %s", tenant, salt, kvc_strerror(rc));
  return c;
}

/* The daemon sees a close after the client's close() returns: wait until
 * the namespaces come down to want (bounded; the assertion is on the count). */
static long long live_after_closes(long long want) {
  long long live = -1;
  for (int i = 0; i < 500 && live != want; i++) {
    if (i) usleep(10000);
    live = ops_stat("namespaces.live");
  }
  return live;
}

/* Used to happen: 65.5k HELLOs with distinct salts took every namespace
 * for good (KV_NS_MAX), and each new one was refused until a restart. Here
 * more than limits.namespaces_per_tenant (4096) HELLO and close. */
Test(namespaces, hello_close_loops_with_distinct_salts_never_run_out, .timeout = 120) {
  ops_start(NULL, NULL);
  for (int i = 0; i < 5000; i++) {
    kvc *c;
    int rc = open_ns("t", i, 0, 1, NULL, &c);
    cr_assert_eq(rc, 0, "HELLO %d: %s", i, kvc_strerror(rc));
    kvc_close(c);
  }
  cr_assert_eq(live_after_closes(0), 0);
  cr_assert_eq(ops_stat("namespaces.freed"), 5000);
  cr_assert_eq(ops_stat("namespaces.refused.tenant_limit"), 0);
  ops_stop();
}

Test(namespaces, a_tenant_at_its_limit_is_refused_and_does_not_stop_another) {
  const char *const set[] = {"limits.namespaces_per_tenant=4", NULL};
  ops_start("alice,bob", set);
  kvc *a[4], *b[4], *c;
  for (int i = 0; i < 4; i++) a[i] = must_open("alice", i);
  cr_assert_eq(open_ns("alice", 4, 0, 1, NULL, &c), -EDQUOT);
  cr_assert_eq(open_ns("alice", 5, 0, 1, NULL, &c), -EDQUOT);
  kvc *again = must_open("alice", 2); /* an existing namespace is not a new one */
  for (int i = 0; i < 4; i++) b[i] = must_open("bob", i);
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "namespaces.refused.tenant_limit"), 2);
  cr_assert_eq(ops_num(o, "namespaces.live"), 8);
  cr_assert_eq(json_integer_value(
                   json_object_get(json_array_get(json_object_get(o, "tenants"), 0), "namespaces")),
               4);
  json_decref(o);
  static char resp[1 << 20];
  const char *m;
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &m), 200);
  cr_assert(strstr(m, "kvcached_namespaces_refused_total{reason=\"tenant_limit\"} 2\n"), "%s", m);
  /* One of alice's goes (its last session, no block): room for a new one. */
  kvc_close(a[0]);
  cr_assert_eq(live_after_closes(7), 7);
  kvc *a4 = must_open("alice", 4);
  kvc_close(a4);
  kvc_close(again);
  for (int i = 1; i < 4; i++) kvc_close(a[i]);
  for (int i = 0; i < 4; i++) kvc_close(b[i]);
  cr_assert_eq(live_after_closes(0), 0);
  ops_stop();
}

static void store1(kvc *c, uint64_t v) {
  kvc_key k = KC(v), none = {0};
  kvc_block out;
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1);
  memset(out.ptr, (int)v, OPS_BLOCK);
  cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
}

/* A namespace with blocks outlives its sessions (and counts); it is freed
 * once they go too. */
Test(namespaces, blocks_keep_a_namespace_until_they_go) {
  const char *const set[] = {"limits.namespaces_per_tenant=2", NULL};
  ops_start(NULL, set);
  kvc *a = must_open("t", 0);
  store1(a, 7);
  kvc_close(a);
  kvc *b = must_open("t", 1), *c;
  cr_assert_eq(live_after_closes(2), 2);
  cr_assert_eq(open_ns("t", 2, 0, 1, NULL, &c), -EDQUOT, "s0's block keeps it");
  a = must_open("t", 0);
  kvc_key k = KC(7);
  cr_assert_eq(kvc_lookup(a, &k, 1, NULL), 1, "the block is found again");
  cr_assert_eq(kvc_delete(a, NULL, 0), 1);
  kvc_close(a);
  cr_assert_eq(live_after_closes(1), 1);
  c = must_open("t", 2);
  kvc_close(c);
  kvc_close(b);
  ops_stop();
}

/* Blocks that only the SSD holds keep their namespace too, across a
 * restart, and are served when it is made again; namespaces made and
 * freed meanwhile (their ids reused) change nothing. */
Test(namespaces, ssd_blocks_are_found_again_after_namespaces_come_and_go, .timeout = 120) {
  char g3dir[64] = "/tmp/kvops-g3-XXXXXX", g3path[96];
  cr_assert_not_null(mkdtemp(g3dir));
  snprintf(g3path, sizeof g3path, "g3.path=%s", g3dir);
  const char *const set[] = {g3path, "g3.capacity=12M", "g3.block_bytes=64K", "g3.backend=threads",
                             NULL};
  ops_start(NULL, set);
  kvc *a = must_open("t", 0);
  for (uint64_t v = 1; v <= 4; v++) store1(a, v);
  kvc_close(a);
  json_decref(ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200)); /* to the SSD */
  for (int i = 100; i < 200; i++) {                                  /* come and go */
    kvc *c = must_open("t", i);
    kvc_close(c);
  }
  a = must_open("t", 0);
  uint8_t tiers[4];
  kvc_key keys[4] = {KC(1), KC(2), KC(3), KC(4)};
  for (int i = 0; i < 200; i++) { /* the writes to the SSD complete */
    if (kvc_lookup(a, keys, 4, tiers) == 4 && tiers[0] == KVC_G3 && tiers[3] == KVC_G3) break;
    usleep(10000);
  }
  cr_assert_eq(tiers[0], KVC_G3);
  kvc_close(a);
  /* A restart: the namespace comes back from the SSD alone. */
  ops_stop();
  ops_start(NULL, set);
  for (int i = 200; i < 300; i++) {
    kvc *c = must_open("t", i);
    kvc_close(c);
  }
  a = must_open("t", 0);
  kvc_block out[4];
  cr_assert_eq(kvc_load(a, KVC_G2, keys, 4, out), 4);
  for (int i = 0; i < 4; i++) cr_assert_eq(((uint8_t *)out[i].ptr)[0], (uint8_t)(i + 1));
  kvc_close(a);
  ops_stop();
  kvt_rmtree(g3dir);
}

static void store_chain(kvc *c, uint32_t n) {
  kvc_key keys[8], parents[8] = {{0}};
  kvc_block out[8];
  for (uint32_t i = 0; i < n; i++) {
    keys[i] = KC(i + 1);
    if (i) parents[i] = keys[i - 1];
  }
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, keys, parents, n, out), (int)n);
  cr_assert_eq(kvc_commit(c, keys, n, NULL), (int)n);
}

static int hit(kvc *c, uint32_t n) {
  kvc_key keys[8];
  for (uint32_t i = 0; i < n; i++) keys[i] = KC(i + 1);
  return kvc_lookup(c, keys, n, NULL);
}

/* Used to happen: a HELLO naming a second TP group for a namespace was
 * served with the first group's; and groups of one name under different
 * tenant names or salts mixed their ranks. */
Test(namespaces, a_namespace_belongs_to_one_tp_group) {
  ops_start(NULL, NULL);
  kvc *r0, *r1, *x;
  cr_assert_eq(open_ns("t", -1, 0, 2, "g", &r0), 0);
  cr_assert_eq(open_ns("t", -1, 1, 2, "g", &r1), 0);
  store_chain(r0, 3);
  store_chain(r1, 2);
  cr_assert_eq(hit(r0, 3), 2, "the group's length");
  cr_assert_eq(open_ns("t", -1, 0, 2, "h", &x), -EINVAL,
               "rank 0 of 'g' said HELLO as rank 0 of 'h'");
  cr_assert_eq(open_ns("t", -1, 0, 2, NULL, &x), 0,
               "naming no group is that namespace, in its group");
  cr_assert_eq(hit(x, 3), 2);
  kvc_close(x);
  /* Another tenant name, another salt: groups of their own. */
  kvc *u0, *u1, *s0;
  cr_assert_eq(open_ns("u", -1, 0, 2, "g", &u0), 0);
  cr_assert_eq(open_ns("u", -1, 1, 2, "g", &u1), 0);
  store_chain(u0, 1);
  store_chain(u1, 3);
  cr_assert_eq(hit(u1, 3), 1);
  cr_assert_eq(hit(r0, 3), 2, "u's ranks are not t's");
  cr_assert_eq(open_ns("t", 9, 0, 2, "g", &s0), 0);
  store_chain(s0, 3);
  cr_assert_eq(hit(s0, 3), 3, "its group has no rank 1 yet");
  cr_assert_eq(hit(r0, 3), 2);
  /* A namespace with no group joins the one a later HELLO names. */
  kvc *n0, *n1;
  cr_assert_eq(open_ns("v", -1, 0, 2, NULL, &n0), 0);
  store_chain(n0, 3);
  cr_assert_eq(open_ns("v", -1, 1, 2, "g", &n1), 0);
  store_chain(n1, 1);
  kvc *j;
  cr_assert_eq(open_ns("v", -1, 0, 2, "g", &j), 0);
  cr_assert_eq(hit(n0, 3), 1, "rank 0 joined 'g'");
  kvc_close(j);
  kvc_close(n0);
  kvc_close(n1);
  kvc_close(s0);
  kvc_close(u0);
  kvc_close(u1);
  kvc_close(r0);
  kvc_close(r1);
  ops_stop();
}
