/*
 * crc32c.c - CRC-32C, hardware (SSE4.2) and table paths (see crc32c.h).
 *
 * The hardware path follows the well-known three-stream scheme: the buffer
 * is cut into three runs of LONG (then SHORT) bytes whose CRCs are computed
 * in parallel, then merged by "shifting" a CRC over a run of zeros with a
 * precomputed GF(2) operator, applied bytewise through four 256-entry
 * tables. The operators are built once, on first use. The copying variant
 * (kv_crc32c_copy) runs the same streams over the words it moves, or, where
 * the CPU has VPCLMULQDQ, folds 128 bytes a turn with carry-less
 * multiplications (faster than the crc32 instruction can go).
 */
#include "base/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define KV_CRC_X86 1
#else
#define KV_CRC_X86 0
#endif

#define POLY 0x82F63B78u

/* ---- portable: slicing-by-8 ---------------------------------------------- */
static uint32_t sw_tab[8][256];
static pthread_once_t sw_once = PTHREAD_ONCE_INIT;

static void sw_init(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    sw_tab[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = sw_tab[0][n];
    for (int k = 1; k < 8; k++) {
      c = sw_tab[0][c & 0xff] ^ (c >> 8);
      sw_tab[k][n] = c;
    }
  }
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v); /* little-endian host assumed (x86-64, arm64) */
  return v;
}

uint32_t kv_crc32c_sw(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&sw_once, sw_init);
  const unsigned char *p = buf;
  uint64_t c = crc ^ 0xffffffffu;
  while (len && ((uintptr_t)p & 7)) {
    c = sw_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    len--;
  }
  while (len >= 8) {
    c ^= load64(p);
    c = sw_tab[7][c & 0xff] ^ sw_tab[6][(c >> 8) & 0xff] ^ sw_tab[5][(c >> 16) & 0xff] ^
        sw_tab[4][(c >> 24) & 0xff] ^ sw_tab[3][(c >> 32) & 0xff] ^ sw_tab[2][(c >> 40) & 0xff] ^
        sw_tab[1][(c >> 48) & 0xff] ^ sw_tab[0][c >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) c = sw_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return (uint32_t)c ^ 0xffffffffu;
}

#if KV_CRC_X86
/* ---- hardware: three interleaved crc32q streams --------------------------- */
#define LONG  8192
#define SHORT 256

static uint32_t shift_long[4][256], shift_short[4][256];
static pthread_once_t hw_once = PTHREAD_ONCE_INIT;

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends `len` zero bytes to a CRC (len a power of two). */
static void zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  odd[0] = POLY; /* one zero bit */
  uint32_t row = 1;
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two zero bits */
  gf2_square(odd, even); /* four zero bits */
  do {                   /* first pass: one zero byte in even */
    gf2_square(even, odd);
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
  } while (len);
  memcpy(even, odd, sizeof odd);
}

static void zeros_tables(uint32_t t[4][256], size_t len) {
  uint32_t op[32];
  zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++) {
    t[0][n] = gf2_times(op, n);
    t[1][n] = gf2_times(op, n << 8);
    t[2][n] = gf2_times(op, n << 16);
    t[3][n] = gf2_times(op, n << 24);
  }
}

static void hw_init(void) {
  zeros_tables(shift_long, LONG);
  zeros_tables(shift_short, SHORT);
}

static inline uint32_t shift(const uint32_t t[4][256], uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

__attribute__((target("sse4.2"))) uint32_t kv_crc32c_hw(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&hw_once, hw_init);
  const unsigned char *p = buf;
  uint64_t c0 = crc ^ 0xffffffffu, c1, c2;
  while (len && ((uintptr_t)p & 7)) {
    c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    len--;
  }
  while (len >= 3 * LONG) {
    c1 = c2 = 0;
    const unsigned char *end = p + LONG;
    do {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + LONG));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * LONG));
      p += 8;
    } while (p < end);
    c0 = shift(shift_long, (uint32_t)c0) ^ c1;
    c0 = shift(shift_long, (uint32_t)c0) ^ c2;
    p += 2 * LONG;
    len -= 3 * LONG;
  }
  while (len >= 3 * SHORT) {
    c1 = c2 = 0;
    const unsigned char *end = p + SHORT;
    do {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + SHORT));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * SHORT));
      p += 8;
    } while (p < end);
    c0 = shift(shift_short, (uint32_t)c0) ^ c1;
    c0 = shift(shift_short, (uint32_t)c0) ^ c2;
    p += 2 * SHORT;
    len -= 3 * SHORT;
  }
  while (len >= 8) {
    c0 = _mm_crc32_u64(c0, load64(p));
    p += 8;
    len -= 8;
  }
  while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
  return (uint32_t)c0 ^ 0xffffffffu;
}

/* The copy runs the same three streams as kv_crc32c_hw: each 8-byte word is
 * loaded once into a register, stored to dst from it and fed to the CRC
 * from it, so the CRC is of exactly the bytes written, whatever src does
 * meanwhile, and the data crosses the memory bus once. With nt, the stores
 * of the streams are non-temporal (movnti): dst's lines are written without
 * being read first (no read-for-ownership) and are not left in the cache. */
static inline void store64(unsigned char *p, uint64_t v) { memcpy(p, &v, sizeof v); }
static inline void store64_nt(unsigned char *p, uint64_t v) {
  _mm_stream_si64((long long *)(void *)p, (long long)v);
}

#define ST(p, v) (nt ? store64_nt(p, v) : store64(p, v))
#define COPY3(n, d, s)                                                                    \
  do {                                                                                    \
    c1 = c2 = 0;                                                                          \
    for (size_t i_ = 0; i_ < (n); i_ += 16) {                                             \
      uint64_t a0 = load64(s + i_), b0 = load64(s + (n) + i_);                            \
      uint64_t e0 = load64(s + 2 * (n) + i_), a1 = load64(s + i_ + 8);                    \
      uint64_t b1 = load64(s + (n) + i_ + 8), e1 = load64(s + 2 * (n) + i_ + 8);          \
      ST(d + i_, a0), ST(d + (n) + i_, b0), ST(d + 2 * (n) + i_, e0);                     \
      ST(d + i_ + 8, a1), ST(d + (n) + i_ + 8, b1), ST(d + 2 * (n) + i_ + 8, e1);         \
      c0 = _mm_crc32_u64(c0, a0), c1 = _mm_crc32_u64(c1, b0), c2 = _mm_crc32_u64(c2, e0); \
      c0 = _mm_crc32_u64(c0, a1), c1 = _mm_crc32_u64(c1, b1), c2 = _mm_crc32_u64(c2, e1); \
    }                                                                                     \
  } while (0)

__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
copy_hw(uint32_t crc, void *dst, const void *src, size_t len, const int nt) {
  pthread_once(&hw_once, hw_init);
  const unsigned char *s = src;
  unsigned char *d = dst;
  uint64_t c0 = crc ^ 0xffffffffu, c1, c2;
  while (len >= 3 * LONG) {
    COPY3(LONG, d, s);
    c0 = shift(shift_long, (uint32_t)c0) ^ c1;
    c0 = shift(shift_long, (uint32_t)c0) ^ c2;
    s += 3 * LONG, d += 3 * LONG, len -= 3 * LONG;
  }
  while (len >= 3 * SHORT) {
    COPY3(SHORT, d, s);
    c0 = shift(shift_short, (uint32_t)c0) ^ c1;
    c0 = shift(shift_short, (uint32_t)c0) ^ c2;
    s += 3 * SHORT, d += 3 * SHORT, len -= 3 * SHORT;
  }
  if (nt) _mm_sfence(); /* the streamed stores are ordered before what follows */
  while (len >= 8) {
    uint64_t v = load64(s);
    store64(d, v);
    c0 = _mm_crc32_u64(c0, v);
    s += 8, d += 8, len -= 8;
  }
  while (len--) {
    unsigned char v = *s++;
    *d++ = v;
    c0 = _mm_crc32_u8((uint32_t)c0, v);
  }
  return (uint32_t)c0 ^ 0xffffffffu;
}
#undef COPY3
#undef ST

__attribute__((target("sse4.2"))) uint32_t kv_crc32c_copy_hw(uint32_t crc, void *dst,
                                                             const void *src, size_t len) {
  return copy_hw(crc, dst, src, len, 0);
}

__attribute__((target("sse4.2"))) uint32_t kv_crc32c_copy_nt_hw(uint32_t crc, void *dst,
                                                                const void *src, size_t len) {
  return copy_hw(crc, dst, src, len, 1);
}

/* ---- VPCLMULQDQ: carry-less folding, 128 bytes a turn ------------------------
 *
 * Four 256-bit accumulators (two 128-bit lanes each) hold the last 128
 * bytes; each turn folds every lane 128 bytes forward (two carry-less
 * multiplications by x^(1024+32) and x^(1024-32) mod P, bit-reflected and
 * shifted left by one: the reflected-CRC form of the fold) onto the next
 * 128 bytes. At the end the four are folded into one lane, whose 16 bytes
 * have the CRC of everything before them; the crc32 instruction takes it
 * from there. Twice the crc32 instruction's 8 bytes a cycle, so the copy
 * keeps up with memory; the loads are prefetched 2 KiB ahead. */
static uint64_t k_fold[6]; /* x^1056, x^992 (128 bytes); x^288, x^224 (32); x^160, x^96 (16) */

static uint64_t fold_const(int e) {
  uint64_t r = 1; /* x^e mod P, then bit-reflected into 32 bits and shifted left by 1 */
  for (int i = 0; i < e; i++) {
    r <<= 1;
    if (r & 0x100000000ull) r ^= 0x11EDC6F41ull;
  }
  uint32_t v = 0;
  for (int i = 0; i < 32; i++)
    if (r >> i & 1) v |= 1u << (31 - i);
  return (uint64_t)v << 1;
}

static pthread_once_t clmul_once = PTHREAD_ONCE_INIT;
static void clmul_init(void) {
  static const int e[6] = {1056, 992, 288, 224, 160, 96};
  for (int i = 0; i < 6; i++) k_fold[i] = fold_const(e[i]);
}

#define CLMUL_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))

CLMUL_TARGET static inline __m256i fold256(__m256i a, __m256i k) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00),
                          _mm256_clmulepi64_epi128(a, k, 0x11));
}

#define KPAIR(lo, hi) \
  _mm256_set_epi64x((long long)(hi), (long long)(lo), (long long)(hi), (long long)(lo))

CLMUL_TARGET __attribute__((always_inline)) static inline uint32_t
copy_clmul(uint32_t crc, void *dst, const void *src, size_t len, int nt) {
  pthread_once(&clmul_once, clmul_init);
  const unsigned char *s = src;
  unsigned char *d = dst;
  uint64_t c = crc ^ 0xffffffffu;
  if (((uintptr_t)d & 31) != 0) nt = 0; /* streaming stores want 32-byte alignment */
  if (len >= 256) {
    const __m256i k128 = KPAIR(k_fold[0], k_fold[1]);
    __m256i a0 = _mm256_loadu_si256((const __m256i *)s);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i a2 = _mm256_loadu_si256((const __m256i *)(s + 64));
    __m256i a3 = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_storeu_si256((__m256i *)d, a0);
    _mm256_storeu_si256((__m256i *)(d + 32), a1);
    _mm256_storeu_si256((__m256i *)(d + 64), a2);
    _mm256_storeu_si256((__m256i *)(d + 96), a3);
    a0 = _mm256_xor_si256(a0, _mm256_set_epi64x(0, 0, 0, (long long)c)); /* the start value */
    s += 128, d += 128, len -= 128;
    while (len >= 128) {
      __builtin_prefetch(s + 2048);
      __builtin_prefetch(s + 2048 + 64);
      __m256i b0 = _mm256_loadu_si256((const __m256i *)s);
      __m256i b1 = _mm256_loadu_si256((const __m256i *)(s + 32));
      __m256i b2 = _mm256_loadu_si256((const __m256i *)(s + 64));
      __m256i b3 = _mm256_loadu_si256((const __m256i *)(s + 96));
      if (nt) {
        _mm256_stream_si256((__m256i *)d, b0);
        _mm256_stream_si256((__m256i *)(d + 32), b1);
        _mm256_stream_si256((__m256i *)(d + 64), b2);
        _mm256_stream_si256((__m256i *)(d + 96), b3);
      } else {
        _mm256_storeu_si256((__m256i *)d, b0);
        _mm256_storeu_si256((__m256i *)(d + 32), b1);
        _mm256_storeu_si256((__m256i *)(d + 64), b2);
        _mm256_storeu_si256((__m256i *)(d + 96), b3);
      }
      a0 = _mm256_xor_si256(fold256(a0, k128), b0);
      a1 = _mm256_xor_si256(fold256(a1, k128), b1);
      a2 = _mm256_xor_si256(fold256(a2, k128), b2);
      a3 = _mm256_xor_si256(fold256(a3, k128), b3);
      s += 128, d += 128, len -= 128;
    }
    if (nt) _mm_sfence(); /* the streamed stores are ordered before what follows */
    const __m256i k32 = KPAIR(k_fold[2], k_fold[3]);
    a1 = _mm256_xor_si256(fold256(a0, k32), a1);
    a2 = _mm256_xor_si256(fold256(a1, k32), a2);
    a3 = _mm256_xor_si256(fold256(a2, k32), a3);
    const __m128i k16 = _mm_set_epi64x((long long)k_fold[5], (long long)k_fold[4]);
    __m128i lo = _mm256_castsi256_si128(a3), hi = _mm256_extracti128_si256(a3, 1);
    __m128i x = _mm_xor_si128(
        _mm_xor_si128(_mm_clmulepi64_si128(lo, k16, 0x00), _mm_clmulepi64_si128(lo, k16, 0x11)),
        hi);
    c = _mm_crc32_u64(_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x)),
                      (uint64_t)_mm_extract_epi64(x, 1));
  }
  while (len >= 8) {
    uint64_t v = load64(s);
    store64(d, v);
    c = _mm_crc32_u64(c, v);
    s += 8, d += 8, len -= 8;
  }
  while (len--) {
    unsigned char v = *s++;
    *d++ = v;
    c = _mm_crc32_u8((uint32_t)c, v);
  }
  return (uint32_t)c ^ 0xffffffffu;
}
#undef KPAIR

CLMUL_TARGET uint32_t kv_crc32c_copy_clmul(uint32_t crc, void *dst, const void *src, size_t len) {
  return copy_clmul(crc, dst, src, len, 0);
}

CLMUL_TARGET uint32_t kv_crc32c_copy_nt_clmul(uint32_t crc, void *dst, const void *src,
                                              size_t len) {
  return copy_clmul(crc, dst, src, len, 1);
}

static int clmul_ok = -1;

int kv_crc32c_clmul_available(void) {
  int v = __atomic_load_n(&clmul_ok, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("vpclmulqdq");
    __atomic_store_n(&clmul_ok, v, __ATOMIC_RELAXED);
  }
  return v;
}

static int hw_ok = -1;

int kv_crc32c_hw_available(void) {
  int v = __atomic_load_n(&hw_ok, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    __atomic_store_n(&hw_ok, v, __ATOMIC_RELAXED);
  }
  return v;
}
#else
uint32_t kv_crc32c_hw(uint32_t crc, const void *buf, size_t len) {
  return kv_crc32c_sw(crc, buf, len);
}
uint32_t kv_crc32c_copy_hw(uint32_t crc, void *dst, const void *src, size_t len) {
  return kv_crc32c_copy_sw(crc, dst, src, len);
}
uint32_t kv_crc32c_copy_nt_hw(uint32_t crc, void *dst, const void *src, size_t len) {
  return kv_crc32c_copy_sw(crc, dst, src, len);
}
int kv_crc32c_hw_available(void) { return 0; }
uint32_t kv_crc32c_copy_clmul(uint32_t crc, void *dst, const void *src, size_t len) {
  return kv_crc32c_copy_sw(crc, dst, src, len);
}
uint32_t kv_crc32c_copy_nt_clmul(uint32_t crc, void *dst, const void *src, size_t len) {
  return kv_crc32c_copy_sw(crc, dst, src, len);
}
int kv_crc32c_clmul_available(void) { return 0; }
#endif

uint32_t kv_crc32c(uint32_t crc, const void *buf, size_t len) {
  return kv_crc32c_hw_available() ? kv_crc32c_hw(crc, buf, len) : kv_crc32c_sw(crc, buf, len);
}

uint32_t kv_crc32c_copy_sw(uint32_t crc, void *dst, const void *src, size_t len) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  for (size_t off = 0; off < len;
       off += KV_CRC_COPY_CHUNK) { /* the CRC reads dst while it is in cache */
    size_t n = len - off < KV_CRC_COPY_CHUNK ? len - off : KV_CRC_COPY_CHUNK;
    memcpy(d + off, s + off, n);
    crc = kv_crc32c_sw(crc, d + off, n);
  }
  return crc;
}

uint32_t kv_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len) {
  if (kv_crc32c_clmul_available()) return kv_crc32c_copy_clmul(crc, dst, src, len);
  return kv_crc32c_hw_available() ? kv_crc32c_copy_hw(crc, dst, src, len)
                                  : kv_crc32c_copy_sw(crc, dst, src, len);
}

uint32_t kv_crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len) {
  if (kv_crc32c_clmul_available()) return kv_crc32c_copy_nt_clmul(crc, dst, src, len);
  return kv_crc32c_hw_available() ? kv_crc32c_copy_nt_hw(crc, dst, src, len)
                                  : kv_crc32c_copy_sw(crc, dst, src, len);
}
