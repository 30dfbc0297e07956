/*
 * kernels.h - the worker side of G1: gather pages of a paged KV cache into
 * kvcached blocks, and scatter blocks back into pages.
 *
 * The engine's side (what vLLM, SGLang, TensorRT-LLM keep) is, per layer,
 * one tensor of pages:
 *
 *   engine[layer] : [num_pages][2 (K, V)][page_tokens][kv_heads][head_dim]
 *
 * with elements of elem_bytes (1, 2 or 4) bytes. One "half" - the K or the
 * V part of one page of one layer, page_tokens * kv_heads * head_dim
 * elements - is contiguous; where the halves lie is described by two byte
 * strides, so that strided views work too:
 *
 *   half(layer, page, kv) = layers[layer] + page * page_stride + kv * kv_stride
 *
 * page_stride 0 means dense (2 * half bytes), kv_stride 0 means dense (half
 * bytes): together the plain [num_pages, 2, ...] tensor above. The vLLM
 * flash-attention layout [2, num_pages, ...] is page_stride = half,
 * kv_stride = num_pages * half. Strides must keep the halves of different
 * pages apart (checked): either interleaved, kv_stride >= half and
 * page_stride >= kv_stride + half; or K halves first, page_stride >= half
 * and kv_stride >= (num_pages - 1) * page_stride + half.
 *
 * The kvcached block (THE CONTRACT of this file: what one key names when a
 * namespace uses this layout) holds one page's tokens for all layers,
 * contiguous, with no padding:
 *
 *   block : [layers][2 (K, V)][page_tokens][kv_heads][head_dim]
 *
 * element (l, kv, t, h, d) at byte ((((l*2 + kv)*T + t)*H + h)*D + d) * E,
 * so block_bytes = layers * 2 * page_tokens * kv_heads * head_dim *
 * elem_bytes. That is the block_bytes a worker declares in HELLO
 * (kv_layout.block_bytes in proto/wire.h, with tokens_per_block =
 * page_tokens, same layers, kv_heads, head_dim).
 *
 *   gather:  for i < n, page page_ids[i] of every layer -> block blocks[i]
 *   scatter: for i < n, block blocks[i] -> page page_ids[i] of every layer
 *
 * Byte-exact copies: elements are never interpreted, so any dtype of the
 * width works. A gather may name a page more than once (each copy gets
 * it); its destination blocks must not overlap each other (checked). A
 * scatter may not name a page twice (checked: the result would depend on
 * the order of the copies). Engine memory and block memory must not overlap
 * (not checked). Pointers may have any alignment; wider copies are used
 * when everything allows them.
 *
 * Every argument is checked on the host before anything is copied: a bad
 * call returns -EINVAL (-ENOMEM if the check itself could not allocate) and
 * changes nothing. n = 0 is a valid call that does nothing.
 *
 * Two implementations with the same semantics:
 *  - kv_kern_*_host (kernels_host.c, always built): "device" memory is host
 *    memory, plain memcpy; the simulation backend of G1 uses it.
 *  - kv_kern_*_cuda (kernels.cu, built only with the CUDA backend, i.e.
 *    when KV_HAVE_CUDA is defined): pointers are device memory (or memory
 *    the device can reach) of the current device; page_ids, layers and
 *    blocks are HOST arrays, packed into the kernel's parameters, so the
 *    caller may reuse them as soon as the call returns. One kernel launch on
 *    the given stream covers all n blocks x all layers (one launch per
 *    KV_KERN_MAX_BLOCKS blocks beyond that); the call returns once the work
 *    is queued, without synchronizing.
 */
#ifndef KV_CUDA_KERNELS_H
#define KV_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most layers one call handles (both implementations). */
#define KV_KERN_MAX_LAYERS 256
/* Most blocks one CUDA launch carries; a larger n is cut into launches. */
#define KV_KERN_MAX_BLOCKS 2048

typedef struct kv_kern_layout {
  uint32_t layers;      /* 1..KV_KERN_MAX_LAYERS */
  uint32_t page_tokens; /* > 0: tokens per page = tokens per block */
  uint32_t kv_heads;    /* > 0: heads this worker holds (its TP shard) */
  uint32_t head_dim;    /* > 0 */
  uint32_t elem_bytes;  /* 1, 2 or 4 */
  uint32_t num_pages;   /* > 0: pages in each layer's tensor */
  uint64_t page_stride; /* bytes from page p to p+1 in a layer; 0: dense */
  uint64_t kv_stride;   /* bytes from a page's K half to its V half; 0: dense */
} kv_kern_layout;

/* Bytes of one block for *lo, or 0 when its geometry is bad: a zero field,
 * elem_bytes not 1, 2 or 4, more than KV_KERN_MAX_LAYERS layers, bad
 * strides, or a block over UINT32_MAX bytes (the largest HELLO can
 * declare). */
uint64_t kv_kern_block_bytes(const kv_kern_layout *lo);

/* Bytes one layer's tensor spans from layers[l] (the end of the last V
 * half), or 0 when the geometry is bad. */
uint64_t kv_kern_layer_bytes(const kv_kern_layout *lo);

/* The checks both implementations make before copying: 0, -EINVAL or
 * -ENOMEM. scatter: 0 for a gather, 1 for a scatter. */
int kv_kern_check(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                  void *const *blocks, size_t n, int scatter);

/* The widest copy unit (16, 8, 4, 2 or 1 bytes) that every base pointer,
 * block pointer, stride and half size is a multiple of. */
unsigned kv_kern_copy_width(const kv_kern_layout *lo, void *const *layers, void *const *blocks,
                            size_t n);

/* Host implementation. layers[lo->layers] are the per-layer tensors,
 * page_ids[n] and blocks[n] the pairs to copy. 0 or -errno as above. */
int kv_kern_gather_host(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                        void *const *blocks, size_t n);
int kv_kern_scatter_host(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                         void *const *blocks, size_t n);

/* CUDA implementation (defined only when built with KV_HAVE_CUDA); stream
 * is a cudaStream_t (NULL: the legacy default stream). Returns 0 once the
 * copy is queued; -EINVAL / -ENOMEM as above; -ENODEV when there is no
 * usable device; -EIO for any other CUDA error, whose text
 * kv_kern_cuda_error() then gives. Errors of the copy itself show up when
 * the caller synchronizes with the stream. */
int kv_kern_gather_cuda(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                        void *const *blocks, size_t n, void *stream);
int kv_kern_scatter_cuda(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                         void *const *blocks, size_t n, void *stream);
/* The CUDA error behind this thread's last -ENODEV / -EIO, or "". */
const char *kv_kern_cuda_error(void);

#ifdef __cplusplus
}
#endif

#endif
