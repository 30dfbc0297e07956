/* defer.c - requests that wait for room (see defer.h). */
#include "daemon/defer.h"

#include <stddef.h>

#include "base/log.h"

void kvd_defer_init(kvd_defer *q, const kvd_defer_ops *ops) {
  *q = (kvd_defer){.ops = ops};
  q->tail = &q->head;
}

void kvd_waiter_init(kvd_waiter *w, kvd_sink *sink) { *w = (kvd_waiter){.sink = sink}; }

static void push(kvd_defer *q, kvd_waiter *w) {
  w->next = NULL;
  w->queued = 1;
  *q->tail = w;
  q->tail = &w->next;
  q->n++;
}

void kvd_defer_wait(kvd_defer *q, kvd_waiter *w, uint64_t now_ms) {
  if (w->queued) return;
  if (!w->since) w->since = now_ms;
  q->waits++;
  push(q, w);
}

/* Takes the whole queue out: what callbacks register meanwhile goes to a
 * fresh one. */
static kvd_waiter *take_all(kvd_defer *q) {
  kvd_waiter *list = q->head;
  q->head = NULL;
  q->tail = &q->head;
  q->n = 0;
  return list;
}

/* Puts the waiters kept by a walk (kept, in order) before those that were
 * registered during it. */
static void put_back(kvd_defer *q, kvd_waiter *kept, kvd_waiter **kept_tail, uint32_t nkept) {
  if (!kept) return;
  *kept_tail = q->head;
  if (!q->head) q->tail = kept_tail;
  q->head = kept;
  q->n += nkept;
}

/* Walks the waiters queued now: cancels those whose session went, then
 * retries the others (timeout_ms 0) or expires those past their deadline.
 * Returns the blocks expired. */
static uint32_t walk(kvd_defer *q, int expire, uint64_t now_ms, uint32_t timeout_ms) {
  kvd_waiter *list = take_all(q), *kept = NULL, **kept_tail = &kept;
  uint32_t nkept = 0, expired = 0;
  while (list) {
    kvd_waiter *w = list;
    list = w->next;
    w->next = NULL;
    w->queued = 0;
    int keep;
    if (!w->sink->sess) {
      q->cancelled++;
      q->ops->cancel(w);
      keep = 0;
    } else if (expire) {
      keep = now_ms - w->since < timeout_ms;
      if (!keep) {
        q->expired++;
        expired += q->ops->expire(w);
      }
    } else {
      q->retries++;
      keep = q->ops->retry(w);
    }
    if (keep && !w->queued) { /* queued already if a callback registered it again */
      w->queued = 1;
      *kept_tail = w;
      kept_tail = &w->next;
      nkept++;
    }
  }
  put_back(q, kept, kept_tail, nkept);
  return expired;
}

void kvd_defer_retry(kvd_defer *q) {
  if (q->head) walk(q, 0, 0, 0);
}

uint32_t kvd_defer_expire(kvd_defer *q, uint64_t now_ms, uint32_t timeout_ms) {
  if (!q->head) return 0;
  uint32_t n = walk(q, 1, now_ms, timeout_ms);
  if (n)
    kv_warn(q->ops->name, "%u block(s) waited more than %u ms for G2 room: %s", n, timeout_ms,
            q->ops->expired_as);
  return n;
}

void kvd_defer_cancel_all(kvd_defer *q) {
  kvd_waiter *list = take_all(q);
  while (list) {
    kvd_waiter *w = list;
    list = w->next;
    w->next = NULL;
    w->queued = 0;
    q->cancelled++;
    q->ops->cancel(w);
  }
}
