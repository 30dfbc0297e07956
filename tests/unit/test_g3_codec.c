/* test_g3_codec.c - coded G3 blocks (tiers/G3.md, "Coded blocks"): a
 * trained model's BF16 KV (bench/kv) written with KV_G3_CODE and read back
 * on both backends, after a reopen and after an index rebuild; random
 * (incompressible) blocks stored raw, as version 1 records; blocks larger
 * than a slot refused (raw at once, coded when their stored form does not
 * fit), and stored when it does; damage to a coded record's stored bytes,
 * its stored length, its codec field, its flags and its stored bytes' CRC
 * each a miss (KV_ECORRUPT), never a wrong block; the record format's own
 * checks of versions 1 and 2. */
#include "base/crc32c.h"
#include "base/le.h"
#include "tests/lib/g3.h"
#include "tiers/codec.h"
#include "tiers/g3_format.h"
#include "tiers/g3_internal.h"
#include "tiers/quant.h"

#define BLOCK     (64u << 10)
#define BF16_FILE KV_SOURCE_DIR "/bench/kv/smollm2-135m.bf16.safetensors"

typedef struct cstore {
  char dir[64];
  kv_arena arena;
  int cls;
  kv_g3 *g;
  kv_g3_open_info info;
  kv_g3_backend be;
  uint32_t slot_bytes;
} cstore;

static void c_open(cstore *s) {
  kv_g3_dir d = {s->dir, 16ull << 20};
  kv_g3_opts o = {.dirs = &d,
                  .ndirs = 1,
                  .block_bytes = BLOCK,
                  .slot_bytes = s->slot_bytes,
                  .queue_depth = 4,
                  .backend = s->be,
                  .arena = &s->arena};
  int rc = kv_g3_open(&s->g, &o, &s->info);
  cr_assert_eq(rc, 0, "open: %s", kv_strerror(rc));
}

static void c_init(cstore *s, kv_g3_backend be, uint32_t slot_bytes) {
  if (be == KV_G3_BACKEND_URING && !t_uring_ok()) cr_skip_test("io_uring unavailable");
  memset(s, 0, sizeof *s);
  t_mkdir(s->dir, sizeof s->dir);
  t_arena(&s->arena, 8u << 20, BLOCK, &s->cls);
  s->be = be;
  s->slot_bytes = slot_bytes;
  c_open(s);
}

static void c_fini(cstore *s) {
  kv_g3_close(s->g);
  kv_arena_fini(&s->arena);
  t_rmdir(s->dir);
}

/* Block i of the sample: BLOCK bytes of real BF16 KV. */
static void kv_block(void *dst, unsigned i) {
  static uint8_t *kv;
  static size_t n;
  if (!kv) kv = t_kv_data(BF16_FILE, &n);
  cr_assert_geq(n, (size_t)(i + 1) * BLOCK);
  memcpy(dst, kv + (size_t)i * BLOCK, BLOCK);
}

/* Writes buf as block i with flags; the completion's status. */
static int put(cstore *s, uint32_t slot, unsigned i, const void *buf, unsigned flags) {
  kv_g3_key k = t_key(i);
  t_count c = {0};
  int rc = kv_g3_write_ex(s->g, slot, &k, 10 + i, buf, BLOCK, kv_g3_write_crc_none, flags,
                          t_count_cb, &c);
  if (rc) return rc;
  kv_g3_drain(s->g);
  cr_assert_eq(c.n, 1);
  return c.last;
}

static int get(cstore *s, uint32_t slot, unsigned i, void *buf) {
  kv_g3_expect e = t_expect(i, BLOCK, 10 + i);
  return kv_g3_read_sync(s->g, slot, &e, buf);
}

/* n coded blocks of real KV written, then read back and compared; again
 * after a reopen (the index keeps their stored lengths) and after the
 * index is rebuilt from the record headers. */
static void coded_round_trip(kv_g3_backend be) {
  enum { N = 8 };
  cstore s;
  c_init(&s, be, 0);
  uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
  uint32_t slot[N];
  for (unsigned i = 0; i < N; i++) {
    kv_block(w, i);
    cr_assert_eq(kv_g3_alloc(s.g, &slot[i]), 0);
    cr_assert_eq(put(&s, slot[i], i, w, KV_G3_CODE), 0);
  }
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.coded, N, "coded %llu", (unsigned long long)st.coded);
  cr_assert_eq(st.codec_in, (uint64_t)N * BLOCK);
  cr_assert_lt(st.codec_out * 5, st.codec_in * 4, "ratio above 1.25: %llu / %llu",
               (unsigned long long)st.codec_in, (unsigned long long)st.codec_out);
  cr_assert_eq(st.held_bytes, st.codec_out);
  cr_assert_eq(st.write_bytes, (uint64_t)N * BLOCK);
  for (int pass = 0; pass < 3; pass++) {
    for (unsigned i = 0; i < N; i++) {
      memset(r, 0, BLOCK);
      int rc = get(&s, slot[i], i, r);
      cr_assert_eq(rc, 0, "pass %d block %u: %s", pass, i, kv_strerror(rc));
      kv_block(w, i);
      cr_assert(!memcmp(r, w, BLOCK), "pass %d block %u differs", pass, i);
    }
    kv_g3_get_stats(s.g, &st);
    cr_assert_eq(st.decoded, N);
    cr_assert_eq(st.coded_stored, N);
    kv_g3_close(s.g);
    if (pass == 1) { /* the index rebuilt from the headers, stored bytes checked */
      kv_g3_dir d = {s.dir, 16ull << 20};
      kv_g3_opts o = {.dirs = &d, .ndirs = 1, .backend = be};
      kv_g3_rebuild_info ri;
      cr_assert_eq(kv_g3_rebuild_index(&o, 1, &ri), 0);
      cr_assert_eq(ri.indexed, N);
      cr_assert_eq(ri.bad_payload, 0);
    }
    c_open(&s);
    cr_assert_eq(s.info.indexed, N);
  }
  c_fini(&s);
}

Test(g3_codec, coded_round_trip_uring) { coded_round_trip(KV_G3_BACKEND_URING); }
Test(g3_codec, coded_round_trip_threads) { coded_round_trip(KV_G3_BACKEND_THREADS); }

/* A burst of reads of coded blocks queued at once (more than the queue
 * depth) leaves at most 2 * queue depth + 8 free ops holding a buffer for
 * stored bytes, not one per op of the burst. */
Test(g3_codec, burst_of_coded_reads_keeps_few_buffers) {
  enum { N = 64 };
  cstore s;
  c_init(&s, KV_G3_BACKEND_THREADS, 0);
  uint8_t *w = t_buf(&s.arena, s.cls);
  uint32_t slot;
  kv_block(w, 7);
  cr_assert_eq(kv_g3_alloc(s.g, &slot), 0);
  cr_assert_eq(put(&s, slot, 7, w, KV_G3_CODE), 0);
  uint8_t *r[N];
  t_count c = {0};
  kv_g3_expect e = t_expect(7, BLOCK, 17);
  for (unsigned i = 0; i < N; i++) {
    r[i] = t_buf(&s.arena, s.cls);
    cr_assert_eq(kv_g3_read(s.g, slot, &e, r[i], t_count_cb, &c), 0);
  }
  kv_g3_drain(s.g);
  cr_assert_eq(c.n, N);
  cr_assert_eq(c.err, 0);
  for (unsigned i = 0; i < N; i++) cr_assert(!memcmp(r[i], w, BLOCK), "read %u", i);
  unsigned held = 0, ops = 0;
  for (g3_op *op = s.g->op_free; op; op = op->next, ops++) held += op->xbuf != NULL;
  cr_assert_geq(ops, N);
  cr_assert_leq(held, 2 * 4 + 8, "%u of %u free ops hold a buffer", held, ops);
  cr_assert_eq(held, s.g->nxfree);
  c_fini(&s);
}

/* The data file's bytes at off (the store closed). */
static void file_rw(const char *dir, uint64_t off, void *buf, size_t n, int write) {
  char path[128];
  snprintf(path, sizeof path, "%s/kvg3-0.dat", dir);
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  ssize_t r = write ? pwrite(fd, buf, n, (off_t)off) : pread(fd, buf, n, (off_t)off);
  cr_assert_eq(r, (ssize_t)n);
  close(fd);
}

static uint64_t hdr_off(const cstore *s, uint32_t slot) {
  return G3_DATA_OFF + (uint64_t)slot * (kv_g3_slot_bytes(s->g) + G3_SECTOR);
}

/* A raw block (random bytes: no gain) is a version 1 record, as before
 * coding, and reads back; with KV_G3_CODE it is counted raw. */
Test(g3_codec, incompressible_block_stored_raw) {
  cstore s;
  c_init(&s, KV_G3_BACKEND_THREADS, 0);
  uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
  uint32_t a, b;
  t_fill(w, BLOCK, 7, 1);
  cr_assert_eq(kv_g3_alloc(s.g, &a), 0);
  cr_assert_eq(put(&s, a, 1, w, KV_G3_CODE), 0);
  t_fill(w, BLOCK, 7, 2);
  cr_assert_eq(kv_g3_alloc(s.g, &b), 0);
  cr_assert_eq(put(&s, b, 2, w, 0), 0);
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.coded, 0);
  cr_assert_eq(st.coded_raw, 1);
  cr_assert_eq(st.held_bytes, 2ull * BLOCK);
  cr_assert_eq(get(&s, a, 1, r), 0);
  cr_assert(t_check(r, BLOCK, 7, 1));
  cr_assert_eq(get(&s, b, 2, r), 0);
  cr_assert(t_check(r, BLOCK, 7, 2));
  uint64_t off = hdr_off(&s, a);
  kv_g3_close(s.g);
  uint8_t h[G3_REC_LEN];
  file_rw(s.dir, off, h, sizeof h, 0);
  cr_assert_eq(kv_ld16(h + 4), 1, "a raw record keeps version 1");
  cr_assert_eq(h[47], 0);
  for (int i = 112; i < 124; i++) cr_assert_eq(h[i], 0);
  c_open(&s);
  cr_assert_eq(get(&s, a, 1, r), 0);
  cr_assert(t_check(r, BLOCK, 7, 1));
  c_fini(&s);
}

/* Slots of a quarter block: a raw block is refused at once (-EMSGSIZE),
 * an incompressible one asked to be coded completes with -EMSGSIZE (no
 * I/O, the store stays ok, the slot is empty again), a real KV block whose
 * coded form fits is stored and reads back. The same file holds more
 * slots. */
Test(g3_codec, too_large_for_slot_refused_and_counted) {
  cstore s;
  c_init(&s, KV_G3_BACKEND_THREADS, 48u << 10); /* BF16 KV codes to ~68% */
  uint32_t small_slots = s.info.slots;
  uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
  uint32_t slot;
  cr_assert_eq(kv_g3_alloc(s.g, &slot), 0);
  t_fill(w, BLOCK, 3, 0);
  kv_g3_key k = t_key(0);
  cr_assert_eq(kv_g3_write(s.g, slot, &k, 1, w, BLOCK, kv_g3_write_crc_none, t_count_cb, NULL),
               -EMSGSIZE);
  cr_assert_eq(put(&s, slot, 0, w, KV_G3_CODE), -EMSGSIZE);
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.too_large, 2);
  cr_assert_eq(st.state, KV_G3_OK);
  cr_assert_eq(st.write_failed, 0);
  cr_assert_eq(st.io_errors, 0);
  kv_block(w, 3);
  cr_assert_eq(put(&s, slot, 3, w, KV_G3_CODE), 0, "the slot is empty again and takes a block");
  cr_assert_eq(get(&s, slot, 3, r), 0);
  cr_assert(!memcmp(r, w, BLOCK));
  c_fini(&s);
  c_init(&s, KV_G3_BACKEND_THREADS, 0);
  cr_assert_gt(small_slots, s.info.slots + s.info.slots / 4, "%u slots of 48K, %u of 64K",
               small_slots, s.info.slots);
  c_fini(&s);
}

/* A reopen asking for another slot size is refused (as before); asking
 * to keep the files' size takes theirs. A coded block larger than the
 * slots reads back whatever block size the reopen gives (0 too). */
Test(g3_codec, other_slot_size_on_reopen) {
  cstore s;
  c_init(&s, KV_G3_BACKEND_THREADS, 48u << 10);
  uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
  uint32_t slot;
  kv_block(w, 6);
  cr_assert_eq(kv_g3_alloc(s.g, &slot), 0);
  cr_assert_eq(put(&s, slot, 6, w, KV_G3_CODE), 0);
  kv_g3_close(s.g);
  kv_g3_dir d = {s.dir, 16ull << 20};
  kv_g3_opts o = {.dirs = &d, .ndirs = 1, .block_bytes = BLOCK, .backend = s.be};
  cr_assert_eq(kv_g3_open(&s.g, &o, &s.info), -EINVAL);
  o.slot_bytes = KV_G3_SLOT_KEEP;
  cr_assert_eq(kv_g3_open(&s.g, &o, &s.info), 0);
  cr_assert_eq(kv_g3_slot_bytes(s.g), 48u << 10);
  cr_assert_eq(kv_g3_block_max(s.g), BLOCK);
  cr_assert_eq(get(&s, slot, 6, r), 0);
  cr_assert(!memcmp(r, w, BLOCK));
  kv_g3_close(s.g);
  o.block_bytes = 0;
  o.slot_bytes = 0;
  cr_assert_eq(kv_g3_open(&s.g, &o, &s.info), 0);
  cr_assert_eq(kv_g3_block_max(s.g), 48u << 10);
  memset(r, 0, BLOCK);
  cr_assert_eq(get(&s, slot, 6, r), 0);
  cr_assert(!memcmp(r, w, BLOCK));
  c_fini(&s);
}

/* Rewrites slot's header after edit(h) and a flip of stored byte
 * payload_at (UINT32_MAX: none) with its header CRC made valid again
 * (fix_crc 1: the checks past it are what refuses; 2: the stored bytes'
 * CRC too, so that decoding or the block's CRC must refuse), or not. */
typedef void (*edit_fn)(uint8_t *h);
static void damage(cstore *s, uint32_t slot, edit_fn edit, uint32_t payload_at, int fix_crc) {
  uint64_t off = hdr_off(s, slot);
  kv_g3_close(s->g);
  uint8_t h[G3_SECTOR];
  file_rw(s->dir, off, h, sizeof h, 0);
  if (edit) edit(h);
  if (payload_at != UINT32_MAX) {
    uint8_t p;
    file_rw(s->dir, off + G3_SECTOR + payload_at, &p, 1, 0);
    p ^= 0x40;
    file_rw(s->dir, off + G3_SECTOR + payload_at, &p, 1, 1);
  }
  if (fix_crc > 1) { /* the stored bytes' CRC made to match their damage */
    uint32_t n = kv_ld32(h + 112);
    uint8_t *p = malloc(n);
    file_rw(s->dir, off + G3_SECTOR, p, n, 0);
    kv_st32(h + 116, kv_crc32c(0, p, n));
    free(p);
  }
  if (fix_crc) kv_st32(h + 124, kv_crc32c(0, h, 124));
  file_rw(s->dir, off, h, sizeof h, 1);
  c_open(s);
}

static void stored_shorter(uint8_t *h) { kv_st32(h + 112, kv_ld32(h + 112) - 8); }
static void codec_other(uint8_t *h) { h[120] = 2; }
static void flag_cleared(uint8_t *h) { h[47] = 0; }
static void flag_other(uint8_t *h) { h[47] = 3; }
static void scrc_other(uint8_t *h) { h[116] ^= 1; }
static void version_1(uint8_t *h) { kv_st16(h + 4, 1); }
static void stored_is_len(uint8_t *h) { kv_st32(h + 112, kv_ld32(h + 32)); }
static void header_bit(uint8_t *h) { h[113] ^= 0x10; }

typedef struct damage_case {
  const char *what;
  edit_fn edit;
  uint32_t payload_at; /* a stored byte flipped, UINT32_MAX: none */
  int fix_crc;      /* damage()'s */
  int codec_failed; /* counted in decode_failed; -1: either */
} damage_case;

/* Each damage makes the read a miss (KV_ECORRUPT, the block dropped), the
 * caller's buffer never handed over as a good block; a coded block next
 * to it still reads. */
Test(g3_codec, damaged_coded_record_is_a_miss) {
  static const damage_case cases[] = {
      {"stored byte flipped", NULL, 100, 0, 1},
      {"stored byte flipped, its CRC fixed up", NULL, 2000, 2, -1},
      {"middle stored byte flipped, its CRC fixed up", NULL, UINT32_MAX - 1, 2, -1},
      {"codec header byte flipped, its CRC fixed up", NULL, 9, 2, 1},
      {"stored length shorter", stored_shorter, UINT32_MAX, 1, 0},
      {"stored length the block's", stored_is_len, UINT32_MAX, 1, 0},
      {"codec field", codec_other, UINT32_MAX, 1, 0},
      {"flag cleared", flag_cleared, UINT32_MAX, 1, 0},
      {"unknown flag", flag_other, UINT32_MAX, 1, 0},
      {"version 1 with coded fields", version_1, UINT32_MAX, 1, 0},
      {"stored bytes' CRC", scrc_other, UINT32_MAX, 1, 1},
      {"header bit, header CRC not fixed", header_bit, UINT32_MAX, 0, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    cstore s;
    c_init(&s, c % 2 ? KV_G3_BACKEND_THREADS : KV_G3_BACKEND_URING, 0);
    uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
    uint32_t a, b;
    kv_block(w, 4);
    cr_assert_eq(kv_g3_alloc(s.g, &a), 0);
    cr_assert_eq(put(&s, a, 4, w, KV_G3_CODE), 0);
    kv_block(w, 5);
    cr_assert_eq(kv_g3_alloc(s.g, &b), 0);
    cr_assert_eq(put(&s, b, 5, w, KV_G3_CODE), 0);
    kv_g3_stats st;
    kv_g3_get_stats(s.g, &st);
    uint32_t stored = (uint32_t)(st.codec_out / 2); /* about; a byte within both */
    uint32_t at = cases[c].payload_at == UINT32_MAX - 1 ? stored / 2 : cases[c].payload_at;
    damage(&s, a, cases[c].edit, at, cases[c].fix_crc);
    memset(r, 0, BLOCK);
    int rc = get(&s, a, 4, r);
    cr_assert_eq(rc, KV_ECORRUPT, "%s: %s", cases[c].what, kv_strerror(rc));
    kv_g3_get_stats(s.g, &st);
    cr_assert_eq(st.corrupt, 1, "%s", cases[c].what);
    if (cases[c].codec_failed >= 0)
      cr_assert_eq(st.decode_failed, (uint64_t)cases[c].codec_failed, "%s", cases[c].what);
    cr_assert_eq(st.dropped, 1, "%s", cases[c].what);
    cr_assert_eq(get(&s, b, 5, r), 0, "%s: the other block", cases[c].what);
    kv_block(w, 5);
    cr_assert(!memcmp(r, w, BLOCK));
    c_fini(&s);
  }
}

/* The record format: version 2 round trip; what decode refuses. */
Test(g3_codec, record_versions) {
  g3_rec r, back;
  memset(&r, 0, sizeof r);
  r.seq = 5;
  r.len = 65536;
  r.crc = 0x1234;
  r.keylen = 4;
  r.stored = 40000;
  r.scrc = 0xABCD;
  r.codec = KV_CODEC_ZSTD_PLANES;
  uint8_t h[G3_REC_LEN];
  g3_rec_encode(&r, h);
  cr_assert_eq(kv_ld16(h + 4), G3_REC_VERSION_CODED);
  cr_assert_eq(g3_rec_decode(&back, h), 0);
  cr_assert_eq(back.stored, 40000);
  cr_assert_eq(back.scrc, 0xABCD);
  cr_assert_eq(back.codec, KV_CODEC_ZSTD_PLANES);
  r.codec = G3_CODEC_INT8; /* lossy: its dtype must be 1 or 2 */
  g3_rec_encode(&r, h);
  cr_assert_eq(g3_rec_decode(&back, h), KV_ECORRUPT);
  r.qdt = KV_QDT_BF16;
  g3_rec_encode(&r, h);
  cr_assert_eq(g3_rec_decode(&back, h), 0);
  cr_assert_eq(back.codec, G3_CODEC_INT8);
  cr_assert_eq(back.qdt, KV_QDT_BF16);
  r.codec = G3_CODEC_PLANES; /* lossless: no dtype */
  g3_rec_encode(&r, h);
  cr_assert_eq(g3_rec_decode(&back, h), KV_ECORRUPT);
  r.codec = 4; /* no such codec */
  r.qdt = 0;
  g3_rec_encode(&r, h);
  cr_assert_eq(g3_rec_decode(&back, h), KV_ECORRUPT);
  r.stored = 0; /* raw: version 1, coded fields all 0 */
  g3_rec_encode(&r, h);
  cr_assert_eq(kv_ld16(h + 4), G3_VERSION);
  cr_assert_eq(g3_rec_decode(&back, h), 0);
  cr_assert_eq(back.stored, 0);
  h[47] = G3_REC_CODED; /* a flag on a version 1 record */
  kv_st32(h + 124, kv_crc32c(0, h, 124));
  cr_assert_eq(g3_rec_decode(&back, h), KV_ECORRUPT);
  kv_st16(h + 4, 3); /* a version nobody wrote */
  h[47] = 0;
  kv_st32(h + 124, kv_crc32c(0, h, 124));
  cr_assert_eq(g3_rec_decode(&back, h), KV_ECORRUPT);
}

/* A tenant's cold_precision: FP8 or INT8 codes of a BF16 block (a scale
 * per 64 elements), read back as what the codes decode to, with that CRC,
 * also after a reopen; a damaged stored byte a miss, with or without its
 * CRC made to match; refused to a reader of exact blocks. */
static void lossy_round_trip(unsigned kind) {
  cstore s;
  c_init(&s, KV_G3_BACKEND_THREADS, 48u << 10); /* the codes take ~53%: they fit */
  uint8_t *w = t_buf(&s.arena, s.cls), *r = t_buf(&s.arena, s.cls);
  uint8_t *want = malloc(BLOCK), *codes = malloc(kv_quant_size(BLOCK / 2, 64));
  kv_quant_kind k = kind == KV_G3_FP8 ? KV_QUANT_FP8 : KV_QUANT_INT8;
  enum { N = 4 };
  uint32_t slot[N];
  for (unsigned i = 0; i < N; i++) {
    kv_block(w, 8 + i);
    cr_assert_eq(kv_g3_alloc(s.g, &slot[i]), 0);
    cr_assert_eq(put(&s, slot[i], 8 + i, w, kind | KV_G3_BF16 | KV_G3_GROUP(64)), 0);
  }
  kv_g3_stats st;
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.coded, N);
  cr_assert_eq(st.codec_out, N * kv_quant_size(BLOCK / 2, 64));
  for (int pass = 0; pass < 2; pass++) {
    for (unsigned i = 0; i < N; i++) {
      kv_block(w, 8 + i);
      cr_assert_eq(kv_quant_encode(k, KV_QDT_BF16, w, BLOCK / 2, 64, codes), 0);
      cr_assert_eq(kv_quant_decode(k, KV_QDT_BF16, codes, BLOCK / 2, 64, want), 0);
      cr_assert(memcmp(want, w, BLOCK), "lossy: not the block's own bytes");
      uint32_t got = 0;
      kv_g3_expect e = t_expect(8 + i, BLOCK, 18 + i);
      e.flags = KV_G3_EXPECT_CRC | KV_G3_EXPECT_LOSSY;
      e.crc = kv_crc32c(0, w, BLOCK); /* the block's own: a lossy record's differs */
      e.crc_out = &got;
      memset(r, 0, BLOCK);
      int rc = kv_g3_read_sync(s.g, slot[i], &e, r);
      cr_assert_eq(rc, 0, "pass %d block %u: %s", pass, i, kv_strerror(rc));
      cr_assert(!memcmp(r, want, BLOCK), "pass %d block %u: not its codes' decoding", pass, i);
      cr_assert_eq(got, kv_crc32c(0, want, BLOCK));
    }
    kv_g3_close(s.g);
    c_open(&s);
    cr_assert_eq(s.info.indexed, N);
  }
  /* block 0: a stored byte flipped; block 1: the same, its CRC made to
   * match; block 2: an exact reader; block 3 still reads */
  damage(&s, slot[0], NULL, 300, 0);
  damage(&s, slot[1], NULL, 5000, 2);
  for (unsigned i = 0; i < N; i++) {
    kv_g3_expect e = t_expect(8 + i, BLOCK, 18 + i);
    e.flags = KV_G3_EXPECT_SEQ | (i == 2 ? 0 : KV_G3_EXPECT_LOSSY);
    cr_assert_eq(kv_g3_read_sync(s.g, slot[i], &e, r), i == 3 ? 0 : KV_ECORRUPT, "block %u", i);
  }
  kv_g3_get_stats(s.g, &st);
  cr_assert_eq(st.corrupt, 3);
  free(want);
  free(codes);
  c_fini(&s);
}

Test(g3_codec, lossy_fp8_round_trip) { lossy_round_trip(KV_G3_FP8); }
Test(g3_codec, lossy_int8_round_trip) { lossy_round_trip(KV_G3_INT8); }
