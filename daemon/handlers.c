/*
 * handlers.c - one function per operation of the wire protocol: decode the
 * request's keys, act on the cache core for the calling session, encode the
 * reply. Batches answer per key; a request that cannot be served as a whole
 * gets an ERROR reply with its reason.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/log.h"
#include "daemon/g3_watch.h"
#include "daemon/kvd.h"
#include "daemon/server.h"

static uint16_t min_u16(uint16_t a, uint16_t b) { return a < b ? a : b; }

static kvd_ns *session_ns(kvd *d, kvd_session *s) { return kvd_registry_ns(&d->reg, s->ns); }

/* --- HELLO ---------------------------------------------------------------- */
/* The G1 tier-info entry of HELLO and G1_SELECT replies: g's pool, whose
 * value is kv_dev_export_encode's bytes (its device, size and handle; a
 * block's device pointer is the imported base plus the offset a LOAD reply
 * gives), with *fd the fd to send (-1: none); or, when g is NULL, kind
 * KV_TI_G1_NONE with the reason (why G1 is off, or that `uuid` names no
 * device with a pool), and -ENODEV. The entry points into d or into a
 * buffer of its own, valid until the next call. */
static int g1_entry(kvd *d, kvd_g1 *g, const uint8_t *uuid, kv_tierinfo *ti, int *fd) {
  static char why[KV_DEV_REASON_MAX + 512];
  char us[KV_DEV_UUID_STR];
  uint8_t kind;
  *fd = -1;
  if (g && kvd_g1_export(g, &kind, fd) == 0) {
    *ti = (kv_tierinfo){.tier = KV_G1, .kind = kind, .len = (uint16_t)g->enc_len, .p = g->enc};
    return 0;
  }
  if (!uuid || !d->g1.on) {
    snprintf(why, sizeof why, "%s", d->g1.reason[0] ? d->g1.reason : "G1 is off");
  } else {
    int k =
        snprintf(why, sizeof why, "no G1 pool on device %s; pools on", kv_dev_uuid_str(uuid, us));
    for (unsigned i = 0; i < d->g1.n && k > 0 && (size_t)k < sizeof why; i++)
      if (d->g1.g[i].on)
        k += snprintf(why + k, sizeof why - (size_t)k, " %s (ordinal %d)",
                      kv_dev_uuid_str(d->g1.g[i].uuid, us), d->g1.g[i].ordinal);
  }
  size_t len = strlen(why);
  if (len > KV_TIERINFO_BYTES_MAX) len = KV_TIERINFO_BYTES_MAX;
  *ti = (kv_tierinfo){
      .tier = KV_G1, .kind = KV_TI_G1_NONE, .len = (uint16_t)len, .p = (const uint8_t *)why};
  return -ENODEV;
}

static int op_hello(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  const kv_hello_req *h = &req->hello;
  if (s->ns >= 0)
    return kvd_fail(out, req, KV_EBADSTATE, "HELLO was already said on this connection");
  if (h->ver_major != KV_PROTO_MAJOR) return kvd_fail(out, req, KV_EBADVERSION, NULL);
  kvd_peer peer = {s->peer_uid, s->peer_gid, s->peer_fd};
  int ns = kvd_registry_hello(&d->reg, h, &peer);
  if (ns < 0) {
    const char *why =
        d->reg.why[0]      ? d->reg.why
        : ns == KV_ETOOBIG ? "block_bytes exceeds the G2 page size (raise g2.page_size)"
        : ns == -EINVAL    ? "layout the daemon cannot serve (TP rank/size, block size, names)"
                           : NULL;
    return kvd_fail(out, req, ns, why);
  }
  s->ns = ns;
  kvd_ns *n = kvd_registry_ns(&d->reg, ns);
  kv_arena *a = kvd_registry_arena(&d->reg, n);
  kvd_session_set_share(s, n->slot_bytes ? a->capacity / n->slot_bytes : 0,
                        d->cfg.limit_session_share);
  kv_msg m = kvd_reply_to(req);
  m.flags |= KV_F_FD;
  m.hello_rep.ver_major = KV_PROTO_MAJOR;
  m.hello_rep.ver_minor = min_u16(h->ver_minor, KV_PROTO_MINOR);
  m.hello_rep.caps = 0;
  m.hello_rep.session_id = s->id;
  m.hello_rep.ns_id = (uint32_t)ns;
  m.hello_rep.arena_bytes = a->capacity;
  m.hello_rep.slot_align = KV_ARENA_ALIGN;
  m.hello_rep.slot_bytes = n->slot_bytes;
  kvd_g1 *g = kvd_g1s_first(&d->g1);
  s->g1pool = g ? g->core_pool : -1;
  kv_tierinfo ti;
  int g1fd = -1;
  if (h->caps & KV_CAP_G1) {
    if (g1_entry(d, g, NULL, &ti, &g1fd) == 0) {
      m.hello_rep.caps |= KV_CAP_G1;
      if (g1fd >= 0) m.flags |= KV_F_FD2;
    }
    m.hello_rep.ntierinfo = 1;
    m.hello_rep.tierinfo = &ti;
  }
  int rc = kv_msg_encode(out, &m);
  if (rc == 0) {
    fd_out[0] = a->fd;
    fd_out[1] = (m.flags & KV_F_FD2) ? g1fd : -1;
  }
  return rc;
}

/* --- G1_SELECT -------------------------------------------------------------- */
static int op_g1_select(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  if (s->g1_loaded)
    return kvd_fail(
        out, req, KV_EBADSTATE,
        "this session already holds G1 offsets from a LOAD: select before the first one");
  kvd_g1 *g = kvd_g1s_find(&d->g1, req->g1_select.uuid);
  kv_msg m = kvd_reply_to(req);
  int g1fd = -1;
  if (g1_entry(d, g, req->g1_select.uuid, &m.g1_pool, &g1fd) == 0) {
    s->g1pool = g->core_pool;
    if (g1fd >= 0) m.flags |= KV_F_FD;
    d->g1.selects[0]++;
  } else {
    s->g1pool = -1;
    d->g1.selects[1]++;
  }
  int rc = kv_msg_encode(out, &m);
  if (rc == 0) fd_out[0] = (m.flags & KV_F_FD) ? g1fd : -1;
  return rc;
}

/* --- LOOKUP ----------------------------------------------------------------- */
/* A local run shorter than the keys asks G4 for the rest, when it is up:
 * then the reply is deferred (g4.h). The run is measured without counting
 * (kv_core_find), so that a LOOKUP is counted once, when it is answered. */
static int lookup(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, uint64_t t0) {
  kvd_session *s = sink->sess;
  const kv_keyvec *v = &req->batch.keys;
  int rc = kvd_load_keys(d, v);
  if (rc) return kvd_fail(out, req, rc, NULL);
  uint32_t core_ns = (uint32_t)session_ns(d, s)->core_ns;
  if (d->g4.c) {
    uint32_t run = 0;
    while (run < v->n && kv_core_find(d->core, core_ns, &d->keys[run])) run++;
    if (run < v->n && kvd_g4_lookup(d, sink, req, v->n, run, t0) == KVD_DEFERRED)
      return KVD_DEFERRED;
  }
  kv_msg m = kvd_lookup_answer(d, s->ns, core_ns, d->keys, v->n, req);
  return kv_msg_encode(out, &m);
}

static int op_lookup(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  uint64_t t0 = kv_now_ns();
  int rc = lookup(d, sink, req, out, t0);
  if (rc != KVD_DEFERRED) kvd_req_done(d, KVD_REQ_LOOKUP, t0); /* else when answered */
  return rc;
}

/* Per-key status reply, shared by RELEASE, COMMIT, ABORT, SET_PRIORITY. */
static int statuses(const kv_msg *req, kv_buf *out, const int32_t *st, uint32_t n) {
  kv_msg m = kvd_reply_to(req);
  m.statuses.n = n;
  m.statuses.v = st;
  return kv_msg_encode(out, &m);
}

/* The record of key i in the session's namespace, in any state. */
static kv_block *any_block(kvd *d, kvd_session *s, uint32_t i) {
  return kv_index_find(kv_core_index(d->core), (uint32_t)session_ns(d, s)->core_ns, d->keys[i].b,
                       d->keys[i].len);
}

static int op_release(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  int rc = kvd_load_keys(d, &req->batch.keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < req->batch.keys.n; i++) {
    kv_block *b = any_block(d, s, i);
    d->status[i] = b ? kvd_session_unpin(d->core, s, b) : KV_ENOTFOUND;
    /* A reader's report counts only for a block it had pinned (trust.h). */
    if (d->status[i] == 0 && (req->batch.flags & KV_REL_CORRUPT)) kvd_trust_report(d, s->id, b);
  }
  if (d->trust.npend) kvd_trust_sweep(d);
  return statuses(req, out, d->status, req->batch.keys.n);
}

/* --- COMMIT / ABORT (ALLOC: alloc.c) ----------------------------------------- */
static int op_commit_abort(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  int commit = req->op == KV_OP_COMMIT;
  int shared = commit && (req->batch.flags & KV_COMMIT_G4); /* answered once G4 has them */
  int rc = kvd_load_keys(d, &req->batch.keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < req->batch.keys.n; i++) {
    kv_block *b = any_block(d, s, i);
    d->blocks[i] = b;
    if (!b) {
      d->status[i] = KV_ENOTFOUND;
    } else if (commit) {
      /* The writer's CRC (1.2) is taken as it is: the daemon never reads
       * the bytes for it, and a wrong one only makes readers reject them. */
      uint32_t crc = 0;
      if (req->batch.flags & KV_COMMIT_CRC) crc = kv_u32vec_get(&req->batch.crcs, i);
      else if (b->state == KV_BS_WRITING && b->slot[KV_G2] != KV_SLOT_NONE)
        crc = kv_crc32c(0, kv_core_g2_ptr(d->core, b), b->size);
      d->status[i] = kvd_session_commit(d->core, s, b, crc);
      if (d->status[i] == 0) {
        kvd_ghost_note(d, b->ns, &d->keys[i], 1);
        if (!shared) kvd_g4_committed(d, session_ns(d, s), b);
      }
    } else {
      d->status[i] = kvd_session_abort(d->core, s, b);
    }
  }
  if (shared && kvd_g4_commit_wait(d, sink, req, session_ns(d, s), d->blocks, d->status,
                                   req->batch.keys.n) == KVD_DEFERRED)
    return KVD_DEFERRED;
  return statuses(req, out, d->status, req->batch.keys.n);
}

/* --- DELETE, SET_PRIORITY ----------------------------------------------------- */
typedef struct del_all {
  kvd *d;
  const kvd_ns *ns;
  uint32_t core_ns;
  uint64_t n;
} del_all;
static int del_one(kv_block *b, void *arg) {
  del_all *x = arg;
  if (b->ns != x->core_ns || b->state != KV_BS_READY) return 0;
  kv_key k;
  kv_key_set(&k, b->key, kv_block_keylen(b));
  if (kv_core_delete(x->d->core, b) == 0) {
    kvd_ghost_note(x->d, x->core_ns, &k, 0);
    kvd_g4_del(x->d, x->ns, &k);
    x->n++;
  }
  return 0;
}

static int op_delete(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  const kv_batch_req *b = &req->batch;
  kv_msg m = kvd_reply_to(req);
  if (b->flags & KV_DEL_ALL) {
    del_all x = {d, session_ns(d, s), (uint32_t)session_ns(d, s)->core_ns, 0};
    kv_index_foreach(kv_core_index(d->core), del_one, &x);
    m.delete_rep.deleted = x.n;
    return kv_msg_encode(out, &m);
  }
  int rc = kvd_load_keys(d, &b->keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  uint64_t n = 0;
  for (uint32_t i = 0; i < b->keys.n; i++) {
    kv_block *blk = kv_core_find(d->core, (uint32_t)session_ns(d, s)->core_ns, &d->keys[i]);
    d->status[i] = blk ? kv_core_delete(d->core, blk) : KV_ENOTFOUND;
    if (d->status[i] == 0) kvd_ghost_note(d, (uint32_t)session_ns(d, s)->core_ns, &d->keys[i], 0);
    /* G4 may hold the key though this node does not (another node wrote it). */
    kvd_g4_del(d, session_ns(d, s), &d->keys[i]);
    n += d->status[i] == 0;
  }
  m.delete_rep.deleted = n;
  m.delete_rep.st.n = b->keys.n;
  m.delete_rep.st.v = d->status;
  return kv_msg_encode(out, &m);
}

static int op_set_priority(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  int rc = kvd_load_keys(d, &req->batch.keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < req->batch.keys.n; i++) {
    kv_block *b = kv_core_find(d->core, (uint32_t)session_ns(d, s)->core_ns, &d->keys[i]);
    d->status[i] = b ? 0 : KV_ENOTFOUND;
    if (b) kv_core_set_priority(d->core, b, req->batch.prio);
  }
  return statuses(req, out, d->status, req->batch.keys.n);
}

/* --- HINT (1.3): advice for eviction, scoped by the session's namespace ------ */
static int op_hint(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  const kv_hint_req *h = &req->hint;
  uint32_t ns = (uint32_t)session_ns(d, sink->sess)->core_ns;
  int rc = kvd_load_keys(d, &h->keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < h->keys.n; i++) {
    kv_block *b = kv_core_find_hintable(d->core, ns, &d->keys[i]);
    d->status[i] = b ? kv_core_hint_session(d->core, ns, h->session, b, h->retain_s) : KV_ENOTFOUND;
    d->st.hints_unmatched += b == NULL;
  }
  if (h->kind != KV_HINT_SESSION) {
    /* The session's news reaches every rank of the caller's TP group: an
     * engine's scheduler says it once, for rank 0, while each rank stores
     * its own blocks (the ranks' namespaces are one tenant's). */
    kvd_ns *me = session_ns(d, sink->sess);
    kvd_group *g = me->group;
    for (unsigned r = 0; !rc && r < (g ? g->tp_size : 1u); r++) {
      int32_t ri = g ? g->ns_of_rank[r] : -1;
      if (g && (ri < 0 || (uint32_t)ri >= d->reg.nns || d->reg.ns[ri].core_ns < 0)) continue;
      uint32_t cns = g ? (uint32_t)d->reg.ns[ri].core_ns : ns;
      rc = h->kind == KV_HINT_FINISHED
               ? kv_core_hint_finished(d->core, cns, h->session, h->stop, h->retain_s)
               : kv_core_hint_end(d->core, cns, h->session);
    }
    if (h->kind == KV_HINT_FINISHED) d->st.hint_stops[h->stop]++;
  }
  if (rc) return kvd_fail(out, req, rc, "the hint could not be kept");
  d->st.hints[h->kind]++;
  return statuses(req, out, d->status, h->keys.n);
}

/* --- PUT (GET: load.c): the inline slow path ---------------------------------------- */
static int op_put(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  const kv_put_req *p = &req->put;
  kvd_ns *n = session_ns(d, s);
  if (p->data.len != n->block_bytes)
    return kvd_fail(out, req, -EINVAL, "PUT data length differs from the namespace's block_bytes");
  kv_key k, parent;
  kv_key_set(&k, p->key.p, p->key.len);
  if (p->parent.len) kv_key_set(&parent, p->parent.p, p->parent.len);
  kv_block *b;
  int rc =
      kv_core_alloc(d->core, (uint32_t)n->core_ns, &k, p->parent.len ? &parent : NULL, p->prio, &b);
  if (rc) return kvd_fail(out, req, rc, NULL);
  memcpy(kv_core_g2_ptr(d->core, b), p->data.p, p->data.len);
  kv_core_commit(d->core, b, kv_crc32c(0, p->data.p, p->data.len));
  kvd_ghost_note(d, (uint32_t)n->core_ns, &k, 1);
  kvd_g4_committed(d, n, b);
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core); /* a soft g2.capacity */
  kv_msg m = kvd_reply_to(req);
  return kv_msg_encode(out, &m);
}

/* --- PRESENCE --------------------------------------------------------------- */
/* The session's namespace's presence table (daemon/presence.h), as an fd
 * the worker maps read-only. A TP group's lookups stay with the daemon:
 * its ranks must agree on one length, which one rank's table cannot say. */
static int op_presence(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  const kvd_ns *n = session_ns(d, sink->sess);
  if (n->group)
    return kvd_fail(out, req, -EOPNOTSUPP,
                    "a TP group's lookups are answered by the daemon (one length for every rank)");
  int fd;
  uint64_t bytes;
  uint32_t flags;
  int rc = kvd_presence_map(&d->pres, (uint32_t)n->core_ns, d->g4.c ? KV_PRES_G4 : 0, &fd, &bytes,
                            &flags);
  if (rc) return kvd_fail(out, req, rc, "cannot make the namespace's presence table");
  kv_msg m = kvd_reply_to(req);
  m.flags |= KV_F_FD;
  m.presence_rep = (kv_presence_rep){.bytes = bytes, .flags = flags};
  rc = kv_msg_encode(out, &m);
  if (rc == 0) fd_out[0] = fd;
  return rc;
}

/* --- STATUS ----------------------------------------------------------------- */
static int op_status(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  json_t *o = kvd_stats_json(d, KVD_JSON_STATUS);
  char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!text) return kvd_fail(out, req, -ENOMEM, NULL);
  kv_msg m = kvd_reply_to(req);
  m.status_text.p = text;
  m.status_text.len = (uint32_t)strlen(text);
  int rc = kv_msg_encode(out, &m);
  free(text);
  return rc;
}

/* --- dispatch --------------------------------------------------------------- */
/* Each opcode a request may carry: its handler, and whether it needs the
 * session HELLO opens. An opcode without a handler is KV_EBADOP. */
static const struct {
  kvd_op_fn *fn;
  uint8_t session;
} ops[KV_OP_COUNT] = {
    [KV_OP_HELLO] = {op_hello, 0},
    [KV_OP_STATUS] = {op_status, 0},
    [KV_OP_LOOKUP] = {op_lookup, 1},
    [KV_OP_LOAD] = {kvd_op_load, 1},
    [KV_OP_LOAD2] = {kvd_op_load, 1},
    [KV_OP_RELEASE] = {op_release, 1},
    [KV_OP_ALLOC] = {kvd_op_alloc, 1},
    [KV_OP_COMMIT] = {op_commit_abort, 1},
    [KV_OP_ABORT] = {op_commit_abort, 1},
    [KV_OP_PREFETCH] = {kvd_op_prefetch, 1},
    [KV_OP_DELETE] = {op_delete, 1},
    [KV_OP_SET_PRIORITY] = {op_set_priority, 1},
    [KV_OP_PUT] = {op_put, 1},
    [KV_OP_GET] = {kvd_op_get, 1},
    [KV_OP_G1_SELECT] = {op_g1_select, 1},
    [KV_OP_HINT] = {op_hint, 1},
    [KV_OP_PRESENCE] = {op_presence, 1},
};

int kvd_handle(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  fd_out[0] = fd_out[1] = -1;
  if (req->flags & KV_F_REPLY)
    return kvd_fail(out, req, KV_EBADFRAME, "a reply sent to the daemon");
  kvd_op_fn *fn = req->op < KV_OP_COUNT ? ops[req->op].fn : NULL;
  if (req->op < KV_OP_COUNT) d->st.ops[req->op]++;
  kv_core_set_now(d->core, (uint64_t)kv_now_ms()); /* the clock hints are measured on */
  if ((!fn || ops[req->op].session) && sink->sess->ns < 0)
    return kvd_fail(out, req, KV_ENOSESSION, NULL);
  if (!fn) return kvd_fail(out, req, KV_EBADOP, NULL);
  return fn(d, sink, req, out, fd_out);
}
