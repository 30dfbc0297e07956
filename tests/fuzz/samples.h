/*
 * samples.h - one or more valid messages of every opcode, request and
 * reply, in the shapes that matter (empty batch, one key, several keys of
 * different lengths, hits and misses, parents present and absent, an fd on
 * HELLO's reply). The round-trip tests walk them; the fuzzers seed from
 * their encodings. Header-only, for tests/unit and tests/fuzz.
 */
#ifndef KV_TESTS_FUZZ_SAMPLES_H
#define KV_TESTS_FUZZ_SAMPLES_H

#include <stdint.h>
#include <string.h>

#include "proto/wire.h"

typedef void (*kv_sample_fn)(const kv_msg *m, const char *what, void *arg);

static const uint8_t kv_sample_keys[4 * 32] = {
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20,
    0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0,
    0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf, 0xc0,
    0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8, 0xf7, 0xf6, 0xf5, 0xf4, 0xf3, 0xf2, 0xf1, 0xf0,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
    0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
};

static inline kv_msg kv_sample_req(uint16_t op, uint64_t id) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = op;
  m.id = id;
  return m;
}

static inline kv_msg kv_sample_rep(uint16_t op, uint64_t id) {
  kv_msg m = kv_sample_req(op, id);
  m.flags = KV_F_REPLY;
  return m;
}

/* Calls fn once per sample message. */
static inline void kv_samples(kv_sample_fn fn, void *arg) {
  static const uint8_t batch_ops[] = {KV_OP_LOOKUP, KV_OP_LOAD,         KV_OP_RELEASE,
                                      KV_OP_COMMIT, KV_OP_ABORT,        KV_OP_PREFETCH,
                                      KV_OP_DELETE, KV_OP_SET_PRIORITY, KV_OP_LOAD2};
  static const int32_t st[4] = {0, KV_ENOTFOUND, -5 /* -EIO */, KV_ECORRUPT};
  static const kv_load_ent le[4] = {
      {0, KV_G2, 4096, 65536, 0},
      {0, KV_G1, 0, 1, 0},
      {KV_ENOTFOUND, KV_TIER_NONE, 0, 0, 0},
      {-110 /* -ETIMEDOUT */, KV_TIER_NONE, 0, 0, 0},
  };
  static const kv_load_ent le2[4] = {
      {0, KV_G2, 4096, 65536, 0xE3069283u},
      {0, KV_G1, 0, 1, 0},
      {KV_ECORRUPT, KV_TIER_NONE, 0, 0, 0},
      {0, KV_G2, 1u << 30, 262144, 0xffffffffu},
  };
  static const uint32_t crcs[4] = {0xE3069283u, 0, 0xffffffffu, 0x12345678u};
  static const kv_alloc_ent ae[3] = {{0, 1u << 20}, {KV_EALLPINNED, 0}, {0, 0}};
  static const uint8_t tiers[4] = {KV_G1, KV_G2, KV_G3, KV_TIER_NONE};
  static const uint8_t has_parent[4] = {0, 1, 1, 0};
  static const uint8_t blob[300] = {1, 2, 3, [299] = 0xee};
  static const uint8_t ti_bytes[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  static const kv_tierinfo ti[2] = {{KV_G1, KV_TI_G1_VMM, 16, ti_bytes}, {KV_G2, 77, 0, NULL}};
  static const char json[] = "{\"tiers\":{\"g2\":{\"used\":1,\"cap\":2}},\"name\":\"k\\u00e9\"}";
  kv_msg m;
  uint64_t id = 1;

  /* HELLO */
  m = kv_sample_req(KV_OP_HELLO, id++);
  m.hello = (kv_hello_req){
      .ver_major = KV_PROTO_MAJOR,
      .ver_minor = KV_PROTO_MINOR,
      .caps = KV_CAP_G1,
      .tenant = {"tenant-a", 8},
      .group = {"tp-group-7", 10},
      .salt = {kv_sample_keys, 20},
      .layout = {.block_bytes = 2u << 20,
                 .tokens_per_block = 16,
                 .layers = 32,
                 .kv_heads = 8,
                 .head_dim = 128,
                 .tp_rank = 1,
                 .tp_size = 4,
                 .dtype = {"bf16", 4}},
  };
  fn(&m, "hello req", arg);
  m.hello.group = (kv_str){NULL, 0};
  m.hello.salt = (kv_bytes){NULL, 0};
  m.hello.layout.tp_rank = 0;
  m.hello.layout.tp_size = 1;
  m.hello.tenant = (kv_str){"t\xc3\xa9nant", 7};
  fn(&m, "hello req, no group, no salt", arg);

  m = kv_sample_rep(KV_OP_HELLO, 1);
  m.flags |= KV_F_FD;
  m.hello_rep = (kv_hello_rep){
      .ver_major = 1,
      .ver_minor = 0,
      .caps = 0,
      .session_id = 0x1122334455667788ull,
      .ns_id = 42,
      .arena_bytes = 1ull << 34,
      .slot_align = 4096,
      .slot_bytes = 2u << 20,
      .ntierinfo = 2,
      .tierinfo = ti,
  };
  fn(&m, "hello rep, arena fd, tier info", arg);
  m.flags = KV_F_REPLY;
  m.hello_rep.arena_bytes = 0;
  m.hello_rep.slot_align = 0;
  m.hello_rep.ntierinfo = 0;
  m.hello_rep.tierinfo = NULL;
  fn(&m, "hello rep, no arena", arg);

  /* Every batch request: empty, one short key, four full keys. */
  for (size_t i = 0; i < sizeof batch_ops; i++) {
    uint16_t op = batch_ops[i];
    m = kv_sample_req(op, id++);
    if (op == KV_OP_LOAD || op == KV_OP_LOAD2) m.batch.tier = KV_G2;
    if (op == KV_OP_PREFETCH) m.batch.tier = KV_G1;
    if (op == KV_OP_SET_PRIORITY) m.batch.prio = 200;
    fn(&m, "batch req, empty", arg);
    m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 1, .klen = 1};
    fn(&m, "batch req, one 1-byte key", arg);
    m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 4, .klen = 32};
    fn(&m, "batch req, four 32-byte keys", arg);
  }
  m = kv_sample_req(KV_OP_DELETE, id++);
  m.batch.flags = KV_DEL_ALL;
  fn(&m, "delete req, whole namespace", arg);
  /* 1.2: COMMIT with the writer's CRCs, RELEASE reporting corrupt blocks */
  m = kv_sample_req(KV_OP_COMMIT, id++);
  m.batch.flags = KV_COMMIT_CRC;
  fn(&m, "commit req with CRCs, empty", arg);
  m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 4, .klen = 32};
  m.batch.crcs = (kv_u32vec){.n = 4, .v = crcs};
  fn(&m, "commit req with CRCs, four keys", arg);
  m = kv_sample_req(KV_OP_RELEASE, id++);
  m.batch.flags = KV_REL_CORRUPT;
  m.batch.keys = (kv_keyvec){.p = kv_sample_keys, .n = 2, .klen = 16};
  fn(&m, "release req, corrupt report", arg);

  /* Replies of the batch ops. */
  m = kv_sample_rep(KV_OP_LOOKUP, 7);
  m.lookup_rep = (kv_lookup_rep){.hit_len = 3, .n = 4, .tiers = tiers};
  fn(&m, "lookup rep", arg);
  m.lookup_rep = (kv_lookup_rep){.hit_len = 0, .n = 0, .tiers = NULL};
  fn(&m, "lookup rep, empty", arg);

  m = kv_sample_rep(KV_OP_LOAD, 8);
  m.load_rep = (kv_loadvec){.n = 4, .v = le};
  fn(&m, "load rep, hits and misses", arg);
  m = kv_sample_rep(KV_OP_LOAD2, 8);
  m.load_rep = (kv_loadvec){.n = 4, .v = le2};
  fn(&m, "load2 rep, hits with CRCs and a miss", arg);
  m.load_rep = (kv_loadvec){0};
  fn(&m, "load2 rep, empty", arg);

  static const uint8_t stat_ops[] = {KV_OP_RELEASE, KV_OP_COMMIT, KV_OP_ABORT, KV_OP_SET_PRIORITY};
  for (size_t i = 0; i < sizeof stat_ops; i++) {
    m = kv_sample_rep(stat_ops[i], 9 + i);
    m.statuses = (kv_statvec){.n = 4, .v = st};
    fn(&m, "statuses rep", arg);
  }

  m = kv_sample_rep(KV_OP_PREFETCH, 20);
  m.prefetch_queued = 17;
  fn(&m, "prefetch rep", arg);

  m = kv_sample_rep(KV_OP_DELETE, 21);
  m.delete_rep = (kv_delete_rep){.deleted = 3, .st = {.n = 4, .v = st}};
  fn(&m, "delete rep", arg);
  m.delete_rep = (kv_delete_rep){.deleted = 123456789012ull};
  fn(&m, "delete rep, whole namespace", arg);

  /* ALLOC */
  m = kv_sample_req(KV_OP_ALLOC, id++);
  m.alloc = (kv_alloc_req){
      .tier = KV_G2,
      .prio = 128,
      .keys = {.p = kv_sample_keys, .n = 4, .klen = 16},
      .has_parent = has_parent,
      .parents = {.p = kv_sample_keys + 64, .n = 4, .klen = 16},
  };
  fn(&m, "alloc req, some parents", arg);
  m.alloc.has_parent = NULL;
  m.alloc.parents = (kv_keyvec){0};
  m.alloc.tier = KV_G1;
  fn(&m, "alloc req, no parents", arg);
  m.alloc.keys = (kv_keyvec){0};
  fn(&m, "alloc req, empty", arg);

  m = kv_sample_rep(KV_OP_ALLOC, 30);
  m.alloc_rep = (kv_allocvec){.n = 3, .v = ae};
  fn(&m, "alloc rep", arg);

  /* PUT, GET */
  m = kv_sample_req(KV_OP_PUT, id++);
  m.put = (kv_put_req){.prio = 5,
                       .key = {kv_sample_keys, 32},
                       .parent = {kv_sample_keys + 32, 32},
                       .data = {blob, sizeof blob}};
  fn(&m, "put req", arg);
  m.put.parent = (kv_bytes){NULL, 0};
  m.put.key = (kv_bytes){kv_sample_keys, 3};
  m.put.data = (kv_bytes){blob, 1};
  fn(&m, "put req, no parent, 1 byte", arg);
  m = kv_sample_rep(KV_OP_PUT, 31);
  fn(&m, "put rep", arg);

  m = kv_sample_req(KV_OP_GET, id++);
  m.get_key = (kv_bytes){kv_sample_keys + 8, 24};
  fn(&m, "get req", arg);
  m = kv_sample_rep(KV_OP_GET, 32);
  m.get_rep = (kv_get_rep){.tier = KV_G3, .data = {blob, sizeof blob}};
  fn(&m, "get rep", arg);

  /* STATUS */
  m = kv_sample_req(KV_OP_STATUS, id++);
  fn(&m, "status req", arg);
  m = kv_sample_rep(KV_OP_STATUS, 33);
  m.status_text = (kv_str){json, sizeof json - 1};
  fn(&m, "status rep", arg);
  m.status_text = (kv_str){NULL, 0};
  fn(&m, "status rep, empty", arg);

  /* ERROR */
  m = kv_sample_rep(KV_OP_ERROR, 34);
  m.status = KV_ENOSESSION;
  m.error = (kv_error_rep){.req_op = KV_OP_LOOKUP, .msg = {"send HELLO first", 16}};
  fn(&m, "error rep", arg);
  m.id = 0;
  m.status = KV_EBADVERSION;
  m.error = (kv_error_rep){.req_op = 0x7777, .msg = {NULL, 0}};
  fn(&m, "error rep, no request, no text", arg);

  /* G1_SELECT (1.1) */
  m = kv_sample_req(KV_OP_G1_SELECT, id++);
  memcpy(m.g1_select.uuid, kv_sample_keys + 16, KV_UUID_BYTES);
  fn(&m, "g1_select req", arg);
  static const uint8_t devx[40] = {'K', 'V', 'D', 'X', 1, 1, 0, 0, 0, 0, 0, 0x40};
  m = kv_sample_rep(KV_OP_G1_SELECT, 35);
  m.flags |= KV_F_FD;
  m.g1_pool = (kv_tierinfo){.tier = KV_G1, .kind = KV_TI_G1_VMM_FD, .len = sizeof devx, .p = devx};
  fn(&m, "g1_select rep, a pool and its fd", arg);
  m = kv_sample_rep(KV_OP_G1_SELECT, 36);
  m.g1_pool = (kv_tierinfo){
      .tier = KV_G1, .kind = KV_TI_G1_NONE, .len = 9, .p = (const uint8_t *)"no device"};
  fn(&m, "g1_select rep, none", arg);

  /* HINT (1.3) */
  m = kv_sample_req(KV_OP_HINT, id++);
  m.hint = (kv_hint_req){.kind = KV_HINT_SESSION,
                         .retain_s = 300,
                         .session = 0x8877665544332211ull,
                         .keys = {.p = kv_sample_keys, .n = 4, .klen = 32}};
  fn(&m, "hint req, session with four keys and a retention", arg);
  m.hint = (kv_hint_req){.kind = KV_HINT_FINISHED, .stop = KV_STOP_TOOL_USE, .session = 1};
  fn(&m, "hint req, finished without keys", arg);
  m.hint.keys = (kv_keyvec){.p = kv_sample_keys, .n = 1, .klen = 1};
  m.hint.stop = KV_STOP_OTHER;
  fn(&m, "hint req, finished with a key", arg);
  m.hint = (kv_hint_req){.kind = KV_HINT_END, .session = UINT64_MAX};
  fn(&m, "hint req, end", arg);
  m = kv_sample_rep(KV_OP_HINT, 37);
  m.statuses = (kv_statvec){.n = 4, .v = st};
  fn(&m, "hint rep", arg);

  /* PRESENCE (1.5) */
  m = kv_sample_req(KV_OP_PRESENCE, id++);
  fn(&m, "presence req", arg);
  m = kv_sample_rep(KV_OP_PRESENCE, 38);
  m.flags |= KV_F_FD;
  m.presence_rep = (kv_presence_rep){.bytes = 64 + (64u << 10), .flags = 3};
  fn(&m, "presence rep, a table and its fd", arg);
  /* LOAD after a lookup answered from the table (1.5) */
  m = kv_sample_req(KV_OP_LOAD2, id++);
  m.batch = (kv_batch_req){.tier = KV_G2, .flags = KV_LOAD_LOCAL,
                           .keys = {.p = kv_sample_keys, .n = 2, .klen = 32}};
  fn(&m, "load2 req, keys from a local lookup", arg);
}

#endif
