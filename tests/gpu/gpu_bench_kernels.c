/* gpu_bench_kernels.c - bandwidth of the CUDA gather/scatter of
 * cuda/kernels.h on a realistic geometry (32 layers, 16-token pages, 8 KV
 * heads, head_dim 128, fp16: 2 MiB blocks; 256 blocks per launch, page ids
 * random over a 4096-page pool) against the device's own cudaMemcpy D2D of
 * the same bytes, contiguous, in the same run; and against what an engine
 * does without the kernels, one cudaMemcpyAsync per page per layer.
 * Median of N runs (argv[1], default 21) timed with CUDA events; bandwidth
 * counts each byte once (as cudaMemcpy bandwidth does).
 * Exit 0, 1 on a CUDA error, 77 (with the reason) without a device. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"
#include "cuda/kernels.h"

enum { LAYERS = 32, TOKENS = 16, HEADS = 8, DIM = 128, ELEM = 2, POOL = 4096, NBLK = 256 };

#define CK(call)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static cudaStream_t stream;
static kv_kern_layout lo = {.layers = LAYERS,
                            .page_tokens = TOKENS,
                            .kv_heads = HEADS,
                            .head_dim = DIM,
                            .elem_bytes = ELEM,
                            .num_pages = POOL};
static void *layers[LAYERS], *blocks[NBLK], *blocks_odd[NBLK];
static uint32_t pages[NBLK];
static unsigned char *src, *dst;
static size_t bytes, page_bytes;

enum { MEMCPY, GATHER, SCATTER, GATHER_ODD, SCATTER_ODD, NAIVE_GATHER };

static void one(int what) {
  int rc = 0;
  switch (what) {
  case MEMCPY: CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); break;
  case GATHER: rc = kv_kern_gather_cuda(&lo, layers, pages, blocks, NBLK, stream); break;
  case SCATTER: rc = kv_kern_scatter_cuda(&lo, layers, pages, blocks, NBLK, stream); break;
  case GATHER_ODD: rc = kv_kern_gather_cuda(&lo, layers, pages, blocks_odd, NBLK, stream); break;
  case SCATTER_ODD: rc = kv_kern_scatter_cuda(&lo, layers, pages, blocks_odd, NBLK, stream); break;
  case NAIVE_GATHER:
    for (int i = 0; i < NBLK; i++)
      for (int l = 0; l < LAYERS; l++)
        CK(cudaMemcpyAsync((unsigned char *)blocks[i] + (size_t)l * page_bytes,
                           (unsigned char *)layers[l] + (size_t)pages[i] * page_bytes, page_bytes,
                           cudaMemcpyDeviceToDevice, stream));
    break;
  }
  if (rc) {
    fprintf(stderr, "launch failed: %d %s\n", rc, kv_kern_cuda_error());
    exit(1);
  }
}

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of `runs` timed runs after 3 untimed ones. */
static float median_ms(int what, int runs) {
  cudaEvent_t a, b;
  float *ms = calloc((size_t)runs, sizeof *ms), m;
  if (!ms) exit(1);
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) one(what);
  for (int r = 0; r < runs; r++) {
    CK(cudaEventRecord(a, stream));
    one(what);
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[r], a, b));
  }
  qsort(ms, (size_t)runs, sizeof *ms, cmp_f);
  m = ms[runs / 2];
  free(ms);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return m;
}

int main(int argc, char **argv) {
  kv_gpu_info gi;
  kv_gpu_probe(&gi);
  if (gi.ndev == 0) {
    printf("no CUDA device: %s\n", gi.reason);
    return 77;
  }
  int runs = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 21;
  if (runs < 1 || runs > 10000) runs = 21;
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bytes = (size_t)kv_kern_block_bytes(&lo) * NBLK;
  page_bytes = (size_t)kv_kern_block_bytes(&lo) / LAYERS;
  size_t layer_bytes = (size_t)kv_kern_layer_bytes(&lo);
  for (int l = 0; l < LAYERS; l++) {
    CK(cudaMalloc(&layers[l], layer_bytes));
    CK(cudaMemset(layers[l], l, layer_bytes));
  }
  unsigned char *blk, *blk_odd;
  CK(cudaMalloc((void **)&blk, bytes));
  CK(cudaMalloc((void **)&blk_odd, bytes + 16));
  CK(cudaMalloc((void **)&src, bytes));
  CK(cudaMalloc((void **)&dst, bytes));
  CK(cudaMemset(src, 1, bytes));
  /* Distinct random page ids (scatter needs them distinct), blocks in order. */
  static uint32_t perm[POOL];
  uint64_t x = 88172645463325252ull;
  for (uint32_t p = 0; p < POOL; p++) perm[p] = p;
  for (uint32_t p = POOL; p > 1; p--) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint32_t j = (uint32_t)(x % p), t = perm[p - 1];
    perm[p - 1] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < NBLK; i++) {
    pages[i] = perm[i];
    blocks[i] = blk + (size_t)i * (bytes / NBLK);
    blocks_odd[i] = blk_odd + 2 + (size_t)i * (bytes / NBLK);
  }
  CK(cudaDeviceSynchronize());

  static const char *names[] = {
      "cudaMemcpy D2D, contiguous",  "gather (16-byte units)",
      "scatter (16-byte units)",     "gather, blocks at +2 bytes",
      "scatter, blocks at +2 bytes", "gather as cudaMemcpyAsync per page per layer"};
  float ms[6];
  for (int w = 0; w < 6; w++) ms[w] = median_ms(w, w == NAIVE_GATHER ? (runs + 1) / 2 : runs);
  printf("device %s, %d layers x %d tokens x %d heads x %d dim x %d B: block %.2f MiB, "
         "%d blocks per call (%.0f MiB), pool %d pages; median of %d runs\n",
         prop.name, LAYERS, TOKENS, HEADS, DIM, ELEM, bytes / NBLK / 1048576.0, NBLK,
         bytes / 1048576.0, POOL, runs);
  printf("%-46s %10s %10s %8s\n", "operation", "ms", "GB/s", "/memcpy");
  double base = bytes / (ms[MEMCPY] * 1e6);
  for (int w = 0; w < 6; w++) {
    double gbs = bytes / (ms[w] * 1e6);
    printf("%-46s %10.3f %10.1f %8.2f\n", names[w], ms[w], gbs, gbs / base);
  }
  for (int l = 0; l < LAYERS; l++) cudaFree(layers[l]);
  cudaFree(blk), cudaFree(blk_odd), cudaFree(src), cudaFree(dst);
  cudaStreamDestroy(stream);
  return 0;
}
