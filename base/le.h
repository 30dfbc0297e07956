/*
 * le.h - little-endian loads and stores at any alignment.
 *
 * The wire format is little-endian and packed, so a field may sit at any
 * byte offset; these helpers go through bytes (the compiler turns them into
 * single moves on x86-64 and arm64) and never cast a buffer pointer to a
 * wider type. Shared by the wire format (proto/, ipc/) and the G3 on-disk
 * format (tiers/g3_format.c).
 */
#ifndef KV_BASE_LE_H
#define KV_BASE_LE_H

#include <stdint.h>

static inline uint16_t kv_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }

static inline uint32_t kv_ld32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t kv_ld64(const uint8_t *p) {
  return (uint64_t)kv_ld32(p) | (uint64_t)kv_ld32(p + 4) << 32;
}

static inline void kv_st16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static inline void kv_st32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static inline void kv_st64(uint8_t *p, uint64_t v) {
  kv_st32(p, (uint32_t)v);
  kv_st32(p + 4, (uint32_t)(v >> 32));
}

#endif
