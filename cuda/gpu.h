/*
 * gpu.h - what the daemon needs to know about the node's GPUs.
 *
 * Built against the CUDA runtime when the toolkit is present (gpu_cuda.c),
 * else as a stub (gpu_none.c). Either way, a machine with no device - or no
 * driver - answers 0 devices with a reason, and the daemon runs without G1.
 */
#ifndef KV_CUDA_GPU_H
#define KV_CUDA_GPU_H

#include <stddef.h>

typedef struct kv_gpu_info {
  int ndev;            /* devices usable, 0 if none */
  int built_with_cuda; /* 1 when this binary has the CUDA backend */
  int runtime_version; /* CUDA runtime version, 0 if unknown */
  char reason[160];    /* why ndev is 0, for the log */
} kv_gpu_info;

/* Fills *info. Never fails: a missing driver is ndev = 0 with a reason. */
void kv_gpu_probe(kv_gpu_info *info);

#endif
