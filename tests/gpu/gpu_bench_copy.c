/* gpu_bench_copy.c - the G1 copy engine against plain CUDA, same run, same
 * bytes:
 *   G2->G1 and G1->G2 through kv_dev_submit (one submission of BATCH blocks,
 *   reaped from the completion fd) vs a loop of cudaMemcpyAsync of the same
 *   blocks from the same cudaHostRegister'ed memory on a stream of its own,
 *   for blocks of 64 KiB .. 16 MiB; median of RUNS batches each, and the
 *   ratio;
 *   a worker's D2D copy inside the pool it imported (VMM or legacy IPC) vs
 *   cudaMemcpy D2D within one allocation of its own.
 * Exit 77 with the reason when no CUDA device answers. Environment:
 * KV_BENCH_RUNS (default 15). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "tests/lib/dev_checks.h"
#include "tests/lib/gpu.h"

#define BATCH  64
#define MAXBLK ((size_t)16 << 20)
#define POOL   ((size_t)BATCH * MAXBLK)

static int runs = 15;

/* Seconds for one batch through the copy engine (submit to reap). */
static double run_dev(kv_dev *d, kv_dev_dir dir, uint8_t *dv, uint8_t *h, size_t blk) {
  kv_dev_copy v[BATCH];
  for (int i = 0; i < BATCH; i++) {
    uint8_t *dp = dv + (size_t)i * blk, *hp = h + (size_t)i * blk;
    v[i] = dir == KV_DEV_H2D   ? (kv_dev_copy){dp, hp, blk}
           : dir == KV_DEV_D2H ? (kv_dev_copy){hp, dp, blk}
                               : (kv_dev_copy){dp, dp + POOL / 2, blk};
  }
  double t0 = kv_now_s();
  if (kv_dev_submit(d, dir, v, BATCH, 1)) return -1;
  kv_dev_done done;
  if (dc_reap_n(d, &done, 1) || done.status) return -1;
  return kv_now_s() - t0;
}

/* The same bytes with cudaMemcpyAsync on a stream of its own. */
static double run_plain(cudaStream_t st, kv_dev_dir dir, uint8_t *dv, uint8_t *h, size_t blk) {
  double t0 = kv_now_s();
  for (int i = 0; i < BATCH; i++) {
    uint8_t *dp = dv + (size_t)i * blk, *hp = h + (size_t)i * blk;
    cudaError_t e = dir == KV_DEV_H2D ? cudaMemcpyAsync(dp, hp, blk, cudaMemcpyHostToDevice, st)
                    : dir == KV_DEV_D2H
                        ? cudaMemcpyAsync(hp, dp, blk, cudaMemcpyDeviceToHost, st)
                        : cudaMemcpyAsync(dp, dp + POOL / 2, blk, cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess) return -1;
  }
  if (cudaStreamSynchronize(st) != cudaSuccess) return -1;
  return kv_now_s() - t0;
}

static void row(const char *what, size_t blk, double a, double b, const char *an, const char *bn) {
  double bytes = (double)blk * BATCH;
  printf("%-14s %8zu KiB  %-8s %7.2f GB/s   %-12s %7.2f GB/s   ratio %.3f\n", what, blk >> 10, an,
         bytes / a / 1e9, bn, bytes / b / 1e9, b / a);
}

/* The worker: imports the pool, D2D within it through kv_dev_submit, vs
 * cudaMemcpy D2D within one allocation of its own. */
static int worker(int sock) {
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  int fd = -1;
  ssize_t n = dc_recv_fd(sock, enc, sizeof enc, &fd);
  kv_dev_export x;
  if (n <= 0 || kv_dev_export_decode(enc, (size_t)n, &x)) return 1;
  x.fd = fd;
  kv_dev *d = NULL;
  kv_dev_map *m = NULL;
  if (dc_open(&d, KV_DEV_CUDA, x.uuid) || kv_dev_pool_import(d, &x, &m)) {
    fprintf(stderr, "worker: import: %s\n", d ? kv_dev_reason(d) : "no device");
    return 1;
  }
  if (fd >= 0) close(fd);
  uint8_t *own = NULL;
  cudaStream_t st;
  if (cudaMalloc((void **)&own, POOL) != cudaSuccess ||
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
    return 1;
  /* Two rows per size: the copy engine's machinery (kv_dev_submit, its
   * completion through the eventfd) within the imported pool, and the plain
   * cudaMemcpyAsync loop within the imported pool - the memory itself, what
   * an engine's own copies from its G1 blocks meet - each against the same
   * loop within an allocation of the worker's own. */
  const char *kind = x.kind == KV_DEVX_VMM_FD ? "VMM" : "IPC";
  for (size_t blk = 64 << 10; blk <= MAXBLK / 2; blk <<= 1) {
    double a[64], b[64], p[64];
    for (int r = 0; r < runs; r++) {
      a[r] = run_dev(d, KV_DEV_D2D, kv_dev_map_base(m), NULL, blk);
      p[r] = run_plain(st, KV_DEV_D2D, kv_dev_map_base(m), NULL, blk);
      b[r] = run_plain(st, KV_DEV_D2D, own, NULL, blk);
      if (a[r] < 0 || b[r] < 0 || p[r] < 0) return 1;
    }
    char what[32];
    snprintf(what, sizeof what, "D2D imp/%s", kind);
    row(what, blk, median(a, runs), median(b, runs), "kv_dev", "own cudaMemcpy");
    row(what, blk, median(p, runs), median(b, runs), "memcpy", "own cudaMemcpy");
  }
  cudaFree(own);
  kv_dev_unmap(d, m);
  kv_dev_close(d);
  return 0;
}

int main(void) {
  const char *r = getenv("KV_BENCH_RUNS");
  if (r && atoi(r) > 0 && atoi(r) <= 64) runs = atoi(r);
  int sv[2];
  if (kv_sock_pair(sv)) return 1;
  pid_t pid = fork(); /* before any CUDA call: the worker needs its own */
  if (pid == 0) {
    close(sv[0]);
    int rc = worker(sv[1]);
    fflush(stdout); /* _exit does not flush: a pipe would lose the rows */
    _exit(rc);
  }
  close(sv[1]);
  char why[KV_DEV_REASON_MAX];
  kv_dev *d = NULL;
  kv_dev_opts o = {.backend = KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
  if (kv_dev_open(&d, &o)) {
    printf("no CUDA device: %s\n", why);
    close(sv[0]);
    waitpid(pid, NULL, 0);
    return 77;
  }
  kv_dev_pool *p;
  uint8_t *h = NULL;
  if (kv_dev_pool_create(d, POOL, &p) || posix_memalign((void **)&h, 4096, POOL) ||
      kv_dev_host_register(d, h, POOL)) {
    fprintf(stderr, "setup: %s\n", kv_dev_reason(d));
    return 1;
  }
  memset(h, 0x5a, POOL);
  uint8_t *dv = kv_dev_pool_base(p);
  cudaStream_t st;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 1;
  printf("G1 copy engine vs cudaMemcpyAsync: batches of %d blocks, median of %d runs\n", BATCH,
         runs);
  for (int dir = KV_DEV_H2D; dir <= KV_DEV_D2H; dir++) {
    for (size_t blk = 64 << 10; blk <= MAXBLK; blk <<= 2) {
      double a[64], b[64];
      run_dev(d, (kv_dev_dir)dir, dv, h, blk); /* warm */
      run_plain(st, (kv_dev_dir)dir, dv, h, blk);
      for (int i = 0; i < runs; i++) {
        a[i] = run_dev(d, (kv_dev_dir)dir, dv, h, blk);
        b[i] = run_plain(st, (kv_dev_dir)dir, dv, h, blk);
        if (a[i] < 0 || b[i] < 0) {
          fprintf(stderr, "copy failed: %s\n", kv_dev_reason(d));
          return 1;
        }
      }
      row(dir == KV_DEV_H2D ? "G2->G1 (H2D)" : "G1->G2 (D2H)", blk, median(a, runs),
          median(b, runs), "kv_dev", "cudaMemcpy");
    }
  }
  fflush(stdout); /* the worker's rows come after these */
  kv_dev_export x;
  kv_dev_pool_export(p, &x);
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  int n = kv_dev_export_encode(&x, enc, sizeof enc);
  struct iovec iov = {enc, n > 0 ? (size_t)n : 0};
  if (n <= 0 || kv_sock_sendmsg(sv[0], &iov, 1, x.fd, 0) != n) return 1;
  int ws = 0;
  waitpid(pid, &ws, 0);
  kv_dev_close(d);
  free(h);
  return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : 1;
}
