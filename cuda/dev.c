/*
 * dev.c - the G1 device's backend-independent half: backend selection,
 * checks of every argument and address, the range registry, the export
 * codec, the completion queue (its reaping; the backends push onto it
 * through dev_done.c). Contract in dev.h, internals in dev_int.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/hex.h"
#include "base/le.h"
#include "cuda/dev_int.h"

const char *kv_dev_backend_name(kv_dev_backend b) {
  switch (b) {
  case KV_DEV_AUTO: return "auto";
  case KV_DEV_CUDA: return "cuda";
  case KV_DEV_SIM: return "sim";
  }
  return "?";
}

static void set_out_reason(const kv_dev_opts *o, const char *r) {
  if (o && o->reason && o->reason_len) snprintf(o->reason, o->reason_len, "%s", r);
}

/* Allocates a dev and opens backend be on it. */
static int open_be(const kv__backend *be, const kv_dev_opts *o, kv_dev **out, char *why,
                   size_t whylen) {
  kv_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  d->be = be;
  d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->efd < 0) {
    int rc = -errno;
    snprintf(why, whylen, "eventfd: %s", strerror(errno));
    free(d);
    return rc;
  }
  int rc = pthread_mutex_init(&d->qmu, NULL);
  if (rc) {
    close(d->efd);
    free(d);
    snprintf(why, whylen, "pthread_mutex_init: %s", strerror(rc));
    return -rc;
  }
  d->ordinal = o->ordinal;
  rc = be->open(d, o, why, whylen);
  if (rc) {
    pthread_mutex_destroy(&d->qmu);
    close(d->efd);
    free(d);
    return rc;
  }
  *out = d;
  return 0;
}

int kv_dev_open(kv_dev **out, const kv_dev_opts *opts) {
  kv_dev_opts o = {0};
  if (opts) o = *opts;
  *out = NULL;
  set_out_reason(opts, "");
  if (o.backend == KV_DEV_AUTO) {
    const char *env = getenv("KV_DEV_BACKEND");
    if (env && *env) {
      if (!strcasecmp(env, "cuda")) o.backend = KV_DEV_CUDA;
      else if (!strcasecmp(env, "sim")) o.backend = KV_DEV_SIM;
      else if (strcasecmp(env, "auto")) {
        char r[KV_DEV_REASON_MAX];
        snprintf(r, sizeof r, "KV_DEV_BACKEND=%.64s: expected cuda, sim or auto", env);
        set_out_reason(opts, r);
        return -EINVAL;
      }
    }
  }
  if (o.backend != KV_DEV_AUTO && o.backend != KV_DEV_CUDA && o.backend != KV_DEV_SIM) {
    set_out_reason(opts, "unknown backend");
    return -EINVAL;
  }
  if (!o.uuid && o.ordinal < 0) {
    set_out_reason(opts, "negative device ordinal");
    return -EINVAL;
  }
  char why[KV_DEV_REASON_MAX] = "";
  int rc;
  if (o.backend == KV_DEV_SIM) {
    rc = open_be(&kv__dev_sim, &o, out, why, sizeof why);
    if (rc) set_out_reason(opts, why);
    /* Test hook (the simulation only): KV_DEV_SIM_FAIL=<errno> makes every
     * submission copy half its bytes and be reaped with -errno, so a
     * daemon's failure paths can be driven from outside. */
    const char *f = getenv("KV_DEV_SIM_FAIL");
    int err = f ? atoi(f) : 0;
    if (rc == 0 && err > 0) (*out)->fail_all = -err;
    return rc;
  }
  rc = open_be(&kv__dev_cuda, &o, out, why, sizeof why);
  if (rc == 0 || o.backend == KV_DEV_CUDA) {
    if (rc) set_out_reason(opts, why);
    return rc;
  }
  /* AUTO: CUDA did not answer; the simulation takes over, and says why. */
  char sw[KV_DEV_REASON_MAX] = "";
  rc = open_be(&kv__dev_sim, &o, out, sw, sizeof sw);
  if (rc) {
    char both[KV_DEV_REASON_MAX];
    snprintf(both, sizeof both, "%.120s; sim: %.120s", why, sw);
    set_out_reason(opts, both);
    return rc;
  }
  snprintf((*out)->reason, sizeof(*out)->reason, "%s", why);
  set_out_reason(opts, why);
  return 0;
}

/* Drops completions nobody will reap. */
static void drop_done(kv_dev *dev) {
  pthread_mutex_lock(&dev->qmu);
  kv__sub *s = dev->done_head;
  dev->done_head = dev->done_tail = NULL;
  pthread_mutex_unlock(&dev->qmu);
  while (s) {
    kv__sub *nx = s->next;
    if (dev->be->finish) dev->be->finish(dev, s);
    free(s);
    s = nx;
  }
}

void kv_dev_close(kv_dev *dev) {
  if (!dev) return;
  dev->be->drain(dev); /* every submission is now on the done list */
  drop_done(dev);
  while (dev->pools) {
    kv_dev_pool *p = dev->pools;
    dev->pools = p->next;
    dev->be->pool_destroy(dev, p);
    free(p);
  }
  while (dev->maps) {
    kv_dev_map *m = dev->maps;
    dev->maps = m->next;
    dev->be->unmap(dev, m);
    free(m);
  }
  for (unsigned i = 0; i < dev->nhost; i++)
    if (dev->host[i].own) dev->be->host_unregister(dev, (void *)dev->host[i].lo);
  free(dev->host);
  dev->be->close(dev);
  pthread_mutex_destroy(&dev->qmu);
  close(dev->efd);
  free(dev);
}

kv_dev_backend kv_dev_backend_of(const kv_dev *dev) { return dev->be->id; }
int kv_dev_ordinal(const kv_dev *dev) { return dev->ordinal; }
void kv_dev_uuid(const kv_dev *dev, uint8_t uuid[16]) { memcpy(uuid, dev->uuid, 16); }
const char *kv_dev_reason(const kv_dev *dev) { return dev->reason; }

/* ---- pools and maps ---------------------------------------------------------- */

int kv_dev_pool_create(kv_dev *dev, size_t bytes, kv_dev_pool **out) {
  *out = NULL;
  if (bytes == 0) return kv__dev_fail(dev, -EINVAL, "pool of 0 bytes");
  kv_dev_pool *p = calloc(1, sizeof *p);
  if (!p) return kv__dev_fail(dev, -ENOMEM, "out of memory");
  p->fd = -1;
  memcpy(p->uuid, dev->uuid, 16);
  int rc = dev->be->pool_create(dev, p, bytes);
  if (rc) {
    free(p);
    return rc;
  }
  p->next = dev->pools;
  dev->pools = p;
  *out = p;
  return 0;
}

int kv_dev_pool_destroy(kv_dev *dev, kv_dev_pool *pool) {
  if (!pool) return 0;
  if (dev->inflight)
    return kv__dev_fail(dev, -EBUSY, "pool destroy with %u submission(s) unreaped", dev->inflight);
  for (kv_dev_pool **pp = &dev->pools; *pp; pp = &(*pp)->next) {
    if (*pp == pool) {
      *pp = pool->next;
      dev->be->pool_destroy(dev, pool);
      free(pool);
      return 0;
    }
  }
  return kv__dev_fail(dev, -ENOENT, "pool is not this device's");
}

void *kv_dev_pool_base(const kv_dev_pool *pool) { return pool->base; }
size_t kv_dev_pool_bytes(const kv_dev_pool *pool) { return pool->bytes; }

int kv_dev_pool_export(const kv_dev_pool *pool, kv_dev_export *x) {
  memset(x, 0, sizeof *x);
  x->kind = pool->kind;
  x->fd = pool->fd;
  x->bytes = pool->bytes;
  memcpy(x->uuid, pool->uuid, 16);
  if (pool->kind == KV_DEVX_LEGACY_IPC) {
    x->handle_len = KV_DEVX_HANDLE_MAX;
    memcpy(x->handle, pool->handle, KV_DEVX_HANDLE_MAX);
  }
  return 0;
}

#define XMAGIC "KVDX"
#define XVER   1
#define XHEAD  32

static int kind_ok(uint8_t kind, uint16_t hlen) {
  switch (kind) {
  case KV_DEVX_VMM_FD:
  case KV_DEVX_SIM_FD: return hlen == 0;
  case KV_DEVX_LEGACY_IPC: return hlen == KV_DEVX_HANDLE_MAX;
  }
  return 0;
}

int kv_dev_export_encode(const kv_dev_export *x, uint8_t *buf, size_t cap) {
  if (!kind_ok(x->kind, x->handle_len) || x->bytes == 0) return -EINVAL;
  size_t n = XHEAD + (size_t)x->handle_len;
  if (cap < n) return -ENOSPC;
  memcpy(buf, XMAGIC, 4);
  buf[4] = XVER;
  buf[5] = x->kind;
  kv_st16(buf + 6, x->handle_len);
  kv_st64(buf + 8, x->bytes);
  memcpy(buf + 16, x->uuid, 16);
  memcpy(buf + XHEAD, x->handle, x->handle_len);
  return (int)n;
}

int kv_dev_export_decode(const uint8_t *buf, size_t len, kv_dev_export *x) {
  memset(x, 0, sizeof *x);
  x->fd = -1;
  if (!buf || len < XHEAD || len > KV_DEVX_ENCODED_MAX) return -EINVAL;
  if (memcmp(buf, XMAGIC, 4) || buf[4] != XVER) return -EINVAL;
  uint8_t kind = buf[5];
  uint16_t hlen = kv_ld16(buf + 6);
  uint64_t bytes = kv_ld64(buf + 8);
  if (!kind_ok(kind, hlen) || bytes == 0 || len != XHEAD + (size_t)hlen) return -EINVAL;
  x->kind = kind;
  x->handle_len = hlen;
  x->bytes = bytes;
  memcpy(x->uuid, buf + 16, 16);
  memcpy(x->handle, buf + XHEAD, hlen);
  return 0;
}

static void uuid_str(const uint8_t u[16], char *s, size_t cap) {
  snprintf(s, cap, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
           u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
           u[15]);
}

int kv_dev_pool_import(kv_dev *dev, const kv_dev_export *x, kv_dev_map **out) {
  *out = NULL;
  if (!kind_ok(x->kind, x->handle_len) || x->bytes == 0)
    return kv__dev_fail(dev, -EINVAL, "malformed export (kind %u)", x->kind);
  int sim = dev->be->id == KV_DEV_SIM;
  if ((x->kind == KV_DEVX_SIM_FD) != sim)
    return kv__dev_fail(dev, -EOPNOTSUPP, "a %s export cannot be mapped by the %s backend",
                        x->kind == KV_DEVX_SIM_FD ? "simulation" : "CUDA",
                        kv_dev_backend_name(dev->be->id));
  if (memcmp(x->uuid, dev->uuid, 16)) {
    char a[40], b[40];
    uuid_str(x->uuid, a, sizeof a);
    uuid_str(dev->uuid, b, sizeof b);
    return kv__dev_fail(dev, -ENODEV, "pool is on another device (%s; this one is %s)", a, b);
  }
  if (x->kind != KV_DEVX_LEGACY_IPC && x->fd < 0)
    return kv__dev_fail(dev, -EINVAL, "export of kind %u without an fd", x->kind);
  kv_dev_map *m = calloc(1, sizeof *m);
  if (!m) return kv__dev_fail(dev, -ENOMEM, "out of memory");
  m->kind = x->kind;
  int rc = dev->be->import(dev, x, m);
  if (rc) {
    free(m);
    return rc;
  }
  m->next = dev->maps;
  dev->maps = m;
  *out = m;
  return 0;
}

int kv_dev_unmap(kv_dev *dev, kv_dev_map *m) {
  if (!m) return 0;
  if (dev->inflight)
    return kv__dev_fail(dev, -EBUSY, "unmap with %u submission(s) unreaped", dev->inflight);
  for (kv_dev_map **pp = &dev->maps; *pp; pp = &(*pp)->next) {
    if (*pp == m) {
      *pp = m->next;
      dev->be->unmap(dev, m);
      free(m);
      return 0;
    }
  }
  return kv__dev_fail(dev, -ENOENT, "mapping is not this device's");
}

void *kv_dev_map_base(const kv_dev_map *m) { return m->base; }
size_t kv_dev_map_bytes(const kv_dev_map *m) { return m->bytes; }

const char *kv_dev_uuid_str(const uint8_t u[16], char out[KV_DEV_UUID_STR]) {
  char *p = out + 4;
  memcpy(out, "GPU-", 4);
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    *p++ = kv_hex_char(u[i] >> 4);
    *p++ = kv_hex_char(u[i]);
  }
  *p = 0;
  return out;
}

int kv_dev_current_uuid(uint8_t uuid[16]) {
  return kv__dev_cuda.current_uuid ? kv__dev_cuda.current_uuid(uuid) : -ENODEV;
}

/* ---- host ranges --------------------------------------------------------------- */

static int host_register(kv_dev *dev, void *p, size_t n, int mapped) {
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  if (!p || n == 0 || hi < lo) return kv__dev_fail(dev, -EINVAL, "host range %p+%zu", p, n);
  for (unsigned i = 0; i < dev->nhost; i++)
    if (lo < dev->host[i].hi && dev->host[i].lo < hi)
      return kv__dev_fail(dev, -EINVAL, "host range %p+%zu overlaps a registered one", p, n);
  if (dev->nhost == dev->caphost) {
    unsigned cap = dev->caphost ? dev->caphost * 2 : 8;
    kv__range *r = realloc(dev->host, cap * sizeof *r);
    if (!r) return kv__dev_fail(dev, -ENOMEM, "out of memory");
    dev->host = r;
    dev->caphost = cap;
  }
  int rc = dev->be->host_register(dev, p, n, mapped);
  if (rc < 0) return rc;
  dev->host[dev->nhost++] = (kv__range){lo, hi, rc == 0};
  return 0;
}

int kv_dev_host_register(kv_dev *dev, void *p, size_t n) { return host_register(dev, p, n, 0); }

int kv_dev_host_register_mapped(kv_dev *dev, void *p, size_t n, void **dptr) {
  *dptr = NULL;
  int rc = host_register(dev, p, n, 1);
  if (rc) return rc;
  if (!dev->be->host_device_ptr) {
    *dptr = p;
    return 0;
  }
  rc = dev->be->host_device_ptr(dev, p, dptr);
  if (rc) { /* the reason is the backend's: undo without touching it */
    *dptr = NULL;
    kv_dev_host_unregister(dev, p);
  }
  return rc;
}

int kv_dev_host_unregister(kv_dev *dev, void *p) {
  for (unsigned i = 0; i < dev->nhost; i++) {
    if (dev->host[i].lo != (uintptr_t)p) continue;
    if (dev->inflight)
      return kv__dev_fail(dev, -EBUSY, "host unregister with %u submission(s) unreaped",
                          dev->inflight);
    if (dev->host[i].own) dev->be->host_unregister(dev, p);
    dev->host[i] = dev->host[--dev->nhost];
    return 0;
  }
  return kv__dev_fail(dev, -ENOENT, "%p is not a registered host range", p);
}

/* ---- checks --------------------------------------------------------------------- */

static int in_host(const kv_dev *dev, uintptr_t lo, uintptr_t hi) {
  for (unsigned i = 0; i < dev->nhost; i++)
    if (lo >= dev->host[i].lo && hi <= dev->host[i].hi) return 1;
  return 0;
}

static int in_device(const kv_dev *dev, uintptr_t lo, uintptr_t hi) {
  for (const kv_dev_pool *p = dev->pools; p; p = p->next)
    if (lo >= (uintptr_t)p->base && hi <= (uintptr_t)p->base + p->bytes) return 1;
  for (const kv_dev_map *m = dev->maps; m; m = m->next)
    if (lo >= (uintptr_t)m->base && hi <= (uintptr_t)m->base + m->bytes) return 1;
  return 0;
}

static int check_copy(kv_dev *dev, kv_dev_dir dir, unsigned i, void *dst, const void *src,
                      size_t n) {
  uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (n == 0) return kv__dev_fail(dev, -EINVAL, "copy %u: 0 bytes", i);
  if (!dst || !src || d + n < d || s + n < s)
    return kv__dev_fail(dev, -EFAULT, "copy %u: bad address", i);
  if (d < s + n && s < d + n)
    return kv__dev_fail(dev, -EINVAL, "copy %u: source and destination overlap", i);
  int dst_dev = dir != KV_DEV_D2H, src_dev = dir != KV_DEV_H2D;
  if (!(dst_dev ? in_device(dev, d, d + n) : in_host(dev, d, d + n)))
    return kv__dev_fail(dev, -EFAULT, "copy %u: destination %p+%zu is not in %s", i, dst, n,
                        dst_dev ? "a pool or mapping of this device" : "registered host memory");
  if (!(src_dev ? in_device(dev, s, s + n) : in_host(dev, s, s + n)))
    return kv__dev_fail(dev, -EFAULT, "copy %u: source %p+%zu is not in %s", i, src, n,
                        src_dev ? "a pool or mapping of this device" : "registered host memory");
  return 0;
}

/* ---- the copy engine ---------------------------------------------------------- */

int kv_dev_submit(kv_dev *dev, kv_dev_dir dir, const kv_dev_copy *v, unsigned n, uint64_t tag) {
  if ((unsigned)dir >= KV_DEV_NDIR) return kv__dev_fail(dev, -EINVAL, "bad direction %d", dir);
  if (n == 0 || n > KV_DEV_BATCH_MAX || !v)
    return kv__dev_fail(dev, -EINVAL, "%u copies in one submission", n);
  for (unsigned i = 0; i < n; i++) {
    int rc = check_copy(dev, dir, i, v[i].dst, v[i].src, v[i].bytes);
    if (rc) return rc;
  }
  kv__sub *s = malloc(sizeof *s + (size_t)n * sizeof s->v[0]);
  if (!s) return kv__dev_fail(dev, -ENOMEM, "out of memory");
  s->next = NULL;
  s->dev = dev;
  s->tag = tag;
  s->status = 0;
  s->fail = dev->fail_next ? dev->fail_next : dev->fail_all;
  s->dir = dir;
  s->n = n;
  s->bk = NULL;
  memcpy(s->v, v, (size_t)n * sizeof s->v[0]);
  int rc = dev->be->submit(dev, s);
  if (rc) {
    free(s);
    return rc;
  }
  dev->fail_next = 0;
  dev->inflight++;
  return 0;
}

int kv_dev_completion_fd(const kv_dev *dev) { return dev->efd; }
unsigned kv_dev_inflight(const kv_dev *dev) { return dev->inflight; }

unsigned kv_dev_reap(kv_dev *dev, kv_dev_done *out, unsigned max) {
  uint64_t cnt;
  /* Clear readiness first: a completion pushed after this read writes the
   * fd again, so none is missed. */
  while (read(dev->efd, &cnt, sizeof cnt) < 0 && errno == EINTR) {}
  unsigned k = 0;
  kv__sub *list = NULL, **tailp = &list;
  pthread_mutex_lock(&dev->qmu);
  while (k < max && dev->done_head) {
    kv__sub *s = dev->done_head;
    dev->done_head = s->next;
    if (!dev->done_head) dev->done_tail = NULL;
    *tailp = s;
    tailp = &s->next;
    k++;
  }
  *tailp = NULL;
  int more = dev->done_head != NULL;
  pthread_mutex_unlock(&dev->qmu);
  if (more) {
    uint64_t one = 1;
    while (write(dev->efd, &one, sizeof one) < 0 && errno == EINTR) {}
  }
  unsigned i = 0;
  while (list) {
    kv__sub *s = list;
    list = s->next;
    if (dev->be->finish) dev->be->finish(dev, s);
    out[i].tag = s->tag;
    out[i].status = s->status;
    i++;
    free(s);
  }
  dev->inflight -= k;
  return k;
}

int kv_dev_wait(kv_dev *dev, int timeout_ms) {
  pthread_mutex_lock(&dev->qmu);
  int ready = dev->done_head != NULL;
  pthread_mutex_unlock(&dev->qmu);
  if (ready) return 0;
  struct pollfd p = {.fd = dev->efd, .events = POLLIN};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r > 0) return 0;
    if (r == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

int kv_dev_memcpy_sync(kv_dev *dev, kv_dev_dir dir, void *dst, const void *src, size_t n) {
  if ((unsigned)dir >= KV_DEV_NDIR) return kv__dev_fail(dev, -EINVAL, "bad direction %d", dir);
  int rc = check_copy(dev, dir, 0, dst, src, n);
  if (rc) return rc;
  return dev->be->memcpy_sync(dev, dir, dst, src, n);
}

int kv_dev_inject_fail_next(kv_dev *dev, int status) {
  if (status >= 0) return -EINVAL;
  dev->fail_next = status;
  return 0;
}
