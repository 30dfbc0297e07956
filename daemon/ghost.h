/*
 * ghost.h - a bounded memory of keys the daemon has held, to tell a miss
 * on a key never seen ("absent") from one on a key that was committed and
 * has gone since ("evicted", or deleted).
 *
 * A fixed-size, 4-way set-associative table of 64-bit fingerprints of
 * (namespace, key), allocated once: add, test and forget are O(1) and
 * allocate nothing. When a set is full the oldest entry of the set goes,
 * so the table remembers roughly the last `slots` distinct keys committed.
 * A fingerprint collision can only call an absent key "evicted" (a
 * statistic, never a decision about data).
 */
#ifndef KV_DAEMON_GHOST_H
#define KV_DAEMON_GHOST_H

#include <stdint.h>

#include "tiers/block.h"

#define KVD_GHOST_WAYS 4

typedef struct kvd_ghost {
  uint64_t *fp;   /* nsets * KVD_GHOST_WAYS entries; 0 = empty */
  uint8_t *next;  /* per set: the way the next insertion replaces */
  uint32_t nsets; /* a power of two */
} kvd_ghost;

/* Room for about `slots` keys (rounded up to a power of two, at least
 * 64). 0 or -ENOMEM. */
int kvd_ghost_init(kvd_ghost *g, uint32_t slots);
void kvd_ghost_fini(kvd_ghost *g);

/* The fingerprint of (namespace, key): never 0. */
uint64_t kvd_ghost_fp(uint32_t ns, const uint8_t *key, unsigned len);

void kvd_ghost_add(kvd_ghost *g, uint64_t fp);
int kvd_ghost_has(const kvd_ghost *g, uint64_t fp);
void kvd_ghost_forget(kvd_ghost *g, uint64_t fp);

#endif
