/* test_quant.c - FP8 (E4M3) and INT8 codes of 16-bit KV blocks with
 * per-group scales (tiers/quant.h): the E4M3 conversion against its
 * definition (every code, the rounding between codes, saturation,
 * subnormals), each block's error within the bound quant.h states, on
 * synthetic and on real KV (bench/kv), and the refusals. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/le.h"
#include "tiers/quant.h"

/* E4M3 by its definition: sign, exponent e (bias 7), mantissa m. */
static float e4m3_def(unsigned c) {
  unsigned e = (c >> 3) & 15, m = c & 7;
  double v = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : m / 512.0;
  return (float)(c & 0x80 ? -v : v);
}

Test(quant, e4m3_codes_are_the_formats_values) {
  for (unsigned c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) {
      cr_assert(isnan(kv_fp8_e4m3_value((uint8_t)c)));
      continue;
    }
    float v = kv_fp8_e4m3_value((uint8_t)c);
    cr_assert_eq(v, e4m3_def(c), "code 0x%02x", c);
    if (c != 0x80) cr_assert_eq(kv_fp8_e4m3(v), c, "code 0x%02x round trip", c);
  }
  cr_assert_eq(kv_fp8_e4m3(1.0f), 0x38);
  cr_assert_eq(kv_fp8_e4m3(448.0f), 0x7e);
  cr_assert_eq(kv_fp8_e4m3(-448.0f), 0xfe);
  cr_assert_eq(kv_fp8_e4m3(1e9f), 0x7e, "saturates");
  cr_assert_eq(kv_fp8_e4m3(INFINITY), 0x7e);
  cr_assert_eq(kv_fp8_e4m3(NAN), 0x7f);
  cr_assert_eq(kv_fp8_e4m3(1.0f / 512), 0x01, "the smallest subnormal");
  cr_assert_eq(kv_fp8_e4m3(1.0f / 1024), 0x00, "half of it: a tie, to even (0)");
  cr_assert_eq(kv_fp8_e4m3(3.0f / 1024), 0x02, "a tie between 1 and 2: to even");
}

/* Between two neighbouring positive codes, a value rounds to the nearer,
 * and a tie to the even code. */
Test(quant, e4m3_rounds_to_nearest_ties_to_even) {
  for (unsigned c = 0; c < 0x7e; c++) {
    float lo = e4m3_def(c), hi = e4m3_def(c + 1), mid = (lo + hi) / 2;
    cr_assert_eq(kv_fp8_e4m3(nextafterf(mid, lo)), c, "just below the middle of 0x%02x", c);
    cr_assert_eq(kv_fp8_e4m3(nextafterf(mid, hi)), c + 1, "just above the middle of 0x%02x", c);
    cr_assert_eq(kv_fp8_e4m3(mid), c % 2 ? c + 1 : c, "the middle of 0x%02x", c);
    cr_assert_eq(kv_fp8_e4m3(-mid), 0x80 | (c % 2 ? c + 1 : c));
  }
}

/* Gaussian-ish values with a few outliers, as K and V have. */
static float sample(unsigned i) {
  unsigned h = i * 2654435761u;
  float u = ((h >> 8) & 0xffff) / 65536.0f - 0.5f, w = ((h >> 4) & 0xfff) / 4096.0f - 0.5f;
  return (u + w) * 4.0f * (i % 97 == 0 ? 8.0f : 1.0f);
}

/* Every element's error within quant.h's bound (plus BF16's rounding). */
static void check_block(kv_quant_kind k, const uint16_t *src, size_t n, unsigned g) {
  uint8_t *q = malloc(kv_quant_size(n, g));
  uint16_t *back = malloc(2 * n);
  cr_assert_eq(kv_quant_encode(k, KV_QDT_BF16, src, n, g, q), 0);
  cr_assert_eq(kv_quant_decode(k, KV_QDT_BF16, q, n, g, back), 0);
  for (size_t grp = 0; grp < n / g; grp++) {
    float amax = 0;
    for (unsigned i = 0; i < g; i++) amax = fmaxf(amax, fabsf(kv_bf16_f32(src[grp * g + i])));
    for (unsigned i = 0; i < g; i++) {
      float x = kv_bf16_f32(src[grp * g + i]), y = kv_bf16_f32(back[grp * g + i]);
      float bound = k == KV_QUANT_FP8 ? fmaxf(fabsf(x) / 16, amax / 448 / 1024)
                                      : amax / 254;
      bound = bound * 1.0001f + fabsf(x) / 256 + 1e-30f; /* and BF16's rounding back */
      cr_assert_leq(fabsf(x - y), bound, "%s group %zu elem %u: %g -> %g (amax %g)",
                    kv_quant_name(k), grp, i, x, y, amax);
    }
  }
  free(q);
  free(back);
}

Test(quant, synthetic_blocks_stay_within_the_bound) {
  enum { N = 64 * 256 };
  static uint16_t src[N];
  for (unsigned i = 0; i < N; i++) src[i] = kv_f32_bf16(sample(i));
  for (unsigned z = 64; z < 128; z++) src[z] = 0; /* one group all zero */
  check_block(KV_QUANT_FP8, src, N, 64);
  check_block(KV_QUANT_INT8, src, N, 64);
  check_block(KV_QUANT_FP8, src, N, 128);
  cr_assert_eq(kv_quant_size(N, 64), N + 4 * N / 64);
}

/* The real KV of bench/kv (BF16): within the bound too. */
Test(quant, real_kv_stays_within_the_bound) {
  char path[512];
  snprintf(path, sizeof path, "%s/bench/kv/smollm2-135m.bf16.safetensors", KV_SOURCE_DIR);
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s", path);
  uint8_t h8[8];
  cr_assert_eq(fread(h8, 1, 8, f), 8);
  uint64_t hl = kv_ld64(h8);
  cr_assert_eq(fseek(f, (long)(8 + hl), SEEK_SET), 0);
  enum { N = 30 * 2 * 80 * 3 * 64 };
  uint16_t *kv = malloc(2 * N);
  cr_assert_eq(fread(kv, 2, N, f), N);
  fclose(f);
  check_block(KV_QUANT_FP8, kv, N, 64);
  check_block(KV_QUANT_INT8, kv, N, 64);
  free(kv);
}

/* FP16 in and out: each element (here 1 to 2) within FP8's half step,
 * 1/16 of its magnitude: at most 2/16 / 2^-10 = 128 FP16 steps; its sign
 * kept. */
Test(quant, fp16_blocks) {
  uint16_t h[64], back[64];
  for (int i = 0; i < 64; i++) h[i] = (uint16_t)(0x3c00 + (i << 4)); /* 1.0 .. ~1.98 */
  h[5] = 0xbc00; /* -1 */
  uint8_t q[64 + 4];
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_FP16, h, 64, 64, q), 0);
  cr_assert_eq(kv_quant_decode(KV_QUANT_FP8, KV_QDT_FP16, q, 64, 64, back), 0);
  cr_assert(back[5] & 0x8000, "-1 stays negative");
  for (int i = 0; i < 64; i++) {
    int d = (int)back[i] - (int)h[i];
    int lim = (int)((h[i] & 0x3ffu) + 1024) / 16 + 1; /* |x| / 16 in steps of 2^-10 */
    cr_assert(d >= -lim && d <= lim, "elem %d: 0x%04x -> 0x%04x", i, h[i], back[i]);
  }
}

Test(quant, refusals) {
  uint16_t src[64] = {0};
  uint8_t q[64 + 4];
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_BF16, src, 64, 0, q), -EINVAL);
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_BF16, src, 64, 48, q), -EINVAL);
  cr_assert_eq(kv_quant_encode((kv_quant_kind)9, KV_QDT_BF16, src, 64, 64, q), -EINVAL);
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, (kv_quant_dtype)9, src, 64, 64, q), -EINVAL);
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_BF16, src, 0, 64, q), -EINVAL);
  src[7] = 0x7f80; /* +infinity */
  cr_assert_eq(kv_quant_encode(KV_QUANT_INT8, KV_QDT_BF16, src, 64, 64, q), -EINVAL);
  src[7] = 0x7fc0; /* NaN */
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_BF16, src, 64, 64, q), -EINVAL);
  src[7] = 0;
  cr_assert_eq(kv_quant_encode(KV_QUANT_FP8, KV_QDT_BF16, src, 64, 64, q), 0);
  uint16_t back[64];
  kv_st32(q, 0xbf800000u); /* a scale of -1 */
  cr_assert_eq(kv_quant_decode(KV_QUANT_FP8, KV_QDT_BF16, q, 64, 64, back), -EINVAL);
  kv_st32(q, 0x7fc00000u); /* NaN */
  cr_assert_eq(kv_quant_decode(KV_QUANT_FP8, KV_QDT_BF16, q, 64, 64, back), -EINVAL);
  kv_st32(q, 0x3f800000u);
  q[4 + 3] = 0x7f; /* an FP8 NaN code */
  cr_assert_eq(kv_quant_decode(KV_QUANT_FP8, KV_QDT_BF16, q, 64, 64, back), -EINVAL);
  cr_assert_eq(kv_quant_decode(KV_QUANT_INT8, KV_QDT_BF16, q, 64, 64, back), 0,
               "0x7f is 127 in INT8");
  cr_assert_str_eq(kv_quant_name(KV_QUANT_FP8), "fp8");
  cr_assert_eq(kv_quant_parse("int8"), KV_QUANT_INT8);
  cr_assert_eq(kv_quant_parse("fp4"), 0);
}
