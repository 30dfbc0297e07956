/*
 * clock.h - the one clock: CLOCK_MONOTONIC, in the unit the caller wants.
 *
 * Deadlines, durations and rate limits everywhere are taken from this
 * clock (never the wall clock, which jumps). Reading it is a vDSO call.
 */
#ifndef KV_BASE_CLOCK_H
#define KV_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kv_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Milliseconds: the unit of deadlines (ipc/sock.h takes -1 for "none"). */
static inline int64_t kv_now_ms(void) { return (int64_t)(kv_now_ns() / 1000000u); }

/* The bucket of a duration in the latency histograms (daemon/metrics.h,
 * G3's codec times): bucket i counts durations up to 2^i microseconds,
 * bucket `last` everything above 2^(last-1). */
static inline unsigned kv_us_bucket(uint64_t ns, unsigned last) {
  uint64_t us = (ns + 999) / 1000;
  unsigned i = us <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(us - 1); /* ceil(log2(us)) */
  return i < last ? i : last;
}

/* Seconds, for benchmarks' rates. */
static inline double kv_now_s(void) { return (double)kv_now_ns() * 1e-9; }

#endif
