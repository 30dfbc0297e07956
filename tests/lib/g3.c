/* g3.c - what the G3 tests share (g3.h). */
#include "tests/lib/g3.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/le.h"
#include "tests/lib/tmpdir.h"

const kv_g3_backend t_backends[T_NBACKENDS] = {KV_G3_BACKEND_URING, KV_G3_BACKEND_THREADS};

void t_mkdir(char *out, size_t n) {
  int rc = kvt_mkdtemp(out, n, "kvg3-test");
  cr_assert_eq(rc, 0, "mkdtemp: %s", strerror(-rc));
}

void t_rmdir(const char *dir) { kvt_rmtree(dir); }

int t_uring_ok(void) {
  static int ok = -1;
  if (ok < 0) {
    char dir[64];
    t_mkdir(dir, sizeof dir);
    kv_g3_dir d = {dir, 8 << 20};
    kv_g3_opts o = {.dirs = &d,
                    .ndirs = 1,
                    .block_bytes = 4096,
                    .queue_depth = 2,
                    .backend = KV_G3_BACKEND_URING};
    kv_g3 *g;
    ok = kv_g3_open(&g, &o, NULL) == 0;
    if (ok) kv_g3_close(g);
    t_rmdir(dir);
  }
  return ok;
}

void t_arena(kv_arena *a, size_t bytes, uint32_t slot, int *cls) {
  kv_arena_opts ao = {
      .capacity = bytes, .page_bytes = slot > (4u << 20) ? slot : (4u << 20), .no_lock = 1};
  if (ao.page_bytes > bytes) ao.page_bytes = bytes;
  cr_assert_eq(kv_arena_init(a, &ao), 0);
  *cls = kv_arena_class_for(a, slot);
  cr_assert_geq(*cls, 0);
}

void *t_buf(kv_arena *a, int cls) {
  uint32_t s;
  cr_assert_eq(kv_arena_alloc(a, cls, &s), 0, "arena full");
  return kv_arena_ptr(a, s);
}

void t_fill(void *buf, uint32_t len, uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
  uint8_t *p = buf;
  for (uint32_t k = 0; k < len; k += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + k, &x, len - k < 8 ? len - k : 8);
  }
}
int t_check(const void *buf, uint32_t len, uint64_t seed, uint64_t i) {
  uint8_t *want = malloc(len);
  t_fill(want, len, seed, i);
  int ok = memcmp(buf, want, len) == 0;
  free(want);
  return ok;
}

uint8_t *t_kv_data(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s: %s", path, strerror(errno));
  uint8_t le[8];
  cr_assert_eq(fread(le, 1, 8, f), 8u);
  uint64_t hlen = kv_ld64(le);
  cr_assert(fseek(f, 0, SEEK_END) == 0);
  long size = ftell(f);
  cr_assert(hlen < (uint64_t)size && size > 0);
  *n = (size_t)size - 8 - (size_t)hlen;
  cr_assert(*n > 0 && *n % 2 == 0);
  uint8_t *d = malloc(*n);
  cr_assert(fseek(f, (long)(8 + hlen), SEEK_SET) == 0);
  cr_assert_eq(fread(d, 1, *n, f), *n);
  fclose(f);
  return d;
}

kv_g3_key t_key(uint64_t i) {
  kv_g3_key k;
  memset(&k, 0, sizeof k);
  for (int j = 0; j < KV_G3_NS_BYTES; j++) k.ns[j] = (uint8_t)(0xA0 + j);
  k.len = 16;
  memcpy(k.b, &i, sizeof i);
  memcpy(k.b + 8, "kvg3test", 8);
  return k;
}

kv_g3_expect t_expect(uint64_t i, uint32_t len, uint64_t seq) {
  kv_g3_expect e;
  memset(&e, 0, sizeof e);
  e.key = t_key(i);
  e.len = len;
  e.seq = seq;
  e.flags = KV_G3_EXPECT_SEQ;
  return e;
}

void t_log_begin(t_log *l) {
  snprintf(l->path, sizeof l->path, "/tmp/kvg3-log-XXXXXX");
  int fd = mkstemp(l->path);
  cr_assert_geq(fd, 0);
  fflush(stderr);
  l->saved = dup(2);
  dup2(fd, 2);
  close(fd);
}
int t_log_end(t_log *l, const char *needle) {
  fflush(stderr);
  dup2(l->saved, 2);
  close(l->saved);
  FILE *f = fopen(l->path, "r");
  cr_assert_not_null(f);
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    fputs(line, stdout);
    if (strstr(line, needle)) n++;
  }
  fclose(f);
  unlink(l->path);
  return n;
}

void t_count_cb(int status, void *arg) {
  t_count *c = arg;
  c->n++;
  if (status) c->err++;
  c->last = status;
}
