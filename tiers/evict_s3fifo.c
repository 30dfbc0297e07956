/*
 * evict_s3fifo.c - S3-FIFO (Yang et al., SOSP'23): three FIFO queues.
 *
 *   S  small: where new blocks arrive; 10% of the held blocks (the paper's
 *      figure: most objects are used once and should leave quickly).
 *   M  main: the rest, FIFO with lazy promotion (a block whose frequency
 *      counter is non-zero goes back to the tail, counter minus one).
 *   G  ghosts: fingerprints of blocks evicted from S, bounded by the tier's
 *      capacity (kv_ghost). A new block found there goes straight to M.
 *
 * Each block carries a 2-bit frequency (0..3) that an access increments.
 * When S is over its share, its head leaves: to M if it was used since it
 * arrived, else evicted (into G). Otherwise M's head is examined.
 *
 * Contract: the lowest priority class present goes first (both queues are
 * keyed class-first and only heads of that class are considered). A block
 * that returns to the policy after a pin or as a parent whose last child
 * left keeps the queue and counter it had (remembered in b->hpos); one the
 * policy never held starts in S with a counter from the core's access
 * count.
 */
#include <errno.h>
#include <stdlib.h>

#include "tiers/evict_impl.h"

enum { Q_S = 1, Q_M = 2, Q_REMEMBERED = 14 };
#define S_SHARE_DIV 10 /* S gets 1/10 of the held blocks */
#define FREQ_MAX    3

typedef struct s3 {
  kv_pq s, m;
  kv_ghost g;
  uint64_t seq;
  uint32_t peak;
  kv_bid offered;
} s3;

static uint32_t s3_cap(kv_evict *e, s3 *f) {
  if (e->capacity) return e->capacity;
  uint32_t c = 64;
  while (c < f->peak) c <<= 1;
  return c;
}

static int s3_init(kv_evict *e) {
  s3 *f = calloc(1, sizeof *f);
  if (!f) return -ENOMEM;
  f->s.id = Q_S;
  f->m.id = Q_M;
  f->offered = KV_BID_NONE;
  e->priv = f;
  if (kv_ghost_size(&f->g, s3_cap(e, f))) {
    free(f);
    e->priv = NULL;
    return -ENOMEM;
  }
  return 0;
}

static void s3_fini(kv_evict *e) {
  s3 *f = e->priv;
  if (!f) return;
  kv_pq_free(&f->s);
  kv_pq_free(&f->m);
  kv_ghost_free(&f->g);
  free(f);
  e->priv = NULL;
}

static int s3_add(kv_evict *e, kv_block *b) {
  s3 *f = e->priv;
  if (++e->count > f->peak) {
    f->peak = e->count;
    if (!e->capacity && s3_cap(e, f) != f->g.cap) kv_ghost_size(&f->g, s3_cap(e, f));
  }
  uint32_t w = b->hpos[e->tier];
  kv_pq *q = &f->s;
  uint32_t freq;
  if (w != KV_SLOT_NONE && KV_PQ_ID(w) == Q_REMEMBERED) { /* back after a pin */
    q = ((w >> 4) & 3) == Q_M ? &f->m : &f->s;
    freq = w & 3;
  } else {
    freq = b->hits > 1 ? (b->hits - 1 > FREQ_MAX ? FREQ_MAX : b->hits - 1u) : 0;
    if (b->hits <= 1 && kv_ghost_take(&f->g, kv_fingerprint(b))) q = &f->m;
  }
  int rc = kv_pq_push(e, q, b, KV_PQ_KEY(b->prio, ++f->seq), freq);
  if (rc) e->count--;
  return rc;
}

static void s3_remove(kv_evict *e, kv_block *b) {
  s3 *f = e->priv;
  uint32_t qid = KV_PQ_ID(b->hpos[e->tier]);
  uint32_t freq = kv_pq_del(e, qid == Q_S ? &f->s : &f->m, b);
  e->count--;
  if (b->id == f->offered) {
    if (qid == Q_S) kv_ghost_add(&f->g, kv_fingerprint(b));
    f->offered = KV_BID_NONE;
    return;
  }
  b->hpos[e->tier] = ((uint32_t)Q_REMEMBERED << KV_PQ_SHIFT) | (qid << 4) | freq;
}

static void s3_touch(kv_evict *e, kv_block *b) {
  s3 *f = e->priv;
  kv_pq *q = KV_PQ_ID(b->hpos[e->tier]) == Q_S ? &f->s : &f->m;
  kv_pq_ent *x = kv_pq_ent_of(q, b, e->tier);
  if (x->aux < FREQ_MAX) x->aux++;
  uint64_t key = KV_PQ_KEY(b->prio, x->key);
  if (key != x->key) kv_pq_rekey(e, q, b, key); /* its class changed */
}

/* Moves the head of `from` to the tail of `to` with counter `freq`. */
static void requeue(kv_evict *e, s3 *f, kv_pq *from, kv_pq *to, uint32_t freq) {
  kv_block *b = kv_index_at(e->ix, kv_pq_top(from)->bid);
  uint64_t key = KV_PQ_KEY(b->prio, ++f->seq);
  if (from == to) {
    kv_pq_top(from)->aux = freq;
    kv_pq_rekey(e, from, b, key);
    return;
  }
  kv_pq_del(e, from, b);
  if (kv_pq_push(e, to, b, key, freq)) kv_pq_push(e, from, b, key, freq); /* from has room */
}

static kv_block *s3_peek(kv_evict *e) {
  s3 *f = e->priv;
  kv_pq *qs[2] = {&f->s, &f->m};
  unsigned cls = kv_pq_min_class(qs, 2);
  if (cls > 255) return NULL;
  /* Every turn either offers a victim or lowers a counter / moves a block
   * from S to M with its counter cleared, so this ends. */
  for (;;) {
    int s_ok = kv_pq_top_in(&f->s, cls), m_ok = kv_pq_top_in(&f->m, cls);
    int from_s = s_ok && (!m_ok || (uint64_t)f->s.n * S_SHARE_DIV >= (uint64_t)e->count);
    kv_pq *q = from_s ? &f->s : &f->m;
    kv_pq_ent *t = kv_pq_top(q);
    if (t->aux == 0) {
      f->offered = t->bid;
      return kv_index_at(e->ix, t->bid);
    }
    if (from_s) requeue(e, f, q, &f->m, 0);
    else requeue(e, f, q, q, t->aux - 1);
  }
}

const kv_evict_ops kv_evict_s3fifo_ops = {
    "s3fifo", "S3-FIFO: small, main and ghost FIFO queues (Yang et al.)",
    s3_init,  s3_fini,
    s3_add,   s3_remove,
    s3_touch, s3_peek,
    NULL,     NULL,
    NULL,
    NULL,
};
