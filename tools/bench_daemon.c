/*
 * bench_daemon.c - kvbench subcommands that measure a running kvcached
 * through libkvclient, and the plain-memory reference they are read
 * against:
 *
 *   lookup  batched LOOKUPs of a resident prefix chain (keys/s), then
 *           single-key LOOKUP round trips (p50/p99 microseconds)
 *   load    LOAD a batch of resident G2 blocks, copy every byte of each
 *           out of the shared arena into the worker's own buffer with a
 *           verified read (kvc_read: the copy and its CRC check in one
 *           pass), RELEASE; GB/s of block bytes copied. --depth LOADs are
 *           kept in flight (the next batch is asked for while this one is
 *           copied), as a worker that prefetches would
 *   store   ALLOC a batch, copy every byte of each block in while
 *           checksumming it (kvc_copy_crc), COMMIT with the CRCs
 *           (kvc_submit_commit_crc: the daemon does not read the bytes);
 *           GB/s of block bytes committed. --depth ALLOCs are kept in
 *           flight and COMMITs are sent without waiting for them, as a
 *           worker that stores while it computes would (--depth 1: one
 *           ALLOC at a time)
 *   memcpy  the same copies as `load`, from a plain shared mapping of the
 *           same size, with no daemon: the ceiling `load` is compared to
 *   swapin  the copies of `load`, of blocks that are on the SSD only: a
 *           working set is stored, pushed down to G3 by as many blocks
 *           again as G2 holds (which are then deleted, so G2 has room),
 *           and each block is LOADed back once (read from G3 and verified
 *           by the daemon), copied out and RELEASEd; GB/s of block bytes.
 *           Needs a daemon with G3 whose admission takes every block
 *
 * --clients N runs N forked processes, each with its own connection (and
 * its own mapping of the arena), started together; rates are summed.
 * Every client first makes one untimed pass (faulting the mapping in), so
 * the timed part is the steady state. What a run needs is put in first
 * (blocks for lookup and load, under keys private to the run) and deleted
 * at the end. GB/s is 1e9 bytes per second.
 *
 * Each subcommand prints one JSON object on stdout (compact with --json)
 * and a summary line on stderr. Exit status: 0 done, 1 the benchmark
 * failed (no daemon, a block missing), 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/paths.h"
#include "base/size.h"
#include "client/kvclient.h"
#include "tools/kvbench.h"

#define AUTO_SET_BYTES  (512ull << 20) /* default working set of load/memcpy */
#define RTT_SAMPLES_MAX (1u << 20)
#define KEY_BYTES       16

typedef enum { B_LOOKUP, B_LOAD, B_STORE, B_MEMCPY, B_SWAPIN } bench_kind;
static const char *const bench_name[] = {"lookup", "load", "store", "memcpy", "swapin"};

typedef struct dopts {
  bench_kind kind;
  char socket[256];
  int have_socket;
  const char *tenant;
  uint32_t block_bytes;
  uint32_t clients;
  double seconds;
  uint32_t blocks; /* working set (load, memcpy); 0: auto */
  uint32_t batch;  /* blocks per LOAD / ALLOC request */
  uint32_t keys;   /* keys per batched LOOKUP */
  uint32_t depth;  /* load: LOAD requests in flight */
  int json;
} dopts;

/* What one client process reports, in shared memory. */
typedef struct cres {
  double elapsed; /* seconds of the timed part */
  uint64_t units; /* keys looked up, blocks copied */
  uint64_t bytes; /* block bytes moved */
  uint64_t requests;
  uint64_t bad; /* blocks whose bytes were not what was stored */
  int rc;       /* 0, or the error that stopped it */
  char err[160];
} cres;

/* --- shared with the other benchmarks of a running daemon (kvbench.h) ------------ */

int kvb_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int kvb_open(const char *socket, const char *tenant, uint32_t block_bytes,
             uint32_t tokens_per_block, kvc **out) {
  kvc_opts ko = {.socket_path = socket,
                 .tenant = tenant,
                 .layout = {.block_bytes = block_bytes,
                            .tokens_per_block = tokens_per_block,
                            .layers = 1,
                            .kv_heads = 1,
                            .head_dim = 1,
                            .tp_rank = 0,
                            .tp_size = 1,
                            .dtype = "u8"},
                 .timeout_ms = 30000};
  return kvc_open(&ko, out);
}

void kvb_say_open_error(const char *cmd, const char *socket, int rc) {
  const char *path = socket ? socket : getenv("KVCACHED_SOCKET");
  if (!path) path = KV_SOCKET_PATH;
  fprintf(stderr, "kvbench %s: cannot open a session on %s: %s%s\n", cmd, path, kvc_strerror(rc),
          rc == -ENOENT || rc == -ECONNREFUSED ? " (is kvcached running?)" : "");
}

int kvb_socket_opt(char *dst, size_t cap, int is_dir, const char *arg, const char *cmd) {
  if ((size_t)snprintf(dst, cap, is_dir ? "%s/kvcached.sock" : "%s", arg) < cap) return 0;
  fprintf(stderr, "kvbench %s: socket path too long\n", cmd);
  return -ENAMETOOLONG;
}

/* ---------------------------------------------------------------------------------- */

/* Keys private to one run: 8 bytes of run nonce, 4 of client (0xffffffff
 * for blocks the parent put in), 4 of index. */
static uint64_t run_nonce;

static kvc_key mkkey(uint32_t client, uint32_t i) {
  kvc_key k = {.len = KEY_BYTES};
  for (int b = 0; b < 8; b++) k.b[b] = (uint8_t)(run_nonce >> (8 * b));
  for (int b = 0; b < 4; b++) k.b[8 + b] = (uint8_t)(client >> (8 * b));
  for (int b = 0; b < 4; b++) k.b[12 + b] = (uint8_t)(i >> (8 * b));
  return k;
}
#define PARENT_CLIENT 0xffffffffu

/* The byte block i is filled with. */
static uint8_t fill_of(uint32_t i) { return (uint8_t)(0x5a ^ i ^ (i >> 8)); }

static int open_conn(const dopts *o, kvc **out) {
  return kvb_open(o->have_socket ? o->socket : NULL, o->tenant, o->block_bytes, 16, out);
}

static void say_open_error(const dopts *o, int rc) {
  kvb_say_open_error(bench_name[o->kind], o->have_socket ? o->socket : NULL, rc);
}

/* G2 bytes the daemon gives this tenant (its arena), from STATUS; 0 if
 * the status does not say. */
static uint64_t arena_capacity(kvc *c, const char *tenant) {
  char *text = NULL;
  if (kvc_status(c, &text)) return 0;
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  uint64_t cap = 0;
  json_t *g2 = json_object_get(o, "g2"), *ts = json_object_get(g2, "tenants"), *t;
  size_t i;
  json_array_foreach(ts, i, t) {
    const char *name = json_string_value(json_object_get(t, "tenant"));
    if (name && !strcmp(name, tenant))
      cap = (uint64_t)json_integer_value(json_object_get(t, "capacity_bytes"));
  }
  if (!cap && json_array_size(ts))
    cap = (uint64_t)json_integer_value(json_object_get(g2, "capacity_bytes")) / json_array_size(ts);
  json_decref(o);
  return cap;
}

/* STATUS's g3.<field>: -1 when the daemon has no G3 (or STATUS fails). */
static int64_t status_g3(kvc *c, const char *field) {
  char *text = NULL;
  if (kvc_status(c, &text)) return -1;
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  json_t *v = json_object_get(json_object_get(o, "g3"), field);
  int64_t r = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
  json_decref(o);
  return r;
}

/* Puts blocks [0, n) of the parent's keys in, `batch` per request, block i
 * filled with fill_of(i); as one chain when chain is set. A block refused
 * for want of room (-EAGAIN while victims are written to G3, or every slot
 * held) is asked for again, for at most 5 s. 0 or an error (printed). */
static int populate(const dopts *o, kvc *c, uint32_t n, int chain) {
  uint32_t batch = o->batch > KVC_BATCH_MAX ? KVC_BATCH_MAX : o->batch;
  kvc_key *keys = calloc(batch, sizeof *keys), *parents = calloc(batch, sizeof *parents);
  uint32_t *idx = calloc(batch, sizeof *idx);
  kvc_block *out = calloc(batch, sizeof *out);
  int32_t *st = calloc(batch, sizeof *st);
  uint32_t *crc = calloc(batch, sizeof *crc);
  int rc = keys && parents && idx && out && st && crc ? 0 : -ENOMEM;
  uint32_t at = 0, m = 0; /* blocks [at, at + m) are pending in keys[] */
  double stuck_since = 0;
  while (!rc && (at < n || m)) {
    while (m < batch && at < n) { /* top the batch up */
      idx[m] = at;
      keys[m] = mkkey(PARENT_CLIENT, at);
      memset(&parents[m], 0, sizeof parents[m]);
      if (chain && at > 0) parents[m] = mkkey(PARENT_CLIENT, at - 1);
      m++, at++;
    }
    int got = kvc_alloc(c, KVC_G2, 200, keys, parents, m, out);
    if (got < 0) {
      rc = got;
      break;
    }
    uint32_t left = 0, done = 0, why = 0;
    for (uint32_t i = 0; i < m; i++) {
      if (out[i].status == 0) {
        memset(out[i].ptr, fill_of(idx[i]), o->block_bytes);
        crc[i] = kvc_crc32c(0, out[i].ptr, o->block_bytes);
        continue;
      }
      if (out[i].status != -EAGAIN && out[i].status != KV_EALLPINNED) {
        rc = out[i].status;
        why = idx[i];
      }
    }
    /* Commit what was allocated (packed to the front), keep the rest. */
    for (uint32_t i = 0; i < m; i++) {
      if (out[i].status) continue;
      kvc_key k = keys[i];
      keys[i] = keys[done];
      keys[done] = k;
      kvc_key p = parents[i];
      parents[i] = parents[done];
      parents[done] = p;
      uint32_t x = idx[i];
      idx[i] = idx[done];
      idx[done] = x;
      kvc_block b = out[i];
      out[i] = out[done];
      out[done] = b;
      uint32_t cc = crc[i];
      crc[i] = crc[done];
      crc[done] = cc;
      done++;
    }
    if (done) {
      int ok = kvc_commit_crc(c, keys, crc, done, st);
      if (ok != (int)done && !rc) rc = ok < 0 ? ok : st[0] ? st[0] : -EIO;
    }
    if (rc) {
      fprintf(stderr, "kvbench %s: storing block %u of %u: %s\n", bench_name[o->kind], why, n,
              kvc_strerror(rc));
      break;
    }
    left = m - done;
    memmove(keys, keys + done, left * sizeof *keys);
    memmove(parents, parents + done, left * sizeof *parents);
    memmove(idx, idx + done, left * sizeof *idx);
    m = left;
    if (done) {
      stuck_since = 0;
    } else {
      double t = kv_now_s();
      if (stuck_since == 0) stuck_since = t;
      if (t - stuck_since > 5) {
        rc = out[0].status;
        fprintf(stderr, "kvbench %s: no room for block %u of %u for 5 s: %s\n", bench_name[o->kind],
                idx[0], n, kvc_strerror(rc));
        break;
      }
      usleep(1000);
    }
  }
  free(keys);
  free(parents);
  free(idx);
  free(out);
  free(st);
  free(crc);
  return rc;
}

/* Deletes blocks [first, first + n) of `client`'s keys (those evicted
 * already are simply not found). A block busy being written to G3 refuses
 * its DELETE (-EBUSY); what is still resident is asked again for up to
 * 5 s. */
static void delete_keys(kvc *c, uint32_t client, uint32_t first, uint32_t n) {
  static kvc_key keys[KVC_BATCH_MAX], left[KVC_BATCH_MAX];
  static uint8_t tiers[KVC_BATCH_MAX];
  for (uint32_t at = 0; at < n; at += KVC_BATCH_MAX) {
    uint32_t m = n - at < KVC_BATCH_MAX ? n - at : KVC_BATCH_MAX;
    for (uint32_t i = 0; i < m; i++) keys[i] = mkkey(client, first + at + i);
    if (kvc_delete(c, keys, m) < 0) return;
    double deadline = kv_now_s() + 5;
    while (kv_now_s() < deadline) {
      if (kvc_lookup(c, keys, m, tiers) < 0) return;
      uint32_t k = 0;
      for (uint32_t i = 0; i < m; i++)
        if (tiers[i] != KVC_TIER_NONE) left[k++] = keys[i];
      if (k == 0) break;
      usleep(20000);
      if (kvc_delete(c, left, k) < 0) return;
    }
  }
}

/* Waits until blocks [0, n) of the parent's are in G3 only (pushed out of
 * G2, their SSD writes done), for at most 60 s. 0 or an error (printed). */
static int wait_demoted(const dopts *o, kvc *c, uint32_t n) {
  kvc_key *keys = calloc(KVC_BATCH_MAX, sizeof *keys);
  uint8_t *tiers = malloc(KVC_BATCH_MAX);
  double deadline = kv_now_s() + 60;
  int rc = keys && tiers ? 0 : -ENOMEM;
  for (uint32_t at = 0; !rc && at < n;) {
    uint32_t m = n - at < KVC_BATCH_MAX ? n - at : KVC_BATCH_MAX, i = 0;
    for (uint32_t k = 0; k < m; k++) keys[k] = mkkey(PARENT_CLIENT, at + k);
    int h = kvc_lookup(c, keys, m, tiers);
    if (h < 0) {
      rc = h;
      fprintf(stderr, "kvbench %s: lookup: %s\n", bench_name[o->kind], kvc_strerror(rc));
      break;
    }
    while (i < m && tiers[i] == KVC_G3) i++;
    if (i == m) {
      at += m;
    } else if (tiers[i] == KVC_TIER_NONE) {
      rc = -ENOENT;
      fprintf(stderr,
              "kvbench %s: block %u left G2 without going to G3 (G3 full, refused by "
              "g3.admit, or larger than g3.block_bytes)\n",
              bench_name[o->kind], at + i);
    } else if (kv_now_s() > deadline) {
      rc = -ETIMEDOUT;
      fprintf(stderr, "kvbench %s: block %u is still in G2 after 60 s\n", bench_name[o->kind],
              at + i);
    } else {
      usleep(10000);
    }
  }
  free(keys);
  free(tiers);
  return rc;
}

/* --- the client processes -------------------------------------------------------- */

typedef struct runctx {
  const dopts *o;
  uint32_t nblocks;     /* working set (load, memcpy), resident keys (lookup) */
  uint32_t base;        /* load: the working set is the parent's blocks
                           [base, base + nblocks) */
  uint32_t filler;      /* swapin: blocks [nblocks, nblocks + filler) pushed
                           the working set down; deleted before the start */
  kvc *parent;          /* swapin: the parent's connection */
  int64_t g3_reads;     /* swapin: the daemon's G3 reads at the start */
  uint32_t warm_blocks; /* store: blocks written before the clock starts */
  uint8_t *src;         /* memcpy: the shared source */
  kvb_sync *sync;       /* in a client: its start barrier */
  cres *res;            /* one result per client, shared with the parent */
} runctx;

static void fail_res(cres *r, int rc, const char *what) {
  r->rc = rc ? rc : -EIO;
  snprintf(r->err, sizeof r->err, "%s: %s", what, kvc_strerror(r->rc));
}

/* Completions of c's requests in flight, at most n: their count, 0 when
 * none is ready yet (after waiting up to 30 s for the socket), or -1 with
 * r's error set. */
static int next_completions(kvc *c, kvc_completion *cp, int n, cres *r) {
  int k = kvc_poll(c, cp, n);
  if (k < 0) {
    fail_res(r, k, "poll");
    return -1;
  }
  if (k == 0) {
    struct pollfd pf = {kvc_fd(c), POLLIN, 0};
    if (poll(&pf, 1, 30000) <= 0) {
      fail_res(r, -ETIMEDOUT, "waiting for a reply");
      return -1;
    }
  }
  return k;
}

/* Tells the parent this client is ready (or failed), then waits for the
 * start; once per client. */
static void barrier(runctx *x) { kvb_sync_wait(x->sync); }

/* Copies block `len` bytes from src to dst and checks the fill byte at
 * both ends; returns 1 if they are not `want`. (`memcpy`: the reference.) */
static int copy_check(uint8_t *dst, const uint8_t *src, uint32_t len, uint8_t want) {
  memcpy(dst, src, len);
  return dst[0] != want || dst[len - 1] != want;
}

/* A worker's read of loaded block b: a verified copy into dst (kvc_read),
 * then the fill byte at both ends; returns 1 if either fails. */
static int read_check(kvc *c, const kvc_key *k, kvc_block *b, uint8_t *dst, uint32_t len,
                      uint8_t want) {
  if (b->length != len || kvc_read(c, k, b, dst) != 0) return 1;
  return dst[0] != want || dst[len - 1] != want;
}

/* One LOAD request's worth of blocks, in flight or being copied. */
typedef struct lslot {
  kvc_key keys[KVC_BATCH_MAX];
  kvc_block blk[KVC_BATCH_MAX];
  uint32_t first, m; /* blocks first .. first+m-1 (mod the working set) */
} lslot;

typedef struct lstats {
  uint64_t units, reqs, bad;
} lstats;

/* Pipelined loads: keeps o->depth LOADs of o->batch blocks in flight; as
 * each completes, copies every block out into dst, RELEASEs them (without
 * waiting) and asks for the next batch. Stops asking once `limit` blocks
 * were asked for (limit > 0) or at `deadline`, then drains. 0, or the
 * error (r->err says which step). */
static int load_run(runctx *x, kvc *c, lslot *sl, uint32_t *at, uint64_t limit, double deadline,
                    uint8_t *dst, lstats *st, cres *r) {
  const dopts *o = x->o;
  uint32_t n = x->nblocks, batch = o->batch < n ? o->batch : n;
  uint64_t asked = 0;
  int loads = 0, releases = 0, stop = 0;
  for (uint32_t d = 0; d < o->depth; d++) {
    lslot *s = &sl[d];
    s->first = *at;
    s->m = batch;
    for (uint32_t i = 0; i < batch; i++) s->keys[i] = mkkey(PARENT_CLIENT, x->base + (*at + i) % n);
    *at = (*at + batch) % n;
    int64_t id = kvc_submit_load(c, KVC_G2, s->keys, batch, s->blk, s);
    if (id < 0) {
      fail_res(r, (int)id, "load");
      return r->rc;
    }
    loads++;
    asked += batch;
  }
  while (loads || releases) {
    kvc_completion cp[16];
    int k = next_completions(c, cp, 16, r);
    if (k < 0) return r->rc;
    if (k == 0) continue;
    for (int j = 0; j < k; j++) {
      if (cp[j].op == KVC_OP_RELEASE) {
        releases--;
        if (cp[j].result != (int)(uintptr_t)cp[j].user) {
          fail_res(r, cp[j].result, "release");
          return r->rc;
        }
        continue;
      }
      lslot *s = cp[j].user;
      loads--;
      if (cp[j].result != (int)s->m) {
        int why = cp[j].result < 0 ? cp[j].result : 0;
        for (uint32_t i = 0; i < s->m && !why; i++) why = s->blk[i].status;
        fail_res(r, why, "load");
        return r->rc;
      }
      for (uint32_t i = 0; i < s->m; i++)
        st->bad += (uint64_t)read_check(c, &s->keys[i], &s->blk[i], dst, o->block_bytes,
                                        fill_of(x->base + (s->first + i) % n));
      st->units += s->m;
      int64_t id = kvc_submit_release(c, s->keys, s->m, NULL, (void *)(uintptr_t)s->m);
      if (id < 0) {
        fail_res(r, (int)id, "release");
        return r->rc;
      }
      releases++;
      st->reqs += 2;
      if (!stop) stop = limit ? asked >= limit : kv_now_s() >= deadline;
      if (stop) continue;
      s->first = *at;
      for (uint32_t i = 0; i < s->m; i++)
        s->keys[i] = mkkey(PARENT_CLIENT, x->base + (*at + i) % n);
      *at = (*at + s->m) % n;
      id = kvc_submit_load(c, KVC_G2, s->keys, s->m, s->blk, s);
      if (id < 0) {
        fail_res(r, (int)id, "load");
        return r->rc;
      }
      loads++;
      asked += s->m;
    }
  }
  return 0;
}

/* `load` (plain == 0) and its reference `memcpy` (plain == 1). */
/* `load`, its reference `memcpy`, and `swapin`: the blocks of `load` read
 * back from G3, one timed pass over this client's share of them, after an
 * untimed pass over the filler that is still in G2 (it faults the mapping
 * in; the parent deletes the filler before the start). */
static void client_load(runctx *x, uint32_t id, cres *r, bench_kind kind) {
  const dopts *o = x->o;
  int plain = kind == B_MEMCPY, swap = kind == B_SWAPIN;
  uint32_t n = x->nblocks;
  kvc *c = NULL;
  lslot *sl = plain ? NULL : calloc(o->depth, sizeof *sl);
  uint8_t *dst = aligned_alloc(4096, (o->block_bytes + 4095) / 4096 * 4096);
  int rc = dst && (plain || sl) ? 0 : -ENOMEM;
  if (rc) fail_res(r, rc, "buffers");
  else if (!plain && (rc = open_conn(o, &c))) fail_res(r, rc, "open");
  uint32_t at = (uint32_t)((uint64_t)n * id / o->clients); /* clients start apart */
  if (swap) {
    x->base = n;
    x->nblocks = x->filler;
    at = 0;
  }
  /* One pass untimed (it faults the mapping in), then the clock. */
  for (int timed = 0; timed < 2 && !r->rc; timed++) {
    lstats st = {0, 0, 0};
    double t0 = 0, deadline = 0;
    if (timed && swap) { /* this client's share of the working set, once */
      x->nblocks = n / o->clients;
      x->base = x->nblocks * id;
      at = 0;
    }
    if (timed) {
      barrier(x);
      t0 = kv_now_s();
      deadline = t0 + o->seconds;
    }
    if (plain) {
      for (uint64_t passed = 0; timed ? kv_now_s() < deadline : passed < n; passed += 32) {
        for (uint32_t i = 0; i < 32; i++, at = (at + 1) % n)
          st.bad += (uint64_t)copy_check(dst, x->src + (size_t)at * o->block_bytes, o->block_bytes,
                                         fill_of(at));
        st.units += 32;
      }
    } else {
      load_run(x, c, sl, &at, swap ? x->nblocks : timed ? 0 : n, deadline, dst, &st, r);
    }
    if (timed) {
      r->elapsed = kv_now_s() - t0;
      r->units = st.units;
      r->bytes = st.units * o->block_bytes;
      r->requests = st.reqs;
      r->bad = st.bad;
    }
  }
  barrier(x); /* a client that failed early still lets the others start */
  kvc_close(c);
  free(sl);
  free(dst);
}

/* One ALLOC request's worth of blocks: the keys asked for, the slots given
 * and the CRCs of what was copied into them. */
typedef struct sslot {
  kvc_key keys[KVC_BATCH_MAX];
  kvc_block blk[KVC_BATCH_MAX];
  uint32_t crc[KVC_BATCH_MAX];
} sslot;

typedef struct sstats {
  uint64_t units, reqs;
} sstats;

static int64_t ask_alloc(runctx *x, kvc *c, sslot *s, uint32_t id, uint32_t *next) {
  for (uint32_t i = 0; i < x->o->batch; i++) s->keys[i] = mkkey(id, *next + i);
  *next += x->o->batch;
  return kvc_submit_alloc(c, KVC_G2, 128, s->keys, NULL, x->o->batch, s->blk, s);
}

/* Pipelined stores: keeps o->depth ALLOCs of o->batch new keys in flight;
 * as each completes, fills its slots (kvc_copy_crc), sends their COMMIT
 * with the CRCs without waiting for it, and asks for the next batch. A
 * batch refused whole (no room yet: other clients' uncommitted blocks hold
 * the slots, or victims are still being written to G3) is asked again for
 * up to 5 s. Stops asking once `limit` blocks were asked for (limit > 0)
 * or at `deadline`, then drains. 0, or the error (r->err says which). */
static int store_run(runctx *x, kvc *c, sslot *sl, uint32_t id, uint32_t *next, uint64_t limit,
                     double deadline, const uint8_t *src, sstats *st, cres *r) {
  const dopts *o = x->o;
  uint64_t asked = 0;
  int allocs = 0, commits = 0, stop = 0;
  double refused_since = 0;
  for (uint32_t d = 0; d < o->depth; d++) {
    int64_t rid = ask_alloc(x, c, &sl[d], id, next);
    if (rid < 0) {
      fail_res(r, (int)rid, "alloc");
      return r->rc;
    }
    allocs++;
    asked += o->batch;
  }
  while (allocs || commits) {
    kvc_completion cp[16];
    int k = next_completions(c, cp, 16, r);
    if (k < 0) return r->rc;
    if (k == 0) continue;
    for (int j = 0; j < k; j++) {
      if (cp[j].op == KVC_OP_COMMIT) {
        commits--;
        if (cp[j].result < 0) {
          fail_res(r, cp[j].result, "commit");
          return r->rc;
        }
        st->units += (uint64_t)cp[j].result;
        continue;
      }
      sslot *s = cp[j].user;
      allocs--;
      if (cp[j].result < 0) {
        fail_res(r, cp[j].result, "alloc");
        return r->rc;
      }
      uint32_t m = 0;
      for (uint32_t i = 0; i < o->batch; i++) {
        if (s->blk[i].status) continue; /* no room even after eviction: counted as not stored */
        s->crc[m] = kvc_copy_crc(s->blk[i].ptr, src, o->block_bytes);
        s->keys[m++] = s->keys[i];
      }
      st->reqs++;
      if (m) { /* the keys and CRCs are copied into the request: s is free again */
        refused_since = 0;
        int64_t rid = kvc_submit_commit_crc(c, s->keys, s->crc, m, NULL, NULL);
        if (rid < 0) {
          fail_res(r, (int)rid, "commit");
          return r->rc;
        }
        commits++;
        st->reqs++;
      } else {
        double t = kv_now_s();
        if (refused_since == 0) refused_since = t;
        if (t - refused_since > 5) {
          fail_res(r, s->blk[0].status, "alloc (every block refused for 5 s)");
          return r->rc;
        }
        usleep(100);
      }
      if (!stop) stop = limit ? asked >= limit : kv_now_s() >= deadline;
      if (stop) continue;
      int64_t rid = ask_alloc(x, c, s, id, next);
      if (rid < 0) {
        fail_res(r, (int)rid, "alloc");
        return r->rc;
      }
      allocs++;
      asked += o->batch;
    }
  }
  return 0;
}

static void client_store(runctx *x, uint32_t id, cres *r) {
  const dopts *o = x->o;
  kvc *c = NULL;
  sslot *sl = calloc(o->depth, sizeof *sl);
  uint8_t *src = aligned_alloc(4096, (o->block_bytes + 4095) / 4096 * 4096);
  int rc = sl && src ? 0 : -ENOMEM;
  if (rc) fail_res(r, rc, "buffers");
  else if ((rc = open_conn(o, &c))) fail_res(r, rc, "open");
  else memset(src, 0xa5, o->block_bytes);
  uint32_t next = 0; /* this client's next key index */
  /* One pass untimed (it faults the mapping in), then the clock. */
  for (int timed = 0; timed < 2 && !r->rc; timed++) {
    sstats st = {0, 0};
    double t0 = 0, deadline = 0;
    if (timed) {
      barrier(x);
      t0 = kv_now_s();
      deadline = t0 + o->seconds;
    }
    store_run(x, c, sl, id, &next, timed ? 0 : x->warm_blocks, deadline, src, &st, r);
    if (timed) {
      r->elapsed = kv_now_s() - t0;
      r->units = st.units;
      r->bytes = st.units * o->block_bytes;
      r->requests = st.reqs;
    }
  }
  barrier(x); /* a client that failed early still lets the others start */
  if (c) delete_keys(c, id, 0, next);
  kvc_close(c);
  free(sl);
  free(src);
}

static void client_lookup(runctx *x, uint32_t id, cres *r) {
  const dopts *o = x->o;
  uint32_t n = o->keys;
  kvc *c = NULL;
  kvc_key *keys = calloc(n, sizeof *keys);
  uint8_t *tiers = malloc(n);
  if (!keys || !tiers) {
    fail_res(r, -ENOMEM, "buffers");
    barrier(x);
    return;
  }
  for (uint32_t i = 0; i < n; i++) keys[i] = mkkey(PARENT_CLIENT, i);
  int rc = open_conn(o, &c);
  if (rc) {
    fail_res(r, rc, "open");
    barrier(x);
    return;
  }
  int hit = kvc_lookup(c, keys, n, tiers); /* untimed, and checked */
  if (hit != (int)x->nblocks) {
    fail_res(r, hit < 0 ? hit : -EIO, "lookup (resident prefix not as stored)");
    barrier(x);
  } else {
    barrier(x);
    double t0 = kv_now_s(), deadline = t0 + o->seconds / 2;
    uint64_t units = 0, reqs = 0;
    do {
      hit = kvc_lookup(c, keys, n, tiers);
      if (hit < 0) {
        fail_res(r, hit, "lookup");
        break;
      }
      units += n;
      reqs++;
    } while (kv_now_s() < deadline);
    r->elapsed = kv_now_s() - t0;
    r->units = units;
    r->requests = reqs;
  }
  kvc_close(c);
  free(keys);
  free(tiers);
}

static int client_run(void *arg, uint32_t i, kvb_sync *sync) {
  runctx *x = arg;
  cres *r = &x->res[i];
  x->sync = sync;
  switch (x->o->kind) {
  case B_LOAD:
  case B_MEMCPY:
  case B_SWAPIN: client_load(x, i, r, x->o->kind); break;
  case B_STORE: client_store(x, i, r); break;
  case B_LOOKUP: client_lookup(x, i, r); break;
  }
  return r->rc ? 1 : 0;
}

/* swapin: the filler goes, so G2 has room for the working set to come back. */
static void clients_ready(void *arg) {
  runctx *x = arg;
  if (x->o->kind != B_SWAPIN) return;
  delete_keys(x->parent, PARENT_CLIENT, x->nblocks, x->filler);
  x->g3_reads = status_g3(x->parent, "reads");
}

static const char *client_err(void *arg, uint32_t i) {
  runctx *x = arg;
  return x->res[i].rc ? x->res[i].err : NULL;
}

/* Forks o->clients clients, starts them together, waits for them all.
 * 0, or -1 when one failed (its message printed). */
static int run_clients(runctx *x, cres *res) {
  static const kvb_clients_ops ops = {client_run, clients_ready, client_err};
  char cmd[64];
  snprintf(cmd, sizeof cmd, "kvbench %s", bench_name[x->o->kind]);
  x->res = res;
  return kvb_run_clients(cmd, x->o->clients, &ops, x, NULL);
}

/* --- the subcommands --------------------------------------------------------------- */

/* Single-key LOOKUP round trips on one connection, for `seconds` (at
 * least 1000 samples). Fills p50/p99 in microseconds. 0 or an error. */
static int measure_rtt(const dopts *o, kvc *c, uint32_t nres, double seconds, double *p50,
                       double *p99, uint64_t *count) {
  uint64_t *s = malloc(RTT_SAMPLES_MAX * sizeof *s);
  if (!s) return -ENOMEM;
  uint32_t n = 0;
  double deadline = kv_now_s() + seconds;
  int rc = 0;
  uint32_t mod = nres ? nres : 1;
  for (uint32_t i = 0; i < 1000; i++) { /* warm-up */
    kvc_key k = mkkey(PARENT_CLIENT, i % mod);
    if ((rc = kvc_lookup(c, &k, 1, NULL)) < 0) break;
  }
  while (rc >= 0 && n < RTT_SAMPLES_MAX && (n < 1000 || kv_now_s() < deadline)) {
    kvc_key k = mkkey(PARENT_CLIENT, n % mod);
    uint64_t t0 = kv_now_ns();
    rc = kvc_lookup(c, &k, 1, NULL);
    s[n++] = kv_now_ns() - t0;
  }
  if (rc < 0) {
    free(s);
    return rc;
  }
  qsort(s, n, sizeof *s, kvb_cmp_u64);
  *p50 = (double)s[n / 2] / 1e3;
  *p99 = (double)s[(uint64_t)n * 99 / 100] / 1e3;
  *count = n;
  free(s);
  return 0;
}

static void usage(FILE *f, bench_kind k) {
  fprintf(f,
          "usage: kvbench %s [--socket-dir DIR | --socket PATH] [--json] [--block-bytes B]\n"
          "           [--clients N] [--seconds S] [--blocks N] [--batch N] [--keys N]\n"
          "           [--depth D] [--tenant T]\n"
          "  lookup  batched LOOKUPs of --keys keys (default 1024) of a resident chain: keys/s;\n"
          "          then single-key LOOKUP round trips: p50/p99 microseconds\n"
          "  load    LOAD --batch blocks (default 32), copy every byte out, RELEASE: GB/s;\n"
          "          --depth LOADs in flight (default 2)\n"
          "  store   ALLOC --batch blocks, copy every byte in, COMMIT: GB/s;\n"
          "          --depth ALLOCs in flight (default 2), COMMITs not waited for\n"
          "  memcpy  the copies of `load` from plain shared memory, no daemon: GB/s\n"
          "  swapin  the copies of `load`, once each, of blocks pushed down to G3 first\n"
          "          (the daemon needs G3, admitting every block): GB/s\n"
          "  --block-bytes B  block size, K/M suffixes (default 256K)\n"
          "  --clients N      client processes, each with its own connection (default 1)\n"
          "  --seconds S      timed part of the run (default 2; lookup: half each phase)\n"
          "  --blocks N       working set of load/memcpy/swapin (default: 512 MiB, at most\n"
          "                   half the tenant's G2 arena, and for swapin half of G3)\n"
          "  --tenant T       tenant of the benchmark's namespace (default \"kvbench\")\n"
          "  --socket-dir DIR, --socket PATH   the daemon (default: $KVCACHED_SOCKET, else\n"
          "                   /run/kvcached/kvcached.sock)\n",
          bench_name[k]);
}

static int parse_opts(dopts *o, int argc, char **argv) {
  static const struct option lo[] = {{"socket-dir", required_argument, 0, 'd'},
                                     {"socket", required_argument, 0, 's'},
                                     {"json", no_argument, 0, 'j'},
                                     {"block-bytes", required_argument, 0, 'b'},
                                     {"clients", required_argument, 0, 'c'},
                                     {"seconds", required_argument, 0, 't'},
                                     {"blocks", required_argument, 0, 'n'},
                                     {"batch", required_argument, 0, 'B'},
                                     {"keys", required_argument, 0, 'k'},
                                     {"tenant", required_argument, 0, 'T'},
                                     {"depth", required_argument, 0, 'D'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  o->tenant = "kvbench";
  o->block_bytes = 256u << 10;
  o->clients = 1;
  o->seconds = 2;
  o->batch = 32;
  o->keys = 1024;
  o->depth = 2;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "d:s:jb:c:t:n:B:k:T:D:h", lo, NULL)) != -1) {
    uint64_t v = 0;
    char *end;
    switch (ch) {
    case 'd':
    case 's':
      if (kvb_socket_opt(o->socket, sizeof o->socket, ch == 'd', optarg, bench_name[o->kind]))
        return 2;
      o->have_socket = 1;
      break;
    case 'j': o->json = 1; break;
    case 'T': o->tenant = optarg; break;
    case 't':
      errno = 0;
      o->seconds = strtod(optarg, &end);
      if (errno || *end || !(o->seconds > 0 && o->seconds <= 3600)) {
        fprintf(stderr, "kvbench %s: bad --seconds '%s'\n", bench_name[o->kind], optarg);
        return 2;
      }
      break;
    case 'b':
    case 'c':
    case 'n':
    case 'B':
    case 'k':
    case 'D':
      if (kv_parse_size(optarg, &v) || v == 0 || v > UINT32_MAX ||
          (ch == 'c' && v > KVB_MAX_CLIENTS) || ((ch == 'B' || ch == 'k') && v > KVC_BATCH_MAX) ||
          (ch == 'D' && v > 16)) {
        fprintf(stderr, "kvbench %s: bad value '%s' for %s\n", bench_name[o->kind], optarg,
                argv[optind - 1]);
        return 2;
      }
      if (ch == 'b') o->block_bytes = (uint32_t)v;
      else if (ch == 'c') o->clients = (uint32_t)v;
      else if (ch == 'n') o->blocks = (uint32_t)v;
      else if (ch == 'B') o->batch = (uint32_t)v;
      else if (ch == 'D') o->depth = (uint32_t)v;
      else o->keys = (uint32_t)v;
      break;
    case 'h': usage(stdout, o->kind); exit(0);
    default: usage(stderr, o->kind); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kvbench %s: unexpected argument '%s'\n", bench_name[o->kind], argv[optind]);
    return 2;
  }
  return 0;
}

static void print_json(json_t *j, int compact) {
  char *s =
      j ? json_dumps(j, (compact ? JSON_COMPACT : JSON_INDENT(2)) | JSON_REAL_PRECISION(6)) : NULL;
  if (s) puts(s);
  free(s);
  json_decref(j);
}

static int bench_main(bench_kind kind, int argc, char **argv) {
  dopts o;
  memset(&o, 0, sizeof o);
  o.kind = kind;
  int rc = parse_opts(&o, argc, argv);
  if (rc) return rc;
  run_nonce = kv_now_ns() ^ ((uint64_t)getpid() << 32);
  cres *res = mmap(NULL, KVB_MAX_CLIENTS * sizeof *res, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (res == MAP_FAILED) {
    perror("kvbench: mmap");
    return 1;
  }
  memset(res, 0, KVB_MAX_CLIENTS * sizeof *res);
  runctx x = {.o = &o};
  kvc *c = NULL;
  uint64_t cap = 0;
  uint32_t populated = 0;
  int status = 1;

  if (kind != B_MEMCPY) {
    if ((rc = open_conn(&o, &c))) {
      say_open_error(&o, rc);
      goto out;
    }
    cap = arena_capacity(c, o.tenant);
  }
  /* What the run needs, sized to the arena. */
  uint64_t fit = cap ? cap / 2 / o.block_bytes : UINT32_MAX;
  if (kind == B_LOAD || kind == B_MEMCPY) {
    uint64_t want = o.blocks ? o.blocks : AUTO_SET_BYTES / o.block_bytes;
    if (!o.blocks && want > fit) want = fit;
    if (want == 0) want = 1;
    if (kind == B_LOAD && want > fit) {
      fprintf(stderr,
              "kvbench load: %llu blocks of %u bytes do not fit half of the %llu-byte "
              "G2 arena\n",
              (unsigned long long)want, o.block_bytes, (unsigned long long)cap);
      goto out;
    }
    x.nblocks = (uint32_t)want;
  } else if (kind == B_LOOKUP) {
    x.nblocks = fit < o.keys ? (uint32_t)fit : o.keys;
  } else if (kind == B_SWAPIN) {
    int64_t g3cap = status_g3(c, "capacity_bytes");
    if (g3cap < 0) {
      fprintf(stderr, "kvbench swapin: the daemon has no G3 tier (start it with --g3-path DIR)\n");
      goto out;
    }
    uint64_t g3fit = (uint64_t)g3cap / 2 / o.block_bytes;
    uint64_t want = o.blocks ? o.blocks : AUTO_SET_BYTES / o.block_bytes;
    if (!o.blocks && want > fit) want = fit;
    if (!o.blocks && want > g3fit) want = g3fit;
    if (want > fit || want > g3fit) {
      fprintf(stderr,
              "kvbench swapin: %llu blocks of %u bytes do not fit half of the G2 arena "
              "(%llu bytes) and half of G3 (%lld bytes)\n",
              (unsigned long long)want, o.block_bytes, (unsigned long long)cap, (long long)g3cap);
      goto out;
    }
    /* Each client's share: whole batches, at least --depth of them. */
    uint32_t share = (uint32_t)want / o.clients;
    if (o.batch * o.depth > share) o.batch = share / o.depth;
    if (o.batch == 0) {
      fprintf(stderr, "kvbench swapin: %llu blocks are too few for %u clients at depth %u\n",
              (unsigned long long)want, o.clients, o.depth);
      goto out;
    }
    x.nblocks = (share - share % o.batch) * o.clients;
    x.filler = (uint32_t)(cap / o.block_bytes);
  } else {
    uint64_t w = cap ? cap / o.block_bytes : 1024;
    x.warm_blocks = (uint32_t)(w > 65536 ? 65536 : w);
    /* Uncommitted blocks cannot be evicted: all clients' batches in flight
     * together must fit half the arena. */
    uint64_t per = fit / ((uint64_t)o.clients * o.depth);
    if (per < o.batch) o.batch = per ? (uint32_t)per : 1;
  }
  if (kind == B_LOAD || kind == B_LOOKUP) {
    if ((rc = populate(&o, c, x.nblocks, kind == B_LOOKUP))) goto out;
    populated = x.nblocks;
  }
  if (kind == B_SWAPIN) { /* the working set, then the filler that pushes it to G3 */
    rc = populate(&o, c, x.nblocks + x.filler, 0);
    populated = x.nblocks + x.filler;
    if (rc || wait_demoted(&o, c, x.nblocks)) goto out;
    x.parent = c;
  }
  if (kind == B_MEMCPY) {
    size_t bytes = (size_t)x.nblocks * o.block_bytes;
    x.src = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (x.src == MAP_FAILED) {
      perror("kvbench memcpy: mmap");
      x.src = NULL;
      goto out;
    }
    for (uint32_t i = 0; i < x.nblocks; i++)
      memset(x.src + (size_t)i * o.block_bytes, fill_of(i), o.block_bytes);
  }
  /* Clients get connections of their own (swapin's parent keeps its own,
   * to delete the filler at the start). */
  if (kind != B_SWAPIN) {
    kvc_close(c);
    c = NULL;
  }
  if (run_clients(&x, res)) goto out;

  double rate = 0, bytes_rate = 0, req_rate = 0;
  uint64_t bad = 0;
  for (uint32_t i = 0; i < o.clients; i++) {
    if (res[i].elapsed <= 0) continue;
    rate += (double)res[i].units / res[i].elapsed;
    bytes_rate += (double)res[i].bytes / res[i].elapsed;
    req_rate += (double)res[i].requests / res[i].elapsed;
    bad += res[i].bad;
  }
  json_t *j = json_pack("{s:s,s:i,s:i,s:f}", "bench", bench_name[kind], "block_bytes",
                        (int)o.block_bytes, "clients", (int)o.clients, "seconds", o.seconds);
  if (kind == B_LOOKUP) {
    double p50 = 0, p99 = 0;
    uint64_t samples = 0;
    if ((rc = open_conn(&o, &c))) {
      say_open_error(&o, rc);
      json_decref(j);
      goto out;
    }
    if ((rc = measure_rtt(&o, c, x.nblocks, o.seconds / 2, &p50, &p99, &samples))) {
      fprintf(stderr, "kvbench lookup: single-key lookups: %s\n", kvc_strerror(rc));
      json_decref(j);
      goto out;
    }
    json_object_set_new(j, "batch_keys", json_integer(o.keys));
    json_object_set_new(j, "resident", json_integer(x.nblocks));
    json_object_set_new(j, "keys_per_s", json_real(rate));
    json_object_set_new(j, "lookups_per_s", json_real(req_rate));
    json_object_set_new(j, "rtt_p50_us", json_real(p50));
    json_object_set_new(j, "rtt_p99_us", json_real(p99));
    json_object_set_new(j, "rtt_samples", json_integer((json_int_t)samples));
    fprintf(stderr,
            "lookup: %.3g keys/s in batches of %u (%u clients); single-key round trip "
            "p50 %.1f us, p99 %.1f us (%llu samples)\n",
            rate, o.keys, o.clients, p50, p99, (unsigned long long)samples);
  } else {
    double gbps = bytes_rate / 1e9;
    if (kind != B_STORE) json_object_set_new(j, "blocks", json_integer(x.nblocks));
    json_object_set_new(j, "batch", json_integer(kind == B_MEMCPY ? 1 : o.batch));
    json_object_set_new(j, "gbps", json_real(gbps));
    json_object_set_new(j, "blocks_per_s", json_real(rate));
    if (kind != B_MEMCPY) json_object_set_new(j, "requests_per_s", json_real(req_rate));
    if (kind != B_STORE) json_object_set_new(j, "bad_blocks", json_integer((json_int_t)bad));
    if (kind == B_SWAPIN) {
      int64_t reads = status_g3(c, "reads");
      json_object_set_new(
          j, "g3_reads",
          json_integer(reads >= 0 && x.g3_reads >= 0 ? (json_int_t)(reads - x.g3_reads) : -1));
    }
    fprintf(stderr, "%s: %.3f GB/s, %.0f blocks/s of %u bytes (%u clients", bench_name[kind], gbps,
            rate, o.block_bytes, o.clients);
    if (kind != B_STORE) fprintf(stderr, ", working set %u blocks", x.nblocks);
    fprintf(stderr, ")\n");
    if (bad) {
      fprintf(stderr, "kvbench %s: %llu blocks read back wrong bytes\n", bench_name[kind],
              (unsigned long long)bad);
      print_json(j, o.json);
      goto out;
    }
  }
  print_json(j, o.json);
  status = 0;
out:
  if (populated) {
    if (!c && open_conn(&o, &c)) c = NULL;
    if (c) delete_keys(c, PARENT_CLIENT, 0, populated);
  }
  kvc_close(c);
  if (x.src) munmap(x.src, (size_t)x.nblocks * o.block_bytes);
  munmap(res, KVB_MAX_CLIENTS * sizeof *res);
  return status;
}

int kvbench_lookup(int argc, char **argv) { return bench_main(B_LOOKUP, argc, argv); }
int kvbench_load(int argc, char **argv) { return bench_main(B_LOAD, argc, argv); }
int kvbench_store(int argc, char **argv) { return bench_main(B_STORE, argc, argv); }
int kvbench_memcpy(int argc, char **argv) { return bench_main(B_MEMCPY, argc, argv); }
int kvbench_swapin(int argc, char **argv) { return bench_main(B_SWAPIN, argc, argv); }
