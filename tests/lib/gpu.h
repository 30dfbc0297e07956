/*
 * gpu.h - what the GPU programs (tests/gpu/gpu_*.c) share: REQ, a check
 * that prints where it failed and returns 1 from the calling function; a
 * kvcached of their own (the launcher of daemon.h, with the options they
 * all use); the benchmarks' median (their clock: kv_now_s of base/clock.h).
 * No criterion, no CUDA.
 */
#ifndef KV_TESTS_LIB_GPU_H
#define KV_TESTS_LIB_GPU_H

#include <stdio.h>

#include "base/clock.h"
#include "tests/lib/daemon.h"

#define REQ(cond, ...)                                    \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "    %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fputc('\n', stderr);                                \
      return 1;                                           \
    }                                                     \
  } while (0)

/* Starts kvcached on a fresh directory: --g2-capacity g2, G2 unlocked, G3
 * off, warnings only, `--set s` for each of sets (NULL-terminated), up to
 * 30 s to serve (pinning a large G2 takes a while). 0 once it serves. */
int gpu_daemon_start(kvt_daemon *d, const char *g2, const char *const *sets);

/* Stops it (SIGTERM) and removes its directory. 0 when it stopped
 * cleanly (or was not running). */
int gpu_daemon_stop(kvt_daemon *d);

/* The median of v[0..n) (sorts v). */
double median(double *v, int n);

#endif
