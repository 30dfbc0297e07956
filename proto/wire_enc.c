/*
 * wire_enc.c - the encoders of the wire protocol (wire.h, PROTOCOL.md).
 *
 * Each message is written twice by the same function: first with a NULL
 * cursor, which checks every field and measures the payload, then, after
 * one reservation, into the buffer. So the checks and the layout live in
 * one place, and an encoder either appends a whole valid frame or nothing.
 */
#include <errno.h>
#include <string.h>

#include "base/le.h"
#include "proto/wire.h"
#include "proto/wire_int.h"

typedef struct wcur {
  uint8_t *p;          /* NULL: measure only */
  size_t n;            /* payload bytes so far */
  int split;           /* leave the trailing bulk field out (encode_head) */
  const uint8_t *tail; /* that field, when split */
  size_t tail_len;
} wcur;

static void w8(wcur *c, uint8_t v) {
  if (c->p) c->p[c->n] = v;
  c->n += 1;
}

static void w16(wcur *c, uint16_t v) {
  if (c->p) kv_st16(c->p + c->n, v);
  c->n += 2;
}

static void w32(wcur *c, uint32_t v) {
  if (c->p) kv_st32(c->p + c->n, v);
  c->n += 4;
}

static void w64(wcur *c, uint64_t v) {
  if (c->p) kv_st64(c->p + c->n, v);
  c->n += 8;
}

static void wmem(wcur *c, const void *src, size_t len) {
  if (c->p && len) memcpy(c->p + c->n, src, len);
  c->n += len;
}

static void wzero(wcur *c, size_t len) {
  if (c->p && len) memset(c->p + c->n, 0, len);
  c->n += len;
}

/* The last field of a PUT, a GET reply or a STATUS reply. */
static void wbulk(wcur *c, const void *src, size_t len) {
  if (c->split) {
    c->tail = src;
    c->tail_len = len;
    c->n += len;
    return;
  }
  wmem(c, src, len);
}

/* u8 length + bytes; lo <= len <= hi; utf8: must be UTF-8 text. */
static int wstr8(wcur *c, const void *p, uint32_t len, uint32_t lo, uint32_t hi, int utf8) {
  if (len < lo || len > hi || (len && !p)) return -EINVAL;
  if (utf8 && !kv_utf8_ok(p, len)) return -EINVAL;
  w8(c, (uint8_t)len);
  wmem(c, p, len);
  return 0;
}

static int keyvec_ok(const kv_keyvec *k) {
  if (k->n > KV_BATCH_MAX) return -E2BIG;
  if (k->n == 0) return 0;
  if (!k->p || k->klen == 0 || k->klen > KV_KEY_MAX) return -EINVAL;
  if (k->stride && k->stride < k->klen) return -EINVAL;
  return 0;
}

/* The key bytes of k, packed. */
static void wkeybytes(wcur *c, const kv_keyvec *k) {
  if (k->n == 0) return;
  if (!k->stride || k->stride == k->klen) {
    wmem(c, k->p, (size_t)k->n * k->klen);
    return;
  }
  for (uint32_t i = 0; i < k->n; i++) wmem(c, kv_keyvec_at(k, i), k->klen);
}

/* KEYS: u32 n | u8 klen (0 iff n == 0) | n * klen bytes. */
static int wkeys(wcur *c, const kv_keyvec *k) {
  int rc = keyvec_ok(k);
  if (rc) return rc;
  w32(c, k->n);
  w8(c, k->n ? k->klen : 0);
  wkeybytes(c, k);
  return 0;
}

/* STATUSES: u32 n | n * i32. */
static int wstatuses(wcur *c, const kv_statvec *s) {
  if (s->n > KV_BATCH_MAX) return -E2BIG;
  if (s->n && !s->v && !s->wire) return -EINVAL;
  w32(c, s->n);
  for (uint32_t i = 0; i < s->n; i++) {
    int32_t st = kv_statvec_get(s, i);
    if (st > 0) return -EINVAL;
    w32(c, (uint32_t)st);
  }
  return 0;
}

static int enc_hello_req(wcur *c, const kv_hello_req *h) {
  if (!kv__hello_ok(h)) return -EINVAL;
  const kv_layout *l = &h->layout;
  w16(c, h->ver_major);
  w16(c, h->ver_minor);
  w32(c, h->caps);
  int rc = wstr8(c, h->tenant.p, h->tenant.len, 1, KV_TENANT_MAX, 1);
  if (!rc) rc = wstr8(c, h->group.p, h->group.len, 0, KV_GROUP_MAX, 1);
  if (!rc) rc = wstr8(c, h->salt.p, h->salt.len, 0, KV_SALT_MAX, 0);
  if (rc) return rc;
  w32(c, l->block_bytes);
  w32(c, l->tokens_per_block);
  w32(c, l->layers);
  w32(c, l->kv_heads);
  w32(c, l->head_dim);
  w16(c, l->tp_rank);
  w16(c, l->tp_size);
  return wstr8(c, l->dtype.p, l->dtype.len, 1, KV_DTYPE_MAX, 1);
}

/* One tier-info entry: u8 tier | u8 kind | u16 len | len bytes. */
static int wtierinfo(wcur *c, const kv_tierinfo *t) {
  if (!kv__tierinfo_ok(t) || (t->len && !t->p)) return -EINVAL;
  w8(c, t->tier);
  w8(c, t->kind);
  w16(c, t->len);
  wmem(c, t->p, t->len);
  return 0;
}

static int enc_hello_rep(wcur *c, const kv_msg *m) {
  const kv_hello_rep *r = &m->hello_rep;
  if (!kv__hello_rep_ok(r, m->flags & KV_F_FD)) return -EINVAL;
  if (r->ntierinfo && !r->tierinfo && !r->tierinfo_wire) return -EINVAL;
  w16(c, r->ver_major);
  w16(c, r->ver_minor);
  w32(c, r->caps);
  w64(c, r->session_id);
  w32(c, r->ns_id);
  w64(c, r->arena_bytes);
  w32(c, r->slot_align);
  w32(c, r->slot_bytes);
  w8(c, r->ntierinfo);
  for (unsigned i = 0; i < r->ntierinfo; i++) {
    kv_tierinfo t;
    kv_hello_tierinfo(r, i, &t);
    int rc = wtierinfo(c, &t);
    if (rc) return rc;
  }
  return 0;
}

/* BATCH: u8 tier | u8 prio | u8 flags | KEYS, and for a COMMIT with
 * KV_COMMIT_CRC, n * u32 crc. */
static int enc_batch(wcur *c, uint16_t op, const kv_batch_req *b) {
  int rc = keyvec_ok(&b->keys);
  if (rc) return rc;
  if (!kv__batch_ok(op, b)) return -EINVAL;
  if (b->crcs.n && !b->crcs.v && !b->crcs.wire) return -EINVAL;
  w8(c, b->tier);
  w8(c, b->prio);
  w8(c, b->flags);
  rc = wkeys(c, &b->keys);
  for (uint32_t i = 0; !rc && i < b->crcs.n; i++) w32(c, kv_u32vec_get(&b->crcs, i));
  return rc;
}

/* HINT: u8 kind | u8 stop | u16 0 | u32 retain_s | u64 session | KEYS. */
static int enc_hint(wcur *c, const kv_hint_req *h) {
  int rc = keyvec_ok(&h->keys);
  if (rc) return rc;
  if (!kv__hint_ok(h)) return -EINVAL;
  w8(c, h->kind);
  w8(c, h->stop);
  w16(c, 0);
  w32(c, h->retain_s);
  w64(c, h->session);
  return wkeys(c, &h->keys);
}

/* ALLOC: u8 tier | u8 prio | KEYS | n * u8 has_parent | n * klen parents. */
static int enc_alloc(wcur *c, const kv_alloc_req *a) {
  const kv_keyvec *k = &a->keys;
  if (!kv__target_ok(a->tier)) return -EINVAL;
  w8(c, a->tier);
  w8(c, a->prio);
  int rc = wkeys(c, k);
  if (rc) return rc;
  int any = 0;
  for (uint32_t i = 0; i < k->n; i++) {
    uint8_t hp = a->has_parent ? a->has_parent[i] : 0;
    if (hp > 1) return -EINVAL;
    any |= hp;
    w8(c, hp);
  }
  if (any) {
    const kv_keyvec *pv = &a->parents;
    if (!pv->p || pv->n != k->n || pv->klen != k->klen || (pv->stride && pv->stride < pv->klen))
      return -EINVAL;
  }
  for (uint32_t i = 0; i < k->n; i++) {
    const uint8_t *pk = kv_alloc_parent(a, i);
    if (pk) wmem(c, pk, k->klen);
    else wzero(c, k->klen);
  }
  return 0;
}

/* LOOKUP reply: u32 hit_len | u32 n | n * u8 tier. */
static int enc_lookup_rep(wcur *c, const kv_lookup_rep *r) {
  if (r->n > KV_BATCH_MAX) return -E2BIG;
  if (r->hit_len > r->n || (r->n && !r->tiers)) return -EINVAL;
  for (uint32_t i = 0; i < r->n; i++)
    if (!kv__tierbyte_ok(r->tiers[i]) || (i < r->hit_len && r->tiers[i] == KV_TIER_NONE))
      return -EINVAL;
  w32(c, r->hit_len);
  w32(c, r->n);
  wmem(c, r->tiers, r->n);
  return 0;
}

/* LOAD reply: u32 n | n * {i32 status, u8 tier, u64 offset, u32 length};
 * a LOAD2 reply (with_crc) adds u32 crc to each entry. */
static int enc_load_rep(wcur *c, const kv_loadvec *l, int with_crc) {
  if (l->n > KV_BATCH_MAX) return -E2BIG;
  if (l->n && !l->v && !l->wire) return -EINVAL;
  if (l->wire && !l->with_crc != !with_crc) return -EINVAL; /* decoded from the other op */
  w32(c, l->n);
  for (uint32_t i = 0; i < l->n; i++) {
    kv_load_ent e;
    kv_loadvec_get(l, i, &e);
    if (!kv__load_ent_ok(&e, with_crc)) return -EINVAL;
    w32(c, (uint32_t)e.status);
    w8(c, e.tier);
    w64(c, e.offset);
    w32(c, e.length);
    if (with_crc) w32(c, e.crc);
  }
  return 0;
}

/* ALLOC reply: u32 n | n * {i32 status, u64 offset}. */
static int enc_alloc_rep(wcur *c, const kv_allocvec *a) {
  if (a->n > KV_BATCH_MAX) return -E2BIG;
  if (a->n && !a->v && !a->wire) return -EINVAL;
  w32(c, a->n);
  for (uint32_t i = 0; i < a->n; i++) {
    kv_alloc_ent e;
    kv_allocvec_get(a, i, &e);
    if (!kv__alloc_ent_ok(&e)) return -EINVAL;
    w32(c, (uint32_t)e.status);
    w64(c, e.offset);
  }
  return 0;
}

/* PUT: u8 prio | u8 klen | key | u8 plen | parent | u32 dlen | data. */
static int enc_put(wcur *c, const kv_put_req *p) {
  if (p->data.len < 1 || p->data.len > KV_INLINE_MAX || !p->data.p) return -EINVAL;
  w8(c, p->prio);
  int rc = wstr8(c, p->key.p, p->key.len, 1, KV_KEY_MAX, 0);
  if (!rc) rc = wstr8(c, p->parent.p, p->parent.len, 0, KV_KEY_MAX, 0);
  if (rc) return rc;
  w32(c, p->data.len);
  wbulk(c, p->data.p, p->data.len);
  return 0;
}

/* GET reply: u8 tier | u32 dlen | data. */
static int enc_get_rep(wcur *c, const kv_get_rep *g) {
  if (g->tier >= KV_NTIERS) return -EINVAL;
  if (g->data.len < 1 || g->data.len > KV_INLINE_MAX || !g->data.p) return -EINVAL;
  w8(c, g->tier);
  w32(c, g->data.len);
  wbulk(c, g->data.p, g->data.len);
  return 0;
}

/* STATUS reply: u32 len | UTF-8 text. */
static int enc_status_rep(wcur *c, const kv_str *s) {
  if (s->len > KV_STATUS_TEXT_MAX || (s->len && !s->p)) return -EINVAL;
  if (!kv_utf8_ok(s->p, s->len)) return -EINVAL;
  w32(c, s->len);
  wbulk(c, s->p, s->len);
  return 0;
}

/* ERROR reply: u16 req_op | u16 mlen | msg. */
static int enc_error_rep(wcur *c, const kv_error_rep *e) {
  if (e->msg.len > KV_ERRMSG_MAX || (e->msg.len && !e->msg.p)) return -EINVAL;
  if (!kv_utf8_ok(e->msg.p, e->msg.len)) return -EINVAL;
  w16(c, e->req_op);
  w16(c, (uint16_t)e->msg.len);
  wmem(c, e->msg.p, e->msg.len);
  return 0;
}

static int enc_payload(wcur *c, const kv_msg *m) {
  int reply = (m->flags & KV_F_REPLY) != 0;
  switch ((kv_op)m->op) {
  case KV_OP_HELLO: return reply ? enc_hello_rep(c, m) : enc_hello_req(c, &m->hello);
  case KV_OP_LOOKUP:
    return reply ? enc_lookup_rep(c, &m->lookup_rep) : enc_batch(c, m->op, &m->batch);
  case KV_OP_LOAD:
  case KV_OP_LOAD2:
    if (reply) return enc_load_rep(c, &m->load_rep, m->op == KV_OP_LOAD2);
    return enc_batch(c, m->op, &m->batch);
  case KV_OP_RELEASE:
  case KV_OP_COMMIT:
  case KV_OP_ABORT:
  case KV_OP_SET_PRIORITY:
    return reply ? wstatuses(c, &m->statuses) : enc_batch(c, m->op, &m->batch);
  case KV_OP_ALLOC: return reply ? enc_alloc_rep(c, &m->alloc_rep) : enc_alloc(c, &m->alloc);
  case KV_OP_PREFETCH:
    if (!reply) return enc_batch(c, m->op, &m->batch);
    w32(c, m->prefetch_queued);
    return 0;
  case KV_OP_DELETE:
    if (!reply) return enc_batch(c, m->op, &m->batch);
    w64(c, m->delete_rep.deleted);
    return wstatuses(c, &m->delete_rep.st);
  case KV_OP_PUT: return reply ? 0 : enc_put(c, &m->put);
  case KV_OP_GET:
    if (reply) return enc_get_rep(c, &m->get_rep);
    return wstr8(c, m->get_key.p, m->get_key.len, 1, KV_KEY_MAX, 0);
  case KV_OP_STATUS:
    if (reply) return enc_status_rep(c, &m->status_text);
    if (m->status_flags != 0) return -EINVAL;
    w8(c, 0);
    return 0;
  case KV_OP_ERROR: return enc_error_rep(c, &m->error);
  case KV_OP_G1_SELECT:
    if (!reply) {
      wmem(c, m->g1_select.uuid, KV_UUID_BYTES);
      return 0;
    }
    if (m->g1_pool.tier != KV_G1) return -EINVAL;
    return wtierinfo(c, &m->g1_pool);
  case KV_OP_HINT: return reply ? wstatuses(c, &m->statuses) : enc_hint(c, &m->hint);
  case KV_OP_PRESENCE:
    if (!reply) {
      if (m->presence_flags != 0) return -EINVAL;
      w8(c, 0);
      return 0;
    }
    if (m->presence_rep.bytes == 0) return -EINVAL;
    w64(c, m->presence_rep.bytes);
    w32(c, m->presence_rep.flags);
    return 0;
  case KV_OP_COUNT: break;
  }
  return KV_EBADOP;
}

int kv_msg_encode_head(kv_buf *b, const kv_msg *m, kv_bytes *tail) {
  int rc = kv__hdr_rules(m->op, m->flags, m->status, m->id);
  if (rc) return rc == KV_EBADOP ? KV_EBADOP : -EINVAL;
  wcur c = {.split = tail != NULL};
  rc = enc_payload(&c, m);
  if (rc) return rc;
  if (c.n > kv_payload_max(m->op, m->flags & KV_F_REPLY)) return -EMSGSIZE;
  size_t head = KV_HDR_SIZE + c.n - c.tail_len;
  rc = kv_buf_reserve(b, head);
  if (rc) return rc;
  kv_hdr h = {
      .magic = KV_PROTO_MAGIC,
      .version = KV_PROTO_MAJOR,
      .op = m->op,
      .flags = m->flags,
      .len = (uint32_t)c.n,
      .id = m->id,
      .status = m->status,
  };
  kv_hdr_write(b->p + b->len, &h);
  wcur w = {.p = b->p + b->len + KV_HDR_SIZE, .split = c.split};
  (void)enc_payload(&w, m); /* checked by the first pass */
  b->len += head;
  if (tail) {
    tail->p = w.tail;
    tail->len = (uint32_t)w.tail_len;
  }
  return 0;
}

int kv_msg_encode(kv_buf *b, const kv_msg *m) { return kv_msg_encode_head(b, m, NULL); }

int kv_msg_encode_error(kv_buf *b, uint64_t id, uint16_t req_op, int32_t status, const char *msg) {
  if (status >= 0) return -EINVAL;
  if (!msg) msg = kv_strerror(status);
  size_t len = strnlen(msg, KV_ERRMSG_MAX + 1);
  if (len > KV_ERRMSG_MAX) {
    len = KV_ERRMSG_MAX;
    while (len > 0 && ((uint8_t)msg[len] & 0xc0) == 0x80) len--; /* cut before a whole char */
  }
  if (!kv_utf8_ok(msg, len)) len = 0; /* not text: send the status alone */
  kv_msg m = {.op = KV_OP_ERROR, .flags = KV_F_REPLY, .status = status, .id = id};
  m.error.req_op = req_op;
  m.error.msg.p = msg;
  m.error.msg.len = (uint32_t)len;
  return kv_msg_encode(b, &m);
}
