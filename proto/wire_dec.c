/*
 * wire_dec.c - the decoders of the wire protocol (wire.h, PROTOCOL.md).
 *
 * A read cursor that never moves past the frame: a read that does not fit
 * marks the cursor bad and yields zeros, and each decoder checks the mark
 * before it trusts what it read. Every length and count is checked against
 * its limit before it is used to take bytes, and the frame must be
 * consumed exactly (trailing bytes are KV_EBADFRAME). Nothing is allocated;
 * the decoded message points into the frame.
 */
#include <errno.h>
#include <string.h>

#include "base/le.h"
#include "proto/wire.h"
#include "proto/wire_int.h"

typedef struct rcur {
  const uint8_t *p;
  size_t n, off;
  int bad; /* a read ran past the end */
} rcur;

static const uint8_t *rtake(rcur *c, size_t len) {
  if (c->bad || c->n - c->off < len) {
    c->bad = 1;
    return NULL;
  }
  const uint8_t *p = c->p + c->off;
  c->off += len;
  return p;
}

static uint8_t r8(rcur *c) {
  const uint8_t *p = rtake(c, 1);
  return p ? p[0] : 0;
}

static uint16_t r16(rcur *c) {
  const uint8_t *p = rtake(c, 2);
  return p ? kv_ld16(p) : 0;
}

static uint32_t r32(rcur *c) {
  const uint8_t *p = rtake(c, 4);
  return p ? kv_ld32(p) : 0;
}

static uint64_t r64(rcur *c) {
  const uint8_t *p = rtake(c, 8);
  return p ? kv_ld64(p) : 0;
}

/* u8 length + bytes; lo <= len <= hi; utf8: must be UTF-8 text. */
static int rstr8(rcur *c, const uint8_t **out, uint32_t *outlen, uint32_t lo, uint32_t hi,
                 int utf8) {
  uint8_t len = r8(c);
  if (c->bad || len < lo || len > hi) return KV_EBADFRAME;
  const uint8_t *p = rtake(c, len);
  if (!p || (utf8 && !kv_utf8_ok(p, len))) return KV_EBADFRAME;
  *out = p;
  *outlen = len;
  return 0;
}

static int rstr(rcur *c, kv_str *s, uint32_t lo, uint32_t hi) {
  const uint8_t *p = NULL;
  int rc = rstr8(c, &p, &s->len, lo, hi, 1);
  s->p = (const char *)p;
  return rc;
}

static int rbytes(rcur *c, kv_bytes *b, uint32_t lo, uint32_t hi) {
  return rstr8(c, &b->p, &b->len, lo, hi, 0);
}

/* KEYS: u32 n | u8 klen (0 iff n == 0) | n * klen bytes. */
static int rkeys(rcur *c, kv_keyvec *k) {
  uint32_t n = r32(c);
  uint8_t klen = r8(c);
  memset(k, 0, sizeof *k);
  if (c->bad) return KV_EBADFRAME;
  if (n > KV_BATCH_MAX) return -E2BIG;
  if (n == 0) return klen == 0 ? 0 : KV_EBADFRAME;
  if (klen == 0 || klen > KV_KEY_MAX) return KV_EBADFRAME;
  const uint8_t *p = rtake(c, (size_t)n * klen);
  if (!p) return KV_EBADFRAME;
  k->p = p;
  k->n = n;
  k->klen = klen;
  return 0;
}

/* STATUSES: u32 n | n * i32, each <= 0. */
static int rstatuses(rcur *c, kv_statvec *s) {
  uint32_t n = r32(c);
  memset(s, 0, sizeof *s);
  if (c->bad) return KV_EBADFRAME;
  if (n > KV_BATCH_MAX) return -E2BIG;
  const uint8_t *p = rtake(c, (size_t)n * 4);
  if (!p) return KV_EBADFRAME;
  for (uint32_t i = 0; i < n; i++)
    if ((int32_t)kv_ld32(p + (size_t)i * 4) > 0) return KV_EBADFRAME;
  s->n = n;
  s->wire = p;
  return 0;
}

static int dec_hello_req(rcur *c, kv_hello_req *h) {
  kv_layout *l = &h->layout;
  h->ver_major = r16(c);
  h->ver_minor = r16(c);
  h->caps = r32(c);
  int rc = rstr(c, &h->tenant, 1, KV_TENANT_MAX);
  if (!rc) rc = rstr(c, &h->group, 0, KV_GROUP_MAX);
  if (!rc) rc = rbytes(c, &h->salt, 0, KV_SALT_MAX);
  if (rc) return rc;
  l->block_bytes = r32(c);
  l->tokens_per_block = r32(c);
  l->layers = r32(c);
  l->kv_heads = r32(c);
  l->head_dim = r32(c);
  l->tp_rank = r16(c);
  l->tp_size = r16(c);
  rc = rstr(c, &l->dtype, 1, KV_DTYPE_MAX);
  if (rc) return rc;
  return kv__hello_ok(h) ? 0 : KV_EBADFRAME;
}

/* One tier-info entry: u8 tier | u8 kind | u16 len | len bytes. */
static int rtierinfo(rcur *c, kv_tierinfo *t) {
  t->tier = r8(c);
  t->kind = r8(c);
  t->len = r16(c);
  if (c->bad || !kv__tierinfo_ok(t)) return KV_EBADFRAME;
  t->p = rtake(c, t->len);
  return t->p || t->len == 0 ? 0 : KV_EBADFRAME;
}

static int dec_hello_rep(rcur *c, kv_msg *m) {
  kv_hello_rep *r = &m->hello_rep;
  r->ver_major = r16(c);
  r->ver_minor = r16(c);
  r->caps = r32(c);
  r->session_id = r64(c);
  r->ns_id = r32(c);
  r->arena_bytes = r64(c);
  r->slot_align = r32(c);
  r->slot_bytes = r32(c);
  r->ntierinfo = r8(c);
  if (c->bad || !kv__hello_rep_ok(r, m->flags & KV_F_FD)) return KV_EBADFRAME;
  r->tierinfo = NULL;
  r->tierinfo_wire = c->p + c->off;
  for (unsigned i = 0; i < r->ntierinfo; i++) {
    kv_tierinfo t;
    if (rtierinfo(c, &t)) return KV_EBADFRAME;
  }
  return 0;
}

/* BATCH: u8 tier | u8 prio | u8 flags | KEYS, and for a COMMIT with
 * KV_COMMIT_CRC, n * u32 crc. */
static int dec_batch(rcur *c, uint16_t op, kv_batch_req *b) {
  b->tier = r8(c);
  b->prio = r8(c);
  b->flags = r8(c);
  int rc = rkeys(c, &b->keys);
  if (rc) return rc;
  memset(&b->crcs, 0, sizeof b->crcs);
  if (op == KV_OP_COMMIT && (b->flags & KV_COMMIT_CRC)) {
    b->crcs.wire = rtake(c, (size_t)b->keys.n * 4);
    if (!b->crcs.wire) return KV_EBADFRAME;
    b->crcs.n = b->keys.n;
  }
  return kv__batch_ok(op, b) ? 0 : KV_EBADFRAME;
}

/* HINT: u8 kind | u8 stop | u16 0 | u32 retain_s | u64 session | KEYS. */
static int dec_hint(rcur *c, kv_hint_req *h) {
  h->kind = r8(c);
  h->stop = r8(c);
  uint16_t rsv = r16(c);
  h->retain_s = r32(c);
  h->session = r64(c);
  int rc = rkeys(c, &h->keys);
  if (rc) return rc;
  return rsv == 0 && kv__hint_ok(h) ? 0 : KV_EBADFRAME;
}

/* ALLOC: u8 tier | u8 prio | KEYS | n * u8 has_parent | n * klen parents. */
static int dec_alloc(rcur *c, kv_alloc_req *a) {
  a->tier = r8(c);
  a->prio = r8(c);
  int rc = rkeys(c, &a->keys);
  if (rc) return rc;
  if (!kv__target_ok(a->tier)) return KV_EBADFRAME;
  uint32_t n = a->keys.n;
  uint8_t klen = a->keys.klen;
  const uint8_t *hp = rtake(c, n);
  const uint8_t *pk = rtake(c, (size_t)n * klen);
  if (!hp || !pk) return KV_EBADFRAME;
  for (uint32_t i = 0; i < n; i++) {
    if (hp[i] > 1) return KV_EBADFRAME;
    if (hp[i] == 0) /* an absent parent is all zero bytes: one encoding only */
      for (uint8_t j = 0; j < klen; j++)
        if (pk[(size_t)i * klen + j]) return KV_EBADFRAME;
  }
  a->has_parent = hp;
  a->parents = (kv_keyvec){.p = pk, .n = n, .klen = klen};
  return 0;
}

static int dec_lookup_rep(rcur *c, kv_lookup_rep *r) {
  r->hit_len = r32(c);
  r->n = r32(c);
  if (c->bad) return KV_EBADFRAME;
  if (r->n > KV_BATCH_MAX) return -E2BIG;
  if (r->hit_len > r->n) return KV_EBADFRAME;
  r->tiers = rtake(c, r->n);
  if (!r->tiers) return KV_EBADFRAME;
  for (uint32_t i = 0; i < r->n; i++)
    if (!kv__tierbyte_ok(r->tiers[i]) || (i < r->hit_len && r->tiers[i] == KV_TIER_NONE))
      return KV_EBADFRAME;
  return 0;
}

/* LOAD reply, or with with_crc a LOAD2 reply (each entry and its crc). */
static int dec_load_rep(rcur *c, kv_loadvec *l, int with_crc) {
  uint32_t n = r32(c);
  memset(l, 0, sizeof *l);
  if (c->bad) return KV_EBADFRAME;
  if (n > KV_BATCH_MAX) return -E2BIG;
  const uint8_t *p = rtake(c, (size_t)n * (with_crc ? KV_LOAD2_ENT_SIZE : KV_LOAD_ENT_SIZE));
  if (!p) return KV_EBADFRAME;
  l->n = n;
  l->wire = p;
  l->with_crc = (uint8_t)with_crc;
  for (uint32_t i = 0; i < n; i++) {
    kv_load_ent e;
    kv_loadvec_get(l, i, &e);
    if (!kv__load_ent_ok(&e, with_crc)) return KV_EBADFRAME;
  }
  return 0;
}

static int dec_alloc_rep(rcur *c, kv_allocvec *a) {
  uint32_t n = r32(c);
  memset(a, 0, sizeof *a);
  if (c->bad) return KV_EBADFRAME;
  if (n > KV_BATCH_MAX) return -E2BIG;
  const uint8_t *p = rtake(c, (size_t)n * KV_ALLOC_ENT_SIZE);
  if (!p) return KV_EBADFRAME;
  a->n = n;
  a->wire = p;
  for (uint32_t i = 0; i < n; i++) {
    kv_alloc_ent e;
    kv_allocvec_get(a, i, &e);
    if (!kv__alloc_ent_ok(&e)) return KV_EBADFRAME;
  }
  return 0;
}

/* u32 len | bytes, lo <= len <= hi. */
static int rblob32(rcur *c, const uint8_t **out, uint32_t *outlen, uint32_t lo, uint32_t hi) {
  uint32_t len = r32(c);
  if (c->bad || len < lo || len > hi) return KV_EBADFRAME;
  const uint8_t *p = rtake(c, len);
  if (!p) return KV_EBADFRAME;
  *out = p;
  *outlen = len;
  return 0;
}

static int dec_put(rcur *c, kv_put_req *p) {
  p->prio = r8(c);
  int rc = rbytes(c, &p->key, 1, KV_KEY_MAX);
  if (!rc) rc = rbytes(c, &p->parent, 0, KV_KEY_MAX);
  if (!rc) rc = rblob32(c, &p->data.p, &p->data.len, 1, KV_INLINE_MAX);
  return rc;
}

static int dec_get_rep(rcur *c, kv_get_rep *g) {
  g->tier = r8(c);
  if (c->bad || g->tier >= KV_NTIERS) return KV_EBADFRAME;
  return rblob32(c, &g->data.p, &g->data.len, 1, KV_INLINE_MAX);
}

static int dec_status_rep(rcur *c, kv_str *s) {
  const uint8_t *p = NULL;
  int rc = rblob32(c, &p, &s->len, 0, KV_STATUS_TEXT_MAX);
  if (rc) return rc;
  s->p = (const char *)p;
  return kv_utf8_ok(p, s->len) ? 0 : KV_EBADFRAME;
}

static int dec_error_rep(rcur *c, kv_error_rep *e) {
  e->req_op = r16(c);
  uint16_t len = r16(c);
  if (c->bad || len > KV_ERRMSG_MAX) return KV_EBADFRAME;
  const uint8_t *p = rtake(c, len);
  if (!p || !kv_utf8_ok(p, len)) return KV_EBADFRAME;
  e->msg.p = (const char *)p;
  e->msg.len = len;
  return 0;
}

static int dec_payload(rcur *c, kv_msg *m) {
  int reply = (m->flags & KV_F_REPLY) != 0;
  switch ((kv_op)m->op) {
  case KV_OP_HELLO: return reply ? dec_hello_rep(c, m) : dec_hello_req(c, &m->hello);
  case KV_OP_LOOKUP:
    return reply ? dec_lookup_rep(c, &m->lookup_rep) : dec_batch(c, m->op, &m->batch);
  case KV_OP_LOAD:
  case KV_OP_LOAD2:
    if (reply) return dec_load_rep(c, &m->load_rep, m->op == KV_OP_LOAD2);
    return dec_batch(c, m->op, &m->batch);
  case KV_OP_RELEASE:
  case KV_OP_COMMIT:
  case KV_OP_ABORT:
  case KV_OP_SET_PRIORITY:
    return reply ? rstatuses(c, &m->statuses) : dec_batch(c, m->op, &m->batch);
  case KV_OP_ALLOC: return reply ? dec_alloc_rep(c, &m->alloc_rep) : dec_alloc(c, &m->alloc);
  case KV_OP_PREFETCH:
    if (!reply) return dec_batch(c, m->op, &m->batch);
    m->prefetch_queued = r32(c);
    return 0;
  case KV_OP_DELETE:
    if (!reply) return dec_batch(c, m->op, &m->batch);
    m->delete_rep.deleted = r64(c);
    return rstatuses(c, &m->delete_rep.st);
  case KV_OP_PUT: return reply ? 0 : dec_put(c, &m->put);
  case KV_OP_GET:
    if (reply) return dec_get_rep(c, &m->get_rep);
    return rbytes(c, &m->get_key, 1, KV_KEY_MAX);
  case KV_OP_STATUS:
    if (reply) return dec_status_rep(c, &m->status_text);
    m->status_flags = r8(c);
    return m->status_flags ? KV_EBADFRAME : 0;
  case KV_OP_ERROR: return dec_error_rep(c, &m->error);
  case KV_OP_G1_SELECT: {
    if (reply) {
      int rc = rtierinfo(c, &m->g1_pool);
      return rc ? rc : m->g1_pool.tier == KV_G1 ? 0 : KV_EBADFRAME;
    }
    const uint8_t *u = rtake(c, KV_UUID_BYTES);
    if (!u) return KV_EBADFRAME;
    memcpy(m->g1_select.uuid, u, KV_UUID_BYTES);
    return 0;
  }
  case KV_OP_HINT: return reply ? rstatuses(c, &m->statuses) : dec_hint(c, &m->hint);
  case KV_OP_PRESENCE:
    if (!reply) {
      m->presence_flags = r8(c);
      return m->presence_flags ? KV_EBADFRAME : 0;
    }
    m->presence_rep.bytes = r64(c);
    m->presence_rep.flags = r32(c);
    return m->presence_rep.bytes ? 0 : KV_EBADFRAME;
  case KV_OP_COUNT: break;
  }
  return KV_EBADOP;
}

int kv_msg_decode(const void *frame, size_t n, kv_msg *m) {
  kv_hdr h;
  memset(m, 0, sizeof *m);
  int rc = kv_hdr_parse(frame, n, &h);
  if (rc == 0 || rc == -EMSGSIZE) { /* the header is sound: name the request */
    m->op = h.op;
    m->flags = h.flags;
    m->id = h.id;
    m->status = h.status;
  }
  if (rc) return rc;
  if (n - KV_HDR_SIZE != h.len) return KV_EBADFRAME;
  rc = kv__hdr_rules(h.op, h.flags, h.status, h.id);
  if (rc) return rc == KV_EBADOP ? KV_EBADOP : KV_EBADFRAME;
  if (h.rsv0 || h.rsv1) return KV_EBADFRAME;
  rcur c = {.p = (const uint8_t *)frame + KV_HDR_SIZE, .n = h.len};
  rc = dec_payload(&c, m);
  if (rc) return rc;
  if (c.bad || c.off != c.n) return KV_EBADFRAME; /* short, or trailing bytes */
  return 0;
}
