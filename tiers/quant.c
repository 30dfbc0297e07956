/*
 * quant.c - FP8 (E4M3) and INT8 codes of 16-bit KV blocks with per-group
 * scales (quant.h).
 */
#include "tiers/quant.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/half.h"
#include "base/le.h"

#define FP8_MAX  448.0f
#define INT8_TOP 127.0f

static float elem(kv_quant_dtype dt, const uint8_t *p) {
  uint16_t v = kv_ld16(p);
  return dt == KV_QDT_BF16 ? kv_bf16_f32(v) : kv_f16_f32(v);
}

static void put_elem(kv_quant_dtype dt, uint8_t *p, float f) {
  kv_st16(p, dt == KV_QDT_BF16 ? kv_f32_bf16(f) : kv_f32_f16(f));
}

/* ---- E4M3 ------------------------------------------------------------------ */

uint8_t kv_fp8_e4m3(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return sign | 0x7e; /* 448 and up (infinity too): the largest */
  if (a < 0x3c800000u) {                    /* below 2^-6: subnormal codes m * 2^-9 */
    float v;
    memcpy(&v, &a, 4);
    return (uint8_t)(sign | (uint8_t)nearbyintf(v * 512.0f)); /* 8: 2^-6, the first normal */
  }
  uint32_t c = ((((a >> 23) - 127 + 7)) << 3) | ((a >> 20) & 7u), rest = a & 0xfffffu;
  /* to the nearest, ties to even, without branches (the rest is random:
   * a branch on it is mispredicted half the time) */
  c += (uint32_t)(rest > 0x80000u) | ((uint32_t)(rest == 0x80000u) & c & 1u);
  c = c > 0x7eu ? 0x7eu : c;
  return (uint8_t)(sign | c);
}

float kv_fp8_e4m3_value(uint8_t c) {
  if ((c & 0x7f) == 0x7f) return NAN;
  unsigned e = (c >> 3) & 0xfu, m = c & 7u;
  float v = e ? ldexpf(1.0f + (float)m / 8.0f, (int)e - 7) : (float)m / 512.0f;
  return c & 0x80 ? -v : v;
}

/* Every code's value, from kv_fp8_e4m3_value (NaN for the two NaN codes):
 * decoding a block is then a load per element, not an ldexpf (about 8x
 * faster: BENCHMARKS.md, "G3 with coded blocks"). Filled once, on first
 * use, by whichever thread comes first (pthread_once). */
static float fp8_table[256];
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;
static void fp8_fill(void) {
  for (unsigned c = 0; c < 256; c++) fp8_table[c] = kv_fp8_e4m3_value((uint8_t)c);
}

/* ---- blocks ------------------------------------------------------------------ */

static int args_ok(kv_quant_kind k, kv_quant_dtype dt, size_t n, unsigned g) {
  return (k == KV_QUANT_FP8 || k == KV_QUANT_INT8) && (dt == KV_QDT_BF16 || dt == KV_QDT_FP16) &&
         n && g && n % g == 0;
}

int kv_quant_encode(kv_quant_kind k, kv_quant_dtype dt, const void *src, size_t n, unsigned g,
                    void *dst) {
  if (!args_ok(k, dt, n, g) || !src || !dst) return -EINVAL;
  const uint8_t *s = src;
  uint8_t *scales = dst, *codes = scales + 4 * (n / g);
  float top = k == KV_QUANT_FP8 ? FP8_MAX : INT8_TOP;
  /* magnitudes compare as their bits (sign and magnitude formats); from
   * this one up, the exponent is all ones: infinite or NaN */
  uint16_t nonfinite = dt == KV_QDT_BF16 ? 0x7f80u : 0x7c00u;
  for (size_t grp = 0; grp < n / g; grp++) {
    const uint8_t *p = s + 2 * grp * g;
    uint16_t mx = 0;
    for (unsigned i = 0; i < g; i++) {
      uint16_t m = kv_ld16(p + 2 * i) & 0x7fffu;
      mx = m > mx ? m : mx;
    }
    if (mx >= nonfinite) return -EINVAL;
    float amax = dt == KV_QDT_BF16 ? kv_bf16_f32(mx) : kv_f16_f32(mx);
    float scale = amax / top;
    uint32_t sb;
    memcpy(&sb, &scale, 4);
    kv_st32(scales + 4 * grp, sb);
    uint8_t *c = codes + grp * g;
    if (scale == 0) { /* all zero (or below float's range once divided) */
      memset(c, 0, g);
      continue;
    }
    float inv = top / amax; /* x * inv, not x / scale: a multiply (codes at most a tie apart) */
    if (k == KV_QUANT_INT8 && dt == KV_QDT_BF16) { /* the common case, in a loop that vectorizes */
      for (unsigned i = 0; i < g; i++) {
        float v = kv_bf16_f32(kv_ld16(p + 2 * i)) * inv;
        float r = (v + 0x1.8p23f) - 0x1.8p23f; /* to the nearest, ties to even (|v| <= 127) */
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        c[i] = (uint8_t)(int8_t)(int)r;
      }
      continue;
    }
    if (k == KV_QUANT_FP8 && dt == KV_QDT_BF16) { /* the conversions inlined, no dtype test */
      for (unsigned i = 0; i < g; i++) c[i] = kv_fp8_e4m3(kv_bf16_f32(kv_ld16(p + 2 * i)) * inv);
      continue;
    }
    for (unsigned i = 0; i < g; i++) {
      float v = elem(dt, p + 2 * i) * inv;
      if (k == KV_QUANT_FP8) {
        c[i] = kv_fp8_e4m3(v);
      } else {
        float r = nearbyintf(v);
        c[i] = (uint8_t)(int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
      }
    }
  }
  return 0;
}

int kv_quant_decode(kv_quant_kind k, kv_quant_dtype dt, const void *stored, size_t n, unsigned g,
                    void *dst) {
  if (!args_ok(k, dt, n, g) || !stored || !dst) return -EINVAL;
  if (k == KV_QUANT_FP8) (void)pthread_once(&fp8_once, fp8_fill);
  const uint8_t *scales = stored, *codes = scales + 4 * (n / g);
  uint8_t *d = dst;
  for (size_t grp = 0; grp < n / g; grp++) {
    uint32_t sb = kv_ld32(scales + 4 * grp);
    float scale;
    memcpy(&scale, &sb, 4);
    if (!isfinite(scale) || scale < 0) return -EINVAL;
    const uint8_t *c = codes + grp * g;
    if (k == KV_QUANT_INT8 && dt == KV_QDT_BF16) { /* finite by construction: no NaN case */
      for (unsigned i = 0; i < g; i++)
        kv_st16(d + 2 * (grp * g + i), kv_f32_bf16_num((float)(int8_t)c[i] * scale));
      continue;
    }
    if (k == KV_QUANT_FP8 && dt == KV_QDT_BF16) {
      for (unsigned i = 0; i < g; i++) {
        if ((c[i] & 0x7f) == 0x7f) return -EINVAL; /* an FP8 NaN code: never written */
        /* no NaN: |code| <= 448, scale finite */
        kv_st16(d + 2 * (grp * g + i), kv_f32_bf16_num(fp8_table[c[i]] * scale));
      }
      continue;
    }
    for (unsigned i = 0; i < g; i++) {
      float v = k == KV_QUANT_FP8 ? fp8_table[c[i]] : (float)(int8_t)c[i];
      if (!isfinite(v)) return -EINVAL; /* an FP8 NaN code: never written */
      put_elem(dt, d + 2 * (grp * g + i), v * scale);
    }
  }
  return 0;
}

const char *kv_quant_name(kv_quant_kind k) {
  return k == KV_QUANT_FP8 ? "fp8" : k == KV_QUANT_INT8 ? "int8" : NULL;
}

kv_quant_kind kv_quant_parse(const char *name) {
  if (name && !strcmp(name, "fp8")) return KV_QUANT_FP8;
  if (name && !strcmp(name, "int8")) return KV_QUANT_INT8;
  return (kv_quant_kind)0;
}
