/* test_dev.c - the G1 device (cuda/dev.h) on the host simulation: backend
 * choice and its reasons, pools shared with a forked worker over SCM_RIGHTS,
 * the export codec, the copy engine (batches, FIFO, directions at once,
 * refusals, injected failures, close with copies in flight, a random run
 * against a memcpy model). The checks live in tests/lib/dev_checks.c, shared with
 * tests/gpu/gpu_test_dev.c, which runs them on a CUDA device. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/dev_checks.h"

#define CHECK(expr)                            \
  do {                                         \
    const char *m_ = (expr);                   \
    cr_assert(m_ == NULL, "%s", m_ ? m_ : ""); \
  } while (0)

static void no_env(void) { unsetenv("KV_DEV_BACKEND"); }

Test(dev, auto_falls_back_to_sim_with_a_reason, .init = no_env) {
  char why[KV_DEV_REASON_MAX] = "x";
  kv_dev *d = NULL;
  kv_dev_opts o = {.backend = KV_DEV_AUTO, .reason = why, .reason_len = sizeof why};
  cr_assert_eq(kv_dev_open(&d, &o), 0);
  /* This suite runs where no CUDA device answers (CI). */
  cr_assert_eq(kv_dev_backend_of(d), KV_DEV_SIM, "a CUDA device answered: %s", why);
  cr_assert(why[0], "AUTO fell back without a reason");
  cr_assert_str_eq(kv_dev_reason(d), why);
  cr_assert(strstr(why, "CUDA"), "the reason does not name CUDA: %s", why);
  kv_dev_close(d);
}

Test(dev, cuda_forced_is_enodev_with_a_reason, .init = no_env) {
  char why[KV_DEV_REASON_MAX] = "";
  kv_dev *d = (kv_dev *)1;
  kv_dev_opts o = {.backend = KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
  cr_assert_eq(kv_dev_open(&d, &o), -ENODEV);
  cr_assert_null(d);
  cr_assert(strstr(why, "CUDA"), "reason: %s", why);
}

Test(dev, env_overrides_auto_only) {
  kv_dev *d = NULL;
  setenv("KV_DEV_BACKEND", "cuda", 1);
  cr_assert_eq(kv_dev_open(&d, NULL), -ENODEV, "KV_DEV_BACKEND=cuda ignored");
  kv_dev_opts o = {.backend = KV_DEV_SIM};
  cr_assert_eq(kv_dev_open(&d, &o), 0, "an explicit backend must win over the env");
  kv_dev_close(d);
  setenv("KV_DEV_BACKEND", "sim", 1);
  cr_assert_eq(kv_dev_open(&d, NULL), 0);
  cr_assert_eq(kv_dev_backend_of(d), KV_DEV_SIM);
  cr_assert_str_empty(kv_dev_reason(d), "SIM asked for is no fallback");
  kv_dev_close(d);
  char why[KV_DEV_REASON_MAX];
  o = (kv_dev_opts){.reason = why, .reason_len = sizeof why};
  setenv("KV_DEV_BACKEND", "tpu", 1);
  cr_assert_eq(kv_dev_open(&d, &o), -EINVAL);
  cr_assert(strstr(why, "KV_DEV_BACKEND"), "reason: %s", why);
}

Test(dev, sim_uuid_is_stable_and_opens_by_uuid) {
  kv_dev *a, *b, *c;
  kv_dev_opts o = {.backend = KV_DEV_SIM, .ordinal = 3};
  cr_assert_eq(kv_dev_open(&a, &o), 0);
  o.ordinal = 4;
  cr_assert_eq(kv_dev_open(&b, &o), 0);
  uint8_t ua[16], ub[16], uc[16];
  kv_dev_uuid(a, ua);
  kv_dev_uuid(b, ub);
  cr_assert(memcmp(ua, ub, 16), "two simulated devices share a uuid");
  o = (kv_dev_opts){.backend = KV_DEV_SIM, .uuid = ua};
  cr_assert_eq(kv_dev_open(&c, &o), 0);
  kv_dev_uuid(c, uc);
  cr_assert_eq(kv_dev_ordinal(c), 3);
  cr_assert_eq(memcmp(ua, uc, 16), 0);
  kv_dev_close(c);
  ua[0] ^= 1;
  cr_assert_eq(kv_dev_open(&c, &o), -ENODEV);
  o = (kv_dev_opts){.backend = KV_DEV_SIM, .ordinal = KV_DEV_SIM_NDEV};
  cr_assert_eq(kv_dev_open(&c, &o), -ENODEV);
  o.ordinal = -1;
  cr_assert_eq(kv_dev_open(&c, &o), -EINVAL);
  kv_dev_close(a);
  kv_dev_close(b);
}

Test(dev, pool_is_rounded_and_exports_a_sim_fd) {
  kv_dev *d;
  kv_dev_opts o = {.backend = KV_DEV_SIM};
  cr_assert_eq(kv_dev_open(&d, &o), 0);
  kv_dev_pool *p;
  cr_assert_eq(kv_dev_pool_create(d, 0, &p), -EINVAL);
  cr_assert_eq(kv_dev_pool_create(d, 5000, &p), 0);
  cr_assert_geq(kv_dev_pool_bytes(p), 5000);
  cr_assert_eq(kv_dev_pool_bytes(p) % (2u << 20), 0);
  kv_dev_export x;
  cr_assert_eq(kv_dev_pool_export(p, &x), 0);
  cr_assert_eq(x.kind, KV_DEVX_SIM_FD);
  cr_assert_geq(x.fd, 0);
  cr_assert_eq(x.bytes, kv_dev_pool_bytes(p));
  uint8_t u[16];
  kv_dev_uuid(d, u);
  cr_assert_eq(memcmp(u, x.uuid, 16), 0);
  /* An in-process import sees the same bytes. */
  kv_dev_map *m;
  cr_assert_eq(kv_dev_pool_import(d, &x, &m), 0);
  memset(kv_dev_pool_base(p), 0x42, 64);
  cr_assert_eq(((uint8_t *)kv_dev_map_base(m))[63], 0x42);
  /* An fd smaller than the export claims is refused. */
  kv_dev_export big = x;
  big.bytes = x.bytes * 2;
  kv_dev_map *m2 = NULL;
  cr_assert_eq(kv_dev_pool_import(d, &big, &m2), -EINVAL);
  big = x;
  big.fd = -1;
  cr_assert_eq(kv_dev_pool_import(d, &big, &m2), -EINVAL);
  cr_assert_eq(kv_dev_unmap(d, m), 0);
  cr_assert_eq(kv_dev_pool_destroy(d, p), 0);
  kv_dev_close(d);
}

Test(dev, export_codec) { CHECK(dc_export_codec()); }
Test(dev, pool_shared_with_a_forked_worker) { CHECK(dc_share_fork(KV_DEV_SIM)); }
Test(dev, import_refusals) { CHECK(dc_import_errors(KV_DEV_SIM)); }
Test(dev, batches_reaped_once) { CHECK(dc_batch(KV_DEV_SIM)); }
Test(dev, fifo_within_a_direction) { CHECK(dc_fifo(KV_DEV_SIM)); }
Test(dev, directions_at_once) { CHECK(dc_concurrent(KV_DEV_SIM)); }
Test(dev, refusals_and_the_reuse_guards) { CHECK(dc_refusals(KV_DEV_SIM)); }
Test(dev, injected_failure_is_reaped) { CHECK(dc_inject(KV_DEV_SIM)); }
Test(dev, close_waits_for_copies_in_flight) { CHECK(dc_close_inflight(KV_DEV_SIM)); }
Test(dev, batcher_many_copies_per_submission) { CHECK(dc_batcher(KV_DEV_SIM)); }
Test(dev, host_range_shared_by_two_devices) { CHECK(dc_shared_host(KV_DEV_SIM)); }
Test(dev, random_copies_match_a_model) { CHECK(dc_random(KV_DEV_SIM, 400, 12345)); }

/* The completion fd works under a plain poll loop with copies in flight on
 * all directions while the owner keeps submitting (the daemon's shape). */
Test(dev, reap_while_submitting) {
  dc_env e;
  cr_assert_eq(dc_env_open(&e, KV_DEV_SIM, 1 << 20), 0);
  unsigned sent = 0, got = 0;
  kv_dev_done done[64];
  while (got < 3000) {
    if (sent < 3000) {
      /* H2D into the first half of the pool, D2H out of the second: the
       * directions never touch the same bytes (the reuse rule). */
      size_t off = (sent % 128) * 4096;
      kv_dev_copy c = sent % 2
                          ? (kv_dev_copy){e.h + (512 << 10) + off, e.dev + (512 << 10) + off, 4096}
                          : (kv_dev_copy){e.dev + off, e.h + off, 4096};
      cr_assert_eq(kv_dev_submit(e.d, (kv_dev_dir)(sent % 2), &c, 1, sent), 0);
      sent++;
    } else {
      cr_assert_eq(kv_dev_wait(e.d, DC_HANG_MS), 0);
    }
    unsigned k = kv_dev_reap(e.d, done, 64);
    for (unsigned i = 0; i < k; i++) cr_assert_eq(done[i].status, 0);
    got += k;
  }
  cr_assert_eq(kv_dev_inflight(e.d), 0);
  dc_env_close(&e);
}

/* The device a worker computes on: CUDA's current device when there is
 * one (then it is device 0's uuid, the default), -ENODEV when CUDA cannot
 * open a device (this build without CUDA, or no driver). */
Test(dev, current_device_uuid) {
  uint8_t cur[16], u[16];
  int rc = kv_dev_current_uuid(cur);
  kv_dev *d = NULL;
  kv_dev_opts o = {.backend = KV_DEV_CUDA};
  if (kv_dev_open(&d, &o) != 0) {
    cr_assert_eq(rc, -ENODEV, "no CUDA device, yet a current one: %d", rc);
    return;
  }
  cr_assert_eq(rc, 0);
  kv_dev_uuid(d, u);
  cr_assert_eq(memcmp(cur, u, 16), 0);
  kv_dev_close(d);
}
