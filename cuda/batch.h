/*
 * batch.h - many copies per submission: a queue in front of kv_dev_submit.
 *
 * The daemon starts G1 copies one block at a time (the core's mover is
 * called per block), but the copy engine is fastest with many copies per
 * submission (one cudaMemcpyBatchAsync, one event, one host callback). A
 * kv_dev_batcher collects copies, each under its own tag, and submits what
 * it holds for a direction as one submission when flushed (or when a
 * direction holds `max` copies). Its reap hands each copy's own tag back,
 * with the status of the submission it went in.
 *
 *   kv_dev_batch_add    queue one copy under tag (nothing reaches the
 *                       device yet); the direction is submitted at once
 *                       when it reaches max copies.
 *   kv_dev_batch_flush  submit everything queued: one submission per
 *                       direction that holds copies. The owner calls it
 *                       before its loop blocks (the daemon: a uv_prepare).
 *   kv_dev_batch_reap   up to max {tag, status}: first the copies refused
 *                       at submit, then those of completed submissions,
 *                       oldest first. Call it until it returns 0 whenever
 *                       the device's completion fd is readable, and
 *                       whenever kv_dev_batch_ready is not 0 (a refusal,
 *                       at a flush or at an add that filled a direction,
 *                       is not signalled on the fd).
 *
 * Every tag added is reaped exactly once, with 0 or a negative errno, and
 * never from inside kv_dev_batch_add or kv_dev_batch_flush: a caller may
 * add copies from its reap handler. Until a tag is reaped, its copy's bytes
 * belong to the copy engine (dev.h's reuse rule).
 *
 * A refused submission (kv_dev_submit's -EFAULT, -EINVAL, -EIO, -ENOMEM)
 * is retried copy by copy, so one bad copy fails alone: the others go on
 * as submissions of one. Directions are independent; within one, copies
 * are submitted in the order they were added, so the device's per-direction
 * FIFO holds across batches.
 *
 * The batcher must be the only submitter on its kv_dev: its reap takes
 * every completion of the device, and each one's tag is its own record.
 * Owner thread only, like the kv_dev it uses.
 */
#ifndef KV_CUDA_BATCH_H
#define KV_CUDA_BATCH_H

#include <stdint.h>

#include "cuda/dev.h"

typedef struct kv__batch_sub kv__batch_sub;

typedef struct kv_dev_batcher {
  kv_dev *dev;
  unsigned max; /* copies per submission */
  struct {
    kv_dev_copy *cp; /* queued, not yet submitted */
    uint64_t *tag;
    unsigned n, cap, tcap;
  } q[KV_DEV_NDIR];
  kv_dev_done *ready;       /* refused, or expanded from a reaped submission */
  unsigned rhead, rn, rcap; /* ready[rhead .. rn); rcap >= outstanding */
  unsigned outstanding;     /* tags added and not yet reaped */
  kv__batch_sub *live;      /* accepted submissions not yet reaped */
  /* Counters, for metrics. */
  uint64_t submissions[KV_DEV_NDIR]; /* submissions accepted */
  uint64_t copies[KV_DEV_NDIR];      /* copies in accepted submissions */
  uint64_t refused[KV_DEV_NDIR];     /* copies refused at submit (reaped with the error) */
  uint64_t split[KV_DEV_NDIR];       /* batches refused whole and retried copy by copy */
} kv_dev_batcher;

/* max: copies per submission, 1 .. KV_DEV_BATCH_MAX (0: 1024). 0 or -EINVAL. */
int kv_dev_batcher_init(kv_dev_batcher *b, kv_dev *dev, unsigned max);
/* Queues one copy. 0, -EINVAL (bad dir, bytes 0), -ENOMEM (nothing
 * queued: the caller still owns tag). */
int kv_dev_batch_add(kv_dev_batcher *b, kv_dev_dir dir, const kv_dev_copy *cp, uint64_t tag);
/* Submits every queued copy. Returns the submissions made. */
unsigned kv_dev_batch_flush(kv_dev_batcher *b);
/* Copies queued and not yet submitted. */
unsigned kv_dev_batch_queued(const kv_dev_batcher *b);
/* Tags kv_dev_batch_reap can hand out without a device completion (the
 * refused copies, and what is left of reaped submissions). */
static inline unsigned kv_dev_batch_ready(const kv_dev_batcher *b) { return b->rn - b->rhead; }
/* Hands out up to max {tag, status} (see above); returns the count. */
unsigned kv_dev_batch_reap(kv_dev_batcher *b, kv_dev_done *out, unsigned max);
/* Frees the queues. Copies still queued are dropped unreaped; call it after
 * the device has been drained (kv_dev_close also drops unreaped
 * submissions, whose records this frees). */
void kv_dev_batcher_fini(kv_dev_batcher *b);

#endif
