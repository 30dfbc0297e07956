/* evict_mini.c - miniature simulations that judge between experts (see
 * evict_mini.h). */
#include "tiers/evict_mini.h"

#include <errno.h>
#include <string.h>

#include "tiers/evict_impl.h"
#include "tiers/sessions.h"

#define PERIOD_PER_BLOCK 10  /* votes halve after 10 sampled accesses per miniature block */
#define SWITCH_Z         2.0 /* standard deviations another expert must lead by */

/* Spatial sampling by a hash of the key, independent of the fingerprint
 * bits the sketch and ghosts use (splitmix64's finaliser). */
static inline uint64_t sample_hash(const kv_block *b) {
  uint64_t z = kv_fingerprint(b) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) >> 32;
}

int kv_minis_init(kv_minis *m, const kv_evict_ops *const *experts, int n, uint32_t capacity,
                  uint32_t mini_cap, uint32_t start, const kv_index *real) {
  memset(m, 0, sizeof *m);
  m->n = n;
  for (int i = 0; i < n; i++) m->ops[i] = experts[i];
  if (!capacity) return 0;
  if (!mini_cap) mini_cap = KV_MINI_CAP;
  uint32_t cap = capacity < mini_cap ? capacity : mini_cap;
  m->sample = ((uint64_t)cap << 32) / capacity;
  m->period = (uint64_t)PERIOD_PER_BLOCK * cap;
  if (kv_index_init(&m->mix, 2 * cap)) return -ENOMEM;
  m->mix.sessions = real->sessions;
  m->on = 1;
  for (int i = 0; i < n; i++) {
    m->mini[i].capacity = cap;
    if ((start >> i & 1) && kv_minis_start(m, i)) {
      kv_minis_fini(m);
      return -ENOMEM;
    }
  }
  return 0;
}

int kv_minis_start(kv_minis *m, int i) {
  if (!m->on || (m->started >> i & 1)) return 0;
  if (kv_evict_init(&m->mini[i], m->ops[i], &m->mix, (kv_tier)i)) return -ENOMEM;
  m->started |= 1u << i;
  return 0;
}

int kv_minis_cluster(kv_minis *m) {
  if (!m->on || m->net) return 0;
  m->trees = m->mini[0].capacity;
  m->net = kv_meta_calloc(m->trees, sizeof *m->net);
  return m->net ? 0 : -ENOMEM;
}

void kv_minis_follow(kv_minis *m, int i) {
  if (i == m->cur || !(m->started >> i & 1)) return;
  m->cur = i;
  m->switches++;
}

/* The index of pair i < j among KV_MINIS_MAX experts. */
static inline int pair_of(int i, int j) { return i * (2 * KV_MINIS_MAX - i - 1) / 2 + (j - i - 1); }

void kv_minis_fini(kv_minis *m) {
  kv_meta_free(m->net);
  m->net = NULL;
  if (!m->on) return;
  for (int i = 0; i < m->n; i++)
    if (m->started >> i & 1) kv_evict_fini(&m->mini[i]);
  kv_index_fini(&m->mix);
  m->on = 0;
  m->started = 0;
}

/* Miniature i stops holding b (evicted; b is a leaf there). Its parent, if
 * b was its last child held, becomes a leaf and comes back to the policy. */
static void mini_drop(kv_minis *m, int i, kv_block *b) {
  kv_evict *me = &m->mini[i];
  me->ops->remove(me, b);
  b->hpos[i] = KV_SLOT_NONE; /* gone from this cache: new if it comes back */
  b->tiers &= (uint8_t) ~(1u << i);
  m->held[i]--;
  kv_block *p = b->parent != KV_BID_NONE ? kv_index_at(&m->mix, b->parent) : NULL;
  if (p && (p->tiers >> i & 1) && --p->rchild[i] == 0 && me->ops->add(me, p) == 0)
    p->inpol |= (uint8_t)(1u << i);
  if (!b->tiers) {
    b->inpol = 0;
    kv_index_remove(&m->mix, b);
  }
}

/* Miniature i holds b from now on, evicting leaves to make room. */
static void mini_hold(kv_minis *m, int i, kv_block *b) {
  kv_evict *me = &m->mini[i];
  while (m->held[i] >= me->capacity) {
    kv_block *v = me->ops->peek(me);
    if (!v) return; /* no leaf offered (out of memory): b stays out */
    v->inpol &= (uint8_t) ~(1u << i);
    mini_drop(m, i, v);
  }
  kv_block *p = b->parent != KV_BID_NONE ? kv_index_at(&m->mix, b->parent) : NULL;
  if (me->ops->add(me, b)) return;
  b->tiers |= (uint8_t)(1u << i);
  b->inpol |= (uint8_t)(1u << i);
  m->held[i]++;
  if (p && (p->tiers >> i & 1) && p->rchild[i]++ == 0 && (p->inpol >> i & 1)) {
    me->ops->remove(me, p); /* no longer a leaf: out of the policy */
    p->inpol &= (uint8_t) ~(1u << i);
  }
}

/* The first block of rb's prefix chain in the real index. */
static const kv_block *root_of(const kv_index *ix, const kv_block *rb) {
  while (rb->parent != KV_BID_NONE) rb = kv_index_at(ix, rb->parent);
  return rb;
}

/* rb's owner (engine hints) on its miniature record b. */
static void copy_owner(kv_minis *m, const kv_index *real, const kv_block *rb, const kv_block *b) {
  uint32_t ref = rb->id < real->nowner ? real->owner[rb->id] : KV_SESS_NONE;
  (void)kv_sessions_set_owner(&m->mix, b->id, ref); /* out of memory: no owner, no harm */
}

/* The two-sided 5% critical value of Student's t with k - 1 degrees of
 * freedom (k clusters): the clustered test estimates its variance from the
 * trees, so with few trees it asks for a larger lead; from 31 trees on,
 * SWITCH_Z. 0 or 1 tree: no test (infinite). */
static double t_crit(uint32_t k) {
  static const double t975[31] = {0,    12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23,
                                  2.20, 2.18,  2.16, 2.14, 2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08,
                                  2.07, 2.07,  2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04};
  if (k < 2) return 1e30;
  return k - 1 < 31 ? t975[k - 1] : SWITCH_Z;
}

/* The leader: the expert whose lead over the followed one passes the test,
 * the largest lead of those; or the followed one. */
static int leader(const kv_minis *m) {
  int cur = m->cur, best = cur;
  double best_lead = 0;
  for (int j = 0; j < m->n; j++) {
    if (j == cur || !(m->started >> j & 1)) continue;
    double b = m->votes[j][cur], c = m->votes[cur][j], lead = b - c;
    int p = j < cur ? pair_of(j, cur) : pair_of(cur, j);
    double var = m->net ? m->sq[p] : b + c, z = m->net ? t_crit(m->clusters[p]) : SWITCH_Z;
    if (lead > 1 && (lead - 1) * (lead - 1) > z * z * var && lead > best_lead)
      best = j, best_lead = lead;
  }
  return best;
}

void kv_minis_observe(kv_minis *m, const kv_index *real, const kv_block *rb) {
  if (!m->on) return;
  uint64_t tree = sample_hash(root_of(real, rb));
  if (tree >= m->sample) return;
  kv_block *b = kv_index_find(&m->mix, rb->ns, rb->key, kv_block_keylen(rb));
  if (!b) {
    if (kv_index_insert(&m->mix, rb->ns, rb->key, kv_block_keylen(rb), &b))
      return; /* out of memory: unsampled */
    b->state = KV_BS_READY;
    b->hits = 0;
    b->inpol = 0;
    for (int i = 0; i < KV_NTIERS; i++) b->rchild[i] = 0;
    const kv_block *rp = rb->parent != KV_BID_NONE ? kv_index_at(real, rb->parent) : NULL;
    kv_block *p = rp ? kv_index_find(&m->mix, rp->ns, rp->key, kv_block_keylen(rp)) : NULL;
    if (p) kv_index_link(&m->mix, b, p);
  }
  b->atime = ++m->clock & KV_ATIME_MASK;
  if (b->hits != KV_HITS_MAX) b->hits++;
  b->prio = rb->prio;
  uint32_t old = b->id < m->mix.nowner ? m->mix.owner[b->id] : KV_SESS_NONE;
  if (real->owner || m->mix.owner) copy_owner(m, real, rb, b);
  uint32_t ref = b->id < m->mix.nowner ? m->mix.owner[b->id] : KV_SESS_NONE;
  for (int i = 0; i < m->n && ref != old; i++) {
    kv_evict *me = &m->mini[i];
    if ((m->started >> i & 1) && (b->inpol >> i & 1) && me->ops->hinted)
      me->ops->hinted(me, b, old);
  }
  int hit[KV_MINIS_MAX] = {0};
  for (int i = 0; i < m->n; i++) {
    if (!(m->started >> i & 1)) continue;
    kv_evict *me = &m->mini[i];
    hit[i] = (b->tiers >> i) & 1;
    if (!hit[i]) mini_hold(m, i, b);
    else if (b->inpol >> i & 1) me->ops->touch(me, b);
    else if (me->ops->seen) me->ops->seen(me, b);
  }
  if (!b->tiers) kv_index_remove(&m->mix, b);
  for (int i = 0; i < m->n; i++)
    for (int j = 0; j < m->n; j++) {
      if (!hit[i] || hit[j] || !(m->started >> i & 1) || !(m->started >> j & 1)) continue;
      m->votes[i][j] += 1;
      if (!m->net) continue;
      int p = i < j ? pair_of(i, j) : pair_of(j, i);
      float *n = &m->net[tree % m->trees][p];
      double d = i < j ? 1.0 : -1.0; /* the net is of the lower expert over the higher */
      if (*n > -0.5f && *n < 0.5f && (*n + (float)d <= -0.5f || *n + (float)d >= 0.5f))
        m->clusters[p]++;             /* a tree that counts (again) */
      m->sq[p] += 2.0 * d * *n + 1.0; /* (n + d)^2 - n^2 */
      *n += (float)d;
    }
  int lead = leader(m);
  if (lead != m->cur) {
    m->cur = lead;
    m->switches++;
  }
  if (++m->seen < m->period) return;
  m->seen = 0;
  for (int i = 0; i < m->n; i++)
    for (int j = 0; j < m->n; j++) m->votes[i][j] *= 0.5;
  if (!m->net) return;
  for (uint32_t t = 0; t < m->trees; t++)
    for (int p = 0; p < KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2; p++) m->net[t][p] *= 0.5f;
  for (int p = 0; p < KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2; p++) m->sq[p] *= 0.25;
  /* the trees whose net is still at least half a vote */
  for (int p = 0; p < KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2; p++) {
    m->clusters[p] = 0;
    for (uint32_t t = 0; t < m->trees; t++)
      m->clusters[p] += m->net[t][p] <= -0.5f || m->net[t][p] >= 0.5f;
  }
}

void kv_minis_hinted(kv_minis *m, const kv_index *real, const kv_block *rb) {
  if (!m->on || sample_hash(root_of(real, rb)) >= m->sample) return;
  kv_block *b = kv_index_find(&m->mix, rb->ns, rb->key, kv_block_keylen(rb));
  if (!b) return;
  uint32_t old = b->id < m->mix.nowner ? m->mix.owner[b->id] : KV_SESS_NONE;
  copy_owner(m, real, rb, b);
  for (int i = 0; i < m->n; i++) {
    kv_evict *me = &m->mini[i];
    if ((m->started >> i & 1) && (b->inpol >> i & 1) && me->ops->hinted)
      me->ops->hinted(me, b, old);
  }
}

void kv_minis_session(kv_minis *m, uint32_t slot) {
  for (int i = 0; i < m->n; i++) {
    kv_evict *me = &m->mini[i];
    if ((m->started >> i & 1) && me->ops->session) me->ops->session(me, slot);
  }
}
