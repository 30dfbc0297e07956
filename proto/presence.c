/* presence.c - the presence table (presence.h has the contract). */
#include "proto/presence.h"

#include <errno.h>
#include <string.h>

#define LD(p)       __atomic_load_n((p), __ATOMIC_RELAXED)
#define LDA(p)      __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v)    __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define STR(p, v)   __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#define FP_MASK     ((1ull << 62) - 1)
#define READ_TRIES  256 /* per bucket, then -EAGAIN: the writer holds a bucket for nanoseconds */
#define KICKS_MAX   128 /* moves tried to make room for one key */

#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield")
#else
#define RELAX() ((void)0)
#endif

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t kv_pres_hash(const uint8_t *key, unsigned len) {
  uint64_t a = 0x9e3779b97f4a7c15ull ^ len;
  for (unsigned i = 0; i < len; i += 8) {
    uint64_t w = 0;
    unsigned n = len - i < 8 ? len - i : 8;
    memcpy(&w, key + i, n);
    a = mix(a ^ w) + 0x632be59bd9b4e019ull;
  }
  uint64_t fp = mix(a) & FP_MASK;
  return fp ? fp : 1;
}

/* The other bucket of an entry in bucket `at`: never `at` itself. */
static inline uint64_t alt(const kv_pres *t, uint64_t at, uint64_t fp) {
  return (at ^ (mix(fp ^ 0x5851f42d4c957f2dull) | 1)) & t->mask;
}
static inline uint64_t home(const kv_pres *t, uint64_t fp) { return fp & t->mask; }
static inline uint64_t fp_of(uint64_t e) { return e >> 2; }

/* t over a table of 2^log2 buckets at base. */
static void point_at(kv_pres *t, void *base, unsigned log2) {
  t->h = base;
  t->b = (kv_pres_bucket *)((uint8_t *)base + KV_PRES_HDR);
  t->mask = (1ull << log2) - 1;
}

int kv_pres_attach(kv_pres *t, void *base, size_t bytes) {
  kv_pres_hdr *h = base;
  if (!base || bytes < KV_PRES_HDR || h->magic != KV_PRES_MAGIC ||
      h->version != KV_PRES_VERSION || h->hdr_bytes != KV_PRES_HDR ||
      h->log2 < KV_PRES_LOG2_MIN || h->log2 > KV_PRES_LOG2_MAX || kv_pres_bytes(h->log2) != bytes)
    return -EPROTO;
  point_at(t, base, h->log2);
  return 0;
}

/* --- readers -------------------------------------------------------------- */

/* fp's code in bucket i as of one stable read: 0..3, or -EAGAIN. */
static int read_bucket(const kv_pres *t, uint64_t i, uint64_t fp) {
  kv_pres_bucket *b = &t->b[i];
  for (int tries = 0; tries < READ_TRIES; tries++) {
    uint32_t s1 = LDA(&b->seq);
    if (s1 & 1) {
      RELAX();
      continue;
    }
    int code = 0;
    /* acquire: the seq read after them cannot be read before them */
    for (unsigned w = 0; w < KV_PRES_WAYS; w++) {
      uint64_t e = LDA(&b->ent[w]);
      if (e && fp_of(e) == fp) code = (int)(e & 3);
    }
    if (LD(&b->seq) == s1) return code;
  }
  return -EAGAIN;
}

int kv_pres_find(const kv_pres *t, uint64_t fp) {
  for (int tries = 0; tries < READ_TRIES; tries++) {
    uint32_t m1 = LDA(&t->h->moves);
    if (m1 & 1) {
      RELAX();
      continue;
    }
    uint64_t b1 = home(t, fp);
    int code = read_bucket(t, b1, fp);
    if (code == 0) code = read_bucket(t, alt(t, b1, fp), fp);
    if (code != 0) return code; /* present (stable in its bucket), or -EAGAIN */
    if (LD(&t->h->moves) == m1) return 0; /* absent, and nothing moved meanwhile */
  }
  return -EAGAIN;
}

int kv_pres_retired(const kv_pres *t) { return LDA(&t->h->retired) != 0; }
uint32_t kv_pres_flags(const kv_pres *t) { return LDA(&t->h->flags); }

/* --- the writer -------------------------------------------------------------- */

void kv_pres_format(kv_pres *t, void *base, unsigned log2, uint32_t flags) {
  kv_pres_hdr *h = base;
  h->magic = KV_PRES_MAGIC;
  h->version = KV_PRES_VERSION;
  h->hdr_bytes = KV_PRES_HDR;
  h->log2 = log2;
  h->flags = flags;
  point_at(t, base, log2);
}

/* Writes entry e into bucket i's way w, as readers expect. */
static void put(kv_pres *t, uint64_t i, unsigned w, uint64_t e) {
  kv_pres_bucket *b = &t->b[i];
  uint32_t s = LD(&b->seq);
  ST(&b->seq, s + 1);
  STR(&b->ent[w], e); /* release: a reader that sees e sees seq odd, or later */
  STR(&b->seq, s + 2);
  __atomic_fetch_add(&t->h->updates, 1, __ATOMIC_RELAXED);
}

/* The way of fp in bucket i, or -1. */
static int way_of(const kv_pres *t, uint64_t i, uint64_t fp) {
  for (unsigned w = 0; w < KV_PRES_WAYS; w++) {
    uint64_t e = t->b[i].ent[w];
    if (e && fp_of(e) == fp) return (int)w;
  }
  return -1;
}

static int free_way(const kv_pres *t, uint64_t i) {
  for (unsigned w = 0; w < KV_PRES_WAYS; w++)
    if (!t->b[i].ent[w]) return (int)w;
  return -1;
}

/* Room in bucket i, whose ways are all taken, by moving entries to their
 * other buckets: a walk of at most KICKS_MAX steps that never takes a
 * place twice, found before anything is written. 0 with way *way of
 * bucket i free, or -ENOSPC (nothing moved) when no walk found room. */
static int make_room(kv_pres *t, uint64_t i, unsigned *way) {
  struct {
    uint64_t bucket;
    unsigned way;
  } path[KICKS_MAX];
  uint64_t r = t->h->updates * 0x9e3779b97f4a7c15ull + i;
  uint64_t at = i;
  for (int n = 0; n < KICKS_MAX; n++) {
    r = mix(r + 1);
    unsigned w = (unsigned)(r % KV_PRES_WAYS), tried = 0;
    for (int k = 0; k < n && tried < KV_PRES_WAYS; k++)
      if (path[k].bucket == at && path[k].way == w) { /* taken before: the next way */
        w = (w + 1) % KV_PRES_WAYS;
        tried++;
        k = -1;
      }
    if (tried == KV_PRES_WAYS) return -ENOSPC;
    path[n].bucket = at;
    path[n].way = w;
    uint64_t e = t->b[at].ent[w];
    uint64_t to = alt(t, at, fp_of(e));
    int fw = free_way(t, to);
    if (fw < 0) {
      at = to;
      continue;
    }
    /* Found: move the walk's entries back from its end, each into its
     * other bucket before its old place is overwritten, with moves odd
     * meanwhile (a reader that saw neither place retries). */
    uint32_t m = LD(&t->h->moves);
    ST(&t->h->moves, m + 1); /* before the entries' release stores (put) */
    put(t, to, (unsigned)fw, e);
    for (int k = n; k > 0; k--)
      put(t, path[k].bucket, path[k].way, t->b[path[k - 1].bucket].ent[path[k - 1].way]);
    put(t, path[0].bucket, path[0].way, 0);
    STR(&t->h->moves, m + 2);
    *way = path[0].way;
    return 0;
  }
  return -ENOSPC;
}

int kv_pres_set(kv_pres *t, uint64_t fp, int code) {
  uint64_t e = fp << 2 | (uint64_t)(code & 3);
  uint64_t b1 = home(t, fp), b2 = alt(t, b1, fp);
  int w = way_of(t, b1, fp);
  uint64_t at = b1;
  if (w < 0 && (w = way_of(t, b2, fp)) >= 0) at = b2;
  if (w >= 0) {
    if (t->b[at].ent[w] != e) put(t, at, (unsigned)w, e);
    return 0;
  }
  if ((w = free_way(t, b1)) >= 0) {
    at = b1;
  } else if ((w = free_way(t, b2)) >= 0) {
    at = b2;
  } else {
    unsigned fw;
    if (make_room(t, b1, &fw)) return -ENOSPC;
    at = b1;
    w = (int)fw;
  }
  put(t, at, (unsigned)w, e);
  __atomic_fetch_add(&t->h->count, 1, __ATOMIC_RELAXED);
  return 0;
}

int kv_pres_del(kv_pres *t, uint64_t fp) {
  uint64_t b1 = home(t, fp);
  uint64_t at = b1;
  int w = way_of(t, b1, fp);
  if (w < 0) w = way_of(t, at = alt(t, b1, fp), fp);
  if (w < 0) return -ENOENT;
  put(t, at, (unsigned)w, 0);
  __atomic_fetch_sub(&t->h->count, 1, __ATOMIC_RELAXED);
  return 0;
}

int kv_pres_copy(kv_pres *to, const kv_pres *from) {
  for (uint64_t i = 0; i <= from->mask; i++)
    for (unsigned w = 0; w < KV_PRES_WAYS; w++) {
      uint64_t e = from->b[i].ent[w];
      if (e && kv_pres_set(to, fp_of(e), (int)(e & 3))) return -ENOSPC;
    }
  return 0;
}

void kv_pres_flag(kv_pres *t, uint32_t flags) {
  __atomic_fetch_or(&t->h->flags, flags, __ATOMIC_RELEASE);
}
void kv_pres_retire(kv_pres *t) { STR(&t->h->retired, 1u); }
uint64_t kv_pres_count(const kv_pres *t) { return LD(&t->h->count); }
