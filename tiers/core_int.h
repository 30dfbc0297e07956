/*
 * core_int.h - what the core's files (core.c, core_g1.c, core_g3.c,
 * core_admin.c, core_hint.c) share: the core and namespace structures, the
 * operator state, and the helpers one file exports to the others. They
 * call one way (tools/dev/layers.sh): core_hint.c, core_admin.c, core_g1.c
 * and core_g3.c on top of core.c, which holds every block's state and
 * reaches G3 only through the demotion callback core_g3.c leaves it.
 *
 * Nothing outside tiers/ includes it but the unit tests of the core that
 * must look at its insides (each says so in its header comment); the
 * daemon and the tools go through core.h's accessors.
 */
#ifndef KV_TIERS_CORE_INT_H
#define KV_TIERS_CORE_INT_H

#include "tiers/core.h"
#include "tiers/evict.h"
#include "tiers/sessions.h"

/* Operator state (core_admin.c): soft limits and the copy observer. */
typedef struct kv_core_admin {
  uint64_t limit[KV_NTIERS]; /* soft limit in bytes per arena (G2) or store (G3); 0: none */
  kv_copy_fn on_copy;        /* NULL: none */
  void *on_copy_arg;
  kv_visible_fn on_visible; /* NULL: none */
  void *on_visible_arg;
} kv_core_admin;

/* --- shared by the core's files ---------------------------------------- */

int kv_core__evict_block(kv_core *c, kv_block *v, kv_tier t);
void kv_core__drop_tier(kv_core *c, kv_block *b, kv_tier t);
typedef struct kv_core_ns kv_core_ns;
int kv_core__class(kv_core *c, kv_arena *arena, uint32_t block_bytes, kv_tier t);
void kv_core__set_valid(kv_core *c, kv_block *b, kv_tier t);
void kv_core__sync_all(kv_core *c, kv_block *b);
void kv_core__reap(kv_core *c, kv_block *b);
/* Tells kv_core_admin.on_copy of a copy started at t0 (kv_now_ns). */
void kv_core__copied(kv_core *c, kv_tier from, kv_tier to, uint32_t bytes, uint64_t t0, int status);
/* The policy ranking namespace ns's blocks in tier t (for G1: in G1 pool
 * `pool`; ignored for the other tiers), or NULL. */
kv_evict *kv_core__policy(kv_core *c, uint32_t ns, kv_tier t, unsigned pool);
/* The policy that ranks b in tier t (for G1, that of b's pool), or NULL. */
kv_evict *kv_core__policy_of(kv_core *c, const kv_block *b, kv_tier t);
/* The next victim of G2 policy e (a class's first instance; the second
 * ranks, least recently used first, the blocks G3 holds too): one of those
 * first, as it costs no write and loses no block, or NULL. */
kv_block *kv_core__g2_peek(kv_evict *e);
/* The next G3 victim across G3's policies (see "G3 shares"): an SSD copy
 * of a block G2 also holds first (tiers/G3.md), or NULL. */
kv_block *kv_core__g3_victim(kv_core *c);
/* Every G2 class's policy follows G3's shared one (kv_evict.lead), whose
 * reach then counts their capacities (kv_core_attach_g3; core.c does it
 * for classes made later). */
void kv_core__follow_g3(kv_core *c);
/* G3's policy instances (the shared one, then the owners'), not their
 * instances for copies G2 holds too; returns how many, at most max. */
uint32_t kv_core__g3_policies(kv_core *c, kv_evict **out, uint32_t max);
int kv_core__alloc_g2_slot(kv_core *c, kv_core_ns *n, uint32_t *slot);
/* Clears b's validity in tier t (its parent's count of resident children
 * and its place in t's policy follow). */
void kv_core__clear_valid(kv_core *c, kv_block *b, kv_tier t);
/* The distinct policy instances of tier t (core_admin.c; one per class in
 * use, G3's owners' too); returns how many, at most max. */
uint32_t kv_core__tier_policies(kv_core *c, kv_tier t, kv_evict **out, uint32_t max);
/* Adds a namespace like proto; returns its id, or -ENOSPC / -ENOMEM. */
int kv_core__ns_add(kv_core *c, kv_core_ns *proto);

/* --- a block's G3 slot (core.c) --- */

/* G3 slots free for a write now (slots being retired are not yet); 0
 * without G3. */
uint64_t kv_core__g3_free(kv_core *c);
/* The G2 room kept ready for n's class while G3 is attached (core.c). */
uint64_t kv_core__g2_headroom(const kv_core *c, const kv_core_ns *n);
/* b's key in G3: its namespace's digest and its key. */
void kv_core__g3_key_of(kv_core *c, const kv_block *b, kv_g3_key *k);
/* b's G3 slot is now `slot` (KV_SLOT_NONE: it has none): the count of its
 * namespace, and of the namespace's owner. */
void kv_core__set_g3_slot(kv_core *c, kv_block *b, uint32_t slot);

/* --- the SSD tier (tiers/core_g3.c) --- */

/* The demotion callback kv_core_attach_g3 leaves in kv_core.demote: core.c
 * reaches G3 only through it (core_g3.c is above core.c, tools/dev/layers.sh). */
int kv_core__g3_demote(kv_core *c, kv_block *v, kv_tier from, void *unused);

struct kv_core_ns {
  kv_arena *arena;             /* NULL while dormant (known from G3, no HELLO yet) */
  int cls;                     /* arena size class of its blocks */
  int g1cls1[KV_G1_POOLS_MAX]; /* 1 + its class in each G1 pool; 0 until first needed */
  uint32_t block_bytes;
  int live;
  int has_digest;
  uint8_t digest[KV_G3_NS_BYTES]; /* identity across restarts (G3 records) */
  int owner;                      /* its G3 share's owner; -1: none */
  uint32_t g3_slots;              /* G3 slots its blocks hold (written or being written) */
  unsigned g3_code;               /* how its blocks go to G3: kv_g3_write_ex's flags
                                   * (kv_core_ns_g3_code) */
  uint32_t nblocks;               /* index records of its blocks, in any state and tier */
  uint32_t next_free1;            /* while freed: 1 + the next freed id, 0 for none */
};

struct kv_core {
  kv_index ix;
  const kv_evict_ops *policy;
  uint64_t clock; /* logical time: one tick per access */
  kv_core_ns *ns;
  uint32_t nns, capns; /* ids 0..nns-1 given out, freed ones included */
  uint32_t ns_free1;   /* 1 + the first freed id (reused first), 0 for none */
  uint32_t nfree;      /* freed ids */
  uint64_t ns_emptied; /* times a namespace's last block went */
  kv_arena **g2a;      /* the G2 arenas whose classes have policies of the core */
  uint32_t ng2a, capg2a;
  kv_demote_fn demote; /* G2's victims: the caller's, G3's once attached, or NULL */
  void *demote_arg;
  uint32_t demoting; /* asynchronous demotions in flight */
  kv_core_stats_t st;
  kv_g3 *g3;         /* NULL: no SSD tier */
  kv_evict g3_evict; /* G3's policy (one slot size) for blocks of no owner ("G3 shares") */
  kv_evict g3_dup;   /* ... for those of them G2 holds too: G3's first victims (tiers/G3.md) */
  kv_core_g3_opts g3o;
  uint64_t g3_seq; /* last sequence number written to G3 */
  /* The parent of the block kv_core_alloc is finding a G2 slot for (with G3
   * attached), or KV_BID_NONE: a G2 victim G3 would decline is written all
   * the same when it is that block (core_g3.c, outranked). */
  kv_bid storing_parent;
  /* Each owner's G3 policy, two instances as g3_evict and g3_dup are; NULL: no share. */
  kv_evict *g3_own[KV_CORE_OWNERS_MAX];
  uint64_t g3_own_slots[KV_CORE_OWNERS_MAX]; /* G3 slots its namespaces hold */
  uint64_t g3_own_limit[KV_CORE_OWNERS_MAX]; /* its share, in slots */
  kv_core_admin adm;             /* operator state: limits, copy observer (core_admin.c) */
  uint32_t ng1;                  /* G1 pools attached (0: no GPU tier) */
  kv_arena *g1[KV_G1_POOLS_MAX]; /* the slots of each pool */
  void *g1_arg[KV_G1_POOLS_MAX]; /* the mover's arg for each */
  kv_g1_copy_fn g1_copy;
  uint32_t g1_writing; /* G1 -> G2 write-backs in flight */
  kv_sessions sess;    /* engine hints (core_hint.c); ix.sessions points here */
};

/* The instance of G3 policy e (g3_evict or an owner's first) that ranks the
 * SSD copies of blocks G2 holds too. */
static inline kv_evict *kv_core__g3_dups(kv_core *c, kv_evict *e) {
  return e == &c->g3_evict ? &c->g3_dup : e + 1;
}

/* A namespace that can take G2 blocks (registered, not dormant), or NULL. */
static inline kv_core_ns *kv_core__ns_get(kv_core *c, uint32_t ns) {
  return ns < c->nns && c->ns[ns].live && c->ns[ns].arena ? &c->ns[ns] : NULL;
}

#endif
