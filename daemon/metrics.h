/*
 * metrics.h - what the daemon measures about itself as it happens, where
 * the core's and G3's counters (read when asked: stats.h) lack it:
 *  - latency histograms (fixed log-scale buckets, a counter increment on
 *    the hot path, no allocation) for LOOKUP and LOAD handling - from the
 *    decoded request to its reply, deferred LOADs included - and for each
 *    copy direction between tiers (fed by the core's copy observer);
 *  - misses by reason: absent (never held), evicted (held before: the
 *    ghost table, ghost.h), corrupt and io_error (a G3 read that failed
 *    verification), timeout (a LOAD that waited for G2 room longer than
 *    daemon.load_timeout_ms), not_shareable (the key is held under another
 *    tenant's namespace);
 *  - the names of what is counted, as the metrics' labels say them.
 * The operations and the services below them feed it; stats.c reports it.
 * Everything runs on the loop's thread.
 */
#ifndef KV_DAEMON_METRICS_H
#define KV_DAEMON_METRICS_H

#include <stdint.h>

#include "daemon/ghost.h"
#include "daemon/http.h"
#include "tiers/block.h"

/* Bucket i counts durations <= 2^i microseconds (1 us .. about 8.4 s);
 * the last one, above that (+Inf). */
#define KVD_HIST_BUCKETS 24

typedef struct kvd_hist {
  uint64_t b[KVD_HIST_BUCKETS + 1];
  uint64_t count;
  uint64_t sum_ns;
} kvd_hist;

void kvd_hist_add(kvd_hist *h, uint64_t ns);
/* The q-quantile (0 < q <= 1), in microseconds, estimated as the upper
 * bound of the bucket that holds it; 0 for an empty histogram. */
uint64_t kvd_hist_quantile_us(const kvd_hist *h, double q);

typedef enum {
  KVD_MISS_ABSENT = 0,
  KVD_MISS_EVICTED,
  KVD_MISS_CORRUPT,
  KVD_MISS_IO_ERROR,
  KVD_MISS_TIMEOUT,
  KVD_MISS_NOT_SHAREABLE,
  KVD_MISS_COUNT
} kvd_miss;
extern const char *const kvd_miss_names[KVD_MISS_COUNT];

typedef enum { KVD_REQ_LOOKUP = 0, KVD_REQ_LOAD, KVD_REQ_COUNT } kvd_req_kind;

typedef enum {
  KVD_DIR_G1_TO_G2 = 0,
  KVD_DIR_G2_TO_G1,
  KVD_DIR_G2_TO_G3,
  KVD_DIR_G3_TO_G2,
  KVD_DIR_COUNT
} kvd_dir;
extern const char *const kvd_dir_names[KVD_DIR_COUNT];

/* The operator listeners, as the `socket` label names them. */
typedef enum { KVD_SOCK_STATS = 0, KVD_SOCK_STATS_TCP, KVD_SOCK_ADMIN, KVD_SOCK_COUNT } kvd_sock;
extern const char *const kvd_sock_names[KVD_SOCK_COUNT];

typedef struct kvd_metrics {
  uint64_t misses[KVD_MISS_COUNT];
  kvd_hist req[KVD_REQ_COUNT];
  kvd_hist copy[KVD_DIR_COUNT];
  kvd_hist loop; /* each turn of the event loop: its callbacks' time, not its waits */
  uint64_t copy_bytes[KVD_DIR_COUNT], copy_ops[KVD_DIR_COUNT];
  uint64_t admin_requests, stats_requests;
  kvd_ghost ghost;
  const kvd_http_lstats *http[KVD_SOCK_COUNT]; /* the operator listeners' counts, or NULL */
} kvd_metrics;

struct kvd;

/* Sets up the metrics of d (the ghost table, the core's copy observer) and
 * remembers the keys the core already holds. 0 or -ENOMEM. */
int kvd_metrics_init(struct kvd *d);
void kvd_metrics_fini(struct kvd *d);

/* Why key (of registry namespace reg_ns, core namespace core_ns) missed:
 * KVD_MISS_NOT_SHAREABLE, _EVICTED or _ABSENT. Counts it. */
kvd_miss kvd_miss_classify(struct kvd *d, int reg_ns, uint32_t core_ns, const kv_key *key);
/* Counts n misses of a reason known otherwise (corrupt, io_error, timeout). */
void kvd_miss_add(struct kvd *d, kvd_miss why, uint64_t n);
/* Records the duration of a LOOKUP or LOAD that started at t0 (kv_now_ns). */
void kvd_req_done(struct kvd *d, kvd_req_kind k, uint64_t t0);

/* A key was committed (remembered) or deleted (forgotten). */
void kvd_ghost_note(struct kvd *d, uint32_t core_ns, const kv_key *key, int held);

#endif
