/* test_kvctl_http.c - kvctl's HTTP client (tools/kvctl_http.c) against a
 * peer that answers and closes without reading the request, as the daemon
 * does when it refuses a connection (a 503 at its descriptor limit). */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "tests/lib/tmpdir.h"
#include "tools/kvctl_http.h"

static char dir[64], path[100];
static int lfd = -1;

static const char answer[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    "Content-Length: 27\r\nConnection: close\r\n\r\n{\"error\":\"out of fds now\"}\n";

/* Accepts one connection, lets the client fill the socket with its
 * request, answers without reading any of it, and closes. */
static void *refuser(void *arg) {
  (void)arg;
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) return NULL;
  usleep(200000);
  ssize_t w = send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
  (void)w;
  close(fd);
  return NULL;
}

static void listen_here(void) {
  cr_assert_eq(kvt_mkdtemp(dir, sizeof dir, "kvctl-http"), 0);
  snprintf(path, sizeof path, "%s/s.sock", dir);
  lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(lfd, 4), 0);
}

/* Runs peer on a listener here, and kvctl_http against it with a request
 * larger than the socket holds, so the send is still going when the peer
 * closes. kvctl_http's result. */
static int against(void *(*peer)(void *), kvctl_http_resp *r) {
  listen_here();
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, peer, NULL), 0);
  size_t n = 4u << 20;
  char *target = malloc(n + 2);
  target[0] = '/';
  memset(target + 1, 'a', n);
  target[n + 1] = 0;
  int rc = kvctl_http(path, "GET", target, 5000, r);
  pthread_join(t, NULL);
  free(target);
  close(lfd);
  kvt_rmtree(dir);
  return rc;
}

/* Used to happen: `kvctl health --live` stopped at the failed send
 * ("Broken pipe") and never read the 503 the daemon had sent. */
Test(kvctl_http, an_answer_sent_before_the_close_is_read_although_the_send_failed) {
  kvctl_http_resp r = {0};
  int rc = against(refuser, &r);
  cr_assert_eq(rc, 0, "kvctl_http: %s", strerror(-rc));
  cr_assert_eq(r.status, 503);
  cr_assert_str_eq(r.body, "{\"error\":\"out of fds now\"}\n");
  kvctl_http_resp_free(&r);
}

/* A peer that closes without answering: the send's error, as before. */
static void *closer(void *arg) {
  (void)arg;
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) return NULL;
  usleep(200000);
  close(fd);
  return NULL;
}

Test(kvctl_http, a_close_without_an_answer_is_the_send_error) {
  kvctl_http_resp r = {0};
  int rc = against(closer, &r);
  cr_assert(rc == -EPIPE || rc == -ECONNRESET || rc == -EPROTO, "kvctl_http: %d (%s)", rc,
            strerror(-rc));
}
