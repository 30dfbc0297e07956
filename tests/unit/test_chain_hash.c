/* test_chain_hash.c - libkvclient's canonical chained block hash: pinned to
 * a vector computed independently (Python's hashlib.blake2b), and sensitive
 * to every input. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client/kvclient.h"

/* Computed with Python: hashlib.blake2b(digest_size=32, key=salt) over the
 * bytes kvclient.h specifies. */
#define REF_ROOT  "9a87acc7824c39c35ee076cec3c296eadbb343da71e313c8810d032d09b1b850"
#define REF_CHILD "2b5f2bf6a16782f92e90fae96fa6efcfb475641c41fb0047f1cca74d3b6e3ef0"

static void hex(const uint8_t *d, char *out) {
  for (int i = 0; i < KVC_DIGEST_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

Test(chain_hash, matches_the_reference_vectors) {
  int32_t toks[4] = {1, 2, 3, 70000};
  uint8_t d0[32], d1[32];
  char h[65];
  cr_assert_eq(kvc_chain_hash(d0, NULL, toks, 4, NULL, 0, NULL, 0), 0);
  hex(d0, h);
  cr_assert_str_eq(h, REF_ROOT);
  cr_assert_eq(kvc_chain_hash(d1, d0, toks, 2, "lora:7", 6, "tenant-a-salt-0123", 18), 0);
  hex(d1, h);
  cr_assert_str_eq(h, REF_CHILD);
}

Test(chain_hash, every_input_changes_the_digest) {
  int32_t toks[3] = {5, 6, 7}, other[3] = {5, 6, 8};
  uint8_t base[32], d[32], parent[32] = {1};
  kvc_chain_hash(base, NULL, toks, 3, NULL, 0, NULL, 0);
  kvc_chain_hash(d, parent, toks, 3, NULL, 0, NULL, 0);
  cr_assert_neq(memcmp(base, d, 32), 0, "parent");
  kvc_chain_hash(d, NULL, other, 3, NULL, 0, NULL, 0);
  cr_assert_neq(memcmp(base, d, 32), 0, "tokens");
  kvc_chain_hash(d, NULL, toks, 2, NULL, 0, NULL, 0);
  cr_assert_neq(memcmp(base, d, 32), 0, "token count");
  kvc_chain_hash(d, NULL, toks, 3, "x", 1, NULL, 0);
  cr_assert_neq(memcmp(base, d, 32), 0, "extra");
  kvc_chain_hash(d, NULL, toks, 3, NULL, 0, "a-salt-of-16-bytes", 18);
  cr_assert_neq(memcmp(base, d, 32), 0, "salt");
  kvc_chain_hash(d, NULL, toks, 3, NULL, 0, "s", 1); /* short salts are hashed to a key */
  cr_assert_neq(memcmp(base, d, 32), 0, "short salt");
  kvc_chain_hash(d, NULL, toks, 3, NULL, 0, NULL, 0);
  cr_assert_eq(memcmp(base, d, 32), 0, "deterministic");
}

Test(chain_hash, bad_arguments) {
  uint8_t d[32];
  cr_assert_eq(kvc_chain_hash(NULL, NULL, NULL, 0, NULL, 0, NULL, 0), -EINVAL);
  cr_assert_eq(kvc_chain_hash(d, NULL, NULL, 3, NULL, 0, NULL, 0), -EINVAL);
  cr_assert_eq(kvc_chain_hash(d, NULL, NULL, 0, NULL, 4, NULL, 0), -EINVAL);
  cr_assert_eq(kvc_chain_hash(d, NULL, NULL, 0, NULL, 0, NULL, 0), 0, "an empty block is allowed");
}

/* kvc_chain_keys gives, in one call, what kvc_chain_hash gives block by
 * block: for every salt kind (none, in BLAKE2b's key range, hashed), with a
 * parent and extra keys, stopping at the last full block and at max_keys. */
Test(chain_hash, chain_keys_equals_block_by_block) {
  int32_t toks[103];
  for (int i = 0; i < 103; i++) toks[i] = i * 7919 - 50;
  const char *salts[] = {NULL, "s", "a-salt-of-16-bytes", NULL};
  size_t salt_lens[] = {0, 1, 18, 0};
  uint8_t parent[32] = {9, 8, 7};
  for (int s = 0; s < 4; s++) {
    const uint8_t *par = s == 3 ? parent : NULL;
    uint8_t keys[8][32], want[32], prev[32];
    int n = kvc_chain_keys(&keys[0][0], 8, par, toks, 103, 16, "lora:1", 6, salts[s], salt_lens[s]);
    cr_assert_eq(n, 6, "103 tokens: 6 full blocks of 16");
    for (int i = 0; i < n; i++) {
      cr_assert_eq(kvc_chain_hash(want, i ? prev : par, toks + 16 * i, 16, "lora:1", 6, salts[s],
                                  salt_lens[s]),
                   0);
      cr_assert_eq(memcmp(keys[i], want, 32), 0, "salt %d block %d", s, i);
      memcpy(prev, want, 32);
    }
  }
  uint8_t keys[2][32];
  cr_assert_eq(kvc_chain_keys(&keys[0][0], 2, NULL, toks, 103, 16, NULL, 0, NULL, 0), 2);
  cr_assert_eq(kvc_chain_keys(NULL, 0, NULL, toks, 15, 16, NULL, 0, NULL, 0), 0);
  cr_assert_eq(kvc_chain_keys(&keys[0][0], 2, NULL, toks, 103, 0, NULL, 0, NULL, 0), -EINVAL);
  cr_assert_eq(kvc_chain_keys(&keys[0][0], 2, NULL, NULL, 5, 1, NULL, 0, NULL, 0), -EINVAL);
  cr_assert_eq(kvc_chain_keys(NULL, 2, NULL, toks, 32, 16, NULL, 0, NULL, 0), -EINVAL);
}
