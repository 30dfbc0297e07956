/*
 * presence.h - the presence table: which keys of one namespace the
 * daemon's local tiers (G1-G3) hold, and the fastest tier of each, in
 * shared memory that the namespace's workers map read-only (PRESENCE,
 * protocol 1.5; proto/PROTOCOL.md, "The presence table"). A worker answers
 * "how much of this prompt is cached" from it without a round trip.
 *
 * Layout (native byte order and atomics: the daemon and its workers share
 * a host), KV_PRES_HDR bytes of header (kv_pres_hdr), then 2^log2 buckets
 * of 64 bytes (one cache line):
 *   u32 seq     even while the bucket is stable; odd while the daemon writes it
 *   u32 zero
 *   u64 ent[7]  0: empty; else fp << 2 | code (code 1..3: the key's fastest
 *               tier is G1..G3)
 * A key hashes (kv_pres_hash) to a 62-bit fingerprint fp; its home bucket
 * is fp's low bits, its other bucket home ^ kv_pres_alt(fp): an entry can
 * move to its other bucket, and a table can be rebuilt at another size,
 * from fp alone (partial-key cuckoo hashing). Two keys of a namespace with
 * the same fp (2^-62 for digests) share an entry: a stale or shared
 * "present" ends in a LOAD that reports the block missing (fail closed).
 *
 * One writer (the daemon's loop) and any number of readers in any process.
 * The writer never waits for a reader: a bucket's writer makes seq odd,
 * writes, makes it even; a reader retries a bucket whose seq was odd or
 * changed while it read. Moving entries between buckets (to make room)
 * makes the header's moves odd for the while, so that a reader that found
 * nothing can tell that a key may have been in flight, and retries. So an
 * answer (kv_pres_find) is the table's state at one instant during the
 * call: never older than the call.
 *
 * The table holds what the daemon's index holds, not more: every change
 * the daemon makes (commit, eviction, promotion, demotion, delete) is
 * written before the daemon answers anything that depends on it. When the
 * daemon stops updating a table (the namespace is gone, or it moved to a
 * larger table) it sets retired; a reader that sees it discards its answer
 * and asks again (PRESENCE). A table that could not take a key (no room
 * found by moving entries) has KV_PRES_PARTIAL: its "absent" answers mean
 * nothing, its "present" ones still do.
 */
#ifndef KV_PROTO_PRESENCE_H
#define KV_PROTO_PRESENCE_H

#include <stddef.h>
#include <stdint.h>

#define KV_PRES_MAGIC    0x53455250u /* bytes "PRES" */
#define KV_PRES_VERSION  1
#define KV_PRES_HDR      64u
#define KV_PRES_BUCKET   64u
#define KV_PRES_WAYS     7u
#define KV_PRES_LOG2_MIN 6u  /* 64 buckets: 448 entries, 4 KiB */
#define KV_PRES_LOG2_MAX 28u /* 2^28 buckets: 16 GiB, 1.9e9 entries */

/* Header flags. */
#define KV_PRES_G4      0x1u /* the daemon asks G4 for keys its local tiers lack */
#define KV_PRES_PARTIAL 0x2u /* some key could not be placed: "absent" is unknown */

typedef struct kv_pres_hdr {
  uint32_t magic;   /* KV_PRES_MAGIC */
  uint16_t version; /* KV_PRES_VERSION */
  uint16_t hdr_bytes;
  uint32_t log2;     /* 2^log2 buckets follow the header */
  uint32_t flags;    /* KV_PRES_* (atomic: PARTIAL may come later) */
  uint32_t retired;  /* atomic: 1 when the daemon no longer updates the table */
  uint32_t moves;    /* atomic: odd while entries move between buckets */
  uint64_t updates;  /* atomic: entries written since the table was made */
  uint64_t count;    /* atomic: entries in use */
  uint8_t rsv[24];
} kv_pres_hdr;
_Static_assert(sizeof(kv_pres_hdr) == KV_PRES_HDR, "presence header is 64 bytes");

typedef struct kv_pres_bucket {
  uint32_t seq;
  uint32_t zero;
  uint64_t ent[KV_PRES_WAYS];
} kv_pres_bucket;
_Static_assert(sizeof(kv_pres_bucket) == KV_PRES_BUCKET, "a bucket is one cache line");

/* Bytes of a table of 2^log2 buckets. */
static inline size_t kv_pres_bytes(unsigned log2) {
  return KV_PRES_HDR + ((size_t)KV_PRES_BUCKET << log2);
}

/* The 62-bit fingerprint of key[0..len) (len 1..32), never 0 in practice. */
uint64_t kv_pres_hash(const uint8_t *key, unsigned len);

/* A mapped table: header and buckets at base. */
typedef struct kv_pres {
  kv_pres_hdr *h;
  kv_pres_bucket *b;
  uint64_t mask; /* buckets - 1 */
} kv_pres;

/* Checks a mapping of `bytes` bytes (magic, version, size) and points t at
 * it. 0, or -EPROTO (not a table this code reads). */
int kv_pres_attach(kv_pres *t, void *base, size_t bytes);

/* --- readers -------------------------------------------------------------- */

/* The code (1..3: tier G1..G3 + 1) of fingerprint fp, 0 when absent, or
 * -EAGAIN when the writer kept the buckets busy past a bounded number of
 * retries (the caller asks the daemon instead). */
int kv_pres_find(const kv_pres *t, uint64_t fp);

/* Whether the daemon still updates the table (0) or not (1). */
int kv_pres_retired(const kv_pres *t);
uint32_t kv_pres_flags(const kv_pres *t);

/* --- the writer (the daemon) ------------------------------------------------ */

/* Makes an empty table of 2^log2 buckets in base[0..kv_pres_bytes(log2)),
 * which must be zeroed, with flags. */
void kv_pres_format(kv_pres *t, void *base, unsigned log2, uint32_t flags);

/* Records fp with code (1..3), or changes its code. 0 (also when nothing
 * changed), or -ENOSPC when no room was found (the table is unchanged). */
int kv_pres_set(kv_pres *t, uint64_t fp, int code);
/* Removes fp. 0, or -ENOENT when absent. */
int kv_pres_del(kv_pres *t, uint64_t fp);
/* Copies every entry of `from` into `to` (empty, any size). 0 or -ENOSPC. */
int kv_pres_copy(kv_pres *to, const kv_pres *from);
/* Sets flag bits (KV_PRES_PARTIAL) and retired, for the readers. */
void kv_pres_flag(kv_pres *t, uint32_t flags);
void kv_pres_retire(kv_pres *t);
uint64_t kv_pres_count(const kv_pres *t);

#endif
