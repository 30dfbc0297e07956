/*
 * g3.c - the G3 store: open/close, slot allocation, submission, read
 * verification, completion delivery, state and statistics (see g3.h and
 * G3.md). The I/O engines (g3_uring.c, g3_threads.c), the commit pipeline
 * (g3_commit.c), the index (g3_lmdb.c) and the rebuild scan (g3_rebuild.c)
 * live in their own files.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/errors.h"
#include "base/log.h"
#include "tiers/codec.h"
#include "tiers/g3_internal.h"
#include "tiers/quant.h"

#define QD_MAX KV_G3_QUEUE_DEPTH_MAX

static uint32_t round_up(uint32_t v) { return (v + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN; }

const char *kv_g3_state_name(kv_g3_state s) {
  switch (s) {
  case KV_G3_OK: return "ok";
  case KV_G3_DEGRADED: return "degraded";
  case KV_G3_FULL: return "full";
  }
  return "?";
}

const char *kv_g3_backend_name(kv_g3_backend b) {
  switch (b) {
  case KV_G3_BACKEND_URING: return "uring";
  case KV_G3_BACKEND_THREADS: return "threads";
  case KV_G3_BACKEND_AUTO: return "auto";
  }
  return "?";
}

/* ---- slots ------------------------------------------------------------------ */
static inline unsigned file_of(const kv_g3 *g, uint32_t slot) {
  unsigned f = 0;
  while (f + 1 < g->nfiles && slot >= g->files[f + 1].base) f++;
  return f;
}

static void slot_free(kv_g3 *g, uint32_t slot) {
  g3_file *f = &g->files[file_of(g, slot)];
  f->freestk[f->nfree++] = slot - f->base;
  g->sstate[slot] = G3S_FREE;
  g->sflag[slot] = 0;
  g->nfree++;
}

/* A retiring slot goes back once its delete is committed and reads end. */
static void maybe_release(kv_g3 *g, uint32_t slot) {
  if (g->sstate[slot] == G3S_RETIRING && !(g->sflag[slot] & G3F_DELPEND) && g->snread[slot] == 0) {
    g->nretiring--;
    slot_free(g, slot);
  }
}

static void retire(kv_g3 *g, uint32_t slot) {
  g->sstate[slot] = G3S_RETIRING;
  g->nretiring++;
}

int kv_g3_alloc(kv_g3 *g, uint32_t *slot) {
  int probe = g->state == KV_G3_FULL && g->probe_armed;
  if (g->state == KV_G3_FULL && !probe) return -ENOSPC;
  if (g->state == KV_G3_DEGRADED) return KV_EDEGRADED;
  if (!g->nfree) return -ENOSPC;
  for (unsigned k = 0; k < g->nfiles; k++) {
    unsigned fi = (g->rr + k) % g->nfiles;
    g3_file *f = &g->files[fi];
    if (!f->nfree) continue;
    uint32_t s = f->base + f->freestk[--f->nfree];
    g->rr = fi + 1;
    g->sstate[s] = G3S_ALLOC;
    g->nfree--;
    if (probe) {
      g->probe_armed = 0;
      g->probe_slot = s;
    }
    *slot = s;
    return 0;
  }
  return -ENOSPC;
}

int kv_g3_free(kv_g3 *g, uint32_t slot) {
  if (slot >= g->nslots) return -EINVAL;
  switch (g->sstate[slot]) {
  case G3S_ALLOC:
    if (slot == g->probe_slot) g->probe_slot = UINT32_MAX; /* never written: re-armed later */
    slot_free(g, slot);
    return 0;
  case G3S_DEAD:
    retire(g, slot);
    maybe_release(g, slot);
    return 0;
  case G3S_STORED:
  case G3S_WRITING: return -EBUSY;
  default: return -EALREADY;
  }
}

/* ---- ops ---------------------------------------------------------------------- */
static g3_op *op_get(kv_g3 *g) {
  g3_op *op = g->op_free;
  if (op) g->op_free = op->next;
  else if (!(op = calloc(1, sizeof *op))) return NULL;
  uint8_t *x = op->xbuf; /* kept across uses */
  g->nxfree -= x != NULL;
  memset(op, 0, sizeof *op);
  op->xbuf = x;
  return op;
}

/* op's own slot-sized buffer (coded blocks' stored bytes): 0 or -ENOMEM. */
static int op_xbuf(kv_g3 *g, g3_op *op) {
  if (!op->xbuf && posix_memalign((void **)&op->xbuf, KV_G3_ALIGN, g->slot_bytes)) {
    op->xbuf = NULL;
    return -ENOMEM;
  }
  return 0;
}

/* Free ops keep their buffers for coded blocks up to twice the queue depth
 * (the ops a busy store reuses); more go, so a burst of reads queued at
 * once does not hold a slot of memory per op for the store's life. */
static void op_put(kv_g3 *g, g3_op *op) {
  if (op->xbuf && g->nxfree >= 2 * g->qd + 8) {
    free(op->xbuf);
    op->xbuf = NULL;
  }
  g->nxfree += op->xbuf != NULL;
  op->next = g->op_free;
  g->op_free = op;
}

static void set_key(g3_op *op, const kv_g3_key *k) {
  memcpy(op->ns, k->ns, KV_G3_NS_BYTES);
  memcpy(op->key, k->b, k->len);
  op->keylen = k->len;
}

static int key_ok(const kv_g3_key *k) { return k && k->len >= 1 && k->len <= KV_G3_KEY_MAX; }

static void place(kv_g3 *g, g3_op *op, uint32_t slot) {
  op->slot = slot;
  op->file = file_of(g, slot);
  op->fslot = slot - g->files[op->file].base;
}

/* Queues an index delete for the entry of key in slot (caller thread). */
static int enqueue_del(kv_g3 *g, uint32_t slot, const uint8_t *ns, const uint8_t *key,
                       unsigned keylen) {
  g3_op *op = op_get(g);
  if (!op) return -ENOMEM;
  op->kind = G3_OP_DEL;
  place(g, op, slot);
  memcpy(op->ns, ns, KV_G3_NS_BYTES);
  memcpy(op->key, key, keylen);
  op->keylen = (uint8_t)keylen;
  g->sflag[slot] |= G3F_DELPEND;
  g->inflight++;
  g3_commit_push(g, op);
  return 0;
}

/* What an indexed block in slot takes of the SSD (kv_g3_stats.held_bytes). */
static void count_held(kv_g3 *g, uint32_t slot) {
  g->st.held_bytes += g->sstored[slot] ? g->sstored[slot] : g->slen[slot];
  g->st.coded_stored += g->sstored[slot] != 0;
}
static void forget_held(kv_g3 *g, uint32_t slot) {
  g->st.held_bytes -= g->sstored[slot] ? g->sstored[slot] : g->slen[slot];
  g->st.coded_stored -= g->sstored[slot] != 0;
  g->sstored[slot] = 0;
}

int kv_g3_remove(kv_g3 *g, uint32_t slot, const kv_g3_key *k) {
  if (slot >= g->nslots || !key_ok(k)) return -EINVAL;
  switch (g->sstate[slot]) {
  case G3S_STORED: {
    int rc = enqueue_del(g, slot, k->ns, k->b, k->len);
    if (rc) return rc;
    retire(g, slot);
    g->st.slots_stored--;
    g->st.stored_bytes -= g->slen[slot];
    forget_held(g, slot);
    g->st.removed++;
    return 0;
  }
  case G3S_ALLOC:
  case G3S_DEAD: return kv_g3_free(g, slot);
  case G3S_WRITING: return -EBUSY;
  default: return -EALREADY;
  }
}

int kv_g3_write(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                uint32_t len, int64_t crc, kv_g3_cb cb, void *arg) {
  return kv_g3_write_ex(g, slot, k, seq, buf, len, crc, 0, cb, arg);
}

int kv_g3_write_ex(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                   uint32_t len, int64_t crc, unsigned flags, kv_g3_cb cb, void *arg) {
  unsigned how = flags & (KV_G3_CODE | KV_G3_FP8 | KV_G3_INT8);
  int code = how == KV_G3_CODE ? G3_CODEC_PLANES
             : how == KV_G3_FP8 ? G3_CODEC_FP8
             : how == KV_G3_INT8 ? G3_CODEC_INT8
                                 : 0;
  int lossy = code == G3_CODEC_FP8 || code == G3_CODEC_INT8; /* a dtype and a group apply */
  if (slot >= g->nslots || !key_ok(k) || !buf || (uintptr_t)buf % KV_G3_ALIGN || len == 0 ||
      len > g->block_max || crc > (int64_t)UINT32_MAX || (how && !code) ||
      (flags & 0xFFF0u) || ((flags & KV_G3_BF16 || KV_G3_GROUP_OF(flags)) && !lossy))
    return -EINVAL;
  if (!code && len > g->slot_bytes) {
    g->st.too_large++;
    return -EMSGSIZE;
  }
  if (g->state == KV_G3_FULL && slot != g->probe_slot) return -ENOSPC;
  if (g->state == KV_G3_DEGRADED) return KV_EDEGRADED;
  if (g->sstate[slot] != G3S_ALLOC) return -EBUSY;
  g3_op *op = op_get(g);
  if (!op) return -ENOMEM;
  if (code && op_xbuf(g, op)) {
    op_put(g, op);
    return -ENOMEM;
  }
  op->kind = G3_OP_WRITE;
  place(g, op, slot);
  set_key(op, k);
  op->len = len;
  op->iolen = round_up(len);
  op->seq = seq;
  op->buf = (uint8_t *)buf;
  op->dst = (uint8_t *)buf;
  op->code = (uint8_t)code;
  op->qdt = flags & KV_G3_BF16 ? KV_QDT_BF16 : KV_QDT_FP16;
  op->group = KV_G3_GROUP_OF(flags);
  op->crc = crc >= 0 ? (uint32_t)crc : kv_crc32c(0, buf, len);
  op->cb = cb;
  op->arg = arg;
  g3_write_hdr(g, op);
  g->sstate[slot] = G3S_WRITING;
  g->inflight++;
  atomic_fetch_add(&g->wr_engine, 1);
  if (code) g3_coders_submit(g, op); /* coded there, then to the engine */
  else g->eng->submit(g, op);
  return 0;
}

int kv_g3_read(kv_g3 *g, uint32_t slot, const kv_g3_expect *e, void *buf, kv_g3_cb cb, void *arg) {
  /* a raw block fits its slot; a coded one may be larger (learned from the
   * index whatever the block size given at open) */
  if (slot >= g->nslots || !e || !key_ok(&e->key) || !buf || (uintptr_t)buf % KV_G3_ALIGN ||
      e->len == 0 || e->len > (g->sstored[slot] ? KV_CODEC_LEN_MAX : g->slot_bytes) ||
      !(e->flags & (KV_G3_EXPECT_SEQ | KV_G3_EXPECT_CRC)) || (e->flags & ~7u))
    return -EINVAL;
  if (g->sstate[slot] == G3S_WRITING) return -EBUSY;
  if (g->sstate[slot] != G3S_STORED) return KV_ENOTFOUND;
  if (g->snread[slot] == UINT8_MAX) return -EBUSY;
  g3_op *op = op_get(g);
  if (!op) return -ENOMEM;
  op->kind = G3_OP_READ;
  place(g, op, slot);
  set_key(op, &e->key);
  op->expect = (uint8_t)e->flags;
  op->len = e->len;
  op->iolen = round_up(e->len);
  op->seq = e->seq;
  op->crc = e->crc;
  op->buf = buf;
  op->crc_out = e->crc_out;
  if ((op->stored = g->sstored[slot])) { /* coded: read into op's buffer, decoded into buf */
    if (op_xbuf(g, op)) {
      op_put(g, op);
      return -ENOMEM;
    }
    op->dst = buf;
    op->buf = op->xbuf;
    op->iolen = round_up(op->stored);
  }
  op->cb = cb;
  op->arg = arg;
  g->snread[slot]++;
  g->inflight++;
  g->eng->submit(g, op);
  return 0;
}

/* ---- engine side ----------------------------------------------------------------- */
/* The engines' g3_io_done_fn (handed to them by start_engine). */
static void io_finished(kv_g3 *g, g3_op *op) {
  if (op->kind == G3_OP_READ && op->stored && !op->io_err && !op->io_short) {
    g3_coders_submit(g, op); /* verified and decoded there */
    return;
  }
  if (op->kind == G3_OP_READ) {
    op->res = g3_verify_read(g, op);
  } else {
    op->res = op->io_err ? op->io_err : op->io_short ? -EIO : 0;
    g3_write_finished(g, op);
    return;
  }
  g3_done_push(g, op);
}

/* ---- caller side: completions --------------------------------------------------- */
/* OK turns FULL or DEGRADED; FULL turns DEGRADED (an error that is not
 * about space: a probe write failing with EIO must not leave the store
 * probing quietly for ever). Each change is logged once. */
static void set_state(kv_g3 *g, kv_g3_state s, int err, const char *what, const g3_op *op) {
  if (g->state == s || g->state == KV_G3_DEGRADED) {
    if (op->slot == g->probe_slot)
      kv_debug(G3_SUB, "probe write to %s failed: %s; G3 stays %s", g->files[op->file].path,
               kv_strerror(err), kv_g3_state_name(g->state));
    return;
  }
  g->state = s;
  g->state_err = err;
  g->state_what = what;
  g->probe_armed = 0;
  kv_warn(G3_SUB,
          "%s of slot %u in %s failed: %s; G3 is now %s: no new blocks are admitted, "
          "stored blocks stay readable",
          what, op->fslot, g->files[op->file].path, kv_strerror(err), kv_g3_state_name(s));
}

static void count_error(kv_g3 *g, int res, const char *what, const g3_op *op) {
  if (res == -ENOSPC || res == -EFBIG || res == -EDQUOT) {
    g->st.nospace++;
    set_state(g, KV_G3_FULL, res, what, op);
  } else if (res != KV_ECORRUPT) {
    g->st.io_errors++;
    set_state(g, KV_G3_DEGRADED, res, what, op);
  }
}

/* A coding's or decoding's time in hist[] (daemon/metrics.h's buckets). */
static void hist_add(uint64_t *hist, uint64_t *sum, uint64_t ns) {
  hist[kv_us_bucket(ns, KV_G3_HIST_BUCKETS)]++;
  *sum += ns;
}

static void done_write(kv_g3 *g, g3_op *op) {
  if (op->code) hist_add(g->st.code_hist, &g->st.code_ns, op->code_ns);
  if (op->res == -EMSGSIZE) { /* coded or not, it fits no slot: no I/O was done */
    if (op->slot == g->probe_slot) g->probe_slot = UINT32_MAX;
    g->sstate[op->slot] = G3S_ALLOC;
    g->st.too_large++;
    return;
  }
  int probe = op->slot == g->probe_slot;
  if (probe) g->probe_slot = UINT32_MAX;
  if (op->res == 0 && probe && g->state == KV_G3_FULL) {
    kv_info(G3_SUB, "a write to %s succeeded again: G3 is ok, new blocks are admitted",
            g->files[op->file].path);
    g->state = KV_G3_OK;
    g->state_err = 0;
    g->state_what = "";
  }
  if (op->res == 0) {
    g->sstate[op->slot] = G3S_STORED;
    g->slen[op->slot] = op->len;
    g->sstored[op->slot] = op->stored;
    count_held(g, op->slot);
    if (op->code) {
      g->st.coded += op->stored != 0;
      g->st.coded_raw += op->stored == 0;
      g->st.codec_in += op->stored ? op->len : 0;
      g->st.codec_out += op->stored;
    }
    g->st.slots_stored++;
    g->st.stored_bytes += op->len;
    g->st.writes++;
    g->st.write_bytes += op->len;
    if (op->seq > g->max_seq) g->max_seq = op->seq;
    return;
  }
  g->sstate[op->slot] = G3S_ALLOC;
  g->st.write_failed++;
  count_error(g, op->res, "write", op);
}

static void done_read(kv_g3 *g, g3_op *op) {
  uint32_t s = op->slot;
  g->snread[s]--;
  if (op->stored && op->code_ns) hist_add(g->st.decode_hist, &g->st.decode_ns, op->code_ns);
  if (op->stored && op->res == 0) g->st.decoded++;
  if (op->codec_failed && op->res == KV_ECORRUPT) g->st.decode_failed++;
  if (op->res == 0) {
    if (op->crc_out) *op->crc_out = op->crc;
    g->st.reads++;
    g->st.read_bytes += op->len;
  } else {
    g->st.read_failed++;
    if (op->res == KV_ECORRUPT) {
      g->st.corrupt++;
      if (op->io_short) g->st.short_reads++;
      if (!g->corrupt_logged) {
        g->corrupt_logged = 1;
        kv_warn(G3_SUB, "slot %u of %s: %s: block dropped (further reports at debug level)",
                op->fslot, g->files[op->file].path, op->why ? op->why : "corrupt");
      } else {
        kv_debug(G3_SUB, "slot %u of %s: %s: block dropped", op->fslot, g->files[op->file].path,
                 op->why ? op->why : "corrupt");
      }
    }
    count_error(g, op->res, "read", op);
    /* Without memory for the delete the entry stays: a later read fails
     * the same way and tries again. */
    if (g->sstate[s] == G3S_STORED && enqueue_del(g, s, op->ns, op->key, op->keylen) == 0) {
      g->sstate[s] = G3S_DEAD;
      g->st.slots_stored--;
      g->st.stored_bytes -= g->slen[s];
      forget_held(g, s);
      g->st.dropped++;
    }
  }
  maybe_release(g, s);
}

static void done_del(kv_g3 *g, g3_op *op) {
  if (op->res) {
    /* The entry may still point here: keep the slot out of use. */
    count_error(g, op->res, "index delete", op);
    return;
  }
  g->sflag[op->slot] &= (uint8_t)~G3F_DELPEND;
  maybe_release(g, op->slot);
}

int kv_g3_poll(kv_g3 *g) {
  int n = 0;
  g3_op *list = g3_done_take(g);
  while (list) {
    g3_op *op = list;
    list = op->next;
    g->inflight--;
    switch (op->kind) {
    case G3_OP_WRITE: done_write(g, op); break;
    case G3_OP_READ: done_read(g, op); break;
    default: done_del(g, op); break;
    }
    kv_g3_cb cb = op->cb;
    void *arg = op->arg;
    int res = op->res;
    op_put(g, op);
    if (cb) {
      cb(res, arg);
      n++;
    }
  }
  return n;
}

int kv_g3_fd(const kv_g3 *g) { return g->efd; }

static void wait_fd(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (poll(&p, 1, -1) < 0 && errno == EINTR) {}
}

int kv_g3_drain(kv_g3 *g) {
  int n = 0;
  while (g->inflight) {
    wait_fd(g->efd);
    n += kv_g3_poll(g);
  }
  return n;
}

typedef struct sync_wait {
  int done, status;
} sync_wait;

static void sync_cb(int status, void *arg) {
  sync_wait *w = arg;
  w->status = status;
  w->done = 1;
}

static int wait_one(kv_g3 *g, sync_wait *w) {
  while (!w->done) {
    wait_fd(g->efd);
    kv_g3_poll(g);
  }
  return w->status;
}

int kv_g3_write_sync(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                     uint32_t len) {
  sync_wait w = {0, 0};
  int rc = kv_g3_write(g, slot, k, seq, buf, len, kv_g3_write_crc_none, sync_cb, &w);
  return rc ? rc : wait_one(g, &w);
}

int kv_g3_read_sync(kv_g3 *g, uint32_t slot, const kv_g3_expect *e, void *buf) {
  sync_wait w = {0, 0};
  int rc = kv_g3_read(g, slot, e, buf, sync_cb, &w);
  return rc ? rc : wait_one(g, &w);
}

/* ---- iteration, state, stats ----------------------------------------------------- */
typedef struct each_ctx {
  kv_g3 *g;
  int (*fn)(const kv_g3_entry *e, void *arg);
  void *arg;
} each_ctx;

static int each_one(const uint8_t *k, unsigned klen, const g3_ival *v, void *arg) {
  each_ctx *c = arg;
  kv_g3 *g = c->g;
  if (v->file >= g->nfiles || v->fslot >= g->files[v->file].sb.nslots) return 0;
  uint32_t slot = g->files[v->file].base + v->fslot;
  if (g->sstate[slot] != G3S_STORED) return 0;
  kv_g3_entry e;
  memset(&e, 0, sizeof e);
  memcpy(e.key.ns, k, KV_G3_NS_BYTES);
  e.key.len = (uint8_t)(klen - KV_G3_NS_BYTES);
  memcpy(e.key.b, k + KV_G3_NS_BYTES, e.key.len);
  e.slot = slot;
  e.file = v->file;
  e.offset = v->off;
  e.len = v->len;
  e.crc = v->crc;
  e.seq = v->seq;
  return c->fn(&e, c->arg);
}

int kv_g3_foreach(kv_g3 *g, int (*fn)(const kv_g3_entry *e, void *arg), void *arg) {
  each_ctx c = {g, fn, arg};
  return g3_idx_scan(&g->ix, each_one, &c);
}

kv_g3_state kv_g3_get_state(const kv_g3 *g) { return g->state; }

void kv_g3_resume(kv_g3 *g) {
  if (g->removed) return; /* nothing written now would survive a restart */
  g->state = KV_G3_OK;
  g->state_err = 0;
  g->state_what = "";
  g->probe_armed = 0;
}

int kv_g3_retry(kv_g3 *g) {
  if (g->state != KV_G3_FULL || g->probe_armed || g->probe_slot != UINT32_MAX) return 0;
  g->probe_armed = 1;
  g->st.probes++;
  return 1;
}

int kv_g3_writable(const kv_g3 *g) {
  return g->state == KV_G3_OK || (g->state == KV_G3_FULL && g->probe_armed);
}

/* Whether fd's file has been unlinked. */
static int unlinked(int fd) {
  struct stat st;
  return fd >= 0 && fstat(fd, &st) == 0 && st.st_nlink == 0;
}

kv_g3_state kv_g3_check(kv_g3 *g) {
  if (g->removed) return g->state;
  const char *gone = NULL;
  for (unsigned i = 0; i < g->nfiles && !gone; i++)
    if (unlinked(g->files[i].fd)) gone = g->files[i].path;
  int ifd = -1;
  if (!gone && g->ix.env && mdb_env_get_fd(g->ix.env, &ifd) == 0 && unlinked(ifd))
    gone = "the index";
  if (!gone) return g->state;
  g->removed = 1;
  g->state = KV_G3_DEGRADED;
  g->state_err = -ENOENT;
  g->state_what = "store file removed";
  g->probe_armed = 0;
  kv_error(G3_SUB,
           "%s was removed while in use (its directory deleted?): G3 admits no new "
           "blocks; what it holds stays readable until kvcached restarts, which makes a new "
           "store",
           gone);
  return g->state;
}

uint32_t kv_g3_slot_bytes(const kv_g3 *g) { return g->slot_bytes; }
uint32_t kv_g3_block_max(const kv_g3 *g) { return g->block_max; }
uint64_t kv_g3_max_seq(const kv_g3 *g) { return g->max_seq; }

int kv_g3_layout_of(uint64_t capacity, uint64_t block_bytes, uint32_t *slots,
                    uint64_t *file_bytes) {
  if (block_bytes == 0 || block_bytes > UINT32_MAX - KV_G3_ALIGN) return -EINVAL;
  g3_sb sb;
  int rc = g3_layout(capacity, round_up((uint32_t)block_bytes), &sb);
  if (rc) return rc;
  if (slots) *slots = sb.nslots;
  if (file_bytes) *file_bytes = sb.file_bytes;
  return 0;
}

void kv_g3_get_stats(const kv_g3 *g, kv_g3_stats *st) {
  *st = g->st;
  st->state = g->state;
  st->slots = g->nslots;
  st->slots_free = g->nfree;
  st->slots_retiring = g->nretiring;
  st->state_err = g->state_err;
  st->state_what = g->state_what ? g->state_what : "";
  st->capacity_bytes = (uint64_t)g->nslots * g->slot_bytes;
  st->index_txns = atomic_load(&((kv_g3 *)g)->a_txns);
  st->index_puts = atomic_load(&((kv_g3 *)g)->a_puts);
  st->index_dels = atomic_load(&((kv_g3 *)g)->a_dels);
  st->syncs = atomic_load(&((kv_g3 *)g)->a_syncs);
  st->inflight = g->inflight;
}

/* ---- open and close ---------------------------------------------------------------- */
static void destroy(kv_g3 *g) {
  g3_coders_stop(g);
  if (g->eng && g->eng_started) g->eng->stop(g);
  g3_pipe_stop(g);
  g3_idx_close(&g->ix);
  if (g->files)
    for (unsigned i = 0; i < g->nfiles; i++) g3_file_close(&g->files[i]);
  free(g->files);
  free(g->sstate);
  free(g->snread);
  free(g->sflag);
  free(g->slen);
  free(g->sstored);
  while (g->op_free) {
    g3_op *op = g->op_free;
    g->op_free = op->next;
    free(op->xbuf);
    free(op);
  }
  if (g->efd >= 0) close(g->efd);
  pthread_mutex_destroy(&g->cmu);
  pthread_cond_destroy(&g->ccv);
  pthread_mutex_destroy(&g->dmu);
  free(g);
}

void kv_g3_close(kv_g3 *g) {
  if (!g) return;
  kv_g3_drain(g);
  destroy(g);
}

/* Records why open failed (the first reason only) and returns rc. */
static int why(kv_g3_open_info *info, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int why(kv_g3_open_info *info, int rc, const char *fmt, ...) {
  if (info->why[0]) return rc;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(info->why, sizeof info->why, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof info->why)
    snprintf(info->why + n, sizeof info->why - (size_t)n, ": %s", kv_strerror(rc));
  return rc;
}

/* Renames f (damaged, or at another position of the store: `what` says
 * which) to <name>.corrupt-<unix time> and opens a fresh, empty file in its
 * place. Loud: the blocks it held are lost to the cache, and the renamed
 * file takes disk space until the operator removes it. */
static int set_aside(kv_g3 *g, g3_file *f, const char *dir, unsigned i, const kv_g3_opts *o,
                     const char *what, kv_g3_open_info *info) {
  char to[G3_PATH_MAX + 48];
  long long now = (long long)time(NULL);
  struct stat st;
  int n = snprintf(to, sizeof to, "%s.corrupt-%lld", f->path, now);
  for (int k = 1; n > 0 && (size_t)n < sizeof to && lstat(to, &st) == 0 && k < 100; k++)
    n = snprintf(to, sizeof to, "%s.corrupt-%lld-%d", f->path, now, k);
  if (n < 0 || (size_t)n >= sizeof to) return why(info, -ENAMETOOLONG, "setting %s aside", f->path);
  if (rename(f->path, to) < 0)
    return why(info, -errno, "%s: %s; setting it aside as %s", f->path, what, to);
  kv_error(G3_SUB,
           "%s: %s: set aside as %s; a fresh file takes its place and the blocks it "
           "held are lost to the cache (remove the set-aside file to reclaim its space)",
           f->path, what, to);
  info->set_aside++;
  g3_file_close(f);
  int rc = g3_file_open(f, dir, i, 1, o->direct, g->fault);
  if (rc) return why(info, rc, "creating %s", f->path);
  if ((rc = g3_file_lock(f, o->lock_wait_ms))) return why(info, rc, "locking %s", f->path);
  return 0;
}

/* Opens every file, keeps those that belong to the store, sets damaged
 * ones aside and (re)formats the rest. Sets store_id, slot_bytes, nslots
 * and each file's base. */
static int open_files(kv_g3 *g, const kv_g3_opts *o, kv_g3_open_info *info) {
  int rc = 0, sbrc[KV_G3_MAX_DIRS];
  int ref = -1;
  g->nfiles = o->ndirs;
  g->files = calloc(o->ndirs, sizeof *g->files);
  if (!g->files) return -ENOMEM;
  for (unsigned i = 0; i < o->ndirs; i++) g->files[i].fd = -1;
  g->direct = 1;
  for (unsigned i = 0; i < o->ndirs; i++) {
    g3_file *f = &g->files[i];
    if ((rc = g3_file_open(f, o->dirs[i].path, i, 1, o->direct, g->fault))) {
      kv_warn(G3_SUB, "cannot open the store file in %s: %s", o->dirs[i].path, strerror(-rc));
      return why(info, rc, "opening %s/kvg3-%u.dat", o->dirs[i].path, i);
    }
    if ((rc = g3_file_lock(f, o->lock_wait_ms))) return why(info, rc, "locking %s", f->path);
    sbrc[i] = o->reformat ? -ENOENT : g3_file_read_sb(f);
    if (sbrc[i] != 0 && sbrc[i] != -ENOENT && sbrc[i] != KV_ECORRUPT)
      return why(info, sbrc[i], "reading the superblock of %s", f->path);
    if (sbrc[i] == KV_ECORRUPT || (sbrc[i] == 0 && f->sb.file != i)) {
      char what[96];
      if (sbrc[i]) snprintf(what, sizeof what, "superblock damaged");
      else
        snprintf(what, sizeof what,
                 "holds file %u of its store, not file %u (directories "
                 "reordered?)",
                 f->sb.file, i);
      if ((rc = set_aside(g, f, o->dirs[i].path, i, o, what, info))) return rc;
      sbrc[i] = -ENOENT;
    }
    g->direct &= f->direct;
    if (sbrc[i] == 0 && ref < 0) ref = (int)i;
  }
  uint32_t want = o->slot_bytes == KV_G3_SLOT_KEEP ? 0
                 : o->slot_bytes                 ? round_up(o->slot_bytes)
                 : o->block_bytes                ? round_up(o->block_bytes)
                                                 : 0;
  if (ref < 0) {
    if (!want) {
      kv_warn(G3_SUB, "no store in %s and no block size given", o->dirs[0].path);
      return why(info, -EINVAL, "no store in %s and no block size given", o->dirs[0].path);
    }
    if (getrandom(g->store_id, sizeof g->store_id, GRND_NONBLOCK) != (ssize_t)sizeof g->store_id) {
      /* No entropy yet (early boot): time and pid are unique enough. */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t a = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, b = (uint64_t)getpid();
      memcpy(g->store_id, &a, 8);
      memcpy(g->store_id + 8, &b, 8);
    }
    g->slot_bytes = want;
  } else {
    memcpy(g->store_id, g->files[ref].sb.store_id, G3_STORE_ID_LEN);
    g->slot_bytes = g->files[ref].sb.slot_bytes;
    if (want && want != g->slot_bytes) {
      kv_warn(G3_SUB,
              "the store in %s has %u-byte slots but %u bytes were asked for: "
              "reformat to change the slot size",
              g->files[ref].path, g->slot_bytes, want);
      return why(info, -EINVAL, "the store in %s has %u-byte slots, not %u", g->files[ref].path,
                 g->slot_bytes, want);
    }
  }
  g->block_max = o->block_bytes > g->slot_bytes ? o->block_bytes : g->slot_bytes;
  uint64_t total = 0;
  for (unsigned i = 0; i < o->ndirs; i++) {
    g3_file *f = &g->files[i];
    int keep = sbrc[i] == 0 && !memcmp(f->sb.store_id, g->store_id, G3_STORE_ID_LEN) &&
               f->sb.slot_bytes == g->slot_bytes;
    if (keep) {
      struct stat st;
      if (fstat(f->fd, &st) < 0) return why(info, -errno, "fstat %s", f->path);
      if ((uint64_t)st.st_size < f->sb.file_bytes) {
        kv_warn(G3_SUB,
                "%s is shorter than its layout (%lld of %llu bytes): extending it; "
                "blocks that were beyond the end will fail verification",
                f->path, (long long)st.st_size, (unsigned long long)f->sb.file_bytes);
        if (fallocate(f->fd, 0, 0, (off_t)f->sb.file_bytes) < 0 &&
            ftruncate(f->fd, (off_t)f->sb.file_bytes) < 0)
          return why(info, -errno, "extending %s to %llu bytes", f->path,
                     (unsigned long long)f->sb.file_bytes);
      }
    } else {
      if (ref >= 0 && sbrc[i] == 0)
        kv_warn(G3_SUB, "%s: belongs to another store: formatting it afresh", f->path);
      g3_sb sb;
      if ((rc = g3_layout(o->dirs[i].capacity, g->slot_bytes, &sb))) {
        kv_warn(G3_SUB, "%s: capacity %llu bytes cannot hold one %u-byte slot", o->dirs[i].path,
                (unsigned long long)o->dirs[i].capacity, g->slot_bytes);
        return why(info, rc, "%s: capacity %llu bytes cannot hold one %u-byte slot",
                   o->dirs[i].path, (unsigned long long)o->dirs[i].capacity, g->slot_bytes);
      }
      sb.file = i;
      sb.nfiles = o->ndirs;
      memcpy(sb.store_id, g->store_id, G3_STORE_ID_LEN);
      sb.created = (uint64_t)time(NULL);
      if ((rc = g3_file_format(f, &sb))) {
        if (rc == -ENOSPC && f->fs_avail) {
          kv_warn(G3_SUB,
                  "formatting %s: %llu bytes do not fit, %llu bytes are free on its "
                  "filesystem",
                  f->path, (unsigned long long)sb.file_bytes, (unsigned long long)f->fs_avail);
          return why(info, rc, "preallocating %s (%llu bytes, %llu free on its filesystem)",
                     f->path, (unsigned long long)sb.file_bytes, (unsigned long long)f->fs_avail);
        }
        kv_warn(G3_SUB, "formatting %s (%llu bytes): %s", f->path,
                (unsigned long long)sb.file_bytes, strerror(-rc));
        return why(info, rc, "preallocating %s (%llu bytes)", f->path,
                   (unsigned long long)sb.file_bytes);
      }
    }
    f->base = (uint32_t)total;
    total += f->sb.nslots;
    if (total >= UINT32_MAX) return why(info, -E2BIG, "too many slots");
  }
  g->nslots = (uint32_t)total;
  return 0;
}

/* Opens the index; rebuilds it from the record headers when it is missing,
 * unreadable or belongs to other files. */
static int open_index(kv_g3 *g, const kv_g3_opts *o, kv_g3_open_info *info) {
  const char *dir = o->dirs[0].path;
  int nosync = o->sync == KV_G3_SYNC_NONE, rebuild = 0, fresh = 1, rc;
  for (unsigned i = 0; i < g->nfiles; i++) fresh &= g->files[i].formatted;
  rc = g3_idx_open(&g->ix, dir, g->nslots, nosync);
  if (rc == KV_ECORRUPT) {
    kv_warn(G3_SUB, "the index in %s is unreadable: rebuilding it from the record headers", dir);
    g3_idx_unlink(dir);
    rc = g3_idx_open(&g->ix, dir, g->nslots, nosync);
    rebuild = 1;
  }
  if (rc) return why(info, rc, "opening the index in %s", dir);
  if (fresh) {
    rc = g3_idx_replace(&g->ix, NULL, 0, g->store_id);
    return rc ? why(info, rc, "writing the index in %s", dir) : 0;
  }
  uint8_t id[G3_STORE_ID_LEN];
  rc = g3_idx_get_store_id(&g->ix, id);
  if (rc == -ENOENT || (rc == 0 && memcmp(id, g->store_id, sizeof id))) {
    if (!rebuild)
      kv_warn(G3_SUB, "the index in %s is %s: rebuilding it from the record headers", dir,
              rc ? "missing" : "of another store");
    rebuild = 1;
  } else if (rc) {
    return why(info, rc, "reading the index in %s", dir);
  }
  if (!rebuild) return 0;
  kv_g3_rebuild_info ri;
  rc = g3_rebuild_scan(g->files, g->nfiles, g->store_id, &g->ix, 0, &ri);
  if (rc) return why(info, rc, "rebuilding the index in %s", dir);
  kv_info(G3_SUB, "index rebuilt: %llu records in %llu slots, %llu indexed",
          (unsigned long long)ri.records, (unsigned long long)ri.scanned,
          (unsigned long long)ri.indexed);
  info->rebuilt = 1;
  return 0;
}

typedef struct load_ctx {
  kv_g3 *g;
  uint8_t *drop; /* keys to delete, G3_IKEY_MAX apart */
  uint8_t *dlen;
  size_t ndrop, capdrop;
  int err;
} load_ctx;

static int load_one(const uint8_t *k, unsigned klen, const g3_ival *v, void *arg) {
  load_ctx *c = arg;
  kv_g3 *g = c->g;
  const g3_file *f = v->file < g->nfiles ? &g->files[v->file] : NULL;
  int ok = f && !f->formatted && v->fslot < f->sb.nslots && v->len >= 1 &&
           (v->stored ? v->stored : v->len) <= g->slot_bytes && v->len <= KV_CODEC_LEN_MAX &&
           v->off == g3_data_pos(&f->sb, v->fslot) &&
           klen > KV_G3_NS_BYTES && klen <= G3_IKEY_MAX;
  if (ok) {
    uint32_t s = f->base + v->fslot;
    if (g->sstate[s] == G3S_FREE) {
      g->sstate[s] = G3S_STORED;
      g->slen[s] = v->len;
      g->sstored[s] = v->stored;
      count_held(g, s);
      g->st.slots_stored++;
      g->st.stored_bytes += v->len;
      if (v->seq > g->max_seq) g->max_seq = v->seq;
      return 0;
    }
  }
  if (klen > G3_IKEY_MAX) return 0; /* cannot be ours; leave it */
  if (c->ndrop == c->capdrop) {
    size_t n = c->capdrop ? c->capdrop * 2 : 64;
    uint8_t *d = realloc(c->drop, n * G3_IKEY_MAX), *l = realloc(c->dlen, n);
    if (d) c->drop = d;
    if (l) c->dlen = l;
    if (!d || !l) {
      c->err = -ENOMEM;
      return 1;
    }
    c->capdrop = n;
  }
  memcpy(c->drop + c->ndrop * G3_IKEY_MAX, k, klen);
  c->dlen[c->ndrop++] = (uint8_t)klen;
  return 0;
}

static int load_index(kv_g3 *g, kv_g3_open_info *info) {
  load_ctx c = {.g = g};
  int rc = g3_idx_scan(&g->ix, load_one, &c);
  if (rc == 1) rc = c.err;
  if (rc == 0 && c.ndrop) {
    kv_warn(G3_SUB, "dropping %zu index entries that do not fit the files", c.ndrop);
    rc = g3_idx_del_keys(&g->ix, c.drop, c.dlen, c.ndrop);
    info->dropped = c.ndrop;
  }
  free(c.drop);
  free(c.dlen);
  if (rc) return rc;
  for (unsigned i = 0; i < g->nfiles; i++) {
    g3_file *f = &g->files[i];
    f->freestk = malloc((size_t)f->sb.nslots * sizeof *f->freestk);
    if (!f->freestk) return -ENOMEM;
    for (uint32_t s = f->sb.nslots; s-- > 0;) /* pop order: ascending offsets */
      if (g->sstate[f->base + s] == G3S_FREE) f->freestk[f->nfree++] = s;
    g->nfree += f->nfree;
  }
  info->indexed = g->st.slots_stored;
  return 0;
}

static int start_engine(kv_g3 *g, const kv_g3_opts *o) {
  int rc;
  if (o->backend != KV_G3_BACKEND_THREADS) {
    g->eng = &g3_engine_uring;
    rc = g->eng->start(g, io_finished);
    if (rc == 0) {
      g->eng_started = 1;
      return 0;
    }
    if (o->backend == KV_G3_BACKEND_URING) {
      kv_warn(G3_SUB, "io_uring unavailable: %s", strerror(-rc));
      return rc;
    }
    kv_warn(G3_SUB, "io_uring unavailable (%s): using the thread-pool backend", strerror(-rc));
  }
  g->eng = &g3_engine_threads;
  if ((rc = g->eng->start(g, io_finished))) return rc;
  g->eng_started = 1;
  return 0;
}

int kv_g3_open(kv_g3 **out, const kv_g3_opts *o, kv_g3_open_info *info) {
  kv_g3_open_info dummy;
  if (!info) info = &dummy;
  memset(info, 0, sizeof *info);
  *out = NULL;
  if (!o || !o->dirs || o->ndirs == 0 || o->ndirs > KV_G3_MAX_DIRS ||
      o->block_bytes > UINT32_MAX - KV_G3_ALIGN || o->queue_depth > QD_MAX ||
      (o->slot_bytes != KV_G3_SLOT_KEEP &&
       (o->slot_bytes > UINT32_MAX - KV_G3_ALIGN ||
        (o->block_bytes && round_up(o->slot_bytes) > round_up(o->block_bytes)))) ||
      o->backend > KV_G3_BACKEND_THREADS || o->sync > KV_G3_SYNC_NONE ||
      o->direct > KV_G3_DIRECT_OFF)
    return -EINVAL;
  for (unsigned i = 0; i < o->ndirs; i++)
    if (!o->dirs[i].path) return -EINVAL;
  kv_g3 *g = calloc(1, sizeof *g);
  if (!g) return -ENOMEM;
  int rc;
  g->opts = *o;
  g->opts.dirs = NULL; /* the caller's; not kept */
  g->fault = o->fault;
  g->qd = o->queue_depth ? o->queue_depth : 32;
  g->efd = -1;
  g->probe_slot = UINT32_MAX;
  pthread_mutex_init(&g->cmu, NULL);
  pthread_condattr_t ca; /* the commit window is timed on the monotonic clock */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->ccv, &ca);
  pthread_condattr_destroy(&ca);
  g->window_us = o->commit_window_us == 0 ? 50000 : o->commit_window_us;
  pthread_mutex_init(&g->dmu, NULL);
  g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (g->efd < 0) {
    rc = -errno;
    goto err;
  }
  if ((rc = open_files(g, o, info))) goto err;
  g->sstate = calloc(g->nslots, 1);
  g->snread = calloc(g->nslots, 1);
  g->sflag = calloc(g->nslots, 1);
  g->slen = calloc(g->nslots, sizeof *g->slen);
  g->sstored = calloc(g->nslots, sizeof *g->sstored);
  if (!g->sstate || !g->snread || !g->sflag || !g->slen || !g->sstored) {
    rc = -ENOMEM;
    goto err;
  }
  if ((rc = open_index(g, o, info))) goto err;
  if ((rc = load_index(g, info))) goto err;
  if ((rc = start_engine(g, o))) {
    why(info, rc, "starting the %s engine",
        o->backend == KV_G3_BACKEND_THREADS ? "threads" : "io_uring");
    goto err;
  }
  if ((rc = g3_pipe_start(g))) goto err;
  if ((rc = g3_coders_start(g, o->codec_threads))) goto err;
  g->backend = g->eng->kind;
  for (unsigned i = 0; i < g->nfiles; i++) info->formatted |= g->files[i].formatted;
  info->slots = g->nslots;
  info->slot_bytes = g->slot_bytes;
  info->backend = g->backend;
  info->direct = g->direct;
  info->fixed_buffers = g->fixed;
  kv_info(G3_SUB,
          "open: %u files, %u slots of %u bytes, %llu blocks indexed, backend %s, "
          "%s I/O%s",
          g->nfiles, g->nslots, g->slot_bytes, (unsigned long long)info->indexed, g->eng->name,
          g->direct ? "direct" : "buffered", g->fixed ? ", G2 arena registered" : "");
  *out = g;
  return 0;
err:
  why(info, rc, "opening the store in %s", o->dirs[0].path);
  /* Leave the directories as they were: no half-made file or index. */
  for (unsigned i = 0; g->files && i < g->nfiles; i++)
    if (g->files[i].created) unlink(g->files[i].path);
  if (g->ix.env && g->ix.created) g3_idx_unlink(o->dirs[0].path);
  destroy(g);
  return rc;
}
