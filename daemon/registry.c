/* registry.c - tenants, namespaces and TP groups (see registry.h). */
#include "daemon/registry.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "base/log.h"
#include "ipc/sock.h"
#include "tiers/quant.h"

const char *const kvd_hello_refusal_names[KVD_HELLO_REFUSED_COUNT] = {"unknown_tenant",
                                                                      "not_allowed"};
const char *const kvd_ns_refusal_names[KVD_NS_REFUSED_COUNT] = {"tenant_limit", "daemon_full"};

int kvd_registry_init(kvd_registry *r, const kvd_registry_opts *o) {
  memset(r, 0, sizeof *r);
  if (!o->cfg || !o->core) return -EINVAL;
  const kv_config *cfg = o->cfg;
  uint32_t n = cfg->ntenants ? cfg->ntenants : 1;
  uint64_t g2[KV_CFG_TENANTS_MAX];
  char err[256];
  if (cfg->ntenants && kv_config_split(cfg, 1, cfg->g2_capacity, g2, err, sizeof err)) {
    kv_error("registry", "%s", err);
    return -EINVAL;
  }
  if (!cfg->ntenants) g2[0] = cfg->g2_capacity;
  r->core = o->core;
  r->ns_changed_fn = o->ns_changed_fn;
  r->ns_changed_arg = o->ns_changed_arg;
  r->configured = cfg->ntenants > 0;
  r->ns_limit = cfg->limit_namespaces_per_tenant;
  r->g3_code = cfg->g3_codec == KV_G3_CODEC_AUTO;
  r->tenants = calloc(n, sizeof *r->tenants);
  r->tenant_nns = calloc(n, sizeof *r->tenant_nns);
  if (!r->tenants || !r->tenant_nns) {
    kvd_registry_fini(r);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    kvd_tenant *t = &r->tenants[i];
    if (r->configured) t->cfg = cfg->tenants[i];
    t->configured = r->configured;
    char name[32];
    snprintf(name, sizeof name, "kvcached-g2-%u", i);
    kv_arena_opts ao = {.capacity = g2[i],
                        .page_bytes = cfg->g2_page_size,
                        .no_lock = !o->lock,
                        .name = name,
                        .register_fn = o->register_fn,
                        .unregister_fn = o->unregister_fn,
                        .register_arg = o->register_arg};
    int rc = kv_arena_init(&t->arena, &ao);
    if (rc) {
      kvd_registry_fini(r);
      return rc;
    }
    r->ntenants++;
    if (r->configured)
      kv_info("registry", "tenant '%s': G2 arena of %llu bytes, for %u uid(s) and %u gid(s)",
              t->cfg.name, (unsigned long long)t->arena.capacity, t->cfg.nuids, t->cfg.ngids);
  }
  return 0;
}

int kvd_registry_g3_shares(kvd_registry *r, const kv_config *cfg, uint64_t g3_capacity) {
  if (!r->configured) return 0;
  uint64_t part[KV_CFG_TENANTS_MAX];
  char err[256];
  if (kv_config_split(cfg, 2, g3_capacity, part, err, sizeof err)) {
    kv_error("registry", "%s", err);
    return -EINVAL;
  }
  for (uint32_t i = 0; i < r->ntenants; i++) {
    int rc = kv_core_g3_share(r->core, i, part[i]);
    if (rc) return rc;
    r->tenants[i].g3_bytes = part[i];
    kv_info("registry", "tenant '%s': %llu bytes of the SSD tier", r->tenants[i].cfg.name,
            (unsigned long long)part[i]);
  }
  return 0;
}

void kvd_registry_fini(kvd_registry *r) {
  for (uint32_t i = 0; i < r->ntenants; i++) kv_arena_fini(&r->tenants[i].arena);
  free(r->tenants);
  free(r->tenant_nns);
  free(r->ns);
  for (kvd_group *g = r->groups; g;) {
    kvd_group *n = g->next;
    free(g);
    g = n;
  }
  memset(r, 0, sizeof *r);
}

/* Logs a refusal unless one of its kind was logged less than a second
 * ago; then it is counted in the next line. */
int kvd_ratelog_due(kvd_ratelog *l, uint64_t *quiet) {
  int64_t now = kv_now_ms();
  if (l->last_ms && now - l->last_ms < 1000) {
    l->quiet++;
    return 0;
  }
  *quiet = l->quiet;
  l->last_ms = now;
  l->quiet = 0;
  return 1;
}

static void ratelog(kvd_ratelog *l, const char *what, const char *why) {
  uint64_t quiet;
  if (!kvd_ratelog_due(l, &quiet)) return;
  if (quiet)
    kv_warn("registry", "%s: %s (and %llu more refused since the last such line)", what, why,
            (unsigned long long)quiet);
  else kv_warn("registry", "%s: %s", what, why);
}

static int has_id(const uint32_t *ids, uint32_t n, uint32_t id) {
  for (uint32_t i = 0; i < n; i++)
    if (ids[i] == id) return 1;
  return 0;
}

/* Whether one of the supplementary groups of the peer on fd, as the kernel
 * took them at connect() (SO_PEERGROUPS), is among gids. */
static int peer_group_in(int fd, const uint32_t *gids, uint32_t n) {
  gid_t small[64], *g = small;
  socklen_t len = sizeof small;
  int found = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
    if (errno != ERANGE || !(g = malloc(len))) return 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) len = 0;
  }
  for (size_t i = 0; i < len / sizeof *g && !found; i++) found = has_id(gids, n, (uint32_t)g[i]);
  if (g != small) free(g);
  return found;
}

/* The tenant a HELLO from p may act as, or -EPERM with r->why set. */
static int tenant_for(kvd_registry *r, const kv_str *name, const kvd_peer *p) {
  if (!r->configured) return 0;
  kvd_tenant *t = NULL;
  for (uint32_t i = 0; i < r->ntenants && !t; i++)
    if (strlen(r->tenants[i].cfg.name) == name->len &&
        !memcmp(r->tenants[i].cfg.name, name->p, name->len))
      t = &r->tenants[i];
  if (!t) {
    r->hello_refused[KVD_HELLO_UNKNOWN_TENANT]++;
    snprintf(r->why, sizeof r->why,
             "tenant '%.*s' is not configured (tenants are [tenant.NAME] sections "
             "of the daemon's configuration)",
             (int)name->len, name->p);
  } else if (has_id(t->cfg.uids, t->cfg.nuids, p->uid) ||
             (t->cfg.ngids && (has_id(t->cfg.gids, t->cfg.ngids, p->gid) ||
                               (p->fd >= 0 && peer_group_in(p->fd, t->cfg.gids, t->cfg.ngids))))) {
    return (int)(t - r->tenants);
  } else {
    r->hello_refused[KVD_HELLO_NOT_ALLOWED]++;
    snprintf(r->why, sizeof r->why,
             "uid %u (gid %u) may not act as tenant '%s': neither the uid nor a "
             "group of the peer is in [tenant.%s] uids or gids",
             p->uid, p->gid, t->cfg.name, t->cfg.name);
  }
  ratelog(&r->hello_log, "HELLO refused", r->why);
  return -EPERM;
}

/* The namespace digest: BLAKE2b-256 over every field that decides what a
 * block's bytes mean, each length-prefixed so no two triples collide. With
 * group = 1, the TP group's key instead: the group's name and every field
 * but the rank. */
static void digest_of(const kv_hello_req *h, int group, uint8_t out[32]) {
  crypto_generichash_state st;
  uint8_t le[4];
  crypto_generichash_init(&st, NULL, 0, 32);
#define PUT32(x)                                                       \
  do {                                                                 \
    uint32_t v_ = (x);                                                 \
    for (int i_ = 0; i_ < 4; i_++) le[i_] = (uint8_t)(v_ >> (8 * i_)); \
    crypto_generichash_update(&st, le, 4);                             \
  } while (0)
#define PUTB(p, n)                                                  \
  do {                                                              \
    PUT32(n);                                                       \
    if (n) crypto_generichash_update(&st, (const uint8_t *)(p), n); \
  } while (0)
  crypto_generichash_update(&st, (const uint8_t *)(group ? "kvcached-tp-v1" : "kvcached-ns-v1"),
                            14);
  PUTB(h->tenant.p, h->tenant.len);
  if (group) PUTB(h->group.p, h->group.len);
  PUT32(h->layout.block_bytes);
  PUT32(h->layout.tokens_per_block);
  PUT32(h->layout.layers);
  PUT32(h->layout.kv_heads);
  PUT32(h->layout.head_dim);
  if (!group) PUT32(h->layout.tp_rank);
  PUT32(h->layout.tp_size);
  PUTB(h->layout.dtype.p, h->layout.dtype.len);
  PUTB(h->salt.p, h->salt.len);
#undef PUT32
#undef PUTB
  crypto_generichash_final(&st, out, 32);
}

static kvd_group *group_find(kvd_registry *r, const uint8_t key[32]) {
  for (kvd_group *g = r->groups; g; g = g->next)
    if (!memcmp(g->key, key, 32)) return g;
  return NULL;
}

static kvd_group *group_new(kvd_registry *r, const uint8_t key[32], const kv_str *name,
                            uint16_t tp_size) {
  kvd_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  memcpy(g->key, key, 32);
  memcpy(g->name, name->p, name->len);
  g->tp_size = tp_size;
  for (int i = 0; i < KVD_TP_MAX; i++) g->ns_of_rank[i] = -1;
  g->next = r->groups;
  r->groups = g;
  return g;
}

/* Takes namespace i out of its group; the group goes with its last rank. */
static void group_leave(kvd_registry *r, uint32_t i) {
  kvd_group *g = r->ns[i].group;
  if (!g) return;
  r->ns[i].group = NULL;
  if (g->ns_of_rank[r->ns[i].tp_rank] == (int32_t)i) g->ns_of_rank[r->ns[i].tp_rank] = -1;
  for (int k = 0; k < KVD_TP_MAX; k++)
    if (g->ns_of_rank[k] >= 0) return;
  for (kvd_group **pp = &r->groups; *pp; pp = &(*pp)->next) {
    if (*pp != g) continue;
    *pp = g->next;
    break;
  }
  free(g);
}

/* Puts namespace i, which has no group, in the group the HELLO names. */
static int group_join(kvd_registry *r, uint32_t i, const kv_hello_req *h) {
  uint8_t key[32];
  digest_of(h, 1, key);
  kvd_group *g = group_find(r, key);
  if (!g && !(g = group_new(r, key, &h->group, h->layout.tp_size))) return -ENOMEM;
  g->ns_of_rank[h->layout.tp_rank] = (int32_t)i; /* the group's key and the rank: namespace i */
  r->ns[i].group = g;
  if (r->ns_changed_fn) r->ns_changed_fn(r->ns_changed_arg, (uint32_t)r->ns[i].core_ns);
  return 0;
}

int kvd_dtype16(const void *p, size_t len) {
  static const char *const names[] = {"bf16", "bfloat16", "fp16", "float16", "f16", "half"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == len && !memcmp(p, names[i], len)) return i < 2 ? 1 : 2;
  return 0;
}

static int ns_live(const kvd_registry *r, uint32_t i) { return r->ns[i].core_ns >= 0; }

/* Frees namespace i if no session uses it and no block of it is left. */
static int ns_try_free(kvd_registry *r, uint32_t i) {
  kvd_ns *n = &r->ns[i];
  if (!ns_live(r, i) || n->sessions || kv_core_ns_blocks(r->core, (uint32_t)n->core_ns)) return 0;
  if (kv_core_ns_free(r->core, (uint32_t)n->core_ns)) return 0;
  if (r->ns_changed_fn) r->ns_changed_fn(r->ns_changed_arg, (uint32_t)n->core_ns);
  group_leave(r, i);
  r->tenant_nns[n->tenant]--;
  r->nlive--;
  r->ns_freed++;
  memset(n, 0, sizeof *n);
  n->core_ns = -1;
  n->next_free1 = r->free1;
  r->free1 = i + 1;
  return 1;
}

/* Frees what can go, of tenant t (-1: of every tenant). */
static uint32_t sweep(kvd_registry *r, int t) {
  uint32_t freed = 0;
  for (uint32_t i = 0; i < r->nns; i++)
    if (t < 0 || r->ns[i].tenant == (uint32_t)t) freed += (uint32_t)ns_try_free(r, i);
  if (t < 0) r->swept_at = kv_core_ns_emptied(r->core);
  return freed;
}

/* Logs the refusals a line stood for that no later line counted. */
static void ratelog_flush(kvd_ratelog *l, const char *what) {
  if (!l->quiet || kv_now_ms() - l->last_ms < 1000) return;
  kv_warn("registry", "%llu more %s since the last such line", (unsigned long long)l->quiet, what);
  l->last_ms = kv_now_ms();
  l->quiet = 0;
}

uint32_t kvd_registry_sweep(kvd_registry *r) {
  ratelog_flush(&r->hello_log, "HELLO(s) refused");
  ratelog_flush(&r->ns_log, "new namespace(s) refused");
  return r->swept_at == kv_core_ns_emptied(r->core) ? 0 : sweep(r, -1);
}

void kvd_registry_release(kvd_registry *r, int ns) {
  if (ns < 0 || (uint32_t)ns >= r->nns || !ns_live(r, (uint32_t)ns) || !r->ns[ns].sessions) return;
  r->ns[ns].sessions--;
  /* its last session gone, nobody reads its presence table */
  if (!r->ns[ns].sessions && r->ns_changed_fn)
    r->ns_changed_fn(r->ns_changed_arg, (uint32_t)r->ns[ns].core_ns);
  ns_try_free(r, (uint32_t)ns);
}

/* A new namespace is refused: count, log (at most once a second), say why. */
static int ns_refuse(kvd_registry *r, kvd_ns_refusal why, const kv_hello_req *h, int rc) {
  r->ns_refused[why]++;
  if (why == KVD_NS_TENANT_LIMIT)
    snprintf(
        r->why, sizeof r->why,
        "tenant '%.*s' has %u namespaces, its limit "
        "(limits.namespaces_per_tenant): close sessions of, or delete the blocks of, namespaces "
        "it no longer uses",
        (int)h->tenant.len, h->tenant.p, r->ns_limit);
  else snprintf(r->why, sizeof r->why, "the daemon holds %u namespaces, all it can", KV_NS_MAX);
  ratelog(&r->ns_log, "new namespace refused", r->why);
  return rc;
}

/* A free registry entry. Its index, or -ENOMEM. */
static int ns_entry(kvd_registry *r) {
  if (r->free1) {
    uint32_t i = r->free1 - 1;
    r->free1 = r->ns[i].next_free1;
    return (int)i;
  }
  if (r->nns == r->capns) {
    uint32_t cap = r->capns ? r->capns * 2 : 8;
    kvd_ns *n = realloc(r->ns, cap * sizeof *n);
    if (!n) return -ENOMEM;
    r->ns = n;
    r->capns = cap;
  }
  r->ns[r->nns].core_ns = -1;
  return (int)r->nns++;
}

static void ns_entry_back(kvd_registry *r, uint32_t i) {
  memset(&r->ns[i], 0, sizeof r->ns[i]);
  r->ns[i].core_ns = -1;
  r->ns[i].next_free1 = r->free1;
  r->free1 = i + 1;
}

int kvd_registry_hello(kvd_registry *r, const kv_hello_req *h, const kvd_peer *p) {
  const kv_layout *l = &h->layout;
  r->why[0] = 0;
  if (h->tenant.len == 0 || h->tenant.len > KVD_NAME_MAX) return -EINVAL;
  int t = tenant_for(r, &h->tenant, p);
  if (t < 0) return t;
  if (l->tp_size == 0 || l->tp_size > KVD_TP_MAX || l->tp_rank >= l->tp_size ||
      l->block_bytes == 0 || h->group.len > KVD_NAME_MAX)
    return -EINVAL;
  uint8_t d[32];
  digest_of(h, 0, d);
  for (uint32_t i = 0; i < r->nns; i++) {
    kvd_ns *n = &r->ns[i];
    if (!ns_live(r, i) || memcmp(n->digest, d, 32)) continue;
    if (h->group.len && n->group &&
        (strlen(n->group->name) != h->group.len ||
         memcmp(n->group->name, h->group.p, h->group.len))) {
      snprintf(r->why, sizeof r->why, "this namespace is rank %u of TP group '%s', not of '%.*s'",
               n->tp_rank, n->group->name, (int)h->group.len, h->group.p);
      return -EINVAL;
    }
    if (h->group.len && !n->group) {
      int rc = group_join(r, i, h);
      if (rc) return rc;
    }
    n->sessions++;
    return (int)i;
  }

  /* A new namespace. */
  if (r->tenant_nns[t] >= r->ns_limit && (sweep(r, t), r->tenant_nns[t] >= r->ns_limit))
    return ns_refuse(r, KVD_NS_TENANT_LIMIT, h, -EDQUOT);
  if (!kv_core_ns_room(r->core)) sweep(r, -1);
  int i = ns_entry(r);
  if (i < 0) return i;
  kv_arena *a = &r->tenants[t].arena;
  int core_ns = kv_core_ns_register_digest(r->core, a, l->block_bytes, d);
  if (core_ns < 0) {
    ns_entry_back(r, (uint32_t)i);
    if (core_ns == -ENOSPC && !kv_core_ns_room(r->core))
      return ns_refuse(r, KVD_NS_DAEMON_FULL, h, -ENOSPC);
    return core_ns;
  }
  kvd_ns *n = &r->ns[i];
  memset(n, 0, sizeof *n);
  memcpy(n->digest, d, 32);
  n->core_ns = core_ns;
  n->tenant = (uint32_t)t;
  n->block_bytes = l->block_bytes;
  kv_core_ns_info ni;
  kv_core_ns_info_get(r->core, (uint32_t)core_ns, &ni);
  n->slot_bytes = a->cls[ni.cls].slot_bytes;
  n->tp_rank = l->tp_rank;
  n->tp_size = l->tp_size;
  n->dtype16 = (uint8_t)kvd_dtype16(l->dtype.p, l->dtype.len);
  n->head_dim = l->head_dim;
  /* lossy in the cold tiers when its tenant says so, for 16-bit KV whose
   * blocks are whole groups of a head (a scale per token and head) */
  if (r->configured && n->dtype16 && l->head_dim && (l->block_bytes / 2) % l->head_dim == 0 &&
      l->block_bytes % 2 == 0)
    n->quant = r->tenants[t].cfg.cold_precision;
  /* G3: lossy as G4 when cold_precision says so, else coded with g3.codec */
  unsigned g3 = r->g3_code && n->dtype16 ? KV_G3_CODE : 0;
  if (n->quant)
    g3 = (n->quant == KV_QUANT_FP8 ? KV_G3_FP8 : KV_G3_INT8) |
         (n->dtype16 == 1 ? KV_G3_BF16 : 0) | KV_G3_GROUP(n->head_dim);
  kv_core_ns_g3_code(r->core, (uint32_t)core_ns, g3);
  n->sessions = 1;
  if (h->group.len) {
    int rc = group_join(r, (uint32_t)i, h);
    if (rc) {
      /* A namespace with no block goes back at once; one found on G3 stays in the core. */
      if (!kv_core_ns_blocks(r->core, (uint32_t)core_ns))
        kv_core_ns_free(r->core, (uint32_t)core_ns);
      ns_entry_back(r, (uint32_t)i);
      return rc;
    }
  }
  r->tenant_nns[t]++;
  r->nlive++;
  /* The tenant's G3 share holds the namespace's blocks (once bound, a
   * namespace stays its tenant's: its digest names the tenant). */
  if (r->configured) kv_core_ns_owner(r->core, (uint32_t)core_ns, (unsigned)t);
  return i;
}

int kvd_registry_lookup(kvd_registry *r, int ns, const kv_key *keys, uint32_t n,
                        uint8_t *tier_out) {
  kvd_ns *me = &r->ns[ns];
  int hit = kv_core_lookup(r->core, (uint32_t)me->core_ns, keys, n, tier_out);
  if (hit <= 0 || !me->group) return hit;
  for (uint16_t rank = 0; rank < me->group->tp_size; rank++) {
    int other = me->group->ns_of_rank[rank];
    if (other < 0 || other == ns) continue;
    /* Only the run the caller has can count, so look no further than it. */
    int h2 = kv_core_lookup(r->core, (uint32_t)r->ns[other].core_ns, keys, (uint32_t)hit, NULL);
    if (h2 < hit) hit = h2 < 0 ? 0 : h2;
  }
  return hit;
}
