/* http.c - the operator surface's HTTP/1.1 server (see http.h). */
#include "daemon/http.h"

#include <errno.h>
#include <http_parser.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/hex.h"
#include "base/log.h"
#include "daemon/accept.h"

struct kvd_http_conn {
  uv_poll_t poll;
  int fd;
  kvd_http *h;
  http_parser p;
  kv_buf url, body, out;
  size_t msg_bytes; /* bytes of the request being parsed */
  int too_big;
  int close_after; /* close once out is sent */
  int closing;
  int events;
  int nreq;
  int has_cred;
  int tcp;
  kv_peercred cred;
  uint64_t last_ms; /* the last byte in or response out */
  uint64_t req_ms;  /* the current request's clock: accept or first byte; 0: idle */
  kvd_http_conn *next, **pprev;
};

static void on_conn(uv_poll_t *p, int status, int events);
static http_parser_settings settings;

/* --- small helpers ----------------------------------------------------------- */

int kvd_buf_printf(kv_buf *b, const char *fmt, ...) {
  va_list ap;
  char small[512];
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return -EINVAL;
  if ((size_t)n < sizeof small) return kv_buf_append(b, small, (size_t)n);
  int rc = kv_buf_reserve(b, (size_t)n + 1);
  if (rc) return rc;
  va_start(ap, fmt);
  vsnprintf((char *)b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

const char *kvd_http_reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  default: return "Unknown";
  }
}

void kvd_http_error(kvd_http_resp *resp, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  resp->status = status;
  resp->content_type = "application/json";
  kv_buf_reset(&resp->body);
  json_t *o = json_pack("{s:s}", "error", msg);
  char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (text) kv_buf_append(&resp->body, text, strlen(text));
  free(text);
}

void kvd_http_json(kvd_http_resp *resp, json_t *o, int status) {
  char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!text) {
    kvd_http_error(resp, 500, "out of memory");
    return;
  }
  resp->status = status;
  resp->content_type = "application/json";
  kv_buf_reset(&resp->body);
  if (kv_buf_append(&resp->body, text, strlen(text)) || kv_buf_append(&resp->body, "\n", 1))
    kvd_http_error(resp, 500, "out of memory");
  free(text);
}

int kvd_http_query(const char *query, const char *name, char *out, size_t outlen) {
  size_t nl = strlen(name);
  for (const char *q = query; q && *q;) {
    const char *end = strchr(q, '&');
    if (!end) end = q + strlen(q);
    const char *eq = memchr(q, '=', (size_t)(end - q));
    const char *kend = eq ? eq : end;
    if ((size_t)(kend - q) == nl && memcmp(q, name, nl) == 0) {
      size_t o = 0;
      int rc = 1;
      for (const char *v = eq ? eq + 1 : end; v < end; v++) {
        int ch = (unsigned char)*v;
        if (ch == '+') ch = ' ';
        else if (ch == '%') {
          if (end - v < 3 || kv_hex_digit(v[1]) < 0 || kv_hex_digit(v[2]) < 0) return -EINVAL;
          ch = kv_hex_digit(v[1]) * 16 + kv_hex_digit(v[2]);
          v += 2;
        }
        if (o + 1 >= outlen) {
          rc = -E2BIG;
          break;
        }
        out[o++] = (char)ch;
      }
      if (outlen) out[o < outlen ? o : outlen - 1] = 0;
      return rc;
    }
    q = *end ? end + 1 : end;
  }
  if (outlen) out[0] = 0;
  return 0;
}

static uint64_t mono_ms(void) { return (uint64_t)kv_now_ms(); }

/* --- connections ----------------------------------------------------------- */

static void conn_free_cb(uv_handle_t *hd) {
  kvd_http_conn *c = hd->data;
  kv_buf_free(&c->url);
  kv_buf_free(&c->body);
  kv_buf_free(&c->out);
  free(c);
  kvd_fd_ops_refill(); /* a descriptor came back: the operator pool first */
}

/* The descriptor is closed at once (uv_poll_stop has taken it out of the
 * loop's epoll set), so its slot can be used before the loop runs again;
 * the memory goes in the close callback. */
static void conn_close(kvd_http_conn *c) {
  if (c->closing) return;
  c->closing = 1;
  *c->pprev = c->next;
  if (c->next) c->next->pprev = c->pprev;
  c->h->nconns--;
  c->h->st[c->tcp].open--;
  uv_poll_stop(&c->poll);
  uv_close((uv_handle_t *)&c->poll, conn_free_cb);
  close(c->fd);
  c->fd = -1;
}

/* A short response to a connection about to be closed (never waits). */
static void say_and_close(kvd_http_conn *c, int status, const char *msg) {
  char r[384];
  int n = snprintf(r, sizeof r,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n{\"error\":\"%s\"}\n",
                   status, kvd_http_reason(status), strlen(msg) + 13, msg);
  if (!c->out.len && n > 0 && (size_t)n < sizeof r)
    send(c->fd, r, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
  conn_close(c);
}

static void set_events(kvd_http_conn *c) {
  int ev = 0;
  if (c->out.len < KVD_HTTP_OUT_MAX && !c->close_after) ev |= UV_READABLE;
  if (c->out.len) ev |= UV_WRITABLE;
  if (ev != c->events) {
    c->events = ev;
    uv_poll_start(&c->poll, ev | UV_DISCONNECT, on_conn);
  }
}

/* Sends what it can. 0, or -errno: the connection is dead. */
static int conn_flush(kvd_http_conn *c) {
  while (c->out.len) {
    ssize_t w = send(c->fd, c->out.p, c->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (w < 0) return -errno;
    kv_buf_consume(&c->out, (size_t)w);
  }
  return 0;
}

static void respond(kvd_http_conn *c, kvd_http_resp *r) {
  int keep = !r->close && !c->close_after && http_should_keep_alive(&c->p);
  if (kvd_buf_printf(&c->out,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\nConnection: %s\r\n\r\n",
                     r->status, kvd_http_reason(r->status),
                     r->content_type ? r->content_type : "application/json", r->body.len,
                     keep ? "keep-alive" : "close") ||
      kv_buf_append(&c->out, r->body.p, r->body.len)) {
    kv_warn("http", "out of memory for a response: closing the connection");
    keep = 0;
  }
  if (!keep) c->close_after = 1;
}

/* A request that never reached the handler: 400 and close. */
static void refuse(kvd_http_conn *c, const char *why) {
  kvd_http_resp r = {.status = 400, .close = 1};
  kv_buf_init(&r.body);
  kvd_http_error(&r, 400, "%s", why);
  respond(c, &r);
  kv_buf_free(&r.body);
  c->h->bad_requests++;
}

static int grow(kvd_http_conn *c, kv_buf *b, const char *at, size_t n) {
  c->msg_bytes += n;
  if (c->msg_bytes > KVD_HTTP_MAX_REQUEST) {
    c->too_big = 1;
    return 1;
  }
  return b && kv_buf_append(b, at, n) ? 1 : 0;
}

static int on_begin(http_parser *p) {
  kvd_http_conn *c = p->data;
  if (!c->req_ms) c->req_ms = mono_ms();
  kv_buf_reset(&c->url);
  kv_buf_reset(&c->body);
  c->msg_bytes = 0;
  return 0;
}
static int on_url(http_parser *p, const char *at, size_t n) {
  return grow(p->data, &((kvd_http_conn *)p->data)->url, at, n);
}
static int on_hdr(http_parser *p, const char *at, size_t n) { return grow(p->data, NULL, at, n); }
static int on_body(http_parser *p, const char *at, size_t n) {
  return grow(p->data, &((kvd_http_conn *)p->data)->body, at, n);
}

static int on_complete(http_parser *p) {
  kvd_http_conn *c = p->data;
  kvd_http *h = c->h;
  if (kv_buf_append(&c->url, "", 1) || kv_buf_append(&c->body, "", 1)) return 1;
  char *url = (char *)c->url.p;
  char *q = strchr(url, '?');
  if (q) *q++ = 0;
  char *frag = strchr(q ? q : url, '#');
  if (frag) *frag = 0;
  kvd_http_req req = {.method = http_method_str((enum http_method)p->method),
                      .path = url,
                      .query = q ? q : "",
                      .body = (const char *)c->body.p,
                      .body_len = c->body.len - 1,
                      .has_cred = c->has_cred,
                      .cred = c->cred,
                      .tcp = c->tcp,
                      .conn_requests = ++c->nreq};
  kvd_http_resp r = {.status = 200, .content_type = "application/json"};
  kv_buf_init(&r.body);
  c->req_ms = 0;
  h->requests++;
  h->fn(h->arg, &req, &r);
  respond(c, &r);
  kv_buf_free(&r.body);
  /* Nothing after a response that closes is read: pause the parser. */
  if (c->close_after) http_parser_pause(p, 1);
  return 0;
}

static void conn_read(kvd_http_conn *c) {
  char buf[16384];
  while (!c->close_after && c->out.len < KVD_HTTP_OUT_MAX) {
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) { /* end of stream (maybe mid-request) or a reset: nothing owed */
      conn_close(c);
      return;
    }
    c->last_ms = mono_ms();
    size_t done = http_parser_execute(&c->p, &settings, buf, (size_t)n);
    enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
    if (e == HPE_PAUSED) return; /* a response that closes was queued */
    if (c->too_big) {
      refuse(c, "request larger than 64 KiB");
      return;
    }
    if (e != HPE_OK || done != (size_t)n) {
      char why[160];
      snprintf(why, sizeof why, "malformed request: %s", http_errno_description(e));
      refuse(c, why);
      return;
    }
    if (c->p.upgrade) {
      refuse(c, "protocol upgrades are not served");
      return;
    }
  }
}

static void on_conn(uv_poll_t *p, int status, int events) {
  kvd_http_conn *c = p->data;
  if (c->closing) return;
  if (status < 0) {
    conn_close(c);
    return;
  }
  if (events & UV_READABLE) conn_read(c);
  if (c->closing) return;
  if (conn_flush(c) < 0) {
    conn_close(c);
    return;
  }
  if (c->close_after && !c->out.len) {
    shutdown(c->fd, SHUT_WR);
    conn_close(c);
    return;
  }
  if ((events & UV_DISCONNECT) && !(events & UV_READABLE)) {
    conn_close(c);
    return;
  }
  set_events(c);
}

/* The connection of listener `which` (-1: either) that has waited longest
 * for a complete request - mid-request since its clock started, or idle
 * since its last byte - among those not sending a response. NULL if none. */
static kvd_http_conn *longest_waiting(kvd_http *h, int which) {
  kvd_http_conn *v = NULL;
  uint64_t vkey = 0;
  for (kvd_http_conn *c = h->conns; c; c = c->next) {
    if (c->closing || c->close_after || c->out.len || (which >= 0 && c->tcp != which)) continue;
    uint64_t key = c->req_ms ? c->req_ms : c->last_ms;
    if (!v || key < vkey) v = c, vkey = key;
  }
  return v;
}

static void evict(kvd_http *h, kvd_http_conn *v, const char *why) {
  h->st[v->tcp].evicted++;
  kv_warn("http", "%s: %s: closing the connection that waited longest for a request (%s)", h->name,
          why, v->tcp ? "TCP" : "Unix socket");
  say_and_close(v, 503, "evicted: the socket is at its connection limit");
}

/* kvd_accept()'s resort before refusing at the descriptor limit: one of
 * the descriptors reserved for the operator sockets, else the connection
 * that waited longest for a request. */
static int make_room(void *arg) {
  kvd_http *h = arg;
  if (kvd_fd_ops_room(NULL)) return 1;
  kvd_http_conn *v = longest_waiting(h, -1);
  if (!v) return 0;
  evict(h, v, "out of file descriptors");
  return 1;
}

static void add_conn(kvd_http *h, int fd, int tcp) {
  kvd_http_lstats *st = &h->st[tcp];
  if (st->open >= st->max) {
    kvd_http_conn *v = longest_waiting(h, tcp);
    if (!v) {
      st->refused_limit++;
      h->refused_conns++;
      kv_warn("http", "%s: %u connections open on the %s, all sending: refusing another", h->name,
              st->open, tcp ? "TCP listener" : "Unix socket");
      static const char r[] =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Content-Length: 38\r\nConnection: close\r\n\r\n"
          "{\"error\":\"too many connections open\"}\n";
      send(fd, r, sizeof r - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      return;
    }
    evict(h, v, "connection limit reached");
  }
  kvd_http_conn *c = calloc(1, sizeof *c);
  if (!c) {
    kv_warn("http", "%s: out of memory: refusing a connection", h->name);
    close(fd);
    return;
  }
  c->fd = fd;
  c->h = h;
  c->has_cred = !tcp && kv_sock_peercred(fd, &c->cred) == 0;
  c->tcp = tcp;
  http_parser_init(&c->p, HTTP_REQUEST);
  c->p.data = c;
  kv_buf_init(&c->url);
  kv_buf_init(&c->body);
  kv_buf_init(&c->out);
  c->last_ms = c->req_ms = mono_ms();
  uv_poll_init(h->loop, &c->poll, fd);
  c->poll.data = c;
  c->next = h->conns;
  c->pprev = &h->conns;
  if (h->conns) h->conns->pprev = &c->next;
  h->conns = c;
  h->nconns++;
  st->open++;
  set_events(c);
}

/* kvd_accept()'s refusal at the descriptor limit: a 503, nothing that
 * takes a descriptor. */
static void refuse_fd_limit(void *arg, int fd) {
  static const char body[] =
      "{\"error\":\"kvcached is out of file descriptors: try again later\"}\n";
  char r[256];
  int n = snprintf(r, sizeof r,
                   "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                   sizeof body - 1, body);
  if (n > 0 && (size_t)n < sizeof r) send(fd, r, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Accepts what waits on listener lfd (tcp: 1 for the TCP one). An accept
 * error that refusing cannot clear stops polling the listener until the
 * next sweep, so the loop never spins on it. */
static void accept_all(kvd_http *h, int lfd, int tcp) {
  for (;;) {
    int shed;
    int fd = kvd_accept(lfd, make_room, refuse_fd_limit, h, &shed);
    if (fd == -EAGAIN) return;
    if (shed) {
      h->st[tcp].refused_fd_limit++;
      h->refused_conns++;
      kv_warn("http", "%s: out of file descriptors (%s): refused a connection", h->name,
              kv_strerror(fd));
      continue;
    }
    if (fd < 0) {
      kv_warn("http", "%s: accept: %s: not accepting for a while", h->name, kv_strerror(fd));
      uv_poll_stop(tcp ? &h->tpoll : &h->upoll);
      if (tcp) h->tpaused = 1;
      else h->upaused = 1;
      return;
    }
    add_conn(h, fd, tcp);
  }
}

static void on_accept_unix(uv_poll_t *p, int status, int events) {
  kvd_http *h = p->data;
  accept_all(h, h->ulst.fd, KVD_HTTP_UNIX);
}

static void on_accept_tcp(uv_poll_t *p, int status, int events) {
  kvd_http *h = p->data;
  accept_all(h, h->tcp_fd, KVD_HTTP_TCP);
}

/* Closes connections whose request is not complete within the request
 * timeout, and those idle too long; resumes paused listeners. */
static void on_sweep(uv_timer_t *t) {
  kvd_http *h = t->data;
  uint64_t now = mono_ms();
  if (h->upaused && h->uon) uv_poll_start(&h->upoll, UV_READABLE, on_accept_unix);
  if (h->tpaused && h->ton) uv_poll_start(&h->tpoll, UV_READABLE, on_accept_tcp);
  h->upaused = h->tpaused = 0;
  for (kvd_http_conn *c = h->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing) continue;
    if (c->req_ms && !c->close_after && now - c->req_ms >= h->request_timeout_ms) {
      h->st[c->tcp].request_timeouts++;
      kv_warn("http", "%s: no complete request within %u ms (%s): closing", h->name,
              h->request_timeout_ms, c->tcp ? "TCP" : "Unix socket");
      say_and_close(c, 408, "no complete request within the request timeout");
    } else if (now - c->last_ms >= KVD_HTTP_IDLE_MS) {
      h->st[c->tcp].idle++;
      conn_close(c);
    }
  }
}

/* --- listeners --------------------------------------------------------------- */

void kvd_http_init(kvd_http *h, uv_loop_t *loop, const char *name, kvd_http_fn fn, void *arg) {
  memset(h, 0, sizeof *h);
  h->loop = loop;
  h->name = name;
  h->fn = fn;
  h->arg = arg;
  h->ulst.fd = h->ulst.lock_fd = -1;
  h->tcp_fd = -1;
  kvd_http_set_limits(h, 0, 0, 0);
  settings = (http_parser_settings){.on_message_begin = on_begin,
                                    .on_url = on_url,
                                    .on_header_field = on_hdr,
                                    .on_header_value = on_hdr,
                                    .on_body = on_body,
                                    .on_message_complete = on_complete};
}

void kvd_http_set_limits(kvd_http *h, uint32_t unix_max, uint32_t tcp_max,
                         uint32_t request_timeout_ms) {
  h->st[KVD_HTTP_UNIX].max = unix_max ? unix_max : KVD_HTTP_MAX_CONNS;
  h->st[KVD_HTTP_TCP].max = tcp_max ? tcp_max : KVD_HTTP_MAX_CONNS;
  h->request_timeout_ms = request_timeout_ms ? request_timeout_ms : KVD_HTTP_IDLE_MS;
}

static void start_sweep(kvd_http *h) {
  if (h->started) return;
  h->started = 1;
  uint32_t every = h->request_timeout_ms / 4;
  every = every < 10 ? 10 : every > 1000 ? 1000 : every;
  uv_timer_init(h->loop, &h->sweep);
  h->sweep.data = h;
  uv_timer_start(&h->sweep, on_sweep, every, every);
  uv_unref((uv_handle_t *)&h->sweep);
}

int kvd_http_listen_unix(kvd_http *h, const char *dir, const char *sockname, mode_t mode) {
  kv_listen_opts lo = {.sock_mode = mode, .flags = KV_SOCK_NONBLOCK};
  int rc = kv_listen(&h->ulst, dir, sockname, &lo);
  if (rc) {
    kv_error("http", "%s: cannot listen on %s/%s: %s", h->name, dir, sockname,
             rc == -EADDRINUSE ? "another kvcached is serving it" : kv_strerror(rc));
    return rc;
  }
  uv_poll_init(h->loop, &h->upoll, h->ulst.fd);
  h->upoll.data = h;
  uv_poll_start(&h->upoll, UV_READABLE, on_accept_unix);
  h->uon = 1;
  start_sweep(h);
  return 0;
}

int kvd_http_listen_tcp(kvd_http *h, const char *hostport) {
  char host[128], port[16];
  const char *colon = strrchr(hostport, ':');
  size_t hl = colon ? (size_t)(colon - hostport) : 0;
  if (!colon || hl == 0 || hl >= sizeof host || strlen(colon + 1) >= sizeof port || !colon[1]) {
    kv_error("http", "%s: '%s' is not host:port", h->name, hostport);
    return -EINVAL;
  }
  memcpy(host, hostport, hl);
  host[hl] = 0;
  if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *ai = NULL;
  int g = getaddrinfo(host, port, &hints, &ai);
  if (g) {
    kv_error("http", "%s: cannot resolve %s: %s", h->name, hostport, gai_strerror(g));
    return -EINVAL;
  }
  int rc = -EADDRNOTAVAIL;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      rc = -errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      h->tcp_fd = fd;
      rc = 0;
      break;
    }
    rc = -errno;
    close(fd);
  }
  freeaddrinfo(ai);
  if (rc) {
    kv_error("http", "%s: cannot listen on %s: %s", h->name, hostport, kv_strerror(rc));
    return rc;
  }
  uv_poll_init(h->loop, &h->tpoll, h->tcp_fd);
  h->tpoll.data = h;
  uv_poll_start(&h->tpoll, UV_READABLE, on_accept_tcp);
  h->ton = 1;
  start_sweep(h);
  return 0;
}

void kvd_http_close(kvd_http *h) {
  if (h->uon) {
    h->uon = 0;
    uv_poll_stop(&h->upoll);
    uv_close((uv_handle_t *)&h->upoll, NULL);
    kv_listener_close(&h->ulst);
  }
  if (h->ton) {
    h->ton = 0;
    uv_poll_stop(&h->tpoll);
    uv_close((uv_handle_t *)&h->tpoll, NULL);
    close(h->tcp_fd);
    h->tcp_fd = -1;
  }
  while (h->conns) {
    conn_flush(h->conns);
    conn_close(h->conns);
  }
  if (h->started) {
    h->started = 0;
    uv_timer_stop(&h->sweep);
    uv_close((uv_handle_t *)&h->sweep, NULL);
  }
}
