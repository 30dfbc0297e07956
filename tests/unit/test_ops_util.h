/* test_ops_util.h - shared by test_admin.c and test_stats.c: a kvcached of
 * their own on a private socket directory, raw HTTP over its stats and
 * admin sockets, and blocks stored through libkvclient. */
#ifndef KV_TEST_OPS_UTIL_H
#define KV_TEST_OPS_UTIL_H

#pragma GCC diagnostic ignored "-Wunused-function" /* each test uses a part */

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/kvclient.h"
#include "ipc/sock.h"

#define OPS_BLOCK 65536u

static char ops_dir[64], ops_sock[128], ops_stats[128], ops_admin[128];
static pid_t ops_pid;
static rlim_t ops_nofile; /* when set, the daemon's RLIMIT_NOFILE (soft and hard) */

/* Starts kvcached: G2 2 MiB, G3 off, plus `extra` (--set values,
 * NULL-terminated, may be NULL). tenants: NULL for the one default tenant,
 * or names, comma-separated, each configured ([tenant.NAME]) for this
 * test's own uid, sharing G2 evenly. 0 once it serves; its exit status
 * (> 0; 128 + signal) when it exits before it does, its directory removed. */
static int ops_try_start(const char *tenants, const char *const *extra) {
  snprintf(ops_dir, sizeof ops_dir, "/tmp/kvops-test-XXXXXX");
  cr_assert_not_null(mkdtemp(ops_dir));
  snprintf(ops_sock, sizeof ops_sock, "%s/kvcached.sock", ops_dir);
  snprintf(ops_stats, sizeof ops_stats, "%s/kvcached-stats.sock", ops_dir);
  snprintf(ops_admin, sizeof ops_admin, "%s/kvcached-admin.sock", ops_dir);
  ops_pid = fork();
  cr_assert_geq(ops_pid, 0);
  if (ops_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char *argv[60] = {"kvcached", "--socket-dir", ops_dir, "--g2-capacity", "2M",
                            "--set", "g2.page_size=1M", "--set", "g2.lock=no",
                            "--g3-path", "", "--log-level", "warn"};
    int n = 13;
    static char tset[8][128];
    char names[256];
    snprintf(names, sizeof names, "%s", tenants ? tenants : "");
    char *save = NULL;
    int k = 0;
    for (char *t = strtok_r(names, ",", &save); t && k < 8; t = strtok_r(NULL, ",", &save), k++) {
      snprintf(tset[k], sizeof tset[k], "tenant.%s.uids=%u", t, (unsigned)getuid());
      argv[n++] = "--set";
      argv[n++] = tset[k];
    }
    for (int i = 0; extra && extra[i] && n < 58; i++) {
      argv[n++] = "--set";
      argv[n++] = extra[i];
    }
    argv[n] = NULL;
    struct rlimit rl = {ops_nofile, ops_nofile};
    if (ops_nofile && setrlimit(RLIMIT_NOFILE, &rl)) _exit(126);
    execv(KV_BIN_DIR "/kvcached", (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 250; i++) {
    int fd = kv_sock_connect(ops_admin, 0);
    if (fd >= 0) { close(fd); return 0; }
    int st;
    if (waitpid(ops_pid, &st, WNOHANG) == ops_pid) {
      ops_pid = 0;
      char cmd[128];
      snprintf(cmd, sizeof cmd, "rm -rf %s", ops_dir);
      system(cmd);
      return WIFEXITED(st) ? (WEXITSTATUS(st) ? WEXITSTATUS(st) : 255) : 128 + WTERMSIG(st);
    }
    usleep(20000);
  }
  cr_assert_fail("kvcached neither served nor exited");
  return -1;
}

static void ops_start(const char *tenants, const char *const *extra) {
  int rc = ops_try_start(tenants, extra);
  cr_assert_eq(rc, 0, "kvcached did not start (exit %d)", rc);
}

static void ops_stop(void) {
  if (ops_pid > 0) {
    kill(ops_pid, SIGTERM);
    int st;
    waitpid(ops_pid, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvcached did not stop cleanly");
    ops_pid = 0;
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", ops_dir);
  system(cmd);
}

/* Sends raw bytes on a fresh connection to sock (send errors ignored: the
 * daemon may close first), then reads until the peer closes. Returns the
 * HTTP status of the first response, or -1; the whole answer in resp. */
static int ops_raw(const char *sock, const void *req, size_t n, char *resp, size_t cap) {
  int fd = kv_sock_connect(sock, 0);
  cr_assert_geq(fd, 0, "connect %s: %s", sock, strerror(-fd));
  for (size_t off = 0; off < n;) {
    ssize_t w = send(fd, (const char *)req + off, n - off, MSG_NOSIGNAL);
    if (w <= 0) break;
    off += (size_t)w;
  }
  size_t got = 0;
  for (;;) {
    ssize_t r = recv(fd, resp + got, cap - 1 - got, 0);
    if (r <= 0) break;
    got += (size_t)r;
    if (got == cap - 1) break;
  }
  close(fd);
  resp[got] = 0;
  int status = -1;
  if (sscanf(resp, "HTTP/1.1 %d", &status) != 1) status = -1;
  return status;
}

/* One request with "Connection: close"; *body points into resp (after
 * the headers). Returns the status. */
static int ops_req(const char *sock, const char *method, const char *target, char *resp,
                   size_t cap, const char **body) {
  char req[8192];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: kvcached\r\nConnection: close\r\n\r\n",
                   method, target);
  cr_assert(n > 0 && (size_t)n < sizeof req);
  int st = ops_raw(sock, req, (size_t)n, resp, cap);
  char *b = strstr(resp, "\r\n\r\n");
  if (body) *body = b ? b + 4 : "";
  return st;
}

/* The JSON body of a request that must answer `want`. Caller decrefs. */
static json_t *ops_json(const char *sock, const char *method, const char *target, int want) {
  static char resp[1 << 20];
  const char *body;
  int st = ops_req(sock, method, target, resp, sizeof resp, &body);
  cr_assert_eq(st, want, "%s %s: status %d, wanted %d: %s", method, target, st, want, body);
  json_error_t e;
  json_t *o = json_loads(body, 0, &e);
  cr_assert_not_null(o, "%s %s: not JSON (%s): %s", method, target, e.text, body);
  return o;
}

/* A number inside a JSON object by a dotted path ("tiers.g2.used_bytes"). */
static long long ops_num(json_t *o, const char *path) {
  char p[128];
  snprintf(p, sizeof p, "%s", path);
  json_t *v = o;
  for (char *save = NULL, *k = strtok_r(p, ".", &save); k; k = strtok_r(NULL, ".", &save))
    v = json_object_get(v, k);
  cr_assert(json_is_integer(v), "%s is not a number", path);
  return (long long)json_integer_value(v);
}

/* A worker session of `tenant`; no_g1: it does not offer to import G1. */
/* A worker of `tenant`; no_g1 and g1_uuid as in kvc_opts. */
static kvc *ops_open_on(const char *tenant, int no_g1, const uint8_t *g1_uuid) {
  kvc_opts o = {.socket_path = ops_sock, .tenant = tenant, .no_g1 = no_g1, .g1_uuid = g1_uuid,
                .layout = {.block_bytes = OPS_BLOCK, .tokens_per_block = 16, .layers = 2,
                           .kv_heads = 2, .head_dim = 64, .tp_rank = 0, .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  cr_assert_eq(rc, 0, "kvc_open: %s", kvc_strerror(rc));
  return c;
}

static kvc *ops_open_with(const char *tenant, int no_g1) { return ops_open_on(tenant, no_g1, NULL); }
static kvc *ops_open(const char *tenant) { return ops_open_with(tenant, 0); }

static kvc_key ops_key(uint64_t v) {
  kvc_key k = {.len = 8};
  for (int i = 0; i < 8; i++) k.b[i] = (uint8_t)(v >> (8 * i));
  return k;
}

/* The key's hex, as the routes take it. */
static void ops_key_hex(uint64_t v, char out[17]) {
  kvc_key k = ops_key(v);
  for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", k.b[i]);
}

/* Stores blocks first..last, unrelated (no chain). */
static void ops_store(kvc *c, uint64_t first, uint64_t last) {
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = ops_key(v), none = {0};
    kvc_block out;
    cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1, "alloc %llu", (unsigned long long)v);
    memset(out.ptr, (int)v, OPS_BLOCK);
    cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
  }
}

/* How many of first..last are resident. */
static int ops_resident(kvc *c, uint64_t first, uint64_t last) {
  int n = 0;
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = ops_key(v);
    uint8_t t;
    kvc_lookup(c, &k, 1, &t);
    n += t != KVC_TIER_NONE;
  }
  return n;
}

/* The namespace digest (hex) of the one namespace holding blocks. */
static void ops_ns_hex(char out[65]) {
  json_t *o = ops_json(ops_stats, "GET", "/keys?limit=1", 200);
  json_t *k = json_array_get(json_object_get(o, "keys"), 0);
  cr_assert_not_null(k, "no key to learn the namespace from");
  snprintf(out, 65, "%s", json_string_value(json_object_get(k, "ns")));
  json_decref(o);
}

#endif
