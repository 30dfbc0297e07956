/*
 * key.h - the names every layer shares: a block's key and the tiers.
 *
 * A key is an opaque digest of 1..KV_KEY_MAX bytes, chosen by the client
 * (libkvclient chains token-block hashes into it); the daemon never looks
 * inside. Tiers are numbered from the fastest: G1 (GPU memory), G2 (host
 * memory), G3 (local SSD). The wire protocol carries both, so they sit
 * below it.
 */
#ifndef KV_BASE_KEY_H
#define KV_BASE_KEY_H

#include <stdint.h>

#define KV_KEY_MAX 32 /* keys are opaque digests of 1..32 bytes */

typedef struct kv_key {
  uint8_t len;
  uint8_t b[KV_KEY_MAX];
} kv_key;

typedef enum { KV_G1 = 0, KV_G2 = 1, KV_G3 = 2, KV_NTIERS = 3 } kv_tier;
#define KV_TIER_NONE   0xff
#define KV_TIER_BIT(t) (1u << (t))

/* k = bytes[0..len); 0, or -EINVAL when len is 0 or over KV_KEY_MAX. */
static inline int kv_key_set(kv_key *k, const void *bytes, unsigned len) {
  if (len == 0 || len > KV_KEY_MAX) return -22; /* -EINVAL */
  k->len = (uint8_t)len;
  for (unsigned i = 0; i < len; i++) k->b[i] = ((const uint8_t *)bytes)[i];
  return 0;
}

#endif
