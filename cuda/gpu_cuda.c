/* gpu_cuda.c - the GPU probe over the CUDA runtime. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "cuda/gpu.h"

void kv_gpu_probe(kv_gpu_info *info) {
  memset(info, 0, sizeof *info);
  info->built_with_cuda = 1;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) info->runtime_version = v;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(info->reason, sizeof info->reason, "CUDA: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return;
  }
  if (n == 0) snprintf(info->reason, sizeof info->reason, "CUDA: no device");
  info->ndev = n;
}
