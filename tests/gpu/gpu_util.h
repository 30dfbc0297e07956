/* gpu_util.h - what the GPU programs (tests/gpu/gpu_*.c) share beyond the
 * daemon (gpu_daemon.h): REQ, a check that prints where it failed and
 * returns 1 from the calling function, and the benchmarks' monotonic clock
 * and median. Header-only. */
#ifndef KV_TESTS_GPU_UTIL_H
#define KV_TESTS_GPU_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REQ(cond, ...)                                                          \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "    %s:%d: ", __FILE__, __LINE__);                       \
      fprintf(stderr, __VA_ARGS__);                                             \
      fputc('\n', stderr);                                                      \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline int gu_cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, gu_cmpd);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
