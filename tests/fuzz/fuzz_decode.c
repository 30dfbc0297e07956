/*
 * fuzz_decode.c - libFuzzer target for the wire decoders and the frame
 * reader (see fuzz_body.h for what is checked). Build with clang:
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKV_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_decode fuzz_seeds
 *   build-fuzz/bin/fuzz_seeds corpus && build-fuzz/bin/fuzz_decode corpus
 * or run tests/sh/fuzz_short.sh, which needs no configured build.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char why[256];
  if (kv_fuzz_one(data, size, NULL, why, sizeof why)) {
    fprintf(stderr, "fuzz_decode: %s\n", why);
    abort();
  }
  return 0;
}
