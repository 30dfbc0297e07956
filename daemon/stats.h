/*
 * stats.h - the daemon's read-only operator routes (daemon/OPS.md):
 * /metrics (Prometheus text format 0.0.4), /stats, /health, /config and
 * /keys (JSON), and the STATUS reply. Counters the core already keeps
 * (kv_core_stats, kv_g3_stats, kvd_stats) and what the daemon measures
 * itself (metrics.h) are read when a route is asked, from one snapshot.
 * Everything runs on the loop's thread.
 */
#ifndef KV_DAEMON_STATS_H
#define KV_DAEMON_STATS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "daemon/http.h"
#include "daemon/metrics.h"
#include "tiers/block.h"

struct kvd;

/* The read-only routes: fills resp for GET path?query, or returns 0 if
 * path is not one of them (resp untouched). */
int kvd_stats_route(struct kvd *d, const kvd_http_req *req, kvd_http_resp *resp);

/* The daemon's state as JSON, both answers built here from one snapshot:
 * /stats (KVD_JSON_STATS, daemon/OPS.md) or the wire STATUS reply
 * (KVD_JSON_STATUS, proto/PROTOCOL.md), whose "tiers" is /stats' own.
 * NULL when out of memory. */
typedef enum { KVD_JSON_STATS = 0, KVD_JSON_STATUS } kvd_json_for;
json_t *kvd_stats_json(struct kvd *d, kvd_json_for what);

/* Renders /metrics into out. 0 or -ENOMEM. */
int kvd_render_metrics(struct kvd *d, kv_buf *out);

/* The core namespace whose digest starts with hex (at least 8 hex digits).
 * 0 with *core_ns set, -EINVAL (not hex, too short), -ENOENT (none),
 * -EEXIST (the prefix names more than one). */
int kvd_ns_by_hex(struct kvd *d, const char *hex, uint32_t *core_ns);

/* Parses a hex key of 1..32 bytes. 0 or -EINVAL. */
int kvd_key_from_hex(const char *hex, size_t len, kv_key *k);

#endif
