/*
 * g3_codec.c - a record's header from a write, a read's verification, and
 * the G3 store's coder threads (tiers/G3.md, "Coded blocks"):
 * a write asked to be coded (kv_g3_write_ex, KV_G3_CODE) is coded here
 * into the op's own buffer and handed to the engine; a read of a coded
 * block comes here from the engine, once its transfers are done, to be
 * verified and decoded into the caller's buffer. Neither runs on the
 * caller's thread (the daemon's loop) nor on the engine's (the io_uring
 * thread, which would stop issuing I/O meanwhile).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/errors.h"
#include "tiers/codec.h"
#include "tiers/g3_internal.h"
#include "tiers/quant.h"

void g3_write_hdr(kv_g3 *g, g3_op *op) {
  g3_rec r;
  memset(&r, 0, sizeof r);
  memcpy(r.store_id, g->store_id, G3_STORE_ID_LEN);
  r.seq = op->seq;
  r.len = op->len;
  r.crc = op->crc;
  r.slot = op->fslot;
  r.file = (uint16_t)op->file;
  r.keylen = op->keylen;
  memcpy(r.ns, op->ns, KV_G3_NS_BYTES);
  memcpy(r.key, op->key, op->keylen);
  if (op->stored) {
    r.stored = op->stored;
    r.scrc = op->scrc;
    r.codec = op->code;
    r.qdt = op->code == G3_CODEC_PLANES ? 0 : op->qdt;
  }
  g3_rec_encode(&r, op->hdr);
}

/* A read's payload against its record r: raw, its CRC32C; coded (in
 * op->buf), its stored bytes' CRC32C, then decoded into op->dst and the
 * decoded block's CRC32C (op->codec_failed when the stored bytes fail).
 * NULL when it holds, else why not. */
static const char *payload_why(g3_op *op, const g3_rec *r) {
  const uint8_t *block = op->buf;
  if (op->stored) {
    kv_codec *c = kv_codec_thread(0, NULL);
    op->codec_failed = 1;
    if (kv_crc32c(0, op->buf, op->stored) != r->scrc) return "stored bytes fail their CRC32C";
    if (!c) return "no memory to decode";
    if (r->codec == G3_CODEC_PLANES) {
      if (kv_codec_decode(c, op->buf, op->stored, op->dst, op->len))
        return "stored bytes do not decode";
    } else {
      /* n elements and their scales: the group is what the stored length
       * says (n + 4 n / g bytes), a whole divisor of n (as G4's) */
      size_t n = op->len / 2, extra = op->stored > n ? op->stored - n : 0;
      size_t g = extra && (4 * n) % extra == 0 ? 4 * n / extra : 0;
      if (op->len % 2 || !g || g > UINT32_MAX || n % g ||
          kv_quant_decode(r->codec == G3_CODEC_FP8 ? KV_QUANT_FP8 : KV_QUANT_INT8,
                          (kv_quant_dtype)r->qdt, op->buf, n, (unsigned)g, op->dst))
        return "stored bytes do not decode";
    }
    op->codec_failed = 0;
    block = op->dst;
  }
  if (kv_crc32c(0, block, op->len) != r->crc)
    return op->stored ? "decoded block fails its CRC32C" : "payload fails its CRC32C";
  return NULL;
}

static int lossy_rec(const g3_rec *r) {
  return r->stored && (r->codec == G3_CODEC_FP8 || r->codec == G3_CODEC_INT8);
}

int g3_verify_read(kv_g3 *g, g3_op *op) {
  if (op->io_err) return op->io_err;
  if (op->io_short) {
    op->why = "short read (file ends early)";
    return KV_ECORRUPT;
  }
  g3_rec r;
  int rc = g3_rec_decode(&r, op->hdr);
  if (rc == -ENOENT) op->why = "no record header (never written or zeroed)";
  else if (rc) op->why = "record header damaged";
  else if (memcmp(r.store_id, g->store_id, G3_STORE_ID_LEN)) op->why = "header of another store";
  else if (r.file != op->file || r.slot != op->fslot) op->why = "header names another slot";
  else if (r.keylen != op->keylen || memcmp(r.ns, op->ns, KV_G3_NS_BYTES) ||
           memcmp(r.key, op->key, op->keylen))
    op->why = "header holds another key";
  else if (r.len != op->len) op->why = "length differs from the expected";
  else if (r.stored != op->stored) op->why = "stored length differs from the index's";
  else if ((op->expect & KV_G3_EXPECT_SEQ) && r.seq != op->seq) op->why = "sequence differs";
  else if (lossy_rec(&r) && !(op->expect & KV_G3_EXPECT_LOSSY))
    op->why = "lossy block for a reader of exact ones";
  else if ((op->expect & KV_G3_EXPECT_CRC) && !lossy_rec(&r) && r.crc != op->crc)
    op->why = "checksum differs";
  else if (!(op->why = payload_why(op, &r))) {
    op->seq = r.seq;
    op->crc = r.crc;
    return 0;
  }
  return KV_ECORRUPT;
}

static uint32_t round_up(uint32_t v) { return (v + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN; }

/* Lossy codes of write op's block into op->xbuf (tiers/quant.h), op->crc
 * made that of what they decode to: their length, or -1 (written raw:
 * codes no smaller or larger than a slot, a group that does not divide
 * the block, a non-finite element, no memory). */
static long quant_write(kv_g3 *g, g3_op *op) {
  size_t n = op->len / 2, need = op->group ? kv_quant_size(n, op->group) : 0;
  uint8_t *back;
  if (op->len % 2 || !op->group || n % op->group || need >= op->len || need > g->slot_bytes ||
      !kv_codec_thread(op->len, &back))
    return -1;
  kv_quant_kind k = op->code == G3_CODEC_FP8 ? KV_QUANT_FP8 : KV_QUANT_INT8;
  kv_quant_dtype dt = (kv_quant_dtype)op->qdt;
  if (kv_quant_encode(k, dt, op->dst, n, op->group, op->xbuf) ||
      kv_quant_decode(k, dt, op->xbuf, n, op->group, back))
    return -1;
  op->crc = kv_crc32c(0, back, op->len); /* what a reader gets */
  return (long)need;
}

/* Codes write op: stored coded in op->xbuf when smaller and fitting a
 * slot, else raw when the block fits one; else -EMSGSIZE. */
static int code_write(kv_g3 *g, g3_op *op) {
  uint64_t t0 = kv_now_ns();
  long sl;
  if (op->code == G3_CODEC_PLANES) {
    kv_codec *c = kv_codec_thread(0, NULL);
    sl = c ? kv_codec_encode(c, op->dst, op->len, op->xbuf, g->slot_bytes) : -ENOMEM;
  } else {
    sl = quant_write(g, op);
  }
  op->code_ns = kv_now_ns() - t0;
  if (sl > 0 && (uint32_t)sl < op->len && (uint32_t)sl <= g->slot_bytes) {
    op->stored = (uint32_t)sl;
    op->scrc = kv_crc32c(0, op->xbuf, op->stored);
    op->iolen = round_up(op->stored);
    memset(op->xbuf + op->stored, 0, op->iolen - op->stored);
    op->buf = op->xbuf;
    g3_write_hdr(g, op);
    return 0;
  }
  return op->len <= g->slot_bytes ? 0 : -EMSGSIZE; /* raw, as written by kv_g3_write_ex */
}

/* A coder thread's work on one op (a g3_pool_fn). */
static void coder_run(void *arg, g3_op *op, void **state) {
  kv_g3 *g = arg;
  (void)state; /* its codec is kv_codec_thread's, freed as the thread ends */
  if (!op) return;
  if (op->kind == G3_OP_WRITE) {
    int rc = code_write(g, op);
    if (rc) {
      op->res = rc;
      g3_write_finished(g, op);
    } else {
      g->eng->submit(g, op);
    }
  } else {
    uint64_t t0 = kv_now_ns();
    op->res = g3_verify_read(g, op);
    op->code_ns = kv_now_ns() - t0;
    g3_done_push(g, op);
  }
}

void g3_coders_submit(kv_g3 *g, g3_op *op) { g3_pool_push(g->coders, op); }

void g3_coders_stop(kv_g3 *g) {
  if (!g->coders) return;
  g3_pool_stop(g->coders);
  free(g->coders);
  g->coders = NULL;
}

int g3_coders_start(kv_g3 *g, unsigned n) {
  if (!(g->coders = calloc(1, sizeof *g->coders))) return -ENOMEM;
  if (n > KV_G3_CODEC_THREADS_MAX) n = KV_G3_CODEC_THREADS_MAX;
  int rc = g3_pool_start(g->coders, n ? n : 2, coder_run, g);
  if (rc) g3_coders_stop(g);
  return rc;
}
