/*
 * evict_mini.h - chain-aware miniature simulations (Waldspurger et al.,
 * "Cache Modeling and Optimization using Miniature Simulations", USENIX
 * ATC'17) that judge between expert policies, for the policies that follow
 * whichever expert is doing better on the workload of the moment ("auto",
 * "adapt").
 *
 *   sample   spatial sampling by hash at rate R = M / C, C the tier's
 *            capacity and M = min(C, KV_MINI_CAP) the miniature capacity;
 *            each expert runs, unchanged, as a cache of M blocks over the
 *            sampled accesses only. The unit sampled is a prefix tree (the
 *            hash of its root block), not a block: the tier evicts
 *            leaf-first, so a tree is what it caches, and a miniature that
 *            sampled blocks one by one would see none of the chains that
 *            protect interior blocks. A miniature keeps the rule too: only
 *            its leaves are offered to its expert; an access to an interior
 *            block is seen().
 *   votes    an access where one miniature hits and another misses is a
 *            vote for the first against the second (the discordant pairs
 *            of McNemar's test), counted per pair; votes decay by half
 *            every 10 sampled accesses per miniature block (TinyLFU's
 *            sample period W = 10 C).
 *   switch   the followed expert changes to another when that one's lead
 *            over it passes McNemar's test with continuity correction,
 *            (|b - c| - 1)^2 > Z^2 (b + c), Z = 2 (two-sided 5%, 1.96
 *            rounded); of several that pass, the one with the largest
 *            lead. Hysteresis by significance, no tuned margin. Expert 0 is
 *            followed first.
 *
 * Engine hints reach the miniatures: their index shares the real index's
 * session table (kv_index.sessions), and a sampled block's miniature
 * record takes the owner its real block has at each access. An expert may
 * join late (kv_minis_start, e.g. at the first hint): its miniature starts
 * empty and it votes from then on.
 *
 * Cost: at most KV_MINIS_MAX miniatures of at most KV_MINI_CAP blocks,
 * their records in an index of their own (miniature i uses hpos[i],
 * rchild[i], bit i of `tiers` for "held" and of `inpol` for "a leaf in its
 * policy"), whatever C. Below KV_MINI_CAP blocks of capacity R = 1: the
 * miniatures are full-size shadows.
 */
#ifndef KV_TIERS_EVICT_MINI_H
#define KV_TIERS_EVICT_MINI_H

#include <stdint.h>

#include "tiers/evict.h"

#define KV_MINIS_MAX 3    /* experts (bits of kv_block.tiers and .inpol) */
#define KV_MINI_CAP  1024 /* blocks per miniature cache at most */

typedef struct kv_minis {
  int on; /* running */
  int n;  /* experts */
  const kv_evict_ops *ops[KV_MINIS_MAX];
  uint32_t started; /* bit i: expert i's miniature runs and votes */
  kv_index mix;     /* records of sampled keys held by some miniature */
  kv_evict mini[KV_MINIS_MAX];
  uint64_t sample; /* a tree is sampled when its root's hash * 2^-32 < sample * 2^-32 */
  uint32_t held[KV_MINIS_MAX];
  uint64_t clock, seen, period;
  double votes[KV_MINIS_MAX][KV_MINIS_MAX]; /* [i][j]: decayed, i hit and j missed */
  int cur;                                  /* the expert followed */
  uint64_t switches;
  /* clustered test (kv_minis_cluster): per sampled tree (hashed into
   * `trees` buckets) and pair i < j, the decayed net votes of i over j, and
   * per pair the sum of their squares */
  float (*net)[KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2];
  uint32_t trees;
  double sq[KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2];
  uint32_t clusters[KV_MINIS_MAX * (KV_MINIS_MAX - 1) / 2]; /* buckets with |net| >= 1/2 */
} kv_minis;

/* Miniatures of n experts (n <= KV_MINIS_MAX) for a tier of `capacity`
 * blocks (0: none run, expert 0 is followed), each of at most mini_cap
 * blocks (0: KV_MINI_CAP), those whose bit is in
 * `start` running from now on; the miniature index shares real's session
 * table. 0 or -ENOMEM. */
int kv_minis_init(kv_minis *m, const kv_evict_ops *const *experts, int n, uint32_t capacity,
                  uint32_t mini_cap, uint32_t start, const kv_index *real);
void kv_minis_fini(kv_minis *m);

/* Judges by trees rather than by accesses: the variance of a lead is
 * taken from the net votes of each sampled prefix tree (the votes of one
 * tree's blocks are not independent: a request hits or misses its chain
 * together), McNemar's test for clustered pairs (Obuchowski, "On the
 * comparison of correlated proportions for clustered data", Statistics in
 * Medicine 1998): lead L = sum of the trees' nets, switch when
 * (L - 1)^2 > Z^2 * sum of their squares. Trees are told apart by a hash
 * into as many buckets as a miniature holds blocks (at most that many trees
 * are held at once); trees that share a bucket count as one, which only
 * makes the test more cautious. 0 or -ENOMEM. */
int kv_minis_cluster(kv_minis *m);

/* Follows expert i from now on (it must run), until another leads it. */
void kv_minis_follow(kv_minis *m, int i);

/* Expert i joins (nothing if it runs, or no miniature does). 0 or -ENOMEM. */
int kv_minis_start(kv_minis *m, int i);

/* One access to block rb of the real index: if its prefix tree is
 * sampled, replays it through every running miniature, counts the votes
 * and moves m->cur to the expert that leads. */
void kv_minis_observe(kv_minis *m, const kv_index *real, const kv_block *rb);

/* Block rb of the real index was named by an engine hint: its sampled
 * record, if any, takes its owner, and the experts holding it are told. */
void kv_minis_hinted(kv_minis *m, const kv_index *real, const kv_block *rb);
/* The state of the session in slot `slot` changed: the experts are told. */
void kv_minis_session(kv_minis *m, uint32_t slot);

#endif
