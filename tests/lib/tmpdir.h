/*
 * tmpdir.h - temporary directories for the tests: made fresh under /tmp
 * (the real disk, where O_DIRECT works) and removed with all they hold.
 */
#ifndef KV_TESTS_LIB_TMPDIR_H
#define KV_TESTS_LIB_TMPDIR_H

#include <stddef.h>

/* A fresh directory /tmp/PREFIX-XXXXXX into out[0..n). 0 or -errno. */
int kvt_mkdtemp(char *out, size_t n, const char *prefix);

/* Removes dir and everything below it (links not followed). 0 or -errno;
 * a missing dir is 0. */
int kvt_rmtree(const char *dir);

#endif
