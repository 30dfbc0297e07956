/* batch.c - many copies per submission (batch.h). */
#include "cuda/batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One accepted submission: the tags of its copies. Its address is the
 * device-level tag. Listed, so fini frees those a closed device dropped. */
struct kv__batch_sub {
  kv__batch_sub *prev, *next;
  unsigned n;
  uint64_t tag[];
};

static int grow(void **p, unsigned *cap, unsigned need, size_t each) {
  if (need <= *cap) return 0;
  unsigned c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void *np = realloc(*p, (size_t)c * each);
  if (!np) return -ENOMEM;
  *p = np;
  *cap = c;
  return 0;
}

int kv_dev_batcher_init(kv_dev_batcher *b, kv_dev *dev, unsigned max) {
  if (!dev || max > KV_DEV_BATCH_MAX) return -EINVAL;
  memset(b, 0, sizeof *b);
  b->dev = dev;
  b->max = max ? max : 1024;
  return 0;
}

/* Cannot fail: add keeps room in `ready` for every outstanding tag. */
static void ready_push(kv_dev_batcher *b, uint64_t tag, int status) {
  if (b->rn == b->rcap) {
    memmove(b->ready, b->ready + b->rhead, (size_t)(b->rn - b->rhead) * sizeof *b->ready);
    b->rn -= b->rhead;
    b->rhead = 0;
  }
  b->ready[b->rn++] = (kv_dev_done){.tag = tag, .status = status};
}

/* One submission of v[0..n) under tags t[0..n). 0, or the device's error
 * (then nothing was queued). */
static int submit(kv_dev_batcher *b, kv_dev_dir dir, const kv_dev_copy *v, const uint64_t *t,
                  unsigned n) {
  kv__batch_sub *s = malloc(sizeof *s + (size_t)n * sizeof s->tag[0]);
  if (!s) return -ENOMEM;
  s->n = n;
  memcpy(s->tag, t, (size_t)n * sizeof t[0]);
  int rc = kv_dev_submit(b->dev, dir, v, n, (uint64_t)(uintptr_t)s);
  if (rc) {
    free(s);
    return rc;
  }
  s->prev = NULL;
  s->next = b->live;
  if (b->live) b->live->prev = s;
  b->live = s;
  b->submissions[dir]++;
  b->copies[dir] += n;
  return 0;
}

/* Submits what dir holds: as one submission, or copy by copy if the device
 * refuses it whole. Returns the submissions made. */
static unsigned flush_dir(kv_dev_batcher *b, kv_dev_dir dir) {
  unsigned n = b->q[dir].n;
  if (n == 0) return 0;
  const kv_dev_copy *v = b->q[dir].cp;
  const uint64_t *t = b->q[dir].tag;
  b->q[dir].n = 0;
  int rc = submit(b, dir, v, t, n);
  if (rc == 0) return 1;
  unsigned made = 0;
  if (n > 1) b->split[dir]++;
  for (unsigned i = 0; i < n; i++) {
    if (n > 1) rc = submit(b, dir, &v[i], &t[i], 1);
    if (rc == 0) {
      made++;
    } else {
      b->refused[dir]++;
      ready_push(b, t[i], rc);
    }
  }
  return made;
}

int kv_dev_batch_add(kv_dev_batcher *b, kv_dev_dir dir, const kv_dev_copy *cp, uint64_t tag) {
  if ((unsigned)dir >= KV_DEV_NDIR || !cp || cp->bytes == 0) return -EINVAL;
  unsigned n = b->q[dir].n;
  if (grow((void **)&b->q[dir].cp, &b->q[dir].cap, n + 1, sizeof *cp) ||
      grow((void **)&b->q[dir].tag, &b->q[dir].tcap, n + 1, sizeof tag) ||
      grow((void **)&b->ready, &b->rcap, b->outstanding + 1, sizeof *b->ready))
    return -ENOMEM;
  b->q[dir].cp[n] = *cp;
  b->q[dir].tag[n] = tag;
  b->q[dir].n = n + 1;
  b->outstanding++;
  if (b->q[dir].n >= b->max) flush_dir(b, dir);
  return 0;
}

unsigned kv_dev_batch_flush(kv_dev_batcher *b) {
  unsigned made = 0;
  for (int d = 0; d < KV_DEV_NDIR; d++) made += flush_dir(b, (kv_dev_dir)d);
  return made;
}

unsigned kv_dev_batch_queued(const kv_dev_batcher *b) {
  unsigned n = 0;
  for (int d = 0; d < KV_DEV_NDIR; d++) n += b->q[d].n;
  return n;
}

unsigned kv_dev_batch_reap(kv_dev_batcher *b, kv_dev_done *out, unsigned max) {
  if (b->rhead == b->rn) {
    kv_dev_done d[32];
    unsigned n = kv_dev_reap(b->dev, d, 32);
    for (unsigned i = 0; i < n; i++) {
      kv__batch_sub *s = (kv__batch_sub *)(uintptr_t)d[i].tag;
      for (unsigned j = 0; j < s->n; j++) ready_push(b, s->tag[j], d[i].status);
      if (s->prev) s->prev->next = s->next;
      else b->live = s->next;
      if (s->next) s->next->prev = s->prev;
      free(s);
    }
  }
  unsigned n = b->rn - b->rhead;
  if (n > max) n = max;
  if (n == 0) return 0;
  memcpy(out, b->ready + b->rhead, (size_t)n * sizeof *out);
  b->rhead += n;
  b->outstanding -= n;
  if (b->rhead == b->rn) b->rhead = b->rn = 0;
  return n;
}

void kv_dev_batcher_fini(kv_dev_batcher *b) {
  while (b->live) {
    kv__batch_sub *s = b->live;
    b->live = s->next;
    free(s);
  }
  for (int d = 0; d < KV_DEV_NDIR; d++) {
    free(b->q[d].cp);
    free(b->q[d].tag);
  }
  free(b->ready);
  memset(b, 0, sizeof *b);
}
