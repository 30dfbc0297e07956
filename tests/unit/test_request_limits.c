/* test_request_limits.c - the protocol's per-opcode request limits match
 * the message layouts, and the frame reader's owner check runs on a
 * header before any room is made for its payload. */
#include <criterion/criterion.h>
#include <errno.h>

#include "base/errors.h"
#include "ipc/reader.h"
#include "proto/wire.h"

/* One timeout for every test, as in test_frame_limits.c. */
TestSuite(frame_limits, .timeout = 120);

/* The payload length of m's frame (bulk tails included, not copied). */
static uint32_t payload_len(const kv_msg *m) {
  kv_buf b;
  kv_bytes tail;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode_head(&b, m, &tail), 0, "encode %s", kv_op_name(m->op));
  size_t n = b.len + tail.len - KV_HDR_SIZE;
  kv_buf_free(&b);
  return (uint32_t)n;
}

Test(frame_limits, request_limits_are_the_largest_messages) {
  static uint8_t keys[KV_BATCH_MAX * KV_KEY_MAX], has_parent[KV_BATCH_MAX];
  static char s64[64];
  memset(keys, 7, sizeof keys);
  memset(has_parent, 1, sizeof has_parent);
  memset(s64, 'a', sizeof s64);
  kv_keyvec kv = {.p = keys, .n = KV_BATCH_MAX, .klen = KV_KEY_MAX};
  kv_msg m = {.op = KV_OP_HELLO, .id = 1};
  m.hello = (kv_hello_req){
      .ver_major = 1,
      .tenant = {s64, KV_TENANT_MAX},
      .group = {s64, KV_GROUP_MAX},
      .salt = {(const uint8_t *)s64, KV_SALT_MAX},
      .layout = {
          .block_bytes = 1, .tokens_per_block = 1, .tp_size = 1, .dtype = {s64, KV_DTYPE_MAX}}};
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_HELLO));
  uint16_t batch_ops[] = {KV_OP_LOOKUP,   KV_OP_LOAD,   KV_OP_LOAD2,
                          KV_OP_RELEASE,  KV_OP_COMMIT, KV_OP_ABORT,
                          KV_OP_PREFETCH, KV_OP_DELETE, KV_OP_SET_PRIORITY};
  static uint32_t crcs[KV_BATCH_MAX];
  for (size_t i = 0; i < sizeof batch_ops / sizeof batch_ops[0]; i++) {
    m = (kv_msg){.op = batch_ops[i], .id = 1};
    m.batch.keys = kv;
    if (m.op == KV_OP_LOAD || m.op == KV_OP_LOAD2 || m.op == KV_OP_PREFETCH) m.batch.tier = KV_G2;
    if (m.op == KV_OP_COMMIT) { /* at its largest: a writer's CRC per key */
      m.batch.flags = KV_COMMIT_CRC;
      m.batch.crcs = (kv_u32vec){.n = KV_BATCH_MAX, .v = crcs};
    }
    cr_assert_eq(payload_len(&m), kv_req_payload_max(m.op), "%s", kv_op_name(m.op));
  }
  m = (kv_msg){.op = KV_OP_ALLOC, .id = 1};
  m.alloc = (kv_alloc_req){.tier = KV_G2, .keys = kv, .has_parent = has_parent, .parents = kv};
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_ALLOC));
  m = (kv_msg){.op = KV_OP_PUT, .id = 1};
  static uint8_t block[1];
  m.put = (kv_put_req){.key = {keys, KV_KEY_MAX},
                       .parent = {keys, KV_KEY_MAX},
                       .data = {block, KV_INLINE_MAX}}; /* the tail is never read */
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_PUT));
  cr_assert_eq(kv_req_payload_max(KV_OP_PUT), KV_PUT_OVERHEAD + KV_INLINE_MAX);
  m = (kv_msg){.op = KV_OP_GET, .id = 1};
  m.get_key = (kv_bytes){keys, KV_KEY_MAX};
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_GET));
  m = (kv_msg){.op = KV_OP_STATUS, .id = 1};
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_STATUS));
  m = (kv_msg){.op = KV_OP_G1_SELECT, .id = 1};
  cr_assert_eq(payload_len(&m), kv_req_payload_max(KV_OP_G1_SELECT));
  for (uint16_t op = 0; op < KV_OP_COUNT + 2; op++)
    cr_assert_leq(kv_req_payload_max(op), kv_payload_max(op, 0), "op %u", op);
  cr_assert_eq(kv_req_payload_max(KV_OP_ERROR), 0);
  cr_assert_eq(kv_req_payload_max(0), 0);
  cr_assert_eq(kv_req_payload_max(KV_OP_COUNT), 0);
}

static int calls;
static int refuse_over_100(void *arg, const kv_hdr *h) {
  calls++;
  return h->len > 100 ? -EMSGSIZE : 0;
}

Test(frame_limits, the_reader_checks_a_header_before_making_room) {
  kv_hdr h = {.magic = KV_PROTO_MAGIC,
              .version = KV_PROTO_MAJOR,
              .op = KV_OP_PUT,
              .id = 9,
              .len = 64u << 20};
  uint8_t hb[KV_HDR_SIZE];
  kv_hdr_write(hb, &h);
  /* Without a check the reader makes room for the whole frame. */
  kv_reader rd;
  kv_reader_init(&rd, 0);
  cr_assert_eq(kv_reader_feed(&rd, hb, sizeof hb), 0);
  void *p;
  size_t len;
  cr_assert_eq(kv_reader_space(&rd, &p, &len), 0);
  cr_assert_geq(rd.cap, (size_t)KV_HDR_SIZE + (64u << 20));
  kv_reader_free(&rd);
  /* With one, the header is refused as it arrives, and stays refused. */
  kv_reader_init(&rd, 0);
  kv_reader_set_check(&rd, refuse_over_100, NULL);
  cr_assert_eq(kv_reader_feed(&rd, hb, sizeof hb), -EMSGSIZE);
  cr_assert_gt(calls, 0);
  cr_assert_eq(kv_reader_space(&rd, &p, &len), -EMSGSIZE);
  kv_frame f;
  cr_assert_eq(kv_reader_next(&rd, &f), -EMSGSIZE);
  cr_assert_leq(rd.cap, 64u << 10, "room was made: %zu bytes", rd.cap);
  kv_reader_free(&rd);
  /* A frame within the limit passes. */
  kv_reader_init(&rd, 0);
  kv_reader_set_check(&rd, refuse_over_100, NULL);
  h.op = KV_OP_STATUS;
  h.len = 1;
  kv_hdr_write(hb, &h);
  uint8_t frame[KV_HDR_SIZE + 1] = {0};
  memcpy(frame, hb, sizeof hb);
  cr_assert_eq(kv_reader_feed(&rd, frame, sizeof frame), 0);
  cr_assert_eq(kv_reader_next(&rd, &f), 1);
  cr_assert_eq(f.hdr.op, KV_OP_STATUS);
  kv_reader_free(&rd);
}
