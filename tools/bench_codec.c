/* bench_codec.c - kvcodec-bench: what the lossless 16-bit block codec
 * (tiers/codec.h) does to real KV, as a markdown table.
 *
 * For each safetensors file (default: the trained model's KV in bench/kv,
 * BF16 and FP16) and each block size (default 64 KiB and 256 KiB) it cuts
 * the file's tensor data into whole blocks (never cycled: a file too small
 * for many gives as many as it holds, and the table says how many; the
 * tail shorter than a block is left out), and measures on one thread:
 *   - the ratio (original bytes / stored bytes) of each plane (high bytes,
 *     low bytes, without the header) and of the whole stored blocks (with
 *     the header; a block that does not shrink counts as stored raw);
 *   - encode and decode speed in GB/s of original bytes, the median of
 *     --repeats runs, each run passing over every block until at least
 *     --ms milliseconds have gone by;
 *   - as references, memcpy of the same blocks, and plain zstd on the
 *     unsplit blocks at the same level (for the codec's tuned level, the
 *     default, plain level 1: its ratio, compression and decompression
 *     speed).
 * Every block is decoded and compared with its original once before
 * anything is timed. GB is 10^9 bytes.
 *
 * Usage: kvcodec-bench [--level L] [--repeats R] [--ms MS] [--block BYTES]...
 *                      [FILE.safetensors]...
 * (--level: 0, the default, the codec's tuned level, else a plain zstd
 * level; --block may be given more than once; the default files are named
 * relative to the repository's root, so run it from there.)
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "base/le.h"
#include "tiers/codec.h"
#include "tools/kvfile.h"

#define MAX_BLOCKS_ARGS 8
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What one timed pass does over the blocks. */
typedef enum { OP_ENCODE, OP_DECODE, OP_MEMCPY, OP_ZENC, OP_ZDEC } op_kind;

typedef struct run {
  kv_codec *c;
  ZSTD_CCtx *zc;
  ZSTD_DCtx *zd;
  const uint8_t *data; /* nblocks * bs original bytes */
  size_t bs, nblocks;
  uint8_t *stored; /* per block: its codec bytes at i * bs (bs - 1 at most) */
  long *slen;      /* their lengths; KV_CODEC_NOGAIN: raw */
  uint8_t *zst;    /* per block: plain zstd at i * zbound */
  size_t *zlen, zbound;
  uint8_t *out; /* zbound bytes: where a pass writes */
} run;

static int pass(run *r, op_kind op) {
  for (size_t i = 0; i < r->nblocks; i++) {
    const uint8_t *src = r->data + i * r->bs;
    size_t z;
    switch (op) {
    case OP_ENCODE:
      if (kv_codec_encode(r->c, src, r->bs, r->out, r->bs - 1) < 0 && r->slen[i] > 0) return -1;
      break;
    case OP_DECODE:
      if (r->slen[i] < 0) memcpy(r->out, src, r->bs); /* stored raw: a read is a copy */
      else if (kv_codec_decode(r->c, r->stored + i * r->bs, (size_t)r->slen[i], r->out, r->bs))
        return -1;
      break;
    case OP_MEMCPY: memcpy(r->out, src, r->bs); break;
    case OP_ZENC:
      z = ZSTD_compress2(r->zc, r->out, r->zbound, src, r->bs);
      if (ZSTD_isError(z)) return -1;
      break;
    case OP_ZDEC:
      z = ZSTD_decompressDCtx(r->zd, r->out, r->bs, r->zst + i * r->zbound, r->zlen[i]);
      if (z != r->bs) return -1;
      break;
    }
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* GB/s of original bytes: the median of `repeats` runs of at least ms
 * milliseconds each; -1 on a failed pass. */
static double speed(run *r, op_kind op, int repeats, int ms) {
  if (pass(r, op)) return -1; /* warm: caches, the context's buffers */
  double *v = calloc((size_t)repeats, sizeof *v);
  if (!v) return -1;
  for (int k = 0; k < repeats; k++) {
    double t0 = now_s(), t;
    size_t bytes = 0;
    do {
      if (pass(r, op)) {
        free(v);
        return -1;
      }
      bytes += r->nblocks * r->bs;
      t = now_s() - t0;
    } while (t < ms / 1e3);
    v[k] = (double)bytes / t / 1e9;
  }
  qsort(v, (size_t)repeats, sizeof *v, cmp_double);
  double m = v[repeats / 2];
  free(v);
  return m;
}

/* One row of the table: file f cut into blocks of bs. */
static int row(const kvfile *f, size_t bs, int level, int repeats, int ms) {
  run r = {.bs = bs, .nblocks = f->len / bs, .data = f->data};
  if (r.nblocks == 0) {
    printf("| %s | %s | %zu | 0 (file holds %zu bytes) | | | | | | | | | |\n", f->path, f->dtype,
           bs, f->len);
    return 0;
  }
  r.c = kv_codec_new(level);
  r.zc = ZSTD_createCCtx();
  r.zd = ZSTD_createDCtx();
  r.zbound = ZSTD_compressBound(bs);
  r.stored = malloc(r.nblocks * bs);
  r.slen = calloc(r.nblocks, sizeof *r.slen);
  r.zst = malloc(r.nblocks * r.zbound);
  r.zlen = calloc(r.nblocks, sizeof *r.zlen);
  r.out = malloc(r.zbound); /* plain zstd compresses here too */
  int rc = -1;
  if (!r.c || !r.zc || !r.zd || !r.stored || !r.slen || !r.zst || !r.zlen || !r.out) goto out;
  ZSTD_CCtx_setParameter(r.zc, ZSTD_c_compressionLevel, level ? level : KV_CODEC_LEVEL);
  /* sizes, and every block back as it was */
  uint64_t plane_in = 0, plane_out[2] = {0, 0}, stored = 0, zstored = 0;
  size_t raw_blocks = 0, zstd_planes[2] = {0, 0};
  for (size_t i = 0; i < r.nblocks; i++) {
    const uint8_t *src = f->data + i * bs;
    uint8_t *st = r.stored + i * bs;
    r.slen[i] = kv_codec_encode(r.c, src, bs, st, bs - 1);
    if (r.slen[i] == KV_CODEC_NOGAIN) {
      raw_blocks++;
      stored += bs;
      plane_in += bs / 2;
      plane_out[0] += bs / 2;
      plane_out[1] += bs / 2;
    } else if (r.slen[i] < 0) {
      fprintf(stderr, "%s: block %zu: encode %ld\n", f->path, i, r.slen[i]);
      goto out;
    } else {
      stored += (uint64_t)r.slen[i];
      plane_in += bs / 2;
      for (int p = 0; p < 2; p++) {
        plane_out[p] += kv_ld32(st + 12 + 4 * p);
        zstd_planes[p] += st[20 + p] == 1;
      }
      if (kv_codec_decode(r.c, st, (size_t)r.slen[i], r.out, bs) || memcmp(r.out, src, bs)) {
        fprintf(stderr, "%s: block %zu does not decode to itself\n", f->path, i);
        goto out;
      }
    }
    r.zlen[i] = ZSTD_compress2(r.zc, r.zst + i * r.zbound, r.zbound, src, bs);
    if (ZSTD_isError(r.zlen[i])) goto out;
    zstored += r.zlen[i];
  }
  double enc = speed(&r, OP_ENCODE, repeats, ms), dec = speed(&r, OP_DECODE, repeats, ms);
  double cpy = speed(&r, OP_MEMCPY, repeats, ms);
  double zenc = speed(&r, OP_ZENC, repeats, ms), zdec = speed(&r, OP_ZDEC, repeats, ms);
  if (enc < 0 || dec < 0 || cpy < 0 || zenc < 0 || zdec < 0) {
    fprintf(stderr, "%s: a timed pass failed\n", f->path);
    goto out;
  }
  double in = (double)(r.nblocks * bs);
  printf("| %s | %s | %zu KiB | %zu | %.3f (%zu/%zu zstd) | %.3f (%zu/%zu zstd) | %.3f | %zu"
         " | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f |\n",
         f->path, f->dtype, bs >> 10, r.nblocks, (double)plane_in / (double)plane_out[0],
         zstd_planes[0], r.nblocks, (double)plane_in / (double)plane_out[1], zstd_planes[1],
         r.nblocks, in / (double)stored, raw_blocks, enc, dec, cpy, in / (double)zstored, zenc,
         zdec);
  rc = 0;
out:
  kv_codec_free(r.c);
  ZSTD_freeCCtx(r.zc);
  ZSTD_freeDCtx(r.zd);
  free(r.stored);
  free(r.slen);
  free(r.zst);
  free(r.zlen);
  free(r.out);
  return rc;
}

int main(int argc, char **argv) {
  int level = 0, repeats = 7, ms = 100, nbs = 0, nfiles = 0;
  size_t bs[MAX_BLOCKS_ARGS];
  const char **files = calloc((size_t)argc + 2, sizeof *files);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 < argc && !strcmp(a, "--level")) level = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--repeats")) repeats = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--ms")) ms = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--block") && nbs < MAX_BLOCKS_ARGS)
      bs[nbs++] = strtoul(argv[++i], NULL, 0);
    else if (a[0] == '-') {
      fprintf(stderr, "usage: %s [--level L] [--repeats R] [--ms MS] [--block BYTES]... "
                      "[FILE.safetensors]...\n", argv[0]);
      return 2;
    } else files[nfiles++] = a;
  }
  if (!nfiles) {
    files[nfiles++] = "bench/kv/smollm2-135m.bf16.safetensors";
    files[nfiles++] = "bench/kv/smollm2-135m.f16.safetensors";
  }
  if (!nbs) {
    bs[nbs++] = 64 << 10;
    bs[nbs++] = 256 << 10;
  }
  for (int i = 0; i < nbs; i++)
    if (!kv_codec_bound(bs[i]) || bs[i] < 64) {
      fprintf(stderr, "a block of %zu bytes: an even number from 64 up is needed\n", bs[i]);
      return 2;
    }
  if (repeats < 1 || ms < 1) {
    fprintf(stderr, "--repeats and --ms must be positive\n");
    return 2;
  }
  char how[80];
  if (level) snprintf(how, sizeof how, "zstd level %d", level);
  else snprintf(how, sizeof how, "its tuned level (zstd %d, high plane minMatch 7, hashLog 6)",
                KV_CODEC_LEVEL);
  printf("Codec %s at %s, plain zstd at level %d (libzstd %s), one thread; ratio = original /"
         " stored bytes; speeds in GB/s (10^9 B/s) of original bytes, median of %d runs of >= %d"
         " ms.\n\n",
         kv_codec_name(), how, level ? level : KV_CODEC_LEVEL, ZSTD_versionString(), repeats, ms);
  printf("| file | dtype | block | blocks | high plane ratio | low plane ratio | overall ratio |"
         " blocks stored raw | encode GB/s | decode GB/s | memcpy GB/s | plain zstd ratio |"
         " plain zstd comp GB/s | plain zstd decomp GB/s |\n");
  printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  for (int i = 0; i < nfiles; i++) {
    kvfile f;
    if (kv_kvfile_load(files[i], &f)) {
      rc = 1;
      continue;
    }
    for (int k = 0; k < nbs; k++)
      if (row(&f, bs[k], level, repeats, ms)) rc = 1;
    free(f.data);
  }
  free(files);
  return rc;
}
