/*
 * kvd.h - the daemon's state, shared by its loop, its connections and the
 * handlers of each operation. One instance per process; only the loop's
 * thread touches it. Its life - built, run with every event source,
 * taken down - is kvd.c's (kvd_init, kvd_main, kvd_fini); requests reach
 * the handlers through one table of opcodes (kvd_handle, handlers.c);
 * those that must wait for room wait in a kvd_defer queue (defer.h).
 */
#ifndef KV_DAEMON_KVD_H
#define KV_DAEMON_KVD_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/defer.h"
#include "daemon/g1.h"
#include "daemon/g3_watch.h"
#include "daemon/g4.h"
#include "daemon/presence.h"
#include "daemon/registry.h"
#include "daemon/session.h"
#include "daemon/sink.h"
#include "daemon/stats.h"
#include "daemon/trust.h"
#include "proto/wire.h"
#include "tiers/core.h"

/* Why a worker connection was refused at accept. */
typedef enum {
  KVD_REFUSED_FD_LIMIT = 0,   /* out of descriptors, or over what RLIMIT_NOFILE leaves */
  KVD_REFUSED_TOTAL,          /* limits.connections */
  KVD_REFUSED_PER_UID,        /* limits.connections_per_uid */
  KVD_REFUSED_NO_CREDENTIALS, /* SO_PEERCRED failed: the peer cannot be told apart */
  KVD_REFUSED_COUNT
} kvd_refused;
extern const char *const kvd_refused_names[KVD_REFUSED_COUNT];

typedef struct kvd_stats {
  uint64_t sessions_opened, sessions_closed;
  uint64_t frames_in, frames_out, bad_frames;
  uint64_t pins_released_on_close, allocs_aborted_on_close;
  uint64_t pins_refused, allocs_refused; /* keys answered -EDQUOT: limits.*_per_session */
  uint64_t share_refused; /* keys answered KV_ESHARE: limits.session_share */
  uint64_t ops[KV_OP_COUNT];
  uint64_t hints[KV_HINT_KIND_COUNT];  /* HINT requests by kind */
  uint64_t hint_stops[KV_STOP_COUNT];  /* FINISHED hints by stop reason */
  uint64_t hints_unmatched;            /* hinted keys with no block committed or being written */
  uint64_t frames_over_limit; /* refused from the header: over frame_limit() (server.c) */
  uint64_t conns_refused[KVD_REFUSED_COUNT];
  uint64_t hello_timeouts; /* connections closed without a session in time */
  uint32_t conns_max;      /* limits.connections within the descriptor budget */
  uint64_t out_bytes;      /* reply bytes all worker connections owe now */
  uint64_t out_max_conn;   /* the most one connection owed at the last sweep */
  uint64_t out_limit;      /* limits.out_bytes in effect */
  uint64_t out_closed;     /* connections closed for owing the most over it */
} kvd_stats;

typedef struct kvd {
  kv_config cfg;
  kv_core *core;
  kvd_registry reg;
  uint64_t next_session_id;
  uint32_t nsessions;
  uint64_t start_ms;
  kvd_stats st;
  /* Scratch for batch handlers, KV_BATCH_MAX entries each. */
  kv_key *keys;
  uint8_t *tiers;
  int32_t *status;
  kv_load_ent *loads;
  kv_alloc_ent *allocs;
  kv_block **blocks;
  kv_g3 *g3;            /* NULL when no SSD tier is configured */
  kvd_g1s g1;           /* the device pools; g1.on = 0 when G1 is off */
  kvd_defer load_wait;  /* LOADs waiting for room (load.c, defer.h) */
  kvd_defer alloc_wait; /* ALLOCs waiting for G2 room (alloc.c, defer.h) */
  kvd_metrics m;        /* latencies, miss reasons (stats.h) */
  kvd_session admin;    /* pins the operator took (POST /pin), released at fini */
  kvd_g3w g3w;          /* G3 unavailable, its checks and poll (g3_watch.h) */
  kvd_trust trust;      /* readers' corrupt-block reports (trust.h) */
  kvd_g4 g4;            /* the fleet's shared tier; g4.c == NULL when off (g4.h) */
  kvd_presence pres;    /* the tables workers answer lookups from (presence.h) */
} kvd;

/* kvd_handle()'s return when the reply will be sent later, through the sink. */
#define KVD_DEFERRED 1

/* Builds the core, the registry (tenant arenas) and, if configured, the G3
 * store (attached to the core: what it holds is served again), from
 * d->cfg; on failure, undoes what it built, the last first. 0 or an error,
 * logged. kvd_fini releases the operator's pins, closes G3 (its writes in
 * flight complete, its index commits), frees the rest; LOADs still
 * waiting for room are dropped (their connections are gone). kvd.c. */
int kvd_init(kvd *d);
void kvd_fini(kvd *d);

/* The whole daemon on cfg (checked; config_path, or NULL, is re-read on
 * SIGHUP): kvd_init, then the loop with every event source - the worker
 * socket, the operator sockets, the housekeeping tick (waits past
 * daemon.load_timeout_ms, namespace sweep, corrupt reports, soft limits),
 * G1 and G3 completions, the G3 watch, SIGTERM/SIGINT (stop) and SIGHUP -
 * until asked to stop; then sockets closed, waiting ALLOCs answered
 * -ECANCELED, owed replies sent (1 s at most), sources closed, kvd_fini.
 * Returns the exit status: 0 after a clean stop, 1 when the start failed
 * (logged; what was built is undone). kvd.c. */
int kvd_main(const kv_config *cfg, const char *config_path);

/*
 * Handles one decoded request of session s and appends exactly one reply
 * frame (the op's reply, or an ERROR reply) to out. When the reply carries
 * descriptors (HELLO: the G2 arena, then the G1 pool when it travels as an
 * fd), fd_out[0] and fd_out[1] are set to them (the daemon's own fds: the
 * caller sends copies, in that order, and does not close them), else -1.
 * Returns 0, or a negative error when the reply could not be encoded (the
 * caller then closes the connection).
 */
int kvd_handle(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]);

/* The handler of one opcode, with kvd_handle's contract; it may return
 * KVD_DEFERRED (the reply goes through the sink). */
typedef int kvd_op_fn(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]);

/* Shared by the handlers (reply.c): a reply header for req; an ERROR reply to req
 * with status and its text (for a sink); an ERROR reply appended to out
 * (msg NULL: the code's own text); the request's keys copied into
 * d->keys. */
kv_msg kvd_reply_to(const kv_msg *req);
kv_msg kvd_error_to(const kv_msg *req, int status);
int kvd_fail(kv_buf *out, const kv_msg *req, int status, const char *msg);
int kvd_load_keys(kvd *d, const kv_keyvec *v);
/* Counts a key of session s refused with KV_ESHARE (a LOAD's pin or an
 * ALLOC): the first refusal of a session is logged, saying why. */
void kvd_share_refused(kvd *d, kvd_session *s, const char *what);

/* LOOKUP's answer to req for keys[0..n) of registry namespace reg_ns (core
 * namespace core_ns): the hit length and each key's tier (in d->tiers,
 * which the reply points to), the misses classified; an ERROR reply when
 * the lookup fails. Used as soon as the keys are looked up, and by G4 once
 * its blocks are in (g4.c). reply.c. */
kv_msg kvd_lookup_answer(kvd *d, int reg_ns, uint32_t core_ns, const kv_key *keys, uint32_t n,
                         const kv_msg *req);

/* LOAD and PREFETCH (load.c): they may wait on the SSD tier. kvd_op_load
 * returns 0 (reply appended to out) or KVD_DEFERRED (the reply goes through
 * the sink when the last block is up). */
kvd_op_fn kvd_op_load;
/* GET (load.c): the block's bytes, verified, from G2; a block only on G3
 * is first brought up as a LOAD brings it (its reply is then deferred,
 * tier G3). A miss is an ERROR reply: KV_ENOTFOUND, KV_ECORRUPT (a bad G3
 * record or G2 bytes), the read's I/O error, or -ETIMEDOUT (no G2 room). */
kvd_op_fn kvd_op_get;
kvd_op_fn kvd_op_prefetch;
/* ALLOC (alloc.c): 0 (reply appended) or KVD_DEFERRED (keys wait for G2
 * room; the reply goes through the sink). */
kvd_op_fn kvd_op_alloc;
/* What a waiting LOAD and a waiting ALLOC do when retried, expired
 * (daemon.load_timeout_ms: a LOAD's blocks answer -ETIMEDOUT, an ALLOC's
 * keys -EAGAIN) or cancelled (-ECANCELED): d->load_wait's and
 * d->alloc_wait's (defer.h). */
extern const kvd_defer_ops kvd_load_defer_ops, kvd_alloc_defer_ops;
/* The G1 completion hook (kvd_g1.done, arg the kvd): ends the core's copy
 * and retries the LOADs waiting for room. */
void kvd_g1_copied(void *arg, uint64_t tag, int status);

#endif
