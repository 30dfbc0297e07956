/*
 * defer.h - requests that wait for room: one queue per kind of operation
 * (LOAD, ALLOC), one mechanism for all of them.
 *
 * A request that cannot finish until room appears in a tier (a G2 slot
 * freed when a demotion's write completes) embeds a kvd_waiter and
 * registers it with its operation's queue (kvd_defer_wait). The queue
 * retries its waiters, oldest first, when room may have come
 * (kvd_defer_retry: after G3 or G1 completions); answers those that have
 * waited longer than the deadline (kvd_defer_expire: from the daemon's
 * tick); gives up, without answering, a waiter whose session went
 * (noticed on either walk, before anything else is done for it); and at
 * shutdown cancels whatever still waits (kvd_defer_cancel_all). What a
 * retry, an expiry or a cancellation does to the request is the
 * operation's, through its kvd_defer_ops; the queue keeps the order, the
 * time each waiter first waited, and the counts.
 *
 * A waiter is in at most one queue, once; the time it first waited
 * survives a retry that leaves it waiting. Callbacks may register other
 * waiters with the queue being walked: those wait for the next walk. Loop
 * thread only.
 */
#ifndef KV_DAEMON_DEFER_H
#define KV_DAEMON_DEFER_H

#include <stdint.h>

#include "daemon/sink.h"

typedef struct kvd_waiter kvd_waiter;

typedef struct kvd_defer_ops {
  const char *name;       /* the log's subsystem: "load", "alloc" */
  const char *expired_as; /* the log's words for an expiry's answer */
  /* Tries the request again. 1: it still waits (it stays queued, in its
   * place); 0: it no longer waits (it may have been answered and freed). */
  int (*retry)(kvd_waiter *w);
  /* Its deadline passed: answers what still waits and returns how many
   * blocks that was. The waiter is out of the queue; it may be freed. */
  uint32_t (*expire)(kvd_waiter *w);
  /* Nobody is left to answer (the session went), or the daemon stops:
   * gives up what still waits. The waiter is out of the queue; it may be
   * freed. */
  void (*cancel)(kvd_waiter *w);
} kvd_defer_ops;

struct kvd_waiter {
  kvd_sink *sink; /* the request's; its sess is NULL once the session went */
  uint64_t since; /* kv_now_ms() when it first waited; 0: never */
  kvd_waiter *next;
  int queued;
};

typedef struct kvd_defer {
  const kvd_defer_ops *ops;
  kvd_waiter *head, **tail;
  uint32_t n;                                  /* waiters queued */
  uint64_t waits, retries, expired, cancelled; /* waiters registered, retried, expired, cancelled */
} kvd_defer;

void kvd_defer_init(kvd_defer *q, const kvd_defer_ops *ops);

/* Prepares w for a request answered through sink (the caller holds a
 * reference to it for as long as the request lives). */
void kvd_waiter_init(kvd_waiter *w, kvd_sink *sink);

/* Queues w at the back, if it is not queued already; its first wait is
 * now_ms unless it waited before. */
void kvd_defer_wait(kvd_defer *q, kvd_waiter *w, uint64_t now_ms);

/* 1 while w is queued. */
static inline int kvd_waiter_queued(const kvd_waiter *w) { return w->queued; }

/* Retries every waiter queued when it is called, oldest first. */
void kvd_defer_retry(kvd_defer *q);

/* Expires the waiters that have waited timeout_ms or more by now_ms, and
 * logs the blocks answered (a warning, once per call). Returns how many. */
uint32_t kvd_defer_expire(kvd_defer *q, uint64_t now_ms, uint32_t timeout_ms);

/* Cancels every waiter (shutdown). */
void kvd_defer_cancel_all(kvd_defer *q);

#endif
