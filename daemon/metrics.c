/* metrics.c - what the daemon measures about itself, as it happens (see
 * metrics.h); stats.c reports it. */
#include "daemon/metrics.h"

#include <string.h>

#include "base/clock.h"
#include "daemon/kvd.h"

#define GHOST_SLOTS (1u << 18) /* about 256 Ki keys remembered: 2 MiB */

const char *const kvd_miss_names[KVD_MISS_COUNT] = {"absent",   "evicted", "corrupt",
                                                    "io_error", "timeout", "not_shareable"};
const char *const kvd_dir_names[KVD_DIR_COUNT] = {"g1_to_g2", "g2_to_g1", "g2_to_g3", "g3_to_g2"};
const char *const kvd_sock_names[KVD_SOCK_COUNT] = {"stats", "stats_tcp", "admin"};
const char *const kvd_refused_names[KVD_REFUSED_COUNT] = {"fd_limit", "total", "per_uid",
                                                          "no_credentials"};

/* --- histograms --------------------------------------------------------------- */

void kvd_hist_add(kvd_hist *h, uint64_t ns) {
  h->b[kv_us_bucket(ns, KVD_HIST_BUCKETS)]++;
  h->count++;
  h->sum_ns += ns;
}

uint64_t kvd_hist_quantile_us(const kvd_hist *h, double q) {
  if (!h->count) return 0;
  uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999);
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (unsigned i = 0; i < KVD_HIST_BUCKETS; i++) {
    seen += h->b[i];
    if (seen >= rank) return 1ull << i;
  }
  return 1ull << KVD_HIST_BUCKETS; /* beyond the last bound: report the bound */
}

/* --- feeding ------------------------------------------------------------------ */

static void on_copy(void *arg, kv_tier from, kv_tier to, uint32_t bytes, uint64_t ns, int status) {
  kvd *d = arg;
  int dir = from == KV_G2 && to == KV_G3   ? KVD_DIR_G2_TO_G3
            : from == KV_G3 && to == KV_G2 ? KVD_DIR_G3_TO_G2
            : from == KV_G1 && to == KV_G2 ? KVD_DIR_G1_TO_G2
            : from == KV_G2 && to == KV_G1 ? KVD_DIR_G2_TO_G1
                                           : -1;
  if (dir < 0) return;
  kvd_hist_add(&d->m.copy[dir], ns);
  if (status == 0) {
    d->m.copy_ops[dir]++;
    d->m.copy_bytes[dir] += bytes;
  }
}

static int remember(const kv_block *b, void *arg) {
  kvd *d = arg;
  kvd_ghost_add(&d->m.ghost, kvd_ghost_fp(b->ns, b->key, kv_block_keylen(b)));
  return 0;
}

int kvd_metrics_init(kvd *d) {
  memset(&d->m, 0, sizeof d->m);
  int rc = kvd_ghost_init(&d->m.ghost, GHOST_SLOTS);
  if (rc) return rc;
  kv_core_on_copy(d->core, on_copy, d);
  kv_core_sample(d->core, KV_TIER_NONE, KV_NS_ANY, remember, d); /* warm blocks from G3 */
  return 0;
}

void kvd_metrics_fini(kvd *d) {
  kv_core_on_copy(d->core, NULL, NULL);
  kvd_ghost_fini(&d->m.ghost);
}

void kvd_ghost_note(kvd *d, uint32_t core_ns, const kv_key *key, int held) {
  uint64_t fp = kvd_ghost_fp(core_ns, key->b, key->len);
  if (held) kvd_ghost_add(&d->m.ghost, fp);
  else kvd_ghost_forget(&d->m.ghost, fp);
}

void kvd_miss_add(kvd *d, kvd_miss why, uint64_t n) { d->m.misses[why] += n; }

void kvd_req_done(kvd *d, kvd_req_kind k, uint64_t t0) {
  kvd_hist_add(&d->m.req[k], kv_now_ns() - t0);
}

/* Held under a namespace of another tenant? Namespaces are few (tenants x
 * layouts); past 64 the check is skipped to keep a miss cheap. */
static int held_elsewhere(kvd *d, int reg_ns, const kv_key *key) {
  const kvd_ns *me = kvd_registry_ns(&d->reg, reg_ns);
  uint32_t n = d->reg.nns < 64 ? d->reg.nns : 64;
  for (uint32_t i = 0; i < n; i++) {
    const kvd_ns *o = &d->reg.ns[i];
    if (o->core_ns < 0 || o->tenant == me->tenant) continue; /* free, or the same tenant */
    if (kv_core_find(d->core, (uint32_t)o->core_ns, key)) return 1;
  }
  return 0;
}

kvd_miss kvd_miss_classify(kvd *d, int reg_ns, uint32_t core_ns, const kv_key *key) {
  kvd_miss why = KVD_MISS_ABSENT;
  if (d->reg.ntenants > 1 && held_elsewhere(d, reg_ns, key)) why = KVD_MISS_NOT_SHAREABLE;
  else if (kvd_ghost_has(&d->m.ghost, kvd_ghost_fp(core_ns, key->b, key->len)))
    why = KVD_MISS_EVICTED;
  d->m.misses[why]++;
  return why;
}
