/*
 * test_proto_wire.c - the wire codec: bad input first (truncation at every
 * byte, trailing bytes, every single-bit flip, unknown opcodes, wrong magic
 * and version, reserved fields, flag rules, every limit and limit + 1),
 * then that every opcode round-trips and that the layout is the one
 * proto/PROTOCOL.md documents.
 */
#include "proto/wire.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/samples.h"
#include "base/le.h"

/* ---- helpers ---------------------------------------------------------------- */

static int keys_eq(const kv_keyvec *a, const kv_keyvec *b) {
  if (a->n != b->n) return 0;
  if (a->n == 0) return 1;
  if (a->klen != b->klen) return 0;
  for (uint32_t i = 0; i < a->n; i++)
    if (memcmp(kv_keyvec_at(a, i), kv_keyvec_at(b, i), a->klen)) return 0;
  return 1;
}

static int mem_eq(const void *a, uint32_t al, const void *b, uint32_t bl) {
  return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

static int stat_eq(const kv_statvec *a, const kv_statvec *b) {
  if (a->n != b->n) return 0;
  for (uint32_t i = 0; i < a->n; i++)
    if (kv_statvec_get(a, i) != kv_statvec_get(b, i)) return 0;
  return 1;
}

/* Field by field, through the accessors, so a host-array message compares
 * equal to its decoded self. */
static int msg_eq(const kv_msg *a, const kv_msg *b) {
  if (a->op != b->op || a->flags != b->flags || a->status != b->status || a->id != b->id) return 0;
  int rep = a->flags & KV_F_REPLY;
  switch (a->op) {
  case KV_OP_HELLO:
    if (!rep) {
      const kv_hello_req *x = &a->hello, *y = &b->hello;
      const kv_layout *l = &x->layout, *k = &y->layout;
      return x->ver_major == y->ver_major && x->ver_minor == y->ver_minor && x->caps == y->caps &&
             mem_eq(x->tenant.p, x->tenant.len, y->tenant.p, y->tenant.len) &&
             mem_eq(x->group.p, x->group.len, y->group.p, y->group.len) &&
             mem_eq(x->salt.p, x->salt.len, y->salt.p, y->salt.len) &&
             l->block_bytes == k->block_bytes && l->tokens_per_block == k->tokens_per_block &&
             l->layers == k->layers && l->kv_heads == k->kv_heads && l->head_dim == k->head_dim &&
             l->tp_rank == k->tp_rank && l->tp_size == k->tp_size &&
             mem_eq(l->dtype.p, l->dtype.len, k->dtype.p, k->dtype.len);
    } else {
      const kv_hello_rep *x = &a->hello_rep, *y = &b->hello_rep;
      if (x->ver_major != y->ver_major || x->ver_minor != y->ver_minor || x->caps != y->caps ||
          x->session_id != y->session_id || x->ns_id != y->ns_id ||
          x->arena_bytes != y->arena_bytes || x->slot_align != y->slot_align ||
          x->slot_bytes != y->slot_bytes || x->ntierinfo != y->ntierinfo)
        return 0;
      for (unsigned i = 0; i < x->ntierinfo; i++) {
        kv_tierinfo s, t;
        kv_hello_tierinfo(x, i, &s);
        kv_hello_tierinfo(y, i, &t);
        if (s.tier != t.tier || s.kind != t.kind || !mem_eq(s.p, s.len, t.p, t.len)) return 0;
      }
      return 1;
    }
  case KV_OP_LOOKUP:
    if (rep)
      return a->lookup_rep.hit_len == b->lookup_rep.hit_len &&
             mem_eq(a->lookup_rep.tiers, a->lookup_rep.n, b->lookup_rep.tiers, b->lookup_rep.n);
    /* fall through */
  case KV_OP_LOAD:
  case KV_OP_LOAD2:
    if (rep && (a->op == KV_OP_LOAD || a->op == KV_OP_LOAD2)) {
      if (a->load_rep.n != b->load_rep.n) return 0;
      for (uint32_t i = 0; i < a->load_rep.n; i++) {
        kv_load_ent s, t;
        kv_loadvec_get(&a->load_rep, i, &s);
        kv_loadvec_get(&b->load_rep, i, &t);
        if (s.status != t.status || s.tier != t.tier || s.offset != t.offset ||
            s.length != t.length)
          return 0;
        if (a->op == KV_OP_LOAD2 && s.crc != t.crc) return 0;
      }
      return 1;
    }
    /* fall through */
  case KV_OP_RELEASE:
  case KV_OP_COMMIT:
  case KV_OP_ABORT:
  case KV_OP_SET_PRIORITY:
    if (rep) return stat_eq(&a->statuses, &b->statuses);
    /* fall through */
  case KV_OP_PREFETCH:
    if (rep) return a->prefetch_queued == b->prefetch_queued;
    /* fall through */
  case KV_OP_DELETE:
    if (rep)
      return a->delete_rep.deleted == b->delete_rep.deleted &&
             stat_eq(&a->delete_rep.st, &b->delete_rep.st);
    if (a->batch.crcs.n != b->batch.crcs.n) return 0;
    for (uint32_t i = 0; i < a->batch.crcs.n; i++)
      if (kv_u32vec_get(&a->batch.crcs, i) != kv_u32vec_get(&b->batch.crcs, i)) return 0;
    return a->batch.tier == b->batch.tier && a->batch.prio == b->batch.prio &&
           a->batch.flags == b->batch.flags && keys_eq(&a->batch.keys, &b->batch.keys);
  case KV_OP_HINT:
    if (rep) return stat_eq(&a->statuses, &b->statuses);
    return a->hint.kind == b->hint.kind && a->hint.stop == b->hint.stop &&
           a->hint.retain_s == b->hint.retain_s && a->hint.session == b->hint.session &&
           keys_eq(&a->hint.keys, &b->hint.keys);
  case KV_OP_ALLOC:
    if (rep) {
      if (a->alloc_rep.n != b->alloc_rep.n) return 0;
      for (uint32_t i = 0; i < a->alloc_rep.n; i++) {
        kv_alloc_ent s, t;
        kv_allocvec_get(&a->alloc_rep, i, &s);
        kv_allocvec_get(&b->alloc_rep, i, &t);
        if (s.status != t.status || s.offset != t.offset) return 0;
      }
      return 1;
    }
    if (a->alloc.tier != b->alloc.tier || a->alloc.prio != b->alloc.prio ||
        !keys_eq(&a->alloc.keys, &b->alloc.keys))
      return 0;
    for (uint32_t i = 0; i < a->alloc.keys.n; i++) {
      const uint8_t *s = kv_alloc_parent(&a->alloc, i), *t = kv_alloc_parent(&b->alloc, i);
      if (!s != !t || (s && memcmp(s, t, a->alloc.keys.klen))) return 0;
    }
    return 1;
  case KV_OP_PUT:
    if (rep) return 1;
    return a->put.prio == b->put.prio &&
           mem_eq(a->put.key.p, a->put.key.len, b->put.key.p, b->put.key.len) &&
           mem_eq(a->put.parent.p, a->put.parent.len, b->put.parent.p, b->put.parent.len) &&
           mem_eq(a->put.data.p, a->put.data.len, b->put.data.p, b->put.data.len);
  case KV_OP_GET:
    if (rep)
      return a->get_rep.tier == b->get_rep.tier &&
             mem_eq(a->get_rep.data.p, a->get_rep.data.len, b->get_rep.data.p, b->get_rep.data.len);
    return mem_eq(a->get_key.p, a->get_key.len, b->get_key.p, b->get_key.len);
  case KV_OP_STATUS:
    if (rep)
      return mem_eq(a->status_text.p, a->status_text.len, b->status_text.p, b->status_text.len);
    return a->status_flags == b->status_flags;
  case KV_OP_PRESENCE:
    if (rep)
      return a->presence_rep.bytes == b->presence_rep.bytes &&
             a->presence_rep.flags == b->presence_rep.flags;
    return a->presence_flags == b->presence_flags;
  case KV_OP_ERROR:
    return a->error.req_op == b->error.req_op &&
           mem_eq(a->error.msg.p, a->error.msg.len, b->error.msg.p, b->error.msg.len);
  case KV_OP_G1_SELECT:
    if (rep)
      return a->g1_pool.tier == b->g1_pool.tier && a->g1_pool.kind == b->g1_pool.kind &&
             mem_eq(a->g1_pool.p, a->g1_pool.len, b->g1_pool.p, b->g1_pool.len);
    return !memcmp(a->g1_select.uuid, b->g1_select.uuid, KV_UUID_BYTES);
  }
  return 0;
}

/* All sample frames, encoded back to back, with their offsets. */
typedef struct corpus {
  kv_buf all;
  size_t off[128], len[128];
  const char *what[128];
  size_t n;
} corpus;

static void corpus_add(const kv_msg *m, const char *what, void *arg) {
  corpus *c = arg;
  size_t before = c->all.len;
  int rc = kv_msg_encode(&c->all, m);
  cr_assert_eq(rc, 0, "encode %s (%s): %s", kv_op_name(m->op), what, kv_strerror(rc));
  cr_assert_lt(c->n, 128);
  c->off[c->n] = before;
  c->len[c->n] = c->all.len - before;
  c->what[c->n] = what;
  c->n++;
}

static void corpus_load(corpus *c) {
  memset(c, 0, sizeof *c);
  kv_buf_init(&c->all);
  kv_samples(corpus_add, c);
}

/* A frame built by hand: payload bytes first, then the header in front. */
static kv_buf P;
static void pb8(uint8_t v) { cr_assert_eq(kv_buf_append(&P, &v, 1), 0); }
static void pb16(uint16_t v) {
  uint8_t b[2];
  kv_st16(b, v);
  cr_assert_eq(kv_buf_append(&P, b, 2), 0);
}
static void pb32(uint32_t v) {
  uint8_t b[4];
  kv_st32(b, v);
  cr_assert_eq(kv_buf_append(&P, b, 4), 0);
}
static void pb64(uint64_t v) {
  uint8_t b[8];
  kv_st64(b, v);
  cr_assert_eq(kv_buf_append(&P, b, 8), 0);
}
static void pbmem(const void *p, size_t n) { cr_assert_eq(kv_buf_append(&P, p, n), 0); }
static void pbfill(uint8_t v, size_t n) {
  for (size_t i = 0; i < n; i++) pb8(v);
}

static kv_msg M;
/* Decodes header(op, flags, id, status) + P and empties P. */
static int pdecode(uint16_t op, uint16_t flags, int32_t status) {
  kv_hdr h = {.magic = KV_PROTO_MAGIC,
              .version = KV_PROTO_MAJOR,
              .op = op,
              .flags = flags,
              .len = (uint32_t)P.len,
              .id = 99,
              .status = status};
  uint8_t *f = malloc(KV_HDR_SIZE + P.len);
  cr_assert(f);
  kv_hdr_write(f, &h);
  if (P.len) memcpy(f + KV_HDR_SIZE, P.p, P.len);
  int rc = kv_msg_decode(f, KV_HDR_SIZE + P.len, &M);
  if (rc == 0) { /* accepted: must re-encode to the same bytes */
    kv_buf b;
    kv_buf_init(&b);
    cr_assert_eq(kv_msg_encode(&b, &M), 0);
    cr_assert_eq(b.len, KV_HDR_SIZE + P.len);
    cr_assert_eq(memcmp(b.p, f, b.len), 0);
    kv_buf_free(&b);
  }
  free(f);
  kv_buf_free(&P);
  return rc;
}
#define REQ(op) pdecode(op, 0, 0)
#define REP(op) pdecode(op, KV_F_REPLY, 0)

static void hello_req_body(uint8_t tenant_len, uint8_t group_len, uint8_t salt_len,
                           uint8_t dtype_len, uint16_t rank, uint16_t size, uint32_t block) {
  pb16(1), pb16(0), pb32(0);
  pb8(tenant_len), pbfill('t', tenant_len);
  pb8(group_len), pbfill('g', group_len);
  pb8(salt_len), pbfill(0, salt_len);
  pb32(block), pb32(16), pb32(1), pb32(1), pb32(1);
  pb16(rank), pb16(size);
  pb8(dtype_len), pbfill('d', dtype_len);
}

/* ---- unhappy paths -------------------------------------------------------------- */

Test(wire_bad, truncated_at_every_byte) {
  corpus c;
  corpus_load(&c);
  kv_msg m;
  for (size_t s = 0; s < c.n; s++) {
    const uint8_t *f = c.all.p + c.off[s];
    for (size_t k = 0; k < c.len[s]; k++) {
      /* as is: the header's length disagrees with what is there */
      int rc = kv_msg_decode(f, k, &m);
      cr_assert_lt(rc, 0, "%s cut at %zu accepted", c.what[s], k);
      /* with a header that agrees: the payload itself is short */
      if (k >= KV_HDR_SIZE) {
        uint8_t *g = malloc(k);
        memcpy(g, f, k);
        kv_st32(g + 12, (uint32_t)(k - KV_HDR_SIZE));
        rc = kv_msg_decode(g, k, &m);
        cr_assert_eq(rc, KV_EBADFRAME, "%s payload cut at %zu: %d", c.what[s], k, rc);
        free(g);
      }
    }
  }
  kv_buf_free(&c.all);
}

Test(wire_bad, trailing_bytes) {
  corpus c;
  corpus_load(&c);
  kv_msg m;
  for (size_t s = 0; s < c.n; s++) {
    size_t n = c.len[s];
    uint8_t *g = malloc(n + 1);
    memcpy(g, c.all.p + c.off[s], n);
    g[n] = 0;
    cr_assert_eq(kv_msg_decode(g, n + 1, &m), KV_EBADFRAME, "%s + 1 byte", c.what[s]);
    kv_st32(g + 12, kv_ld32(g + 12) + 1);
    cr_assert_eq(kv_msg_decode(g, n + 1, &m), KV_EBADFRAME, "%s + 1 payload byte", c.what[s]);
    free(g);
  }
  kv_buf_free(&c.all);
}

Test(wire_bad, every_bit_flip_is_rejected_or_canonical) {
  corpus c;
  corpus_load(&c);
  kv_msg m;
  kv_buf b;
  kv_buf_init(&b);
  size_t accepted = 0, total = 0;
  for (size_t s = 0; s < c.n; s++) {
    size_t n = c.len[s];
    uint8_t *g = malloc(n);
    for (size_t bit = 0; bit < n * 8; bit++) {
      memcpy(g, c.all.p + c.off[s], n);
      g[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      total++;
      if (kv_msg_decode(g, n, &m) != 0) continue;
      accepted++;
      kv_buf_reset(&b);
      cr_assert_eq(kv_msg_encode(&b, &m), 0, "%s bit %zu: decoded but not encodable", c.what[s],
                   bit);
      cr_assert(b.len == n && memcmp(b.p, g, n) == 0, "%s bit %zu: not canonical", c.what[s], bit);
    }
    free(g);
  }
  cr_log_info("bit flips: %zu of %zu still valid frames", accepted, total);
  kv_buf_free(&b);
  kv_buf_free(&c.all);
}

Test(wire_bad, unknown_opcodes) {
  static const uint16_t ops[] = {0, KV_OP_COUNT, KV_OP_COUNT + 1, 0x00ff, 0x7fff, 0xffff};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    pb32(0);
    cr_assert_eq(REQ(ops[i]), KV_EBADOP, "request op %u", ops[i]);
    cr_assert_eq(M.id, 99, "the request stays identifiable");
    cr_assert_eq(M.op, ops[i]);
    cr_assert_eq(REP(ops[i]), KV_EBADOP, "reply op %u", ops[i]);
    cr_assert_null(kv_op_name(ops[i]));
    cr_assert_eq(kv_payload_max(ops[i], 0), KV_PAYLOAD_MAX_CTRL);
  }
  kv_msg m = kv_sample_req(0x4242, 1);
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), KV_EBADOP);
  cr_assert_eq(b.len, 0);
}

Test(wire_bad, magic_and_version) {
  corpus c;
  corpus_load(&c);
  kv_msg m;
  uint8_t g[256];
  size_t n = c.len[0];
  cr_assert_leq(n, sizeof g);
  for (int byte = 0; byte < 4; byte++) {
    memcpy(g, c.all.p, n);
    g[byte] ^= 0x20;
    cr_assert_eq(kv_msg_decode(g, n, &m), KV_EBADFRAME);
  }
  static const uint16_t versions[] = {0, 2, 0x0100, 0xffff};
  for (size_t i = 0; i < 4; i++) {
    memcpy(g, c.all.p, n);
    kv_st16(g + 4, versions[i]);
    cr_assert_eq(kv_msg_decode(g, n, &m), KV_EBADVERSION, "version %u", versions[i]);
  }
  kv_hdr h;
  cr_assert_eq(kv_hdr_parse(g, KV_HDR_SIZE - 1, &h), KV_EBADFRAME);
  cr_assert_eq(kv_msg_decode(g, 0, &m), KV_EBADFRAME);
  cr_assert_eq(kv_msg_decode("", 0, &m), KV_EBADFRAME);
  kv_buf_free(&c.all);
}

Test(wire_bad, reserved_fields_and_flags) {
  corpus c;
  corpus_load(&c);
  kv_msg m;
  uint8_t g[256];
  size_t n = c.len[0]; /* a HELLO request */
  cr_assert_eq(kv_msg_decode(c.all.p, n, &m), 0);
  memcpy(g, c.all.p, n), g[10] = 1;
  cr_assert_eq(kv_msg_decode(g, n, &m), KV_EBADFRAME, "rsv0");
  memcpy(g, c.all.p, n), g[31] = 0x80;
  cr_assert_eq(kv_msg_decode(g, n, &m), KV_EBADFRAME, "rsv1");
  for (int bit = 2; bit < 16; bit++) {
    memcpy(g, c.all.p, n);
    kv_st16(g + 8, (uint16_t)(1u << bit));
    cr_assert_eq(kv_msg_decode(g, n, &m), KV_EBADFRAME, "flag bit %d", bit);
  }
  kv_buf_free(&c.all);
}

Test(wire_bad, header_rules) {
  /* a request must have an id, no status, and not be an ERROR */
  pb8(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, 0, 0), 0);
  pb8(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, 0, -5), KV_EBADFRAME);
  pb16(1), pb16(0);
  cr_assert_eq(pdecode(KV_OP_ERROR, 0, -5), KV_EBADFRAME);
  /* a reply other than ERROR has status 0; an ERROR a negative one */
  pb32(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, KV_F_REPLY, 0), 0);
  pb32(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, KV_F_REPLY, KV_ENOTFOUND), KV_EBADFRAME);
  pb16(1), pb16(0);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY, 0), KV_EBADFRAME);
  pb16(1), pb16(0);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY, 3), KV_EBADFRAME);
  pb16(1), pb16(0);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY, KV_EBADOP), 0);
  /* an fd only with HELLO's reply, and there only with an arena */
  pb32(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, KV_F_REPLY | KV_F_FD, 0), KV_EBADFRAME);
  pb8(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, KV_F_FD, 0), KV_EBADFRAME);
  pb16(1), pb16(0);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY | KV_F_FD, -1), KV_EBADFRAME);

  kv_buf b;
  kv_buf_init(&b);
  kv_msg m = kv_sample_req(KV_OP_STATUS, 0);
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "request id 0");
  m = kv_sample_rep(KV_OP_ERROR, 5);
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "ERROR with status 0");
  m = kv_sample_rep(KV_OP_PREFETCH, 5);
  m.flags |= KV_F_FD;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "fd on a PREFETCH reply");
  m.flags = 0x80 | KV_F_REPLY;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "unknown flag");
  cr_assert_eq(b.len, 0);
}

Test(wire_bad, hello_request_fields) {
  hello_req_body(8, 0, 0, 4, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), 0);
  hello_req_body(KV_TENANT_MAX, KV_GROUP_MAX, KV_SALT_MAX, KV_DTYPE_MAX, 7, 8, 1);
  cr_assert_eq(REQ(KV_OP_HELLO), 0, "every string at its limit");
  hello_req_body(KV_TENANT_MAX + 1, 0, 0, 4, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "tenant 65");
  hello_req_body(0, 0, 0, 4, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "empty tenant");
  hello_req_body(8, KV_GROUP_MAX + 1, 0, 4, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "group 65");
  hello_req_body(8, 0, KV_SALT_MAX + 1, 4, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "salt 65");
  hello_req_body(8, 0, 0, KV_DTYPE_MAX + 1, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "dtype 17");
  hello_req_body(8, 0, 0, 0, 0, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "empty dtype");
  hello_req_body(8, 0, 0, 4, 1, 1, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "rank == size");
  hello_req_body(8, 0, 0, 4, 0, 0, 4096);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "size 0");
  hello_req_body(8, 0, 0, 4, 0, 1, 0);
  cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "block bytes 0");
  /* not UTF-8, or with a NUL */
  static const char *bad[] = {"ab\0cd", "\xff\xfe", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82"};
  static const uint8_t badlen[] = {5, 2, 2, 3, 2};
  for (int i = 0; i < 5; i++) {
    pb16(1), pb16(0), pb32(0);
    pb8(badlen[i]), pbmem(bad[i], badlen[i]);
    pb8(0), pb8(0);
    pb32(4096), pb32(16), pb32(1), pb32(1), pb32(1), pb16(0), pb16(1);
    pb8(4), pbmem("fp16", 4);
    cr_assert_eq(REQ(KV_OP_HELLO), KV_EBADFRAME, "tenant sample %d", i);
  }

  kv_buf b;
  kv_buf_init(&b);
  kv_msg m = kv_sample_req(KV_OP_HELLO, 1);
  m.hello = (kv_hello_req){
      .tenant = {"x", 1},
      .layout = {.block_bytes = 1, .tokens_per_block = 1, .tp_size = 1, .dtype = {"f32", 3}}};
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  char big[KV_TENANT_MAX + 1];
  memset(big, 'a', sizeof big);
  m.hello.tenant = (kv_str){big, sizeof big};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
  m.hello.tenant = (kv_str){"x", 1};
  m.hello.layout.tp_rank = 1;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
  kv_buf_free(&b);
}

static void hello_rep_body(uint64_t arena, uint32_t align, uint8_t nti, uint16_t tilen,
                           uint8_t tier) {
  pb16(1), pb16(0), pb32(0), pb64(1), pb32(1), pb64(arena), pb32(align), pb32(4096);
  pb8(nti);
  for (unsigned i = 0; i < nti; i++) pb8(tier), pb8(1), pb16(tilen), pbfill(0xab, tilen);
}

Test(wire_bad, hello_reply_fields) {
  hello_rep_body(1 << 20, 4096, KV_TIERINFO_MAX, KV_TIERINFO_BYTES_MAX, KV_G1);
  cr_assert_eq(pdecode(KV_OP_HELLO, KV_F_REPLY | KV_F_FD, 0), 0, "limits");
  hello_rep_body(1 << 20, 4096, 0, 0, 0);
  cr_assert_eq(REP(KV_OP_HELLO), KV_EBADFRAME, "arena without the fd flag");
  hello_rep_body(0, 0, 0, 0, 0);
  cr_assert_eq(pdecode(KV_OP_HELLO, KV_F_REPLY | KV_F_FD, 0), KV_EBADFRAME, "fd flag, no arena");
  hello_rep_body(0, 0, 0, 0, 0);
  cr_assert_eq(REP(KV_OP_HELLO), 0);
  hello_rep_body(1 << 20, 4095, 0, 0, 0);
  cr_assert_eq(pdecode(KV_OP_HELLO, KV_F_REPLY | KV_F_FD, 0), KV_EBADFRAME, "alignment");
  /* The second fd (the G1 pool) comes only after the arena's. */
  hello_rep_body(1 << 20, 4096, 1, 16, KV_G1);
  cr_assert_eq(pdecode(KV_OP_HELLO, KV_F_REPLY | KV_F_FD | KV_F_FD2, 0), 0, "arena and G1 fds");
  hello_rep_body(0, 0, 1, 16, KV_G1);
  cr_assert_eq(pdecode(KV_OP_HELLO, KV_F_REPLY | KV_F_FD2, 0), KV_EBADFRAME,
               "second fd without a first");
  pb32(0);
  cr_assert_eq(pdecode(KV_OP_STATUS, KV_F_REPLY | KV_F_FD | KV_F_FD2, 0), KV_EBADFRAME,
               "fds on STATUS");
  hello_rep_body(0, 0, KV_TIERINFO_MAX + 1, 0, 0);
  cr_assert_eq(REP(KV_OP_HELLO), KV_EBADFRAME, "9 tier-info entries");
  hello_rep_body(0, 0, 1, KV_TIERINFO_BYTES_MAX + 1, 0);
  cr_assert_eq(REP(KV_OP_HELLO), KV_EBADFRAME, "tier-info entry of 1025 bytes");
  hello_rep_body(0, 0, 1, 0, KV_NTIERS);
  cr_assert_eq(REP(KV_OP_HELLO), KV_EBADFRAME, "tier-info of an unknown tier");
  hello_rep_body(0, 0, 2, 3, 0);
  P.len -= 1; /* second entry short */
  cr_assert_eq(REP(KV_OP_HELLO), KV_EBADFRAME, "tier-info runs past the frame");
}

Test(wire_bad, g1_select) {
  /* request: exactly a 16-byte uuid */
  pbfill(0x11, KV_UUID_BYTES);
  cr_assert_eq(REQ(KV_OP_G1_SELECT), 0);
  cr_assert_eq(M.g1_select.uuid[15], 0x11);
  pbfill(0x11, KV_UUID_BYTES - 1);
  cr_assert_eq(REQ(KV_OP_G1_SELECT), KV_EBADFRAME, "short uuid");
  pbfill(0x11, KV_UUID_BYTES + 1);
  cr_assert_eq(REQ(KV_OP_G1_SELECT), KV_EBADFRAME, "bytes after the uuid");
  pbfill(0x11, KV_UUID_BYTES);
  cr_assert_eq(pdecode(KV_OP_G1_SELECT, KV_F_FD, 0), KV_EBADFRAME, "an fd on the request");
  /* reply: one tier-info entry of tier G1, with at most the one fd */
  pb8(KV_G1), pb8(KV_TI_G1_SIM_FD), pb16(3), pbfill(0xab, 3);
  cr_assert_eq(pdecode(KV_OP_G1_SELECT, KV_F_REPLY | KV_F_FD, 0), 0);
  cr_assert_eq(M.g1_pool.kind, KV_TI_G1_SIM_FD);
  cr_assert_eq(M.g1_pool.len, 3);
  pb8(KV_G1), pb8(KV_TI_G1_NONE), pb16(0);
  cr_assert_eq(REP(KV_OP_G1_SELECT), 0, "none, no fd");
  pb8(KV_G1), pb8(KV_TI_G1_SIM_FD), pb16(3), pbfill(0xab, 3);
  cr_assert_eq(pdecode(KV_OP_G1_SELECT, KV_F_REPLY | KV_F_FD | KV_F_FD2, 0), KV_EBADFRAME,
               "two fds on a G1_SELECT reply");
  pb8(KV_G2), pb8(KV_TI_G1_SIM_FD), pb16(0);
  cr_assert_eq(REP(KV_OP_G1_SELECT), KV_EBADFRAME, "an entry of another tier");
  pb8(KV_G1), pb8(KV_TI_G1_SIM_FD), pb16(4), pbfill(0xab, 3);
  cr_assert_eq(REP(KV_OP_G1_SELECT), KV_EBADFRAME, "value runs past the frame");
  pb8(KV_G1), pb8(KV_TI_G1_SIM_FD), pb16(KV_TIERINFO_BYTES_MAX + 1),
      pbfill(0, KV_TIERINFO_BYTES_MAX + 1);
  cr_assert_eq(REP(KV_OP_G1_SELECT), KV_EBADFRAME, "value over the limit");

  kv_buf b;
  kv_buf_init(&b);
  kv_msg m = kv_sample_rep(KV_OP_G1_SELECT, 5);
  m.g1_pool = (kv_tierinfo){.tier = KV_G2, .kind = KV_TI_G1_NONE};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "encoder: tier G2");
  m.g1_pool.tier = KV_G1;
  m.flags |= KV_F_FD | KV_F_FD2;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "encoder: two fds");
  cr_assert_eq(b.len, 0);
  /* the documented bytes: request 15, a uuid */
  m = kv_sample_req(KV_OP_G1_SELECT, 2);
  for (int i = 0; i < KV_UUID_BYTES; i++) m.g1_select.uuid[i] = (uint8_t)i;
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  cr_assert_eq(b.len, KV_HDR_SIZE + KV_UUID_BYTES);
  cr_assert_eq(b.p[6], 15);
  cr_assert_eq(b.p[12], KV_UUID_BYTES);
  cr_assert_eq(b.p[KV_HDR_SIZE + 15], 15);
  kv_buf_free(&b);
}

/* BATCH body with n keys of klen bytes each. */
static void batch_body(uint8_t tier, uint8_t prio, uint8_t flags, uint32_t n, uint8_t klen) {
  pb8(tier), pb8(prio), pb8(flags), pb32(n), pb8(klen);
  pbfill(0x33, (size_t)n * klen);
}

Test(wire_bad, batch_requests) {
  static const uint16_t ops[] = {KV_OP_LOOKUP, KV_OP_RELEASE,  KV_OP_COMMIT, KV_OP_ABORT,
                                 KV_OP_LOAD,   KV_OP_PREFETCH, KV_OP_DELETE, KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    uint16_t op = ops[i];
    uint8_t tier = (op == KV_OP_LOAD || op == KV_OP_PREFETCH) ? KV_G2 : 0;
    batch_body(tier, 0, 0, KV_BATCH_MAX, KV_KEY_MAX);
    cr_assert_eq(REQ(op), 0, "%s: KV_BATCH_MAX keys of KV_KEY_MAX bytes", kv_op_name(op));
    batch_body(tier, 0, 0, KV_BATCH_MAX + 1, 1);
    cr_assert_eq(REQ(op), -E2BIG, "%s: KV_BATCH_MAX + 1 keys", kv_op_name(op));
    pb8(tier), pb8(0), pb8(0), pb32(UINT32_MAX), pb8(1), pbfill(0x33, 64);
    cr_assert_eq(REQ(op), -E2BIG, "%s: 2^32-1 keys", kv_op_name(op));
    batch_body(tier, 0, 0, 2, KV_KEY_MAX + 1);
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: 33-byte keys", kv_op_name(op));
    batch_body(tier, 0, 0, 2, 0);
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: 0-byte keys", kv_op_name(op));
    batch_body(tier, 0, 0, 0, 5);
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: no keys but a key length", kv_op_name(op));
    batch_body(tier, 0, 0, 3, 8);
    P.len--;
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: keys short by one byte", kv_op_name(op));
    batch_body(tier, 0, 0x80, 1, 8);
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: unknown flags", kv_op_name(op));
    if (op != KV_OP_SET_PRIORITY) {
      batch_body(tier, 1, 0, 1, 8);
      cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: prio it does not use", kv_op_name(op));
    }
    batch_body(op == KV_OP_LOAD || op == KV_OP_PREFETCH ? KV_G3 : KV_G2, 0, 0, 1, 8);
    cr_assert_eq(REQ(op), KV_EBADFRAME, "%s: tier", kv_op_name(op));

    /* the encoder refuses the same */
    kv_buf b;
    kv_buf_init(&b);
    static uint8_t keys[(KV_BATCH_MAX + 1) * 2];
    kv_msg m = kv_sample_req(op, 1);
    m.batch.tier = tier;
    m.batch.keys = (kv_keyvec){.p = keys, .n = KV_BATCH_MAX, .klen = 2};
    cr_assert_eq(kv_msg_encode(&b, &m), 0);
    size_t len = b.len;
    m.batch.keys.n++;
    cr_assert_eq(kv_msg_encode(&b, &m), -E2BIG);
    m.batch.keys = (kv_keyvec){.p = keys, .n = 1, .klen = KV_KEY_MAX + 1};
    cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
    m.batch.keys = (kv_keyvec){.p = NULL, .n = 1, .klen = 4};
    cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
    cr_assert_eq(b.len, len, "a failed encode leaves the buffer alone");
    kv_buf_free(&b);
  }
  batch_body(0, 0, KV_DEL_ALL, 1, 8);
  cr_assert_eq(REQ(KV_OP_DELETE), KV_EBADFRAME, "DELETE all with keys");
  batch_body(0, 0, KV_DEL_ALL, 0, 0);
  cr_assert_eq(REQ(KV_OP_DELETE), 0);
  batch_body(0, 0, KV_DEL_ALL, 0, 0);
  cr_assert_eq(REQ(KV_OP_LOOKUP), KV_EBADFRAME, "DELETE's flag on LOOKUP");
  batch_body(KV_TIER_NONE, 0, 0, 0, 0);
  cr_assert_eq(REQ(KV_OP_LOAD), KV_EBADFRAME, "LOAD to no tier");
  batch_body(KV_G1, 0, 0, 0, 0);
  cr_assert_eq(REQ(KV_OP_LOAD), 0, "LOAD to G1");
}

static void alloc_body(uint8_t tier, uint32_t n, uint8_t klen, uint8_t hp, uint8_t pbyte) {
  pb8(tier), pb8(0), pb32(n), pb8(klen);
  pbfill(0x44, (size_t)n * klen);
  pbfill(hp, n);
  pbfill(pbyte, (size_t)n * klen);
}

Test(wire_bad, alloc_request) {
  alloc_body(KV_G2, KV_BATCH_MAX, KV_KEY_MAX, 1, 0x55);
  cr_assert_eq(REQ(KV_OP_ALLOC), 0, "KV_BATCH_MAX entries with parents");
  alloc_body(KV_G2, KV_BATCH_MAX + 1, 1, 1, 0x55);
  cr_assert_eq(REQ(KV_OP_ALLOC), -E2BIG);
  alloc_body(KV_G2, 4, 8, 0, 0);
  cr_assert_eq(REQ(KV_OP_ALLOC), 0, "no parents");
  alloc_body(KV_G2, 4, 8, 0, 1);
  cr_assert_eq(REQ(KV_OP_ALLOC), KV_EBADFRAME, "absent parent with bytes");
  alloc_body(KV_G2, 4, 8, 2, 1);
  cr_assert_eq(REQ(KV_OP_ALLOC), KV_EBADFRAME, "has_parent 2");
  alloc_body(KV_G3, 4, 8, 1, 1);
  cr_assert_eq(REQ(KV_OP_ALLOC), KV_EBADFRAME, "ALLOC in G3");
  alloc_body(KV_G2, 4, 8, 1, 1);
  P.len -= 8;
  cr_assert_eq(REQ(KV_OP_ALLOC), KV_EBADFRAME, "parents short");

  kv_buf b;
  kv_buf_init(&b);
  kv_msg m = kv_sample_req(KV_OP_ALLOC, 1);
  static const uint8_t hp[2] = {1, 1};
  m.alloc = (kv_alloc_req){
      .tier = KV_G2, .keys = {.p = kv_sample_keys, .n = 2, .klen = 8}, .has_parent = hp};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "parents flagged but none given");
  m.alloc.parents = (kv_keyvec){.p = kv_sample_keys, .n = 2, .klen = 4};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "parents of another length");
  m.alloc.parents.klen = 8;
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  kv_buf_free(&b);
}

Test(wire_bad, batch_replies) {
  /* LOOKUP */
  pb32(KV_BATCH_MAX), pb32(KV_BATCH_MAX), pbfill(KV_G2, KV_BATCH_MAX);
  cr_assert_eq(REP(KV_OP_LOOKUP), 0);
  pb32(0), pb32(KV_BATCH_MAX + 1), pbfill(KV_TIER_NONE, KV_BATCH_MAX + 1);
  cr_assert_eq(REP(KV_OP_LOOKUP), -E2BIG);
  pb32(3), pb32(2), pbfill(KV_G2, 2);
  cr_assert_eq(REP(KV_OP_LOOKUP), KV_EBADFRAME, "hit length past the keys");
  pb32(2), pb32(2), pb8(KV_G2), pb8(KV_TIER_NONE);
  cr_assert_eq(REP(KV_OP_LOOKUP), KV_EBADFRAME, "a hole in the hit prefix");
  pb32(0), pb32(1), pb8(3);
  cr_assert_eq(REP(KV_OP_LOOKUP), KV_EBADFRAME, "tier 3");

  /* LOAD */
  pb32(KV_BATCH_MAX + 1);
  for (int i = 0; i <= KV_BATCH_MAX; i++) pb32(0), pb8(KV_G2), pb64(0), pb32(1);
  cr_assert_eq(REP(KV_OP_LOAD), -E2BIG);
  pb32(1), pb32(0), pb8(KV_TIER_NONE), pb64(0), pb32(1);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a hit in no tier");
  pb32(1), pb32(0), pb8(KV_G3), pb64(0), pb32(1);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a hit in G3");
  pb32(1), pb32(0), pb8(KV_G2), pb64(0), pb32(0);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a hit of 0 bytes");
  pb32(1), pb32((uint32_t)KV_ENOTFOUND), pb8(KV_G2), pb64(0), pb32(0);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a miss with a tier");
  pb32(1), pb32((uint32_t)KV_ENOTFOUND), pb8(KV_TIER_NONE), pb64(8), pb32(0);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a miss with an offset");
  pb32(1), pb32(5), pb8(KV_G2), pb64(0), pb32(1);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a positive status");

  /* statuses */
  static const uint16_t st_ops[] = {KV_OP_RELEASE, KV_OP_COMMIT, KV_OP_ABORT, KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < 4; i++) {
    pb32(KV_BATCH_MAX), pbfill(0, KV_BATCH_MAX * 4);
    cr_assert_eq(REP(st_ops[i]), 0);
    pb32(KV_BATCH_MAX + 1), pbfill(0, (KV_BATCH_MAX + 1) * 4);
    cr_assert_eq(REP(st_ops[i]), -E2BIG);
    pb32(1), pb32(1);
    cr_assert_eq(REP(st_ops[i]), KV_EBADFRAME, "status 1");
  }
  pb64(0), pb32(KV_BATCH_MAX + 1), pbfill(0, (KV_BATCH_MAX + 1) * 4);
  cr_assert_eq(REP(KV_OP_DELETE), -E2BIG);

  /* ALLOC */
  pb32(KV_BATCH_MAX + 1), pbfill(0, (KV_BATCH_MAX + 1) * 12);
  cr_assert_eq(REP(KV_OP_ALLOC), -E2BIG);
  pb32(1), pb32((uint32_t)KV_EALLPINNED), pb64(4096);
  cr_assert_eq(REP(KV_OP_ALLOC), KV_EBADFRAME, "a failed entry with an offset");

  /* the encoder refuses the same */
  kv_buf b;
  kv_buf_init(&b);
  static int32_t st[KV_BATCH_MAX + 1];
  kv_msg m = kv_sample_rep(KV_OP_COMMIT, 1);
  m.statuses = (kv_statvec){.n = KV_BATCH_MAX + 1, .v = st};
  cr_assert_eq(kv_msg_encode(&b, &m), -E2BIG);
  m.statuses.n = 1;
  st[0] = 1;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
  kv_load_ent e = {0, KV_TIER_NONE, 0, 1, 0};
  m = kv_sample_rep(KV_OP_LOAD, 1);
  m.load_rep = (kv_loadvec){.n = 1, .v = &e};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL);
  static uint8_t tiers[KV_BATCH_MAX + 1];
  m = kv_sample_rep(KV_OP_LOOKUP, 1);
  m.lookup_rep = (kv_lookup_rep){.hit_len = 0, .n = KV_BATCH_MAX + 1, .tiers = tiers};
  cr_assert_eq(kv_msg_encode(&b, &m), -E2BIG);
  cr_assert_eq(b.len, 0);
  kv_buf_free(&b);
}

Test(wire_bad, inline_data) {
  uint8_t key[KV_KEY_MAX + 1] = {0};
  /* PUT */
  pb8(0), pb8(KV_KEY_MAX + 1), pbmem(key, KV_KEY_MAX + 1), pb8(0), pb32(1), pb8(7);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "33-byte key");
  pb8(0), pb8(0), pb8(0), pb32(1), pb8(7);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "empty key");
  pb8(0), pb8(4), pbmem(key, 4), pb8(KV_KEY_MAX + 1), pbmem(key, KV_KEY_MAX + 1), pb32(1), pb8(7);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "33-byte parent");
  pb8(0), pb8(4), pbmem(key, 4), pb8(0), pb32(0);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "no data");
  pb8(0), pb8(4), pbmem(key, 4), pb8(0), pb32(2), pb8(7);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "data short");
  pb8(0), pb8(4), pbmem(key, 4), pb8(0), pb32(KV_INLINE_MAX + 1);
  cr_assert_eq(REQ(KV_OP_PUT), KV_EBADFRAME, "data over KV_INLINE_MAX");
  /* GET */
  pb8(0);
  cr_assert_eq(REQ(KV_OP_GET), KV_EBADFRAME, "GET of an empty key");
  pb8(KV_G3), pb32(1), pb8(1);
  cr_assert_eq(REP(KV_OP_GET), 0);
  pb8(KV_NTIERS), pb32(1), pb8(1);
  cr_assert_eq(REP(KV_OP_GET), KV_EBADFRAME, "GET reply from tier 3");
  pb8(KV_G2), pb32(0);
  cr_assert_eq(REP(KV_OP_GET), KV_EBADFRAME, "GET reply of nothing");
  /* PUT reply is empty */
  pb8(0);
  cr_assert_eq(REP(KV_OP_PUT), KV_EBADFRAME);
  /* STATUS */
  pb8(1);
  cr_assert_eq(REQ(KV_OP_STATUS), KV_EBADFRAME, "STATUS flags");
  pb32(3), pbmem("a\xffz", 3);
  cr_assert_eq(REP(KV_OP_STATUS), KV_EBADFRAME, "STATUS text not UTF-8");
  pb32(KV_STATUS_TEXT_MAX + 1);
  cr_assert_eq(REP(KV_OP_STATUS), KV_EBADFRAME, "STATUS text over its limit");
  /* ERROR */
  pb16(1), pb16(KV_ERRMSG_MAX + 1), pbfill('e', KV_ERRMSG_MAX + 1);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY, -1), KV_EBADFRAME, "message of 256 bytes");
  pb16(1), pb16(KV_ERRMSG_MAX), pbfill('e', KV_ERRMSG_MAX);
  cr_assert_eq(pdecode(KV_OP_ERROR, KV_F_REPLY, -1), 0);
}

Test(wire_bad, payload_length_limits) {
  kv_hdr h = {.magic = KV_PROTO_MAGIC,
              .version = KV_PROTO_MAJOR,
              .op = KV_OP_LOOKUP,
              .len = KV_PAYLOAD_MAX_CTRL + 1,
              .id = 77};
  uint8_t g[KV_HDR_SIZE];
  kv_hdr r;
  kv_msg m;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), -EMSGSIZE);
  cr_assert_eq(kv_msg_decode(g, sizeof g, &m), -EMSGSIZE);
  cr_assert_eq(m.id, 77, "the oversized request is still named");
  h.len = KV_PAYLOAD_MAX_CTRL;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), 0);
  /* PUT requests and GET replies may be large, their counterparts not */
  h.op = KV_OP_PUT;
  h.len = KV_PAYLOAD_MAX_DATA;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), 0);
  h.len = KV_PAYLOAD_MAX_DATA + 1;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), -EMSGSIZE);
  h.flags = KV_F_REPLY;
  h.len = KV_PAYLOAD_MAX_CTRL + 1;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), -EMSGSIZE, "PUT reply");
  h.op = KV_OP_GET;
  h.len = KV_PAYLOAD_MAX_DATA;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), 0, "GET reply");
  h.flags = 0;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), -EMSGSIZE, "GET request");
  h.len = UINT32_MAX;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_hdr_parse(g, sizeof g, &r), -EMSGSIZE);

  /* the encoder will not write a STATUS text that does not fit */
  kv_buf b;
  kv_buf_init(&b);
  char *big = malloc(KV_STATUS_TEXT_MAX + 1);
  memset(big, 'x', KV_STATUS_TEXT_MAX + 1);
  kv_msg s = kv_sample_rep(KV_OP_STATUS, 1);
  s.status_text = (kv_str){big, KV_STATUS_TEXT_MAX + 1};
  cr_assert_eq(kv_msg_encode(&b, &s), -EINVAL);
  s.status_text.len = KV_STATUS_TEXT_MAX;
  cr_assert_eq(kv_msg_encode(&b, &s), 0);
  cr_assert_eq(b.len, KV_HDR_SIZE + KV_PAYLOAD_MAX_CTRL);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &m), 0);
  free(big);
  kv_buf_free(&b);
}

Test(wire_bad, fixed_buffer_too_small) {
  uint8_t mem[40];
  kv_buf b;
  kv_buf_init_fixed(&b, mem, sizeof mem);
  kv_msg m = kv_sample_req(KV_OP_LOOKUP, 1);
  m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 1, .klen = 32};
  cr_assert_eq(kv_msg_encode(&b, &m), -ENOBUFS);
  cr_assert_eq(b.len, 0);
  m.batch.keys.klen = 1; /* 32 + 3 + 5 + 1 = 41 */
  cr_assert_eq(kv_msg_encode(&b, &m), -ENOBUFS);
  m.batch.keys.n = 0; /* 40 */
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  cr_assert_eq(b.len, 40);
  kv_buf_free(&b);
  cr_assert_eq(b.p, mem, "a fixed buffer is never freed");
}

/* ---- happy paths ------------------------------------------------------------------ */

static void roundtrip_one(const kv_msg *m, const char *what, void *arg) {
  kv_buf b, b2;
  kv_msg d;
  kv_buf_init(&b);
  kv_buf_init(&b2);
  int rc = kv_msg_encode(&b, m);
  cr_assert_eq(rc, 0, "%s %s: encode %s", kv_op_name(m->op), what, kv_strerror(rc));
  rc = kv_msg_decode(b.p, b.len, &d);
  cr_assert_eq(rc, 0, "%s %s: decode %s", kv_op_name(m->op), what, kv_strerror(rc));
  cr_assert(msg_eq(m, &d), "%s %s: decoded differs", kv_op_name(m->op), what);
  cr_assert_eq(kv_msg_encode(&b2, &d), 0);
  cr_assert(b2.len == b.len && !memcmp(b.p, b2.p, b.len), "%s %s: re-encoding differs",
            kv_op_name(m->op), what);
  /* the head + tail split is the same bytes */
  kv_bytes tail;
  kv_buf_reset(&b2);
  cr_assert_eq(kv_msg_encode_head(&b2, m, &tail), 0);
  cr_assert_eq(b2.len + tail.len, b.len);
  cr_assert_eq(memcmp(b2.p, b.p, b2.len), 0);
  if (tail.len) cr_assert_eq(memcmp(tail.p, b.p + b2.len, tail.len), 0);
  unsigned *count = arg;
  (*count)++;
  kv_buf_free(&b);
  kv_buf_free(&b2);
}

Test(wire_ok, every_opcode_roundtrips) {
  unsigned count = 0;
  kv_samples(roundtrip_one, &count);
  cr_assert_gt(count, 40);
  /* and every opcode appears, as request and as reply */
  corpus c;
  corpus_load(&c);
  unsigned seen[KV_OP_COUNT][2] = {{0}};
  for (size_t s = 0; s < c.n; s++) {
    kv_msg m;
    cr_assert_eq(kv_msg_decode(c.all.p + c.off[s], c.len[s], &m), 0);
    seen[m.op][(m.flags & KV_F_REPLY) != 0]++;
  }
  for (unsigned op = KV_OP_HELLO; op < KV_OP_COUNT; op++) {
    if (op != KV_OP_ERROR) cr_assert(seen[op][0], "no %s request sample", kv_op_name(op));
    cr_assert(seen[op][1], "no %s reply sample", kv_op_name(op));
  }
  kv_buf_free(&c.all);
}

Test(wire_ok, header_layout_is_documented_one) {
  kv_msg m = kv_sample_req(KV_OP_LOOKUP, 0x0102030405060708ull);
  m.batch.keys = (kv_keyvec){.p = (const uint8_t *)"\xaa\xbb", .n = 2, .klen = 1};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  static const uint8_t want[] = {
      'K',  'V',  'C',  'D',                          /* magic */
      0x01, 0x00,                                     /* version 1 */
      0x02, 0x00,                                     /* opcode LOOKUP */
      0x00, 0x00,                                     /* flags */
      0x00, 0x00,                                     /* reserved */
      0x0a, 0x00, 0x00, 0x00,                         /* payload length 10 */
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* request id */
      0x00, 0x00, 0x00, 0x00,                         /* status */
      0x00, 0x00, 0x00, 0x00,                         /* reserved */
      0x00, 0x00, 0x00,                               /* tier, prio, flags */
      0x02, 0x00, 0x00, 0x00,                         /* 2 keys */
      0x01,                                           /* of 1 byte */
      0xaa, 0xbb,
  };
  cr_assert_eq(b.len, sizeof want);
  cr_assert_eq(memcmp(b.p, want, sizeof want), 0);
  kv_buf_free(&b);

  /* an ERROR reply, as the daemon answers a bad version */
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode_error(&b, 0, 0x3333, KV_EBADVERSION, "speak 1"), 0);
  static const uint8_t werr[] = {
      'K',  'V', 'C', 'D', 0x01, 0x00, 0x0e, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x00,
      0x00, 0,   0,   0,   0,    0,    0,    0,    0,    0xe7, 0xd8, 0xff, 0xff, /* -10009 */
      0,    0,   0,   0,   0x33, 0x33, 0x07, 0x00, 's',  'p',  'e',  'a',  'k',  ' ',  '1',
  };
  cr_assert_eq(b.len, sizeof werr);
  cr_assert_eq(memcmp(b.p, werr, sizeof werr), 0);
  kv_buf_free(&b);
}

Test(wire_ok, error_reply_helper) {
  kv_buf b;
  kv_msg m;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode_error(&b, 5, KV_OP_LOAD, 0, "x"), -EINVAL);
  cr_assert_eq(kv_msg_encode_error(&b, 5, KV_OP_LOAD, KV_ENOSESSION, NULL), 0);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &m), 0);
  cr_assert_eq(m.status, KV_ENOSESSION);
  cr_assert_eq(m.error.req_op, KV_OP_LOAD);
  cr_assert(mem_eq(m.error.msg.p, m.error.msg.len, kv_strerror(KV_ENOSESSION),
                   (uint32_t)strlen(kv_strerror(KV_ENOSESSION))));
  /* a long message is cut at KV_ERRMSG_MAX bytes, between characters */
  char msg[600];
  size_t n = 0;
  while (n + 2 < sizeof msg) msg[n++] = '\xc3', msg[n++] = '\xa9'; /* é, 2 bytes */
  msg[n] = 0;
  kv_buf_reset(&b);
  cr_assert_eq(kv_msg_encode_error(&b, 5, KV_OP_LOAD, -5, msg), 0);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &m), 0);
  cr_assert_eq(m.error.msg.len, KV_ERRMSG_MAX - 1);
  /* a message that is not text is dropped, the status stays */
  kv_buf_reset(&b);
  cr_assert_eq(kv_msg_encode_error(&b, 5, KV_OP_LOAD, -5, "\xff\xff"), 0);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &m), 0);
  cr_assert_eq(m.error.msg.len, 0);
  cr_assert_eq(m.status, -5);
  kv_buf_free(&b);
}

Test(wire_ok, keyvec_from_kv_key_array) {
  kv_key keys[3];
  for (int i = 0; i < 3; i++) {
    uint8_t d[20];
    memset(d, i + 1, sizeof d);
    cr_assert_eq(kv_key_set(&keys[i], d, sizeof d), 0);
  }
  kv_keyvec v;
  cr_assert_eq(kv_keyvec_from_keys(&v, keys, 3), 0);
  kv_msg m = kv_sample_req(KV_OP_COMMIT, 9), d;
  m.batch.keys = v;
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &d), 0);
  cr_assert_eq(d.batch.keys.n, 3);
  for (uint32_t i = 0; i < 3; i++) {
    kv_key k;
    cr_assert_eq(kv_keyvec_get(&d.batch.keys, i, &k), 0);
    cr_assert_eq(k.len, 20);
    cr_assert_eq(memcmp(k.b, keys[i].b, 20), 0);
  }
  kv_key k;
  cr_assert_eq(kv_keyvec_get(&d.batch.keys, 3, &k), -EINVAL);
  keys[1].len = 19;
  cr_assert_eq(kv_keyvec_from_keys(&v, keys, 3), -EINVAL, "mixed key lengths");
  cr_assert_eq(kv_keyvec_from_keys(&v, keys, 0), 0);
  cr_assert_eq(v.n, 0);
  kv_buf_free(&b);
}

Test(wire_ok, frames_append_back_to_back) {
  kv_buf b;
  kv_buf_init(&b);
  corpus c;
  corpus_load(&c);
  /* decode the concatenation frame by frame using each header's length */
  size_t off = 0, i = 0;
  while (off < c.all.len) {
    kv_hdr h;
    cr_assert_eq(kv_hdr_parse(c.all.p + off, c.all.len - off, &h), 0);
    kv_msg m;
    cr_assert_eq(kv_msg_decode(c.all.p + off, KV_HDR_SIZE + h.len, &m), 0);
    cr_assert_eq(off, c.off[i]);
    off += KV_HDR_SIZE + h.len;
    i++;
  }
  cr_assert_eq(i, c.n);
  kv_buf_free(&c.all);
  kv_buf_free(&b);
}

Test(wire_ok, utf8) {
  cr_assert(kv_utf8_ok("", 0));
  cr_assert(kv_utf8_ok("plain", 5));
  cr_assert(kv_utf8_ok("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
  cr_assert_not(kv_utf8_ok("a\0b", 3), "NUL");
  cr_assert_not(kv_utf8_ok("\xc1\xbf", 2), "overlong");
  cr_assert_not(kv_utf8_ok("\xe0\x80\xaf", 3), "overlong");
  cr_assert_not(kv_utf8_ok("\xed\xbf\xbf", 3), "surrogate");
  cr_assert_not(kv_utf8_ok("\xf4\x90\x80\x80", 4), "past U+10FFFF");
  cr_assert_not(kv_utf8_ok("\xf0\x9f\x98", 3), "cut");
  cr_assert_not(kv_utf8_ok("\x80", 1), "lone continuation");
  cr_assert_not(kv_utf8_ok("\xf8\x88\x80\x80\x80", 5), "5-byte form");
}

Test(wire_ok, op_names_and_errors) {
  cr_assert_str_eq(kv_op_name(KV_OP_SET_PRIORITY), "SET_PRIORITY");
  cr_assert_str_eq(kv_op_name(KV_OP_ERROR), "ERROR");
  for (unsigned op = KV_OP_HELLO; op < KV_OP_COUNT; op++) cr_assert_not_null(kv_op_name(op));
  cr_assert_str_eq(kv_err_name(KV_EBADFD), "KV_EBADFD");
  cr_assert_eq(KV_EBADFD, -10015);
  cr_assert_eq(KV_ESHARE, -10016);
  cr_assert_eq(KV_EBADFRAME, -10008);
}

/* 1.2: a COMMIT with the writer's CRCs and a LOAD2 reply, byte by byte as
 * PROTOCOL.md lays them out. */
Test(wire_ok, v1_2_commit_crc_and_load2_layout) {
  static const uint32_t crcs[2] = {0xE3069283u, 0x01020304u};
  kv_msg m = kv_sample_req(KV_OP_COMMIT, 5);
  m.batch.flags = KV_COMMIT_CRC;
  m.batch.keys = (kv_keyvec){.p = (const uint8_t *)"\xaa\xbb", .n = 2, .klen = 1};
  m.batch.crcs = (kv_u32vec){.n = 2, .v = crcs};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  static const uint8_t body[] = {
      0x00, 0x00, 0x02,       /* tier, prio, flags KV_COMMIT_CRC */
      0x02, 0x00, 0x00, 0x00, /* 2 keys */
      0x01, 0xaa, 0xbb,       /* of 1 byte */
      0x83, 0x92, 0x06, 0xe3, /* crc of key 0 */
      0x04, 0x03, 0x02, 0x01, /* crc of key 1 */
  };
  cr_assert_eq(b.len, KV_HDR_SIZE + sizeof body);
  cr_assert_eq(memcmp(b.p + KV_HDR_SIZE, body, sizeof body), 0);
  kv_msg d;
  cr_assert_eq(kv_msg_decode(b.p, b.len, &d), 0);
  cr_assert_eq(d.batch.crcs.n, 2);
  cr_assert_eq(kv_u32vec_get(&d.batch.crcs, 0), 0xE3069283u);
  cr_assert_eq(kv_u32vec_get(&d.batch.crcs, 1), 0x01020304u);
  kv_buf_free(&b);

  static const kv_load_ent le[2] = {{0, KV_G2, 0x1000, 0x40000, 0xA1B2C3D4u},
                                    {KV_ECORRUPT, KV_TIER_NONE, 0, 0, 0}};
  m = kv_sample_rep(KV_OP_LOAD2, 6);
  m.load_rep = (kv_loadvec){.n = 2, .v = le};
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  static const uint8_t rep[] = {
      0x02, 0x00, 0x00, 0x00,                         /* 2 entries */
      0x00, 0x00, 0x00, 0x00, 0x01,                   /* status 0, tier G2 */
      0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* offset */
      0x00, 0x00, 0x04, 0x00,                         /* length */
      0xd4, 0xc3, 0xb2, 0xa1,                         /* crc */
      0xe9, 0xd8, 0xff, 0xff, 0xff,                   /* KV_ECORRUPT (-10007), no tier */
      0,    0,    0,    0,    0,    0,    0,    0,
      0,    0,    0,    0,    0,    0,    0,    0, /* offset, length, crc: 0 */
  };
  cr_assert_eq(b.len, KV_HDR_SIZE + sizeof rep);
  cr_assert_eq(memcmp(b.p + KV_HDR_SIZE, rep, sizeof rep), 0);
  cr_assert_eq(kv_msg_decode(b.p, b.len, &d), 0);
  kv_load_ent e;
  kv_loadvec_get(&d.load_rep, 0, &e);
  cr_assert_eq(e.crc, 0xA1B2C3D4u);
  cr_assert_eq(e.length, 0x40000);
  kv_buf_free(&b);
}

Test(wire_bad, v1_2_fields) {
  /* COMMIT's CRCs: exactly one per key, only with the flag */
  batch_body(0, 0, KV_COMMIT_CRC, 2, 8), pb32(1), pb32(2);
  cr_assert_eq(REQ(KV_OP_COMMIT), 0, "two keys, two CRCs");
  batch_body(0, 0, KV_COMMIT_CRC, 2, 8), pb32(1);
  cr_assert_eq(REQ(KV_OP_COMMIT), KV_EBADFRAME, "a CRC short");
  batch_body(0, 0, KV_COMMIT_CRC, 2, 8), pb32(1), pb32(2), pb32(3);
  cr_assert_eq(REQ(KV_OP_COMMIT), KV_EBADFRAME, "a CRC too many");
  batch_body(0, 0, 0, 2, 8), pb32(1), pb32(2);
  cr_assert_eq(REQ(KV_OP_COMMIT), KV_EBADFRAME, "CRCs without the flag");
  batch_body(0, 0, KV_COMMIT_CRC, 0, 0);
  cr_assert_eq(REQ(KV_OP_COMMIT), 0, "an empty COMMIT with the flag");
  static const uint16_t not_commit[] = {KV_OP_LOOKUP, KV_OP_RELEASE, KV_OP_ABORT, KV_OP_DELETE,
                                        KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < sizeof not_commit / sizeof not_commit[0]; i++) {
    batch_body(0, 0, KV_COMMIT_CRC, 1, 8), pb32(1);
    cr_assert_eq(REQ(not_commit[i]), KV_EBADFRAME, "KV_COMMIT_CRC on %s",
                 kv_op_name(not_commit[i]));
  }
  /* the corrupt report is RELEASE's flag only */
  batch_body(0, 0, KV_REL_CORRUPT, 1, 8);
  cr_assert_eq(REQ(KV_OP_RELEASE), 0);
  batch_body(0, 0, KV_REL_CORRUPT, 1, 8);
  cr_assert_eq(REQ(KV_OP_COMMIT), KV_EBADFRAME, "KV_REL_CORRUPT on COMMIT");
  batch_body(0, 0, KV_REL_CORRUPT, 1, 8);
  cr_assert_eq(REQ(KV_OP_ABORT), KV_EBADFRAME, "KV_REL_CORRUPT on ABORT");
  batch_body(0, 0, KV_REL_CORRUPT | KV_DEL_ALL, 1, 8);
  cr_assert_eq(REQ(KV_OP_RELEASE), KV_EBADFRAME, "KV_DEL_ALL on RELEASE");
  /* LOAD2: a request as LOAD's; reply entries of 21 bytes, a miss's crc 0 */
  batch_body(KV_G2, 0, 0, 1, 8);
  cr_assert_eq(REQ(KV_OP_LOAD2), 0);
  batch_body(KV_G3, 0, 0, 1, 8);
  cr_assert_eq(REQ(KV_OP_LOAD2), KV_EBADFRAME, "LOAD2 to G3");
  pb32(1), pb32(0), pb8(KV_G2), pb64(0), pb32(1), pb32(0xdeadbeef);
  cr_assert_eq(REP(KV_OP_LOAD2), 0);
  pb32(1), pb32(0), pb8(KV_G2), pb64(0), pb32(1);
  cr_assert_eq(REP(KV_OP_LOAD2), KV_EBADFRAME, "a LOAD entry in a LOAD2 reply");
  pb32(1), pb32(0), pb8(KV_G2), pb64(0), pb32(1), pb32(7);
  cr_assert_eq(REP(KV_OP_LOAD), KV_EBADFRAME, "a LOAD2 entry in a LOAD reply");
  pb32(1), pb32((uint32_t)KV_ENOTFOUND), pb8(KV_TIER_NONE), pb64(0), pb32(0), pb32(7);
  cr_assert_eq(REP(KV_OP_LOAD2), KV_EBADFRAME, "a miss with a crc");

  /* the encoder refuses the same */
  kv_buf b;
  kv_buf_init(&b);
  static const uint32_t crcs[2] = {1, 2};
  kv_msg m = kv_sample_req(KV_OP_COMMIT, 1);
  m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 2, .klen = 8};
  m.batch.crcs = (kv_u32vec){.n = 2, .v = crcs};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "CRCs without the flag");
  m.batch.flags = KV_COMMIT_CRC;
  m.batch.crcs.n = 1;
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "fewer CRCs than keys");
  m.batch.crcs = (kv_u32vec){.n = 2, .v = NULL};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "no CRC array");
  m.op = KV_OP_RELEASE;
  m.batch.crcs = (kv_u32vec){.n = 2, .v = crcs};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "KV_COMMIT_CRC on RELEASE");
  kv_load_ent e = {KV_ENOTFOUND, KV_TIER_NONE, 0, 0, 9};
  m = kv_sample_rep(KV_OP_LOAD2, 1);
  m.load_rep = (kv_loadvec){.n = 1, .v = &e};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "a LOAD2 miss with a crc");
  m.op = KV_OP_LOAD; /* LOAD has no crc on the wire: ignored */
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  kv_buf_free(&b);
}

Test(wire_bad, v1_4_commit_g4) {
  /* COMMIT's wait for G4: with or without CRCs, COMMIT's flag only */
  batch_body(0, 0, KV_COMMIT_G4, 2, 8);
  cr_assert_eq(REQ(KV_OP_COMMIT), 0);
  batch_body(0, 0, KV_COMMIT_G4 | KV_COMMIT_CRC, 2, 8), pb32(1), pb32(2);
  cr_assert_eq(REQ(KV_OP_COMMIT), 0, "with CRCs");
  batch_body(0, 0, KV_COMMIT_G4, 2, 8), pb32(1), pb32(2);
  cr_assert_eq(REQ(KV_OP_COMMIT), KV_EBADFRAME, "CRCs without KV_COMMIT_CRC");
  static const uint16_t not_commit[] = {KV_OP_LOOKUP, KV_OP_RELEASE, KV_OP_ABORT, KV_OP_DELETE,
                                        KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < sizeof not_commit / sizeof not_commit[0]; i++) {
    batch_body(0, 0, KV_COMMIT_G4, 1, 8);
    cr_assert_eq(REQ(not_commit[i]), KV_EBADFRAME, "KV_COMMIT_G4 on %s",
                 kv_op_name(not_commit[i]));
  }
}

Test(wire_bad, v1_4_lookup_all) {
  /* LOOKUP past holes: LOOKUP's flag only, and no other bit beside it */
  batch_body(0, 0, KV_LOOKUP_ALL, 2, 8);
  cr_assert_eq(REQ(KV_OP_LOOKUP), 0);
  batch_body(0, 0, 0, 2, 8);
  cr_assert_eq(REQ(KV_OP_LOOKUP), 0, "a LOOKUP without it, as before");
  batch_body(0, 0, KV_LOOKUP_ALL | KV_REL_CORRUPT, 2, 8);
  cr_assert_eq(REQ(KV_OP_LOOKUP), KV_EBADFRAME, "KV_REL_CORRUPT on LOOKUP");
  batch_body(0, 0, 0x10, 2, 8);
  cr_assert_eq(REQ(KV_OP_LOOKUP), KV_EBADFRAME, "an unknown bit on LOOKUP");
  batch_body(KV_G2, 0, KV_LOOKUP_ALL, 2, 8);
  cr_assert_eq(REQ(KV_OP_LOOKUP), KV_EBADFRAME, "a tier on LOOKUP");
  static const uint16_t not_lookup[] = {KV_OP_LOAD, KV_OP_RELEASE, KV_OP_COMMIT, KV_OP_DELETE,
                                        KV_OP_PREFETCH, KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < sizeof not_lookup / sizeof not_lookup[0]; i++) {
    batch_body(not_lookup[i] == KV_OP_LOAD || not_lookup[i] == KV_OP_PREFETCH ? KV_G2 : 0, 0,
               KV_LOOKUP_ALL, 1, 8);
    cr_assert_eq(REQ(not_lookup[i]), KV_EBADFRAME, "KV_LOOKUP_ALL on %s",
                 kv_op_name(not_lookup[i]));
  }
}

/* ---- 1.3: HINT ---------------------------------------------------------------------- */

static void hint_body(uint8_t kind, uint8_t stop, uint16_t rsv, uint32_t retain, uint64_t session,
                      uint32_t n, uint8_t klen) {
  pb8(kind), pb8(stop), pb16(rsv), pb32(retain), pb64(session), pb32(n), pb8(klen);
  pbfill(0x55, (size_t)n * klen);
}

Test(wire_ok, v1_3_hint_layout) {
  kv_msg m = kv_sample_req(KV_OP_HINT, 5);
  m.hint = (kv_hint_req){.kind = KV_HINT_FINISHED,
                         .stop = KV_STOP_END_TURN,
                         .retain_s = 0x0102,
                         .session = 0x1122334455667788ull,
                         .keys = {.p = (const uint8_t *)"\xaa\xbb", .n = 2, .klen = 1}};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  static const uint8_t body[] = {
      0x02, 0x01, 0x00, 0x00,                         /* FINISHED, end_turn, reserved */
      0x02, 0x01, 0x00, 0x00,                         /* retain_s */
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* session */
      0x02, 0x00, 0x00, 0x00, 0x01, 0xaa, 0xbb,       /* 2 keys of 1 byte */
  };
  cr_assert_eq(b.len, KV_HDR_SIZE + sizeof body);
  cr_assert_eq(memcmp(b.p + KV_HDR_SIZE, body, sizeof body), 0);
  kv_msg d;
  cr_assert_eq(kv_msg_decode(b.p, b.len, &d), 0);
  cr_assert_eq(d.hint.session, 0x1122334455667788ull);
  cr_assert_eq(d.hint.stop, KV_STOP_END_TURN);
  cr_assert_eq(d.hint.keys.n, 2);
  kv_buf_free(&b);
  cr_assert_eq(kv_req_payload_max(KV_OP_HINT), 16u + 5u + KV_BATCH_MAX * KV_KEY_MAX);
  cr_assert_str_eq(kv_op_name(KV_OP_HINT), "HINT");
}

Test(wire_bad, v1_3_hint_fields) {
  hint_body(KV_HINT_SESSION, 0, 0, 60, 7, 2, 8);
  cr_assert_eq(REQ(KV_OP_HINT), 0);
  hint_body(KV_HINT_SESSION, 0, 0, 60, 7, 0, 0);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "SESSION without keys");
  hint_body(KV_HINT_SESSION, KV_STOP_END_TURN, 0, 0, 7, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "a stop reason on SESSION");
  hint_body(KV_HINT_SESSION, 0, 0, 0, 0, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "session 0");
  hint_body(KV_HINT_SESSION, 0, 1, 0, 7, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "reserved field");
  hint_body(KV_HINT_FINISHED, KV_STOP_OTHER, 0, 0, 7, 0, 0);
  cr_assert_eq(REQ(KV_OP_HINT), 0);
  hint_body(KV_HINT_FINISHED, KV_STOP_COUNT, 0, 0, 7, 0, 0);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "stop reason out of range");
  hint_body(KV_HINT_END, 0, 0, 0, 7, 0, 0);
  cr_assert_eq(REQ(KV_OP_HINT), 0);
  hint_body(KV_HINT_END, 0, 0, 5, 7, 0, 0);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "retention on END");
  hint_body(KV_HINT_END, 0, 0, 0, 7, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "keys on END");
  hint_body(0, 0, 0, 0, 7, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "kind 0");
  hint_body(KV_HINT_KIND_COUNT, 0, 0, 0, 7, 1, 8);
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "kind past the last");
  hint_body(KV_HINT_SESSION, 0, 0, 0, 7, KV_BATCH_MAX + 1, 1);
  cr_assert_eq(REQ(KV_OP_HINT), -E2BIG, "KV_BATCH_MAX + 1 keys");
  hint_body(KV_HINT_SESSION, 0, 0, 0, 7, 2, 8);
  P.len--;
  cr_assert_eq(REQ(KV_OP_HINT), KV_EBADFRAME, "keys short by one byte");

  /* the encoder refuses the same */
  kv_buf b;
  kv_buf_init(&b);
  kv_msg m = kv_sample_req(KV_OP_HINT, 1);
  m.hint = (kv_hint_req){.kind = KV_HINT_END, .session = 0};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "session 0");
  m.hint = (kv_hint_req){.kind = KV_HINT_SESSION, .session = 3};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "SESSION without keys");
  m.hint = (kv_hint_req){.kind = KV_HINT_FINISHED, .stop = 200, .session = 3};
  cr_assert_eq(kv_msg_encode(&b, &m), -EINVAL, "stop out of range");
  cr_assert_eq(b.len, 0, "a failed encode leaves the buffer alone");
  kv_buf_free(&b);
}

Test(hint_vocabulary, stop_names_and_session_ids) {
  for (unsigned s = 0; s < KV_STOP_COUNT; s++)
    cr_assert_eq(kv_stop_parse(kv_stop_name(s)), (kv_stop)s, "%s", kv_stop_name(s));
  cr_assert_null(kv_stop_name(KV_STOP_COUNT));
  cr_assert_eq(kv_stop_parse("stop"), KV_STOP_END_TURN);
  cr_assert_eq(kv_stop_parse("length"), KV_STOP_MAX_TOKENS);
  cr_assert_eq(kv_stop_parse("tool_calls"), KV_STOP_TOOL_USE);
  cr_assert_eq(kv_stop_parse("refusal"), KV_STOP_OTHER);
  cr_assert_eq(kv_stop_parse(""), KV_STOP_UNKNOWN);
  cr_assert_eq(kv_stop_parse(NULL), KV_STOP_UNKNOWN);
  /* FNV-1a 64's published values; the Python package's test checks the same */
  cr_assert_eq(kv_session_id("", 0), 0xcbf29ce484222325ull);
  cr_assert_eq(kv_session_id("a", 1), 0xaf63dc4c8601ec8cull);
  cr_assert_eq(kv_session_id("foobar", 6), 0x85944171f73967e8ull);
}

/* ---- 1.5: PRESENCE, KV_LOAD_LOCAL ------------------------------------------------- */

Test(wire_ok, v1_5_presence_layout) {
  kv_msg m = kv_sample_rep(KV_OP_PRESENCE, 9);
  m.flags |= KV_F_FD;
  m.presence_rep = (kv_presence_rep){.bytes = 0x0102030405ull, .flags = 0x11223344u};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  static const uint8_t body[] = {0x05, 0x04, 0x03, 0x02, 0x01, 0x00, 0x00, 0x00, /* bytes */
                                 0x44, 0x33, 0x22, 0x11};                        /* flags */
  cr_assert_eq(b.len, KV_HDR_SIZE + sizeof body);
  cr_assert_eq(memcmp(b.p + KV_HDR_SIZE, body, sizeof body), 0);
  kv_buf_free(&b);
  cr_assert_eq(kv_req_payload_max(KV_OP_PRESENCE), 1u);
  cr_assert_str_eq(kv_op_name(KV_OP_PRESENCE), "PRESENCE");
}

Test(wire_bad, v1_5_presence_fields) {
  pb8(0);
  cr_assert_eq(REQ(KV_OP_PRESENCE), 0);
  pb8(1);
  cr_assert_eq(REQ(KV_OP_PRESENCE), KV_EBADFRAME, "request flags other than 0");
  pb64(4160), pb32(0);
  cr_assert_eq(pdecode(KV_OP_PRESENCE, KV_F_REPLY | KV_F_FD, 0), 0);
  pb64(4160), pb32(0);
  cr_assert_eq(REP(KV_OP_PRESENCE), KV_EBADFRAME, "a reply without the table's fd");
  pb64(0), pb32(0);
  cr_assert_eq(pdecode(KV_OP_PRESENCE, KV_F_REPLY | KV_F_FD, 0), KV_EBADFRAME, "0 bytes");
  pb8(0);
  cr_assert_eq(pdecode(KV_OP_PRESENCE, KV_F_FD, 0), KV_EBADFRAME, "an fd on a request");
  /* KV_LOAD_LOCAL: on LOAD and LOAD2 only */
  static const uint16_t ok[] = {KV_OP_LOAD, KV_OP_LOAD2};
  static const uint16_t not_load[] = {KV_OP_LOOKUP, KV_OP_PREFETCH, KV_OP_RELEASE};
  for (unsigned i = 0; i < 2; i++) {
    pb8(KV_G2), pb8(0), pb8(KV_LOAD_LOCAL), pb32(1), pb8(4), pbfill(7, 4);
    cr_assert_eq(REQ(ok[i]), 0, "%s", kv_op_name(ok[i]));
  }
  for (unsigned i = 0; i < 3; i++) {
    pb8(not_load[i] == KV_OP_PREFETCH ? KV_G2 : 0), pb8(0), pb8(KV_LOAD_LOCAL), pb32(1), pb8(4);
    pbfill(7, 4);
    cr_assert_eq(REQ(not_load[i]), KV_EBADFRAME, "%s", kv_op_name(not_load[i]));
  }
}
