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
#include <sys/stat.h>
#include <time.h>

#include "daemon/g3_watch.h"
#include "base/clock.h"
#include "daemon/kvd.h"
#include "base/log.h"
#include "daemon/server.h"
#include "base/crc32c.h"


/* Opens the SSD tier on the configured directories and attaches it
 * (g3_watch.h). */
int kvd_g3_open(kvd *d, int lock_wait_ms, char *why, size_t whylen) {
  char paths[sizeof d->cfg.g3_path];
  const char *names[KV_G3_MAX_DIRS];
  kv_g3_dir dirs[KV_G3_MAX_DIRS];
  int nd = kv_config_g3_dirs(&d->cfg, paths, names, KV_G3_MAX_DIRS); /* checked at start */
  unsigned n = nd > 0 ? (unsigned)nd : 0;
  why[0] = 0;
  for (unsigned i = 0; i < n; i++) {
    if (mkdir(names[i], 0750) < 0 && errno != EEXIST) {
      int rc = -errno;
      snprintf(why, whylen, "cannot create %s: %s", names[i], strerror(-rc));
      return rc;
    }
    dirs[i] = (kv_g3_dir){names[i], d->cfg.g3_capacity};
  }
  if (n == 0) return 0;
  kv_g3_opts o = {.dirs = dirs, .ndirs = n, .block_bytes = (uint32_t)d->cfg.g3_block_bytes,
                  .queue_depth = d->cfg.g3_queue_depth,
                  .backend = !strcmp(d->cfg.g3_backend, "uring") ? KV_G3_BACKEND_URING
                           : !strcmp(d->cfg.g3_backend, "threads") ? KV_G3_BACKEND_THREADS
                           : KV_G3_BACKEND_AUTO,
                  .lock_wait_ms = lock_wait_ms,
                  /* No G2 arena is registered as io_uring fixed buffers:
                   * workers hold the memfd writable and can punch holes in
                   * it (fallocate, MADV_REMOVE), which would leave the
                   * registration pinning pages no longer in the file, and
                   * every later G3 read landing where G2 cannot see it.
                   * Plain reads map the arena's current pages per I/O. */
                  .arena = NULL};
  kv_g3_open_info info;
  int rc = kv_g3_open(&d->g3, &o, &info);
  if (rc == -EINVAL) {
    /* Existing files made with another slot size: keep theirs. */
    o.block_bytes = 0;
    rc = kv_g3_open(&d->g3, &o, &info);
    if (rc == 0)
      kv_warn("g3", "existing files use %u-byte slots, not g3.block_bytes; keeping theirs",
              info.slot_bytes);
  }
  if (rc) {
    snprintf(why, whylen, "%s", info.why[0] ? info.why : kv_strerror(rc));
    return rc;
  }
  kv_core_g3_opts go = {.admit = !strcmp(d->cfg.g3_admit, "second-use") ? KV_ADMIT_SECOND_USE
                               : !strcmp(d->cfg.g3_admit, "min-prio") ? KV_ADMIT_MIN_PRIO
                               : KV_ADMIT_ALWAYS,
                        .min_prio = (uint8_t)d->cfg.g3_min_prio};
  rc = kv_core_attach_g3(d->core, d->g3, &go);
  if (rc >= 0) {
    kv_g3_stats gs;
    kv_g3_get_stats(d->g3, &gs);
    int sr = kvd_registry_g3_shares(&d->reg, &d->cfg, gs.capacity_bytes);
    if (sr) rc = sr;
  }
  if (rc < 0) {
    snprintf(why, whylen, "cannot attach the SSD tier to the cache core: %s", kv_strerror(rc));
    kv_g3_close(d->g3);
    d->g3 = NULL;
    return rc;
  }
  kv_info("g3", "%u slots of %u bytes in %u file(s), %llu blocks served from before (warm)%s",
          info.slots, info.slot_bytes, n, (unsigned long long)info.indexed,
          info.rebuilt ? ", index rebuilt from the records" : "");
  return 0;
}

int kvd_init(kvd *d) {
  int rc;
  d->start_ms = kv_now_ms();
  d->next_session_id = 1;
  d->keys = malloc(KV_BATCH_MAX * sizeof *d->keys);
  d->tiers = malloc(KV_BATCH_MAX);
  d->status = malloc(KV_BATCH_MAX * sizeof *d->status);
  d->loads = malloc(KV_BATCH_MAX * sizeof *d->loads);
  d->allocs = malloc(KV_BATCH_MAX * sizeof *d->allocs);
  if (!d->keys || !d->tiers || !d->status || !d->loads || !d->allocs) {
    rc = -ENOMEM;
    goto err;
  }
  kv_core_opts co = {.policy = d->cfg.policy};
  rc = kv_core_new(&d->core, &co);
  if (rc) {
    kv_error("core", "cannot start the cache core: %s", kv_strerror(rc));
    goto err;
  }
  if ((rc = kvd_g1s_open(&d->g1, &d->cfg))) {
    kv_core_free(d->core);
    goto err;
  }
  for (unsigned i = 0; i < d->g1.n; i++) {
    kvd_g1 *g = &d->g1.g[i];
    if (!g->on) continue;
    g->core_pool = kv_core_attach_g1(d->core, &g->slots, kvd_g1_copy, g);
    if (g->core_pool < 0) {
      rc = g->core_pool;
      kv_error("g1", "cannot attach the pool of device %d to the cache core: %s", g->ordinal,
               kv_strerror(rc));
      kvd_g1s_close(&d->g1);
      kv_core_free(d->core);
      goto err;
    }
    g->done = kvd_g1_copied;
    g->done_arg = d;
  }
  kvd_registry_opts ro = {.cfg = &d->cfg, .lock = d->cfg.g2_lock, .core = d->core};
  if (d->g1.on) {
    ro.register_fn = kvd_g1s_arena_register;
    ro.unregister_fn = kvd_g1s_arena_unregister;
    ro.register_arg = &d->g1;
  }
  rc = kvd_registry_init(&d->reg, &ro);
  if (rc) {
    kv_error("g2", "cannot create the G2 arenas (%llu bytes for %u tenant(s)): %s",
             (unsigned long long)d->cfg.g2_capacity, d->cfg.ntenants ? d->cfg.ntenants : 1,
             kv_strerror(rc));
    kvd_g1s_close(&d->g1);
    kv_core_free(d->core);
    goto err;
  }
  /* A G3 that cannot be opened leaves the daemon on G2 alone (g3_watch.h). */
  if (d->cfg.g3_path[0] && (rc = kvd_g3_open(d, 0, d->g3w.why, sizeof d->g3w.why)))
    kvd_g3_unavailable(d, rc);
  if ((rc = kvd_metrics_init(d))) {
    kv_error("daemon", "cannot set up the metrics: %s", kv_strerror(rc));
    if (d->g3) kv_g3_close(d->g3);
    d->g3 = NULL;
    kvd_registry_fini(&d->reg);
    kvd_g1s_close(&d->g1);
    kv_core_free(d->core);
    goto err;
  }
  kvd_session_init(&d->admin, 0);
  return 0;
err:
  free(d->keys); free(d->tiers); free(d->status); free(d->loads); free(d->allocs);
  d->keys = NULL;
  return rc;
}

void kvd_fini(kvd *d) {
  uint64_t pins = 0, allocs = 0;
  kvd_session_close(d->core, &d->admin, &pins, &allocs);
  if (pins) kv_info("admin", "released %llu pin(s) the operator held", (unsigned long long)pins);
  if (d->g3) {
    /* Every write in flight completes and the last index batch commits. */
    kv_g3_close(d->g3);
    d->g3 = NULL;
    kv_info("g3", "index synced and closed");
  }
  kvd_metrics_fini(d);
  kvd_trust_fini(&d->trust);
  kv_core_free(d->core);
  kvd_registry_fini(&d->reg); /* unregisters the arenas from the device */
  kvd_g1s_close(&d->g1);
  free(d->keys); free(d->tiers); free(d->status); free(d->loads); free(d->allocs);
  d->keys = NULL;
}

static uint16_t min_u16(uint16_t a, uint16_t b) { return a < b ? a : b; }

kv_msg kvd_reply_to(const kv_msg *req) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = req->op;
  m.flags = KV_F_REPLY;
  m.id = req->id;
  return m;
}

int kvd_fail(kv_buf *out, const kv_msg *req, int status, const char *msg) {
  return kv_msg_encode_error(out, req->id, req->op, status, msg ? msg : kv_strerror(status));
}

/* Copies the request's keys into d->keys. */
int kvd_load_keys(kvd *d, const kv_keyvec *v) {
  for (uint32_t i = 0; i < v->n; i++) {
    int rc = kv_keyvec_get(v, i, &d->keys[i]);
    if (rc) return rc;
  }
  return 0;
}

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
    int k = snprintf(why, sizeof why, "no G1 pool on device %s; pools on", kv_dev_uuid_str(uuid, us));
    for (unsigned i = 0; i < d->g1.n && k > 0 && (size_t)k < sizeof why; i++)
      if (d->g1.g[i].on)
        k += snprintf(why + k, sizeof why - (size_t)k, " %s (ordinal %d)",
                      kv_dev_uuid_str(d->g1.g[i].uuid, us), d->g1.g[i].ordinal);
  }
  size_t len = strlen(why);
  if (len > KV_TIERINFO_BYTES_MAX) len = KV_TIERINFO_BYTES_MAX;
  *ti = (kv_tierinfo){.tier = KV_G1, .kind = KV_TI_G1_NONE, .len = (uint16_t)len,
                      .p = (const uint8_t *)why};
  return -ENODEV;
}

static int op_hello(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  const kv_hello_req *h = &req->hello;
  if (s->ns >= 0) return kvd_fail(out, req, KV_EBADSTATE, "HELLO was already said on this connection");
  if (h->ver_major != KV_PROTO_MAJOR) return kvd_fail(out, req, KV_EBADVERSION, NULL);
  kvd_peer peer = {s->peer_uid, s->peer_gid, s->peer_fd};
  int ns = kvd_registry_hello(&d->reg, h, &peer);
  if (ns < 0) {
    const char *why = d->reg.why[0] ? d->reg.why
                    : ns == KV_ETOOBIG ? "block_bytes exceeds the G2 page size (raise g2.page_size)"
                    : ns == -EINVAL ? "layout the daemon cannot serve (TP rank/size, block size, names)"
                    : NULL;
    return kvd_fail(out, req, ns, why);
  }
  s->ns = ns;
  kvd_ns *n = kvd_registry_ns(&d->reg, ns);
  kv_arena *a = kvd_registry_arena(&d->reg, n);
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
static int op_g1_select(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  if (s->g1_loaded)
    return kvd_fail(out, req, KV_EBADSTATE,
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
static int op_lookup(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
  const kv_keyvec *v = &req->batch.keys;
  int rc = kvd_load_keys(d, v);
  if (rc) return kvd_fail(out, req, rc, NULL);
  int hit = kvd_registry_lookup(&d->reg, s->ns, d->keys, v->n, d->tiers);
  if (hit < 0) return kvd_fail(out, req, hit, NULL);
  uint32_t core_ns = (uint32_t)session_ns(d, s)->core_ns;
  for (uint32_t i = 0; i < v->n; i++)
    if (d->tiers[i] == KV_TIER_NONE) kvd_miss_classify(d, s->ns, core_ns, &d->keys[i]);
  kv_msg m = kvd_reply_to(req);
  m.lookup_rep.hit_len = (uint32_t)hit;
  m.lookup_rep.n = v->n;
  m.lookup_rep.tiers = d->tiers;
  return kv_msg_encode(out, &m);
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

static int op_release(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
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
static int op_commit_abort(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out, int commit) {
  int rc = kvd_load_keys(d, &req->batch.keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < req->batch.keys.n; i++) {
    kv_block *b = any_block(d, s, i);
    if (!b) {
      d->status[i] = KV_ENOTFOUND;
    } else if (commit) {
      /* The writer's CRC (1.2) is taken as it is: the daemon never reads
       * the bytes for it, and a wrong one only makes readers reject them. */
      uint32_t crc = 0;
      if (req->batch.flags & KV_COMMIT_CRC)
        crc = kv_u32vec_get(&req->batch.crcs, i);
      else if (b->state == KV_BS_WRITING && b->slot[KV_G2] != KV_SLOT_NONE)
        crc = kv_crc32c(0, kv_core_g2_ptr(d->core, b), b->size);
      d->status[i] = kvd_session_commit(d->core, s, b, crc);
      if (d->status[i] == 0) kvd_ghost_note(d, b->ns, &d->keys[i], 1);
    } else {
      d->status[i] = kvd_session_abort(d->core, s, b);
    }
  }
  return statuses(req, out, d->status, req->batch.keys.n);
}

/* --- DELETE, SET_PRIORITY ----------------------------------------------------- */
typedef struct del_all { kvd *d; uint32_t core_ns; uint64_t n; } del_all;
static int del_one(kv_block *b, void *arg) {
  del_all *x = arg;
  if (b->ns != x->core_ns || b->state != KV_BS_READY) return 0;
  kv_key k;
  kv_key_set(&k, b->key, kv_block_keylen(b));
  if (kv_core_delete(x->d->core, b) == 0) {
    kvd_ghost_note(x->d, x->core_ns, &k, 0);
    x->n++;
  }
  return 0;
}

static int op_delete(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
  const kv_batch_req *b = &req->batch;
  kv_msg m = kvd_reply_to(req);
  if (b->flags & KV_DEL_ALL) {
    del_all x = {d, (uint32_t)session_ns(d, s)->core_ns, 0};
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
    n += d->status[i] == 0;
  }
  m.delete_rep.deleted = n;
  m.delete_rep.st.n = b->keys.n;
  m.delete_rep.st.v = d->status;
  return kv_msg_encode(out, &m);
}

static int op_set_priority(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
  int rc = kvd_load_keys(d, &req->batch.keys);
  if (rc) return kvd_fail(out, req, rc, NULL);
  for (uint32_t i = 0; i < req->batch.keys.n; i++) {
    kv_block *b = kv_core_find(d->core, (uint32_t)session_ns(d, s)->core_ns, &d->keys[i]);
    d->status[i] = b ? 0 : KV_ENOTFOUND;
    if (b) kv_core_set_priority(d->core, b, req->batch.prio);
  }
  return statuses(req, out, d->status, req->batch.keys.n);
}

/* --- PUT (GET: load.c): the inline slow path ---------------------------------------- */
static int op_put(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
  const kv_put_req *p = &req->put;
  kvd_ns *n = session_ns(d, s);
  if (p->data.len != n->block_bytes)
    return kvd_fail(out, req, -EINVAL, "PUT data length differs from the namespace's block_bytes");
  kv_key k, parent;
  kv_key_set(&k, p->key.p, p->key.len);
  if (p->parent.len) kv_key_set(&parent, p->parent.p, p->parent.len);
  kv_block *b;
  int rc = kv_core_alloc(d->core, (uint32_t)n->core_ns, &k, p->parent.len ? &parent : NULL,
                         p->prio, &b);
  if (rc) return kvd_fail(out, req, rc, NULL);
  memcpy(kv_core_g2_ptr(d->core, b), p->data.p, p->data.len);
  kv_core_commit(d->core, b, kv_crc32c(0, p->data.p, p->data.len));
  kvd_ghost_note(d, (uint32_t)n->core_ns, &k, 1);
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core); /* a soft g2.capacity */
  kv_msg m = kvd_reply_to(req);
  return kv_msg_encode(out, &m);
}

/* --- STATUS ----------------------------------------------------------------- */
static int op_status(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out) {
  json_t *tenants = json_array();
  uint64_t cap = 0, used = 0;
  for (uint32_t i = 0; i < d->reg.ntenants; i++) {
    kv_arena *a = &d->reg.tenants[i].arena;
    cap += a->capacity;
    used += a->used_bytes;
    json_array_append_new(tenants, json_pack("{s:s,s:I,s:I,s:b}", "tenant", d->reg.tenants[i].cfg.name,
                                             "capacity_bytes", (json_int_t)a->capacity,
                                             "used_bytes", (json_int_t)a->used_bytes,
                                             "locked", a->locked));
  }
  kv_core_stats_t cs;
  kv_core_stats(d->core, &cs);
  const kv_core_stats_t *c = &cs;
  uint64_t misses = 0; /* every reason, as kvcached_misses_total counts them */
  for (int i = 0; i < KVD_MISS_COUNT; i++) misses += d->m.misses[i];
  json_t *o = json_pack(
      "{s:s,s:I,s:I,s:{s:I,s:I,s:I,s:o},s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I},s:s,s:I}",
      "version", KV_VERSION, "uptime_s", (json_int_t)((kv_now_ms() - d->start_ms) / 1000),
      "sessions", (json_int_t)d->nsessions,
      "g2", "capacity_bytes", (json_int_t)cap, "used_bytes", (json_int_t)used,
      "blocks", (json_int_t)kv_core_index(d->core)->count, "tenants", tenants,
      "core", "lookups", (json_int_t)c->lookups, "hits_g1", (json_int_t)c->hits[KV_G1],
      "hits_g2", (json_int_t)c->hits[KV_G2], "hits_g3", (json_int_t)c->hits[KV_G3],
      "misses", (json_int_t)misses, "evictions_g2", (json_int_t)c->evictions[KV_G2],
      "allocs", (json_int_t)c->allocs, "commits", (json_int_t)c->commits,
      "aborts", (json_int_t)c->aborts,
      "policy", kv_core_policy_name(d->core), "namespaces", (json_int_t)d->reg.nlive);
  if (o && d->g3) {
    kv_g3_stats gs;
    kv_g3_get_stats(d->g3, &gs);
    json_object_set_new(o, "g3", json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
        "state", kv_g3_state_name(gs.state), "capacity_bytes", (json_int_t)gs.capacity_bytes,
        "stored_bytes", (json_int_t)gs.stored_bytes, "blocks", (json_int_t)gs.slots_stored,
        "reads", (json_int_t)gs.reads, "writes", (json_int_t)gs.writes,
        "corrupt", (json_int_t)gs.corrupt, "io_errors", (json_int_t)gs.io_errors,
        "warm_blocks", (json_int_t)c->warm_blocks));
    json_object_set_new(json_object_get(o, "core"), "promotions", json_integer((json_int_t)c->promotions));
    json_object_set_new(json_object_get(o, "core"), "g3_admitted", json_integer((json_int_t)c->g3_admitted));
    json_object_set_new(json_object_get(o, "core"), "g3_refused", json_integer((json_int_t)c->g3_refused));
  }
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

int kvd_handle(kvd *d, kvd_sink *sink, const kv_msg *req, kv_buf *out, int fd_out[2]) {
  kvd_session *s = sink->sess;
  fd_out[0] = fd_out[1] = -1;
  if (req->flags & KV_F_REPLY) return kvd_fail(out, req, KV_EBADFRAME, "a reply sent to the daemon");
  if (req->op < KV_OP_COUNT) d->st.ops[req->op]++;
  if (req->op == KV_OP_HELLO) return op_hello(d, sink, req, out, fd_out);
  if (req->op == KV_OP_STATUS) return op_status(d, s, req, out);
  if (s->ns < 0) return kvd_fail(out, req, KV_ENOSESSION, NULL);
  switch (req->op) {
  case KV_OP_LOOKUP: {
    uint64_t t0 = kv_now_ns();
    int rc = op_lookup(d, s, req, out);
    kvd_req_done(d, KVD_REQ_LOOKUP, t0);
    return rc;
  }
  case KV_OP_LOAD:
  case KV_OP_LOAD2: return kvd_op_load(d, sink, req, out);
  case KV_OP_RELEASE: return op_release(d, s, req, out);
  case KV_OP_ALLOC: return kvd_op_alloc(d, sink, req, out);
  case KV_OP_COMMIT: return op_commit_abort(d, s, req, out, 1);
  case KV_OP_ABORT: return op_commit_abort(d, s, req, out, 0);
  case KV_OP_PREFETCH: return kvd_op_prefetch(d, sink, req, out);
  case KV_OP_DELETE: return op_delete(d, s, req, out);
  case KV_OP_SET_PRIORITY: return op_set_priority(d, s, req, out);
  case KV_OP_PUT: return op_put(d, s, req, out);
  case KV_OP_GET: return kvd_op_get(d, sink, req, out);
  case KV_OP_G1_SELECT: return op_g1_select(d, s, req, out, fd_out);
  default: return kvd_fail(out, req, KV_EBADOP, NULL);
  }
}
