/*
 * alloc.c - ALLOC: G2 slots for blocks a worker is about to write.
 *
 * Each key gets a slot of the session's namespace, evicting as needed.
 * With the SSD tier attached an eviction is a demotion, and the victim's
 * slot is free only when its bytes are on the SSD: a key that finds no
 * free slot meanwhile (-EAGAIN from the core) does not fail - the ALLOC
 * waits in d->alloc_waiting and those keys are retried after each batch of
 * G3 completions, like a LOAD waiting for room (load.c). The reply goes
 * out when every key is final; a key still waiting after
 * daemon.load_timeout_ms is answered -EAGAIN (retry later). A worker that
 * disconnects while its ALLOC waits gets nothing more: what the ALLOC had
 * allocated went with its session, and no further slot is taken for it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/kvd.h"
#include "base/clock.h"
#include "base/log.h"

#define WAIT 1 /* entry status while waiting for room */

struct kvd_alloc {
  kvd *d;
  kvd_sink *sink;
  kv_msg req;          /* id and op, for the reply */
  uint32_t n, waiting, core_ns;
  uint8_t prio;
  uint64_t since;      /* kv_now_ms() when it first waited */
  kvd_alloc *next;
  kv_key *keys;
  kv_key *parents;     /* len 0: no parent */
  kv_alloc_ent *ent;
};

/* Tries key i: its entry is final, or WAIT. */
static void try_one(kvd *d, kvd_session *s, uint32_t core_ns, const kv_key *key,
                    const kv_key *parent, uint8_t prio, kv_alloc_ent *e) {
  kv_block *b;
  e->offset = 0;
  if (!kvd_session_may_alloc(s, d->cfg.limit_allocs_per_session)) {
    e->status = -EDQUOT;
    d->st.allocs_refused++;
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
    if (a) { free(a->keys); free(a->parents); free(a->ent); free(a); }
    return -ENOMEM;
  }
  *a = (kvd_alloc){d, sink, *req, n, 0, core_ns, r->prio, (uint64_t)kv_now_ms(), NULL,
                   a->keys, a->parents, a->ent};
  kvd_sink_get(sink);
  memcpy(a->keys, d->keys, n * sizeof *a->keys);
  memcpy(a->ent, d->allocs, n * sizeof *a->ent);
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *pb = kv_alloc_parent(r, i);
    if (pb) kv_key_set(&a->parents[i], pb, r->keys.klen);
    if (a->ent[i].status == WAIT) a->waiting++;
  }
  a->next = d->alloc_waiting;
  d->alloc_waiting = a;
  return 0;
}

int kvd_op_alloc(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out) {
  const kv_alloc_req *r = &req->alloc;
  kvd_session *s = sink->sess;
  if (r->tier != KV_G2) return kvd_fail(out, req, -EOPNOTSUPP, "ALLOC serves tier G2 in this build");
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

/* Walks the waiting ALLOCs: retry (expire = 0) or time out (expire = 1).
 * Returns the keys answered with a timeout. */
static uint32_t walk(kvd *d, int expire) {
  uint64_t now = (uint64_t)kv_now_ms();
  uint32_t expired = 0;
  kvd_alloc *list = d->alloc_waiting, **keep = &d->alloc_waiting;
  d->alloc_waiting = NULL;
  while (list) {
    kvd_alloc *a = list;
    list = a->next;
    a->next = NULL;
    if (!a->sink->sess) { /* gone: nobody to answer, nothing more to take */
      free_alloc(a);
      continue;
    }
    int late = expire && now - a->since >= a->d->cfg.load_timeout_ms;
    for (uint32_t i = 0; i < a->n && a->waiting; i++) {
      if (a->ent[i].status != WAIT) continue;
      if (late) {
        a->ent[i].status = -EAGAIN;
        expired++;
      } else {
        try_one(d, a->sink->sess, a->core_ns, &a->keys[i], &a->parents[i], a->prio, &a->ent[i]);
        if (a->ent[i].status == WAIT) break; /* no room yet: later keys wait too */
      }
      if (a->ent[i].status != WAIT) a->waiting--;
    }
    if (a->waiting == 0) {
      answer(a);
    } else {
      *keep = a;
      keep = &a->next;
    }
  }
  return expired;
}

void kvd_allocs_retry(kvd *d) {
  if (d->alloc_waiting) walk(d, 0);
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core);
}

uint32_t kvd_allocs_expire(kvd *d) {
  if (!d->alloc_waiting) return 0;
  uint32_t n = walk(d, 1);
  if (n)
    kv_warn("alloc", "%u block(s) waited more than %u ms for G2 room: answered -EAGAIN", n,
            d->cfg.load_timeout_ms);
  return n;
}

void kvd_allocs_fini(kvd *d) {
  while (d->alloc_waiting) {
    kvd_alloc *a = d->alloc_waiting;
    d->alloc_waiting = a->next;
    for (uint32_t i = 0; i < a->n; i++)
      if (a->ent[i].status == WAIT) a->ent[i].status = -ECANCELED;
    answer(a);
  }
}
