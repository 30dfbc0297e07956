/* admin.c - the stats and admin sockets and the state-changing routes
 * (see admin.h; the contract is daemon/OPS.md). */
#include "daemon/admin.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <jansson.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"

static const char *const admin_routes[] = {"/config", "/evict", "/flush", "/pin", "/unpin"};
#define NADMIN (sizeof admin_routes / sizeof admin_routes[0])

/* --- credentials ----------------------------------------------------------------- */

int kvd_ops_peer_allowed(const kvd_ops *o, const kv_peercred *cred) {
  if (cred->uid == 0 || cred->uid == geteuid()) return 1;
  if (!o->has_gid) return 0;
  if (cred->gid == o->admin_gid) return 1;
  /* Supplementary groups: the peer's user as the group database knows it. */
  struct passwd pw, *pp = NULL;
  char buf[4096];
  if (getpwuid_r(cred->uid, &pw, buf, sizeof buf, &pp) || !pp) return 0;
  gid_t groups[256];
  int n = 256;
  if (getgrouplist(pp->pw_name, pp->pw_gid, groups, &n) < 0) return 0;
  for (int i = 0; i < n; i++)
    if (groups[i] == o->admin_gid) return 1;
  return 0;
}

/* --- helpers ---------------------------------------------------------------------- */

static void reply(kvd_http_resp *resp, json_t *o) { kvd_http_json(resp, o, 200); }

/* A decimal count: digits only. */
static int parse_count(const char *s, uint64_t *out) {
  if (!*s) return -EINVAL;
  uint64_t v = 0;
  for (; *s; s++) {
    if (!isdigit((unsigned char)*s) || v > (UINT64_MAX - 9) / 10) return -EINVAL;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

/* Reads an optional parameter; on a bad one answers 400 and returns -1. */
static int param(const kvd_http_req *req, kvd_http_resp *resp, const char *name, char *out,
                 size_t len) {
  int r = kvd_http_query(req->query, name, out, len);
  if (r == -E2BIG) kvd_http_error(resp, 400, "%s: value too long", name);
  else if (r < 0) kvd_http_error(resp, 400, "%s: bad %%-escape in the value", name);
  return r < 0 ? -1 : r;
}

static int tier_param(const kvd_http_req *req, kvd_http_resp *resp, int required, uint8_t *t) {
  char v[16];
  int r = param(req, resp, "tier", v, sizeof v);
  if (r < 0) return -1;
  if (r == 0) {
    if (!required) {
      *t = KV_TIER_NONE;
      return 0;
    }
    kvd_http_error(resp, 400, "tier: required (g2 or g3)");
    return -1;
  }
  if (!strcmp(v, "g2")) *t = KV_G2;
  else if (!strcmp(v, "g3")) *t = KV_G3;
  else {
    kvd_http_error(resp, 400, "tier: '%s' is not g2 or g3", v);
    return -1;
  }
  return 0;
}

static int ns_param(kvd *d, const kvd_http_req *req, kvd_http_resp *resp, int required,
                    uint32_t *ns) {
  char v[80];
  int r = param(req, resp, "ns", v, sizeof v);
  if (r < 0) return -1;
  if (r == 0) {
    if (!required) {
      *ns = KV_NS_ANY;
      return 0;
    }
    kvd_http_error(resp, 400, "ns: required (the namespace digest in hex, at least 8 digits)");
    return -1;
  }
  int rc = kvd_ns_by_hex(d, v, ns);
  if (rc == -ENOENT) kvd_http_error(resp, 404, "ns: no namespace has the digest '%s'", v);
  else if (rc == -EEXIST) kvd_http_error(resp, 400, "ns: '%s' names more than one namespace", v);
  else if (rc)
    kvd_http_error(resp, 400, "ns: '%s' is not a namespace digest in hex (at least 8 digits)", v);
  return rc ? -1 : 0;
}

/* --- POST /config ------------------------------------------------------------------ */

static uint32_t g3_dirs(const kv_config *c) {
  uint32_t n = 0;
  int in = 0;
  for (const char *p = c->g3_path; *p; p++) {
    if (*p == ',') in = 0;
    else if (*p != ' ' && !in) {
      in = 1;
      n++;
    }
  }
  return n ? n : 1;
}

typedef struct prev_ctx {
  const char *want;
  char val[300];
} prev_ctx;
static void prev_one(void *arg, const char *section, const char *name, const char *value) {
  prev_ctx *p = arg;
  char key[96];
  snprintf(key, sizeof key, "%s.%s", section, name);
  if (!strcmp(key, p->want)) snprintf(p->val, sizeof p->val, "%s", value);
}

static void route_config(kvd *d, const kvd_http_req *req, kvd_http_resp *resp) {
  char name[64], value[256], err[256];
  int r1 = param(req, resp, "name", name, sizeof name);
  if (r1 < 0) return;
  int r2 = param(req, resp, "value", value, sizeof value);
  if (r2 < 0) return;
  if (!r1 || !r2) {
    kvd_http_error(resp, 400, "POST /config wants name=SECTION.NAME&value=V");
    return;
  }
  kv_config next = d->cfg;
  int rc = kv_config_set(&next, name, value, err, sizeof err);
  if (rc == -ENOENT) {
    kvd_http_error(resp, 404, "%s", err);
    return;
  }
  if (rc || kv_config_validate(&next, err, sizeof err)) {
    kvd_http_error(resp, 400, "%s", err);
    return;
  }
  prev_ctx prev = {name, ""};
  kv_config_foreach(&d->cfg, prev_one, &prev);
  if (!strcmp(name, "cache.policy"))
    snprintf(prev.val, sizeof prev.val, "%s", kv_core_policy_name(d->core));
  int64_t evicted = -1;

  if (!strcmp(name, "g2.capacity")) {
    uint64_t reserved = 0;
    for (uint32_t i = 0; i < d->reg.ntenants; i++) reserved += d->reg.tenants[i].arena.capacity;
    if (next.g2_capacity > reserved) {
      kvd_http_error(resp, 400, "g2.capacity: at most %llu bytes (the memory reserved at start)",
                     (unsigned long long)reserved);
      return;
    }
    for (uint32_t i = 1; i < d->reg.ntenants; i++)
      if (d->reg.tenants[i].arena.capacity != d->reg.tenants[0].arena.capacity) {
        /* The core's soft limit is one size for every arena. */
        kvd_http_error(resp, 409,
                       "g2.capacity changes only on restart while tenants' arenas differ "
                       "in size (g2_share)");
        return;
      }
    uint64_t each = next.g2_capacity / d->reg.ntenants;
    evicted = kv_core_set_limit(d->core, KV_G2, next.g2_capacity == reserved ? 0 : each);
  } else if (!strcmp(name, "g3.capacity")) {
    if (!d->g3) {
      kvd_http_error(resp, 409, "g3.capacity: no SSD tier is configured");
      return;
    }
    kv_g3_stats gs;
    kv_g3_get_stats(d->g3, &gs);
    uint64_t dirs = g3_dirs(&d->cfg), want = next.g3_capacity * dirs;
    if (want > gs.capacity_bytes) {
      kvd_http_error(resp, 400, "g3.capacity: at most %llu bytes per directory (the files' size)",
                     (unsigned long long)(gs.capacity_bytes / dirs));
      return;
    }
    evicted = kv_core_set_limit(d->core, KV_G3, want == gs.capacity_bytes ? 0 : want);
  } else if (!strcmp(name, "cache.policy")) {
    rc = kv_core_set_policy(d->core, next.policy);
    if (rc) {
      kvd_http_error(resp, 500, "cache.policy: %s", kv_strerror(rc));
      return;
    }
  } else if (!strcmp(name, "g3.admit")) {
    kv_core_set_admit(d->core, next.g3_admit, kv_core_g3_options(d->core).min_prio);
  } else if (!strcmp(name, "g3.min_prio")) {
    kv_core_set_admit(d->core, kv_core_g3_options(d->core).admit, (uint8_t)next.g3_min_prio);
  } else if (!strcmp(name, "log.level")) {
    kv_log_threshold = next.log_level;
  } else {
    kvd_http_error(resp, 409, "%s changes only on restart", name);
    return;
  }
  if (evicted < 0 && evicted != -1) {
    kvd_http_error(resp, 500, "%s: %s", name, kv_strerror((int)evicted));
    return;
  }
  d->cfg = next;
  kv_info("admin", "%s = %s (was %s)", name, value, prev.val);
  json_t *o = json_pack("{s:s,s:s,s:s}", "name", name, "value", value, "previous", prev.val);
  if (o && evicted >= 0) json_object_set_new(o, "evicted", json_integer(evicted));
  reply(resp, o);
}

/* --- POST /evict, /flush -------------------------------------------------------------- */

static void route_evict(kvd *d, const kvd_http_req *req, kvd_http_resp *resp) {
  uint8_t t;
  uint32_t ns;
  char v[32];
  uint64_t count = UINT64_MAX;
  if (tier_param(req, resp, 1, &t) || ns_param(d, req, resp, 0, &ns)) return;
  int r = param(req, resp, "count", v, sizeof v);
  if (r < 0) return;
  if (r == 1 && parse_count(v, &count)) {
    kvd_http_error(resp, 400, "count: '%s' is not a count", v);
    return;
  }
  if (t == KV_G3 && !d->g3) {
    kvd_http_error(resp, 409, "tier g3: no SSD tier is configured");
    return;
  }
  int64_t n = kv_core_evict_n(d->core, (kv_tier)t, ns, count);
  if (n < 0) {
    kvd_http_error(resp, 500, "evict: %s", kv_strerror((int)n));
    return;
  }
  kv_info("admin", "evicted %lld block(s) from %s", (long long)n, t == KV_G2 ? "g2" : "g3");
  reply(resp, json_pack("{s:I}", "evicted", (json_int_t)n));
}

static void route_flush(kvd *d, const kvd_http_req *req, kvd_http_resp *resp) {
  uint8_t t;
  uint32_t ns;
  if (tier_param(req, resp, 0, &t) || ns_param(d, req, resp, 0, &ns)) return;
  if (t == KV_G3 && !d->g3) {
    kvd_http_error(resp, 409, "tier g3: no SSD tier is configured");
    return;
  }
  int64_t n = kv_core_flush(d->core, t, ns);
  if (n < 0) {
    kvd_http_error(resp, 500, "flush: %s", kv_strerror((int)n));
    return;
  }
  kv_info("admin", "flushed %lld block copies", (long long)n);
  reply(resp, json_pack("{s:I}", "dropped", (json_int_t)n));
}

/* --- POST /pin, /unpin ------------------------------------------------------------------ */

static void route_pin(kvd *d, const kvd_http_req *req, kvd_http_resp *resp, int pin) {
  uint32_t ns;
  if (ns_param(d, req, resp, 1, &ns)) return;
  static char keys[KVD_HTTP_MAX_REQUEST];
  int r = param(req, resp, "keys", keys, sizeof keys);
  if (r < 0) return;
  if (r == 0 || !keys[0]) {
    kvd_http_error(resp, 400, "keys: required (hex keys, comma-separated)");
    return;
  }
  /* Check every key first: a bad one changes nothing. */
  for (const char *k = keys; *k;) {
    const char *e = strchr(k, ',');
    size_t len = e ? (size_t)(e - k) : strlen(k);
    kv_key key;
    if (kvd_key_from_hex(k, len, &key)) {
      kvd_http_error(resp, 400, "keys: '%.*s' is not a hex key of 1 to 32 bytes",
                     (int)(len < 80 ? len : 80), k);
      return;
    }
    k += len + (e ? 1 : 0);
  }
  uint64_t done = 0, missing = 0, failed = 0;
  for (const char *k = keys; *k;) {
    const char *e = strchr(k, ',');
    size_t len = e ? (size_t)(e - k) : strlen(k);
    kv_key key;
    kvd_key_from_hex(k, len, &key);
    kv_block *b = kv_core_find(d->core, ns, &key);
    if (!b) missing++;
    else if ((pin ? kvd_session_pin(d->core, &d->admin, b, 0)
                  : kvd_session_unpin(d->core, &d->admin, b)) == 0)
      done++;
    else if (pin) failed++;
    else missing++; /* not pinned by the operator */
    k += len + (e ? 1 : 0);
  }
  if (failed) {
    kvd_http_error(resp, 500, "pin: %llu block(s) could not be pinned (out of memory)",
                   (unsigned long long)failed);
    return;
  }
  reply(resp, json_pack("{s:I,s:I}", pin ? "pinned" : "unpinned", (json_int_t)done, "missing",
                        (json_int_t)missing));
}

/* --- the two handlers ------------------------------------------------------------------ */

static int admin_route(const char *path) {
  for (size_t i = 0; i < NADMIN; i++)
    if (!strcmp(path, admin_routes[i])) return (int)i;
  return -1;
}

static void on_stats(void *arg, const kvd_http_req *req, kvd_http_resp *resp) {
  kvd_ops *o = arg;
  o->d->m.stats_requests++;
  if (req->tcp && strcmp(req->path, "/metrics") && strcmp(req->path, "/health")) {
    kvd_http_error(resp, 403,
                   "%s is served on the Unix sockets only (over TCP: /metrics and /health)",
                   req->path);
    return;
  }
  int r = admin_route(req->path);
  int read_only = r == 0 && (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD"));
  if (r >= 0 && !read_only) {
    kvd_http_error(resp, 403, "%s %s is served on the admin socket only", req->method, req->path);
    return;
  }
  if (kvd_stats_route(o->d, req, resp)) return;
  kvd_http_error(resp, 404, "no route %s", req->path);
}

static void on_admin(void *arg, const kvd_http_req *req, kvd_http_resp *resp) {
  kvd_ops *o = arg;
  kvd *d = o->d;
  d->m.admin_requests++;
  if (!req->has_cred || !kvd_ops_peer_allowed(o, &req->cred)) {
    if (req->conn_requests == 1)
      kv_warn("admin",
              "refused peer pid %d uid %d gid %d: not root, the daemon's user or admin.group",
              (int)req->cred.pid, (int)req->cred.uid, (int)req->cred.gid);
    kvd_http_error(resp, 403, "peer uid %d may not use the admin socket", (int)req->cred.uid);
    resp->close = 1;
    return;
  }
  int r = admin_route(req->path);
  if (r < 0) {
    if (!kvd_stats_route(d, req, resp)) kvd_http_error(resp, 404, "no route %s", req->path);
    return;
  }
  if (r == 0 && !strcmp(req->method, "GET")) { /* GET /config: the read-only route */
    kvd_stats_route(d, req, resp);
    return;
  }
  if (strcmp(req->method, "POST")) {
    kvd_http_error(resp, 405, "%s takes POST", req->path);
    return;
  }
  switch (r) {
  case 0: route_config(d, req, resp); break;
  case 1: route_evict(d, req, resp); break;
  case 2: route_flush(d, req, resp); break;
  case 3: route_pin(d, req, resp, 1); break;
  case 4: route_pin(d, req, resp, 0); break;
  }
}

int kvd_ops_start(kvd_ops *o, kvd *d, uv_loop_t *loop) {
  memset(o, 0, sizeof *o);
  o->d = d;
  if (d->cfg.admin_group[0]) {
    /* kv_config_check refused an unknown group before start; it may have gone since. */
    int rc = kv_config_admin_gid(&d->cfg, &o->admin_gid);
    if (rc) {
      kv_error("admin", "admin.group '%s': %s", d->cfg.admin_group,
               rc == -ENOENT ? "no such group" : strerror(-rc));
      return rc;
    }
    o->has_gid = 1;
  }
  kvd_http_init(&o->stats, loop, "stats", on_stats, o);
  kvd_http_init(&o->admin, loop, "admin", on_admin, o);
  kvd_http_set_limits(&o->stats, d->cfg.stats_connections, d->cfg.stats_tcp_connections,
                      d->cfg.stats_request_timeout_ms);
  kvd_http_set_limits(&o->admin, d->cfg.admin_connections, 0, d->cfg.stats_request_timeout_ms);
  d->m.http[KVD_SOCK_STATS] = &o->stats.st[KVD_HTTP_UNIX];
  d->m.http[KVD_SOCK_STATS_TCP] = d->cfg.stats_listen[0] ? &o->stats.st[KVD_HTTP_TCP] : NULL;
  d->m.http[KVD_SOCK_ADMIN] = &o->admin.st[KVD_HTTP_UNIX];
  int rc = kvd_http_listen_unix(&o->stats, d->cfg.socket_dir, KV_STATS_SOCKET_NAME, 0666);
  if (!rc && d->cfg.stats_listen[0]) rc = kvd_http_listen_tcp(&o->stats, d->cfg.stats_listen);
  if (!rc) rc = kvd_http_listen_unix(&o->admin, d->cfg.socket_dir, KV_ADMIN_SOCKET_NAME, 0600);
  if (rc) {
    for (int i = 0; i < KVD_SOCK_COUNT; i++) d->m.http[i] = NULL;
    kvd_http_close(&o->stats);
    kvd_http_close(&o->admin);
    return rc;
  }
  return 0;
}

void kvd_ops_stop(kvd_ops *o) {
  if (o->d)
    for (int i = 0; i < KVD_SOCK_COUNT; i++) o->d->m.http[i] = NULL;
  kvd_http_close(&o->stats);
  kvd_http_close(&o->admin);
}
