/*
 * quant_tool.c - kvquant: a 16-bit KV array through the cold tiers' lossy
 * codes (tiers/quant.h) and back, as a promotion would give it to the
 * engine: what tools/bench/kv_quality.py feeds the model.
 *
 *   kvquant fp8|int8 bf16|fp16 GROUP IN OUT
 *
 * IN holds little-endian 16-bit elements (a multiple of GROUP of them);
 * OUT gets the same number, decoded from their codes. Prints the bytes
 * the codes take and the 16-bit array's bytes. Exit status 0, or 1 with
 * a message.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/quant.h"

static int fail(const char *what) {
  fprintf(stderr, "kvquant: %s\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 6) return fail("usage: kvquant fp8|int8 bf16|fp16 GROUP IN OUT");
  kv_quant_kind k = kv_quant_parse(argv[1]);
  kv_quant_dtype dt = !strcmp(argv[2], "bf16") ? KV_QDT_BF16
                      : !strcmp(argv[2], "fp16") ? KV_QDT_FP16
                                                 : (kv_quant_dtype)0;
  char *end;
  unsigned long g = strtoul(argv[3], &end, 10);
  if (!k || !dt || *end || g == 0 || g > 1u << 20) return fail("bad kind, dtype or group");
  FILE *f = fopen(argv[4], "rb");
  if (!f) return fail(strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (len <= 0 || len % (long)(2 * g)) return fail("IN is not a whole number of groups");
  size_t n = (size_t)len / 2;
  uint8_t *src = malloc((size_t)len), *q = malloc(kv_quant_size(n, (unsigned)g)),
          *out = malloc((size_t)len);
  if (!src || !q || !out || fread(src, 1, (size_t)len, f) != (size_t)len) return fail("read");
  fclose(f);
  int rc = kv_quant_encode(k, dt, src, n, (unsigned)g, q);
  if (!rc) rc = kv_quant_decode(k, dt, q, n, (unsigned)g, out);
  if (rc) return fail(strerror(-rc));
  f = fopen(argv[5], "wb");
  if (!f || fwrite(out, 1, (size_t)len, f) != (size_t)len || fclose(f)) return fail("write");
  printf("%zu %ld\n", kv_quant_size(n, (unsigned)g), len);
  free(src);
  free(q);
  free(out);
  return 0;
}
