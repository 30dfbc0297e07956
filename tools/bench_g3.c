/*
 * bench_g3.c - `kvbench g3`: G3 store throughput, and `kvbench g3 rebuild`:
 * the operator's index rebuild (see tiers/G3.md).
 *
 * The benchmark makes a fresh store of `count` blocks in the given
 * directories, writes them all (sequential slots, queue_depth block I/Os in
 * flight, from buffers in a G2 arena registered with io_uring), then reads
 * them all back verified, and prints one JSON object with both rates in
 * GB/s (1e9 bytes/s). A write counts when its index entry is committed
 * (data durable first, per the sync policy); a read counts when its bytes
 * and header are verified. Payload CRCs are given with the write, as the
 * cache core passes the checksum it took at commit.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/errors.h"
#include "tiers/arena.h"
#include "tiers/g3.h"
#include "tools/kvbench.h"
#include "tools/kvfile.h"

#define MAX_DIRS 16

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s) return -EINVAL;
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
  else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
  else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
  if (*end) return -EINVAL;
  *out = v * mul;
  return 0;
}

static void print_json(json_t *o, int compact) {
  char *s = json_dumps(o, (compact ? JSON_COMPACT : JSON_INDENT(2)) | JSON_REAL_PRECISION(6));
  if (s) puts(s);
  free(s);
  json_decref(o);
}

/* ---- kvbench g3 rebuild --------------------------------------------------------- */
static int cmd_rebuild(int argc, char **argv) {
  static const struct option lo[] = {{"dir", required_argument, 0, 'd'},
                                     {"no-verify", no_argument, 0, 'n'},
                                     {"json", no_argument, 0, 'j'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  kv_g3_dir dirs[MAX_DIRS];
  unsigned ndirs = 0;
  int verify = 1, json = 0, ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "d:njh", lo, NULL)) != -1) {
    switch (ch) {
    case 'd':
      if (ndirs == MAX_DIRS) return 2;
      dirs[ndirs++] = (kv_g3_dir){optarg, 0};
      break;
    case 'n': verify = 0; break;
    case 'j': json = 1; break;
    case 'h':
      printf("usage: kvbench g3 rebuild --dir DIR [--dir DIR2 ...] [--no-verify] [--json]\n"
             "  Rebuilds the LMDB index of a closed G3 store from its record headers:\n"
             "  the newest record of each key wins; with verification (the default)\n"
             "  only records whose payload matches its CRC32C are kept. Give the\n"
             "  directories in the store's order (the index lives in the first).\n");
      return 0;
    default: return 2;
    }
  }
  if (!ndirs) {
    fprintf(stderr, "kvbench g3 rebuild: --dir is required\n");
    return 2;
  }
  kv_g3_opts o = {.dirs = dirs, .ndirs = ndirs};
  kv_g3_rebuild_info ri;
  double t0 = kv_now_s();
  int rc = kv_g3_rebuild_index(&o, verify, &ri);
  double dt = kv_now_s() - t0;
  if (rc) {
    fprintf(stderr, "kvbench g3 rebuild: %s\n", kv_strerror(rc));
    return 1;
  }
  fprintf(stderr,
          "rebuilt in %.3f s: %llu slots scanned in %u files, %llu records, %llu indexed, "
          "%llu superseded, %llu with a bad payload\n",
          dt, (unsigned long long)ri.scanned, ri.files, (unsigned long long)ri.records,
          (unsigned long long)ri.indexed, (unsigned long long)ri.superseded,
          (unsigned long long)ri.bad_payload);
  print_json(json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:i,s:b,s:f}", "bench", "g3-rebuild", "scanned",
                       (json_int_t)ri.scanned, "records", (json_int_t)ri.records, "indexed",
                       (json_int_t)ri.indexed, "superseded", (json_int_t)ri.superseded,
                       "bad_payload", (json_int_t)ri.bad_payload, "files", (int)ri.files,
                       "verified", verify, "seconds", dt),
             json);
  return 0;
}

/* ---- kvbench g3 ------------------------------------------------------------------ */
typedef struct bench {
  kv_g3 *g;
  uint32_t block, nbuf;
  uint64_t count;
  uint8_t **buf;  /* block i moves through buffer i % nbuf */
  uint32_t *crc;  /* CRC32C of each buffer's contents */
  uint8_t *busy;  /* per buffer */
  uint32_t *slot; /* per block */
  uint64_t done, errors;
  uint8_t *refused; /* per block: too large for a slot (-EMSGSIZE), not stored */
  uint64_t nrefused;
  int first_err;
  unsigned wflags; /* kv_g3_write_ex's: KV_G3_CODE with --code */
} bench;

typedef struct op_ctx {
  bench *b;
  uint32_t buf;
  uint64_t blk;
} op_ctx;

static void op_done(int status, void *arg) {
  op_ctx *c = arg;
  bench *b = c->b;
  if (status == -EMSGSIZE) { /* refused: fits no slot; its slot is empty again */
    b->refused[c->blk] = 1;
    b->nrefused++;
    kv_g3_free(b->g, b->slot[c->blk]);
  } else if (status) {
    if (!b->errors) b->first_err = status;
    b->errors++;
  }
  b->done++;
  b->busy[c->buf] = 0;
}

static kv_g3_key bench_key(uint64_t i) {
  kv_g3_key k;
  memset(&k, 0, sizeof k);
  memcpy(k.ns, "kvbench-g3-namespace-digest-0001", KV_G3_NS_BYTES);
  k.len = 16;
  memcpy(k.b, &i, sizeof i);
  memcpy(k.b + 8, "kvbench!", 8);
  return k;
}

/* One phase over all blocks, in order, with at most nbuf outstanding (the
 * store itself keeps queue_depth of them at the device). */
static int run_phase(bench *b, int writing, op_ctx *ctx, double *secs) {
  uint64_t next = 0;
  b->done = 0;
  double t0 = kv_now_s();
  while (b->done < b->count) {
    while (next < b->count && !b->busy[next % b->nbuf]) {
      uint32_t bi = (uint32_t)(next % b->nbuf);
      if (!writing && b->refused[next]) { /* not stored: nothing to read */
        b->done++;
        next++;
        continue;
      }
      kv_g3_key k = bench_key(next);
      int rc;
      ctx[bi].b = b;
      ctx[bi].buf = bi;
      ctx[bi].blk = next;
      if (writing) {
        rc = kv_g3_alloc(b->g, &b->slot[next]);
        if (rc == 0)
          rc = kv_g3_write_ex(b->g, b->slot[next], &k, next + 1, b->buf[bi], b->block,
                              b->crc[bi], b->wflags, op_done, &ctx[bi]);
      } else {
        kv_g3_expect e = {.key = k,
                          .len = b->block,
                          .seq = next + 1,
                          .crc = b->crc[bi],
                          .flags = KV_G3_EXPECT_SEQ | KV_G3_EXPECT_CRC | KV_G3_EXPECT_LOSSY};
        rc = kv_g3_read(b->g, b->slot[next], &e, b->buf[bi], op_done, &ctx[bi]);
      }
      if (rc) {
        fprintf(stderr, "kvbench g3: %s of block %llu: %s\n", writing ? "write" : "read",
                (unsigned long long)next, kv_strerror(rc));
        kv_g3_drain(b->g);
        return rc;
      }
      b->busy[bi] = 1;
      next++;
    }
    struct pollfd p = {.fd = kv_g3_fd(b->g), .events = POLLIN};
    poll(&p, 1, 1000);
    kv_g3_poll(b->g);
  }
  *secs = kv_now_s() - t0;
  if (b->errors) {
    fprintf(stderr, "kvbench g3: %llu %s failed (first: %s)\n", (unsigned long long)b->errors,
            writing ? "writes" : "reads", kv_strerror(b->first_err));
    return b->first_err;
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbench g3 --dir DIR [--dir DIR2 ...] [--block-bytes B] [--qd Q] [--count N]\n"
          "                  [--backend auto|uring|threads] [--sync batch|dsync|none]\n"
          "                  [--buffers K] [--commit-window-us U] [--no-fixed] [--keep] [--json]\n"
          "                  [--kv FILE.safetensors] [--code] [--slot-bytes S]\n"
          "       kvbench g3 rebuild --dir DIR [--dir DIR2 ...] [--no-verify] [--json]\n"
          "  Writes N blocks of B bytes (default 1M) into a fresh store, then reads them\n"
          "  back verified; prints write_gbps and read_gbps (1e9 bytes/s). Q (default\n"
          "  32) block I/Os in flight at the device; K blocks outstanding (default: 256\n"
          "  MiB of them, at least 2*Q+8), the rest waiting in G3 or for their group\n"
          "  commit. The write phase ends when every block is durable and indexed.\n"
          "  --no-fixed: the buffers are not registered with io_uring, as kvcached's\n"
          "  G2 arenas are not (workers can punch holes in them).\n"
          "  --kv: the blocks' bytes are the file's whole blocks in turn (bench/kv's\n"
          "  trained-model KV), not random; --code: written coded (tiers/codec.h);\n"
          "  --quant fp8|int8: written lossy (tiers/quant.h, a scale per 64 elements:\n"
          "  bench/kv's head_dim), read back as the codes decode to;\n"
          "  --slot-bytes: the store's slots (default B): a block that fits none is\n"
          "  refused (too_large) and not read. GB/s count the blocks' own bytes.\n"
          "  Sizes take K/M/G suffixes. The store is deleted afterwards unless --keep.\n");
}

int kvbench_g3(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "rebuild")) return cmd_rebuild(argc - 1, argv + 1);
  static const struct option lo[] = {{"dir", required_argument, 0, 'd'},
                                     {"block-bytes", required_argument, 0, 'b'},
                                     {"qd", required_argument, 0, 'q'},
                                     {"count", required_argument, 0, 'n'},
                                     {"backend", required_argument, 0, 'B'},
                                     {"sync", required_argument, 0, 's'},
                                     {"buffers", required_argument, 0, 'K'},
                                     {"keep", no_argument, 0, 'k'},
                                     {"json", no_argument, 0, 'j'},
                                     {"help", no_argument, 0, 'h'},
                                     {"commit-window-us", required_argument, 0, 'W'},
                                     {"no-fixed", no_argument, 0, 'F'},
                                     {"kv", required_argument, 0, 'V'},
                                     {"code", no_argument, 0, 'C'},
                                     {"slot-bytes", required_argument, 0, 'S'},
                                     {"quant", required_argument, 0, 'Q'},
                                     {0, 0, 0, 0}};
  kv_g3_dir dirs[MAX_DIRS];
  unsigned ndirs = 0;
  uint64_t block = 1 << 20, qd = 32, count = 1024, nbuf = 0;
  kv_g3_backend be = KV_G3_BACKEND_AUTO;
  kv_g3_sync sync = KV_G3_SYNC_BATCH;
  int json = 0, keep = 0, window = 0, fixed = 1, code = 0, ch;
  const char *kvpath = NULL;
  uint64_t slot_opt = 0;
  optind = 1;
  unsigned quant = 0; /* KV_G3_FP8 or KV_G3_INT8 with --quant */
  while ((ch = getopt_long(argc, argv, "d:b:q:n:B:s:K:W:FkjhV:CS:Q:", lo, NULL)) != -1) {
    switch (ch) {
    case 'd':
      if (ndirs == MAX_DIRS) return 2;
      dirs[ndirs++] = (kv_g3_dir){optarg, 0};
      break;
    case 'b':
      if (parse_u64(optarg, &block) || !block || block > (1u << 30)) return 2;
      break;
    case 'q':
      if (parse_u64(optarg, &qd) || !qd || qd > 4096) return 2;
      break;
    case 'n':
      if (parse_u64(optarg, &count) || !count || count > (1u << 30)) return 2;
      break;
    case 'K':
      if (parse_u64(optarg, &nbuf) || !nbuf || nbuf > 65536) return 2;
      break;
    case 'B':
      if (!strcmp(optarg, "auto")) be = KV_G3_BACKEND_AUTO;
      else if (!strcmp(optarg, "uring")) be = KV_G3_BACKEND_URING;
      else if (!strcmp(optarg, "threads")) be = KV_G3_BACKEND_THREADS;
      else return 2;
      break;
    case 's':
      if (!strcmp(optarg, "batch")) sync = KV_G3_SYNC_BATCH;
      else if (!strcmp(optarg, "dsync")) sync = KV_G3_SYNC_DSYNC;
      else if (!strcmp(optarg, "none")) sync = KV_G3_SYNC_NONE;
      else return 2;
      break;
    case 'W': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || v < -1 || v > 1000000) return 2;
      window = (int)v;
      break;
    }
    case 'k': keep = 1; break;
    case 'F': fixed = 0; break;
    case 'V': kvpath = optarg; break;
    case 'C': code = 1; break;
    case 'Q':
      if (!strcmp(optarg, "fp8")) quant = KV_G3_FP8;
      else if (!strcmp(optarg, "int8")) quant = KV_G3_INT8;
      else return 2;
      break;
    case 'S':
      if (parse_u64(optarg, &slot_opt) || !slot_opt || slot_opt > (1u << 30)) return 2;
      break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!ndirs) {
    usage(stderr);
    return 2;
  }
  uint32_t slot = (uint32_t)((block + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN);
  uint32_t sslot = slot_opt ? (uint32_t)((slot_opt + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN)
                            : slot; /* the store's slots */
  kvfile kv = {0};
  if (kvpath && (kv_kvfile_load(kvpath, &kv) || kv.len < block)) {
    fprintf(stderr, "kvbench g3: %s holds no block of %llu bytes\n", kvpath,
            (unsigned long long)block);
    free(kv.data);
    return 1;
  }
  /* Outstanding blocks: enough to keep qd at the device while one batch
   * fills its group-commit window and the one before it syncs (256 MiB of
   * them, at least 2*qd+8): a G2 buffer is held until its block is durable
   * and indexed, as a demotion holds its G2 slot. */
  if (!nbuf) nbuf = 2 * qd + 8 > (256u << 20) / slot ? 2 * qd + 8 : (256u << 20) / slot;
  if (nbuf > count) nbuf = count;
  /* files just big enough: the blocks, their header sectors, and the layout's
   * 1 MiB alignment of the data area */
  uint64_t per = (count + ndirs - 1) / ndirs;
  for (unsigned i = 0; i < ndirs; i++) dirs[i].capacity = per * (sslot + 4096ull) + (3u << 20);

  bench b = {.block = (uint32_t)block,
             .nbuf = (uint32_t)nbuf,
             .count = count,
             .wflags = code ? KV_G3_CODE : 0};
  if (quant) /* groups of 64: bench/kv's head_dim, its elements' last axis */
    b.wflags = quant | KV_G3_GROUP(64) | (kv.data && !strcmp(kv.dtype, "BF16") ? KV_G3_BF16 : 0);
  kv_arena arena;
  size_t page = slot > (4u << 20) ? slot : (4u << 20) / slot * slot;
  kv_arena_opts ao = {
      .capacity = (nbuf * slot + page - 1) / page * page, .page_bytes = page, .name = "kvbench-g3"};
  int rc = kv_arena_init(&arena, &ao);
  if (rc) {
    fprintf(stderr, "kvbench g3: G2 arena of %zu bytes: %s\n", ao.capacity, kv_strerror(rc));
    return 1;
  }
  int cls = kv_arena_class_for(&arena, slot);
  b.buf = calloc(nbuf, sizeof *b.buf);
  b.crc = calloc(nbuf, sizeof *b.crc);
  b.busy = calloc(nbuf, 1);
  b.slot = calloc(count, sizeof *b.slot);
  b.refused = calloc(count, 1);
  op_ctx *ctx = calloc(nbuf, sizeof *ctx);
  int ret = 1;
  if (cls < 0 || !b.buf || !b.crc || !b.busy || !b.slot || !b.refused || !ctx) goto out;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint32_t i = 0; i < nbuf; i++) {
    uint32_t s;
    if (kv_arena_alloc(&arena, cls, &s)) goto out;
    b.buf[i] = kv_arena_ptr(&arena, s);
    if (kv.data) { /* the file's whole blocks, in turn */
      size_t n = kv.len / block;
      memcpy(b.buf[i], kv.data + (i % n) * block, block);
    }
    for (uint32_t k = 0; !kv.data && k < slot; k += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      memcpy(b.buf[i] + k, &x, 8);
    }
    b.crc[i] = kv_crc32c(0, b.buf[i], b.block);
  }
  kv_g3_opts o = {.dirs = dirs,
                  .ndirs = ndirs,
                  .block_bytes = b.block,
                  .slot_bytes = sslot,
                  .queue_depth = (uint32_t)qd,
                  .backend = be,
                  .sync = sync,
                  .reformat = 1,
                  .arena = fixed ? &arena : NULL,
                  .commit_window_us = window};
  kv_g3_open_info info;
  double t0 = kv_now_s();
  if ((rc = kv_g3_open(&b.g, &o, &info))) {
    fprintf(stderr, "kvbench g3: open: %s\n", kv_strerror(rc));
    goto out;
  }
  double open_s = kv_now_s() - t0, wsec = 0, rsec = 0;
  if (run_phase(&b, 1, ctx, &wsec) || run_phase(&b, 0, ctx, &rsec)) goto close;
  kv_g3_stats st;
  kv_g3_get_stats(b.g, &st);
  double bytes = (double)(count - b.nrefused) * (double)block; /* stored and read back */
  json_t *out = json_pack(
      "{s:s,s:I,s:I,s:I,s:I,s:s,s:s,s:b,s:b,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I}", "bench",
      "g3", "block_bytes", (json_int_t)block, "qd", (json_int_t)qd, "count", (json_int_t)count,
      "bytes", (json_int_t)(count * block), "backend", kv_g3_backend_name(info.backend), "sync",
      sync == KV_G3_SYNC_BATCH   ? "batch"
      : sync == KV_G3_SYNC_DSYNC ? "dsync"
                                 : "none",
      "direct", info.direct, "fixed_buffers", info.fixed_buffers, "open_s", open_s, "write_s", wsec,
      "read_s", rsec, "write_gbps", bytes / wsec / 1e9, "read_gbps", bytes / rsec / 1e9,
      "write_iops", (double)count / wsec, "read_iops", (double)count / rsec, "index_txns",
      (json_int_t)st.index_txns, "syncs", (json_int_t)st.syncs, "buffers", (json_int_t)nbuf);
  json_object_update_new(
      out, json_pack("{s:s,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:I}", "kv",
                     kvpath ? kvpath : "random", "code", code, "quant",
                     quant == KV_G3_FP8 ? "fp8" : quant == KV_G3_INT8 ? "int8" : "exact", "slot_bytes", (json_int_t)sslot, "slots", (json_int_t)info.slots,
                     "coded", (json_int_t)st.coded, "too_large", (json_int_t)st.too_large,
                     "held_bytes", (json_int_t)st.held_bytes, "ratio",
                     st.codec_out ? (double)st.codec_in / (double)st.codec_out : 1.0,
                     "decoded", (json_int_t)st.decoded));
  fprintf(stderr,
          "g3 %s qd %llu, %llu x %llu B: write %.3f GB/s, read %.3f GB/s "
          "(%llu index txns, %llu fdatasync)\n",
          kv_g3_backend_name(info.backend), (unsigned long long)qd, (unsigned long long)count,
          (unsigned long long)block, bytes / wsec / 1e9, bytes / rsec / 1e9,
          (unsigned long long)st.index_txns, (unsigned long long)st.syncs);
  print_json(out, json);
  ret = 0;
close:
  kv_g3_close(b.g);
  if (!keep)
    for (unsigned i = 0; i < ndirs; i++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/kvg3-%u.dat", dirs[i].path, i);
      unlink(p);
      if (i == 0) {
        snprintf(p, sizeof p, "%s/kvg3-index.mdb", dirs[i].path);
        unlink(p);
        snprintf(p, sizeof p, "%s/kvg3-index.mdb-lock", dirs[i].path);
        unlink(p);
      }
    }
out:
  free(b.buf);
  free(b.crc);
  free(b.busy);
  free(b.slot);
  free(b.refused);
  free(ctx);
  kv_arena_fini(&arena);
  free(kv.data);
  return ret;
}
