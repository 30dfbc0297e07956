/* g4_format.c - the G4 value header and Redis key names (see g4_format.h). */
#include "tiers/g4_format.h"

#include <errno.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "base/hex.h"
#include "base/le.h"

/* Header:
 *   0 u32 magic | 4 u16 version | 6 u16 header length (96) | 8 u8 keylen
 *   9 u8 flags (0) | 10 u16 reserved (0) | 12 u32 payload length
 *  16 u32 payload CRC32C | 20 u32 reserved (0) | 24 ns[32] | 56 key[32]
 *  (zero padded) | 88 u32 reserved (0) | 92 u32 CRC32C of bytes 0..91 */
#define HCRC_OFF 92

static const char *const miss_names[] = {
#define KV_G4_MISS_NAME(name, label) label,
    KV_G4_MISS_MAP(KV_G4_MISS_NAME)
#undef KV_G4_MISS_NAME
};

const char *kv_g4_miss_name(int why) {
  return why >= 0 && why < KV_G4_MISS_COUNT ? miss_names[why] : "?";
}

int kv_g4_encode_hdr(const kv_g4_key *k, uint32_t len, uint32_t crc, uint8_t *out) {
  if (k->len == 0 || k->len > KV_G4_KEY_MAX || len > KV_G4_PAYLOAD_MAX) return -EINVAL;
  memset(out, 0, KV_G4_HDR_LEN);
  kv_st32(out, KV_G4_MAGIC);
  kv_st16(out + 4, KV_G4_VERSION);
  kv_st16(out + 6, KV_G4_HDR_LEN);
  out[8] = k->len;
  kv_st32(out + 12, len);
  kv_st32(out + 16, crc);
  memcpy(out + 24, k->ns, KV_G4_NS_BYTES);
  memcpy(out + 56, k->b, k->len);
  kv_st32(out + HCRC_OFF, kv_crc32c(0, out, HCRC_OFF));
  return 0;
}

long kv_g4_encode(const kv_g4_key *k, const void *payload, uint32_t len, uint8_t *out) {
  if (k->len == 0 || k->len > KV_G4_KEY_MAX || len > KV_G4_PAYLOAD_MAX) return -EINVAL;
  uint32_t crc = kv_crc32c_copy(0, out + KV_G4_HDR_LEN, payload, len);
  kv_g4_encode_hdr(k, len, crc, out);
  return (long)kv_g4_value_len(len);
}

static int refuse(kv_g4_miss *why, kv_g4_miss w) {
  if (why) *why = w;
  return w == KV_G4_MISS_VERSION ? KV_EBADVERSION : KV_ECORRUPT;
}

int kv_g4_check(const void *val, size_t n, const kv_g4_key *expect, uint32_t expect_len,
                kv_g4_view *v, kv_g4_miss *why) {
  const uint8_t *p = val;
  if (n >= 4 && kv_ld32(p) != KV_G4_MAGIC) return refuse(why, KV_G4_MISS_MAGIC);
  if (n < KV_G4_HDR_LEN) return refuse(why, KV_G4_MISS_SHORT);
  if (kv_ld16(p + 4) != KV_G4_VERSION || kv_ld16(p + 6) != KV_G4_HDR_LEN)
    return refuse(why, KV_G4_MISS_VERSION);
  if (kv_ld32(p + HCRC_OFF) != kv_crc32c(0, p, HCRC_OFF))
    return refuse(why, KV_G4_MISS_HEADER_CRC);
  uint8_t klen = p[8];
  if (klen != expect->len || memcmp(p + 24, expect->ns, KV_G4_NS_BYTES) ||
      memcmp(p + 56, expect->b, klen))
    return refuse(why, KV_G4_MISS_KEY);
  uint32_t len = kv_ld32(p + 12);
  if (expect_len && len != expect_len) return refuse(why, KV_G4_MISS_LENGTH);
  if (n - KV_G4_HDR_LEN < len) return refuse(why, KV_G4_MISS_SHORT);
  if (n - KV_G4_HDR_LEN > len) return refuse(why, KV_G4_MISS_LENGTH);
  uint32_t crc = kv_ld32(p + 16);
  if (kv_crc32c(0, p + KV_G4_HDR_LEN, len) != crc) return refuse(why, KV_G4_MISS_PAYLOAD_CRC);
  v->payload = p + KV_G4_HDR_LEN;
  v->len = len;
  v->crc = crc;
  if (why) *why = KV_G4_MISS_OK;
  return 0;
}

int kv_g4_prefix_ok(const char *prefix) {
  size_t n = strnlen(prefix, KV_G4_PREFIX_MAX + 1);
  if (n > KV_G4_PREFIX_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (prefix[i] <= ' ' || prefix[i] > '~' || prefix[i] == '{' || prefix[i] == '}') return 0;
  return 1;
}

int kv_g4_rkey(const char *prefix, const kv_g4_key *k, char *out, size_t n) {
  if (!prefix) prefix = KV_G4_PREFIX;
  if (!kv_g4_prefix_ok(prefix) || k->len == 0 || k->len > KV_G4_KEY_MAX) return -EINVAL;
  size_t pl = strlen(prefix);
  size_t total = pl + 2 * KV_G4_NS_BYTES + 1 + 2 * (size_t)k->len;
  if (total + 1 > n) return -ENAMETOOLONG;
  memcpy(out, prefix, pl);
  kv_hex_encode(k->ns, KV_G4_NS_BYTES, out + pl);
  out[pl + 2 * KV_G4_NS_BYTES] = ':';
  kv_hex_encode(k->b, k->len, out + pl + 2 * KV_G4_NS_BYTES + 1);
  return (int)total;
}
