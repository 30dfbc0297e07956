/*
 * engine.c - libkvclient for engines (kvclient.h, "for engines"): the
 * worker's G2 mapping registered with CUDA, the paged gather/scatter of
 * cuda/kernels.h, batched copies.
 *
 * The registration goes through cuda/dev.h, as the daemon's does: a
 * kv_dev owned by the handle (CUDA on the calling thread's current device,
 * or SIM with KV_DEV_BACKEND=sim) and kv_dev_host_register_mapped on it,
 * so the CUDA calls are dev_cuda.c's and the simulation records the range
 * in CI. The registration leaves g2_release in the handle's kvc__g2 (see
 * engine.h); kvc_close calls it, which closes that kv_dev and so undoes
 * the registration.
 *
 * Every block and copy side is placed before anything runs: inside the
 * handle's G2 mapping (translated to its device-side address for a kernel;
 * refused unless registered for KVC_MEM_CUDA), across its edge (refused),
 * inside a G1 pool on a real GPU (refused for KVC_MEM_HOST), or elsewhere
 * (passed as it is).
 */
#include "client/engine.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cuda/kernels.h"

#ifdef KV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

_Static_assert(sizeof(kvc_page_layout) == sizeof(kv_kern_layout) &&
                   offsetof(kvc_page_layout, num_pages) == offsetof(kv_kern_layout, num_pages) &&
                   offsetof(kvc_page_layout, page_stride) ==
                       offsetof(kv_kern_layout, page_stride) &&
                   offsetof(kvc_page_layout, kv_stride) == offsetof(kv_kern_layout, kv_stride),
               "kvc_page_layout is kv_kern_layout");
_Static_assert(sizeof(kvc_copy) == sizeof(kv_dev_copy) &&
                   offsetof(kvc_copy, src) == offsetof(kv_dev_copy, src) &&
                   offsetof(kvc_copy, bytes) == offsetof(kv_dev_copy, bytes),
               "kvc_copy is kv_dev_copy");

static _Thread_local char cuda_err[256];

const char *kvc_cuda_error(void) { return cuda_err; }

static int cuda_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cuda_fail(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cuda_err, sizeof cuda_err, fmt, ap);
  va_end(ap);
  return rc;
}

/* ---- the registration ---------------------------------------------------------- */

/* CUDA's calls below (kv_dev_open, its close) set the thread's current
 * device to the kv_dev's; a worker's current device is its own business. */
typedef struct cur_dev {
  int ord, ok;
} cur_dev;

static void cur_save(cur_dev *d) {
  d->ok = 0;
#ifdef KV_HAVE_CUDA
  int n = 0;
  d->ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && cudaGetDevice(&d->ord) == cudaSuccess;
  if (!d->ok) cudaGetLastError();
#endif
}

static void cur_restore(const cur_dev *d) {
#ifdef KV_HAVE_CUDA
  if (d->ok) cudaSetDevice(d->ord);
#endif
}

/* reason = why, then ": detail" when there is one; also the CUDA error
 * text. Returns rc. */
static int reg_fail(kvc__g2 *g, int rc, const char *why, const char *detail) {
  snprintf(g->info.reason, sizeof g->info.reason, "%s%s%s", why, detail && *detail ? ": " : "",
           detail ? detail : "");
  snprintf(cuda_err, sizeof cuda_err, "%s", g->info.reason);
  return rc;
}

/* The registration's undoing, left in g->release for kvc_close. */
static void g2_release(kvc__g2 *g) {
  if (g->dev) {
    cur_dev cur;
    cur_save(&cur);
    kv_dev_close(g->dev); /* unregisters what it registered */
    cur_restore(&cur);
  }
  g->dev = NULL;
  g->dbase = 0;
  g->release = NULL;
  g->info.registered = 0;
}

int kvc_g2_register_cuda(kvc *c) {
  if (!c) return -EINVAL;
  cuda_err[0] = 0;
  kvc__g2 *g = kvc__g2_of(c);
  if (g->info.registered) return 0;
  if (!g->info.base || !g->info.bytes) return reg_fail(g, -EINVAL, "no G2 mapping", NULL);
  const char *env = getenv("KV_DEV_BACKEND");
  int sim = env && !strcasecmp(env, "sim");
  char why[KV_DEV_REASON_MAX] = "";
  uint8_t uuid[16];
  kv_dev_opts o = {
      .backend = sim ? KV_DEV_SIM : KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
  /* The calling thread's current device, by uuid (ordinals are the
   * process's own; the uuid is what kv_dev_open matches). Without one,
   * kv_dev_open with no uuid says why (no driver, no device, no CUDA). */
  if (!sim && kv_dev_current_uuid(uuid) == 0) o.uuid = uuid;
  cur_dev cur;
  cur_save(&cur);
  kv_dev *dev = NULL;
  void *dbase = NULL;
  int rc = kv_dev_open(&dev, &o);
  if (rc == 0 && !sim && !o.uuid) { /* a device, but none current: cannot happen */
    kv_dev_close(dev);
    dev = NULL;
    snprintf(why, sizeof why, "CUDA: no current device on this thread");
    rc = -ENODEV;
  }
  if (rc) {
    dev = NULL;
    rc =
        reg_fail(g, rc, "cannot open the device to register G2 with", why[0] ? why : strerror(-rc));
    goto out;
  }
  rc = kv_dev_host_register_mapped(dev, g->info.base, (size_t)g->info.bytes, &dbase);
  if (rc) {
    rc = reg_fail(g, rc, "cannot register the G2 mapping", kv_dev_reason(dev));
    kv_dev_close(dev);
    dev = NULL;
    goto out;
  }
  g->dev = dev;
  g->dbase = (uintptr_t)dbase;
  g->release = g2_release;
  g->info.registered = sim ? KVC_G1_SIM : KVC_G1_CUDA;
  g->info.reason[0] = 0;
out:
  cur_restore(&cur);
  return rc;
}

/* ---- where a block lies --------------------------------------------------------- */

enum { OUTSIDE, IN_G2 };

/* [p, p + n) against c's G2 mapping and G1 pool, for `mem`. OUTSIDE or
 * IN_G2 (the caller translates), or -EFAULT / -ENODEV with the text. */
static int place(kvc *c, const void *p, size_t n, int mem, const char *what, size_t i) {
  if (!c) return OUTSIDE;
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  if (hi < lo) return cuda_fail(-EFAULT, "%s %zu: %p+%zu wraps", what, i, p, n);
  kvc__g2 *g = kvc__g2_of(c);
  uintptr_t b = (uintptr_t)g->info.base, e = b + (uintptr_t)g->info.bytes;
  if (lo < e && b < hi) {
    if (lo < b || hi > e)
      return cuda_fail(-EFAULT, "%s %zu: %p+%zu crosses the edge of the G2 mapping", what, i, p, n);
    if (mem == KVC_MEM_CUDA && g->info.registered != KVC_G1_CUDA)
      return g->info.registered == KVC_G1_SIM
                 ? cuda_fail(-ENODEV,
                             "%s %zu is in G2, registered with the simulated device "
                             "(KV_DEV_BACKEND=sim): KVC_MEM_CUDA needs CUDA's registration",
                             what, i)
                 : cuda_fail(-EFAULT,
                             "%s %zu is in G2, which is not registered with CUDA "
                             "(kvc_g2_register_cuda)",
                             what, i);
    return IN_G2;
  }
  const kvc_g1 *g1 = kvc__g1_of(c);
  if (mem == KVC_MEM_HOST && g1->available && g1->backend == KVC_G1_CUDA) {
    uintptr_t gb = (uintptr_t)g1->base, ge = gb + (uintptr_t)g1->bytes;
    if (lo < ge && gb < hi)
      return cuda_fail(-EFAULT, "%s %zu is in the G1 pool, device memory: use KVC_MEM_CUDA", what,
                       i);
  }
  return OUTSIDE;
}

/* ---- gather / scatter ------------------------------------------------------------ */

uint64_t kvc_page_block_bytes(const kvc_page_layout *lo) {
  return kv_kern_block_bytes((const kv_kern_layout *)lo);
}

static int pages(kvc *c, const kvc_page_layout *lop, void *const *layers, const uint32_t *page_ids,
                 void *const *blocks, size_t n, int mem, void *stream, int scatter) {
  cuda_err[0] = 0;
  const kv_kern_layout *lo = (const kv_kern_layout *)lop;
  if (mem != KVC_MEM_HOST && mem != KVC_MEM_CUDA) return -EINVAL;
  /* Every argument first (n 0 included): -EINVAL, nothing placed. */
  int rc = kv_kern_check(lo, layers, page_ids, blocks, n, scatter);
  if (rc || n == 0) return rc;
  size_t bb = (size_t)kv_kern_block_bytes(lo);
  void **moved = NULL; /* the blocks, G2 ones translated (KVC_MEM_CUDA) */
  kvc__g2 *g = c ? kvc__g2_of(c) : NULL;
  for (size_t i = 0; i < n; i++) {
    rc = place(c, blocks[i], bb, mem, "block", i);
    if (rc < 0) goto out;
    if (rc != IN_G2 || mem != KVC_MEM_CUDA || g->dbase == (uintptr_t)g->info.base) continue;
    if (!moved) {
      if (!(moved = malloc(n * sizeof *moved))) {
        rc = -ENOMEM;
        goto out;
      }
      memcpy(moved, blocks, n * sizeof *moved);
    }
    moved[i] = (void *)(g->dbase + ((uintptr_t)blocks[i] - (uintptr_t)g->info.base));
  }
  void *const *use = moved ? moved : blocks;
  if (mem == KVC_MEM_HOST) {
    rc = scatter ? kv_kern_scatter_host(lo, layers, page_ids, use, n)
                 : kv_kern_gather_host(lo, layers, page_ids, use, n);
    goto out;
  }
#ifdef KV_HAVE_CUDA
  rc = scatter ? kv_kern_scatter_cuda(lo, layers, page_ids, use, n, stream)
               : kv_kern_gather_cuda(lo, layers, page_ids, use, n, stream);
  if (rc == -ENODEV || rc == -EIO) snprintf(cuda_err, sizeof cuda_err, "%s", kv_kern_cuda_error());
#else
  rc = cuda_fail(-ENODEV, "this libkvclient was built without CUDA");
#endif
out:
  free(moved);
  return rc;
}

int kvc_pages_gather(kvc *c, const kvc_page_layout *lo, void *const *layers,
                     const uint32_t *page_ids, void *const *blocks, size_t n, int mem,
                     void *stream) {
  return pages(c, lo, layers, page_ids, blocks, n, mem, stream, 0);
}

int kvc_pages_scatter(kvc *c, const kvc_page_layout *lo, void *const *layers,
                      const uint32_t *page_ids, void *const *blocks, size_t n, int mem,
                      void *stream) {
  return pages(c, lo, layers, page_ids, blocks, n, mem, stream, 1);
}

/* ---- batched copies --------------------------------------------------------------- */

#ifdef KV_HAVE_CUDA
/* cudaMemcpyBatchAsync is worth trying until the driver refuses it once:
 * process-wide, like dev_cuda.c's per device. */
static int batch_ok = 1;

static int cuda_copy_fail(cudaError_t e, const char *what) {
  snprintf(cuda_err, sizeof cuda_err, "%s: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                 e == cudaErrorDevicesUnavailable
             ? -ENODEV
             : -EIO;
}
#endif

int kvc_memcpy_batch(kvc *c, const kvc_copy *v, size_t n, int mem, void *stream) {
  cuda_err[0] = 0;
  if (mem != KVC_MEM_HOST && mem != KVC_MEM_CUDA) return -EINVAL;
  if (n == 0) return 0;
  if (!v) return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    uintptr_t d = (uintptr_t)v[i].dst, s = (uintptr_t)v[i].src, k = v[i].bytes;
    if (!v[i].dst || !v[i].src || k == 0 || d + k < d || s + k < s) return -EINVAL;
    if (d < s + k && s < d + k) return -EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = place(c, v[i].dst, v[i].bytes, mem, "copy destination", i);
    if (rc >= 0) rc = place(c, v[i].src, v[i].bytes, mem, "copy source", i);
    if (rc < 0) return rc;
  }
  if (mem == KVC_MEM_HOST) {
    for (size_t i = 0; i < n; i++) memcpy(v[i].dst, v[i].src, v[i].bytes);
    return 0;
  }
#ifdef KV_HAVE_CUDA
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count <= 0) e = cudaErrorNoDevice;
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_copy_fail(e, "no CUDA device");
  }
  int batch = __atomic_load_n(&batch_ok, __ATOMIC_RELAXED);
  size_t queued = 0;
  e = (cudaError_t)kv_cuda_enqueue((const kv_dev_copy *)v, n, KV_DEV_NDIR, stream, &batch, &queued);
  if (!batch) __atomic_store_n(&batch_ok, 0, __ATOMIC_RELAXED);
  if (e == cudaErrorMemoryAllocation && queued == 0) return -ENOMEM;
  if (e != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "cudaMemcpyAsync, copy %zu of %zu (%zu queued before it)", queued,
             n, queued);
    return cuda_copy_fail(e, what);
  }
  return 0;
#else
  (void)stream;
  return cuda_fail(-ENODEV, "this libkvclient was built without CUDA");
#endif
}
