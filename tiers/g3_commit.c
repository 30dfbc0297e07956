/*
 * g3_commit.c - the G3 commit pipeline: the committer thread that makes a
 * batch of finished writes durable (fdatasync of the files they touched,
 * unless the sync policy says otherwise) and only then commits their index
 * entries, with the batch's index deletes, in one LMDB transaction; and the
 * done list that hands finished ops back to the caller's thread, waking it
 * through the eventfd.
 *
 * Batching is group commit: whatever finished while the previous batch was
 * syncing forms the next one (at most opts.commit_max ops), and a batch
 * waits up to commit_window_us from its first write for more while writes
 * are still in flight at the engine - each fdatasync and index commit costs a device cache
 * flush or more, so fewer, larger batches keep the device streaming. A
 * batch never waits once the engine has no write left: the end of a burst
 * commits at once.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "tiers/g3_internal.h"

void g3_done_push(kv_g3 *g, g3_op *op) {
  pthread_mutex_lock(&g->dmu);
  int was_empty = g->dq.head == NULL;
  g3_q_push(&g->dq, op);
  pthread_mutex_unlock(&g->dmu);
  if (was_empty) {
    uint64_t one = 1;
    ssize_t w;
    do { w = write(g->efd, &one, sizeof one); } while (w < 0 && errno == EINTR);
  }
}

g3_op *g3_done_take(kv_g3 *g) {
  uint64_t v;
  ssize_t r;
  /* Drain the eventfd before taking the list: a push after the take then
   * signals again, so no completion waits unseen. */
  do { r = read(g->efd, &v, sizeof v); } while (r < 0 && errno == EINTR);
  pthread_mutex_lock(&g->dmu);
  g3_op *head = g->dq.head;
  g->dq.head = g->dq.tail = NULL;
  g->dq.n = 0;
  pthread_mutex_unlock(&g->dmu);
  return head;
}

/* With cmu held: op joins the committer's queue; an empty queue starts a
 * batch, whose window opens now. */
static void cq_push(kv_g3 *g, g3_op *op) {
  if (!g->cq.head) clock_gettime(CLOCK_MONOTONIC, &g->cq_t0);
  g3_q_push(&g->cq, op);
}

static uint32_t commit_max(const kv_g3 *g) {
  return g->opts.commit_max ? g->opts.commit_max : 4096;
}

void g3_commit_push(kv_g3 *g, g3_op *op) {
  pthread_mutex_lock(&g->cmu);
  cq_push(g, op);
  pthread_cond_signal(&g->ccv);
  pthread_mutex_unlock(&g->cmu);
}

void g3_write_finished(kv_g3 *g, g3_op *op) {
  int ok = op->res == 0;
  /* Counted down under the committer's lock, so a committer waiting for
   * more writes sees the engine run dry. It is woken only when that
   * changes what it does - a batch to start, the engine dry, the batch
   * full - not for every write joining an open window (a context switch
   * per block on a busy machine). */
  pthread_mutex_lock(&g->cmu);
  int wake = atomic_fetch_sub(&g->wr_engine, 1) == 1;
  if (ok) {
    wake |= !g->cq.head;
    cq_push(g, op);
    wake |= g->cq.n >= commit_max(g);
  }
  if (wake) pthread_cond_signal(&g->ccv);
  pthread_mutex_unlock(&g->cmu);
  if (!ok) g3_done_push(g, op);
}

/* Committer, with cmu held and the queue not empty: waits while the window
 * is open, the batch is not full and writes are still coming. The window
 * runs from the batch's first write, not from when the committer got to
 * it: writes that waited out the previous batch's sync are not held for a
 * second window (an ack waits at most window + one commit, the G2 buffers
 * with it). */
static void window_wait(kv_g3 *g, uint32_t max) {
  if (g->window_us <= 0) return;
  struct timespec dl = g->cq_t0;
  dl.tv_nsec += (long)g->window_us * 1000L;
  dl.tv_sec += dl.tv_nsec / 1000000000L;
  dl.tv_nsec %= 1000000000L;
  while (!g->cstop && g->cq.n < max && atomic_load(&g->wr_engine) > 0)
    if (pthread_cond_timedwait(&g->ccv, &g->cmu, &dl) == ETIMEDOUT) break;
}

static void commit_batch(kv_g3 *g, g3_op *batch) {
  /* 1. Data first: flush every file a write of this batch touched. */
  if (g->opts.sync == KV_G3_SYNC_BATCH) {
    for (unsigned f = 0; f < g->nfiles; f++) {
      int touched = 0;
      for (g3_op *op = batch; op && !touched; op = op->next)
        touched = op->kind == G3_OP_WRITE && op->res == 0 && op->file == f;
      if (!touched) continue;
      int e = fdatasync(g->files[f].fd) < 0 ? -errno : 0;
      atomic_fetch_add(&g->a_syncs, 1);
      if (e) {
        for (g3_op *op = batch; op; op = op->next)
          if (op->kind == G3_OP_WRITE && op->res == 0 && op->file == f) op->res = e;
      }
    }
  }
  /* 2. Then the index, in one transaction. */
  int rc = g3_idx_apply(g, batch);
  if (rc) {
    for (g3_op *op = batch; op; op = op->next)
      if (op->res == 0) op->res = rc;
  }
}

static void *committer_main(void *arg) {
  kv_g3 *g = arg;
  uint32_t max = commit_max(g);
  for (;;) {
    pthread_mutex_lock(&g->cmu);
    while (!g->cq.head && !g->cstop) pthread_cond_wait(&g->ccv, &g->cmu);
    if (!g->cq.head) {
      pthread_mutex_unlock(&g->cmu);
      break;
    }
    window_wait(g, max);
    g3_op *batch = NULL, *tail = NULL;
    for (uint32_t n = 0; n < max && g->cq.head; n++) {
      g3_op *op = g3_q_pop(&g->cq);
      if (tail) tail->next = op;
      else batch = op;
      tail = op;
    }
    pthread_mutex_unlock(&g->cmu);
    commit_batch(g, batch);
    while (batch) {
      g3_op *next = batch->next;
      g3_done_push(g, batch);
      batch = next;
    }
  }
  return NULL;
}

int g3_pipe_start(kv_g3 *g) {
  g->cstop = 0;
  int rc = pthread_create(&g->committer, NULL, committer_main, g);
  if (rc) return -rc;
  g->committer_started = 1;
  return 0;
}

void g3_pipe_stop(kv_g3 *g) {
  if (!g->committer_started) return;
  pthread_mutex_lock(&g->cmu);
  g->cstop = 1;
  pthread_cond_signal(&g->ccv);
  pthread_mutex_unlock(&g->cmu);
  pthread_join(g->committer, NULL);
  g->committer_started = 0;
}
