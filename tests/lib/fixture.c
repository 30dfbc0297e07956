/* fixture.c - the criterion fixture of the tests that run kvcached (fixture.h). */
#include "tests/lib/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ipc/reader.h"
#include "proto/wire.h"

kvt_daemon ops_d;
rlim_t ops_nofile;

int ops_try_start(const char *tenants, const char *const *extra) {
  static const char *const args[] = {"--g2-capacity", "2M",         "--set",     "g2.page_size=1M",
                                     "--set",         "g2.lock=no", "--g3-path", "",
                                     "--log-level",   "warn",       NULL};
  const char *sets[32];
  char tset[8][128], names[256];
  int n = 0;
  snprintf(names, sizeof names, "%s", tenants ? tenants : "");
  char *save = NULL;
  for (char *t = strtok_r(names, ",", &save); t && n < 8; t = strtok_r(NULL, ",", &save), n++) {
    snprintf(tset[n], sizeof tset[n], "tenant.%s.uids=%u", t, (unsigned)getuid());
    sets[n] = tset[n];
  }
  for (int i = 0; extra && extra[i] && n < 31; i++) sets[n++] = extra[i];
  sets[n] = NULL;
  kvt_daemon_opts o = {.args = args, .sets = sets, .nofile = ops_nofile};
  int rc = kvt_daemon_start(&ops_d, &o);
  cr_assert_geq(rc, 0, "kvcached neither served nor exited: %s", strerror(-rc));
  return rc;
}

void ops_start(const char *tenants, const char *const *extra) {
  int rc = ops_try_start(tenants, extra);
  cr_assert_eq(rc, 0, "kvcached did not start (exit %d)", rc);
}

void ops_stop(void) {
  cr_expect_eq(kvt_daemon_stop(&ops_d), 0, "kvcached did not stop cleanly");
  kvt_daemon_free(&ops_d);
}

int ops_raw(const char *sock, const void *req, size_t n, char *resp, size_t cap) {
  int st = kvt_http_raw(sock, req, n, resp, cap);
  cr_assert_geq(st, 0, "connect %s: %s", sock, strerror(-st));
  return st ? st : -1;
}

int ops_req(const char *sock, const char *method, const char *target, char *resp, size_t cap,
            const char **body) {
  int st = kvt_http(sock, method, target, resp, cap, body);
  cr_assert_geq(st, 0, "%s %s on %s: %s", method, target, sock, strerror(-st));
  return st ? st : -1;
}

json_t *ops_json(const char *sock, const char *method, const char *target, int want) {
  static char resp[1 << 20];
  const char *body;
  int st = ops_req(sock, method, target, resp, sizeof resp, &body);
  cr_assert_eq(st, want, "%s %s: status %d, wanted %d: %s", method, target, st, want, body);
  json_error_t e;
  json_t *o = json_loads(body, 0, &e);
  cr_assert_not_null(o, "%s %s: not JSON (%s): %s", method, target, e.text, body);
  return o;
}

long long ops_num(json_t *o, const char *path) {
  long long v = 0;
  cr_assert_eq(kvt_json_num(o, path, &v), 0, "%s is not a number", path);
  return v;
}

long long ops_stat(const char *path) {
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  long long v = ops_num(o, path);
  json_decref(o);
  return v;
}

long long ops_metric(const char *series) {
  static char resp[1 << 20];
  const char *body;
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &body), 200);
  return kvt_metric_value(body, series);
}

kvc *ops_open_at(const char *sock, const char *tenant, const char *salt, int no_g1,
                 const uint8_t *g1_uuid) {
  kvc_opts o = {.socket_path = sock,
                .tenant = tenant,
                .salt = salt,
                .salt_len = salt ? strlen(salt) : 0,
                .no_g1 = no_g1,
                .g1_uuid = g1_uuid,
                .layout = {.block_bytes = OPS_BLOCK,
                           .tokens_per_block = 16,
                           .layers = 2,
                           .kv_heads = 2,
                           .head_dim = 64,
                           .tp_rank = 0,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  cr_assert_eq(rc, 0, "kvc_open: %s", kvc_strerror(rc));
  return c;
}

kvc *ops_open_on(const char *tenant, int no_g1, const uint8_t *g1_uuid) {
  return ops_open_at(ops_d.sock, tenant, NULL, no_g1, g1_uuid);
}

kvc *ops_open_with(const char *tenant, int no_g1) { return ops_open_on(tenant, no_g1, NULL); }
kvc *ops_open(const char *tenant) { return ops_open_with(tenant, 0); }

int ops_raw_worker(const char *sock, const char *tenant) {
  int fd = kv_sock_connect(sock, 0);
  cr_assert_geq(fd, 0, "connect %s: %s", sock, strerror(-fd));
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (!tenant) return fd;
  kv_msg m = {.op = KV_OP_HELLO, .id = 1};
  m.hello = (kv_hello_req){.ver_major = KV_PROTO_MAJOR,
                           .ver_minor = KV_PROTO_MINOR,
                           .tenant = {tenant, (uint16_t)strlen(tenant)},
                           .layout = {.block_bytes = OPS_BLOCK,
                                      .tokens_per_block = 16,
                                      .layers = 2,
                                      .kv_heads = 2,
                                      .head_dim = 64,
                                      .tp_size = 1,
                                      .dtype = {"bf16", 4}}};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  struct iovec iov = {b.p, b.len};
  cr_assert_eq(kv_sock_send_frame(fd, &iov, 1, -1, 3000), 0);
  kv_buf_free(&b);
  kv_reader rd;
  kv_frame f;
  kv_reader_init(&rd, 0);
  cr_assert_eq(kv_reader_recv(&rd, fd, &f, 3000), 1);
  kv_msg rep;
  cr_assert_eq(kv_msg_decode(f.p, f.len, &rep), 0);
  cr_assert_eq(rep.op, KV_OP_HELLO, "HELLO refused: %d", rep.status);
  if (f.fd >= 0) close(f.fd);
  if (f.fd2 >= 0) close(f.fd2);
  kv_reader_free(&rd);
  return fd;
}

void ops_store(kvc *c, uint64_t first, uint64_t last) {
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = KC(v), none = {0};
    kvc_block out;
    cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1, "alloc %llu",
                 (unsigned long long)v);
    memset(out.ptr, (int)v, OPS_BLOCK);
    cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
  }
}

int ops_resident(kvc *c, uint64_t first, uint64_t last) {
  int n = 0;
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = KC(v);
    uint8_t t;
    kvc_lookup(c, &k, 1, &t);
    n += t != KVC_TIER_NONE;
  }
  return n;
}

void ops_ns_hex(char out[65]) {
  json_t *o = ops_json(ops_d.stats, "GET", "/keys?limit=1", 200);
  json_t *k = json_array_get(json_object_get(o, "keys"), 0);
  cr_assert_not_null(k, "no key to learn the namespace from");
  snprintf(out, 65, "%s", json_string_value(json_object_get(k, "ns")));
  json_decref(o);
}
