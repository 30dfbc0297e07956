/* test_stats_unit.c - the daemon's measuring pieces alone: histogram
 * buckets and quantiles, the ghost table, query parsing and hex keys. */
#include <criterion/criterion.h>
#include <errno.h>

#include "base/errors.h"
#include "daemon/ghost.h"
#include "daemon/http.h"
#include "daemon/stats.h"

Test(stats_unit, histogram_buckets_are_log2_microseconds) {
  kvd_hist h = {0};
  kvd_hist_add(&h, 0);                   /* <= 1 us */
  kvd_hist_add(&h, 1000);                /* 1 us */
  kvd_hist_add(&h, 1001);                /* 2 us bucket */
  kvd_hist_add(&h, 3000);                /* <= 4 us */
  kvd_hist_add(&h, 1000000);             /* 1 ms: <= 1024 us, bucket 10 */
  kvd_hist_add(&h, 100ull * 1000000000); /* 100 s: +Inf */
  cr_assert_eq(h.b[0], 2);
  cr_assert_eq(h.b[1], 1);
  cr_assert_eq(h.b[2], 1);
  cr_assert_eq(h.b[10], 1);
  cr_assert_eq(h.b[KVD_HIST_BUCKETS], 1);
  cr_assert_eq(h.count, 6);
  cr_assert_eq(kvd_hist_quantile_us(&h, 0.5), 2);
  cr_assert_eq(kvd_hist_quantile_us(&h, 0.8), 1024);
  cr_assert_eq(kvd_hist_quantile_us(&h, 1.0), 1ull << KVD_HIST_BUCKETS);
  kvd_hist e = {0};
  cr_assert_eq(kvd_hist_quantile_us(&e, 0.99), 0);
}

Test(stats_unit, ghost_remembers_forgets_and_stays_bounded) {
  kvd_ghost g;
  cr_assert_eq(kvd_ghost_init(&g, 1024), 0);
  uint8_t k[8] = {1, 2, 3};
  uint64_t a = kvd_ghost_fp(0, k, 8), b = kvd_ghost_fp(1, k, 8);
  cr_assert_neq(a, b, "the namespace is part of the fingerprint");
  kvd_ghost_add(&g, a);
  cr_assert(kvd_ghost_has(&g, a));
  cr_assert(!kvd_ghost_has(&g, b));
  kvd_ghost_forget(&g, a);
  cr_assert(!kvd_ghost_has(&g, a));
  /* 100x its size in keys: the table keeps about the last `slots`. */
  for (uint64_t v = 0; v < 102400; v++) kvd_ghost_add(&g, kvd_ghost_fp(0, (uint8_t *)&v, 8));
  uint32_t old = 0, recent = 0;
  for (uint64_t v = 0; v < 256; v++)
    old += (uint32_t)kvd_ghost_has(&g, kvd_ghost_fp(0, (uint8_t *)&v, 8));
  for (uint64_t v = 102400 - 256; v < 102400; v++)
    recent += (uint32_t)kvd_ghost_has(&g, kvd_ghost_fp(0, (uint8_t *)&v, 8));
  cr_assert_lt(old, 16, "old keys should be gone (%u of 256 left)", old);
  cr_assert_gt(recent, 200, "recent keys should be remembered (%u of 256)", recent);
  kvd_ghost_fini(&g);
}

Test(stats_unit, query_parameters_are_decoded_and_checked) {
  char v[16];
  cr_assert_eq(kvd_http_query("a=1&name=x%2Cy+z&b", "name", v, sizeof v), 1);
  cr_assert_str_eq(v, "x,y z");
  cr_assert_eq(kvd_http_query("a=1&b", "b", v, sizeof v), 1);
  cr_assert_str_eq(v, "");
  cr_assert_eq(kvd_http_query("a=1", "nam", v, sizeof v), 0);
  cr_assert_eq(kvd_http_query("", "a", v, sizeof v), 0);
  cr_assert_eq(kvd_http_query("a=%4", "a", v, sizeof v), -EINVAL);
  cr_assert_eq(kvd_http_query("a=%g0", "a", v, sizeof v), -EINVAL);
  cr_assert_eq(kvd_http_query("a=0123456789abcdefXYZ", "a", v, sizeof v), -E2BIG);
  kv_key k;
  cr_assert_eq(kvd_key_from_hex("0aFF", 4, &k), 0);
  cr_assert_eq(k.len, 2);
  cr_assert_eq(k.b[1], 0xff);
  cr_assert_eq(kvd_key_from_hex("0a0", 3, &k), -EINVAL);
  cr_assert_eq(kvd_key_from_hex("zz", 2, &k), -EINVAL);
  cr_assert_eq(kvd_key_from_hex("", 0, &k), -EINVAL);
}
