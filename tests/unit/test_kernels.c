/* test_kernels.c - the host gather/scatter of cuda/kernels.h: the block
 * format byte by byte, equal to the CPU reference (kernels_ref.h) on random
 * data for every element width, geometry, stride kind and alignment, a
 * scatter gathered back, and every bad argument refused with nothing
 * written. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "tests/lib/kernels_ref.h"

static void *h_alloc(size_t bytes, void *ctx) { return malloc(bytes); }
static void h_release(void *p, void *ctx) { free(p); }
static int h_copy(void *dst, const void *src, size_t bytes, void *ctx) {
  memcpy(dst, src, bytes);
  return 0;
}
static int h_gather(const kv_kern_layout *lo, void *const *layers, const uint32_t *pages,
                    void *const *blocks, size_t n, void *ctx) {
  return kv_kern_gather_host(lo, layers, pages, blocks, n);
}
static int h_scatter(const kv_kern_layout *lo, void *const *layers, const uint32_t *pages,
                     void *const *blocks, size_t n, void *ctx) {
  return kv_kern_scatter_host(lo, layers, pages, blocks, n);
}
static const kv_ref_backend host_be = {h_alloc,  h_release, h_copy, h_copy,
                                       h_gather, h_scatter, NULL};

static void run_all(int mode) {
  kv_ref_case cases[256];
  size_t nc = kv_ref_cases(cases, 256);
  cr_assert_gt(nc, 100);
  for (size_t i = 0; i < nc; i++) {
    char why[200];
    const kv_ref_case *c = &cases[i];
    int rc = kv_ref_run(c, mode, &host_be, why, sizeof why);
    cr_assert_eq(rc, 0, "case %zu (L%u T%u H%u D%u E%u pages %u strides %d n %zu mis %u): %s", i,
                 c->layers, c->page_tokens, c->kv_heads, c->head_dim, c->elem_bytes, c->num_pages,
                 c->strides, c->n, c->misalign, why);
  }
}

Test(kernels, gather_equals_reference) { run_all(KV_REF_GATHER); }
Test(kernels, scatter_equals_reference) { run_all(KV_REF_SCATTER); }
Test(kernels, scatter_then_gather_gives_the_blocks_back) { run_all(KV_REF_ROUNDTRIP); }

/* The block format, written out by hand: 2 layers, 1 token, 1 head,
 * head_dim 2, 1-byte elements, 2 pages. Page p of layer l holds K then V. */
Test(kernels, block_format_by_hand) {
  unsigned char l0[8] = {0, 1, 2, 3, 4, 5, 6, 7}, l1[8] = {10, 11, 12, 13, 14, 15, 16, 17};
  void *layers[2] = {l0, l1};
  kv_kern_layout lo = {
      .layers = 2, .page_tokens = 1, .kv_heads = 1, .head_dim = 2, .elem_bytes = 1, .num_pages = 2};
  unsigned char b0[8], b1[8];
  void *blocks[2] = {b0, b1};
  uint32_t pages[2] = {1, 0};
  cr_assert_eq(kv_kern_block_bytes(&lo), 8);
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 2), 0);
  const unsigned char want0[8] = {4, 5, 6, 7, 14, 15, 16, 17};
  const unsigned char want1[8] = {0, 1, 2, 3, 10, 11, 12, 13};
  cr_assert_arr_eq(b0, want0, 8);
  cr_assert_arr_eq(b1, want1, 8);
  /* and back, swapped: block 0 -> page 0, block 1 -> page 1 */
  uint32_t swapped[2] = {0, 1};
  cr_assert_eq(kv_kern_scatter_host(&lo, layers, swapped, blocks, 2), 0);
  const unsigned char w0[8] = {4, 5, 6, 7, 0, 1, 2, 3}, w1[8] = {14, 15, 16, 17, 10, 11, 12, 13};
  cr_assert_arr_eq(l0, w0, 8);
  cr_assert_arr_eq(l1, w1, 8);
}

/* The vLLM flash-attention layout [2, num_pages, ...] is a strided view. */
Test(kernels, k_first_layout_by_hand) {
  /* 1 layer, 3 pages, half = 2 bytes: K of pages 0..2, then V of 0..2 */
  unsigned char l0[12] = {0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105};
  void *layers[1] = {l0};
  kv_kern_layout lo = {.layers = 1,
                       .page_tokens = 1,
                       .kv_heads = 1,
                       .head_dim = 1,
                       .elem_bytes = 2,
                       .num_pages = 3,
                       .page_stride = 2,
                       .kv_stride = 6};
  unsigned char b[4];
  void *blocks[1] = {b};
  uint32_t page = 2;
  cr_assert_eq(kv_kern_layer_bytes(&lo), 12);
  cr_assert_eq(kv_kern_gather_host(&lo, layers, &page, blocks, 1), 0);
  const unsigned char want[4] = {4, 5, 104, 105};
  cr_assert_arr_eq(b, want, 4);
}

Test(kernels, block_bytes_match_hello) {
  kv_kern_layout lo = {.layers = 32,
                       .page_tokens = 16,
                       .kv_heads = 8,
                       .head_dim = 128,
                       .elem_bytes = 2,
                       .num_pages = 4096};
  cr_assert_eq(kv_kern_block_bytes(&lo), 32ull * 2 * 16 * 8 * 128 * 2);
  cr_assert_eq(kv_kern_layer_bytes(&lo), 4096ull * 2 * 16 * 8 * 128 * 2);
  lo.elem_bytes = 1;
  cr_assert_eq(kv_kern_block_bytes(&lo), 32ull * 2 * 16 * 8 * 128);
  /* over UINT32_MAX: no HELLO can declare it */
  lo.layers = 256, lo.page_tokens = 4096, lo.elem_bytes = 4;
  cr_assert_eq(kv_kern_block_bytes(&lo), 0);
}

Test(kernels, copy_width) {
  _Alignas(16) unsigned char buf[4096];
  kv_kern_layout lo = {.layers = 1,
                       .page_tokens = 16,
                       .kv_heads = 1,
                       .head_dim = 8,
                       .elem_bytes = 2,
                       .num_pages = 4};
  void *layers[1] = {buf}, *blocks[2] = {buf + 1024, buf + 2048};
  cr_assert_eq(kv_kern_copy_width(&lo, layers, blocks, 2), 16);
  blocks[1] = buf + 2048 + 8;
  cr_assert_eq(kv_kern_copy_width(&lo, layers, blocks, 2), 8);
  layers[0] = buf + 2;
  cr_assert_eq(kv_kern_copy_width(&lo, layers, blocks, 2), 2);
  layers[0] = buf, blocks[1] = buf + 2048, lo.head_dim = 3, lo.elem_bytes = 1; /* half 48 */
  cr_assert_eq(kv_kern_copy_width(&lo, layers, blocks, 2), 16);
  lo.page_tokens = 1; /* half 3 */
  cr_assert_eq(kv_kern_copy_width(&lo, layers, blocks, 2), 1);
}

Test(kernels, nothing_to_do) {
  kv_kern_layout lo = {
      .layers = 1, .page_tokens = 1, .kv_heads = 1, .head_dim = 1, .elem_bytes = 1, .num_pages = 1};
  cr_assert_eq(kv_kern_gather_host(&lo, NULL, NULL, NULL, 0), 0);
  cr_assert_eq(kv_kern_scatter_host(&lo, NULL, NULL, NULL, 0), 0);
  lo.elem_bytes = 3; /* the geometry is still checked */
  cr_assert_eq(kv_kern_gather_host(&lo, NULL, NULL, NULL, 0), -EINVAL);
}

/* A fixture for the refusals: 2 layers x 4 pages, 3 blocks; every refusal
 * must leave both sides as they were. */
#define BB (2 * 2 * 4 * 2 * 3 * 2) /* layers 2, T 4, H 2, D 3, E 2 */
static unsigned char eng[2][4 * BB], blk[4][BB], eng0[2][4 * BB], blk0[4][BB];
static void *layers[2], *blocks[3];
static uint32_t pages[3];
static kv_kern_layout lo;

static void setup(void) {
  uint64_t s = 42;
  kv_ref_fill(&eng[0][0], sizeof eng, &s);
  kv_ref_fill(&blk[0][0], sizeof blk, &s);
  memcpy(eng0, eng, sizeof eng);
  memcpy(blk0, blk, sizeof blk);
  layers[0] = eng[0], layers[1] = eng[1];
  blocks[0] = blk[0], blocks[1] = blk[1], blocks[2] = blk[2];
  pages[0] = 3, pages[1] = 0, pages[2] = 1;
  lo = (kv_kern_layout){
      .layers = 2, .page_tokens = 4, .kv_heads = 2, .head_dim = 3, .elem_bytes = 2, .num_pages = 4};
  cr_assert_eq(kv_kern_block_bytes(&lo), BB);
}

static void refused(const char *what) {
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), -EINVAL, "gather: %s", what);
  cr_assert_eq(kv_kern_scatter_host(&lo, layers, pages, blocks, 3), -EINVAL, "scatter: %s", what);
  cr_assert_eq(memcmp(eng, eng0, sizeof eng), 0, "%s: engine memory written", what);
  cr_assert_eq(memcmp(blk, blk0, sizeof blk), 0, "%s: blocks written", what);
}

TestSuite(kernels_bad, .init = setup);

Test(kernels_bad, the_fixture_itself_is_accepted) {
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), 0);
  cr_assert_eq(kv_kern_scatter_host(&lo, layers, pages, blocks, 3), 0);
}

Test(kernels_bad, geometry) {
  kv_kern_layout good = lo;
  uint32_t *fields[] = {&lo.layers,   &lo.page_tokens, &lo.kv_heads,
                        &lo.head_dim, &lo.elem_bytes,  &lo.num_pages};
  for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
    lo = good;
    *fields[f] = 0;
    refused("a zero field");
  }
  uint32_t widths[] = {3, 5, 8, 16, UINT32_MAX};
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
    lo = good, lo.elem_bytes = widths[w];
    refused("element width");
  }
  lo = good, lo.layers = KV_KERN_MAX_LAYERS + 1;
  refused("too many layers");
  lo = good, lo.head_dim = UINT32_MAX, lo.kv_heads = UINT32_MAX;
  refused("block size overflow");
  uint32_t *empty = NULL;
  cr_assert_eq(kv_kern_gather_host(NULL, layers, pages, blocks, 3), -EINVAL);
  cr_assert_eq(kv_kern_scatter_host(NULL, layers, empty, blocks, 0), -EINVAL);
}

Test(kernels_bad, strides_that_overlap_pages) {
  const uint64_t half = 4 * 2 * 3 * 2;
  kv_kern_layout good = lo;
  lo = good, lo.kv_stride = half - 1; /* V over K */
  refused("kv_stride under a half");
  lo = good, lo.page_stride = 2 * half - 2; /* page over the next */
  refused("page_stride under a page");
  lo = good, lo.page_stride = half, lo.kv_stride = 4 * half - 1; /* K first, V too soon */
  refused("K-first with V over the last K");
  lo = good, lo.page_stride = half - 2, lo.kv_stride = 100 * half;
  refused("K-first with halves over each other");
  lo = good, lo.page_stride = UINT64_MAX / 2;
  refused("a layer past the address space");
  lo = good, lo.page_stride = half, lo.kv_stride = 4 * half; /* the limit: accepted */
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), 0);
}

Test(kernels_bad, pointers_and_page_ids) {
  pages[1] = 4;
  refused("page id == num_pages");
  pages[1] = UINT32_MAX;
  refused("page id UINT32_MAX");
  pages[1] = 0;
  layers[1] = NULL;
  refused("a NULL layer");
  layers[1] = eng[1];
  blocks[2] = NULL;
  refused("a NULL block");
  blocks[2] = blk[2];
  cr_assert_eq(kv_kern_gather_host(&lo, NULL, pages, blocks, 3), -EINVAL);
  cr_assert_eq(kv_kern_gather_host(&lo, layers, NULL, blocks, 3), -EINVAL);
  cr_assert_eq(kv_kern_scatter_host(&lo, layers, pages, NULL, 3), -EINVAL);
  blocks[2] = (void *)(UINTPTR_MAX - 8);
  refused("a block past the address space");
  cr_assert_eq(memcmp(eng, eng0, sizeof eng), 0);
}

Test(kernels_bad, gather_into_overlapping_blocks) {
  blocks[2] = blk[0] + BB - 1;
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), -EINVAL);
  blocks[2] = blk[0];
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), -EINVAL);
  cr_assert_eq(memcmp(blk, blk0, sizeof blk), 0);
  blocks[2] = blk[0] + BB; /* touching is fine (blk[1]'s place: use blk[3]) */
  blocks[1] = blk[3];
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), 0);
}

Test(kernels_bad, scatter_of_a_page_twice) {
  pages[2] = 3;
  cr_assert_eq(kv_kern_scatter_host(&lo, layers, pages, blocks, 3), -EINVAL);
  cr_assert_eq(memcmp(eng, eng0, sizeof eng), 0);
  /* a gather may read a page twice */
  cr_assert_eq(kv_kern_gather_host(&lo, layers, pages, blocks, 3), 0);
  cr_assert_eq(memcmp(blk[0], blk[2], BB), 0);
}
