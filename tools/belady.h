/*
 * belady.h - Belady's offline MIN over a request trace, the ceiling a
 * policy's hit rate is reported against (EVICTION.md).
 *
 * The replay is kvbench core-replay's (tools/bench_core.c): per
 * request, its blocks are looked up in order (a prefix hit while every
 * earlier block of the request hit), then each is inserted or touched.
 * A cache of `cap` blocks; every block of a request is stored, as the
 * policies' replay stores it, and when the cache is full the held block
 * whose next reference is farthest goes (MIN without bypass). "Next" is
 * counted in references, so of a future request's blocks the last goes
 * first, as its prefix is what can hit: the traces' publishers' figures
 * (bench/traces/README.md) counted in requests (ties in any order) and are
 * up to 0.9 points lower (Mooncake 1%: 17.66 there, 18.52 here). Any
 * trace, any capacity: O(refs log cap) time, 12 bytes per reference and 16
 * per distinct block.
 */
#ifndef KV_TOOLS_BELADY_H
#define KV_TOOLS_BELADY_H

#include <stdint.h>

#include "tools/trace.h"

typedef struct kv_belady {
  uint32_t *dense; /* per reference: its block as 0..nunique-1 */
  uint64_t *next;  /* per reference: the position of the block's next reference, or UINT64_MAX */
  uint32_t nunique;
} kv_belady;

/* Indexes t's references (once per trace). 0 or -ENOMEM. */
int kv_belady_prepare(kv_belady *b, const kv_trace *t);
/* The replay with a cache of cap blocks. 0 or -ENOMEM. */
int kv_belady_run(const kv_belady *b, const kv_trace *t, uint32_t cap, kv_trace_hits *r);
void kv_belady_free(kv_belady *b);

#endif
