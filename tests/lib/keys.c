/* keys.c - block keys for the tests (keys.h). */
#include "tests/lib/keys.h"

#include "base/hex.h"

static void key_bytes(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

kv_key K(uint64_t v) {
  kv_key k = {.len = 8};
  key_bytes(k.b, v);
  return k;
}

kvc_key KC(uint64_t v) {
  kvc_key k = {.len = 8};
  key_bytes(k.b, v);
  return k;
}

void kvt_key_hex(uint64_t v, char out[17]) {
  uint8_t b[8];
  key_bytes(b, v);
  kv_hex_encode(b, sizeof b, out);
}
