/*
 * metrics.h - reading the daemon's operator surface in the tests: raw
 * HTTP/1.1 over its stats or admin socket, a sample of /metrics, a number
 * of /stats by its dotted path. No criterion here.
 */
#ifndef KV_TESTS_LIB_METRICS_H
#define KV_TESTS_LIB_METRICS_H

#include <jansson.h>
#include <stddef.h>

/* Sends req[0..n) on a fresh connection to the unix socket at path (send
 * errors ignored: the daemon may close first), then reads until the peer
 * closes into resp (NUL-terminated, at most cap - 1 bytes). The HTTP
 * status of the first response, 0 when there is none, or -errno when it
 * could not connect (resp empty). */
int kvt_http_raw(const char *path, const void *req, size_t n, char *resp, size_t cap);

/* One request METHOD TARGET with "Connection: close"; *body (may be
 * NULL) points into resp after the headers. As kvt_http_raw. */
int kvt_http(const char *path, const char *method, const char *target, char *resp, size_t cap,
             const char **body);

/* The value of the sample line of Prometheus text that starts with
 * `series ` ("name" or "name{labels}"), or -1 when there is none. */
long long kvt_metric_value(const char *text, const char *series);

/* The integer at a dotted path in o ("tiers.g2.used_bytes") into *out.
 * 0, or -ENOENT when there is no integer there. */
int kvt_json_num(json_t *o, const char *path, long long *out);

#endif
