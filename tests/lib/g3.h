/*
 * g3.h - what the G3 tests (tests/unit/test_g3_*.c) share: temp
 * directories on the real disk, a G2 arena for I/O buffers, block contents
 * that can be checked without keeping them, keys, and capture of the log
 * lines a test provokes. Criterion fixtures: a function fails the running
 * test (cr_assert) when what it needs does not hold. The headers the
 * tests use with it come with it.
 */
#ifndef KV_TESTS_LIB_G3_H
#define KV_TESTS_LIB_G3_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "tiers/arena.h"
#include "tiers/g3.h"

#define T_NBACKENDS 2
extern const kv_g3_backend t_backends[T_NBACKENDS]; /* uring, threads */

/* A fresh directory under /tmp (the real disk, so O_DIRECT works). */
void t_mkdir(char *out, size_t n);
/* Removes it with all it holds. */
void t_rmdir(const char *dir);

/* Is io_uring usable here? Tests of the uring backend skip without it. */
int t_uring_ok(void);

/* An arena of `bytes` cut in slots of `slot` bytes; *cls their class. */
void t_arena(kv_arena *a, size_t bytes, uint32_t slot, int *cls);

/* One slot of class cls (the arena must have room). */
void *t_buf(kv_arena *a, int cls);

/* Deterministic block contents for (seed, i); t_check: 1 when buf holds
 * them. */
void t_fill(void *buf, uint32_t len, uint64_t seed, uint64_t i);
int t_check(const void *buf, uint32_t len, uint64_t seed, uint64_t i);

/* A 16-byte key of i in a fixed namespace; what a lookup of it expects
 * (len bytes, sequence seq). */
kv_g3_key t_key(uint64_t i);
kv_g3_expect t_expect(uint64_t i, uint32_t len, uint64_t seq);

/* A safetensors file's data section (everything after the JSON header: the
 * files of bench/kv hold one 16-bit array of a trained model's KV),
 * malloc'd; *n its length. */
uint8_t *t_kv_data(const char *path, size_t *n);

/* Log capture: stderr goes to a file until t_log_end(), which returns the
 * number of lines containing `needle` and echoes the log to stdout. */
typedef struct t_log {
  int saved;
  char path[64];
} t_log;
void t_log_begin(t_log *l);
int t_log_end(t_log *l, const char *needle);

/* Completions counted by t_count_cb (arg: a t_count). */
typedef struct t_count {
  int n, err, last;
} t_count;
void t_count_cb(int status, void *arg);

#endif
