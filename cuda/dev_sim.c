/*
 * dev_sim.c - the G1 device simulated in host memory (see dev.h, G1.md).
 *
 * A pool is a memfd mapped MAP_SHARED, its size rounded up to a 2 MiB
 * granularity like a CUDA VMM allocation; it is exported as its fd and a
 * worker maps the same pages. Each copy direction has one thread that runs
 * its submissions in FIFO order with memcpy and finishes each through
 * kv__dev_complete - the completion path of the CUDA backend's host
 * function. The address checks are dev.c's, shared with CUDA.
 */
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/dev_int.h"

#define SIM_GRANULARITY ((size_t)2 << 20)

typedef struct sim_q {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  kv__sub *head, *tail;
  int stop;
  int started;
  pthread_t th;
  kv_dev *dev;
} sim_q;

typedef struct sim_state {
  sim_q q[KV_DEV_NDIR];
} sim_state;

/* The uuid of simulated device `ordinal` on this boot of this host. */
static void sim_uuid(int ordinal, uint8_t out[16]) {
  char boot[64] = "no-boot-id";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "no-boot-id");
    fclose(f);
  }
  char in[128];
  int n = snprintf(in, sizeof in, "kvcached-sim-g1|%s|%d", boot, ordinal);
  crypto_generichash(out, 16, (const unsigned char *)in, (size_t)n, NULL, 0);
  out[6] = (uint8_t)((out[6] & 0x0f) | 0x80); /* RFC 9562 version 8 */
  out[8] = (uint8_t)((out[8] & 0x3f) | 0x80);
}

static void *sim_thread(void *arg) {
  sim_q *q = arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    kv__sub *s = q->head;
    if (!s) break; /* stop, and nothing left */
    q->head = s->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    unsigned k = kv__sub_ncopy(s);
    for (unsigned i = 0; i < k; i++) memcpy(s->v[i].dst, s->v[i].src, s->v[i].bytes);
    s->status = 0;
    kv__dev_complete(q->dev, s);
    pthread_mutex_lock(&q->mu);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void sim_drain(kv_dev *dev) {
  sim_state *st = dev->bk;
  if (!st) return;
  for (int d = 0; d < KV_DEV_NDIR; d++) {
    sim_q *q = &st->q[d];
    if (!q->started) continue;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL); /* the thread drains its queue first */
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    q->started = 0;
  }
}

static void sim_close(kv_dev *dev) {
  free(dev->bk);
  dev->bk = NULL;
}

static int sim_open(kv_dev *dev, const kv_dev_opts *o, char *why, size_t len) {
  if (o->uuid) {
    int found = -1;
    for (int i = 0; i < KV_DEV_SIM_NDEV && found < 0; i++) {
      uint8_t u[16];
      sim_uuid(i, u);
      if (!memcmp(u, o->uuid, 16)) found = i;
    }
    if (found < 0) {
      snprintf(why, len, "sim: no simulated device has the requested uuid");
      return -ENODEV;
    }
    dev->ordinal = found;
  } else if (o->ordinal >= KV_DEV_SIM_NDEV) {
    snprintf(why, len, "sim: ordinal %d out of 0..%d", o->ordinal, KV_DEV_SIM_NDEV - 1);
    return -ENODEV;
  }
  sim_uuid(dev->ordinal, dev->uuid);
  sim_state *st = calloc(1, sizeof *st);
  if (!st) {
    snprintf(why, len, "sim: out of memory");
    return -ENOMEM;
  }
  dev->bk = st;
  for (int d = 0; d < KV_DEV_NDIR; d++) {
    sim_q *q = &st->q[d];
    q->dev = dev;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    int rc = pthread_create(&q->th, NULL, sim_thread, q);
    if (rc) {
      pthread_cond_destroy(&q->cv);
      pthread_mutex_destroy(&q->mu);
      sim_drain(dev);
      sim_close(dev);
      snprintf(why, len, "sim: pthread_create: %s", strerror(rc));
      return -rc;
    }
    q->started = 1;
  }
  return 0;
}

static int sim_pool_create(kv_dev *dev, kv_dev_pool *p, size_t bytes) {
  if (bytes > SIZE_MAX - SIM_GRANULARITY)
    return kv__dev_fail(dev, -ENOMEM, "sim: pool of %zu bytes", bytes);
  size_t len = (bytes + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
  int fd = memfd_create("kvcached-g1-sim", MFD_CLOEXEC);
  if (fd < 0) return kv__dev_fail(dev, -errno, "sim: memfd_create: %s", strerror(errno));
  if (ftruncate(fd, (off_t)len) < 0) {
    int rc = -errno;
    close(fd);
    return kv__dev_fail(dev, rc, "sim: ftruncate %zu: %s", len, strerror(-rc));
  }
  void *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (b == MAP_FAILED) {
    int rc = -errno;
    close(fd);
    return kv__dev_fail(dev, rc, "sim: mmap %zu: %s", len, strerror(-rc));
  }
  p->base = b;
  p->bytes = len;
  p->fd = fd;
  p->kind = KV_DEVX_SIM_FD;
  return 0;
}

static void sim_pool_destroy(kv_dev *dev, kv_dev_pool *p) {
  munmap(p->base, p->bytes);
  close(p->fd);
}

static int sim_import(kv_dev *dev, const kv_dev_export *x, kv_dev_map *m) {
  struct stat sb;
  if (fstat(x->fd, &sb) < 0) return kv__dev_fail(dev, -errno, "sim: fstat: %s", strerror(errno));
  if (x->bytes > SIZE_MAX || (uint64_t)sb.st_size < x->bytes)
    return kv__dev_fail(dev, -EINVAL, "sim: fd holds %lld bytes, export says %llu",
                        (long long)sb.st_size, (unsigned long long)x->bytes);
  void *b = mmap(NULL, (size_t)x->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, x->fd, 0);
  if (b == MAP_FAILED) return kv__dev_fail(dev, -errno, "sim: mmap: %s", strerror(errno));
  m->base = b;
  m->bytes = (size_t)x->bytes;
  return 0;
}

static void sim_unmap(kv_dev *dev, kv_dev_map *m) { munmap(m->base, m->bytes); }

/* There is nothing to pin: dev.c keeps each kv_dev's ranges. What is
 * modelled is that CUDA's registration belongs to the process (portable):
 * a range a second kv_dev registers is already registered (1), and only
 * its first registrant undoes it. `mapped` changes nothing: simulated
 * device memory and host memory are one address space, so a mapped
 * range's device-side address is its own (no host_device_ptr). */
#define SIM_HOST_MAX 256
static struct {
  pthread_mutex_t mu;
  unsigned n;
  void *p[SIM_HOST_MAX];
} sim_host = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int sim_host_register(kv_dev *dev, void *p, size_t n, int mapped) {
  int rc = 0;
  pthread_mutex_lock(&sim_host.mu);
  for (unsigned i = 0; i < sim_host.n && rc == 0; i++)
    if (sim_host.p[i] == p) rc = 1;
  if (rc == 0 && sim_host.n == SIM_HOST_MAX)
    rc = kv__dev_fail(dev, -ENOMEM, "sim: more than %d host ranges registered", SIM_HOST_MAX);
  if (rc == 0) sim_host.p[sim_host.n++] = p;
  pthread_mutex_unlock(&sim_host.mu);
  return rc;
}

static void sim_host_unregister(kv_dev *dev, void *p) {
  pthread_mutex_lock(&sim_host.mu);
  for (unsigned i = 0; i < sim_host.n; i++)
    if (sim_host.p[i] == p) {
      sim_host.p[i] = sim_host.p[--sim_host.n];
      break;
    }
  pthread_mutex_unlock(&sim_host.mu);
}

int kv_dev_sim_host_registered(const void *p) {
  int found = 0;
  pthread_mutex_lock(&sim_host.mu);
  for (unsigned i = 0; i < sim_host.n && !found; i++) found = sim_host.p[i] == p;
  pthread_mutex_unlock(&sim_host.mu);
  return found;
}

static int sim_submit(kv_dev *dev, kv__sub *s) {
  sim_q *q = &((sim_state *)dev->bk)->q[s->dir];
  pthread_mutex_lock(&q->mu);
  if (q->tail) q->tail->next = s;
  else q->head = s;
  q->tail = s;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

static int sim_memcpy_sync(kv_dev *dev, kv_dev_dir dir, void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return 0;
}

const kv__backend kv__dev_sim = {
    .id = KV_DEV_SIM,
    .open = sim_open,
    .drain = sim_drain,
    .close = sim_close,
    .pool_create = sim_pool_create,
    .pool_destroy = sim_pool_destroy,
    .import = sim_import,
    .unmap = sim_unmap,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .submit = sim_submit,
    .memcpy_sync = sim_memcpy_sync,
};
