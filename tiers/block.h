/*
 * block.h - the block record: what the daemon knows about one KV block.
 *
 * A block is an opaque, fixed-size byte range named by (namespace, key).
 * Its record says where its bytes are (a slot per tier), whether they are
 * valid there, who holds it, and where it sits in each tier's eviction
 * order. Records live in the index (index.h) and are addressed by a 32-bit
 * id, so links between records (parent, children) cost 4 bytes each.
 *
 * Residency model, per tier t:
 *   slot[t] != KV_SLOT_NONE   a slot of tier t is allocated to the block
 *   tiers & KV_TIER_BIT(t)    the bytes in that slot are complete and valid
 *   busy  & KV_TIER_BIT(t)    a copy is reading or writing that slot now
 * A block is visible to lookups only in state KV_BS_READY, and only in the
 * tiers whose bit is set.
 */
#ifndef KV_TIERS_BLOCK_H
#define KV_TIERS_BLOCK_H

#include <stdint.h>

#include "base/key.h"

typedef enum {
  KV_BS_FREE = 0, /* record unused (on the index's free list) */
  KV_BS_WRITING,  /* allocated, bytes being written, invisible */
  KV_BS_READY,    /* committed and visible */
} kv_bstate;

typedef uint32_t kv_bid;
#define KV_BID_NONE     UINT32_MAX
#define KV_SLOT_NONE    UINT32_MAX
#define KV_PRIO_DEFAULT 128 /* priorities 0..255; lower is evicted first */

/*
 * 104 bytes, so that a block's whole metadata - this record, its share of
 * the index table and of its eviction policy - stays within 128 bytes
 * (tiers/INDEX.md measures it). Fields are only as wide as they need to be:
 *   ns    16 bits: a core has at most KV_NS_MAX namespaces;
 *   pins  16 bits: kv_core_pin answers -EOVERFLOW past UINT16_MAX;
 *   atime 48 bits of the core's logical clock (2.8e14 accesses, years at
 *         millions of accesses a second);
 *   hits  8 bits, saturating at KV_HITS_MAX: policies ask "used again?"
 *         or count to a few (S3-FIFO's 3), LFU-DA's counts stop at 255;
 *   key length 5 bits, as length - 1 (keys are 1..32 bytes): read it with
 *         kv_block_keylen();
 *   rchild 16 bits per tier: a count that reaches UINT16_MAX sticks there
 *         and the core recounts the children when it must (core.c).
 * Records are addressed by 32-bit ids, so every link costs 4 bytes.
 */
typedef struct kv_block {
  uint8_t key[KV_KEY_MAX];
  kv_bid id;     /* this record's own id */
  uint32_t size; /* bytes */
  uint32_t crc;  /* CRC32C of the payload, taken at commit */
  uint16_t ns;
  uint16_t pins;                    /* holders that need the bytes to stay put */
  uint64_t atime : 48;              /* logical time of the last access */
  uint64_t hits : 8;                /* accesses, saturating at KV_HITS_MAX */
  uint64_t prio : 8;                /* eviction class, lower goes first */
  kv_bid parent, child, next, prev; /* prefix tree: parent, first child, siblings */
  uint32_t slot[KV_NTIERS];         /* slot per tier, KV_SLOT_NONE if none */
  uint32_t hpos[KV_NTIERS];         /* owned by that tier's eviction policy */
  uint16_t rchild[KV_NTIERS];       /* children whose bytes are valid in tier t */
  uint8_t tiers : 3;                /* KV_TIER_BIT set where bytes are valid */
  uint8_t klen1 : 5;                /* key length - 1: see kv_block_keylen */
  uint8_t busy : 3;                 /* KV_TIER_BIT set where a copy is in flight */
  uint8_t inpol : 3;                /* KV_TIER_BIT set where the tier's policy holds it */
  uint8_t state : 2;                /* kv_bstate */
} kv_block;

#define KV_HITS_MAX     255u
#define KV_NS_MAX       65535u /* namespaces 0..KV_NS_MAX-1 */
#define KV_ATIME_MASK   ((1ull << 48) - 1)
#define KV_RCHILD_STUCK UINT16_MAX
_Static_assert(sizeof(kv_block) == 104, "kv_block grew: see tiers/INDEX.md for the budget");

static inline unsigned kv_block_keylen(const kv_block *b) { return b->klen1 + 1u; }
/* len is 1..KV_KEY_MAX (the index checks it before). */
static inline void kv_block_set_keylen(kv_block *b, unsigned len) { b->klen1 = (len - 1u) & 31u; }

#endif
