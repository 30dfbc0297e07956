/*
 * kvctl_http.h - a tiny HTTP/1.1 client over a Unix socket, for kvctl's
 * talk with the daemon's stats and admin sockets (daemon/OPS.md).
 *
 * One request per connection ("Connection: close"), no request body (the
 * routes take their arguments in the query string), the response parsed
 * with http-parser. Enough for kvcached's operator routes, nothing more.
 */
#ifndef KVCTL_HTTP_H
#define KVCTL_HTTP_H

#include <stddef.h>

/* The largest response body accepted (a /keys sample of 1000 entries is
 * far below it). */
#define KVCTL_HTTP_BODY_MAX (16u << 20)

typedef struct kvctl_http_resp {
  int status; /* HTTP status code */
  char *body; /* NUL-terminated, malloc()ed; the caller frees */
  size_t len; /* body bytes, without the NUL */
} kvctl_http_resp;

/*
 * Sends `method target` to the socket at sock_path and reads the whole
 * response, waiting at most timeout_ms in all. Returns 0 with *r filled
 * (any HTTP status, 4xx and 5xx included; a response the daemon sent
 * before closing without reading the request counts, although the send
 * failed), or -errno and *r untouched:
 * the socket's connect() errors as they are (-ENOENT: no socket file,
 * -ECONNREFUSED: no daemon behind it, -EACCES: its mode), -ETIMEDOUT,
 * -EPROTO (not an HTTP response, or the peer closed before it ended),
 * -EMSGSIZE (body over KVCTL_HTTP_BODY_MAX), -ENOMEM.
 */
int kvctl_http(const char *sock_path, const char *method, const char *target, int timeout_ms,
               kvctl_http_resp *r);

/* Frees r's body; safe twice. */
void kvctl_http_resp_free(kvctl_http_resp *r);

/* Appends s to out (capacity cap, NUL-terminated, holding *at bytes) with
 * every byte outside RFC 3986's unreserved set percent-encoded. 0, or
 * -ENAMETOOLONG when it does not fit (out is then left as it was). */
int kvctl_url_encode(char *out, size_t cap, size_t *at, const char *s);

#endif
