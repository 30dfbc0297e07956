/*
 * fuzz_body.h - what every fuzz input goes through, shared by the libFuzzer
 * target (fuzz_decode.c) and the in-suite driver (test_proto_fuzz.c).
 *
 * An input is taken three ways: as one frame (kv_msg_decode), as a header
 * (kv_hdr_parse), and as a byte stream cut into chunks and fed to a frame
 * reader, each frame it yields decoded in turn. The properties checked:
 * nothing crashes or reads out of bounds (the sanitizers see to that), and
 * every frame the decoder accepts is re-encoded to exactly its own bytes,
 * which also proves the decoded struct self-consistent: its counts,
 * lengths and pointers describe the frame and nothing else.
 * Header-only, for tests/unit and tests/fuzz.
 */
#ifndef KV_TESTS_FUZZ_BODY_H
#define KV_TESTS_FUZZ_BODY_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ipc/reader.h"
#include "proto/wire.h"

typedef struct kv_fuzz_stats {
  unsigned long inputs, accepted, stream_frames;
  unsigned long by_err[8]; /* 0 ok, BADFRAME, BADVERSION, BADOP, EMSGSIZE, E2BIG, other */
} kv_fuzz_stats;

static inline void kv_fuzz_count(kv_fuzz_stats *s, int rc) {
  if (!s) return;
  int i = rc == 0                ? 0
          : rc == KV_EBADFRAME   ? 1
          : rc == KV_EBADVERSION ? 2
          : rc == KV_EBADOP      ? 3
          : rc == -EMSGSIZE      ? 4
          : rc == -E2BIG         ? 5
                                 : 6;
  s->by_err[i]++;
}

/* Decodes frame[0..n); when accepted, re-encodes and compares. 0, or -1
 * with a message in why on a broken property. */
static inline int kv_fuzz_frame(const uint8_t *frame, size_t n, kv_buf *scratch, kv_fuzz_stats *s,
                                char *why, size_t whylen) {
  kv_msg m;
  int rc = kv_msg_decode(frame, n, &m);
  kv_fuzz_count(s, rc);
  if (rc > 0) {
    snprintf(why, whylen, "decode returned %d > 0", rc);
    return -1;
  }
  if (rc) return 0;
  if (s) s->accepted++;
  kv_buf_reset(scratch);
  rc = kv_msg_encode(scratch, &m);
  if (rc) {
    snprintf(why, whylen, "accepted %s frame of %zu bytes does not re-encode: %s",
             kv_op_name(m.op) ? kv_op_name(m.op) : "?", n, kv_strerror(rc));
    return -1;
  }
  if (scratch->len != n || memcmp(scratch->p, frame, n)) {
    snprintf(why, whylen, "accepted %s frame of %zu bytes re-encodes to %zu other bytes",
             kv_op_name(m.op) ? kv_op_name(m.op) : "?", n, scratch->len);
    return -1;
  }
  return 0;
}

/* The whole input through every entry point. 0, or -1 with why set. */
static inline int kv_fuzz_one(const uint8_t *data, size_t size, kv_fuzz_stats *s, char *why,
                              size_t whylen) {
  kv_buf scratch;
  kv_hdr h;
  int ret = 0;
  kv_buf_init(&scratch);
  if (s) s->inputs++;

  if (kv_fuzz_frame(data, size, &scratch, s, why, whylen)) {
    ret = -1;
    goto out;
  }
  int rc = kv_hdr_parse(data, size, &h);
  if (rc == 0 && h.len > kv_payload_max(h.op, h.flags & KV_F_REPLY)) {
    snprintf(why, whylen, "header accepted with length %u over the limit", (unsigned)h.len);
    ret = -1;
    goto out;
  }

  /* As a stream, in chunks whose sizes come from the input itself. */
  kv_reader rd;
  kv_reader_init(&rd, 1u << 16);
  size_t off = 0, k = 0;
  while (off < size) {
    size_t chunk = 1 + (size_t)data[k++ % size] % 61;
    if (chunk > size - off) chunk = size - off;
    rc = kv_reader_feed(&rd, data + off, chunk);
    off += chunk;
    if (rc) break;
    kv_frame f;
    while ((rc = kv_reader_next(&rd, &f)) == 1) {
      if (s) s->stream_frames++;
      if (f.fd != -1 || f.len != KV_HDR_SIZE + (size_t)f.hdr.len || f.hdr.len > rd.max_payload) {
        snprintf(why, whylen, "reader yielded an inconsistent frame");
        ret = -1;
        break;
      }
      if (kv_fuzz_frame(f.p, f.len, &scratch, NULL, why, whylen)) {
        ret = -1;
        break;
      }
    }
    if (ret || rc < 0) break;
  }
  kv_reader_free(&rd);
out:
  kv_buf_free(&scratch);
  return ret;
}

#endif
