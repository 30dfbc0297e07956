/* hex.c - the hex codec (hex.h). */
#include "base/hex.h"

#include <errno.h>

char *kv_hex_encode(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = kv_hex_char(p[i] >> 4);
    out[2 * i + 1] = kv_hex_char(p[i]);
  }
  out[2 * n] = 0;
  return out;
}

int kv_hex_decode(const char *s, size_t len, uint8_t *out, size_t max) {
  if (len % 2 || len / 2 > max) return -EINVAL;
  for (size_t i = 0; i < len / 2; i++) {
    int hi = kv_hex_digit((unsigned char)s[2 * i]), lo = kv_hex_digit((unsigned char)s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -EINVAL;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return (int)(len / 2);
}
