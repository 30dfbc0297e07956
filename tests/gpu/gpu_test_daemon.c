/* gpu_test_daemon.c - G1 end to end on a CUDA device: a real kvcached
 * (g1.backend = cuda, its pool on the device, exported over the socket)
 * and this process as its worker: libkvclient maps the pool of its current
 * device, LOADs to G1 come up through the daemon's copy engine, and the
 * bytes read back through the worker's own device equal what was stored.
 * A worker naming a device without a pool (G1_SELECT) gets G2 and the
 * reason. `--sim` runs the same against the simulated device, so the
 * program itself is checked on any machine.
 * Exit: 0 passed, 1 failed, 77 no CUDA device here (with the reason). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/kvclient.h"
#include "cuda/dev.h"
#include "ipc/sock.h"
#include "proto/wire.h"
#include "tests/lib/gpu.h"

#define BLOCK   (1u << 20)
#define NBLOCKS 32

static kvt_daemon kd;

/* kvcached with G1 on `backend` (cuda or sim): G2 96 MiB, G1 64 MiB. */
static int start_daemon(const char *backend) {
  char be[32];
  snprintf(be, sizeof be, "g1.backend=%s", backend);
  const char *sets[] = {"g2.page_size=4M", "g1.enable=on", be, "g1.capacity=64M", NULL};
  return gpu_daemon_start(&kd, "96M", sets);
}

static kvc *worker(const uint8_t *uuid) {
  kvc_opts o = {.socket_path = kd.sock,
                .tenant = "gpu",
                .g1_uuid = uuid,
                .layout = {.block_bytes = BLOCK,
                           .tokens_per_block = 16,
                           .layers = 1,
                           .kv_heads = 8,
                           .head_dim = 128,
                           .tp_size = 1,
                           .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  if (rc) fprintf(stderr, "    kvc_open: %s\n", kvc_strerror(rc));
  return c;
}

static kvc_key key(uint64_t v) {
  kvc_key k = {.len = 8};
  for (int i = 0; i < 8; i++) k.b[i] = (uint8_t)(v >> (8 * i) ^ 0x5c);
  return k;
}

static uint8_t pat(uint32_t block, uint32_t i) {
  return (uint8_t)(block * 131u + i * 7u + (i >> 12));
}

static int run(int sim) {
  kvc *c = worker(NULL);
  REQ(c, "the worker could not connect");
  kvc_g1 g;
  REQ(kvc_g1_info(c, &g) == 0 && g.available, "G1 not mapped: %s", g.reason);
  REQ(sim ? g.kind == KV_TI_G1_SIM_FD : g.kind == KV_TI_G1_VMM_FD || g.kind == KV_TI_G1_LEGACY_IPC,
      "export kind %u", g.kind);
  char us[KV_DEV_UUID_STR];
  printf("    pool of %llu bytes on %s, kind %u\n", (unsigned long long)g.bytes,
         kv_dev_uuid_str(g.uuid, us), g.kind);

  kvc_key keys[NBLOCKS];
  kvc_block out[NBLOCKS];
  for (uint32_t b = 0; b < NBLOCKS; b++) keys[b] = key(b);
  REQ(kvc_alloc(c, KVC_G2, 128, keys, NULL, NBLOCKS, out) == NBLOCKS, "alloc of %u blocks",
      NBLOCKS);
  for (uint32_t b = 0; b < NBLOCKS; b++)
    for (uint32_t i = 0; i < BLOCK; i++) ((uint8_t *)out[b].ptr)[i] = pat(b, i);
  REQ(kvc_commit(c, keys, NBLOCKS, NULL) == NBLOCKS, "commit");

  int64_t t0 = kv_now_ms();
  int ok = kvc_load(c, KVC_G1, keys, NBLOCKS, out);
  int64_t t1 = kv_now_ms();
  REQ(ok == NBLOCKS, "LOAD to G1: %d of %u", ok, NBLOCKS);
  uint8_t *host = malloc(BLOCK);
  REQ(host && kv_dev_host_register(g.dev, host, BLOCK) == 0, "host buffer: %s",
      kv_dev_reason(g.dev));
  for (uint32_t b = 0; b < NBLOCKS; b++) {
    REQ(out[b].status == 0 && out[b].tier == KVC_G1, "block %u: status %d tier %u", b,
        out[b].status, out[b].tier);
    REQ(kv_dev_memcpy_sync(g.dev, KV_DEV_D2H, host, out[b].ptr, BLOCK) == 0, "D2H: %s",
        kv_dev_reason(g.dev));
    for (uint32_t i = 0; i < BLOCK; i++)
      REQ(host[i] == pat(b, i), "block %u byte %u: %#x, stored %#x", b, i, host[i], pat(b, i));
  }
  printf("    LOAD of %u x %u KiB to G1 in %lld ms (one run, not a benchmark); bytes equal\n",
         NBLOCKS, BLOCK >> 10, (long long)(t1 - t0));
  REQ(kvc_release(c, keys, NBLOCKS, NULL) == NBLOCKS, "release");
  REQ(kv_dev_host_unregister(g.dev, host) == 0, "unregister");
  free(host);

  /* A worker on a device the daemon has no pool on: G2, and why. */
  uint8_t other[16];
  memset(other, 0xee, sizeof other);
  kvc *w = worker(other);
  REQ(w, "second worker");
  kvc_g1 g2;
  REQ(kvc_g1_info(w, &g2) == 0 && !g2.available, "a pool mapped for a device without one");
  REQ(strstr(g2.reason, "no G1 pool on this worker's device"), "reason: %s", g2.reason);
  printf("    worker on %s: %s\n", kv_dev_uuid_str(other, us), g2.reason);
  kvc_block one;
  REQ(kvc_load(w, KVC_G2, keys, 1, &one) == 1 && one.tier == KVC_G2, "its LOAD to G2");
  kvc_close(w);
  kvc_close(c);
  return 0;
}

int main(int argc, char **argv) {
  int sim = argc > 1 && !strcmp(argv[1], "--sim");
  uint8_t u[16];
  if (!sim && kv_dev_current_uuid(u) != 0) {
    printf("gpu_test_daemon: skipped: no CUDA device here (try --sim)\n");
    return 77;
  }
  printf("gpu_test_daemon: kvcached with its G1 pool on the %s device, this process its worker\n",
         sim ? "simulated" : "CUDA");
  if (start_daemon(sim ? "sim" : "cuda")) {
    gpu_daemon_stop(&kd);
    return 1;
  }
  int rc = run(sim);
  int st = gpu_daemon_stop(&kd);
  rc = rc || st;
  printf("gpu_test_daemon: %s\n", rc ? "FAILED" : "passed");
  return rc;
}
