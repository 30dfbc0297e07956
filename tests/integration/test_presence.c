/*
 * test_presence.c - lookups from the presence table (protocol 1.5,
 * daemon/presence.h) against a running kvcached: the same answers as the
 * daemon's LOOKUP, a table no worker can write, another namespace's keys
 * never in it, a TP group and KVCACHED_LOOKUP=daemon asking the daemon, a
 * table that grows and is mapped again, a stale answer counted as a LOAD
 * miss, and processes racing lookups and loads against commits, deletes
 * and evictions without ever loading a wrong block.
 */
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "ipc/reader.h"
#include "proto/presence.h"
#include "proto/wire.h"
#include "tests/lib/fixture.h"

TestSuite(presence, .fini = ops_stop, .timeout = 120);

/* A worker of tenant on ops_d with blocks of `block` bytes, in TP group
 * `group` (NULL: none) as rank `rank` of `size`. */
static kvc *open_worker(const char *tenant, uint32_t block, const char *group, uint16_t rank,
                        uint16_t size) {
  kvc_opts o = {.socket_path = ops_d.sock,
                .tenant = tenant,
                .group = group,
                .layout = {.block_bytes = block,
                           .tokens_per_block = 16,
                           .layers = 1,
                           .kv_heads = 1,
                           .head_dim = 64,
                           .tp_rank = rank,
                           .tp_size = size,
                           .dtype = "bf16"},
                .no_g1 = 1};
  kvc *c;
  int rc = kvc_open(&o, &c);
  cr_assert_eq(rc, 0, "kvc_open: %s", kvc_strerror(rc));
  return c;
}

/* Stores KC(first..last), each block filled with its number (8 bytes
 * repeated), committed with its CRC. */
static void store(kvc *c, uint32_t block, uint64_t first, uint64_t last) {
  for (uint64_t v = first; v <= last; v++) {
    kvc_key k = KC(v), none = {0};
    kvc_block out;
    cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1, "alloc %llu",
                 (unsigned long long)v);
    for (uint32_t i = 0; i < block; i += 8) memcpy((uint8_t *)out.ptr + i, &v, 8);
    uint32_t crc = kvc_crc32c(0, out.ptr, block);
    cr_assert_eq(kvc_commit_crc(c, &k, &crc, 1, NULL), 1);
  }
}

static kvc_lookup_info info(kvc *c) {
  kvc_lookup_info i;
  cr_assert_eq(kvc_lookup_stats(c, &i), 0);
  return i;
}

/* The answers of c (from its table) and of d (the daemon) for KC(a..b). */
static void same_answer(kvc *c, kvc *d, uint64_t a, uint64_t b) {
  kvc_key k[64];
  uint32_t n = (uint32_t)(b - a + 1);
  for (uint32_t i = 0; i < n; i++) k[i] = KC(a + i);
  uint8_t t1[64], t2[64];
  int h1 = kvc_lookup(c, k, n, t1), h2 = kvc_lookup(d, k, n, t2);
  cr_assert_eq(h1, h2, "keys %llu..%llu: %d from the table, %d from the daemon",
               (unsigned long long)a, (unsigned long long)b, h1, h2);
  cr_assert_eq(memcmp(t1, t2, n), 0, "keys %llu..%llu: the tiers differ", (unsigned long long)a,
               (unsigned long long)b);
}

Test(presence, lookups_from_the_table_answer_as_the_daemon) {
  ops_start(NULL, NULL);
  kvc *c = open_worker("t", 4096, NULL, 0, 1), *d = open_worker("t", 4096, NULL, 0, 1);
  cr_assert_eq(kvc_set_lookup(d, KVC_LOOKUP_DAEMON), 0);
  kvc_lookup_info i = info(c);
  cr_assert(i.mapped, "no table: %s", i.reason);
  cr_assert_eq(i.mode, KVC_LOOKUP_AUTO);
  same_answer(c, d, 1, 8);
  store(c, 4096, 1, 10);
  same_answer(c, d, 1, 10);
  same_answer(c, d, 1, 20);
  same_answer(c, d, 5, 5);
  same_answer(c, d, 11, 12);
  kvc_key k3 = KC(3);
  cr_assert_eq(kvc_delete(d, &k3, 1), 1);
  same_answer(c, d, 1, 10);
  kvc_key k[4] = {KC(1), KC(2), KC(3), KC(4)};
  cr_assert_eq(kvc_lookup(c, k, 4, NULL), 2, "a delete is seen at once");
  i = info(c);
  cr_assert_eq(i.daemon, 0, "every lookup of c was answered from its table");
  cr_assert_geq(i.local, 7);
  cr_assert_eq(info(d).local, 0, "KVC_LOOKUP_DAEMON asks the daemon");
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 1);
  cr_assert_gt(ops_metric("kvcached_presence_bytes"), 0);
  cr_assert_geq(ops_metric("kvcached_presence_updates_total"), 11, "ten commits and a delete");
  cr_assert_eq(ops_stat("presence.namespaces"), 1);
  kvc_close(c);
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 1, "d's session still open");
  kvc_close(d);
  /* the last session gone, the table goes (the close is seen on the loop) */
  for (int w = 0; w < 200 && ops_metric("kvcached_presence_namespaces") != 0; w++) usleep(10000);
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 0);
  cr_assert_eq(ops_metric("kvcached_presence_bytes"), 0);
}

/* PRESENCE on a raw connection of tenant "t": the table's fd. */
static int raw_table(uint64_t *bytes) {
  int s = ops_raw_worker(ops_d.sock, "t");
  kv_msg m = {.op = KV_OP_PRESENCE, .id = 7};
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, &m), 0);
  struct iovec iov = {b.p, b.len};
  cr_assert_eq(kv_sock_send_frame(s, &iov, 1, -1, 3000), 0);
  kv_buf_free(&b);
  kv_reader rd;
  kv_reader_init(&rd, 0);
  kv_frame f;
  cr_assert_gt(kv_reader_recv(&rd, s, &f, 3000), 0);
  kv_msg r;
  cr_assert_eq(kv_msg_decode(f.p, f.len, &r), 0);
  cr_assert_eq(r.op, KV_OP_PRESENCE, "the daemon answered %s", kv_op_name(r.op));
  cr_assert_geq(f.fd, 0, "a table's fd");
  *bytes = r.presence_rep.bytes;
  int fd = f.fd;
  kv_reader_free(&rd);
  close(s);
  return fd;
}

Test(presence, no_worker_can_write_the_table) {
  ops_start(NULL, NULL);
  kvc *c = ops_open("t");
  ops_store(c, 1, 3);
  uint64_t n;
  int fd = raw_table(&n);
  errno = 0;
  cr_assert_eq(mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  cr_assert_eq(errno, EPERM, "a writable shared mapping: %s", strerror(errno));
  char z[8] = {0};
  cr_assert_eq(pwrite(fd, z, sizeof z, 0), -1);
  cr_assert_eq(errno, EPERM, "write(2): %s", strerror(errno));
  cr_assert_eq(ftruncate(fd, 0), -1, "shrinking it");
  cr_assert_eq(ftruncate(fd, (off_t)n * 2), -1, "growing it");
  cr_assert_eq(fcntl(fd, F_ADD_SEALS, 0), -1, "the seals are sealed");
  void *ro = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
  cr_assert_neq(ro, MAP_FAILED, "a read-only mapping works");
  cr_assert_eq(mprotect(ro, n, PROT_READ | PROT_WRITE), -1, "nor can it be made writable");
  kv_pres t;
  cr_assert_eq(kv_pres_attach(&t, ro, n), 0);
  cr_assert_eq(kv_pres_count(&t), 3, "it holds the three blocks");
  /* a new description of the same file is no way around the seal */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int fd2 = open(path, O_RDWR);
  if (fd2 >= 0) {
    cr_assert_eq(mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0), MAP_FAILED);
    close(fd2);
  }
  munmap(ro, n);
  close(fd);
  kvc_close(c);
}

Test(presence, another_namespace_is_never_in_the_table) {
  ops_start("a,b", NULL);
  kvc *a = open_worker("a", 4096, NULL, 0, 1), *b = open_worker("b", 4096, NULL, 0, 1);
  kvc *a2 = open_worker("a", 8192, NULL, 0, 1); /* a's other layout: another namespace */
  store(a, 4096, 1, 5);
  kvc_key k[5] = {KC(1), KC(2), KC(3), KC(4), KC(5)};
  cr_assert_eq(kvc_lookup(a, k, 5, NULL), 5);
  cr_assert_eq(kvc_lookup(b, k, 5, NULL), 0, "tenant b's table has none of a's keys");
  cr_assert_eq(kvc_lookup(a2, k, 5, NULL), 0, "nor has a's other namespace's");
  cr_assert(info(b).local >= 1 && info(a2).local >= 1, "both answered from their own tables");
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 3);
  kvc_close(a);
  kvc_close(a2);
  kvc_close(b);
}

Test(presence, a_tp_group_and_kvcached_lookup_daemon_ask_the_daemon) {
  ops_start(NULL, NULL);
  kvc *r0 = open_worker("t", 4096, "g", 0, 2), *r1 = open_worker("t", 4096, "g", 1, 2);
  kvc_lookup_info i = info(r0);
  cr_assert_not(i.mapped, "a TP group's rank maps no table");
  cr_assert(strstr(i.reason, "PRESENCE"), "why: %s", i.reason);
  store(r0, 4096, 1, 4);
  store(r1, 4096, 1, 2);
  kvc_key k[4] = {KC(1), KC(2), KC(3), KC(4)};
  cr_assert_eq(kvc_lookup(r0, k, 4, NULL), 2, "the length every rank has");
  cr_assert_eq(info(r0).daemon, 1);
  /* a namespace that joins a group later: its table is retired, its
   * worker asks the daemon from then on */
  kvc *n0 = open_worker("v", 4096, NULL, 0, 2);
  store(n0, 4096, 1, 3);
  cr_assert_eq(kvc_lookup(n0, k, 3, NULL), 3);
  cr_assert_eq(info(n0).local, 1);
  kvc *n1 = open_worker("v", 4096, "g", 1, 2), *j = open_worker("v", 4096, "g", 0, 2);
  store(n1, 4096, 1, 1);
  cr_assert_eq(kvc_lookup(n0, k, 3, NULL), 1, "rank 0 joined 'g'");
  cr_assert_eq(info(n0).local, 1, "that answer came from the daemon");
  cr_assert_eq(setenv("KVCACHED_LOOKUP", "daemon", 1), 0);
  kvc *e = open_worker("t", 4096, NULL, 0, 1);
  unsetenv("KVCACHED_LOOKUP");
  i = info(e);
  cr_assert_not(i.mapped);
  cr_assert_eq(i.mode, KVC_LOOKUP_DAEMON);
  cr_assert_eq(kvc_lookup(e, k, 4, NULL), 0);
  cr_assert_eq(info(e).daemon, 1);
  cr_assert_eq(kvc_set_lookup(e, KVC_LOOKUP_AUTO), 0);
  cr_assert(info(e).mapped, "asked for again");
  kvc *list[] = {r0, r1, n0, n1, j, e};
  for (int x = 0; x < 6; x++) kvc_close(list[x]);
}

Test(presence, a_table_that_grows_is_mapped_again) {
  static const char *const sets[] = {"g2.capacity=16M", NULL};
  ops_start(NULL, sets);
  kvc *c = open_worker("t", 4096, NULL, 0, 1), *d = open_worker("t", 4096, NULL, 0, 1);
  cr_assert_eq(kvc_set_lookup(d, KVC_LOOKUP_DAEMON), 0);
  uint64_t b0 = info(c).bytes;
  store(c, 4096, 1, 1500);
  for (uint64_t a = 1; a <= 1500; a += 50) same_answer(c, d, a, a + 63);
  kvc_lookup_info i = info(c);
  cr_assert_gt(ops_metric("kvcached_presence_tables_total{event=\"grown\"}"), 0);
  cr_assert_gt(i.bytes, b0, "a larger table is mapped");
  cr_assert_geq(i.maps, 2);
  cr_assert_geq(i.retired, 1, "an answer from the retired table was not given");
  cr_assert_eq(i.daemon, 0);
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 1);
  kvc_close(c);
  kvc_close(d);
}

Test(presence, a_stale_answer_is_a_counted_load_miss) {
  ops_start(NULL, NULL);
  kvc *c = open_worker("t", 4096, NULL, 0, 1), *d = open_worker("t", 4096, NULL, 0, 1);
  store(c, 4096, 1, 4);
  kvc_key k[4] = {KC(1), KC(2), KC(3), KC(4)};
  cr_assert_eq(kvc_lookup(c, k, 4, NULL), 4);
  cr_assert_eq(kvc_delete(d, &k[1], 1), 1, "gone after c's answer");
  kvc_block out[4];
  cr_assert_eq(kvc_load(c, KVC_G2, k, 4, out), 3);
  cr_assert_eq(out[1].status, KV_ENOTFOUND, "the stale 'present' is a miss");
  cr_assert_eq(ops_metric("kvcached_presence_contradicted_total"), 1);
  cr_assert_eq(kvc_release(c, k, 4, NULL), 3);
  /* a load after a daemon's answer is not counted */
  cr_assert_eq(kvc_set_lookup(c, KVC_LOOKUP_DAEMON), 0);
  cr_assert_eq(kvc_lookup(c, k, 4, NULL), 1);
  cr_assert_eq(kvc_load(c, KVC_G2, k, 4, out), 3);
  cr_assert_eq(ops_metric("kvcached_presence_contradicted_total"), 1);
  kvc_close(c);
  kvc_close(d);
}

/* --- processes racing ------------------------------------------------------ */

#define POOL  96 /* keys; G2 holds fewer (2 MiB of 64 KiB blocks): commits evict */
#define BLOCK 65536u

static void race_writer(int seed, uint64_t *shared) {
  kvc *c = open_worker("t", BLOCK, NULL, 0, 1);
  uint64_t s = (uint64_t)seed * 7919 + 1;
  for (int i = 0; i < 4000; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t v = 1 + (s >> 33) % POOL;
    kvc_key k = KC(v), none = {0};
    if ((s >> 20) % 5 == 0) {
      kvc_delete(c, &k, 1);
      continue;
    }
    kvc_block out;
    if (kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out) != 1) continue; /* exists, or no room */
    for (uint32_t j = 0; j < BLOCK; j += 8) memcpy((uint8_t *)out.ptr + j, &v, 8);
    uint32_t crc = kvc_crc32c(0, out.ptr, BLOCK);
    kvc_commit_crc(c, &k, &crc, 1, NULL);
  }
  kvc_close(c);
  __atomic_fetch_add(&shared[2], 1, __ATOMIC_RELEASE); /* a writer done */
}

/* Looks up runs of the pool, loads what the table said was there, and
 * checks every block it got, until both writers are done: exit 1 for a
 * wrong block, 2 for no local answer, 0 otherwise. */
static void race_reader(int seed, uint64_t *shared) {
  kvc *c = open_worker("t", BLOCK, NULL, 0, 1);
  uint8_t *buf = malloc(BLOCK);
  uint64_t s = (uint64_t)seed * 104729 + 3, loaded = 0, wrong = 0;
  for (int i = 0; i < 3000 || __atomic_load_n(&shared[2], __ATOMIC_ACQUIRE) < 2; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t a = 1 + (s >> 33) % POOL;
    kvc_key k[4];
    uint32_t n = 0;
    for (; n < 4 && a + n <= POOL; n++) k[n] = KC(a + n);
    int hit = kvc_lookup(c, k, n, NULL);
    if (hit <= 0) continue;
    kvc_block out[4];
    kvc_load(c, KVC_G2, k, (uint32_t)hit, out);
    for (int j = 0; j < hit; j++) {
      if (out[j].status != 0) continue;
      if (kvc_read(c, &k[j], &out[j], buf) != 0) continue; /* failed its CRC: not data */
      uint64_t want = a + (uint64_t)j, got;
      memcpy(&got, buf, 8);
      wrong += got != want || memcmp(buf, buf + 8, BLOCK - 8) != 0;
      loaded++;
    }
    kvc_release(c, k, (uint32_t)hit, NULL);
  }
  kvc_lookup_info in;
  kvc_lookup_stats(c, &in);
  __atomic_fetch_add(&shared[0], loaded, __ATOMIC_RELAXED);
  __atomic_fetch_add(&shared[1], in.local, __ATOMIC_RELAXED);
  kvc_close(c);
  _exit(wrong ? 1 : in.local ? 0 : 2);
}

Test(presence, racing_processes_never_load_a_wrong_block) {
  ops_start(NULL, NULL);
  uint64_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(shared, MAP_FAILED);
  pid_t kids[4];
  for (int i = 0; i < 4; i++) {
    kids[i] = fork();
    cr_assert_geq(kids[i], 0);
    if (kids[i] == 0) {
      if (i < 2) race_writer(i, shared);
      else race_reader(i, shared);
      _exit(0);
    }
  }
  for (int i = 0; i < 4; i++) {
    int st;
    cr_assert_eq(waitpid(kids[i], &st, 0), kids[i]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "process %d: status %d (1: a wrong block, 2: no local answer)", i,
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  long long evicted = ops_metric("kvcached_evictions_total{tier=\"g2\"}");
  cr_log_info("%llu blocks loaded and checked, %llu local lookups, %lld contradicted, %lld "
              "evictions", (unsigned long long)shared[0], (unsigned long long)shared[1],
              ops_metric("kvcached_presence_contradicted_total"), evicted);
  cr_assert_gt(shared[0], 100, "the readers loaded blocks");
  cr_assert_gt(evicted, 0, "commits evicted blocks while they were looked up");
  munmap(shared, 4096);
}

/* --- a daemon before 1.5 ---------------------------------------------------- */

/* Relays frames between a worker (w) and the daemon (d), its HELLO asking
 * for protocol 1.4 at most: the daemon then speaks 1.4, as an older daemon
 * would. Returns when either side closes. */
static void relay_as_1_4(int w, int d) {
  kv_reader rw, rd;
  kv_reader_init(&rw, 0);
  kv_reader_init(&rd, 0);
  struct pollfd p[2] = {{.fd = w, .events = POLLIN}, {.fd = d, .events = POLLIN}};
  for (;;) {
    if (poll(p, 2, 5000) <= 0) return;
    for (int i = 0; i < 2; i++) {
      if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
      kv_frame f;
      if (kv_reader_recv(i ? &rd : &rw, p[i].fd, &f, 1000) <= 0) return;
      kv_buf b;
      kv_buf_init(&b);
      kv_msg m;
      const void *bytes = f.p;
      size_t n = f.len;
      if (!i && kv_msg_decode(f.p, f.len, &m) == 0 && m.op == KV_OP_HELLO) {
        m.hello.ver_minor = 4;
        if (kv_msg_encode(&b, &m)) return;
        bytes = b.p;
        n = b.len;
      }
      int fds[2] = {f.fd, f.fd2};
      unsigned nfds = (f.fd >= 0) + (f.fd2 >= 0);
      struct iovec iov = {(void *)bytes, n};
      if (kv_sock_send_frame_fds(i ? w : d, &iov, 1, fds, nfds, 3000)) return;
      if (f.fd >= 0) close(f.fd);
      if (f.fd2 >= 0) close(f.fd2);
      kv_buf_free(&b);
    }
  }
}

Test(presence, a_daemon_before_1_5_is_asked) {
  ops_start(NULL, NULL);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(ops_d.dir) + 9, sizeof a.sun_path);
  snprintf(a.sun_path, sizeof a.sun_path, "%.96s/old.sock", ops_d.dir);
  const char *path = a.sun_path;
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  cr_assert_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(l, 4), 0);
  pid_t kid = fork();
  cr_assert_geq(kid, 0);
  if (kid == 0) {
    int w = accept(l, NULL, NULL), d = kv_sock_connect(ops_d.sock, 0);
    if (w >= 0 && d >= 0) relay_as_1_4(w, d);
    _exit(0);
  }
  close(l);
  kvc_opts o = {.socket_path = path,
                .tenant = "t",
                .layout = {.block_bytes = 4096, .tokens_per_block = 16, .layers = 1,
                           .kv_heads = 1, .head_dim = 64, .tp_rank = 0, .tp_size = 1,
                           .dtype = "bf16"},
                .no_g1 = 1};
  kvc *c;
  cr_assert_eq(kvc_open(&o, &c), 0);
  kvc_lookup_info i = info(c);
  cr_assert_not(i.mapped);
  cr_assert(strstr(i.reason, "1.4"), "why: %s", i.reason);
  store(c, 4096, 1, 3);
  kvc_key k[4] = {KC(1), KC(2), KC(3), KC(4)};
  uint8_t t[4];
  cr_assert_eq(kvc_lookup(c, k, 4, t), 3, "the daemon's answer");
  cr_assert_eq(t[3], KVC_TIER_NONE);
  kvc_block out[3];
  cr_assert_eq(kvc_load(c, KVC_G2, k, 3, out), 3, "no KV_LOAD_LOCAL, which 1.4 refuses");
  cr_assert_eq(kvc_release(c, k, 3, NULL), 3);
  i = info(c);
  cr_assert(i.daemon == 1 && i.local == 0);
  cr_assert_eq(ops_metric("kvcached_presence_namespaces"), 0, "no table was asked for");
  kvc_close(c);
  int st;
  waitpid(kid, &st, 0);
}
