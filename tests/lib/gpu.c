/* gpu.c - what the GPU programs share (gpu.h). */
#include "tests/lib/gpu.h"

#include <stdlib.h>
int gpu_daemon_start(kvt_daemon *d, const char *g2, const char *const *sets) {
  const char *args[] = {"--g2-capacity", g2,     "--set", "g2.lock=no", "--g3-path", "",
                        "--log-level",   "warn", NULL};
  kvt_daemon_opts o = {.args = args, .sets = sets, .wait_ms = 30000};
  int rc = kvt_daemon_start(d, &o);
  if (rc > 0) fprintf(stderr, "    kvcached exited (status %d) before serving\n", rc);
  return rc;
}

int gpu_daemon_stop(kvt_daemon *d) {
  int rc = kvt_daemon_stop(d);
  kvt_daemon_free(d);
  return rc;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmpd);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
