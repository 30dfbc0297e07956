/* gpu_test_kernels.c - the CUDA gather/scatter of cuda/kernels.h against the
 * CPU reference (tests/lib/kernels_ref.c): every case of the unit test
 * (element widths 1, 2, 4, odd geometries, misaligned pointers, strided
 * views, one block to several launches' worth) in device memory, gather,
 * scatter and scatter-then-gather; and the refusals, checked before any
 * launch. Exit 0 pass, 1 fail, 77 (with the reason) without a device. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"
#include "cuda/kernels.h"
#include "tests/lib/kernels_ref.h"

static cudaStream_t stream;

static int cuda_rc(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return -EIO;
}

static void *d_alloc(size_t bytes, void *ctx) {
  void *p = NULL;
  return cuda_rc(cudaMalloc(&p, bytes), "cudaMalloc") ? NULL : p;
}
static void d_release(void *p, void *ctx) { cudaFree(p); }
static int d_put(void *dst, const void *src, size_t bytes, void *ctx) {
  return cuda_rc(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
static int d_get(void *dst, const void *src, size_t bytes, void *ctx) {
  return cuda_rc(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
/* Queue, then wait: a fault inside the kernel surfaces here. */
static int done(int rc) {
  if (rc) {
    fprintf(stderr, "launch: %d %s\n", rc, kv_kern_cuda_error());
    return rc;
  }
  return cuda_rc(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}
static int d_gather(const kv_kern_layout *lo, void *const *layers, const uint32_t *pages,
                    void *const *blocks, size_t n, void *ctx) {
  return done(kv_kern_gather_cuda(lo, layers, pages, blocks, n, stream));
}
static int d_scatter(const kv_kern_layout *lo, void *const *layers, const uint32_t *pages,
                     void *const *blocks, size_t n, void *ctx) {
  return done(kv_kern_scatter_cuda(lo, layers, pages, blocks, n, stream));
}
static const kv_ref_backend dev_be = {d_alloc, d_release, d_put, d_get, d_gather, d_scatter, NULL};

/* The refusals of the unit test, through the CUDA entry points: -EINVAL
 * before any launch, the device memory untouched. */
static int refusals(void) {
  kv_kern_layout lo = {
      .layers = 2, .page_tokens = 4, .kv_heads = 2, .head_dim = 3, .elem_bytes = 2, .num_pages = 4};
  size_t bb = (size_t)kv_kern_block_bytes(&lo), lb = (size_t)kv_kern_layer_bytes(&lo);
  size_t total = 2 * lb + 3 * bb;
  unsigned char *d = d_alloc(total, NULL), *want = malloc(total), *got = malloc(total);
  int fails = 0;
  if (!d || !want || !got) {
    fprintf(stderr, "refusals: setup failed\n");
    fails = 1;
    goto out;
  }
  uint64_t s = 7;
  kv_ref_fill(want, total, &s);
  if (d_put(d, want, total, NULL)) {
    fails = 1;
    goto out;
  }
  void *layers[2] = {d, d + lb}, *blocks[3] = {d + 2 * lb, d + 2 * lb + bb, d + 2 * lb + 2 * bb};
  uint32_t pages[3] = {3, 0, 1};
  struct {
    const char *what;
    kv_kern_layout lo;
    uint32_t page1;
    void *block2;
    int scatter_only, gather_only;
  } bad[] = {
      {"element width 3", lo, 0, blocks[2], 0, 0},         {"zero layers", lo, 0, blocks[2], 0, 0},
      {"page id == num_pages", lo, 4, blocks[2], 0, 0},    {"a NULL block", lo, 0, NULL, 0, 0},
      {"overlapping blocks", lo, 0, blocks[0], 0, 1},      {"a page twice", lo, 3, blocks[2], 1, 0},
      {"strides over each other", lo, 0, blocks[2], 0, 0},
  };
  bad[0].lo.elem_bytes = 3;
  bad[1].lo.layers = 0;
  bad[6].lo.kv_stride = 1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pages[1] = bad[i].page1;
    blocks[2] = bad[i].block2;
    int g = bad[i].scatter_only ? -EINVAL
                                : kv_kern_gather_cuda(&bad[i].lo, layers, pages, blocks, 3, stream);
    int sc = bad[i].gather_only
                 ? -EINVAL
                 : kv_kern_scatter_cuda(&bad[i].lo, layers, pages, blocks, 3, stream);
    if (g != -EINVAL || sc != -EINVAL) {
      fprintf(stderr, "FAIL refusal %s: gather %d scatter %d, want %d\n", bad[i].what, g, sc,
              -EINVAL);
      fails++;
    }
  }
  if (done(0) || d_get(got, d, total, NULL) || memcmp(got, want, total)) {
    fprintf(stderr, "FAIL refusals: device memory changed\n");
    fails++;
  }
out:
  if (d) d_release(d, NULL);
  free(want), free(got);
  return fails;
}

int main(void) {
  kv_gpu_info gi;
  kv_gpu_probe(&gi);
  if (gi.ndev == 0) {
    printf("no CUDA device: %s\n", gi.reason);
    return 77;
  }
  if (cuda_rc(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"))
    return 1;
  static kv_ref_case cases[256];
  size_t nc = kv_ref_cases(cases, 256);
  static const char *modes[] = {"gather", "scatter", "scatter+gather"};
  int fails = refusals(), ran = 0;
  for (int m = KV_REF_GATHER; m <= KV_REF_ROUNDTRIP; m++)
    for (size_t i = 0; i < nc; i++) {
      char why[200];
      const kv_ref_case *c = &cases[i];
      int rc = kv_ref_run(c, m, &dev_be, why, sizeof why);
      ran++;
      if (rc) {
        fails++;
        fprintf(stderr,
                "FAIL %s case %zu (L%u T%u H%u D%u E%u pages %u strides %d n %zu mis %u): %s\n",
                modes[m], i, c->layers, c->page_tokens, c->kv_heads, c->head_dim, c->elem_bytes,
                c->num_pages, c->strides, c->n, c->misalign, why);
        if (rc != -1 && cudaGetLastError() != cudaSuccess) {
          fprintf(stderr, "the CUDA context is broken: stopping\n");
          goto end;
        }
      }
    }
end:
  cudaStreamDestroy(stream);
  printf("gpu_test_kernels: %d cases, %d failed\n", ran, fails);
  return fails ? 1 : 0;
}
