/*
 * dev_int.h - what dev.c shares with its backends (dev_sim.c, dev_cuda.c /
 * dev_none.c): the device, pool, map and submission structures, the
 * backend function table, and the completion queue.
 *
 * dev.c does everything that does not depend on the backend: opening by
 * AUTO/env, argument and address checks, the registry of ranges, the
 * export codec, the completion queue and its eventfd, in-flight counting,
 * failure injection. A backend only allocates, maps and copies. Its
 * copy-side code (a SIM thread, a CUDA host function) finishes a
 * submission by calling kv__dev_complete(), which takes the queue lock,
 * links the submission (no allocation) and writes the eventfd: no CUDA
 * call, no callback into the caller. kv__dev_complete and kv__dev_fail live
 * in dev_done.c, below dev.c and the backends, which all use them.
 */
#ifndef KV_CUDA_DEV_INT_H
#define KV_CUDA_DEV_INT_H

#include <pthread.h>
#include <stdint.h>

#include "cuda/dev.h"

typedef struct kv__sub {
  struct kv__sub *next;
  kv_dev *dev;
  uint64_t tag;
  int status; /* set by the backend; 0 or -errno */
  int fail;   /* injected: copy half, report this */
  kv_dev_dir dir;
  unsigned n;
  void *bk;        /* backend's per-submission data (CUDA event) */
  kv_dev_copy v[]; /* the copies */
} kv__sub;

struct kv_dev_pool {
  kv_dev_pool *next;
  void *base;
  size_t bytes;
  uint8_t kind;     /* KV_DEVX_* */
  uint8_t uuid[16]; /* the device's */
  int fd;           /* VMM/SIM fd, -1 for legacy */
  uint8_t handle[KV_DEVX_HANDLE_MAX];
  uint64_t bk[2]; /* backend: CUDA generic allocation handle */
};

struct kv_dev_map {
  kv_dev_map *next;
  void *base;
  size_t bytes;
  uint8_t kind;
  uint64_t bk[2];
};

typedef struct kv__range {
  uintptr_t lo, hi; /* [lo, hi) */
  int own;          /* 1: this kv_dev's registration, undone at unregister;
                        * 0: another kv_dev of the process registered it */
} kv__range;

typedef struct kv__backend {
  kv_dev_backend id;
  /* Opens the backend part (dev->ordinal or opts uuid already resolved by
   * the backend itself): sets dev->uuid, dev->ordinal. Fills reason. */
  int (*open)(kv_dev *dev, const kv_dev_opts *o, char *reason, size_t len);
  /* Waits for everything in flight (each finished via kv__dev_complete). */
  void (*drain)(kv_dev *dev);
  /* Frees the backend's state (after pools, maps, host ranges). */
  void (*close)(kv_dev *dev);
  int (*pool_create)(kv_dev *dev, kv_dev_pool *p, size_t bytes);
  void (*pool_destroy)(kv_dev *dev, kv_dev_pool *p);
  int (*import)(kv_dev *dev, const kv_dev_export *x, kv_dev_map *m);
  void (*unmap)(kv_dev *dev, kv_dev_map *m);
  /* 0: registered; 1: already registered in this process by another
   * kv_dev, in a way that serves this one too (CUDA: portable); -errno.
   * mapped: also map the range into the device's address space (CUDA:
   * cudaHostRegisterMapped), for kv_dev_host_register_mapped. */
  int (*host_register)(kv_dev *dev, void *p, size_t n, int mapped);
  void (*host_unregister)(kv_dev *dev, void *p);
  /* Optional (CUDA): the device-side address of p, a registered and mapped
   * host address (cudaHostGetDevicePointer). Absent: p itself (SIM). */
  int (*host_device_ptr)(kv_dev *dev, void *p, void **out);
  /* Queues s (checked). On 0 the backend owns s until kv__dev_complete. */
  int (*submit)(kv_dev *dev, kv__sub *s);
  /* Optional: s leaves the done list (reaped or dropped); may set
   * s->status from what the device says, frees s->bk. Owner thread. */
  void (*finish)(kv_dev *dev, kv__sub *s);
  int (*memcpy_sync)(kv_dev *dev, kv_dev_dir dir, void *dst, const void *src, size_t n);
  /* Optional (CUDA): the uuid of the calling thread's current device. */
  int (*current_uuid)(uint8_t uuid[16]);
} kv__backend;

struct kv_dev {
  const kv__backend *be;
  int ordinal;
  uint8_t uuid[16];
  char reason[KV_DEV_REASON_MAX];
  int efd;             /* completion eventfd */
  pthread_mutex_t qmu; /* guards done_head/done_tail */
  kv__sub *done_head, *done_tail;
  unsigned inflight; /* owner thread only */
  int fail_next;     /* owner thread only */
  int fail_all;      /* SIM, KV_DEV_SIM_FAIL: every submission fails so */
  kv_dev_pool *pools;
  kv_dev_map *maps;
  kv__range *host; /* registered host ranges */
  unsigned nhost, caphost;
  void *bk; /* backend state */
};

extern const kv__backend kv__dev_sim;
extern const kv__backend kv__dev_cuda; /* dev_cuda.c, or dev_none.c */

/* Called from any thread when s's copies are done (s->status set);
 * an injected failure (s->fail) becomes the status (dev_done.c). */
void kv__dev_complete(kv_dev *dev, kv__sub *s);
/* printf into dev->reason (dev_done.c); returns rc (for `return kv__dev_fail(...)`). */
int kv__dev_fail(kv_dev *dev, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The copies a submission actually performs: all, or half if injected. */
static inline unsigned kv__sub_ncopy(const kv__sub *s) { return s->fail ? s->n / 2 : s->n; }

#endif
