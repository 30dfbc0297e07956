/*
 * g4_owed.h - two small tables of the daemon's G4 side (daemon/g4.c), each
 * bounded, each a pure data structure on the loop thread:
 *
 * kvd_g4_backlog - blocks whose G4 write is owed: committed while G4 was
 *   not ok, or while too many writes were in flight, or whose write failed
 *   (a few times at most: an error or a timeout, as right after the
 *   cluster came back). A FIFO of (namespace
 *   digest, core namespace, key) of at most `cap` entries: when full, the
 *   oldest is dropped (counted). g4.c drains it once G4 is ok again and
 *   writes have room, each entry written only if its block is still in G2
 *   under the same namespace (else counted as gone). 72 bytes an entry.
 *
 * kvd_g4_absent - keys G4 lacked lately: a LOOKUP that found a key absent
 *   remembers it for `ttl_ms`, and the next LOOKUP of that key within that
 *   time does not ask again. Direct-mapped: `cap` (a power of two) slots
 *   of a 64-bit fingerprint of (digest, key) and an expiry; a new key
 *   takes its slot over, so it forgets early rather than grow (a
 *   forgotten key is only asked again). A false "absent" needs two keys'
 *   fingerprints to collide (1 in 2^64). 16 bytes a slot.
 */
#ifndef KV_DAEMON_G4_OWED_H
#define KV_DAEMON_G4_OWED_H

#include <stdint.h>

#include "base/key.h"

typedef struct kvd_g4_owed {
  uint8_t digest[32]; /* the namespace's (its G4 names) */
  uint32_t core_ns;
  uint8_t tries;      /* writes of it that failed already */
  uint32_t coding;    /* how its value is stored (daemon/g4.c: coding, dtype, group) */
  int64_t due_ms;     /* not written before then (a failed write waits) */
  kv_key key;
} kvd_g4_owed;

typedef struct kvd_g4_backlog {
  kvd_g4_owed *v;
  uint32_t cap, head, n;
  uint64_t added, dropped; /* entries taken; dropped when full (the oldest) */
} kvd_g4_backlog;

/* cap entries at most (0: off, every push dropped). 0 or -ENOMEM. */
int kvd_g4_backlog_init(kvd_g4_backlog *b, uint32_t cap);
void kvd_g4_backlog_fini(kvd_g4_backlog *b);
/* Appends an entry (tries: its failed writes so far; coding: how its value
 * is stored, kept for its write; due_ms: not to be written before then),
 * dropping the oldest when full. */
void kvd_g4_backlog_push(kvd_g4_backlog *b, const uint8_t digest[32], uint32_t core_ns,
                         const kv_key *key, uint8_t tries, uint32_t coding, int64_t due_ms);
/* Takes the oldest entry into *out if it is due at now_ms: 1, or 0 when
 * there is none or it is not due. */
int kvd_g4_backlog_pop(kvd_g4_backlog *b, kvd_g4_owed *out, int64_t now_ms);

typedef struct kvd_g4_absent_slot {
  uint64_t fp;
  int64_t until_ms; /* absent until then */
} kvd_g4_absent_slot;

typedef struct kvd_g4_absent {
  kvd_g4_absent_slot *v;
  uint32_t mask;
  uint32_t ttl_ms; /* 0: off */
} kvd_g4_absent;

/* cap slots (rounded up to a power of two; 0 or ttl_ms 0: off). 0 or -ENOMEM. */
int kvd_g4_absent_init(kvd_g4_absent *a, uint32_t cap, uint32_t ttl_ms);
void kvd_g4_absent_fini(kvd_g4_absent *a);
/* The fingerprint of (digest, key). */
uint64_t kvd_g4_absent_fp(const uint8_t digest[32], const kv_key *key);
/* G4 answered fp absent at now_ms. */
void kvd_g4_absent_note(kvd_g4_absent *a, uint64_t fp, int64_t now_ms);
/* fp was answered absent within ttl_ms before now_ms. */
int kvd_g4_absent_recent(const kvd_g4_absent *a, uint64_t fp, int64_t now_ms);
/* fp is no longer absent (written by this node). */
void kvd_g4_absent_forget(kvd_g4_absent *a, uint64_t fp);

#endif
