/* codec.c - the lossless byte-plane codec for 16-bit KV blocks (see
 * codec.h for the stored format and the contract). */
#include "tiers/codec.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "base/le.h"

#define OFF_VERSION 4
#define OFF_CODEC   5
#define OFF_ESIZE   6
#define OFF_NPLANES 7
#define OFF_N       8
#define OFF_PLEN    12 /* u32 per plane */
#define OFF_PCODE   20 /* u8 per plane */
#define OFF_RESV    22
#define NPLANES     2
#define ESIZE       2
#define CODE_RAW    0
#define CODE_ZSTD   1
_Static_assert(OFF_RESV + 2 == KV_CODEC_HDR_LEN, "the header's layout");
_Static_assert(KV_CODEC_LEN_MAX <= UINT32_MAX, "n fits its field");

struct kv_codec {
  ZSTD_CCtx *cc;
  ZSTD_DCtx *dc;
  uint8_t *scratch; /* the planes: high bytes then low bytes */
  size_t scratch_cap;
  uint8_t *zbuf; /* a plane's zstd frame when dst may be too small for it */
  size_t zbuf_cap;
  int tuned; /* the tuned level: the high plane's match finder, per plane */
};

const char *kv_codec_name(void) { return "zstd-planes"; }

static int n_ok(size_t n) { return n >= ESIZE && n <= KV_CODEC_LEN_MAX && n % ESIZE == 0; }

size_t kv_codec_bound(size_t n) { return n_ok(n) ? n - 1 : 0; }

/* zstd's parameter p of cc set to v: 0, or -1. */
static int set(ZSTD_CCtx *cc, ZSTD_cParameter p, int v) {
  return ZSTD_isError(ZSTD_CCtx_setParameter(cc, p, v)) ? -1 : 0;
}

kv_codec *kv_codec_new(int level) {
  if (level != 0 && (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())) return NULL;
  kv_codec *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->cc = ZSTD_createCCtx();
  c->dc = ZSTD_createDCtx();
  c->tuned = level == 0;
  if (!c->cc || !c->dc || set(c->cc, ZSTD_c_compressionLevel, level ? level : KV_CODEC_LEVEL) ||
      set(c->cc, ZSTD_c_checksumFlag, 0) || set(c->cc, ZSTD_c_dictIDFlag, 0) ||
      set(c->cc, ZSTD_c_contentSizeFlag, 1)) {
    kv_codec_free(c);
    return NULL;
  }
  return c;
}

void kv_codec_free(kv_codec *c) {
  if (!c) return;
  ZSTD_freeCCtx(c->cc);
  ZSTD_freeDCtx(c->dc);
  free(c->scratch);
  free(c->zbuf);
  free(c);
}

/* *buf holds at least n bytes (n from the caller's length, never from
 * stored bytes); what it held is lost. */
static int grow(uint8_t **buf, size_t *cap, size_t n) {
  if (*cap >= n) return 0;
  uint8_t *p = malloc(n);
  if (!p) return -ENOMEM;
  free(*buf);
  *buf = p;
  *cap = n;
  return 0;
}

/* src[0..2h) -> hi[0..h) (each element's byte 1) and lo[0..h) (byte 0). */
static void split(const uint8_t *src, size_t h, uint8_t *hi, uint8_t *lo) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i m = _mm_set1_epi16(0x00ff);
  for (; i + 16 <= h; i += 16) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i + 16));
    _mm_storeu_si128((__m128i *)(void *)(lo + i),
                     _mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m)));
    _mm_storeu_si128((__m128i *)(void *)(hi + i),
                     _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
  }
#endif
  for (; i < h; i++) {
    lo[i] = src[2 * i];
    hi[i] = src[2 * i + 1];
  }
}

/* The inverse: hi[0..h), lo[0..h) -> dst[0..2h). */
static void merge(const uint8_t *hi, const uint8_t *lo, size_t h, uint8_t *dst) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= h; i += 16) {
    __m128i l = _mm_loadu_si128((const __m128i *)(const void *)(lo + i));
    __m128i u = _mm_loadu_si128((const __m128i *)(const void *)(hi + i));
    _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), _mm_unpacklo_epi8(l, u));
    _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i + 16), _mm_unpackhi_epi8(l, u));
  }
#endif
  for (; i < h; i++) {
    dst[2 * i] = lo[i];
    dst[2 * i + 1] = hi[i];
  }
}

long kv_codec_encode(kv_codec *c, const void *src, size_t n, void *dst, size_t cap) {
  if (!c || !src || !dst || !n_ok(n)) return -EINVAL;
  size_t h = n / ESIZE;
  size_t limit = cap < n - 1 ? cap : n - 1; /* the stored bytes must fit */
  int nogain = limit == n - 1 ? KV_CODEC_NOGAIN : -ENOSPC;
  if (limit < KV_CODEC_HDR_LEN + NPLANES) return nogain; /* a plane is at least a byte */
  /* zstd may refuse a dst shorter than its bound even where the frame
   * would fit: a plane is compressed there only with that room, else into
   * zbuf and copied */
  size_t zbound = ZSTD_compressBound(h);
  int rc = grow(&c->scratch, &c->scratch_cap, n);
  if (!rc) rc = grow(&c->zbuf, &c->zbuf_cap, zbound);
  if (rc) return rc;
  uint8_t *out = dst;
  const uint8_t *plane[NPLANES] = {c->scratch, c->scratch + h};
  split(src, h, c->scratch, c->scratch + h);
  size_t off = KV_CODEC_HDR_LEN;
  for (int p = 0; p < NPLANES; p++) {
    /* The tuned level codes the high plane at level 1 matching only runs
     * of 7 bytes or more, from a 64-entry table: a plane of exponents is
     * coded mostly by its literals' Huffman code, which level 1's short
     * matches disturb (BF16 high bytes of bench/kv in 64 KiB blocks: ratio
     * 2.71 at 0.97 GB/s against 2.61 at 0.28 GB/s; FP16's 1.368 at 1.29
     * GB/s against 1.379 at 1.08). The low plane, mantissas, keeps level
     * 1's own (its rare gains are short matches). 0: the level's own. */
    if (c->tuned && (set(c->cc, ZSTD_c_minMatch, p == 0 ? 7 : 0) ||
                     set(c->cc, ZSTD_c_hashLog, p == 0 ? 6 : 0)))
      return -EINVAL; /* not reached: zstd takes both */
    size_t room = limit - off;
    /* zstd only where it saves a byte over raw and fits */
    size_t zcap = room < h - 1 ? room : h - 1;
    int direct = room >= zbound;
    size_t z = zcap ? ZSTD_compress2(c->cc, direct ? out + off : c->zbuf,
                                     direct ? room : zbound, plane[p], h)
                    : 0;
    size_t len;
    if (zcap && !ZSTD_isError(z) && z <= zcap) {
      if (!direct) memcpy(out + off, c->zbuf, z);
      len = z;
      out[OFF_PCODE + p] = CODE_ZSTD;
    } else if (h <= room) {
      memcpy(out + off, plane[p], h);
      len = h;
      out[OFF_PCODE + p] = CODE_RAW;
    } else {
      return nogain;
    }
    kv_st32(out + OFF_PLEN + 4 * p, (uint32_t)len);
    off += len;
    if (off > limit) return nogain; /* not reached: len <= room */
  }
  kv_st32(out, KV_CODEC_MAGIC);
  out[OFF_VERSION] = KV_CODEC_VERSION;
  out[OFF_CODEC] = KV_CODEC_ZSTD_PLANES;
  out[OFF_ESIZE] = ESIZE;
  out[OFF_NPLANES] = NPLANES;
  kv_st32(out + OFF_N, (uint32_t)n);
  kv_st16(out + OFF_RESV, 0);
  return (long)off;
}

static int header_ok(const uint8_t *in, size_t len) {
  return len >= KV_CODEC_HDR_LEN && kv_ld32(in) == KV_CODEC_MAGIC &&
         in[OFF_VERSION] == KV_CODEC_VERSION && in[OFF_CODEC] == KV_CODEC_ZSTD_PLANES;
}

long kv_codec_stored_n(const void *stored, size_t len) {
  if (!stored || !header_ok(stored, len)) return -EBADMSG;
  return (long)kv_ld32((const uint8_t *)stored + OFF_N);
}

/* One plane's stored bytes in[0..len) as h bytes: a raw plane is used
 * where it lies (*out = in), a zstd one is decompressed into buf. */
static int plane_in(kv_codec *c, int code, const uint8_t *in, size_t len, size_t h,
                    uint8_t *buf, const uint8_t **out) {
  if (code == CODE_RAW) {
    if (len != h) return -EBADMSG;
    *out = in;
    return 0;
  }
  if (code != CODE_ZSTD) return -EBADMSG;
  /* one zstd frame (not a skippable or legacy one) and nothing after it */
  if (len < 4 || kv_ld32(in) != ZSTD_MAGICNUMBER || ZSTD_findFrameCompressedSize(in, len) != len)
    return -EBADMSG;
  size_t got = ZSTD_decompressDCtx(c->dc, buf, h, in, len);
  if (ZSTD_isError(got) || got != h) return -EBADMSG;
  *out = buf;
  return 0;
}

int kv_codec_decode(kv_codec *c, const void *stored, size_t len, void *dst, size_t n) {
  if (!c || !stored || !dst || !n_ok(n)) return -EINVAL;
  const uint8_t *in = stored;
  if (!header_ok(in, len) || in[OFF_ESIZE] != ESIZE || in[OFF_NPLANES] != NPLANES ||
      kv_ld16(in + OFF_RESV) != 0 || kv_ld32(in + OFF_N) != n)
    return -EBADMSG;
  uint64_t plen[NPLANES], sum = 0;
  for (int p = 0; p < NPLANES; p++) sum += plen[p] = kv_ld32(in + OFF_PLEN + 4 * p);
  if (sum != len - KV_CODEC_HDR_LEN) return -EBADMSG;
  size_t h = n / ESIZE;
  const uint8_t *plane[NPLANES];
  int rc = 0;
  for (int p = 0; p < NPLANES && !rc; p++)
    if (in[OFF_PCODE + p] == CODE_ZSTD) rc = grow(&c->scratch, &c->scratch_cap, n);
  if (rc) return rc;
  size_t off = KV_CODEC_HDR_LEN;
  for (int p = 0; p < NPLANES; p++) {
    rc = plane_in(c, in[OFF_PCODE + p], in + off, (size_t)plen[p], h, c->scratch + p * h,
                  &plane[p]);
    if (rc) return rc;
    off += (size_t)plen[p];
  }
  merge(plane[0], plane[1], h, dst);
  return 0;
}

/* A thread's context and its scratch (kv_codec_thread). */
typedef struct coder {
  kv_codec *c;
  uint8_t *buf;
  size_t cap;
} coder;
static pthread_key_t coder_key;
static pthread_once_t coder_once = PTHREAD_ONCE_INIT;
static void coder_free(void *p) {
  coder *t = p;
  kv_codec_free(t->c);
  free(t->buf);
  free(t);
}
static void coder_key_make(void) { pthread_key_create(&coder_key, coder_free); }

kv_codec *kv_codec_thread(size_t n, uint8_t **room) {
  pthread_once(&coder_once, coder_key_make);
  coder *t = pthread_getspecific(coder_key);
  if (!t) {
    if (!(t = calloc(1, sizeof *t))) return NULL;
    if (!(t->c = kv_codec_new(0)) || pthread_setspecific(coder_key, t)) {
      kv_codec_free(t->c);
      free(t);
      return NULL;
    }
  }
  if (t->cap < n) {
    uint8_t *b = realloc(t->buf, n);
    if (!b) return NULL;
    t->buf = b;
    t->cap = n;
  }
  if (room) *room = t->buf;
  return t->c;
}
