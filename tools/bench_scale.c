/*
 * bench_scale.c - `kvbench scale`: how the block index and the default
 * eviction policy cost as they grow, at 10^4, 10^5, ... indexed blocks (up
 * to --max, 10^7 by default).
 *
 * At each size: N blocks are inserted into an empty index (timed: inserts/s)
 * and handed, committed and evictable, to the policy, as the core does for
 * blocks resident in G2. Metadata per block is what the index and the
 * policy really hold from the allocator for them (kv_meta_bytes(), which
 * counts malloc_usable_size of every allocation they make), divided by N.
 * Lookup latency is sampled over random keys that are present (hits) and
 * absent (misses); lookups are timed in batches of BATCH so the clock
 * (CLOCK_MONOTONIC, vDSO) stays small beside them, and p50/p99 are those of
 * the per-lookup mean of each batch.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/errors.h"
#include "tiers/evict.h"
#include "tiers/index.h"
#include "tools/kvbench.h"

#define TARGET_BYTES 128.0 /* metadata per block, tiers/INDEX.md */
#define BATCH        32
#define SAMPLE       (1u << 19) /* lookups of each kind per size */
#define MISS_BASE    (1ull << 40)

typedef struct scale_row {
  uint64_t blocks;
  double index_bytes, policy_bytes; /* per block */
  double inserts_per_s;
  double hit_p50, hit_p99, miss_p50, miss_p99; /* ns per lookup */
} scale_row;

/* splitmix64: 32 distinct key bytes for each i. */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
static void key_of(uint64_t i, uint8_t k[KV_KEY_MAX]) {
  for (int w = 0; w < 4; w++) {
    uint64_t v = mix(i * 4 + (uint64_t)w);
    memcpy(k + 8 * w, &v, 8);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Times SAMPLE lookups of the keys in ks (BATCH per clock reading); puts
 * the p50 and p99 of the per-lookup batch means in ns. Returns how many
 * were found. */
static uint64_t time_lookups(const kv_index *ix, const uint8_t (*ks)[KV_KEY_MAX], double *ns,
                             double *p50, double *p99) {
  uint64_t found = 0;
  uint32_t nb = SAMPLE / BATCH;
  for (uint32_t b = 0; b < nb; b++) {
    uint64_t t0 = kv_now_ns();
    for (uint32_t j = 0; j < BATCH; j++)
      found += kv_index_find(ix, 0, ks[b * BATCH + j], KV_KEY_MAX) != NULL;
    ns[b] = (double)(kv_now_ns() - t0) / BATCH;
  }
  qsort(ns, nb, sizeof *ns, cmp_double);
  *p50 = ns[nb / 2];
  *p99 = ns[(size_t)(nb * 0.99)];
  return found;
}

static int measure(uint64_t n, const kv_evict_ops *pol, uint8_t (*ks)[KV_KEY_MAX], double *ns,
                   scale_row *r) {
  int rc;
  size_t base = kv_meta_bytes();
  kv_index ix;
  kv_evict e = {0};
  if ((rc = kv_index_init(&ix, 1024))) return rc; /* the core's default hint */
  size_t index_init = kv_meta_bytes();
  e.capacity = (uint32_t)n;
  if ((rc = kv_evict_init(&e, pol, &ix, KV_G2))) goto out_ix;
  size_t policy_init = kv_meta_bytes() - index_init;

  uint8_t k[KV_KEY_MAX];
  double t0 = kv_now_s();
  for (uint64_t i = 0; i < n; i++) {
    kv_block *b;
    key_of(i, k);
    if ((rc = kv_index_insert(&ix, 0, k, KV_KEY_MAX, &b))) {
      fprintf(stderr, "kvbench scale: insert %llu of %llu: %s\n", (unsigned long long)i,
              (unsigned long long)n, kv_strerror(rc));
      goto out;
    }
  }
  double t1 = kv_now_s();
  size_t index_all = kv_meta_bytes() - base - policy_init;
  /* Committed, resident in G2, evictable: held by the policy. */
  for (uint64_t i = 0; i < n; i++) {
    kv_block *b = kv_index_at(&ix, (kv_bid)i);
    b->state = KV_BS_READY;
    b->tiers = (uint8_t)KV_TIER_BIT(KV_G2);
    b->slot[KV_G2] = (uint32_t)i;
    b->atime = i + 1;
    b->hits = 1;
    if ((rc = e.ops->add(&e, b))) goto out;
    b->inpol = (uint8_t)KV_TIER_BIT(KV_G2);
  }
  r->blocks = n;
  r->index_bytes = (double)index_all / (double)n;
  r->policy_bytes = (double)(kv_meta_bytes() - base - index_all) / (double)n;
  r->inserts_per_s = (double)n / (t1 - t0);

  /* Hits: random present keys; misses: keys never inserted. */
  for (uint32_t s = 0; s < SAMPLE; s++) key_of(mix(s ^ n) % n, ks[s]);
  uint64_t hits = time_lookups(&ix, (const uint8_t(*)[KV_KEY_MAX])ks, ns, &r->hit_p50, &r->hit_p99);
  for (uint32_t s = 0; s < SAMPLE; s++) key_of(MISS_BASE + mix(s ^ n) % (MISS_BASE / 4), ks[s]);
  uint64_t false_hits =
      time_lookups(&ix, (const uint8_t(*)[KV_KEY_MAX])ks, ns, &r->miss_p50, &r->miss_p99);
  if (hits != SAMPLE || false_hits != 0) {
    fprintf(stderr,
            "kvbench scale: at %llu blocks, %llu of %u present keys found, %llu absent "
            "keys found\n",
            (unsigned long long)n, (unsigned long long)hits, SAMPLE,
            (unsigned long long)false_hits);
    rc = -EIO;
  }
out:
  kv_evict_fini(&e);
out_ix:
  kv_index_fini(&ix);
  if (rc == 0 && kv_meta_bytes() != base) {
    fprintf(stderr, "kvbench scale: %zd metadata bytes still allocated after freeing\n",
            (ssize_t)(kv_meta_bytes() - base));
    rc = -EIO;
  }
  return rc;
}

static void usage(FILE *f) {
  fprintf(f, "usage: kvbench scale [--max N] [--policy NAME] [--json]\n"
             "  index lookup latency, metadata bytes per block and inserts/s at\n"
             "  10^4, 10^5, ... blocks up to N (default 10^7); policy: the default\n");
}

int kvbench_scale(int argc, char **argv) {
  static const struct option opts[] = {{"max", required_argument, 0, 'm'},
                                       {"policy", required_argument, 0, 'p'},
                                       {"json", no_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  uint64_t max = 10000000;
  const char *pname = kv_evict_default;
  int json = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    char *end;
    switch (c) {
    case 'm':
      errno = 0;
      max = strtoull(optarg, &end, 10);
      if (errno || *end || max == 0 || max >= KV_BID_NONE) {
        fprintf(stderr, "kvbench scale: --max wants a block count, 1..%u\n", KV_BID_NONE - 1);
        return 2;
      }
      break;
    case 'p': pname = optarg; break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }
  const kv_evict_ops *pol = kv_evict_lookup(pname);
  if (!pol) {
    fprintf(stderr, "kvbench scale: no policy '%s'\n", pname);
    return 2;
  }

  scale_row rows[12];
  int nrows = 0, rc = 0;
  uint8_t(*ks)[KV_KEY_MAX] = malloc((size_t)SAMPLE * KV_KEY_MAX);
  double *ns = malloc((SAMPLE / BATCH) * sizeof *ns);
  if (!ks || !ns) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint64_t n = 10000; nrows < 12; n *= 10) {
    uint64_t at = n < max ? n : max;
    if ((rc = measure(at, pol, ks, ns, &rows[nrows]))) goto out;
    nrows++;
    if (at == max) break;
  }

  FILE *t = json ? stderr : stdout;
  fprintf(t, "kvbench scale: policy %s, %zu-byte records, target %.0f B/block\n", pol->name,
          sizeof(kv_block), TARGET_BYTES);
  fprintf(t, "%10s %8s %8s %8s %9s %9s %9s %9s %12s\n", "blocks", "B/block", "index", "policy",
          "hit p50", "hit p99", "miss p50", "miss p99", "inserts/s");
  int meets = 1;
  for (int i = 0; i < nrows; i++) {
    scale_row *r = &rows[i];
    double total = r->index_bytes + r->policy_bytes;
    meets &= total <= TARGET_BYTES;
    fprintf(t, "%10llu %8.1f %8.1f %8.1f %7.0fns %7.0fns %7.0fns %7.0fns %12.0f\n",
            (unsigned long long)r->blocks, total, r->index_bytes, r->policy_bytes, r->hit_p50,
            r->hit_p99, r->miss_p50, r->miss_p99, r->inserts_per_s);
  }
  if (json) {
    printf("{\"policy\":\"%s\",\"record_bytes\":%zu,\"target_bytes_per_block\":%.0f,"
           "\"meets_target\":%s,\"batch\":%d,\"sample\":%u,\"sizes\":[",
           pol->name, sizeof(kv_block), TARGET_BYTES, meets ? "true" : "false", BATCH, SAMPLE);
    for (int i = 0; i < nrows; i++) {
      scale_row *r = &rows[i];
      printf("%s{\"blocks\":%llu,\"bytes_per_block\":%.3f,\"index_bytes_per_block\":%.3f,"
             "\"policy_bytes_per_block\":%.3f,\"inserts_per_s\":%.0f,\"hit_ns_p50\":%.1f,"
             "\"hit_ns_p99\":%.1f,\"miss_ns_p50\":%.1f,\"miss_ns_p99\":%.1f}",
             i ? "," : "", (unsigned long long)r->blocks, r->index_bytes + r->policy_bytes,
             r->index_bytes, r->policy_bytes, r->inserts_per_s, r->hit_p50, r->hit_p99, r->miss_p50,
             r->miss_p99);
    }
    printf("]}\n");
  }
out:
  free(ks);
  free(ns);
  if (rc) {
    fprintf(stderr, "kvbench scale: %s\n", kv_strerror(rc));
    return 1;
  }
  return 0;
}
