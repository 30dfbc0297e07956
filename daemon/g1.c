/* g1.c - the daemon's G1 tier: device, pool, export, completions (g1.h). */
#include "daemon/g1.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "tiers/core.h"

/* G1 cannot be had, for `why`: with g1.enable = on that fails the start
 * (rc), else G1 is off and the daemon goes on (0). */
static int unavailable(kvd_g1 *g, int must, const char *why, int rc) {
  snprintf(g->reason, sizeof g->reason, "%s", why);
  if (must) {
    kv_error("g1", "g1.enable = on but %s", why);
    return rc;
  }
  kv_info("g1", "G1 disabled: %s", why);
  return 0;
}

int kvd_g1_open(kvd_g1 *g, const kv_config *c, int ordinal) {
  memset(g, 0, sizeof *g);
  g->ordinal = ordinal;
  g->core_pool = -1;
  g->x.fd = -1;
  g->slots.fd = -1; /* kv_arena_fini of a never-made arena closes nothing */
  if (c->g1_enable == KV_CFG_G1_OFF) {
    snprintf(g->reason, sizeof g->reason, "g1.enable = off");
    kv_info("g1", "G1 off (g1.enable = off)");
    return 0;
  }
  int must = c->g1_enable == KV_CFG_G1_ON;
  char why[KV_DEV_REASON_MAX] = "";
  kv_dev_opts o = {.backend =
                       c->g1_backend == KV_DEV_SIM ? KV_DEV_SIM : KV_DEV_CUDA, /* auto: CUDA */
                   .ordinal = ordinal,
                   .reason = why,
                   .reason_len = sizeof why};
  int rc = kv_dev_open(&g->dev, &o);
  if (rc) {
    char msg[KV_DEV_REASON_MAX + 96];
    snprintf(msg, sizeof msg, "%s device %d: %s", kv_dev_backend_name(o.backend), ordinal,
             why[0] ? why : kv_strerror(rc));
    g->dev = NULL;
    return unavailable(g, must, msg, rc);
  }
  rc = kv_dev_pool_create(g->dev, (size_t)c->g1_capacity, &g->pool);
  if (rc == 0) rc = kv_dev_pool_export(g->pool, &g->x);
  if (rc == 0) {
    kv_arena_opts ao = {.capacity = kv_dev_pool_bytes(g->pool),
                        .page_bytes = c->g2_page_size,
                        .memory = kv_dev_pool_base(g->pool)};
    rc = kv_arena_init(&g->slots, &ao);
  }
  if (rc == 0) {
    g->enc_len = kv_dev_export_encode(&g->x, g->enc, sizeof g->enc);
    if (g->enc_len < 0) rc = g->enc_len;
  }
  if (rc == 0) rc = kv_dev_batcher_init(&g->batch, g->dev, 0);
  if (rc) {
    char msg[KV_DEV_REASON_MAX + 96];
    snprintf(msg, sizeof msg, "cannot make a %llu-byte pool on %s device %d: %s",
             (unsigned long long)c->g1_capacity, kv_dev_backend_name(o.backend), ordinal,
             kv_dev_reason(g->dev)[0] ? kv_dev_reason(g->dev) : kv_strerror(rc));
    kv_arena_fini(&g->slots);
    if (g->pool) kv_dev_pool_destroy(g->dev, g->pool);
    g->pool = NULL;
    kv_dev_close(g->dev);
    g->dev = NULL;
    g->x.fd = -1;
    return unavailable(g, must, msg, rc);
  }
  g->on = 1;
  kv_dev_uuid(g->dev, g->uuid);
  static const char *const kinds[] = {"?", "CUDA VMM (POSIX fd)", "legacy CUDA IPC",
                                      "simulated (memfd)"};
  kv_info("g1", "pool of %llu bytes on %s device %d, exported as %s",
          (unsigned long long)kv_dev_pool_bytes(g->pool),
          kv_dev_backend_name(kv_dev_backend_of(g->dev)), kv_dev_ordinal(g->dev),
          g->x.kind < 4 ? kinds[g->x.kind] : "?");
  return 0;
}

static void on_poll(uv_poll_t *h, int status, int events) { kvd_g1_reap(h->data); }
static void on_prepare(uv_prepare_t *h) { kvd_g1_flush(h->data); }

int kvd_g1_start(kvd_g1 *g, uv_loop_t *loop) {
  if (!g->on) return 0;
  int rc = uv_poll_init(loop, &g->poll, kv_dev_completion_fd(g->dev));
  if (rc) return rc;
  g->poll.data = g;
  rc = uv_poll_start(&g->poll, UV_READABLE, on_poll);
  if (rc) {
    uv_close((uv_handle_t *)&g->poll, NULL);
    return rc;
  }
  uv_prepare_init(loop, &g->prep); /* cannot fail */
  g->prep.data = g;
  uv_prepare_start(&g->prep, on_prepare);
  g->polling = 1;
  return 0;
}

void kvd_g1_stop(kvd_g1 *g) {
  if (!g->polling) return;
  kvd_g1_flush(g);
  uv_poll_stop(&g->poll);
  uv_close((uv_handle_t *)&g->poll, NULL);
  uv_prepare_stop(&g->prep);
  uv_close((uv_handle_t *)&g->prep, NULL);
  g->polling = 0;
}

static uint64_t refused(const kvd_g1 *g) {
  uint64_t n = 0;
  for (int d = 0; d < KV_DEV_NDIR; d++) n += g->batch.refused[d];
  return n;
}

void kvd_g1_flush(kvd_g1 *g) {
  if (!g->on) return;
  /* Refusals wait in the batcher (the fd does not signal them), also those
   * of a direction that filled up during an add. */
  while (kv_dev_batch_queued(&g->batch) > 0 || kv_dev_batch_ready(&g->batch) > 0) {
    uint64_t before = refused(g);
    kv_dev_batch_flush(&g->batch);
    if (refused(g) > before)
      kv_warn("g1", "the device refused %llu copies: %s", (unsigned long long)(refused(g) - before),
              kv_dev_reason(g->dev)[0] ? kv_dev_reason(g->dev) : "no reason given");
    kvd_g1_reap(g); /* refusals (and whatever is done), which may queue more */
  }
}

unsigned kvd_g1_reap(kvd_g1 *g) {
  if (!g->on) return 0;
  kv_dev_done done[64];
  unsigned n, total = 0, failed = 0;
  int first = 0;
  while ((n = kv_dev_batch_reap(&g->batch, done, 64)) > 0) {
    for (unsigned i = 0; i < n; i++) {
      if (done[i].status && failed++ == 0) first = done[i].status;
      if (g->done) g->done(g->done_arg, done[i].tag, done[i].status);
    }
    total += n;
  }
  if (failed) kv_warn("g1", "%u of %u copies failed (%s)", failed, total, kv_strerror(first));
  g->reaped += total;
  return total;
}

/* Submits what is queued and waits until every copy is reaped. */
static void drain(kvd_g1 *g) {
  kvd_g1_flush(g);
  while (kv_dev_inflight(g->dev) > 0) {
    int rc = kv_dev_wait(g->dev, 1000);
    if (rc && rc != -ETIMEDOUT) break;
    kvd_g1_reap(g);
    kvd_g1_flush(g);
  }
}

void kvd_g1_close(kvd_g1 *g) {
  if (!g->dev) return;
  if (g->on) {
    drain(g);
    kv_arena_fini(&g->slots);
  }
  if (g->pool) {
    int rc = kv_dev_pool_destroy(g->dev, g->pool);
    if (rc) kv_warn("g1", "pool: %s (released with the device)", kv_strerror(rc));
  }
  g->pool = NULL;
  kv_dev_close(g->dev); /* also waits for anything still in flight */
  if (g->on) kv_dev_batcher_fini(&g->batch);
  g->dev = NULL;
  g->x.fd = -1;
  g->on = 0;
  kv_info("g1", "pool on device %d released", g->ordinal);
}

int kvd_g1_copy(void *arg, int to_g1, void *g1, void *g2, uint32_t bytes, uint64_t tag) {
  kvd_g1 *g = arg;
  kv_dev_copy cp = {.dst = to_g1 ? g1 : g2, .src = to_g1 ? g2 : g1, .bytes = bytes};
  return kv_dev_batch_add(&g->batch, to_g1 ? KV_DEV_H2D : KV_DEV_D2H, &cp, tag);
}

int kvd_g1_arena_register(void *base, size_t len, void *arg) {
  kvd_g1 *g = arg;
  if (!g || !g->dev) return 0;
  int rc = kv_dev_host_register(g->dev, base, len);
  if (rc) {
    kv_warn("g1",
            "cannot register a G2 arena of %zu bytes with the device (%s): "
            "G1<->G2 copies of it will not be DMA",
            len, kv_dev_reason(g->dev));
    return rc;
  }
  g->arenas++;
  return 0;
}

void kvd_g1_arena_unregister(void *base, size_t len, void *arg) {
  kvd_g1 *g = arg;
  if (!g || !g->dev) return;
  if (g->on) drain(g);
  int rc = kv_dev_host_unregister(g->dev, base);
  if (rc) kv_warn("g1", "cannot unregister a G2 arena: %s", kv_strerror(rc));
  else g->arenas--;
}

int kvd_g1_export(kvd_g1 *g, uint8_t *kind, int *fd) {
  if (!g->on) return -ENODEV;
  *kind = g->x.kind;
  *fd = g->x.fd;
  if (g->x.kind < 4) g->exports[g->x.kind]++;
  return 0;
}

/* ---- every device of g1.device ------------------------------------------------ */

_Static_assert(KV_CFG_G1_DEVICES_MAX <= KV_G1_POOLS_MAX, "a core pool for every device");

int kvd_g1s_open(kvd_g1s *s, const kv_config *c) {
  int ord[KV_CFG_G1_DEVICES_MAX];
  int n = kv_config_g1_devices(c, ord);
  memset(s, 0, sizeof *s);
  if (n < 0) { /* kv_config_validate refuses this; a default to stay safe */
    n = 1;
    ord[0] = 0;
  }
  for (int i = 0; i < n; i++) {
    int rc = kvd_g1_open(&s->g[i], c, ord[i]);
    s->n = (unsigned)i + 1;
    if (rc) {
      kvd_g1s_close(s);
      return rc;
    }
    s->on += (unsigned)s->g[i].on;
  }
  /* Why G1 is off: each device's reason (one device: its own). */
  size_t k = 0;
  for (unsigned i = 0; i < s->n && !s->on && k < sizeof s->reason; i++) {
    int w = snprintf(s->reason + k, sizeof s->reason - k, "%s%s", i ? "; " : "", s->g[i].reason);
    if (w < 0) break;
    k += (size_t)w;
  }
  if (s->on && s->n > 1) kv_info("g1", "%u of %u devices have a pool", s->on, s->n);
  return 0;
}

int kvd_g1s_start(kvd_g1s *s, uv_loop_t *loop) {
  for (unsigned i = 0; i < s->n; i++) {
    int rc = kvd_g1_start(&s->g[i], loop);
    if (rc) return rc;
  }
  return 0;
}

void kvd_g1s_stop(kvd_g1s *s) {
  for (unsigned i = 0; i < s->n; i++) kvd_g1_stop(&s->g[i]);
}

void kvd_g1s_close(kvd_g1s *s) {
  for (unsigned i = 0; i < s->n; i++) kvd_g1_close(&s->g[i]);
  s->on = 0;
}

kvd_g1 *kvd_g1s_first(kvd_g1s *s) {
  for (unsigned i = 0; i < s->n; i++)
    if (s->g[i].on) return &s->g[i];
  return NULL;
}

kvd_g1 *kvd_g1s_find(kvd_g1s *s, const uint8_t uuid[16]) {
  for (unsigned i = 0; i < s->n; i++)
    if (s->g[i].on && !memcmp(s->g[i].uuid, uuid, 16)) return &s->g[i];
  return NULL;
}

int kvd_g1s_arena_register(void *base, size_t len, void *arg) {
  kvd_g1s *s = arg;
  for (unsigned i = 0; i < s->n; i++) {
    if (!s->g[i].on) continue;
    int rc = kvd_g1_arena_register(base, len, &s->g[i]);
    if (rc) { /* none, rather than copies that work on some devices only */
      while (i-- > 0)
        if (s->g[i].on) kvd_g1_arena_unregister(base, len, &s->g[i]);
      return rc;
    }
  }
  return 0;
}

void kvd_g1s_arena_unregister(void *base, size_t len, void *arg) {
  kvd_g1s *s = arg;
  /* Each device drains its copies before it lets go (kvd_g1_arena_unregister);
   * the first registrant, whose registration the others borrow, goes last. */
  for (unsigned i = s->n; i-- > 0;)
    if (s->g[i].on) kvd_g1_arena_unregister(base, len, &s->g[i]);
}
