/*
 * kvctl_http.c - kvctl's HTTP/1.1 client over a Unix socket (see
 * kvctl_http.h). The request is written whole, then bytes are fed to
 * http-parser as they come until it reports the message complete, or the
 * peer closes (an EOF is given to the parser too, which ends a response
 * without Content-Length). A daemon that refuses a connection (a 503 at
 * its descriptor limit, a 403) answers and closes without reading the
 * request: the send then fails (EPIPE, ECONNRESET), and the answer is read
 * all the same; the send's error is returned only when none came.
 */
#include "tools/kvctl_http.h"

#include <ctype.h>
#include <errno.h>
#include <http_parser.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hex.h"
#include "ipc/sock.h"

typedef struct rd {
  char *body;
  size_t len, cap;
  int done, err;
} rd;

static int on_body(http_parser *p, const char *at, size_t n) {
  rd *s = p->data;
  if (s->len + n > KVCTL_HTTP_BODY_MAX) {
    s->err = -EMSGSIZE;
    return 1;
  }
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n + 1) cap *= 2;
    char *q = realloc(s->body, cap);
    if (!q) {
      s->err = -ENOMEM;
      return 1;
    }
    s->body = q;
    s->cap = cap;
  }
  memcpy(s->body + s->len, at, n);
  s->len += n;
  return 0;
}

static int on_complete(http_parser *p) {
  ((rd *)p->data)->done = 1;
  return 0;
}

/* Writes all of buf before the deadline. 0 or -errno. */
static int send_all(int fd, const char *buf, size_t n, int64_t deadline) {
  while (n) {
    int rc = kv_sock_wait(fd, POLLOUT, deadline);
    if (rc) return rc;
    ssize_t w = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    buf += w;
    n -= (size_t)w;
  }
  return 0;
}

int kvctl_http(const char *sock_path, const char *method, const char *target, int timeout_ms,
               kvctl_http_resp *r) {
  int64_t deadline = kv_now_ms() + timeout_ms;
  int fd = kv_sock_connect(sock_path, KV_SOCK_NONBLOCK);
  if (fd < 0) return fd;
  char *req = NULL;
  rd s = {0};
  int n = asprintf(&req,
                   "%s %s HTTP/1.1\r\nHost: kvcached\r\nUser-Agent: kvctl/%s\r\n"
                   "Accept: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                   method, target, KV_VERSION);
  int rc = n < 0 ? -ENOMEM : send_all(fd, req, (size_t)n, deadline);
  int send_rc = 0;
  if (rc == -EPIPE || rc == -ECONNRESET) send_rc = rc, rc = 0; /* an answer may be waiting */
  http_parser p;
  http_parser_settings cb;
  http_parser_settings_init(&cb);
  cb.on_body = on_body;
  cb.on_message_complete = on_complete;
  http_parser_init(&p, HTTP_RESPONSE);
  p.data = &s;
  char buf[16384];
  while (!rc && !s.done) {
    if ((rc = kv_sock_wait(fd, POLLIN, deadline))) break;
    ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      /* A reset is an end of stream here: the daemon closes a refused
       * peer's connection right after its 403, before reading the rest
       * of the request, and a response it sent whole must still count. */
      if (errno != ECONNRESET) {
        rc = -errno;
        break;
      }
      got = 0;
    }
    size_t used = http_parser_execute(&p, &cb, buf, (size_t)got);
    if (s.err) rc = s.err;
    else if (HTTP_PARSER_ERRNO(&p) != HPE_OK || used != (size_t)got) rc = -EPROTO;
    else if (got == 0 && !s.done) rc = -EPROTO; /* closed before the message ended */
  }
  if (rc && send_rc) rc = send_rc; /* no answer: the send's failure says why */
  free(req);
  close(fd);
  if (rc) {
    free(s.body);
    return rc;
  }
  if (!s.body && !(s.body = malloc(1))) return -ENOMEM;
  s.body[s.len] = 0;
  r->status = (int)p.status_code;
  r->body = s.body;
  r->len = s.len;
  return 0;
}

void kvctl_http_resp_free(kvctl_http_resp *r) {
  free(r->body);
  r->body = NULL;
  r->len = 0;
}

int kvctl_url_encode(char *out, size_t cap, size_t *at, const char *s) {
  size_t i = *at;
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                ch == '-' || ch == '.' || ch == '_' || ch == '~';
    if (i + (plain ? 1 : 3) + 1 > cap) {
      if (cap) out[*at] = 0;
      return -ENAMETOOLONG;
    }
    if (plain) {
      out[i++] = (char)ch;
    } else {
      out[i++] = '%';
      out[i++] = (char)toupper(kv_hex_char(ch >> 4)); /* RFC 3986 2.1: uppercase */
      out[i++] = (char)toupper(kv_hex_char(ch));
    }
  }
  out[i] = 0;
  *at = i;
  return 0;
}
