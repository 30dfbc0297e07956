/* test_client_engine.c - libkvclient's engine calls against a real kvcached
 * (kvclient.h, "for engines"): kvc_g2_register_cuda without a device
 * (-ENODEV, a reason, nothing changed) and on the simulation
 * (KV_DEV_BACKEND=sim: registered, idempotent, undone by kvc_close);
 * kvc_pages_gather into G2 slots from kvc_alloc, committed, loaded by
 * another session and scattered into a second engine buffer of another
 * stride layout, every byte against the CPU reference (kernels_ref.h);
 * every refusal with nothing written; KVC_MEM_CUDA without CUDA; and
 * kvc_memcpy_batch's host path and its refusals. */
#include "tests/lib/fixture.h"

#include "cuda/dev.h"
#include "tests/lib/kernels_ref.h"

#define NB 8 /* blocks per test */

/* 4 layers of 16-token pages, 2 KV heads of 64, bf16: 32 KiB blocks. The
 * engine that gathers holds its pages in the vLLM flash-attention layout
 * ([2][num_pages][...]: K halves first); the one that scatters, dense. */
static const kvc_page_layout lo_dense = {.layers = 4,
                                         .page_tokens = 16,
                                         .kv_heads = 2,
                                         .head_dim = 64,
                                         .elem_bytes = 2,
                                         .num_pages = 20};
#define HALF (16u * 2 * 64 * 2)
static const kvc_page_layout lo_kfirst = {.layers = 4,
                                          .page_tokens = 16,
                                          .kv_heads = 2,
                                          .head_dim = 64,
                                          .elem_bytes = 2,
                                          .num_pages = 20,
                                          .page_stride = HALF,
                                          .kv_stride = 20ull * HALF};

typedef struct engine {
  void *layers[4];
  size_t layer_bytes;
} engine;

static void engine_make(engine *e, const kvc_page_layout *lo, uint64_t seed) {
  e->layer_bytes = (size_t)kv_kern_layer_bytes((const kv_kern_layout *)lo);
  cr_assert_gt(e->layer_bytes, 0);
  for (uint32_t l = 0; l < lo->layers; l++) {
    e->layers[l] = malloc(e->layer_bytes);
    cr_assert_not_null(e->layers[l]);
    kv_ref_fill(e->layers[l], e->layer_bytes, &seed);
  }
}

static void engine_copy(engine *dst, const engine *src) {
  dst->layer_bytes = src->layer_bytes;
  for (int l = 0; l < 4; l++) {
    dst->layers[l] = malloc(src->layer_bytes);
    cr_assert_not_null(dst->layers[l]);
    memcpy(dst->layers[l], src->layers[l], src->layer_bytes);
  }
}

static void engine_expect_eq(const engine *want, const engine *got, const char *what) {
  for (int l = 0; l < 4; l++)
    cr_assert(!memcmp(want->layers[l], got->layers[l], want->layer_bytes), "%s: layer %d differs",
              what, l);
}

static void engine_free(engine *e) {
  for (int l = 0; l < 4; l++) free(e->layers[l]);
}

static kvc *open_lo(const kvc_page_layout *lo) {
  kvc_opts o = {.socket_path = ops_d.sock,
                .tenant = "t1",
                .layout = {.block_bytes = (uint32_t)kvc_page_block_bytes(lo),
                           .tokens_per_block = lo->page_tokens,
                           .layers = lo->layers,
                           .kv_heads = lo->kv_heads,
                           .head_dim = lo->head_dim,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  cr_assert_eq(rc, 0, "kvc_open: %s", kvc_strerror(rc));
  return c;
}

/* NB fresh slots in G2 for keys first.. */
static void alloc_blocks(kvc *c, uint64_t first, kvc_key *keys, kvc_block *out, void **ptrs) {
  for (int i = 0; i < NB; i++) keys[i] = KC(first + (uint64_t)i);
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, keys, NULL, NB, out), NB);
  for (int i = 0; i < NB; i++) ptrs[i] = out[i].ptr;
}

static int have_cuda_device(void) {
  uint8_t u[16];
  return kv_dev_current_uuid(u) == 0;
}

Test(engine, block_bytes) {
  cr_assert_eq(kvc_page_block_bytes(&lo_dense), 4ull * 2 * 16 * 2 * 64 * 2);
  cr_assert_eq(kvc_page_block_bytes(&lo_kfirst), kvc_page_block_bytes(&lo_dense));
  cr_assert_eq(kvc_page_block_bytes(&lo_dense),
               kv_kern_block_bytes((const kv_kern_layout *)&lo_dense));
  kvc_page_layout bad = lo_dense;
  bad.elem_bytes = 3;
  cr_assert_eq(kvc_page_block_bytes(&bad), 0);
  bad = lo_dense;
  bad.kv_stride = 1; /* the halves over each other */
  cr_assert_eq(kvc_page_block_bytes(&bad), 0);
  cr_assert_eq(kvc_page_block_bytes(NULL), 0);
  cr_assert_str_eq(kvc_cuda_error(), "");
}

Test(engine, register_without_a_device, .timeout = 60) {
  if (have_cuda_device()) cr_skip_test("a CUDA device answers here: tests/gpu/gpu_test_client");
  unsetenv("KV_DEV_BACKEND");
  ops_start(NULL, NULL);
  kvc *c = open_lo(&lo_dense);
  kvc_g2 g;
  cr_assert_eq(kvc_g2_info(c, &g), 0);
  cr_assert_not_null(g.base);
  cr_assert_gt(g.bytes, 0);
  cr_assert_eq(g.registered, 0);
  cr_assert_str_eq(g.reason, "");
  cr_assert_eq(kvc_g2_info(NULL, &g), -EINVAL);
  cr_assert_eq(kvc_g2_info(c, NULL), -EINVAL);
  cr_assert_eq(kvc_g2_register_cuda(NULL), -EINVAL);

  for (int round = 0; round < 2; round++) {
    cr_assert_eq(kvc_g2_register_cuda(c), -ENODEV);
    kvc_g2 after;
    cr_assert_eq(kvc_g2_info(c, &after), 0);
    cr_assert_eq(after.registered, 0);
    cr_assert_eq(after.base, g.base);
    cr_assert_eq(after.bytes, g.bytes);
    cr_assert_gt(strlen(after.reason), 0);
    cr_assert(strstr(after.reason, "CUDA"), "reason: %s", after.reason);
    cr_assert_str_eq(kvc_cuda_error(), after.reason);
  }
  /* Nothing changed: the session works, and its G2 is not CUDA's. */
  kvc_key keys[NB];
  kvc_block out[NB];
  void *ptrs[NB];
  alloc_blocks(c, 100, keys, out, ptrs);
  for (int i = 0; i < NB; i++) {
    cr_assert((uint8_t *)ptrs[i] >= (uint8_t *)g.base &&
              (uint8_t *)ptrs[i] + kvc_page_block_bytes(&lo_dense) <= (uint8_t *)g.base + g.bytes);
    memset(ptrs[i], i + 1, (size_t)kvc_page_block_bytes(&lo_dense));
  }
  cr_assert_eq(kvc_commit(c, keys, NB, NULL), NB);
  cr_assert_eq(kvc_lookup(c, keys, NB, NULL), NB);
  static uint8_t dst[32768];
  kvc_copy v = {dst, ptrs[0], sizeof dst};
  cr_assert_eq(kvc_memcpy_batch(c, &v, 1, KVC_MEM_CUDA, NULL), -EFAULT);
  cr_assert(strstr(kvc_cuda_error(), "not registered"), "%s", kvc_cuda_error());
  kvc_close(c);
  ops_stop();
}

Test(engine, register_on_the_simulation, .timeout = 60) {
  setenv("KV_DEV_BACKEND", "sim", 1);
  ops_start(NULL, NULL);
  kvc *c = open_lo(&lo_dense), *c2 = open_lo(&lo_dense);
  kvc_g2 g, g2;
  cr_assert_eq(kvc_g2_info(c, &g), 0);
  cr_assert_eq(kvc_g2_info(c2, &g2), 0);
  cr_assert_neq(g.base, g2.base, "two handles, two mappings");
  cr_assert_eq(kv_dev_sim_host_registered(g.base), 0);

  cr_assert_eq(kvc_g2_register_cuda(c), 0, "%s", kvc_cuda_error());
  cr_assert_eq(kvc_g2_info(c, &g), 0);
  cr_assert_eq(g.registered, KVC_G1_SIM);
  cr_assert_str_eq(g.reason, "");
  cr_assert_eq(kv_dev_sim_host_registered(g.base), 1);
  cr_assert_eq(kvc_g2_register_cuda(c), 0, "idempotent");
  cr_assert_eq(kvc_g2_info(c, &g), 0);
  cr_assert_eq(g.registered, KVC_G1_SIM);
  cr_assert_eq(kv_dev_sim_host_registered(g.base), 1);
  cr_assert_eq(kvc_g2_register_cuda(c2), 0);
  cr_assert_eq(kv_dev_sim_host_registered(g2.base), 1);

  /* Host copies in and out of the registered mapping, as before. */
  engine a;
  engine_make(&a, &lo_dense, 11);
  kvc_key keys[NB];
  kvc_block out[NB];
  void *ptrs[NB];
  uint32_t pages[NB] = {3, 1, 4, 15, 9, 2, 6, 5};
  alloc_blocks(c, 200, keys, out, ptrs);
  cr_assert_eq(kvc_pages_gather(c, &lo_dense, a.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), 0);
  /* A simulated registration is no CUDA registration. */
  cr_assert_eq(kvc_pages_scatter(c, &lo_dense, a.layers, pages, ptrs, NB, KVC_MEM_CUDA, NULL),
               -ENODEV);
  cr_assert(strstr(kvc_cuda_error(), "simulated"), "%s", kvc_cuda_error());
  static uint8_t dst[32768];
  kvc_copy v = {dst, ptrs[0], sizeof dst};
  cr_assert_eq(kvc_memcpy_batch(c, &v, 1, KVC_MEM_CUDA, NULL), -ENODEV);
  cr_assert_eq(kvc_memcpy_batch(c, &v, 1, KVC_MEM_HOST, NULL), 0);
  cr_assert(!memcmp(dst, ptrs[0], sizeof dst));
  cr_assert_eq(kvc_commit(c, keys, NB, NULL), NB);

  /* kvc_close undoes it: this handle's range goes, the other's stays. */
  kvc_close(c);
  cr_assert_eq(kv_dev_sim_host_registered(g.base), 0);
  cr_assert_eq(kv_dev_sim_host_registered(g2.base), 1);
  kvc_close(c2);
  cr_assert_eq(kv_dev_sim_host_registered(g2.base), 0);
  engine_free(&a);
  ops_stop();
}

/* The whole way: engine A (K-first layout) gathers NB pages into fresh G2
 * slots, which must hold the reference's blocks; they are committed; a
 * second session loads them and scatters them into engine B (dense
 * layout), which must equal its old self with the reference's scatter of
 * those blocks - so B's pages equal A's, page for page. */
Test(engine, gather_store_load_scatter, .timeout = 60) {
  ops_start(NULL, NULL);
  const size_t bb = (size_t)kvc_page_block_bytes(&lo_dense);
  engine a, a_before, b, want;
  engine_make(&a, &lo_kfirst, 21);
  engine_copy(&a_before, &a);
  engine_make(&b, &lo_dense, 22);
  engine_copy(&want, &b);
  uint32_t from[NB] = {7, 0, 19, 3, 11, 3, 12, 5}; /* a page twice: a gather may */
  uint32_t to[NB] = {2, 17, 4, 9, 0, 13, 6, 18};

  kvc *c = open_lo(&lo_dense);
  kvc_key keys[NB];
  kvc_block out[NB];
  void *ptrs[NB];
  alloc_blocks(c, 300, keys, out, ptrs);
  cr_assert_eq(kvc_pages_gather(c, &lo_kfirst, a.layers, from, ptrs, NB, KVC_MEM_HOST, NULL), 0);
  engine_expect_eq(&a_before, &a, "a gather changed its engine");
  uint8_t *ref = malloc(NB * bb);
  cr_assert_not_null(ref);
  void *refp[NB];
  for (int i = 0; i < NB; i++) refp[i] = ref + (size_t)i * bb;
  kv_ref_copy((const kv_kern_layout *)&lo_kfirst, a.layers, from, refp, NB, 0);
  for (int i = 0; i < NB; i++)
    cr_assert(!memcmp(ptrs[i], refp[i], bb), "G2 block %d is not the reference's", i);
  cr_assert_eq(kvc_commit(c, keys, NB, NULL), NB);

  kvc *c2 = open_lo(&lo_dense);
  kvc_block got[NB];
  cr_assert_eq(kvc_load(c2, KVC_G2, keys, NB, got), NB);
  void *gp[NB];
  for (int i = 0; i < NB; i++) {
    cr_assert_eq(got[i].tier, KVC_G2);
    cr_assert_eq(got[i].length, bb);
    gp[i] = got[i].ptr;
  }
  cr_assert_eq(kvc_pages_scatter(c2, &lo_dense, b.layers, to, gp, NB, KVC_MEM_HOST, NULL), 0);
  kv_ref_copy((const kv_kern_layout *)&lo_dense, want.layers, to, refp, NB, 1);
  engine_expect_eq(&want, &b, "the scatter is not the reference's");
  /* Page for page: B's page to[i] is A's page from[i], K and V. */
  for (int i = 0; i < NB; i++)
    for (int l = 0; l < 4; l++)
      for (int kv = 0; kv < 2; kv++) {
        const uint8_t *pa =
            (uint8_t *)a.layers[l] + from[i] * (uint64_t)HALF + (uint64_t)kv * lo_kfirst.kv_stride;
        const uint8_t *pb = (uint8_t *)b.layers[l] + to[i] * 2ull * HALF + (uint64_t)kv * HALF;
        cr_assert(!memcmp(pa, pb, HALF), "block %d layer %d half %d", i, l, kv);
      }
  cr_assert_eq(kvc_release(c2, keys, NB, NULL), NB);
  kvc_close(c2);
  kvc_close(c);
  free(ref);
  engine_free(&a), engine_free(&a_before), engine_free(&b), engine_free(&want);
  ops_stop();
}

/* Each bad call returns its error and writes nothing: the engine and the
 * blocks are as they were. */
Test(engine, pages_refusals, .timeout = 60) {
  ops_start(NULL, NULL);
  const size_t bb = (size_t)kvc_page_block_bytes(&lo_dense);
  kvc *c = open_lo(&lo_dense);
  kvc_key keys[NB];
  kvc_block out[NB];
  void *ptrs[NB];
  alloc_blocks(c, 400, keys, out, ptrs);
  uint64_t seed = 5;
  for (int i = 0; i < NB; i++) kv_ref_fill(ptrs[i], bb, &seed);
  uint8_t *blocks_before = malloc(NB * bb);
  cr_assert_not_null(blocks_before);
  for (int i = 0; i < NB; i++) memcpy(blocks_before + (size_t)i * bb, ptrs[i], bb);
  engine e, e_before;
  engine_make(&e, &lo_dense, 31);
  engine_copy(&e_before, &e);
  uint32_t pages[NB] = {0, 1, 2, 3, 4, 5, 6, 7};
  kvc_g2 g;
  cr_assert_eq(kvc_g2_info(c, &g), 0);

  kvc_page_layout bad_elem = lo_dense, no_layers = lo_dense, bad_strides = lo_dense;
  bad_elem.elem_bytes = 3;
  no_layers.layers = 0;
  bad_strides.kv_stride = 1;
  for (int scatter = 0; scatter < 2; scatter++) {
    int (*fn)(kvc *, const kvc_page_layout *, void *const *, const uint32_t *, void *const *,
              size_t, int, void *) = scatter ? kvc_pages_scatter : kvc_pages_gather;
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, ptrs, NB, 2, NULL), -EINVAL, "mem 2");
    cr_assert_eq(fn(c, &bad_elem, e.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, &no_layers, e.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, &bad_strides, e.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, NULL, e.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, &lo_dense, NULL, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, &lo_dense, e.layers, NULL, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, NULL, NB, KVC_MEM_HOST, NULL), -EINVAL);
    /* n 0: the geometry is still checked, nothing else */
    cr_assert_eq(fn(c, &lo_dense, NULL, NULL, NULL, 0, KVC_MEM_HOST, NULL), 0);
    cr_assert_eq(fn(c, &lo_dense, NULL, NULL, NULL, 0, KVC_MEM_CUDA, NULL), 0);
    cr_assert_eq(fn(c, &bad_elem, NULL, NULL, NULL, 0, KVC_MEM_HOST, NULL), -EINVAL);
    uint32_t far[NB] = {0, 1, 2, 3, 4, 5, 6, 20}; /* == num_pages */
    cr_assert_eq(fn(c, &lo_dense, e.layers, far, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    void *with_null[NB];
    memcpy(with_null, ptrs, sizeof with_null);
    with_null[5] = NULL;
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, with_null, NB, KVC_MEM_HOST, NULL), -EINVAL);
    void *null_layer[4] = {e.layers[0], NULL, e.layers[2], e.layers[3]};
    cr_assert_eq(fn(c, &lo_dense, null_layer, pages, ptrs, NB, KVC_MEM_HOST, NULL), -EINVAL);
    /* Blocks across the edge of the G2 mapping: -EFAULT, in both modes. */
    void *edge[NB];
    memcpy(edge, ptrs, sizeof edge);
    edge[3] = (uint8_t *)g.base + g.bytes - bb / 2;
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, edge, NB, KVC_MEM_HOST, NULL), -EFAULT);
    cr_assert(strstr(kvc_cuda_error(), "edge"), "%s", kvc_cuda_error());
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, edge, NB, KVC_MEM_CUDA, NULL), -EFAULT);
    edge[3] = ptrs[3];
    int low = 0; /* the lowest block may sit at the base: it makes way */
    for (int i = 1; i < NB; i++)
      if ((uintptr_t)ptrs[i] < (uintptr_t)ptrs[low]) low = i;
    edge[low] = (uint8_t *)g.base - bb / 2;
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, edge, NB, KVC_MEM_HOST, NULL), -EFAULT);
    /* G2 blocks of a handle that is not registered, for a kernel. */
    cr_assert_eq(fn(c, &lo_dense, e.layers, pages, ptrs, NB, KVC_MEM_CUDA, NULL), -EFAULT);
    cr_assert(strstr(kvc_cuda_error(), "not registered"), "%s", kvc_cuda_error());
  }
  /* Gather: destination blocks that overlap. */
  void *overlap[NB];
  memcpy(overlap, ptrs, sizeof overlap);
  overlap[6] = (uint8_t *)ptrs[2] + 64;
  cr_assert_eq(kvc_pages_gather(c, &lo_dense, e.layers, pages, overlap, NB, KVC_MEM_HOST, NULL),
               -EINVAL);
  /* Scatter: a page named twice. */
  uint32_t twice[NB] = {0, 1, 2, 3, 4, 5, 6, 1};
  cr_assert_eq(kvc_pages_scatter(c, &lo_dense, e.layers, twice, ptrs, NB, KVC_MEM_HOST, NULL),
               -EINVAL);
  cr_assert_eq(kvc_pages_gather(c, &lo_dense, e.layers, twice, ptrs, NB, KVC_MEM_HOST, NULL), 0,
               "a gather may name a page twice");
  /* that one copied; the rest wrote nothing: put the blocks back, compare */
  for (int i = 0; i < NB; i++) memcpy(ptrs[i], blocks_before + (size_t)i * bb, bb);
  engine_expect_eq(&e_before, &e, "a refused call wrote the engine");
  cr_assert_eq(kvc_abort(c, keys, NB, NULL), NB);
  kvc_close(c);
  free(blocks_before);
  engine_free(&e), engine_free(&e_before);
  ops_stop();
}

/* KVC_MEM_CUDA where no device answers: -ENODEV with CUDA's text, nothing
 * written (c NULL: no block is in G2). */
Test(engine, cuda_without_a_device) {
  if (have_cuda_device()) cr_skip_test("a CUDA device answers here: tests/gpu/gpu_test_client");
  const size_t bb = (size_t)kvc_page_block_bytes(&lo_dense);
  engine e, e_before;
  engine_make(&e, &lo_dense, 41);
  engine_copy(&e_before, &e);
  uint8_t *blk = malloc(NB * bb), *blk_before = malloc(NB * bb);
  cr_assert(blk && blk_before);
  uint64_t seed = 3;
  kv_ref_fill(blk, NB * bb, &seed);
  memcpy(blk_before, blk, NB * bb);
  void *ptrs[NB];
  uint32_t pages[NB] = {9, 8, 7, 6, 5, 4, 3, 2};
  for (int i = 0; i < NB; i++) ptrs[i] = blk + (size_t)i * bb;
  cr_assert_eq(kvc_pages_gather(NULL, &lo_dense, e.layers, pages, ptrs, NB, KVC_MEM_CUDA, NULL),
               -ENODEV);
  cr_assert_gt(strlen(kvc_cuda_error()), 0);
  char first[256];
  snprintf(first, sizeof first, "%s", kvc_cuda_error());
  cr_assert_eq(kvc_pages_scatter(NULL, &lo_dense, e.layers, pages, ptrs, NB, KVC_MEM_CUDA, NULL),
               -ENODEV);
  cr_assert_str_eq(kvc_cuda_error(), first);
  kvc_copy v[2] = {{blk, blk + bb, bb}, {blk + 2 * bb, blk + 3 * bb, bb}};
  cr_assert_eq(kvc_memcpy_batch(NULL, v, 2, KVC_MEM_CUDA, NULL), -ENODEV);
  cr_assert_gt(strlen(kvc_cuda_error()), 0);
  /* The host path of the same calls clears the text. */
  cr_assert_eq(kvc_pages_gather(NULL, &lo_dense, e.layers, pages, ptrs, NB, KVC_MEM_HOST, NULL), 0);
  cr_assert_str_eq(kvc_cuda_error(), "");
  engine_expect_eq(&e_before, &e, "engine");
  cr_assert(memcmp(blk, blk_before, NB * bb), "the host gather wrote the blocks");
  memcpy(blk, blk_before, NB * bb);
  cr_assert_eq(kvc_memcpy_batch(NULL, v, 2, KVC_MEM_CUDA, NULL), -ENODEV);
  cr_assert(!memcmp(blk, blk_before, NB * bb), "a refused batch copied");
  free(blk), free(blk_before);
  engine_free(&e), engine_free(&e_before);
}

Test(engine, memcpy_batch_host, .timeout = 60) {
  ops_start(NULL, NULL);
  const size_t bb = (size_t)kvc_page_block_bytes(&lo_dense);
  kvc *c = open_lo(&lo_dense);
  kvc_key keys[NB];
  kvc_block out[NB];
  void *ptrs[NB];
  alloc_blocks(c, 500, keys, out, ptrs);
  uint8_t *src = malloc(NB * bb), *back = malloc(NB * bb);
  cr_assert(src && back);
  uint64_t seed = 9;
  kv_ref_fill(src, NB * bb, &seed);
  memset(back, 0, NB * bb);
  /* Host -> G2, one batch. */
  kvc_copy v[NB];
  for (int i = 0; i < NB; i++) v[i] = (kvc_copy){ptrs[i], src + (size_t)(NB - 1 - i) * bb, bb};
  cr_assert_eq(kvc_memcpy_batch(c, v, NB, KVC_MEM_HOST, NULL), 0);
  for (int i = 0; i < NB; i++)
    cr_assert(!memcmp(ptrs[i], src + (size_t)(NB - 1 - i) * bb, bb), "block %d", i);
  cr_assert_eq(kvc_commit(c, keys, NB, NULL), NB);
  /* G2 -> host from another session, partial blocks too. */
  kvc *c2 = open_lo(&lo_dense);
  kvc_block got[NB];
  cr_assert_eq(kvc_load(c2, KVC_G2, keys, NB, got), NB);
  for (int i = 0; i < NB; i++) v[i] = (kvc_copy){back + (size_t)i * bb, got[i].ptr, bb - (size_t)i};
  cr_assert_eq(kvc_memcpy_batch(c2, v, NB, KVC_MEM_HOST, NULL), 0);
  for (int i = 0; i < NB; i++) {
    cr_assert(!memcmp(back + (size_t)i * bb, src + (size_t)(NB - 1 - i) * bb, bb - (size_t)i));
    for (int k = 0; k < i; k++) cr_assert_eq(back[(size_t)(i + 1) * bb - 1 - (size_t)k], 0);
  }
  cr_assert_eq(kvc_memcpy_batch(c2, NULL, 0, KVC_MEM_HOST, NULL), 0, "n 0 does nothing");
  cr_assert_eq(kvc_memcpy_batch(NULL, NULL, 0, KVC_MEM_CUDA, NULL), 0, "n 0 does nothing");

  /* Refusals, all or nothing: the first copy is good, the second not. */
  memset(back, 0, NB * bb);
  kvc_g2 g;
  cr_assert_eq(kvc_g2_info(c2, &g), 0);
  struct {
    const char *what;
    kvc_copy bad;
    int mem, want;
  } cases[] = {
      {"bytes 0", {back + bb, got[1].ptr, 0}, KVC_MEM_HOST, -EINVAL},
      {"NULL dst", {NULL, got[1].ptr, bb}, KVC_MEM_HOST, -EINVAL},
      {"NULL src", {back + bb, NULL, bb}, KVC_MEM_HOST, -EINVAL},
      {"overlap", {back + bb, back + bb + 100, 200}, KVC_MEM_HOST, -EINVAL},
      {"wraps", {back + bb, (void *)(UINTPTR_MAX - 10), 100}, KVC_MEM_HOST, -EINVAL},
      {"mem 5", {back + bb, got[1].ptr, bb}, 5, -EINVAL},
      {"across the end of G2",
       {back + bb, (uint8_t *)g.base + g.bytes - 10, 100},
       KVC_MEM_HOST,
       -EFAULT},
      {"across the start of G2", {(uint8_t *)g.base - 10, back + bb, 100}, KVC_MEM_HOST, -EFAULT},
      {"G2 not registered", {back + bb, got[1].ptr, bb}, KVC_MEM_CUDA, -EFAULT},
      {"G2 not registered (dst)", {got[1].ptr, back + bb, bb}, KVC_MEM_CUDA, -EFAULT},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kvc_copy two[2] = {{back, got[0].ptr, bb}, cases[k].bad};
    cr_assert_eq(kvc_memcpy_batch(c2, two, 2, cases[k].mem, NULL), cases[k].want, "%s",
                 cases[k].what);
    for (size_t i = 0; i < 2 * bb; i++) cr_assert_eq(back[i], 0, "%s: copied", cases[k].what);
  }
  cr_assert_eq(kvc_memcpy_batch(c2, NULL, 1, KVC_MEM_HOST, NULL), -EINVAL);
  cr_assert_eq(kvc_release(c2, keys, NB, NULL), NB);
  kvc_close(c2);
  kvc_close(c);
  free(src), free(back);
  ops_stop();
}
