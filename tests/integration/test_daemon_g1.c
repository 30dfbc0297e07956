/* test_daemon_g1.c - G1 through the real kvcached on the simulated device
 * (g1.backend = sim): the HELLO reply's G1 entry and fd, libkvclient's
 * import (kvc_g1_info, kvc_g1_ptr), bytes written by one worker through the
 * device seen by another, workers that do not ask, a daemon with G1 off,
 * a pool per device with each worker on its own (G1_SELECT) and the g1
 * metrics. The client's side alone is in tests/unit/test_g1_client.c. */
#include "tests/lib/fixture.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "base/errors.h"
#include "client/g1.h"
#include "cuda/dev.h"
#include "ipc/reader.h"
#include "proto/wire.h"
#include "tests/lib/dev_checks.h"

static const char *const sim_on[] = {"g1.enable=on", "g1.backend=sim", "g1.capacity=4M", NULL};

static kvc *open_g1(int no_g1) { return ops_open_with("t1", no_g1); }

#define PAT_OFF (3u << 20)
#define PAT_LEN 65536u

/* A second worker: waits for the go byte, opens its own session (its own
 * import of the pool), reads the pattern back through the device. Exit 0
 * when the bytes match. */
static int second_worker(int go) {
  char b;
  if (read(go, &b, 1) != 1) return 10;
  kvc *c = open_g1(0);
  kvc_g1 g;
  if (kvc_g1_info(c, &g) || !g.available) return 11;
  void *src;
  if (kvc_g1_ptr(c, PAT_OFF, PAT_LEN, &src)) return 12;
  static uint8_t host[PAT_LEN];
  if (kv_dev_host_register(g.dev, host, sizeof host)) return 13;
  if (kv_dev_memcpy_sync(g.dev, KV_DEV_D2H, host, src, PAT_LEN)) return 14;
  for (uint32_t i = 0; i < PAT_LEN; i++)
    if (host[i] != (uint8_t)(i * 7 + 1)) return 15;
  if (kv_dev_host_unregister(g.dev, host)) return 16;
  kvc_close(c);
  return 0;
}

Test(g1, sim_pool_shared_between_workers, .timeout = 60) {
  int go[2];
  cr_assert_eq(pipe(go), 0);
  ops_start(NULL, sim_on);
  /* Forked before this process imports anything: the child maps the pool
   * through its own HELLO. */
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    close(go[1]);
    _exit(second_worker(go[0]));
  }
  close(go[0]);

  kvc *c = open_g1(0);
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert_eq(g.available, 1, "G1 not imported: %s", g.reason);
  cr_assert_eq(g.backend, KVC_G1_SIM);
  cr_assert_eq(g.kind, KV_TI_G1_SIM_FD);
  cr_assert_geq(g.bytes, 4u << 20);
  cr_assert_not_null(g.base);
  cr_assert_not_null(g.dev);
  /* Bounds-checked block pointers. */
  void *p;
  cr_assert_eq(kvc_g1_ptr(c, 0, g.bytes, &p), 0);
  cr_assert_eq(p, g.base);
  cr_assert_eq(kvc_g1_ptr(c, g.bytes - 1, 2, &p), -ERANGE);
  cr_assert_eq(kvc_g1_ptr(c, g.bytes, 1, &p), -ERANGE);
  cr_assert_eq(kvc_g1_ptr(c, 0, 0, &p), -ERANGE);
  cr_assert_eq(kvc_g1_ptr(c, UINT64_MAX, 2, &p), -ERANGE);

  /* Write a pattern into the pool through the device (H2D from a
   * registered host buffer), then let the other worker read it. */
  static uint8_t host[PAT_LEN];
  for (uint32_t i = 0; i < PAT_LEN; i++) host[i] = (uint8_t)(i * 7 + 1);
  cr_assert_eq(kv_dev_host_register(g.dev, host, sizeof host), 0);
  cr_assert_eq(kvc_g1_ptr(c, PAT_OFF, PAT_LEN, &p), 0);
  cr_assert_eq(kv_dev_memcpy_sync(g.dev, KV_DEV_H2D, p, host, PAT_LEN), 0);
  cr_assert_eq(kv_dev_host_unregister(g.dev, host), 0);
  cr_assert_eq(write(go[1], "g", 1), 1);
  int st;
  cr_assert_eq(waitpid(child, &st, 0), child);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "second worker: exit %d",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);

  /* G2 still works in the same session. */
  kvc_key k = KC(1), parent = {0};
  kvc_block b;
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &parent, 1, &b), 1);
  memset(b.ptr, 0x5a, OPS_BLOCK);
  cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);

  cr_assert_eq(ops_metric("kvcached_g1_enabled"), 1);
  cr_assert_eq(ops_metric("kvcached_g1_unavailable"), 0);
  cr_assert_geq(ops_metric("kvcached_g1_pool_bytes"), 4 << 20);
  cr_assert_eq(ops_metric("kvcached_g1_exports_total{kind=\"sim_fd\"}"), 2);
  cr_assert_eq(ops_metric("kvcached_g1_exports_total{kind=\"vmm_fd\"}"), 0);
  kvc_close(c);
  close(go[1]);
  ops_stop();
}

Test(g1, worker_without_cap_gets_no_pool, .timeout = 60) {
  ops_start(NULL, sim_on);
  kvc *c = open_g1(1);
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert_eq(g.available, 0);
  cr_assert(strstr(g.reason, "not asked"), "%s", g.reason);
  void *p;
  cr_assert_eq(kvc_g1_ptr(c, 0, 1, &p), -ENODEV);
  cr_assert_eq(ops_metric("kvcached_g1_exports_total{kind=\"sim_fd\"}"), 0, "no entry was sent");
  kvc_close(c);
  ops_stop();
}

/* The raw reply: a HELLO without KV_CAP_G1 has no tier-info and one fd;
 * with it, one G1 entry and a second fd. */
static void raw_hello(uint32_t caps, kv_msg *r, kv_frame *f, kv_reader *rd, int *sockfd) {
  int s = kv_sock_connect(ops_d.sock, 0);
  cr_assert_geq(s, 0);
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_HELLO;
  m.id = 1;
  m.hello.ver_major = KV_PROTO_MAJOR;
  m.hello.caps = caps;
  m.hello.tenant = (kv_str){"t1", 2};
  m.hello.layout = (kv_layout){
      .block_bytes = OPS_BLOCK, .tokens_per_block = 16, .tp_size = 1, .dtype = {"bf16", 4}};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  struct iovec iov = {b.p, b.len};
  cr_assert_eq(kv_sock_send_frame(s, &iov, 1, -1, 5000), 0);
  kv_buf_free(&b);
  kv_reader_init(rd, 0);
  cr_assert_eq(kv_reader_recv(rd, s, f, 5000), 1);
  cr_assert_eq(kv_msg_decode(f->p, f->len, r), 0);
  *sockfd = s;
}

Test(g1, raw_hello_entry_and_fds, .timeout = 60) {
  ops_start(NULL, sim_on);
  kv_msg r;
  kv_frame f;
  kv_reader rd;
  int s;
  raw_hello(0, &r, &f, &rd, &s);
  cr_assert_eq(r.hello_rep.ntierinfo, 0);
  cr_assert_eq(r.hello_rep.caps & KV_CAP_G1, 0);
  cr_assert(f.fd >= 0 && f.fd2 < 0);
  close(f.fd);
  kv_reader_free(&rd);
  close(s);

  raw_hello(KV_CAP_G1, &r, &f, &rd, &s);
  cr_assert_eq(r.hello_rep.ntierinfo, 1);
  cr_assert(r.hello_rep.caps & KV_CAP_G1);
  cr_assert(r.flags & KV_F_FD2);
  cr_assert(f.fd >= 0 && f.fd2 >= 0);
  kv_tierinfo t;
  kv_hello_tierinfo(&r.hello_rep, 0, &t);
  cr_assert_eq(t.tier, KV_G1);
  cr_assert_eq(t.kind, KV_TI_G1_SIM_FD);
  kv_dev_export x;
  cr_assert_eq(kv_dev_export_decode(t.p, t.len, &x), 0);
  cr_assert_geq(x.bytes, 4u << 20);
  /* The second fd is the pool (the first the arena): as large as the export. */
  struct stat st1, st2;
  cr_assert_eq(fstat(f.fd2, &st2), 0);
  cr_assert_eq((uint64_t)st2.st_size, x.bytes);
  cr_assert_eq(fstat(f.fd, &st1), 0);
  cr_assert_eq((uint64_t)st1.st_size, r.hello_rep.arena_bytes);
  close(f.fd);
  close(f.fd2);
  kv_reader_free(&rd);
  close(s);
  ops_stop();
}

/* The value of a metric line with labels, -1 if none. */
static long long metric_l(const char *name_labels) { return ops_metric(name_labels); }

/* Reads n bytes at device address src back through the worker's device. */
static void read_device(kvc *c, const void *src, uint8_t *host, size_t n) {
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert_eq(kv_dev_memcpy_sync(g.dev, KV_DEV_D2H, host, src, n), 0);
}

static int all_bytes(const uint8_t *p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return 0;
  return 1;
}

/* LOAD to G1 over the whole path: blocks come up from G2 through the
 * device copy engine, the worker reads them through its import; G1 victims
 * that G2 has lost are written back to G2 first, bytes intact (victims G2
 * still holds just lose their G1 copy: test_core_g1). G2 and G1 hold 32
 * blocks each. */
static void load_g1(kvc *c, uint64_t first, uint32_t n, uint8_t *host) {
  kvc_key k[32];
  kvc_block out[32];
  for (uint32_t i = 0; i < n; i++) k[i] = KC(first + i);
  int ok = kvc_load(c, KVC_G1, k, n, out);
  for (uint32_t i = 0; i < n; i++)
    cr_assert_eq(out[i].status, 0, "load of %llu to G1: %d of %u; this one: %s",
                 (unsigned long long)(first + i), ok, n, kvc_strerror(out[i].status));
  cr_assert_eq(ok, (int)n);
  for (uint32_t i = 0; i < n; i++) {
    cr_assert_eq(out[i].tier, KVC_G1, "block %llu: tier %u", (unsigned long long)(first + i),
                 out[i].tier);
    cr_assert_eq(out[i].length, OPS_BLOCK);
    read_device(c, out[i].ptr, host, OPS_BLOCK);
    cr_assert(all_bytes(host, OPS_BLOCK, (uint8_t)(first + i)), "block %llu's bytes on the device",
              (unsigned long long)(first + i));
  }
  cr_assert_eq(kvc_release(c, k, n, NULL), (int)n);
}

static uint8_t tier_of(kvc *c, uint64_t v) {
  kvc_key k = KC(v);
  uint8_t t;
  kvc_lookup(c, &k, 1, &t);
  return t;
}

Test(g1, load_to_g1_and_write_back, .timeout = 60) {
  /* One worker holds all 32 blocks at once: no session share. */
  static const char *const conf[] = {"g1.enable=on",     "g1.backend=sim",
                                     "g1.capacity=2M",   "cache.policy=lru",
                                     "limits.session_share=100", NULL};
  ops_start(NULL, conf);
  kvc *c = open_g1(0);
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert(g.available, "%s", g.reason);
  cr_assert_eq(g.bytes, 2u << 20);
  static uint8_t host[OPS_BLOCK];
  cr_assert_eq(kv_dev_host_register(g.dev, host, sizeof host), 0);

  ops_store(c, 1, 16);
  load_g1(c, 1, 16, host);
  cr_assert_eq(tier_of(c, 1), KVC_G1, "the fastest tier holding it");
  cr_assert_eq(metric_l("kvcached_g1_copies_total{dir=\"load\"}"), 16);
  cr_assert_eq(metric_l("kvcached_copy_ops_total{direction=\"g2_to_g1\"}"), 16);
  cr_assert_eq(metric_l("kvcached_tier_blocks{tier=\"g1\"}"), 16);
  cr_assert_eq(metric_l("kvcached_tier_capacity_bytes{tier=\"g1\"}"), 2ll << 20);
  cr_assert_eq(metric_l("kvcached_tier_used_bytes{tier=\"g1\"}"), 16ll * OPS_BLOCK);
  cr_assert_eq(metric_l("kvcached_copy_bytes_total{direction=\"g2_to_g1\"}"), 16ll * OPS_BLOCK);
  /* The LOAD's 16 copies went to the device as one submission. */
  cr_assert_eq(metric_l("kvcached_g1_submissions_total{dir=\"load\"}"), 1);
  /* 32 new blocks push 1..16 out of G2: they live in G1 only. */
  ops_store(c, 17, 48);
  cr_assert_eq(metric_l("kvcached_evictions_total{tier=\"g2\"}"), 16);
  cr_assert_eq(tier_of(c, 1), KVC_G1);
  /* G1 has room for 16 more; the next 8 take the room of 1..8, which G2
   * has lost: they are written back first. */
  load_g1(c, 17, 16, host);
  cr_assert_eq(metric_l("kvcached_evictions_total{tier=\"g1\"}"), 0);
  load_g1(c, 33, 8, host);
  cr_assert_eq(metric_l("kvcached_evictions_total{tier=\"g1\"}"), 8);
  cr_assert_eq(metric_l("kvcached_g1_copies_total{dir=\"writeback\"}"), 8);
  cr_assert_eq(metric_l("kvcached_copy_ops_total{direction=\"g1_to_g2\"}"), 8);
  /* One submission for the 8 write-backs; the 8 loads they made room for
   * went as one more (one per LOAD before: 16 + 16 + 8). */
  cr_assert_eq(metric_l("kvcached_g1_submissions_total{dir=\"writeback\"}"), 1);
  cr_assert_eq(metric_l("kvcached_g1_submissions_total{dir=\"load\"}"), 3);
  cr_assert_eq(metric_l("kvcached_g1_copies_refused_total{dir=\"load\"}"), 0);
  cr_assert_eq(metric_l("kvcached_g1_copy_failures_total{dir=\"load\"}"), 0);
  for (uint64_t v = 1; v <= 8; v++)
    cr_assert_eq(tier_of(c, v), KVC_G2, "block %llu written back", (unsigned long long)v);
  cr_assert_eq(tier_of(c, 9), KVC_G1);
  kvc_key k = KC(1);
  kvc_block out;
  cr_assert_eq(kvc_load(c, KVC_G2, &k, 1, &out), 1);
  cr_assert(all_bytes(out.ptr, OPS_BLOCK, 1), "written back intact");
  cr_assert_eq(kvc_release(c, &k, 1, NULL), 1);
  cr_assert_eq(kv_dev_host_unregister(g.dev, host), 0);
  kvc_close(c);
  ops_stop();
}

/* Every device copy fails (the simulation's KV_DEV_SIM_FAIL): a LOAD to G1
 * is still answered, from G2, bytes intact; the failures are counted and
 * nothing is left in G1. */
Test(g1, failed_device_copies_are_answered_from_g2, .timeout = 60) {
  static const char *const conf[] = {"g1.enable=on", "g1.backend=sim", "g1.capacity=2M", NULL};
  setenv("KV_DEV_SIM_FAIL", "5", 1); /* EIO, inherited by the daemon */
  ops_start(NULL, conf);
  unsetenv("KV_DEV_SIM_FAIL");
  kvc *c = open_g1(0);
  ops_store(c, 1, 4);
  kvc_key k[4];
  kvc_block out[4];
  for (uint32_t i = 0; i < 4; i++) k[i] = KC(1 + i);
  cr_assert_eq(kvc_load(c, KVC_G1, k, 4, out), 4);
  for (uint32_t i = 0; i < 4; i++) {
    cr_assert_eq(out[i].status, 0, "block %u: %s", i + 1, kvc_strerror(out[i].status));
    cr_assert_eq(out[i].tier, KVC_G2, "block %u answered from tier %u", i + 1, out[i].tier);
    cr_assert(all_bytes(out[i].ptr, OPS_BLOCK, (uint8_t)(1 + i)), "block %u's bytes in G2", i + 1);
  }
  cr_assert_eq(kvc_release(c, k, 4, NULL), 4);
  cr_assert_eq(metric_l("kvcached_g1_copy_failures_total{dir=\"load\"}"), 4);
  cr_assert_eq(metric_l("kvcached_g1_copies_total{dir=\"load\"}"), 0);
  cr_assert_eq(metric_l("kvcached_g1_submissions_total{dir=\"load\"}"), 1);
  cr_assert_eq(metric_l("kvcached_tier_blocks{tier=\"g1\"}"), 0);
  cr_assert_eq(metric_l("kvcached_tier_used_bytes{tier=\"g1\"}"), 0,
               "a failed copy's slot was given back");
  cr_assert_eq(tier_of(c, 1), KVC_G2);
  kvc_close(c);
  ops_stop();
}

Test(g1, load_to_g1_without_g1_is_refused, .timeout = 60) {
  static const char *const off[] = {"g1.enable=off", NULL};
  ops_start(NULL, off);
  kvc *c = open_g1(0);
  ops_store(c, 1, 1);
  kvc_key k = KC(1);
  kvc_block out;
  cr_assert_eq(kvc_load(c, KVC_G1, &k, 1, &out), -ENODEV, "the worker loads to G2 instead");
  cr_assert_eq(kvc_load(c, KVC_G2, &k, 1, &out), 1);
  kvc_close(c);
  ops_stop();
}

Test(g1, daemon_with_g1_off, .timeout = 60) {
  static const char *const off[] = {"g1.enable=off", NULL};
  ops_start(NULL, off);
  kvc *c = open_g1(0);
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert_eq(g.available, 0);
  cr_assert(strstr(g.reason, "no G1 pool"), "%s", g.reason);
  cr_assert(strstr(g.reason, "g1.enable = off"), "the daemon's reason comes along: %s", g.reason);
  cr_assert_eq(ops_metric("kvcached_g1_enabled"), 0);
  cr_assert_eq(ops_metric("kvcached_g1_unavailable"), 0, "off by configuration is not unavailable");
  cr_assert_eq(ops_metric("kvcached_g1_pool_bytes"), 0);
  /* G2 as before. */
  kvc_key k = KC(2), parent = {0};
  kvc_block b;
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &parent, 1, &b), 1);
  cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
  kvc_close(c);
  ops_stop();
}

/* auto on the CUDA backend: on where a GPU answers, else unavailable -
 * exactly one of the two, and the daemon starts either way. */
Test(g1, auto_is_on_or_unavailable, .timeout = 60) {
  static const char *const autoc[] = {"g1.enable=auto", "g1.backend=cuda", "g1.capacity=2M", NULL};
  ops_start(NULL, autoc);
  long long on = ops_metric("kvcached_g1_enabled"), un = ops_metric("kvcached_g1_unavailable");
  cr_assert(on + un == 1 && on >= 0 && un >= 0, "enabled %lld, unavailable %lld", on, un);
  kvc *c = open_g1(0);
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  if (un == 1) /* the worker learns the daemon's reason in the HELLO reply */
    cr_assert(strstr(g.reason, "no G1 pool: cuda device 0"), "%s", g.reason);
  else cr_assert(g.available, "%s", g.reason);
  kvc_close(c);
  ops_stop();
}

/* ---- a pool per device (g1.device = 0,2 on the simulation) -------------------- */

static const char *const two_devs[] = {"g1.enable=on",  "g1.backend=sim",   "g1.capacity=2M",
                                       "g1.device=0,2", "cache.policy=lru", NULL};

static void sim_uuid(int ordinal, uint8_t u[16]) {
  cr_assert_eq(dc_uuid_of(KV_DEV_SIM, ordinal, u), 0);
}

/* A worker computing on the device with this uuid. */
static kvc *open_on(const uint8_t *uuid) { return ops_open_on("t1", 0, uuid); }

/* Loads first..first+n-1 to G1; each entry's tier must be `tier`, its
 * bytes the block's (read through the worker's device for G1). */
static void load_expect(kvc *c, uint64_t first, uint32_t n, uint8_t tier, uint8_t *host) {
  kvc_key k[8];
  kvc_block out[8];
  for (uint32_t i = 0; i < n; i++) k[i] = KC(first + i);
  cr_assert_eq(kvc_load(c, KVC_G1, k, n, out), (int)n);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t v = first + i;
    cr_assert_eq(out[i].status, 0, "block %llu: %s", (unsigned long long)v,
                 kvc_strerror(out[i].status));
    cr_assert_eq(out[i].tier, tier, "block %llu in tier %u, wanted %u", (unsigned long long)v,
                 out[i].tier, tier);
    if (tier == KVC_G1) read_device(c, out[i].ptr, host, OPS_BLOCK);
    else memcpy(host, out[i].ptr, OPS_BLOCK);
    cr_assert(all_bytes(host, OPS_BLOCK, (uint8_t)v), "block %llu's bytes", (unsigned long long)v);
  }
  cr_assert_eq(kvc_release(c, k, n, NULL), (int)n);
}

Test(g1, a_pool_per_device_each_worker_maps_its_own, .timeout = 60) {
  uint8_t u0[16], u2[16], u5[16];
  sim_uuid(0, u0);
  sim_uuid(2, u2);
  sim_uuid(5, u5);
  ops_start(NULL, two_devs);
  cr_assert_eq(metric_l("kvcached_g1_device_up{device=\"0\"}"), 1);
  cr_assert_eq(metric_l("kvcached_g1_device_up{device=\"2\"}"), 1);
  cr_assert_eq(metric_l("kvcached_g1_device_pool_bytes{device=\"2\"}"), 2ll << 20);
  cr_assert_eq(ops_metric("kvcached_g1_pool_bytes"), 4ll << 20);
  cr_assert_eq(ops_metric("kvcached_g1_unavailable"), 0);

  /* Device 0's worker takes what HELLO offers; device 2's asks for its own. */
  kvc *a = open_on(u0), *b = open_on(u2);
  kvc_g1 ga, gb;
  cr_assert_eq(kvc_g1_info(a, &ga), 0);
  cr_assert_eq(kvc_g1_info(b, &gb), 0);
  cr_assert(ga.available, "%s", ga.reason);
  cr_assert(gb.available, "%s", gb.reason);
  cr_assert_eq(memcmp(ga.uuid, u0, 16), 0);
  cr_assert_eq(memcmp(gb.uuid, u2, 16), 0);
  cr_assert_eq(metric_l("kvcached_g1_selects_total{result=\"pool\"}"), 1);
  cr_assert_eq(metric_l("kvcached_g1_selects_total{result=\"none\"}"), 0);
  static uint8_t ha[OPS_BLOCK], hb[OPS_BLOCK];
  cr_assert_eq(kv_dev_host_register(ga.dev, ha, sizeof ha), 0);
  cr_assert_eq(kv_dev_host_register(gb.dev, hb, sizeof hb), 0);

  ops_store(a, 1, 8);
  /* Each worker's LOAD to G1 fills its own device's pool ... */
  load_expect(b, 1, 4, KVC_G1, hb);
  load_expect(a, 5, 4, KVC_G1, ha);
  cr_assert_eq(metric_l("kvcached_tier_blocks{tier=\"g1\"}"), 8);
  /* ... one submission per device. */
  cr_assert_eq(metric_l("kvcached_g1_submissions_total{dir=\"load\"}"), 2);
  /* A block in the other device's pool is answered from G2, bytes intact. */
  load_expect(a, 1, 4, KVC_G2, ha);
  load_expect(b, 5, 4, KVC_G2, hb);
  /* and again from its own pool without a copy. */
  load_expect(b, 1, 4, KVC_G1, hb);
  cr_assert_eq(metric_l("kvcached_g1_copies_total{dir=\"load\"}"), 8);

  /* A worker on a device without a pool: G2, and the reason names the
   * devices that have one. */
  kvc *c = open_on(u5);
  kvc_g1 gc;
  cr_assert_eq(kvc_g1_info(c, &gc), 0);
  cr_assert_eq(gc.available, 0);
  char us[KV_DEV_UUID_STR];
  cr_assert(strstr(gc.reason, "no G1 pool on this worker's device"), "%s", gc.reason);
  cr_assert(strstr(gc.reason, kv_dev_uuid_str(u5, us)), "%s", gc.reason);
  cr_assert(strstr(gc.reason, kv_dev_uuid_str(u2, us)), "%s", gc.reason);
  cr_assert_eq(metric_l("kvcached_g1_selects_total{result=\"none\"}"), 1);
  kvc_key k = KC(1);
  kvc_block out;
  cr_assert_eq(kvc_load(c, KVC_G2, &k, 1, &out), 1);
  cr_assert(all_bytes(out.ptr, OPS_BLOCK, 1));
  cr_assert_eq(kvc_release(c, &k, 1, NULL), 1);

  cr_assert_eq(kv_dev_host_unregister(ga.dev, ha), 0);
  cr_assert_eq(kv_dev_host_unregister(gb.dev, hb), 0);
  kvc_close(c);
  kvc_close(b);
  kvc_close(a);
  ops_stop();
}

/* Sends m on s and reads the reply into *r (its frame in *f). */
static void raw_call(int s, kv_reader *rd, kv_msg *m, kv_frame *f, kv_msg *r) {
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, m), 0);
  struct iovec iov = {b.p, b.len};
  cr_assert_eq(kv_sock_send_frame(s, &iov, 1, -1, 5000), 0);
  kv_buf_free(&b);
  cr_assert_eq(kv_reader_recv(rd, s, f, 5000), 1);
  cr_assert_eq(kv_msg_decode(f->p, f->len, r), 0);
  cr_assert_eq(r->id, m->id);
}

static kv_msg select_msg(uint64_t id, const uint8_t uuid[16]) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_G1_SELECT;
  m.id = id;
  memcpy(m.g1_select.uuid, uuid, 16);
  return m;
}

static kv_msg load_none_to_g1(uint64_t id) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_LOAD;
  m.id = id;
  m.batch.tier = KV_G1;
  return m;
}

/* The bytes of G1_SELECT: a pool's entry and its fd (the frame's only
 * one); none, with the reason, and the session then has no G1; refused once
 * the session has loaded to G1; without a session, refused too. */
Test(g1, raw_g1_select, .timeout = 60) {
  uint8_t u2[16], u7[16];
  sim_uuid(2, u2);
  sim_uuid(7, u7);
  ops_start(NULL, two_devs);
  kv_msg r, m;
  kv_frame f, f2;
  kv_reader rd;
  int s;

  /* Before HELLO. */
  s = kv_sock_connect(ops_d.sock, 0);
  cr_assert_geq(s, 0);
  kv_reader_init(&rd, 0);
  m = select_msg(1, u2);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_ERROR);
  cr_assert_eq(r.status, KV_ENOSESSION);
  kv_reader_free(&rd);
  close(s);

  raw_hello(KV_CAP_G1, &r, &f, &rd, &s);
  close(f.fd);
  close(f.fd2);
  m = select_msg(2, u2);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_G1_SELECT);
  cr_assert_eq(r.flags & (KV_F_FD | KV_F_FD2), KV_F_FD);
  cr_assert_eq(r.g1_pool.tier, KV_G1);
  cr_assert_eq(r.g1_pool.kind, KV_TI_G1_SIM_FD);
  kv_dev_export x;
  cr_assert_eq(kv_dev_export_decode(r.g1_pool.p, r.g1_pool.len, &x), 0);
  cr_assert_eq(memcmp(x.uuid, u2, 16), 0, "device 2's pool");
  cr_assert(f2.fd >= 0 && f2.fd2 < 0);
  struct stat st;
  cr_assert_eq(fstat(f2.fd, &st), 0);
  cr_assert_eq((uint64_t)st.st_size, x.bytes, "the fd is that pool");
  close(f2.fd);
  /* A device without a pool: none, and the reason. */
  m = select_msg(3, u7);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_G1_SELECT);
  cr_assert_eq(r.flags & KV_F_FD, 0);
  cr_assert_eq(f2.fd, -1);
  cr_assert_eq(r.g1_pool.kind, KV_TI_G1_NONE);
  char us[KV_DEV_UUID_STR], text[1100];
  snprintf(text, sizeof text, "%.*s", (int)r.g1_pool.len, (const char *)r.g1_pool.p);
  cr_assert(strstr(text, kv_dev_uuid_str(u7, us)), "%s", text);
  /* ... so a LOAD to G1 on this session is refused. */
  m = load_none_to_g1(4);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_ERROR);
  cr_assert_eq(r.status, -ENODEV);
  /* Back to device 2, load to G1; then no more changing devices. */
  m = select_msg(5, u2);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.g1_pool.kind, KV_TI_G1_SIM_FD);
  close(f2.fd);
  m = load_none_to_g1(6);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_LOAD);
  m = select_msg(7, u2);
  raw_call(s, &rd, &m, &f2, &r);
  cr_assert_eq(r.op, KV_OP_ERROR);
  cr_assert_eq(r.status, KV_EBADSTATE);
  cr_assert_eq(f2.fd, -1);
  kv_reader_free(&rd);
  close(s);
  ops_stop();
}

/* A device of the list that cannot be had: with auto the others serve
 * and the metrics say which is missing; with on the daemon does not start. */
Test(g1, a_missing_device_of_the_list, .timeout = 60) {
  static const char *const autoc[] = {"g1.enable=auto", "g1.backend=sim", "g1.capacity=2M",
                                      "g1.device=1,9", NULL};
  ops_start(NULL, autoc);
  cr_assert_eq(ops_metric("kvcached_g1_enabled"), 1);
  cr_assert_eq(ops_metric("kvcached_g1_unavailable"), 1);
  cr_assert_eq(metric_l("kvcached_g1_device_up{device=\"1\"}"), 1);
  cr_assert_eq(metric_l("kvcached_g1_device_up{device=\"9\"}"), 0);
  cr_assert_eq(metric_l("kvcached_g1_device_pool_bytes{device=\"9\"}"), 0);
  cr_assert_eq(ops_metric("kvcached_g1_pool_bytes"), 2ll << 20);
  kvc *c = open_g1(0); /* no preference: the first pool, device 1's */
  kvc_g1 g;
  uint8_t u1[16];
  sim_uuid(1, u1);
  cr_assert_eq(kvc_g1_info(c, &g), 0);
  cr_assert(g.available, "%s", g.reason);
  cr_assert_eq(memcmp(g.uuid, u1, 16), 0);
  kvc_close(c);
  ops_stop();

  static const char *const on[] = {"g1.enable=on", "g1.backend=sim", "g1.capacity=2M",
                                   "g1.device=1,9", NULL};
  cr_assert_neq(ops_try_start(NULL, on), 0, "g1.enable = on with device 9 missing started");
}
