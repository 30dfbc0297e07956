/* test_g3_crash.c - kill -9 in the middle of a stream of writes, on both
 * backends, twice over the same store: after each crash every indexed block
 * reads back verified with the contents it was written with (nothing torn
 * is served), and every write that was acknowledged is indexed. */
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "tests/lib/g3.h"

#define BLOCK      65536u
#define INFLIGHT   16
#define KILL_AFTER 150
#define SEED       0xC0FFEE

typedef struct ack {
  uint32_t i, slot;
} ack;

typedef struct wctx {
  kv_g3 *g;
  int pipe;
  uint32_t i, slot;
  void *buf;
  int busy;
} wctx;

static void child_cb(int status, void *arg) {
  wctx *w = arg;
  w->busy = 0;
  if (status) return;
  ack a = {w->i, w->slot};
  ssize_t r = write(w->pipe, &a, sizeof a); /* the acknowledgement */
  if (r != (ssize_t)sizeof a) _exit(3);
}

/* Writes blocks first, first+1, ... until killed. */
static void child(const char *dir, kv_g3_backend be, kv_g3_sync sync, uint32_t first, int pipe) {
  kv_arena arena;
  int cls;
  kv_arena_opts ao = {.capacity = 8u << 20, .page_bytes = 4u << 20, .no_lock = 1};
  if (kv_arena_init(&arena, &ao)) _exit(2);
  cls = kv_arena_class_for(&arena, BLOCK);
  kv_g3_dir d = {dir, 256u << 20};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = BLOCK,
                  .queue_depth = 8,
                  .backend = be,
                  .sync = sync,
                  .arena = &arena};
  kv_g3 *g;
  if (kv_g3_open(&g, &o, NULL)) _exit(2);
  wctx w[INFLIGHT];
  for (int k = 0; k < INFLIGHT; k++) {
    uint32_t s;
    if (kv_arena_alloc(&arena, cls, &s)) _exit(2);
    w[k] = (wctx){.g = g, .pipe = pipe, .buf = kv_arena_ptr(&arena, s)};
  }
  uint32_t next = first;
  for (;;) {
    for (int k = 0; k < INFLIGHT; k++) {
      if (w[k].busy) continue;
      uint32_t s;
      if (kv_g3_alloc(g, &s)) break; /* full: wait to be killed */
      w[k].i = next++;
      w[k].slot = s;
      t_fill(w[k].buf, BLOCK, SEED, w[k].i);
      kv_g3_key key = t_key(w[k].i);
      if (kv_g3_write(g, s, &key, 1000 + w[k].i, w[k].buf, BLOCK, -1, child_cb, &w[k])) _exit(2);
      w[k].busy = 1;
    }
    struct pollfd p = {.fd = kv_g3_fd(g), .events = POLLIN};
    poll(&p, 1, 100);
    kv_g3_poll(g);
  }
}

typedef struct verify_ctx {
  uint8_t *acked; /* 1 if acknowledged, by block number */
  uint8_t *present;
  uint32_t max;
  uint32_t *slot;
  uint64_t n;
} verify_ctx;

static int note(const kv_g3_entry *e, void *arg) {
  verify_ctx *v = arg;
  uint64_t i;
  memcpy(&i, e->key.b, 8);
  cr_assert_lt(i, v->max);
  cr_assert_eq(e->seq, 1000 + i);
  v->present[i] = 1;
  v->slot[i] = e->slot;
  v->n++;
  return 0;
}

/* One crash round: returns the number of blocks acknowledged. */
static uint32_t crash_round(const char *dir, kv_g3_backend be, kv_g3_sync sync, uint32_t first,
                            uint8_t *acked, uint32_t max) {
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(pfd[0]);
    child(dir, be, sync, first, pfd[1]);
    _exit(0);
  }
  close(pfd[1]);
  uint32_t n = 0;
  ack a;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (n < KILL_AFTER) {
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 20000), 1, "child stopped acknowledging");
    ssize_t r = read(pfd[0], &a, sizeof a);
    cr_assert_eq(r, (ssize_t)sizeof a, "child died early");
    cr_assert_lt(a.i, max);
    acked[a.i] = 1;
    n++;
  }
  kill(pid, SIGKILL); /* with writes in flight */
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child was not killed but ended");
  /* acknowledgements already in the pipe count too */
  ssize_t r;
  while ((r = read(pfd[0], &a, sizeof a)) == (ssize_t)sizeof a) {
    acked[a.i] = 1;
    n++;
  }
  close(pfd[0]);
  return n;
}

static void verify_after_crash(const char *dir, kv_g3_backend be, uint8_t *acked, uint32_t max,
                               uint32_t acks, int round) {
  kv_arena arena;
  int cls;
  t_arena(&arena, 4u << 20, BLOCK, &cls);
  kv_g3_dir d = {dir, 256u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = be, .arena = &arena};
  kv_g3 *g;
  kv_g3_open_info info;
  int rc = kv_g3_open(&g, &o, &info);
  cr_assert_eq(rc, 0, "reopen after kill -9: %s", kv_strerror(rc));
  verify_ctx v = {.acked = acked, .max = max};
  v.present = calloc(max, 1);
  v.slot = calloc(max, sizeof *v.slot);
  cr_assert_eq(kv_g3_foreach(g, note, &v), 0);
  cr_assert_eq(v.n, info.indexed);
  void *b = t_buf(&arena, cls);
  uint64_t verified = 0, acked_total = 0;
  for (uint32_t i = 0; i < max; i++) {
    if (acked[i]) {
      acked_total++;
      cr_assert(v.present[i], "block %u was acknowledged but is not indexed", i);
    }
    if (!v.present[i]) continue;
    kv_g3_expect e = t_expect(i, BLOCK, 1000 + i);
    memset(b, 0, BLOCK);
    rc = kv_g3_read_sync(g, v.slot[i], &e, b);
    cr_assert_eq(rc, 0, "indexed block %u fails: %s", i, kv_strerror(rc));
    cr_assert(t_check(b, BLOCK, SEED, i), "indexed block %u has other bytes", i);
    verified++;
  }
  kv_g3_stats st;
  kv_g3_get_stats(g, &st);
  cr_assert_eq(st.corrupt, 0);
  printf("kill -9 (%s, round %d): %u acks seen this round, %llu acknowledged in all; "
         "survivors: %llu blocks indexed, %llu verified, 0 torn\n",
         kv_g3_backend_name(be), round, acks, (unsigned long long)acked_total,
         (unsigned long long)info.indexed, (unsigned long long)verified);
  fflush(stdout);
  kv_g3_close(g);
  kv_arena_fini(&arena);
  free(v.present);
  free(v.slot);
}

static void crash_test(kv_g3_backend be) {
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) cr_skip_test("io_uring unavailable");
  char dir[64];
  t_mkdir(dir, sizeof dir);
  const uint32_t max = 20000;
  uint8_t *acked = calloc(max, 1);
  /* round 1 on a new store (batched fdatasync), round 2 reopens the crashed
   * store and goes on (dsync), reusing what round 1 left unindexed */
  uint32_t n = crash_round(dir, be, KV_G3_SYNC_BATCH, 0, acked, max);
  verify_after_crash(dir, be, acked, max, n, 1);
  n = crash_round(dir, be, KV_G3_SYNC_DSYNC, 10000, acked, max);
  verify_after_crash(dir, be, acked, max, n, 2);
  free(acked);
  t_rmdir(dir);
}

Test(g3_crash, kill9_mid_stream_uring, .timeout = 60) { crash_test(KV_G3_BACKEND_URING); }
Test(g3_crash, kill9_mid_stream_threads, .timeout = 60) { crash_test(KV_G3_BACKEND_THREADS); }
