/*
 * evict_util.c - what several eviction policies share (see evict.h, "for
 * policy implementations"): priority queues keyed class-first, bounded
 * ghost sets of key fingerprints, and a count-min frequency sketch.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tiers/evict_impl.h"
#include "tiers/probe.h"

/* ---- kv_pq ---------------------------------------------------------------- */

static inline void pq_place(kv_evict *e, kv_pq *q, uint32_t i, kv_pq_ent x) {
  q->v[i] = x;
  kv_index_at(e->ix, x.bid)->hpos[e->tier] = (q->id << KV_PQ_SHIFT) | i;
}

static void pq_up(kv_evict *e, kv_pq *q, uint32_t i) {
  kv_pq_ent x = q->v[i];
  while (i > 0) {
    uint32_t p = (i - 1) / 2;
    if (q->v[p].key <= x.key) break;
    pq_place(e, q, i, q->v[p]);
    i = p;
  }
  pq_place(e, q, i, x);
}

static void pq_down(kv_evict *e, kv_pq *q, uint32_t i) {
  kv_pq_ent x = q->v[i];
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    uint64_t mk = x.key;
    if (l < q->n && q->v[l].key < mk) m = l, mk = q->v[l].key;
    if (l + 1 < q->n && q->v[l + 1].key < mk) m = l + 1;
    if (m == i) break;
    pq_place(e, q, i, q->v[m]);
    i = m;
  }
  pq_place(e, q, i, x);
}

int kv_pq_push(kv_evict *e, kv_pq *q, kv_block *b, uint64_t key, uint32_t aux) {
  if (q->n == q->cap) {
    if (q->cap >= (1u << KV_PQ_SHIFT) / 2) return -ENOMEM;
    uint32_t cap = q->cap ? q->cap * 2 : 64;
    kv_pq_ent *v = realloc(q->v, (size_t)cap * sizeof *v);
    if (!v) return -ENOMEM;
    q->v = v;
    q->cap = cap;
  }
  q->v[q->n] = (kv_pq_ent){key, b->id, aux};
  pq_up(e, q, q->n++);
  return 0;
}

uint32_t kv_pq_del(kv_evict *e, kv_pq *q, kv_block *b) {
  uint32_t i = KV_PQ_IDX(b->hpos[e->tier]);
  uint32_t aux = q->v[i].aux;
  b->hpos[e->tier] = KV_SLOT_NONE;
  if (--q->n == i) return aux;
  uint64_t gone = q->v[i].key;
  q->v[i] = q->v[q->n];
  if (q->v[i].key < gone) pq_up(e, q, i);
  else pq_down(e, q, i);
  return aux;
}

void kv_pq_rekey(kv_evict *e, kv_pq *q, kv_block *b, uint64_t key) {
  uint32_t i = KV_PQ_IDX(b->hpos[e->tier]);
  uint64_t old = q->v[i].key;
  q->v[i].key = key;
  if (key < old) pq_up(e, q, i);
  else pq_down(e, q, i);
}

void kv_pq_free(kv_pq *q) {
  free(q->v);
  q->v = NULL;
  q->n = q->cap = 0;
}

int kv_meta_grow(void **v, uint32_t *n, uint64_t want, size_t each) {
  if (want <= *n) return 0;
  uint64_t to = (uint64_t)*n + (*n / 4 > 256 ? *n / 4 : 256);
  if (to < want) to = want;
  if (to > UINT32_MAX) return -ENOMEM;
  void *p = kv_meta_realloc(*v, (size_t)to * each);
  if (!p) return -ENOMEM;
  *v = p;
  *n = (uint32_t)to;
  return 0;
}

unsigned kv_pq_min_class(kv_pq *const *qs, int n) {
  unsigned m = 256;
  for (int i = 0; i < n; i++)
    if (qs[i]->n && (qs[i]->v[0].key >> 56) < m) m = (unsigned)(qs[i]->v[0].key >> 56);
  return m;
}

/* ---- kv_ghost ------------------------------------------------------------- */

uint32_t kv_fingerprint(const kv_block *b) {
  uint32_t fp = (uint32_t)XXH3_64bits_withSeed(b->key, kv_block_keylen(b), b->ns ^ 0x9e3779b9u);
  return fp ? fp : 1;
}

static inline uint32_t ghost_home(const kv_ghost *g, uint32_t fp) {
  return (fp * 0x9E3779B1u) & g->mask;
}

int kv_ghost_size(kv_ghost *g, uint32_t cap) {
  if (cap == g->cap) return 0;
  kv_ghost_free(g);
  if (cap == 0) return 0;
  uint32_t t = 16;
  while ((uint64_t)t * 3 < (uint64_t)cap * 4) t <<= 1; /* load <= 3/4 */
  g->ring = malloc((size_t)cap * sizeof *g->ring);
  g->tab = calloc(t, sizeof *g->tab);
  if (!g->ring || !g->tab) {
    kv_ghost_free(g);
    return -ENOMEM;
  }
  g->cap = cap;
  g->mask = t - 1;
  return 0;
}

static int ghost_erase(kv_ghost *g, uint32_t fp) {
  uint32_t i = ghost_home(g, fp);
  while (g->tab[i] != fp) {
    if (!g->tab[i]) return 0;
    i = (i + 1) & g->mask;
  }
  uint32_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & g->mask;
    uint32_t x = g->tab[j];
    if (!x) break;
    if (!kv_probe_stays(hole, j, ghost_home(g, x))) {
      g->tab[hole] = x;
      hole = j;
    }
  }
  g->tab[hole] = 0;
  g->live--;
  return 1;
}

void kv_ghost_add(kv_ghost *g, uint32_t fp) {
  if (!g->cap) return;
  if (g->n == g->cap) { /* forget the oldest (it may be gone already) */
    ghost_erase(g, g->ring[g->head]);
    g->head = (g->head + 1) % g->cap;
    g->n--;
  }
  g->ring[(g->head + g->n) % g->cap] = fp;
  g->n++;
  uint32_t i = ghost_home(g, fp);
  while (g->tab[i] && g->tab[i] != fp) i = (i + 1) & g->mask;
  if (!g->tab[i]) g->live++;
  g->tab[i] = fp;
}

int kv_ghost_take(kv_ghost *g, uint32_t fp) { return g->cap ? ghost_erase(g, fp) : 0; }

void kv_ghost_free(kv_ghost *g) {
  free(g->ring);
  free(g->tab);
  memset(g, 0, sizeof *g);
}

/* ---- kv_seen ---------------------------------------------------------------- */

#define SEEN_WAYS 8

/* Set and tag from independent bits of a mixed fingerprint (splitmix64's
 * finaliser), so keys that share a set rarely share a tag. */
static inline uint16_t *seen_set(const kv_seen *s, int g, uint32_t fp, uint16_t *tag) {
  uint64_t z = (uint64_t)fp * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  *tag = (uint16_t)((uint16_t)z & 0xfffe) ? (uint16_t)((uint16_t)z & 0xfffe) : 2; /* class 0 */
  return &s->gen[g][(size_t)(((z >> 32) * s->nsets) >> 32) * SEEN_WAYS];
}

int kv_seen_size(kv_seen *s, uint32_t n) {
  if (n == s->n && (n == 0 || s->gen[0])) return 0;
  kv_seen_free(s);
  if (n == 0) return 0;
  uint64_t per = (uint64_t)n * 2;
  if (per > UINT32_MAX) per = UINT32_MAX;
  uint32_t nsets = (uint32_t)((per + SEEN_WAYS - 1) / SEEN_WAYS);
  for (int g = 0; g < 2; g++) {
    s->gen[g] = kv_meta_calloc((size_t)nsets * SEEN_WAYS, sizeof *s->gen[g]);
    if (!s->gen[g]) {
      kv_seen_free(s);
      return -ENOMEM;
    }
  }
  s->nsets = nsets;
  s->per_gen = (uint32_t)per;
  s->n = n;
  return 0;
}

void kv_seen_add(kv_seen *s, uint32_t fp, int cls) {
  if (!s->gen[0]) return;
  if (s->adds == s->per_gen) { /* retire the current generation */
    uint16_t *old = s->gen[1];
    memset(old, 0, (size_t)s->nsets * SEEN_WAYS * sizeof *old);
    s->gen[1] = s->gen[0];
    s->gen[0] = old;
    memcpy(s->count[1], s->count[0], sizeof s->count[0]);
    memset(s->count[0], 0, sizeof s->count[0]);
    s->adds = 0;
  }
  s->adds++;
  uint16_t tag, *set = seen_set(s, 0, fp, &tag);
  tag |= (uint16_t)(cls != 0);
  s->count[0][cls != 0]++;
  for (int i = 0; i < SEEN_WAYS; i++) {
    if ((set[i] | 1) == (tag | 1) || set[i] == 0) {
      set[i] = tag;
      return;
    }
  }
  set[tag % SEEN_WAYS] = tag; /* full: one tag goes early */
}

int kv_seen_class(const kv_seen *s, uint32_t fp) {
  if (!s->gen[0]) return -1;
  for (int g = 0; g < 2; g++) {
    uint16_t tag, *set = seen_set(s, g, fp, &tag);
    for (int i = 0; i < SEEN_WAYS; i++)
      if ((set[i] | 1) == (tag | 1)) return set[i] & 1;
  }
  return -1;
}

void kv_seen_free(kv_seen *s) {
  kv_meta_free(s->gen[0]);
  kv_meta_free(s->gen[1]);
  memset(s, 0, sizeof *s);
}

/* ---- kv_sketch ------------------------------------------------------------ */

#define SK_COUNTERS_PER_ENTRY   4  /* per row; x 4 rows = Caffeine's 16 */
#define SK_SAMPLE_PER_ENTRY     10 /* TinyLFU's W = 10 x the cache's size */
#define SK_DOOR_BITS_PER_ACCESS 8

int kv_sketch_size(kv_sketch *s, uint32_t n) {
  if (n == 0) n = 1;
  uint64_t want = (uint64_t)n * SK_COUNTERS_PER_ENTRY, sample = (uint64_t)n * SK_SAMPLE_PER_ENTRY;
  uint32_t w = 64;
  while (w < want && w < (1u << 28)) w <<= 1;
  if (sample > UINT32_MAX) sample = UINT32_MAX;
  uint64_t bits = 64;
  while (bits < sample * SK_DOOR_BITS_PER_ACCESS && bits < (1ull << 32)) bits <<= 1;
  if (w == s->width && bits - 1 == s->door_mask) return 0;
  uint64_t *rows = calloc((size_t)4 * (w / 16), sizeof *rows);
  uint64_t *door = calloc((size_t)(bits / 64), sizeof *door);
  if (!rows || !door) {
    free(rows);
    free(door);
    return -ENOMEM;
  }
  free(s->rows);
  free(s->door);
  s->rows = rows;
  s->door = door;
  s->width = w;
  s->door_mask = (uint32_t)(bits - 1);
  s->adds = 0;
  s->sample = (uint32_t)sample;
  return 0;
}

/* splitmix64's finaliser (Steele et al. 2014) of fp and a per-use seed:
 * rows must not collide together, as a plain multiply's rows would (equal
 * differences between fingerprints give equal differences in every row). */
static inline uint64_t sk_mix(uint32_t fp, uint64_t seed) {
  uint64_t z = fp + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint32_t sk_index(const kv_sketch *s, uint32_t fp, int row) {
  static const uint64_t seed[4] = {0xc3a5c85c97cb3127ull, 0xb492b66fbe98f273ull,
                                   0x9ae16a3b2f90404full, 0xcbf29ce484222325ull};
  return (uint32_t)(sk_mix(fp, seed[row]) >> 32) & (s->width - 1);
}

static inline unsigned sk_get(const kv_sketch *s, int row, uint32_t i) {
  return (unsigned)(s->rows[(size_t)row * (s->width / 16) + i / 16] >> (4 * (i % 16))) & 15u;
}

/* The doorkeeper's three bit positions for fp (one 64-bit mix, split). */
static inline void door_bits(const kv_sketch *s, uint32_t fp, uint32_t out[3]) {
  uint64_t h = sk_mix(fp, 0x8ebc6af09c88c6e3ull);
  uint32_t a = (uint32_t)(h >> 32), b = (uint32_t)h | 1u;
  for (int k = 0; k < 3; k++) out[k] = (a + (uint32_t)k * b) & s->door_mask;
}

static int door_has(const kv_sketch *s, uint32_t fp) {
  uint32_t bit[3];
  door_bits(s, fp, bit);
  for (int k = 0; k < 3; k++)
    if (!(s->door[bit[k] / 64] >> (bit[k] % 64) & 1)) return 0;
  return 1;
}

/* Sets fp's doorkeeper bits; 1 if they were all set already. */
static int door_put(kv_sketch *s, uint32_t fp) {
  uint32_t bit[3];
  int had = 1;
  door_bits(s, fp, bit);
  for (int k = 0; k < 3; k++) {
    uint64_t m = 1ull << (bit[k] % 64);
    if (!(s->door[bit[k] / 64] & m)) had = 0;
    s->door[bit[k] / 64] |= m;
  }
  return had;
}

static unsigned sk_count(const kv_sketch *s, uint32_t fp) {
  unsigned m = 15;
  for (int r = 0; r < 4; r++) {
    unsigned c = sk_get(s, r, sk_index(s, fp, r));
    if (c < m) m = c;
  }
  return m;
}

void kv_sketch_add(kv_sketch *s, uint32_t fp) {
  if (!s->width) return;
  if (door_put(s, fp)) {
    unsigned m = sk_count(s, fp);
    if (m < 15) /* conservative update: only the counters at the minimum grow */
      for (int r = 0; r < 4; r++) {
        uint32_t i = sk_index(s, fp, r);
        if (sk_get(s, r, i) == m)
          s->rows[(size_t)r * (s->width / 16) + i / 16] += 1ull << (4 * (i % 16));
      }
  }
  if (++s->adds >= s->sample) { /* halve every counter, forget the doorkeeper */
    size_t nw = (size_t)4 * (s->width / 16);
    for (size_t k = 0; k < nw; k++) s->rows[k] = (s->rows[k] >> 1) & 0x7777777777777777ull;
    memset(s->door, 0, ((size_t)s->door_mask + 1) / 8);
    s->adds /= 2;
  }
}

unsigned kv_sketch_get(const kv_sketch *s, uint32_t fp) {
  if (!s->width) return 0;
  unsigned m = sk_count(s, fp) + (unsigned)door_has(s, fp);
  return m < 15 ? m : 15;
}

void kv_sketch_free(kv_sketch *s) {
  free(s->rows);
  free(s->door);
  memset(s, 0, sizeof *s);
}
