/* test_crc32c.c - CRC-32C: known vectors, hardware path == table path
 * for every length and alignment, and exact chaining. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_vectors(crc_fn f) {
  uint8_t b[32];
  cr_assert_eq(f(0, "123456789", 9), 0xE3069283u);
  cr_assert_eq(f(0, "", 0), 0u);
  memset(b, 0, 32); /* RFC 3720 B.4 */
  cr_assert_eq(f(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, 32);
  cr_assert_eq(f(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
  cr_assert_eq(f(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
  cr_assert_eq(f(0, b, 32), 0x113FDB5Cu);
}

Test(g3_crc32c, known_vectors_table) { check_vectors(kv_crc32c_sw); }

Test(g3_crc32c, known_vectors_dispatch) { check_vectors(kv_crc32c); }

Test(g3_crc32c, known_vectors_hw) {
  if (!kv_crc32c_hw_available()) cr_skip_test("no SSE4.2 on this CPU");
  check_vectors(kv_crc32c_hw);
}

/* Lengths around the three-stream block sizes (256, 8192) and odd
 * alignments: the hardware combine must match the table everywhere. */
Test(g3_crc32c, hw_matches_table) {
  if (!kv_crc32c_hw_available()) cr_skip_test("no SSE4.2 on this CPU");
  size_t max = 3 * 8192 * 3 + 64;
  uint8_t *b = malloc(max + 8);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < max + 8; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b[i] = (uint8_t)x;
  }
  size_t lens[] = {0,    1,    7,    8,    9,     255,   256,   767,   768,          769,
                   1000, 4096, 8191, 8192, 24575, 24576, 24577, 50000, 3 * 8192 * 3, max};
  for (size_t a = 0; a < 8; a++)
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      size_t n = lens[i];
      cr_assert_eq(kv_crc32c_hw(0, b + a, n), kv_crc32c_sw(0, b + a, n), "len %zu align %zu", n, a);
      cr_assert_eq(kv_crc32c_hw(0x12345678, b + a, n), kv_crc32c_sw(0x12345678, b + a, n));
    }
  free(b);
}

Test(g3_crc32c, chaining) {
  const char *s = "123456789";
  for (size_t cut = 0; cut <= 9; cut++) {
    uint32_t c = kv_crc32c(kv_crc32c(0, s, cut), s + cut, 9 - cut);
    cr_assert_eq(c, 0xE3069283u, "cut %zu", cut);
    c = kv_crc32c_sw(kv_crc32c_sw(0, s, cut), s + cut, 9 - cut);
    cr_assert_eq(c, 0xE3069283u, "cut %zu", cut);
  }
}

Test(g3_crc32c, detects_single_bit_flips) {
  uint8_t b[4096];
  memset(b, 0x5a, sizeof b);
  uint32_t ref = kv_crc32c(0, b, sizeof b);
  for (size_t i = 0; i < sizeof b; i += 61) {
    b[i] ^= 0x10;
    cr_assert_neq(kv_crc32c(0, b, sizeof b), ref);
    b[i] ^= 0x10;
  }
}
