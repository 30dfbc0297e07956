/* kernels_host.c - the geometry and argument checks both implementations of
 * cuda/kernels.h share, and the host implementation (memcpy per half page)
 * used where "device memory" is host memory. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"

/* The effective geometry: half bytes and the two strides, 0 on bad input. */
typedef struct geom {
  uint64_t half, block, pstride, kstride, layer;
} geom;

static int geom_of(const kv_kern_layout *lo, geom *g) {
  memset(g, 0, sizeof *g);
  if (!lo || lo->layers == 0 || lo->layers > KV_KERN_MAX_LAYERS || lo->page_tokens == 0 ||
      lo->kv_heads == 0 || lo->head_dim == 0 || lo->num_pages == 0)
    return -EINVAL;
  if (lo->elem_bytes != 1 && lo->elem_bytes != 2 && lo->elem_bytes != 4) return -EINVAL;
  uint64_t h = lo->page_tokens, b;
  if (__builtin_mul_overflow(h, (uint64_t)lo->kv_heads, &h) ||
      __builtin_mul_overflow(h, (uint64_t)lo->head_dim, &h) ||
      __builtin_mul_overflow(h, (uint64_t)lo->elem_bytes, &h) ||
      __builtin_mul_overflow(h, 2 * (uint64_t)lo->layers, &b) || b > UINT32_MAX)
    return -EINVAL;
  uint64_t p = lo->page_stride ? lo->page_stride : 2 * h;
  uint64_t k = lo->kv_stride ? lo->kv_stride : h;
  uint64_t last, end;
  if (__builtin_mul_overflow((uint64_t)(lo->num_pages - 1), p, &last) ||
      __builtin_add_overflow(last, k, &end) || __builtin_add_overflow(end, h, &end) ||
      end > (UINT64_MAX >> 2))
    return -EINVAL;
  int interleaved = k >= h && p >= k + h;
  int k_first = p >= h && k >= last + h; /* last + h cannot overflow: <= end */
  if (!interleaved && !k_first) return -EINVAL;
  *g = (geom){.half = h, .block = b, .pstride = p, .kstride = k, .layer = end};
  return 0;
}

uint64_t kv_kern_block_bytes(const kv_kern_layout *lo) {
  geom g;
  return geom_of(lo, &g) ? 0 : g.block;
}

uint64_t kv_kern_layer_bytes(const kv_kern_layout *lo) {
  geom g;
  return geom_of(lo, &g) ? 0 : g.layer;
}

static int cmp_uptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Gather: no two destination blocks overlap. */
static int blocks_apart(void *const *blocks, size_t n, uint64_t bytes) {
  if (n < 2) return 0;
  uintptr_t *s = malloc(n * sizeof *s);
  if (!s) return -ENOMEM;
  for (size_t i = 0; i < n; i++) s[i] = (uintptr_t)blocks[i];
  qsort(s, n, sizeof *s, cmp_uptr);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (s[i] - s[i - 1] < bytes) rc = -EINVAL;
  free(s);
  return rc;
}

/* Scatter: no page named twice. */
static int pages_distinct(const uint32_t *page_ids, size_t n) {
  if (n < 2) return 0;
  uint32_t *s = malloc(n * sizeof *s);
  if (!s) return -ENOMEM;
  memcpy(s, page_ids, n * sizeof *s);
  qsort(s, n, sizeof *s, cmp_u32);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (s[i] == s[i - 1]) rc = -EINVAL;
  free(s);
  return rc;
}

int kv_kern_check(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                  void *const *blocks, size_t n, int scatter) {
  geom g;
  int rc = geom_of(lo, &g);
  if (rc || n == 0) return rc;
  if (!layers || !page_ids || !blocks) return -EINVAL;
  for (uint32_t l = 0; l < lo->layers; l++)
    if (!layers[l] || (uintptr_t)layers[l] > UINTPTR_MAX - g.layer) return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (page_ids[i] >= lo->num_pages) return -EINVAL;
    if (!blocks[i] || (uintptr_t)blocks[i] > UINTPTR_MAX - g.block) return -EINVAL;
  }
  return scatter ? pages_distinct(page_ids, n) : blocks_apart(blocks, n, g.block);
}

unsigned kv_kern_copy_width(const kv_kern_layout *lo, void *const *layers, void *const *blocks,
                            size_t n) {
  geom g;
  if (geom_of(lo, &g)) return 1;
  uint64_t bits = g.half | g.pstride | g.kstride | 16;
  for (uint32_t l = 0; l < lo->layers; l++) bits |= (uintptr_t)layers[l];
  for (size_t i = 0; i < n; i++) bits |= (uintptr_t)blocks[i];
  return (unsigned)(bits & -bits); /* lowest set bit, at most 16 */
}

/* The copy itself, after the checks: one memcpy per contiguous run. */
static int run(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
               void *const *blocks, size_t n, int scatter) {
  int rc = kv_kern_check(lo, layers, page_ids, blocks, n, scatter);
  if (rc || n == 0) return rc;
  geom g;
  geom_of(lo, &g);
  /* Dense halves (K next to V) copy as one run of a whole page. */
  unsigned halves = g.kstride == g.half ? 1 : 2;
  size_t run_bytes = (size_t)(g.half * (3 - halves));
  for (size_t i = 0; i < n; i++) {
    unsigned char *blk = blocks[i];
    uint64_t page_off = (uint64_t)page_ids[i] * g.pstride;
    for (uint32_t l = 0; l < lo->layers; l++) {
      unsigned char *eng = (unsigned char *)layers[l] + page_off;
      for (unsigned kv = 0; kv < halves; kv++) {
        unsigned char *e = eng + kv * g.kstride;
        unsigned char *b = blk + ((size_t)l * 2 + kv) * g.half;
        if (scatter) memcpy(e, b, run_bytes);
        else memcpy(b, e, run_bytes);
      }
    }
  }
  return 0;
}

int kv_kern_gather_host(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                        void *const *blocks, size_t n) {
  return run(lo, layers, page_ids, blocks, n, 0);
}

int kv_kern_scatter_host(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                         void *const *blocks, size_t n) {
  return run(lo, layers, page_ids, blocks, n, 1);
}
