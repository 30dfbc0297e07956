/*
 * half.h - 16-bit floats (BF16, IEEE FP16) to and from float, rounding to
 * the nearest with ties to even, as engines store KV. Subnormals are
 * kept; a NaN stays a (quiet) NaN; FP16 values of 65520 and up become
 * infinity, as IEEE rounding says.
 */
#ifndef KV_BASE_HALF_H
#define KV_BASE_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float kv_bf16_f32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* f, known not to be a NaN (infinities are fine): the rounding alone, for
 * loops that convert many values and must vectorize. */
static inline uint16_t kv_f32_bf16_num(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static inline uint16_t kv_f32_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* a quiet NaN */
  return kv_f32_bf16_num(f);
}

static inline float kv_f16_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* 2^-24: subnormals */
    return sign ? -v : v;
  }
  x = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static inline uint16_t kv_f32_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* 65520 and up round to infinity */
  if (a < 0x38800000u) {                       /* below 2^-14: subnormal (or 0) */
    float v;
    memcpy(&v, &a, 4);
    return (uint16_t)(sign | (uint16_t)nearbyintf(v * 16777216.0f)); /* 2^24; 1024: 2^-14 */
  }
  uint32_t h = (((a >> 23) - 127 + 15) << 10) | ((a >> 13) & 0x3ffu), rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry moves the exponent */
  return (uint16_t)(sign | h);
}

#endif
