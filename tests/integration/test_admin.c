/* test_admin.c - the operator sockets of a real kvcached: malformed,
 * oversized and abandoned requests, admin routes refused on the stats
 * socket and to a peer without the right credentials, bad query values,
 * and the live changes: g2.capacity shrinking evicts, a policy switch
 * keeps every block, operator pins survive /flush and /evict. */
#include "tests/lib/fixture.h"

#include <pwd.h>
#include <sys/stat.h>

#include "tiers/evict.h"

static void setup(void) { ops_start(NULL, NULL); }
TestSuite(admin, .init = setup, .fini = ops_stop, .timeout = 60);

static char resp[1 << 20];

Test(admin, malformed_request_is_400_and_closed) {
  const char bad[] = "GARBAGE \x01\x02 nonsense\r\n\r\n";
  int st = ops_raw(ops_d.stats, bad, sizeof bad - 1, resp, sizeof resp);
  cr_assert_eq(st, 400, "%s", resp);
  cr_assert(strstr(resp, "malformed request"), "%s", resp);
  cr_assert(strstr(resp, "Connection: close"), "%s", resp);
  /* A bad Content-Length, on the admin socket too. */
  const char bad2[] = "POST /flush HTTP/1.1\r\nContent-Length: xyz\r\n\r\n";
  cr_assert_eq(ops_raw(ops_d.admin, bad2, sizeof bad2 - 1, resp, sizeof resp), 400, "%s", resp);
  /* The daemon still serves. */
  json_t *o = ops_json(ops_d.stats, "GET", "/health", 200);
  cr_assert_str_eq(json_string_value(json_object_get(o, "status")), "ok");
  json_decref(o);
}

Test(admin, oversized_request_is_400) {
  size_t n = 70000;
  char *big = malloc(n + 64);
  int h = snprintf(big, 64, "GET /keys?x=");
  memset(big + h, 'a', n - (size_t)h);
  memcpy(big + n, " HTTP/1.1\r\n\r\n", 14);
  int st = ops_raw(ops_d.stats, big, n + 13, resp, sizeof resp);
  cr_assert_eq(st, 400, "%.300s", resp);
  cr_assert(strstr(resp, "larger than 64 KiB"), "%.300s", resp);
  /* Many headers, together over the limit. */
  size_t off = (size_t)snprintf(big, n, "GET /stats HTTP/1.1\r\n");
  while (off + 600 < n) off += (size_t)snprintf(big + off, n - off, "X-Pad: %0500d\r\n", 0);
  off += (size_t)snprintf(big + off, n - off, "\r\n");
  st = ops_raw(ops_d.stats, big, off, resp, sizeof resp);
  cr_assert_eq(st, 400, "%.300s", resp);
  free(big);
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/health", resp, sizeof resp, NULL), 200);
}

Test(admin, state_changing_routes_are_403_on_the_stats_socket) {
  const char *routes[] = {"/config?name=log.level&value=debug", "/evict?tier=g2", "/flush",
                          "/pin?ns=00000000&keys=00", "/unpin?ns=00000000&keys=00"};
  const char *body;
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(ops_req(ops_d.stats, "POST", routes[i], resp, sizeof resp, &body), 403, "%s: %s",
                 routes[i], body);
    cr_assert(strstr(body, "admin socket"), "%s", body);
  }
  /* The same on the admin socket is served. */
  json_t *o = ops_json(ops_d.admin, "POST", "/flush", 200);
  cr_assert_eq(ops_num(o, "dropped"), 0);
  json_decref(o);
}

Test(admin, peer_without_credentials_is_refused_on_the_admin_socket) {
  if (geteuid() != 0) cr_skip_test("needs root to connect as another user (setuid)");
  struct passwd *pw = getpwnam("nobody");
  if (!pw) cr_skip_test("no user 'nobody' to connect as");
  /* Let that user reach the socket file: the check under test is the
   * daemon's SO_PEERCRED one, not the file mode. */
  chmod(ops_d.dir, 0755);
  chmod(ops_d.admin, 0666);
  chmod(ops_d.stats, 0666);
  pid_t p = fork();
  cr_assert_geq(p, 0);
  if (p == 0) {
    if (setgid(pw->pw_gid) || setuid(pw->pw_uid)) _exit(10);
    char r[4096];
    const char req[] = "POST /flush HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\n\r\n";
    int st = ops_raw(ops_d.admin, req, sizeof req - 1, r, sizeof r);
    if (st != 403) _exit(11);
    if (strstr(r + 12, "HTTP/1.1")) _exit(12); /* closed after the 403: no second answer */
    /* The stats socket serves the same peer. */
    const char ok[] = "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
    if (ops_raw(ops_d.stats, ok, sizeof ok - 1, r, sizeof r) != 200) _exit(13);
    _exit(0);
  }
  int st;
  waitpid(p, &st, 0);
  cr_assert(WIFEXITED(st), "child died");
  cr_assert_eq(WEXITSTATUS(st), 0,
               "child check %d failed (10 setuid, 11 not 403, 12 not closed, 13 stats)",
               WEXITSTATUS(st));
}

Test(admin, disconnect_mid_request_leaves_the_daemon_serving) {
  const char *partial[] = {"GET /sta", "GET /stats HTTP/1.1\r\nHost: x\r\n",
                           "POST /flush HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789"};
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 3; i++) {
      int fd = kv_sock_connect(i == 2 ? ops_d.admin : ops_d.stats, 0);
      cr_assert_geq(fd, 0);
      send(fd, partial[i], strlen(partial[i]), MSG_NOSIGNAL);
      if (round % 2) shutdown(fd, SHUT_WR); /* half-close first, then go */
      close(fd);
    }
  }
  /* Keep-alive: two requests on one connection, both answered. */
  const char two[] =
      "GET /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
  cr_assert_eq(ops_raw(ops_d.stats, two, sizeof two - 1, resp, sizeof resp), 200);
  char *second = strstr(resp + 12, "HTTP/1.1 200");
  cr_assert_not_null(second, "second pipelined request unanswered: %s", resp);
  json_t *o = ops_json(ops_d.admin, "POST", "/flush", 200); /* the abandoned POST did nothing */
  json_decref(o);
}

Test(admin, bad_query_values_are_400_with_a_clear_error) {
  static const struct {
    const char *method, *target, *sock_admin, *want;
    int status;
  } cases[] = {
      {"GET", "/keys?limit=abc", NULL, "limit", 400},
      {"GET", "/keys?limit=5000", NULL, "limit", 400},
      {"GET", "/keys?tier=g9", NULL, "tier", 400},
      {"GET", "/keys?ns=xyz", NULL, "ns", 400},
      {"GET", "/keys?ns=0123456789abcdef", NULL, "no namespace", 404},
      {"POST", "/evict", "a", "tier: required", 400},
      {"POST", "/evict?tier=g2&count=-1", "a", "count", 400},
      {"POST", "/evict?tier=g3", "a", "no SSD tier", 409},
      {"POST", "/flush?tier=x", "a", "tier", 400},
      {"POST", "/config?name=g2.capacity&value=lots", "a", "not a size", 400},
      {"POST", "/config?name=g2.capacity&value=64M", "a", "reserved at start", 400},
      {"POST", "/config?name=g2.page_size&value=2M", "a", "only on restart", 409},
      {"POST", "/config?name=nope.x&value=1", "a", "no such option", 404},
      {"POST", "/config?name=cache.policy&value=fifo-ish", "a", "unknown policy", 400},
      {"POST", "/config?name=g3.min_prio&value=300", "a", "min_prio", 400},
      {"POST", "/config?name=log.level", "a", "name=SECTION.NAME", 400},
      {"POST", "/config?name=log.level&value=%zz", "a", "escape", 400},
      {"POST", "/pin?keys=00", "a", "ns: required", 400},
      {"POST", "/pin?ns=00000000", "a", "ns", 404},
      {"GET", "/evict?tier=g2", "a", "takes POST", 405},
      {"POST", "/metrics", NULL, "takes GET", 405},
      {"GET", "/nope", NULL, "no route", 404},
  };
  const char *body;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int st = ops_req(cases[i].sock_admin ? ops_d.admin : ops_d.stats, cases[i].method,
                     cases[i].target, resp, sizeof resp, &body);
    cr_expect_eq(st, cases[i].status, "%s %s: %d, wanted %d: %s", cases[i].method, cases[i].target,
                 st, cases[i].status, body);
    cr_expect(strstr(body, "{\"error\":") && strstr(body, cases[i].want), "%s %s: %s",
              cases[i].method, cases[i].target, body);
  }
}

Test(admin, live_g2_capacity_shrink_evicts_down_to_it) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 24); /* 24 x 64 KiB = 1.5 MiB of 2 MiB */
  json_t *o = ops_json(ops_d.admin, "POST", "/config?name=g2.capacity&value=512K", 200);
  cr_assert_eq(ops_num(o, "evicted"), 16);
  cr_assert_str_eq(json_string_value(json_object_get(o, "previous")), "2097152");
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "tiers.g2.used_bytes"), 512 * 1024);
  cr_assert_eq(ops_num(o, "tiers.g2.capacity_bytes"), 512 * 1024);
  cr_assert_eq(ops_num(o, "tiers.g2.evictions"), 16);
  json_decref(o);
  cr_assert_eq(ops_resident(c, 1, 24), 8);
  cr_assert_eq(ops_resident(c, 17, 24), 8, "the most recent blocks stay");
  /* New stores keep to the soft limit. */
  ops_store(c, 25, 28);
  o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "tiers.g2.used_bytes"), 512 * 1024);
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/config", 200);
  cr_assert_str_eq(json_string_value(json_object_get(o, "g2.capacity")), "524288");
  json_decref(o);
  /* Growing back to what was reserved lifts the limit. */
  o = ops_json(ops_d.admin, "POST", "/config?name=g2.capacity&value=2M", 200);
  json_decref(o);
  ops_store(c, 29, 40);
  cr_assert_eq(ops_resident(c, 25, 40), 16);
  kvc_close(c);
}

Test(admin, policy_switch_keeps_every_block) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 20);
  const char *other = kv_evict_policies[1] ? kv_evict_policies[1]->name : NULL;
  cr_assert_not_null(other, "only one eviction policy is compiled in");
  char target[128];
  snprintf(target, sizeof target, "/config?name=cache.policy&value=%s", other);
  json_t *o = ops_json(ops_d.admin, "POST", target, 200);
  cr_assert_str_eq(json_string_value(json_object_get(o, "previous")), kv_evict_default);
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "policy"), "eviction")),
                   other);
  cr_assert_eq(ops_num(o, "tiers.g2.blocks"), 20);
  json_decref(o);
  cr_assert_eq(ops_resident(c, 1, 20), 20);
  /* And they are still evictable under the new policy. */
  o = ops_json(ops_d.admin, "POST", "/evict?tier=g2&count=5", 200);
  cr_assert_eq(ops_num(o, "evicted"), 5);
  json_decref(o);
  cr_assert_eq(ops_resident(c, 1, 20), 15);
  kvc_close(c);
}

Test(admin, operator_pins_survive_flush_and_evict) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 6);
  char ns[65], k1[17], k2[17], target[512];
  ops_ns_hex(ns);
  kvt_key_hex(1, k1);
  kvt_key_hex(2, k2);
  snprintf(target, sizeof target, "/pin?ns=%s&keys=%s,%s,0099", ns, k1, k2);
  json_t *o = ops_json(ops_d.admin, "POST", target, 200);
  cr_assert_eq(ops_num(o, "pinned"), 2);
  cr_assert_eq(ops_num(o, "missing"), 1);
  json_decref(o);
  o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  cr_assert_eq(ops_num(o, "evicted"), 4);
  json_decref(o);
  ops_store(c, 3, 6);
  char nsq[32];
  snprintf(nsq, sizeof nsq, "/flush?ns=%.8s", ns); /* a prefix selects the namespace */
  o = ops_json(ops_d.admin, "POST", nsq, 200);
  cr_assert_eq(ops_num(o, "dropped"), 4);
  json_decref(o);
  cr_assert_eq(ops_resident(c, 1, 2), 2, "pinned blocks went");
  cr_assert_eq(ops_resident(c, 3, 6), 0);
  o = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(o, "pins"), 2);
  json_decref(o);
  snprintf(target, sizeof target, "/unpin?ns=%s&keys=%s,%s", ns, k1, k2);
  o = ops_json(ops_d.admin, "POST", target, 200);
  cr_assert_eq(ops_num(o, "unpinned"), 2);
  json_decref(o);
  o = ops_json(ops_d.admin, "POST", "/flush?tier=g2", 200);
  cr_assert_eq(ops_num(o, "dropped"), 2);
  json_decref(o);
  cr_assert_eq(ops_resident(c, 1, 6), 0);
  kvc_close(c);
}

Test(admin, live_log_level_and_admission) {
  json_t *o = ops_json(ops_d.admin, "POST", "/config?name=log.level&value=error", 200);
  cr_assert_str_eq(json_string_value(json_object_get(o, "previous")), "warn");
  json_decref(o);
  o = ops_json(ops_d.admin, "POST", "/config?name=g3.admit&value=second-use", 200);
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/config", 200);
  cr_assert_str_eq(json_string_value(json_object_get(o, "log.level")), "error");
  cr_assert_str_eq(json_string_value(json_object_get(o, "g3.admit")), "second-use");
  json_decref(o);
}
