/*
 * dev.h - the G1 device: GPU pools, their export to workers, and the
 * asynchronous copy engine between G1 (device) and G2 (registered host).
 *
 * One interface, two backends chosen at run time (design: cuda/G1.md):
 *   - CUDA (dev_cuda.c), when the binary has it and a device answers.
 *     Driver calls (VMM) are resolved at run time through
 *     cudaGetDriverEntryPointByVersion: nothing links libcuda, so a binary
 *     runs on a machine with no driver and says why.
 *   - SIM (dev_sim.c): device memory is emulated by shared host memory
 *     (memfd + mmap MAP_SHARED), copies run on worker threads with the same
 *     asynchronous completion semantics. Every path above the CUDA calls
 *     runs on any machine.
 *
 * Addresses. A "device address" is a void * that lies inside a pool created
 * on this kv_dev (kv_dev_pool_base .. + bytes) or a mapping imported into
 * it (kv_dev_map_base .. + bytes). A "host address" lies inside a range
 * given to kv_dev_host_register. Both backends check every copy against
 * these ranges at submit time (-EFAULT): the simulation thus catches a
 * missing registration that CUDA would silently run as a slow pageable
 * copy, and a stray device address never reaches the driver.
 *
 * Copies. kv_dev_submit queues n copies of one direction under a caller's
 * 64-bit tag. Each direction has its own stream (CUDA) or thread (SIM):
 * submissions of one direction complete in FIFO order; directions run
 * concurrently and are not ordered against each other. When a submission's
 * copies are done, {tag, status} is pushed on the completion queue and the
 * completion fd (an eventfd, non-blocking) becomes readable: put it in a
 * uv_poll, and on readable call kv_dev_reap until it returns 0. Every
 * accepted submission is reaped exactly once, with status 0 or a negative
 * errno (-EIO: the device reported an error; then the destination bytes of
 * that submission are undefined, the source bytes untouched).
 *
 * THE REUSE RULE. From kv_dev_submit until its tag is reaped, the memory a
 * submission reads or writes belongs to the copy engine: the caller must
 * not free, reuse, overwrite (sources) or read (destinations) those bytes,
 * nor hand the block to anyone who would. A block becomes the caller's
 * again when kv_dev_reap returns its tag, whatever the status. To make the
 * rule hard to break, kv_dev_pool_destroy, kv_dev_unmap and
 * kv_dev_host_unregister refuse with -EBUSY while any submission of the
 * device is unreaped (kv_dev_inflight() > 0).
 *
 * Threads. A kv_dev belongs to one thread at a time, its owner (the
 * daemon's loop thread, or a worker's thread): every function here except
 * kv_dev_export_encode/decode (pure) must be called from the owner. The
 * backends' own threads (SIM copy threads, CUDA host-function callbacks)
 * only touch the completion queue, which is locked inside; they never call
 * back into the caller. The completion fd may be polled from the owner's
 * loop only.
 *
 * Errors. Functions return 0 or a negative errno. A failing call leaves a
 * one-line reason in kv_dev_reason(dev), for the log (kv_dev_open: in the
 * caller's buffer, opts.reason, since there is no dev yet).
 */
#ifndef KV_CUDA_DEV_H
#define KV_CUDA_DEV_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_dev kv_dev;
typedef struct kv_dev_pool kv_dev_pool;
typedef struct kv_dev_map kv_dev_map;

/* ---- the device ------------------------------------------------------------ */

typedef enum kv_dev_backend {
  KV_DEV_AUTO = 0, /* CUDA if a device answers, else SIM (reason recorded) */
  KV_DEV_CUDA = 1,
  KV_DEV_SIM = 2,
} kv_dev_backend;

#define KV_DEV_SIM_NDEV   8 /* simulated devices: ordinals 0..7 */
#define KV_DEV_REASON_MAX 256

typedef struct kv_dev_opts {
  kv_dev_backend backend; /* AUTO; the env KV_DEV_BACKEND=cuda|sim overrides AUTO */
  int ordinal;            /* device ordinal, as the backend numbers them */
  const uint8_t *uuid;    /* non-NULL: open the device with this uuid (16 bytes)
                           * instead of `ordinal` - what a worker does with the
                           * uuid of an export (CUDA_VISIBLE_DEVICES renumbers) */
  char *reason;           /* optional out: why open failed, or why AUTO fell
                           * back to SIM; "" when it did neither */
  size_t reason_len;
} kv_dev_opts;

/*
 * Opens a device. o may be NULL (AUTO, ordinal 0).
 *  AUTO: tries CUDA; on failure opens SIM and records the reason (e.g.
 *        "CUDA: no CUDA-capable device is detected") in kv_dev_reason(*out).
 *  CUDA: -ENODEV when the binary lacks CUDA, no device or driver answers,
 *        or the ordinal/uuid names none; the reason says which.
 *  SIM:  -ENODEV for an ordinal outside 0..KV_DEV_SIM_NDEV-1 or an unknown
 *        uuid.
 * Also -EINVAL (bad opts), -ENOMEM, -errno (eventfd, threads).
 */
int kv_dev_open(kv_dev **out, const kv_dev_opts *o);

/* Waits for every copy in flight to finish, drops the unreaped
 * completions, then releases what is left: pools, mappings and host
 * registrations still open (their handles become invalid), the streams or
 * threads, the completion fd. NULL is a no-op. */
void kv_dev_close(kv_dev *dev);

kv_dev_backend kv_dev_backend_of(const kv_dev *dev); /* KV_DEV_CUDA or KV_DEV_SIM */
const char *kv_dev_backend_name(kv_dev_backend b);   /* "auto", "cuda", "sim" */
int kv_dev_ordinal(const kv_dev *dev);
/* The device's uuid. CUDA: the GPU's. SIM: derived from the host's boot id
 * and the ordinal, so the daemon and its workers (other processes of the
 * same boot) agree on it, like they would on a GPU's. */
void kv_dev_uuid(const kv_dev *dev, uint8_t uuid[16]);
/* A uuid as nvidia-smi writes it: "GPU-" and 8-4-4-4-12 hex digits. */
#define KV_DEV_UUID_STR 41
const char *kv_dev_uuid_str(const uint8_t uuid[16], char out[KV_DEV_UUID_STR]);
/* The uuid of the CUDA device current on the calling thread (the one a
 * worker computes on: cudaGetDevice). 0, or -ENODEV when there is none (no
 * CUDA in the build, no driver, no device). Needs no kv_dev. */
int kv_dev_current_uuid(uint8_t uuid[16]);
/* The last failure's reason (or AUTO's fallback reason); "" if none. */
const char *kv_dev_reason(const kv_dev *dev);

/* ---- pools (daemon side) ------------------------------------------------------- */

/*
 * Allocates a pool of at least `bytes` of device memory (rounded up to the
 * allocation granularity; kv_dev_pool_bytes says how much).
 *  CUDA: VMM (cuMemCreate with POSIX-fd handles, mapped and made
 *        read-write for this device); where the device lacks VMM or
 *        POSIX-fd handles, or KV_DEV_LEGACY_IPC=1 is set: cudaMalloc with a
 *        cudaIpcGetMemHandle. SIM: a memfd mapped MAP_SHARED.
 * 0, -EINVAL (bytes 0), -ENOMEM, -EIO (driver), -errno.
 */
int kv_dev_pool_create(kv_dev *dev, size_t bytes, kv_dev_pool **out);
/* Frees the pool. -EBUSY (nothing done) while copies are unreaped. A
 * worker's mapping of it stays valid until unmapped (the memory lives on
 * until its last mapping goes). NULL: 0. */
int kv_dev_pool_destroy(kv_dev *dev, kv_dev_pool *pool);
void *kv_dev_pool_base(const kv_dev_pool *pool); /* the daemon-side device address */
size_t kv_dev_pool_bytes(const kv_dev_pool *pool);

/* ---- export / import --------------------------------------------------------- */

/* Export kinds; 1 and 2 equal proto/wire.h's KV_TI_G1_VMM and
 * KV_TI_G1_CUDAIPC, so the kind can be the tier-info entry's kind. */
#define KV_DEVX_VMM_FD      1 /* CUDA VMM allocation, POSIX fd (SCM_RIGHTS) */
#define KV_DEVX_LEGACY_IPC  2 /* cudaIpcMemHandle_t in `handle`, no fd */
#define KV_DEVX_SIM_FD      3 /* simulation memfd (SCM_RIGHTS) */
#define KV_DEVX_HANDLE_MAX  64
#define KV_DEVX_ENCODED_MAX 128 /* kv_dev_export_encode never writes more */

typedef struct kv_dev_export {
  uint8_t kind;                       /* KV_DEVX_* */
  int fd;                             /* VMM_FD, SIM_FD: the fd to send (owned by the pool:
                     * send it, do not close it); -1 otherwise and after
                     * decode (the receiver puts the fd it got here) */
  uint64_t bytes;                     /* the pool's size */
  uint8_t uuid[16];                   /* the device the pool lives on */
  uint16_t handle_len;                /* LEGACY_IPC: 64; else 0 */
  uint8_t handle[KV_DEVX_HANDLE_MAX]; /* LEGACY_IPC: the cudaIpcMemHandle_t */
} kv_dev_export;

/* Fills *x for sending to a worker. 0. */
int kv_dev_pool_export(const kv_dev_pool *pool, kv_dev_export *x);

/*
 * The byte string carried as a HELLO tier-info entry's value (the fd
 * travels beside it, by SCM_RIGHTS):
 *   "KVDX" | u8 version (1) | u8 kind | u16 handle_len | u64 bytes |
 *   16 B uuid | handle_len B handle            (little-endian)
 * encode: returns the length written (<= KV_DEVX_ENCODED_MAX), -ENOSPC if
 * cap is too small, -EINVAL for an export that is not well formed.
 * decode: strict - a wrong magic or version, an unknown kind, a handle
 * length that does not fit the kind, bytes 0, a short or long input:
 * -EINVAL, never a crash. Sets x->fd = -1.
 */
int kv_dev_export_encode(const kv_dev_export *x, uint8_t *buf, size_t cap);
int kv_dev_export_decode(const uint8_t *buf, size_t len, kv_dev_export *x);

/*
 * Maps an exported pool into this process (the worker side). The pool's
 * uuid must be this device's: else -ENODEV ("pool is on another device";
 * open the device by uuid first). A kind this backend cannot map (a SIM
 * export into a CUDA device or the reverse) is -EOPNOTSUPP. -EINVAL (bad
 * export: no fd, fd smaller than bytes), -EIO (driver refused), -errno.
 * x->fd is not taken: the caller closes it after the call, either way.
 * CUDA legacy IPC cannot be opened in the process that created the pool.
 */
int kv_dev_pool_import(kv_dev *dev, const kv_dev_export *x, kv_dev_map **out);
/* Unmaps. -EBUSY while copies are unreaped. NULL: 0. */
int kv_dev_unmap(kv_dev *dev, kv_dev_map *m);
void *kv_dev_map_base(const kv_dev_map *m); /* device address in this process */
size_t kv_dev_map_bytes(const kv_dev_map *m);

/* ---- host memory ------------------------------------------------------------- */

/* Registers [p, p+n) as the host side of copies (CUDA: cudaHostRegister,
 * portable, so the copies are DMA; G2 arenas go here, see kv_arena_opts'
 * register_fn). A range another kv_dev of this process registered already
 * (a daemon with a pool on each of several GPUs) is taken as it is: the
 * portable registration serves every device, and only the kv_dev that made
 * it undoes it, so unregister it from the others first. -EINVAL (NULL, 0,
 * overlap with a range registered with this kv_dev), -EIO (driver),
 * -ENOMEM. */
int kv_dev_host_register(kv_dev *dev, void *p, size_t n);
/* p: exactly a registered range's start. -ENOENT if none, -EBUSY while
 * copies are unreaped. */
int kv_dev_host_unregister(kv_dev *dev, void *p);
/* kv_dev_host_register, and the range is also mapped into the device's
 * address space so kernels can read and write it in place (CUDA:
 * cudaHostRegisterPortable | cudaHostRegisterMapped). *dptr gets the
 * device-side address of p (CUDA: cudaHostGetDevicePointer, which equals
 * p on current GPUs - cudaDevAttrCanUseHostPointerForRegisteredMem - but
 * is not assumed to; SIM: p). A range another kv_dev registered already
 * must have been mapped too, else -EIO and nothing is registered here.
 * Undone by kv_dev_host_unregister. Errors as kv_dev_host_register. What a
 * worker registers its G2 mapping with (kvc_g2_register_cuda). */
int kv_dev_host_register_mapped(kv_dev *dev, void *p, size_t n, void **dptr);
/* Test hook: 1 when [p, ...) starts a host range registered with the
 * simulation in this process (by any SIM kv_dev; the process-wide list
 * that models CUDA's portable registration), else 0. */
int kv_dev_sim_host_registered(const void *p);

/* ---- the copy engine --------------------------------------------------------- */

typedef enum kv_dev_dir {
  KV_DEV_H2D = 0, /* G2 -> G1: src host, dst device */
  KV_DEV_D2H = 1, /* G1 -> G2: src device, dst host */
  KV_DEV_D2D = 2, /* within G1 */
} kv_dev_dir;
#define KV_DEV_NDIR      3
#define KV_DEV_BATCH_MAX 65536 /* copies per submission */

typedef struct kv_dev_copy {
  void *dst;
  const void *src;
  size_t bytes; /* > 0 */
} kv_dev_copy;

typedef struct kv_dev_done {
  uint64_t tag;
  int status; /* 0 or -errno */
} kv_dev_done;

/*
 * Queues v[0..n) (copied: v may be reused on return) on the direction's
 * stream/thread under `tag` (the caller's; need not be unique). All or
 * nothing: on error nothing was queued and nothing will be reaped.
 * -EINVAL (n 0 or > KV_DEV_BATCH_MAX, bytes 0, bad dir, src and dst
 * overlapping), -EFAULT (a side outside its kind of range: see
 * "Addresses"), -EIO (the driver refused the submission), -ENOMEM.
 */
int kv_dev_submit(kv_dev *dev, kv_dev_dir dir, const kv_dev_copy *v, unsigned n, uint64_t tag);
/* The completion eventfd (non-blocking, close-on-exec, owned by dev). */
int kv_dev_completion_fd(const kv_dev *dev);
/* Moves up to max finished submissions to out, oldest first; returns the
 * count (0 when none). Clears the fd's readiness when it empties the queue,
 * leaves it readable when entries remain. */
unsigned kv_dev_reap(kv_dev *dev, kv_dev_done *out, unsigned max);
/* Submissions accepted and not yet reaped. */
unsigned kv_dev_inflight(const kv_dev *dev);
/* Waits (poll on the completion fd, no spinning) until at least one
 * completion can be reaped or timeout_ms passes (-1: forever).
 * 0, -ETIMEDOUT, -errno. For tests, tools and shutdown paths. */
int kv_dev_wait(kv_dev *dev, int timeout_ms);

/* One synchronous copy, checked like a submission, not ordered against
 * submissions in flight. For tests and benchmarks. */
int kv_dev_memcpy_sync(kv_dev *dev, kv_dev_dir dir, void *dst, const void *src, size_t n);

/* Test hook (both backends): the next accepted submission performs only
 * the first half of its copies and is reaped with `status` (< 0). So the
 * upper layers can test their error paths. -EINVAL if status >= 0. */
int kv_dev_inject_fail_next(kv_dev *dev, int status);
/* The same for every submission, from outside a process: the simulation
 * reads KV_DEV_SIM_FAIL=<errno> (> 0) at open (tests of the daemon's
 * failure paths; CUDA ignores it). */

/*
 * dev_cuda.c (CUDA builds only), shared with libkvclient's kvc_memcpy_batch:
 * queues v[0..k) on `stream` (a cudaStream_t) as one cudaMemcpyBatchAsync
 * while *batch is 1 (k > 1, and a stream other than the legacy default,
 * which the batch call refuses), else - or when the driver refuses the
 * batch call, which then sets *batch to 0 for good - as a loop of
 * cudaMemcpyAsync(cudaMemcpyDefault). Source access order "stream";
 * location hints from dir (H2D, D2H, D2D), or with dir KV_DEV_NDIR from
 * each pointer (cudaPointerGetAttributes: what a batch of mixed directions
 * needs). Returns 0 (cudaSuccess) or the cudaError_t of the call that
 * failed, cleared from the thread's error state; *queued (may be NULL)
 * gets how many copies were queued before it: k on success, 0 when a
 * batch call failed (all or nothing), i when copy i of the loop failed.
 */
int kv_cuda_enqueue(const kv_dev_copy *v, size_t k, int dir, void *stream, int *batch,
                    size_t *queued);

#endif
