/* tmpdir.c - temporary directories for the tests (tmpdir.h). */
#include "tests/lib/tmpdir.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int kvt_mkdtemp(char *out, size_t n, const char *prefix) {
  int k = snprintf(out, n, "/tmp/%s-XXXXXX", prefix);
  if (k < 0 || (size_t)k >= n) return -ENAMETOOLONG;
  return mkdtemp(out) ? 0 : -errno;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p) && errno != ENOENT ? -1 : 0;
}

int kvt_rmtree(const char *dir) {
  if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
  return errno == ENOENT ? 0 : -errno;
}
