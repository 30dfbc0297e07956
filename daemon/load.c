/*
 * load.c - LOAD, GET and PREFETCH: pin blocks where the worker can read
 * them, bringing them up from the SSD when they are there only.
 *
 * A LOAD answers per block. Blocks already in the target tier are
 * answered at once; blocks in G3 only are promoted (kv_core_promote: a G2
 * slot, a verified read) and, for a LOAD to G1, then copied up from G2
 * (kv_core_promote_g1); the reply waits for the last of them. A block
 * whose G2 -> G1 copy fails is answered from G2 (its entry says tier G2):
 * the worker reads it there. A block whose read fails
 * verification is answered with KV_ECORRUPT (or the I/O error), never as a
 * hit. When G2 has no room until a demotion completes (-EAGAIN), the LOAD
 * waits in d->load_wait (defer.h) and is retried after each batch of G3
 * or G1 completions (so does a LOAD to G1 whose G1 room comes with a
 * write-back). If the worker disconnects meanwhile, its pins are already
 * released with its session; the late reply is dropped. A LOAD that has
 * waited for room longer than daemon.load_timeout_ms answers the blocks
 * still waiting with -ETIMEDOUT (the queue's expiry, from the daemon's
 * tick).
 *
 * A block no local tier holds is asked of G4 first, when it is up (g4.h,
 * kvd_g4_fetch: every verified value into G2, then the LOAD goes on as
 * here, answered through the sink), so a LOAD finds what another node
 * stored without a LOOKUP first.
 *
 * GET (the inline slow path) is a LOAD of one block to G2 whose reply
 * carries the bytes instead of an offset: the same promotion, waiting and
 * timeout; its pin is dropped once the bytes are in the reply, and a
 * failed entry becomes an ERROR reply with the entry's status.
 *
 * Every block answered with its bytes is a hit of the best tier that held
 * it when asked (kv_core_stats_t.hits, as LOOKUP counts), every block
 * answered without them a miss with a reason (stats.h): absent, evicted or
 * not_shareable when it is not indexed, corrupt or io_error when its SSD
 * read (or a GET's check of the G2 bytes) failed, timeout as above. The
 * LOAD's duration, from the request to its reply, goes to the LOAD
 * latency histogram (a GET's does not).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/log.h"
#include "daemon/kvd.h"
#include "ipc/sock.h"

#define RETRY 1 /* entry status while waiting for G2 room */

typedef struct kvd_load kvd_load;

typedef struct load_key {
  kvd_load *ld;
  uint32_t i;
} load_key;

struct kvd_load {
  kvd_waiter w; /* in d->load_wait while some entry waits for room */
  kvd *d;
  kvd_sink *sink;
  kv_msg req; /* id and op, for the reply */
  uint32_t n, pending;
  uint32_t core_ns;
  uint8_t target; /* KV_G1 or KV_G2 */
  unsigned pool;  /* target G1: the session's pool (its worker's device) */
  uint64_t t0;    /* kv_now_ns() when the request was taken */
  kv_bid *bid;
  kv_load_ent *ent;
  load_key *keys;
  uint8_t *found; /* per entry: the best tier holding the block when asked */
};

/* Entry i is a hit in tier t (G1 or G2): its slot's offset in the memory
 * the worker mapped for that tier (the G2 arena, the G1 pool), and the CRC
 * it was committed with (a LOAD2 reply carries it; a LOAD's drops it). */
static void fill(kvd_load *ld, uint32_t i, const kv_block *b, kv_tier t) {
  kv_load_ent *e = &ld->ent[i];
  e->status = 0;
  e->tier = (uint8_t)t;
  e->offset = t == KV_G1 ? kv_core_g1_offset(b) : kv_arena_offset(b->slot[t]);
  e->length = b->size;
  e->crc = b->crc;
}

/* The block's entry failed: say why and drop the pin the LOAD took. */
static void fail_entry(kvd_load *ld, uint32_t i, int status) {
  kv_load_ent *e = &ld->ent[i];
  memset(e, 0, sizeof *e);
  e->status = status;
  e->tier = KV_TIER_NONE;
  kv_block *b = kv_index_at(kv_core_index(ld->d->core), ld->bid[i]);
  if (b && ld->sink->sess) kvd_session_unpin(ld->d->core, ld->sink->sess, b);
}

/* The reply to a GET: the block's bytes from G2, verified again (a worker
 * may have scribbled on G2), or an ERROR with the entry's status. GET
 * holds its pin only until the bytes are in the reply. */
static int get_reply(kvd_load *ld, kv_buf *out) {
  kvd *d = ld->d;
  kv_load_ent *e = &ld->ent[0];
  kv_block *b = e->status == 0 ? kv_index_at(kv_core_index(d->core), ld->bid[0]) : NULL;
  int status = e->status;
  const uint8_t *p = b ? kv_core_g2_ptr(d->core, b) : NULL;
  if (b && kv_crc32c(0, p, b->size) != b->crc) {
    status = KV_ECORRUPT;
    kvd_miss_add(d, KVD_MISS_CORRUPT, 1);
  }
  kv_msg m = status ? kvd_error_to(&ld->req, status) : kvd_reply_to(&ld->req);
  if (status == 0) {
    kv_core_count_hit(d->core, ld->found[0]);
    /* The bytes are G2's; G3 says they had to come up from there. */
    m.get_rep.tier = ld->found[0] == KV_G3 ? KV_G3 : KV_G2;
    m.get_rep.data.p = p;
    m.get_rep.data.len = b->size;
  }
  int rc = 0;
  if (out) rc = kv_msg_encode(out, &m);
  else kvd_sink_reply(ld->sink, &m);
  if (b && ld->sink->sess) kvd_session_unpin(d->core, ld->sink->sess, b);
  return rc;
}

/* Answers the request, into out when it is answered at once, else
 * through the sink, and frees it. Returns the encoder's result (0 for the
 * sink). */
static int answer(kvd_load *ld, kv_buf *out) {
  int rc = 0;
  if (ld->req.op == KV_OP_GET) {
    rc = get_reply(ld, out);
  } else {
    /* A hit for each block served, in the tier that held it when asked
     * (as LOOKUP counts): the misses were counted with their reasons. */
    for (uint32_t i = 0; i < ld->n && (out || ld->sink->conn); i++)
      if (ld->ent[i].status == 0) kv_core_count_hit(ld->d->core, ld->found[i]);
    /* Keys the worker's presence table said were here and are not. */
    if (ld->req.batch.flags & KV_LOAD_LOCAL)
      for (uint32_t i = 0; i < ld->n; i++)
        ld->d->pres.contradicted += ld->ent[i].status == KV_ENOTFOUND;
    kvd_req_done(ld->d, KVD_REQ_LOAD, ld->t0);
    kv_msg m = kvd_reply_to(&ld->req);
    m.load_rep.n = ld->n;
    m.load_rep.v = ld->ent;
    if (out) rc = kv_msg_encode(out, &m);
    else kvd_sink_reply(ld->sink, &m);
  }
  kvd_sink_put(ld->sink);
  free(ld->bid);
  free(ld->ent);
  free(ld->keys);
  free(ld->found);
  free(ld);
  return rc;
}

static void finish(kvd_load *ld) { answer(ld, NULL); }

static void wait_for_room(kvd_load *ld);
static int start(kvd_load *ld, uint32_t i);

/* One step of an entry is over: the reply goes when the last one is. */
static void step_done(kvd_load *ld) {
  if (--ld->pending == 0 && !kvd_waiter_queued(&ld->w)) finish(ld);
}

static void promoted(kv_core *c, kv_block *b, int status, void *arg) {
  load_key *k = arg;
  kvd_load *ld = k->ld;
  if (status == 0 && ld->target == KV_G1) {
    if (start(ld, k->i)) { /* on its way up to G1: still pending */
      if (ld->ent[k->i].status == RETRY) wait_for_room(ld);
      return;
    }
  } else if (status == 0) {
    fill(ld, k->i, b, KV_G2);
  } else {
    kvd_miss_add(ld->d, status == KV_ECORRUPT ? KVD_MISS_CORRUPT : KVD_MISS_IO_ERROR, 1);
    fail_entry(ld, k->i, status);
  }
  step_done(ld);
}

static void copied_up(kv_core *c, kv_block *b, int status, void *arg) {
  load_key *k = arg;
  /* On failure the pinned block's G2 copy is still there. */
  fill(k->ld, k->i, b, status == 0 ? KV_G1 : KV_G2);
  step_done(k->ld);
}

/* Starts (or retries) bringing entry i up to the target tier. Returns 1 if
 * it is now pending on a completion or waiting for room, 0 if the entry is
 * final. */
static int start(kvd_load *ld, uint32_t i) {
  kv_core *core = ld->d->core;
  kv_block *b = kv_index_at(kv_core_index(core), ld->bid[i]);
  int rc = kv_core_promote(core, b, promoted, &ld->keys[i]);
  if (rc == 1 && ld->target == KV_G1) {
    rc = kv_core_promote_g1(core, b, ld->pool, copied_up, &ld->keys[i]);
    if (rc == 1) {
      fill(ld, i, b, KV_G1);
      return 0;
    }
    /* In another device's pool: the worker reads it from G2. */
    if (rc == -EXDEV && (b->tiers & KV_TIER_BIT(KV_G2))) {
      fill(ld, i, b, KV_G2);
      return 0;
    }
  } else if (rc == 1) {
    fill(ld, i, b, KV_G2);
    return 0;
  }
  if (rc == 0) return 1;
  if (rc == -EAGAIN || rc == -EBUSY) {
    ld->ent[i].status = RETRY;
    return 1;
  }
  fail_entry(ld, i, rc);
  return 0;
}

static void wait_for_room(kvd_load *ld) {
  kvd_defer_wait(&ld->d->load_wait, &ld->w, (uint64_t)kv_now_ms());
}

/* Brings up the first n keys of d->keys for sink's session: each block
 * pinned, then answered at once when it is in the target tier, else
 * brought up (answered when the last one is). t0: when the request was
 * taken (kv_now_ns). Returns the reply's encoding result (0: appended to
 * out; out NULL: through the sink), or KVD_DEFERRED. */
static int load_keys(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n, uint8_t target,
                     uint64_t t0, kv_buf *out) {
  kvd_session *s = sink->sess;
  kvd_load *ld = calloc(1, sizeof *ld);
  if (ld) {
    ld->bid = calloc(n ? n : 1, sizeof *ld->bid);
    ld->ent = calloc(n ? n : 1, sizeof *ld->ent);
    ld->keys = calloc(n ? n : 1, sizeof *ld->keys);
    ld->found = calloc(n ? n : 1, 1);
  }
  if (!ld || !ld->bid || !ld->ent || !ld->keys || !ld->found) {
    if (ld) {
      free(ld->bid);
      free(ld->ent);
      free(ld->keys);
      free(ld->found);
      free(ld);
    }
    if (out) return kvd_fail(out, req, -ENOMEM, NULL);
    kv_msg m = kvd_error_to(req, -ENOMEM); /* taken up after G4: through the sink */
    kvd_sink_reply(sink, &m);
    return 0;
  }
  ld->d = d;
  ld->t0 = t0;
  ld->sink = sink;
  kvd_sink_get(sink);
  kvd_waiter_init(&ld->w, sink);
  ld->req = *req;
  ld->n = n;
  ld->target = target;
  ld->pool = target == KV_G1 ? (unsigned)s->g1pool : 0;
  ld->core_ns = (uint32_t)kvd_registry_ns(&d->reg, s->ns)->core_ns;

  for (uint32_t i = 0; i < n; i++) {
    kv_load_ent *e = &ld->ent[i];
    e->tier = KV_TIER_NONE;
    ld->keys[i] = (load_key){ld, i};
    ld->bid[i] = KV_BID_NONE;
    kv_block *b = kv_core_find(d->core, ld->core_ns, &d->keys[i]);
    if (!b) {
      e->status = KV_ENOTFOUND;
      kvd_miss_classify(d, s->ns, ld->core_ns, &d->keys[i]);
      continue;
    }
    if (kvd_trust_refused(d, b)) { /* reported, confirmed, waiting for its pins to go */
      e->status = KV_ECORRUPT;
      kvd_miss_add(d, KVD_MISS_CORRUPT, 1);
      continue;
    }
    ld->found[i] = (uint8_t)__builtin_ctz(b->tiers);
    if ((e->status = kvd_session_pin(d->core, s, b, d->cfg.limit_pins_per_session))) {
      if (e->status == -EDQUOT) d->st.pins_refused++;
      if (e->status == KV_ESHARE) kvd_share_refused(d, s, "pin");
      continue;
    }
    ld->bid[i] = b->id;
    kv_core_touch(d->core, b);
    kvd_g4_used(d, kvd_registry_ns(&d->reg, s->ns), b);
  }
  /* Every block is pinned before any moves: the room one block's copy
   * makes is never taken from another block of the same LOAD. */
  for (uint32_t i = 0; i < n; i++) {
    kv_block *b = kv_index_at(kv_core_index(d->core), ld->bid[i]);
    if (!b || ld->ent[i].status) continue;
    int there = (b->tiers & KV_TIER_BIT(ld->target)) &&
                (ld->target != KV_G1 || kv_g1_pool_of(b->slot[KV_G1]) == ld->pool);
    if (there) fill(ld, i, b, (kv_tier)ld->target);
    else ld->pending += (uint32_t)start(ld, i);
  }
  for (uint32_t i = 0; i < n; i++)
    if (ld->ent[i].status == RETRY) {
      wait_for_room(ld);
      break;
    }
  if (ld->pending) return KVD_DEFERRED;
  return answer(ld, out); /* everything was final: answer now, in the reply stream */
}

/* A LOAD or GET taken up once G4 answered (kvd_g4_fetch): answered
 * through the sink. */
static void load_after_g4(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n,
                          uint8_t target, uint64_t t0) {
  load_keys(d, sink, req, n, target, t0, NULL);
}

/* The first n keys of d->keys, some held by no local tier: G4 is asked
 * for those first when it is up (KVD_DEFERRED), else 0. */
static int from_g4(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n, uint8_t target) {
  if (!d->g4.c) return 0;
  uint32_t core_ns = (uint32_t)kvd_registry_ns(&d->reg, sink->sess->ns)->core_ns;
  uint32_t i = 0;
  while (i < n && kv_core_find(d->core, core_ns, &d->keys[i])) i++;
  return i < n ? kvd_g4_fetch(d, sink, req, n, target, load_after_g4) : 0;
}

int kvd_op_load(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  const kv_batch_req *br = &req->batch;
  kvd_session *s = sink->sess;
  int rc = kvd_load_keys(d, &br->keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  if (br->tier == KV_G1 && s->g1pool < 0)
    return kvd_fail(out, req, -ENODEV,
                    !kv_core_g1_pools(d->core)
                        ? (d->g1.reason[0] ? d->g1.reason : "G1 is off")
                        : "this session has no G1 pool (G1_SELECT named a device without one)");
  if (br->tier == KV_G1) s->g1_loaded = 1;
  if (from_g4(d, sink, req, br->keys.n, br->tier) == KVD_DEFERRED) return KVD_DEFERRED;
  return load_keys(d, sink, req, br->keys.n, br->tier, kv_now_ns(), out);
}

int kvd_op_get(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kv_key_set(&d->keys[0], req->get_key.p, req->get_key.len);
  if (from_g4(d, sink, req, 1, KV_G2) == KVD_DEFERRED) return KVD_DEFERRED;
  return load_keys(d, sink, req, 1, KV_G2, kv_now_ns(), out);
}

/* The queue's callbacks (defer.h) for a LOAD waiting for room. */
static kvd_load *waiter_load(kvd_waiter *w) {
  return (kvd_load *)(void *)((char *)w - offsetof(kvd_load, w));
}

static int retry_load(kvd_waiter *w) {
  kvd_load *ld = waiter_load(w);
  int still = 0;
  for (uint32_t i = 0; i < ld->n; i++) {
    if (ld->ent[i].status != RETRY) continue;
    ld->pending--;
    ld->ent[i].status = 0;
    int p = start(ld, i);
    ld->pending += (uint32_t)p;
    if (p && ld->ent[i].status == RETRY) still = 1;
  }
  if (!still && ld->pending == 0) finish(ld);
  return still;
}

static uint32_t expire_load(kvd_waiter *w) {
  kvd_load *ld = waiter_load(w);
  uint32_t expired = 0;
  for (uint32_t i = 0; i < ld->n; i++) {
    if (ld->ent[i].status != RETRY) continue;
    fail_entry(ld, i, -ETIMEDOUT);
    ld->pending--;
    expired++;
  }
  if (expired) kvd_miss_add(ld->d, KVD_MISS_TIMEOUT, expired);
  if (ld->pending == 0) finish(ld);
  return expired;
}

static void cancel_load(kvd_waiter *w) {
  kvd_load *ld = waiter_load(w);
  for (uint32_t i = 0; i < ld->n; i++) {
    if (ld->ent[i].status != RETRY) continue;
    ld->ent[i].status = -ECANCELED;
    ld->pending--;
  }
  if (ld->pending == 0) finish(ld);
}

const kvd_defer_ops kvd_load_defer_ops = {"load", "answered with a timeout", retry_load,
                                          expire_load, cancel_load};

int kvd_op_prefetch(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  const kv_batch_req *br = &req->batch;
  int rc = kvd_load_keys(d, &br->keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  uint32_t core_ns = (uint32_t)kvd_registry_ns(&d->reg, sink->sess->ns)->core_ns;
  uint32_t queued = 0;
  for (uint32_t i = 0; i < br->keys.n; i++) {
    kv_block *b = kv_core_find(d->core, core_ns, &d->keys[i]);
    if (b && kv_core_promote(d->core, b, NULL, NULL) == 0) queued++;
  }
  kv_msg m = kvd_reply_to(req);
  m.prefetch_queued = queued;
  return kv_msg_encode(out, &m);
}
