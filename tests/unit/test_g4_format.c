/* test_g4_format.c - G4 value format and key names: round trips, each
 * refusal reason, every damaged header byte and every cut refused, random
 * bytes never accepted, names that keep namespaces apart; values forged by
 * whoever lacks the fleet's secret (issue 34: a correct header and both
 * CRCs were enough) refused as `mac`, and the old secret of a rotation
 * accepted until its end only; the MAC equal to libsodium's Poly1305
 * whichever library computes it, a payload that does not match its CRC
 * never signed, and one pass over a signed value's payload. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "base/le.h"
#include "tiers/g4_format.h"

#define NOW 1790000000 /* a time for the checks: 2026-09-21 */

/* A secret of len bytes made from seed. */
static kv_g4_secret sample_secret(uint8_t seed, size_t len) {
  uint8_t b[KV_G4_SECRET_MAX];
  for (size_t i = 0; i < len; i++) b[i] = (uint8_t)(seed * 13 + i * 29 + 1);
  kv_g4_secret s;
  cr_assert_eq(kv_g4_secret_init(&s, b, len), 0);
  return s;
}

/* The fleet's secrets of these tests: the current one alone. */
static kv_g4_keys fleet(void) {
  kv_g4_keys keys;
  memset(&keys, 0, sizeof keys);
  keys.cur = sample_secret(1, 32);
  return keys;
}

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
  kv_g4_keys keys = fleet();
  cr_assert_eq(kv_g4_encode(k, &keys.cur, payload, len, v), (long)*n);
  free(payload);
  return v;
}

static void expect_miss(const void *v, size_t n, const kv_g4_key *k, uint32_t elen, kv_g4_miss want,
                        const char *what) {
  kv_g4_view view = {.payload = NULL, .len = 0xdead};
  kv_g4_miss why = KV_G4_MISS_OK;
  kv_g4_keys keys = fleet();
  int rc = kv_g4_check(v, n, k, elen, &keys, NOW, &view, &why);
  cr_assert_eq(rc, want == KV_G4_MISS_VERSION ? KV_EBADVERSION : KV_ECORRUPT, "%s: rc %d", what, rc);
  cr_assert_eq(why, want, "%s: %s, wanted %s", what, kv_g4_miss_name(why), kv_g4_miss_name(want));
  cr_assert_eq(view.len, 0xdead, "%s: the view is left alone", what);
}

Test(g4_format, round_trip_every_key_length_and_sizes) {
  uint32_t sizes[] = {0, 1, 95, 96, 4096, 65537, 1 << 20};
  kv_g4_keys keys = fleet();
  for (uint8_t klen = 1; klen <= KV_G4_KEY_MAX; klen++)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      kv_g4_key k = sample_key(klen, klen);
      size_t n;
      uint8_t *v = sample_value(&k, sizes[i], &n);
      kv_g4_view view;
      kv_g4_miss why = KV_G4_MISS_SHORT;
      cr_assert_eq(kv_g4_check(v, n, &k, 0, &keys, NOW, &view, &why), 0, "klen %u size %u", klen,
                   sizes[i]);
      cr_assert_eq(why, KV_G4_MISS_OK);
      cr_assert_eq(view.len, sizes[i]);
      cr_assert_eq(view.payload, v + KV_G4_HDR_LEN);
      cr_assert_eq(view.crc, kv_crc32c(0, view.payload, view.len));
      for (uint32_t j = 0; j < sizes[i]; j++) cr_assert_eq(view.payload[j], (uint8_t)(j * 131 + 17));
      /* the expected length, when given, must match */
      cr_assert_eq(kv_g4_check(v, n, &k, sizes[i] ? sizes[i] : 0, &keys, NOW, &view, NULL), 0);
      free(v);
    }
}

/* The same header but for its nonce and MAC (fresh for each value), and
 * a value that verifies. */
Test(g4_format, header_then_payload_apart_gives_the_same_value) {
  kv_g4_key k = sample_key(3, 32);
  size_t n;
  uint8_t *v = sample_value(&k, 5000, &n);
  uint8_t hdr[KV_G4_HDR_LEN];
  kv_g4_keys keys = fleet();
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, v + KV_G4_HDR_LEN, 5000,
                                kv_crc32c(0, v + KV_G4_HDR_LEN, 5000), hdr),
               0);
  cr_assert_eq(memcmp(hdr, v, 96), 0);
  cr_assert_neq(memcmp(hdr + 96, v + 96, KV_G4_NONCE_BYTES), 0, "a nonce used twice");
  memcpy(v, hdr, KV_G4_HDR_LEN);
  kv_g4_view view;
  cr_assert_eq(kv_g4_check(v, n, &k, 5000, &keys, NOW, &view, NULL), 0);
  free(v);
}

Test(g4_format, bad_arguments_are_refused) {
  kv_g4_key k = sample_key(1, 0);
  kv_g4_keys keys = fleet();
  uint8_t out[KV_G4_HDR_LEN + 4];
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, "abcd", 4, 0, out), -EINVAL);
  cr_assert_eq(kv_g4_encode(&k, &keys.cur, "abcd", 4, out), -EINVAL);
  k.len = KV_G4_KEY_MAX + 1;
  cr_assert_eq(kv_g4_encode(&k, &keys.cur, "abcd", 4, out), -EINVAL);
  k.len = 4;
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, "abcd", KV_G4_PAYLOAD_MAX + 1, 0, out), -EINVAL);
  /* no secret, or one of a length BLAKE2b does not take as a key */
  kv_g4_secret none;
  memset(&none, 0, sizeof none);
  cr_assert_eq(kv_g4_encode(&k, &none, "abcd", 4, out), -EINVAL);
  uint8_t b[KV_G4_SECRET_MAX + 1] = {1};
  kv_g4_secret s;
  cr_assert_eq(kv_g4_secret_init(&s, b, KV_G4_SECRET_MIN - 1), -EINVAL);
  cr_assert_eq(kv_g4_secret_init(&s, b, KV_G4_SECRET_MAX + 1), -EINVAL);
  cr_assert_eq(kv_g4_secret_init(&s, b, KV_G4_SECRET_MAX), 0);
  cr_assert_eq(s.len, KV_G4_SECRET_MAX);
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

  /* another version: an older writer's (1, without a MAC), a newer one's
   * (3 is a coded value's: coded_values) */
  uint8_t *w = malloc(n);
  memcpy(w, v, n);
  w[4] = 1;
  expect_miss(w, n, &k, 0, KV_G4_MISS_VERSION, "version 1");
  w[4] = 4;
  expect_miss(w, n, &k, 0, KV_G4_MISS_VERSION, "version 4");
  uint8_t hdr[KV_G4_HDR_LEN];
  memcpy(w, v, n);
  w[6] = 96; /* another header length: version 1's */
  expect_miss(w, n, &k, 0, KV_G4_MISS_VERSION, "header length 96");

  /* a flipped payload bit; a flipped header bit */
  memcpy(w, v, n);
  w[KV_G4_HDR_LEN + 500] ^= 4;
  expect_miss(w, n, &k, 0, KV_G4_MISS_PAYLOAD_CRC, "payload bit");
  memcpy(w, v, n);
  w[12] ^= 1; /* payload length */
  expect_miss(w, n, &k, 0, KV_G4_MISS_HEADER_CRC, "length bit");

  /* a header whose payload CRC is wrong from the start: not signed
   * (an earlier writer's such value: a_signed_crc_saves_the_readers_pass) */
  kv_g4_keys keys = fleet();
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, v + KV_G4_HDR_LEN, 1000, 12345, hdr), KV_ECORRUPT);
  memcpy(w, v, n);
  kv_st32(w + 16, 12345);
  kv_st32(w + KV_G4_HDR_LEN - 4, kv_crc32c(0, w, KV_G4_HDR_LEN - 4));
  expect_miss(w, n, &k, 0, KV_G4_MISS_PAYLOAD_CRC, "wrong payload CRC");
  free(w);
  free(v);

  cr_assert_str_eq(kv_g4_miss_name(KV_G4_MISS_PAYLOAD_CRC), "payload_crc");
  cr_assert_str_eq(kv_g4_miss_name(KV_G4_MISS_MAC), "mac");
  cr_assert_str_eq(kv_g4_miss_name(KV_G4_MISS_COUNT), "?");
  cr_assert_str_eq(kv_g4_miss_name(-1), "?");
}

Test(g4_format, every_damaged_header_byte_and_every_cut_is_refused) {
  kv_g4_key k = sample_key(4, 32);
  size_t n;
  uint8_t *v = sample_value(&k, 300, &n);
  kv_g4_view view;
  kv_g4_keys keys = fleet();
  for (size_t i = 0; i < KV_G4_HDR_LEN; i++)
    for (int bit = 0; bit < 8; bit++) {
      v[i] ^= (uint8_t)(1 << bit);
      kv_g4_miss why = KV_G4_MISS_OK;
      cr_assert_neq(kv_g4_check(v, n, &k, 0, &keys, NOW, &view, &why), 0, "byte %zu bit %d", i,
                    bit);
      cr_assert_neq(why, KV_G4_MISS_OK);
      v[i] ^= (uint8_t)(1 << bit);
    }
  for (size_t cut = 0; cut < n; cut++) {
    kv_g4_miss why = KV_G4_MISS_OK;
    cr_assert_neq(kv_g4_check(v, cut, &k, 0, &keys, NOW, &view, &why), 0, "cut at %zu", cut);
    cr_assert(why == KV_G4_MISS_SHORT, "cut at %zu: %s", cut, kv_g4_miss_name(why));
  }
  cr_assert_eq(kv_g4_check(v, n, &k, 0, &keys, NOW, &view, NULL), 0);
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
  kv_g4_keys keys = fleet();
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
    cr_assert_neq(kv_g4_check(w, len, &k, 0, &keys, NOW, &view, &why), 0, "iteration %d mode %d",
                  iter, mode);
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

/* --- issue 34: values nobody without the fleet's secret can forge -------- */

/* Makes both CRCs of value w[0..n) right again, as whoever rewrites a
 * value in Redis can: base/crc32c.h, as kv_g4_encode computes them. */
static void fix_crcs(uint8_t *w, size_t n) {
  kv_st32(w + 16, kv_crc32c(0, w + KV_G4_HDR_LEN, n - KV_G4_HDR_LEN));
  kv_st32(w + KV_G4_HDR_LEN - 4, kv_crc32c(0, w, KV_G4_HDR_LEN - 4));
}

/* The issue: a value rewritten with a correct header and both CRCs was
 * served as the tenant's block. Every forgery here passes every check but
 * the MAC, and is refused as `mac`. */
Test(g4_format, forged_values_are_refused_as_mac) {
  kv_g4_key k = sample_key(7, 32);
  size_t n;
  uint8_t *v = sample_value(&k, 4096, &n);
  uint8_t *w = malloc(n);
  kv_g4_keys keys = fleet();
  kv_g4_view view;
  cr_assert_eq(kv_g4_check(v, n, &k, 4096, &keys, NOW, &view, NULL), 0);
  cr_assert_eq(kv_ld32(v + 20), keys.cur.id, "the header names the secret that signed it");

  /* the payload replaced, both CRCs made right (the attack of the issue) */
  memcpy(w, v, n);
  memset(w + KV_G4_HDR_LEN + 100, 0xee, 64);
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "payload changed, CRCs recomputed");

  /* a whole value made by kv_g4_encode with another secret (another
   * fleet's, or a guess), as it is and naming the fleet's secret */
  kv_g4_secret other = sample_secret(2, 32);
  cr_assert_eq(kv_g4_encode(&k, &other, v + KV_G4_HDR_LEN, 4096, w), (long)n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "another secret");
  kv_st32(w + 20, keys.cur.id);
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "another secret under the fleet's id");

  /* no MAC (zeros), and the right MAC with one bit flipped */
  memcpy(w, v, n);
  memset(w + 108, 0, KV_G4_MAC_BYTES);
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "no MAC");
  for (int i = 0; i < KV_G4_MAC_BYTES; i++) {
    memcpy(w, v, n);
    w[108 + i] ^= (uint8_t)(1 << (i & 7));
    fix_crcs(w, n);
    expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "a MAC bit flipped");
  }

  /* the header changed under the MAC: flags, a reserved field, and the
   * value moved to another block (its namespace and key rewritten) */
  memcpy(w, v, n);
  w[9] ^= 0x80;
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "flags");
  memcpy(w, v, n);
  w[9] = 0; /* "an earlier writer's": its CRC is checked, then its MAC */
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "flags cleared");
  memcpy(w, v, n);
  w[96] ^= 1;
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "nonce");
  memcpy(w, v, n);
  w[88] = 1;
  fix_crcs(w, n);
  expect_miss(w, n, &k, 4096, KV_G4_MISS_MAC, "reserved");
  kv_g4_key k2 = sample_key(8, 32);
  memcpy(w, v, n);
  memcpy(w + 24, k2.ns, KV_G4_NS_BYTES);
  memcpy(w + 56, k2.b, KV_G4_KEY_MAX);
  fix_crcs(w, n);
  expect_miss(w, n, &k2, 4096, KV_G4_MISS_MAC, "moved to another block");

  /* a reader with another fleet's secret refuses the fleet's values */
  kv_g4_keys theirs;
  memset(&theirs, 0, sizeof theirs);
  theirs.cur = other;
  kv_g4_miss why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(v, n, &k, 4096, &theirs, NOW, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
  /* and the value as its writer made it is still good */
  cr_assert_eq(kv_g4_check(v, n, &k, 4096, &keys, NOW, &view, NULL), 0);
  free(w);
  free(v);
}

/* A rotation: values signed by the old secret are accepted until
 * old_until (excluded), then refused as `mac`; the new secret's always;
 * a reader picks the secret by the header's id. */
Test(g4_format, the_old_secret_is_accepted_until_its_end_only) {
  kv_g4_secret a = sample_secret(1, 32), b = sample_secret(3, 64);
  cr_assert_neq(a.id, b.id);
  kv_g4_key k = sample_key(2, 16);
  uint8_t payload[1000];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 3);
  size_t n = kv_g4_value_len(sizeof payload);
  uint8_t *va = malloc(n), *vb = malloc(n);
  cr_assert_eq(kv_g4_encode(&k, &a, payload, sizeof payload, va), (long)n);
  cr_assert_eq(kv_g4_encode(&k, &b, payload, sizeof payload, vb), (long)n);
  kv_g4_view view;
  kv_g4_miss why;
  kv_g4_keys rot;
  memset(&rot, 0, sizeof rot);
  rot.cur = b;
  rot.old = a;
  rot.old_until = NOW;
  cr_assert_eq(kv_g4_check(va, n, &k, 0, &rot, NOW - 1, &view, NULL), 0, "old, in the window");
  cr_assert_eq(kv_g4_check(vb, n, &k, 0, &rot, NOW - 1, &view, NULL), 0, "new");
  why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(va, n, &k, 0, &rot, NOW, &view, &why), KV_ECORRUPT, "old, at its end");
  cr_assert_eq(why, KV_G4_MISS_MAC);
  why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(va, n, &k, 0, &rot, NOW + 86400, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
  cr_assert_eq(kv_g4_check(vb, n, &k, 0, &rot, NOW + 86400, &view, NULL), 0, "new, after");
  /* without the old secret, its values are refused at any time; a node
   * not given the new secret yet refuses the new values */
  kv_g4_keys only_b = rot, only_a = rot;
  memset(&only_b.old, 0, sizeof only_b.old);
  only_a.cur = a;
  memset(&only_a.old, 0, sizeof only_a.old);
  why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(va, n, &k, 0, &only_b, NOW - 1, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
  why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(vb, n, &k, 0, &only_a, NOW - 1, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
  /* an old value under a forged MAC is refused in the window too */
  va[108] ^= 1;
  fix_crcs(va, n);
  why = KV_G4_MISS_OK;
  cr_assert_eq(kv_g4_check(va, n, &k, 0, &rot, NOW - 1, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
  /* ids: the same secret, the same id; they tell nothing of it */
  kv_g4_secret a2 = sample_secret(1, 32);
  cr_assert_eq(a2.id, a.id);
  cr_assert_neq(a.id, kv_ld32(a.b));
  free(va);
  free(vb);
}

/* The MAC as RFC 8439 and libsodium define it: Poly1305 of bytes 0..107
 * then the payload under ChaCha20(mac key, nonce)'s first 32 bytes. */
static void sodium_mac(const kv_g4_secret *s, const uint8_t *v, size_t n, uint8_t tag[16]) {
  uint8_t otk[32] = {0};
  crypto_stream_chacha20_ietf_xor(otk, otk, sizeof otk, v + 96, s->mk);
  crypto_onetimeauth_state st;
  crypto_onetimeauth_init(&st, otk);
  crypto_onetimeauth_update(&st, v, 108);
  crypto_onetimeauth_update(&st, v + KV_G4_HDR_LEN, n - KV_G4_HDR_LEN);
  crypto_onetimeauth_final(&st, tag);
}

/* Signs w as a holder of s would, with whatever flags and CRC it has. */
static void resign(uint8_t *w, size_t n, const kv_g4_secret *s) {
  sodium_mac(s, w, n, w + 108);
  kv_st32(w + KV_G4_HDR_LEN - 4, kv_crc32c(0, w, KV_G4_HDR_LEN - 4));
}

/* libcrypto computes the tags now: they must be the ones every earlier
 * writer and reader (libsodium) computes, at every length. */
Test(g4_format, the_mac_is_libsodiums_poly1305) {
  uint32_t sizes[] = {0, 1, 15, 16, 17, 95, 4096, 65537, 1 << 20};
  kv_g4_keys keys = fleet();
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    kv_g4_key k = sample_key(4, 32);
    size_t n;
    uint8_t *v = sample_value(&k, sizes[i], &n);
    uint8_t tag[16];
    sodium_mac(&keys.cur, v, n, tag);
    cr_assert_eq(memcmp(tag, v + 108, 16), 0, "size %u: the MAC is not libsodium's", sizes[i]);
    free(v);
  }
}

Test(g4_format, a_payload_that_does_not_match_its_crc_is_not_signed) {
  kv_g4_key k = sample_key(5, 32);
  kv_g4_keys keys = fleet();
  uint8_t payload[3000], out[KV_G4_HDR_LEN];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 7);
  uint32_t crc = kv_crc32c(0, payload, sizeof payload);
  payload[1234] ^= 1; /* changed after its CRC was taken */
  memset(out, 0xab, sizeof out);
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, payload, sizeof payload, crc, out), KV_ECORRUPT);
  for (size_t i = 0; i < sizeof out; i++) cr_assert_eq(out[i], 0xab, "byte %zu written", i);
  payload[1234] ^= 1;
  cr_assert_eq(kv_g4_encode_hdr(&k, &keys.cur, payload, sizeof payload, crc, out), 0);
  cr_assert_eq(out[9], 1, "the header says its signer checked the CRC");
}

/* A value whose signer checked its CRC is read in one pass, the MAC's: a
 * key holder's value whose payload does not match its CRC is taken as
 * signed (kv_g4_encode_hdr never writes one). Without the flag (a writer
 * before it) the CRC is checked first, as before. Damage to either is a
 * miss with its reason. */
Test(g4_format, a_signed_crc_saves_the_readers_pass) {
  kv_g4_key k = sample_key(6, 32);
  kv_g4_keys keys = fleet();
  size_t n;
  uint8_t *v = sample_value(&k, 8192, &n);
  uint8_t *w = malloc(n);
  kv_g4_view view;
  /* the payload changed by a key holder, its CRC left: accepted with the
   * flag (no CRC pass), refused as payload_crc without it */
  memcpy(w, v, n);
  w[KV_G4_HDR_LEN + 10] ^= 0x40;
  resign(w, n, &keys.cur);
  cr_assert_eq(kv_g4_check(w, n, &k, 8192, &keys, NOW, &view, NULL), 0);
  cr_assert_eq(view.crc, kv_ld32(v + 16));
  w[9] = 0;
  resign(w, n, &keys.cur);
  expect_miss(w, n, &k, 8192, KV_G4_MISS_PAYLOAD_CRC, "no flag: CRC checked");
  /* an earlier writer's intact value is accepted */
  memcpy(w, v, n);
  w[9] = 0;
  resign(w, n, &keys.cur);
  cr_assert_eq(kv_g4_check(w, n, &k, 8192, &keys, NOW, &view, NULL), 0);
  /* damage after signing, flag or not: payload_crc, not mac */
  for (int flag = 0; flag <= 1; flag++) {
    memcpy(w, v, n);
    w[9] = (uint8_t)flag;
    resign(w, n, &keys.cur);
    w[n - 1] ^= 1;
    expect_miss(w, n, &k, 8192, KV_G4_MISS_PAYLOAD_CRC, "damaged payload");
  }
  free(w);
  free(v);
}

/* A coded value (version 3, tiers/codec.h): header then the stored bytes.
 * Checked, it gives the stored bytes, their length and the block's length
 * and CRC; the MAC covers the stored bytes; damage to them is
 * payload_crc, a stored length that does not fit or does not shrink is
 * length or short, and a version-2 header over coded bytes is refused. */
Test(g4_format, coded_values) {
  kv_g4_keys keys = fleet();
  kv_g4_key k = sample_key(3, 16);
  uint8_t stored[100], blockcrc[4];
  for (int i = 0; i < 100; i++) stored[i] = (uint8_t)(i * 37 + 5);
  kv_st32(blockcrc, 0x12345678u);
  uint8_t v[KV_G4_HDR_LEN + 100];
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 100, 1, 1, 0, v), -EINVAL,
               "a stored length not below the block's is refused");
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 0, 4096, 1, 1, 0, v), -EINVAL);
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, 1, 0, 0, v), -EINVAL,
               "coding 0 is only read");
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, 1, 4, 0, v), -EINVAL);
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, 1, 2, 3, v), -EINVAL,
               "a lossy coding needs a dtype of 1 or 2");
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, 1, 1, 1, v), -EINVAL,
               "the lossless one has none");
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, 1, 3, 2, v), 0);
  cr_assert_eq(v[10], 3);
  cr_assert_eq(v[11], 2);
  cr_assert_eq(kv_g4_encode_hdr_coded(&k, &keys.cur, stored, 100, 4096, kv_ld32(blockcrc),
                                      KV_G4_CODING_PLANES, 0, v),
               0);
  memcpy(v + KV_G4_HDR_LEN, stored, 100);
  cr_assert_eq(kv_ld16(v + 4), KV_G4_VERSION_CODED);
  kv_g4_view view;
  kv_g4_miss why;
  cr_assert_eq(kv_g4_check(v, sizeof v, &k, 4096, &keys, NOW, &view, &why), 0,
               "%s", kv_g4_miss_name(why));
  cr_assert(view.coded);
  cr_assert_eq(view.coding, KV_G4_CODING_PLANES);
  cr_assert_eq(view.dtype, 0);
  cr_assert_eq(view.len, 4096);
  cr_assert_eq(view.stored_len, 100);
  cr_assert_eq(view.crc, 0x12345678u);
  cr_assert_eq(view.payload, v + KV_G4_HDR_LEN);
  expect_miss(v, sizeof v, &k, 8192, KV_G4_MISS_LENGTH, "another block length expected");
  expect_miss(v, sizeof v - 1, &k, 4096, KV_G4_MISS_SHORT, "cut short");
  uint8_t w[sizeof v + 1];
  memcpy(w, v, sizeof v);
  w[sizeof v] = 0;
  expect_miss(w, sizeof w, &k, 4096, KV_G4_MISS_LENGTH, "a byte past the stored bytes");
  memcpy(w, v, sizeof v);
  w[KV_G4_HDR_LEN + 50] ^= 1;
  expect_miss(w, sizeof v, &k, 4096, KV_G4_MISS_PAYLOAD_CRC, "a stored byte flipped");
  /* header fields rewritten, the header's CRC made right (not the MAC) */
  struct {
    int off, width;
    uint32_t val;
    kv_g4_miss want;
    const char *what;
  } cases[] = {
      {88, 4, 4096, KV_G4_MISS_LENGTH, "stored length = block length"},
      {88, 4, 0, KV_G4_MISS_LENGTH, "stored length 0"},
      {88, 4, 99, KV_G4_MISS_LENGTH, "stored length one short"},
      {88, 4, 101, KV_G4_MISS_SHORT, "stored length one long"},
      {4, 2, KV_G4_VERSION, KV_G4_MISS_SHORT, "version 2 over coded bytes (4096 expected)"},
      {4, 2, 4, KV_G4_MISS_VERSION, "version 4"},
      {92, 4, 0, KV_G4_MISS_PAYLOAD_CRC, "the stored CRC (the MAC fails, then it)"},
      {10, 1, 4, KV_G4_MISS_VERSION, "a coding this reader does not know"},
      {10, 1, 2, KV_G4_MISS_VERSION, "a lossy coding without its dtype"},
      {11, 1, 1, KV_G4_MISS_VERSION, "the lossless coding with a dtype"},
      {10, 1, 0, KV_G4_MISS_MAC, "coding 0 (read as the lossless one): under the MAC"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(w, v, sizeof v);
    if (cases[i].width == 1)
      w[cases[i].off] = (uint8_t)cases[i].val;
    else if (cases[i].width == 2)
      kv_st16(w + cases[i].off, (uint16_t)cases[i].val);
    else
      kv_st32(w + cases[i].off, cases[i].val);
    kv_st32(w + KV_G4_HDR_LEN - 4, kv_crc32c(0, w, KV_G4_HDR_LEN - 4));
    expect_miss(w, sizeof v, &k, 4096, cases[i].want, cases[i].what);
  }
  /* another fleet's secret */
  kv_g4_keys other = {.cur = sample_secret(9, 32)};
  cr_assert_eq(kv_g4_check(v, sizeof v, &k, 4096, &other, NOW, &view, &why), KV_ECORRUPT);
  cr_assert_eq(why, KV_G4_MISS_MAC);
}
