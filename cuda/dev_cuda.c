/*
 * dev_cuda.c - the G1 device on a CUDA GPU (see dev.h, G1.md).
 *
 * Runtime API for streams, events, copies, cudaHostRegister and legacy IPC;
 * driver API (VMM: cuMemCreate, export/import of POSIX fds, address
 * reservation and mapping) resolved at open through
 * cudaGetDriverEntryPointByVersion, so nothing links libcuda and a binary
 * runs on a machine without a driver. <cuda.h> is included for its types.
 *
 * One non-blocking stream per direction. A submission is enqueued as one
 * cudaMemcpyBatchAsync (a loop of cudaMemcpyAsync where the batch call is
 * not supported), an event, then a host function that only links the
 * submission on the completion queue and writes the eventfd (no CUDA call,
 * as cudaLaunchHostFunc requires). The event is queried when the
 * submission is reaped, on the owner thread: an asynchronous copy error
 * becomes the submission's -EIO.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/dev_int.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == KV_DEVX_HANDLE_MAX, "IPC handle size");

#define LEGACY_GRANULARITY ((size_t)2 << 20)

typedef struct cu_fns {
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                          CUmemAllocationGranularity_flags);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                        unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                           CUmemAllocationHandleType);
  CUresult (*GetErrorString)(CUresult, const char **);
} cu_fns;

typedef struct cu_state {
  cu_fns f;
  int have_fns;                  /* every driver entry point resolved */
  int vmm;                       /* pools are VMM with POSIX-fd export */
  char novmm[KV_DEV_REASON_MAX]; /* why not */
  int batch;                     /* cudaMemcpyBatchAsync still worth trying */
  size_t gran;                   /* VMM granularity */
  cudaStream_t st[KV_DEV_NDIR];
  cudaStream_t sync; /* kv_dev_memcpy_sync */
  cudaEvent_t *ev;   /* free events */
  unsigned nev, capev;
} cu_state;

static const char *cuerr(cu_state *cs, CUresult r) {
  const char *s = NULL;
  if (cs->f.GetErrorString && cs->f.GetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown driver error";
}

static int drv(const char *sym, void **fn) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  *fn = NULL;
  cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, &q);
  return e == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn ? 0 : -1;
}

static int load_fns(cu_fns *f) {
  int bad = 0;
#define L(name) bad |= drv("cu" #name, (void **)&f->name)
  L(DeviceGet);
  L(DeviceGetAttribute);
  L(MemGetAllocationGranularity);
  L(MemCreate);
  L(MemRelease);
  L(MemAddressReserve);
  L(MemAddressFree);
  L(MemMap);
  L(MemUnmap);
  L(MemSetAccess);
  L(MemExportToShareableHandle);
  L(MemImportFromShareableHandle);
  L(GetErrorString);
#undef L
  return bad ? -1 : 0;
}

static CUmemAllocationProp vmm_prop(int ordinal) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = ordinal;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

/* Decides VMM or legacy for this device; the reason lands in cs->novmm. */
static void probe_vmm(kv_dev *dev, cu_state *cs) {
  const char *env = getenv("KV_DEV_LEGACY_IPC");
  if (env && *env && strcmp(env, "0")) {
    snprintf(cs->novmm, sizeof cs->novmm, "KV_DEV_LEGACY_IPC is set");
    return;
  }
  if (!cs->have_fns) {
    snprintf(cs->novmm, sizeof cs->novmm, "the driver lacks the VMM entry points");
    return;
  }
  CUdevice d;
  int vmm = 0, pfd = 0;
  CUresult r = cs->f.DeviceGet(&d, dev->ordinal);
  if (r == CUDA_SUCCESS)
    r = cs->f.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d);
  if (r == CUDA_SUCCESS)
    r = cs->f.DeviceGetAttribute(
        &pfd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d);
  if (r != CUDA_SUCCESS) {
    snprintf(cs->novmm, sizeof cs->novmm, "cuDeviceGetAttribute: %s", cuerr(cs, r));
    return;
  }
  if (!vmm || !pfd) {
    snprintf(cs->novmm, sizeof cs->novmm, "device %d lacks %s", dev->ordinal,
             !vmm ? "virtual memory management" : "POSIX-fd memory handles");
    return;
  }
  CUmemAllocationProp p = vmm_prop(dev->ordinal);
  r = cs->f.MemGetAllocationGranularity(&cs->gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || cs->gran == 0) {
    snprintf(cs->novmm, sizeof cs->novmm, "cuMemGetAllocationGranularity: %s", cuerr(cs, r));
    return;
  }
  cs->vmm = 1;
}

static void cu_close(kv_dev *dev) {
  cu_state *cs = dev->bk;
  if (!cs) return;
  cudaSetDevice(dev->ordinal);
  for (int i = 0; i < KV_DEV_NDIR; i++)
    if (cs->st[i]) cudaStreamDestroy(cs->st[i]);
  if (cs->sync) cudaStreamDestroy(cs->sync);
  for (unsigned i = 0; i < cs->nev; i++) cudaEventDestroy(cs->ev[i]);
  free(cs->ev);
  free(cs);
  dev->bk = NULL;
}

static void cu_drain(kv_dev *dev) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  /* A stream's synchronize returns after its host functions have run. */
  for (int i = 0; i < KV_DEV_NDIR; i++)
    if (cs->st[i]) cudaStreamSynchronize(cs->st[i]);
}

static int cu_open(kv_dev *dev, const kv_dev_opts *o, char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, len, "CUDA: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return -ENODEV;
  }
  if (n <= 0) {
    snprintf(why, len, "CUDA: no device");
    return -ENODEV;
  }
  struct cudaDeviceProp prop;
  if (o->uuid) {
    int found = -1;
    for (int i = 0; i < n && found < 0; i++)
      if (cudaGetDeviceProperties(&prop, i) == cudaSuccess && !memcmp(prop.uuid.bytes, o->uuid, 16))
        found = i;
    if (found < 0) {
      snprintf(why, len, "CUDA: none of the %d visible devices has the requested uuid", n);
      return -ENODEV;
    }
    dev->ordinal = found;
  } else if (dev->ordinal >= n) {
    snprintf(why, len, "CUDA: ordinal %d, but %d device(s) visible", dev->ordinal, n);
    return -ENODEV;
  }
  e = cudaSetDevice(dev->ordinal);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev->ordinal);
  if (e != cudaSuccess) {
    snprintf(why, len, "CUDA: device %d: %s", dev->ordinal, cudaGetErrorString(e));
    return -ENODEV;
  }
  memcpy(dev->uuid, prop.uuid.bytes, 16);
  cu_state *cs = calloc(1, sizeof *cs);
  if (!cs) {
    snprintf(why, len, "CUDA: out of memory");
    return -ENOMEM;
  }
  dev->bk = cs;
  cs->have_fns = load_fns(&cs->f) == 0;
  cs->batch = 1;
  probe_vmm(dev, cs);
  for (int i = 0; i < KV_DEV_NDIR && e == cudaSuccess; i++)
    e = cudaStreamCreateWithFlags(&cs->st[i], cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&cs->sync, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    snprintf(why, len, "CUDA: cudaStreamCreate: %s", cudaGetErrorString(e));
    cu_close(dev);
    return -EIO;
  }
  return 0;
}

static int cu_pool_legacy(kv_dev *dev, kv_dev_pool *p, size_t bytes) {
  size_t len = (bytes + LEGACY_GRANULARITY - 1) / LEGACY_GRANULARITY * LEGACY_GRANULARITY;
  void *b = NULL;
  cudaError_t e = cudaMalloc(&b, len);
  if (e != cudaSuccess)
    return kv__dev_fail(dev, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "cudaMalloc %zu: %s",
                        len, cudaGetErrorString(e));
  cudaIpcMemHandle_t h;
  e = cudaIpcGetMemHandle(&h, b);
  if (e != cudaSuccess) {
    cudaFree(b);
    return kv__dev_fail(dev, -EOPNOTSUPP, "cudaIpcGetMemHandle: %s: the pool cannot be shared",
                        cudaGetErrorString(e));
  }
  p->base = b;
  p->bytes = len;
  p->kind = KV_DEVX_LEGACY_IPC;
  memcpy(p->handle, &h, sizeof h);
  return 0;
}

static int cu_pool_vmm(kv_dev *dev, kv_dev_pool *p, size_t bytes) {
  cu_state *cs = dev->bk;
  CUmemAllocationProp prop = vmm_prop(dev->ordinal);
  if (bytes > SIZE_MAX - cs->gran) return kv__dev_fail(dev, -ENOMEM, "pool of %zu bytes", bytes);
  size_t len = (bytes + cs->gran - 1) / cs->gran * cs->gran;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  int fd = -1, mapped = 0, rc;
  const char *what = "cuMemCreate";
  CUresult r = cs->f.MemCreate(&h, len, &prop, 0);
  if (r != CUDA_SUCCESS) {
    rc = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
    h = 0;
    goto err;
  }
  what = "cuMemAddressReserve";
  r = cs->f.MemAddressReserve(&va, len, cs->gran, 0, 0);
  if (r != CUDA_SUCCESS) {
    va = 0;
    rc = -ENOMEM;
    goto err;
  }
  what = "cuMemMap";
  r = cs->f.MemMap(va, len, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    rc = -EIO;
    goto err;
  }
  mapped = 1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location = prop.location;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  what = "cuMemSetAccess";
  r = cs->f.MemSetAccess(va, len, &ad, 1);
  if (r != CUDA_SUCCESS) {
    rc = -EIO;
    goto err;
  }
  what = "cuMemExportToShareableHandle";
  r = cs->f.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) {
    fd = -1;
    rc = -EOPNOTSUPP;
    goto err;
  }
  p->base = (void *)(uintptr_t)va;
  p->bytes = len;
  p->fd = fd;
  p->kind = KV_DEVX_VMM_FD;
  p->bk[0] = (uint64_t)h;
  return 0;
err:
  if (mapped) cs->f.MemUnmap(va, len);
  if (va) cs->f.MemAddressFree(va, len);
  if (h) cs->f.MemRelease(h);
  return kv__dev_fail(dev, rc, "%s (%zu bytes): %s", what, len, cuerr(cs, r));
}

static int cu_pool_create(kv_dev *dev, kv_dev_pool *p, size_t bytes) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  if (cs->vmm) {
    int rc = cu_pool_vmm(dev, p, bytes);
    if (rc != -EOPNOTSUPP && rc != -EIO) return rc;
    /* VMM export refused: legacy IPC from now on, and say why. */
    cs->vmm = 0;
    memcpy(cs->novmm, dev->reason, sizeof cs->novmm);
  }
  int rc = cu_pool_legacy(dev, p, bytes);
  if (rc == 0) kv__dev_fail(dev, 0, "pool exported with legacy CUDA IPC: %s", cs->novmm);
  return rc;
}

static void cu_pool_destroy(kv_dev *dev, kv_dev_pool *p) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  if (p->kind == KV_DEVX_VMM_FD) {
    CUdeviceptr va = (CUdeviceptr)(uintptr_t)p->base;
    cs->f.MemUnmap(va, p->bytes);
    cs->f.MemAddressFree(va, p->bytes);
    cs->f.MemRelease((CUmemGenericAllocationHandle)p->bk[0]);
    if (p->fd >= 0) close(p->fd);
  } else {
    cudaFree(p->base);
  }
}

static int cu_import(kv_dev *dev, const kv_dev_export *x, kv_dev_map *m) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  if (x->kind == KV_DEVX_LEGACY_IPC) {
    cudaIpcMemHandle_t h;
    memcpy(&h, x->handle, sizeof h);
    void *b = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&b, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      return kv__dev_fail(dev, -EIO, "cudaIpcOpenMemHandle: %s", cudaGetErrorString(e));
    m->base = b;
    m->bytes = (size_t)x->bytes;
    return 0;
  }
  if (!cs->have_fns)
    return kv__dev_fail(dev, -EOPNOTSUPP, "VMM import: the driver lacks the entry points");
  size_t gran = cs->gran;
  if (!gran) {
    CUmemAllocationProp p = vmm_prop(dev->ordinal);
    if (cs->f.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        !gran)
      return kv__dev_fail(dev, -EOPNOTSUPP, "VMM import: no allocation granularity");
  }
  size_t len = (size_t)x->bytes;
  if (len % gran)
    return kv__dev_fail(dev, -EINVAL, "VMM import: %zu bytes is not a multiple of %zu", len, gran);
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  int mapped = 0, rc = -EIO;
  const char *what = "cuMemImportFromShareableHandle";
  CUresult r = cs->f.MemImportFromShareableHandle(&h, (void *)(uintptr_t)x->fd,
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    h = 0;
    goto err;
  }
  what = "cuMemAddressReserve";
  r = cs->f.MemAddressReserve(&va, len, gran, 0, 0);
  if (r != CUDA_SUCCESS) {
    va = 0;
    goto err;
  }
  what = "cuMemMap";
  r = cs->f.MemMap(va, len, 0, h, 0);
  if (r != CUDA_SUCCESS) goto err;
  mapped = 1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = dev->ordinal;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  what = "cuMemSetAccess";
  r = cs->f.MemSetAccess(va, len, &ad, 1);
  if (r != CUDA_SUCCESS) goto err;
  m->base = (void *)(uintptr_t)va;
  m->bytes = len;
  m->bk[0] = (uint64_t)h;
  return 0;
err:
  if (mapped) cs->f.MemUnmap(va, len);
  if (va) cs->f.MemAddressFree(va, len);
  if (h) cs->f.MemRelease(h);
  return kv__dev_fail(dev, rc, "%s: %s", what, cuerr(cs, r));
}

static void cu_unmap(kv_dev *dev, kv_dev_map *m) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  if (m->kind == KV_DEVX_LEGACY_IPC) {
    cudaIpcCloseMemHandle(m->base);
    return;
  }
  CUdeviceptr va = (CUdeviceptr)(uintptr_t)m->base;
  cs->f.MemUnmap(va, m->bytes);
  cs->f.MemAddressFree(va, m->bytes);
  cs->f.MemRelease((CUmemGenericAllocationHandle)m->bk[0]);
}

static int cu_host_register(kv_dev *dev, void *p, size_t n, int mapped) {
  cudaSetDevice(dev->ordinal);
  unsigned flags = cudaHostRegisterPortable | (mapped ? cudaHostRegisterMapped : 0);
  cudaError_t e = cudaHostRegister(p, n, flags);
  if (e == cudaErrorHostMemoryAlreadyRegistered) { /* by another kv_dev: portable */
    cudaGetLastError();
    return 1;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return kv__dev_fail(dev, -EIO, "cudaHostRegister %p+%zu%s: %s", p, n, mapped ? " (mapped)" : "",
                        cudaGetErrorString(e));
  }
  return 0;
}

static void cu_host_unregister(kv_dev *dev, void *p) {
  cudaSetDevice(dev->ordinal);
  cudaHostUnregister(p);
}

static int cu_host_device_ptr(kv_dev *dev, void *p, void **out) {
  cudaSetDevice(dev->ordinal);
  cudaError_t e = cudaHostGetDevicePointer(out, p, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *out = NULL;
    return kv__dev_fail(dev, -EIO,
                        "cudaHostGetDevicePointer %p: %s (registered elsewhere in this process "
                        "without cudaHostRegisterMapped?)",
                        p, cudaGetErrorString(e));
  }
  return 0;
}

/* The host function: no CUDA call here. */
static void CUDART_CB cu_done(void *arg) {
  kv__sub *s = arg;
  kv__dev_complete(s->dev, s);
}

#if CUDART_VERSION >= 12080
/* A location hint for p: what the copy engine's direction says, or, for
 * a batch of mixed directions, what CUDA knows of the pointer. */
static struct cudaMemLocation loc_hint(const void *p, int dir, int src) {
  struct cudaMemLocation l;
  memset(&l, 0, sizeof l);
  if (dir < KV_DEV_NDIR) {
    int dev = src ? dir != KV_DEV_H2D : dir != KV_DEV_D2H;
    l.type = dev ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    return l;
  }
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    a.type = cudaMemoryTypeUnregistered;
  }
  l.type = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged
               ? cudaMemLocationTypeDevice
               : cudaMemLocationTypeHost;
  if (l.type == cudaMemLocationTypeDevice) l.id = a.device;
  return l;
}

static int same_loc(const struct cudaMemLocation *a, const struct cudaMemLocation *b) {
  return a->type == b->type && a->id == b->id;
}

/* One cudaMemcpyBatchAsync of v[0..k): one attribute per run of copies
 * with the same hints. cudaErrorMemoryAllocation when the arrays could not
 * be had (nothing tried). */
static cudaError_t batch_call(const kv_dev_copy *v, size_t k, int dir, cudaStream_t st) {
  void **dsts = malloc(k * sizeof *dsts);
  const void **srcs = malloc(k * sizeof *srcs);
  size_t na_max = dir < KV_DEV_NDIR ? 1 : k; /* one direction: one attribute */
  size_t *sizes = malloc(k * sizeof *sizes), *idx = malloc(na_max * sizeof *idx);
  struct cudaMemcpyAttributes *at = malloc(na_max * sizeof *at);
  cudaError_t e = cudaErrorMemoryAllocation;
  if (dsts && srcs && sizes && idx && at) {
    size_t na = 0;
    for (size_t i = 0; i < k; i++) {
      dsts[i] = v[i].dst;
      srcs[i] = v[i].src;
      sizes[i] = v[i].bytes;
      if (i && dir < KV_DEV_NDIR) continue;
      struct cudaMemcpyAttributes a;
      memset(&a, 0, sizeof a);
      a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      a.srcLocHint = loc_hint(v[i].src, dir, 1);
      a.dstLocHint = loc_hint(v[i].dst, dir, 0);
      if (na && same_loc(&at[na - 1].srcLocHint, &a.srcLocHint) &&
          same_loc(&at[na - 1].dstLocHint, &a.dstLocHint))
        continue;
      at[na] = a;
      idx[na++] = i;
    }
#if CUDART_VERSION >= 13000
    e = cudaMemcpyBatchAsync(dsts, (const void *const *)srcs, sizes, k, at, idx, na, st);
#else
    size_t fail = 0;
    e = cudaMemcpyBatchAsync(dsts, (void **)srcs, sizes, k, at, idx, na, &fail, st);
#endif
  }
  free(dsts);
  free(srcs);
  free(sizes);
  free(idx);
  free(at);
  return e;
}
#endif

int kv_cuda_enqueue(const kv_dev_copy *v, size_t k, int dir, void *stream, int *batch,
                    size_t *queued) {
  cudaStream_t st = stream;
  if (queued) *queued = 0;
  if (k == 0) return cudaSuccess;
#if CUDART_VERSION >= 12080
  /* The batch call refuses the legacy default stream: loop there. */
  if (*batch && k > 1 && st != NULL && st != cudaStreamLegacy) {
    cudaError_t e = batch_call(v, k, dir, st);
    if (e == cudaSuccess && queued) *queued = k;
    if (e == cudaSuccess || e == cudaErrorMemoryAllocation) return e;
    /* Not supported here (driver too old, or these pointers): loop from now on. */
    cudaGetLastError();
    *batch = 0;
  }
#endif
  for (size_t i = 0; i < k; i++) {
    cudaError_t e = cudaMemcpyAsync(v[i].dst, v[i].src, v[i].bytes, cudaMemcpyDefault, st);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (queued) *queued = i;
      return e;
    }
  }
  if (queued) *queued = k;
  return cudaSuccess;
}

static cudaError_t cu_enqueue(cu_state *cs, kv__sub *s, cudaStream_t st) {
  size_t queued = 0;
  cudaError_t e =
      (cudaError_t)kv_cuda_enqueue(s->v, kv__sub_ncopy(s), s->dir, st, &cs->batch, &queued);
  return e != cudaSuccess && queued ? cudaErrorUnknown : e; /* Unknown: some copies are queued */
}

static int cu_submit(kv_dev *dev, kv__sub *s) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  cudaStream_t st = cs->st[s->dir];
  cudaEvent_t ev = NULL;
  int pooled = cs->nev > 0;
  if (pooled) ev = cs->ev[--cs->nev];
  else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
    return kv__dev_fail(dev, -EIO, "cudaEventCreate failed");
  cudaError_t e = cu_enqueue(cs, s, st);
  if (e != cudaSuccess && e != cudaErrorUnknown) {
    if (pooled) cs->ev[cs->nev++] = ev;
    else cudaEventDestroy(ev);
    return kv__dev_fail(dev, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "cudaMemcpyAsync: %s",
                        cudaGetErrorString(e));
  }
  /* From here the submission is accepted: some copies may be queued, so it
   * must be reaped, after them, even when it failed. */
  s->status = e == cudaSuccess ? 0 : -EIO;
  s->bk = ev;
  if (cudaEventRecord(ev, st) != cudaSuccess || cudaLaunchHostFunc(st, cu_done, s) != cudaSuccess) {
    cudaGetLastError();
    cudaStreamSynchronize(st);
    s->status = -EIO;
    kv__dev_complete(dev, s);
  }
  return 0;
}

static void cu_finish(kv_dev *dev, kv__sub *s) {
  cu_state *cs = dev->bk;
  cudaEvent_t ev = s->bk;
  if (!ev) return;
  cudaError_t e = cudaEventQuery(ev);
  if (e != cudaSuccess && s->status == 0) s->status = -EIO;
  if (e != cudaSuccess) cudaGetLastError();
  s->bk = NULL;
  if (cs->nev == cs->capev) {
    unsigned cap = cs->capev ? cs->capev * 2 : 64;
    cudaEvent_t *v = realloc(cs->ev, cap * sizeof *v);
    if (!v) {
      cudaEventDestroy(ev);
      return;
    }
    cs->ev = v;
    cs->capev = cap;
  }
  cs->ev[cs->nev++] = ev;
}

static int cu_memcpy_sync(kv_dev *dev, kv_dev_dir dir, void *dst, const void *src, size_t n) {
  cu_state *cs = dev->bk;
  cudaSetDevice(dev->ordinal);
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cs->sync);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cs->sync);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return kv__dev_fail(dev, -EIO, "cudaMemcpy %zu bytes: %s", n, cudaGetErrorString(e));
  }
  return 0;
}

static int cu_current_uuid(uint8_t uuid[16]) {
  int ord = -1, n = 0;
  struct cudaDeviceProp prop;
  /* No device count, no current device: no driver or no GPU. */
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0 || cudaGetDevice(&ord) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, ord) != cudaSuccess) {
    cudaGetLastError();
    return -ENODEV;
  }
  memcpy(uuid, prop.uuid.bytes, 16);
  return 0;
}

const kv__backend kv__dev_cuda = {
    .id = KV_DEV_CUDA,
    .open = cu_open,
    .drain = cu_drain,
    .close = cu_close,
    .pool_create = cu_pool_create,
    .pool_destroy = cu_pool_destroy,
    .import = cu_import,
    .unmap = cu_unmap,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .host_device_ptr = cu_host_device_ptr,
    .submit = cu_submit,
    .finish = cu_finish,
    .memcpy_sync = cu_memcpy_sync,
    .current_uuid = cu_current_uuid,
};
