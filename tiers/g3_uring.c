/*
 * g3_uring.c - the G3 io_uring engine. One thread makes and owns the ring
 * (its only submitter: SINGLE_ISSUER | DEFER_TASKRUN where the kernel has
 * them, with fallbacks; data files and ring fd registered): it takes
 * queued ops (at most queue_depth in flight), issues a write as one
 * vectored SQE (header sector and payload, adjacent on disk) and a read as
 * two (header, payload), reaps completions, resubmits the rest of short
 * transfers, and hands finished ops on. Callers wake it through an eventfd
 * that the ring itself keeps a read armed on.
 *
 * Buffers: the engine's header sectors and the G2 arena if the caller
 * gives one (in chunks of at most 1 GiB, the kernel's limit per buffer;
 * kvcached gives none, see G3.md) are registered as fixed buffers, so
 * reads land in G2 with no copy and no per-I/O page pinning;
 * writes go from G2 with no copy too, the kernel pinning the pages per I/O
 * (a vectored write cannot span two registered buffers). If registration
 * is refused (RLIMIT_MEMLOCK, kernel limits) a shorter prefix of the arena
 * is tried, then none: reads then use plain READ, logged once.
 */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "tiers/g3_internal.h"

#define KICK_TAG UINT64_MAX
#define CHUNK    (1ull << 30)
#define MIN_REG  (64ull << 20)

typedef struct uring_eng {
  struct io_uring ring;
  int ring_ok;
  pthread_t thr;
  int thr_started;
  pthread_mutex_t mu;
  g3_queue q;
  int stop;
  int kickfd;
  uint64_t kickval;
  uint32_t inflight;
  uint8_t *hbufs;  /* qd sectors */
  uint32_t *hfree; /* free header sectors (ring thread) */
  uint32_t nhfree;
  int fixed_hdr;  /* header sectors registered as buffer 0 */
  uint8_t *abase; /* registered arena prefix: buffers 1.. */
  uint64_t alen;
  g3_queue fin;    /* transfers done, not yet verified / handed on */
  int enter_err;   /* an io_uring_enter failure was logged */
  int fixed_files; /* the data files are registered: SQEs name their index */
  unsigned setup;  /* the IORING_SETUP_* flags the ring got */
  int start_rc;    /* the ring thread's set-up result, 1 while pending */
  pthread_cond_t start_cv;
  kv_g3 *g;
  g3_io_done_fn done; /* where a finished op goes (start's) */
} uring_eng;

static int buf_index(const uring_eng *u, const uint8_t *p, uint32_t len) {
  if (p >= u->hbufs && p + len <= u->hbufs + (size_t)u->g->qd * G3_SECTOR)
    return u->fixed_hdr ? 0 : -1;
  if (!u->alen || p < u->abase || p + len > u->abase + u->alen) return -1;
  uint64_t off = (uint64_t)(p - u->abase), k = off / CHUNK;
  if ((off + len - 1) / CHUNK != k) return -1; /* straddles two chunks */
  return (int)(1 + k);
}

static struct io_uring_sqe *get_sqe(uring_eng *u) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
  while (!sqe) { /* cannot happen with the ring sized 2*qd+4; be safe */
    io_uring_submit(&u->ring);
    sqe = io_uring_get_sqe(&u->ring);
  }
  return sqe;
}

/* The fd field of an SQE on op's file: its registered index, or the fd. */
static int file_ref(const uring_eng *u, const g3_op *op) {
  return u->fixed_files ? (int)op->file : u->g->files[op->file].fd;
}

static void arm_kick(uring_eng *u) {
  struct io_uring_sqe *sqe = get_sqe(u);
  io_uring_prep_read(sqe, u->kickfd, &u->kickval, sizeof u->kickval, 0);
  io_uring_sqe_set_data64(sqe, KICK_TAG);
}

static void sub_result(uring_eng *u, g3_op *op, int sub, int res);

/* Both transfers are over: the op leaves the device queue at once (its
 * verification runs after the next ops are submitted, see ring_main). */
static void finish(uring_eng *u, g3_op *op) {
  if (op->kind == G3_OP_READ) memcpy(op->hdr, u->hbufs + (size_t)op->ebuf * G3_SECTOR, G3_REC_LEN);
  u->hfree[u->nhfree++] = op->ebuf;
  u->inflight--;
  g3_q_push(&u->fin, op);
}

/* A write's one transfer: its header sector and, right after it on disk,
 * its payload, as one vectored write from where a short one stopped. One
 * request to the device and one extent conversion per block, where two
 * separate writes cost two of each (the block layer does not merge them
 * when they are the only two SQEs of a submission). */
static void issue_write(uring_eng *u, g3_op *op) {
  kv_g3 *g = u->g;
  const g3_file *f = &g->files[op->file];
  uint64_t off = g3_hdr_pos(&f->sb, op->fslot);
  uint32_t done = op->edone[0];
  if (done == 0) {
    int e = g3_fault_io(g, op, 1, off, G3_SECTOR);
    if (!e) e = g3_fault_io(g, op, 0, off + G3_SECTOR, op->iolen);
    if (e) {
      sub_result(u, op, 0, e);
      return;
    }
  }
  uint8_t *h = u->hbufs + (size_t)op->ebuf * G3_SECTOR;
  unsigned n = 0;
  if (done < G3_SECTOR) {
    op->eiov[n++] = (struct iovec){h + done, G3_SECTOR - done};
    op->eiov[n++] = (struct iovec){op->buf, op->iolen};
  } else {
    op->eiov[n++] = (struct iovec){op->buf + (done - G3_SECTOR), G3_SECTOR + op->iolen - done};
  }
  struct io_uring_sqe *sqe = get_sqe(u);
  io_uring_prep_writev(sqe, file_ref(u, op), op->eiov, n, off + done);
  if (u->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
  if (g->opts.sync == KV_G3_SYNC_DSYNC) sqe->rw_flags = RWF_DSYNC;
  io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)op);
}

/* Issues (the rest of) one read transfer: sub 0 header, sub 1 payload. */
static void issue(uring_eng *u, g3_op *op, int sub) {
  kv_g3 *g = u->g;
  const g3_file *f = &g->files[op->file];
  uint8_t *p = sub ? op->buf : u->hbufs + (size_t)op->ebuf * G3_SECTOR;
  uint32_t len = sub ? op->iolen : G3_SECTOR;
  uint64_t off = sub ? g3_data_pos(&f->sb, op->fslot) : g3_hdr_pos(&f->sb, op->fslot);
  uint32_t done = op->edone[sub];
  p += done;
  off += done;
  len -= done;
  int e = g3_fault_io(g, op, !sub, off, len);
  if (e) {
    sub_result(u, op, sub, e);
    return;
  }
  struct io_uring_sqe *sqe = get_sqe(u);
  int bi = buf_index(u, p, len);
  if (bi >= 0) io_uring_prep_read_fixed(sqe, file_ref(u, op), p, len, off, bi);
  else io_uring_prep_read(sqe, file_ref(u, op), p, len, off);
  if (u->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)op | (uint64_t)sub);
}

static void sub_result(uring_eng *u, g3_op *op, int sub, int res) {
  int wr = op->kind == G3_OP_WRITE;
  uint32_t total = wr ? G3_SECTOR + op->iolen : sub ? op->iolen : G3_SECTOR;
  if (res < 0) {
    if (!op->io_err) op->io_err = res;
  } else if (res == 0) {
    op->io_short = 1;
  } else {
    op->edone[sub] += (uint32_t)res;
    if (op->edone[sub] < total) { /* short transfer: go on from there */
      if (wr) issue_write(u, op);
      else issue(u, op, sub);
      return;
    }
  }
  if (--op->epending == 0) finish(u, op);
}

static void start_op(uring_eng *u, g3_op *op) {
  op->ebuf = u->hfree[--u->nhfree];
  op->edone[0] = op->edone[1] = 0;
  u->inflight++;
  if (op->kind == G3_OP_WRITE) {
    uint8_t *h = u->hbufs + (size_t)op->ebuf * G3_SECTOR;
    memset(h, 0, G3_SECTOR);
    memcpy(h, op->hdr, G3_REC_LEN);
    op->epending = 1;
    issue_write(u, op);
    return;
  }
  /* A read: header and payload as two fixed-buffer transfers in flight
   * together (the payload lands in G2 with no per-I/O page pinning).
   * Either may finish at once (an injected fault); epending reaches 0
   * exactly once, and op is not touched here after the second issue. */
  op->epending = 2;
  issue(u, op, 0);
  issue(u, op, 1);
}

/* Moves queued ops to the device while fewer than qd are in flight.
 * Returns 1 if the engine is stopping and has nothing left. */
static int take_ops(uring_eng *u) {
  g3_queue take = {0};
  pthread_mutex_lock(&u->mu);
  while (u->q.head && u->inflight + take.n < u->g->qd) g3_q_push(&take, g3_q_pop(&u->q));
  int done = u->stop && !u->q.head && u->inflight == 0 && take.n == 0 && !u->fin.head;
  pthread_mutex_unlock(&u->mu);
  for (g3_op *op; (op = g3_q_pop(&take));) start_op(u, op);
  return done;
}

static int ring_setup(uring_eng *u);

static void *ring_main(void *arg) {
  uring_eng *u = arg;
  int src = ring_setup(u);
  pthread_mutex_lock(&u->mu);
  u->start_rc = src;
  pthread_cond_signal(&u->start_cv);
  pthread_mutex_unlock(&u->mu);
  if (src) return NULL;
  arm_kick(u);
  for (;;) {
    if (take_ops(u)) break;
    int rc = io_uring_submit_and_wait(&u->ring, u->fin.head ? 0 : 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME && !u->enter_err) {
      u->enter_err = 1; /* once: it is retried on every turn */
      kv_error(G3_SUB, "io_uring_submit_and_wait: %s", strerror(-rc));
    }
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&u->ring, head, cqe) {
      seen++;
      uint64_t ud = io_uring_cqe_get_data64(cqe);
      if (ud == KICK_TAG) {
        arm_kick(u);
        continue;
      }
      g3_op *op = (g3_op *)(uintptr_t)(ud & ~(uint64_t)1);
      sub_result(u, op, (int)(ud & 1), cqe->res);
    }
    io_uring_cq_advance(&u->ring, seen);
    if (!u->fin.head) continue;
    /* Refill the device queue first, so verifying what finished (a CRC
     * over the payload) overlaps the next transfers. */
    take_ops(u);
    io_uring_submit(&u->ring);
    for (g3_op *op; (op = g3_q_pop(&u->fin));) u->done(u->g, op);
  }
  /* The registered ring fd belongs to this thread: give it back here. */
  io_uring_unregister_ring_fd(&u->ring);
  return NULL;
}

static void register_buffers(uring_eng *u) {
  kv_g3 *g = u->g;
  const kv_arena *a = g->opts.arena;
  uint64_t want = a ? a->capacity : 0;
  int err = 0;
  for (uint64_t len = want;; len = len > MIN_REG ? len / 2 / KV_G3_ALIGN * KV_G3_ALIGN : 0) {
    unsigned n = 1 + (unsigned)((len + CHUNK - 1) / CHUNK);
    struct iovec *iov = calloc(n, sizeof *iov);
    if (!iov) {
      err = -ENOMEM;
      break;
    }
    iov[0].iov_base = u->hbufs;
    iov[0].iov_len = (size_t)g->qd * G3_SECTOR;
    for (unsigned i = 1; i < n; i++) {
      uint64_t o = (uint64_t)(i - 1) * CHUNK;
      iov[i].iov_base = a->base + o;
      iov[i].iov_len = (size_t)(len - o < CHUNK ? len - o : CHUNK);
    }
    int rc = g->fault && g->fault->refuse_fixed ? -g->fault->refuse_fixed
                                                : io_uring_register_buffers(&u->ring, iov, n);
    free(iov);
    if (rc == 0) {
      u->fixed_hdr = 1;
      u->abase = a ? a->base : NULL;
      u->alen = len;
      if (len < want)
        kv_warn(G3_SUB,
                "registered only %llu of %llu bytes of the G2 arena with io_uring "
                "(%s); the rest moves without fixed buffers (raise RLIMIT_MEMLOCK)",
                (unsigned long long)len, (unsigned long long)want, strerror(-err));
      g->fixed = a && len == want;
      return;
    }
    err = rc;
    if (len == 0) break;
  }
  kv_warn(G3_SUB,
          "io_uring refused fixed buffers (%s): I/O goes without them "
          "(raise RLIMIT_MEMLOCK for zero-copy)",
          strerror(-err));
}

/* Ring set-up flags, best first; a kernel without one refuses it with
 * EINVAL and the next is tried. SINGLE_ISSUER | DEFER_TASKRUN (6.1): only
 * this thread submits, and completion work runs when it asks for events
 * rather than interrupting it; COOP_TASKRUN (5.19) at least spares it the
 * interrupts. SQPOLL is never asked for (it needs privileges on older
 * kernels and a core of its own). */
static const unsigned setup_flags[] = {
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER,
    IORING_SETUP_COOP_TASKRUN,
    0,
};

/* On the ring thread, which is then the ring's only submitter: makes the
 * ring, registers the buffers (falling back as register_buffers says),
 * the data files (else SQEs carry plain fds) and the ring fd (else each
 * io_uring_enter looks the ring up). 0 or -errno. */
static int ring_setup(uring_eng *u) {
  kv_g3 *g = u->g;
  if (g->fault && g->fault->refuse_uring) return -g->fault->refuse_uring;
  unsigned entries = 2 * g->qd + 4;
  int rc = -EINVAL;
  for (size_t i = 0; i < sizeof setup_flags / sizeof *setup_flags && rc == -EINVAL; i++) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = setup_flags[i];
    rc = io_uring_queue_init_params(entries, &u->ring, &p);
    if (rc == 0) u->setup = setup_flags[i];
  }
  if (rc < 0) return rc;
  u->ring_ok = 1;
  register_buffers(u);
  int *fds = malloc(g->nfiles * sizeof *fds);
  if (fds) {
    for (unsigned i = 0; i < g->nfiles; i++) fds[i] = g->files[i].fd;
    u->fixed_files = io_uring_register_files(&u->ring, fds, g->nfiles) == 0;
    free(fds);
  }
  int rfd = io_uring_register_ring_fd(&u->ring);
  kv_debug(G3_SUB, "io_uring: setup flags 0x%x, registered files %s, registered ring fd %s",
           u->setup, u->fixed_files ? "yes" : "no", rfd == 1 ? "yes" : "no");
  return 0;
}

static void ur_free(uring_eng *u) {
  if (u->ring_ok) io_uring_queue_exit(&u->ring);
  if (u->kickfd >= 0) close(u->kickfd);
  pthread_mutex_destroy(&u->mu);
  pthread_cond_destroy(&u->start_cv);
  free(u->hbufs);
  free(u->hfree);
  free(u);
}

static int ur_start(kv_g3 *g, g3_io_done_fn done) {
  uring_eng *u = calloc(1, sizeof *u);
  if (!u) return -ENOMEM;
  int rc;
  u->g = g;
  u->done = done;
  u->kickfd = -1;
  u->start_rc = 1;
  pthread_mutex_init(&u->mu, NULL);
  pthread_cond_init(&u->start_cv, NULL);
  if (posix_memalign((void **)&u->hbufs, G3_SECTOR, (size_t)g->qd * G3_SECTOR)) {
    u->hbufs = NULL;
    rc = -ENOMEM;
    goto err;
  }
  memset(u->hbufs, 0, (size_t)g->qd * G3_SECTOR);
  u->hfree = malloc(g->qd * sizeof *u->hfree);
  if (!u->hfree) {
    rc = -ENOMEM;
    goto err;
  }
  for (uint32_t i = 0; i < g->qd; i++) u->hfree[i] = g->qd - 1 - i;
  u->nhfree = g->qd;
  u->kickfd = eventfd(0, EFD_CLOEXEC);
  if (u->kickfd < 0) {
    rc = -errno;
    goto err;
  }
  g->eng_priv = u;
  rc = pthread_create(&u->thr, NULL, ring_main, u);
  if (rc) {
    rc = -rc;
    goto err;
  }
  pthread_mutex_lock(&u->mu);
  while (u->start_rc == 1) pthread_cond_wait(&u->start_cv, &u->mu);
  rc = u->start_rc;
  pthread_mutex_unlock(&u->mu);
  if (rc) {
    pthread_join(u->thr, NULL);
    goto err;
  }
  u->thr_started = 1;
  return 0;
err:
  g->eng_priv = NULL;
  g->fixed = 0;
  ur_free(u);
  return rc;
}

static void ur_submit(kv_g3 *g, g3_op *op) {
  uring_eng *u = g->eng_priv;
  pthread_mutex_lock(&u->mu);
  int was_empty = u->q.head == NULL;
  g3_q_push(&u->q, op);
  pthread_mutex_unlock(&u->mu);
  if (was_empty) {
    uint64_t one = 1;
    ssize_t w;
    do { w = write(u->kickfd, &one, sizeof one); } while (w < 0 && errno == EINTR);
  }
}

static void ur_stop(kv_g3 *g) {
  uring_eng *u = g->eng_priv;
  if (!u) return;
  pthread_mutex_lock(&u->mu);
  u->stop = 1;
  pthread_mutex_unlock(&u->mu);
  uint64_t one = 1;
  ssize_t w;
  do { w = write(u->kickfd, &one, sizeof one); } while (w < 0 && errno == EINTR);
  if (u->thr_started) pthread_join(u->thr, NULL);
  ur_free(u);
  g->eng_priv = NULL;
}

const g3_engine_ops g3_engine_uring = {
    .name = "uring",
    .kind = KV_G3_BACKEND_URING,
    .start = ur_start,
    .submit = ur_submit,
    .stop = ur_stop,
};
