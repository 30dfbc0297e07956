/*
 * client.c - libkvclient's connection, requests and replies (kvclient.h).
 *
 * Every request, blocking or not, goes the same way: encode, send, record
 * a pending entry under its request id. Replies may come in any order;
 * each is matched to its pending entry by id, its per-key results written
 * where the caller asked, and the entry finished. A blocking call reads
 * and dispatches replies until its own is finished; finished non-blocking
 * requests wait in a list for kvc_poll().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/paths.h"
#include "client/engine.h"
#include "client/g1.h"
#include "client/kvclient.h"
#include "client/presence.h"
#include "ipc/reader.h"
#include "ipc/sock.h"
#include "proto/wire.h"

/* kvc_block.has_crc and .crc took padding (after tier, after length): the
 * struct keeps its size (and every other field its offset) on LP64. */
_Static_assert(sizeof(void *) != 8 || sizeof(kvc_block) == 24, "kvc_block changed size");

typedef struct pending {
  uint64_t id;
  int op;
  int sync;
  void *user;
  uint32_t n;
  uint8_t *tiers;
  kvc_block *blocks;
  int32_t *status;
  void *buf; /* GET */
  uint32_t cap;
  char **json; /* STATUS */
  int fd;      /* PRESENCE: the table's, from its reply's frame; -1: none */
} pending;

struct kvc {
  int fd;
  kv_reader rd;
  kv_buf wbuf;
  uint8_t *arena;
  size_t arena_bytes;
  uint32_t slot_bytes, block_bytes;
  uint64_t session;
  uint16_t minor; /* the protocol minor HELLO settled on (1.2: LOAD2, COMMIT CRCs) */
  uint64_t next_id;
  int timeout_ms;
  pending *pend;
  uint32_t npend, cappend;
  kvc_completion *done;
  uint32_t ndone, capdone;
  uint64_t sync_id; /* the blocking call's request, when finished */
  int sync_result;
  int sync_done;
  int dead;   /* sticky connection error */
  kvc__g1 g1; /* the imported G1 pool, if any */
  kvc__g2 g2; /* the G2 mapping's CUDA registration (engine.c) */
  kvc__pres pres; /* the namespace's presence table, if mapped (presence.h) */
  int lookup_mode; /* KVC_LOOKUP_AUTO or KVC_LOOKUP_DAEMON */
  int last_local;  /* the last lookup was answered from the table: the next LOAD says so */
  kvc_lookup_info lst;
};

int kvc_g1_info(const kvc *c, kvc_g1 *out) {
  if (!c || !out) return -EINVAL;
  *out = c->g1.info;
  return 0;
}

int kvc_g2_info(const kvc *c, kvc_g2 *out) {
  if (!c || !out) return -EINVAL;
  *out = c->g2.info;
  return 0;
}

kvc__g2 *kvc__g2_of(kvc *c) { return &c->g2; }
const kvc_g1 *kvc__g1_of(const kvc *c) { return &c->g1.info; }

int kvc_g1_ptr(const kvc *c, uint64_t offset, uint64_t len, void **out) {
  if (!c || !out) return -EINVAL;
  if (!c->g1.info.available) return -ENODEV;
  if (len == 0 || offset > c->g1.info.bytes || len > c->g1.info.bytes - offset) return -ERANGE;
  *out = (uint8_t *)c->g1.info.base + offset;
  return 0;
}

const char *kvc_strerror(int err) { return kv_strerror(err); }
uint64_t kvc_session_id(const kvc *c) { return c->session; }
uint32_t kvc_slot_bytes(const kvc *c) { return c->slot_bytes; }
int kvc_fd(const kvc *c) { return c->fd; }
int kvc_pending(const kvc *c) { return (int)(c->npend + c->ndone); }

/* --- sending ----------------------------------------------------------------- */

static int send_msg(kvc *c, kv_msg *m) {
  if (c->dead) return c->dead;
  kv_buf_reset(&c->wbuf);
  kv_bytes tail;
  int rc = kv_msg_encode_head(&c->wbuf, m, &tail);
  if (rc) return rc;
  struct iovec iov[2] = {{c->wbuf.p, c->wbuf.len}, {(void *)tail.p, tail.len}};
  rc = kv_sock_send_frame(c->fd, iov, tail.len ? 2 : 1, -1, c->timeout_ms);
  if (rc) c->dead = rc == -ETIMEDOUT ? -EPIPE : rc; /* a partial frame breaks the stream */
  return rc;
}

static int keyvec(kv_keyvec *v, const kvc_key *keys, uint32_t n) {
  if (n > KVC_BATCH_MAX) return -E2BIG;
  if (n == 0) {
    memset(v, 0, sizeof *v);
    return 0;
  }
  /* kvc_key and kv_key have one layout: a length byte and 32 key bytes. */
  return kv_keyvec_from_keys(v, (const kv_key *)keys, n);
}

static pending *add_pending(kvc *c, int op, uint32_t n, void *user) {
  if (c->npend == c->cappend) {
    uint32_t cap = c->cappend ? c->cappend * 2 : 16;
    pending *p = realloc(c->pend, cap * sizeof *p);
    if (!p) return NULL;
    c->pend = p;
    c->cappend = cap;
  }
  pending *p = &c->pend[c->npend++];
  memset(p, 0, sizeof *p);
  p->fd = -1;
  p->id = c->next_id++;
  p->op = op;
  p->n = n;
  p->user = user;
  return p;
}

/* Encodes and sends m for pending p (the last added); on failure p is
 * withdrawn. Returns p's id or the error. */
static int64_t submit(kvc *c, kv_msg *m, pending *p) {
  m->id = p->id;
  int rc = send_msg(c, m);
  if (rc) {
    c->npend--;
    return rc;
  }
  return (int64_t)p->id;
}

/* --- receiving ------------------------------------------------------------- */

static int count_ok_status(const kv_statvec *s, int32_t *out, uint32_t n) {
  int ok = 0;
  for (uint32_t i = 0; i < s->n && i < n; i++) {
    int32_t v = kv_statvec_get(s, i);
    if (out) out[i] = v;
    ok += v == 0;
  }
  return ok;
}

/* Fills one block result of a LOAD or ALLOC reply (crc: LOAD2's, else -1).
 * A pointer is handed out only inside the G2 mapping or the G1 pool this
 * handle imported: anything else is KV_EBADFRAME. Returns 1 if the block
 * is usable. */
static int set_block(kvc *c, kvc_block *b, int32_t status, uint8_t tier, uint64_t offset,
                     uint32_t length, int64_t crc) {
  memset(b, 0, sizeof *b);
  b->tier = KVC_TIER_NONE;
  b->status = status;
  if (status != 0) return 0;
  if (crc >= 0) {
    b->has_crc = 1;
    b->crc = (uint32_t)crc;
  }
  if (tier == KV_G1) {
    void *p;
    if (length == 0 || kvc_g1_ptr(c, offset, length, &p)) {
      b->status = KV_EBADFRAME;
      return 0;
    }
    b->tier = KVC_G1;
    b->ptr = p;
    b->length = length;
    return 1;
  }
  if (tier != KV_G2 || offset > c->arena_bytes || length > c->arena_bytes - offset) {
    b->status = KV_EBADFRAME;
    return 0;
  }
  b->tier = KVC_G2;
  b->ptr = c->arena + offset;
  b->length = length;
  return 1;
}

/* Writes the reply's results where p asked; returns the call's result. */
static int apply_reply(kvc *c, pending *p, const kv_msg *m) {
  if (m->op == KV_OP_ERROR) return m->status < 0 ? m->status : KV_EBADFRAME;
  if (m->op != p->op) return KV_EBADFRAME;
  switch (m->op) {
  case KV_OP_LOOKUP:
    if (m->lookup_rep.n != p->n || m->lookup_rep.hit_len > p->n) return KV_EBADFRAME;
    if (p->tiers) memcpy(p->tiers, m->lookup_rep.tiers, p->n);
    return (int)m->lookup_rep.hit_len;
  case KV_OP_LOAD:
  case KV_OP_LOAD2: {
    if (m->load_rep.n != p->n) return KV_EBADFRAME;
    int ok = 0;
    for (uint32_t i = 0; i < p->n; i++) {
      kv_load_ent e;
      kv_loadvec_get(&m->load_rep, i, &e);
      ok += set_block(c, &p->blocks[i], e.status, e.tier, e.offset, e.length,
                      m->op == KV_OP_LOAD2 ? (int64_t)e.crc : -1);
    }
    return ok;
  }
  case KV_OP_ALLOC: {
    if (m->alloc_rep.n != p->n) return KV_EBADFRAME;
    int ok = 0;
    for (uint32_t i = 0; i < p->n; i++) {
      kv_alloc_ent e;
      kv_allocvec_get(&m->alloc_rep, i, &e);
      ok += set_block(c, &p->blocks[i], e.status, KV_G2, e.offset, c->block_bytes, -1);
    }
    return ok;
  }
  case KV_OP_RELEASE:
  case KV_OP_COMMIT:
  case KV_OP_ABORT:
  case KV_OP_SET_PRIORITY:
  case KV_OP_HINT:
    if (m->statuses.n != p->n) return KV_EBADFRAME;
    return count_ok_status(&m->statuses, p->status, p->n);
  case KV_OP_PREFETCH: return (int)m->prefetch_queued;
  case KV_OP_PRESENCE: {
    int fd = p->fd;
    p->fd = -1;
    return fd < 0 ? KV_EBADFD : kvc__pres_attach(&c->pres, fd, m->presence_rep.bytes);
  }
  case KV_OP_DELETE: return (int)m->delete_rep.deleted;
  case KV_OP_PUT: return 0;
  case KV_OP_GET: {
    uint32_t n = m->get_rep.data.len < p->cap ? m->get_rep.data.len : p->cap;
    if (p->buf && n) memcpy(p->buf, m->get_rep.data.p, n);
    return (int)m->get_rep.data.len;
  }
  case KV_OP_STATUS: {
    char *s = malloc(m->status_text.len + 1);
    if (!s) return -ENOMEM;
    memcpy(s, m->status_text.p, m->status_text.len);
    s[m->status_text.len] = 0;
    *p->json = s;
    return 0;
  }
  default: return KV_EBADFRAME;
  }
}

static int push_done(kvc *c, const pending *p, int result) {
  if (c->ndone == c->capdone) {
    uint32_t cap = c->capdone ? c->capdone * 2 : 16;
    kvc_completion *d = realloc(c->done, cap * sizeof *d);
    if (!d) return -ENOMEM;
    c->done = d;
    c->capdone = cap;
  }
  int op = p->op == KV_OP_LOAD2 ? KVC_OP_LOAD : p->op; /* the caller asked for a load */
  c->done[c->ndone++] = (kvc_completion){p->id, op, result, p->user};
  return 0;
}

static int dispatch(kvc *c, const kv_frame *f) {
  kv_msg m;
  int rc = kv_msg_decode(f->p, f->len, &m);
  int fd = f->fd; /* a PRESENCE reply's table; closed below for anything else */
  if (f->fd2 >= 0) close(f->fd2);
  if (!rc && m.op == KV_OP_PRESENCE && (m.flags & KV_F_REPLY)) {
    for (uint32_t i = 0; i < c->npend && fd >= 0; i++)
      if (c->pend[i].id == m.id && c->pend[i].op == KV_OP_PRESENCE) {
        c->pend[i].fd = fd;
        fd = -1;
      }
  }
  if (fd >= 0) close(fd);
  if (rc && rc != KV_EBADOP) return rc;
  if (!(m.flags & KV_F_REPLY)) return KV_EBADFRAME;
  for (uint32_t i = 0; i < c->npend; i++) {
    pending *p = &c->pend[i];
    if (p->id != m.id) continue;
    int result = rc ? rc : apply_reply(c, p, &m);
    if (p->fd >= 0) close(p->fd); /* not taken: an ERROR, or a reply to another op */
    if (p->sync) {
      c->sync_id = p->id;
      c->sync_result = result;
      c->sync_done = 1;
    } else if ((rc = push_done(c, p, result))) {
      return rc;
    }
    c->pend[i] = c->pend[--c->npend];
    return 0;
  }
  if (m.id == 0 && m.op == KV_OP_ERROR) return m.status < 0 ? m.status : KV_EBADFRAME;
  return 0; /* a reply to nothing we wait for: ignore it */
}

/* Reads and dispatches until the request `id` is finished. */
static int wait_for(kvc *c, uint64_t id) {
  c->sync_done = 0;
  for (uint32_t i = 0; i < c->npend; i++)
    if (c->pend[i].id == id) c->pend[i].sync = 1;
  while (!(c->sync_done && c->sync_id == id)) {
    kv_frame f;
    int r = kv_reader_recv(&c->rd, c->fd, &f, c->timeout_ms);
    if (r == 0) r = -ECONNRESET;
    if (r < 0) {
      c->dead = r;
      return r;
    }
    r = dispatch(c, &f);
    if (r < 0) {
      c->dead = r;
      return r;
    }
  }
  return c->sync_result;
}

int kvc_poll(kvc *c, kvc_completion *out, int max) {
  if (c->dead) return c->dead;
  for (;;) {
    kv_frame f;
    int r;
    while ((r = kv_reader_next(&c->rd, &f)) == 1)
      if ((r = dispatch(c, &f)) < 0) return c->dead = r;
    if (r < 0) return c->dead = r;
    ssize_t n = kv_reader_fill(&c->rd, c->fd, 1);
    if (n == -EAGAIN) break;
    if (n == 0) return c->dead = -ECONNRESET;
    if (n < 0) return c->dead = (int)n;
  }
  int k = 0;
  while (k < max && (uint32_t)k < c->ndone) {
    out[k] = c->done[k];
    k++;
  }
  if (k) {
    memmove(c->done, c->done + k, (c->ndone - (uint32_t)k) * sizeof *c->done);
    c->ndone -= (uint32_t)k;
  }
  return k;
}

/* --- requests ---------------------------------------------------------------- */

static int64_t batch(kvc *c, int op, uint8_t tier, uint8_t prio, uint8_t flags, const kvc_key *keys,
                     uint32_t n, pending **pp, void *user) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = (uint16_t)op;
  m.batch.tier = tier;
  m.batch.prio = prio;
  m.batch.flags = flags;
  int rc = keyvec(&m.batch.keys, keys, n);
  if (rc) return rc;
  pending *p = add_pending(c, op, n, user);
  if (!p) return -ENOMEM;
  *pp = p;
  return submit(c, &m, p);
}

static int64_t submit_lookup(kvc *c, uint8_t flags, const kvc_key *keys, uint32_t n,
                             uint8_t *tiers, void *user) {
  pending *p;
  int64_t id = batch(c, KV_OP_LOOKUP, 0, 0, flags, keys, n, &p, user);
  if (id > 0) c->pend[c->npend - 1].tiers = tiers;
  return id;
}
int64_t kvc_submit_lookup(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers, void *user) {
  return submit_lookup(c, 0, keys, n, tiers, user);
}
int64_t kvc_submit_lookup_all(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers,
                              void *user) {
  /* 1.4: KV_LOOKUP_ALL; a daemon before it refuses the bit, and answers as without it */
  return submit_lookup(c, c->minor >= 4 ? KV_LOOKUP_ALL : 0, keys, n, tiers, user);
}

int64_t kvc_submit_load(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n, kvc_block *out,
                        void *user) {
  if (!out) return -EINVAL;
  if (tier == KVC_G1 && !c->g1.info.available) return -ENODEV; /* not mapped here: load to G2 */
  pending *p;
  /* 1.2: LOAD2, whose reply carries each block's CRC for kvc_read/kvc_verify */
  int op = c->minor >= 2 ? KV_OP_LOAD2 : KV_OP_LOAD;
  /* 1.5: after a lookup the table answered, the daemon counts what it lacks */
  uint8_t flags = c->last_local && c->minor >= 5 ? KV_LOAD_LOCAL : 0;
  c->last_local = 0;
  int64_t id = batch(c, op, tier, 0, flags, keys, n, &p, user);
  if (id > 0) c->pend[c->npend - 1].blocks = out;
  return id;
}

static int64_t submit_status_op(kvc *c, int op, uint8_t prio, const kvc_key *keys, uint32_t n,
                                int32_t *status, void *user) {
  pending *p;
  int64_t id = batch(c, op, 0, prio, 0, keys, n, &p, user);
  if (id > 0) c->pend[c->npend - 1].status = status;
  return id;
}

int64_t kvc_submit_release(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status, void *user) {
  return submit_status_op(c, KV_OP_RELEASE, 0, keys, n, status, user);
}
int64_t kvc_submit_commit(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status, void *user) {
  return submit_status_op(c, KV_OP_COMMIT, 0, keys, n, status, user);
}

/* A COMMIT with flags (KV_COMMIT_CRC: crcs, n of them; KV_COMMIT_G4). */
static int64_t submit_commit(kvc *c, uint8_t flags, const kvc_key *keys, const uint32_t *crcs,
                             uint32_t n, int32_t *status, void *user) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_COMMIT;
  m.batch.flags = flags;
  int rc = keyvec(&m.batch.keys, keys, n);
  if (rc) return rc;
  if (flags & KV_COMMIT_CRC) m.batch.crcs = (kv_u32vec){.n = n, .v = crcs};
  pending *p = add_pending(c, KV_OP_COMMIT, n, user);
  if (!p) return -ENOMEM;
  p->status = status;
  return submit(c, &m, p);
}

int64_t kvc_submit_commit_crc(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                              int32_t *status, void *user) {
  if (n && !crcs) return -EINVAL;
  if (c->minor < 2) /* the daemon predates 1.2: it checksums the blocks itself */
    return kvc_submit_commit(c, keys, n, status, user);
  return submit_commit(c, KV_COMMIT_CRC, keys, crcs, n, status, user);
}

int64_t kvc_submit_commit_shared(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                                 int32_t *status, void *user) {
  if (c->minor < 4) return -EOPNOTSUPP; /* before 1.4 no COMMIT waits for G4 */
  return submit_commit(c, KV_COMMIT_G4 | (crcs ? KV_COMMIT_CRC : 0), keys, crcs, n, status,
                       user);
}

_Static_assert(KVC_STOP_OTHER == KV_STOP_OTHER && KVC_STOP_TOOL_USE == KV_STOP_TOOL_USE &&
                   KVC_STOP_END_TURN == KV_STOP_END_TURN && KVC_STOP_ABORTED == KV_STOP_ABORTED,
               "kvclient.h's stop reasons are base/hint.h's");
_Static_assert(KVC_OP_HINT == KV_OP_HINT, "kvclient.h's HINT opcode");

uint64_t kvc_hint_session_id(const void *name, size_t len) { return kv_session_id(name, len); }
int kvc_stop_parse(const char *name) { return (int)kv_stop_parse(name); }

int64_t kvc_submit_hint(kvc *c, int kind, uint64_t session, int stop, uint32_t retain_s,
                        const kvc_key *keys, uint32_t n, int32_t *status, void *user) {
  if (c->minor < 3) return -EOPNOTSUPP; /* the daemon predates 1.3 */
  if (kind != KV_HINT_FINISHED && stop != 0) return -EINVAL;
  if (stop < 0 || stop >= KV_STOP_COUNT || kind < KV_HINT_SESSION || kind >= KV_HINT_KIND_COUNT)
    return -EINVAL;
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_HINT;
  m.hint = (kv_hint_req){
      .kind = (uint8_t)kind, .stop = (uint8_t)stop, .retain_s = retain_s, .session = session};
  int rc = keyvec(&m.hint.keys, keys, n);
  if (rc) return rc;
  pending *p = add_pending(c, KV_OP_HINT, n, user);
  if (!p) return -ENOMEM;
  p->status = status;
  return submit(c, &m, p);
}

int64_t kvc_submit_alloc(kvc *c, uint8_t tier, uint8_t prio, const kvc_key *keys,
                         const kvc_key *parents, uint32_t n, kvc_block *out, void *user) {
  if (!out) return -EINVAL;
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_ALLOC;
  m.alloc.tier = tier;
  m.alloc.prio = prio;
  int rc = keyvec(&m.alloc.keys, keys, n);
  if (rc) return rc;
  uint8_t *has = NULL;
  kv_key *par = NULL;
  if (parents && n) {
    has = calloc(n, 1);
    par = calloc(n, sizeof *par);
    if (!has || !par) {
      free(has);
      free(par);
      return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
      par[i].len = keys[0].len; /* absent entries: zero bytes of the keys' length */
      if (parents[i].len) {
        if (parents[i].len != keys[0].len) {
          free(has);
          free(par);
          return -EINVAL;
        }
        has[i] = 1;
        memcpy(par[i].b, parents[i].b, parents[i].len);
      }
    }
    m.alloc.has_parent = has;
    rc = kv_keyvec_from_keys(&m.alloc.parents, par, n);
    if (rc) {
      free(has);
      free(par);
      return rc;
    }
  }
  int64_t id = -ENOMEM;
  pending *p = add_pending(c, KV_OP_ALLOC, n, user);
  if (p) {
    p->blocks = out;
    id = submit(c, &m, p);
  }
  free(has);
  free(par);
  return id;
}

/* The blocking calls: submit, then wait for that reply. */
#define BLOCK_ON(expr)                 \
  do {                                 \
    int64_t id_ = (expr);              \
    if (id_ < 0) return (int)id_;      \
    return wait_for(c, (uint64_t)id_); \
  } while (0)

/* PRESENCE (1.5): maps the namespace's presence table, or records why
 * not. Returns 0 (table or not: c->lst says), or the error that broke the
 * connection. */
static int presence_map(kvc *c) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_PRESENCE;
  pending *p = add_pending(c, KV_OP_PRESENCE, 0, NULL);
  if (!p) return -ENOMEM;
  int64_t id = submit(c, &m, p);
  int rc = id < 0 ? (int)id : wait_for(c, (uint64_t)id);
  if (rc == 0) {
    c->lst.mapped = 1;
    c->lst.maps++;
    c->lst.reason[0] = 0;
    return 0;
  }
  kvc__pres_release(&c->pres);
  c->lst.mapped = 0;
  snprintf(c->lst.reason, sizeof c->lst.reason, "the daemon's PRESENCE failed: %s",
           kv_strerror(rc));
  return c->dead;
}

/* The lookup answered from the presence table, or -EAGAIN when only the
 * daemon can answer (client/presence.h), counted as the daemon's: the
 * caller asks it. A retired table is replaced once. */
static int lookup_local(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers) {
  int r = -EAGAIN;
  if (c->lookup_mode == KVC_LOOKUP_AUTO && c->pres.map && !c->dead) {
    r = kvc__pres_lookup(&c->pres, keys, n, tiers);
    if (r == -ESTALE) {
      c->lst.retired++;
      r = presence_map(c) || !c->pres.map ? -EAGAIN : kvc__pres_lookup(&c->pres, keys, n, tiers);
    }
  }
  c->last_local = r >= 0;
  if (r >= 0) c->lst.local++;
  else c->lst.daemon++;
  return r;
}

int kvc_lookup(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers) {
  int r = lookup_local(c, keys, n, tiers);
  if (r >= 0) return r;
  BLOCK_ON(kvc_submit_lookup(c, keys, n, tiers, NULL));
}
int kvc_lookup_all(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers) {
  /* past a miss, only G4 could know more, and a table with G4 sends a short
   * run to the daemon: the same answer as KV_LOOKUP_ALL's */
  int r = lookup_local(c, keys, n, tiers);
  if (r >= 0) return r;
  BLOCK_ON(kvc_submit_lookup_all(c, keys, n, tiers, NULL));
}

int kvc_set_lookup(kvc *c, int mode) {
  if (!c || (mode != KVC_LOOKUP_AUTO && mode != KVC_LOOKUP_DAEMON)) return -EINVAL;
  c->lookup_mode = mode;
  if (mode == KVC_LOOKUP_AUTO && !c->pres.map && c->minor >= 5) return presence_map(c);
  if (mode == KVC_LOOKUP_DAEMON) { /* the table is of no more use */
    kvc__pres_release(&c->pres);
    c->lst.mapped = 0;
    snprintf(c->lst.reason, sizeof c->lst.reason, "KVC_LOOKUP_DAEMON");
  }
  return 0;
}

int kvc_lookup_stats(const kvc *c, kvc_lookup_info *out) {
  if (!c || !out) return -EINVAL;
  *out = c->lst;
  out->bytes = c->pres.bytes;
  out->mode = c->lookup_mode;
  return 0;
}
int kvc_load(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n, kvc_block *out) {
  BLOCK_ON(kvc_submit_load(c, tier, keys, n, out, NULL));
}
int kvc_release(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status) {
  BLOCK_ON(kvc_submit_release(c, keys, n, status, NULL));
}
int kvc_alloc(kvc *c, uint8_t tier, uint8_t prio, const kvc_key *keys, const kvc_key *parents,
              uint32_t n, kvc_block *out) {
  BLOCK_ON(kvc_submit_alloc(c, tier, prio, keys, parents, n, out, NULL));
}
int kvc_commit(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status) {
  BLOCK_ON(kvc_submit_commit(c, keys, n, status, NULL));
}
int kvc_commit_crc(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n, int32_t *status) {
  BLOCK_ON(kvc_submit_commit_crc(c, keys, crcs, n, status, NULL));
}
int kvc_commit_shared(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                      int32_t *status) {
  BLOCK_ON(kvc_submit_commit_shared(c, keys, crcs, n, status, NULL));
}

/* --- checksums ------------------------------------------------------------------ */

uint32_t kvc_copy_crc(void *dst, const void *src, size_t len) {
  /* A writer fills a slot for other processes: stream it past the cache. */
  return kv_crc32c_copy_nt(0, dst, src, len);
}

uint32_t kvc_crc32c(uint32_t crc, const void *p, size_t len) { return kv_crc32c(crc, p, len); }

/* The block's bytes as this process can read them with the CPU: a G2 slot,
 * or a G1 slot of a simulated pool (host memory). 0, -EINVAL (not a usable
 * block), -EOPNOTSUPP (no CRC came with it: a daemon before 1.2, or an
 * allocation; or a G1 slot on a real device). */
static int readable(const kvc *c, const kvc_block *b, const void **p) {
  if (b->status != 0 || !b->ptr || b->length == 0) return -EINVAL;
  if (!b->has_crc) return -EOPNOTSUPP;
  if (b->tier == KVC_G1 && c->g1.info.backend != KVC_G1_SIM) return -EOPNOTSUPP;
  if (b->tier != KVC_G1 && b->tier != KVC_G2) return -EINVAL;
  *p = b->ptr;
  return 0;
}

/* b failed its CRC: RELEASE its pin with KV_REL_CORRUPT (the daemon checks
 * its own copy and drops the block if that fails too), and mark b unusable. */
static int report_corrupt(kvc *c, const kvc_key *key, kvc_block *b) {
  int32_t st;
  pending *p;
  int64_t id = batch(c, KV_OP_RELEASE, 0, 0, KV_REL_CORRUPT, key, 1, &p, NULL);
  if (id > 0) {
    c->pend[c->npend - 1].status = &st;
    (void)wait_for(c, (uint64_t)id); /* the verdict is the daemon's; a dead link shows next call */
  }
  memset(b, 0, sizeof *b);
  b->status = KV_ECORRUPT;
  b->tier = KVC_TIER_NONE;
  return KV_ECORRUPT;
}

int kvc_read(kvc *c, const kvc_key *key, kvc_block *b, void *dst) {
  if (!c || !key || !b || !dst) return -EINVAL;
  const void *src;
  int rc = readable(c, b, &src);
  if (rc) return rc;
  if (kv_crc32c_copy(0, dst, src, b->length) == b->crc) return 0;
  return report_corrupt(c, key, b);
}

int kvc_verify(kvc *c, const kvc_key *key, kvc_block *b) {
  if (!c || !key || !b) return -EINVAL;
  const void *src;
  int rc = readable(c, b, &src);
  if (rc) return rc;
  if (kv_crc32c(0, src, b->length) == b->crc) return 0;
  return report_corrupt(c, key, b);
}
int kvc_abort(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status) {
  BLOCK_ON(submit_status_op(c, KV_OP_ABORT, 0, keys, n, status, NULL));
}
int kvc_set_priority(kvc *c, uint8_t prio, const kvc_key *keys, uint32_t n, int32_t *status) {
  BLOCK_ON(submit_status_op(c, KV_OP_SET_PRIORITY, prio, keys, n, status, NULL));
}
int kvc_hint_session(kvc *c, uint64_t session, const kvc_key *keys, uint32_t n, uint32_t retain_s,
                     int32_t *status) {
  BLOCK_ON(kvc_submit_hint(c, KV_HINT_SESSION, session, 0, retain_s, keys, n, status, NULL));
}
int kvc_hint_finished(kvc *c, uint64_t session, int stop, const kvc_key *keys, uint32_t n,
                      uint32_t retain_s, int32_t *status) {
  BLOCK_ON(kvc_submit_hint(c, KV_HINT_FINISHED, session, stop, retain_s, keys, n, status, NULL));
}
int kvc_hint_end(kvc *c, uint64_t session) {
  BLOCK_ON(kvc_submit_hint(c, KV_HINT_END, session, 0, 0, NULL, 0, NULL, NULL));
}
int kvc_prefetch(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n) {
  pending *p;
  BLOCK_ON(batch(c, KV_OP_PREFETCH, tier, 0, 0, keys, n, &p, NULL));
}
int kvc_delete(kvc *c, const kvc_key *keys, uint32_t n) {
  pending *p;
  if (!keys && n == 0) BLOCK_ON(batch(c, KV_OP_DELETE, 0, 0, KV_DEL_ALL, NULL, 0, &p, NULL));
  BLOCK_ON(batch(c, KV_OP_DELETE, 0, 0, 0, keys, n, &p, NULL));
}

int kvc_put(kvc *c, const kvc_key *key, const kvc_key *parent, uint8_t prio, const void *data,
            uint32_t len) {
  if (!key || !data) return -EINVAL;
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_PUT;
  m.put.prio = prio;
  m.put.key = (kv_bytes){key->b, key->len};
  if (parent && parent->len) m.put.parent = (kv_bytes){parent->b, parent->len};
  m.put.data = (kv_bytes){data, len};
  pending *p = add_pending(c, KV_OP_PUT, 0, NULL);
  if (!p) return -ENOMEM;
  BLOCK_ON(submit(c, &m, p));
}

int kvc_get(kvc *c, const kvc_key *key, void *buf, uint32_t cap) {
  if (!key) return -EINVAL;
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_GET;
  m.get_key = (kv_bytes){key->b, key->len};
  pending *p = add_pending(c, KV_OP_GET, 0, NULL);
  if (!p) return -ENOMEM;
  p->buf = buf;
  p->cap = cap;
  BLOCK_ON(submit(c, &m, p));
}

int kvc_status(kvc *c, char **json) {
  if (!json) return -EINVAL;
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_STATUS;
  pending *p = add_pending(c, KV_OP_STATUS, 0, NULL);
  if (!p) return -ENOMEM;
  p->json = json;
  BLOCK_ON(submit(c, &m, p));
}

/* --- open / close ------------------------------------------------------------ */

/* One request of kvc_open's, before replies can come out of order: sends
 * m, reads the next frame into *f (its fds, -1 when none) and decodes it
 * into *r. 0, the decoder's error, or the error that broke the connection
 * (*f then holds no fds); the caller closes the fds *f holds. */
/* A daemon that refuses a connection at accept (a connection limit) sends
 * an ERROR and closes it, maybe before the request is sent: the ERROR is
 * then still read, and returned rather than the send's -EPIPE. */
static int call_open(kvc *c, kv_msg *m, kv_frame *f, kv_msg *r) {
  f->fd = f->fd2 = -1;
  int sent = send_msg(c, m);
  if (sent && sent != -EPIPE && sent != -ECONNRESET) return sent;
  int rc = kv_reader_recv(&c->rd, c->fd, f, c->timeout_ms);
  if (rc == 0) rc = -ECONNRESET;
  if (rc < 0) {
    f->fd = f->fd2 = -1;
    return sent ? sent : rc;
  }
  rc = kv_msg_decode(f->p, f->len, r);
  if (rc == 0 && sent && r->op != KV_OP_ERROR) rc = sent;
  return rc;
}

/* g1.info.reason = prefix and the daemon's text (printable only). */
static void g1_reason_text(kvc *c, const char *prefix, const kv_tierinfo *t) {
  snprintf(c->g1.info.reason, sizeof c->g1.info.reason, "%s%.*s", prefix, (int)t->len,
           (const char *)t->p);
  for (char *q = c->g1.info.reason; *q; q++) /* text from the socket */
    if ((unsigned char)*q < 0x20 || (unsigned char)*q == 0x7f) *q = '?';
}

/* The device this worker computes on: kvc_opts.g1_uuid, else, for a pool
 * on a real GPU, the calling thread's current CUDA device. 0 when there is
 * no preference (a simulated pool, or no CUDA device here): the worker
 * takes the pool HELLO offers. */
static int g1_wanted(const kvc_opts *o, uint8_t kind, uint8_t want[16]) {
  if (o->g1_uuid) {
    memcpy(want, o->g1_uuid, 16);
    return 1;
  }
  if (kind != KV_TI_G1_VMM_FD && kind != KV_TI_G1_LEGACY_IPC) return 0;
  return kv_dev_current_uuid(want) == 0;
}

/* G1_SELECT: asks for the pool on device `want` and imports it. Returns 0
 * (the outcome, pool or not, is in c->g1) or the error that broke the
 * connection. */
static int g1_select(kvc *c, const uint8_t want[16]) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_G1_SELECT;
  m.id = c->next_id++;
  memcpy(m.g1_select.uuid, want, 16);
  kv_frame f;
  kv_msg r;
  int rc = call_open(c, &m, &f, &r);
  if (f.fd2 >= 0) close(f.fd2); /* never announced on this reply */
  if (rc == 0 && r.op == KV_OP_ERROR && r.id == m.id) {
    char us[KV_DEV_UUID_STR];
    snprintf(c->g1.info.reason, sizeof c->g1.info.reason,
             "the daemon refused G1_SELECT for device %s: %s", kv_dev_uuid_str(want, us),
             kv_strerror(r.status));
    rc = 0;
  } else if (rc || r.op != KV_OP_G1_SELECT || !(r.flags & KV_F_REPLY) || r.id != m.id) {
    rc = rc ? rc : KV_EBADFRAME;
  } else if (r.g1_pool.kind == KV_TI_G1_NONE) {
    g1_reason_text(c, "the daemon has no G1 pool on this worker's device: ", &r.g1_pool);
  } else {
    kvc__g1_import(&c->g1, r.g1_pool.kind, r.g1_pool.p, r.g1_pool.len, f.fd);
    f.fd = -1;
  }
  if (f.fd >= 0) close(f.fd);
  return rc;
}

/* HELLO's G1 entry t (fd: its pool's, or -1; closed here either way): the
 * pool when it is on this worker's device, or when the worker has no
 * preference; else that device's pool through G1_SELECT (protocol 1.1).
 * 0, or the error that broke the connection. */
static int g1_choose(kvc *c, const kvc_opts *o, uint16_t minor, const kv_tierinfo *t, int fd) {
  uint8_t want[16];
  kv_dev_export x;
  if (!g1_wanted(o, t->kind, want) || kv_dev_export_decode(t->p, t->len, &x) != 0 ||
      !memcmp(x.uuid, want, 16)) {
    kvc__g1_import(&c->g1, t->kind, t->p, t->len, fd); /* reports a bad entry itself */
    return 0;
  }
  if (fd >= 0) close(fd);
  if (minor >= 1) return g1_select(c, want);
  char a[KV_DEV_UUID_STR], b[KV_DEV_UUID_STR];
  snprintf(c->g1.info.reason, sizeof c->g1.info.reason,
           "the daemon's G1 pool is on device %s, this worker computes on %s, and the daemon "
           "(protocol 1.0) cannot offer another",
           kv_dev_uuid_str(x.uuid, a), kv_dev_uuid_str(want, b));
  return 0;
}

int kvc_open(const kvc_opts *o, kvc **out) {
  if (!o || !out || !o->tenant || !o->layout.dtype) return -EINVAL;
  const char *path = o->socket_path;
  if (!path) path = getenv("KVCACHED_SOCKET");
  if (!path) path = KV_SOCKET_PATH;
  kvc *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->fd = -1;
  c->next_id = 1;
  c->timeout_ms = o->timeout_ms == 0 ? 10000 : o->timeout_ms;
  kv_reader_init(&c->rd, 0);
  kv_buf_init(&c->wbuf);
  int rc;
  int fd = kv_sock_connect(path, 0);
  if (fd < 0) {
    rc = fd;
    goto err;
  }
  c->fd = fd;

  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_HELLO;
  m.id = c->next_id++;
  m.hello.ver_major = KV_PROTO_MAJOR;
  m.hello.ver_minor = KV_PROTO_MINOR;
  m.hello.tenant = (kv_str){o->tenant, (uint32_t)strlen(o->tenant)};
  if (o->group) m.hello.group = (kv_str){o->group, (uint32_t)strlen(o->group)};
  if (o->salt_len) m.hello.salt = (kv_bytes){o->salt, (uint32_t)o->salt_len};
  m.hello.layout.block_bytes = o->layout.block_bytes;
  m.hello.layout.tokens_per_block = o->layout.tokens_per_block;
  m.hello.layout.layers = o->layout.layers;
  m.hello.layout.kv_heads = o->layout.kv_heads;
  m.hello.layout.head_dim = o->layout.head_dim;
  m.hello.layout.tp_rank = o->layout.tp_rank;
  m.hello.layout.tp_size = o->layout.tp_size;
  m.hello.layout.dtype = (kv_str){o->layout.dtype, (uint32_t)strlen(o->layout.dtype)};
  if (!o->no_g1) m.hello.caps |= KV_CAP_G1;
  kv_frame f;
  kv_msg r;
  rc = call_open(c, &m, &f, &r);
  if (rc == 0 && r.op == KV_OP_ERROR) rc = r.status < 0 ? r.status : KV_EBADFRAME;
  else if (rc == 0 && (r.op != KV_OP_HELLO || !(r.flags & KV_F_REPLY) || f.fd < 0 ||
                       r.hello_rep.arena_bytes == 0))
    rc = KV_EBADFRAME;
  if (rc) {
    if (f.fd >= 0) close(f.fd);
    if (f.fd2 >= 0) close(f.fd2);
    goto err;
  }
  c->session = r.hello_rep.session_id;
  c->minor = r.hello_rep.ver_minor;
  c->slot_bytes = r.hello_rep.slot_bytes;
  c->block_bytes = o->layout.block_bytes;
  c->arena_bytes = r.hello_rep.arena_bytes;
  int arena_fd = f.fd;
  /* G1: the first entry for tier G1, if the daemon granted it; the pool's
   * fd (KV_F_FD2) is closed by the import (or g1_choose) either way. */
  int g1fd = f.fd2, g1done = 0;
  if (r.hello_rep.caps & KV_CAP_G1) {
    for (unsigned i = 0; i < r.hello_rep.ntierinfo && !g1done; i++) {
      kv_tierinfo t;
      kv_hello_tierinfo(&r.hello_rep, i, &t);
      if (t.tier != KV_G1) continue;
      rc = g1_choose(c, o, r.hello_rep.ver_minor, &t, g1fd);
      g1fd = -1;
      g1done = 1;
    }
    if (!g1done)
      snprintf(c->g1.info.reason, sizeof c->g1.info.reason,
               "the daemon granted G1 but sent no pool");
  } else if (!o->no_g1) {
    snprintf(
        c->g1.info.reason, sizeof c->g1.info.reason,
        "the daemon offers no G1 pool (G1 off there: see its log and kvcached_g1_unavailable)");
    for (unsigned i = 0; i < r.hello_rep.ntierinfo; i++) {
      kv_tierinfo t;
      kv_hello_tierinfo(&r.hello_rep, i, &t);
      if (t.tier != KV_G1 || t.kind != KV_TI_G1_NONE) continue;
      g1_reason_text(c, "the daemon offers no G1 pool: ", &t);
      break;
    }
  } else {
    snprintf(c->g1.info.reason, sizeof c->g1.info.reason, "not asked for (kvc_opts.no_g1)");
  }
  if (g1fd >= 0) close(g1fd);
  if (rc) { /* the connection broke while asking for the device's pool */
    close(arena_fd);
    goto err;
  }
  void *map = mmap(NULL, c->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
  rc = map == MAP_FAILED ? -errno : 0;
  close(arena_fd);
  if (rc) goto err;
  c->arena = map;
  c->g2.info.base = map;
  c->g2.info.bytes = c->arena_bytes;
  /* Lookups from the presence table (1.5), unless the environment says
   * KVCACHED_LOOKUP=daemon; a table refused (a TP group) is not an error. */
  const char *lk = getenv("KVCACHED_LOOKUP");
  if (lk && !strcmp(lk, "daemon")) {
    c->lookup_mode = KVC_LOOKUP_DAEMON;
    snprintf(c->lst.reason, sizeof c->lst.reason, "KVCACHED_LOOKUP=daemon");
  } else if (c->minor < 5) {
    snprintf(c->lst.reason, sizeof c->lst.reason,
             "the daemon speaks protocol 1.%u, before presence tables (1.5)", c->minor);
  } else if ((rc = presence_map(c))) {
    goto err;
  }
  *out = c;
  return 0;
err:
  kvc_close(c);
  return rc;
}

void kvc_close(kvc *c) {
  if (!c) return;
  kvc__g1_release(&c->g1);
  kvc__pres_release(&c->pres);
  if (c->g2.release) c->g2.release(&c->g2); /* the registration goes before the mapping */
  if (c->arena) munmap(c->arena, c->arena_bytes);
  if (c->fd >= 0) close(c->fd);
  kv_reader_free(&c->rd);
  kv_buf_free(&c->wbuf);
  free(c->pend);
  free(c->done);
  free(c);
}
