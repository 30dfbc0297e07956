/*
 * admin.h - the operator surface: the stats socket (read-only routes, to
 * anyone who can reach it; optionally /metrics and /health alone over TCP,
 * every other path answered 403 there) and the admin socket
 * (state-changing routes, to root, the daemon's own user and members of
 * admin.group, checked with SO_PEERCRED on every connection). The routes,
 * their arguments and answers are the contract of daemon/OPS.md.
 */
#ifndef KV_DAEMON_ADMIN_H
#define KV_DAEMON_ADMIN_H

#include <sys/types.h>
#include <uv.h>

#include "base/paths.h"
#include "daemon/http.h"
#include "daemon/kvd.h"

typedef struct kvd_ops {
  kvd *d;
  kvd_http stats, admin;
  int has_gid;
  gid_t admin_gid; /* admin.group's gid when has_gid */
} kvd_ops;

/* Listens on <socket_dir>/kvcached-stats.sock (0666), stats.listen when
 * set, and <socket_dir>/kvcached-admin.sock (0600).
 * 0 or -errno (logged; nothing is left listening). An admin.group that
 * does not exist is an error (-ENOENT). */
int kvd_ops_start(kvd_ops *o, kvd *d, uv_loop_t *loop);

/* Stops listening, removes the socket files, closes the connections
 * (their memory goes with the loop's next run). */
void kvd_ops_stop(kvd_ops *o);

/* 1 if a peer with these credentials may use the admin routes. */
int kvd_ops_peer_allowed(const kvd_ops *o, const kv_peercred *cred);

#endif
