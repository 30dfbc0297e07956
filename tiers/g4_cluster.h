/*
 * g4_cluster.h - a small Redis Cluster client on a caller-owned libuv loop:
 * the transport of the G4 tier (tiers/G4.md). hiredis async contexts, one
 * per node, carry the commands; this file adds what hiredis 0.14 lacks:
 * the slot map, routing, redirections, timeouts, reconnection.
 *
 * - Routing: a command names the key it routes by (binary, any length); its
 *   hash slot (CRC16 of the key or of its {hash tag}, as Redis does) picks
 *   the slot's master from the map read with CLUSTER SLOTS. With
 *   read_replicas on, commands flagged KV_G4C_READONLY go to the slot's
 *   replicas in turn (their connections send READONLY), the master when
 *   none is connected.
 * - Redirections: -MOVED updates the map for that slot, resends the command
 *   there and schedules a re-read of the whole map; -ASK sends ASKING and
 *   the command to the named node, once. At most max_redirects of them per
 *   command, then the command fails (reason MOVED or ASK).
 * - Connections: made on first use (AUTH, as password or as ACL user and
 *   password, and READONLY queued first), lost ones are retried with
 *   exponential backoff; the masters of the map are reconnected on their
 *   own, so the client comes back after an outage without traffic.
 * - Host names (seeds, CLUSTER SLOTS, MOVED: Redis 7's
 *   cluster-preferred-endpoint-type hostname) are looked up off the loop,
 *   with uv_getaddrinfo on libuv's thread pool, before each connection;
 *   commands for the node wait meanwhile, as they do while a connection is
 *   made. A lookup not done within connect_timeout_ms fails the node (CONN,
 *   then its backoff); IP addresses are connected to without a lookup.
 * - Bounded by what it is told: a CLUSTER SLOTS reply with more ranges
 *   than slots, a range outside 0..16383 or a slot in two ranges is
 *   refused whole (the map unchanged, refresh_fails counted); the map is
 *   built in time linear in the reply and the state is kept up to date as
 *   the map and the connections change (kv_g4c_get_state is O(1)). At most
 *   KV_G4C_NODES_MAX nodes: a node that the map no longer names and no
 *   command is addressed to is closed and freed.
 * - Bounded replies: hiredis 0.14 builds a reply whole, of any size, on the
 *   loop before the client sees it. Each connection's reader builds with
 *   the client's own functions (the same objects: freeReplyObject frees
 *   them) that refuse, as the reply is read: a string longer than
 *   max_string (once its length line is in: nothing of it buffered), a
 *   status, error or any other line over KV_G4C_LINE_MAX, more than
 *   KV_G4C_REPLY_ELEMENTS_MAX array elements in one reply (all levels,
 *   counted when each array announces its length), more than max_string
 *   + KV_G4C_REPLY_BYTES_EXTRA string bytes in one reply, and a reply to
 *   no command (hiredis 0.14 asserts on one). The connection is dropped (a
 *   warning naming the node, replies_refused counted), its commands fail
 *   (CONN, "reply over the limits (why)"), the node is tried again after
 *   its backoff.
 * - Failure is fast and final: a command gets exactly one callback, within
 *   timeout_ms of its submission (plus one loop turn), whatever the
 *   cluster does: a value, nil, or an error with a reason. A command to a
 *   node that is down fails at once (CONN); nothing is retried behind the
 *   caller's back except redirections. For a cache, a failure is a miss.
 *
 * Callbacks are never called from inside the call that submitted the
 * command (or from kv_g4c_close): such outcomes are delivered from the loop.
 * Every function is called on the loop's thread. Errors: 0 or -errno.
 */
#ifndef KV_TIERS_G4_CLUSTER_H
#define KV_TIERS_G4_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct redisReply;
typedef struct kv_g4c kv_g4c;

#define KV_G4C_SLOTS     16384
#define KV_G4C_SEEDS_MAX 64
/* The most nodes a client knows at once (Redis advises clusters of at most
 * 1000): a MOVED or ASK to a new node while the table is full fails that
 * command (reason MOVED or ASK, "node table is full"); a map naming more
 * leaves the rest out (their slots unmapped: degraded). */
#define KV_G4C_NODES_MAX 1024
/* Reply limits (see above; tiers/G4.md). The longest string by default:
 * the longest G4 value, KV_G4_PAYLOAD_MAX + KV_G4_HDR_LEN (g4_format.h). */
#define KV_G4C_STRING_MAX ((size_t)(512u << 20) + 128u)
#define KV_G4C_LINE_MAX   (64u << 10)
/* A CLUSTER SLOTS reply of 16384 ranges of a master and 4 replicas, each
 * node [ip, port, id, [hostname, name]] as Redis 7 sends, is 16384 * 38
 * elements; any other reply G4 gets is far smaller. */
#define KV_G4C_REPLY_ELEMENTS_MAX (KV_G4C_SLOTS * 40)
#define KV_G4C_REPLY_BYTES_EXTRA  (64u << 20)

typedef enum {
  KV_G4C_OK = 0,   /* every slot has a master and every master is reachable */
  KV_G4C_DEGRADED, /* some slots unmapped or their master unreachable */
  KV_G4C_DOWN,     /* no slot map yet, or no master reachable */
} kv_g4c_state;

/* Why a command failed. Append only: the names are metric labels. */
#define KV_G4C_REASON_MAP(X)                                                 \
  X(NONE, "none")       /* not a failure */                                  \
  X(TIMEOUT, "timeout") /* no reply within timeout_ms */                     \
  X(CONN, "conn")       /* node unreachable, connection lost or in backoff */ \
  X(MOVED, "moved")     /* still redirected after max_redirects */           \
  X(ASK, "ask")         /* the same, the last redirection an ASK */          \
  X(OOM, "oom")         /* the node is full (maxmemory refused a write) */   \
  X(DOWN, "down")       /* no node for the slot; CLUSTERDOWN, LOADING,       \
                           TRYAGAIN */                                       \
  X(AUTH, "auth")       /* NOAUTH, WRONGPASS, NOPERM */                      \
  X(CLOSED, "closed")   /* the client was closed first */                    \
  X(OTHER, "other")     /* any other server error, or a malformed reply */
typedef enum {
#define KV_G4C_REASON_ENUM(name, label) KV_G4C_R_##name,
  KV_G4C_REASON_MAP(KV_G4C_REASON_ENUM)
#undef KV_G4C_REASON_ENUM
  KV_G4C_R_COUNT
} kv_g4c_reason;

typedef enum {
  KV_G4C_VALUE = 0, /* a reply: string, integer, status or array (raw) */
  KV_G4C_NIL,       /* a nil reply: the key is absent */
  KV_G4C_ERROR,     /* failed: reason, err, and str/len the message */
} kv_g4c_kind;

/* What a callback gets; valid only during the callback. */
typedef struct kv_g4c_reply {
  kv_g4c_kind kind;
  kv_g4c_reason reason;          /* KV_G4C_R_NONE unless kind is ERROR */
  int err;                       /* 0, or -ETIMEDOUT, -ENOTCONN, -ENOSPC (OOM),
                                  * -EAGAIN (DOWN), -EACCES (AUTH),
                                  * -ECANCELED (CLOSED), -EREMOTE (MOVED, ASK),
                                  * -EPROTO (OTHER) */
  const char *str;               /* VALUE string/status: its bytes (binary);
                                  * ERROR: a message; NULL otherwise */
  size_t len;
  long long integer;             /* VALUE integer */
  const struct redisReply *raw;  /* VALUE: hiredis' reply (arrays); else NULL */
} kv_g4c_reply;

typedef void (*kv_g4c_cb)(kv_g4c *c, const kv_g4c_reply *r, void *arg);

/* In a callback: takes the bytes of r, a VALUE string, from the reply
 * instead of copying them - the caller owns them (free()) and r->str is
 * not to be read after; NULL when r is no VALUE string. */
void *kv_g4c_reply_take(const kv_g4c_reply *r);
typedef void (*kv_g4c_close_cb)(kv_g4c *c, void *arg);

typedef struct kv_g4c_opts {
  const char *const *seeds; /* "host:port" (an IP address or a host name),
                             * 1..KV_G4C_SEEDS_MAX */
  unsigned nseeds;
  const char *user;         /* ACL user, with password; NULL: AUTH password */
  const char *password;     /* NULL: no AUTH */
  int timeout_ms;           /* per command, from submission; 0: 1000 */
  int connect_timeout_ms;   /* a host name lookup, then a connect; 0: timeout_ms */
  int backoff_min_ms;       /* first reconnect delay; 0: 100 */
  int backoff_max_ms;       /* doubling up to; 0: 2000 */
  int refresh_ms;           /* map re-read while healthy; 0: 30000, < 0: only
                             * when something says it changed */
  int max_redirects;        /* 0: 5 */
  int read_replicas;        /* KV_G4C_READONLY commands may go to replicas */
  size_t max_string;        /* the longest string a reply may hold (a value
                             * read); 0: KV_G4C_STRING_MAX */
} kv_g4c_opts;

/* Counters since open. */
typedef struct kv_g4c_stats {
  uint64_t commands;                 /* accepted by kv_g4c_command */
  uint64_t values, nils;             /* outcomes other than errors */
  uint64_t errors[KV_G4C_R_COUNT];   /* outcomes by reason */
  uint64_t moved, ask;               /* redirections followed */
  uint64_t refreshes, refresh_fails; /* slot map reads */
  uint64_t connects, conn_fails;     /* connections made; attempts failed or
                                      * connections lost */
  uint64_t replies_refused;          /* over the limits: connection dropped */
  uint64_t bytes_out;                /* commands as sent (RESP), resends too */
  uint64_t bytes_in;                 /* reply payload bytes (strings) */
  uint64_t in_flight;                /* commands without their callback yet */
  unsigned nodes, masters;           /* known (at most KV_G4C_NODES_MAX),
                                      * and masters in the map */
  unsigned slots;                    /* slots with a master */
  kv_g4c_state state;
} kv_g4c_stats;

/* kv_g4c_command flags */
#define KV_G4C_READONLY 1u /* a read: may be served by a replica */

/* Opens a client on loop. Nothing blocks: the first slot map is read in the
 * background; commands sent before it arrives go to a seed and follow its
 * MOVED. 0 and *out, or -EINVAL (no seeds, a seed not "host:port", bad
 * options: a max_string over SIZE_MAX / 4), -ENOMEM. */
int kv_g4c_open(uv_loop_t *loop, const kv_g4c_opts *o, kv_g4c **out);

/* Sends argv[0..argc) (binary-safe: argvlen[i] bytes each; argvlen NULL:
 * NUL-terminated strings) to the node serving key[0..keylen) (the key is
 * only for routing: it need not appear in argv). cb(c, reply, arg) is called
 * exactly once, later, from the loop. 0 when accepted; -EINVAL (argc < 1,
 * keylen 0), -ESHUTDOWN (the client is closing), -ENOMEM: no callback. */
int kv_g4c_command(kv_g4c *c, const void *key, size_t keylen, unsigned flags, int argc,
                   const char *const *argv, const size_t *argvlen, kv_g4c_cb cb, void *arg);

/* kv_g4c_command with the command already in RESP, cmd[0..len) (malloc'ed):
 * the client takes it, and frees it whatever the outcome (an error return
 * too). For a value built in place: see kv_g4c_resp. */
int kv_g4c_command_resp(kv_g4c *c, const void *key, size_t keylen, unsigned flags, char *cmd,
                        size_t len, kv_g4c_cb cb, void *arg);

/* The RESP of argv[0..argc) (argvlen NULL: NUL-terminated strings), as a
 * command is sent: its length; written to out unless out is NULL (then
 * only measured). Argument hole (-1: none) is not written: its argvlen
 * bytes' place is left at out + *hole_at, for the caller to fill (a value
 * built there, not copied). */
size_t kv_g4c_resp(char *out, int argc, const char *const *argv, const size_t *argvlen, int hole,
                   size_t *hole_at);

/* Closes the client: commands not answered yet get a CLOSED error, every
 * connection and handle is closed, host name lookups not started yet are
 * cancelled (one already running is waited for: the system resolver's own
 * timeout bounds it), then cb(c, arg) is called from the loop and the
 * client is freed. Calling it from a callback is allowed; calling it twice
 * is not. */
void kv_g4c_close(kv_g4c *c, kv_g4c_close_cb cb, void *arg);

/* O(1): kept up to date as the map and the connections change. */
kv_g4c_state kv_g4c_get_state(const kv_g4c *c);
const char *kv_g4c_state_name(kv_g4c_state s);
/* The reason's metric label ("timeout"), or "?". */
const char *kv_g4c_reason_name(int r);
void kv_g4c_get_stats(const kv_g4c *c, kv_g4c_stats *st);

/* CRC16-CCITT (XModem), the one Redis Cluster uses: "123456789" -> 0x31C3. */
uint16_t kv_g4c_crc16(const void *buf, size_t len);
/* The hash slot of key[0..len): CRC16 of the key, or of the part between
 * its first '{' and the first '}' after it when that part is not empty,
 * mod 16384. */
unsigned kv_g4c_slot(const void *key, size_t len);

#endif
