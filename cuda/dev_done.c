/*
 * dev_done.c - how a G1 device backend (dev_sim.c, dev_cuda.c) finishes:
 * kv__dev_complete pushes a submission onto the device's completion queue,
 * kv__dev_fail sets the device's reason. Shared by dev.c and the backends
 * and below both, so a backend reports without naming dev.c. Contract in
 * dev_int.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "cuda/dev_int.h"

int kv__dev_fail(kv_dev *dev, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dev->reason, sizeof dev->reason, fmt, ap);
  va_end(ap);
  return rc;
}

void kv__dev_complete(kv_dev *dev, kv__sub *s) {
  if (s->fail && s->status == 0) s->status = s->fail;
  s->next = NULL;
  pthread_mutex_lock(&dev->qmu);
  if (dev->done_tail) dev->done_tail->next = s;
  else dev->done_head = s;
  dev->done_tail = s;
  pthread_mutex_unlock(&dev->qmu);
  uint64_t one = 1;
  /* Only EAGAIN (counter at its maximum) can fail: it is readable anyway. */
  while (write(dev->efd, &one, sizeof one) < 0 && errno == EINTR) {}
}
