/* chain_hash.c - the canonical chained block hash (see kvclient.h). */
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "client/kvclient.h"

static const char domain[] = "kvcached-chain-v1";

int kvc_chain_hash(uint8_t out[KVC_DIGEST_BYTES],
                   const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens,
                   const void *extra, size_t extra_len,
                   const void *salt, size_t salt_len) {
  if (!out || (!tokens && ntokens) || (!extra && extra_len) || (!salt && salt_len))
    return -EINVAL;
  if (ntokens > UINT32_MAX) return -EINVAL;
  if (sodium_init() < 0) return -ENOSYS;

  uint8_t keybuf[crypto_generichash_KEYBYTES_MAX];
  const uint8_t *key = NULL;
  size_t keylen = 0;
  if (salt_len > crypto_generichash_KEYBYTES_MAX || (salt_len && salt_len < crypto_generichash_KEYBYTES_MIN)) {
    /* Out of BLAKE2b's key range: key with the salt's own digest. */
    crypto_generichash(keybuf, 32, salt, salt_len, NULL, 0);
    key = keybuf;
    keylen = 32;
  } else if (salt_len) {
    key = salt;
    keylen = salt_len;
  }

  crypto_generichash_state st;
  crypto_generichash_init(&st, key, keylen, KVC_DIGEST_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
  static const uint8_t zero[KVC_DIGEST_BYTES];
  crypto_generichash_update(&st, parent ? parent : zero, KVC_DIGEST_BYTES);
  uint8_t le[4 * 64];
  uint32_t n = (uint32_t)ntokens;
  uint8_t nb[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  crypto_generichash_update(&st, nb, 4);
  for (size_t i = 0; i < ntokens;) {
    size_t m = 0;
    for (; m < 64 && i < ntokens; m++, i++) {
      uint32_t t = (uint32_t)tokens[i];
      le[4 * m] = (uint8_t)t;
      le[4 * m + 1] = (uint8_t)(t >> 8);
      le[4 * m + 2] = (uint8_t)(t >> 16);
      le[4 * m + 3] = (uint8_t)(t >> 24);
    }
    crypto_generichash_update(&st, le, 4 * m);
  }
  if (extra_len) crypto_generichash_update(&st, extra, extra_len);
  crypto_generichash_final(&st, out, KVC_DIGEST_BYTES);
  sodium_memzero(keybuf, sizeof keybuf);
  return 0;
}
