/*
 * kernels_ref.h - a CPU reference for the gather/scatter of cuda/kernels.h,
 * and one case runner that checks an implementation against it.
 *
 * The reference is written from the index formulas alone, one element at a
 * time, sharing no code with kernels_host.c or kernels.cu:
 *   engine: layers[l] + page*P + kv*K + ((t*H + h)*D + d)*E
 *   block:  blocks[i] + ((((l*2 + kv)*T + t)*H + h)*D + d)*E
 * with P = page_stride or 2*T*H*D*E, K = kv_stride or T*H*D*E.
 *
 * The runner builds a case's engine tensors and blocks (random bytes, every
 * pointer misaligned as asked, blocks in a shuffled order inside one buffer
 * with gaps), runs the implementation through a backend (host memory for the
 * unit test, device memory for tests/gpu), runs the reference on host
 * copies, and compares every byte of the buffers - gaps and untouched pages
 * included. Used by tests/unit/test_kernels.c,
 * tests/integration/test_client_engine.c, tests/gpu/gpu_test_kernels.c and
 * gpu_test_client.c; defined in kernels_ref.c.
 */
#ifndef KV_TESTS_LIB_KERNELS_REF_H
#define KV_TESTS_LIB_KERNELS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/kernels.h"

/* Reference copy: scatter 0 moves engine -> blocks, 1 blocks -> engine. */
void kv_ref_copy(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                 void *const *blocks, size_t n, int scatter);

/* Where the implementation under test runs. alloc/release/put/get move
 * whole buffers; gather/scatter are the entry points (returning 0 or
 * -errno once the copy is complete). */
typedef struct kv_ref_backend {
  void *(*alloc)(size_t bytes, void *ctx);
  void (*release)(void *p, void *ctx);
  int (*put)(void *dst, const void *src_host, size_t bytes, void *ctx);
  int (*get)(void *dst_host, const void *src, size_t bytes, void *ctx);
  int (*gather)(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                void *const *blocks, size_t n, void *ctx);
  int (*scatter)(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                 void *const *blocks, size_t n, void *ctx);
  void *ctx;
} kv_ref_backend;

enum { KV_REF_DENSE, KV_REF_PADDED, KV_REF_KFIRST };      /* stride kinds */
enum { KV_REF_GATHER, KV_REF_SCATTER, KV_REF_ROUNDTRIP }; /* modes */

typedef struct kv_ref_case {
  uint32_t layers, page_tokens, kv_heads, head_dim, elem_bytes, num_pages;
  int strides;       /* KV_REF_DENSE, _PADDED (gaps between halves), _KFIRST */
  size_t n;          /* blocks (> 0); scatter, round trip: at most num_pages */
  unsigned misalign; /* bytes added to every layer base and block pointer */
  int repeat;        /* gather: page ids drawn with repeats (else distinct) */
  uint64_t seed;
} kv_ref_case;

/* xorshift64: the next number of the sequence in *s (nonzero). */
uint64_t kv_ref_rand(uint64_t *s);

/* n random bytes from the sequence in *s. */
void kv_ref_fill(unsigned char *p, size_t n, uint64_t *s);

/* Runs one case in one mode: 0 when the implementation matched the
 * reference byte for byte, -1 on a mismatch, -errno when the setup or the
 * implementation failed; why says which. */
int kv_ref_run(const kv_ref_case *c, int mode, const kv_ref_backend *be, char *why, size_t whylen);

/* The cases both test programs run: every element width, odd and
 * realistic geometries, one block and many, every stride kind, aligned
 * and misaligned pointers. */
size_t kv_ref_cases(kv_ref_case *out, size_t max);

#endif
