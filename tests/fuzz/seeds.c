/*
 * seeds.c - writes a seed corpus for fuzz_decode: one file per sample
 * frame (samples.h), plus a few streams of several frames back to back.
 * Usage: fuzz_seeds DIR (DIR must exist or be creatable). Exit 0 or 1.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "samples.h"

typedef struct seeds {
  const char *dir;
  unsigned n;
  kv_buf stream;
  int err;
} seeds;

static int write_file(seeds *s, const void *p, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/seed-%03u", s->dir, s->n++);
  FILE *f = fopen(path, "wb");
  if (!f) return -errno;
  size_t w = fwrite(p, 1, len, f);
  if (fclose(f) || w != len) return -EIO;
  return 0;
}

static void one(const kv_msg *m, const char *what, void *arg) {
  seeds *s = arg;
  kv_buf b;
  kv_buf_init(&b);
  int rc = kv_msg_encode(&b, m);
  if (!rc) rc = write_file(s, b.p, b.len);
  if (!rc && s->n % 4 == 0) rc = kv_buf_append(&s->stream, b.p, b.len);
  if (rc && !s->err) {
    fprintf(stderr, "fuzz_seeds: %s: %s\n", what, kv_strerror(rc));
    s->err = rc;
  }
  kv_buf_free(&b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 1;
  }
  seeds s = {.dir = argv[1]};
  kv_buf_init(&s.stream);
  if (mkdir(s.dir, 0755) && errno != EEXIST) {
    fprintf(stderr, "fuzz_seeds: %s: %s\n", s.dir, strerror(errno));
    return 1;
  }
  kv_samples(one, &s);
  if (!s.err) s.err = write_file(&s, s.stream.p, s.stream.len);
  kv_buf_free(&s.stream);
  if (s.err) return 1;
  printf("fuzz_seeds: %u seeds in %s\n", s.n, s.dir);
  return 0;
}
