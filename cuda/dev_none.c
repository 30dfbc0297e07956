/* dev_none.c - the CUDA backend of a build without CUDA: it never opens, so
 * AUTO falls back to the simulation and says why. */
#include <errno.h>
#include <stdio.h>

#include "cuda/dev_int.h"

static int none_open(kv_dev *dev, const kv_dev_opts *o, char *why, size_t len) {
  snprintf(why, len, "CUDA: built without CUDA (KV_CUDA=OFF or no nvcc)");
  return -ENODEV;
}

const kv__backend kv__dev_cuda = {.id = KV_DEV_CUDA, .open = none_open};
