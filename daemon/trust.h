/*
 * trust.h - what the daemon does when a reader reports that a block's bytes
 * fail their committed CRC (RELEASE with KV_REL_CORRUPT, protocol 1.2), and
 * the reported blocks it could not drop yet.
 *
 * The workers of a tenant share its G2 arena and can write it, so the
 * daemon cannot keep them from changing a committed block; it keeps
 * readers from using such bytes instead (daemon/OPS.md, "Trust model"): a
 * reader checks what it reads against the CRC LOAD2 gave it and reports a
 * mismatch. A report is never taken on trust: the daemon checks the CRC
 * over its own G2 copy of the block. When that fails too (confirmed), the
 * block's G2 and G1 copies are dropped (kv_core_drop; a G3 copy stays:
 * its record is verified when it is read back) and the block counts as a
 * `corrupt` miss; when it holds (rejected), nothing changes. A confirmed
 * block that other connections still pin cannot be dropped under them: it
 * waits in a list, LOADs answer it KV_ECORRUPT, and it is dropped once the
 * last pin goes (kvd_trust_sweep, after RELEASEs and from the tick).
 *
 * The list names blocks by (namespace, key, committed CRC), never by record
 * id, so a record reused by another block is never dropped in its place.
 * Every report and drop is counted (kvcached_corrupt_reported_total,
 * kvcached_corrupt_dropped_total) and logged (rate-limited by log.h).
 * Loop thread only.
 */
#ifndef KV_DAEMON_TRUST_H
#define KV_DAEMON_TRUST_H

#include <stdint.h>

#include "tiers/block.h"

#define KVD_TRUST_PENDING_MAX 1024 /* confirmed blocks waiting for their pins to go */

typedef struct kvd_suspect {
  uint32_t core_ns;
  uint32_t crc; /* the committed CRC the bytes failed */
  kv_key key;
} kvd_suspect;

typedef struct kvd_trust {
  uint64_t confirmed; /* reports whose block failed the daemon's own check */
  uint64_t rejected;  /* reports whose block passed it (or could not be checked) */
  uint64_t dropped;   /* confirmed blocks whose G2/G1 copies were dropped */
  kvd_suspect *pend;  /* confirmed, still pinned or in a copy */
  uint32_t npend, cap;
} kvd_trust;

struct kvd;

/*
 * Session `sid` reported b as failing its CRC, after its pin on b was
 * released. Checks the CRC over b's G2 copy: confirmed, the copies are
 * dropped now or b waits in the list; rejected, b stays. Returns 1
 * (confirmed) or 0 (rejected). Never fails: a list that is full logs
 * and leaves the block to the next reader's report.
 */
int kvd_trust_report(struct kvd *d, uint64_t sid, kv_block *b);

/* 1 if b is confirmed corrupt and waits for its drop: a LOAD answers it
 * KV_ECORRUPT (and pins nothing). Cheap when the list is empty. */
int kvd_trust_refused(struct kvd *d, const kv_block *b);

/* Drops the listed blocks that no one pins any more; forgets those that
 * are gone or were stored again. */
void kvd_trust_sweep(struct kvd *d);

void kvd_trust_fini(kvd_trust *t);

#endif
