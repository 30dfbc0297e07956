/* test_g3_rebuild.c - recovering the G3 index from the record headers: a
 * deleted, damaged or foreign index is rebuilt at open; the explicit rebuild
 * (function and `kvbench g3 rebuild`) keeps the newest seq of each key and,
 * verifying, skips records whose payload fails its CRC; a store in use is
 * refused. */
#include <sys/wait.h>

#include "tests/lib/g3.h"
#include "tiers/g3_format.h"

typedef struct rb {
  char dir[64];
  kv_arena arena;
  int cls;
  kv_g3 *g;
  kv_g3_open_info info;
  kv_g3_backend be;
  void *buf;
} rb;

static void rb_open(rb *r) {
  kv_g3_dir d = {r->dir, 4u << 20};
  kv_g3_opts o = {
      .dirs = &d, .ndirs = 1, .block_bytes = 8192, .backend = r->be, .arena = &r->arena};
  int rc = kv_g3_open(&r->g, &o, &r->info);
  cr_assert_eq(rc, 0, "open: %s", kv_strerror(rc));
}

static int rb_init(rb *r, kv_g3_backend be) {
  memset(r, 0, sizeof *r);
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) return 0;
  r->be = be;
  t_mkdir(r->dir, sizeof r->dir);
  t_arena(&r->arena, 4u << 20, 8192, &r->cls);
  r->buf = t_buf(&r->arena, r->cls);
  rb_open(r);
  return 1;
}

static void rb_fini(rb *r) {
  kv_g3_close(r->g);
  kv_arena_fini(&r->arena);
  t_rmdir(r->dir);
}

/* Writes key i (contents seeded by seed) with seq into a new slot. */
static uint32_t rb_put(rb *r, uint64_t i, uint64_t seq, uint64_t seed) {
  uint32_t s;
  cr_assert_eq(kv_g3_alloc(r->g, &s), 0);
  t_fill(r->buf, 8192, seed, i);
  kv_g3_key k = t_key(i);
  cr_assert_eq(kv_g3_write_sync(r->g, s, &k, seq, r->buf, 8192), 0);
  return s;
}

static int rb_get(rb *r, uint32_t slot, uint64_t i, uint64_t seq, uint64_t seed) {
  kv_g3_expect e = t_expect(i, 8192, seq);
  memset(r->buf, 0, 8192);
  int rc = kv_g3_read_sync(r->g, slot, &e, r->buf);
  if (rc == 0) cr_assert(t_check(r->buf, 8192, seed, i));
  return rc;
}

static void rb_unlink_index(const rb *r) {
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-index.mdb", r->dir);
  cr_assert_eq(unlink(p), 0);
  snprintf(p, sizeof p, "%s/kvg3-index.mdb-lock", r->dir);
  unlink(p);
}

typedef struct where {
  uint32_t slot[64];
  uint64_t seq[64];
  int n;
} where;

static int note(const kv_g3_entry *e, void *arg) {
  where *w = arg;
  uint64_t i;
  memcpy(&i, e->key.b, 8);
  cr_assert_lt(i, 64);
  w->slot[i] = e->slot;
  w->seq[i] = e->seq;
  w->n++;
  return 0;
}

static where rb_where(rb *r) {
  where w;
  memset(&w, 0xff, sizeof w);
  w.n = 0;
  cr_assert_eq(kv_g3_foreach(r->g, note, &w), 0);
  return w;
}

Test(g3_rebuild, deleted_index_rebuilt_at_open) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    rb r;
    if (!rb_init(&r, t_backends[be])) continue;
    uint32_t s[12];
    for (int i = 0; i < 12; i++) s[i] = rb_put(&r, (uint64_t)i, 100 + (uint64_t)i, 1);
    kv_g3_close(r.g);
    rb_unlink_index(&r);
    t_log lg;
    t_log_begin(&lg);
    rb_open(&r);
    cr_assert_eq(t_log_end(&lg, "is missing: rebuilding"), 1);
    cr_assert_eq(r.info.rebuilt, 1);
    cr_assert_eq(r.info.indexed, 12);
    where w = rb_where(&r);
    for (int i = 0; i < 12; i++) {
      cr_assert_eq(w.slot[i], s[i]);
      cr_assert_eq(rb_get(&r, s[i], (uint64_t)i, 100 + (uint64_t)i, 1), 0);
    }
    /* and it stays rebuilt */
    kv_g3_close(r.g);
    rb_open(&r);
    cr_assert_eq(r.info.rebuilt, 0);
    cr_assert_eq(r.info.indexed, 12);
    rb_fini(&r);
  }
}

Test(g3_rebuild, damaged_index_rebuilt_at_open) {
  rb r;
  rb_init(&r, KV_G3_BACKEND_THREADS);
  for (int i = 0; i < 7; i++) rb_put(&r, (uint64_t)i, 1, 2);
  kv_g3_close(r.g);
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-index.mdb", r.dir);
  int fd = open(p, O_WRONLY);
  cr_assert_geq(fd, 0);
  char junk[8192];
  memset(junk, 0x5c, sizeof junk);
  cr_assert_eq(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  close(fd);
  t_log lg;
  t_log_begin(&lg);
  rb_open(&r);
  cr_assert_eq(t_log_end(&lg, "unreadable"), 1);
  cr_assert_eq(r.info.rebuilt, 1);
  cr_assert_eq(r.info.indexed, 7);
  rb_fini(&r);
}

/* An index that belongs to other files (another store's) is not trusted. */
Test(g3_rebuild, foreign_index_rebuilt_at_open) {
  rb a, b;
  rb_init(&a, KV_G3_BACKEND_THREADS);
  rb_init(&b, KV_G3_BACKEND_THREADS);
  for (int i = 0; i < 5; i++) rb_put(&a, (uint64_t)i, 1, 3);
  for (int i = 0; i < 9; i++) rb_put(&b, (uint64_t)i, 1, 4);
  kv_g3_close(a.g);
  kv_g3_close(b.g);
  char from[128], to[128];
  snprintf(from, sizeof from, "%s/kvg3-index.mdb", b.dir);
  snprintf(to, sizeof to, "%s/kvg3-index.mdb", a.dir);
  cr_assert_eq(rename(from, to), 0);
  rb_open(&a);
  cr_assert_eq(a.info.rebuilt, 1);
  cr_assert_eq(a.info.indexed, 5);
  where w = rb_where(&a);
  for (int i = 0; i < 5; i++) cr_assert_eq(rb_get(&a, w.slot[i], (uint64_t)i, 1, 3), 0);
  rb_open(&b); /* b lost its index: rebuilt too */
  cr_assert_eq(b.info.indexed, 9);
  rb_fini(&a);
  rb_fini(&b);
}

/* Key 1: seq 5 in one slot, then seq 9 in another. Key 2: seq 30, then an
 * older seq 20 written later. The rebuild keeps seq 9 and seq 30. */
Test(g3_rebuild, newest_seq_wins) {
  rb r;
  rb_init(&r, KV_G3_BACKEND_THREADS);
  rb_put(&r, 1, 5, 10);
  uint32_t k1new = rb_put(&r, 1, 9, 11);
  uint32_t k2old = rb_put(&r, 2, 30, 12);
  rb_put(&r, 2, 20, 13);
  rb_put(&r, 3, 1, 14);
  kv_g3_close(r.g);
  kv_g3_dir d = {r.dir, 0};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1};
  kv_g3_rebuild_info ri;
  cr_assert_eq(kv_g3_rebuild_index(&o, 1, &ri), 0);
  cr_assert_eq(ri.records, 5);
  cr_assert_eq(ri.indexed, 3);
  cr_assert_eq(ri.superseded, 2);
  cr_assert_eq(ri.bad_payload, 0);
  cr_assert_eq(ri.files, 1);
  rb_open(&r);
  cr_assert_eq(r.info.indexed, 3);
  where w = rb_where(&r);
  cr_assert_eq(w.slot[1], k1new);
  cr_assert_eq(w.seq[1], 9);
  cr_assert_eq(w.slot[2], k2old);
  cr_assert_eq(w.seq[2], 30);
  cr_assert_eq(rb_get(&r, k1new, 1, 9, 11), 0);
  cr_assert_eq(rb_get(&r, k2old, 2, 30, 12), 0);
  cr_assert_eq(kv_g3_max_seq(r.g), 30);
  rb_fini(&r);
}

static void flip_payload(const rb *r, uint32_t slot) {
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-0.dat", r->dir);
  int fd = open(p, O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t sbuf[G3_SECTOR];
  cr_assert_eq(pread(fd, sbuf, sizeof sbuf, 0), (ssize_t)sizeof sbuf);
  g3_sb sb;
  cr_assert_eq(g3_sb_decode(&sb, sbuf), 0);
  uint8_t c;
  off_t off = (off_t)(g3_data_pos(&sb, slot) + 100);
  cr_assert_eq(pread(fd, &c, 1, off), 1);
  c ^= 1;
  cr_assert_eq(pwrite(fd, &c, 1, off), 1);
  fsync(fd);
  close(fd);
}

/* The newest record of key 2 is damaged: a verifying rebuild falls back to
 * the older intact one; a header-only rebuild indexes the damaged one,
 * which then fails verification when read - never served. */
Test(g3_rebuild, verify_skips_bad_payload) {
  rb r;
  rb_init(&r, KV_G3_BACKEND_THREADS);
  uint32_t s[4];
  for (int i = 0; i < 4; i++) s[i] = rb_put(&r, (uint64_t)i, 1, 20);
  uint32_t k2new = rb_put(&r, 2, 2, 21);
  kv_g3_close(r.g);
  flip_payload(&r, k2new);
  kv_g3_dir d = {r.dir, 0};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1};
  kv_g3_rebuild_info ri;
  cr_assert_eq(kv_g3_rebuild_index(&o, 1, &ri), 0);
  cr_assert_eq(ri.bad_payload, 1);
  cr_assert_eq(ri.indexed, 4);
  rb_open(&r);
  where w = rb_where(&r);
  cr_assert_eq(w.slot[2], s[2]);
  cr_assert_eq(rb_get(&r, s[2], 2, 1, 20), 0);
  kv_g3_close(r.g);

  cr_assert_eq(kv_g3_rebuild_index(&o, 0, &ri), 0);
  cr_assert_eq(ri.bad_payload, 0);
  rb_open(&r);
  w = rb_where(&r);
  cr_assert_eq(w.slot[2], k2new);
  cr_assert_eq(rb_get(&r, k2new, 2, 2, 21), KV_ECORRUPT);
  rb_fini(&r);
}

Test(g3_rebuild, refuses_open_store_and_missing_store) {
  rb r;
  rb_init(&r, KV_G3_BACKEND_THREADS);
  kv_g3_dir d = {r.dir, 0};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .lock_wait_ms = -1};
  cr_assert_eq(kv_g3_rebuild_index(&o, 1, NULL), -EBUSY);
  rb_fini(&r);
  char empty[64];
  t_mkdir(empty, sizeof empty);
  d.path = empty;
  cr_assert_eq(kv_g3_rebuild_index(&o, 1, NULL), -ENOENT);
  t_rmdir(empty);
}

/* The operator's tool: `kvbench g3 rebuild --dir DIR`. */
Test(g3_rebuild, kvbench_g3_rebuild_cli) {
  rb r;
  rb_init(&r, KV_G3_BACKEND_THREADS);
  for (int i = 0; i < 6; i++) rb_put(&r, (uint64_t)i, 7, 30);
  kv_g3_close(r.g);
  rb_unlink_index(&r);
  char cmd[512], out[1024] = {0};
  snprintf(cmd, sizeof cmd, "%s/kvbench g3 rebuild --dir %s --json 2>/dev/null", KV_BIN_DIR, r.dir);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  int st = pclose(p);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvbench g3 rebuild failed: %s", out);
  cr_assert_gt(n, 0);
  cr_assert_not_null(strstr(out, "\"indexed\":6"), "output: %s", out);
  rb_open(&r);
  cr_assert_eq(r.info.rebuilt, 0);
  cr_assert_eq(r.info.indexed, 6);
  rb_fini(&r);
  snprintf(cmd, sizeof cmd, "%s/kvbench g3 rebuild 2>/dev/null", KV_BIN_DIR);
  st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "usage error must exit 2");
}

/* Large slots (one header read per slot) over two files: a rebuild finds
 * every block in both. */
Test(g3_rebuild, large_slots_two_files) {
  char d0[64], d1[64];
  t_mkdir(d0, sizeof d0);
  t_mkdir(d1, sizeof d1);
  kv_arena arena;
  int cls;
  const uint32_t blk = 300 * 1024;
  t_arena(&arena, 8u << 20, blk, &cls);
  void *b = t_buf(&arena, cls);
  kv_g3_dir d[2] = {{d0, 6u << 20}, {d1, 6u << 20}};
  kv_g3_opts o = {
      .dirs = d, .ndirs = 2, .block_bytes = blk, .backend = KV_G3_BACKEND_THREADS, .arena = &arena};
  kv_g3 *g;
  cr_assert_eq(kv_g3_open(&g, &o, NULL), 0);
  uint32_t s[16];
  for (int i = 0; i < 16; i++) {
    cr_assert_eq(kv_g3_alloc(g, &s[i]), 0);
    t_fill(b, blk, 40, (uint64_t)i);
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_write_sync(g, s[i], &k, 1, b, blk), 0);
  }
  kv_g3_close(g);
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-index.mdb", d0);
  cr_assert_eq(unlink(p), 0);
  kv_g3_rebuild_info ri;
  cr_assert_eq(kv_g3_rebuild_index(&o, 1, &ri), 0);
  cr_assert_eq(ri.files, 2);
  cr_assert_eq(ri.records, 16);
  cr_assert_eq(ri.indexed, 16);
  kv_g3_open_info info;
  cr_assert_eq(kv_g3_open(&g, &o, &info), 0);
  cr_assert_eq(info.indexed, 16);
  for (int i = 0; i < 16; i++) {
    kv_g3_expect e = t_expect((uint64_t)i, blk, 1);
    cr_assert_eq(kv_g3_read_sync(g, s[i], &e, b), 0);
    cr_assert(t_check(b, blk, 40, (uint64_t)i));
  }
  kv_g3_close(g);
  kv_arena_fini(&arena);
  t_rmdir(d0);
  t_rmdir(d1);
}
