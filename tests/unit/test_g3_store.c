/* test_g3_store.c - G3 store: round trips at 4 KiB..1 MiB on both backends,
 * warm restart, iteration, slot allocation rules, removal, sync policies,
 * several directories, fixed buffers, and completion through the eventfd. */
#include <poll.h>
#include <stdatomic.h>

#include "tests/lib/g3.h"

typedef struct store_t {
  char dir[64];
  kv_arena arena;
  int cls;
  kv_g3 *g;
  kv_g3_open_info info;
} store_t;

static void s_open_opts(store_t *s, kv_g3_opts *o) {
  kv_g3_dir d = {s->dir, o->dirs ? o->dirs[0].capacity : 64ull << 20};
  if (!o->dirs) {
    o->dirs = &d;
    o->ndirs = 1;
  }
  if (!o->arena) o->arena = &s->arena;
  int rc = kv_g3_open(&s->g, o, &s->info);
  cr_assert_eq(rc, 0, "open: %s", kv_strerror(rc));
  o->dirs = NULL;
}

static void s_init(store_t *s, uint32_t block, size_t arena_bytes, kv_g3_backend be, uint64_t cap) {
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) cr_skip_test("io_uring unavailable");
  t_mkdir(s->dir, sizeof s->dir);
  t_arena(&s->arena, arena_bytes, block, &s->cls);
  kv_g3_dir d = {s->dir, cap};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .block_bytes = block, .queue_depth = 8, .backend = be};
  s_open_opts(s, &o);
}

static void s_fini(store_t *s) {
  kv_g3_close(s->g);
  kv_arena_fini(&s->arena);
  t_rmdir(s->dir);
}

/* Writes n blocks of len bytes asynchronously, then reads them back into
 * other buffers, all verified. */
static void round_trip(kv_g3_backend be, uint32_t block, uint32_t len, unsigned n) {
  store_t s;
  size_t arena = (size_t)block * (2 * n + 2);
  if (arena < (8u << 20)) arena = 8u << 20;
  s_init(&s, block, arena, be, (uint64_t)n * (block + 4096) + (4u << 20));
  cr_assert_eq(s.info.backend, be);
  cr_assert_eq(s.info.direct, 1);
  cr_assert_geq(s.info.slots, n);
  uint32_t *slot = calloc(n, sizeof *slot);
  void **wb = calloc(n, sizeof *wb), **rb = calloc(n, sizeof *rb);
  t_count wc = {0}, rc = {0};
  for (unsigned i = 0; i < n; i++) {
    wb[i] = t_buf(&s.arena, s.cls);
    rb[i] = t_buf(&s.arena, s.cls);
    t_fill(wb[i], len, block, i);
    cr_assert_eq(kv_g3_alloc(s.g, &slot[i]), 0);
    kv_g3_key k = t_key(i);
    cr_assert_eq(
        kv_g3_write(s.g, slot[i], &k, 100 + i, wb[i], len, kv_g3_write_crc_none, t_count_cb, &wc),
        0);
  }
  kv_g3_drain(s.g);
  cr_assert_eq(wc.n, (int)n);
  cr_assert_eq(wc.err, 0, "write error %s", kv_strerror(wc.last));
  for (unsigned i = 0; i < n; i++) {
    memset(rb[i], 0, len);
    kv_g3_expect e = t_expect(i, len, 100 + i);
    cr_assert_eq(kv_g3_read(s.g, slot[i], &e, rb[i], t_count_cb, &rc), 0);
  }
  kv_g3_drain(s.g);
  cr_assert_eq(rc.n, (int)n);
  cr_assert_eq(rc.err, 0, "read error %s", kv_strerror(rc.last));
  for (unsigned i = 0; i < n; i++) cr_assert(t_check(rb[i], len, block, i), "block %u", i);
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.writes, n);
  cr_assert_eq(st.reads, n);
  cr_assert_eq(st.slots_stored, n);
  cr_assert_eq(st.stored_bytes, (uint64_t)n * len);
  cr_assert_eq(st.corrupt, 0);
  cr_assert_leq(st.index_txns, n + 1);
  cr_assert_eq(st.state, KV_G3_OK);
  free(slot);
  free(wb);
  free(rb);
  s_fini(&s);
}

Test(g3_store, round_trip_sizes_both_backends, .timeout = 60) {
  const uint32_t sizes[] = {4096, 65536, 262144, 1u << 20};
  for (int b = 0; b < T_NBACKENDS; b++)
    for (int i = 0; i < 4; i++) {
      if (t_backends[b] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
      round_trip(t_backends[b], sizes[i], sizes[i], 24);
    }
}

/* A payload that is not a multiple of 4 KiB: the CRC covers exactly len. */
Test(g3_store, round_trip_odd_length) {
  for (int b = 0; b < T_NBACKENDS; b++) {
    if (t_backends[b] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
    round_trip(t_backends[b], 65536, 65536 - 1000, 5);
    round_trip(t_backends[b], 65536, 1, 3);
  }
}

static int collect(const kv_g3_entry *e, void *arg) {
  uint64_t *seen = arg;
  uint64_t i;
  memcpy(&i, e->key.b, 8);
  cr_assert_lt(i, 64);
  cr_assert_eq(e->seq, 100 + i);
  cr_assert_eq(e->len, 8192);
  seen[i] = e->slot + 1;
  return 0;
}

/* Close and reopen: everything indexed before is indexed and readable after,
 * with its slots marked allocated. */
static void warm_restart(kv_g3_backend be) {
  store_t s;
  const unsigned n = 40;
  s_init(&s, 8192, 8u << 20, be, 4u << 20);
  uint32_t slot[40];
  void *b = t_buf(&s.arena, s.cls);
  for (unsigned i = 0; i < n; i++) {
    t_fill(b, 8192, 7, i);
    cr_assert_eq(kv_g3_alloc(s.g, &slot[i]), 0);
    kv_g3_key k = t_key(i);
    cr_assert_eq(kv_g3_write_sync(s.g, slot[i], &k, 100 + i, b, 8192), 0);
  }
  kv_g3_close(s.g);
  kv_g3_dir d = {s.dir, 4u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .block_bytes = 0, .backend = be, .arena = &s.arena};
  s_open_opts(&s, &o);
  cr_assert_eq(s.info.indexed, n);
  cr_assert_eq(s.info.formatted, 0);
  cr_assert_eq(s.info.rebuilt, 0);
  cr_assert_eq(s.info.slot_bytes, 8192);
  cr_assert_eq(kv_g3_max_seq(s.g), 100 + n - 1);
  uint64_t seen[64] = {0};
  cr_assert_eq(kv_g3_foreach(s.g, collect, seen), 0);
  for (unsigned i = 0; i < n; i++) {
    cr_assert_eq(seen[i], slot[i] + 1ull, "entry %u", i);
    kv_g3_expect e = t_expect(i, 8192, 100 + i);
    cr_assert_eq(kv_g3_read_sync(s.g, slot[i], &e, b), 0);
    cr_assert(t_check(b, 8192, 7, i));
    /* the slot is the caller's: not free, not writable again */
    cr_assert_eq(kv_g3_free(s.g, slot[i]), -EBUSY);
  }
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.slots_free, st.slots - n);
  s_fini(&s);
}

Test(g3_store, warm_restart_uring) { warm_restart(KV_G3_BACKEND_URING); }
Test(g3_store, warm_restart_threads) { warm_restart(KV_G3_BACKEND_THREADS); }

Test(g3_store, alloc_free_remove_rules) {
  store_t s;
  s_init(&s, 4096, 4u << 20, KV_G3_BACKEND_THREADS, 2u << 20);
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  uint32_t n = (uint32_t)st.slots, sl, first;
  cr_assert_gt(n, 10);
  uint8_t *seen = calloc(n, 1);
  for (uint32_t i = 0; i < n; i++) {
    cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
    cr_assert_lt(sl, n);
    cr_assert_eq(seen[sl], 0, "slot %u twice", sl);
    seen[sl] = 1;
    if (i == 0) first = sl;
  }
  cr_assert_eq(kv_g3_alloc(s.g, &sl), -ENOSPC);
  cr_assert_eq(kv_g3_free(s.g, first), 0);
  cr_assert_eq(kv_g3_free(s.g, first), -EALREADY);
  cr_assert_eq(kv_g3_free(s.g, n), -EINVAL);
  cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
  cr_assert_eq(sl, first);

  /* write, then: free refused, read ok, remove, read refused */
  void *b = t_buf(&s.arena, s.cls);
  t_fill(b, 4096, 1, 1);
  kv_g3_key k = t_key(1);
  cr_assert_eq(kv_g3_write(s.g, sl, &k, 5, b, 4096, -1, NULL, NULL), 0);
  cr_assert_eq(kv_g3_write(s.g, sl, &k, 5, b, 4096, -1, NULL, NULL), -EBUSY);
  cr_assert_eq(kv_g3_free(s.g, sl), -EBUSY);
  kv_g3_drain(s.g);
  cr_assert_eq(kv_g3_free(s.g, sl), -EBUSY);
  kv_g3_expect e = t_expect(1, 4096, 5);
  cr_assert_eq(kv_g3_read_sync(s.g, sl, &e, b), 0);
  cr_assert_eq(kv_g3_remove(s.g, sl, &k), 0);
  cr_assert_eq(kv_g3_remove(s.g, sl, &k), -EALREADY);
  cr_assert_eq(kv_g3_read(s.g, sl, &e, b, NULL, NULL), KV_ENOTFOUND);
  /* the slot comes back only after the delete committed */
  cr_assert_eq(kv_g3_alloc(s.g, &sl), -ENOSPC);
  kv_g3_drain(s.g);
  cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
  cr_assert_eq(sl, first);
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.slots_stored, 0);
  cr_assert_eq(st.removed, 1);
  cr_assert_eq(st.index_dels, 1);

  /* bad arguments */
  cr_assert_eq(kv_g3_write(s.g, sl, &k, 5, (char *)b + 1, 4096, -1, NULL, NULL), -EINVAL);
  cr_assert_eq(kv_g3_write(s.g, sl, &k, 5, b, 4097, -1, NULL, NULL), -EINVAL);
  cr_assert_eq(kv_g3_write(s.g, sl, &k, 5, b, 0, -1, NULL, NULL), -EINVAL);
  kv_g3_key bad = k;
  bad.len = 0;
  cr_assert_eq(kv_g3_write(s.g, sl, &bad, 5, b, 4096, -1, NULL, NULL), -EINVAL);
  bad.len = 33;
  cr_assert_eq(kv_g3_write(s.g, sl, &bad, 5, b, 4096, -1, NULL, NULL), -EINVAL);
  e.flags = 0;
  cr_assert_eq(kv_g3_read(s.g, sl, &e, b, NULL, NULL), -EINVAL);
  free(seen);
  s_fini(&s);
}

/* Removed blocks stay gone after a restart; the rest stays. */
Test(g3_store, remove_survives_restart) {
  store_t s;
  s_init(&s, 4096, 4u << 20, KV_G3_BACKEND_THREADS, 4u << 20);
  void *b = t_buf(&s.arena, s.cls);
  uint32_t slot[10];
  for (int i = 0; i < 10; i++) {
    t_fill(b, 4096, 3, (uint64_t)i);
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_alloc(s.g, &slot[i]), 0);
    cr_assert_eq(kv_g3_write_sync(s.g, slot[i], &k, 1, b, 4096), 0);
  }
  for (int i = 0; i < 10; i += 2) {
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_remove(s.g, slot[i], &k), 0);
  }
  kv_g3_close(s.g);
  kv_g3_dir d = {s.dir, 4u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = KV_G3_BACKEND_THREADS};
  s_open_opts(&s, &o);
  cr_assert_eq(s.info.indexed, 5);
  for (int i = 1; i < 10; i += 2) {
    kv_g3_expect e = t_expect((uint64_t)i, 4096, 1);
    cr_assert_eq(kv_g3_read_sync(s.g, slot[i], &e, b), 0);
    cr_assert(t_check(b, 4096, 3, (uint64_t)i));
  }
  s_fini(&s);
}

/* Every sync policy round-trips and survives a reopen. */
Test(g3_store, sync_policies) {
  const kv_g3_sync pol[] = {KV_G3_SYNC_BATCH, KV_G3_SYNC_DSYNC, KV_G3_SYNC_NONE};
  for (int b = 0; b < T_NBACKENDS; b++)
    for (int p = 0; p < 3; p++) {
      if (t_backends[b] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
      store_t s;
      t_mkdir(s.dir, sizeof s.dir);
      t_arena(&s.arena, 4u << 20, 16384, &s.cls);
      kv_g3_dir d = {s.dir, 4u << 20};
      kv_g3_opts o = {
          .dirs = &d, .ndirs = 1, .block_bytes = 16384, .backend = t_backends[b], .sync = pol[p]};
      s_open_opts(&s, &o);
      void *buf = t_buf(&s.arena, s.cls);
      uint32_t sl[8];
      for (int i = 0; i < 8; i++) {
        t_fill(buf, 16384, 11, (uint64_t)i);
        kv_g3_key k = t_key((uint64_t)i);
        cr_assert_eq(kv_g3_alloc(s.g, &sl[i]), 0);
        cr_assert_eq(kv_g3_write_sync(s.g, sl[i], &k, 9, buf, 16384), 0);
      }
      kv_g3_stats st;
      kv_g3_get_stats(s.g, &st);
      if (pol[p] == KV_G3_SYNC_BATCH) cr_assert_geq(st.syncs, 1);
      else cr_assert_eq(st.syncs, 0);
      kv_g3_close(s.g);
      kv_g3_dir d2 = {s.dir, 4u << 20};
      kv_g3_opts o2 = {.dirs = &d2, .ndirs = 1, .backend = t_backends[b], .sync = pol[p]};
      s_open_opts(&s, &o2);
      cr_assert_eq(s.info.indexed, 8);
      for (int i = 0; i < 8; i++) {
        kv_g3_expect e = t_expect((uint64_t)i, 16384, 9);
        cr_assert_eq(kv_g3_read_sync(s.g, sl[i], &e, buf), 0);
        cr_assert(t_check(buf, 16384, 11, (uint64_t)i));
      }
      s_fini(&s);
    }
}

/* Two directories: slots alternate between the files; both reopen. */
Test(g3_store, two_directories) {
  store_t s;
  char dir2[64];
  t_mkdir(s.dir, sizeof s.dir);
  t_mkdir(dir2, sizeof dir2);
  t_arena(&s.arena, 4u << 20, 4096, &s.cls);
  kv_g3_dir d[2] = {{s.dir, 3u << 20}, {dir2, 5u << 20}};
  kv_g3_opts o = {.dirs = d, .ndirs = 2, .block_bytes = 4096, .backend = KV_G3_BACKEND_THREADS};
  s_open_opts(&s, &o);
  {
    kv_g3_stats st;
    kv_g3_get_stats(s.g, &st);
    cr_assert_gt(st.slots, 400);
  }
  void *b = t_buf(&s.arena, s.cls);
  uint32_t sl[20];
  for (int i = 0; i < 20; i++) {
    cr_assert_eq(kv_g3_alloc(s.g, &sl[i]), 0);
    t_fill(b, 4096, 5, (uint64_t)i);
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_write_sync(s.g, sl[i], &k, 1, b, 4096), 0);
  }
  kv_g3_close(s.g);
  kv_g3_opts o2 = {.dirs = d, .ndirs = 2, .backend = KV_G3_BACKEND_THREADS};
  s_open_opts(&s, &o2);
  cr_assert_eq(s.info.indexed, 20);
  for (int i = 0; i < 20; i++) {
    kv_g3_expect e = t_expect((uint64_t)i, 4096, 1);
    cr_assert_eq(kv_g3_read_sync(s.g, sl[i], &e, b), 0);
    cr_assert(t_check(b, 4096, 5, (uint64_t)i));
  }
  char p[128];
  struct stat st0, st1;
  snprintf(p, sizeof p, "%s/kvg3-0.dat", s.dir);
  cr_assert_eq(stat(p, &st0), 0);
  snprintf(p, sizeof p, "%s/kvg3-1.dat", dir2);
  cr_assert_eq(stat(p, &st1), 0);
  cr_assert_leq(st0.st_size, 3u << 20);
  cr_assert_leq(st1.st_size, 5u << 20);
  s_fini(&s);
  t_rmdir(dir2);
}

static int count_files(const kv_g3_entry *e, void *arg) {
  int *n = arg;
  n[e->file]++;
  return 0;
}

Test(g3_store, two_directories_round_robin) {
  store_t s;
  char dir2[64];
  t_mkdir(s.dir, sizeof s.dir);
  t_mkdir(dir2, sizeof dir2);
  t_arena(&s.arena, 4u << 20, 4096, &s.cls);
  kv_g3_dir d[2] = {{s.dir, 4u << 20}, {dir2, 4u << 20}};
  kv_g3_opts o = {.dirs = d, .ndirs = 2, .block_bytes = 4096, .backend = KV_G3_BACKEND_THREADS};
  s_open_opts(&s, &o);
  void *b = t_buf(&s.arena, s.cls);
  for (int i = 0; i < 10; i++) {
    uint32_t sl;
    cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
    t_fill(b, 4096, 5, (uint64_t)i);
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_write_sync(s.g, sl, &k, 1, b, 4096), 0);
  }
  int n[2] = {0, 0};
  cr_assert_eq(kv_g3_foreach(s.g, count_files, n), 0);
  cr_assert_eq(n[0], 5);
  cr_assert_eq(n[1], 5);
  s_fini(&s);
  t_rmdir(dir2);
}

/* Reopening with another block size is refused, not silently reformatted;
 * reformat discards the old contents. */
Test(g3_store, block_size_change_and_reformat) {
  store_t s;
  s_init(&s, 8192, 4u << 20, KV_G3_BACKEND_THREADS, 4u << 20);
  void *b = t_buf(&s.arena, s.cls);
  uint32_t sl;
  t_fill(b, 8192, 1, 1);
  kv_g3_key k = t_key(1);
  cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
  cr_assert_eq(kv_g3_write_sync(s.g, sl, &k, 1, b, 8192), 0);
  kv_g3_close(s.g);
  s.g = NULL;
  kv_g3_dir d = {s.dir, 4u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .block_bytes = 16384, .backend = KV_G3_BACKEND_THREADS};
  kv_g3 *g2;
  cr_assert_eq(kv_g3_open(&g2, &o, NULL), -EINVAL);
  o.reformat = 1;
  kv_g3_open_info info;
  cr_assert_eq(kv_g3_open(&g2, &o, &info), 0);
  cr_assert_eq(info.indexed, 0);
  cr_assert_eq(info.formatted, 1);
  cr_assert_eq(info.slot_bytes, 16384);
  kv_g3_close(g2);
  kv_arena_fini(&s.arena);
  t_rmdir(s.dir);
}

/* The same store cannot be opened twice at once. */
Test(g3_store, exclusive_open) {
  store_t s;
  s_init(&s, 4096, 4u << 20, KV_G3_BACKEND_THREADS, 2u << 20);
  kv_g3_dir d = {s.dir, 2u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = KV_G3_BACKEND_THREADS, .lock_wait_ms = -1};
  kv_g3 *g2;
  cr_assert_eq(kv_g3_open(&g2, &o, NULL), -EBUSY);
  o.lock_wait_ms = 50;
  cr_assert_eq(kv_g3_open(&g2, &o, NULL), -EBUSY);
  s_fini(&s);
}

/* The arena is registered with io_uring; refusal falls back, logged, and
 * I/O still works. */
Test(g3_store, fixed_buffers_and_fallback) {
  if (!t_uring_ok()) cr_skip_test("io_uring unavailable");
  store_t s;
  s_init(&s, 65536, 16u << 20, KV_G3_BACKEND_URING, 4u << 20);
  cr_assert_eq(s.info.fixed_buffers, 1);
  kv_g3_close(s.g);
  kv_g3_fault f = {.refuse_fixed = ENOMEM};
  kv_g3_dir d = {s.dir, 4u << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = KV_G3_BACKEND_URING, .fault = &f};
  t_log lg;
  t_log_begin(&lg);
  s_open_opts(&s, &o);
  cr_assert_eq(t_log_end(&lg, "refused fixed buffers"), 1);
  cr_assert_eq(s.info.fixed_buffers, 0);
  void *b = t_buf(&s.arena, s.cls);
  uint32_t sl;
  t_fill(b, 65536, 2, 2);
  kv_g3_key k = t_key(2);
  cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
  cr_assert_eq(kv_g3_write_sync(s.g, sl, &k, 1, b, 65536), 0);
  memset(b, 0, 65536);
  kv_g3_expect e = t_expect(2, 65536, 1);
  cr_assert_eq(kv_g3_read_sync(s.g, sl, &e, b), 0);
  cr_assert(t_check(b, 65536, 2, 2));
  s_fini(&s);
}

/* Completions arrive through the eventfd and kv_g3_poll, in a loop like the
 * daemon's; a callback may submit the next operation. */
typedef struct chain {
  kv_g3 *g;
  void *buf;
  uint32_t slot;
  int stage, status;
} chain;

static void chain_cb(int status, void *arg) {
  chain *c = arg;
  c->status = status;
  if (status) return;
  if (c->stage++ == 0) {
    kv_g3_expect e = t_expect(9, 4096, 3);
    cr_assert_eq(kv_g3_read(c->g, c->slot, &e, c->buf, chain_cb, c), 0);
  }
}

Test(g3_store, eventfd_delivery) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    if (t_backends[be] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
    store_t s;
    s_init(&s, 4096, 4u << 20, t_backends[be], 2u << 20);
    chain c = {.g = s.g, .buf = t_buf(&s.arena, s.cls)};
    t_fill(c.buf, 4096, 4, 9);
    kv_g3_key k = t_key(9);
    cr_assert_eq(kv_g3_alloc(s.g, &c.slot), 0);
    cr_assert_eq(kv_g3_poll(s.g), 0);
    cr_assert_eq(kv_g3_write(s.g, c.slot, &k, 3, c.buf, 4096, -1, chain_cb, &c), 0);
    int spins = 0;
    while (c.stage < 2 && c.status == 0) {
      struct pollfd p = {.fd = kv_g3_fd(s.g), .events = POLLIN};
      cr_assert_eq(poll(&p, 1, 10000), 1, "no completion within 10 s");
      kv_g3_poll(s.g);
      cr_assert_lt(++spins, 1000);
    }
    cr_assert_eq(c.status, 0);
    cr_assert(t_check(c.buf, 4096, 4, 9));
    cr_assert_eq(kv_g3_poll(s.g), 0);
    s_fini(&s);
  }
}

/* The file is preallocated to its full layout at open, not sparse. */
Test(g3_store, file_preallocated) {
  store_t s;
  s_init(&s, 65536, 4u << 20, KV_G3_BACKEND_THREADS, 32u << 20);
  char p[128];
  snprintf(p, sizeof p, "%s/kvg3-0.dat", s.dir);
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  uint64_t want = (uint64_t)s.info.slots * (65536 + 4096);
  cr_assert_geq((uint64_t)st.st_size, want);
  cr_assert_leq((uint64_t)st.st_size, 32u << 20);
  cr_assert_geq((uint64_t)st.st_blocks * 512, (uint64_t)st.st_size, "file is sparse");
  s_fini(&s);
}

/* Many blocks share one index transaction and one fdatasync. */
Test(g3_store, index_writes_are_batched) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    if (t_backends[be] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
    store_t s;
    s_init(&s, 4096, 4u << 20, t_backends[be], 4u << 20);
    void *b = t_buf(&s.arena, s.cls);
    t_fill(b, 4096, 1, 1);
    t_count c = {0};
    for (int i = 0; i < 256; i++) {
      uint32_t sl;
      kv_g3_key k = t_key((uint64_t)i);
      cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
      cr_assert_eq(kv_g3_write(s.g, sl, &k, 1, b, 4096, -1, t_count_cb, &c), 0);
    }
    kv_g3_drain(s.g);
    cr_assert_eq(c.n, 256);
    cr_assert_eq(c.err, 0);
    kv_g3_stats st;
    kv_g3_get_stats(s.g, &st);
    cr_assert_eq(st.index_puts, 256);
    cr_assert_lt(st.index_txns, 256 / 8, "%llu transactions for 256 blocks",
                 (unsigned long long)st.index_txns);
    cr_assert_leq(st.syncs, st.index_txns);
    printf("%s: 256 blocks in %llu index transactions, %llu fdatasync\n",
           kv_g3_backend_name(t_backends[be]), (unsigned long long)st.index_txns,
           (unsigned long long)st.syncs);
    s_fini(&s);
  }
}

/* queue_depth bounds the transfers at the device: with the thread backend,
 * at most qd run at once (and qd do, under load). */
typedef struct conc {
  atomic_int now, max;
} conc;

static int conc_io(void *arg, int is_write, int is_header, unsigned file, uint64_t off,
                   uint32_t len) {
  conc *c = arg;
  if (is_header) return 0;
  int n = atomic_fetch_add(&c->now, 1) + 1, m = atomic_load(&c->max);
  while (n > m && !atomic_compare_exchange_weak(&c->max, &m, n)) {}
  usleep(3000);
  atomic_fetch_sub(&c->now, 1);
  return 0;
}

Test(g3_store, queue_depth_bounds_concurrency) {
  conc cc;
  atomic_init(&cc.now, 0);
  atomic_init(&cc.max, 0);
  kv_g3_fault f = {.io = conc_io, .arg = &cc};
  store_t s;
  t_mkdir(s.dir, sizeof s.dir);
  t_arena(&s.arena, 4u << 20, 4096, &s.cls);
  kv_g3_dir d = {s.dir, 4u << 20};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = 4096,
                  .queue_depth = 3,
                  .backend = KV_G3_BACKEND_THREADS,
                  .fault = &f};
  s_open_opts(&s, &o);
  void *b = t_buf(&s.arena, s.cls);
  t_count c = {0};
  for (int i = 0; i < 24; i++) {
    uint32_t sl;
    kv_g3_key k = t_key((uint64_t)i);
    cr_assert_eq(kv_g3_alloc(s.g, &sl), 0);
    cr_assert_eq(kv_g3_write(s.g, sl, &k, 1, b, 4096, -1, t_count_cb, &c), 0);
  }
  kv_g3_drain(s.g);
  cr_assert_eq(c.err, 0);
  cr_assert_eq(atomic_load(&cc.max), 3);
  s_fini(&s);
}
