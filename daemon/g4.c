/*
 * g4.c - G4 in the daemon (g4.h; tiers/G4.md, "In the daemon").
 *
 * Writes: a block is written when it is committed (g4.admit = always) or
 * when a LOAD or GET uses it a second time (second-use): its key is queued
 * and the pump starts the writes, at most KVD_G4_TURN_BYTES a turn of the
 * loop, while its bytes are in G2 (gone otherwise): the payload is copied
 * out of G2 into its place in the SET's RESP at once, so nothing of G2 is
 * held; on libuv's thread pool that copy is checked against the commit's
 * CRC (a copy that fails, bytes a worker changed in G2 after the commit,
 * is not written: result "corrupt"), coded when its namespace's values are
 * (g4.codec, a tenant's cold_precision: tiers/G4.md, "Coded values") and
 * signed with the current secret; back on the loop the SET is handed to the
 * client, which takes the buffer. A DEL of the key while its value is
 * being signed cancels the SET, so a deleted block never comes back. Only
 * while the client is ok; bounded in flight. A COMMIT with KV_COMMIT_G4
 * (its worker waits for the writes) is queued for the pump too, ahead of
 * the blocks committed without it, and its blocks are copied at the same
 * pace: a COMMIT of 16 blocks of 1 MiB was 16 MiB copied in one turn of
 * the loop, every other request waiting (BENCHMARKS.md).
 *
 * Reads: a LOOKUP whose local run is short asks G4 for the keys after it,
 * one pipelined GET each (the client groups them per node). Each answer is
 * checked as it comes, on the loop (kv_g4_check against the namespace
 * digest, the key, the namespace's block size and the secrets accepted
 * now: a value without a valid MAC is a `mac` miss), and a verified
 * value taken from hiredis' reply (not copied; a coded one is decoded on
 * the thread pool, into a buffer of its own); when the last answer is in (the
 * client answers every command within g4.timeout_ms), the verified run that
 * continues the local one goes into G2 as committed blocks, chained to
 * their parents, with the value's CRC (at most KVD_G4_TURN_BYTES of them
 * a turn of the loop, the rest by the pump), and the LOOKUP is answered as
 * usual: those blocks are G2 hits now. A session gone meanwhile is owed
 * nothing: what came back is dropped.
 *
 * The MAC (Poly1305 under a one-time ChaCha20 key) is the pass over a
 * value that costs (tiers/G4.md, "Values"). A write's runs off the loop,
 * where it delays nobody; a read's runs on it, as each answer comes (see
 * on_get). A work reads the secrets, which outlive the client until the
 * last work is done (keys_closed). Where the thread pool refuses a work,
 * it runs on the loop.
 */
#include "daemon/g4.h"

#include <errno.h>
#include <sodium.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/log.h"
#include "daemon/kvd.h"
#include "tiers/codec.h"
#include "tiers/quant.h"

const char *const kvd_g4_miss_names[KVD_G4_MISS_COUNT] = {
#define KVD_G4_MISS_LABEL(name, label) label,
    KVD_G4_MISS_MAP(KVD_G4_MISS_LABEL)
#undef KVD_G4_MISS_LABEL
};
const char *const kvd_g4_write_names[KVD_G4_W_COUNT] = {
#define KVD_G4_WRITE_LABEL(name, label) label,
    KVD_G4_WRITE_MAP(KVD_G4_WRITE_LABEL)
#undef KVD_G4_WRITE_LABEL
};
const char *const kvd_g4_codec_names[KVD_G4_CODEC_COUNT] = {
#define KVD_G4_CODEC_LABEL(name, label) label,
    KVD_G4_CODEC_MAP(KVD_G4_CODEC_LABEL)
#undef KVD_G4_CODEC_LABEL
};

_Static_assert(KVD_G4_MISS_SHORT == (int)KV_G4_MISS_SHORT &&
                   KVD_G4_MISS_PAYLOAD_CRC == (int)KV_G4_MISS_PAYLOAD_CRC &&
                   KV_G4_MISS_MAC == KV_G4_MISS_PAYLOAD_CRC + 1,
               "kvd_g4_miss's refusals are kv_g4_miss's, in its order, but MAC");

/* kv_g4_check's reason as a kvd_g4_miss: the same number, but MAC
 * (appended to both lists: labels are append only). */
static int8_t miss_of(kv_g4_miss why) {
  return (int8_t)(why == KV_G4_MISS_MAC      ? KVD_G4_MISS_MAC
                  : why == KV_G4_MISS_DECODE ? KVD_G4_MISS_DECODE
                                             : (int)why);
}

/* The secrets, in memory of their own: locked (not swapped), guarded,
 * read-only once loaded, wiped when freed. NULL (logged) when the key
 * files cannot be read. */
static kv_g4_keys *keys_load(const kv_config *cfg) {
  char err[512];
  if (sodium_init() < 0) {
    kv_error("g4", "libsodium does not start: running without G4");
    return NULL;
  }
  kv_g4_keys *keys = sodium_malloc(sizeof *keys);
  if (!keys) {
    kv_error("g4", "no memory for the G4 secrets: running without G4");
    return NULL;
  }
  if (kv_config_g4_keys(cfg, keys, err, sizeof err)) {
    kv_error("g4", "%s: running without G4", err);
    sodium_free(keys);
    return NULL;
  }
  sodium_mprotect_readonly(keys);
  if (keys->old.len) {
    char until[32];
    struct tm tm;
    time_t t = (time_t)keys->old_until;
    strftime(until, sizeof until, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    kv_info("g4", "values signed with secret %08x; those of old secret %08x accepted until %s",
            keys->cur.id, keys->old.id, until);
  } else {
    kv_info("g4", "values signed with secret %08x", keys->cur.id);
  }
  return keys;
}

/* The secrets of a closed client go (wiped) once no work reads them. */
static void keys_release(kvd_g4 *g) {
  if (g->closed && !g->works && g->keys_closed) {
    sodium_free(g->keys_closed);
    g->keys_closed = NULL;
  }
}

static void on_closed(kv_g4c *c, void *arg) {
  kvd_g4 *g = arg;
  g->closed = 1;
  keys_release(g);
}

/* A work off the loop is done (on the loop). */
static void work_done(kvd_g4 *g) {
  g->works--;
  keys_release(g);
}

int kvd_g4_state(const kvd *d) { return d->g4.c ? (int)kv_g4c_get_state(d->g4.c) : -1; }

int kvd_g4_start(kvd *d, uv_loop_t *loop) {
  kvd_g4 *g = &d->g4;
  if (!d->cfg.g4_seeds[0]) return 0;
  char buf[sizeof d->cfg.g4_seeds];
  const char *seeds[KV_G4C_SEEDS_MAX];
  int n = kv_config_g4_seeds(&d->cfg, buf, seeds, KV_G4C_SEEDS_MAX);
  if (n <= 0) return -EINVAL; /* kv_config_check refused it before */
  if (!(g->keys = keys_load(&d->cfg))) return -EINVAL;
  kv_g4c_opts o = {.seeds = seeds,
                   .nseeds = (unsigned)n,
                   .user = d->cfg.g4_user[0] ? d->cfg.g4_user : NULL,
                   .password = d->cfg.g4_password[0] ? d->cfg.g4_password : NULL,
                   .timeout_ms = (int)d->cfg.g4_timeout_ms,
                   .read_replicas = d->cfg.g4_replica_reads,
                   .refresh_ms = (int)d->cfg.g4_map_refresh_ms};
  g->loop = loop;
  int rc = kv_g4c_open(loop, &o, &g->c);
  if (rc) {
    kv_error("g4", "cannot start the Redis Cluster client: %s: running without G4", strerror(-rc));
    g->c = NULL;
    sodium_free(g->keys);
    g->keys = NULL;
    return rc;
  }
  uv_idle_init(loop, &g->pump);
  g->pump.data = d;
  g->pump_init = 1;
  g->commits_tail = &g->commits;
  g->storing_tail = &g->storing;
  if (kvd_g4_backlog_init(&g->backlog, d->cfg.g4_backlog_blocks) ||
      kvd_g4_backlog_init(&g->fresh, d->cfg.g4_backlog_blocks) ||
      kvd_g4_absent_init(&g->absent, KVD_G4_ABSENT_SLOTS, d->cfg.g4_absent_ms)) {
    kv_error("g4", "no memory for the backlog of writes: running without G4");
    kvd_g4_stop(d);
    return -ENOMEM;
  }
  g->logged = KV_G4C_DOWN;
  g->logged_ms = kv_now_ms();
  kv_info("g4", "Redis Cluster at %s (prefix '%s', ttl %u s, timeout %u ms): connecting",
          d->cfg.g4_seeds, d->cfg.g4_prefix, d->cfg.g4_ttl_s, d->cfg.g4_timeout_ms);
  return 0;
}

static void start_commits(kvd *d, uint64_t *bytes, uint64_t max);
static void store_runs(kvd *d, uint64_t *bytes, uint64_t max);

void kvd_g4_stop(kvd *d) {
  kvd_g4 *g = &d->g4;
  if (!g->c) return;
  g->closing = 1;
  g->keys_closed = g->keys; /* callbacks and works may still come: the keys stay till then */
  kv_g4c_close(g->c, on_closed, g);
  g->c = NULL;
  g->keys = NULL;
  kvd_g4_backlog_fini(&g->backlog); /* owed writes not made by now are not made */
  kvd_g4_backlog_fini(&g->fresh);   /* nor writes not started */
  /* No pump any more: the queued COMMITs are answered now (each block not
   * started KV_EDEGRADED: no client), and the LOOKUPs storing what came. */
  uint64_t bytes = 0;
  start_commits(d, &bytes, UINT64_MAX);
  store_runs(d, &bytes, UINT64_MAX);
  kvd_g4_absent_fini(&g->absent);
  if (g->pump_init) uv_close((uv_handle_t *)&g->pump, NULL);
  g->pump_init = g->pump_on = 0;
}

static void drain(kvd *d, uint64_t max_bytes);

void kvd_g4_tick(kvd *d) {
  kvd_g4 *g = &d->g4;
  if (!g->c) return;
  kv_g4c_state s = kv_g4c_get_state(g->c);
  if (s == KV_G4C_OK && g->backlog.n) drain(d, KVD_G4_DRAIN_BYTES);
  int64_t now = kv_now_ms();
  if (s == g->logged || now - g->logged_ms < 1000) return;
  kv_g4c_stats st;
  kv_g4c_get_stats(g->c, &st);
  if (s == KV_G4C_OK)
    kv_info("g4", "Redis Cluster ok: %u masters, %u slots", st.masters, st.slots);
  else
    kv_warn("g4", "Redis Cluster %s: %u masters mapped (%u nodes known), %u of %d slots%s",
            kv_g4c_state_name(s), st.masters, st.nodes, st.slots, KV_G4C_SLOTS,
            s == KV_G4C_DOWN ? ": LOOKUPs do not ask G4, blocks are not written"
                             : ": blocks are not written");
  g->logged = s;
  g->logged_ms = now;
}

/* How a value is stored, in one word (the queues keep it): a coding
 * (KV_G4_CODING_*, 0: as it is), the lossy ones' dtype (1 BF16, 2 FP16)
 * and group (the elements of one scale: the layout's head_dim). */
#define CODING(c, dt, g) ((uint32_t)(c) | (uint32_t)(dt) << 8 | (uint32_t)(g) << 16)
#define CODING_OF(x)     ((int)((x) & 0xffu))
#define DTYPE_OF(x)      ((int)(((x) >> 8) & 0xffu))
#define GROUP_OF(x)      ((unsigned)((x) >> 16))
static int lossy(uint32_t coding) {
  return CODING_OF(coding) == KV_G4_CODING_FP8 || CODING_OF(coding) == KV_G4_CODING_INT8;
}

/* The digest that names a namespace's values in G4: its own, or for lossy
 * values one of its own per code (BLAKE2b keyed by the namespace digest),
 * so that a node reading exact blocks never asks for a lossy value, nor
 * one reading FP8 for INT8 (tiers/G4.md, "Coded values"). */
static void g4_digest(const uint8_t ns[32], uint32_t coding, uint8_t out[32]) {
  if (!lossy(coding)) {
    memcpy(out, ns, 32);
    return;
  }
  const char *m = CODING_OF(coding) == KV_G4_CODING_FP8 ? "kvcached-g4-fp8" : "kvcached-g4-int8";
  crypto_generichash(out, 32, (const uint8_t *)m, strlen(m), ns, 32);
}

static void g4_key(kv_g4_key *k, const uint8_t digest[32], const uint8_t *key, unsigned len) {
  memcpy(k->ns, digest, KV_G4_NS_BYTES);
  memset(k->b, 0, sizeof k->b);
  k->len = (uint8_t)len;
  memcpy(k->b, key, len);
}

/* The G4 key of (digest, key) in *k and its Redis name in rkey
 * (KV_G4_RKEY_MAX bytes): the name's length, or <= 0 when there is none. */
static int g4_name(const kvd *d, const uint8_t digest[32], const uint8_t *key, unsigned len,
                   kv_g4_key *k, char *rkey) {
  g4_key(k, digest, key, len);
  return kv_g4_rkey(d->cfg.g4_prefix, k, rkey, KV_G4_RKEY_MAX);
}

/* --- writes ------------------------------------------------------------------ */

/* A COMMIT with KV_COMMIT_G4 waiting for its writes (kvd_g4_commit_wait):
 * queued (g->commits) until the pump has started the write of each of its
 * blocks, then waiting for the writes to end. */
typedef struct g4_commit {
  kvd *d;
  kvd_sink *sink;
  kv_msg req; /* id and op, for the reply */
  int reg_ns;
  uint32_t n, pending; /* pending: writes under way, and 1 while queued */
  uint32_t at;         /* queued: the next block whose write the pump starts */
  uint32_t coding;     /* how its namespace's values are stored (CODING) */
  uint8_t digest[32];  /* its namespace's (the core's): a block is found again by it */
  struct g4_commit *next; /* g->commits */
  struct g4_commit_block {
    kv_key key;
    uint32_t core_ns;
  } *blk;       /* the block of st[i], where st[i] is 0 */
  int32_t st[]; /* the reply's statuses */
} g4_commit;

typedef struct g4_write {
  kvd_g4 *g;
  uint32_t bytes; /* the value's */
  uv_work_t work; /* signing it, off the loop */
  const kv_g4_secret *secret;
  kv_g4_key k;
  uint32_t size, crc;
  char *cmd;     /* the SET, in RESP, its value built in place (kv_g4c_resp) */
  size_t cmdlen;
  uint8_t *val; /* in cmd: the header, then the payload copied out of G2 */
  int rl;
  char rkey[KV_G4_RKEY_MAX];
  uint8_t digest[32];             /* its namespace's (the core's), to owe the write again */
  int cancelled;                  /* a DEL of its key came while it was signed */
  int signed_rc;                  /* kv_g4_encode_hdr's */
  struct g4_write *next, **pprev; /* g->signing */
  g4_commit *cw;                  /* the COMMIT waiting for it, or NULL */
  uint32_t ci;                    /* its key's index there */
  uint32_t core_ns;               /* the block's, to owe the write again */
  uint8_t tries;                  /* earlier writes of the block that failed */
  uint32_t coding;                /* how it is to be stored: CODING_OF, DTYPE_OF, GROUP_OF */
  uint32_t ttl_s;
  uint32_t stored;                /* coded: the stored bytes' length; 0: sent raw */
  uint64_t code_ns;               /* the coding's time (on the thread pool) */
} g4_write;

static void commit_done(g4_commit *cw);
static void drain(kvd *d, uint64_t max_bytes);
static void pump_start(kvd_g4 *g);

/* The write ended: in G4 (ok) or not. Its room goes to owed writes, if
 * any: a backlog streams at the cluster's pace, not the tick's. */
static void write_end(g4_write *w, int ok) {
  kvd_g4 *g = w->g;
  g->writes_in_flight--;
  g->write_bytes_in_flight -= w->bytes;
  if (w->cw) {
    if (!ok) w->cw->st[w->ci] = KV_EDEGRADED;
    if (--w->cw->pending == 0) commit_done(w->cw);
  }
  free(w->cmd);
  free(w);
  if (g->fresh.n)
    pump_start(g); /* writes committed and not started first */
  else if (g->backlog.n && g->c && kv_g4c_get_state(g->c) == KV_G4C_OK)
    drain((kvd *)((char *)g - offsetof(kvd, g4)), KVD_G4_DRAIN_STEP);
}

static void on_set(kv_g4c *c, const kv_g4c_reply *r, void *arg) {
  g4_write *w = arg;
  kvd_g4 *g = w->g;
  if (r->kind == KV_G4C_VALUE) {
    g->writes[KVD_G4_W_OK]++;
  } else if (r->reason == KV_G4C_R_OOM) {
    g->writes[KVD_G4_W_OOM]++;
  } else {
    g->writes[KVD_G4_W_ERROR]++;
    /* owed again: while the cluster says it is down (CLUSTERDOWN, LOADING, a
     * node unreachable: as after a restart, until its nodes agree) each
     * second; after any other failure a few times, each later */
    int down = r->reason == KV_G4C_R_DOWN || r->reason == KV_G4C_R_CONN;
    uint8_t tries = (uint8_t)(w->tries + !down);
    if (tries < KVD_G4_WRITE_TRIES && g->c) {
      kv_key key;
      kv_key_set(&key, w->k.b, w->k.len);
      kvd_g4_backlog_push(&g->backlog, w->digest, w->core_ns, &key, tries, w->coding,
                          kv_now_ms() + ((int64_t)KVD_G4_RETRY_MS << (down ? 0 : w->tries)));
    }
  }
  write_end(w, r->kind == KV_G4C_VALUE);
}

/* A SET of w's key (w->rkey) expiring in w->ttl_s, with room for a value
 * of vlen bytes: the command in *cmd (malloc'ed) and *len; where the value
 * goes in it, or NULL (no memory). */
static uint8_t *set_command(const g4_write *w, size_t vlen, char **cmd, size_t *len) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%u", w->ttl_s);
  const char *argv[] = {"SET", w->rkey, NULL, "EX", ttl};
  size_t lens[] = {3, (size_t)w->rl, vlen, 2, strlen(ttl)};
  size_t at = 0;
  *len = kv_g4c_resp(NULL, 5, argv, lens, 2, &at);
  if (!(*cmd = malloc(*len))) return NULL;
  kv_g4c_resp(*cmd, 5, argv, lens, 2, &at);
  return (uint8_t *)*cmd + at;
}

/* Off the loop: w's payload coded into a new SET (w->cmd replaced, its
 * value signed as coded), when that makes it smaller and the payload still
 * matches its CRC: losslessly (KV_G4_CODING_PLANES), or in FP8 or INT8
 * codes (its namespace's cold_precision), whose value carries the CRC of
 * what they decode to. 0 when done; -1 when w is left as it was (sent raw,
 * a mismatch reported by kv_g4_encode_hdr; a lossy block with a
 * non-finite element too). */
static int code_value(g4_write *w) {
  const uint8_t *payload = w->val + KV_G4_HDR_LEN;
  int coding = CODING_OF(w->coding), dt = DTYPE_OF(w->coding);
  unsigned group = GROUP_OF(w->coding);
  int lossy_ = lossy(w->coding);
  size_t n = w->size / 2, cap = lossy_ ? kv_quant_size(n, group) : kv_codec_bound(w->size);
  uint8_t *buf;
  kv_codec *cx = kv_codec_thread(cap + (lossy_ ? w->size : 0), &buf); /* lossy: decodes too */
  if (!cx || kv_crc32c(0, payload, w->size) != w->crc) return -1;
  long sl;
  uint32_t crc = w->crc;
  if (!lossy_) {
    sl = kv_codec_encode(cx, payload, w->size, buf, cap);
  } else {
    kv_quant_kind k = coding == KV_G4_CODING_FP8 ? KV_QUANT_FP8 : KV_QUANT_INT8;
    kv_quant_dtype qd = dt == 1 ? KV_QDT_BF16 : KV_QDT_FP16;
    uint8_t *back = buf + cap;
    if (w->size % 2 || kv_quant_encode(k, qd, payload, n, group, buf) ||
        kv_quant_decode(k, qd, buf, n, group, back))
      return -1;
    sl = (long)cap;
    crc = kv_crc32c(0, back, w->size); /* what a reader gets */
  }
  if (sl <= 0 || (size_t)sl >= w->size) return -1; /* KV_CODEC_NOGAIN, or an error: raw */
  char *cmd;
  size_t len;
  uint8_t *val = set_command(w, KV_G4_HDR_LEN + (size_t)sl, &cmd, &len);
  if (!val) return -1;
  if (kv_g4_encode_hdr_coded(&w->k, w->secret, buf, (uint32_t)sl, w->size, crc, coding,
                             lossy_ ? dt : 0, val)) {
    free(cmd);
    return -1;
  }
  memcpy(val + KV_G4_HDR_LEN, buf, (size_t)sl);
  free(w->cmd);
  w->cmd = cmd;
  w->cmdlen = len;
  w->val = val;
  w->stored = (uint32_t)sl;
  w->signed_rc = 0;
  return 0;
}

static void sign_work(uv_work_t *req) {
  g4_write *w = req->data;
  if (w->coding) {
    uint64_t t0 = kv_now_ns();
    int coded = code_value(w) == 0;
    w->code_ns = kv_now_ns() - t0;
    if (coded) return;
  }
  w->signed_rc =
      kv_g4_encode_hdr(&w->k, w->secret, w->val + KV_G4_HDR_LEN, w->size, w->crc, w->val);
}

/* The value is signed: SET it, unless its key was deleted meanwhile or the
 * client closed. */
static void sign_done(uv_work_t *req, int status) {
  g4_write *w = req->data;
  kvd_g4 *g = w->g;
  *w->pprev = w->next;
  if (w->next) w->next->pprev = w->pprev;
  work_done(g);
  if (status || w->cancelled || !g->c) {
    g->writes[KVD_G4_W_SKIPPED]++;
    write_end(w, 0);
    return;
  }
  if (w->coding) {
    g->codec[w->stored ? KVD_G4_CODEC_CODED : KVD_G4_CODEC_RAW]++;
    kvd_hist_add(&g->codec_time[0], w->code_ns);
    if (w->stored) {
      g->codec_bytes[0] += w->size;
      g->codec_bytes[1] += w->stored;
    }
  }
  if (w->signed_rc) { /* KV_ECORRUPT: G2's bytes no longer match the commit's CRC */
    g->writes[w->signed_rc == KV_ECORRUPT ? KVD_G4_W_CORRUPT : KVD_G4_W_ERROR]++;
    write_end(w, 0);
    return;
  }
  int rc = kv_g4c_command_resp(g->c, w->rkey, (size_t)w->rl, 0, w->cmd, w->cmdlen, on_set, w);
  w->cmd = NULL;
  w->val = NULL; /* the client's now */
  if (rc) {
    g->writes[KVD_G4_W_ERROR]++;
    write_end(w, 0);
  }
}

/* Writes b (of the namespace whose digest is given) to G4 now, when G4 is
 * ok and the writes in flight leave room; else its write is owed (the
 * backlog). cw (may be NULL) is told when the write ends. 0 when the
 * write is under way, -1 when it was not started (counted). */
static int g4_put(kvd *d, const uint8_t digest[32], const kv_block *b, uint32_t coding,
                  g4_commit *cw, uint32_t ci, uint8_t tries) {
  kvd_g4 *g = &d->g4;
  if (!g->c) return -1;
  kv_key key;
  kv_key_set(&key, b->key, kv_block_keylen(b));
  size_t vlen = kv_g4_value_len(b->size);
  int busy = g->writes_in_flight >= KVD_G4_WRITES_MAX ||
             g->write_bytes_in_flight + vlen > KVD_G4_WRITE_BYTES_MAX;
  if (kv_g4c_get_state(g->c) != KV_G4C_OK || busy) {
    g->writes[busy ? KVD_G4_W_BUSY : KVD_G4_W_SKIPPED]++;
    kvd_g4_backlog_push(&g->backlog, digest, b->ns, &key, tries, coding, 0);
    return -1;
  }
  if (b->size > KV_G4_PAYLOAD_MAX) {
    g->writes[KVD_G4_W_BUSY]++;
    return -1;
  }
  uint8_t gd[32];
  g4_digest(digest, coding, gd);
  kvd_g4_absent_forget(&g->absent, kvd_g4_absent_fp(gd, &key));
  const uint8_t *src = kv_core_g2_ptr(d->core, b);
  g4_write *w = calloc(1, sizeof *w);
  if (w) w->ttl_s = d->cfg.g4_ttl_s;
  if (!src || !w || (w->rl = g4_name(d, gd, b->key, kv_block_keylen(b), &w->k, w->rkey)) <= 0 ||
      !(w->val = set_command(w, vlen, &w->cmd, &w->cmdlen))) {
    free(w);
    g->writes[KVD_G4_W_ERROR]++;
    return -1;
  }
  w->cw = cw;
  w->ci = ci;
  w->core_ns = b->ns;
  w->tries = tries;
  w->coding = coding;
  memcpy(w->digest, digest, 32);
  if (cw) cw->pending++;
  /* the copy is what is signed and sent, whatever G2 holds by then */
  memcpy(w->val + KV_G4_HDR_LEN, src, b->size);
  w->g = g;
  w->bytes = (uint32_t)vlen;
  w->secret = &g->keys->cur;
  w->size = b->size;
  w->crc = b->crc;
  w->work.data = w;
  g->writes_in_flight++;
  g->write_bytes_in_flight += vlen;
  g->works++;
  w->next = g->signing;
  w->pprev = &g->signing;
  if (g->signing) g->signing->pprev = &w->next;
  g->signing = w;
  if (uv_queue_work(g->loop, &w->work, sign_work, sign_done)) {
    sign_work(&w->work); /* no thread pool: on the loop */
    sign_done(&w->work, 0);
  }
  return 0;
}

/* How namespace n's values are stored (CODING): lossy when its tenant's
 * cold_precision says so; else coded losslessly with g4.codec auto and a
 * 16-bit dtype; else as they are (0). */
static uint32_t coded_ns(const kvd *d, const kvd_ns *n) {
  if (n->quant)
    return CODING(n->quant == KV_QUANT_FP8 ? KV_G4_CODING_FP8 : KV_G4_CODING_INT8, n->dtype16,
                  n->head_dim);
  return d->cfg.g4_codec == KV_G4_CODEC_AUTO && n->dtype16 ? CODING(KV_G4_CODING_PLANES, 0, 0)
                                                            : 0;
}

/* The block of key in core namespace core_ns, if it is still in G2 and the
 * namespace is still the one of that digest (a namespace id freed and
 * given to another never sends one tenant's block under another's name);
 * else NULL. */
static kv_block *g2_block(kvd *d, uint32_t core_ns, const kv_key *key, const uint8_t *digest) {
  kv_block *b = kv_core_find(d->core, core_ns, key);
  kv_core_ns_info ni;
  if (!b || !(b->tiers & KV_TIER_BIT(KV_G2)) || kv_core_ns_info_get(d->core, core_ns, &ni) ||
      !ni.digest || memcmp(ni.digest, digest, KV_G3_NS_BYTES))
    return NULL;
  return b;
}

/* The block queued entry e names (g2_block). */
static kv_block *queued_block(kvd *d, const kvd_g4_owed *e) {
  return g2_block(d, e->core_ns, &e->key, e->digest);
}

/* Starts the writes of the COMMITs with KV_COMMIT_G4 queued, oldest first,
 * until *bytes (the blocks copied this turn of the loop) reaches max; each
 * COMMIT whose every write is started leaves the queue (answered now if
 * they all ended already). A block gone from G2 meanwhile (deleted,
 * evicted) is not written: it is answered KV_EDEGRADED, as a write that
 * was not started (busy, G4 not ok or closed: g4_put). */
static void start_commits(kvd *d, uint64_t *bytes, uint64_t max) {
  kvd_g4 *g = &d->g4;
  while (g->commits && *bytes < max) {
    g4_commit *cw = g->commits;
    while (cw->at < cw->n && *bytes < max) {
      uint32_t i = cw->at++;
      if (cw->st[i]) continue;
      g->commit_queued--;
      kv_block *b = g2_block(d, cw->blk[i].core_ns, &cw->blk[i].key, cw->digest);
      if (!b) {
        g->writes[KVD_G4_W_GONE]++;
        cw->st[i] = KV_EDEGRADED;
        continue;
      }
      if (g4_put(d, cw->digest, b, cw->coding, cw, i, 0)) cw->st[i] = KV_EDEGRADED;
      *bytes += b->size;
    }
    if (cw->at < cw->n) return;
    g->commits = cw->next;
    if (!g->commits) g->commits_tail = &g->commits;
    if (--cw->pending == 0) commit_done(cw);
  }
}

/* The pump: each turn of the loop, copies at most KVD_G4_TURN_BYTES of
 * blocks: into G2, the runs LOOKUPs brought from G4 (g->storing); out of
 * G2, for their writes, the blocks of the COMMITs with KV_COMMIT_G4 queued,
 * then, while the writes in flight have room, the oldest blocks waiting in
 * g->fresh. Stops when none waits, or only g->fresh does and there is no
 * room (a write that ends starts it again). */
static void on_pump(uv_idle_t *h) {
  kvd *d = h->data;
  kvd_g4 *g = &d->g4;
  kvd_g4_owed e;
  uint64_t bytes = 0;
  store_runs(d, &bytes, KVD_G4_TURN_BYTES);    /* workers wait for these */
  start_commits(d, &bytes, KVD_G4_TURN_BYTES); /* and for these */
  while (g->c && g->writes_in_flight < KVD_G4_WRITES_MAX &&
         g->write_bytes_in_flight < KVD_G4_WRITE_BYTES_MAX && bytes < KVD_G4_TURN_BYTES &&
         kvd_g4_backlog_pop(&g->fresh, &e, 0)) {
    kv_block *b = queued_block(d, &e);
    if (!b) {
      g->writes[KVD_G4_W_GONE]++;
      continue;
    }
    g4_put(d, e.digest, b, e.coding, NULL, 0, 0); /* not started: owed (counted there) */
    bytes += b->size;
  }
  if (!g->c || (!g->storing && !g->commits &&
                 (!g->fresh.n || g->writes_in_flight >= KVD_G4_WRITES_MAX ||
                  g->write_bytes_in_flight >= KVD_G4_WRITE_BYTES_MAX))) {
    uv_idle_stop(h);
    g->pump_on = 0;
  }
}

static void pump_start(kvd_g4 *g) {
  if (g->pump_on || !g->pump_init || !g->c) return;
  g->pump_on = 1;
  uv_idle_start(&g->pump, on_pump);
}

/* b's write is to start: queued for the pump, which starts it within a
 * turn or a few (a COMMIT of many blocks is not copied out of G2 in one
 * turn of the loop). Queued past g4.backlog_blocks, the oldest is dropped
 * (busy). */
static void queue_write(kvd *d, const kvd_ns *n, const kv_block *b) {
  kvd_g4 *g = &d->g4;
  if (!g->c) return;
  kv_key key;
  kv_key_set(&key, b->key, kv_block_keylen(b));
  uint64_t dropped = g->fresh.dropped;
  kvd_g4_backlog_push(&g->fresh, n->digest, b->ns, &key, 0, coded_ns(d, n), 0);
  g->writes[KVD_G4_W_BUSY] += g->fresh.dropped - dropped;
  pump_start(g);
}

void kvd_g4_committed(kvd *d, const kvd_ns *n, const kv_block *b) {
  /* second-use: a block committed again soon after its eviction is on its
   * second use already (the policy's history said so: hits 2); a LOAD will
   * not take its count to 2 again, so it goes now or never. */
  if (d->cfg.g4_admit == KV_ADMIT_ALWAYS || b->hits >= 2) queue_write(d, n, b);
}

void kvd_g4_used(kvd *d, const kvd_ns *n, const kv_block *b) {
  /* second-use: this use took its count to two (a commit is its first;
   * the count saturates, so this is once), while it is in G2 */
  if (d->cfg.g4_admit == KV_ADMIT_SECOND_USE && b->hits == 2 && (b->tiers & KV_TIER_BIT(KV_G2)))
    queue_write(d, n, b);
}

/* The owed writes, oldest first, while G4 is ok and writes have room
 * (half the caps: commits keep the rest); each once per call, and at most
 * max_bytes of them (each is copied out of G2 on the loop, so a large
 * backlog drains in steps: one per tick, one per write that ends). A block
 * no longer in G2 under the namespace it was committed in is gone: its
 * bytes are not read back from G3 for it. Not reentered (a write that ends
 * inside one). */
static void drain(kvd *d, uint64_t max_bytes) {
  kvd_g4 *g = &d->g4;
  if (g->draining) return;
  g->draining = 1;
  kvd_g4_owed e;
  int64_t now = kv_now_ms();
  uint64_t bytes = 0;
  for (uint32_t budget = g->backlog.n;
       budget && g->writes_in_flight < KVD_G4_WRITES_MAX / 2 &&
       g->write_bytes_in_flight < KVD_G4_WRITE_BYTES_MAX / 2 && bytes < max_bytes &&
       kvd_g4_backlog_pop(&g->backlog, &e, now);
       budget--) {
    kv_block *b = queued_block(d, &e);
    if (!b) {
      g->backlog_gone++;
      continue;
    }
    if (g4_put(d, e.digest, b, e.coding, NULL, 0, e.tries)) break; /* owed again, at the end */
    g->backlog_written++;
    bytes += b->size;
  }
  g->draining = 0;
}

/* --- COMMIT with KV_COMMIT_G4 -------------------------------------------------- */

/* Whether the session that sent a request through sink, registered in
 * namespace reg_ns then, is still there to be answered (else nobody is
 * owed a reply). */
static int owed(const kvd_sink *sink, int reg_ns) {
  return sink->sess && sink->sess->ns == reg_ns;
}

static void commit_done(g4_commit *cw) {
  if (owed(cw->sink, cw->reg_ns)) {
    kv_msg m = kvd_reply_to(&cw->req);
    m.statuses.n = cw->n;
    m.statuses.v = cw->st;
    kvd_sink_reply(cw->sink, &m);
  }
  kvd_sink_put(cw->sink);
  free(cw->blk);
  free(cw);
}

int kvd_g4_commit_wait(kvd *d, kvd_sink *sink, const kv_msg *req, const kvd_ns *n,
                       kv_block *const *blocks, int32_t *st, uint32_t count) {
  kvd_g4 *g = &d->g4;
  uint32_t want = 0;
  for (uint32_t i = 0; i < count; i++) want += st[i] == 0;
  g4_commit *cw = NULL;
  if (want && g->c && g->pump_init && (cw = calloc(1, sizeof *cw + count * sizeof cw->st[0])) &&
      !(cw->blk = calloc(count, sizeof *cw->blk))) {
    free(cw);
    cw = NULL;
  }
  if (!cw) { /* answered now: committed here, not known to be in G4 */
    for (uint32_t i = 0; i < count; i++)
      if (st[i] == 0) st[i] = KV_EDEGRADED;
    return 0;
  }
  cw->d = d;
  cw->sink = sink;
  kvd_sink_get(sink);
  cw->req = *req;
  cw->reg_ns = sink->sess->ns;
  cw->n = count;
  cw->pending = 1; /* held while queued: no write that ends answers it early */
  cw->coding = coded_ns(d, n);
  memcpy(cw->digest, n->digest, sizeof cw->digest);
  memcpy(cw->st, st, count * sizeof *st);
  for (uint32_t i = 0; i < count; i++) {
    if (st[i]) continue;
    kv_key_set(&cw->blk[i].key, blocks[i]->key, kv_block_keylen(blocks[i]));
    cw->blk[i].core_ns = blocks[i]->ns;
  }
  *g->commits_tail = cw;
  g->commits_tail = &cw->next;
  g->commit_queued += want;
  pump_start(g);
  return KVD_DEFERRED;
}

/* --- deletes ----------------------------------------------------------------- */

static void on_del(kv_g4c *c, const kv_g4c_reply *r, void *arg) {
  kvd_g4 *g = arg;
  g->deletes[r->kind == KV_G4C_ERROR]++;
}

void kvd_g4_del(kvd *d, const kvd_ns *n, const kv_key *key) {
  kvd_g4 *g = &d->g4;
  if (!g->c) return;
  if (kv_g4c_get_state(g->c) == KV_G4C_DOWN) { /* not sent: the value lives out its TTL */
    g->deletes[1]++;
    return;
  }
  kv_g4_key k;
  char rkey[KV_G4_RKEY_MAX];
  uint8_t gd[32];
  g4_digest(n->digest, coded_ns(d, n), gd);
  int rl = g4_name(d, gd, key->b, key->len, &k, rkey);
  if (rl <= 0) return;
  for (g4_write *w = g->signing; w; w = w->next) /* being signed: never SET after this DEL */
    if (w->rl == rl && !memcmp(w->rkey, rkey, (size_t)rl)) w->cancelled = 1;
  const char *argv[] = {"DEL", rkey};
  size_t lens[] = {3, (size_t)rl};
  if (kv_g4c_command(g->c, rkey, (size_t)rl, 0, 2, argv, lens, on_del, g)) g->deletes[1]++;
}

/* --- LOOKUP ------------------------------------------------------------------ */

typedef struct g4_lookup g4_lookup;

typedef struct g4_get {
  g4_lookup *lk;
  uint8_t *val; /* the verified value (its payload at KV_G4_HDR_LEN), taken from the reply;
                 NULL otherwise */
  uint32_t crc;
  int8_t miss; /* kvd_g4_miss, or -1 for a verified value */
} g4_get;

struct g4_lookup {
  kvd *d;
  kvd_sink *sink;
  kv_msg req; /* id and op, for the reply */
  int reg_ns;
  uint32_t core_ns;
  uint8_t digest[32];
  uint32_t block_bytes;
  const kv_g4_keys *secrets; /* g4.keys, which outlives every callback of the client */
  uint32_t n, hit, nask, pending;
  int past_holes; /* KV_LOOKUP_ALL, or a LOAD: every key asked is stored, not only the run */
  kvd_g4_then then; /* a LOAD or GET's: called instead of the LOOKUP's answer */
  uint8_t target;   /* ... with this target tier */
  uint64_t t0, g4_t0;
  kv_key *keys; /* the LOOKUP's n keys */
  g4_get *get;  /* nask, for keys at[0..nask-1] */
  uint32_t *at; /* nask: the key index each GET is for (hit, hit+1, ... without past_holes) */
  uint32_t stored; /* the answers store_run has been through */
  int ended;       /* ... and the run ended there (a miss, no room) */
  g4_lookup *next; /* g->storing */
};

static void lookup_free(g4_lookup *lk) {
  for (uint32_t i = 0; i < lk->nask; i++) free(lk->get[i].val);
  kvd_sink_put(lk->sink);
  free(lk->keys);
  free(lk->get);
  free(lk->at);
  free(lk);
}

/* The verified run into G2 (with past_holes, every verified value): alloc
 * (chained to the previous key when it is known), copy, commit with the
 * value's CRC. Counts each key asked once. Goes on from where the last
 * call stopped, until *bytes (the blocks copied this turn of the loop)
 * reaches max: 1 when the run is all through, 0 when there is more. */
static int store_run(g4_lookup *lk, uint64_t *bytes, uint64_t max) {
  kvd *d = lk->d;
  kvd_g4 *g = &d->g4;
  int ended = lk->ended;
  for (; lk->stored < lk->nask && *bytes < max; lk->stored++) {
    uint32_t i = lk->stored;
    g4_get *x = &lk->get[i];
    if (x->miss >= 0) {
      g->misses[x->miss]++;
      ended = !lk->past_holes;
      continue;
    }
    if (ended) {
      g->misses[KVD_G4_MISS_GAP]++;
      continue;
    }
    uint32_t at = lk->at[i];
    const kv_key *key = &lk->keys[at], *parent = at ? &lk->keys[at - 1] : NULL;
    kv_block *b = NULL;
    int rc = kv_core_alloc(d->core, lk->core_ns, key, parent, KV_PRIO_DEFAULT, &b);
    if (rc == KV_EEXISTS && b && b->state == KV_BS_READY) continue; /* stored here meanwhile */
    if (rc) {
      g->misses[KVD_G4_MISS_NO_ROOM]++;
      ended = !lk->past_holes;
      continue;
    }
    memcpy(kv_core_g2_ptr(d->core, b), x->val + KV_G4_HDR_LEN, b->size);
    kv_core_commit(d->core, b, x->crc);
    kvd_ghost_note(d, lk->core_ns, key, 1);
    g->hits++;
    *bytes += b->size;
    free(x->val); /* copied: its memory goes back now, not at the answer */
    x->val = NULL;
  }
  lk->ended = ended;
  return lk->stored == lk->nask;
}

/* The LOOKUP answered (or its LOAD or GET taken up again) with its run in
 * G2; nothing if its session went meanwhile. */
static void lookup_finish(g4_lookup *lk) {
  kvd *d = lk->d;
  d->g4.waiting--; /* its reply waited for G4 until now */
  if (!owed(lk->sink, lk->reg_ns)) {
    lookup_free(lk);
    return;
  }
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core); /* a soft g2.capacity */
  if (lk->then) { /* a LOAD or GET: taken up again with its keys in d->keys */
    memcpy(d->keys, lk->keys, lk->n * sizeof *lk->keys);
    lk->then(d, lk->sink, &lk->req, lk->n, lk->target, lk->t0);
    lookup_free(lk);
    return;
  }
  kv_msg m = kvd_lookup_answer(d, lk->reg_ns, lk->core_ns, lk->keys, lk->n, &lk->req);
  kvd_sink_reply(lk->sink, &m);
  kvd_req_done(d, KVD_REQ_LOOKUP, lk->t0);
  lookup_free(lk);
}

/* Every answer is in: the verified run goes into G2, at most
 * KVD_G4_TURN_BYTES of it this turn of the loop and the rest by the pump
 * on the next turns (16 blocks of 1 MiB were 16 MiB copied in one turn),
 * then the LOOKUP is answered. */
static void lookup_done(g4_lookup *lk) {
  kvd *d = lk->d;
  kvd_g4 *g = &d->g4;
  kvd_hist_add(&g->lookup, kv_now_ns() - lk->g4_t0);
  if (!owed(lk->sink, lk->reg_ns)) { /* nothing stored for nobody */
    g->waiting--;
    lookup_free(lk);
    return;
  }
  uint64_t bytes = 0; /* no pump (the client closed): all of it now */
  if (store_run(lk, &bytes, g->pump_init ? KVD_G4_TURN_BYTES : UINT64_MAX)) {
    lookup_finish(lk);
    return;
  }
  *g->storing_tail = lk;
  g->storing_tail = &lk->next;
  pump_start(g);
}

/* The runs of the LOOKUPs queued (g->storing), oldest first, until *bytes
 * reaches max; each LOOKUP whose run is all in G2 is answered. */
static void store_runs(kvd *d, uint64_t *bytes, uint64_t max) {
  kvd_g4 *g = &d->g4;
  while (g->storing && store_run(g->storing, bytes, max)) {
    g4_lookup *lk = g->storing;
    g->storing = lk->next;
    if (!g->storing) g->storing_tail = &g->storing;
    lookup_finish(lk);
  }
}

/* A coded value's decoding, on the thread pool. */
typedef struct g4_decode {
  uv_work_t work;
  g4_get *x;
  uint32_t n, stored_len;
  int coding, dtype; /* the value's (kv_g4_view) */
  uint8_t *out; /* KV_G4_HDR_LEN bytes of room, then the block */
  int ok;
  uint64_t ns; /* the decoding's time */
} g4_decode;

static void decode_work(uv_work_t *req) {
  g4_decode *q = req->data;
  g4_get *x = q->x;
  kv_codec *cx = kv_codec_thread(0, NULL);
  const uint8_t *stored = x->val + KV_G4_HDR_LEN;
  uint64_t t0 = kv_now_ns();
  if (!cx || !(q->out = malloc(KV_G4_HDR_LEN + (size_t)q->n))) return;
  uint8_t *out = q->out + KV_G4_HDR_LEN;
  int rc;
  if (q->coding == KV_G4_CODING_PLANES) {
    rc = kv_codec_decode(cx, stored, q->stored_len, out, q->n);
  } else {
    /* n elements and their scales: the group is what the stored length
     * says (n + 4 n / g bytes), and must be a whole divisor of n */
    size_t n = q->n / 2, extra = q->stored_len > n ? q->stored_len - n : 0;
    size_t g = extra && (4 * n) % extra == 0 ? 4 * n / extra : 0;
    rc = q->n % 2 || !g || g > UINT32_MAX || n % g
             ? -EBADMSG
             : kv_quant_decode(q->coding == KV_G4_CODING_FP8 ? KV_QUANT_FP8 : KV_QUANT_INT8,
                               q->dtype == 1 ? KV_QDT_BF16 : KV_QDT_FP16, stored, n,
                               (unsigned)g, out);
  }
  q->ok = rc == 0 && kv_crc32c(0, out, q->n) == x->crc;
  q->ns = kv_now_ns() - t0;
}

static void lookup_done(g4_lookup *lk);

/* The block decoded (or not): it takes the stored value's place, or is a
 * DECODE miss; the LOOKUP goes on when it was its last answer. */
static void decode_done(uv_work_t *req, int status) {
  g4_decode *q = req->data;
  g4_get *x = q->x;
  g4_lookup *lk = x->lk;
  kvd_g4 *g = &lk->d->g4;
  work_done(g);
  free(x->val);
  x->val = NULL;
  if (!status) kvd_hist_add(&g->codec_time[1], q->ns);
  if (!status && q->ok) {
    x->val = q->out;
    x->miss = -1;
    g->codec[KVD_G4_CODEC_DECODED]++;
  } else {
    free(q->out);
    x->miss = KVD_G4_MISS_DECODE;
  }
  free(q);
  if (--lk->pending == 0) lookup_done(lk);
}

/* x holds a coded value (its stored bytes at KV_G4_HDR_LEN), v its view:
 * decoded on the thread pool, after which its LOOKUP goes on (x
 * holds the LOOKUP's pending count meanwhile). 0, or -1: x is a miss. */
static int decode(g4_get *x, const kv_g4_view *v) {
  kvd_g4 *g = &x->lk->d->g4;
  g4_decode *q = calloc(1, sizeof *q);
  if (!q) return -1;
  q->x = x;
  q->n = v->len;
  q->stored_len = v->stored_len;
  q->coding = v->coding;
  q->dtype = v->dtype;
  q->work.data = q;
  g->works++;
  if (uv_queue_work(g->loop, &q->work, decode_work, decode_done)) {
    g->works--;
    free(q);
    return -1;
  }
  return 0;
}

/* Each answer is checked as it comes, on the loop: the checks overlap
 * the answers still on their way, where one hand-off to the thread pool
 * per LOOKUP (after the last answer) or per value made a LOOKUP of 16
 * 64 KiB blocks slower (tools/bench/g4_bench.sh). A coded value, checked
 * the same way, is decoded on the thread pool (decode). */
static void on_get(kv_g4c *c, const kv_g4c_reply *r, void *arg) {
  g4_get *x = arg;
  g4_lookup *lk = x->lk;
  uint32_t i = (uint32_t)(x - lk->get);
  if (r->kind == KV_G4C_NIL) {
    x->miss = KVD_G4_MISS_ABSENT;
    kvd_g4_absent_note(&lk->d->g4.absent,
                       kvd_g4_absent_fp(lk->digest, &lk->keys[lk->at[i]]),
                       kv_now_ms());
  } else if (r->kind == KV_G4C_ERROR) {
    x->miss = r->reason == KV_G4C_R_TIMEOUT ? KVD_G4_MISS_TIMEOUT : KVD_G4_MISS_ERROR;
  } else {
    kv_g4_key k;
    const kv_key *key = &lk->keys[lk->at[i]];
    g4_key(&k, lk->digest, key->b, key->len);
    kv_g4_view v;
    kv_g4_miss why = KV_G4_MISS_SHORT;
    if (!r->str || kv_g4_check(r->str, r->len, &k, lk->block_bytes, lk->secrets,
                               (int64_t)time(NULL), &v, &why)) {
      x->miss = miss_of(why);
    } else if ((x->val = kv_g4c_reply_take(r))) { /* no copy: the reply's bytes are ours */
      x->crc = v.crc;
      x->miss = -1;
      if (v.coded) {
        if (decode(x, &v) == 0) return; /* decode_done goes on */
        free(x->val);
        x->val = NULL;
        x->miss = KVD_G4_MISS_ERROR;
      }
    } else {
      x->miss = KVD_G4_MISS_ERROR;
    }
  }
  if (--lk->pending == 0) lookup_done(lk);
}

/* Asks G4 for keys hit..n-1 of d->keys (past_holes: each no local tier
 * holds; else the run past hit) and, once answered, stores what came into
 * G2 and answers the LOOKUP, or calls then. KVD_DEFERRED, or 0 when
 * nothing was asked. */
static int ask(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n, uint32_t hit,
               uint64_t t0, int past_holes, kvd_g4_then then, uint8_t target) {
  kvd_g4 *g = &d->g4;
  if (!g->c || g->closing || hit >= n) return 0;
  kvd_session *s = sink->sess;
  kvd_ns *ns = kvd_registry_ns(&d->reg, s->ns);
  /* The keys to ask: past the run, up to the first G4 answered absent
   * within g4.absent_ms (which ends the run: not asked; with past_holes,
   * every such key is skipped, and so is every key a local tier holds). */
  uint8_t gd[32]; /* the namespace's G4 names */
  g4_digest(ns->digest, coded_ns(d, ns), gd);
  static uint32_t chosen[KV_CFG_G4_LOOKUP_MAX]; /* their indices (the loop's thread only) */
  int64_t now = kv_now_ms();
  uint32_t nask = 0;
  for (uint32_t i = hit; i < n && nask < d->cfg.g4_lookup_blocks; i++) {
    if (past_holes && kv_core_find(d->core, (uint32_t)ns->core_ns, &d->keys[i])) continue;
    if (kvd_g4_absent_recent(&g->absent, kvd_g4_absent_fp(gd, &d->keys[i]), now)) {
      g->misses[KVD_G4_MISS_RECENT]++;
      if (past_holes) continue;
      break;
    }
    chosen[nask++] = i;
  }
  if (nask == 0) return 0;
  if (kv_g4c_get_state(g->c) == KV_G4C_DOWN) {
    g->misses[KVD_G4_MISS_DOWN] += nask;
    return 0;
  }
  g4_lookup *lk = calloc(1, sizeof *lk);
  if (lk) {
    lk->keys = malloc(n * sizeof *lk->keys);
    lk->get = calloc(nask, sizeof *lk->get);
    lk->at = malloc(nask * sizeof *lk->at);
  }
  if (!lk || !lk->keys || !lk->get || !lk->at) {
    if (lk) free(lk->keys), free(lk->get), free(lk->at);
    free(lk);
    g->misses[KVD_G4_MISS_ERROR] += nask;
    return 0;
  }
  lk->d = d;
  lk->sink = sink;
  kvd_sink_get(sink);
  lk->req = *req;
  lk->reg_ns = s->ns;
  lk->core_ns = (uint32_t)ns->core_ns;
  memcpy(lk->digest, gd, 32);
  lk->block_bytes = ns->block_bytes;
  lk->secrets = g->keys;
  lk->n = n;
  lk->hit = hit;
  lk->nask = nask;
  lk->past_holes = past_holes;
  lk->then = then;
  lk->target = target;
  memcpy(lk->at, chosen, nask * sizeof *lk->at);
  lk->t0 = t0;
  lk->g4_t0 = kv_now_ns();
  memcpy(lk->keys, d->keys, n * sizeof *lk->keys);
  g->lookups++;
  g->waiting++;
  lk->pending = 1; /* held until every GET is sent: no answer finishes it early */
  unsigned flags = d->cfg.g4_replica_reads ? KV_G4C_READONLY : 0;
  for (uint32_t i = 0; i < nask; i++) {
    g4_get *x = &lk->get[i];
    x->lk = lk;
    x->miss = KVD_G4_MISS_ERROR;
    kv_g4_key k;
    char rkey[KV_G4_RKEY_MAX];
    const kv_key *key = &lk->keys[lk->at[i]];
    int rl = g4_name(d, lk->digest, key->b, key->len, &k, rkey);
    const char *argv[] = {"GET", rkey};
    size_t lens[] = {3, rl > 0 ? (size_t)rl : 0};
    if (rl > 0 && kv_g4c_command(g->c, rkey, (size_t)rl, flags, 2, argv, lens, on_get, x) == 0)
      lk->pending++;
  }
  if (--lk->pending == 0) { /* nothing could be sent: the caller answers now */
    g->lookups--;
    g->waiting--;
    g->misses[KVD_G4_MISS_ERROR] += nask;
    lookup_free(lk);
    return 0;
  }
  return KVD_DEFERRED;
}

int kvd_g4_lookup(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n, uint32_t hit,
                  uint64_t t0) {
  return ask(d, sink, req, n, hit, t0, (req->batch.flags & KV_LOOKUP_ALL) != 0, NULL, 0);
}

int kvd_g4_fetch(kvd *d, kvd_sink *sink, const kv_msg *req, uint32_t n, uint8_t target,
                 kvd_g4_then then) {
  return ask(d, sink, req, n, 0, kv_now_ns(), 1, then, target);
}
