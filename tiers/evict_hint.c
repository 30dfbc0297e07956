/* evict_hint.c - eviction by engine hints (see evict_hint.h). */
#include "tiers/evict_hint.h"

#include <errno.h>
#include <string.h>

#include "tiers/evict_heap.h"
#include "tiers/sessions.h"

#define UNLISTED UINT32_MAX /* prv[id]: the record is in no session's list */
#define NOPOS    UINT32_MAX /* not in a heap */
#define KEY_TOP  (1ull << 62)

typedef struct hr_slot {
  uint32_t head, tail; /* its blocks held, least recently used first: id + 1, 0 none */
  uint32_t count;
  uint32_t hpos, tpos; /* in its namespace's heap, in the timer heap */
  uint16_t gen, ns;    /* the session this state is of */
  uint64_t key;        /* higher goes first */
  uint64_t due;        /* when to make the prediction again; UINT64_MAX: never */
} hr_slot;

typedef struct hr_heap {
  uint32_t *v; /* slots */
  uint32_t n, cap;
} hr_heap;

struct kv_hrank {
  kv_evict *e;
  kv_sessions *s;
  uint32_t *nxt, *prv; /* by record id: session list links (id + 1, 0 none) */
  uint32_t nids;
  hr_slot *ss; /* by session slot */
  uint32_t nss;
  hr_heap *nsh; /* by namespace: max-heap of slots by key */
  uint32_t nnsh;
  hr_heap tim; /* min-heap of slots by due */
};

static inline uint32_t raw_slot(uint32_t ref) {
  return (ref & ((1u << KV_SESS_SLOT_BITS) - 1)) - 1;
}

/* ---- the two heaps of slots ----------------------------------------------- */

/* tim: 1, by due, smallest first; else by key, largest first. */
static inline int before(const kv_hrank *h, int tim, uint32_t a, uint32_t b) {
  return tim ? h->ss[a].due < h->ss[b].due : h->ss[a].key > h->ss[b].key;
}
static inline void hput(kv_hrank *h, hr_heap *q, int tim, uint32_t i, uint32_t g) {
  q->v[i] = g;
  if (tim) h->ss[g].tpos = i;
  else h->ss[g].hpos = i;
}
static void hfix(kv_hrank *h, hr_heap *q, int tim, uint32_t i) {
  uint32_t x = q->v[i];
  while (i > 0 && before(h, tim, x, q->v[(i - 1) / 2])) {
    hput(h, q, tim, i, q->v[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint32_t best = x;
    if (l < q->n && before(h, tim, q->v[l], best)) m = l, best = q->v[l];
    if (l + 1 < q->n && before(h, tim, q->v[l + 1], best)) m = l + 1;
    if (m == i) break;
    hput(h, q, tim, i, q->v[m]);
    i = m;
  }
  hput(h, q, tim, i, x);
}
static int hpush(kv_hrank *h, hr_heap *q, int tim, uint32_t g) {
  if (kv_meta_grow((void **)&q->v, &q->cap, (uint64_t)q->n + 1, sizeof *q->v)) return -ENOMEM;
  hput(h, q, tim, q->n++, g);
  hfix(h, q, tim, q->n - 1);
  return 0;
}
static void hdel(kv_hrank *h, hr_heap *q, int tim, uint32_t i) {
  uint32_t g = q->v[i];
  if (tim) h->ss[g].tpos = NOPOS;
  else h->ss[g].hpos = NOPOS;
  if (--q->n == i) return;
  hput(h, q, tim, i, q->v[q->n]);
  hfix(h, q, tim, i);
}

/* ---- predictions ------------------------------------------------------------ */

/* Makes slot g's key and due again, and places it in its heaps. */
static void rescore(kv_hrank *h, uint32_t g) {
  hr_slot *z = &h->ss[g];
  const kv_session *x = &h->s->v[g];
  uint64_t now = h->s->now_ms, until, key;
  uint64_t p = kv_sessions_predict(h->s, x, &until);
  uint64_t ru = kv_sessions_retain_until(h->s, x);
  if (x->flags & KV_SESS_ENDED) {
    key = UINT64_MAX;
  } else if (p == KV_PREDICT_NEVER) { /* overdue past every gap: the longest idle first */
    key = 2 * KEY_TOP + (KEY_TOP - 1 - (x->last_ms < KEY_TOP ? x->last_ms : KEY_TOP - 1));
  } else {
    key = (ru > now ? 0 : KEY_TOP) + (p < KEY_TOP ? p : KEY_TOP - 1);
  }
  if (ru > now && ru < until) until = ru;
  z->key = key;
  z->due = until;
  hr_heap *q = &h->nsh[z->ns];
  if (z->hpos == NOPOS) {
    (void)hpush(h, q, 0, g); /* out of memory: not ranked; its blocks go as the base says */
  } else {
    hfix(h, q, 0, z->hpos);
  }
  if (until == UINT64_MAX) {
    if (z->tpos != NOPOS) hdel(h, &h->tim, 1, z->tpos);
  } else if (z->tpos == NOPOS) {
    (void)hpush(h, &h->tim, 1, g); /* out of memory: predicted again at its next hint */
  } else {
    hfix(h, &h->tim, 1, z->tpos);
  }
}

/* Predictions whose time has come are made again. */
static void run_timers(kv_hrank *h) {
  uint64_t now = h->s->now_ms;
  while (h->tim.n && h->ss[h->tim.v[0]].due <= now) {
    uint32_t g = h->tim.v[0];
    if (h->ss[g].gen != h->s->v[g].gen) hdel(h, &h->tim, 1, 0); /* flushed at its next use */
    else rescore(h, g);
  }
}

/* ---- session lists ---------------------------------------------------------- */

static inline int listed(const kv_hrank *h, kv_bid id) {
  return id < h->nids && h->prv[id] != UNLISTED;
}

static void unlink_block(kv_hrank *h, uint32_t g, kv_bid id) {
  hr_slot *z = &h->ss[g];
  uint32_t n = h->nxt[id], p = h->prv[id];
  if (p) h->nxt[p - 1] = n;
  else z->head = n;
  if (n) h->prv[n - 1] = p;
  else z->tail = p;
  h->prv[id] = UNLISTED;
  if (--z->count) return;
  if (z->hpos != NOPOS) hdel(h, &h->nsh[z->ns], 0, z->hpos);
  if (z->tpos != NOPOS) hdel(h, &h->tim, 1, z->tpos);
}

static void append_block(kv_hrank *h, uint32_t g, kv_bid id) {
  hr_slot *z = &h->ss[g];
  h->nxt[id] = 0;
  h->prv[id] = z->tail;
  if (z->tail) h->nxt[z->tail - 1] = id + 1;
  else z->head = id + 1;
  z->tail = id + 1;
  z->count++;
}

/* Slot g's state belongs to the session in the slot now: if the slot was
 * given to another session, the old one's blocks leave its list (they
 * have no owner any more). */
static void sync_slot(kv_hrank *h, uint32_t g) {
  hr_slot *z = &h->ss[g];
  const kv_session *x = &h->s->v[g];
  if (z->count && z->gen == x->gen && z->ns == x->ns) return;
  while (z->head) unlink_block(h, g, z->head - 1);
  z->gen = x->gen;
  z->ns = x->ns;
}

/* Arrays cover record id and slot g (and g's namespace). 0 or -ENOMEM. */
static int cover(kv_hrank *h, kv_bid id, uint32_t g, uint32_t ns) {
  uint32_t had = h->nids, n2 = h->nids;
  if (kv_meta_grow((void **)&h->nxt, &n2, (uint64_t)id + 1, sizeof *h->nxt)) return -ENOMEM;
  if (kv_meta_grow((void **)&h->prv, &had, n2, sizeof *h->prv)) return -ENOMEM;
  for (uint32_t i = h->nids; i < n2; i++) h->prv[i] = UNLISTED;
  h->nids = n2;
  had = h->nss;
  if (kv_meta_grow((void **)&h->ss, &h->nss, (uint64_t)g + 1, sizeof *h->ss)) return -ENOMEM;
  for (uint32_t i = had; i < h->nss; i++)
    h->ss[i] = (hr_slot){.hpos = NOPOS, .tpos = NOPOS, .gen = UINT16_MAX};
  had = h->nnsh;
  if (kv_meta_grow((void **)&h->nsh, &h->nnsh, (uint64_t)ns + 1, sizeof *h->nsh)) return -ENOMEM;
  memset(h->nsh + had, 0, (size_t)(h->nnsh - had) * sizeof *h->nsh);
  return 0;
}

/* ---- the interface ---------------------------------------------------------- */

kv_hrank *kv_hrank_new(kv_evict *e) {
  if (!e->ix->sessions) return NULL;
  kv_hrank *h = kv_meta_calloc(1, sizeof *h);
  if (!h) return NULL;
  h->e = e;
  h->s = e->ix->sessions;
  return h;
}

void kv_hrank_free(kv_hrank *h) {
  if (!h) return;
  kv_meta_free(h->nxt);
  kv_meta_free(h->prv);
  kv_meta_free(h->ss);
  for (uint32_t i = 0; i < h->nnsh; i++) kv_meta_free(h->nsh[i].v);
  kv_meta_free(h->nsh);
  kv_meta_free(h->tim.v);
  kv_meta_free(h);
}

int kv_hrank_add(kv_hrank *h, kv_block *b) {
  if (listed(h, b->id)) return 0;
  uint32_t g = kv_sessions_owner_slot(h->s, h->e->ix, b->id);
  if (g == UINT32_MAX) return 0;
  if (cover(h, b->id, g, h->s->v[g].ns)) return -ENOMEM;
  sync_slot(h, g);
  append_block(h, g, b->id);
  if (h->ss[g].count == 1) rescore(h, g);
  return 0;
}

void kv_hrank_remove(kv_hrank *h, kv_block *b) {
  if (!listed(h, b->id)) return;
  unlink_block(h, raw_slot(h->e->ix->owner[b->id]), b->id);
}

void kv_hrank_touch(kv_hrank *h, kv_block *b) {
  if (!listed(h, b->id)) {
    (void)kv_hrank_add(h, b); /* out of memory: ranked without its session */
    return;
  }
  uint32_t g = raw_slot(h->e->ix->owner[b->id]);
  if (h->ss[g].tail == b->id + 1) return;
  unlink_block(h, g, b->id);
  int alone = h->ss[g].count == 0;
  append_block(h, g, b->id);
  if (alone) rescore(h, g);
}

void kv_hrank_hinted(kv_hrank *h, kv_block *b, uint32_t old_ref) {
  if (listed(h, b->id)) unlink_block(h, raw_slot(old_ref), b->id);
  (void)kv_hrank_add(h, b);
}

void kv_hrank_session(kv_hrank *h, uint32_t g) {
  if (g >= h->nss || !h->ss[g].count) return;
  sync_slot(h, g);
  if (h->ss[g].count) rescore(h, g);
}

kv_block *kv_hrank_pick(kv_hrank *h, kv_block *v0, kv_bid newest) {
  if (!v0 || !listed(h, v0->id)) return v0;
  run_timers(h);
  hr_heap *q = &h->nsh[v0->ns];
  while (q->n) {
    uint32_t g = q->v[0];
    hr_slot *z = &h->ss[g];
    sync_slot(h, g);
    if (!z->count) continue; /* its session was forgotten: its blocks left */
    kv_block *v = kv_index_at(h->e->ix, z->head - 1);
    if (v->id == newest) {
      if (z->count == 1) return v0;
      v = kv_index_at(h->e->ix, h->nxt[v->id] - 1);
    }
    return v->prio == v0->prio ? v : v0;
  }
  return v0;
}

uint64_t kv_hrank_bytes(const kv_hrank *h) {
  if (!h) return 0;
  uint64_t n = sizeof *h + (uint64_t)h->nids * 8 + (uint64_t)h->nss * sizeof *h->ss +
               (uint64_t)h->nnsh * sizeof *h->nsh + (uint64_t)h->tim.cap * 4;
  for (uint32_t i = 0; i < h->nnsh; i++) n += (uint64_t)h->nsh[i].cap * 4;
  return n;
}

/* ---- "hints": the ranking over an lru base, an expert of "adapt" ----------- */

typedef struct hintp {
  kv_heap *lru; /* evict_heap.h's, scored (class, last access) */
  kv_hrank *hr; /* NULL until the first hint */
  kv_newest newest; /* the newest rule's block (evict_impl.h) */
} hintp;

static uint64_t score_lru(const kv_heap *hp, const kv_block *b) {
  (void)hp;
  return ((uint64_t)b->prio << 56) | (b->atime & KV_HEAP_TIME_MASK);
}

static int hints_init(kv_evict *e) {
  hintp *p = kv_meta_calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  if (kv_heap_init(e, score_lru)) {
    kv_meta_free(p);
    return -ENOMEM;
  }
  p->lru = e->priv;
  kv_newest_init(&p->newest);
  p->hr = kv_hrank_new(e); /* NULL without a session table, or out of memory: lru */
  e->priv = p;
  return 0;
}

static void hints_fini(kv_evict *e) {
  hintp *p = e->priv;
  if (!p) return;
  kv_hrank_free(p->hr);
  e->priv = p->lru;
  kv_heap_fini(e);
  kv_meta_free(p);
  e->priv = NULL;
}

/* The heap functions find their heap in e->priv. */
#define WITH_HEAP(e, p, call) \
  do {                        \
    (e)->priv = (p)->lru;     \
    call;                     \
    (e)->priv = (p);          \
  } while (0)

static int hints_add(kv_evict *e, kv_block *b) {
  hintp *p = e->priv;
  int rc;
  WITH_HEAP(e, p, rc = kv_heap_add(e, b));
  if (rc) return rc;
  kv_newest_added(&p->newest, e, b);
  if (p->hr) (void)kv_hrank_add(p->hr, b); /* out of memory: ranked without its session */
  return 0;
}

static void hints_remove(kv_evict *e, kv_block *b) {
  hintp *p = e->priv;
  if (p->hr) kv_hrank_remove(p->hr, b);
  WITH_HEAP(e, p, kv_heap_remove(e, b));
}

static void hints_touch(kv_evict *e, kv_block *b) {
  hintp *p = e->priv;
  WITH_HEAP(e, p, kv_heap_touch(e, b));
  if (p->hr) kv_hrank_touch(p->hr, b);
}

static kv_block *hints_peek(kv_evict *e) {
  hintp *p = e->priv;
  kv_block *v;
  WITH_HEAP(e, p, v = kv_heap_peek(e));
  return p->hr ? kv_hrank_pick(p->hr, v, p->newest.id) : v;
}

static void hints_hinted(kv_evict *e, kv_block *b, uint32_t old_ref) {
  hintp *p = e->priv;
  if (!p->hr) p->hr = kv_hrank_new(e);
  if (p->hr) kv_hrank_hinted(p->hr, b, old_ref);
}

static void hints_session(kv_evict *e, uint32_t slot) {
  hintp *p = e->priv;
  if (p->hr) kv_hrank_session(p->hr, slot);
}

const kv_evict_ops kv_evict_hints_ops = {
    "hints",
    "lru, and within the namespace it names, the block of the session expected back last",
    hints_init,
    hints_fini,
    hints_add,
    hints_remove,
    hints_touch,
    hints_peek,
    NULL,
    hints_hinted,
    hints_session,
    NULL,
};
