/*
 * wire_int.h - rules the encoder and the decoder both enforce, so that what
 * one writes the other accepts and nothing else. Internal to proto/.
 *
 * Each predicate returns 1 when the value is allowed. The encoder turns a 0
 * into -EINVAL (its caller's mistake), the decoder into KV_EBADFRAME.
 */
#ifndef KV_PROTO_WIRE_INT_H
#define KV_PROTO_WIRE_INT_H

#include "proto/wire.h"

/* Wire sizes of the packed reply entries. */
#define KV_LOAD_ENT_SIZE  17 /* i32 status, u8 tier, u64 offset, u32 length */
#define KV_LOAD2_ENT_SIZE 21 /* the same and u32 crc */
#define KV_ALLOC_ENT_SIZE 12 /* i32 status, u64 offset */

static inline int kv__op_known(uint16_t op) { return op >= KV_OP_HELLO && op < KV_OP_COUNT; }

/* Header rules beyond kv_hdr_parse(): flags, status, id, which frames may
 * carry an fd. Returns 0, KV_EBADOP (unknown opcode) or 1 (any other). */
static inline int kv__hdr_rules(uint16_t op, uint16_t flags, int32_t status, uint64_t id) {
  if (!kv__op_known(op)) return KV_EBADOP;
  if (flags & ~KV_F_KNOWN) return 1;
  int reply = (flags & KV_F_REPLY) != 0;
  if (!reply) {
    if (op == KV_OP_ERROR || status != 0 || id == 0) return 1;
  } else if (op == KV_OP_ERROR) {
    if (status >= 0) return 1;
  } else if (status != 0 || id == 0) {
    return 1;
  }
  /* Only a HELLO reply (the G2 arena, checked against arena_bytes with the
   * payload), a G1_SELECT reply (the G1 pool) and a PRESENCE reply (the
   * table, which it must carry) carry an fd. */
  if ((flags & KV_F_FD) &&
      !(reply && (op == KV_OP_HELLO || op == KV_OP_G1_SELECT || op == KV_OP_PRESENCE)))
    return 1;
  if (reply && op == KV_OP_PRESENCE && !(flags & KV_F_FD)) return 1;
  /* The second fd (the G1 pool) only comes after the first, on a HELLO reply. */
  if ((flags & KV_F_FD2) && (!(flags & KV_F_FD) || op != KV_OP_HELLO)) return 1;
  return 0;
}

/* The tier a LOAD, PREFETCH or ALLOC may target. */
static inline int kv__target_ok(uint8_t t) { return t == KV_G1 || t == KV_G2; }

/* A tier byte of a LOOKUP reply. */
static inline int kv__tierbyte_ok(uint8_t t) { return t < KV_NTIERS || t == KV_TIER_NONE; }

/* The per-op use of a batch request's tier, prio and flags fields. */
static inline int kv__batch_ok(uint16_t op, const kv_batch_req *b) {
  if (b->crcs.n && !(op == KV_OP_COMMIT && (b->flags & KV_COMMIT_CRC))) return 0;
  switch (op) {
  case KV_OP_LOAD:
  case KV_OP_LOAD2:
    return kv__target_ok(b->tier) && b->prio == 0 && (b->flags & ~KV_LOAD_LOCAL) == 0;
  case KV_OP_PREFETCH: return kv__target_ok(b->tier) && b->prio == 0 && b->flags == 0;
  case KV_OP_COMMIT:
    if (b->tier || b->prio || (b->flags & ~(KV_COMMIT_CRC | KV_COMMIT_G4))) return 0;
    return !(b->flags & KV_COMMIT_CRC) || b->crcs.n == b->keys.n;
  case KV_OP_RELEASE: return b->tier == 0 && b->prio == 0 && (b->flags & ~KV_REL_CORRUPT) == 0;
  case KV_OP_LOOKUP: return b->tier == 0 && b->prio == 0 && (b->flags & ~KV_LOOKUP_ALL) == 0;
  case KV_OP_SET_PRIORITY: return b->tier == 0 && b->flags == 0;
  case KV_OP_DELETE:
    if (b->tier || b->prio || (b->flags & ~KV_DEL_ALL)) return 0;
    return !(b->flags & KV_DEL_ALL) || b->keys.n == 0;
  default: return b->tier == 0 && b->prio == 0 && b->flags == 0;
  }
}

/* with_crc: a LOAD2 entry, whose crc is on the wire (0 on a miss). */
static inline int kv__load_ent_ok(const kv_load_ent *e, int with_crc) {
  if (e->status == 0) return kv__target_ok(e->tier) && e->length > 0;
  return e->status < 0 && e->tier == KV_TIER_NONE && e->offset == 0 && e->length == 0 &&
         (!with_crc || e->crc == 0);
}

static inline int kv__alloc_ent_ok(const kv_alloc_ent *e) {
  return e->status == 0 || (e->status < 0 && e->offset == 0);
}

/* HINT request fields (the keys are checked as every batch's). */
static inline int kv__hint_ok(const kv_hint_req *h) {
  if (h->session == 0) return 0;
  switch (h->kind) {
  case KV_HINT_SESSION: return h->stop == 0 && h->keys.n > 0;
  case KV_HINT_FINISHED: return h->stop < KV_STOP_COUNT;
  case KV_HINT_END: return h->stop == 0 && h->retain_s == 0 && h->keys.n == 0;
  default: return 0;
  }
}

static inline int kv__is_pow2_or_0(uint32_t v) { return (v & (v - 1)) == 0; }

/* HELLO request fields (lengths and the layout's consistency). */
static inline int kv__hello_ok(const kv_hello_req *h) {
  const kv_layout *l = &h->layout;
  if (h->tenant.len < 1 || h->tenant.len > KV_TENANT_MAX) return 0;
  if (h->group.len > KV_GROUP_MAX || h->salt.len > KV_SALT_MAX) return 0;
  if (l->dtype.len < 1 || l->dtype.len > KV_DTYPE_MAX) return 0;
  if (l->block_bytes == 0 || l->tokens_per_block == 0) return 0;
  if (l->tp_size == 0 || l->tp_rank >= l->tp_size) return 0;
  return kv_utf8_ok(h->tenant.p, h->tenant.len) && kv_utf8_ok(h->group.p, h->group.len) &&
         kv_utf8_ok(l->dtype.p, l->dtype.len);
}

/* HELLO reply fields except the tier-info list; fd: KV_F_FD is set. */
static inline int kv__hello_rep_ok(const kv_hello_rep *r, int fd) {
  if ((r->arena_bytes > 0) != (fd != 0)) return 0;
  if (!kv__is_pow2_or_0(r->slot_align)) return 0;
  return r->ntierinfo <= KV_TIERINFO_MAX;
}

static inline int kv__tierinfo_ok(const kv_tierinfo *t) {
  return t->tier < KV_NTIERS && t->len <= KV_TIERINFO_BYTES_MAX;
}

#endif
