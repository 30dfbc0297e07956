/* test_g3_faults.c - G3 failure handling on both backends: flipped payload
 * and header bytes, mismatched expectations, truncated files, disk full
 * (real EFBIG under RLIMIT_FSIZE, injected ENOSPC), I/O errors, O_DIRECT
 * refused (injected, and a tmpfs), io_uring refused (injected, and a real
 * seccomp filter). Bad bytes are never reported as success. */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "tests/lib/g3.h"
#include "tiers/g3_format.h"

typedef struct fx {
  char dir[64];
  kv_arena arena;
  int cls;
  kv_g3 *g;
  kv_g3_open_info info;
  kv_g3_backend be;
  uint32_t block;
  uint64_t cap;
  const kv_g3_fault *fault;
  uint32_t slot[64];
  unsigned n;
} fx;

static void fx_open(fx *f) {
  kv_g3_dir d = {f->dir, f->cap};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = f->block,
                  .queue_depth = 4,
                  .backend = f->be,
                  .arena = &f->arena,
                  .fault = f->fault};
  int rc = kv_g3_open(&f->g, &o, &f->info);
  cr_assert_eq(rc, 0, "open: %s", kv_strerror(rc));
}

static int fx_init(fx *f, kv_g3_backend be, uint32_t block, uint64_t cap) {
  memset(f, 0, sizeof *f);
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) return 0;
  f->be = be;
  f->block = block;
  f->cap = cap;
  t_mkdir(f->dir, sizeof f->dir);
  t_arena(&f->arena, 8u << 20, block, &f->cls);
  fx_open(f);
  return 1;
}

static void fx_fini(fx *f) {
  kv_g3_close(f->g);
  kv_arena_fini(&f->arena);
  t_rmdir(f->dir);
}

/* Writes blocks 0..n-1 (seq 10+i). */
static void fx_fill(fx *f, unsigned n) {
  void *b = t_buf(&f->arena, f->cls);
  for (unsigned i = 0; i < n; i++) {
    t_fill(b, f->block, 1, i);
    kv_g3_key k = t_key(i);
    cr_assert_eq(kv_g3_alloc(f->g, &f->slot[i]), 0);
    int rc = kv_g3_write_sync(f->g, f->slot[i], &k, 10 + i, b, f->block);
    cr_assert_eq(rc, 0, "write %u: %s", i, kv_strerror(rc));
  }
  kv_arena_free(&f->arena, (uint32_t)(((uint8_t *)b - f->arena.base) / KV_ARENA_ALIGN));
  f->n = n;
}

static int fx_read(fx *f, unsigned i, void *b) {
  kv_g3_expect e = t_expect(i, f->block, 10 + i);
  memset(b, 0, f->block);
  int rc = kv_g3_read_sync(f->g, f->slot[i], &e, b);
  if (rc == 0) cr_assert(t_check(b, f->block, 1, i), "block %u read as success with bad bytes", i);
  return rc;
}

static void fx_path(const fx *f, char *p, size_t n) { snprintf(p, n, "%s/kvg3-0.dat", f->dir); }

static g3_sb fx_sb(const fx *f) {
  char p[128];
  fx_path(f, p, sizeof p);
  int fd = open(p, O_RDONLY);
  cr_assert_geq(fd, 0);
  uint8_t buf[G3_SECTOR];
  cr_assert_eq(pread(fd, buf, sizeof buf, 0), (ssize_t)sizeof buf);
  close(fd);
  g3_sb sb;
  cr_assert_eq(g3_sb_decode(&sb, buf), 0);
  return sb;
}

static void flip(const fx *f, uint64_t off) {
  char p[128];
  fx_path(f, p, sizeof p);
  int fd = open(p, O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t c;
  cr_assert_eq(pread(fd, &c, 1, (off_t)off), 1);
  c ^= 0x40;
  cr_assert_eq(pwrite(fd, &c, 1, (off_t)off), 1);
  fsync(fd);
  close(fd);
}

static int indexed(const kv_g3_entry *e, void *arg) {
  int *n = arg;
  (*n)++;
  return 0;
}

static int count_indexed(fx *f) {
  int n = 0;
  cr_assert_eq(kv_g3_foreach(f->g, indexed, &n), 0);
  return n;
}

/* The failed block: KV_ECORRUPT, counted, out of the index now and after a
 * restart; every other block still reads back. */
static void expect_dropped(fx *f, unsigned bad, int want_rc) {
  void *b = t_buf(&f->arena, f->cls);
  cr_assert_eq(fx_read(f, bad, b), want_rc);
  kv_g3_drain(f->g); /* the index delete commits */
  kv_g3_stats st;
  kv_g3_get_stats(f->g, &st);
  if (want_rc == KV_ECORRUPT) cr_assert_eq(st.corrupt, 1);
  cr_assert_eq(st.dropped, 1);
  cr_assert_eq(st.read_failed, 1);
  cr_assert_eq(count_indexed(f), (int)f->n - 1);
  cr_assert_eq(fx_read(f, bad, b), KV_ENOTFOUND);
  for (unsigned i = 0; i < f->n; i++)
    if (i != bad) cr_assert_eq(fx_read(f, i, b), 0, "block %u", i);
  /* the caller frees the dead slot; it is reusable */
  cr_assert_eq(kv_g3_free(f->g, f->slot[bad]), 0);
  kv_g3_close(f->g);
  fx_open(f);
  cr_assert_eq(f->info.indexed, f->n - 1);
}

Test(g3_faults, flipped_payload_byte) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    fx f;
    if (!fx_init(&f, t_backends[be], 65536, 4u << 20)) continue;
    fx_fill(&f, 6);
    kv_g3_close(f.g);
    g3_sb sb = fx_sb(&f);
    flip(&f, g3_data_pos(&sb, f.slot[3]) + 40000);
    fx_open(&f);
    t_log lg;
    t_log_begin(&lg);
    expect_dropped(&f, 3, KV_ECORRUPT);
    cr_assert_eq(t_log_end(&lg, "payload fails its CRC32C"), 1);
    fx_fini(&f);
  }
}

/* The last byte of the payload: a torn tail is caught too. */
Test(g3_faults, flipped_last_payload_byte_while_open) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    fx f;
    if (!fx_init(&f, t_backends[be], 16384, 4u << 20)) continue;
    fx_fill(&f, 4);
    g3_sb sb = fx_sb(&f);
    flip(&f, g3_data_pos(&sb, f.slot[0]) + 16383);
    expect_dropped(&f, 0, KV_ECORRUPT);
    fx_fini(&f);
  }
}

Test(g3_faults, flipped_header_bytes) {
  /* key byte, seq byte, header CRC byte */
  const unsigned where[] = {85, 27, 125};
  for (int be = 0; be < T_NBACKENDS; be++)
    for (int w = 0; w < 3; w++) {
      fx f;
      if (!fx_init(&f, t_backends[be], 8192, 4u << 20)) continue;
      fx_fill(&f, 5);
      kv_g3_close(f.g);
      g3_sb sb = fx_sb(&f);
      flip(&f, g3_hdr_pos(&sb, f.slot[2]) + where[w]);
      fx_open(&f);
      expect_dropped(&f, 2, KV_ECORRUPT);
      fx_fini(&f);
    }
}

/* A header that is intact but not the one expected (seq, key, length). */
Test(g3_faults, header_mismatch) {
  fx f;
  fx_init(&f, KV_G3_BACKEND_THREADS, 8192, 4u << 20);
  fx_fill(&f, 4);
  void *b = t_buf(&f.arena, f.cls);
  kv_g3_expect e = t_expect(1, 8192, 999); /* wrong seq */
  cr_assert_eq(kv_g3_read_sync(f.g, f.slot[1], &e, b), KV_ECORRUPT);
  e = t_expect(0, 8192, 11); /* block 0's key in block 1's slot */
  e.flags = KV_G3_EXPECT_SEQ;
  cr_assert_eq(kv_g3_read_sync(f.g, f.slot[2], &e, b), KV_ECORRUPT);
  e = t_expect(3, 4096, 13); /* wrong length */
  cr_assert_eq(kv_g3_read_sync(f.g, f.slot[3], &e, b), KV_ECORRUPT);
  e = t_expect(0, 8192, 10); /* wrong crc */
  e.flags = KV_G3_EXPECT_CRC;
  e.crc = 1234;
  cr_assert_eq(kv_g3_read_sync(f.g, f.slot[0], &e, b), KV_ECORRUPT);
  kv_g3_drain(f.g);
  kv_g3_stats st;
  kv_g3_get_stats(f.g, &st);
  cr_assert_eq(st.corrupt, 4);
  cr_assert_eq(count_indexed(&f), 0);
  fx_fini(&f);
}

/* The file is cut short under a running store: the read is short. */
Test(g3_faults, truncated_while_open) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    fx f;
    if (!fx_init(&f, t_backends[be], 65536, 4u << 20)) continue;
    fx_fill(&f, 5);
    g3_sb sb = fx_sb(&f);
    char p[128];
    fx_path(&f, p, sizeof p);
    cr_assert_eq(truncate(p, (off_t)(g3_data_pos(&sb, f.slot[4]) + 8192)), 0);
    expect_dropped(&f, 4, KV_ECORRUPT);
    kv_g3_stats st;
    kv_g3_get_stats(f.g, &st);
    fx_fini(&f);
  }
}

Test(g3_faults, truncated_while_open_counts_short_read) {
  fx f;
  fx_init(&f, KV_G3_BACKEND_THREADS, 65536, 4u << 20);
  fx_fill(&f, 3);
  g3_sb sb = fx_sb(&f);
  char p[128];
  fx_path(&f, p, sizeof p);
  cr_assert_eq(truncate(p, (off_t)g3_data_pos(&sb, f.slot[2])), 0);
  void *b = t_buf(&f.arena, f.cls);
  cr_assert_eq(fx_read(&f, 2, b), KV_ECORRUPT);
  kv_g3_stats st;
  kv_g3_get_stats(f.g, &st);
  cr_assert_eq(st.short_reads, 1);
  fx_fini(&f);
}

/* Cut short while closed: open restores the length, says so, and the
 * blocks that were beyond the end fail verification. */
Test(g3_faults, truncated_while_closed) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    fx f;
    if (!fx_init(&f, t_backends[be], 65536, 4u << 20)) continue;
    fx_fill(&f, 5);
    kv_g3_close(f.g);
    g3_sb sb = fx_sb(&f);
    char p[128];
    fx_path(&f, p, sizeof p);
    cr_assert_eq(truncate(p, (off_t)(g3_data_pos(&sb, f.slot[3]) + 4096)), 0);
    t_log lg;
    t_log_begin(&lg);
    fx_open(&f);
    cr_assert_eq(t_log_end(&lg, "shorter than its layout"), 1);
    void *b = t_buf(&f.arena, f.cls);
    cr_assert_eq(fx_read(&f, 3, b), KV_ECORRUPT);
    cr_assert_eq(fx_read(&f, 4, b), KV_ECORRUPT);
    for (unsigned i = 0; i < 3; i++) cr_assert_eq(fx_read(&f, i, b), 0);
    kv_g3_drain(f.g);
    cr_assert_eq(count_indexed(&f), 3);
    fx_fini(&f);
  }
}

/* ---- disk full ------------------------------------------------------------- */
#define CHECK(c)                                                            \
  do {                                                                      \
    if (!(c)) {                                                             \
      fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #c); \
      fflush(NULL);                                                         \
      _exit(1);                                                             \
    }                                                                       \
  } while (0)

static int wait_child(pid_t pid) {
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st), "child died (signal %d)", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return WEXITSTATUS(st);
}

/* Real EFBIG: the file size limit cuts the data area after `ok` slots. */
static void rlimit_full(kv_g3_backend be) {
  fx f;
  if (!fx_init(&f, be, 65536, 16u << 20)) return;
  g3_sb sb = fx_sb(&f);
  kv_g3_close(f.g);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    fx_open(&f);
    const unsigned ok = 20;
    void *b = t_buf(&f.arena, f.cls);
    for (unsigned i = 0; i < ok; i++) {
      t_fill(b, 65536, 1, i);
      kv_g3_key k = t_key(i);
      CHECK(kv_g3_alloc(f.g, &f.slot[i]) == 0);
      CHECK(f.slot[i] == i);
      CHECK(kv_g3_write_sync(f.g, f.slot[i], &k, 10 + i, b, 65536) == 0);
    }
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {g3_data_pos(&sb, ok) + 32768, RLIM_INFINITY};
    rl.rlim_max = rl.rlim_cur;
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    t_log lg;
    t_log_begin(&lg);
    /* several writes in flight past the limit: all fail, one log line */
    t_count c = {0};
    uint32_t sl[4];
    for (int i = 0; i < 4; i++) {
      kv_g3_key k = t_key(100 + (unsigned)i);
      CHECK(kv_g3_alloc(f.g, &sl[i]) == 0);
      CHECK(kv_g3_write(f.g, sl[i], &k, 1, b, 65536, -1, t_count_cb, &c) == 0);
    }
    kv_g3_drain(f.g);
    int lines = t_log_end(&lg, "is now full");
    CHECK(c.n == 4 && c.err == 4);
    CHECK(c.last == -EFBIG);
    CHECK(lines == 1);
    CHECK(kv_g3_get_state(f.g) == KV_G3_FULL);
    uint32_t s;
    CHECK(kv_g3_alloc(f.g, &s) == -ENOSPC);
    kv_g3_key k = t_key(200);
    CHECK(kv_g3_free(f.g, sl[0]) == 0);
    CHECK(kv_g3_write(f.g, sl[1], &k, 1, b, 65536, -1, NULL, NULL) == -ENOSPC);
    kv_g3_stats st;
    kv_g3_get_stats(f.g, &st);
    CHECK(st.nospace == 4 && st.write_failed == 4);
    for (unsigned i = 0; i < ok; i++) {
      kv_g3_expect e = t_expect(i, 65536, 10 + i);
      CHECK(kv_g3_read_sync(f.g, f.slot[i], &e, b) == 0);
      CHECK(t_check(b, 65536, 1, i));
    }
    kv_g3_close(f.g);
    fflush(NULL);
    _exit(0);
  }
  cr_assert_eq(wait_child(pid), 0);
  /* after the limit is gone, everything stored before is still there */
  fx_open(&f);
  cr_assert_eq(f.info.indexed, 20);
  fx_fini(&f);
}

Test(g3_faults, disk_full_rlimit_uring) { rlimit_full(KV_G3_BACKEND_URING); }
Test(g3_faults, disk_full_rlimit_threads) { rlimit_full(KV_G3_BACKEND_THREADS); }

/* ---- injected errors -------------------------------------------------------- */
typedef struct inject {
  atomic_int write_err, read_err; /* errno to return (positive), 0 none */
  atomic_int hits;
} inject;

static int inject_io(void *arg, int is_write, int is_header, unsigned file, uint64_t off,
                     uint32_t len) {
  inject *in = arg;
  int e = is_write ? atomic_load(&in->write_err) : atomic_load(&in->read_err);
  if (!e || is_header) return 0;
  atomic_fetch_add(&in->hits, 1);
  return -e;
}

/* Opens an 8 KiB-block store on backend be whose transfers go through
 * fault. 0 (nothing opened) where io_uring is not available. */
static int fx_init_fault(fx *f, kv_g3_backend be, const kv_g3_fault *fault) {
  memset(f, 0, sizeof *f);
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) return 0;
  f->be = be, f->block = 8192, f->cap = 4u << 20, f->fault = fault;
  t_mkdir(f->dir, sizeof f->dir);
  t_arena(&f->arena, 8u << 20, f->block, &f->cls);
  fx_open(f);
  return 1;
}

static void injected_write(kv_g3_backend be, int err, kv_g3_state want, int alloc_rc,
                           const char *needle) {
  inject in = {0};
  kv_g3_fault fault = {.io = inject_io, .arg = &in};
  fx f;
  if (!fx_init_fault(&f, be, &fault)) return;
  fx_fill(&f, 5);
  atomic_store(&in.write_err, err);
  void *b = t_buf(&f.arena, f.cls);
  t_log lg;
  t_log_begin(&lg);
  t_count c = {0};
  for (int i = 0; i < 3; i++) {
    uint32_t s;
    kv_g3_key k = t_key(50 + (unsigned)i);
    cr_assert_eq(kv_g3_alloc(f.g, &s), 0);
    cr_assert_eq(kv_g3_write(f.g, s, &k, 1, b, 8192, -1, t_count_cb, &c), 0);
  }
  kv_g3_drain(f.g);
  cr_assert_eq(t_log_end(&lg, needle), 1);
  cr_assert_eq(c.err, 3);
  cr_assert_eq(c.last, -err);
  cr_assert_eq(kv_g3_get_state(f.g), want);
  uint32_t s;
  cr_assert_eq(kv_g3_alloc(f.g, &s), alloc_rc);
  for (unsigned i = 0; i < 5; i++) cr_assert_eq(fx_read(&f, i, b), 0);
  cr_assert_eq(count_indexed(&f), 5);
  /* the operator fixed it */
  atomic_store(&in.write_err, 0);
  kv_g3_resume(f.g);
  cr_assert_eq(kv_g3_alloc(f.g, &s), 0);
  kv_g3_key k = t_key(77);
  cr_assert_eq(kv_g3_write_sync(f.g, s, &k, 1, b, 8192), 0);
  fx_fini(&f);
}

Test(g3_faults, injected_enospc) {
  for (int be = 0; be < T_NBACKENDS; be++)
    injected_write(t_backends[be], ENOSPC, KV_G3_FULL, -ENOSPC, "is now full");
}

Test(g3_faults, injected_write_eio) {
  for (int be = 0; be < T_NBACKENDS; be++)
    injected_write(t_backends[be], EIO, KV_G3_DEGRADED, KV_EDEGRADED, "is now degraded");
}

/* A block's header and payload go to the disk as one transfer: a write
 * whose payload is refused leaves no record header behind. The uring
 * engine used to issue the header as a transfer of its own, which landed
 * even when the payload's failed (a header naming bytes never written). */
Test(g3_faults, refused_payload_leaves_no_header) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    inject in = {0};
    kv_g3_fault fault = {.io = inject_io, .arg = &in};
    fx f;
    if (!fx_init_fault(&f, t_backends[be], &fault)) continue;
    void *b = t_buf(&f.arena, f.cls);
    t_fill(b, f.block, 3, 0);
    atomic_store(&in.write_err, EIO);
    uint32_t s;
    kv_g3_key k = t_key(9);
    cr_assert_eq(kv_g3_alloc(f.g, &s), 0);
    cr_assert_eq(kv_g3_write_sync(f.g, s, &k, 1, b, f.block), -EIO);
    cr_assert_gt(atomic_load(&in.hits), 0);
    kv_g3_close(f.g);
    f.g = NULL;
    g3_sb sb = fx_sb(&f);
    char p[128];
    fx_path(&f, p, sizeof p);
    int fd = open(p, O_RDONLY);
    cr_assert_geq(fd, 0);
    uint8_t h[G3_SECTOR], zero[G3_SECTOR] = {0};
    cr_assert_eq(pread(fd, h, sizeof h, (off_t)g3_hdr_pos(&sb, s)), (ssize_t)sizeof h);
    close(fd);
    cr_assert_eq(memcmp(h, zero, sizeof h), 0, "%s: a header was written for a failed write",
                 kv_g3_backend_name(f.be));
    kv_arena_fini(&f.arena);
    t_rmdir(f.dir);
  }
}

Test(g3_faults, injected_read_eio) {
  for (int be = 0; be < T_NBACKENDS; be++) {
    inject in = {0};
    kv_g3_fault fault = {.io = inject_io, .arg = &in};
    fx f;
    if (!fx_init_fault(&f, t_backends[be], &fault)) continue;
    fx_fill(&f, 4);
    void *b = t_buf(&f.arena, f.cls);
    atomic_store(&in.read_err, EIO);
    cr_assert_eq(fx_read(&f, 1, b), -EIO);
    atomic_store(&in.read_err, 0);
    kv_g3_drain(f.g);
    kv_g3_stats st;
    kv_g3_get_stats(f.g, &st);
    cr_assert_eq(st.io_errors, 1);
    cr_assert_eq(st.corrupt, 0);
    cr_assert_eq(st.dropped, 1);
    cr_assert_eq(kv_g3_get_state(f.g), KV_G3_DEGRADED);
    cr_assert_eq(count_indexed(&f), 3);
    for (unsigned i = 0; i < 4; i++)
      if (i != 1) cr_assert_eq(fx_read(&f, i, b), 0);
    fx_fini(&f);
  }
}

/* ---- O_DIRECT refused --------------------------------------------------------- */
Test(g3_faults, odirect_refused_injected) {
  kv_g3_fault fault = {.refuse_direct = EINVAL};
  for (int be = 0; be < T_NBACKENDS; be++) {
    if (t_backends[be] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
    fx f;
    memset(&f, 0, sizeof f);
    f.be = t_backends[be], f.block = 8192, f.cap = 4u << 20, f.fault = &fault;
    t_mkdir(f.dir, sizeof f.dir);
    t_arena(&f.arena, 8u << 20, f.block, &f.cls);
    t_log lg;
    t_log_begin(&lg);
    fx_open(&f);
    cr_assert_eq(t_log_end(&lg, "refuses O_DIRECT"), 1);
    cr_assert_eq(f.info.direct, 0);
    fx_fill(&f, 6);
    kv_g3_close(f.g);
    fx_open(&f);
    cr_assert_eq(f.info.indexed, 6);
    void *b = t_buf(&f.arena, f.cls);
    for (unsigned i = 0; i < 6; i++) cr_assert_eq(fx_read(&f, i, b), 0);
    fx_fini(&f);
  }
  /* DIRECT_ON refuses to run buffered */
  char dir[64];
  t_mkdir(dir, sizeof dir);
  kv_g3_dir d = {dir, 4u << 20};
  kv_g3_opts o = {
      .dirs = &d, .ndirs = 1, .block_bytes = 4096, .direct = KV_G3_DIRECT_ON, .fault = &fault};
  kv_g3 *g;
  cr_assert_eq(kv_g3_open(&g, &o, NULL), -EINVAL);
  t_rmdir(dir);
}

/* A memory filesystem: runs whether or not it takes O_DIRECT. */
Test(g3_faults, tmpfs_store) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) cr_skip_test("no /dev/shm");
  for (int be = 0; be < T_NBACKENDS; be++) {
    if (t_backends[be] == KV_G3_BACKEND_URING && !t_uring_ok()) continue;
    fx f;
    memset(&f, 0, sizeof f);
    f.be = t_backends[be], f.block = 8192, f.cap = 4u << 20;
    snprintf(f.dir, sizeof f.dir, "/dev/shm/kvg3-test-XXXXXX");
    cr_assert_not_null(mkdtemp(f.dir));
    t_arena(&f.arena, 8u << 20, f.block, &f.cls);
    fx_open(&f);
    printf("tmpfs: O_DIRECT %s\n", f.info.direct ? "accepted" : "refused, buffered");
    fx_fill(&f, 4);
    kv_g3_close(f.g);
    fx_open(&f);
    void *b = t_buf(&f.arena, f.cls);
    for (unsigned i = 0; i < 4; i++) cr_assert_eq(fx_read(&f, i, b), 0);
    fx_fini(&f);
  }
}

/* ---- io_uring refused --------------------------------------------------------- */
Test(g3_faults, uring_refused_injected) {
  const int errs[] = {ENOSYS, EPERM};
  for (int i = 0; i < 2; i++) {
    kv_g3_fault fault = {.refuse_uring = errs[i]};
    fx f;
    memset(&f, 0, sizeof f);
    f.be = KV_G3_BACKEND_AUTO, f.block = 4096, f.cap = 4u << 20, f.fault = &fault;
    t_mkdir(f.dir, sizeof f.dir);
    t_arena(&f.arena, 8u << 20, f.block, &f.cls);
    t_log lg;
    t_log_begin(&lg);
    fx_open(&f);
    cr_assert_eq(t_log_end(&lg, "using the thread-pool backend"), 1);
    cr_assert_eq(f.info.backend, KV_G3_BACKEND_THREADS);
    fx_fill(&f, 4);
    void *b = t_buf(&f.arena, f.cls);
    for (unsigned j = 0; j < 4; j++) cr_assert_eq(fx_read(&f, j, b), 0);
    kv_g3_close(f.g);
    /* forcing io_uring fails cleanly instead */
    kv_g3_dir d = {f.dir, f.cap};
    kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = KV_G3_BACKEND_URING, .fault = &fault};
    cr_assert_eq(kv_g3_open(&f.g, &o, NULL), -errs[i]);
    f.g = NULL;
    fx_fini(&f);
  }
}

/* A real sandbox: a seccomp filter makes io_uring_setup fail with EPERM, as
 * container runtimes do; the auto backend runs on threads. */
Test(g3_faults, uring_refused_by_seccomp) {
#if defined(__x86_64__) && defined(__NR_io_uring_setup)
  fx f;
  memset(&f, 0, sizeof f);
  f.be = KV_G3_BACKEND_AUTO, f.block = 4096, f.cap = 4u << 20;
  t_mkdir(f.dir, sizeof f.dir);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fp = {.len = sizeof prog / sizeof prog[0], .filter = prog};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp) == 0);
    t_arena(&f.arena, 8u << 20, f.block, &f.cls);
    kv_g3_dir d = {f.dir, f.cap};
    kv_g3_opts o = {.dirs = &d, .ndirs = 1, .block_bytes = 4096, .arena = &f.arena};
    CHECK(kv_g3_open(&f.g, &o, &f.info) == 0);
    CHECK(f.info.backend == KV_G3_BACKEND_THREADS);
    void *b = t_buf(&f.arena, f.cls);
    t_fill(b, 4096, 1, 1);
    kv_g3_key k = t_key(1);
    uint32_t s;
    CHECK(kv_g3_alloc(f.g, &s) == 0);
    CHECK(kv_g3_write_sync(f.g, s, &k, 1, b, 4096) == 0);
    kv_g3_expect e = t_expect(1, 4096, 1);
    memset(b, 0, 4096);
    CHECK(kv_g3_read_sync(f.g, s, &e, b) == 0);
    CHECK(t_check(b, 4096, 1, 1));
    kv_g3_close(f.g);
    o.backend = KV_G3_BACKEND_URING;
    CHECK(kv_g3_open(&f.g, &o, NULL) == -EPERM);
    fflush(NULL);
    _exit(0);
  }
  cr_assert_eq(wait_child(pid), 0);
  t_rmdir(f.dir);
#else
  cr_skip_test("x86-64 only");
#endif
}
