/*
 * keys.h - block keys for the tests: the 8 little-endian bytes of a
 * number, as a core key (K) or as libkvclient's (KC), and its hex as the
 * HTTP routes take it. Distinct numbers give distinct keys.
 */
#ifndef KV_TESTS_LIB_KEYS_H
#define KV_TESTS_LIB_KEYS_H

#include <stdint.h>

#include "base/key.h"
#include "client/kvclient.h"

kv_key K(uint64_t v);
kvc_key KC(uint64_t v);

/* The 16 hex digits of K(v)'s bytes, NUL-terminated. */
void kvt_key_hex(uint64_t v, char out[17]);

#endif
