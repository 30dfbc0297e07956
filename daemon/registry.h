/*
 * registry.h - who the daemon's clients are: tenants, namespaces, TP groups.
 *
 * Tenants are bound to credentials (daemon/OPS.md, "Tenants and
 * credentials"). Without [tenant.NAME] sections there is one tenant and one
 * G2 arena, and every peer that can reach the worker socket acts as it,
 * whatever tenant name its HELLO gives (the name still makes namespaces of
 * its own). With sections, each configured tenant has an arena of its own,
 * made at start-up with its share of g2.capacity; a HELLO naming a tenant
 * not configured, or from a peer that is not allowed to act as it (its uid
 * among the tenant's uids, or its gid or one of its supplementary groups,
 * as the kernel gives them with SO_PEERCRED and SO_PEERGROUPS, among its
 * gids; uid 0 only if listed), is refused with -EPERM. No arena is ever
 * bound to a tenant nobody configured.
 *
 * Namespaces: (tenant, layout descriptor, salt) names one namespace, and
 * its 32-byte digest is its identity on disk and across restarts. Sessions
 * with the same triple share the namespace; any difference (another TP rank,
 * another dtype, another salt) is another namespace. A namespace lives
 * while a session uses it or it has blocks (in any tier); one with neither
 * is freed (its registry entry and its core id are reused), when its last
 * session closes or, for one whose last block went later, at the next
 * kvd_registry_sweep. A tenant has at most limits.namespaces_per_tenant
 * namespaces at once, the daemon at most KV_NS_MAX: a HELLO that would
 * make one more is refused (-EDQUOT; -ENOSPC for the daemon's), counted,
 * logged at most once a second. Blocks on G3 keep their namespace alive,
 * and a namespace made again (same digest) finds what G3 still holds.
 *
 * TP groups: ranks of one tensor-parallel group each have a namespace (the
 * rank is part of the layout); the group keeps them side by side so that a
 * LOOKUP answers the hit length every rank has. A group is the ranks that
 * name it and agree on everything else (tenant, salt, the layout but the
 * rank), so two engines naming the same group with other salts or layouts
 * never mix. A namespace belongs to one group: a HELLO naming another group
 * for it is refused (-EINVAL).
 */
#ifndef KV_DAEMON_REGISTRY_H
#define KV_DAEMON_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "proto/wire.h"
#include "tiers/arena.h"
#include "tiers/core.h"

#define KVD_NAME_MAX 64
#define KVD_TP_MAX   64 /* ranks in a TP group */

typedef struct kvd_tenant {
  kv_cfg_tenant cfg; /* name, uids, gids; name "" for the one default tenant */
  int configured;    /* 0: the default tenant (no [tenant.*] section) */
  kv_arena arena;
  uint64_t g3_bytes; /* its share of the SSD tier; 0: no G3 or no share */
} kvd_tenant;

/* Why a HELLO was refused, for the counters (kvcached_hello_refused_total). */
typedef enum {
  KVD_HELLO_UNKNOWN_TENANT = 0, /* names a tenant no [tenant.NAME] section configures */
  KVD_HELLO_NOT_ALLOWED,        /* the peer's uid, gid and groups are not the tenant's */
  KVD_HELLO_REFUSED_COUNT
} kvd_hello_refusal;
extern const char *const kvd_hello_refusal_names[KVD_HELLO_REFUSED_COUNT];

/* At most one log line a second for a kind of refusal, with a count of
 * those it did not log. */
typedef struct kvd_ratelog {
  int64_t last_ms;
  uint64_t quiet;
} kvd_ratelog;

/* Whether a line of l's kind is due now (none in the last second): 1, with
 * *quiet the events since the last line that were not logged; else 0, and
 * this event is counted for the next line. */
int kvd_ratelog_due(kvd_ratelog *l, uint64_t *quiet);

/* The peer of a HELLO: SO_PEERCRED's uid and gid; fd is its socket, for
 * its supplementary groups (SO_PEERGROUPS, read only when a tenant's gids
 * need them), or -1. */
typedef struct kvd_peer {
  uint32_t uid, gid;
  int fd;
} kvd_peer;

typedef struct kvd_group kvd_group;

typedef struct kvd_ns {
  uint8_t digest[32];
  int core_ns;     /* id in the cache core; -1 while the entry is free */
  uint32_t tenant; /* index into the tenant table */
  uint32_t block_bytes;
  uint32_t slot_bytes; /* block_bytes rounded to the arena's alignment */
  kvd_group *group;    /* NULL when the sessions name no group */
  uint16_t tp_rank, tp_size;
  uint8_t dtype16;     /* its layout's dtype: 1 BF16, 2 FP16, 0 another (kvd_dtype16) */
  uint8_t quant;       /* its blocks in G3 and G4 are lossy (its tenant's cold_precision:
                        * KV_QUANT_FP8, _INT8; 0: exact) */
  uint32_t head_dim;   /* its layout's: the elements of one token's one head */
  uint32_t sessions;   /* sessions using it */
  uint32_t next_free1; /* while free: 1 + the next free entry, 0 for none */
} kvd_ns;

struct kvd_group {
  uint8_t key[32]; /* tenant, group name, salt, layout but the rank */
  char name[KVD_NAME_MAX + 1];
  uint16_t tp_size;
  int32_t ns_of_rank[KVD_TP_MAX]; /* registry ns index, -1 until a rank joins */
  kvd_group *next;
};

/* The dtype name p[0..len) (a HELLO's layout) as 16-bit elements, by the
 * names engines use: 1 BF16 (bf16, bfloat16), 2 FP16 (fp16, float16, f16,
 * half), 0 another. */
int kvd_dtype16(const void *p, size_t len);

/* Why a new namespace was refused (kvcached_namespaces_refused_total). */
typedef enum {
  KVD_NS_TENANT_LIMIT = 0, /* limits.namespaces_per_tenant */
  KVD_NS_DAEMON_FULL,      /* KV_NS_MAX namespaces in the daemon */
  KVD_NS_REFUSED_COUNT
} kvd_ns_refusal;
extern const char *const kvd_ns_refusal_names[KVD_NS_REFUSED_COUNT];

typedef struct kvd_registry {
  kvd_tenant *tenants;
  uint32_t ntenants;
  int configured; /* tenants come from [tenant.NAME] sections */
  uint64_t hello_refused[KVD_HELLO_REFUSED_COUNT];
  kvd_ratelog hello_log;
  char why[256]; /* the last refusal's reason, for the ERROR reply */
  kvd_ns *ns;
  uint32_t nns, capns;  /* entries 0..nns-1 in use or free */
  uint32_t free1;       /* 1 + the first free entry, 0 for none */
  uint32_t nlive;       /* namespaces */
  uint32_t *tenant_nns; /* namespaces per tenant */
  uint32_t ns_limit;    /* limits.namespaces_per_tenant */
  int g3_code;          /* g3.codec = auto: 16-bit namespaces' G3 blocks coded */
  uint64_t ns_freed;
  uint64_t ns_refused[KVD_NS_REFUSED_COUNT];
  kvd_ratelog ns_log;
  uint64_t swept_at; /* the core's ns_emptied at the last sweep */
  kvd_group *groups;
  kv_core *core;
  void (*ns_changed_fn)(void *arg, uint32_t core_ns);
  void *ns_changed_arg;
} kvd_registry;

typedef struct kvd_registry_opts {
  const kv_config *cfg; /* g2.*, limits.namespaces_per_tenant, [tenant.NAME] sections */
  int lock;
  kv_core *core;
  /* Passed to every arena (kv_arena_opts): the device registration. */
  int (*register_fn)(void *base, size_t len, void *arg);
  void (*unregister_fn)(void *base, size_t len, void *arg);
  void *register_arg;
  /* Told, by its core id, of each namespace whose last session closed or
   * that is freed (its id may be reused next), and of each that joins a TP
   * group (whose LOOKUPs then answer for every rank): the daemon retires
   * its presence table. NULL: nobody. */
  void (*ns_changed_fn)(void *arg, uint32_t core_ns);
  void *ns_changed_arg;
} kvd_registry_opts;

/* Creates every tenant's arena, with its share of g2.capacity. 0, -EINVAL
 * (shares kv_config_validate refuses), or the arena's error (arena.h). */
int kvd_registry_init(kvd_registry *r, const kvd_registry_opts *o);
void kvd_registry_fini(kvd_registry *r);

/*
 * The namespace for a HELLO from peer p, registered with the core on first
 * use, with one more session using it (kvd_registry_release gives it
 * back). Returns its registry index (>= 0) or: -EPERM (the tenant is not
 * configured, or p may not act as it), -EDQUOT (the tenant has
 * limits.namespaces_per_tenant namespaces), -ENOSPC (the daemon has
 * KV_NS_MAX) - those counted and logged at most once a second -, -EINVAL
 * (layout the daemon cannot serve: tp_rank >= tp_size, tp_size >
 * KVD_TP_MAX; or the namespace is in another TP group than the one named),
 * KV_ETOOBIG (block larger than a G2 page), -ENOMEM. On error r->why says
 * why, for the ERROR reply ("" when the code says it all).
 */
int kvd_registry_hello(kvd_registry *r, const kv_hello_req *h, const kvd_peer *p);

/* A session of namespace ns is over: the namespace is freed if it was the
 * last and no block of it is left. */
void kvd_registry_release(kvd_registry *r, int ns);

/* Frees every namespace with no session and no block (all tenants'), if
 * a namespace of the core lost its last block since the last sweep, and
 * logs the count of refusals no log line has told yet. Returns how many
 * namespaces were freed. For the daemon's tick. */
uint32_t kvd_registry_sweep(kvd_registry *r);

/* Gives each configured tenant its share (g3_share) of the SSD tier of
 * g3_capacity bytes, attached to the core (the core's "G3 shares", each
 * tenant the owner of its namespaces). Nothing without tenant sections.
 * 0, -EINVAL (shares over the capacity: logged) or -ENOMEM. */
int kvd_registry_g3_shares(kvd_registry *r, const kv_config *cfg, uint64_t g3_capacity);

static inline kvd_ns *kvd_registry_ns(kvd_registry *r, int i) { return &r->ns[i]; }
static inline kv_arena *kvd_registry_arena(kvd_registry *r, const kvd_ns *n) {
  return &r->tenants[n->tenant].arena;
}

/* The longest prefix of keys resident for every rank of ns's TP group (for
 * a namespace outside any group, its own). tier_out as kv_core_lookup()'s,
 * for ns itself. */
int kvd_registry_lookup(kvd_registry *r, int ns, const kv_key *keys, uint32_t n, uint8_t *tier_out);

#endif
