/* sessions.c - the session table of engine hints (see sessions.h). */
#include "tiers/sessions.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define SLOT_MASK ((1u << KV_SESS_SLOT_BITS) - 1)
#define GEN_MASK  ((1u << KV_SESS_GEN_BITS) - 1)
#define SLOTS_MAX (SLOT_MASK - 1) /* slot + 1 must fit the reference */

void kv_sessions_init(kv_sessions *s, uint32_t max, uint32_t retain_max_s) {
  memset(s, 0, sizeof *s);
  s->max = max ? max : KV_SESSIONS_MAX_DEFAULT;
  if (s->max > SLOTS_MAX) s->max = SLOTS_MAX;
  s->retain_max_s = retain_max_s;
}

void kv_sessions_fini(kv_sessions *s) {
  kv_meta_free(s->v);
  kv_meta_free(s->heads);
  kv_meta_free(s->sh);
  kv_meta_free(s->bycount);
  for (uint32_t i = 0; i < s->nnss; i++) kv_meta_free(s->nss[i]);
  kv_meta_free(s->nss);
  memset(s, 0, sizeof *s);
}

void kv_sessions_set_now(kv_sessions *s, uint64_t now_ms) {
  if (now_ms > s->now_ms) s->now_ms = now_ms;
}

unsigned kv_gap_bucket(uint64_t ms) {
  if (ms < 2) return 0;
  /* half octaves: 2 log2(ms), from the top bit and the next one */
  unsigned hi = 63u - (unsigned)__builtin_clzll(ms);
  unsigned half = hi ? (unsigned)(ms >> (hi - 1)) & 1u : 0;
  unsigned k = 2 * hi + half - 1;
  return k < KV_GAP_BUCKETS ? k : KV_GAP_BUCKETS - 1;
}

uint64_t kv_gap_bucket_lo(unsigned k) {
  if (k == 0) return 0;
  unsigned hi = (k + 1) / 2, half = (k + 1) % 2;
  return (1ull << hi) | (half ? 1ull << (hi - 1) : 0);
}

static inline uint32_t hash_of(uint32_t ns, uint64_t id) {
  uint64_t z = (id ^ ((uint64_t)ns << 48)) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static uint32_t find_slot(const kv_sessions *s, uint32_t ns, uint64_t id) {
  if (!s->nheads) return UINT32_MAX;
  for (uint32_t i = s->heads[hash_of(ns, id) & (s->nheads - 1)]; i; i = s->v[i - 1].hnext)
    if (s->v[i - 1].id == id && s->v[i - 1].ns == ns) return i - 1;
  return UINT32_MAX;
}

const kv_session *kv_sessions_find(const kv_sessions *s, uint32_t ns, uint64_t id) {
  uint32_t i = find_slot(s, ns, id);
  return i == UINT32_MAX ? NULL : &s->v[i];
}

/* ---- the shares: a recency list each, and the lists of shares by count ---- */

/* Share u is in the list of shares holding sh[u].count sessions (none when
 * it holds none) and leaves it. */
static void count_unlink(kv_sessions *s, uint32_t u) {
  kv_sess_share *p = &s->sh[u];
  if (!p->count) return;
  if (p->cprev) s->sh[p->cprev - 1].cnext = p->cnext;
  else s->bycount[p->count] = p->cnext;
  if (p->cnext) s->sh[p->cnext - 1].cprev = p->cprev;
  p->cprev = p->cnext = 0;
}

static void count_link(kv_sessions *s, uint32_t u) {
  kv_sess_share *p = &s->sh[u];
  if (!p->count) return;
  p->cprev = 0;
  p->cnext = s->bycount[p->count];
  if (p->cnext) s->sh[p->cnext - 1].cprev = u + 1;
  s->bycount[p->count] = u + 1;
}

/* Share u holds one session more (d = 1) or less (d = -1); maxc follows. */
static void count_add(kv_sessions *s, uint32_t u, int d) {
  kv_sess_share *p = &s->sh[u];
  uint32_t was = p->count;
  count_unlink(s, u);
  p->count = d > 0 ? was + 1 : was - 1;
  count_link(s, u);
  if (p->count > s->maxc) s->maxc = p->count;
  else if (was == s->maxc && !s->bycount[was]) s->maxc = was - 1; /* u holds was - 1 now */
}

static void list_unlink(kv_sessions *s, uint32_t i) {
  kv_session *x = &s->v[i];
  kv_sess_share *p = &s->sh[x->share];
  if (x->lprev) s->v[x->lprev - 1].lnext = x->lnext;
  else p->lru = x->lnext;
  if (x->lnext) s->v[x->lnext - 1].lprev = x->lprev;
  else p->mru = x->lprev;
  x->lprev = x->lnext = 0;
}

static void list_push_mru(kv_sessions *s, uint32_t i) {
  kv_session *x = &s->v[i];
  kv_sess_share *p = &s->sh[x->share];
  x->lnext = 0;
  x->lprev = p->mru;
  if (p->mru) s->v[p->mru - 1].lnext = i + 1;
  else p->lru = i + 1;
  p->mru = i + 1;
}

/* Slot i's session joins its share (x->share), as its most recent, or
 * leaves it. */
static void share_join(kv_sessions *s, uint32_t i) {
  list_push_mru(s, i);
  count_add(s, s->v[i].share, 1);
}
static void share_leave(kv_sessions *s, uint32_t i) {
  list_unlink(s, i);
  count_add(s, s->v[i].share, -1);
}

/* The shares cover share u. 0 or -ENOMEM. */
static int share_cover(kv_sessions *s, uint32_t u) {
  if (u < s->nsh) return 0;
  uint32_t n = s->nsh ? s->nsh : 8;
  while (n <= u) n *= 2;
  kv_sess_share *v = kv_meta_realloc(s->sh, (size_t)n * sizeof *v);
  if (!v) return -ENOMEM;
  memset(v + s->nsh, 0, (size_t)(n - s->nsh) * sizeof *v);
  s->sh = v;
  s->nsh = n;
  return 0;
}

/* The share a new session of share u takes a slot from, the table being
 * full: u's own when u holds at least as many sessions as any share less
 * one, else the (first) share holding the most. */
static uint32_t victim_share(const kv_sessions *s, uint32_t u) {
  uint32_t have = s->sh[u].count;
  if (have && have + 1 >= s->maxc) return u;
  return s->maxc ? s->bycount[s->maxc] - 1 : UINT32_MAX;
}

static void hash_unlink(kv_sessions *s, uint32_t i) {
  kv_session *x = &s->v[i];
  uint32_t *p = &s->heads[hash_of(x->ns, x->id) & (s->nheads - 1)];
  while (*p && *p != i + 1) p = &s->v[*p - 1].hnext;
  if (*p) *p = x->hnext;
  x->hnext = 0;
}

static void hash_link(kv_sessions *s, uint32_t i) {
  kv_session *x = &s->v[i];
  uint32_t *h = &s->heads[hash_of(x->ns, x->id) & (s->nheads - 1)];
  x->hnext = *h;
  *h = i + 1;
}

/* Room for slot n: slots grow by half (at least 256) up to max, the lists
 * of shares by count cover as many sessions, the hash buckets stay at least
 * as many as the slots. 0 or -ENOMEM. */
static int reserve(kv_sessions *s) {
  if (s->n < s->cap) return 0;
  uint64_t want = (uint64_t)s->cap + (s->cap / 2 > 256 ? s->cap / 2 : 256);
  if (want > s->max) want = s->max;
  uint64_t had = s->bycount ? (uint64_t)s->cap + 1 : 0;
  uint32_t *bc = kv_meta_realloc(s->bycount, (size_t)(want + 1) * sizeof *bc);
  if (!bc) return -ENOMEM;
  memset(bc + had, 0, (size_t)(want + 1 - had) * sizeof *bc);
  s->bycount = bc;
  kv_session *v = kv_meta_realloc(s->v, (size_t)want * sizeof *v);
  if (!v) return -ENOMEM;
  s->v = v;
  s->cap = (uint32_t)want;
  if (s->nheads >= s->cap) return 0;
  uint32_t nh = 64;
  while (nh < s->cap) nh <<= 1;
  uint32_t *h = kv_meta_calloc(nh, sizeof *h);
  if (!h) return s->heads ? 0 : -ENOMEM; /* the old buckets still work, with longer chains */
  kv_meta_free(s->heads);
  s->heads = h;
  s->nheads = nh;
  for (uint32_t i = 0; i < s->n; i++)
    if (s->v[i].id) hash_link(s, i);
  return 0;
}

/* The namespace's statistics, made if needed; NULL when out of memory. */
static kv_sess_ns *ns_stats(kv_sessions *s, uint32_t ns) {
  if (ns >= s->nnss) {
    uint32_t n = s->nnss ? s->nnss : 4;
    while (n <= ns) n *= 2;
    kv_sess_ns **v = kv_meta_realloc(s->nss, (size_t)n * sizeof *v);
    if (!v) return NULL;
    memset(v + s->nnss, 0, (size_t)(n - s->nnss) * sizeof *v);
    s->nss = v;
    s->nnss = n;
  }
  if (!s->nss[ns]) s->nss[ns] = kv_meta_calloc(1, sizeof *s->nss[ns]);
  return s->nss[ns];
}

/* Session (ns, id)'s slot, made (in a free slot, a new slot, or that of
 * the least recently hinted session of victim_share's choice) if it is
 * not known, in share u; moved to the recent end of u's list. UINT32_MAX
 * when out of memory. */
static uint32_t get_slot(kv_sessions *s, uint32_t ns, uint32_t u, uint64_t id) {
  if (share_cover(s, u)) return UINT32_MAX;
  uint32_t i = find_slot(s, ns, id);
  if (i == UINT32_MAX) {
    if (!ns_stats(s, ns)) return UINT32_MAX;
    if (s->free1) { /* a slot kv_sessions_ns_drop freed */
      i = s->free1 - 1;
      s->free1 = s->v[i].lnext;
    } else if (s->n < s->max && reserve(s) == 0) {
      i = s->n++;
      s->v[i].gen = 0;
    } else { /* full: a share's least recently hinted is forgotten */
      uint32_t from = s->bycount ? victim_share(s, u) : UINT32_MAX;
      if (from == UINT32_MAX || !s->sh[from].lru) return UINT32_MAX;
      i = s->sh[from].lru - 1;
      share_leave(s, i);
      hash_unlink(s, i);
      s->live--;
      s->forgotten++;
    }
    uint16_t gen = (uint16_t)((s->v[i].gen + 1) & GEN_MASK);
    memset(&s->v[i], 0, sizeof s->v[i]);
    s->v[i].id = id;
    s->v[i].ns = (uint16_t)ns;
    s->v[i].gen = gen;
    s->v[i].share = u;
    hash_link(s, i);
    share_join(s, i);
    s->live++;
  } else if (s->v[i].share != u) { /* its namespace was given a tenant: it moves */
    share_leave(s, i);
    s->v[i].share = u;
    share_join(s, i);
  } else if (s->sh[u].mru != i + 1) {
    list_unlink(s, i);
    list_push_mru(s, i);
  }
  s->v[i].last_ms = s->now_ms;
  s->hints++;
  return i;
}

static inline uint32_t ref_of(const kv_sessions *s, uint32_t i) {
  return ((uint32_t)s->v[i].gen << KV_SESS_SLOT_BITS) | (i + 1);
}

static void set_retain(kv_session *x, uint32_t retain_s) {
  if (retain_s) x->retain_s = retain_s;
}

/* A request of x starts now: the gap since its last FINISHED is filed. */
static void start_request(kv_sessions *s, kv_session *x) {
  x->flags = (uint8_t)((x->flags | KV_SESS_ACTIVE) & ~KV_SESS_ENDED);
  x->start_ms = s->now_ms;
  x->nreq++;
  if (!x->fin_ms) return;
  uint64_t gap = s->now_ms - x->fin_ms;
  kv_sess_ns *st = s->nss[x->ns];
  unsigned k = kv_gap_bucket(gap);
  if (++st->total[x->stop] >= KV_GAP_HALVE) {
    st->total[x->stop] = 0;
    for (unsigned j = 0; j < KV_GAP_BUCKETS; j++) {
      st->hist[x->stop][j] /= 2;
      st->total[x->stop] += st->hist[x->stop][j];
    }
  }
  st->hist[x->stop][k]++;
  st->stale[x->stop] = 1;
  if (++st->total[KV_STOP_ANY] >= KV_GAP_HALVE) {
    st->total[KV_STOP_ANY] = 0;
    for (unsigned j = 0; j < KV_GAP_BUCKETS; j++) {
      st->hist[KV_STOP_ANY][j] /= 2;
      st->total[KV_STOP_ANY] += st->hist[KV_STOP_ANY][j];
    }
  }
  st->hist[KV_STOP_ANY][k]++;
  st->stale[KV_STOP_ANY] = 1;
  /* the session's own: log2 of the gap, x 256, averaged with weight 1/2 */
  double l = gap > 1 ? log2((double)gap) * 256.0 : 0.0;
  if (l > 65535.0) l = 65535.0;
  x->lgap = x->ngaps ? (uint16_t)((x->lgap + (uint32_t)l + 1) / 2) : (uint16_t)l;
  x->ngaps++;
}

/* ix's owner array covers record id: grown by a quarter (at least 1024),
 * new entries without owner. 0 or -ENOMEM. */
static int owner_cover(kv_index *ix, kv_bid id) {
  if (id < ix->nowner) return 0;
  uint64_t to = (uint64_t)ix->nowner + (ix->nowner / 4 > 1024 ? ix->nowner / 4 : 1024);
  if (to <= id) to = (uint64_t)id + 1;
  if (to > UINT32_MAX) return -ENOMEM;
  uint32_t *v = kv_meta_realloc(ix->owner, (size_t)to * sizeof *v);
  if (!v) return -ENOMEM;
  memset(v + ix->nowner, 0, (size_t)(to - ix->nowner) * sizeof *v);
  ix->owner = v;
  ix->nowner = (uint32_t)to;
  return 0;
}

int kv_sessions_set_owner(kv_index *ix, kv_bid id, uint32_t ref) {
  if (ref == KV_SESS_NONE && id >= ix->nowner) return 0;
  if (owner_cover(ix, id)) return -ENOMEM;
  ix->owner[id] = ref;
  return 0;
}

int kv_sessions_hint_block(kv_sessions *s, kv_index *ix, uint32_t ns, uint32_t share, uint64_t id,
                           kv_block *b, uint32_t retain_s, uint32_t *slot) {
  if (share >= KV_SESS_SHARES_MAX) return -EINVAL;
  if (owner_cover(ix, b->id)) return -ENOMEM;
  uint32_t i = get_slot(s, ns, share, id);
  if (i == UINT32_MAX) return -ENOMEM;
  kv_session *x = &s->v[i];
  int changed = !(x->flags & KV_SESS_ACTIVE) || (retain_s && retain_s != x->retain_s);
  if (!(x->flags & KV_SESS_ACTIVE)) start_request(s, x);
  set_retain(x, retain_s);
  ix->owner[b->id] = ref_of(s, i);
  *slot = i;
  return changed;
}

int64_t kv_sessions_finished(kv_sessions *s, uint32_t ns, uint32_t share, uint64_t id,
                             unsigned stop, uint32_t retain_s) {
  if (share >= KV_SESS_SHARES_MAX) return -EINVAL;
  uint32_t i = get_slot(s, ns, share, id);
  if (i == UINT32_MAX) return -ENOMEM;
  kv_session *x = &s->v[i];
  if (!x->nreq) x->nreq = 1; /* known only from its end: a request there was */
  x->flags = (uint8_t)(x->flags & ~KV_SESS_ACTIVE); /* an ended session stays ended */
  x->stop = (uint8_t)stop;
  x->fin_ms = s->now_ms ? s->now_ms : 1; /* 0 means "none yet" */
  set_retain(x, retain_s);
  return i;
}

uint32_t kv_sessions_end(kv_sessions *s, uint32_t ns, uint64_t id) {
  uint32_t i = find_slot(s, ns, id);
  if (i == UINT32_MAX) return i;
  kv_session *x = &s->v[i];
  x->flags = (uint8_t)((x->flags & ~KV_SESS_ACTIVE) | KV_SESS_ENDED);
  x->last_ms = s->now_ms;
  s->hints++;
  return i;
}

void kv_sessions_ns_drop(kv_sessions *s, uint32_t ns) {
  /* A session of ns is made only once its statistics are (get_slot), and
   * both go here: none without them. */
  if (ns >= s->nnss || !s->nss[ns]) return;
  for (uint32_t i = 0; i < s->n; i++) {
    kv_session *x = &s->v[i];
    if (!x->id || x->ns != ns) continue;
    share_leave(s, i);
    hash_unlink(s, i);
    /* The generation moves on now: a reference to the session, or a
     * policy's state of its slot (kept by generation), is stale at once. */
    uint16_t gen = (uint16_t)((x->gen + 1) & GEN_MASK);
    memset(x, 0, sizeof *x);
    x->gen = gen;
    x->lnext = s->free1;
    s->free1 = i + 1;
    s->live--;
  }
  kv_meta_free(s->nss[ns]);
  s->nss[ns] = NULL;
}

/* Row r's table of medians: med[k], the median of the gaps of at least
 * kv_gap_bucket_lo(k) ms, read from the histogram with the gaps spread
 * evenly within a bucket; KV_PREDICT_NEVER where no gap is that long. */
static void make_medians(kv_sess_ns *st, unsigned r) {
  const uint32_t *h = st->hist[r];
  uint64_t tail = 0;
  for (int k = KV_GAP_BUCKETS - 1; k >= 0; k--) {
    tail += h[k];
    if (!tail) {
      st->med[r][k] = KV_PREDICT_NEVER;
      continue;
    }
    uint64_t half2 = tail, acc2 = 0; /* in halves: the median at acc = tail / 2 */
    unsigned j = (unsigned)k;
    while (acc2 + 2ull * h[j] < half2) acc2 += 2ull * h[j++];
    uint64_t lo = kv_gap_bucket_lo(j);
    uint64_t hi = j + 1 < KV_GAP_BUCKETS ? kv_gap_bucket_lo(j + 1) : lo + lo / 2;
    st->med[r][k] = lo + (hi - lo) * (half2 - acc2) / (2ull * h[j]);
  }
  st->stale[r] = 0;
}

uint64_t kv_sessions_predict(kv_sessions *s, const kv_session *x, uint64_t *until) {
  uint64_t now = s->now_ms;
  *until = UINT64_MAX;
  if (x->flags & KV_SESS_ENDED) return KV_PREDICT_NEVER;
  kv_sess_ns *st = x->ns < s->nnss ? s->nss[x->ns] : NULL;
  unsigned r = x->stop < KV_STOP_COUNT && st && st->total[x->stop] ? x->stop : KV_STOP_ANY;
  int running = (x->flags & KV_SESS_ACTIVE) || !x->fin_ms || !st || !st->total[r];
  uint64_t from = running ? x->last_ms : x->fin_ms;
  uint64_t e = now > from ? now - from : 0;
  unsigned k = kv_gap_bucket(e);
  if (k + 1 < KV_GAP_BUCKETS) *until = from + kv_gap_bucket_lo(k + 1);
  if (running) return from + 2 * kv_gap_bucket_lo(k);
  if (st->stale[r]) make_medians(st, r);
  uint64_t m = st->med[r][k];
  return m == KV_PREDICT_NEVER ? m : from + m;
}
