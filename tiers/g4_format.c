/* g4_format.c - the G4 value header, its MAC and Redis key names (see
 * g4_format.h). */
#include "tiers/g4_format.h"

#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sodium.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "base/hex.h"
#include "base/le.h"

/* Header (version 2):
 *   0 u32 magic | 4 u16 version | 6 u16 header length (128) | 8 u8 keylen
 *   9 u8 flags (F_CRC_SIGNED, or 0 from a writer before it) | 10 u16
 *  reserved (0) | 12 u32 payload length
 *  16 u32 payload CRC32C | 20 u32 secret id | 24 ns[32] | 56 key[32]
 *  (zero padded) | 88 u64 reserved (0) | 96 nonce[12] | 108 MAC[16]:
 *  Poly1305 of bytes 0..107 then the payload, under the one-time key
 *  ChaCha20(mac key, nonce) | 124 u32 CRC32C of bytes 0..123 */
#define FLAGS_OFF 9
/* The signer checked the payload against its CRC before signing: a value
 * whose MAC holds needs no CRC pass (kv_g4_check). Under the MAC. */
#define F_CRC_SIGNED 0x01
#define SID_OFF   20
#define NONCE_OFF 96
#define MAC_OFF   108
#define HCRC_OFF  124
#define CODING_OFF 10 /* coded values: the coding, then the lossy ones' dtype */
#define SLEN_OFF  88 /* coded values: the stored bytes' length, then their CRC32C */
#define SCRC_OFF  92
_Static_assert(NONCE_OFF + KV_G4_NONCE_BYTES == MAC_OFF && MAC_OFF + KV_G4_MAC_BYTES == HCRC_OFF &&
                   HCRC_OFF + 4 == KV_G4_HDR_LEN,
               "the header's layout");
_Static_assert(KV_G4_SECRET_MIN >= crypto_generichash_KEYBYTES_MIN &&
                   KV_G4_SECRET_MAX <= crypto_generichash_KEYBYTES_MAX &&
                   KV_G4_MAC_BYTES == crypto_onetimeauth_BYTES &&
                   KV_G4_NONCE_BYTES == crypto_stream_chacha20_ietf_NONCEBYTES &&
                   crypto_stream_chacha20_ietf_KEYBYTES == 32 &&
                   crypto_onetimeauth_KEYBYTES == 32,
               "a secret is a BLAKE2b key; the MAC Poly1305 under a ChaCha20 one-time key");

static const char SECRET_ID_MSG[] = "kvcached-g4-secret-id";
static const char MAC_KEY_MSG[] = "kvcached-g4-mac-key";

static const char *const miss_names[] = {
#define KV_G4_MISS_NAME(name, label) label,
    KV_G4_MISS_MAP(KV_G4_MISS_NAME)
#undef KV_G4_MISS_NAME
};

const char *kv_g4_miss_name(int why) {
  return why >= 0 && why < KV_G4_MISS_COUNT ? miss_names[why] : "?";
}

static int secret_ok(const kv_g4_secret *s) {
  return s->len >= KV_G4_SECRET_MIN && s->len <= KV_G4_SECRET_MAX;
}

int kv_g4_secret_init(kv_g4_secret *s, const uint8_t *b, size_t len) {
  if (len < KV_G4_SECRET_MIN || len > KV_G4_SECRET_MAX) return -EINVAL;
  if (sodium_init() < 0) return -ENOSYS;
  uint8_t h[crypto_generichash_BYTES];
  crypto_generichash(h, sizeof h, (const uint8_t *)SECRET_ID_MSG, sizeof SECRET_ID_MSG - 1, b,
                     len);
  memset(s, 0, sizeof *s);
  memcpy(s->b, b, len);
  s->len = (uint8_t)len;
  s->id = kv_ld32(h);
  crypto_generichash(s->mk, sizeof s->mk, (const uint8_t *)MAC_KEY_MSG, sizeof MAC_KEY_MSG - 1, b,
                     len);
  sodium_memzero(h, sizeof h);
  return 0;
}

/* The MAC of hdr[0..MAC_OFF) (its nonce included) then payload[0..len)
 * under s, into mac: Poly1305 under the one-time key that ChaCha20 makes
 * of s's MAC key and the header's nonce (RFC 8439, 2.6), so that no two
 * values share one. */
/* Poly1305 is computed by OpenSSL's libcrypto where it can (its vector
 * code: 4.2 GB/s per core on the development VM's AVX2, against 1.7 for
 * libsodium's), by libsodium where it cannot (the same function: the tags
 * are equal, tests/unit/test_g4_format.c holds them so). */
static EVP_MAC *poly1305;
static pthread_once_t poly1305_once = PTHREAD_ONCE_INIT;
static void poly1305_fetch(void) { poly1305 = EVP_MAC_fetch(NULL, "POLY1305", NULL); }

static int mac_openssl(const uint8_t otk[32], const uint8_t *hdr, const void *payload,
                       uint32_t len, uint8_t mac[KV_G4_MAC_BYTES]) {
  pthread_once(&poly1305_once, poly1305_fetch);
  EVP_MAC_CTX *c = poly1305 ? EVP_MAC_CTX_new(poly1305) : NULL;
  size_t n = 0;
  int ok = c && EVP_MAC_init(c, otk, 32, NULL) && EVP_MAC_update(c, hdr, MAC_OFF) &&
           EVP_MAC_update(c, payload, len) && EVP_MAC_final(c, mac, &n, KV_G4_MAC_BYTES) &&
           n == KV_G4_MAC_BYTES;
  EVP_MAC_CTX_free(c); /* clears its state, the one-time key with it */
  return ok ? 0 : -ENOMEM;
}

static void mac_of(const kv_g4_secret *s, const uint8_t *hdr, const void *payload, uint32_t len,
                   uint8_t mac[KV_G4_MAC_BYTES]) {
  uint8_t otk[crypto_onetimeauth_KEYBYTES] = {0};
  crypto_stream_chacha20_ietf_xor(otk, otk, sizeof otk, hdr + NONCE_OFF, s->mk);
  if (mac_openssl(otk, hdr, payload, len, mac) != 0) {
    crypto_onetimeauth_state st;
    crypto_onetimeauth_init(&st, otk);
    crypto_onetimeauth_update(&st, hdr, MAC_OFF);
    crypto_onetimeauth_update(&st, payload, len);
    crypto_onetimeauth_final(&st, mac);
    sodium_memzero(&st, sizeof st); /* it holds the one-time key */
  }
  sodium_memzero(otk, sizeof otk);
}

/* The header of payload[0..len) with CRC crc; for a coded value (stored
 * non-NULL) of its stored bytes stored[0..slen), which the MAC covers. */
static void encode_hdr(const kv_g4_key *k, const kv_g4_secret *s, const void *payload,
                       uint32_t len, uint32_t crc, const void *stored, uint32_t slen, int coding,
                       int dtype, uint8_t *out) {
  memset(out, 0, KV_G4_HDR_LEN);
  kv_st32(out, KV_G4_MAGIC);
  kv_st16(out + 4, stored ? KV_G4_VERSION_CODED : KV_G4_VERSION);
  kv_st16(out + 6, KV_G4_HDR_LEN);
  out[8] = k->len;
  out[FLAGS_OFF] = F_CRC_SIGNED;
  kv_st32(out + 12, len);
  kv_st32(out + 16, crc);
  kv_st32(out + SID_OFF, s->id);
  memcpy(out + 24, k->ns, KV_G4_NS_BYTES);
  memcpy(out + 56, k->b, k->len);
  if (stored) {
    out[CODING_OFF] = (uint8_t)coding;
    out[CODING_OFF + 1] = (uint8_t)dtype;
    kv_st32(out + SLEN_OFF, slen);
    kv_st32(out + SCRC_OFF, kv_crc32c(0, stored, slen));
  }
  randombytes_buf(out + NONCE_OFF, KV_G4_NONCE_BYTES);
  if (stored)
    mac_of(s, out, stored, slen, out + MAC_OFF);
  else
    mac_of(s, out, payload, len, out + MAC_OFF);
  kv_st32(out + HCRC_OFF, kv_crc32c(0, out, HCRC_OFF));
}

int kv_g4_encode_hdr(const kv_g4_key *k, const kv_g4_secret *s, const void *payload, uint32_t len,
                     uint32_t crc, uint8_t *out) {
  if (k->len == 0 || k->len > KV_G4_KEY_MAX || len > KV_G4_PAYLOAD_MAX || !secret_ok(s))
    return -EINVAL;
  if (kv_crc32c(0, payload, len) != crc) return KV_ECORRUPT;
  encode_hdr(k, s, payload, len, crc, NULL, 0, 0, 0, out);
  return 0;
}

/* A coding and dtype a reader knows: 0 when so. */
static int coding_ok(int coding, int dtype) {
  if (coding == 0 || coding == KV_G4_CODING_PLANES) return dtype == 0 ? 0 : -1;
  if (coding == KV_G4_CODING_FP8 || coding == KV_G4_CODING_INT8)
    return dtype == 1 || dtype == 2 ? 0 : -1;
  return -1;
}

int kv_g4_encode_hdr_coded(const kv_g4_key *k, const kv_g4_secret *s, const void *stored,
                           uint32_t slen, uint32_t len, uint32_t crc, int coding, int dtype,
                           uint8_t *out) {
  if (k->len == 0 || k->len > KV_G4_KEY_MAX || len > KV_G4_PAYLOAD_MAX || !secret_ok(s) ||
      slen == 0 || slen >= len || !stored || coding == 0 || coding_ok(coding, dtype))
    return -EINVAL;
  encode_hdr(k, s, NULL, len, crc, stored, slen, coding, dtype, out);
  return 0;
}

long kv_g4_encode(const kv_g4_key *k, const kv_g4_secret *s, const void *payload, uint32_t len,
                  uint8_t *out) {
  if (k->len == 0 || k->len > KV_G4_KEY_MAX || len > KV_G4_PAYLOAD_MAX || !secret_ok(s))
    return -EINVAL;
  /* the CRC of the bytes copied: checked by construction */
  uint32_t crc = kv_crc32c_copy(0, out + KV_G4_HDR_LEN, payload, len);
  encode_hdr(k, s, out + KV_G4_HDR_LEN, len, crc, NULL, 0, 0, 0, out);
  return (long)kv_g4_value_len(len);
}

/* The secret of keys that id names and that is accepted at now, or NULL. */
static const kv_g4_secret *secret_for(const kv_g4_keys *keys, uint32_t id, int64_t now) {
  if (secret_ok(&keys->cur) && keys->cur.id == id) return &keys->cur;
  if (secret_ok(&keys->old) && keys->old.id == id && now < keys->old_until) return &keys->old;
  return NULL;
}

static int refuse(kv_g4_miss *why, kv_g4_miss w) {
  if (why) *why = w;
  return w == KV_G4_MISS_VERSION ? KV_EBADVERSION : KV_ECORRUPT;
}

/* kv_g4_check's checks but the passes over the payload (its CRC, the MAC). */
static int check_hdr(const void *val, size_t n, const kv_g4_key *expect, uint32_t expect_len,
                     kv_g4_miss *why) {
  const uint8_t *p = val;
  if (n >= 4 && kv_ld32(p) != KV_G4_MAGIC) return refuse(why, KV_G4_MISS_MAGIC);
  if (n < KV_G4_HDR_LEN) return refuse(why, KV_G4_MISS_SHORT);
  uint16_t ver = kv_ld16(p + 4);
  if ((ver != KV_G4_VERSION && ver != KV_G4_VERSION_CODED) || kv_ld16(p + 6) != KV_G4_HDR_LEN)
    return refuse(why, KV_G4_MISS_VERSION);
  if (kv_ld32(p + HCRC_OFF) != kv_crc32c(0, p, HCRC_OFF))
    return refuse(why, KV_G4_MISS_HEADER_CRC);
  uint8_t klen = p[8];
  if (klen != expect->len || memcmp(p + 24, expect->ns, KV_G4_NS_BYTES) ||
      memcmp(p + 56, expect->b, klen))
    return refuse(why, KV_G4_MISS_KEY);
  uint32_t len = kv_ld32(p + 12);
  if (expect_len && len != expect_len) return refuse(why, KV_G4_MISS_LENGTH);
  uint32_t slen = len; /* the bytes after the header */
  if (ver == KV_G4_VERSION_CODED) {
    if (coding_ok(p[CODING_OFF], p[CODING_OFF + 1])) return refuse(why, KV_G4_MISS_VERSION);
    slen = kv_ld32(p + SLEN_OFF);
    if (slen == 0 || slen >= len) return refuse(why, KV_G4_MISS_LENGTH);
  }
  if (n - KV_G4_HDR_LEN < slen) return refuse(why, KV_G4_MISS_SHORT);
  if (n - KV_G4_HDR_LEN > slen) return refuse(why, KV_G4_MISS_LENGTH);
  if (why) *why = KV_G4_MISS_OK;
  return 0;
}

int kv_g4_check(const void *val, size_t n, const kv_g4_key *expect, uint32_t expect_len,
                const kv_g4_keys *keys, int64_t now, kv_g4_view *v, kv_g4_miss *why) {
  int rc = check_hdr(val, n, expect, expect_len, why);
  if (rc) return rc;
  const uint8_t *p = val;
  uint32_t len = kv_ld32(p + 12);
  int coded = kv_ld16(p + 4) == KV_G4_VERSION_CODED;
  /* what follows the header: the payload, or its stored bytes */
  uint32_t slen = coded ? kv_ld32(p + SLEN_OFF) : len;
  uint32_t scrc = coded ? kv_ld32(p + SCRC_OFF) : kv_ld32(p + 16);
  /* A value whose signer checked its CRC needs one pass, the MAC's; the
   * CRC is computed only to tell damage from forgery when the MAC fails.
   * One without the flag (an earlier writer) has its CRC checked first. */
  int signed_crc = (p[FLAGS_OFF] & F_CRC_SIGNED) != 0;
  if (!signed_crc && kv_crc32c(0, p + KV_G4_HDR_LEN, slen) != scrc)
    return refuse(why, KV_G4_MISS_PAYLOAD_CRC);
  const kv_g4_secret *s = secret_for(keys, kv_ld32(p + SID_OFF), now);
  uint8_t mac[KV_G4_MAC_BYTES];
  if (s) mac_of(s, p, p + KV_G4_HDR_LEN, slen, mac);
  if (!s || crypto_verify_16(mac, p + MAC_OFF)) {
    if (signed_crc && kv_crc32c(0, p + KV_G4_HDR_LEN, slen) != scrc)
      return refuse(why, KV_G4_MISS_PAYLOAD_CRC);
    return refuse(why, KV_G4_MISS_MAC);
  }
  v->payload = p + KV_G4_HDR_LEN;
  v->len = len;
  v->crc = kv_ld32(p + 16);
  v->stored_len = slen;
  v->coded = coded;
  v->coding = coded ? (p[CODING_OFF] ? p[CODING_OFF] : KV_G4_CODING_PLANES) : 0;
  v->dtype = coded ? p[CODING_OFF + 1] : 0;
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
