/*
 * alloc.c - ALLOC: G2 slots for blocks a worker is about to write.
 *
 * Each key gets a slot of the session's namespace, evicting as needed.
 * With the SSD tier attached an eviction is a demotion, and the victim's
 * slot is free only when its bytes are on the SSD: a key that finds no
 * free slot meanwhile (-EAGAIN from the core) does not fail - the ALLOC
 * waits in d->alloc_wait (defer.h) and those keys are retried, in order,
 * after each batch of G3 completions, like a LOAD waiting for room
 * (load.c). The reply goes out when every key is final; a key still
 * waiting after daemon.load_timeout_ms is answered -EAGAIN (retry later),
 * and at shutdown -ECANCELED. A worker that disconnects while its ALLOC
 * waits gets nothing more: what the ALLOC had allocated went with its
 * session, and no further slot is taken for it.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "daemon/kvd.h"

#define WAIT 1 /* entry status while waiting for room */

typedef struct kvd_alloc {
  kvd_waiter w; /* in d->alloc_wait until every key is final */
  kvd *d;
  kvd_sink *sink;
  kv_msg req; /* id and op, for the reply */
  uint32_t n, waiting, core_ns;
  uint8_t prio;
  kv_key *keys;
  kv_key *parents; /* len 0: no parent */
  kv_alloc_ent *ent;
} kvd_alloc;

/* Tries key i: its entry is final, or WAIT. */
static void try_one(kvd *d, kvd_session *s, uint32_t core_ns, const kv_key *key,
                    const kv_key *parent, uint8_t prio, kv_alloc_ent *e) {
  kv_block *b;
  e->offset = 0;
  if ((e->status = kvd_session_may_alloc(s, d->cfg.limit_allocs_per_session))) {
    if (e->status == -EDQUOT) d->st.allocs_refused++;
    else kvd_share_refused(d, s, "allocate");
    return;
  }
  e->status = kv_core_alloc(d->core, core_ns, key, parent && parent->len ? parent : NULL, prio, &b);
  if (e->status == -EAGAIN) {
    e->status = WAIT;
    return;
  }
  if (e->status) return;
  if (kvd_session_track_alloc(s, b)) {
    kv_core_abort(d->core, b);
    e->status = -ENOMEM;
    return;
  }
  e->offset = kv_arena_offset(b->slot[KV_G2]);
}

static void free_alloc(kvd_alloc *a) {
  kvd_sink_put(a->sink);
  free(a->keys);
  free(a->parents);
  free(a->ent);
  free(a);
}

static void answer(kvd_alloc *a) {
  kv_msg m = kvd_reply_to(&a->req);
  m.alloc_rep.n = a->n;
  m.alloc_rep.v = a->ent;
  kvd_sink_reply(a->sink, &m);
  free_alloc(a);
}

/* Keeps the waiting keys of this ALLOC for later. 0, or -ENOMEM (the
 * caller then answers them -EAGAIN now). */
static int defer(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t core_ns) {
  const kv_alloc_req *r = &req->alloc;
  uint32_t n = r->keys.n;
  kvd_alloc *a = calloc(1, sizeof *a);
  if (a) {
    a->keys = malloc(n * sizeof *a->keys);
    a->parents = calloc(n, sizeof *a->parents);
    a->ent = malloc(n * sizeof *a->ent);
  }
  if (!a || !a->keys || !a->parents || !a->ent) {
    if (a) {
      free(a->keys);
      free(a->parents);
      free(a->ent);
      free(a);
    }
    return -ENOMEM;
  }
  *a = (kvd_alloc){.d = d,
                   .sink = sink,
                   .req = *req,
                   .n = n,
                   .core_ns = core_ns,
                   .prio = r->prio,
                   .keys = a->keys,
                   .parents = a->parents,
                   .ent = a->ent};
  kvd_sink_get(sink);
  kvd_waiter_init(&a->w, sink);
  memcpy(a->keys, d->keys, n * sizeof *a->keys);
  memcpy(a->ent, d->allocs, n * sizeof *a->ent);
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *pb = kv_alloc_parent(r, i);
    if (pb) kv_key_set(&a->parents[i], pb, r->keys.klen);
    if (a->ent[i].status == WAIT) a->waiting++;
  }
  kvd_defer_wait(&d->alloc_wait, &a->w, (uint64_t)kv_now_ms());
  return 0;
}

int kvd_op_alloc(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  const kv_alloc_req *r = &req->alloc;
  kvd_session *s = sink->sess;
  if (r->tier != KV_G2)
    return kvd_fail(out, req, -EOPNOTSUPP, "ALLOC serves tier G2 in this build");
  int rc = kvd_load_keys(d, &r->keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  uint32_t core_ns = (uint32_t)kvd_registry_ns(&d->reg, s->ns)->core_ns;
  uint32_t waiting = 0;
  for (uint32_t i = 0; i < r->keys.n; i++) {
    kv_key parent = {.len = 0};
    const uint8_t *pb = kv_alloc_parent(r, i);
    if (pb) kv_key_set(&parent, pb, r->keys.klen);
    try_one(d, s, core_ns, &d->keys[i], &parent, r->prio, &d->allocs[i]);
    waiting += d->allocs[i].status == WAIT;
  }
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core); /* a soft g2.capacity */
  if (waiting && defer(d, sink, req, core_ns) == 0) return KVD_DEFERRED;
  for (uint32_t i = 0; i < r->keys.n; i++)
    if (d->allocs[i].status == WAIT) d->allocs[i].status = -EAGAIN;
  kv_msg m = kvd_reply_to(req);
  m.alloc_rep.n = r->keys.n;
  m.alloc_rep.v = d->allocs;
  return kv_msg_encode(out, &m);
}

/* The queue's callbacks (defer.h) for an ALLOC waiting for room. */
static kvd_alloc *waiter_alloc(kvd_waiter *w) {
  return (kvd_alloc *)(void *)((char *)w - offsetof(kvd_alloc, w));
}

/* Answers the keys still waiting with status, and the ALLOC. Returns how
 * many there were. */
static uint32_t answer_waiting(kvd_alloc *a, int status) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < a->n; i++)
    if (a->ent[i].status == WAIT) {
      a->ent[i].status = status;
      n++;
    }
  answer(a);
  return n;
}

static int retry_alloc(kvd_waiter *w) {
  kvd_alloc *a = waiter_alloc(w);
  for (uint32_t i = 0; i < a->n && a->waiting; i++) {
    if (a->ent[i].status != WAIT) continue;
    try_one(a->d, a->sink->sess, a->core_ns, &a->keys[i], &a->parents[i], a->prio, &a->ent[i]);
    if (a->ent[i].status == WAIT) break; /* no room yet: later keys wait too */
    a->waiting--;
  }
  if (a->waiting) return 1;
  answer(a);
  return 0;
}

static uint32_t expire_alloc(kvd_waiter *w) { return answer_waiting(waiter_alloc(w), -EAGAIN); }

/* The reply is dropped when the connection is gone. */
static void cancel_alloc(kvd_waiter *w) { answer_waiting(waiter_alloc(w), -ECANCELED); }

const kvd_defer_ops kvd_alloc_defer_ops = {"alloc", "answered -EAGAIN", retry_alloc, expire_alloc,
                                           cancel_alloc};
