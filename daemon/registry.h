/*
 * registry.h - who the daemon's clients are: tenants, namespaces, TP groups.
 *
 * Tenants: each tenant gets a G2 arena of its own (g2.capacity divided by
 * g2.tenants), made at start-up and bound to the first tenant names that say
 * HELLO, so no tenant is ever handed memory that holds another's blocks. A
 * HELLO from one tenant too many is refused (-EUSERS).
 *
 * Namespaces: (tenant, layout descriptor, salt) names one namespace, and
 * its 32-byte digest is its identity on disk and across restarts. Sessions
 * with the same triple share the namespace; any difference (another TP rank,
 * another dtype, another salt) is another namespace.
 *
 * TP groups: ranks of one tensor-parallel group each have a namespace (the
 * rank is part of the layout); the group keeps them side by side so that a
 * LOOKUP answers the hit length every rank has.
 */
#ifndef KV_DAEMON_REGISTRY_H
#define KV_DAEMON_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"
#include "tiers/arena.h"
#include "tiers/core.h"

#define KVD_NAME_MAX 64
#define KVD_TP_MAX 64 /* ranks in a TP group */

typedef struct kvd_tenant {
  char name[KVD_NAME_MAX + 1]; /* "" while unbound */
  kv_arena arena;
} kvd_tenant;

typedef struct kvd_group kvd_group;

typedef struct kvd_ns {
  uint8_t digest[32];
  int core_ns;            /* id in the cache core */
  uint32_t tenant;        /* index into the tenant table */
  uint32_t block_bytes;
  uint32_t slot_bytes;    /* block_bytes rounded to the arena's alignment */
  kvd_group *group;       /* NULL when the sessions name no group */
  uint16_t tp_rank, tp_size;
} kvd_ns;

struct kvd_group {
  char name[KVD_NAME_MAX + 1];
  uint32_t tenant;
  uint16_t tp_size;
  int32_t ns_of_rank[KVD_TP_MAX]; /* registry ns index, -1 until a rank joins */
  kvd_group *next;
};

typedef struct kvd_registry {
  kvd_tenant *tenants;
  uint32_t ntenants;
  kvd_ns *ns;
  uint32_t nns, capns;
  kvd_group *groups;
  kv_core *core;
} kvd_registry;

typedef struct kvd_registry_opts {
  uint64_t g2_capacity;  /* total, split evenly among tenants */
  uint64_t g2_page_size;
  uint32_t tenants;      /* > 0 */
  int lock;
  kv_core *core;
  /* Passed to every arena (kv_arena_opts): the device registration. */
  int (*register_fn)(void *base, size_t len, void *arg);
  void (*unregister_fn)(void *base, size_t len, void *arg);
  void *register_arg;
} kvd_registry_opts;

/* Creates every tenant arena. 0 or the arena's error (see arena.h). */
int kvd_registry_init(kvd_registry *r, const kvd_registry_opts *o);
void kvd_registry_fini(kvd_registry *r);

/*
 * The namespace for a HELLO, registered with the core on first use.
 * Returns its registry index (>= 0) or: -EUSERS (no arena left for a new
 * tenant), -EINVAL (layout the daemon cannot serve: tp_rank >= tp_size,
 * tp_size > KVD_TP_MAX, a group whose tp_size differs from its first
 * member's), KV_ETOOBIG (block larger than a G2 page), -ENOMEM.
 */
int kvd_registry_hello(kvd_registry *r, const kv_hello_req *h);

static inline kvd_ns *kvd_registry_ns(kvd_registry *r, int i) { return &r->ns[i]; }
static inline kv_arena *kvd_registry_arena(kvd_registry *r, const kvd_ns *n) {
  return &r->tenants[n->tenant].arena;
}

/* The longest prefix of keys resident for every rank of ns's TP group (for
 * a namespace outside any group, its own). tier_out as kv_core_lookup()'s,
 * for ns itself. */
int kvd_registry_lookup(kvd_registry *r, int ns, const kv_key *keys, uint32_t n,
                        uint8_t *tier_out);

#endif
