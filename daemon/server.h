/*
 * server.h - the worker socket: accepts connections, turns bytes into
 * frames and frames into handler calls, and sends the replies.
 *
 * Every connection is polled by the daemon's libuv loop (uv_poll on the raw
 * socket, so an fd can travel with a reply). A connection's session -
 * its pins and uncommitted allocations - is released the moment the socket
 * reports end of stream or an error, before anything else runs. A frame
 * that is malformed but keeps the stream in sync gets an ERROR reply and
 * the connection goes on; a stream that cannot be resynchronised (bad
 * magic, wrong version, an oversized length, fd trouble) gets one ERROR
 * reply and is closed. "Oversized" is judged from the header, before any
 * payload is buffered, against the connection's state: before HELLO, the
 * largest HELLO; after it, the opcode's layout, and for PUT the session's
 * block size (proto/PROTOCOL.md, section 5). A peer that does not read its replies is not
 * allowed to make the daemon buffer without bound: past KVD_OUT_MAX bytes
 * waiting, the daemon stops reading from it until they drain; and while
 * the replies all connections owe add up to more than limits.out_bytes,
 * the connection that owes the most is closed (counted, logged at most
 * once a second), so that many such peers cannot either.
 *
 * Admission: the peer's credentials are read at accept (into the
 * session's peer_uid, peer_gid, peer_pid). A connection over
 * limits.connections (lowered to what RLIMIT_NOFILE leaves beside the
 * operator sockets and KVD_FD_SPARE, re-read every second) or
 * limits.connections_per_uid gets
 * one ERROR -EAGAIN saying which, and is closed; so is one accepted when
 * descriptors ran out (daemon/accept.h: the listener never spins). A
 * connection without a session limits.hello_timeout_ms after its accept is
 * closed. Each refusal and close is counted (kvd_stats) and logged
 * (rate-limited).
 */
#ifndef KV_DAEMON_SERVER_H
#define KV_DAEMON_SERVER_H

#include <uv.h>

#include "base/paths.h"
#include "daemon/kvd.h"
#include "ipc/sock.h"

#define KVD_OUT_MAX ((size_t)16 << 20)

typedef struct kvd_conn kvd_conn;

typedef struct kvd_server {
  kvd *d;
  uv_loop_t *loop;
  kv_listener lst;
  uv_poll_t lpoll;
  int listening;
  int paused;       /* lpoll stopped after an accept error; the sweep resumes it */
  uv_timer_t sweep; /* HELLO deadlines, and resuming a paused listener */
  int sweeping;
  uint32_t nconns;    /* connections open */
  uint32_t max_conns; /* limits.connections within the descriptor budget */
  u32map per_uid;     /* peer uid -> connections open */
  kvd_conn *conns;
  kvd_ratelog out_log; /* the "owes the most" lines */
  int64_t budget_ms;   /* max_conns last computed */
} kvd_server;

/* Listens on <socket_dir>/kvcached.sock. 0 or -errno (logged). */
int kvd_server_start(kvd_server *s, kvd *d, uv_loop_t *loop);

/* Stops accepting and removes the socket file; live connections go on. */
void kvd_server_stop_listening(kvd_server *s);

/* Closes every connection (their sessions released) after trying, for at
 * most timeout_ms, to send the replies they are owed. */
void kvd_server_close_all(kvd_server *s, int timeout_ms);

#endif
