/*
 * g4.h - the daemon's side of G4, the tier every node of a fleet shares
 * (tiers/G4.md, "In the daemon"): the Redis Cluster client on the loop,
 * blocks written at commit, a LOOKUP's missing keys asked of the cluster
 * (its reply deferred until they are answered), DELETE passed on, and
 * what is counted. Off (every call a no-op) when g4.seeds is empty. The
 * core knows nothing of it. Loop thread only.
 *
 * Every value written is signed, and every value read verified, with the
 * fleet's secret (g4.key_file; g4.old_key_file for reads during a
 * rotation: tiers/g4_format.h), held here alone: locked in memory, read
 * only, wiped when G4 closes, never sent to workers or shown.
 */
#ifndef KV_DAEMON_G4_H
#define KV_DAEMON_G4_H

#include <stdint.h>
#include <uv.h>

#include "daemon/g4_owed.h"
#include "daemon/stats.h"
#include "tiers/block.h"
#include "tiers/g4_cluster.h"
#include "tiers/g4_format.h"

struct kvd;
struct kvd_ns;
struct kvd_sink;
struct kv_msg;
struct kv_buf;

/* Why a key a LOOKUP asked G4 for was not served from it
 * (kvcached_g4_misses_total{reason}): the refusals are kv_g4_check's. */
#define KVD_G4_MISS_MAP(X)                                                      \
  X(ABSENT, "absent")           /* nil: nobody wrote it, or it expired */       \
  X(SHORT, "short")             /* refused by kv_g4_check: kv_g4_miss_name */   \
  X(MAGIC, "magic")                                                             \
  X(VERSION, "version")                                                         \
  X(HEADER_CRC, "header_crc")                                                   \
  X(KEY, "key")                                                                 \
  X(LENGTH, "length")                                                           \
  X(PAYLOAD_CRC, "payload_crc")                                                 \
  X(TIMEOUT, "timeout")         /* no answer within g4.timeout_ms */            \
  X(ERROR, "error")             /* any other failure (conn, down slot, ...) */  \
  X(DOWN, "down")               /* G4 was down: not asked at all */             \
  X(NO_ROOM, "no_room")         /* verified, but G2 had no slot for it */       \
  X(GAP, "gap")                 /* verified, but an earlier key missed */       \
  X(RECENT, "recent")           /* not asked: G4 answered it absent within    \
                                   g4.absent_ms */                             \
  X(MAC, "mac")                 /* refused by kv_g4_check: not signed by the  \
                                   fleet's secret (forged, or an old secret    \
                                   past g4.old_key_until) */                   \
  X(DECODE, "decode")           /* a coded value, signed, that did not decode \
                                   to its block (its CRC) */
typedef enum {
#define KVD_G4_MISS_ENUM(name, label) KVD_G4_MISS_##name,
  KVD_G4_MISS_MAP(KVD_G4_MISS_ENUM)
#undef KVD_G4_MISS_ENUM
  KVD_G4_MISS_COUNT
} kvd_g4_miss;
extern const char *const kvd_g4_miss_names[KVD_G4_MISS_COUNT];

/* What became of a block to be written (kvcached_g4_writes_total{result}). */
#define KVD_G4_WRITE_MAP(X)                                                    \
  X(OK, "ok")             /* the cluster took it */                            \
  X(ERROR, "error")       /* refused or failed: timeout, connection, ...  */   \
  X(OOM, "oom")           /* the cluster is full (maxmemory, no eviction) */   \
  X(SKIPPED, "skipped")   /* not written: G4 was not ok */                     \
  X(BUSY, "busy")         /* not written: too many writes in flight */     \
  X(CORRUPT, "corrupt")   /* not written: its bytes in G2 no longer match \
                             the commit's CRC (a worker wrote them since) */ \
  X(GONE, "gone")         /* not written: it left G2 (evicted, deleted)   \
                             before its write started */
typedef enum {
#define KVD_G4_WRITE_ENUM(name, label) KVD_G4_W_##name,
  KVD_G4_WRITE_MAP(KVD_G4_WRITE_ENUM)
#undef KVD_G4_WRITE_ENUM
  KVD_G4_W_COUNT
} kvd_g4_write;
extern const char *const kvd_g4_write_names[KVD_G4_W_COUNT];

/* Writes in flight at most, and their bytes: past either, a block is not
 * written (busy) rather than queued without bound in hiredis' buffers. */
#define KVD_G4_WRITES_MAX      4096u
#define KVD_G4_WRITE_BYTES_MAX (256ull << 20)
/* Keys remembered absent (g4_owed.h), at most: 256 KiB. */
#define KVD_G4_ABSENT_SLOTS 16384u
/* A write that fails is owed again (g4_owed.h): after KVD_G4_RETRY_MS
 * while the cluster says it is down or a node is unreachable (as after a
 * restart, until its nodes agree), for as long as the backlog keeps it;
 * after any other failure (a timeout, an error) KVD_G4_WRITE_TRIES writes
 * at most, each retry twice as late as the one before. */
#define KVD_G4_WRITE_TRIES 3
#define KVD_G4_RETRY_MS    1000
/* Committed blocks' writes started per turn of the loop at most, in bytes
 * (each is copied out of G2 on the loop): a COMMIT of many blocks starts
 * their writes over several turns, other requests served in between. */
#define KVD_G4_TURN_BYTES (1ull << 20)
/* Owed writes started per housekeeping tick at most, in bytes (copied out
 * of G2 on the loop: about a millisecond): 4 MiB every 100 ms; and each
 * time a write ends, at most KVD_G4_DRAIN_STEP, so that a backlog keeps
 * the writes in flight and drains at the cluster's pace. */
#define KVD_G4_DRAIN_BYTES (4ull << 20)
#define KVD_G4_DRAIN_STEP  (1ull << 20)

/* Blocks of namespaces whose values are coded (g4.codec, tiers/codec.h),
 * kvcached_g4_codec_blocks_total{result}: written coded, written raw (no
 * gain, or its bytes no longer matched), read and decoded. */
#define KVD_G4_CODEC_MAP(X) X(CODED, "coded") X(RAW, "raw") X(DECODED, "decoded")
typedef enum {
#define KVD_G4_CODEC_ENUM(name, label) KVD_G4_CODEC_##name,
  KVD_G4_CODEC_MAP(KVD_G4_CODEC_ENUM)
#undef KVD_G4_CODEC_ENUM
  KVD_G4_CODEC_COUNT
} kvd_g4_codec;
extern const char *const kvd_g4_codec_names[KVD_G4_CODEC_COUNT];

typedef struct kvd_g4 {
  kv_g4c *c;             /* NULL: G4 off (or closed) */
  kv_g4_keys *keys;      /* the secrets (sodium_malloc: locked, read-only); NULL when off */
  kv_g4c_state logged;   /* the state the log last said */
  int64_t logged_ms;     /* when it said it */
  uint64_t hits;         /* blocks a LOOKUP brought into G2 from G4 */
  uint64_t misses[KVD_G4_MISS_COUNT];
  uint64_t writes[KVD_G4_W_COUNT];
  uint64_t codec[KVD_G4_CODEC_COUNT];
  uint64_t codec_bytes[2]; /* the blocks written coded: their bytes, and what was stored */
  kvd_hist codec_time[2];  /* a block's coding (0) and decoding (1), on the thread pool */
  uint64_t deletes[2];   /* DELs: answered (0), or failed or not sent while down (1) */
  uint64_t lookups;      /* LOOKUPs that asked G4 (waited for it) */
  uint32_t waiting;      /* ... of those, still waiting */
  uint32_t writes_in_flight;
  uint64_t write_bytes_in_flight;
  kvd_hist lookup;       /* from the first GET sent to the last answer */
  int closing;
  uv_loop_t *loop;
  uint32_t works;            /* MACs being made or checked off the loop */
  struct g4_write *signing;  /* writes whose value is being signed */
  kv_g4_keys *keys_closed;   /* the secrets of a closing client, freed once it is closed
                                and the last work is done */
  int closed;                /* the client's close callback came */
  kvd_g4_backlog backlog;    /* blocks whose write is owed (g4.backlog_blocks) */
  kvd_g4_backlog fresh;      /* blocks just committed whose write is to start (the pump) */
  uv_idle_t pump;            /* starts fresh writes, KVD_G4_TURN_BYTES a turn */
  struct g4_commit *commits, **commits_tail; /* COMMITs with KV_COMMIT_G4 whose writes the
                                                pump has not all started, oldest first */
  uint64_t commit_queued;                    /* ... their blocks not started yet */
  struct g4_lookup *storing, **storing_tail; /* LOOKUPs whose run from G4 the pump is
                                                copying into G2, oldest first */
  int pump_init, pump_on;
  uint64_t backlog_written, backlog_gone; /* owed writes started; gone from G2 first */
  int draining;              /* in drain(): a write ending inside it does not reenter */
  kvd_g4_absent absent;      /* keys G4 lacked lately (g4.absent_ms) */
} kvd_g4;

/* Reads the key files and opens the client on loop when g4.seeds is set
 * (it connects in the background: G4 starts down and comes up by itself).
 * 0, or an error (logged; a key file kv_config_check took that is no
 * longer valid too): the daemon then runs without G4. */
int kvd_g4_start(struct kvd *d, uv_loop_t *loop);
/* Closes the client: commands in flight get their callbacks (LOOKUPs
 * waiting are answered from G1-G3) while the loop runs on; the secrets
 * are wiped once it is closed. */
void kvd_g4_stop(struct kvd *d);

/* From the housekeeping tick: logs state changes (at most one line a
 * second, the last state always said). */
void kvd_g4_tick(struct kvd *d);

/* The block b of registry namespace n was just used by a LOAD or GET:
 * written to G4 when g4.admit = second-use and this use is its second. */
void kvd_g4_used(struct kvd *d, const struct kvd_ns *n, const kv_block *b);

/* The block b of registry namespace n was just committed: written to G4
 * when g4.admit says so (always; second-use: when the commit is its second
 * use, as for a block back soon after its eviction). */
void kvd_g4_committed(struct kvd *d, const struct kvd_ns *n, const kv_block *b);

/* What a LOAD or GET does once G4 answered (kvd_g4_fetch): its n keys are
 * in d->keys again; req is the request (id and op); reply through sink;
 * t0: when kvd_g4_fetch was called (kv_now_ns), for its latency. */
typedef void (*kvd_g4_then)(struct kvd *d, struct kvd_sink *sink, const struct kv_msg *req,
                            uint32_t n, uint8_t target, uint64_t t0);

/* A LOAD or GET of session sink->sess whose keys (the n of d->keys) a
 * local tier does not all hold: when G4 is up, asks it for each key no
 * local tier holds (not one it answered absent within g4.absent_ms),
 * stores every verified value into G2 (as a LOOKUP with KV_LOOKUP_ALL),
 * then calls then: KVD_DEFERRED. 0 when G4 is off or down or nothing is
 * to be asked (the caller goes on now). */
int kvd_g4_fetch(struct kvd *d, struct kvd_sink *sink, const struct kv_msg *req, uint32_t n,
                 uint8_t target, kvd_g4_then then);

/* A COMMIT with KV_COMMIT_G4 of session sink->sess: st[i] (count of them)
 * are its statuses, blocks[i] the block of key i where st[i] is 0. Writes
 * each committed block to G4 (whatever g4.admit says: the writer asked)
 * and answers the COMMIT through the sink once every write has ended:
 * KVD_DEFERRED. The writes start on later turns of the loop, at most
 * KVD_G4_TURN_BYTES of blocks a turn. A block committed here that did not
 * reach G4 (G4 off, not ok, too many writes in flight, gone from G2 before
 * its write started, an error or a timeout) is answered KV_EDEGRADED. 0
 * when no write is to be made (G4 off, no block committed, no memory):
 * the caller answers now with st, which this has updated. */
int kvd_g4_commit_wait(struct kvd *d, struct kvd_sink *sink, const struct kv_msg *req,
                       const struct kvd_ns *n, kv_block *const *blocks, int32_t *st,
                       uint32_t count);

/* The key was deleted: DEL it in G4 too (fire and forget, counted). */
void kvd_g4_del(struct kvd *d, const struct kvd_ns *n, const kv_key *key);

/* A LOOKUP of session sink->sess whose local run, `hit` of the n keys
 * in d->keys, is short: when G4 is up, asks it for the next keys (at most
 * g4.lookup_blocks), stores the verified run into G2 and answers the
 * LOOKUP through the sink later: KVD_DEFERRED. With KV_LOOKUP_ALL in the
 * request's flags, asks for the keys past the run that no local tier
 * holds and stores every verified value, past a miss too (each chained
 * to the key before it when that is known). 0 when G4 is off or down, or
 * nothing is to be asked (the caller answers now). t0: when the request
 * was taken, for the LOOKUP's latency. */
int kvd_g4_lookup(struct kvd *d, struct kvd_sink *sink, const struct kv_msg *req, uint32_t n,
                  uint32_t hit, uint64_t t0);

/* The client's state, or -1 when G4 is off. */
int kvd_g4_state(const struct kvd *d);

#endif
