/*
 * g3_threads.c - the G3 thread-pool engine: queue_depth threads, each
 * taking one op at a time and moving its header and payload (adjacent on
 * disk) with one preadv2/pwritev2 (RWF_DSYNC under the dsync policy). The
 * fallback where io_uring is missing or refused (seccomp, old kernels,
 * io_uring_disabled), and selectable so tests run every path on both.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "base/log.h"
#include "tiers/g3_internal.h"

#define MAX_THREADS 256

typedef struct thr_eng {
  g3_pool pool;
  kv_g3 *g;
  g3_io_done_fn done; /* where a finished op goes (start's) */
} thr_eng;

/* Moves op's header sector and payload - adjacent on disk - with one
 * vectored call, resumed after a short transfer. */
static void xfer(kv_g3 *g, g3_op *op, uint8_t *hbuf) {
  const g3_file *f = &g->files[op->file];
  uint64_t off = g3_hdr_pos(&f->sb, op->fslot);
  int e = g3_fault_io(g, op, 1, off, G3_SECTOR);
  if (!e) e = g3_fault_io(g, op, 0, off + G3_SECTOR, op->iolen);
  if (e) {
    op->io_err = e;
    return;
  }
  int wr = op->kind == G3_OP_WRITE;
  int flags = wr && g->opts.sync == KV_G3_SYNC_DSYNC ? RWF_DSYNC : 0;
  size_t total = (size_t)G3_SECTOR + op->iolen, done = 0;
  while (done < total) {
    struct iovec v[2];
    int n = 0;
    if (done < G3_SECTOR) {
      v[n++] = (struct iovec){hbuf + done, G3_SECTOR - done};
      v[n++] = (struct iovec){op->buf, op->iolen};
    } else {
      v[n++] = (struct iovec){op->buf + (done - G3_SECTOR), total - done};
    }
    ssize_t r = wr ? pwritev2(f->fd, v, n, (off_t)(off + done), flags)
                   : preadv2(f->fd, v, n, (off_t)(off + done), 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      op->io_err = -errno;
      return;
    }
    if (r == 0) { /* end of file */
      op->io_short = 1;
      return;
    }
    done += (size_t)r;
  }
}

/* A pool thread's transfer of one op (a g3_pool_fn); *state is its
 * header sector buffer. */
static void worker(void *arg, g3_op *op, void **state) {
  thr_eng *t = arg;
  kv_g3 *g = t->g;
  uint8_t *hbuf = *state;
  if (!op) {
    free(hbuf);
    return;
  }
  if (!hbuf && posix_memalign(state, G3_SECTOR, G3_SECTOR)) *state = NULL;
  if (!(hbuf = *state)) {
    op->io_err = -ENOMEM;
  } else {
    if (op->kind == G3_OP_WRITE) {
      memset(hbuf, 0, G3_SECTOR);
      memcpy(hbuf, op->hdr, G3_REC_LEN);
    }
    xfer(g, op, hbuf);
    if (op->kind == G3_OP_READ) memcpy(op->hdr, hbuf, G3_REC_LEN);
  }
  t->done(g, op);
}

static void thr_stop(kv_g3 *g) {
  thr_eng *t = g->eng_priv;
  if (!t) return;
  g3_pool_stop(&t->pool);
  free(t);
  g->eng_priv = NULL;
}

static int thr_start(kv_g3 *g, g3_io_done_fn done) {
  thr_eng *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  t->g = g;
  t->done = done;
  int rc = g3_pool_start(&t->pool, g->qd < MAX_THREADS ? g->qd : MAX_THREADS, worker, t);
  if (rc) {
    free(t);
    return rc;
  }
  g->eng_priv = t;
  return 0;
}

static void thr_submit(kv_g3 *g, g3_op *op) {
  thr_eng *t = g->eng_priv;
  g3_pool_push(&t->pool, op);
}

const g3_engine_ops g3_engine_threads = {
    .name = "threads",
    .kind = KV_G3_BACKEND_THREADS,
    .start = thr_start,
    .submit = thr_submit,
    .stop = thr_stop,
};
