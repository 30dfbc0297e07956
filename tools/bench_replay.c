/*
 * bench_replay.c - `kvbench replay`: a Mooncake-format trace replayed
 * through a running kvcached by N worker processes, as inference engines
 * sharing one cache would use it.
 *
 * Each request of the trace goes to one client process (round-robin on
 * its index, or a stable hash of it: --deal), at its timestamp scaled by
 * --time-scale (0: as fast as the clients go). Every process has its own
 * connection; all use one namespace, so they share blocks. Per request:
 *
 *   keys     the kvc_chain_hash chain of its hash_ids (the id, 8 bytes
 *            little-endian, as the hash's `extra`; the trace's ids form a
 *            true prefix tree, so equal chains mean equal prefixes)
 *   LOOKUP   all keys: the resident prefix, and each key's tier
 *   LOAD     that prefix; every byte of each served block is read from
 *            the mapped G2 slot, checked against its committed CRC
 *            (kvc_verify, in place) and against the payload pattern of
 *            its hash id (a wrong block is counted in verify_failures and
 *            ends the hit); RELEASE. Keys refused KV_ESHARE (the
 *            connection pins its limits.session_share of G2: a prefix of
 *            over half a small G2) are loaded after that RELEASE, as a
 *            connector would (`share_rounds` counts the LOADs and ALLOCs
 *            asked again so). Hit blocks: the leading run served and
 *            verified; hit tokens: min(hit blocks x 512, input_length)
 *   store    the blocks after the hit: ALLOC (parent: the previous key),
 *            write the payload of --block-bytes, COMMIT with its CRC
 *            (kvc_crc32c over the slot, kvc_commit_crc). A key another
 *            client holds or already stored (KV_EEXISTS) is counted as
 *            `exists`; a slot refused (-EAGAIN while G2 victims are being
 *            written to G3, KV_EALLPINNED) as `refused`: not stored, unless
 *            --alloc-wait-ms asks for it again for a while; one refused
 *            KV_ESHARE is asked for after the COMMIT of those before it.
 *            All of a request's blocks in one ALLOC, or --store-batch N
 *            at a time (ALLOC N, COMMIT them, the next N), as an engine
 *            storing what each step computed: vLLM's connector stores
 *            a request's blocks of each step (wait_for_save), so a
 *            chunked prefill stores a chunk's blocks at a time
 *
 *   hints    with --hints, for a request of a session (the trace's
 *            "session", or its sub-agent's own id where "agent" is set):
 *            HINT SESSION of its hit keys once they are loaded (before
 *            the stores, which may evict: the session is known when the
 *            request arrives), of the keys it stores once their ALLOC
 *            answers (the slots allocated and the keys found there, before
 *            the blocks are written and committed, so that they come in
 *            with their session: tiers/EVICTION.md, "Through the
 *            daemon"), then HINT FINISHED with its stop reason (which an
 *            API server knows once the response ends: nothing from a
 *            later request is used)
 *
 * The parent takes the daemon's STATUS before and after the run and
 * reports the difference of its counters beside the clients' own counts
 * (commits, allocations, lookups, G3 reads and writes), so one can check
 * the other. Prints one JSON object; exit status 0 done, 1 the replay
 * failed (no daemon, a connection lost, a client died), 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/size.h"
#include "client/kvclient.h"
#include "tools/kvbench.h"
#include "tools/trace.h"

#define TOKENS_PER_BLOCK 512 /* the Mooncake trace's block */
#define STORE_PRIO       128
#define NO_SAMPLE        UINT64_MAX

typedef struct ropts {
  const char *trace;
  char socket[256];
  int have_socket;
  const char *tenant;
  uint32_t block_bytes;
  uint32_t clients;
  double time_scale;      /* 0: no waiting */
  size_t limit;           /* requests replayed, 0: all */
  int deal_hash;          /* deal requests by hash of the index, not round-robin */
  int deal_session;       /* deal requests by session: a session's requests keep their order */
  int hints;              /* --hints: session and finished hints from the trace */
  uint32_t alloc_wait_ms; /* how long a refused slot is asked for again */
  uint32_t store_batch;   /* blocks per ALLOC of a request's stores, 0: all at once */
  int shared;             /* --shared: COMMITs answered once the blocks are in G4 */
  int json;
} ropts;

/* What one client counts, in shared memory. */
typedef struct rres {
  uint64_t requests, blocks, hit_blocks, hit_g2, hit_g3;
  uint64_t tokens, hit_tokens;
  uint64_t lookup_keys;
  uint64_t load_failed; /* resident at LOOKUP, not served by LOAD */
  uint64_t verify_failures;
  uint64_t allocs, stored, exists, refused, commit_failed, alloc_retries;
  uint64_t not_shared;   /* --shared: committed here, not in G4 (KV_EDEGRADED) */
  uint64_t share_rounds; /* LOADs and ALLOCs asked again after KV_ESHARE (load_run) */
  uint64_t hints, hint_keys_unmatched;
  uint64_t bytes_read, bytes_written;
  double late_s; /* the most a request started behind its time */
  int rc;
  char err[160];
} rres;

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The payload of trace block `id`: word j is mix64(id + 1) ^ j * phi. */
static void fill_block(uint64_t *w, size_t words, uint64_t id) {
  uint64_t base = mix64(id + 1);
  for (size_t j = 0; j < words; j++) w[j] = base ^ (j * 0x9e3779b97f4a7c15ull);
}

/* 0 if every word of the block is the payload of `id`. */
static int check_block(const uint64_t *w, size_t words, uint64_t id) {
  uint64_t base = mix64(id + 1), diff = 0;
  for (size_t j = 0; j < words; j++) diff |= w[j] ^ base ^ (j * 0x9e3779b97f4a7c15ull);
  return diff != 0;
}

static int open_conn(const ropts *o, kvc **out) {
  return kvb_open(o->have_socket ? o->socket : NULL, o->tenant, o->block_bytes, TOKENS_PER_BLOCK,
                  out);
}

static void fail(rres *r, int rc, const char *what, size_t req) {
  r->rc = rc ? rc : -EIO;
  snprintf(r->err, sizeof r->err, "request %zu: %s: %s", req, what, kvc_strerror(r->rc));
}

/* The session a request's hints name: its sub-agent's id where it has one
 * (a sub-agent's context is its own), else its session's; 0: none. */
static uint64_t hint_session(const kv_trace_req *q) { return q->agent ? q->agent : q->session; }

static int owner_of(const ropts *o, const kv_trace *t, size_t i) {
  if (o->deal_session && t->req[i].session) return (int)(mix64(t->req[i].session) % o->clients);
  if (!o->deal_hash) return (int)(i % o->clients);
  return (int)(mix64(i) % o->clients);
}

/* --- one client ---------------------------------------------------------------- */

typedef struct client {
  const ropts *o;
  const kv_trace *t;
  size_t nreq;
  uint64_t *lookup_ns, *load_ns; /* shared, one slot per request */
  double t0;                     /* the start, set before the fork of clients */
  kvc *c;
  kvc_key *keys;
  uint8_t *tiers;
  kvc_block *blk;
  int32_t *st;
  uint32_t *crc;    /* store: the CRC of each block written */
  kvc_key *ak, *ap; /* store: the keys asked for, their parents */
  uint32_t *idx;    /* store: their block indices in the request */
  rres *res;        /* one result per client, shared with the parent */
} client;

/* HINT SESSION sid of keys[0..n), none when n is 0: counted, with the keys
 * the daemon did not find. 0 or the error. */
static int hint_keys(client *x, rres *r, uint64_t sid, const kvc_key *keys, uint32_t n) {
  if (!n) return 0;
  int got = kvc_hint_session(x->c, sid, keys, n, 0, NULL);
  if (got < 0) return got;
  r->hint_keys_unmatched += n - (uint32_t)got;
  r->hints++;
  return 0;
}

/* Stores blocks [from, to) of request q (after its hit) in one ALLOC and
 * their COMMIT. A slot refused for want of room is asked for again until
 * give_up (--alloc-wait-ms after the request's first ALLOC; by default not
 * at all); one refused with KV_ESHARE (this connection holds its share of
 * G2) once the slots allocated before it are committed. sid (0: none): the session the slots allocated are hinted to,
 * before they are written, as an engine that knows its request's session
 * names the blocks it allocates, so that they have it when committed. 0,
 * or the error of a whole request (the connection is then unusable). */
static int store_run(client *x, const kv_trace_req *q, uint32_t from, uint32_t to, uint64_t sid,
                     double give_up, rres *r) {
  const ropts *o = x->o;
  uint32_t m = 0;
  for (uint32_t i = from; i < to; i++) x->idx[m++] = i;
  while (m) {
    for (uint32_t i = 0; i < m; i++) {
      x->ak[i] = x->keys[x->idx[i]];
      memset(&x->ap[i], 0, sizeof x->ap[i]);
      if (x->idx[i] > 0) x->ap[i] = x->keys[x->idx[i] - 1];
    }
    int got = kvc_alloc(x->c, KVC_G2, STORE_PRIO, x->ak, x->ap, m, x->blk);
    if (got < 0) return got;
    int again = o->alloc_wait_ms > 0 && kv_now_s() < give_up;
    uint32_t k = 0, left = 0, waiting = 0, e = 0;
    for (uint32_t i = 0; i < m; i++) {
      const kvc_block *b = &x->blk[i];
      if (b->status == KV_EEXISTS) {
        r->exists++;
        x->ap[e++] = x->ak[i]; /* ap's parents are sent: it keeps the keys found, to hint */
      } else if (b->status == 0) {
        r->allocs++;
        fill_block(b->ptr, o->block_bytes / 8, q->ids[x->idx[i]]);
        x->crc[k] = kvc_crc32c(0, b->ptr, o->block_bytes);
        x->ak[k++] = x->ak[i];
      } else if (again && (b->status == -EAGAIN || b->status == KV_EALLPINNED)) {
        x->idx[left++] = x->idx[i];
        waiting++;
      } else if (b->status == KV_ESHARE && k) { /* the rest, once these are committed */
        x->idx[left++] = x->idx[i];
      } else {
        r->refused++;
      }
    }
    memcpy(x->ak + k, x->ap, e * sizeof *x->ak); /* after the ones to commit */
    if (k + e && sid && (got = hint_keys(x, r, sid, x->ak, k + e)) < 0) return got;
    if (k) {
      got = (o->shared ? kvc_commit_shared : kvc_commit_crc)(x->c, x->ak, x->crc, k, x->st);
      if (got < 0) return got;
      for (uint32_t i = 0; o->shared && i < k; i++) /* committed, not in G4: stored all the same */
        if (x->st[i] == KV_EDEGRADED) got++, r->not_shared++;
      r->stored += (uint64_t)got;
      r->commit_failed += k - (uint64_t)got;
      r->bytes_written += (uint64_t)got * o->block_bytes;
    }
    if (left && left == m) usleep(200); /* nothing moved: give the SSD a moment */
    r->alloc_retries += waiting;
    r->share_rounds += left > waiting;
    m = left;
  }
  return 0;
}

/* Stores blocks [from, n) of request q, --store-batch of them at a time
 * (by default all: store_run splits them only at the connection's share).
 * 0, or the error of a whole request. */
static int store_tail(client *x, const kv_trace_req *q, uint32_t from, uint64_t sid, rres *r) {
  uint32_t step = x->o->store_batch ? x->o->store_batch : q->n;
  double give_up = kv_now_s() + x->o->alloc_wait_ms / 1e3;
  for (uint32_t i = from; i < q->n; i += step) {
    int rc = store_run(x, q, i, q->n - i > step ? i + step : q->n, sid, give_up, r);
    if (rc) return rc;
  }
  return 0;
}


/* LOADs the prefix the LOOKUP found, keys [0, h) of request q, and reads
 * it: *hit is the run of blocks that loaded and verified. Keys the daemon
 * refused with KV_ESHARE (this connection pins its share of G2:
 * limits.session_share) are asked again once the blocks loaded before them
 * are read and released, as an engine's connector does with a prefix
 * longer than its share (over half a small G2 is). 0, or the error of a
 * LOAD or RELEASE (reported). */
static int load_run(client *x, size_t qi, uint32_t h, rres *r, uint32_t *hit) {
  const ropts *o = x->o;
  const kv_trace_req *q = &x->t->req[qi];
  int run = 1;
  uint64_t ns = 0;
  for (uint32_t from = 0; from < h;) {
    uint64_t t = kv_now_ns();
    int got = kvc_load(x->c, KVC_G2, x->keys + from, h - from, x->blk);
    ns += kv_now_ns() - t;
    if (got < 0) {
      fail(r, got, "load", qi);
      return got;
    }
    uint32_t m = h - from, pinned = 0;
    for (uint32_t i = 0; i < m; i++) {
      kvc_block *b = &x->blk[i];
      uint32_t k = from + i;
      if (b->status == KV_ESHARE && pinned) { /* the rest, once these are released */
        m = i;
        break;
      }
      if (b->status) {
        r->load_failed++;
        run = 0;
        continue;
      }
      pinned++;
      if (!run) continue;
      /* A block failing its CRC is reported (its pin goes with the report). */
      if (b->length != o->block_bytes || kvc_verify(x->c, &x->keys[k], b) != 0 ||
          check_block(b->ptr, o->block_bytes / 8, q->ids[k])) {
        r->verify_failures++;
        run = 0;
        continue;
      }
      r->bytes_read += o->block_bytes;
      (*hit)++;
      if (x->tiers[k] == KVC_G3) r->hit_g3++;
      else r->hit_g2++;
    }
    /* Pins of blocks that did not load are refused per key: harmless. */
    int rel = pinned ? kvc_release(x->c, x->keys + from, m, x->st) : 0;
    if (rel < 0) {
      fail(r, rel, "release", qi);
      return rel;
    }
    r->share_rounds += m < h - from;
    from += m;
  }
  if (h) x->load_ns[qi] = ns;
  return 0;
}

static int replay_one(client *x, size_t qi, rres *r) {
  const ropts *o = x->o;
  const kv_trace_req *q = &x->t->req[qi];
  uint8_t parent[KVC_DIGEST_BYTES];
  for (uint32_t i = 0; i < q->n; i++) {
    uint8_t id[8];
    kv_trace_key(q->ids[i], id);
    x->keys[i].len = KVC_DIGEST_BYTES;
    kvc_chain_hash(x->keys[i].b, i ? parent : NULL, NULL, 0, id, sizeof id, NULL, 0);
    memcpy(parent, x->keys[i].b, KVC_DIGEST_BYTES);
  }
  r->requests++;
  r->blocks += q->n;
  r->tokens += q->input_len;
  if (q->n == 0) return 0;

  uint64_t t = kv_now_ns();
  int h = kvc_lookup(x->c, x->keys, q->n, x->tiers);
  x->lookup_ns[qi] = kv_now_ns() - t;
  if (h < 0) {
    fail(r, h, "lookup", qi);
    return h;
  }
  r->lookup_keys += q->n;

  uint32_t hit = 0;
  int rc = load_run(x, qi, (uint32_t)h, r, &hit);
  if (rc) return rc;
  uint64_t sid = hint_session(q);
  /* The session is known when the request arrives: its hit blocks are
   * hinted before the stores, which may evict, as an engine's connector
   * does after its LOAD. */
  rc = o->hints && sid ? hint_keys(x, r, sid, x->keys, hit) : 0;
  if (rc) {
    fail(r, rc, "hint", qi);
    return rc;
  }
  r->hit_blocks += hit;
  uint64_t ht = (uint64_t)hit * TOKENS_PER_BLOCK;
  r->hit_tokens += ht < q->input_len ? ht : q->input_len;
  rc = store_tail(x, q, hit, o->hints ? sid : 0, r);
  if (rc) {
    fail(r, rc, "store", qi);
    return rc;
  }
  if (o->hints && sid) {
    int n = kvc_hint_finished(x->c, sid, q->stop, NULL, 0, 0, NULL);
    if (n < 0) {
      fail(r, n, "hint", qi);
      return n;
    }
    r->hints++;
  }
  return 0;
}

/* Client `id`: sets up, passes the start barrier, replays its requests.
 * Returns its exit status (0: every request went through). */
static int client_main(void *arg, uint32_t uid, kvb_sync *sync) {
  client *x = arg;
  int id = (int)uid;
  rres *r = &x->res[uid];
  const ropts *o = x->o;
  uint32_t maxn = 1;
  for (size_t i = 0; i < x->nreq; i++)
    if (x->t->req[i].n > maxn) maxn = x->t->req[i].n;
  x->keys = calloc(maxn, sizeof *x->keys);
  x->tiers = calloc(maxn, 1);
  x->blk = calloc(maxn, sizeof *x->blk);
  x->st = calloc(maxn, sizeof *x->st);
  x->ak = calloc(maxn, sizeof *x->ak);
  x->ap = calloc(maxn, sizeof *x->ap);
  x->idx = calloc(maxn, sizeof *x->idx);
  x->crc = calloc(maxn, sizeof *x->crc);
  int rc =
      x->keys && x->tiers && x->blk && x->st && x->ak && x->ap && x->idx && x->crc ? 0 : -ENOMEM;
  if (rc) fail(r, rc, "buffers", 0);
  else if ((rc = open_conn(o, &x->c))) fail(r, rc, "open", 0);
  kvb_sync_wait(sync);
  double t0 = kv_now_s();
  uint64_t ts0 = x->nreq ? x->t->req[0].ts_ms : 0;
  for (size_t i = 0; i < x->nreq && !rc; i++) {
    if (owner_of(o, x->t, i) != id) continue;
    if (o->time_scale > 0) {
      double due = t0 + (double)(x->t->req[i].ts_ms - ts0) / 1e3 * o->time_scale, now = kv_now_s();
      if (due > now) {
        struct timespec ts = {(time_t)(due - now),
                              (long)((due - now - (double)(time_t)(due - now)) * 1e9)};
        while (nanosleep(&ts, &ts) && errno == EINTR) {}
      } else if (now - due > r->late_s) {
        r->late_s = now - due;
      }
    }
    rc = replay_one(x, i, r);
  }
  kvc_close(x->c);
  free(x->keys);
  free(x->tiers);
  free(x->blk);
  free(x->st);
  free(x->ak);
  free(x->ap);
  free(x->idx);
  free(x->crc);
  return rc ? 1 : 0;
}

/* --- the parent ----------------------------------------------------------------- */

/* {"p50", "p99", "count"} in microseconds of the samples that are set. */
static json_t *percentiles(const uint64_t *s, size_t n) {
  uint64_t *v = malloc((n ? n : 1) * sizeof *v);
  size_t k = 0;
  if (!v) return json_null();
  for (size_t i = 0; i < n; i++)
    if (s[i] != NO_SAMPLE) v[k++] = s[i];
  qsort(v, k, sizeof *v, kvb_cmp_u64);
  json_t *j = json_pack("{s:f,s:f,s:I}", "p50", k ? (double)v[k / 2] / 1e3 : 0.0, "p99",
                        k ? (double)v[k * 99 / 100] / 1e3 : 0.0, "count", (json_int_t)k);
  free(v);
  return j;
}

static json_t *get_status(kvc *c) {
  char *text = NULL;
  if (kvc_status(c, &text)) return NULL;
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  return o;
}

/* after - before for every integer of the objects (recursively; arrays
 * and other values are left out). */
static json_t *delta(json_t *before, json_t *after) {
  json_t *d = json_object(), *v;
  const char *k;
  json_object_foreach(after, k, v) {
    json_t *b = json_object_get(before, k);
    if (json_is_integer(v))
      json_object_set_new(d, k, json_integer(json_integer_value(v) - json_integer_value(b)));
    else if (json_is_object(v)) json_object_set_new(d, k, delta(b, v));
  }
  return d;
}

/* An integer of the delta, by path ("g3", "reads"); -1 if absent. */
static json_int_t dget(json_t *d, const char *a, const char *b) {
  json_t *v = json_object_get(json_object_get(d, a), b);
  return json_is_integer(v) ? json_integer_value(v) : -1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: kvbench replay --trace FILE [--socket-dir DIR | --socket PATH] [--json]\n"
             "           [--clients N] [--block-bytes B] [--time-scale F | --no-timestamps]\n"
             "           [--limit N] [--deal rr|hash|session] [--alloc-wait-ms MS] [--tenant T]\n"
             "           [--hints] [--store-batch N] [--shared]\n"
             "  Replays a Mooncake trace through a running kvcached: per request LOOKUP its\n"
             "  chained keys, LOAD and verify the resident prefix, store the rest.\n"
             "  --clients N      worker processes, one connection each (default 1)\n"
             "  --block-bytes B  bytes of each 512-token block, K/M suffixes (default 64K)\n"
             "  --time-scale F   request times x F (default 1: real time, 17 minutes for the\n"
             "                   whole Mooncake trace); 0 or --no-timestamps: no waiting\n"
             "  --limit N        the first N requests only\n"
             "  --deal rr|hash|session  which client takes request i: i mod N (default), a hash\n"
             "                   of i, or a hash of its session (a session's requests in order)\n"
             "  --hints          send the trace's sessions and stop reasons as engine hints\n"
             "  --store-batch N  ALLOC (then COMMIT) a request's new blocks N at a time, as an\n"
             "                   engine that stores each step's blocks (default 0: all at once)\n"
             "  --alloc-wait-ms MS  ask again for slots refused while G2 victims are written to\n"
             "                   G3 (-EAGAIN), for up to MS per request (default 0: not stored)\n"
             "  --tenant T       tenant of the namespace (default \"kvbench\")\n"
             "  --shared         COMMITs answered once the blocks are in G4 too (a prefill\n"
             "                   node handing a prompt to a decode node: kvc_commit_shared)\n");
}

static int parse_opts(ropts *o, int argc, char **argv) {
  static const struct option lo[] = {{"trace", required_argument, 0, 'f'},
                                     {"socket-dir", required_argument, 0, 'd'},
                                     {"socket", required_argument, 0, 's'},
                                     {"json", no_argument, 0, 'j'},
                                     {"clients", required_argument, 0, 'c'},
                                     {"block-bytes", required_argument, 0, 'b'},
                                     {"time-scale", required_argument, 0, 'x'},
                                     {"no-timestamps", no_argument, 0, 'X'},
                                     {"limit", required_argument, 0, 'l'},
                                     {"deal", required_argument, 0, 'D'},
                                     {"tenant", required_argument, 0, 'T'},
                                     {"alloc-wait-ms", required_argument, 0, 'w'},
                                     {"hints", no_argument, 0, 'H'},
                                     {"store-batch", required_argument, 0, 'S'},
                                     {"shared", no_argument, 0, 'G'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  o->tenant = "kvbench";
  o->block_bytes = 64u << 10;
  o->clients = 1;
  o->time_scale = 1;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "f:d:s:jc:b:x:Xl:D:T:w:S:HGh", lo, NULL)) != -1) {
    uint64_t v = 0;
    char *end;
    switch (ch) {
    case 'f': o->trace = optarg; break;
    case 'd':
    case 's':
      if (kvb_socket_opt(o->socket, sizeof o->socket, ch == 'd', optarg, "replay")) return 2;
      o->have_socket = 1;
      break;
    case 'j': o->json = 1; break;
    case 'T': o->tenant = optarg; break;
    case 'X': o->time_scale = 0; break;
    case 'x':
      errno = 0;
      o->time_scale = strtod(optarg, &end);
      if (errno || *end || end == optarg || !(o->time_scale >= 0 && o->time_scale <= 1000)) {
        fprintf(stderr, "kvbench replay: bad --time-scale '%s' (0 to 1000)\n", optarg);
        return 2;
      }
      break;
    case 'D':
      if (strcmp(optarg, "rr") && strcmp(optarg, "hash") && strcmp(optarg, "session")) {
        fprintf(stderr, "kvbench replay: bad --deal '%s' (rr, hash or session)\n", optarg);
        return 2;
      }
      o->deal_hash = !strcmp(optarg, "hash");
      o->deal_session = !strcmp(optarg, "session");
      break;
    case 'H': o->hints = 1; break;
    case 'G': o->shared = 1; break;
    case 'S':
      if (kv_parse_size(optarg, &v) || v > KVC_BATCH_MAX) {
        fprintf(stderr, "kvbench replay: bad --store-batch '%s' (0 to %d)\n", optarg,
                KVC_BATCH_MAX);
        return 2;
      }
      o->store_batch = (uint32_t)v;
      break;
    case 'w':
      if (kv_parse_size(optarg, &v) || v > 60000) {
        fprintf(stderr, "kvbench replay: bad --alloc-wait-ms '%s' (0 to 60000)\n", optarg);
        return 2;
      }
      o->alloc_wait_ms = (uint32_t)v;
      break;
    case 'c':
    case 'b':
    case 'l':
      if (kv_parse_size(optarg, &v) || v == 0 || v > UINT32_MAX ||
          (ch == 'c' && v > KVB_MAX_CLIENTS) || (ch == 'b' && (v % 8 || v < 64))) {
        fprintf(stderr, "kvbench replay: bad value '%s' for %s%s\n", optarg, argv[optind - 1],
                ch == 'b' ? " (a multiple of 8, at least 64)" : "");
        return 2;
      }
      if (ch == 'c') o->clients = (uint32_t)v;
      else if (ch == 'b') o->block_bytes = (uint32_t)v;
      else o->limit = (size_t)v;
      break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kvbench replay: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!o->trace) {
    fprintf(stderr, "kvbench replay: --trace FILE is needed\n");
    usage(stderr);
    return 2;
  }
  return 0;
}

static const char *client_err(void *arg, uint32_t i) {
  client *x = arg;
  return x->res[i].rc ? x->res[i].err : NULL;
}

/* Forks the clients, starts them together, waits for them all; the
 * wall-clock seconds from the start in *elapsed. 0, or -1 when one failed
 * (its message printed). */
static int run_clients(client *x, rres *res, double *elapsed) {
  static const kvb_clients_ops ops = {client_main, NULL, client_err};
  x->res = res;
  return kvb_run_clients("kvbench replay", x->o->clients, &ops, x, elapsed);
}

static double rate(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

int kvbench_replay(int argc, char **argv) {
  ropts o;
  memset(&o, 0, sizeof o);
  int rc = parse_opts(&o, argc, argv);
  if (rc) return rc;
  kv_trace t;
  size_t bad_line = 0;
  if ((rc = kv_trace_load(&t, o.trace, &bad_line))) {
    if (rc == -EINVAL)
      fprintf(stderr, "kvbench replay: %s:%zu: not a Mooncake trace line\n", o.trace, bad_line);
    else fprintf(stderr, "kvbench replay: %s: %s\n", o.trace, strerror(-rc));
    return 1;
  }
  size_t nreq = o.limit && o.limit < t.nreq ? o.limit : t.nreq;
  for (size_t i = 0; i < nreq; i++)
    if (t.req[i].n > KVC_BATCH_MAX) {
      fprintf(stderr, "kvbench replay: request %zu has %u blocks, more than a batch (%d)\n", i,
              t.req[i].n, KVC_BATCH_MAX);
      kv_trace_free(&t);
      return 1;
    }
  size_t shm = KVB_MAX_CLIENTS * sizeof(rres) + 2 * (nreq ? nreq : 1) * sizeof(uint64_t);
  void *mem = mmap(NULL, shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    perror("kvbench replay: mmap");
    kv_trace_free(&t);
    return 1;
  }
  rres *res = mem;
  memset(res, 0, KVB_MAX_CLIENTS * sizeof *res);
  client x = {.o = &o, .t = &t, .nreq = nreq, .lookup_ns = (uint64_t *)(res + KVB_MAX_CLIENTS)};
  x.load_ns = x.lookup_ns + nreq;
  for (size_t i = 0; i < 2 * nreq; i++) x.lookup_ns[i] = NO_SAMPLE;

  int status = 1;
  kvc *c = NULL;
  json_t *before = NULL, *after = NULL;
  if ((rc = open_conn(&o, &c))) {
    kvb_say_open_error("replay", o.have_socket ? o.socket : NULL, rc);
    goto out;
  }
  if (!(before = get_status(c))) {
    fprintf(stderr, "kvbench replay: the daemon's STATUS could not be read\n");
    goto out;
  }
  double elapsed = 0;
  if (run_clients(&x, res, &elapsed)) goto out;
  if (!(after = get_status(c))) {
    fprintf(stderr, "kvbench replay: the daemon's STATUS could not be read after the run\n");
    goto out;
  }

  rres s;
  memset(&s, 0, sizeof s);
  for (uint32_t i = 0; i < o.clients; i++) {
    const rres *r = &res[i];
    s.requests += r->requests;
    s.blocks += r->blocks;
    s.hit_blocks += r->hit_blocks;
    s.hit_g2 += r->hit_g2;
    s.hit_g3 += r->hit_g3;
    s.tokens += r->tokens;
    s.hit_tokens += r->hit_tokens;
    s.lookup_keys += r->lookup_keys;
    s.load_failed += r->load_failed;
    s.verify_failures += r->verify_failures;
    s.allocs += r->allocs;
    s.stored += r->stored;
    s.exists += r->exists;
    s.refused += r->refused;
    s.commit_failed += r->commit_failed;
    s.not_shared += r->not_shared;
    s.alloc_retries += r->alloc_retries;
    s.share_rounds += r->share_rounds;
    s.hints += r->hints;
    s.hint_keys_unmatched += r->hint_keys_unmatched;
    s.bytes_read += r->bytes_read;
    s.bytes_written += r->bytes_written;
    if (r->late_s > s.late_s) s.late_s = r->late_s;
  }
  json_t *d = delta(before, after);
  /* G2 <-> G3 traffic: every block of the run has one size, so the G3
   * counters of blocks give the bytes. */
  json_int_t g3w = dget(d, "g3", "writes"), g3r = dget(d, "g3", "reads");
  json_t *j = json_pack(
      "{s:s,s:s,s:I,s:i,s:i,s:i,s:f,s:s,s:f,s:f,s:f,s:f}", "bench", "replay", "trace", o.trace,
      "requests", (json_int_t)s.requests, "clients", (int)o.clients, "block_bytes",
      (int)o.block_bytes, "tokens_per_block", TOKENS_PER_BLOCK, "time_scale", o.time_scale, "deal",
      o.deal_session ? "session" : o.deal_hash ? "hash" : "rr", "elapsed_s", elapsed, "requests_per_s",
      elapsed > 0 ? (double)s.requests / elapsed : 0.0, "prefix_hit_rate",
      rate(s.hit_tokens, s.tokens), "block_hit_rate", rate(s.hit_blocks, s.blocks));
  json_object_set_new(
      j, "hits", json_pack("{s:I,s:I}", "g2", (json_int_t)s.hit_g2, "g3", (json_int_t)s.hit_g3));
  json_object_set_new(
      j, "blocks",
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "referenced", (json_int_t)s.blocks,
                "hit", (json_int_t)s.hit_blocks, "load_failed", (json_int_t)s.load_failed, "allocated",
                (json_int_t)s.allocs, "committed", (json_int_t)s.stored, "commit_failed",
                (json_int_t)s.commit_failed, "exists", (json_int_t)s.exists, "refused",
                (json_int_t)s.refused, "alloc_retries", (json_int_t)s.alloc_retries,
                "share_rounds", (json_int_t)s.share_rounds));
  json_object_set_new(
      j, "tokens",
      json_pack("{s:I,s:I}", "input", (json_int_t)s.tokens, "hit", (json_int_t)s.hit_tokens));
  json_object_set_new(j, "bytes",
                      json_pack("{s:I,s:I,s:I,s:I}", "client_read", (json_int_t)s.bytes_read,
                                "client_written", (json_int_t)s.bytes_written, "g2_to_g3",
                                g3w < 0 ? (json_int_t)0 : g3w * (json_int_t)o.block_bytes,
                                "g3_to_g2",
                                g3r < 0 ? (json_int_t)0 : g3r * (json_int_t)o.block_bytes));
  json_object_set_new(j, "store_batch", json_integer((json_int_t)o.store_batch));
  json_object_set_new(j, "shared", json_pack("{s:b,s:I}", "on", o.shared, "not_in_g4",
                                             (json_int_t)s.not_shared));
  json_object_set_new(j, "lookup_us", percentiles(x.lookup_ns, nreq));
  json_object_set_new(j, "load_us", percentiles(x.load_ns, nreq));
  json_object_set_new(j, "hints",
                      json_pack("{s:b,s:I,s:I,s:I}", "on", o.hints, "sent", (json_int_t)s.hints,
                                "keys_unmatched", (json_int_t)s.hint_keys_unmatched,
                                "trace_requests_with_session", (json_int_t)t.nsession));
  json_object_set_new(j, "verify_failures", json_integer((json_int_t)s.verify_failures));
  json_object_set_new(j, "late_s_max", json_real(s.late_s));
  json_object_set_new(
      j, "cross_check",
      json_pack("{s:{s:I,s:I},s:{s:I,s:I},s:{s:I,s:I},s:{s:I,s:I}}", "commits", "client",
                (json_int_t)s.stored, "daemon", dget(d, "core", "commits"), "allocs", "client",
                (json_int_t)s.allocs, "daemon", dget(d, "core", "allocs"), "lookup_keys", "client",
                (json_int_t)s.lookup_keys, "daemon", dget(d, "core", "lookups"), "g3_hits_vs_reads",
                "client", (json_int_t)s.hit_g3, "daemon", g3r));
  json_object_set_new(j, "daemon", d);
  fprintf(stderr,
          "replay: %llu requests, %u clients, %.1f req/s; prefix hit rate %.4f, block hit "
          "rate %.4f (g2 %llu, g3 %llu); lookup p50 %.1f us; %llu verify failures\n",
          (unsigned long long)s.requests, o.clients, elapsed > 0 ? (double)s.requests / elapsed : 0,
          rate(s.hit_tokens, s.tokens), rate(s.hit_blocks, s.blocks), (unsigned long long)s.hit_g2,
          (unsigned long long)s.hit_g3,
          json_real_value(json_object_get(json_object_get(j, "lookup_us"), "p50")),
          (unsigned long long)s.verify_failures);
  char *text = json_dumps(j, (o.json ? JSON_COMPACT : JSON_INDENT(2)) | JSON_REAL_PRECISION(6));
  if (text) puts(text);
  free(text);
  json_decref(j);
  status = s.verify_failures ? 1 : 0;
  if (s.verify_failures)
    fprintf(stderr, "kvbench replay: %llu blocks were served with bytes that are not theirs\n",
            (unsigned long long)s.verify_failures);
out:
  json_decref(before);
  json_decref(after);
  kvc_close(c);
  munmap(mem, shm);
  kv_trace_free(&t);
  return status;
}
