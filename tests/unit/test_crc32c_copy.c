/* test_crc32c_copy.c - kv_crc32c_copy, the one-pass copy and checksum that
 * writers and readers of G2 blocks use: on the SSE4.2 path and the
 * VPCLMULQDQ path (each with ordinary and with non-temporal stores), the
 * table path and the dispatch, for
 * random lengths and alignments of both sides, it
 * writes exactly src's bytes into dst (nothing around it) and returns the
 * table CRC-32C of them, chaining from any start value. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"

typedef uint32_t (*copy_fn)(uint32_t, void *, const void *, size_t);

static uint64_t rnd_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rnd_state ^= rnd_state << 13, rnd_state ^= rnd_state >> 7, rnd_state ^= rnd_state << 17;
  return rnd_state;
}

#define MAXLEN (3 * 8192 * 4 + 3 * 256 * 2 + 64)
#define GUARD  16

static void check_copy(copy_fn f, const char *name) {
  uint8_t *src = malloc(MAXLEN + 64), *dst = malloc(MAXLEN + 64 + 2 * GUARD);
  cr_assert(src && dst);
  for (size_t i = 0; i < MAXLEN + 64; i++) src[i] = (uint8_t)rnd();
  /* the lengths around the stream sizes, then random ones */
  size_t fixed[] = {0,   1,   7,     8,     9,     15,    16,          17,    767,
                    768, 769, 24575, 24576, 24577, 49152, 49152 + 768, MAXLEN};
  for (int k = 0; k < 400; k++) {
    size_t len = k < (int)(sizeof fixed / sizeof fixed[0]) ? fixed[k] : (size_t)(rnd() % MAXLEN);
    size_t sa = (size_t)(rnd() % 64), da = (size_t)(rnd() % 64);
    uint32_t start = k % 3 == 0 ? 0 : (uint32_t)rnd();
    memset(dst, 0xcc, MAXLEN + 64 + 2 * GUARD);
    uint8_t *d = dst + GUARD + da;
    uint32_t got = f(start, d, src + sa, len);
    cr_assert_eq(got, kv_crc32c_sw(start, src + sa, len), "%s: len %zu, src +%zu, dst +%zu", name,
                 len, sa, da);
    cr_assert(len == 0 || !memcmp(d, src + sa, len), "%s: dst differs (len %zu)", name, len);
    for (size_t g = 0; g < GUARD + da; g++)
      cr_assert_eq(dst[g], 0xcc, "%s: wrote before dst", name);
    for (size_t g = 0; g < GUARD; g++) cr_assert_eq(d[len + g], 0xcc, "%s: wrote past dst", name);
  }
  /* chaining: two copies of halves give the CRC of the whole */
  for (size_t cut = 0; cut < 50000; cut += 4999) {
    uint32_t c = f(0, dst, src, cut);
    c = f(c, dst + cut, src + cut, 50000 - cut);
    cr_assert_eq(c, kv_crc32c_sw(0, src, 50000), "%s: chained at %zu", name, cut);
  }
  free(src);
  free(dst);
}

Test(crc32c_copy, table_path) { check_copy(kv_crc32c_copy_sw, "table"); }

Test(crc32c_copy, hw_path) {
  if (!kv_crc32c_hw_available()) cr_skip_test("no SSE4.2 on this CPU");
  check_copy(kv_crc32c_copy_hw, "sse4.2");
}

Test(crc32c_copy, hw_path_non_temporal) {
  if (!kv_crc32c_hw_available()) cr_skip_test("no SSE4.2 on this CPU");
  check_copy(kv_crc32c_copy_nt_hw, "sse4.2, non-temporal");
}

Test(crc32c_copy, clmul_path) {
  if (!kv_crc32c_clmul_available()) cr_skip_test("no AVX2 + VPCLMULQDQ on this CPU");
  check_copy(kv_crc32c_copy_clmul, "vpclmulqdq");
  check_copy(kv_crc32c_copy_nt_clmul, "vpclmulqdq, non-temporal");
}

Test(crc32c_copy, dispatch) {
  check_copy(kv_crc32c_copy, "dispatch");
  check_copy(kv_crc32c_copy_nt, "dispatch, non-temporal");
}

Test(crc32c_copy, known_vector) {
  char out[9];
  cr_assert_eq(kv_crc32c_copy(0, out, "123456789", 9), 0xE3069283u);
  cr_assert(!memcmp(out, "123456789", 9));
}
