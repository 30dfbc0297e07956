/*
 * bench_core.c - `kvbench core-replay`: a Mooncake trace through the cache
 * core alone (no daemon, no sockets), at several capacities.
 *
 * Replay rule (the one the traces' publishers used for their reference
 * figures, bench/traces/README.md): for each request, look up its blocks in order - a block is a
 * prefix hit only while every earlier block of the request hit - then insert
 * or touch every block of the request. A plain LRU over block ids (no
 * prefix awareness) runs beside the core in the same process as the
 * reference, so the two are always compared on the same machine and trace.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/errors.h"
#include "tiers/core.h"
#include "tiers/evict.h"
#include "tiers/probe.h"
#include "tools/belady.h"
#include "tools/kvbench.h"
#include "tools/trace.h"

/* The capacities replayed, as shares of the trace's unique blocks; --capacity
 * replaces them (NFRAC is how many are in use). */
#define MAXFRAC 8
static double fractions[MAXFRAC] = {0.01, 0.02, 0.05, 0.10, 0.20, 0.50};
static size_t nfrac = 6;
#define NFRAC nfrac

typedef struct replay_result {
  kv_trace_hits h;
  uint64_t meta_bytes; /* the core's metadata at the end (kv_meta_bytes: index, policies, hints) */
} replay_result;

/* ---- the reference: plain LRU over block ids ----------------------------- */
typedef struct lru_ref {
  uint64_t *key;
  uint32_t *slot_of; /* hash table: node index + 1, 0 empty */
  uint32_t *prev, *next;
  uint32_t mask, n, cap, head, tail; /* head: most recent */
} lru_ref;

#define NIL UINT32_MAX

static uint32_t *lru_find(lru_ref *l, uint64_t k) {
  uint32_t h = (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & l->mask;
  for (;; h = (h + 1) & l->mask) {
    uint32_t s = l->slot_of[h];
    if (!s || l->key[s - 1] == k) return &l->slot_of[h];
  }
}
static void lru_unlink(lru_ref *l, uint32_t i) {
  if (l->prev[i] != NIL) l->next[l->prev[i]] = l->next[i];
  else l->head = l->next[i];
  if (l->next[i] != NIL) l->prev[l->next[i]] = l->prev[i];
  else l->tail = l->prev[i];
}
static void lru_front(lru_ref *l, uint32_t i) {
  l->prev[i] = NIL;
  l->next[i] = l->head;
  if (l->head != NIL) l->prev[l->head] = i;
  l->head = i;
  if (l->tail == NIL) l->tail = i;
}
/* Removes the table entry for k (linear probing, backward shift). */
static void lru_erase(lru_ref *l, uint64_t k) {
  uint32_t *p = lru_find(l, k);
  uint32_t hole = (uint32_t)(p - l->slot_of), j = hole;
  for (;;) {
    j = (j + 1) & l->mask;
    uint32_t s = l->slot_of[j];
    if (!s) break;
    uint32_t home = (uint32_t)((l->key[s - 1] * 0x9E3779B97F4A7C15ull) >> 32) & l->mask;
    if (!kv_probe_stays(hole, j, home)) {
      l->slot_of[hole] = s;
      hole = j;
    }
  }
  l->slot_of[hole] = 0;
}

static replay_result replay_lru_ref(const kv_trace *t, uint32_t cap) {
  lru_ref l = {0};
  uint32_t tab = 64;
  while (tab < cap * 2) tab <<= 1;
  l.mask = tab - 1;
  l.cap = cap;
  l.key = malloc(cap * sizeof *l.key);
  l.prev = malloc(cap * sizeof *l.prev);
  l.next = malloc(cap * sizeof *l.next);
  l.slot_of = calloc(tab, sizeof *l.slot_of);
  l.head = l.tail = NIL;
  replay_result r = {0};
  for (size_t qi = 0; qi < t->nreq; qi++) {
    const kv_trace_req *q = &t->req[qi];
    uint32_t prefix = 0, any = 0;
    int run = 1;
    for (uint32_t i = 0; i < q->n; i++) {
      int hit = *lru_find(&l, q->ids[i]) != 0;
      any += hit;
      if (run && hit) prefix++;
      else run = 0;
    }
    kv_trace_count(&r.h, q, prefix, any);
    for (uint32_t i = 0; i < q->n; i++) {
      uint32_t *s = lru_find(&l, q->ids[i]);
      if (*s) {
        lru_unlink(&l, *s - 1);
        lru_front(&l, *s - 1);
        continue;
      }
      uint32_t node;
      if (l.n < l.cap) {
        node = l.n++;
      } else {
        node = l.tail;
        lru_unlink(&l, node);
        lru_erase(&l, l.key[node]);
        s = lru_find(&l, q->ids[i]);
      }
      l.key[node] = q->ids[i];
      *s = node + 1;
      lru_front(&l, node);
    }
  }
  free(l.key);
  free(l.prev);
  free(l.next);
  free(l.slot_of);
  return r;
}

/* ---- the core ------------------------------------------------------------ */
#define SLOT 4096u

typedef struct core_run {
  kv_arena arena;
  kv_core *core;
  int ns;
} core_run;

static int core_open(core_run *cr, const char *policy, uint32_t cap_blocks, uint32_t hint) {
  kv_arena_opts ao = {.capacity = (size_t)cap_blocks * SLOT,
                      .page_bytes = SLOT,
                      .no_lock = 1,
                      .name = "kvbench-g2"};
  int rc = kv_arena_init(&cr->arena, &ao);
  if (rc) return rc;
  kv_core_opts co = {.policy = policy, .index_hint = hint};
  rc = kv_core_new(&cr->core, &co);
  if (rc) {
    kv_arena_fini(&cr->arena);
    return rc;
  }
  cr->ns = kv_core_ns_register(cr->core, &cr->arena, SLOT);
  if (cr->ns < 0) {
    rc = cr->ns;
    kv_core_free(cr->core);
    kv_arena_fini(&cr->arena);
  }
  return rc;
}

static void core_close(core_run *cr) {
  kv_core_free(cr->core);
  kv_arena_fini(&cr->arena);
}

/* ---- hints from the trace ----------------------------------------------------
 * What an API server knows, request by request (no look-ahead): the
 * session (and sub-agent) id on the request's lookups and stores, and its
 * stop reason once the request is done - after its stores. A session that
 * does not come back is never told "ended": only the future knows that.
 * Wrong hints for measuring what they cost: the stop reasons shuffled
 * across requests, or each request's session taken from a random request. */
typedef enum { HINTS_OFF = 0, HINTS_ON, HINTS_WRONG_STOPS, HINTS_WRONG_SESSIONS } hints_mode;

typedef struct hint_plan {
  uint64_t *session; /* per request; 0: none */
  uint8_t *stop;
} hint_plan;

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

static int hint_plan_make(hint_plan *hp, const kv_trace *t, hints_mode mode, int by_agent) {
  hp->session = malloc(t->nreq * sizeof *hp->session);
  hp->stop = malloc(t->nreq);
  if (!hp->session || !hp->stop) {
    free(hp->session);
    free(hp->stop);
    return -ENOMEM;
  }
  for (size_t i = 0; i < t->nreq; i++) {
    const kv_trace_req *q = &t->req[i];
    hp->session[i] = by_agent && q->agent ? q->agent : q->session;
    hp->stop[i] = q->stop;
  }
  uint64_t x = 88172645463325252ull; /* fixed: the same wrong hints every run */
  for (size_t i = t->nreq; i > 1 && mode == HINTS_WRONG_STOPS; i--) {
    size_t j = xorshift(&x) % i;
    uint8_t s = hp->stop[i - 1];
    hp->stop[i - 1] = hp->stop[j], hp->stop[j] = s;
  }
  if (mode == HINTS_WRONG_SESSIONS) {
    uint64_t *orig = malloc(t->nreq * sizeof *orig);
    if (!orig) {
      free(hp->session);
      free(hp->stop);
      return -ENOMEM;
    }
    memcpy(orig, hp->session, t->nreq * sizeof *orig);
    for (size_t i = 0; i < t->nreq; i++) hp->session[i] = orig[xorshift(&x) % t->nreq];
    free(orig);
  }
  return 0;
}

static void hint_plan_free(hint_plan *hp) {
  free(hp->session);
  free(hp->stop);
}

/* Stores keys[idx[0..m)] of a request: ALLOC each (parent: the key
 * before it), hint the session of those allocated (sid, 0: none) as the
 * daemon's replay does once its ALLOC answers, then COMMIT them. A slot
 * refused for want of room (KV_EALLPINNED: the rest is the request's own
 * blocks being written, or their prefix) is not stored. 0 or the error. */
static int store_batch(kv_core *core, uint32_t ns, const kv_key *keys, const uint32_t *idx,
                       uint32_t m, uint64_t sid, kv_block **blk) {
  uint32_t k = 0;
  for (uint32_t j = 0; j < m; j++) {
    uint32_t i = idx[j];
    int arc = kv_core_alloc(core, ns, &keys[i], i ? &keys[i - 1] : NULL, KV_PRIO_DEFAULT, &blk[k]);
    if (arc == KV_EALLPINNED) continue;
    if (arc) return arc;
    if (sid && (arc = kv_core_hint_session(core, ns, sid, blk[k], 0))) return arc;
    k++;
  }
  for (uint32_t j = 0; j < k; j++) {
    int arc = kv_core_commit(core, blk[j], 0);
    if (arc) return arc;
  }
  return 0;
}

/* --victims PREFIX: each block the whole cache lets go of, in order, as
 * "REQUEST KEY USED_AGAIN" lines (KEY the trace's block id in hex,
 * USED_AGAIN 1 when its hits were 2 or more), the single tier's in
 * PREFIX.one and G2 + G3's in PREFIX.two, so that where the two part can
 * be found (tools/bench/victims_diff.py; tiers/EVICTION.md, "Looked at
 * again"). A block leaves when its last valid tier goes: the core's
 * visibility observer (kv_core_on_visible) sees it with no tier left. */
typedef struct victims_log {
  FILE *f;
  size_t req; /* the request being replayed */
} victims_log;
static victims_log victims[2]; /* [0] one tier, [1] G2 + G3; f NULL: not asked for */

static void victim_seen(void *arg, const kv_block *b) {
  victims_log *v = arg;
  if (b->tiers) return;
  uint64_t id = 0;
  for (int i = 0; i < 8; i++) id |= (uint64_t)b->key[i] << (8 * i); /* kv_trace_key's inverse */
  fprintf(v->f, "%zu %llx %d\n", v->req, (unsigned long long)id, b->hits >= 2);
}

/* The replay on the trace's clock (kv_core_set_now per request); hp: the
 * hints to give (NULL: none). batch < 0: each block stored (ALLOC, COMMIT,
 * hint) before the next is looked at; else a request's new blocks are
 * stored `batch` at a time as `kvbench replay --store-batch` stores them
 * through the daemon (0: up to half the capacity at a time, the daemon's
 * default limits.session_share). */
static int replay_core(const kv_trace *t, const char *policy, uint32_t cap, const hint_plan *hp,
                       int64_t batch, replay_result *out, kv_core_stats_t *st) {
  size_t meta0 = kv_meta_bytes();
  core_run cr;
  int rc = core_open(&cr, policy, cap, cap);
  if (rc) return rc;
  if (victims[0].f && !hp) kv_core_on_visible(cr.core, victim_seen, &victims[0]);
  kv_key *keys = NULL;
  uint8_t *tiers = NULL;
  uint32_t kcap = 0, *idx = NULL, step = batch > 0 ? (uint32_t)batch : cap / 2 ? cap / 2 : 1;
  kv_block **blk = NULL;
  replay_result r = {0};
  for (size_t qi = 0; qi < t->nreq && !rc; qi++) {
    const kv_trace_req *q = &t->req[qi];
    if (q->n > kcap) {
      kcap = q->n * 2;
      free(keys);
      free(tiers);
      free(idx);
      free(blk);
      keys = malloc(kcap * sizeof *keys);
      tiers = malloc(kcap);
      idx = malloc(kcap * sizeof *idx);
      blk = malloc(kcap * sizeof *blk);
      if (!keys || !tiers || !idx || !blk) {
        rc = -ENOMEM;
        break;
      }
    }
    for (uint32_t i = 0; i < q->n; i++) {
      keys[i].len = 8;
      kv_trace_key(q->ids[i], keys[i].b);
    }
    uint32_t ns = (uint32_t)cr.ns;
    uint64_t sid = hp ? hp->session[qi] : 0;
    kv_core_set_now(cr.core, q->ts_ms);
    victims[0].req = qi;
    int prefix = kv_core_lookup(cr.core, ns, keys, q->n, tiers);
    if (prefix < 0) {
      rc = prefix;
      break;
    }
    uint32_t any = 0;
    for (uint32_t i = 0; i < q->n; i++) {
      if (tiers[i] == KV_TIER_NONE) continue;
      any++;
      if (sid) kv_core_hint_session(cr.core, ns, sid, kv_core_find(cr.core, ns, &keys[i]), 0);
    }
    kv_trace_count(&r.h, q, (uint32_t)prefix, any);
    uint32_t m = 0;
    for (uint32_t i = 0; i < q->n && batch >= 0 && !rc; i++) {
      kv_block *b = kv_core_find(cr.core, ns, &keys[i]);
      if (b) kv_core_touch(cr.core, b);
      else idx[m++] = i;
      if (m && (m == step || i + 1 == q->n)) {
        rc = store_batch(cr.core, ns, keys, idx, m, sid, blk);
        m = 0;
      }
    }
    for (uint32_t i = 0; i < q->n && batch < 0; i++) {
      kv_block *b = kv_core_find(cr.core, ns, &keys[i]);
      if (b) {
        kv_core_touch(cr.core, b);
        continue;
      }
      int arc = kv_core_alloc(cr.core, ns, &keys[i], i ? &keys[i - 1] : NULL, KV_PRIO_DEFAULT, &b);
      if (arc == 0) arc = kv_core_commit(cr.core, b, 0);
      if (arc == 0 && sid) arc = kv_core_hint_session(cr.core, ns, sid, b, 0);
      if (arc) {
        rc = arc;
        break;
      }
    }
    if (sid && !rc) rc = kv_core_hint_finished(cr.core, ns, sid, hp->stop[qi], 0);
  }
  if (st) kv_core_stats(cr.core, st);
  r.meta_bytes = kv_meta_bytes() - meta0;
  free(keys);
  free(tiers);
  free(idx);
  free(blk);
  core_close(&cr);
  *out = r;
  return rc;
}

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* The capacity, in blocks, of fraction f of the trace's unique blocks. */
static uint32_t frac_cap(const kv_trace *t, size_t f) {
  uint32_t cap = (uint32_t)(fractions[f] * (double)t->nunique + 0.5);
  return cap ? cap : 1;
}

static const char *const hints_name[] = {"", "hints", "wrong_stops", "wrong_sessions"};

static json_t *rates_json(const replay_result *r) {
  json_t *o = json_pack("{s:f,s:f,s:f}", "prefix_hit_rate",
                        r->h.refs ? (double)r->h.prefix_hits / r->h.refs : 0.0, "block_hit_rate",
                        r->h.refs ? (double)r->h.block_hits / r->h.refs : 0.0, "prefix_token_hit_rate",
                        r->h.tokens ? (double)r->h.prefix_tokens / r->h.tokens : 0.0);
  if (r->meta_bytes)
    json_object_set_new(o, "metadata_bytes", json_integer((json_int_t)r->meta_bytes));
  return o;
}

/* ---- G2 + G3: admission policies ---------------------------------------------
 * The same replay with a real SSD tier under a small G2: a block found in
 * G3 is brought up (promoted) as a LOAD would, and G2 victims go to G3 when
 * the admission policy admits them. Reported per policy: prefix hit rate
 * (G2 or G3), and how much was written to the SSD (its wear). */
typedef struct g3_result {
  replay_result r;
  uint64_t hits_g3, g3_writes, g3_bytes;
  uint64_t promotions, promote_failed; /* G3 -> G2 reads that verified, and not */
  uint64_t g3_slots;                   /* the store's slots */
  uint64_t g3_refused;                 /* G2 victims G3 did not take (dropped) */
  uint64_t g3_outranked;               /* ... of those, ranked before G3's next victim */
  uint64_t held, both;                 /* at the end: blocks held, and held in G2 and G3 */
} g3_result;

static int count_held(const kv_block *b, void *arg) {
  uint64_t *n = arg;
  n[0]++;
  n[1] += (b->tiers & KV_TIER_BIT(KV_G2)) && (b->tiers & KV_TIER_BIT(KV_G3));
  return 0;
}

static void wait_promoted(kv_core *c, kv_block *b, int status, void *arg) { *(int *)arg = status; }

/* The smallest G3 directory size whose store has `slots` slots of SLOT
 * bytes (one more slot takes a payload and a header sector), so that a
 * replay's G3 holds exactly what it was given. */
static uint64_t g3_dir_bytes(uint32_t slots) {
  uint64_t lo = 0, hi = (1u << 20) + (uint64_t)slots * (SLOT + 8192);
  while (lo + 4096 < hi) {
    uint64_t mid = (lo + hi) / 2 / 4096 * 4096;
    uint32_t n = 0;
    if (kv_g3_layout_of(mid, SLOT, &n, NULL) == 0 && n >= slots) hi = mid;
    else lo = mid;
  }
  return hi;
}

/* Promotions of one request in flight: a LOAD reads its SSD blocks
 * together. Each is pinned until settle(), which waits for the SSD, checks
 * that what came up is the block that went down, and releases them. */
typedef struct g3_loading {
  kv_block *b;
  uint32_t i; /* its place in the request */
  int st;     /* the promotion's status (1: not called back yet) */
} g3_loading;

static int settle(kv_core *core, kv_g3 *g3, g3_loading *l, uint32_t *nl, const kv_key *keys) {
  kv_g3_drain(g3);
  int rc = 0;
  for (uint32_t k = 0; k < *nl; k++) {
    if (l[k].st == 0 && memcmp(kv_core_g2_ptr(core, l[k].b), keys[l[k].i].b, 8)) rc = -EIO;
    kv_core_unpin(core, l[k].b);
  }
  *nl = 0;
  return rc;
}

static int replay_g3(const kv_trace *t, const char *dir, const char *policy, kv_admit admit,
                     uint32_t g2cap, uint32_t g3cap, g3_result *out) {
  static const uint8_t digest[KV_G3_NS_BYTES] = {0x6b, 0x76};
  kv_arena arena;
  kv_arena_opts ao = {
      .capacity = (size_t)g2cap * SLOT, .page_bytes = SLOT, .no_lock = 1, .name = "kvbench-g2"};
  int rc = kv_arena_init(&arena, &ao);
  if (rc) return rc;
  kv_g3_dir d = {dir, g3_dir_bytes(g3cap)};
  kv_g3_opts go = {.dirs = &d,
                   .ndirs = 1,
                   .block_bytes = SLOT,
                   .queue_depth = 16,
                   .backend = KV_G3_BACKEND_AUTO,
                   .sync = KV_G3_SYNC_NONE,
                   .reformat = 1,
                   .arena = &arena,
                   .commit_window_us = -1};
  kv_g3 *g3;
  if ((rc = kv_g3_open(&g3, &go, NULL))) {
    kv_arena_fini(&arena);
    return rc;
  }
  kv_core *core;
  kv_core_opts co = {.policy = policy, .index_hint = g2cap + g3cap};
  if ((rc = kv_core_new(&core, &co))) {
    kv_g3_close(g3);
    kv_arena_fini(&arena);
    return rc;
  }
  kv_core_g3_opts ko = {.admit = admit, .min_prio = KV_PRIO_DEFAULT, .low_water = 32};
  kv_core_attach_g3(core, g3, &ko);
  if (victims[1].f) kv_core_on_visible(core, victim_seen, &victims[1]);
  int ns = kv_core_ns_register_digest(core, &arena, SLOT, digest);
  kv_key *keys = malloc(4096 * sizeof *keys);
  uint8_t *tiers = malloc(4096);
  memset(out, 0, sizeof *out);
  /* Reads in flight at once: the store's queue depth, and no more pinned
   * than a quarter of G2, which must keep room for the request's stores. */
  g3_loading loading[16];
  uint32_t nl = 0, maxl = g2cap / 4 < 16 ? g2cap / 4 : 16;
  if (maxl < 1) maxl = 1;
  for (size_t qi = 0; qi < t->nreq && !rc; qi++) {
    const kv_trace_req *q = &t->req[qi];
    uint32_t n = q->n < 4096 ? q->n : 4096;
    for (uint32_t i = 0; i < n; i++) {
      keys[i].len = 8;
      kv_trace_key(q->ids[i], keys[i].b);
    }
    kv_core_set_now(core, q->ts_ms); /* the trace's clock, as the single-tier replay */
    victims[1].req = qi;
    int prefix = kv_core_lookup(core, (uint32_t)ns, keys, n, tiers);
    uint32_t any = 0;
    for (uint32_t i = 0; i < n; i++) {
      any += tiers[i] != KV_TIER_NONE;
      if (i < (uint32_t)prefix && tiers[i] == KV_G3) out->hits_g3++;
    }
    kv_trace_count(&out->r.h, q, (uint32_t)prefix, any);
    for (uint32_t i = 0; i < n && !rc; i++) {
      kv_block *b = kv_core_find(core, (uint32_t)ns, &keys[i]);
      if (b) {
        kv_core_touch(core, b);
        if (!(b->tiers & KV_TIER_BIT(KV_G2))) {
          /* A LOAD of a block on the SSD: pin, promote; settled with the
           * request's other reads. */
          if (nl == maxl) rc = settle(core, g3, loading, &nl, keys);
          g3_loading *l = &loading[nl];
          *l = (g3_loading){b, i, 1};
          kv_core_pin(core, b);
          int prc;
          while ((prc = kv_core_promote(core, b, wait_promoted, &l->st)) == -EAGAIN ||
                 prc == -EBUSY) {
            int src = settle(core, g3, loading, &nl, keys); /* room comes from the SSD */
            if (src) rc = src;
            l = &loading[0];
            *l = (g3_loading){b, i, 1};
          }
          if (prc == 0) nl++;
          else kv_core_unpin(core, b);
        }
        continue;
      }
      int arc;
      while ((arc = kv_core_alloc(core, (uint32_t)ns, &keys[i], i ? &keys[i - 1] : NULL,
                                  KV_PRIO_DEFAULT, &b)) == -EAGAIN) {
        int src = settle(core, g3, loading, &nl, keys);
        if (src) rc = src;
      }
      if (arc == 0) {
        /* A payload that names the block, with its real checksum: G3
         * verifies it when the block comes back. */
        uint8_t *p = kv_core_g2_ptr(core, b);
        memcpy(p, keys[i].b, 8);
        arc = kv_core_commit(core, b, kv_crc32c(0, p, SLOT));
      }
      if (arc) rc = arc;
    }
    /* Deliver the SSD writes this request started before the next one, as
     * the daemon's loop does while the next request is on its way; without
     * it a write completes only when an allocation waits for one, and its
     * block holds a G2 slot and a G3 slot while readable in G2 alone. */
    int src = settle(core, g3, loading, &nl, keys);
    if (src && !rc) rc = src;
  }
  kv_g3_drain(g3);
  kv_g3_stats gs;
  kv_g3_get_stats(g3, &gs);
  out->g3_writes = gs.writes;
  out->g3_bytes = gs.write_bytes;
  out->g3_slots = gs.slots;
  kv_core_stats_t cs;
  kv_core_stats(core, &cs);
  out->promotions = cs.promotions;
  out->promote_failed = cs.promote_failed;
  out->g3_refused = cs.g3_refused;
  out->g3_outranked = cs.g3_outranked;
  uint64_t held[2] = {0, 0};
  kv_core_sample(core, KV_TIER_NONE, KV_NS_ANY, count_held, held);
  out->held = held[0];
  out->both = held[1];
  free(keys);
  free(tiers);
  kv_core_free(core);
  kv_g3_close(g3);
  kv_arena_fini(&arena);
  return rc;
}

/* G2 and G3 capacities in blocks for fractions g2f and g3f of the unique
 * blocks (G3 at least 64: the store keeps free slots ahead). */
static void g3_caps(const kv_trace *t, double g2f, double g3f, uint32_t *g2cap, uint32_t *g3cap) {
  *g2cap = (uint32_t)(g2f * (double)t->nunique + 0.5);
  *g3cap = (uint32_t)(g3f * (double)t->nunique + 0.5);
  if (*g2cap < 1) *g2cap = 1;
  if (*g3cap < 64) *g3cap = 64;
}

/* One G2 + G3 replay's figures. */
static json_t *g3_json(const g3_result *r, uint32_t g2cap, uint32_t g3cap) {
  json_t *o = rates_json(&r->r);
  json_object_set_new(o, "g2_blocks", json_integer(g2cap));
  json_object_set_new(o, "g3_blocks", json_integer(g3cap));
  json_object_set_new(o, "prefix_hits_from_g3", json_integer((json_int_t)r->hits_g3));
  json_object_set_new(o, "g3_writes", json_integer((json_int_t)r->g3_writes));
  json_object_set_new(o, "g3_writes_per_block_ref",
                      json_real(r->r.h.refs ? (double)r->g3_writes / r->r.h.refs : 0));
  json_object_set_new(o, "g3_promotions", json_integer((json_int_t)r->promotions));
  json_object_set_new(o, "g3_promote_failed", json_integer((json_int_t)r->promote_failed));
  json_object_set_new(o, "g3_slots", json_integer((json_int_t)r->g3_slots));
  json_object_set_new(o, "g3_refused", json_integer((json_int_t)r->g3_refused));
  json_object_set_new(o, "g3_outranked", json_integer((json_int_t)r->g3_outranked));
  json_object_set_new(o, "blocks_held_at_end", json_integer((json_int_t)r->held));
  json_object_set_new(o, "blocks_in_g2_and_g3_at_end", json_integer((json_int_t)r->both));
  return o;
}

static json_t *admission_json(const kv_trace *t, const char *dir, double g2f, double g3f,
                              int human) {
  static const struct {
    kv_admit a;
    const char *name;
  } pols[] = {{KV_ADMIT_ALWAYS, "always"},
              {KV_ADMIT_SECOND_USE, "second-use"},
              {KV_ADMIT_MIN_PRIO, "min-prio"}};
  uint32_t g2cap, g3cap;
  g3_caps(t, g2f, g3f, &g2cap, &g3cap);
  json_t *arr = json_array();
  for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
    g3_result r;
    int rc = replay_g3(t, dir, NULL, pols[i].a, g2cap, g3cap, &r);
    if (rc) {
      fprintf(stderr, "kvbench: G3 replay (%s): %s\n", pols[i].name, kv_strerror(rc));
      json_decref(arr);
      return NULL;
    }
    json_t *o = g3_json(&r, g2cap, g3cap);
    json_object_set_new(o, "admit", json_string(pols[i].name));
    json_array_append_new(arr, o);
    if (human)
      fprintf(stderr,
              "admit %-10s G2 %u + G3 %u blocks: prefix hit %6.2f%%  SSD writes %llu (%.3f per "
              "block reference)\n",
              pols[i].name, g2cap, g3cap, 100.0 * r.r.h.prefix_hits / r.r.h.refs,
              (unsigned long long)r.g3_writes, r.r.h.refs ? (double)r.g3_writes / r.r.h.refs : 0);
  }
  return arr;
}

/* Every eviction policy over G2 + G3 (admission `always`, the daemon's
 * default): G2 at g2f and G3 at g3f of the unique blocks; the policy ranks
 * both tiers, as in the daemon. */
static json_t *g3_policies_json(const kv_trace *t, const char *dir, double g2f, double g3f,
                                const char *const *policies, int npol, int human) {
  uint32_t g2cap, g3cap;
  g3_caps(t, g2f, g3f, &g2cap, &g3cap);
  json_t *o = json_object();
  for (int p = 0; p < npol; p++) {
    g3_result r;
    int rc = replay_g3(t, dir, policies[p], KV_ADMIT_ALWAYS, g2cap, g3cap, &r);
    if (rc) {
      fprintf(stderr, "kvbench: G3 replay (policy %s): %s\n", policies[p], kv_strerror(rc));
      json_decref(o);
      return NULL;
    }
    json_object_set_new(o, policies[p], g3_json(&r, g2cap, g3cap));
    if (human)
      fprintf(
          stderr,
          "policy %-7s G2 %u + G3 %u blocks: prefix hit %6.2f%%  (from G3 %llu)  SSD writes %llu\n",
          policies[p], g2cap, g3cap, 100.0 * r.r.h.prefix_hits / r.r.h.refs,
          (unsigned long long)r.hits_g3, (unsigned long long)r.g3_writes);
  }
  return o;
}

/* G2 + G3 against a single tier of the same total: for each capacity X of
 * the single-tier table (`single`, that replay's results for `policy`), the
 * G2 + G3 replay with X split 1:ratio between G2 and G3 (G2 gets
 * round(X / (1 + ratio)) blocks, G3 the rest). Both figures side by side,
 * with their difference in points of prefix hit rate. */
static json_t *tiers_json(const kv_trace *t, const char *dir, const char *policy, double ratio,
                          json_t *single, int human) {
  json_t *arr = json_array();
  for (size_t f = 0; f < json_array_size(single); f++) {
    json_t *one = json_array_get(single, f);
    uint32_t total = (uint32_t)json_integer_value(json_object_get(one, "capacity_blocks"));
    uint32_t g2cap = (uint32_t)((double)total / (1 + ratio) + 0.5);
    if (g2cap < 1) g2cap = 1;
    uint32_t g3cap = total > g2cap ? total - g2cap : 0;
    if (g3cap < 64) {
      fprintf(stderr, "kvbench: %u blocks is too few for G2 + G3 (G3 needs at least 64)\n", total);
      continue;
    }
    g3_result r;
    int rc = replay_g3(t, dir, policy, KV_ADMIT_ALWAYS, g2cap, g3cap, &r);
    if (rc) {
      fprintf(stderr, "kvbench: G3 replay (policy %s): %s\n", policy, kv_strerror(rc));
      json_decref(arr);
      return NULL;
    }
    double one_tier = json_real_value(json_object_get(one, "prefix_hit_rate"));
    double two = r.r.h.refs ? (double)r.r.h.prefix_hits / r.r.h.refs : 0;
    json_t *o = json_pack("{s:O,s:I,s:f,s:O,s:o,s:f}", "capacity_fraction",
                          json_object_get(one, "capacity_fraction"), "capacity_blocks",
                          (json_int_t)total, "g3_ratio", ratio, "single_tier", one, "g2_g3",
                          g3_json(&r, g2cap, g3cap), "difference_points", 100.0 * (two - one_tier));
    json_array_append_new(arr, o);
    if (human)
      fprintf(stderr,
              "%-7s %4.0f%% (%6u blocks): one tier %6.2f%%  G2 %u + G3 %u: %6.2f%% (%+.2f)  "
              "from G3 %llu  SSD writes %llu\n",
              policy, 100 * json_real_value(json_object_get(one, "capacity_fraction")), total,
              100 * one_tier, g2cap, g3cap, 100 * two, 100.0 * (two - one_tier),
              (unsigned long long)r.hits_g3, (unsigned long long)r.g3_writes);
  }
  return arr;
}

/* Index lookups per second: every block reference of the trace, looked up
 * in a full index, repeated; median of several rounds. */
static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int measure_lookups(const kv_trace *t, double *per_s, uint64_t *found_out) {
  core_run cr;
  int rc = core_open(&cr, NULL, (uint32_t)t->nunique, (uint32_t)t->nunique);
  if (rc) return rc;
  kv_key *keys = malloc(t->nids * sizeof *keys);
  if (!keys) {
    core_close(&cr);
    return -ENOMEM;
  }
  for (size_t i = 0; i < t->nids; i++) {
    keys[i].len = 8;
    kv_trace_key(t->ids[i], keys[i].b);
    kv_block *b;
    int a = kv_core_alloc(cr.core, (uint32_t)cr.ns, &keys[i], NULL, KV_PRIO_DEFAULT, &b);
    if (a == 0) kv_core_commit(cr.core, b, 0);
    else if (a != KV_EEXISTS) {
      rc = a;
      break;
    }
  }
  double rates[9];
  uint64_t found = 0;
  for (int round = 0; round < 9 && !rc; round++) {
    int reps = 8;
    double t0 = kv_now_s();
    for (int k = 0; k < reps; k++)
      for (size_t i = 0; i < t->nids; i++)
        found +=
            kv_index_find(kv_core_index(cr.core), (uint32_t)cr.ns, keys[i].b, keys[i].len) != NULL;
    rates[round] = (double)reps * (double)t->nids / (kv_now_s() - t0);
  }
  if (!rc) {
    qsort(rates, 9, sizeof rates[0], cmp_double);
    *per_s = rates[4];
    *found_out = found;
  }
  free(keys);
  core_close(&cr);
  return rc;
}

int kvbench_core_replay(int argc, char **argv) {
  static const struct option lo[] = {{"trace", required_argument, 0, 't'},
                                     {"policy", required_argument, 0, 'p'},
                                     {"json", no_argument, 0, 'j'},
                                     {"g3-dir", required_argument, 0, 'g'},
                                     {"g2-fraction", required_argument, 0, '2'},
                                     {"g3-fraction", required_argument, 0, '3'},
                                     {"hints", no_argument, 0, 'H'},
                                     {"hints-wrong", required_argument, 0, 'W'},
                                     {"hints-by", required_argument, 0, 'B'},
                                     {"g3-ratio", required_argument, 0, 'r'},
                                     {"tiers-only", no_argument, 0, 'T'},
                                     {"capacity", required_argument, 0, 'c'},
                                     {"store-batch", required_argument, 0, 'S'},
                                     {"victims", required_argument, 0, 'V'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  const char *trace = NULL, *policies[16] = {0}, *g3dir = NULL, *vprefix = NULL;
  double g2f = 0.01, g3f = 0.10, g3ratio = 10;
  int npol = 0, json = 0, ch, by_agent = 1, tiers_only = 0;
  size_t ncap = 0;
  hints_mode hints = HINTS_OFF;
  int64_t batch = -1; /* --store-batch: none, each block stored before the next */
  optind = 1;
  while ((ch = getopt_long(argc, argv, "t:p:jhg:2:3:HW:B:r:Tc:S:V:", lo, NULL)) != -1) {
    switch (ch) {
    case 't': trace = optarg; break;
    case 'p':
      if (!strcmp(optarg, "all")) {
        for (int i = 0; kv_evict_policies[i] && npol < 15; i++)
          policies[npol++] = kv_evict_policies[i]->name;
      } else if (!kv_evict_lookup(optarg)) {
        fprintf(stderr, "kvbench core-replay: unknown policy '%s'\n", optarg);
        return 2;
      } else if (npol < 15) {
        policies[npol++] = optarg;
      }
      break;
    case 'j': json = 1; break;
    case 'g': g3dir = optarg; break;
    case '2': g2f = strtod(optarg, NULL); break;
    case '3': g3f = strtod(optarg, NULL); break;
    case 'H':
      if (hints == HINTS_OFF) hints = HINTS_ON;
      break;
    case 'W':
      if (!strcmp(optarg, "stops")) hints = HINTS_WRONG_STOPS;
      else if (!strcmp(optarg, "sessions")) hints = HINTS_WRONG_SESSIONS;
      else {
        fprintf(stderr, "kvbench core-replay: --hints-wrong stops|sessions\n");
        return 2;
      }
      break;
    case 'B':
      if (!strcmp(optarg, "agent") || !strcmp(optarg, "session"))
        by_agent = !strcmp(optarg, "agent");
      else {
        fprintf(stderr, "kvbench core-replay: --hints-by session|agent\n");
        return 2;
      }
      break;
    case 'r':
      g3ratio = strtod(optarg, NULL);
      if (!(g3ratio > 0 && g3ratio < 1e6)) {
        fprintf(stderr, "kvbench core-replay: --g3-ratio wants a number above 0\n");
        return 2;
      }
      break;
    case 'T': tiers_only = 1; break;
    case 'c': {
      double c = strtod(optarg, NULL);
      if (!(c > 0 && c <= 1) || ncap == MAXFRAC) {
        fprintf(stderr, "kvbench core-replay: --capacity wants a share in (0, 1], at most %d\n",
                MAXFRAC);
        return 2;
      }
      fractions[ncap++] = c;
      nfrac = ncap;
      break;
    }
    case 'S': {
      char *end;
      errno = 0;
      long long v = strtoll(optarg, &end, 10);
      if (errno || *end || end == optarg || v < 0 || v > UINT32_MAX) {
        fprintf(stderr, "kvbench core-replay: bad --store-batch '%s'\n", optarg);
        return 2;
      }
      batch = v;
      break;
    }
    case 'V': vprefix = optarg; break;
    case 'h':
      printf("usage: kvbench core-replay --trace FILE [--policy NAME|all]... [--json]\n"
             "         [--g3-dir DIR [--g2-fraction F] [--g3-fraction F] [--g3-ratio R]\n"
             "          [--tiers-only]]\n"
             "         [--hints [--hints-wrong stops|sessions] [--hints-by agent|session]]\n"
             "         [--capacity F]... [--store-batch N] [--victims PREFIX]\n"
             "  --capacity: replay only at these shares of the unique blocks (default\n"
             "              0.01 0.02 0.05 0.10 0.20 0.50)\n"
             "  --store-batch: store a request's new blocks N at a time (ALLOC N, hint\n"
             "              them, COMMIT them), as `kvbench replay --store-batch` does\n"
             "              through the daemon; 0: up to half the capacity at a time (the\n"
             "              daemon's session share). Without it: each block stored (ALLOC,\n"
             "              COMMIT, hint) before the next key is looked at (not with --g3-dir)\n"
             "  --hints: also replay with the hints an API server has (the trace's session\n"
             "           and sub-agent on lookups and stores, its stop reason once each\n"
             "           request is done), reported beside the replay without them;\n"
             "           --hints-wrong: with wrong hints instead (stop reasons shuffled across\n"
             "           requests, or each request's session taken from a random request);\n"
             "           --hints-by: a sub-agent is a session of its own (agent, the default)\n"
             "           or part of its parent's (session)\n"
             "  --g3-dir: also replay with a real SSD tier in DIR: for each policy and\n"
             "            capacity X, G2 + G3 holding X together (split 1:R, default\n"
             "            1:10) beside the single tier of X (tiers); and under a small G2\n"
             "            (default 1%% and 10%% of the unique blocks), once per admission\n"
             "            policy, reporting hit rate and SSD writes; with more than one\n"
             "            --policy (or all), also once per eviction policy (g3_by_policy)\n"
             "  --tiers-only: with --g3-dir, only the side-by-side table (tiers)\n"
             "  --victims: with --g3-dir --tiers-only, one --capacity and one --policy,\n"
             "            write the blocks each replay lets go of, in order (REQUEST KEY\n"
             "            USED_AGAIN), to PREFIX.one (one tier) and PREFIX.two (G2 + G3);\n"
             "            tools/bench/victims_diff.py shows where the two part\n");
      return 0;
    default: return 2;
    }
  }
  if (!trace) {
    fprintf(stderr, "kvbench core-replay: --trace FILE is required\n");
    return 2;
  }
  if (npol == 0) policies[npol++] = kv_evict_default;
  if (vprefix) {
    if (!g3dir || !tiers_only || ncap != 1 || npol != 1) {
      fprintf(stderr, "kvbench core-replay: --victims needs --g3-dir, --tiers-only, one "
                      "--capacity and one --policy\n");
      return 2;
    }
    for (int i = 0; i < 2; i++) {
      char path[4096];
      snprintf(path, sizeof path, "%s.%s", vprefix, i ? "two" : "one");
      if (!(victims[i].f = fopen(path, "w"))) {
        fprintf(stderr, "kvbench core-replay: %s: %s\n", path, strerror(errno));
        if (i) fclose(victims[0].f);
        return 1;
      }
    }
  }

  kv_trace t;
  size_t bad = 0;
  int rc = kv_trace_load(&t, trace, &bad);
  if (rc) {
    if (rc == -EINVAL) fprintf(stderr, "kvbench: %s:%zu: not a Mooncake trace line\n", trace, bad);
    else fprintf(stderr, "kvbench: %s: %s\n", trace, kv_strerror(rc));
    return 1;
  }

  json_t *out = json_pack("{s:s,s:I,s:I,s:I,s:s}", "trace", trace, "requests", (json_int_t)t.nreq,
                          "block_refs", (json_int_t)t.nids, "unique_blocks", (json_int_t)t.nunique,
                          "policy", policies[0]);
  if (batch >= 0) json_object_set_new(out, "store_batch", json_integer((json_int_t)batch));
  json_t *by_policy = json_object();
  /* Belady's MIN (belady.h) at each capacity: the ceiling beside the rates */
  double belady[MAXFRAC], belady_tok[MAXFRAC];
  kv_belady bel;
  if ((rc = kv_belady_prepare(&bel, &t)) == 0) {
    for (size_t f = 0; f < NFRAC && !rc; f++) {
      kv_trace_hits br;
      rc = kv_belady_run(&bel, &t, frac_cap(&t, f), &br);
      belady[f] = br.refs ? (double)br.prefix_hits / br.refs : 0;
      belady_tok[f] = br.tokens ? (double)br.prefix_tokens / br.tokens : 0;
    }
    kv_belady_free(&bel);
  }
  if (rc) {
    fprintf(stderr, "kvbench core-replay: Belady: %s\n", kv_strerror(rc));
    json_decref(out);
    json_decref(by_policy);
    kv_trace_free(&t);
    return 1;
  }
  hint_plan hp = {0};
  if (hints && (rc = hint_plan_make(&hp, &t, hints, by_agent)))
    fprintf(stderr, "kvbench core-replay: %s\n", kv_strerror(rc));
  replay_result refs[MAXFRAC];
  for (size_t f = 0; f < NFRAC; f++) refs[f] = replay_lru_ref(&t, frac_cap(&t, f));
  for (int p = 0; p < npol && !rc; p++) {
    json_t *arr = json_array();
    for (size_t f = 0; f < NFRAC && !rc; f++) {
      uint32_t cap = frac_cap(&t, f);
      replay_result core_r, hint_r, ref_r = refs[f];
      kv_core_stats_t st;
      double t0 = kv_now_s();
      rc = replay_core(&t, policies[p], cap, NULL, batch, &core_r, &st);
      double dt = kv_now_s() - t0;
      if (!rc && hints) rc = replay_core(&t, policies[p], cap, &hp, batch, &hint_r, NULL);
      if (rc) break;
      json_t *o = rates_json(&core_r);
      json_object_set_new(o, "capacity_fraction", json_real(fractions[f]));
      json_object_set_new(o, "capacity_blocks", json_integer(cap));
      json_object_set_new(o, "reference_lru", rates_json(&ref_r));
      json_object_set_new(o, "belady_prefix_hit_rate", json_real(belady[f]));
      json_object_set_new(o, "belady_prefix_token_hit_rate", json_real(belady_tok[f]));
      if (hints) json_object_set_new(o, hints_name[hints], rates_json(&hint_r));
      json_object_set_new(o, "evictions", json_integer((json_int_t)st.evictions[KV_G2]));
      json_object_set_new(o, "replay_s", json_real(dt));
      json_array_append_new(arr, o);
      if (json) continue;
      fprintf(stderr,
              "%-7s %4.0f%% (%6u blocks): prefix hit %6.2f%%  tokens %6.2f%%  (plain LRU %6.2f%%, "
              "tokens %6.2f%%",
              policies[p], fractions[f] * 100, cap, pct(core_r.h.prefix_hits, core_r.h.refs),
              pct(core_r.h.prefix_tokens, core_r.h.tokens), pct(ref_r.h.prefix_hits, ref_r.h.refs),
              pct(ref_r.h.prefix_tokens, ref_r.h.tokens));
      fprintf(stderr, "; Belady %.2f%%, tokens %.2f%%", 100 * belady[f], 100 * belady_tok[f]);
      fprintf(stderr, ")  block hit %6.2f%%", pct(core_r.h.block_hits, core_r.h.refs));
      if (hints)
        fprintf(stderr, "  %s: prefix hit %6.2f%%  tokens %6.2f%%", hints_name[hints],
                pct(hint_r.h.prefix_hits, hint_r.h.refs), pct(hint_r.h.prefix_tokens, hint_r.h.tokens));
      fprintf(stderr, "\n");
    }
    if (p == 0) json_object_set(out, "results", arr);
    json_object_set_new(by_policy, policies[p], arr);
  }
  if (hints) hint_plan_free(&hp);
  if (npol > 1) json_object_set(out, "by_policy", by_policy);
  json_decref(by_policy);

  double lps = 0;
  uint64_t found = 0;
  if (!rc) rc = measure_lookups(&t, &lps, &found);
  if (rc) {
    fprintf(stderr, "kvbench core-replay: %s\n", kv_strerror(rc));
    json_decref(out);
    kv_trace_free(&t);
    return 1;
  }
  if (g3dir) {
    json_t *tiers = json_object();
    for (int p = 0; p < npol && tiers; p++) {
      json_t *single = npol > 1 ? json_object_get(json_object_get(out, "by_policy"), policies[p])
                                : json_object_get(out, "results");
      json_t *arr = tiers_json(&t, g3dir, policies[p], g3ratio, single, !json);
      if (!arr) {
        json_decref(tiers);
        tiers = NULL;
      } else {
        json_object_set_new(tiers, policies[p], arr);
      }
    }
    if (!tiers) {
      json_decref(out);
      kv_trace_free(&t);
      return 1;
    }
    json_object_set_new(out, "tiers", tiers);
  }
  if (g3dir && !tiers_only) {
    json_t *adm = admission_json(&t, g3dir, g2f, g3f, !json);
    if (!adm) {
      json_decref(out);
      kv_trace_free(&t);
      return 1;
    }
    json_object_set_new(out, "admission", adm);
    if (npol > 1) {
      json_t *gp = g3_policies_json(&t, g3dir, g2f, g3f, policies, npol, !json);
      if (!gp) {
        json_decref(out);
        kv_trace_free(&t);
        return 1;
      }
      json_object_set_new(out, "g3_by_policy", gp);
    }
  }
  json_object_set_new(out, "index_lookups_per_s", json_real(lps));
  json_object_set_new(out, "index_lookup_ns", json_real(1e9 / lps));
  if (!json)
    fprintf(stderr, "index lookups: %.1f M/s (median of 9 rounds, found %llu)\n", lps / 1e6,
            (unsigned long long)found);
  char *s = json_dumps(out, JSON_INDENT(json ? 0 : 2) | JSON_REAL_PRECISION(6));
  printf("%s\n", s);
  free(s);
  json_decref(out);
  kv_trace_free(&t);
  for (int i = 0; i < 2; i++)
    if (victims[i].f && fclose(victims[i].f)) {
      fprintf(stderr, "kvbench core-replay: --victims: %s\n", strerror(errno));
      return 1;
    }
  return 0;
}
