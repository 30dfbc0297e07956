/* test_g3_stress.c - G3 under a random mix of concurrent operations on both
 * backends: writes, verified reads, removes, frees, injected read and write
 * errors, and a reopen half way; every completed read is either the right
 * bytes or an error, the accounting matches at the end.
 *
 * Also builds without criterion (-DKV_G3_STANDALONE), because criterion
 * cannot start under ThreadSanitizer; tools/bench/g3_sanitize.sh runs it so
 * under TSan. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KV_G3_STANDALONE
#include <criterion/criterion.h>
#endif

#include "base/errors.h"
#include "tiers/arena.h"
#include "tiers/g3.h"

#define CHECK(c)                                                                      \
  do {                                                                                \
    if (!(c)) {                                                                       \
      fprintf(stderr, "stress: check failed at %s:%d: %s\n", __FILE__, __LINE__, #c); \
      return __LINE__;                                                                \
    }                                                                                 \
  } while (0)

#define BLOCK 16384u
#define NBUF  48
#define NKEYS 400

typedef struct inject {
  atomic_uint n; /* transfers seen */
  atomic_int armed;
} inject;

/* Fails about one payload transfer in 97 with EIO while armed. */
static int inject_io(void *arg, int is_write, int is_header, unsigned file, uint64_t off,
                     uint32_t len) {
  inject *in = arg;
  unsigned n = atomic_fetch_add(&in->n, 1);
  if (!atomic_load(&in->armed) || is_header) return 0;
  return n % 97 == 13 ? -EIO : 0;
}

enum { K_EMPTY, K_WRITING, K_STORED, K_READING };

typedef struct stress {
  kv_g3 *g;
  kv_arena arena;
  int cls;
  uint8_t *buf[NBUF];
  int bufkey[NBUF]; /* key using the buffer, -1 free */
  int kstate[NKEYS];
  uint32_t kslot[NKEYS];
  uint64_t kseq[NKEYS];
  uint8_t kremoved[NKEYS]; /* removed while a read was in flight */
  uint64_t seq;
  int fail; /* first failed check (line) */
  uint64_t rd_ok, rd_err, wr_ok, wr_err, removes;
} stress;

typedef struct opctx {
  stress *s;
  int key, buf;
} opctx;

static opctx ctxs[NBUF];

static void fill(uint8_t *p, int key, uint64_t seq) {
  uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ull ^ seq;
  for (uint32_t i = 0; i < BLOCK; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
}

static kv_g3_key mkkey(int key) {
  kv_g3_key k;
  memset(&k, 0, sizeof k);
  memset(k.ns, 0x33, sizeof k.ns);
  k.len = 4;
  memcpy(k.b, &key, 4);
  return k;
}

static void on_write(int status, void *arg) {
  opctx *c = arg;
  stress *s = c->s;
  s->bufkey[c->buf] = -1;
  if (status == 0) {
    s->kstate[c->key] = K_STORED;
    s->wr_ok++;
  } else {
    s->wr_err++;
    s->kstate[c->key] = K_EMPTY;
    if (kv_g3_free(s->g, s->kslot[c->key]) && !s->fail) s->fail = __LINE__;
    kv_g3_resume(s->g);
  }
}

static void on_read(int status, void *arg) {
  opctx *c = arg;
  stress *s = c->s;
  uint8_t *want = malloc(BLOCK);
  int removed = s->kremoved[c->key];
  s->bufkey[c->buf] = -1;
  s->kremoved[c->key] = 0;
  if (status == 0) {
    /* right bytes, even if the block was removed meanwhile: its slot is
     * not reused while the read is in flight */
    fill(want, c->key, s->kseq[c->key]);
    if (memcmp(want, s->buf[c->buf], BLOCK) && !s->fail) s->fail = __LINE__;
    s->kstate[c->key] = removed ? K_EMPTY : K_STORED;
    s->rd_ok++;
  } else {
    /* only injected I/O errors: nothing here is corrupt */
    if (status != -EIO && !s->fail) s->fail = __LINE__;
    s->rd_err++;
    s->kstate[c->key] = K_EMPTY;
    /* the store dropped the entry; the slot is ours to free (unless the
     * remove already gave it back) */
    if (!removed && kv_g3_free(s->g, s->kslot[c->key]) && !s->fail) s->fail = __LINE__;
    kv_g3_resume(s->g);
  }
  free(want);
}

static int free_buf(stress *s) {
  for (int i = 0; i < NBUF; i++)
    if (s->bufkey[i] < 0) return i;
  return -1;
}

static int open_store(stress *s, const char *dir, kv_g3_backend be, const kv_g3_fault *f) {
  kv_g3_dir d = {dir, 16u << 20};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = BLOCK,
                  .queue_depth = 8,
                  .backend = be,
                  .arena = &s->arena,
                  .fault = f,
                  .commit_window_us = 500};
  return kv_g3_open(&s->g, &o, NULL);
}

typedef struct reload {
  stress *s;
  int n;
} reload;

static int reload_one(const kv_g3_entry *e, void *arg) {
  reload *r = arg;
  int key;
  memcpy(&key, e->key.b, 4);
  if (key < 0 || key >= NKEYS || r->s->kstate[key] != K_STORED) return 1;
  if (r->s->kslot[key] != e->slot || r->s->kseq[key] != e->seq) return 2;
  r->n++;
  return 0;
}

static int run(kv_g3_backend be, unsigned rounds) {
  char dir[] = "/tmp/kvg3-stress-XXXXXX";
  CHECK(mkdtemp(dir));
  static stress s;
  memset(&s, 0, sizeof s);
  inject in;
  atomic_init(&in.n, 0);
  atomic_init(&in.armed, 1);
  kv_g3_fault fault = {.io = inject_io, .arg = &in};
  kv_arena_opts ao = {.capacity = 4u << 20, .page_bytes = 1u << 20, .no_lock = 1};
  CHECK(kv_arena_init(&s.arena, &ao) == 0);
  s.cls = kv_arena_class_for(&s.arena, BLOCK);
  for (int i = 0; i < NBUF; i++) {
    uint32_t sl;
    CHECK(kv_arena_alloc(&s.arena, s.cls, &sl) == 0);
    s.buf[i] = kv_arena_ptr(&s.arena, sl);
    s.bufkey[i] = -1;
  }
  int rc = open_store(&s, dir, be, &fault);
  if (rc == -ENOSYS || rc == -EPERM) {
    fprintf(stderr, "stress: %s unavailable, skipped\n", kv_g3_backend_name(be));
    kv_arena_fini(&s.arena);
    rmdir(dir);
    return 0;
  }
  CHECK(rc == 0);
  uint64_t x = 88172645463325252ull, rd_ok0 = 0, rd_err0 = 0;
  for (unsigned r = 0; r < rounds && !s.fail; r++) {
    if (r == rounds / 2) { /* restart: everything stored comes back */
      kv_g3_drain(s.g);
      kv_g3_close(s.g);
      CHECK(open_store(&s, dir, be, &fault) == 0);
      reload rl = {&s, 0};
      CHECK(kv_g3_foreach(s.g, reload_one, &rl) == 0);
      int stored = 0;
      for (int k = 0; k < NKEYS; k++) stored += s.kstate[k] == K_STORED;
      CHECK(rl.n == stored);
      rd_ok0 = s.rd_ok; /* the store's counters start again */
      rd_err0 = s.rd_err;
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int key = (int)(x % NKEYS), op = (int)((x >> 32) % 10), b = free_buf(&s);
    if (b >= 0 && s.kstate[key] == K_EMPTY && op < 5) {
      uint32_t sl;
      if (kv_g3_alloc(s.g, &sl) == 0) {
        kv_g3_key k = mkkey(key);
        s.kslot[key] = sl;
        s.kseq[key] = ++s.seq;
        fill(s.buf[b], key, s.seq);
        ctxs[b] = (opctx){&s, key, b};
        CHECK(kv_g3_write(s.g, sl, &k, s.seq, s.buf[b], BLOCK, -1, on_write, &ctxs[b]) == 0);
        s.kstate[key] = K_WRITING;
        s.bufkey[b] = key;
      }
    } else if (b >= 0 && s.kstate[key] == K_STORED && op < 9) {
      kv_g3_expect e = {
          .key = mkkey(key), .len = BLOCK, .seq = s.kseq[key], .flags = KV_G3_EXPECT_SEQ};
      ctxs[b] = (opctx){&s, key, b};
      CHECK(kv_g3_read(s.g, s.kslot[key], &e, s.buf[b], on_read, &ctxs[b]) == 0);
      s.kstate[key] = K_READING;
      s.bufkey[b] = key;
    } else if (s.kstate[key] == K_STORED || (s.kstate[key] == K_READING && !s.kremoved[key])) {
      kv_g3_key k = mkkey(key);
      CHECK(kv_g3_remove(s.g, s.kslot[key], &k) == 0);
      if (s.kstate[key] == K_STORED) s.kstate[key] = K_EMPTY;
      else s.kremoved[key] = 1;
      s.removes++;
    }
    kv_g3_poll(s.g);
    if (free_buf(&s) < 0) {
      struct pollfd p = {.fd = kv_g3_fd(s.g), .events = POLLIN};
      poll(&p, 1, 1000);
      kv_g3_poll(s.g);
    }
  }
  kv_g3_drain(s.g);
  CHECK(!s.fail);
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  int stored = 0;
  for (int k = 0; k < NKEYS; k++) stored += s.kstate[k] == K_STORED;
  CHECK(st.slots_stored == (uint64_t)stored);
  CHECK(st.read_failed == s.rd_err - rd_err0 && st.reads == s.rd_ok - rd_ok0);
  fprintf(stderr,
          "stress %s: %llu writes ok, %llu failed; %llu reads ok, %llu failed; "
          "%llu removes; %d stored\n",
          kv_g3_backend_name(be), (unsigned long long)s.wr_ok, (unsigned long long)s.wr_err,
          (unsigned long long)s.rd_ok, (unsigned long long)s.rd_err, (unsigned long long)s.removes,
          stored);
  CHECK(s.rd_ok > 0 && s.wr_ok > 0 && s.rd_err + s.wr_err > 0);
  kv_g3_close(s.g);
  kv_arena_fini(&s.arena);
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-0.dat", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/kvg3-index.mdb", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/kvg3-index.mdb-lock", dir);
  unlink(p);
  rmdir(dir);
  return 0;
}

#ifdef KV_G3_STANDALONE
int main(int argc, char **argv) {
  unsigned rounds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 20000;
  int a = run(KV_G3_BACKEND_THREADS, rounds), b = run(KV_G3_BACKEND_URING, rounds);
  if (a || b) fprintf(stderr, "stress: FAILED (line %d / %d)\n", a, b);
  return a || b;
}
#else
Test(g3_stress, threads, .timeout = 60) { cr_assert_eq(run(KV_G3_BACKEND_THREADS, 20000), 0); }
Test(g3_stress, uring, .timeout = 60) { cr_assert_eq(run(KV_G3_BACKEND_URING, 20000), 0); }
#endif
