/* test_conn_limits.c - the daemon's connection limits. At the descriptor
 * limit a listener used to spin (accept failing with EMFILE on a
 * level-triggered poll: a core at 100%, nothing served); now the waiting
 * connection is accepted with a reserve descriptor and refused, and worker
 * connections are kept within what RLIMIT_NOFILE leaves, so the stats
 * socket keeps answering. Connections per uid and in total are capped, and
 * a connection without a session is closed after limits.hello_timeout_ms. */
#include "tests/lib/fixture.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>

#include "base/errors.h"
#include "daemon/accept.h"
#include "proto/wire.h"

static char resp[1 << 20];

/* A metric's value (the line that starts with `series `); -1 when it is
 * not there, -2 when /metrics does not answer 200. */
static long long metric(const char *series) {
  const char *body;
  if (ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &body) != 200) return -2;
  return kvt_metric_value(body, series);
}

/* Waits (up to 10 s) for a metric to reach want; returns its last value. */
static long long wait_metric(const char *series, long long want) {
  long long v = -1;
  for (int i = 0; i < 500 && (v = metric(series)) != want; i++) usleep(20000);
  return v;
}

/* The daemon's CPU time (user + system), in seconds. */
static double cpu_s(void) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)ops_d.pid);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command may hold spaces */
  cr_assert_not_null(p);
  unsigned long long ut = 0, st = 0;
  /* After ")": state, then fields 4..13, then utime (14) and stime (15). */
  cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st), 2);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int raw_conn(void) {
  int fd = kv_sock_connect(ops_d.sock, 0);
  cr_assert_geq(fd, 0, "connect: %s", strerror(-fd));
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* The next frame on fd: 1 (decoded into *m, the message copied into msg),
 * 0 at end of stream, or a negative error (-EAGAIN: nothing within 5 s). */
static int next_frame(int fd, kv_msg *m, char *msg, size_t cap) {
  uint8_t buf[4096];
  size_t got = 0;
  while (got < KV_HDR_SIZE) {
    ssize_t r = recv(fd, buf + got, KV_HDR_SIZE - got, 0);
    if (r == 0) return got ? KV_EBADFRAME : 0;
    if (r < 0) return -errno;
    got += (size_t)r;
  }
  kv_hdr h;
  int rc = kv_hdr_parse(buf, got, &h);
  if (rc) return rc;
  cr_assert_leq(h.len, sizeof buf - KV_HDR_SIZE);
  while (got < KV_HDR_SIZE + h.len) {
    ssize_t r = recv(fd, buf + got, KV_HDR_SIZE + h.len - got, 0);
    if (r <= 0) return r == 0 ? KV_EBADFRAME : -errno;
    got += (size_t)r;
  }
  rc = kv_msg_decode(buf, got, m);
  if (rc) return rc;
  if (msg && cap) {
    size_t n = m->op == KV_OP_ERROR ? m->error.msg.len : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(msg, m->error.msg.p, n);
    msg[n] = 0;
  }
  return 1;
}

/* Asserts that fd was refused: one ERROR whose message holds `why`, then
 * the end of the stream. */
static void expect_refused(int fd, int32_t status, const char *why) {
  kv_msg m;
  char msg[300];
  int r = next_frame(fd, &m, msg, sizeof msg);
  cr_assert_eq(r, 1, "no refusal frame (%d)", r);
  cr_assert_eq(m.op, KV_OP_ERROR);
  cr_assert_eq(m.status, status, "status %d: %s", m.status, msg);
  cr_assert(strstr(msg, why), "the refusal '%s' does not say '%s'", msg, why);
  r = next_frame(fd, &m, NULL, 0);
  cr_assert(r == 0 || r == -ECONNRESET, "not closed after the refusal (%d)", r);
}

/* Asserts that fd is served: STATUS (allowed before HELLO) is answered. */
static void expect_served(int fd) {
  kv_msg q = {.op = KV_OP_STATUS, .id = 42};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &q), 0);
  cr_assert_eq(send(fd, b.p, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
  kv_buf_free(&b);
  uint8_t big[1 << 16];
  ssize_t n = recv(fd, big, sizeof big, 0);
  cr_assert_geq(n, KV_HDR_SIZE, "no STATUS reply: the connection is not served");
  kv_hdr h;
  cr_assert_eq(kv_hdr_parse(big, (size_t)n, &h), 0);
  cr_assert_eq(h.op, KV_OP_STATUS, "op %u", h.op);
  cr_assert_eq(h.id, 42);
}

/* Every test of a file has the same timeout: Criterion 2.4's runner leaks a
 * timeout record (LeakSanitizer reports it) when tests with different
 * timeouts end in some orders. */
TestSuite(fd_limit, .timeout = 120);
TestSuite(conn_caps, .timeout = 120);
TestSuite(slowloris, .timeout = 120);

/* --- the reserve descriptor ------------------------------------------------------ */

static void say_no(void *arg, int fd) {
  (*(int *)arg)++;
  send(fd, "no\n", 3, MSG_NOSIGNAL | MSG_DONTWAIT);
}

Test(fd_limit, a_listener_out_of_descriptors_is_drained_not_spun_on) {
  char dir[] = "/tmp/kvacc-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  kv_listener l;
  kv_listen_opts lo = {.flags = KV_SOCK_NONBLOCK};
  cr_assert_eq(kv_listen(&l, dir, "t.sock", &lo), 0);
  cr_assert_eq(kvd_fd_reserve_init(), 0);
  int cl[4];
  for (int i = 0; i < 4; i++) cl[i] = kv_sock_connect(l.path, 0);
  for (int i = 0; i < 4; i++) cr_assert_geq(cl[i], 0);
  /* Use every descriptor up, under a low limit. */
  struct rlimit old, low = {128, 128};
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
  low.rlim_max = old.rlim_max;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  int fill[128], nfill = 0;
  for (int fd; nfill < 128 && (fd = open("/dev/null", O_RDONLY)) >= 0;) fill[nfill++] = fd;
  /* What used to happen: accept fails, and the connection stays waiting,
   * so a level-triggered poll reports it again at once. */
  int plain1 = kv_sock_accept(l.fd, KV_SOCK_NONBLOCK);
  int plain2 = kv_sock_accept(l.fd, KV_SOCK_NONBLOCK);
  /* With the reserve: each waiting connection is taken and refused. */
  int refused = 0, rc[4], shed[4];
  for (int i = 0; i < 3; i++) rc[i] = kvd_accept(l.fd, NULL, say_no, &refused, &shed[i]);
  /* Without a reserve to spend nothing is taken: the caller pauses. */
  kvd_fd_reserve_fini();
  int refill[1 + KVD_FD_OPS_RESERVE], nrefill = 0; /* the slots the reserves held */
  while (nrefill < 1 + KVD_FD_OPS_RESERVE && (refill[nrefill] = open("/dev/null", O_RDONLY)) >= 0)
    nrefill++;
  rc[3] = kvd_accept(l.fd, NULL, say_no, &refused, &shed[3]);
  for (int i = 0; i < nrefill; i++) close(refill[i]);
  for (int i = 0; i < nfill; i++) close(fill[i]);
  setrlimit(RLIMIT_NOFILE, &old);

  cr_assert_eq(plain1, -EMFILE);
  cr_assert_eq(plain2, -EMFILE, "the connection was not left waiting");
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(rc[i], -EMFILE, "accept %d: %d", i, rc[i]);
    cr_assert_eq(shed[i], 1);
    char buf[8] = {0};
    cr_assert_eq(recv(cl[i], buf, sizeof buf, 0), 3);
    cr_assert_str_eq(buf, "no\n");
    cr_assert_eq(recv(cl[i], buf, sizeof buf, 0), 0, "refused, then closed");
  }
  cr_assert_eq(refused, 3);
  cr_assert_eq(nrefill, 1 + KVD_FD_OPS_RESERVE);
  cr_assert_eq(rc[3], -EMFILE);
  cr_assert_eq(shed[3], 0, "a connection was taken without a reserve");
  /* The fourth still waits, and is accepted once descriptors are back. */
  int fd = kvd_accept(l.fd, NULL, NULL, NULL, NULL);
  cr_assert_geq(fd, 0);
  cr_assert_eq(kvd_accept(l.fd, NULL, NULL, NULL, NULL), -EAGAIN);
  close(fd);
  for (int i = 0; i < 4; i++) close(cl[i]);
  kv_listener_close(&l);
  rmdir(dir);
}

/* The operator sockets' listeners spend the descriptors kept for them: at
 * the limit their waiting connections are accepted and served, one per
 * reserved descriptor, and the pool fills again when descriptors come back. */
Test(fd_limit, operator_listeners_are_served_from_their_reserved_descriptors) {
  char dir[] = "/tmp/kvacc-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  kv_listener l;
  kv_listen_opts lo = {.flags = KV_SOCK_NONBLOCK};
  cr_assert_eq(kv_listen(&l, dir, "t.sock", &lo), 0);
  cr_assert_eq(kvd_fd_reserve_init(), 0);
  cr_assert_eq(kvd_fd_ops_held(), KVD_FD_OPS_RESERVE);
  enum { C = KVD_FD_OPS_RESERVE + 2 };
  int cl[C];
  for (int i = 0; i < C; i++) cr_assert_geq(cl[i] = kv_sock_connect(l.path, 0), 0);
  struct rlimit old, low = {128, 128};
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
  low.rlim_max = old.rlim_max;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  int fill[128], nfill = 0;
  for (int fd; nfill < 128 && (fd = open("/dev/null", O_RDONLY)) >= 0;) fill[nfill++] = fd;
  int got[C], shed[C], refused = 0;
  for (int i = 0; i < C; i++) got[i] = kvd_accept(l.fd, kvd_fd_ops_room, say_no, &refused, &shed[i]);
  unsigned held_at_limit = kvd_fd_ops_held();
  for (int i = 0; i < KVD_FD_OPS_RESERVE; i++)
    if (got[i] >= 0) close(got[i]);
  kvd_fd_ops_refill();
  unsigned held_after = kvd_fd_ops_held();
  for (int i = 0; i < nfill; i++) close(fill[i]);
  setrlimit(RLIMIT_NOFILE, &old);
  for (int i = 0; i < KVD_FD_OPS_RESERVE; i++) {
    cr_assert_geq(got[i], 0, "connection %d at the limit: %d", i, got[i]);
    cr_assert_eq(shed[i], 0);
  }
  cr_assert_eq(held_at_limit, 0);
  /* The pool spent, the next is refused with the other reserve. */
  cr_assert_eq(got[KVD_FD_OPS_RESERVE], -EMFILE);
  cr_assert_eq(shed[KVD_FD_OPS_RESERVE], 1);
  cr_assert_eq(held_after, KVD_FD_OPS_RESERVE, "the pool did not fill again");
  kvd_fd_reserve_fini();
  for (int i = 0; i < C; i++) close(cl[i]);
  kv_listener_close(&l);
  rmdir(dir);
}

/* More worker connections than the daemon has descriptors: those past what
 * RLIMIT_NOFILE leaves are refused with the reason, the stats socket keeps
 * answering, the daemon does not spin, and a worker gets in once others
 * have gone. */
Test(fd_limit, workers_past_the_descriptor_limit_are_refused_and_health_answers) {
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < 512) {
    rl.rlim_cur = rl.rlim_max < 512 ? rl.rlim_max : 512;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 512)
    cr_skip_test("this test needs 512 descriptors (hard limit %llu)",
                 (unsigned long long)rl.rlim_max);
  ops_nofile = 256;
  ops_start(NULL, NULL);
  long long cap = metric("kvcached_connections_limit{socket=\"worker\"}");
  cr_assert(cap > 0 && cap < 256, "the worker limit is %lld under RLIMIT_NOFILE 256", cap);
  enum { N = 300 };
  static int fds[N];
  for (int i = 0; i < N; i++) fds[i] = raw_conn();
  long long refused = wait_metric(
      "kvcached_connections_refused_total{socket=\"worker\",reason=\"fd_limit\"}", N - cap);
  cr_assert_eq(refused, N - cap);
  cr_assert_eq(metric("kvcached_sessions"), cap);
  /* Saturated: the daemon idles, and the stats socket answers. */
  double c0 = cpu_s();
  usleep(1000000);
  double used = cpu_s() - c0;
  cr_assert_lt(used, 0.5, "the daemon used %.2f s of CPU in 1 s at its descriptor limit", used);
  for (int i = 0; i < 5; i++) {
    json_t *o = ops_json(ops_d.stats, "GET", "/health", 200);
    json_decref(o);
  }
  expect_refused(fds[N - 1], -EAGAIN, "RLIMIT_NOFILE");
  expect_served(fds[0]);
  kvc_opts o = {
      .socket_path = ops_d.sock,
      .tenant = "t",
      .layout = {.block_bytes = OPS_BLOCK, .tokens_per_block = 16, .tp_size = 1, .dtype = "bf16"}};
  kvc *c = NULL;
  cr_assert_eq(kvc_open(&o, &c), -EAGAIN, "a worker got in past the limit");
  for (int i = 0; i < 10; i++) close(fds[i]);
  int rc = -EAGAIN;
  for (int i = 0; i < 250 && rc == -EAGAIN; i++)
    if ((rc = kvc_open(&o, &c)) == -EAGAIN) usleep(20000);
  cr_assert_eq(rc, 0, "no worker got in after others closed: %s", kvc_strerror(rc));
  kvc_close(c);
  for (int i = 10; i < N; i++) close(fds[i]);
  ops_stop();
}

/* Descriptors the daemon has open. */
static int daemon_fds(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)ops_d.pid);
  DIR *d = opendir(path);
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Descriptors run out although the budget said otherwise (here: the limit
 * is lowered under the running daemon): connections past it are accepted
 * with the reserve and refused, the loop idles, and once connections
 * close the daemon serves again. Used to happen: the stats socket was out
 * of descriptors too and /health and /metrics answered 503 for as long as
 * the workers held them; now the operator sockets spend descriptors kept
 * for them, and the worker budget follows the new limit within a second. */
Test(fd_limit, out_of_descriptors_the_daemon_refuses_and_does_not_spin) {
  ops_start(NULL, NULL);
  cr_assert_eq(metric("kvcached_operator_fds_reserved"), KVD_FD_OPS_RESERVE);
  struct rlimit low;
  low.rlim_cur = low.rlim_max = (rlim_t)daemon_fds() + 16;
  cr_assert_eq(prlimit(ops_d.pid, RLIMIT_NOFILE, &low, NULL), 0, "prlimit: %s", strerror(errno));
  enum { N = 64 };
  int fds[N];
  /* A second wave fills what the daemon closed meanwhile (ops_start's probe). */
  for (int i = 0; i < N - 16; i++) fds[i] = raw_conn();
  usleep(200000);
  for (int i = N - 16; i < N; i++) fds[i] = raw_conn();
  /* The last ones were refused at the limit: an ERROR, then the close. */
  expect_refused(fds[N - 1], -EAGAIN, "out of file descriptors");
  double c0 = cpu_s();
  usleep(1000000);
  double used = cpu_s() - c0;
  /* Every descriptor the limit allows is taken, and the operator sockets
   * answer: one reserved descriptor after another. */
  int health[6], metrics_st = ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, NULL);
  for (int i = 0; i < 6; i++) health[i] = ops_req(ops_d.stats, "GET", "/health", resp, sizeof resp, NULL);
  long long budget = -1;
  for (int i = 0; i < 150; i++) { /* the budget is re-read once a second */
    budget = metric("kvcached_connections_limit{socket=\"worker\"}");
    if (budget >= 0 && budget < (long long)low.rlim_cur) break;
    usleep(20000);
  }
  for (int i = 0; i < N; i++) close(fds[i]);
  cr_assert_lt(used, 0.5, "the daemon used %.2f s of CPU in 1 s out of descriptors", used);
  cr_assert_eq(metrics_st, 200, "GET /metrics out of descriptors: %d", metrics_st);
  for (int i = 0; i < 6; i++) cr_assert_eq(health[i], 200, "GET /health #%d out of descriptors: %d", i, health[i]);
  cr_assert(budget >= 0 && budget < (long long)low.rlim_cur,
            "the worker budget (%lld) did not follow RLIMIT_NOFILE lowered to %llu", budget,
            (unsigned long long)low.rlim_cur);
  cr_assert_eq(wait_metric("kvcached_sessions", 0), 0);
  long long refused =
      metric("kvcached_connections_refused_total{socket=\"worker\",reason=\"fd_limit\"}");
  cr_assert(refused >= 1 && refused < N, "refused at the limit: %lld", refused);
  /* Under the new limit there is no room for workers beside what the
   * operator sockets may take: a worker is refused, saying why. */
  int w = raw_conn();
  expect_refused(w, -EAGAIN, "RLIMIT_NOFILE");
  close(w);
  ops_stop();
}

/* --- caps ---------------------------------------------------------------------- */

Test(conn_caps, per_uid_cap_refuses_with_the_reason) {
  const char *extra[] = {"limits.connections_per_uid=3", NULL};
  ops_start(NULL, extra);
  int fds[5];
  for (int i = 0; i < 5; i++) fds[i] = raw_conn();
  for (int i = 0; i < 3; i++) expect_served(fds[i]);
  for (int i = 3; i < 5; i++) expect_refused(fds[i], -EAGAIN, "limits.connections_per_uid");
  cr_assert_eq(metric("kvcached_connections_refused_total{socket=\"worker\",reason=\"per_uid\"}"),
               2);
  close(fds[0]);
  /* Once the daemon has seen the close, the uid may connect again. */
  cr_assert_eq(wait_metric("kvcached_sessions", 2), 2);
  int again = raw_conn();
  expect_served(again);
  close(again);
  for (int i = 1; i < 5; i++) close(fds[i]);
  ops_stop();
}

Test(conn_caps, total_cap_refuses_with_the_reason) {
  const char *extra[] = {"limits.connections=2", NULL};
  ops_start(NULL, extra);
  int a = raw_conn(), b = raw_conn(), c = raw_conn();
  expect_served(a);
  expect_served(b);
  expect_refused(c, -EAGAIN, "limits.connections");
  cr_assert_eq(metric("kvcached_connections_refused_total{socket=\"worker\",reason=\"total\"}"), 1);
  cr_assert_eq(metric("kvcached_connections_limit{socket=\"worker\"}"), 2);
  close(a);
  close(b);
  close(c);
  ops_stop();
}

Test(conn_caps, a_connection_without_hello_is_closed_after_the_timeout) {
  const char *extra[] = {"limits.hello_timeout_ms=500", NULL};
  ops_start(NULL, extra);
  kvc *w = ops_open("t");
  int idle = raw_conn();
  expect_refused(idle, -ETIMEDOUT, "limits.hello_timeout_ms");
  close(idle);
  /* A connection that sends bytes but no HELLO gets no more time. */
  int chatty = raw_conn();
  for (int i = 0; i < 2; i++) {
    expect_served(chatty);
    usleep(50000);
  }
  expect_refused(chatty, -ETIMEDOUT, "limits.hello_timeout_ms");
  close(chatty);
  cr_assert_eq(
      metric("kvcached_connections_closed_total{socket=\"worker\",reason=\"hello_timeout\"}"), 2);
  /* The session that said HELLO long before is still served. */
  char *j = NULL;
  cr_assert_eq(kvc_status(w, &j), 0);
  free(j);
  kvc_close(w);
  ops_stop();
}

/* --- slowloris on the operator sockets ------------------------------------------- */

/* A TCP connection to 127.0.0.1:port, or -errno. */
static int tcp_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

/* One GET /health on a fresh TCP connection: its status, or -1. */
static int tcp_health(int port) {
  int fd = tcp_connect(port);
  if (fd < 0) return -1;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
  char buf[512] = {0};
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  close(fd);
  int st = -1;
  if (n > 0 && sscanf(buf, "HTTP/1.1 %d", &st) != 1) st = -1;
  return st;
}

/* A free TCP port on loopback. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

#define SLOW 300 /* more than the 256 places every operator socket used to have */

/* 1 once the daemon has closed fd (what it said before is read first). */
static int closed_by_daemon(int fd) {
  char buf[512];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
    if (n < 0) return 0;
  }
}

/* SLOW connections (on TCP port `port`, or the Unix stats socket when 0)
 * trickle a request one byte every 100 ms for 2.5 s, past the 1 s request
 * timeout; meanwhile /health is asked on the Unix socket (and over TCP) every
 * round and must answer 200 every time; at the end the daemon has closed
 * every trickling connection. */
static void slowloris(int port) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2 * SLOW) {
    rl.rlim_cur = rl.rlim_max < 2 * SLOW ? rl.rlim_max : 2 * SLOW;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  static int fds[SLOW];
  for (int i = 0; i < SLOW; i++) {
    fds[i] = port ? tcp_connect(port) : kv_sock_connect(ops_d.stats, 0);
    cr_assert_geq(fds[i], 0, "connection %d: %s", i, strerror(-fds[i]));
  }
  static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n";
  char cmd[256];
  snprintf(cmd, sizeof cmd, "%s/kvctl health --live --socket-dir %s >/dev/null 2>&1", KV_BIN_DIR,
           ops_d.dir);
  for (int round = 0; round < 25; round++) {
    for (int i = 0; i < SLOW; i++)
      send(fds[i], req + round % (sizeof req - 1), 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    const char *body;
    int st = ops_req(ops_d.stats, "GET", "/health", resp, sizeof resp, &body);
    cr_assert_eq(st, 200, "round %d: GET /health on the stats socket answered %d", round, st);
    if (port) {
      st = tcp_health(port);
      cr_assert_eq(st, 200, "round %d: GET /health over TCP answered %d", round, st);
    }
    if (round % 8 == 0) cr_assert_eq(system(cmd), 0, "round %d: kvctl health --live failed", round);
    usleep(100000);
  }
  int open = 0;
  for (int i = 0; i < SLOW; i++) {
    open += !closed_by_daemon(fds[i]);
    close(fds[i]);
  }
  cr_assert_eq(open, 0, "%d of %d trickling connections are still open after 2.5 s", open, SLOW);
}

Test(slowloris, on_the_stats_socket_health_always_answers) {
  const char *extra[] = {"stats.request_timeout_ms=1000", NULL};
  ops_start(NULL, extra);
  slowloris(0);
  const char *s = "socket=\"stats\"";
  char q[128];
  snprintf(q, sizeof q, "kvcached_connections_closed_total{%s,reason=\"request_timeout\"}", s);
  cr_assert_gt(metric(q), 0, "none closed by the request timeout");
  snprintf(q, sizeof q, "kvcached_connections_closed_total{%s,reason=\"evicted\"}", s);
  cr_assert_geq(metric(q), SLOW - 64, "fewer evicted than connections past the limit");
  ops_stop();
}

Test(slowloris, over_tcp_does_not_starve_the_unix_socket) {
  int port = free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "stats.listen=127.0.0.1:%d", port);
  const char *extra[] = {"stats.request_timeout_ms=1000", listen, NULL};
  ops_start(NULL, extra);
  slowloris(port);
  cr_assert_gt(
      metric("kvcached_connections_closed_total{socket=\"stats_tcp\",reason=\"request_timeout\"}"),
      0);
  cr_assert_eq(metric("kvcached_connections_closed_total{socket=\"stats\",reason=\"evicted\"}"), 0,
               "TCP clients made Unix socket connections go");
  ops_stop();
}

/* A request that trickles in within the deadline is still served, and the
 * deadline does not move with the bytes. */
Test(slowloris, the_request_deadline_is_absolute) {
  const char *extra[] = {"stats.request_timeout_ms=1500", NULL};
  ops_start(NULL, extra);
  static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  /* Fast enough: one byte every 10 ms (about 0.6 s in all). */
  int fd = kv_sock_connect(ops_d.stats, 0);
  cr_assert_geq(fd, 0);
  for (size_t i = 0; i < sizeof req - 1; i++) {
    cr_assert_eq(send(fd, req + i, 1, MSG_NOSIGNAL), 1);
    usleep(10000);
  }
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512] = {0};
  cr_assert_gt(recv(fd, buf, sizeof buf - 1, 0), 0);
  cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "%s", buf);
  close(fd);
  /* Too slow: a byte every 100 ms would take about 6 s; 408 at 1.5 s. */
  fd = kv_sock_connect(ops_d.stats, 0);
  cr_assert_geq(fd, 0);
  size_t i = 0;
  for (; i < sizeof req - 1; i++) {
    if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) break;
    usleep(100000);
    if (closed_by_daemon(fd)) break;
  }
  cr_assert_lt(i, sizeof req - 1, "the whole request trickled in: the deadline moved");
  close(fd);
  cr_assert_eq(
      metric("kvcached_connections_closed_total{socket=\"stats\",reason=\"request_timeout\"}"), 1);
  ops_stop();
}
