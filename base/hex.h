/*
 * hex.h - the one hex codec: keys, digests and UUIDs as text.
 *
 * Encoding writes lowercase digits; decoding takes either case. Used for
 * keys on the operator surface (/stats?key=, kvctl), namespace digests,
 * log lines and GPU UUIDs.
 */
#ifndef KV_BASE_HEX_H
#define KV_BASE_HEX_H

#include <stddef.h>
#include <stdint.h>

/* The lowercase digit of v's low four bits. */
static inline char kv_hex_char(unsigned v) { return "0123456789abcdef"[v & 15]; }

/* The value of one hex digit (either case), or -1. */
static inline int kv_hex_digit(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Writes n bytes as 2n lowercase digits and a NUL into out (2n + 1 bytes).
 * Returns out. */
char *kv_hex_encode(const uint8_t *p, size_t n, char *out);

/* Decodes len digits of s into out, at most max bytes. Returns the byte
 * count (len / 2), or -EINVAL: odd length, a character that is not a hex
 * digit, or more than max bytes. */
int kv_hex_decode(const char *s, size_t len, uint8_t *out, size_t max);

#endif
