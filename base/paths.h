/*
 * paths.h - the well-known socket names, shared by the daemon, the client
 * library and the tools.
 *
 * The daemon listens in one directory ([server] socket_dir): the worker
 * socket, the stats socket (read-only HTTP) and the admin socket
 * (state-changing HTTP). Clients find the worker socket at
 * $KVCACHED_SOCKET, else at KV_SOCKET_PATH.
 */
#ifndef KV_BASE_PATHS_H
#define KV_BASE_PATHS_H

#define KV_SOCKET_DIR        "/run/kvcached"       /* [server] socket_dir's default */
#define KV_SOCKET_NAME       "kvcached.sock"       /* the worker protocol */
#define KV_STATS_SOCKET_NAME "kvcached-stats.sock" /* GET /stats, /metrics, ... */
#define KV_ADMIN_SOCKET_NAME "kvcached-admin.sock" /* POST /evict, /config, ... */
#define KV_SOCKET_PATH       KV_SOCKET_DIR "/" KV_SOCKET_NAME

#endif
