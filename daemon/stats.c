/* stats.c - the daemon's measurements and its read-only routes (see
 * stats.h; the names and shapes are the contract of daemon/OPS.md). */
#include "daemon/stats.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/hex.h"
#include "base/log.h"
#include "base/size.h"
#include "daemon/accept.h"
#include "daemon/kvd.h"

static const char *const tier_names[KV_NTIERS] = {"g1", "g2", "g3"};

/* --- hex ------------------------------------------------------------------------ */

int kvd_key_from_hex(const char *hex, size_t len, kv_key *k) {
  uint8_t b[KV_KEY_MAX];
  int n = len ? kv_hex_decode(hex, len, b, sizeof b) : -EINVAL;
  return n < 0 ? n : kv_key_set(k, b, (unsigned)n);
}

int kvd_ns_by_hex(kvd *d, const char *hex, uint32_t *core_ns) {
  size_t n = strlen(hex);
  if (n < 8 || n > 2 * KV_G3_NS_BYTES) return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (kv_hex_digit((unsigned char)hex[i]) < 0) return -EINVAL;
  int found = -1;
  for (uint32_t i = 0; i < kv_core_ns_count(d->core); i++) {
    kv_core_ns_info cn;
    kv_core_ns_info_get(d->core, i, &cn);
    if (!cn.digest) continue;
    char h[2 * KV_G3_NS_BYTES + 1];
    kv_hex_encode(cn.digest, KV_G3_NS_BYTES, h);
    if (strncasecmp(h, hex, n)) continue;
    if (found >= 0) return -EEXIST;
    found = (int)i;
  }
  if (found < 0) return -ENOENT;
  *core_ns = (uint32_t)found;
  return 0;
}

/* --- a snapshot of the state the routes report ---------------------------------- */

typedef struct tier_view {
  int enabled;
  const char *state;
  uint64_t configured; /* bytes the configuration asks for (g1/g2/g3.capacity) */
  uint64_t capacity, used, blocks, hits, evictions;
} tier_view;

typedef struct snapshot {
  tier_view t[KV_NTIERS];
  uint64_t pinned, uncommitted;
  int g3_state; /* kv_g3_state, or -1 when off */
  kv_g3_stats gs;
} snapshot;

/* Adds arena a (a soft limit per arena: 0 for none) to the tier's view. */
static void add_arena(tier_view *v, const kv_arena *a, uint64_t limit) {
  v->capacity += limit && limit < a->capacity ? limit : a->capacity;
  v->used += a->used_bytes;
  for (uint32_t k = 0; k < a->nclasses; k++) v->blocks += a->cls[k].used;
}

/* G3 directories configured (g3.path). */
static uint64_t g3_dirs(const kv_config *c) {
  char buf[sizeof c->g3_path];
  const char *dirs[KV_G3_MAX_DIRS];
  int n = kv_config_g3_dirs(c, buf, dirs, KV_G3_MAX_DIRS);
  return n > 0 ? (uint64_t)n : 0;
}

static void take(kvd *d, snapshot *s) {
  memset(s, 0, sizeof *s);
  s->t[KV_G1].state = "off";
  if (kv_core_g1_pools(d->core)) {
    tier_view *g1 = &s->t[KV_G1];
    g1->enabled = 1;
    g1->configured = d->cfg.g1_capacity * kv_core_g1_pools(d->core);
    for (uint32_t p = 0; p < kv_core_g1_pools(d->core); p++)
      add_arena(g1, kv_core_g1_arena(d->core, p), 0);
    g1->state = g1->used >= g1->capacity ? "full" : "ok";
  }
  tier_view *g2 = &s->t[KV_G2];
  g2->enabled = 1;
  g2->configured = d->cfg.g2_capacity;
  for (uint32_t i = 0; i < d->reg.ntenants; i++)
    add_arena(g2, &d->reg.tenants[i].arena, kv_core_limit(d->core, KV_G2));
  g2->state = g2->capacity && g2->used >= g2->capacity ? "full" : "ok";
  tier_view *g3 = &s->t[KV_G3];
  s->g3_state = -1;
  g3->state = d->g3w.err ? "unavailable" : "off";
  if (d->g3) {
    kv_g3_get_stats(d->g3, &s->gs);
    g3->enabled = 1;
    s->g3_state = (int)s->gs.state;
    g3->state = kv_g3_state_name(s->gs.state);
    g3->configured = d->cfg.g3_capacity * g3_dirs(&d->cfg);
    g3->capacity = s->gs.capacity_bytes;
    if (kv_core_limit(d->core, KV_G3) && kv_core_limit(d->core, KV_G3) < g3->capacity)
      g3->capacity = kv_core_limit(d->core, KV_G3);
    g3->used = s->gs.stored_bytes;
    g3->blocks = s->gs.slots_stored;
  }
  kv_core_stats_t cs;
  kv_core_stats(d->core, &cs);
  for (int t = 0; t < KV_NTIERS; t++) {
    s->t[t].hits = cs.hits[t];
    s->t[t].evictions = cs.evictions[t];
  }
  uint64_t seen = 0;
  const kv_index *ix = kv_core_index(d->core);
  for (kv_bid id = 0; id < ix->hiwater && seen < ix->count; id++) {
    const kv_block *b = kv_index_at(ix, id);
    if (b->state == KV_BS_FREE) continue;
    seen++;
    s->pinned += b->pins > 0;
    s->uncommitted += b->state == KV_BS_WRITING;
  }
}

/* The `op` label of a request opcode ("lookup"); 0 for none (ERROR, gaps). */
static int op_label(uint16_t op, char *low, size_t len) {
  const char *name = kv_op_name(op);
  if (!name || op == KV_OP_ERROR) return 0;
  size_t i = 0;
  for (; name[i] && i < len - 1; i++) low[i] = (char)tolower((unsigned char)name[i]);
  low[i] = 0;
  return 1;
}

static uint64_t uptime_s(kvd *d) { return ((uint64_t)kv_now_ms() - d->start_ms) / 1000; }

/* --- /metrics -------------------------------------------------------------------- */

#define P(...)                                            \
  do {                                                    \
    if (kvd_buf_printf(out, __VA_ARGS__)) return -ENOMEM; \
  } while (0)

static int header(kv_buf *out, const char *name, const char *type, const char *help) {
  P("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  return 0;
}

static int histogram(kv_buf *out, const char *name, const char *label, const char *value,
                     const kvd_hist *h) {
  uint64_t cum = 0;
  for (unsigned i = 0; i < KVD_HIST_BUCKETS; i++) {
    cum += h->b[i];
    P("%s_bucket{%s=\"%s\",le=\"%g\"} %llu\n", name, label, value, (double)(1ull << i) * 1e-6,
      (unsigned long long)cum);
  }
  P("%s_bucket{%s=\"%s\",le=\"+Inf\"} %llu\n", name, label, value, (unsigned long long)h->count);
  P("%s_sum{%s=\"%s\"} %.9f\n", name, label, value, (double)h->sum_ns * 1e-9);
  P("%s_count{%s=\"%s\"} %llu\n", name, label, value, (unsigned long long)h->count);
  return 0;
}

#define H(name, type, help)                            \
  do {                                                 \
    if (header(out, name, type, help)) return -ENOMEM; \
  } while (0)
#define U(x) ((unsigned long long)(x))

/* G4 (daemon/g4.h): the client's state and counts, and the daemon's. */
static json_t *lat_json(const kvd_hist *h);

/* A cold tier's coding in /stats (G3's, G4's): blocks written coded, raw
 * (no gain), read and decoded; the coded ones' bytes and stored bytes, and
 * their ratio (1 when none). */
static json_t *codec_json(uint64_t coded, uint64_t raw, uint64_t decoded, uint64_t block,
                          uint64_t stored) {
  return json_pack("{s:I,s:I,s:I,s:I,s:I,s:f}", "coded", (json_int_t)coded, "raw",
                   (json_int_t)raw, "decoded", (json_int_t)decoded, "block_bytes",
                   (json_int_t)block, "stored_bytes", (json_int_t)stored, "ratio",
                   stored ? (double)block / (double)stored : 1.0);
}

static int g4_metrics(kvd *d, kv_buf *out) {
  const kvd_g4 *g = &d->g4;
  kv_g4c_stats cs;
  memset(&cs, 0, sizeof cs);
  if (g->c) kv_g4c_get_stats(g->c, &cs);
  int cur = kvd_g4_state(d); /* -1: off */
  H("kvcached_g4_state", "gauge",
    "State of the shared Redis Cluster tier (1 for the current one): ok, degraded (some slots "
    "unreachable: no writes), down (no reads, no writes), off (g4.seeds empty).");
  static const char *const g4s[] = {"ok", "degraded", "down", "off"};
  for (int i = 0; i < 4; i++)
    P("kvcached_g4_state{state=\"%s\"} %d\n", g4s[i], i == (cur < 0 ? 3 : cur));
  H("kvcached_g4_hits_total", "counter",
    "Blocks a LOOKUP found in G4, verified and stored into G2.");
  P("kvcached_g4_hits_total %llu\n", U(g->hits));
  H("kvcached_g4_misses_total", "counter",
    "Keys a LOOKUP asked G4 for (or would have: down) that were not served from it, by reason "
    "(the refusals are the value check's: tiers/G4.md).");
  for (int i = 0; i < KVD_G4_MISS_COUNT; i++)
    P("kvcached_g4_misses_total{reason=\"%s\"} %llu\n", kvd_g4_miss_names[i], U(g->misses[i]));
  H("kvcached_g4_bytes_total", "counter",
    "Bytes to the cluster (commands as sent) and from it (reply payloads).");
  P("kvcached_g4_bytes_total{dir=\"in\"} %llu\n", U(cs.bytes_in));
  P("kvcached_g4_bytes_total{dir=\"out\"} %llu\n", U(cs.bytes_out));
  H("kvcached_g4_writes_total", "counter", "Blocks to be written to G4, by what became of them.");
  for (int i = 0; i < KVD_G4_W_COUNT; i++)
    P("kvcached_g4_writes_total{result=\"%s\"} %llu\n", kvd_g4_write_names[i], U(g->writes[i]));
  H("kvcached_g4_codec_blocks_total", "counter",
    "Blocks of namespaces whose G4 values are coded (g4.codec): written coded, written raw (no "
    "gain), read and decoded.");
  for (int i = 0; i < KVD_G4_CODEC_COUNT; i++)
    P("kvcached_g4_codec_blocks_total{result=\"%s\"} %llu\n", kvd_g4_codec_names[i],
      U(g->codec[i]));
  H("kvcached_g4_codec_bytes_total", "counter",
    "Of the blocks written coded: their bytes (block) and the bytes stored for them (stored); "
    "block / stored is the stored ratio.");
  P("kvcached_g4_codec_bytes_total{side=\"block\"} %llu\n", U(g->codec_bytes[0]));
  P("kvcached_g4_codec_bytes_total{side=\"stored\"} %llu\n", U(g->codec_bytes[1]));
  H("kvcached_g4_codec_seconds", "histogram",
    "Time a block's coding (op=code: on the way to G4, with the decode a lossy code's CRC needs) "
    "or decoding (op=decode: on the way back) took on the thread pool.");
  if (histogram(out, "kvcached_g4_codec_seconds", "op", "code", &g->codec_time[0]) ||
      histogram(out, "kvcached_g4_codec_seconds", "op", "decode", &g->codec_time[1]))
    return -ENOMEM;
  H("kvcached_g4_deletes_total", "counter",
    "DELs for deleted keys, by outcome (error: failed, or not sent while G4 was down).");
  P("kvcached_g4_deletes_total{result=\"ok\"} %llu\n", U(g->deletes[0]));
  P("kvcached_g4_deletes_total{result=\"error\"} %llu\n", U(g->deletes[1]));
  H("kvcached_g4_commands_in_flight", "gauge", "Redis commands sent and not answered yet.");
  P("kvcached_g4_commands_in_flight %llu\n", U(cs.in_flight));
  H("kvcached_g4_nodes", "gauge",
    "Redis Cluster nodes the client knows (at most KV_G4C_NODES_MAX): the map's, the seeds, and "
    "those commands were redirected to.");
  P("kvcached_g4_nodes %u\n", cs.nodes);
  H("kvcached_g4_replies_refused_total", "counter",
    "Replies from cluster nodes over the reply limits (tiers/G4.md): the connection was dropped.");
  P("kvcached_g4_replies_refused_total %llu\n", U(cs.replies_refused));
  H("kvcached_g4_backlog_blocks", "gauge",
    "Blocks whose G4 write is owed (committed while G4 was not ok, or busy): written once it is.");
  P("kvcached_g4_backlog_blocks %u\n", g->backlog.n);
  H("kvcached_g4_queued_blocks", "gauge",
    "Blocks committed whose G4 write has not started yet (started at most 1 MiB a turn of the "
    "loop; g4.backlog_blocks at most, the oldest dropped as busy; and those of COMMITs that "
    "wait for G4).");
  P("kvcached_g4_queued_blocks %llu\n", U(g->fresh.n + g->commit_queued));
  H("kvcached_g4_backlog_total", "counter",
    "Owed G4 writes by what became of them: written (started once G4 was ok), gone (no longer "
    "in G2 by then), dropped (the backlog was full: the oldest).");
  P("kvcached_g4_backlog_total{result=\"written\"} %llu\n", U(g->backlog_written));
  P("kvcached_g4_backlog_total{result=\"gone\"} %llu\n", U(g->backlog_gone));
  P("kvcached_g4_backlog_total{result=\"dropped\"} %llu\n", U(g->backlog.dropped));
  H("kvcached_g4_lookups_waiting", "gauge",
    "LOOKUPs, LOADs and GETs whose reply waits for G4 (its answers, then their copy into G2).");
  P("kvcached_g4_lookups_waiting %llu\n", U(g->waiting));
  H("kvcached_g4_lookup_seconds", "histogram",
    "Time a LOOKUP waited for G4: from its first GET to its last answer.");
  if (histogram(out, "kvcached_g4_lookup_seconds", "op", "lookup", &g->lookup)) return -ENOMEM;
  return 0;
}

/* G4's part of /stats and STATUS; NULL when it is off. */
static json_t *g4_json(kvd *d) {
  const kvd_g4 *g = &d->g4;
  if (!g->c) return NULL;
  kv_g4c_stats cs;
  kv_g4c_get_stats(g->c, &cs);
  json_t *m = json_object(), *w = json_object();
  for (int i = 0; i < KVD_G4_MISS_COUNT; i++)
    json_object_set_new(m, kvd_g4_miss_names[i], json_integer((json_int_t)g->misses[i]));
  for (int i = 0; i < KVD_G4_W_COUNT; i++)
    json_object_set_new(w, kvd_g4_write_names[i], json_integer((json_int_t)g->writes[i]));
  json_t *cj = codec_json(g->codec[KVD_G4_CODEC_CODED], g->codec[KVD_G4_CODEC_RAW],
                          g->codec[KVD_G4_CODEC_DECODED], g->codec_bytes[0], g->codec_bytes[1]);
  json_t *bl = json_pack("{s:I,s:I,s:I,s:I}", "blocks", (json_int_t)g->backlog.n, "written",
                          (json_int_t)g->backlog_written, "gone", (json_int_t)g->backlog_gone,
                          "dropped", (json_int_t)g->backlog.dropped);
  return json_pack("{s:s,s:I,s:I,s:I,s:o,s:o,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "state",
                   kv_g4c_state_name(cs.state), "masters", (json_int_t)cs.masters, "slots",
                   (json_int_t)cs.slots, "hits", (json_int_t)g->hits, "misses", m, "writes", w,
                   "deletes", (json_int_t)(g->deletes[0] + g->deletes[1]), "lookups",
                   (json_int_t)g->lookups, "bytes_in", (json_int_t)cs.bytes_in, "bytes_out",
                   (json_int_t)cs.bytes_out, "in_flight", (json_int_t)cs.in_flight, "latency_us",
                   lat_json(&g->lookup), "backlog", bl, "codec", cj);
}

_Static_assert(KV_G3_HIST_BUCKETS == KVD_HIST_BUCKETS, "G3's codec times share the buckets");

/* G3's coding (g3.codec; tiers/G3.md, "Coded blocks"). */
static int g3_codec_metrics(kv_buf *out, const kv_g3_stats *gs, const kv_core_stats_t *c) {
  H("kvcached_g3_codec_blocks_total", "counter",
    "Blocks of namespaces whose G3 blocks are coded (g3.codec): written coded, written raw (no "
    "gain), read and decoded, read and refused (stored bytes failing their CRC or decoding).");
  P("kvcached_g3_codec_blocks_total{result=\"coded\"} %llu\n", U(gs->coded));
  P("kvcached_g3_codec_blocks_total{result=\"raw\"} %llu\n", U(gs->coded_raw));
  P("kvcached_g3_codec_blocks_total{result=\"decoded\"} %llu\n", U(gs->decoded));
  P("kvcached_g3_codec_blocks_total{result=\"decode_failed\"} %llu\n", U(gs->decode_failed));
  H("kvcached_g3_codec_bytes_total", "counter",
    "Of the blocks written to G3 coded: their bytes (block) and the bytes stored for them "
    "(stored); block / stored is the stored ratio.");
  P("kvcached_g3_codec_bytes_total{side=\"block\"} %llu\n", U(gs->codec_in));
  P("kvcached_g3_codec_bytes_total{side=\"stored\"} %llu\n", U(gs->codec_out));
  H("kvcached_g3_codec_seconds", "histogram",
    "Time a block's coding (op=code: on the way to G3) or decoding and verification (op=decode: "
    "on the way back) took on G3's coder threads.");
  kvd_hist h[2];
  memset(h, 0, sizeof h);
  for (unsigned i = 0; i <= KVD_HIST_BUCKETS; i++) {
    h[0].b[i] = gs->code_hist[i];
    h[1].b[i] = gs->decode_hist[i];
    h[0].count += gs->code_hist[i];
    h[1].count += gs->decode_hist[i];
  }
  h[0].sum_ns = gs->code_ns;
  h[1].sum_ns = gs->decode_ns;
  if (histogram(out, "kvcached_g3_codec_seconds", "op", "code", &h[0]) ||
      histogram(out, "kvcached_g3_codec_seconds", "op", "decode", &h[1]))
    return -ENOMEM;
  H("kvcached_g3_too_large_total", "counter",
    "G2 victims not written to G3 because they do not fit a G3 slot (g3.slot_bytes): raw, or "
    "coded where their namespace's blocks are.");
  P("kvcached_g3_too_large_total %llu\n", U(c->g3_too_large));
  H("kvcached_g3_held_bytes", "gauge",
    "Bytes G3's blocks take in their slots (coded ones their stored bytes); the tier's stored "
    "ratio is kvcached_tier_used_bytes{tier=\"g3\"} / this.");
  P("kvcached_g3_held_bytes %llu\n", U(gs->held_bytes));
  return 0;
}

int kvd_render_metrics(kvd *d, kv_buf *out) {
  snapshot s;
  take(d, &s);
  kv_core_stats_t cs;
  kv_core_stats(d->core, &cs);
  const kv_core_stats_t *c = &cs;
#ifdef KV_HAVE_CUDA
  const char *cuda = "yes";
#else
  const char *cuda = "no";
#endif
  H("kvcached_build_info", "gauge", "Build of the running daemon (always 1).");
  P("kvcached_build_info{version=\"%s\",cuda=\"%s\"} 1\n", KV_VERSION, cuda);
  H("kvcached_uptime_seconds", "gauge", "Seconds since the daemon started.");
  P("kvcached_uptime_seconds %llu\n", U(uptime_s(d)));
  static const struct {
    const char *name, *help;
    size_t off;
  } tg[] = {
      {"kvcached_tier_configured_bytes",
       "Bytes the configuration gives the tier (g1.capacity per device, g2.capacity, g3.capacity "
       "per directory; 0 when off).",
       offsetof(tier_view, configured)},
      {"kvcached_tier_capacity_bytes",
       "Bytes the tier may hold: what its memory or files hold (a soft limit when one is set).",
       offsetof(tier_view, capacity)},
      {"kvcached_tier_used_bytes", "Bytes of blocks the tier holds.", offsetof(tier_view, used)},
      {"kvcached_tier_blocks", "Blocks the tier holds.", offsetof(tier_view, blocks)},
      {"kvcached_hits_total",
       "Keys asked for (LOOKUP, LOAD, GET) and found, by the fastest tier holding them.",
       offsetof(tier_view, hits)},
      {"kvcached_evictions_total", "Blocks evicted from the tier.", offsetof(tier_view, evictions)},
  };
  for (size_t i = 0; i < sizeof tg / sizeof tg[0]; i++) {
    H(tg[i].name, strstr(tg[i].name, "_total") ? "counter" : "gauge", tg[i].help);
    for (int t = 0; t < KV_NTIERS; t++)
      P("%s{tier=\"%s\"} %llu\n", tg[i].name, tier_names[t],
        U(*(const uint64_t *)((const char *)&s.t[t] + tg[i].off)));
  }
  H("kvcached_misses_total", "counter",
    "Keys asked for (LOOKUP, LOAD, GET) and not served, by reason.");
  for (int i = 0; i < KVD_MISS_COUNT; i++)
    P("kvcached_misses_total{reason=\"%s\"} %llu\n", kvd_miss_names[i], U(d->m.misses[i]));
  H("kvcached_lookups_total", "counter", "Keys looked up.");
  P("kvcached_lookups_total %llu\n", U(c->lookups));
  H("kvcached_copy_bytes_total", "counter", "Bytes copied between tiers, by direction.");
  for (int i = 0; i < KVD_DIR_COUNT; i++)
    P("kvcached_copy_bytes_total{direction=\"%s\"} %llu\n", kvd_dir_names[i],
      U(d->m.copy_bytes[i]));
  H("kvcached_copy_ops_total", "counter", "Block copies between tiers completed, by direction.");
  for (int i = 0; i < KVD_DIR_COUNT; i++)
    P("kvcached_copy_ops_total{direction=\"%s\"} %llu\n", kvd_dir_names[i], U(d->m.copy_ops[i]));
  H("kvcached_copy_duration_seconds", "histogram",
    "Time from the start of a block copy between tiers to its completion.");
  for (int i = 0; i < KVD_DIR_COUNT; i++)
    if (histogram(out, "kvcached_copy_duration_seconds", "direction", kvd_dir_names[i],
                  &d->m.copy[i]))
      return -ENOMEM;
  H("kvcached_demotions_total", "counter", "Victims handed down to the next tier, by source tier.");
  P("kvcached_demotions_total{from=\"g1\"} 0\n");
  P("kvcached_demotions_total{from=\"g2\"} %llu\n", U(c->demotions));
  H("kvcached_admissions_refused_total", "counter",
    "G2 victims the SSD tier did not take (admission policy, state or space).");
  P("kvcached_admissions_refused_total %llu\n", U(c->g3_refused));
  H("kvcached_g3_share_refused_total", "counter",
    "G2 victims not written to G3 because their tenant held its g3_share and none of its G3 blocks "
    "could go.");
  P("kvcached_g3_share_refused_total %llu\n", U(c->g3_share_refused));
  H("kvcached_g3_outranked_total", "counter",
    "G2 victims not written to G3 because G3's policy ranked them before its own next victim "
    "(they would have gone next).");
  P("kvcached_g3_outranked_total %llu\n", U(c->g3_outranked));
  H("kvcached_pinned_blocks", "gauge", "Blocks pinned by workers or the operator.");
  P("kvcached_pinned_blocks %llu\n", U(s.pinned));
  H("kvcached_uncommitted_allocations", "gauge", "Blocks allocated and not yet committed.");
  P("kvcached_uncommitted_allocations %llu\n", U(s.uncommitted));
  kv_core_policy_view pv[KV_NTIERS];
  int have[KV_NTIERS];
  for (int t = 0; t < KV_NTIERS; t++)
    have[t] = kv_core_policy_view_get(d->core, (kv_tier)t, &pv[t]) == 0;
  H("kvcached_eviction_order", "gauge",
    "The order the tier's eviction policy follows now (1), read from its instance holding the most "
    "blocks: hints while the default follows engine hints, else the policy's own.");
  for (int t = 0; t < KV_NTIERS; t++)
    if (have[t])
      P("kvcached_eviction_order{tier=\"%s\",order=\"%s\"} 1\n", tier_names[t], pv[t].following);
  H("kvcached_eviction_order_switches_total", "counter",
    "Times the tier's eviction policy changed the order it follows (the default's judge between "
    "engine hints and its order without them; auto's between its experts).");
  for (int t = 0; t < KV_NTIERS; t++)
    if (have[t])
      P("kvcached_eviction_order_switches_total{tier=\"%s\"} %llu\n", tier_names[t],
        U(pv[t].switches));
  H("kvcached_eviction_bonus_capacities", "gauge",
    "The default policy's H: how much later than its last use a block used again ranks, in "
    "capacities of accesses (0: LRU's order; tiers/EVICTION.md).");
  for (int t = 0; t < KV_NTIERS; t++)
    if (have[t] && pv[t].bonus >= 0)
      P("kvcached_eviction_bonus_capacities{tier=\"%s\"} %.3f\n", tier_names[t], pv[t].bonus);
  H("kvcached_session_limit_refused_total", "counter",
    "Keys refused because their connection held limits.pins_per_session pins or "
    "limits.allocs_per_session allocations (-EDQUOT), or its limits.session_share of its "
    "tenant's G2 slots (KV_ESHARE), by limit.");
  P("kvcached_session_limit_refused_total{limit=\"pins\"} %llu\n", U(d->st.pins_refused));
  P("kvcached_session_limit_refused_total{limit=\"allocs\"} %llu\n", U(d->st.allocs_refused));
  P("kvcached_session_limit_refused_total{limit=\"share\"} %llu\n", U(d->st.share_refused));
  H("kvcached_sessions", "gauge", "Worker connections open.");
  P("kvcached_sessions %llu\n", U(d->nsessions));
  H("kvcached_sessions_opened_total", "counter", "Worker connections accepted.");
  P("kvcached_sessions_opened_total %llu\n", U(d->st.sessions_opened));
  H("kvcached_hello_refused_total", "counter",
    "HELLOs refused by tenant: naming a tenant not configured, or from a peer not allowed to act "
    "as it.");
  for (int i = 0; i < KVD_HELLO_REFUSED_COUNT; i++)
    P("kvcached_hello_refused_total{reason=\"%s\"} %llu\n", kvd_hello_refusal_names[i],
      U(d->reg.hello_refused[i]));
  H("kvcached_namespaces", "gauge", "Namespaces: those with a session open or blocks in any tier.");
  P("kvcached_namespaces %llu\n", U(d->reg.nlive));
  H("kvcached_namespaces_freed_total", "counter",
    "Namespaces freed: no session and no block left.");
  P("kvcached_namespaces_freed_total %llu\n", U(d->reg.ns_freed));
  H("kvcached_namespaces_refused_total", "counter",
    "HELLOs refused a new namespace: the tenant at limits.namespaces_per_tenant, or the daemon "
    "full.");
  for (int i = 0; i < KVD_NS_REFUSED_COUNT; i++)
    P("kvcached_namespaces_refused_total{reason=\"%s\"} %llu\n", kvd_ns_refusal_names[i],
      U(d->reg.ns_refused[i]));
  const kvd_presence *pr = &d->pres;
  H("kvcached_presence_namespaces", "gauge",
    "Namespaces whose presence table workers map (protocol 1.5 PRESENCE).");
  P("kvcached_presence_namespaces %llu\n", U(pr->published));
  H("kvcached_presence_bytes", "gauge", "Bytes of those presence tables.");
  P("kvcached_presence_bytes %llu\n", U(pr->bytes));
  H("kvcached_presence_maps_total", "counter", "PRESENCE requests answered with a table.");
  P("kvcached_presence_maps_total %llu\n", U(pr->maps));
  H("kvcached_presence_updates_total", "counter",
    "Entries written to presence tables (commits, evictions, promotions, deletes).");
  P("kvcached_presence_updates_total %llu\n", U(kvd_presence_updates(pr)));
  H("kvcached_presence_tables_total", "counter",
    "Presence tables replaced by a larger one (grown), marked partial (a key found no room: "
    "their workers ask the daemon for what they lack), or not made (out of memory).");
  P("kvcached_presence_tables_total{event=\"grown\"} %llu\n", U(pr->grown));
  P("kvcached_presence_tables_total{event=\"partial\"} %llu\n", U(pr->partial));
  P("kvcached_presence_tables_total{event=\"failed\"} %llu\n", U(pr->failed));
  H("kvcached_presence_contradicted_total", "counter",
    "Keys a worker's presence table said were here that its LOAD then found missing (a stale "
    "answer: a miss, never a wrong block).");
  P("kvcached_presence_contradicted_total %llu\n", U(pr->contradicted));
  H("kvcached_connections_refused_total", "counter",
    "Connections refused at accept (answered with the reason, then closed), by socket and reason.");
  for (int i = 0; i < KVD_REFUSED_COUNT; i++)
    P("kvcached_connections_refused_total{socket=\"worker\",reason=\"%s\"} %llu\n",
      kvd_refused_names[i], U(d->st.conns_refused[i]));
  for (int i = 0; i < KVD_SOCK_COUNT; i++) {
    const kvd_http_lstats *l = d->m.http[i];
    if (!l) continue;
    P("kvcached_connections_refused_total{socket=\"%s\",reason=\"fd_limit\"} %llu\n",
      kvd_sock_names[i], U(l->refused_fd_limit));
    P("kvcached_connections_refused_total{socket=\"%s\",reason=\"limit\"} %llu\n",
      kvd_sock_names[i], U(l->refused_limit));
  }
  H("kvcached_connections_closed_total", "counter",
    "Connections the daemon closed for a limit, by socket and reason.");
  P("kvcached_connections_closed_total{socket=\"worker\",reason=\"hello_timeout\"} %llu\n",
    U(d->st.hello_timeouts));
  P("kvcached_connections_closed_total{socket=\"worker\",reason=\"out_bytes\"} %llu\n",
    U(d->st.out_closed));
  for (int i = 0; i < KVD_SOCK_COUNT; i++) {
    const kvd_http_lstats *l = d->m.http[i];
    if (!l) continue;
    P("kvcached_connections_closed_total{socket=\"%s\",reason=\"request_timeout\"} %llu\n",
      kvd_sock_names[i], U(l->request_timeouts));
    P("kvcached_connections_closed_total{socket=\"%s\",reason=\"evicted\"} %llu\n",
      kvd_sock_names[i], U(l->evicted));
    P("kvcached_connections_closed_total{socket=\"%s\",reason=\"idle\"} %llu\n", kvd_sock_names[i],
      U(l->idle));
  }
  H("kvcached_out_bytes", "gauge",
    "Reply bytes the worker connections owe: made by the daemon, not yet read by the worker.");
  P("kvcached_out_bytes %llu\n", U(d->st.out_bytes));
  H("kvcached_out_bytes_max", "gauge",
    "The most reply bytes one worker connection owed, at the last sweep (under a second ago).");
  P("kvcached_out_bytes_max %llu\n", U(d->st.out_max_conn));
  H("kvcached_out_bytes_limit", "gauge",
    "limits.out_bytes in effect: past it the connection owing the most is closed.");
  P("kvcached_out_bytes_limit %llu\n", U(d->st.out_limit));
  H("kvcached_operator_fds_reserved", "gauge",
    "Descriptors held for the operator sockets, spent when every other one is taken (of 4).");
  P("kvcached_operator_fds_reserved %u\n", kvd_fd_ops_held());
  H("kvcached_connections", "gauge", "Connections open, by socket.");
  P("kvcached_connections{socket=\"worker\"} %llu\n", U(d->nsessions));
  for (int i = 0; i < KVD_SOCK_COUNT; i++)
    if (d->m.http[i])
      P("kvcached_connections{socket=\"%s\"} %llu\n", kvd_sock_names[i], U(d->m.http[i]->open));
  H("kvcached_connections_limit", "gauge", "Connections a socket takes at once.");
  P("kvcached_connections_limit{socket=\"worker\"} %llu\n", U(d->st.conns_max));
  for (int i = 0; i < KVD_SOCK_COUNT; i++)
    if (d->m.http[i])
      P("kvcached_connections_limit{socket=\"%s\"} %llu\n", kvd_sock_names[i],
        U(d->m.http[i]->max));
  H("kvcached_requests_total", "counter", "Worker requests handled, by operation.");
  char low[32];
  for (uint16_t op = 1; op < KV_OP_COUNT; op++)
    if (op_label(op, low, sizeof low))
      P("kvcached_requests_total{op=\"%s\"} %llu\n", low, U(d->st.ops[op]));
  static const char *const hint_kinds[KV_HINT_KIND_COUNT] = {NULL, "session", "finished", "end"};
  H("kvcached_hints_total", "counter", "Engine hints taken (HINT requests), by kind.");
  for (int k = KV_HINT_SESSION; k < KV_HINT_KIND_COUNT; k++)
    P("kvcached_hints_total{kind=\"%s\"} %llu\n", hint_kinds[k], U(d->st.hints[k]));
  H("kvcached_hint_finished_total", "counter", "Requests the engines said finished, by stop reason.");
  for (unsigned k = 0; k < KV_STOP_COUNT; k++)
    P("kvcached_hint_finished_total{stop=\"%s\"} %llu\n", kv_stop_name(k), U(d->st.hint_stops[k]));
  kv_core_hint_stats hs;
  kv_core_hint_stats_get(d->core, &hs);
  H("kvcached_hint_sessions", "gauge", "Sessions the daemon remembers from engine hints.");
  P("kvcached_hint_sessions %llu\n", U(hs.sessions));
  H("kvcached_hint_sessions_forgotten_total", "counter",
    "Sessions forgotten to make room (cache.hint_sessions).");
  P("kvcached_hint_sessions_forgotten_total %llu\n", U(hs.forgotten));
  H("kvcached_hint_keys_unmatched_total", "counter",
    "Keys named by hints that had no block committed or being written in the namespace.");
  P("kvcached_hint_keys_unmatched_total %llu\n", U(d->st.hints_unmatched));
  H("kvcached_request_duration_seconds", "histogram",
    "Time from a decoded request to its reply (LOOKUP; LOAD, waits on the SSD included).");
  if (histogram(out, "kvcached_request_duration_seconds", "op", "lookup",
                &d->m.req[KVD_REQ_LOOKUP]) ||
      histogram(out, "kvcached_request_duration_seconds", "op", "load", &d->m.req[KVD_REQ_LOAD]))
    return -ENOMEM;
  H("kvcached_loop_turn_seconds", "histogram",
    "Time the event loop spent in one turn's callbacks (not waiting for events): a long turn "
    "delays every request behind it.");
  if (histogram(out, "kvcached_loop_turn_seconds", "loop", "main", &d->m.loop)) return -ENOMEM;
  H("kvcached_g3_state", "gauge",
    "State of the SSD tier (1 for the current one; unavailable: configured but it could not be "
    "opened).");
  static const char *const g3s[] = {"ok", "degraded", "full", "off", "unavailable"};
  int cur = s.g3_state >= 0 ? s.g3_state : d->g3w.err ? 4 : 3;
  for (int i = 0; i < 5; i++) P("kvcached_g3_state{state=\"%s\"} %d\n", g3s[i], i == cur);
  H("kvcached_g3_problem", "gauge",
    "Why the SSD tier is not ok (1 for the current reason, none while it is ok or off; details in "
    "/health and the log).");
  kvd_g3_problem why = kvd_g3_problem_of(d);
  for (int i = 0; i < KVD_G3P_COUNT; i++)
    P("kvcached_g3_problem{reason=\"%s\"} %d\n", kvd_g3_problem_names[i], i == (int)why);
  H("kvcached_g3_io_errors_total", "counter", "SSD transfers that failed with an I/O error.");
  P("kvcached_g3_io_errors_total %llu\n", U(s.gs.io_errors));
  H("kvcached_g3_corrupt_total", "counter", "SSD reads that failed verification.");
  P("kvcached_g3_corrupt_total %llu\n", U(s.gs.corrupt));
  if (g3_codec_metrics(out, &s.gs, c)) return -ENOMEM;
  if (g4_metrics(d, out)) return -ENOMEM;
  H("kvcached_corrupt_reported_total", "counter",
    "Blocks readers reported as failing their CRC, by the daemon's verdict on its own G2 copy.");
  P("kvcached_corrupt_reported_total{verdict=\"confirmed\"} %llu\n", U(d->trust.confirmed));
  P("kvcached_corrupt_reported_total{verdict=\"rejected\"} %llu\n", U(d->trust.rejected));
  H("kvcached_corrupt_dropped_total", "counter",
    "Confirmed corrupt blocks whose G2 and G1 copies were dropped.");
  P("kvcached_corrupt_dropped_total %llu\n", U(d->trust.dropped));
  H("kvcached_corrupt_pending_blocks", "gauge",
    "Confirmed corrupt blocks still pinned: refused to LOADs, dropped when their pins go.");
  P("kvcached_corrupt_pending_blocks %llu\n", U(d->trust.npend));
  const kvd_g1s *g1 = &d->g1;
  uint64_t pool_bytes = 0, exports[4] = {0}, subs[KV_DEV_NDIR] = {0}, refused[KV_DEV_NDIR] = {0};
  for (unsigned i = 0; i < g1->n; i++) {
    const kvd_g1 *g = &g1->g[i];
    if (!g->on) continue;
    pool_bytes += kv_dev_pool_bytes(g->pool);
    for (int k = 0; k < 4; k++) exports[k] += g->exports[k];
    for (int k = 0; k < KV_DEV_NDIR; k++) {
      subs[k] += g->batch.submissions[k];
      refused[k] += g->batch.refused[k];
    }
  }
  int wanted = d->cfg.g1_enable != KV_CFG_G1_OFF;
  H("kvcached_g1_enabled", "gauge", "1 when a G1 device pool is up.");
  P("kvcached_g1_enabled %d\n", g1->on > 0);
  H("kvcached_g1_unavailable", "gauge",
    "1 when G1 was wanted (g1.enable auto or on) but a device of g1.device or its pool could not "
    "be had (reason in the log).");
  P("kvcached_g1_unavailable %d\n", wanted && g1->on < g1->n);
  H("kvcached_g1_pool_bytes", "gauge",
    "Bytes of the G1 device pools, all devices together (0 when off).");
  P("kvcached_g1_pool_bytes %llu\n", U(pool_bytes));
  H("kvcached_g1_device_up", "gauge",
    "Per device of g1.device (its ordinal): 1 when its pool is up, 0 when it could not be had.");
  for (unsigned i = 0; i < g1->n; i++)
    P("kvcached_g1_device_up{device=\"%d\"} %d\n", g1->g[i].ordinal, g1->g[i].on);
  H("kvcached_g1_device_pool_bytes", "gauge", "Bytes of the G1 pool on each device (its ordinal).");
  for (unsigned i = 0; i < g1->n; i++)
    P("kvcached_g1_device_pool_bytes{device=\"%d\"} %llu\n", g1->g[i].ordinal,
      U(g1->g[i].on ? kv_dev_pool_bytes(g1->g[i].pool) : 0));
  H("kvcached_g1_exports_total", "counter",
    "G1 pool exports sent to workers, in HELLO and G1_SELECT replies.");
  static const char *const g1k[] = {"vmm_fd", "legacy_ipc", "sim_fd"};
  for (int i = 0; i < 3; i++)
    P("kvcached_g1_exports_total{kind=\"%s\"} %llu\n", g1k[i], U(exports[i + 1]));
  H("kvcached_g1_selects_total", "counter",
    "G1_SELECT requests (a worker asking for its device's pool): answered with a pool, or with "
    "none (the worker uses G2).");
  P("kvcached_g1_selects_total{result=\"pool\"} %llu\n", U(g1->selects[0]));
  P("kvcached_g1_selects_total{result=\"none\"} %llu\n", U(g1->selects[1]));
  H("kvcached_g1_copies_total", "counter",
    "Block copies between G1 and G2 that completed: load (G2->G1, for a LOAD to G1) and writeback "
    "(a G1 victim not in G2).");
  P("kvcached_g1_copies_total{dir=\"load\"} %llu\n", U(c->g1_loads));
  P("kvcached_g1_copies_total{dir=\"writeback\"} %llu\n", U(c->g1_writebacks));
  H("kvcached_g1_copy_failures_total", "counter",
    "Block copies between G1 and G2 the device failed (a failed load is answered from G2; a failed "
    "write-back keeps the G1 copy).");
  P("kvcached_g1_copy_failures_total{dir=\"load\"} %llu\n", U(c->g1_load_failed));
  P("kvcached_g1_copy_failures_total{dir=\"writeback\"} %llu\n", U(c->g1_writeback_failed));
  H("kvcached_g1_submissions_total", "counter",
    "Submissions to the devices' copy engines: the copies queued in one turn of the loop go as one "
    "per direction and device.");
  P("kvcached_g1_submissions_total{dir=\"load\"} %llu\n", U(subs[KV_DEV_H2D]));
  P("kvcached_g1_submissions_total{dir=\"writeback\"} %llu\n", U(subs[KV_DEV_D2H]));
  H("kvcached_g1_copies_refused_total", "counter",
    "Copies the device refused at submit (each fails alone: a refused submission is retried copy "
    "by copy).");
  P("kvcached_g1_copies_refused_total{dir=\"load\"} %llu\n", U(refused[KV_DEV_H2D]));
  P("kvcached_g1_copies_refused_total{dir=\"writeback\"} %llu\n", U(refused[KV_DEV_D2H]));
  H("kvcached_bad_frames_total", "counter", "Malformed frames received on the worker socket.");
  P("kvcached_bad_frames_total %llu\n", U(d->st.bad_frames));
  H("kvcached_frames_over_limit_total", "counter",
    "Worker frames refused from their header alone: payload over the connection's limit "
    "(connection closed).");
  P("kvcached_frames_over_limit_total %llu\n", U(d->st.frames_over_limit));
  return 0;
}
#undef P
#undef H

/* --- JSON routes ------------------------------------------------------------------ */

static json_t *tier_json(const tier_view *t) {
  return json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "enabled", t->enabled, "state", t->state,
                   "configured_bytes", (json_int_t)t->configured, "capacity_bytes",
                   (json_int_t)t->capacity, "used_bytes", (json_int_t)t->used, "blocks",
                   (json_int_t)t->blocks, "hits", (json_int_t)t->hits, "evictions",
                   (json_int_t)t->evictions);
}

static json_t *lat_json(const kvd_hist *h) {
  return json_pack("{s:I,s:I,s:I}", "count", (json_int_t)h->count, "p50",
                   (json_int_t)kvd_hist_quantile_us(h, 0.5), "p99",
                   (json_int_t)kvd_hist_quantile_us(h, 0.99));
}

/* Each tenant: its name ("" for the default one), its arena, its G3 share. */
static json_t *tenants_json(kvd *d) {
  json_t *a = json_array();
  for (uint32_t i = 0; i < d->reg.ntenants; i++) {
    const kvd_tenant *t = &d->reg.tenants[i];
    json_t *o =
        json_pack("{s:s,s:b,s:I,s:I,s:I,s:I}", "name", t->cfg.name, "configured", t->configured,
                  "g2_configured_bytes", (json_int_t)t->arena.configured, "g2_capacity_bytes",
                  (json_int_t)t->arena.capacity, "g2_used_bytes", (json_int_t)t->arena.used_bytes,
                  "namespaces", (json_int_t)d->reg.tenant_nns[i]);
    uint64_t share, held;
    if (d->g3 && kv_core_g3_share_get(d->core, i, &share, &held) == 0) {
      uint64_t sb = kv_g3_slot_bytes(d->g3);
      json_object_set_new(o, "g3_share_bytes", json_integer((json_int_t)(share * sb)));
      json_object_set_new(o, "g3_used_bytes", json_integer((json_int_t)(held * sb)));
    }
    json_array_append_new(a, o);
  }
  return a;
}

/* Each tier's view: {"g1": ..., "g2": ..., "g3": ...}. */
static json_t *tiers_json(const snapshot *s) {
  json_t *tiers = json_object();
  for (int t = 0; t < KV_NTIERS; t++)
    json_object_set_new(tiers, tier_names[t], tier_json(&s->t[t]));
  return tiers;
}

/* /stats (daemon/OPS.md). */
/* G3's coding in /stats: its counts and stored ratio (as G4's), what its
 * blocks take in their slots, and the victims too large for a slot. */
static json_t *g3_json(const kv_g3_stats *gs, const kv_core_stats_t *c) {
  return json_pack("{s:o,s:I,s:I,s:I}", "codec",
                   codec_json(gs->coded, gs->coded_raw, gs->decoded, gs->codec_in, gs->codec_out),
                   "held_bytes", (json_int_t)gs->held_bytes, "too_large",
                   (json_int_t)c->g3_too_large, "decode_failed", (json_int_t)gs->decode_failed);
}

static json_t *stats_json(kvd *d, const snapshot *s) {
  kv_core_stats_t cs;
  kv_core_stats(d->core, &cs);
  const kv_core_stats_t *c = &cs;
  json_t *o = json_object();
  json_object_set_new(o, "version", json_string(KV_VERSION));
  json_object_set_new(o, "pid", json_integer(getpid()));
  json_object_set_new(o, "uptime_s", json_integer((json_int_t)uptime_s(d)));
  json_object_set_new(o, "policy",
                      json_pack("{s:s,s:s}", "eviction", kv_core_policy_name(d->core), "admission",
                                kv_config_enum_name("g3.admit", d->cfg.g3_admit)));
  json_object_set_new(o, "tiers", tiers_json(s));
  json_object_set_new(o, "g4", g4_json(d) ?: json_pack("{s:s}", "state", "off"));
  if (d->g3) json_object_set_new(o, "g3", g3_json(&s->gs, &cs));
  json_t *m = json_object();
  for (int i = 0; i < KVD_MISS_COUNT; i++)
    json_object_set_new(m, kvd_miss_names[i], json_integer((json_int_t)d->m.misses[i]));
  json_object_set_new(o, "misses", m);
  json_object_set_new(o, "lookups", json_integer((json_int_t)c->lookups));
  json_object_set_new(o, "corrupt_reports",
                      json_pack("{s:I,s:I,s:I,s:I}", "confirmed", (json_int_t)d->trust.confirmed,
                                "rejected", (json_int_t)d->trust.rejected, "dropped",
                                (json_int_t)d->trust.dropped, "pending",
                                (json_int_t)d->trust.npend));
  json_t *tr = json_object();
  for (int i = 0; i < KVD_DIR_COUNT; i++)
    json_object_set_new(tr, kvd_dir_names[i],
                        json_pack("{s:I,s:I}", "bytes", (json_int_t)d->m.copy_bytes[i], "ops",
                                  (json_int_t)d->m.copy_ops[i]));
  json_object_set_new(o, "traffic", tr);
  json_object_set_new(o, "demotions", json_integer((json_int_t)c->demotions));
  json_object_set_new(o, "admissions_refused", json_integer((json_int_t)c->g3_refused));
  json_object_set_new(o, "pins", json_integer((json_int_t)s->pinned));
  json_object_set_new(o, "uncommitted", json_integer((json_int_t)s->uncommitted));
  json_object_set_new(o, "session_limit_refused",
                      json_pack("{s:I,s:I,s:I}", "pins", (json_int_t)d->st.pins_refused, "allocs",
                                (json_int_t)d->st.allocs_refused, "share",
                                (json_int_t)d->st.share_refused));
  json_object_set_new(o, "sessions", json_integer((json_int_t)d->nsessions));
  json_object_set_new(o, "out",
                      json_pack("{s:I,s:I,s:I,s:I}", "bytes", (json_int_t)d->st.out_bytes,
                                "max_connection_bytes", (json_int_t)d->st.out_max_conn,
                                "limit_bytes", (json_int_t)d->st.out_limit, "closed",
                                (json_int_t)d->st.out_closed));
  json_object_set_new(o, "tenants", tenants_json(d));
  json_t *hr = json_object();
  for (int i = 0; i < KVD_HELLO_REFUSED_COUNT; i++)
    json_object_set_new(hr, kvd_hello_refusal_names[i],
                        json_integer((json_int_t)d->reg.hello_refused[i]));
  json_object_set_new(o, "hello_refused", hr);
  json_t *nr = json_object();
  for (int i = 0; i < KVD_NS_REFUSED_COUNT; i++)
    json_object_set_new(nr, kvd_ns_refusal_names[i],
                        json_integer((json_int_t)d->reg.ns_refused[i]));
  json_object_set_new(o, "namespaces",
                      json_pack("{s:I,s:I,s:o}", "live", (json_int_t)d->reg.nlive, "freed",
                                (json_int_t)d->reg.ns_freed, "refused", nr));
  const kvd_presence *pr = &d->pres;
  json_object_set_new(
      o, "presence",
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "namespaces", (json_int_t)pr->published, "bytes",
                (json_int_t)pr->bytes, "maps", (json_int_t)pr->maps, "updates",
                (json_int_t)kvd_presence_updates(pr), "grown", (json_int_t)pr->grown, "partial",
                (json_int_t)pr->partial, "contradicted", (json_int_t)pr->contradicted));
  json_t *rq = json_object();
  char low[32];
  for (uint16_t op = 1; op < KV_OP_COUNT; op++)
    if (op_label(op, low, sizeof low))
      json_object_set_new(rq, low, json_integer((json_int_t)d->st.ops[op]));
  json_object_set_new(o, "requests", rq);
  json_t *hj = json_object(), *stops = json_object();
  json_object_set_new(hj, "session", json_integer((json_int_t)d->st.hints[KV_HINT_SESSION]));
  json_object_set_new(hj, "finished", json_integer((json_int_t)d->st.hints[KV_HINT_FINISHED]));
  json_object_set_new(hj, "end", json_integer((json_int_t)d->st.hints[KV_HINT_END]));
  json_object_set_new(hj, "keys_unmatched", json_integer((json_int_t)d->st.hints_unmatched));
  for (unsigned k = 0; k < KV_STOP_COUNT; k++)
    json_object_set_new(stops, kv_stop_name(k), json_integer((json_int_t)d->st.hint_stops[k]));
  json_object_set_new(hj, "finished_by_stop", stops);
  kv_core_hint_stats hst;
  kv_core_hint_stats_get(d->core, &hst);
  json_object_set_new(hj, "sessions", json_integer((json_int_t)hst.sessions));
  json_object_set_new(hj, "sessions_forgotten", json_integer((json_int_t)hst.forgotten));
  json_object_set_new(o, "hints", hj);
  json_object_set_new(o, "latency_us",
                      json_pack("{s:o,s:o,s:o,s:o,s:o}", "lookup",
                                lat_json(&d->m.req[KVD_REQ_LOOKUP]), "load",
                                lat_json(&d->m.req[KVD_REQ_LOAD]), "g2_to_g3",
                                lat_json(&d->m.copy[KVD_DIR_G2_TO_G3]), "g3_to_g2",
                                lat_json(&d->m.copy[KVD_DIR_G3_TO_G2]), "loop_turn",
                                lat_json(&d->m.loop)));
  return o;
}

/* STATUS (proto/PROTOCOL.md): the worker's summary, with the tiers as
 * /stats shows them. */
static json_t *status_json(kvd *d, const snapshot *s) {
  json_t *tenants = json_array();
  uint64_t cap = 0, used = 0;
  for (uint32_t i = 0; i < d->reg.ntenants; i++) {
    kv_arena *a = &d->reg.tenants[i].arena;
    cap += a->capacity;
    used += a->used_bytes;
    json_array_append_new(tenants,
                          json_pack("{s:s,s:I,s:I,s:I,s:b}", "tenant", d->reg.tenants[i].cfg.name,
                                    "configured_bytes", (json_int_t)a->configured, "capacity_bytes",
                                    (json_int_t)a->capacity, "used_bytes",
                                    (json_int_t)a->used_bytes, "locked", a->locked));
  }
  kv_core_stats_t cs;
  kv_core_stats(d->core, &cs);
  const kv_core_stats_t *c = &cs;
  uint64_t misses = 0; /* every reason, as kvcached_misses_total counts them */
  for (int i = 0; i < KVD_MISS_COUNT; i++) misses += d->m.misses[i];
  json_t *o = json_pack(
      "{s:s,s:I,s:I,s:{s:I,s:I,s:I,s:I,s:o},s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I},s:s,s:I}",
      "version", KV_VERSION, "uptime_s", (json_int_t)uptime_s(d), "sessions",
      (json_int_t)d->nsessions, "g2", "configured_bytes", (json_int_t)s->t[KV_G2].configured,
      "capacity_bytes", (json_int_t)cap, "used_bytes", (json_int_t)used, "blocks",
      (json_int_t)kv_core_index(d->core)->count, "tenants", tenants, "core", "lookups",
      (json_int_t)c->lookups, "hits_g1", (json_int_t)c->hits[KV_G1], "hits_g2",
      (json_int_t)c->hits[KV_G2], "hits_g3", (json_int_t)c->hits[KV_G3], "misses",
      (json_int_t)misses, "evictions_g2", (json_int_t)c->evictions[KV_G2], "allocs",
      (json_int_t)c->allocs, "commits", (json_int_t)c->commits, "aborts", (json_int_t)c->aborts,
      "policy", kv_core_policy_name(d->core), "namespaces", (json_int_t)d->reg.nlive);
  if (o && d->g3) {
    const kv_g3_stats *gs = &s->gs;
    json_object_set_new(
        o, "g3",
        json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "state", kv_g3_state_name(gs->state),
                  "capacity_bytes", (json_int_t)gs->capacity_bytes, "stored_bytes",
                  (json_int_t)gs->stored_bytes, "blocks", (json_int_t)gs->slots_stored, "reads",
                  (json_int_t)gs->reads, "writes", (json_int_t)gs->writes, "corrupt",
                  (json_int_t)gs->corrupt, "io_errors", (json_int_t)gs->io_errors, "warm_blocks",
                  (json_int_t)c->warm_blocks));
    json_object_set_new(json_object_get(o, "core"), "promotions",
                        json_integer((json_int_t)c->promotions));
    json_object_set_new(json_object_get(o, "core"), "g3_admitted",
                        json_integer((json_int_t)c->g3_admitted));
    json_object_set_new(json_object_get(o, "core"), "g3_refused",
                        json_integer((json_int_t)c->g3_refused));
  }
  if (o) json_object_set_new(o, "g4", g4_json(d) ?: json_pack("{s:s}", "state", "off"));
  if (o) json_object_set_new(o, "tiers", tiers_json(s));
  return o;
}

json_t *kvd_stats_json(kvd *d, kvd_json_for what) {
  snapshot s;
  take(d, &s);
  return what == KVD_JSON_STATUS ? status_json(d, &s) : stats_json(d, &s);
}

static json_t *health_json(kvd *d, int *status) {
  json_t *reasons = json_array();
  char r[sizeof d->g3w.why + 160];
  if (d->g3) {
    kv_g3_stats gs;
    kv_g3_get_stats(d->g3, &gs);
    if (gs.state != KV_G3_OK) {
      int n = snprintf(r, sizeof r, "g3 %s: %s: %s", kv_g3_state_name(gs.state), gs.state_what,
                       kv_strerror(gs.state_err));
      if (n > 0 && (size_t)n < sizeof r && gs.state == KV_G3_FULL && d->cfg.g3_retry_ms)
        snprintf(r + n, sizeof r - (size_t)n, " (a write is tried every %u ms)",
                 d->cfg.g3_retry_ms);
      else if (n > 0 && (size_t)n < sizeof r && !strcmp(gs.state_what, "store file removed"))
        snprintf(r + n, sizeof r - (size_t)n, " (restart to make a new store)");
      json_array_append_new(reasons, json_string(r));
    }
  } else if (d->g3w.err) {
    snprintf(r, sizeof r, "g3 unavailable: %s", d->g3w.why);
    json_array_append_new(reasons, json_string(r));
  }
  *status = json_array_size(reasons) ? 503 : 200;
  if (*status == 200) {
    json_decref(reasons);
    return json_pack("{s:s}", "status", "ok");
  }
  return json_pack("{s:s,s:o}", "status", "degraded", "reasons", reasons);
}

static void config_one(void *arg, const char *section, const char *name, const char *value) {
  char key[96];
  snprintf(key, sizeof key, "%s.%s", section, name);
  json_object_set_new(arg, key, json_string(value));
}

typedef struct keys_ctx {
  kvd *d;
  json_t *arr;
  uint64_t limit;
} keys_ctx;

static int key_one(const kv_block *b, void *arg) {
  keys_ctx *k = arg;
  char key[2 * KV_KEY_MAX + 1], ns[2 * KV_G3_NS_BYTES + 1] = "";
  kv_hex_encode(b->key, kv_block_keylen(b), key);
  kv_core_ns_info cn;
  kv_core_ns_info_get(k->d->core, b->ns, &cn);
  if (cn.digest) kv_hex_encode(cn.digest, KV_G3_NS_BYTES, ns);
  json_t *tiers = json_array();
  for (int t = 0; t < KV_NTIERS; t++)
    if (b->tiers & KV_TIER_BIT(t)) json_array_append_new(tiers, json_string(tier_names[t]));
  json_array_append_new(k->arr,
                        json_pack("{s:s,s:s,s:o,s:I,s:I,s:I,s:I}", "key", key, "ns", ns, "tiers",
                                  tiers, "bytes", (json_int_t)b->size, "pins", (json_int_t)b->pins,
                                  "prio", (json_int_t)b->prio, "hits", (json_int_t)b->hits));
  return json_array_size(k->arr) >= k->limit;
}

static json_t *keys_json(kvd *d, const kvd_http_req *req, kvd_http_resp *resp) {
  char v[80];
  uint64_t limit = 20;
  int r = kvd_http_query(req->query, "limit", v, sizeof v);
  if (r < 0 || (r == 1 && (kv_parse_size(v, &limit) || !isdigit((unsigned char)v[0]) ||
                           limit == 0 || limit > 1000))) {
    kvd_http_error(resp, 400, "limit: '%s' is not a count from 1 to 1000", r < 0 ? "?" : v);
    return NULL;
  }
  uint8_t tier = KV_TIER_NONE;
  r = kvd_http_query(req->query, "tier", v, sizeof v);
  if (r == 1 && !strcmp(v, "g2")) tier = KV_G2;
  else if (r == 1 && !strcmp(v, "g3")) tier = KV_G3;
  else if (r != 0) {
    kvd_http_error(resp, 400, "tier: '%s' is not g2 or g3", r < 0 ? "?" : v);
    return NULL;
  }
  uint32_t ns = KV_NS_ANY;
  r = kvd_http_query(req->query, "ns", v, sizeof v);
  if (r != 0) {
    int rc = r < 0 ? -EINVAL : kvd_ns_by_hex(d, v, &ns);
    if (rc) {
      kvd_http_error(resp, rc == -ENOENT ? 404 : 400, "ns: %s",
                     rc == -ENOENT   ? "no namespace has that digest"
                     : rc == -EEXIST ? "the prefix names more than one namespace"
                                     : "wants the namespace digest in hex (at least 8 digits)");
      return NULL;
    }
  }
  keys_ctx k = {d, json_array(), limit};
  uint64_t total = kv_core_sample(d->core, tier, ns, key_one, &k);
  return json_pack("{s:I,s:o}", "total", (json_int_t)total, "keys", k.arr);
}

int kvd_stats_route(kvd *d, const kvd_http_req *req, kvd_http_resp *resp) {
  static const char *const routes[] = {"/metrics", "/stats", "/health", "/config", "/keys"};
  int which = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(req->path, routes[i])) which = i;
  if (which < 0) return 0;
  if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
    kvd_http_error(resp, 405, "%s takes GET", req->path);
    return 1;
  }
  int status = 200;
  json_t *o = NULL;
  switch (which) {
  case 0:
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (kvd_render_metrics(d, &resp->body)) kvd_http_error(resp, 500, "out of memory");
    return 1;
  case 1: o = kvd_stats_json(d, KVD_JSON_STATS); break;
  case 2: o = health_json(d, &status); break;
  case 3:
    o = json_object();
    kv_config_foreach(&d->cfg, config_one, o);
    json_object_set_new(o, "cache.policy", json_string(kv_core_policy_name(d->core)));
    break;
  case 4:
    o = keys_json(d, req, resp);
    if (!o) return 1;
    break;
  }
  kvd_http_json(resp, o, status);
  return 1;
}
