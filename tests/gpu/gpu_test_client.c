/* gpu_test_client.c - libkvclient's engine calls (kvclient.h, "for
 * engines") on a CUDA device, this process the worker of a real kvcached
 * (G1 pool on the device):
 *   - kvc_g2_register_cuda registers the worker's G2 mapping (idempotent;
 *     the thread's current device left as it was);
 *   - kvc_pages_gather(KVC_MEM_CUDA) from a cudaMalloc'ed paged engine
 *     (vLLM's K-first layout) straight into G2 slots from kvc_alloc: every
 *     byte equal to the CPU reference (tests/lib/kernels_ref.c), then
 *     committed;
 *   - the blocks, loaded back, scattered into a second engine buffer three
 *     ways: straight from G2 (the kernel reads host memory in place), via
 *     kvc_memcpy_batch into a device staging buffer and a scatter from it,
 *     and from G1 (kvc_load to KVC_G1, the daemon's copy) with the kernel;
 *     each time the whole engine buffer against the reference;
 *   - a G2 block of a handle that is not registered is -EFAULT for both.
 * `--sim` runs the same against the simulated device (daemon g1.backend =
 * sim, KV_DEV_BACKEND=sim here, "device" memory is host memory and the
 * calls take KVC_MEM_HOST), so ctest keeps the program sound.
 * Exit: 0 passed, 1 failed, 77 no CUDA device here (with the reason). */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/engine.h"
#include "client/kvclient.h"
#include "cuda/dev.h"
#include "tests/lib/gpu.h"
#include "tests/lib/kernels_ref.h"

#define NBLK   32
#define NPAGES 64
#define LAYERS 4
#define HALF   (16u * 4 * 64 * 2) /* 16 tokens, 4 KV heads of 64, bf16: 8 KiB */

/* 64 KiB blocks; the engine in the vLLM flash-attention layout. */
static const kvc_page_layout lo = {.layers = LAYERS,
                                   .page_tokens = 16,
                                   .kv_heads = 4,
                                   .head_dim = 64,
                                   .elem_bytes = 2,
                                   .num_pages = NPAGES,
                                   .page_stride = HALF,
                                   .kv_stride = (uint64_t)NPAGES * HALF};

static int sim, mem;
static cudaStream_t stream;
static kvt_daemon kd;

/* "Device" memory: CUDA's, or host memory with --sim. */
static void *d_alloc(size_t n) {
  void *p = NULL;
  if (sim) return malloc(n);
  return cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
}
static void d_free(void *p) {
  if (sim) free(p);
  else cudaFree(p);
}
static int d_put(void *dst, const void *src, size_t n) {
  if (!sim) return cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -EIO;
  memcpy(dst, src, n);
  return 0;
}
static int d_get(void *dst, const void *src, size_t n) {
  if (!sim) return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -EIO;
  memcpy(dst, src, n);
  return 0;
}
/* Waits for the stream: an error of a kernel or a copy shows here. */
static int d_sync(void) {
  if (sim) return 0;
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) fprintf(stderr, "    stream: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : -EIO;
}

/* A worker session; no_g1: without the G1 pool (kvc_opts.no_g1). */
static kvc *worker(int no_g1) {
  kvc_opts o = {.socket_path = kd.sock,
                .tenant = "gpu",
                .no_g1 = no_g1,
                .layout = {.block_bytes = (uint32_t)kvc_page_block_bytes(&lo),
                           .tokens_per_block = lo.page_tokens,
                           .layers = lo.layers,
                           .kv_heads = lo.kv_heads,
                           .head_dim = lo.head_dim,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  if (rc) fprintf(stderr, "    kvc_open: %s\n", kvc_strerror(rc));
  return c;
}

static kvc_key key(uint64_t v) {
  kvc_key k = {.len = 8};
  for (int i = 0; i < 8; i++) k.b[i] = (uint8_t)(v >> (8 * i) ^ 0xa3);
  return k;
}

/* The engine's layers in one allocation, one tensor each. */
typedef struct engine {
  uint8_t *mem;
  void *layers[LAYERS];
} engine;

static size_t layer_bytes(void) { return (size_t)kv_kern_layer_bytes((const kv_kern_layout *)&lo); }

static int engine_make(engine *e) {
  e->mem = d_alloc(LAYERS * layer_bytes());
  for (int l = 0; l < LAYERS; l++) e->layers[l] = e->mem + (size_t)l * layer_bytes();
  return e->mem ? 0 : -ENOMEM;
}

/* The whole engine (every layer, the pages no block went to included)
 * against `want` (host), after the scatter `how` names. */
static int check_engine(const engine *e, const uint8_t *want, const char *how) {
  size_t n = LAYERS * layer_bytes();
  uint8_t *got = malloc(n);
  REQ(got, "malloc");
  int rc = d_get(got, e->mem, n);
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "    %s: engine byte %zu (layer %zu) is %#x, reference %#x\n", how, i,
              i / layer_bytes(), got[i], want[i]);
      rc = 1;
    }
  free(got);
  REQ(rc == 0, "%s: the engine is not the reference's", how);
  printf("    %-44s every byte equal to the reference\n", how);
  return 0;
}

static int run(void) {
  const size_t bb = (size_t)kvc_page_block_bytes(&lo), eb = LAYERS * layer_bytes();
  int cur0 = -1, cur1 = -1;
  if (!sim) REQ(cudaGetDevice(&cur0) == cudaSuccess, "cudaGetDevice");

  kvc *c = worker(0);
  REQ(c, "the worker could not connect");
  REQ(kvc_g2_register_cuda(c) == 0, "kvc_g2_register_cuda: %s", kvc_cuda_error());
  REQ(kvc_g2_register_cuda(c) == 0, "a second kvc_g2_register_cuda: %s", kvc_cuda_error());
  kvc_g2 g;
  REQ(kvc_g2_info(c, &g) == 0 && g.registered == (sim ? KVC_G1_SIM : KVC_G1_CUDA),
      "registered %d: %s", g.registered, g.reason);
  if (!sim) {
    REQ(cudaGetDevice(&cur1) == cudaSuccess && cur1 == cur0, "current device %d, was %d", cur1,
        cur0);
    struct cudaPointerAttributes pa;
    REQ(cudaPointerGetAttributes(&pa, g.base) == cudaSuccess && pa.type == cudaMemoryTypeHost,
        "the G2 mapping is not registered host memory for CUDA");
  }
  kvc_g1 g1;
  REQ(kvc_g1_info(c, &g1) == 0 && g1.available, "G1 not mapped: %s", g1.reason);
  printf("    G2 mapping of %llu MiB registered (%s; device-side address %s the host's)\n",
         (unsigned long long)(g.bytes >> 20), sim ? "simulation" : "CUDA",
         kvc__g2_of(c)->dbase == (uintptr_t)g.base ? "equal to" : "differs from");

  /* The engine that stores: random pages, on the device. */
  uint64_t seed = 0x5eed;
  uint8_t *ha = malloc(eb), *hb = malloc(eb), *want = malloc(eb), *ref = malloc(NBLK * bb);
  REQ(ha && hb && want && ref, "malloc");
  kv_ref_fill(ha, eb, &seed);
  kv_ref_fill(hb, eb, &seed);
  engine a, b;
  REQ(engine_make(&a) == 0 && engine_make(&b) == 0, "engine buffers");
  REQ(d_put(a.mem, ha, eb) == 0, "engine A");
  uint32_t from[NBLK], to[NBLK], perm[NPAGES];
  for (uint32_t p = 0; p < NPAGES; p++) perm[p] = p;
  for (uint32_t p = NPAGES; p > 1; p--) {
    uint32_t j = (uint32_t)(kv_ref_rand(&seed) % p), t = perm[p - 1];
    perm[p - 1] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < NBLK; i++) {
    from[i] = perm[i];
    to[i] = perm[NPAGES - 1 - i];
  }
  void *hal[LAYERS], *refp[NBLK];
  for (int l = 0; l < LAYERS; l++) hal[l] = ha + (size_t)l * layer_bytes();
  for (int i = 0; i < NBLK; i++) refp[i] = ref + (size_t)i * bb;
  kv_ref_copy((const kv_kern_layout *)&lo, hal, from, refp, NBLK, 0);

  /* Store: gather from the device engine straight into G2 slots. */
  kvc_key keys[NBLK];
  kvc_block out[NBLK];
  void *ptrs[NBLK];
  for (int i = 0; i < NBLK; i++) keys[i] = key((uint64_t)i);
  REQ(kvc_alloc(c, KVC_G2, 128, keys, NULL, NBLK, out) == NBLK, "alloc");
  for (int i = 0; i < NBLK; i++) ptrs[i] = out[i].ptr;
  int rc = kvc_pages_gather(c, &lo, a.layers, from, ptrs, NBLK, mem, stream);
  REQ(rc == 0, "gather into G2: %d %s", rc, kvc_cuda_error());
  REQ(d_sync() == 0, "gather into G2");
  for (int i = 0; i < NBLK; i++)
    REQ(!memcmp(ptrs[i], refp[i], bb), "G2 block %d after the gather is not the reference's", i);
  printf("    %-44s every byte equal to the reference\n", "gather: device engine -> G2 slots");
  REQ(kvc_commit(c, keys, NBLK, NULL) == NBLK, "commit");

  /* What every scatter must leave: B's old bytes with the blocks at to[]. */
  void *wl[LAYERS];
  memcpy(want, hb, eb);
  for (int l = 0; l < LAYERS; l++) wl[l] = want + (size_t)l * layer_bytes();
  kv_ref_copy((const kv_kern_layout *)&lo, wl, to, refp, NBLK, 1);

  kvc_block got[NBLK];
  void *gp[NBLK];
  REQ(kvc_load(c, KVC_G2, keys, NBLK, got) == NBLK, "LOAD to G2");
  for (int i = 0; i < NBLK; i++) gp[i] = got[i].ptr;
  /* 1. straight from G2 */
  REQ(d_put(b.mem, hb, eb) == 0, "engine B");
  rc = kvc_pages_scatter(c, &lo, b.layers, to, gp, NBLK, mem, stream);
  REQ(rc == 0, "scatter from G2: %d %s", rc, kvc_cuda_error());
  REQ(d_sync() == 0, "scatter from G2");
  if (check_engine(&b, want, "scatter straight from G2")) return 1;
  /* 2. G2 -> device staging (one batch), then a scatter from there */
  uint8_t *stage = d_alloc(NBLK * bb);
  REQ(stage, "staging buffer");
  kvc_copy v[NBLK];
  void *sp[NBLK];
  for (int i = 0; i < NBLK; i++) {
    sp[i] = stage + (size_t)(NBLK - 1 - i) * bb;
    v[i] = (kvc_copy){sp[i], gp[i], bb};
  }
  REQ(d_put(b.mem, hb, eb) == 0, "engine B");
  rc = kvc_memcpy_batch(c, v, NBLK, mem, stream);
  REQ(rc == 0, "kvc_memcpy_batch: %d %s", rc, kvc_cuda_error());
  rc = kvc_pages_scatter(c, &lo, b.layers, to, sp, NBLK, mem, stream);
  REQ(rc == 0, "scatter from staging: %d %s", rc, kvc_cuda_error());
  REQ(d_sync() == 0, "staged scatter");
  if (check_engine(&b, want, "kvc_memcpy_batch to staging + scatter")) return 1;
  REQ(kvc_release(c, keys, NBLK, NULL) == NBLK, "release");
  /* 3. from G1: the daemon's copy, then the kernel */
  REQ(kvc_load(c, KVC_G1, keys, NBLK, got) == NBLK, "LOAD to G1");
  for (int i = 0; i < NBLK; i++) {
    REQ(got[i].tier == KVC_G1, "block %d came back in tier %u", i, got[i].tier);
    gp[i] = got[i].ptr;
  }
  REQ(d_put(b.mem, hb, eb) == 0, "engine B");
  rc = kvc_pages_scatter(c, &lo, b.layers, to, gp, NBLK, mem, stream);
  REQ(rc == 0, "scatter from G1: %d %s", rc, kvc_cuda_error());
  REQ(d_sync() == 0, "scatter from G1");
  if (check_engine(&b, want, "scatter from G1 (kvc_load to KVC_G1)")) return 1;
  REQ(kvc_release(c, keys, NBLK, NULL) == NBLK, "release");

  /* A handle that did not register: its G2 blocks are refused for CUDA,
   * before anything runs. */
  kvc *u = worker(1);
  REQ(u, "second worker");
  REQ(kvc_load(u, KVC_G2, keys, NBLK, got) == NBLK, "its LOAD to G2");
  for (int i = 0; i < NBLK; i++) {
    gp[i] = got[i].ptr;
    v[i] = (kvc_copy){sp[i], gp[i], bb};
  }
  rc = kvc_pages_scatter(u, &lo, b.layers, to, gp, NBLK, KVC_MEM_CUDA, stream);
  REQ(rc == -EFAULT, "scatter from an unregistered G2: %d", rc);
  rc = kvc_pages_gather(u, &lo, b.layers, to, gp, NBLK, KVC_MEM_CUDA, stream);
  REQ(rc == -EFAULT, "gather into an unregistered G2: %d", rc);
  rc = kvc_memcpy_batch(u, v, NBLK, KVC_MEM_CUDA, stream);
  REQ(rc == -EFAULT, "kvc_memcpy_batch from an unregistered G2: %d", rc);
  printf("    %-44s -EFAULT (%s)\n", "a G2 block of an unregistered handle", kvc_cuda_error());
  kvc_close(u);

  kvc_close(c);
  if (sim) REQ(!kv_dev_sim_host_registered(g.base), "kvc_close left the registration");
  else REQ(cudaGetDevice(&cur1) == cudaSuccess && cur1 == cur0, "kvc_close changed the device");
  d_free(stage);
  d_free(a.mem);
  d_free(b.mem);
  free(ha), free(hb), free(want), free(ref);
  return 0;
}

int main(int argc, char **argv) {
  sim = argc > 1 && !strcmp(argv[1], "--sim");
  uint8_t u[16];
  if (!sim && kv_dev_current_uuid(u) != 0) {
    char why[KV_DEV_REASON_MAX] = "";
    kv_dev *d = NULL;
    kv_dev_opts o = {.backend = KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
    if (kv_dev_open(&d, &o) == 0) kv_dev_close(d);
    printf("gpu_test_client: skipped: no CUDA device here (%s; try --sim)\n", why);
    return 77;
  }
  if (sim) setenv("KV_DEV_BACKEND", "sim", 1);
  mem = sim ? KVC_MEM_HOST : KVC_MEM_CUDA;
  if (!sim && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    printf("gpu_test_client: FAILED (cudaStreamCreate)\n");
    return 1;
  }
  printf("gpu_test_client: libkvclient's engine calls on the %s device, against kvcached\n",
         sim ? "simulated" : "CUDA");
  const char *sets[] = {"g2.page_size=4M", "g1.enable=on",
                        sim ? "g1.backend=sim" : "g1.backend=cuda", "g1.capacity=64M", NULL};
  if (gpu_daemon_start(&kd, "96M", sets)) {
    gpu_daemon_stop(&kd);
    printf("gpu_test_client: FAILED (kvcached did not start)\n");
    return 1;
  }
  int rc = run();
  rc = gpu_daemon_stop(&kd) || rc;
  printf("gpu_test_client: %s\n", rc ? "FAILED" : "passed");
  return rc;
}
