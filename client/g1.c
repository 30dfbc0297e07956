/* g1.c - libkvclient's G1 import (g1.h). */
#include "client/g1.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "proto/wire.h"

/* why, then ": detail" when detail is given. */
static int fail(kvc__g1 *g, int rc, const char *why, const char *detail) {
  snprintf(g->info.reason, sizeof g->info.reason, "%s%s%s", why, detail ? ": " : "",
           detail ? detail : "");
  g->info.available = 0;
  return rc;
}

int kvc__g1_import(kvc__g1 *g, uint8_t kind, const uint8_t *val, size_t len, int fd) {
  kv_dev_export x;
  int rc;
  if (kind != KV_TI_G1_VMM_FD && kind != KV_TI_G1_LEGACY_IPC && kind != KV_TI_G1_SIM_FD) {
    char k[8];
    snprintf(k, sizeof k, "%u", kind);
    rc = fail(g, -EOPNOTSUPP, "G1 export kind unknown to this libkvclient", k);
    goto out;
  }
  if (kv_dev_export_decode(val, len, &x) || x.kind != kind) {
    rc = fail(g, KV_EBADFRAME, "the daemon's G1 entry does not decode (corrupt or another version)",
              NULL);
    goto out;
  }
  if ((kind == KV_TI_G1_LEGACY_IPC) != (fd < 0)) {
    rc = fail(g, KV_EBADFD,
              kind == KV_TI_G1_LEGACY_IPC ? "an fd came with a legacy IPC G1 export"
                                          : "the G1 pool's fd did not come with HELLO",
              NULL);
    goto out;
  }
  memcpy(g->info.uuid, x.uuid, 16);
  x.fd = fd;
  char why[KV_DEV_REASON_MAX] = "";
  kv_dev_opts o = {.backend = kind == KV_TI_G1_SIM_FD ? KV_DEV_SIM : KV_DEV_CUDA,
                   .uuid = x.uuid,
                   .reason = why,
                   .reason_len = sizeof why};
  rc = kv_dev_open(&g->dev, &o);
  if (rc) {
    g->dev = NULL;
    rc = fail(g, rc, "cannot open the G1 device", why[0] ? why : kv_strerror(rc));
    goto out;
  }
  rc = kv_dev_pool_import(g->dev, &x, &g->map);
  if (rc) {
    fail(g, rc, "cannot map the G1 pool",
         kv_dev_reason(g->dev)[0] ? kv_dev_reason(g->dev) : kv_strerror(rc));
    kv_dev_close(g->dev);
    g->dev = NULL;
    g->map = NULL;
    goto out;
  }
  g->info.available = 1;
  g->info.reason[0] = 0;
  g->info.backend = kv_dev_backend_of(g->dev) == KV_DEV_SIM ? KVC_G1_SIM : KVC_G1_CUDA;
  g->info.kind = kind;
  g->info.base = kv_dev_map_base(g->map);
  g->info.bytes = kv_dev_map_bytes(g->map);
  g->info.dev = g->dev;
out:
  if (fd >= 0) close(fd);
  return rc;
}

void kvc__g1_release(kvc__g1 *g) {
  if (g->dev) {
    if (g->map) kv_dev_unmap(g->dev, g->map);
    kv_dev_close(g->dev); /* waits for copies in flight, releases what is left */
  }
  g->dev = NULL;
  g->map = NULL;
  g->info.available = 0;
  g->info.base = NULL;
  g->info.dev = NULL;
}
