/* test_g4_format.c - G4 value format and key names: round trips, each
 * refusal reason, every damaged header byte and every cut refused, random
 * bytes never accepted, names that keep namespaces apart. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "tiers/g4_format.h"

static kv_g4_key sample_key(uint8_t seed, uint8_t len) {
  kv_g4_key k;
  memset(&k, 0, sizeof k);
  for (int i = 0; i < KV_G4_NS_BYTES; i++) k.ns[i] = (uint8_t)(seed * 31 + i);
  k.len = len;
  for (int i = 0; i < len; i++) k.b[i] = (uint8_t)(seed + 7 * i);
  return k;
}

/* A value of len payload bytes for k, malloc'd; *n its length. */
static uint8_t *sample_value(const kv_g4_key *k, uint32_t len, size_t *n) {
  uint8_t *payload = malloc(len ? len : 1);
  for (uint32_t i = 0; i < len; i++) payload[i] = (uint8_t)(i * 131 + 17);
  *n = kv_g4_value_len(len);
  uint8_t *v = malloc(*n);
  cr_assert_eq(kv_g4_encode(k, payload, len, v), (long)*n);
  free(payload);
  return v;
}

static void expect_miss(const void *v, size_t n, const kv_g4_key *k, uint32_t elen, kv_g4_miss want,
                        const char *what) {
  kv_g4_view view = {.payload = NULL, .len = 0xdead};
  kv_g4_miss why = KV_G4_MISS_OK;
  int rc = kv_g4_check(v, n, k, elen, &view, &why);
  cr_assert_eq(rc, want == KV_G4_MISS_VERSION ? KV_EBADVERSION : KV_ECORRUPT, "%s: rc %d", what, rc);
  cr_assert_eq(why, want, "%s: %s, wanted %s", what, kv_g4_miss_name(why), kv_g4_miss_name(want));
  cr_assert_eq(view.len, 0xdead, "%s: the view is left alone", what);
}

Test(g4_format, round_trip_every_key_length_and_sizes) {
  uint32_t sizes[] = {0, 1, 95, 96, 4096, 65537, 1 << 20};
  for (uint8_t klen = 1; klen <= KV_G4_KEY_MAX; klen++)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      kv_g4_key k = sample_key(klen, klen);
      size_t n;
      uint8_t *v = sample_value(&k, sizes[i], &n);
      kv_g4_view view;
      kv_g4_miss why = KV_G4_MISS_SHORT;
      cr_assert_eq(kv_g4_check(v, n, &k, 0, &view, &why), 0, "klen %u size %u", klen, sizes[i]);
      cr_assert_eq(why, KV_G4_MISS_OK);
      cr_assert_eq(view.len, sizes[i]);
      cr_assert_eq(view.payload, v + KV_G4_HDR_LEN);
      cr_assert_eq(view.crc, kv_crc32c(0, view.payload, view.len));
      for (uint32_t j = 0; j < sizes[i]; j++) cr_assert_eq(view.payload[j], (uint8_t)(j * 131 + 17));
      /* the expected length, when given, must match */
      cr_assert_eq(kv_g4_check(v, n, &k, sizes[i] ? sizes[i] : 0, &view, NULL), 0);
      free(v);
    }
}

Test(g4_format, header_then_payload_apart_gives_the_same_value) {
  kv_g4_key k = sample_key(3, 32);
  size_t n;
  uint8_t *v = sample_value(&k, 5000, &n);
  uint8_t hdr[KV_G4_HDR_LEN];
  cr_assert_eq(kv_g4_encode_hdr(&k, 5000, kv_crc32c(0, v + KV_G4_HDR_LEN, 5000), hdr), 0);
  cr_assert_eq(memcmp(hdr, v, KV_G4_HDR_LEN), 0);
  free(v);
}

Test(g4_format, bad_arguments_are_refused) {
  kv_g4_key k = sample_key(1, 0);
  uint8_t out[KV_G4_HDR_LEN + 4];
  cr_assert_eq(kv_g4_encode_hdr(&k, 4, 0, out), -EINVAL);
  cr_assert_eq(kv_g4_encode(&k, "abcd", 4, out), -EINVAL);
  k.len = KV_G4_KEY_MAX + 1;
  cr_assert_eq(kv_g4_encode(&k, "abcd", 4, out), -EINVAL);
  k.len = 4;
  cr_assert_eq(kv_g4_encode_hdr(&k, KV_G4_PAYLOAD_MAX + 1, 0, out), -EINVAL);
}

Test(g4_format, each_reason_is_its_own) {
  kv_g4_key k = sample_key(9, 20);
  size_t n;
  uint8_t *v = sample_value(&k, 1000, &n);

  /* another namespace, another key, a key that is a prefix of the stored one */
  kv_g4_key other = k;
  other.ns[31] ^= 1;
  expect_miss(v, n, &other, 0, KV_G4_MISS_KEY, "other namespace");
  other = k;
  other.b[0] ^= 0x80;
  expect_miss(v, n, &other, 0, KV_G4_MISS_KEY, "other key");
  other = k;
  other.len = 19;
  expect_miss(v, n, &other, 0, KV_G4_MISS_KEY, "shorter key");

  /* cut short: inside the header, and inside the payload */
  expect_miss(v, 50, &k, 0, KV_G4_MISS_SHORT, "cut in the header");
  expect_miss(v, n - 1, &k, 0, KV_G4_MISS_SHORT, "cut in the payload");
  expect_miss(v, 2, &k, 0, KV_G4_MISS_SHORT, "two bytes");
  expect_miss(v, 0, &k, 0, KV_G4_MISS_SHORT, "empty");

  /* bytes beyond the payload; a length other than expected */
  uint8_t *longer = malloc(n + 1);
  memcpy(longer, v, n);
  longer[n] = 0;
  expect_miss(longer, n + 1, &k, 0, KV_G4_MISS_LENGTH, "a byte too many");
  free(longer);
  expect_miss(v, n, &k, 999, KV_G4_MISS_LENGTH, "not the length expected");

  /* not ours: a plain string, of any length */
  expect_miss("hello world", 11, &k, 0, KV_G4_MISS_MAGIC, "plain string");
  uint8_t zeros[200] = {0};
  expect_miss(zeros, sizeof zeros, &k, 0, KV_G4_MISS_MAGIC, "zeros");

  /* another version (the header CRC made right, as a newer writer would) */
  uint8_t *w = malloc(n);
  memcpy(w, v, n);
  w[4] = 2;
  expect_miss(w, n, &k, 0, KV_G4_MISS_VERSION, "version 2");
  uint8_t hdr[KV_G4_HDR_LEN];
  memcpy(w, v, n);
  w[6] = 128; /* another header length */
  expect_miss(w, n, &k, 0, KV_G4_MISS_VERSION, "header length 128");

  /* a flipped payload bit; a flipped header bit */
  memcpy(w, v, n);
  w[KV_G4_HDR_LEN + 500] ^= 4;
  expect_miss(w, n, &k, 0, KV_G4_MISS_PAYLOAD_CRC, "payload bit");
  memcpy(w, v, n);
  w[12] ^= 1; /* payload length */
  expect_miss(w, n, &k, 0, KV_G4_MISS_HEADER_CRC, "length bit");

  /* a header whose payload CRC is wrong from the start */
  cr_assert_eq(kv_g4_encode_hdr(&k, 1000, 12345, hdr), 0);
  memcpy(w, hdr, KV_G4_HDR_LEN);
  memcpy(w + KV_G4_HDR_LEN, v + KV_G4_HDR_LEN, 1000);
  expect_miss(w, n, &k, 0, KV_G4_MISS_PAYLOAD_CRC, "wrong payload CRC");
  free(w);
  free(v);

  cr_assert_str_eq(kv_g4_miss_name(KV_G4_MISS_PAYLOAD_CRC), "payload_crc");
  cr_assert_str_eq(kv_g4_miss_name(KV_G4_MISS_COUNT), "?");
  cr_assert_str_eq(kv_g4_miss_name(-1), "?");
}

Test(g4_format, every_damaged_header_byte_and_every_cut_is_refused) {
  kv_g4_key k = sample_key(4, 32);
  size_t n;
  uint8_t *v = sample_value(&k, 300, &n);
  kv_g4_view view;
  for (size_t i = 0; i < KV_G4_HDR_LEN; i++)
    for (int bit = 0; bit < 8; bit++) {
      v[i] ^= (uint8_t)(1 << bit);
      kv_g4_miss why = KV_G4_MISS_OK;
      cr_assert_neq(kv_g4_check(v, n, &k, 0, &view, &why), 0, "byte %zu bit %d", i, bit);
      cr_assert_neq(why, KV_G4_MISS_OK);
      v[i] ^= (uint8_t)(1 << bit);
    }
  for (size_t cut = 0; cut < n; cut++) {
    kv_g4_miss why = KV_G4_MISS_OK;
    cr_assert_neq(kv_g4_check(v, cut, &k, 0, &view, &why), 0, "cut at %zu", cut);
    cr_assert(why == KV_G4_MISS_SHORT, "cut at %zu: %s", cut, kv_g4_miss_name(why));
  }
  cr_assert_eq(kv_g4_check(v, n, &k, 0, &view, NULL), 0);
  free(v);
}

/* Random bytes, random bytes behind a valid magic, and valid values with
 * random damage anywhere: never accepted, unless the damage left them
 * unchanged. */
Test(g4_format, fuzzed_values_are_never_accepted) {
  srand(20);
  kv_g4_key k = sample_key(5, 16);
  size_t n;
  uint8_t *v = sample_value(&k, 777, &n);
  uint8_t *w = malloc(n + 64);
  kv_g4_view view;
  for (int iter = 0; iter < 20000; iter++) {
    size_t len = (size_t)rand() % (n + 64);
    int mode = iter % 3;
    if (mode < 2) {
      for (size_t i = 0; i < len; i++) w[i] = (uint8_t)rand();
      if (mode == 1 && len >= 4) { /* a real header's first bytes, then noise */
        size_t keep = 4 + (size_t)rand() % 90;
        memcpy(w, v, keep < len ? keep : len);
      }
    } else {
      len = n;
      memcpy(w, v, n);
      int flips = 1 + rand() % 4;
      for (int f = 0; f < flips; f++) w[(size_t)rand() % n] ^= (uint8_t)(1 + rand() % 255);
      if (!memcmp(w, v, n)) continue;
    }
    kv_g4_miss why = KV_G4_MISS_OK;
    cr_assert_neq(kv_g4_check(w, len, &k, 0, &view, &why), 0, "iteration %d mode %d", iter, mode);
    cr_assert_neq(why, KV_G4_MISS_OK);
  }
  free(w);
  free(v);
}

Test(g4_format, redis_key_names) {
  kv_g4_key k = sample_key(0, 2);
  memset(k.ns, 0, sizeof k.ns);
  k.ns[0] = 0xab;
  k.b[0] = 0x01;
  k.b[1] = 0xff;
  char out[KV_G4_RKEY_MAX];
  int n = kv_g4_rkey(NULL, &k, out, sizeof out);
  cr_assert_eq(n, 3 + 64 + 1 + 4);
  cr_assert_str_eq(out, "kv:ab00000000000000000000000000000000000000000000000000000000000000:01ff");
  cr_assert_eq(kv_g4_rkey("fleet7/", &k, out, sizeof out), 7 + 64 + 1 + 4);
  cr_assert_eq(strncmp(out, "fleet7/ab00", 11), 0);
  /* the longest name fits KV_G4_RKEY_MAX, one byte less does not */
  kv_g4_key big = sample_key(1, KV_G4_KEY_MAX);
  char prefix[KV_G4_PREFIX_MAX + 2];
  memset(prefix, 'p', KV_G4_PREFIX_MAX);
  prefix[KV_G4_PREFIX_MAX] = 0;
  cr_assert_eq(kv_g4_rkey(prefix, &big, out, sizeof out), KV_G4_RKEY_MAX - 1);
  cr_assert_eq(kv_g4_rkey(prefix, &big, out, sizeof out - 1), -ENAMETOOLONG);
  /* prefixes that would make a hash tag, hold a space, or are too long */
  cr_assert_eq(kv_g4_rkey("kv{x}:", &k, out, sizeof out), -EINVAL);
  cr_assert_eq(kv_g4_rkey("k v", &k, out, sizeof out), -EINVAL);
  prefix[KV_G4_PREFIX_MAX] = 'p';
  prefix[KV_G4_PREFIX_MAX + 1] = 0;
  cr_assert_eq(kv_g4_rkey(prefix, &big, out, sizeof out), -EINVAL);
  cr_assert(kv_g4_prefix_ok(""));
  k.len = 0;
  cr_assert_eq(kv_g4_rkey(NULL, &k, out, sizeof out), -EINVAL);
}

/* Two namespaces with the same key, and keys where one is the other's
 * prefix, never share a name: the namespace part has a fixed width and
 * the key part its own length. */
Test(g4_format, names_keep_namespaces_and_keys_apart) {
  kv_g4_key a = sample_key(1, 8), b = a, c = a;
  b.ns[5] ^= 1;
  c.len = 9;
  c.b[8] = 0;
  char na[KV_G4_RKEY_MAX], nb[KV_G4_RKEY_MAX], nc[KV_G4_RKEY_MAX];
  kv_g4_rkey(NULL, &a, na, sizeof na);
  kv_g4_rkey(NULL, &b, nb, sizeof nb);
  kv_g4_rkey(NULL, &c, nc, sizeof nc);
  cr_assert_str_neq(na, nb);
  cr_assert_str_neq(na, nc);
  cr_assert_eq(strchr(na, '{'), NULL, "no hash tag: names spread over every slot");
}
