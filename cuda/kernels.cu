/* kernels.cu - the CUDA implementation of cuda/kernels.h.
 *
 * The unit of work is one "chunk": the K or the V half of one page of one
 * layer, contiguous on both sides. Chunk c of a launch is block i =
 * c / (2 * layers), layer l = (c / 2) % layers, half kv = c % 2; it sits at
 * byte (c % (2 * layers)) * half of block i, so consecutive chunks fill a
 * block front to back. One warp copies one chunk (grid-stride over chunks),
 * each lane moving copy units of V = 16, 8, 4, 2 or 1 bytes, four loads in
 * flight before the stores. V is the widest unit every base pointer, block
 * pointer, stride and the half size are multiples of (kv_kern_copy_width),
 * so an aligned engine gets 16-byte loads and stores and an odd one still
 * gets exact copies.
 *
 * How the arguments reach the device: the page ids, block pointers and
 * per-layer base pointers are copied by value into the kernel's parameter
 * struct (a __grid_constant__ parameter, read in place from the constant
 * bank). No device scratch, no extra copy on the stream, and the caller's
 * host arrays are free again when the call returns. Two sizes of the
 * struct: up to 64 blocks (under 4 KiB, the classic parameter limit) and up
 * to KV_KERN_MAX_BLOCKS (under the 32 KiB limit of CUDA 12.1+ on Volta and
 * newer); a call with more blocks is cut into launches of that many.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"

namespace {

constexpr int kThreads = 256; /* 8 warps per CTA */
constexpr int kSmallBlocks = 64;

template <int NB> struct Params {
  unsigned long long half;    /* bytes of one chunk */
  unsigned long long pstride; /* engine: page to page */
  unsigned long long kstride; /* engine: K half to V half */
  unsigned int layers;
  unsigned int n;       /* blocks in this launch, <= NB */
  unsigned int scatter; /* 0: engine -> block, 1: block -> engine */
  unsigned int page[NB];
  unsigned char *layer[KV_KERN_MAX_LAYERS];
  unsigned char *block[NB];
};
static_assert(sizeof(Params<kSmallBlocks>) <= 4096, "small params fit 4 KiB");
static_assert(sizeof(Params<KV_KERN_MAX_BLOCKS>) <= 32764, "params fit 32 KiB");

template <int W> struct Unit;
template <> struct Unit<16> { typedef uint4 T; };
template <> struct Unit<8> { typedef uint2 T; };
template <> struct Unit<4> { typedef unsigned int T; };
template <> struct Unit<2> { typedef unsigned short T; };
template <> struct Unit<1> { typedef unsigned char T; };

template <int W, int NB>
__global__ void __launch_bounds__(kThreads) copy_chunks(const __grid_constant__ Params<NB> p) {
  typedef typename Unit<W>::T V;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned long long per_block = 2ull * p.layers;
  const unsigned long long chunks = per_block * p.n;
  const unsigned long long units = p.half / W;
  const unsigned long long nwarps = (unsigned long long)gridDim.x * (kThreads / 32);
  for (unsigned long long c = blockIdx.x * (unsigned long long)(kThreads / 32) + (threadIdx.x >> 5);
       c < chunks; c += nwarps) {
    const unsigned long long i = c / per_block, r = c % per_block;
    unsigned char *eng = p.layer[r >> 1] + p.page[i] * p.pstride + (r & 1) * p.kstride;
    unsigned char *blk = p.block[i] + r * p.half;
    const V *s = reinterpret_cast<const V *>(p.scatter ? blk : eng);
    V *d = reinterpret_cast<V *>(p.scatter ? eng : blk);
    unsigned long long j = lane;
    for (; j + 96 < units; j += 128) {
      V a = s[j], b = s[j + 32], e = s[j + 64], f = s[j + 96];
      d[j] = a;
      d[j + 32] = b;
      d[j + 64] = e;
      d[j + 96] = f;
    }
    for (; j < units; j += 32) d[j] = s[j];
  }
}

thread_local char last_error[160];

int fail(cudaError_t e, const char *what) {
  snprintf(last_error, sizeof last_error, "%s: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  switch (e) {
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorDevicesUnavailable: return -ENODEV;
  default: return -EIO;
  }
}

template <int W, int NB> cudaError_t launch_one(Params<NB> *p, cudaStream_t stream) {
  unsigned long long warps = 2ull * p->layers * p->n;
  unsigned grid = (unsigned)((warps + kThreads / 32 - 1) / (kThreads / 32));
  void *args[] = {p};
  return cudaLaunchKernel(reinterpret_cast<const void *>(&copy_chunks<W, NB>), dim3(grid),
                          dim3(kThreads), args, 0, stream);
}

template <int NB>
int launch(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
           void *const *blocks, size_t n, int scatter, unsigned width, cudaStream_t stream) {
  Params<NB> *p = static_cast<Params<NB> *>(calloc(1, sizeof(Params<NB>)));
  if (!p) return -ENOMEM;
  unsigned long long half = kv_kern_block_bytes(lo) / (2ull * lo->layers);
  p->half = half;
  p->pstride = lo->page_stride ? lo->page_stride : 2 * half;
  p->kstride = lo->kv_stride ? lo->kv_stride : half;
  p->layers = lo->layers;
  p->scatter = (unsigned)scatter;
  for (uint32_t l = 0; l < lo->layers; l++) p->layer[l] = static_cast<unsigned char *>(layers[l]);
  int rc = 0;
  for (size_t at = 0; at < n && rc == 0; at += NB) {
    size_t m = n - at < (size_t)NB ? n - at : (size_t)NB;
    p->n = (unsigned)m;
    for (size_t i = 0; i < m; i++) {
      p->page[i] = page_ids[at + i];
      p->block[i] = static_cast<unsigned char *>(blocks[at + i]);
    }
    cudaError_t e;
    switch (width) {
    case 16: e = launch_one<16>(p, stream); break;
    case 8: e = launch_one<8>(p, stream); break;
    case 4: e = launch_one<4>(p, stream); break;
    case 2: e = launch_one<2>(p, stream); break;
    default: e = launch_one<1>(p, stream); break;
    }
    if (e != cudaSuccess) rc = fail(e, "kernel launch");
  }
  free(p);
  return rc;
}

int run(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
        void *const *blocks, size_t n, int scatter, void *stream) {
  last_error[0] = '\0';
  int rc = kv_kern_check(lo, layers, page_ids, blocks, n, scatter);
  if (rc || n == 0) return rc;
  unsigned width = kv_kern_copy_width(lo, layers, blocks, n);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (n <= (size_t)kSmallBlocks)
    return launch<kSmallBlocks>(lo, layers, page_ids, blocks, n, scatter, width, s);
  return launch<KV_KERN_MAX_BLOCKS>(lo, layers, page_ids, blocks, n, scatter, width, s);
}

} // namespace

extern "C" int kv_kern_gather_cuda(const kv_kern_layout *lo, void *const *layers,
                                   const uint32_t *page_ids, void *const *blocks, size_t n,
                                   void *stream) {
  return run(lo, layers, page_ids, blocks, n, 0, stream);
}

extern "C" int kv_kern_scatter_cuda(const kv_kern_layout *lo, void *const *layers,
                                    const uint32_t *page_ids, void *const *blocks, size_t n,
                                    void *stream) {
  return run(lo, layers, page_ids, blocks, n, 1, stream);
}

extern "C" const char *kv_kern_cuda_error(void) { return last_error; }
