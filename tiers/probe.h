/*
 * probe.h - the one rule of backward-shift deletion in a linear-probing
 * hash table, shared by every such table in the project (the block index,
 * the daemon's per-connection maps, kvbench's reference LRU).
 *
 * After emptying slot `hole`, the entries that follow it are walked; the
 * entry at `j`, whose home slot is `home`, must move back into the hole
 * unless its home lies cyclically in (hole, j] - then moving it would put
 * it before its home, where probes never look.
 */
#ifndef KV_TIERS_PROBE_H
#define KV_TIERS_PROBE_H

#include <stdint.h>

/* 1 if the entry at j (home slot `home`) stays where it is. */
static inline int kv_probe_stays(uint32_t hole, uint32_t j, uint32_t home) {
  return hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
}

#endif
