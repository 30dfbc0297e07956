/* chain_hash.c - the canonical chained block hash (see kvclient.h), one
 * block at a time (kvc_chain_hash) or a whole sequence's chain in one call
 * (kvc_chain_keys: the salt's key is derived once). */
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "client/kvclient.h"

static const char domain[] = "kvcached-chain-v1";

/* BLAKE2b's key for `salt`: the salt itself, or its digest when it is out
 * of BLAKE2b's key range. *keylen 0: no key. */
static const uint8_t *salt_key(const void *salt, size_t salt_len, uint8_t buf[32], size_t *keylen) {
  *keylen = 0;
  if (!salt_len) return NULL;
  if (salt_len > crypto_generichash_KEYBYTES_MAX || salt_len < crypto_generichash_KEYBYTES_MIN) {
    crypto_generichash(buf, 32, salt, salt_len, NULL, 0);
    *keylen = 32;
    return buf;
  }
  *keylen = salt_len;
  return salt;
}

static void hash_block(uint8_t out[KVC_DIGEST_BYTES], const uint8_t *parent, const int32_t *tokens,
                       uint32_t n, const void *extra, size_t extra_len, const uint8_t *key,
                       size_t keylen) {
  static const uint8_t zero[KVC_DIGEST_BYTES];
  crypto_generichash_state st;
  crypto_generichash_init(&st, key, keylen, KVC_DIGEST_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
  crypto_generichash_update(&st, parent ? parent : zero, KVC_DIGEST_BYTES);
  uint8_t le[4 * 64];
  uint8_t nb[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  crypto_generichash_update(&st, nb, 4);
  for (uint32_t i = 0; i < n;) {
    size_t m = 0;
    for (; m < 64 && i < n; m++, i++) {
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
}

int kvc_chain_hash(uint8_t out[KVC_DIGEST_BYTES], const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens, const void *extra, size_t extra_len,
                   const void *salt, size_t salt_len) {
  if (!out || (!tokens && ntokens) || (!extra && extra_len) || (!salt && salt_len)) return -EINVAL;
  if (ntokens > UINT32_MAX) return -EINVAL;
  if (sodium_init() < 0) return -ENOSYS;
  uint8_t keybuf[32];
  size_t keylen;
  const uint8_t *key = salt_key(salt, salt_len, keybuf, &keylen);
  hash_block(out, parent, tokens, (uint32_t)ntokens, extra, extra_len, key, keylen);
  sodium_memzero(keybuf, sizeof keybuf);
  return 0;
}

int kvc_chain_keys(uint8_t *out, size_t max_keys, const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens, uint32_t tokens_per_block,
                   const void *extra, size_t extra_len, const void *salt, size_t salt_len) {
  if (!tokens_per_block || (!tokens && ntokens) || (!extra && extra_len) || (!salt && salt_len))
    return -EINVAL;
  size_t n = ntokens / tokens_per_block;
  if (n > max_keys) n = max_keys;
  if (n > INT32_MAX) return -EINVAL;
  if (n && !out) return -EINVAL;
  if (sodium_init() < 0) return -ENOSYS;
  uint8_t keybuf[32];
  size_t keylen;
  const uint8_t *key = salt_key(salt, salt_len, keybuf, &keylen);
  const uint8_t *prev = parent;
  for (size_t i = 0; i < n; i++) {
    uint8_t *d = out + i * KVC_DIGEST_BYTES;
    hash_block(d, prev, tokens + i * tokens_per_block, tokens_per_block, extra, extra_len, key,
               keylen);
    prev = d;
  }
  sodium_memzero(keybuf, sizeof keybuf);
  return (int)n;
}
