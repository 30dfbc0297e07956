/* test_codec.c - the lossless 16-bit block codec (tiers/codec.h): round
 * trips on a trained model's real KV (bench/kv, BF16 and FP16) cut into
 * 4 KiB, 64 KiB and 256 KiB blocks, on zeros and on every length and
 * capacity boundary; random bytes answered "no gain"; refusals of odd and
 * out-of-range lengths; and damage: every value of every header byte,
 * thousands of random flips, cuts and extensions of the body, headers that
 * claim huge or wrapping lengths, zstd planes of the wrong size, trailing
 * or skippable frames - each -EBADMSG or (a flip zstd cannot see) exactly n
 * wrong bytes, never a byte written past dst + n. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/le.h"
#include "tests/lib/g3.h"
#include "tiers/codec.h"

#define GUARD     64   /* canary bytes after every decode buffer */
#define CANARY    0xA5
#define KV_DIR    KV_SOURCE_DIR "/bench/kv/"
#define BF16_FILE KV_DIR "smollm2-135m.bf16.safetensors"
#define F16_FILE  KV_DIR "smollm2-135m.f16.safetensors"

/* The same, for a test that needs only its first MiB. */
static uint8_t *kv_mib(const char *path) {
  size_t total;
  uint8_t *d = t_kv_data(path, &total);
  cr_assert(total >= (1u << 20), "%s: %zu bytes", path, total);
  return d;
}

static kv_codec *codec(void) {
  kv_codec *c = kv_codec_new(0);
  cr_assert(c);
  return c;
}

/* Decodes stored[0..len) as n bytes into a buffer with a canary after it;
 * checks the canary and returns decode's answer, the bytes in out[0..n). */
static int decode_guarded(kv_codec *c, const uint8_t *stored, size_t len, uint8_t *out, size_t n) {
  memset(out + n, CANARY, GUARD);
  int rc = kv_codec_decode(c, stored, len, out, n);
  for (size_t i = 0; i < GUARD; i++) cr_assert_eq(out[n + i], CANARY, "a write past dst + n");
  return rc;
}

/* Encodes src[0..n), which must compress, decodes it back and compares;
 * returns the stored length. */
static long round_trip(kv_codec *c, const uint8_t *src, size_t n) {
  uint8_t *st = malloc(kv_codec_bound(n));
  uint8_t *back = malloc(n + GUARD);
  long len = kv_codec_encode(c, src, n, st, kv_codec_bound(n));
  cr_assert(len >= (long)KV_CODEC_HDR_LEN && len < (long)n, "n %zu: encode %ld", n, len);
  cr_assert_eq(kv_codec_stored_n(st, (size_t)len), (long)n);
  cr_assert_eq(decode_guarded(c, st, (size_t)len, back, n), 0, "n %zu", n);
  cr_assert_eq(memcmp(back, src, n), 0, "n %zu: the bytes back differ", n);
  free(st);
  free(back);
  return len;
}

Test(codec, name_and_bound) {
  cr_assert_str_eq(kv_codec_name(), "zstd-planes");
  cr_assert_eq(kv_codec_bound(0), 0u);
  cr_assert_eq(kv_codec_bound(3), 0u);
  cr_assert_eq(kv_codec_bound(2), 1u);
  cr_assert_eq(kv_codec_bound(65536), 65535u);
  cr_assert_eq(kv_codec_bound((size_t)KV_CODEC_LEN_MAX + 2), 0u);
  cr_assert_null(kv_codec_new(ZSTD_maxCLevel() + 1));
  kv_codec_free(NULL);
}

static void real_kv(const char *path, double max_ratio) {
  size_t total;
  uint8_t *d = t_kv_data(path, &total);
  kv_codec *c = codec();
  size_t sizes[] = {4096, 65536, 262144};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t bs = sizes[s], in = 0, out = 0, blocks = 0;
    for (size_t off = 0; off + bs <= total; off += bs, blocks++) {
      out += (size_t)round_trip(c, d + off, bs);
      in += bs;
    }
    cr_assert(blocks >= 7, "%s: %zu blocks of %zu", path, blocks, bs);
    double ratio = (double)out / (double)in;
    cr_log_info("%s: %zu blocks of %zu bytes: stored/raw %.3f", path, blocks, bs, ratio);
    cr_assert(ratio < max_ratio, "%s, %zu-byte blocks: stored/raw %.3f", path, bs, ratio);
    /* the file's last, partial block too */
    if (total % bs) round_trip(c, d + total - total % bs, total % bs);
  }
  round_trip(c, d, total); /* and the whole array as one block */
  kv_codec_free(c);
  free(d);
}

/* The ratios stay close to those measured (BF16 about 0.68, FP16 0.86). */
Test(codec, real_kv_bf16) { real_kv(BF16_FILE, 0.75); }
Test(codec, real_kv_f16) { real_kv(F16_FILE, 0.92); }

Test(codec, zeros) {
  kv_codec *c = codec();
  size_t sizes[] = {64, 4096, 65536, 262144, 1 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint8_t *z = calloc(1, sizes[i]);
    long len = round_trip(c, z, sizes[i]);
    cr_assert(len < 256, "%zu zeros stored in %ld bytes", sizes[i], len);
    free(z);
  }
  kv_codec_free(c);
}

static void fill_random(uint8_t *p, size_t n, unsigned seed) {
  srand(seed);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rand() >> 7);
}

Test(codec, random_bytes_do_not_compress) {
  kv_codec *c = codec();
  size_t sizes[] = {2, 26, 4096, 65536, 262144};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    uint8_t *r = malloc(n), *st = malloc(n + 1024);
    fill_random(r, n, (unsigned)i + 1);
    cr_assert_eq(kv_codec_encode(c, r, n, st, n + 1024), KV_CODEC_NOGAIN, "n %zu", n);
    cr_assert_eq(kv_codec_encode(c, r, n, st, n - 1), KV_CODEC_NOGAIN, "n %zu", n);
    free(r);
    free(st);
  }
  kv_codec_free(c);
}

Test(codec, refused_lengths_and_arguments) {
  kv_codec *c = codec();
  uint8_t b[64] = {0}, st[64];
  cr_assert_eq(kv_codec_encode(c, b, 0, st, sizeof st), -EINVAL);
  cr_assert_eq(kv_codec_encode(c, b, 33, st, sizeof st), -EINVAL);
  cr_assert_eq(kv_codec_encode(c, b, 1, st, sizeof st), -EINVAL);
  /* refused before a byte of src is read */
  cr_assert_eq(kv_codec_encode(c, b, (size_t)KV_CODEC_LEN_MAX + 2, st, sizeof st), -EINVAL);
  cr_assert_eq(kv_codec_encode(NULL, b, 64, st, sizeof st), -EINVAL);
  cr_assert_eq(kv_codec_encode(c, NULL, 64, st, sizeof st), -EINVAL);
  cr_assert_eq(kv_codec_encode(c, b, 64, NULL, sizeof st), -EINVAL);
  long len = kv_codec_encode(c, b, 64, st, sizeof st);
  cr_assert(len > 0);
  uint8_t out[64];
  cr_assert_eq(kv_codec_decode(c, st, (size_t)len, out, 63), -EINVAL);
  cr_assert_eq(kv_codec_decode(c, st, (size_t)len, out, 0), -EINVAL);
  cr_assert_eq(kv_codec_decode(c, st, (size_t)len, out, (size_t)KV_CODEC_LEN_MAX + 2), -EINVAL);
  cr_assert_eq(kv_codec_decode(NULL, st, (size_t)len, out, 64), -EINVAL);
  cr_assert_eq(kv_codec_decode(c, NULL, (size_t)len, out, 64), -EINVAL);
  /* another n than stored: refused, whichever way */
  uint8_t big[128 + GUARD];
  cr_assert_eq(decode_guarded(c, st, (size_t)len, big, 62), -EBADMSG);
  cr_assert_eq(decode_guarded(c, st, (size_t)len, big, 66), -EBADMSG);
  cr_assert_eq(decode_guarded(c, st, (size_t)len, big, 128), -EBADMSG);
  cr_assert_eq(kv_codec_stored_n(st, KV_CODEC_HDR_LEN - 1), -EBADMSG);
  cr_assert_eq(kv_codec_stored_n(b, sizeof b), -EBADMSG);
  kv_codec_free(c);
}

/* Every even length from 2 to 1 KiB, and some past 64 KiB, of zeros and of
 * real KV: compressed and back, or "no gain"; never anything else. At each
 * stored length L, a cap of L works and gives the same bytes, a cap of
 * L - 1 is -ENOSPC. */
Test(codec, every_length_and_capacity) {
  size_t total;
  uint8_t *kv = t_kv_data(BF16_FILE, &total);
  uint8_t *zero = calloc(1, 70000);
  kv_codec *c = codec();
  uint8_t *st = malloc(70000), *st2 = malloc(70000), *back = malloc(70000 + GUARD);
  size_t extra[] = {65534, 65536, 65538, 69998};
  for (int src = 0; src < 2; src++)
    for (size_t i = 0; i < 512 + 4; i++) {
      size_t n = i < 512 ? 2 * (i + 1) : extra[i - 512];
      const uint8_t *in = src ? kv + 4096 : zero;
      long len = kv_codec_encode(c, in, n, st, kv_codec_bound(n));
      if (len == KV_CODEC_NOGAIN) {
        cr_assert(src == 1 || n < 64, "n %zu zeros: no gain", n);
        continue;
      }
      cr_assert(len >= (long)KV_CODEC_HDR_LEN + 2 && len < (long)n, "n %zu: %ld", n, len);
      cr_assert_eq(decode_guarded(c, st, (size_t)len, back, n), 0, "n %zu", n);
      cr_assert_eq(memcmp(back, in, n), 0, "n %zu", n);
      cr_assert_eq(kv_codec_encode(c, in, n, st2, (size_t)len), len, "n %zu, cap %ld", n, len);
      cr_assert_eq(memcmp(st, st2, (size_t)len), 0);
      cr_assert_eq(kv_codec_encode(c, in, n, st2, (size_t)len - 1), -ENOSPC, "n %zu", n);
    }
  /* the smallest n that can gain: header and a byte per plane */
  cr_assert_eq(kv_codec_encode(c, zero, KV_CODEC_HDR_LEN + 2, st, 100), KV_CODEC_NOGAIN);
  free(st);
  free(st2);
  free(back);
  kv_codec_free(c);
  free(zero);
  free(kv);
}

/* One context for many sizes in turn, encode and decode interleaved. */
Test(codec, context_reuse) {
  uint8_t *kv = kv_mib(F16_FILE);
  kv_codec *c = codec();
  size_t sizes[] = {262144, 4096, (1 << 20) - 16, 4000, 65536, 262144};
  for (int r = 0; r < 3; r++)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) round_trip(c, kv + 2 * i, sizes[i]);
  kv_codec_free(c);
  free(kv);
}

/* Stored bytes of any level decode with any context: the format does not
 * depend on it. */
Test(codec, levels) {
  uint8_t *kv = kv_mib(BF16_FILE);
  kv_codec *dec = codec();
  int levels[] = {1, 3, 9, -1};
  uint8_t *st = malloc(65536), *back = malloc(65536 + GUARD);
  for (size_t i = 0; i < sizeof levels / sizeof *levels; i++) {
    kv_codec *c = kv_codec_new(levels[i]);
    cr_assert(c, "level %d", levels[i]);
    long len = kv_codec_encode(c, kv, 65536, st, 65535);
    cr_assert(len > 0, "level %d: %ld", levels[i], len);
    cr_assert_eq(decode_guarded(dec, st, (size_t)len, back, 65536), 0);
    cr_assert_eq(memcmp(back, kv, 65536), 0, "level %d", levels[i]);
    kv_codec_free(c);
  }
  free(st);
  free(back);
  kv_codec_free(dec);
  free(kv);
}

/* A compressed sample: n bytes of real BF16 KV (src), its stored bytes
 * (st[0..len): plane 0 in zstd), a buffer to decode into (back, n bytes
 * and the canary) and the context. */
typedef struct sample {
  kv_codec *c;
  uint8_t *src, *st, *back;
  size_t n, len;
} sample;

static sample sample_new(size_t n) {
  sample s = {.c = codec(), .n = n, .st = malloc(n), .back = malloc(n + GUARD)};
  size_t total;
  s.src = t_kv_data(BF16_FILE, &total);
  cr_assert(total >= n);
  long l = kv_codec_encode(s.c, s.src, n, s.st, n);
  cr_assert(l > 0);
  cr_assert_eq(s.st[20], 1, "plane 0 is zstd");
  s.len = (size_t)l;
  return s;
}

static void sample_free(sample *s) {
  free(s->back);
  free(s->st);
  free(s->src);
  kv_codec_free(s->c);
}

static size_t hand_made(uint8_t *out, size_t n, const uint8_t *p0, size_t l0, int c0,
                        const uint8_t *p1, size_t l1, int c1);

/* Every value of every header byte: -EBADMSG. */
Test(codec, every_header_byte_value) {
  sample s = sample_new(4096);
  kv_codec *c = s.c;
  uint8_t *st = s.st, *back = s.back;
  size_t n = s.n, len = s.len;
  for (size_t i = 0; i < KV_CODEC_HDR_LEN; i++)
    for (int x = 1; x < 256; x++) {
      st[i] ^= (uint8_t)x;
      cr_assert_eq(decode_guarded(c, st, len, back, n), -EBADMSG, "byte %zu ^ %d", i, x);
      st[i] ^= (uint8_t)x;
    }
  cr_assert_eq(decode_guarded(c, st, len, back, n), 0);
  cr_assert_eq(memcmp(back, s.src, n), 0);
  /* and where both planes are zstd frames (zeros) */
  memset(s.src, 0, n);
  long zl = kv_codec_encode(c, s.src, n, st, n - 1);
  cr_assert(zl > 0 && st[20] == 1 && st[21] == 1);
  for (size_t i = 0; i < KV_CODEC_HDR_LEN; i++)
    for (int x = 1; x < 256; x++) {
      st[i] ^= (uint8_t)x;
      cr_assert_eq(decode_guarded(c, st, (size_t)zl, back, n), -EBADMSG, "byte %zu ^ %d", i, x);
      st[i] ^= (uint8_t)x;
    }
  sample_free(&s);
}

/* A valid header over garbage: plane 0 a zstd magic then random bytes,
 * plane 1 raw; zstd's decoder fed noise answers -EBADMSG (or, rarely, n
 * bytes), never a byte past dst + n. */
Test(codec, garbage_frames) {
  kv_codec *c = codec();
  size_t n = 8192, h = n / 2;
  uint8_t *out = malloc(KV_CODEC_HDR_LEN + 2 * h), *back = malloc(n + GUARD);
  uint8_t *noise = malloc(h), *raw = calloc(1, h);
  srand(11);
  int refused = 0;
  for (int it = 0; it < 3000; it++) {
    size_t l0 = 4 + (size_t)rand() % (h - 4);
    kv_st32(noise, ZSTD_MAGICNUMBER);
    for (size_t i = 4; i < l0; i++) noise[i] = (uint8_t)rand();
    if (it % 2) noise[4] = 0x20; /* a frame header of a single segment: reach the blocks */
    size_t len = hand_made(out, n, noise, l0, 1, raw, h, 0);
    int rc = decode_guarded(c, out, len, back, n);
    cr_assert(rc == 0 || rc == -EBADMSG, "rc %d", rc);
    refused += rc != 0;
  }
  cr_log_info("3000 garbage frames: %d refused", refused);
  free(out);
  free(back);
  free(noise);
  free(raw);
  kv_codec_free(c);
}

/* Random damage to the body, random cuts and extensions: never a byte
 * past dst + n; a cut or an extension is always -EBADMSG; a flip is
 * -EBADMSG or n bytes (wrong: the caller's CRC of the block catches it). */
Test(codec, random_damage) {
  sample s = sample_new(65536);
  kv_codec *c = s.c;
  uint8_t *st = s.st, *src = s.src, *back = s.back;
  size_t n = s.n, len = s.len;
  uint8_t *bad = malloc(len + 256);
  srand(7);
  int refused = 0, wrong = 0;
  for (int it = 0; it < 3000; it++) {
    memcpy(bad, st, len);
    int flips = 1 + rand() % 4;
    for (int f = 0; f < flips; f++) {
      size_t at = KV_CODEC_HDR_LEN + (size_t)rand() % (len - KV_CODEC_HDR_LEN);
      bad[at] ^= (uint8_t)(1 + rand() % 255);
    }
    int rc = decode_guarded(c, bad, len, back, n);
    cr_assert(rc == 0 || rc == -EBADMSG, "rc %d", rc);
    if (rc) refused++;
    else if (memcmp(back, src, n)) wrong++;
  }
  cr_log_info("3000 damaged bodies: %d refused, %d decoded wrong", refused, wrong);
  for (int it = 0; it < 1000; it++) {
    size_t cut = (size_t)rand() % len;
    memcpy(bad, st, cut);
    cr_assert_eq(decode_guarded(c, bad, cut, back, n), -EBADMSG, "cut at %zu", cut);
    size_t more = 1 + (size_t)rand() % 256;
    memcpy(bad, st, len);
    for (size_t i = 0; i < more; i++) bad[len + i] = (uint8_t)rand();
    cr_assert_eq(decode_guarded(c, bad, len + more, back, n), -EBADMSG, "%zu more", more);
  }
  /* every cut near the ends */
  for (size_t cut = 0; cut < 64; cut++) {
    cr_assert_eq(decode_guarded(c, st, cut, back, n), -EBADMSG);
    cr_assert_eq(decode_guarded(c, st, len - 1 - cut, back, n), -EBADMSG);
  }
  free(bad);
  sample_free(&s);
}

/* Headers that claim what the bytes are not: huge lengths, plane lengths
 * whose 32-bit sum wraps to the right total, a length of n with another
 * caller's n. */
Test(codec, hostile_lengths) {
  sample s = sample_new(4096);
  kv_codec *c = s.c;
  uint8_t *st = s.st, *back = s.back;
  size_t n = s.n, len = s.len;
  uint32_t body = (uint32_t)(len - KV_CODEC_HDR_LEN);
  uint32_t p0 = kv_ld32(st + 12), p1 = kv_ld32(st + 16);
  struct { uint32_t n, p0, p1; } h[] = {
      {0xFFFFFFFFu, p0, p1},        {(uint32_t)n, 0xFFFFFFFFu, body + 1},
      {(uint32_t)n, body + 1, 0xFFFFFFFFu}, {(uint32_t)n, 0x80000000u, body + 0x80000000u},
      {(uint32_t)n, 0, body},       {(uint32_t)n, body, 0},
      {(uint32_t)n, p0 + 1, p1 - 1}, {(uint32_t)n, p0 - 1, p1 + 1},
      {0x40000000u, p0, p1},        {0, p0, p1},
  };
  for (size_t i = 0; i < sizeof h / sizeof *h; i++) {
    kv_st32(st + 8, h[i].n);
    kv_st32(st + 12, h[i].p0);
    kv_st32(st + 16, h[i].p1);
    cr_assert_eq(decode_guarded(c, st, len, back, n), -EBADMSG, "case %zu", i);
  }
  sample_free(&s);
}

/* Stored bytes made by hand around real zstd frames: planes of the wrong
 * size, a frame then another, a skippable frame, a raw plane marked zstd. */
static size_t hand_made(uint8_t *out, size_t n, const uint8_t *p0, size_t l0, int c0,
                        const uint8_t *p1, size_t l1, int c1) {
  kv_st32(out, KV_CODEC_MAGIC);
  out[4] = KV_CODEC_VERSION;
  out[5] = KV_CODEC_ZSTD_PLANES;
  out[6] = 2;
  out[7] = 2;
  kv_st32(out + 8, (uint32_t)n);
  kv_st32(out + 12, (uint32_t)l0);
  kv_st32(out + 16, (uint32_t)l1);
  out[20] = (uint8_t)c0;
  out[21] = (uint8_t)c1;
  out[22] = out[23] = 0;
  memcpy(out + KV_CODEC_HDR_LEN, p0, l0);
  memcpy(out + KV_CODEC_HDR_LEN + l0, p1, l1);
  return KV_CODEC_HDR_LEN + l0 + l1;
}

Test(codec, wrong_frames) {
  kv_codec *c = codec();
  size_t n = 4096, h = n / 2;
  uint8_t plane[4096] = {0}, back[4096 + GUARD], out[3 * 4096], zf[1024], zf2[1024];
  size_t cap = sizeof zf;
  size_t z = ZSTD_compress(zf, cap, plane, h, 1);
  cr_assert(!ZSTD_isError(z));
  size_t len = hand_made(out, n, zf, z, 1, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), 0, "the hand-made sample is good");
  size_t sizes[] = {h - 1, h + 1, 0, 2 * h, 1 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint8_t *big = calloc(1, sizes[i] + 1);
    size_t zb = ZSTD_compress(zf2, sizeof zf2, big, sizes[i], 1);
    cr_assert(!ZSTD_isError(zb));
    len = hand_made(out, n, zf2, zb, 1, plane, h, 0);
    cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG, "a plane of %zu", sizes[i]);
    len = hand_made(out, n, plane, h, 0, zf2, zb, 1);
    cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG, "a plane of %zu", sizes[i]);
    free(big);
  }
  /* two frames of h/2 each: n bytes, but not one frame */
  size_t za = ZSTD_compress(zf2, sizeof zf2, plane, h / 2, 1);
  memcpy(zf2 + za, zf2, za);
  len = hand_made(out, n, zf2, 2 * za, 1, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG, "two frames");
  /* a frame then a skippable frame; a skippable frame then a frame */
  uint8_t skip[16];
  kv_st32(skip, ZSTD_MAGIC_SKIPPABLE_START);
  kv_st32(skip + 4, 8);
  memset(skip + 8, 0, 8);
  memcpy(zf2, zf, z);
  memcpy(zf2 + z, skip, sizeof skip);
  len = hand_made(out, n, zf2, z + sizeof skip, 1, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG, "a skippable frame after");
  memcpy(zf2, skip, sizeof skip);
  memcpy(zf2 + sizeof skip, zf, z);
  len = hand_made(out, n, zf2, z + sizeof skip, 1, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG, "a skippable frame first");
  /* both planes raw: fine (a writer never makes it at this n, a reader
   * takes it); a raw plane marked zstd, a zstd plane marked raw: refused */
  len = hand_made(out, n, plane, h, 0, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), 0);
  len = hand_made(out, n, plane, h, 1, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG);
  len = hand_made(out, n, zf, z, 0, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG);
  len = hand_made(out, n, zf, z, 2, plane, h, 0);
  cr_assert_eq(decode_guarded(c, out, len, back, n), -EBADMSG);
  kv_codec_free(c);
}
