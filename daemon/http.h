/*
 * http.h - a small HTTP/1.1 server inside the daemon's libuv loop, for the
 * operator surface (daemon/OPS.md): the stats and admin sockets.
 *
 * One kvd_http serves one handler on a Unix socket (with a file mode) and,
 * optionally, on TCP host:port. Requests are parsed with http-parser; each
 * complete request is handed to the handler synchronously, on the loop's
 * thread, with its method, path, query string, body and - on the Unix
 * socket - the peer's credentials (SO_PEERCRED, read at accept). The
 * handler fills a response; the server frames it (Content-Length) and sends
 * it without blocking.
 *
 * Robustness: a request over KVD_HTTP_MAX_REQUEST bytes (request line,
 * headers and body together) or one the parser refuses is answered 400
 * with a JSON error and the connection closed; a peer that disconnects
 * mid-request is dropped; a peer that does not read its responses stops
 * being read once KVD_HTTP_OUT_MAX bytes wait for it. Keep-alive follows
 * the request (HTTP/1.1 default, "Connection: close", HTTP/1.0).
 *
 * Slow peers cannot hold the server (kvd_http_set_limits()):
 *  - a request must be complete within the request timeout of its start:
 *    the connection's accept for its first request, the first byte for a
 *    later one; the clock is not reset by bytes that trickle in. Past it:
 *    408 and close. A connection idle between requests for
 *    KVD_HTTP_IDLE_MS is closed.
 *  - each listener (the Unix socket, the TCP one) has its own connection
 *    limit and count, so one cannot take the other's places. A connection
 *    that finds its listener full evicts the one of that listener that has
 *    waited longest for a complete request (503 to it), so a new request -
 *    a liveness probe's /health - is always taken; only when every
 *    connection there is sending a response is the new one refused (503).
 *  - when descriptors ran out, a waiting connection first evicts the
 *    longest-waiting one of either listener; with none, it is answered 503
 *    and closed (daemon/accept.h), so no listener spins.
 * Every refusal, eviction and timeout is counted (kvd_http_lstats).
 */
#ifndef KV_DAEMON_HTTP_H
#define KV_DAEMON_HTTP_H

#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

#include "base/buf.h"
#include "ipc/sock.h"

#define KVD_HTTP_MAX_REQUEST (64u << 10)
#define KVD_HTTP_MAX_CONNS   256
#define KVD_HTTP_IDLE_MS     30000
#define KVD_HTTP_OUT_MAX     ((size_t)4 << 20)

typedef struct kvd_http_req {
  const char *method; /* "GET", "POST", ... */
  const char *path;   /* without the query; NUL-terminated */
  const char *query;  /* after '?', "" if none */
  const char *body;
  size_t body_len;
  int has_cred; /* 1 on the Unix socket */
  kv_peercred cred;
  int tcp;           /* 1 on the TCP listener */
  int conn_requests; /* requests on this connection so far, this one included */
} kvd_http_req;

typedef struct kvd_http_resp {
  int status;               /* 200 unless the handler says otherwise */
  const char *content_type; /* "application/json" unless set */
  kv_buf body;
  int close; /* close the connection after this response */
} kvd_http_resp;

typedef void (*kvd_http_fn)(void *arg, const kvd_http_req *req, kvd_http_resp *resp);

typedef struct kvd_http_conn kvd_http_conn;

/* What one listener counts. */
typedef struct kvd_http_lstats {
  uint32_t open, max;        /* connections now, and the limit */
  uint64_t refused_fd_limit; /* answered 503 when descriptors ran out */
  uint64_t refused_limit;    /* answered 503: full, and nothing to evict */
  uint64_t evicted;          /* closed (503) to make room for a new one */
  uint64_t request_timeouts; /* closed (408): no complete request in time */
  uint64_t idle;             /* closed: idle between requests too long */
} kvd_http_lstats;

#define KVD_HTTP_UNIX 0
#define KVD_HTTP_TCP  1

typedef struct kvd_http {
  uv_loop_t *loop;
  kvd_http_fn fn;
  void *arg;
  const char *name; /* for the log: "stats", "admin" */
  kv_listener ulst; /* Unix listener (fd -1 when off) */
  int tcp_fd;       /* -1 when off */
  uv_poll_t upoll, tpoll;
  uv_timer_t sweep;
  int uon, ton, started;
  int upaused, tpaused; /* a listener stopped after an accept error; the sweep resumes it */
  kvd_http_conn *conns;
  uint32_t nconns;
  uint64_t requests, bad_requests, refused_conns;
  uint32_t request_timeout_ms;
  kvd_http_lstats st[2]; /* KVD_HTTP_UNIX, KVD_HTTP_TCP */
} kvd_http;

/* Prepares h (no socket yet). */
void kvd_http_init(kvd_http *h, uv_loop_t *loop, const char *name, kvd_http_fn fn, void *arg);

/* Sets the limits (before listening): at most unix_max and tcp_max
 * connections on each listener (0: KVD_HTTP_MAX_CONNS), a request complete
 * within request_timeout_ms (0: KVD_HTTP_IDLE_MS). */
void kvd_http_set_limits(kvd_http *h, uint32_t unix_max, uint32_t tcp_max,
                         uint32_t request_timeout_ms);

/* Listens on dir/name with the given mode (see kv_listen: a live server on
 * the path is -EADDRINUSE). 0 or -errno, logged. */
int kvd_http_listen_unix(kvd_http *h, const char *dir, const char *sockname, mode_t mode);

/* Listens on "host:port" ("[v6addr]:port" for IPv6; host may be a name).
 * 0 or -errno (-EINVAL for a malformed address), logged. */
int kvd_http_listen_tcp(kvd_http *h, const char *hostport);

/* Stops listening (the socket file is removed) and closes every
 * connection. Memory goes in libuv's close callbacks: run the loop once
 * more before it is closed. Safe twice and on a server that never started. */
void kvd_http_close(kvd_http *h);

/* Reads parameter `name` of a query string, percent-decoded, into out.
 * Returns 1 if found, 0 if absent, -E2BIG if it does not fit (out
 * holds a truncated copy), -EINVAL for a bad %-escape. */
int kvd_http_query(const char *query, const char *name, char *out, size_t outlen);

/* Appends formatted text to b. 0 or -ENOMEM. */
int kvd_buf_printf(kv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets resp to a JSON error {"error": msg} with the given status. */
void kvd_http_error(kvd_http_resp *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets resp to the compact JSON text of o (a reference it takes; NULL:
 * out of memory, answered 500) with the given status. */
typedef struct json_t json_t;
void kvd_http_json(kvd_http_resp *resp, json_t *o, int status);

/* The reason phrase of a status code ("Not Found"). */
const char *kvd_http_reason(int status);

#endif
