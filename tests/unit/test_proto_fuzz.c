/*
 * test_proto_fuzz.c - a short fuzz run inside the normal suite, no clang
 * needed: 200,000 inputs (random bytes, and mutations of valid encodings of
 * every opcode: bit flips, interesting values, inserted and deleted bytes,
 * splices, with the header's length patched to match or not) through the
 * decoders and the frame reader (tests/fuzz/fuzz_body.h). Deterministic:
 * the seed is fixed, and KV_FUZZ_SEED / KV_FUZZ_ITERS override it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/fuzz_body.h"
#include "../fuzz/samples.h"
#include "base/clock.h"
#include "base/le.h"
#include "ipc/sock.h"

#define SEEDS_MAX 128
#define INPUT_MAX 4096

typedef struct pool {
  uint8_t *frame[SEEDS_MAX];
  size_t len[SEEDS_MAX];
  size_t n;
} pool;

static void pool_add(const kv_msg *m, const char *what, void *arg) {
  pool *p = arg;
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, m), 0, "%s", what);
  cr_assert_lt(p->n, SEEDS_MAX);
  p->frame[p->n] = b.p; /* keeps the buffer */
  p->len[p->n] = b.len;
  p->n++;
}

static uint64_t rng;
static uint64_t next_rand(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next_rand() % n) : 0; }

static const uint32_t interesting[] = {
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    32,
    33,
    64,
    65,
    KV_BATCH_MAX,
    KV_BATCH_MAX + 1,
    KV_PAYLOAD_MAX_CTRL,
    KV_PAYLOAD_MAX_CTRL + 1,
    KV_INLINE_MAX,
    0x7fffffff,
    0x80000000,
    0xffffffff,
};
#define NINTERESTING (sizeof interesting / sizeof interesting[0])

/* Mutates buf[0..*len) in place, a few times; *len stays <= INPUT_MAX. */
static void mutate(uint8_t *buf, size_t *len, const pool *p) {
  int rounds = 1 + (int)below(4);
  for (int r = 0; r < rounds; r++) {
    size_t n = *len;
    switch (below(9)) {
    case 0: /* flip a bit */
      if (n) buf[below(n)] ^= (uint8_t)(1u << below(8));
      break;
    case 1: /* a random byte */
      if (n) buf[below(n)] = (uint8_t)next_rand();
      break;
    case 2: /* an interesting u8/u16/u32 at a random place */
      if (n >= 4) {
        size_t at = below(n - 3);
        uint32_t v = interesting[below(NINTERESTING)];
        switch (below(3)) {
        case 0: buf[at] = (uint8_t)v; break;
        case 1: kv_st16(buf + at, (uint16_t)v); break;
        default: kv_st32(buf + at, v); break;
        }
      }
      break;
    case 3: /* insert bytes */
      if (n < INPUT_MAX) {
        size_t k = 1 + below(n + 1 < 16 ? n + 1 : 16);
        if (n + k > INPUT_MAX) k = INPUT_MAX - n;
        size_t at = below(n + 1);
        memmove(buf + at + k, buf + at, n - at);
        for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)next_rand();
        *len = n + k;
      }
      break;
    case 4: /* delete bytes */
      if (n) {
        size_t at = below(n), k = 1 + below(n - at < 16 ? n - at : 16);
        memmove(buf + at, buf + at + k, n - at - k);
        *len = n - k;
      }
      break;
    case 5: /* truncate */ *len = below(n + 1); break;
    case 6: { /* splice: the tail of another seed */
      size_t s = below(p->n), from = below(p->len[s] + 1), at = below(n + 1);
      size_t k = p->len[s] - from;
      if (at + k > INPUT_MAX) k = INPUT_MAX - at;
      memcpy(buf + at, p->frame[s] + from, k);
      *len = at + k;
      break;
    }
    case 7: /* change the opcode or the reply flag, keep the body */
      if (n >= KV_HDR_SIZE) {
        if (below(2)) kv_st16(buf + 6, (uint16_t)below(KV_OP_COUNT + 2));
        else buf[8] ^= KV_F_REPLY;
      }
      break;
    default: /* duplicate a run inside the frame */
      if (n >= 2) {
        size_t from = below(n), k = 1 + below(n - from), to = below(n);
        if (to + k > n) k = n - to;
        memmove(buf + to, buf + from, k < n - from ? k : n - from);
      }
      break;
    }
  }
  /* Mostly keep the header's length honest, so the body is what is tested. */
  if (*len >= KV_HDR_SIZE && below(4) != 0) kv_st32(buf + 12, (uint32_t)(*len - KV_HDR_SIZE));
}

Test(proto_fuzz, short_run, .timeout = 120) {
  pool p = {.n = 0};
  kv_samples(pool_add, &p);
  unsigned long iters = 200000;
  uint64_t seed = 0x6b766361636865ull; /* "kvcache" */
  const char *e = getenv("KV_FUZZ_ITERS");
  if (e) iters = strtoul(e, NULL, 10);
  e = getenv("KV_FUZZ_SEED");
  if (e) seed = strtoull(e, NULL, 0);
  rng = seed ? seed : 1;
  cr_log_info("seed 0x%llx, %lu inputs, %zu seed frames", (unsigned long long)seed, iters, p.n);

  static uint8_t buf[INPUT_MAX];
  kv_fuzz_stats st;
  memset(&st, 0, sizeof st);
  char why[256];
  int64_t t0 = kv_now_ms();
  for (unsigned long i = 0; i < iters; i++) {
    size_t len;
    uint64_t kind = below(16);
    if (kind == 0) { /* random bytes, sometimes behind a valid magic and version */
      len = below(128);
      for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)next_rand();
      if (len >= 6 && below(2)) memcpy(buf, "KVCD\x01\x00", 6);
    } else if (kind == 1) { /* several valid frames back to back, one mutated */
      len = 0;
      for (int k = 0; k < 4; k++) {
        size_t s = below(p.n);
        if (len + p.len[s] > INPUT_MAX) break;
        memcpy(buf + len, p.frame[s], p.len[s]);
        len += p.len[s];
      }
      if (len) buf[below(len)] ^= (uint8_t)(1u << below(8));
    } else {
      size_t s = below(p.n);
      len = p.len[s];
      memcpy(buf, p.frame[s], len);
      mutate(buf, &len, &p);
    }
    if (kv_fuzz_one(buf, len, &st, why, sizeof why)) {
      char hex[3 * 64 + 1] = {0};
      for (size_t k = 0; k < len && k < 64; k++) snprintf(hex + 3 * k, 4, "%02x ", buf[k]);
      cr_assert_fail("input %lu (seed 0x%llx): %s; first bytes: %s", i, (unsigned long long)seed,
                     why, hex);
    }
  }
  int64_t ms = kv_now_ms() - t0;
  cr_log_info("%lu inputs in %lld ms: %lu accepted whole, %lu frames from streams; "
              "errors: badframe %lu, badversion %lu, badop %lu, msgsize %lu, 2big %lu, other %lu",
              st.inputs, (long long)ms, st.accepted, st.stream_frames, st.by_err[1], st.by_err[2],
              st.by_err[3], st.by_err[4], st.by_err[5], st.by_err[6]);
  cr_assert_eq(st.by_err[6], 0, "only the documented errors come out of the decoder");
  if (iters >= 100000) {
    /* the mutations reach past the header into every payload decoder */
    cr_assert_gt(st.accepted, iters / 50, "too few valid frames: the run is shallow");
    cr_assert_gt(st.by_err[1], iters / 10);
    cr_assert_gt(st.by_err[3], 0);
    cr_assert_gt(st.by_err[5], 0);
  }
  for (size_t i = 0; i < p.n; i++) free(p.frame[i]);
}
