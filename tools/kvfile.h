/* kvfile.h - a safetensors file of 16-bit KV (bench/kv's trained-model
 * samples), read whole: what the benchmarks of the cold tiers' coding
 * (kvcodec-bench, kvbench g3 --kv) run on. */
#ifndef KV_TOOLS_KVFILE_H
#define KV_TOOLS_KVFILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvfile {
  const char *path;
  char dtype[8]; /* F16 or BF16 */
  uint8_t *data; /* the tensor data: 16-bit elements (malloc'd) */
  size_t len;
} kvfile;

/* Reads a safetensors file: 8-byte little-endian header length, a JSON
 * header, the data. Every tensor must be F16 or BF16 (one dtype for the
 * file) and the tensors must cover their data span without gaps. 0, or -1
 * after saying why on stderr. */
int kv_kvfile_load(const char *path, kvfile *f);

#endif
