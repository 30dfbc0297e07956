/*
 * belady.c - Belady's MIN over a trace (belady.h): the references numbered
 * by block, each with the position of its block's next reference, and a
 * max-heap of the held blocks by that position.
 */
#include "tools/belady.h"

#include <errno.h>
#include <stdlib.h>

#define NONE UINT32_MAX

int kv_belady_prepare(kv_belady *b, const kv_trace *t) {
  b->dense = malloc((t->nids ? t->nids : 1) * sizeof *b->dense);
  b->next = malloc((t->nids ? t->nids : 1) * sizeof *b->next);
  uint64_t *last = NULL;
  size_t nu = 0;
  int rc = -ENOMEM;
  if (!b->dense || !b->next || kv_trace_dense(t, b->dense, &nu)) goto out;
  b->nunique = (uint32_t)nu;
  last = malloc((nu ? nu : 1) * sizeof *last);
  if (!last) goto out;
  for (uint32_t d = 0; d < b->nunique; d++) last[d] = UINT64_MAX;
  for (size_t i = t->nids; i-- > 0;) {
    b->next[i] = last[b->dense[i]];
    last[b->dense[i]] = i;
  }
  rc = 0;
out:
  free(last);
  if (rc) kv_belady_free(b);
  return rc;
}

void kv_belady_free(kv_belady *b) {
  free(b->dense);
  free(b->next);
  b->dense = NULL;
  b->next = NULL;
  b->nunique = 0;
}

/* The held blocks, a max-heap by the position of their next reference. */
typedef struct maxheap {
  uint32_t *v, n;   /* dense ids */
  uint32_t *pos;    /* per dense id: its place in v, NONE if not held */
  uint64_t *key;    /* per dense id: its next reference */
} maxheap;

static void put(maxheap *h, uint32_t i, uint32_t d) {
  h->v[i] = d;
  h->pos[d] = i;
}

static void fix(maxheap *h, uint32_t i) {
  uint32_t d = h->v[i];
  uint64_t k = h->key[d];
  while (i > 0 && h->key[h->v[(i - 1) / 2]] < k) {
    put(h, i, h->v[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = k;
    if (l < h->n && h->key[h->v[l]] > mk) m = l, mk = h->key[h->v[l]];
    if (l + 1 < h->n && h->key[h->v[l + 1]] > mk) m = l + 1;
    if (m == i) break;
    put(h, i, h->v[m]);
    i = m;
  }
  put(h, i, d);
}

int kv_belady_run(const kv_belady *b, const kv_trace *t, uint32_t cap, kv_trace_hits *r) {
  maxheap h = {0};
  uint32_t nu = b->nunique ? b->nunique : 1;
  h.v = malloc((cap ? cap : 1) * sizeof *h.v);
  h.pos = malloc(nu * sizeof *h.pos);
  h.key = malloc(nu * sizeof *h.key);
  if (!h.v || !h.pos || !h.key) {
    free(h.v), free(h.pos), free(h.key);
    return -ENOMEM;
  }
  for (uint32_t d = 0; d < b->nunique; d++) h.pos[d] = NONE;
  *r = (kv_trace_hits){0};
  for (size_t qi = 0; qi < t->nreq; qi++) {
    const kv_trace_req *q = &t->req[qi];
    size_t off = (size_t)(q->ids - t->ids);
    uint32_t prefix = 0, any = 0;
    int run = 1;
    for (uint32_t i = 0; i < q->n; i++) {
      int hit = h.pos[b->dense[off + i]] != NONE;
      any += hit;
      if (run && hit) prefix++;
      else run = 0;
    }
    kv_trace_count(r, q, prefix, any);
    for (uint32_t i = 0; i < q->n && cap; i++) {
      uint32_t d = b->dense[off + i];
      uint64_t nx = b->next[off + i];
      if (h.pos[d] != NONE) {
        h.key[d] = nx;
        fix(&h, h.pos[d]);
        continue;
      }
      if (h.n == cap) {
        h.pos[h.v[0]] = NONE; /* the farthest held block goes */
        h.key[d] = nx;
        put(&h, 0, d);
        fix(&h, 0);
        continue;
      }
      h.key[d] = nx;
      put(&h, h.n++, d);
      fix(&h, h.n - 1);
    }
  }
  free(h.v);
  free(h.pos);
  free(h.key);
  return 0;
}
