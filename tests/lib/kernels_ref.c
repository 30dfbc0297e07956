/* kernels_ref.c - a CPU reference for the kernels and a case runner (kernels_ref.h). */
#include "tests/lib/kernels_ref.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kv_ref_strides(const kv_kern_layout *lo, uint64_t *p, uint64_t *k) {
  uint64_t half = (uint64_t)lo->page_tokens * lo->kv_heads * lo->head_dim * lo->elem_bytes;
  *p = lo->page_stride ? lo->page_stride : 2 * half;
  *k = lo->kv_stride ? lo->kv_stride : half;
}

/* Reference copy: scatter 0 moves engine -> blocks, 1 blocks -> engine. */
void kv_ref_copy(const kv_kern_layout *lo, void *const *layers, const uint32_t *page_ids,
                 void *const *blocks, size_t n, int scatter) {
  const uint64_t T = lo->page_tokens, H = lo->kv_heads, D = lo->head_dim, E = lo->elem_bytes;
  uint64_t P, K;
  kv_ref_strides(lo, &P, &K);
  for (size_t i = 0; i < n; i++)
    for (uint64_t l = 0; l < lo->layers; l++)
      for (uint64_t kv = 0; kv < 2; kv++)
        for (uint64_t t = 0; t < T; t++)
          for (uint64_t h = 0; h < H; h++)
            for (uint64_t d = 0; d < D; d++) {
              unsigned char *e =
                  (unsigned char *)layers[l] + page_ids[i] * P + kv * K + ((t * H + h) * D + d) * E;
              unsigned char *b =
                  (unsigned char *)blocks[i] + ((((l * 2 + kv) * T + t) * H + h) * D + d) * E;
              for (uint64_t x = 0; x < E; x++) {
                if (scatter) e[x] = b[x];
                else b[x] = e[x];
              }
            }
}

uint64_t kv_ref_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

void kv_ref_fill(unsigned char *p, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(kv_ref_rand(s) >> 24);
}

static void kv_ref_layout(const kv_ref_case *c, kv_kern_layout *lo) {
  uint64_t half = (uint64_t)c->page_tokens * c->kv_heads * c->head_dim * c->elem_bytes;
  memset(lo, 0, sizeof *lo);
  lo->layers = c->layers, lo->page_tokens = c->page_tokens, lo->kv_heads = c->kv_heads;
  lo->head_dim = c->head_dim, lo->elem_bytes = c->elem_bytes, lo->num_pages = c->num_pages;
  if (c->strides == KV_REF_PADDED) {
    lo->kv_stride = half + 16;
    lo->page_stride = 2 * lo->kv_stride + 48;
  } else if (c->strides == KV_REF_KFIRST) {
    lo->page_stride = half;
    lo->kv_stride = (uint64_t)c->num_pages * half + 32;
  }
}

/* First differing byte of two buffers, as a message; 0 if equal. */
static int kv_ref_diff(const unsigned char *want, const unsigned char *got, size_t n,
                       const char *what, size_t idx, char *why, size_t whylen) {
  for (size_t i = 0; i < n; i++)
    if (want[i] != got[i]) {
      snprintf(why, whylen, "%s %zu: byte %zu is %#x, reference %#x", what, idx, i, got[i],
               want[i]);
      return -1;
    }
  return 0;
}

/* Runs one case in one mode: 0 when the implementation matched the
 * reference byte for byte, -1 on a mismatch, -errno when the setup or the
 * implementation failed; why says which. */
int kv_ref_run(const kv_ref_case *c, int mode, const kv_ref_backend *be, char *why, size_t whylen) {
  kv_kern_layout lo;
  kv_ref_layout(c, &lo);
  uint64_t seed = c->seed | 1;
  const size_t L = c->layers, mis = c->misalign;
  /* a scatter names each page once at most */
  const size_t n = mode == KV_REF_GATHER || c->n < c->num_pages ? c->n : c->num_pages;
  const size_t bb = (size_t)kv_kern_block_bytes(&lo), lb = (size_t)kv_kern_layer_bytes(&lo);
  const size_t lsz = lb + mis + 16, gap = 32 + 16 * (size_t)(kv_ref_rand(&seed) % 4);
  const size_t bstep = bb + gap, bsz = n * bstep + mis + 16;
  int rc = -ENOMEM;
  snprintf(why, whylen, "setup failed");
  if (!bb || !lb || n == 0) {
    snprintf(why, whylen, "bad case");
    return -EINVAL;
  }
  unsigned char **dl = calloc(L, sizeof *dl), **hl = calloc(L, sizeof *hl);
  void **dlp = calloc(L, sizeof *dlp), **hlp = calloc(L, sizeof *hlp);
  void **dbp = calloc(n, sizeof *dbp), **hbp = calloc(n, sizeof *hbp);
  void **dbp2 = calloc(n, sizeof *dbp2);
  uint32_t *pages = calloc(n, sizeof *pages), *perm = calloc(c->num_pages, sizeof *perm);
  size_t *slot = calloc(n, sizeof *slot);
  unsigned char *hb = malloc(bsz), *got = malloc(lsz > bsz ? lsz : bsz);
  unsigned char *db = be->alloc(bsz, be->ctx), *db2 = NULL;
  if (!dl || !hl || !dlp || !hlp || !dbp || !hbp || !dbp2 || !pages || !perm || !slot || !hb ||
      !got || !db)
    goto out;
  if (mode == KV_REF_ROUNDTRIP && !(db2 = be->alloc(bsz, be->ctx))) goto out;
  for (size_t l = 0; l < L; l++) {
    if (!(hl[l] = malloc(lsz)) || !(dl[l] = be->alloc(lsz, be->ctx))) goto out;
    kv_ref_fill(hl[l], lsz, &seed);
    if ((rc = be->put(dl[l], hl[l], lsz, be->ctx))) goto out;
    dlp[l] = dl[l] + mis, hlp[l] = hl[l] + mis;
  }
  kv_ref_fill(hb, bsz, &seed);
  if ((rc = be->put(db, hb, bsz, be->ctx))) goto out;
  if (db2 && (rc = be->put(db2, hb, bsz, be->ctx))) goto out;
  /* Page ids: distinct (a shuffled prefix) or drawn with repeats; blocks
   * at shuffled slots of the block buffer. */
  for (uint32_t p = 0; p < c->num_pages; p++) perm[p] = p;
  for (uint32_t p = c->num_pages; p > 1; p--) {
    uint32_t j = (uint32_t)(kv_ref_rand(&seed) % p), t = perm[p - 1];
    perm[p - 1] = perm[j], perm[j] = t;
  }
  for (size_t i = 0; i < n; i++) {
    pages[i] = c->repeat && mode == KV_REF_GATHER ? (uint32_t)(kv_ref_rand(&seed) % c->num_pages)
                                                  : perm[i % c->num_pages];
    slot[i] = i;
  }
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(kv_ref_rand(&seed) % i), t = slot[i - 1];
    slot[i - 1] = slot[j], slot[j] = t;
  }
  for (size_t i = 0; i < n; i++) {
    dbp[i] = db + mis + slot[i] * bstep, hbp[i] = hb + mis + slot[i] * bstep;
    if (db2) dbp2[i] = db2 + mis + slot[i] * bstep;
  }
  /* Run it, then the reference on the host copies. */
  if (mode == KV_REF_GATHER) rc = be->gather(&lo, dlp, pages, dbp, n, be->ctx);
  else rc = be->scatter(&lo, dlp, pages, dbp, n, be->ctx);
  if (rc == 0 && mode == KV_REF_ROUNDTRIP) rc = be->gather(&lo, dlp, pages, dbp2, n, be->ctx);
  if (rc) {
    snprintf(why, whylen, "%s returned %d", mode == KV_REF_GATHER ? "gather" : "scatter", rc);
    goto out;
  }
  kv_ref_copy(&lo, hlp, pages, hbp, n, mode != KV_REF_GATHER);
  /* Compare: blocks after a gather, every layer after a scatter, and the
   * second block buffer (gathered back) against the first after both. */
  if (mode == KV_REF_GATHER || mode == KV_REF_ROUNDTRIP) {
    if ((rc = be->get(got, mode == KV_REF_GATHER ? db : db2, bsz, be->ctx))) goto out;
    if ((rc = kv_ref_diff(hb, got, bsz, "block buffer", 0, why, whylen))) goto out;
  }
  if (mode != KV_REF_GATHER)
    for (size_t l = 0; l < L; l++) {
      if ((rc = be->get(got, dl[l], lsz, be->ctx))) goto out;
      if ((rc = kv_ref_diff(hl[l], got, lsz, "layer", l, why, whylen))) goto out;
    }
  rc = 0;
  why[0] = '\0';
out:
  for (size_t l = 0; dl && hl && l < L; l++) {
    free(hl[l]);
    if (dl[l]) be->release(dl[l], be->ctx);
  }
  if (db) be->release(db, be->ctx);
  if (db2) be->release(db2, be->ctx);
  free(dl), free(hl), free(dlp), free(hlp), free(dbp), free(hbp), free(dbp2);
  free(pages), free(perm), free(slot), free(hb), free(got);
  return rc;
}

/* The cases both test programs run: every element width, odd and
 * realistic geometries, one block and many, every stride kind, aligned
 * and misaligned pointers. */
size_t kv_ref_cases(kv_ref_case *out, size_t max) {
  static const uint32_t geo[][5] = {
      /* layers, page_tokens, kv_heads, head_dim, num_pages */
      {1, 1, 1, 1, 1},     {1, 1, 1, 3, 7},  {3, 5, 2, 3, 11},    {2, 16, 8, 1, 9},
      {4, 16, 2, 128, 40}, {5, 3, 3, 7, 64}, {32, 16, 8, 128, 6},
  };
  static const unsigned mis[] = {0, 1, 2, 4, 8};
  static const size_t nn[] = {1, 5, 37};
  size_t k = 0;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
    for (uint32_t e = 1; e <= 4; e *= 2)
      for (int s = KV_REF_DENSE; s <= KV_REF_KFIRST; s++)
        for (size_t ni = 0; ni < sizeof nn / sizeof nn[0]; ni++) {
          if (geo[g][0] == 32 && (ni == 2 || s == KV_REF_PADDED)) continue; /* big: keep short */
          if (k == max) return k;
          kv_ref_case *c = &out[k++];
          memset(c, 0, sizeof *c);
          c->layers = geo[g][0], c->page_tokens = geo[g][1], c->kv_heads = geo[g][2];
          c->head_dim = geo[g][3], c->num_pages = geo[g][4], c->elem_bytes = e;
          c->strides = s, c->n = nn[ni], c->repeat = (int)(ni & 1);
          c->misalign = mis[(g + ni + (size_t)s) % (sizeof mis / sizeof mis[0])];
          c->seed = kv_ref_rand(&seed);
        }
  /* More blocks than one small launch carries, and more than one launch. */
  static const kv_ref_case big[] = {
      {2, 4, 2, 8, 2, 4096, KV_REF_DENSE, 300, 0, 0, 0},
      {1, 2, 1, 4, 4, 4096, KV_REF_PADDED, KV_KERN_MAX_BLOCKS + 123, 0, 1, 0},
      {3, 1, 1, 3, 1, 4096, KV_REF_KFIRST, KV_KERN_MAX_BLOCKS * 2 + 1, 3, 0, 0},
  };
  for (size_t b = 0; b < sizeof big / sizeof big[0] && k < max; b++) {
    out[k] = big[b];
    out[k++].seed = kv_ref_rand(&seed);
  }
  return k;
}
