/* test_daemon_g3.c - the real kvcached with its SSD tier in trouble (item
 * 10 of issue 16): a G3 that cannot be opened at start (a path that is a
 * file, a file too large for its filesystem, an immutable directory) used
 * to make the daemon exit; it runs on G2 alone now, with the reason in
 * /health and the metrics, and G3 comes up by itself once the cause is
 * gone. A G3 that ran out of space (a file size limit put on the running
 * daemon) used to stay full for good; it comes back by itself. A removed G3
 * directory used to go unnoticed; it shows in /health. */
#include <dirent.h>
#include <math.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "base/half.h"
#include "base/le.h"
#include "tests/lib/fixture.h"
#include "tests/lib/tmpdir.h"
#include "tiers/quant.h"

static char resp[1 << 20];
static char g3dir[128], setpath[160];

/* GET /health: its status; the reasons joined in `out`. */
static int health(char *out, size_t n) {
  const char *body;
  int st = ops_req(ops_d.stats, "GET", "/health", resp, sizeof resp, &body);
  snprintf(out, n, "%s", body);
  return st;
}

/* Polls /health until its body contains `needle` (NULL: until 200). The
 * bound only stops a broken daemon from hanging the test. */
static int wait_health(const char *needle, char *out, size_t n) {
  for (int i = 0; i < 400; i++) {
    int st = health(out, n);
    if (needle ? strstr(out, needle) != NULL : st == 200) return st;
    usleep(50000);
  }
  return -1;
}

static char g3root[64];

/* Starts kvcached (threads backend, 64 KiB slots, retries every 100 ms,
 * plus `more`) with G3 in g3root/name; prepare (may be NULL) runs first,
 * with g3dir set. Returns ops_try_start's result. */
static int start_with_g3(const char *name, void (*prepare)(void), const char *const *more) {
  snprintf(g3root, sizeof g3root, "/tmp/kvg3-daemon-XXXXXX");
  cr_assert_not_null(mkdtemp(g3root));
  snprintf(g3dir, sizeof g3dir, "%s/%s", g3root, name);
  snprintf(setpath, sizeof setpath, "g3.path=%s", g3dir);
  if (prepare) prepare();
  const char *extra[16] = {setpath, "g3.block_bytes=64K", "g3.backend=threads", "g3.retry_ms=100",
                           "g3.capacity=8M"};
  int n = 5;
  for (int i = 0; more && more[i] && n < 15; i++) extra[n++] = more[i];
  extra[n] = NULL;
  return ops_try_start(NULL, extra);
}

/* Clears the immutable flag of path, if it can. */
static void mutable_again(const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return;
  int fl = 0;
  if (ioctl(fd, FS_IOC_GETFLAGS, &fl) == 0 && (fl & FS_IMMUTABLE_FL)) {
    fl &= ~FS_IMMUTABLE_FL;
    ioctl(fd, FS_IOC_SETFLAGS, &fl);
  }
  close(fd);
}

/* Sets the immutable flag of path: 0, or the errno (the filesystem or the
 * process's capabilities refuse it). */
static int make_immutable(const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return errno;
  int fl = 0, rc = 0;
  if (ioctl(fd, FS_IOC_GETFLAGS, &fl) < 0) rc = errno;
  fl |= FS_IMMUTABLE_FL;
  if (!rc && ioctl(fd, FS_IOC_SETFLAGS, &fl) < 0) rc = errno;
  close(fd);
  return rc;
}

static void fini(void) {
  ops_stop();
  if (g3root[0]) {
    mutable_again(g3dir);
    kvt_rmtree(g3root);
  }
}

static void rm_tree(const char *p) { cr_assert_eq(kvt_rmtree(p), 0); }

/* The worker still works on G2. */
static void g2_serves(void) {
  kvc *c = ops_open("t1");
  ops_store(c, 1001, 1003);
  cr_assert_eq(ops_resident(c, 1001, 1003), 3);
  kvc_close(c);
}

/* How many entries named kvg3-* dir holds. */
static int g3_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, "kvg3-", 5);
  closedir(d);
  return n;
}

TestSuite(daemon_g3, .fini = fini, .timeout = 90);

/* ---- G3 unavailable at start ------------------------------------------------------ */

static void path_is_a_file(void) {
  int fd = open(g3dir, O_CREAT | O_WRONLY, 0644);
  cr_assert_geq(fd, 0);
  close(fd);
}

static const char *g3_state_of_stats(json_t *s) {
  return json_string_value(
      json_object_get(json_object_get(json_object_get(s, "tiers"), "g3"), "state"));
}

Test(daemon_g3, g3_path_that_is_a_file_runs_on_g2_alone) {
  int rc = start_with_g3("notadir", path_is_a_file, NULL);
  cr_assert_eq(rc, 0, "kvcached exited (%d) instead of running on G2 alone", rc);
  char h[4096];
  cr_assert_eq(health(h, sizeof h), 503, "%s", h);
  cr_assert(strstr(h, "g3 unavailable: "), "%s", h);
  cr_assert(strstr(h, "Not a directory"), "%s", h);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"unavailable\"}"), 1);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"off\"}"), 0);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"bad_path\"}"), 1);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"none\"}"), 0);
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_str_eq(g3_state_of_stats(s), "unavailable");
  json_decref(s);
  g2_serves();
}

/* Larger than the free space (and than ext4's largest file, so that a
 * build without the free-space check fails at once, not by filling the
 * disk): refused up front, no file left behind. */
Test(daemon_g3, g3_too_large_for_its_filesystem_runs_on_g2_alone_and_leaves_no_file) {
  struct statvfs vs;
  cr_assert_eq(statvfs("/tmp", &vs), 0);
  unsigned long long cap = 2ull * vs.f_bavail * vs.f_frsize + (1ull << 30);
  if (cap < (64ull << 40)) cap = 64ull << 40;
  char opt[64];
  snprintf(opt, sizeof opt, "g3.capacity=%llu", cap);
  const char *more[] = {opt, NULL};
  int rc = start_with_g3("big", NULL, more);
  cr_assert_eq(rc, 0, "kvcached exited (%d) instead of running on G2 alone", rc);
  char h[4096];
  cr_assert_eq(health(h, sizeof h), 503, "%s", h);
  cr_assert(strstr(h, "free on its filesystem"), "%s", h);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"no_space\"}"), 1);
  cr_assert_eq(g3_files(g3dir), 0, "a partial store file was left in %s", g3dir);
  g2_serves();
}

static int immutable_rc;
static void immutable_dir(void) {
  cr_assert_eq(mkdir(g3dir, 0750), 0);
  immutable_rc = make_immutable(g3dir);
}

/* An immutable directory (EPERM, as a read-only one would be EACCES for a
 * daemon not running as root); fixed while the daemon runs, G3 comes up by
 * itself and takes demotions. */
Test(daemon_g3, immutable_g3_directory_runs_on_g2_alone_until_fixed) {
  int rc = start_with_g3("frozen", immutable_dir, NULL);
  if (immutable_rc)
    cr_skip_test("cannot make a directory immutable here: %s", strerror(immutable_rc));
  cr_assert_eq(rc, 0, "kvcached exited (%d) instead of running on G2 alone", rc);
  char h[4096];
  cr_assert_eq(health(h, sizeof h), 503, "%s", h);
  cr_assert(strstr(h, "g3 unavailable: "), "%s", h);
  cr_assert(strstr(h, "Operation not permitted"), "%s", h);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"permission\"}"), 1);
  cr_assert_eq(g3_files(g3dir), 0);
  g2_serves();
  mutable_again(g3dir);
  cr_assert_eq(wait_health(NULL, h, sizeof h), 200, "G3 did not come up: %s", h);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"ok\"}"), 1);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"none\"}"), 1);
  kvc *c = ops_open("t1");
  ops_store(c, 10, 13);
  json_t *o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  json_decref(o);
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_str_eq(g3_state_of_stats(s), "ok");
  long long blocks = 0;
  for (int i = 0; i < 200 && blocks < 4; i++) { /* demotions complete */
    json_decref(s);
    usleep(20000);
    s = ops_json(ops_d.stats, "GET", "/stats", 200);
    blocks = ops_num(s, "tiers.g3.blocks");
  }
  json_decref(s);
  cr_assert_geq(blocks, 4, "G3 took %lld demotions", blocks);
  cr_assert_eq(ops_resident(c, 10, 13), 4);
  kvc_close(c);
}

/* ---- G3 in trouble at run time ------------------------------------------------------ */

/* Stores first..last and demotes everything G2 holds; returns how many the
 * eviction took. */
static long long store_and_demote(kvc *c, uint64_t first, uint64_t last) {
  ops_store(c, first, last);
  json_t *o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  long long n = ops_num(o, "evicted");
  json_decref(o);
  return n;
}

/* Loads key v (to G2) and checks its bytes (ops_store fills with v). */
static int load_ok(kvc *c, uint64_t v) {
  kvc_key k = KC(v);
  kvc_block out;
  int n = kvc_load(c, KVC_G2, &k, 1, &out);
  if (n != 1) return n < 0 ? n : out.status ? out.status : -1;
  int ok = out.status == 0 && out.length == OPS_BLOCK;
  for (uint32_t i = 0; ok && i < OPS_BLOCK; i++) ok = ((uint8_t *)out.ptr)[i] == (uint8_t)v;
  kvc_release(c, &k, 1, NULL);
  return ok ? 0 : -2;
}

/* The filesystem refuses space under the running daemon (a file size
 * limit put on it from outside: EFBIG, as a full disk gives ENOSPC). G3
 * turns full, says so, and - once the limit is gone - comes back by itself
 * (it used to stay full until a restart; and SIGXFSZ killed the daemon). */
Test(daemon_g3, full_g3_comes_back_by_itself_when_space_returns) {
  cr_assert_eq(start_with_g3("ssd", NULL, NULL), 0);
  kvc *c = ops_open("t1");
  cr_assert_geq(store_and_demote(c, 1, 4), 4);
  /* Their writes complete before the trouble starts: a write still in
   * flight when the limit comes fails, and its block is gone. */
  for (uint64_t k = 1; k <= 4; k++) {
    uint8_t t = KVC_TIER_NONE;
    for (int i = 0; i < 250 && t != KVC_G3; i++) {
      kvc_key key = KC(k);
      kvc_lookup(c, &key, 1, &t);
      if (t != KVC_G3) usleep(20000);
    }
    cr_assert_eq(t, KVC_G3, "block %llu not in G3 yet", (unsigned long long)k);
  }
  char h[4096];
  cr_assert_eq(wait_health(NULL, h, sizeof h), 200, "%s", h);
  /* Below the data area (which starts at 1 MiB): every block write fails. */
  struct rlimit lim = {1u << 20, RLIM_INFINITY};
  cr_assert_eq(prlimit(ops_d.pid, RLIMIT_FSIZE, &lim, NULL), 0, "prlimit: %s", strerror(errno));
  store_and_demote(c, 100, 107);
  cr_assert_eq(wait_health("g3 full", h, sizeof h), 503, "%s", h);
  cr_assert(strstr(h, "File too large"), "%s", h);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"full\"}"), 1);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"no_space\"}"), 1);
  /* Still full after more tries: it stays full (probes fail quietly). */
  usleep(300000);
  store_and_demote(c, 200, 203);
  cr_assert_eq(health(h, sizeof h), 503, "%s", h);
  /* Space is back: demotions go on until a probe gets through. */
  lim.rlim_cur = RLIM_INFINITY;
  cr_assert_eq(prlimit(ops_d.pid, RLIMIT_FSIZE, &lim, NULL), 0);
  int st = 0;
  uint64_t v = 300;
  /* The probes' blocks go again, so however many rounds a slow machine
   * takes, they never push the blocks from before the trouble out of the
   * small store (8 MiB: about 100 blocks). */
  for (int i = 0; i < 200 && st != 200; i++, v += 2) {
    store_and_demote(c, v, v + 1);
    usleep(50000);
    st = health(h, sizeof h);
    kvc_key probes[2] = {KC(v), KC(v + 1)};
    kvc_delete(c, probes, 2);
  }
  cr_assert_eq(st, 200, "G3 did not come back: %s", h);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"ok\"}"), 1);
  /* New demotions land and load back intact. */
  uint64_t first = v;
  store_and_demote(c, first, first + 3);
  for (uint64_t k = first; k <= first + 3; k++) {
    int rc = 1;
    for (int i = 0; i < 100 && rc; i++) { /* its demotion may still be in flight */
      kvc_key key = KC(k);
      uint8_t t = KVC_TIER_NONE;
      kvc_lookup(c, &key, 1, &t);
      if (t == KVC_G3) rc = load_ok(c, k);
      else usleep(20000);
    }
    cr_assert_eq(rc, 0, "block %llu: %d", (unsigned long long)k, rc);
  }
  int rc1 = load_ok(c, 1);
  cr_assert_eq(rc1, 0, "a block from before the trouble: %d", rc1);
  kvc_close(c);
}

/* The G3 directory removed while the daemon runs: health says so. */
Test(daemon_g3, removed_g3_directory_shows_in_health) {
  cr_assert_eq(start_with_g3("ssd", NULL, NULL), 0);
  kvc *c = ops_open("t1");
  store_and_demote(c, 1, 4);
  char h[4096];
  cr_assert_eq(health(h, sizeof h), 200, "%s", h);
  rm_tree(g3dir);
  cr_assert_eq(wait_health("store file removed", h, sizeof h), 503, "%s", h);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"degraded\"}"), 1);
  cr_assert_eq(ops_metric("kvcached_g3_problem{reason=\"removed\"}"), 1);
  g2_serves();
  kvc_close(c);
}

/* ---- a worker punches holes in G2 ------------------------------------------------------ */

static long long g3_blocks(void) {
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  long long n = ops_num(s, "tiers.g3.blocks");
  json_decref(s);
  return n;
}

/* Item 2 of issue 16, G3's side: a worker punched holes over the whole G2
 * memfd (MADV_REMOVE on its mapping; fallocate(PUNCH_HOLE) on the fd is
 * the same). With the arena registered as io_uring fixed buffers, the
 * registration kept the old pages: every later G3 read landed in them, the
 * arena showed fresh zero pages, verification failed and G3 dropped the
 * blocks (79 of 80). The arena is not registered any more: blocks demoted
 * before the punch load back intact and G3 keeps them. Blocks whose G2
 * bytes the punch destroyed before their demotion are written with the
 * CRC taken at commit, so their load fails verification: never zeros
 * served as valid. */
Test(daemon_g3, holes_punched_in_g2_leave_g3_reads_intact) {
  const char *more[] = {"g3.backend=uring", NULL};
  cr_assert_eq(start_with_g3("ssd", NULL, more), 0);
  char h[4096];
  if (health(h, sizeof h) != 200) cr_skip_test("no io_uring G3 here: %s", h);
  kvc *c = ops_open("t1");
  const uint64_t n = 16;
  for (uint64_t v = 1; v <= n; v += 4) store_and_demote(c, v, v + 3);
  for (int i = 0; i < 200 && g3_blocks() < (long long)n; i++) usleep(20000);
  cr_assert_eq(g3_blocks(), (long long)n, "demoted to G3");
  /* Blocks in G2 when the holes are punched. */
  ops_store(c, 101, 104);
  kvc_g2 g2;
  cr_assert_eq(kvc_g2_info(c, &g2), 0);
  cr_assert_eq(madvise(g2.base, g2.bytes, MADV_REMOVE), 0, "MADV_REMOVE: %s", strerror(errno));
  /* Before the punch, on G3: loaded back intact, one by one, kept by G3. */
  for (uint64_t v = 1; v <= n; v++)
    cr_assert_eq(load_ok(c, v), 0, "block %llu", (unsigned long long)v);
  cr_assert_eq(ops_metric("kvcached_g3_corrupt_total"), 0);
  cr_assert_eq(g3_blocks(), (long long)n, "G3 dropped blocks");
  cr_assert_eq(health(h, sizeof h), 200, "%s", h);
  /* Destroyed in G2, then demoted: their loads fail, never serve zeros. */
  json_t *o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  json_decref(o);
  for (uint64_t v = 101; v <= 104; v++) {
    int rc = -2;
    for (int i = 0; i < 100; i++) { /* its demotion may still be in flight */
      kvc_key key = KC(v);
      uint8_t t = KVC_TIER_NONE;
      kvc_lookup(c, &key, 1, &t);
      if (t != KVC_G2) break;
      usleep(20000);
    }
    rc = load_ok(c, v);
    cr_assert(rc != 0 && rc != -2, "block %llu, destroyed in G2: load answered %d",
              (unsigned long long)v, rc);
  }
  kvc_close(c);
}

/* ---- coded blocks (g3.codec = auto; tiers/G3.md, "Coded blocks") ---------------------- */

/* Stores key v with pseudo-random bytes (nothing for the codec to gain). */
static void store_random(kvc *c, uint64_t v) {
  kvc_key k = KC(v), none = {0};
  kvc_block out;
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1);
  uint64_t x = v * 0x9E3779B97F4A7C15ull + 1;
  for (uint32_t i = 0; i < OPS_BLOCK; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy((uint8_t *)out.ptr + i, &x, 8);
  }
  cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
}

/* A bf16 namespace's blocks go to G3 coded into 16 KiB slots (a quarter
 * of the block) and load back intact; a block that does not code to a
 * slot stays out of G3, counted as too large. The stored ratio shows in
 * /stats and the metrics. Without coding (g3.codec = off) no 64 KiB block
 * fits a 16 KiB slot: none would reach G3. */
Test(daemon_g3, coded_blocks_in_smaller_slots) {
  const char *more[] = {"g3.codec=auto", "g3.slot_bytes=16K", NULL};
  cr_assert_eq(start_with_g3("ssd", NULL, more), 0);
  kvc *c = ops_open("t1");
  const uint64_t n = 8;
  store_and_demote(c, 1, n);
  for (int i = 0; i < 200 && g3_blocks() < (long long)n; i++) usleep(20000);
  cr_assert_eq(g3_blocks(), (long long)n, "coded blocks in G3");
  for (uint64_t v = 1; v <= n; v++)
    cr_assert_eq(load_ok(c, v), 0, "block %llu", (unsigned long long)v);
  cr_assert_eq(ops_metric("kvcached_g3_codec_blocks_total{result=\"coded\"}"), (long long)n);
  cr_assert_geq(ops_metric("kvcached_g3_codec_blocks_total{result=\"decoded\"}"), (long long)n);
  cr_assert_eq(ops_metric("kvcached_g3_codec_bytes_total{side=\"block\"}"),
               (long long)(n * OPS_BLOCK));
  long long stored = ops_metric("kvcached_g3_codec_bytes_total{side=\"stored\"}");
  cr_assert(stored > 0 && stored < (long long)(n * OPS_BLOCK) / 4, "stored %lld", stored);
  cr_assert_eq(ops_metric("kvcached_g3_corrupt_total"), 0);
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  json_t *ratio = json_object_get(json_object_get(json_object_get(s, "g3"), "codec"), "ratio");
  cr_assert(json_number_value(ratio) > 4.0, "ratio %g", json_number_value(ratio));
  json_decref(s);
  /* Incompressible: refused by G3, counted; G2 keeps it until evicted. */
  store_random(c, 500);
  json_t *o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  json_decref(o);
  long long tl = 0;
  for (int i = 0; i < 200 && !(tl = ops_metric("kvcached_g3_too_large_total")); i++)
    usleep(20000);
  cr_assert_eq(tl, 1);
  cr_assert_eq(ops_metric("kvcached_g3_codec_blocks_total{result=\"raw\"}"), 0);
  cr_assert_eq(ops_metric("kvcached_g3_state{state=\"ok\"}"), 1);
  /* every coding timed, the refused one's too; every decoding */
  cr_assert_eq(ops_metric("kvcached_g3_codec_seconds_count{op=\"code\"}"), (long long)n + 1);
  cr_assert_geq(ops_metric("kvcached_g3_codec_seconds_count{op=\"decode\"}"), (long long)n);
  cr_assert_eq(ops_metric("kvcached_g3_codec_seconds_bucket{op=\"code\",le=\"+Inf\"}"),
               (long long)n + 1);
  kvc_close(c);
}

/* A tenant with cold_precision = int8: its bf16 blocks go to G3 as INT8
 * codes (a scale per token's head: 53% of the bytes, fitting 40 KiB
 * slots, which no raw 64 KiB block fits) and load back as those codes
 * decode to, with g3.codec off. */
Test(daemon_g3, a_tenants_cold_precision_stores_int8_in_g3) {
  snprintf(g3root, sizeof g3root, "/tmp/kvg3-daemon-XXXXXX");
  cr_assert_not_null(mkdtemp(g3root));
  snprintf(g3dir, sizeof g3dir, "%s/ssd", g3root);
  snprintf(setpath, sizeof setpath, "g3.path=%s", g3dir);
  const char *extra[] = {setpath,
                         "g3.block_bytes=64K",
                         "g3.backend=threads",
                         "g3.capacity=8M",
                         "g3.slot_bytes=40K",
                         "tenant.t1.cold_precision=int8",
                         NULL};
  cr_assert_eq(ops_try_start("t1", extra), 0);
  kvc *c = ops_open("t1");
  const uint64_t n = 4;
  uint8_t *want[4];
  for (uint64_t v = 1; v <= n; v++) {
    kvc_key k = KC(v), none = {0};
    kvc_block out;
    cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1);
    for (uint32_t i = 0; i < OPS_BLOCK / 2; i++) {
      float f = sinf((float)(i * 0.37 + v)) * (float)(1 + (i / 64) % 7);
      kv_st16((uint8_t *)out.ptr + 2 * i, kv_f32_bf16(f));
    }
    uint8_t *codes = malloc(kv_quant_size(OPS_BLOCK / 2, 64));
    want[v - 1] = malloc(OPS_BLOCK);
    cr_assert_eq(kv_quant_encode(KV_QUANT_INT8, KV_QDT_BF16, out.ptr, OPS_BLOCK / 2, 64, codes), 0);
    cr_assert_eq(kv_quant_decode(KV_QUANT_INT8, KV_QDT_BF16, codes, OPS_BLOCK / 2, 64, want[v - 1]),
                 0);
    cr_assert(memcmp(want[v - 1], out.ptr, OPS_BLOCK), "lossy: the block changes");
    free(codes);
    cr_assert_eq(kvc_commit(c, &k, 1, NULL), 1);
  }
  json_t *o = ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200);
  json_decref(o);
  for (int i = 0; i < 200 && g3_blocks() < (long long)n; i++) usleep(20000);
  cr_assert_eq(g3_blocks(), (long long)n, "int8 blocks in G3");
  cr_assert_eq(ops_metric("kvcached_g3_codec_bytes_total{side=\"stored\"}"),
               (long long)(n * kv_quant_size(OPS_BLOCK / 2, 64)));
  for (uint64_t v = 1; v <= n; v++) {
    kvc_key k = KC(v);
    kvc_block out;
    cr_assert_eq(kvc_load(c, KVC_G2, &k, 1, &out), 1, "block %llu", (unsigned long long)v);
    cr_assert_eq(out.status, 0);
    cr_assert(!memcmp(out.ptr, want[v - 1], OPS_BLOCK), "block %llu: its codes' decoding",
              (unsigned long long)v);
    kvc_release(c, &k, 1, NULL);
    free(want[v - 1]);
  }
  cr_assert_eq(ops_metric("kvcached_g3_corrupt_total"), 0);
  kvc_close(c);
}
