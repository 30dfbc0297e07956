/* gpu_none.c - the GPU probe of a build without the CUDA backend. */
#include <string.h>

#include "cuda/gpu.h"

void kv_gpu_probe(kv_gpu_info *info) {
  memset(info, 0, sizeof *info);
  strncpy(info->reason, "built without CUDA (KV_CUDA=OFF or no nvcc)", sizeof info->reason - 1);
}
