/* metrics.c - reading the daemon's operator surface in the tests (metrics.h). */
#include "tests/lib/metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/sock.h"

int kvt_http_raw(const char *path, const void *req, size_t n, char *resp, size_t cap) {
  int fd = kv_sock_connect(path, 0);
  resp[0] = 0;
  if (fd < 0) return fd;
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
  int status = 0;
  if (sscanf(resp, "HTTP/1.1 %d", &status) != 1) status = 0;
  return status;
}

int kvt_http(const char *path, const char *method, const char *target, char *resp, size_t cap,
             const char **body) {
  char req[8192];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: kvcached\r\nConnection: close\r\n\r\n",
                   method, target);
  if (n < 0 || (size_t)n >= sizeof req) return -ENAMETOOLONG;
  int st = kvt_http_raw(path, req, (size_t)n, resp, cap);
  char *b = strstr(resp, "\r\n\r\n");
  if (body) *body = b ? b + 4 : "";
  return st;
}

long long kvt_metric_value(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, series, n) && l[n] == ' ') return atoll(l + n + 1);
  return -1;
}

int kvt_json_num(json_t *o, const char *path, long long *out) {
  char p[128];
  snprintf(p, sizeof p, "%s", path);
  json_t *v = o;
  for (char *save = NULL, *k = strtok_r(p, ".", &save); k; k = strtok_r(NULL, ".", &save))
    v = json_object_get(v, k);
  if (!json_is_integer(v)) return -ENOENT;
  *out = (long long)json_integer_value(v);
  return 0;
}
