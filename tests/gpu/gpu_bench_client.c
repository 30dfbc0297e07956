/* gpu_bench_client.c - the bandwidth an engine gets from kvcached on a CUDA
 * device, each path beside cudaMemcpyAsync of the same bytes from (or to)
 * cudaMallocHost memory in this process, same run; medians of
 * KV_BENCH_RUNS (default 15, at most 64) runs, wall clock from the first
 * call to the end of the stream's work; printed as one table with ratios
 * (path GB/s / reference GB/s) and the targets of the issue. Nothing is
 * asserted about speed.
 *
 * a. G2 -> G1 through the daemon. For each block size B (64 KiB .. 16 MiB)
 *    a kvcached of its own (G1 on the device, g1.capacity exactly 64 * B,
 *    G3 off); this process, its worker, stores two sets of 64 blocks in G2
 *    and then LOADs the sets to G1 in turn, releasing each. Since G1 holds
 *    exactly one set, every LOAD finds the other set there (unpinned, still
 *    in G2) and evicts it without a copy: so each LOAD copies its 64 blocks
 *    G2 -> G1. Timed: kvc_load(KVC_G1) of the 64 keys, blocking - the
 *    request, the daemon pinning and evicting, its one batched submission
 *    of 64 H2D copies on its own stream, the completion, the reply. The
 *    program checks that every block came back in G1 and that the daemon's
 *    kvcached_g1_copies_total{dir="load"} grew by 64 per LOAD. Reference:
 *    64 cudaMemcpyAsync H2D of B bytes from cudaMallocHost memory.
 * b. G1 -> G2: the daemon copies G1 -> G2 only when it writes back a G1
 *    victim that G2 no longer holds, inside a LOAD to G1 that needs its
 *    room (each such copy followed by that LOAD's own H2D copy, block by
 *    block); no request does the write-back alone, so there is no honest
 *    way to time it through the daemon. Reported instead: the daemon's copy
 *    engine (cuda/dev.h, kv_dev_submit of 64 D2H copies from a pool into
 *    registered host memory, reaped from the completion fd, as
 *    gpu_bench_copy does), reference 64 cudaMemcpyAsync D2H into
 *    cudaMallocHost memory.
 * c. The worker's own copies, G2 registered (kvc_g2_register_cuda):
 *    - kvc_memcpy_batch(KVC_MEM_CUDA) of 64 G2 blocks (loaded, pinned) into
 *      a device staging buffer, for each B of part a (target >= 90%);
 *    - on a realistic geometry (16 layers, 16-token pages, 8 KV heads of
 *      64, bf16: 512 KiB blocks; 256 blocks; the engine's 1024 pages per
 *      layer in vLLM's K-first layout, page ids random): scatter straight
 *      from G2 (kvc_pages_scatter reading host memory in place) vs
 *      kvc_memcpy_batch into a device staging buffer + scatter from there;
 *      and the store direction, gather straight into G2 slots vs gather
 *      into staging + kvc_memcpy_batch to G2. This decides which path the
 *      Python package takes by default: the program prints the winner of
 *      each direction.
 * `--sim`: the same program on the simulated device with host memory for
 * device memory, B up to 1 MiB: checks the program, its numbers mean
 * nothing. Exit 0, 1 on an error, 77 (with the reason) without a device. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "client/kvclient.h"
#include "cuda/dev.h"
#include "cuda/kernels.h"
#include "tests/lib/gpu.h"
#include "tests/lib/metrics.h"

/* Blocks per LOAD / submission: KV_BENCH_BLOCKS, default 64; more shows
 * how a request's fixed cost is amortised (block sizes are then limited to
 * those whose batch fits in 1 GiB). */
#define BATCH_MAX 1024
static int BATCH = 64;

static int runs = 15, sim;
static cudaStream_t st;
static uint8_t *ph, *dref, *dstage; /* pinned host, device, device staging */

#define CK(cond, ...)                                                   \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "gpu_bench_client: %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
      return 1;                                                         \
    }                                                                   \
  } while (0)

/* ---- "device" memory: CUDA's, or host memory with --sim ---------------------- */

static void *d_alloc(size_t n) {
  void *p = NULL;
  if (sim) return calloc(1, n);
  return cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
}
static void *h_pinned(size_t n) {
  void *p = NULL;
  if (sim) return calloc(1, n);
  return cudaMallocHost(&p, n) == cudaSuccess ? p : NULL;
}
static int d_sync(void) { return sim || cudaStreamSynchronize(st) == cudaSuccess ? 0 : -EIO; }
static int copy_async(void *dst, const void *src, size_t n) {
  if (sim) {
    memcpy(dst, src, n);
    return 0;
  }
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, st) == cudaSuccess ? 0 : -EIO;
}

/* The reference: nb cudaMemcpyAsync of blk bytes, pinned host -> device
 * (h2d) or back, on the stream; seconds to the end of the stream's work. */
static double ref_copy(int h2d, size_t blk, int nb) {
  double t0 = kv_now_s();
  for (int i = 0; i < nb; i++) {
    uint8_t *h = ph + (size_t)i * blk, *d = dref + (size_t)i * blk;
    if (copy_async(h2d ? d : h, h2d ? h : d, blk)) return -1;
  }
  return d_sync() ? -1 : kv_now_s() - t0;
}

/* ---- the table ------------------------------------------------------------------- */

static void header(void) {
  printf("%-4s %-48s %9s %10s %10s %7s  %s\n", "part", "path", "block", "path GB/s", "ref GB/s",
         "ratio", "target");
}

/* One row: medians of the path's and the reference's times for `bytes`. */
static void row(const char *part, const char *what, size_t blk, double bytes, double tp, double tr,
                const char *target) {
  char b[24];
  if (blk >= (1u << 20)) snprintf(b, sizeof b, "%zu MiB", blk >> 20);
  else snprintf(b, sizeof b, "%zu KiB", blk >> 10);
  printf("%-4s %-48s %9s %10.2f %10.2f %7.3f  %s\n", part, what, b, bytes / tp / 1e9,
         bytes / tr / 1e9, tr / tp, target);
  fflush(stdout);
}

/* ---- the daemon ------------------------------------------------------------------- */

static kvt_daemon kd;

static kvc *worker(uint32_t block_bytes) {
  kvc_opts o = {.socket_path = kd.sock,
                .tenant = "bench",
                .layout = {.block_bytes = block_bytes,
                           .tokens_per_block = 16,
                           .layers = 16,
                           .kv_heads = 8,
                           .head_dim = 64,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  if (rc) fprintf(stderr, "gpu_bench_client: kvc_open: %s\n", kvc_strerror(rc));
  return c;
}

static kvc_key key(uint64_t v) {
  kvc_key k = {.len = 8};
  for (int i = 0; i < 8; i++) k.b[i] = (uint8_t)(v >> (8 * i) ^ 0x3c);
  return k;
}

/* The daemon's kvcached_g1_copies_total{dir="load"}, from its stats
 * socket; -1 if it cannot be read. */
static long long g1_loads(void) {
  static char buf[1 << 20];
  const char *body;
  if (kvt_http(kd.stats, "GET", "/metrics", buf, sizeof buf, &body) != 200) return -1;
  return kvt_metric_value(body, "kvcached_g1_copies_total{dir=\"load\"}");
}

/* Stores keys first..first+n-1 (blk bytes each), committed. */
static int store(kvc *c, uint64_t first, int n, size_t blk, kvc_key *keys) {
  static kvc_block out[BATCH_MAX];
  for (int i = 0; i < n; i++) keys[i] = key(first + (uint64_t)i);
  CK(kvc_alloc(c, KVC_G2, 128, keys, NULL, (uint32_t)n, out) == n, "alloc of %d blocks", n);
  for (int i = 0; i < n; i++) memset(out[i].ptr, (int)(first + (uint64_t)i), blk);
  CK(kvc_commit(c, keys, (uint32_t)n, NULL) == n, "commit");
  return 0;
}

/* Parts a and c (kvc_memcpy_batch) for one block size. */
static int part_ac(size_t blk) {
  size_t page = blk > ((size_t)4 << 20) ? blk : (size_t)4 << 20;
  char g2[32], pg[48], g1[48], be[32];
  snprintf(g2, sizeof g2, "%zuK", (2 * BATCH * blk + 4 * page) >> 10);
  snprintf(pg, sizeof pg, "g2.page_size=%zuK", page >> 10);
  snprintf(g1, sizeof g1, "g1.capacity=%zuK", (BATCH * blk) >> 10);
  snprintf(be, sizeof be, "g1.backend=%s", sim ? "sim" : "cuda");
  /* One worker is the daemon's only client: it may hold all of G2. */
  const char *sets[] = {pg, "g1.enable=on", be, g1, "limits.session_share=100", NULL};
  CK(gpu_daemon_start(&kd, g2, sets) == 0, "kvcached (G2 %s, %s) did not start", g2, g1);
  kvc *c = worker((uint32_t)blk);
  CK(c, "worker");
  CK(kvc_g2_register_cuda(c) == 0, "kvc_g2_register_cuda: %s", kvc_cuda_error());
  kvc_g1 gi;
  CK(kvc_g1_info(c, &gi) == 0 && gi.available, "no G1 in the worker: %s", gi.reason);
  static kvc_key keys[2][BATCH_MAX];
  if (store(c, 0, BATCH, blk, keys[0]) || store(c, BATCH, BATCH, blk, keys[1])) return 1;
  long long before = g1_loads();
  double ta[64], tr[64], tc[64];
  static kvc_block out[BATCH_MAX];
  static kvc_copy v[BATCH_MAX];
  for (int r = 0; r < runs + 2; r++) { /* two untimed: each set in G1 once */
    const kvc_key *k = keys[r & 1];
    double t0 = kv_now_s();
    int n = kvc_load(c, KVC_G1, k, BATCH, out);
    double t1 = kv_now_s();
    CK(n == BATCH, "LOAD to G1: %d of %d usable", n, BATCH);
    for (int i = 0; i < BATCH; i++)
      CK(out[i].tier == KVC_G1, "block %d came back in tier %u, not G1", i, out[i].tier);
    CK(kvc_release(c, k, BATCH, NULL) == BATCH, "release");
    double t_ref = ref_copy(1, blk, BATCH);
    CK(t_ref > 0, "reference copy failed");
    /* c: G2 -> device staging, from this worker's registered mapping */
    CK(kvc_load(c, KVC_G2, k, BATCH, out) == BATCH, "LOAD to G2");
    for (int i = 0; i < BATCH; i++) v[i] = (kvc_copy){dstage + (size_t)i * blk, out[i].ptr, blk};
    double t2 = kv_now_s();
    int rc = kvc_memcpy_batch(c, v, BATCH, sim ? KVC_MEM_HOST : KVC_MEM_CUDA, st);
    CK(rc == 0 && d_sync() == 0, "kvc_memcpy_batch: %d %s", rc, kvc_cuda_error());
    double t3 = kv_now_s();
    CK(kvc_release(c, k, BATCH, NULL) == BATCH, "release");
    if (r >= 2) {
      ta[r - 2] = t1 - t0;
      tr[r - 2] = t_ref;
      tc[r - 2] = t3 - t2;
    }
  }
  long long after = g1_loads();
  CK(before >= 0 && after - before == (long long)BATCH * (runs + 2),
     "the daemon copied %lld blocks to G1 for %d LOADs of %d (every LOAD must copy all)",
     after - before, runs + 2, BATCH);
  double ref = median(tr, runs), bytes = (double)BATCH * (double)blk;
  row("a", "G2->G1: kvc_load(KVC_G1) through kvcached", blk, bytes, median(ta, runs), ref,
      ">= 0.85");
  row("c", "G2->dev: kvc_memcpy_batch(KVC_MEM_CUDA)", blk, bytes, median(tc, runs), ref, ">= 0.90");
  kvc_close(c);
  CK(gpu_daemon_stop(&kd) == 0, "kvcached did not stop cleanly");
  return 0;
}

/* Part b: the daemon's copy engine, D2H. */
static int part_b(const size_t *sizes, int nsizes) {
  char why[KV_DEV_REASON_MAX] = "";
  kv_dev *d = NULL;
  kv_dev_opts o = {
      .backend = sim ? KV_DEV_SIM : KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
  CK(kv_dev_open(&d, &o) == 0, "kv_dev_open: %s", why);
  size_t maxb = sizes[nsizes - 1] * BATCH;
  kv_dev_pool *p;
  uint8_t *h = NULL;
  CK(kv_dev_pool_create(d, maxb, &p) == 0, "pool: %s", kv_dev_reason(d));
  CK(posix_memalign((void **)&h, 4096, maxb) == 0, "host buffer");
  memset(h, 0x5a, maxb);
  CK(kv_dev_host_register(d, h, maxb) == 0, "register: %s", kv_dev_reason(d));
  uint8_t *dv = kv_dev_pool_base(p);
  for (int s = 0; s < nsizes; s++) {
    size_t blk = sizes[s];
    double tb[64], tr[64];
    static kv_dev_copy v[BATCH_MAX];
    for (int i = 0; i < BATCH; i++)
      v[i] = (kv_dev_copy){h + (size_t)i * blk, dv + (size_t)i * blk, blk};
    for (int r = 0; r < runs + 1; r++) {
      double t0 = kv_now_s();
      CK(kv_dev_submit(d, KV_DEV_D2H, v, BATCH, 1) == 0, "submit: %s", kv_dev_reason(d));
      kv_dev_done done;
      unsigned got = 0;
      while (got == 0) {
        CK(kv_dev_wait(d, 10000) == 0, "no completion within 10 s");
        got = kv_dev_reap(d, &done, 1);
      }
      CK(done.status == 0, "D2H submission: %d", done.status);
      double t1 = kv_now_s(), t_ref = ref_copy(0, blk, BATCH);
      CK(t_ref > 0, "reference copy failed");
      if (r >= 1) {
        tb[r - 1] = t1 - t0;
        tr[r - 1] = t_ref;
      }
    }
    row("b", "G1->G2: kv_dev_submit D2H (daemon's copy engine)", blk, (double)BATCH * (double)blk,
        median(tb, runs), median(tr, runs), "-");
  }
  kv_dev_close(d);
  free(h);
  return 0;
}

/* Part c, paged: the realistic geometry, zero-copy vs staged. */
enum { L = 16, T = 16, H = 8, D = 64, E = 2, PAGES = 1024, NB = 256 };
#define HALFB ((size_t)T * H * D * E)

static int part_c_pages(void) {
  const kvc_page_layout lo = {.layers = L,
                              .page_tokens = T,
                              .kv_heads = H,
                              .head_dim = D,
                              .elem_bytes = E,
                              .num_pages = PAGES,
                              .page_stride = HALFB,
                              .kv_stride = (uint64_t)PAGES * HALFB};
  const size_t bb = (size_t)kvc_page_block_bytes(&lo);
  const size_t lb = (size_t)kv_kern_layer_bytes((const kv_kern_layout *)&lo);
  const int mem = sim ? KVC_MEM_HOST : KVC_MEM_CUDA;
  const char *sets[] = {"g2.page_size=4M", "g1.enable=off", "limits.session_share=100", NULL};
  char g2[32];
  snprintf(g2, sizeof g2, "%zuM", (2 * NB * bb + (16u << 20)) >> 20);
  CK(gpu_daemon_start(&kd, g2, sets) == 0, "kvcached (G2 %s) did not start", g2);
  kvc *c = worker((uint32_t)bb);
  CK(c, "worker");
  CK(kvc_g2_register_cuda(c) == 0, "kvc_g2_register_cuda: %s", kvc_cuda_error());
  uint8_t *eng = d_alloc(L * lb);
  CK(eng, "engine buffer of %zu MiB", (L * lb) >> 20);
  void *layers[L];
  for (int l = 0; l < L; l++) layers[l] = eng + (size_t)l * lb;
  uint32_t pages[NB], perm[PAGES];
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (uint32_t p = 0; p < PAGES; p++) perm[p] = p;
  for (uint32_t p = PAGES; p > 1; p--) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    uint32_t j = (uint32_t)(s % p), t = perm[p - 1];
    perm[p - 1] = perm[j], perm[j] = t;
  }
  memcpy(pages, perm, sizeof pages);
  /* Committed blocks to scatter from (loaded: pinned), slots to gather into. */
  kvc_key keys[NB], slots[NB];
  if (store(c, 1000, NB, bb, keys)) return 1;
  kvc_block in[NB], out[NB];
  CK(kvc_load(c, KVC_G2, keys, NB, in) == NB, "LOAD to G2");
  for (int i = 0; i < NB; i++) slots[i] = key(5000 + (uint64_t)i);
  CK(kvc_alloc(c, KVC_G2, 128, slots, NULL, NB, out) == NB, "alloc of %d slots", NB);
  void *g2in[NB], *g2out[NB], *stg[NB];
  kvc_copy up[NB], down[NB];
  for (int i = 0; i < NB; i++) {
    g2in[i] = in[i].ptr;
    g2out[i] = out[i].ptr;
    stg[i] = dstage + (size_t)i * bb;
    up[i] = (kvc_copy){stg[i], g2in[i], bb};
    down[i] = (kvc_copy){g2out[i], stg[i], bb};
  }
  enum { SC_G2, SC_STAGED, GA_G2, GA_STAGED, REF_H2D, REF_D2H, NWAYS };
  double t[NWAYS][64];
  for (int r = 0; r < runs + 1; r++) {
    for (int w = 0; w < NWAYS; w++) {
      double t0 = kv_now_s();
      int rc = 0;
      switch (w) {
      case SC_G2: rc = kvc_pages_scatter(c, &lo, layers, pages, g2in, NB, mem, st); break;
      case SC_STAGED:
        rc = kvc_memcpy_batch(c, up, NB, mem, st);
        if (rc == 0) rc = kvc_pages_scatter(c, &lo, layers, pages, stg, NB, mem, st);
        break;
      case GA_G2: rc = kvc_pages_gather(c, &lo, layers, pages, g2out, NB, mem, st); break;
      case GA_STAGED:
        rc = kvc_pages_gather(c, &lo, layers, pages, stg, NB, mem, st);
        if (rc == 0) rc = kvc_memcpy_batch(c, down, NB, mem, st);
        break;
      case REF_H2D: t[w][r ? r - 1 : 0] = ref_copy(1, bb, NB); continue;
      case REF_D2H: t[w][r ? r - 1 : 0] = ref_copy(0, bb, NB); continue;
      }
      CK(rc == 0 && d_sync() == 0, "way %d: %d %s", w, rc, kvc_cuda_error());
      if (r) t[w][r - 1] = kv_now_s() - t0;
    }
    CK(t[REF_H2D][r ? r - 1 : 0] > 0 && t[REF_D2H][r ? r - 1 : 0] > 0, "reference copy failed");
  }
  /* The last round's blocks went out to the engine and came back. */
  for (int i = 0; i < NB; i++)
    CK(!memcmp(g2in[i], g2out[i], bb), "block %d gathered back is not the one scattered", i);
  double bytes = (double)NB * (double)bb, m[NWAYS];
  for (int w = 0; w < NWAYS; w++) m[w] = median(t[w], runs);
  row("c", "G2->engine: kvc_pages_scatter from G2 (zero-copy)", bb, bytes, m[SC_G2], m[REF_H2D],
      "-");
  row("c", "G2->engine: kvc_memcpy_batch + scatter (staged)", bb, bytes, m[SC_STAGED], m[REF_H2D],
      "-");
  row("c", "engine->G2: kvc_pages_gather into G2 (zero-copy)", bb, bytes, m[GA_G2], m[REF_D2H],
      "-");
  row("c", "engine->G2: gather + kvc_memcpy_batch (staged)", bb, bytes, m[GA_STAGED], m[REF_D2H],
      "-");
  printf("\nc (%d blocks of %zu KiB, %d layers, K-first engine of %d pages): default path\n", NB,
         bb >> 10, L, PAGES);
  printf("  load  (G2 -> engine): %s, %.2fx the other\n",
         m[SC_G2] <= m[SC_STAGED] ? "zero-copy scatter from G2" : "staged (batch + scatter)",
         m[SC_G2] <= m[SC_STAGED] ? m[SC_STAGED] / m[SC_G2] : m[SC_G2] / m[SC_STAGED]);
  printf("  store (engine -> G2): %s, %.2fx the other\n",
         m[GA_G2] <= m[GA_STAGED] ? "zero-copy gather into G2" : "staged (gather + batch)",
         m[GA_G2] <= m[GA_STAGED] ? m[GA_STAGED] / m[GA_G2] : m[GA_G2] / m[GA_STAGED]);
  CK(kvc_abort(c, slots, NB, NULL) == NB, "abort");
  CK(kvc_release(c, keys, NB, NULL) == NB, "release");
  kvc_close(c);
  if (sim) free(eng);
  else cudaFree(eng);
  CK(gpu_daemon_stop(&kd) == 0, "kvcached did not stop cleanly");
  return 0;
}

int main(int argc, char **argv) {
  sim = argc > 1 && !strcmp(argv[1], "--sim");
  const char *r = getenv("KV_BENCH_RUNS");
  if (r && atoi(r) > 0 && atoi(r) <= 64) runs = atoi(r);
  const char *nbk = getenv("KV_BENCH_BLOCKS");
  if (nbk && atoi(nbk) >= 1 && atoi(nbk) <= BATCH_MAX) BATCH = atoi(nbk);
  uint8_t u[16];
  if (!sim && kv_dev_current_uuid(u) != 0) {
    char why[KV_DEV_REASON_MAX] = "";
    kv_dev *d = NULL;
    kv_dev_opts o = {.backend = KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
    if (kv_dev_open(&d, &o) == 0) kv_dev_close(d);
    printf("gpu_bench_client: skipped: no CUDA device here (%s)\n", why);
    return 77;
  }
  if (sim) setenv("KV_DEV_BACKEND", "sim", 1);
  static const size_t sizes[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20};
  int nsizes = sim ? 3 : 5; /* the simulation: up to 1 MiB */
  while (nsizes > 1 && (size_t)BATCH * sizes[nsizes - 1] > ((size_t)1 << 30)) nsizes--;
  /* The largest batch: 64 blocks of the largest size, or part c's 256 of
   * 512 KiB. */
  size_t big = (size_t)BATCH * sizes[nsizes - 1];
  if (big < (size_t)NB * HALFB * 2 * L) big = (size_t)NB * HALFB * 2 * L;
  if (!sim && cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "gpu_bench_client: cudaStreamCreate failed\n");
    return 1;
  }
  ph = h_pinned(big);
  dref = d_alloc(big);
  dstage = d_alloc(big);
  if (!ph || !dref || !dstage) {
    fprintf(stderr, "gpu_bench_client: cannot allocate the reference buffers (3 x %zu MiB)\n",
            big >> 20);
    return 1;
  }
  memset(ph, 0xa5, big);
  printf("gpu_bench_client: kvcached's paths on the %s device vs cudaMemcpyAsync from/to "
         "cudaMallocHost, same bytes; median of %d runs; ratio = path / reference\n",
         sim ? "SIMULATED (numbers mean nothing)" : "CUDA", runs);
  printf("a, c: %d blocks per run; b: %d blocks per submission\n", BATCH, BATCH);
  header();
  int rc = 0;
  for (int s = 0; s < nsizes && !rc; s++) rc = part_ac(sizes[s]);
  if (!rc) rc = part_b(sizes, nsizes);
  if (!rc) rc = part_c_pages();
  if (rc) gpu_daemon_stop(&kd);
  printf("gpu_bench_client: %s\n", rc ? "FAILED" : "done");
  return rc;
}
