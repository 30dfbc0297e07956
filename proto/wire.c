/*
 * wire.c - the frame header, the opcode table, and the accessors that read
 * the wire protocol's vectors (wire.h). Encoders are in wire_enc.c,
 * decoders in wire_dec.c.
 */
#include "proto/wire.h"

#include <errno.h>
#include <string.h>

#include "base/le.h"

/* Per opcode: its name and the payload limits of its request and reply. */
static const struct {
  const char *name;
  uint32_t req_max, rep_max;
} kv_ops[KV_OP_COUNT] = {
    [KV_OP_HELLO] = {"HELLO", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_LOOKUP] = {"LOOKUP", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_LOAD] = {"LOAD", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_RELEASE] = {"RELEASE", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_ALLOC] = {"ALLOC", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_COMMIT] = {"COMMIT", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_ABORT] = {"ABORT", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_PREFETCH] = {"PREFETCH", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_DELETE] = {"DELETE", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_SET_PRIORITY] = {"SET_PRIORITY", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_PUT] = {"PUT", KV_PAYLOAD_MAX_DATA, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_GET] = {"GET", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_DATA},
    [KV_OP_STATUS] = {"STATUS", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_ERROR] = {"ERROR", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_G1_SELECT] = {"G1_SELECT", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_LOAD2] = {"LOAD2", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_HINT] = {"HINT", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
    [KV_OP_PRESENCE] = {"PRESENCE", KV_PAYLOAD_MAX_CTRL, KV_PAYLOAD_MAX_CTRL},
};

const char *kv_op_name(uint16_t op) { return op < KV_OP_COUNT ? kv_ops[op].name : NULL; }

uint32_t kv_payload_max(uint16_t op, int reply) {
  if (op == 0 || op >= KV_OP_COUNT) return KV_PAYLOAD_MAX_CTRL;
  return reply ? kv_ops[op].rep_max : kv_ops[op].req_max;
}

uint32_t kv_req_payload_max(uint16_t op) {
  const uint32_t keys = 4u + 1u + KV_BATCH_MAX * KV_KEY_MAX; /* KEYS at their largest */
  switch (op) {
  case KV_OP_HELLO:
    return 8u + (1u + KV_TENANT_MAX) + (1u + KV_GROUP_MAX) + (1u + KV_SALT_MAX) + 5u * 4u +
           2u * 2u + (1u + KV_DTYPE_MAX);
  case KV_OP_LOOKUP:
  case KV_OP_LOAD:
  case KV_OP_LOAD2:
  case KV_OP_RELEASE:
  case KV_OP_ABORT:
  case KV_OP_PREFETCH:
  case KV_OP_DELETE:
  case KV_OP_SET_PRIORITY: return 3u + keys;
  case KV_OP_COMMIT: return 3u + keys + KV_BATCH_MAX * 4u; /* KV_COMMIT_CRC: a CRC per key */
  case KV_OP_ALLOC: return 2u + keys + KV_BATCH_MAX + KV_BATCH_MAX * KV_KEY_MAX;
  case KV_OP_PUT: return KV_PUT_OVERHEAD + KV_INLINE_MAX;
  case KV_OP_GET: return 1u + KV_KEY_MAX;
  case KV_OP_STATUS:
  case KV_OP_PRESENCE: return 1u;
  case KV_OP_G1_SELECT: return KV_UUID_BYTES;
  case KV_OP_HINT: return 16u + keys;
  default: return 0;
  }
}

int kv_hdr_parse(const void *p, size_t n, kv_hdr *h) {
  const uint8_t *b = p;
  memset(h, 0, sizeof *h);
  if (n < KV_HDR_SIZE) return KV_EBADFRAME;
  h->magic = kv_ld32(b + 0);
  h->version = kv_ld16(b + 4);
  h->op = kv_ld16(b + 6);
  h->flags = kv_ld16(b + 8);
  h->rsv0 = kv_ld16(b + 10);
  h->len = kv_ld32(b + 12);
  h->id = kv_ld64(b + 16);
  h->status = (int32_t)kv_ld32(b + 24);
  h->rsv1 = kv_ld32(b + 28);
  if (h->magic != KV_PROTO_MAGIC) return KV_EBADFRAME;
  if (h->version != KV_PROTO_MAJOR) return KV_EBADVERSION;
  if (h->len > kv_payload_max(h->op, h->flags & KV_F_REPLY)) return -EMSGSIZE;
  return 0;
}

void kv_hdr_write(void *p, const kv_hdr *h) {
  uint8_t *b = p;
  kv_st32(b + 0, h->magic);
  kv_st16(b + 4, h->version);
  kv_st16(b + 6, h->op);
  kv_st16(b + 8, h->flags);
  kv_st16(b + 10, h->rsv0);
  kv_st32(b + 12, h->len);
  kv_st64(b + 16, h->id);
  kv_st32(b + 24, (uint32_t)h->status);
  kv_st32(b + 28, h->rsv1);
}

/* ---- vectors ---------------------------------------------------------------- */

int kv_keyvec_from_keys(kv_keyvec *v, const kv_key *keys, uint32_t n) {
  memset(v, 0, sizeof *v);
  if (n == 0) return 0;
  if (!keys) return -EINVAL;
  uint8_t klen = keys[0].len;
  if (klen == 0 || klen > KV_KEY_MAX) return -EINVAL;
  for (uint32_t i = 1; i < n; i++)
    if (keys[i].len != klen) return -EINVAL;
  v->p = keys[0].b;
  v->n = n;
  v->klen = klen;
  v->stride = sizeof(kv_key);
  return 0;
}

int kv_keyvec_get(const kv_keyvec *v, uint32_t i, kv_key *out) {
  if (i >= v->n) return -EINVAL;
  return kv_key_set(out, kv_keyvec_at(v, i), v->klen);
}

int32_t kv_statvec_get(const kv_statvec *s, uint32_t i) {
  return s->wire ? (int32_t)kv_ld32(s->wire + (size_t)i * 4) : s->v[i];
}

void kv_loadvec_get(const kv_loadvec *l, uint32_t i, kv_load_ent *out) {
  if (!l->wire) {
    *out = l->v[i];
    return;
  }
  const uint8_t *p = l->wire + (size_t)i * (l->with_crc ? 21 : 17);
  out->status = (int32_t)kv_ld32(p);
  out->tier = p[4];
  out->offset = kv_ld64(p + 5);
  out->length = kv_ld32(p + 13);
  out->crc = l->with_crc ? kv_ld32(p + 17) : 0;
}

uint32_t kv_u32vec_get(const kv_u32vec *u, uint32_t i) {
  return u->wire ? kv_ld32(u->wire + (size_t)i * 4) : u->v[i];
}

void kv_allocvec_get(const kv_allocvec *a, uint32_t i, kv_alloc_ent *out) {
  if (!a->wire) {
    *out = a->v[i];
    return;
  }
  const uint8_t *p = a->wire + (size_t)i * 12;
  out->status = (int32_t)kv_ld32(p);
  out->offset = kv_ld64(p + 4);
}

void kv_hello_tierinfo(const kv_hello_rep *r, unsigned i, kv_tierinfo *out) {
  if (!r->tierinfo_wire) {
    *out = r->tierinfo[i];
    return;
  }
  /* The decoder checked the list, so walking it stays inside the frame. */
  const uint8_t *p = r->tierinfo_wire;
  for (unsigned k = 0;; k++) {
    out->tier = p[0];
    out->kind = p[1];
    out->len = kv_ld16(p + 2);
    out->p = p + 4;
    if (k == i) return;
    p += 4 + out->len;
  }
}

const uint8_t *kv_alloc_parent(const kv_alloc_req *a, uint32_t i) {
  if (!a->has_parent || !a->has_parent[i] || !a->parents.p) return NULL;
  return kv_keyvec_at(&a->parents, i);
}

/* ---- UTF-8 -------------------------------------------------------------------- */

int kv_utf8_ok(const void *p, size_t n) {
  const uint8_t *s = p;
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c == 0) return 0;
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return 0;
    }
    if (n - i < len) return 0;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    i += len;
  }
  return 1;
}
