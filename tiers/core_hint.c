/*
 * core_hint.c - engine hints (core.h, "engine hints"): the checks, the
 * session table (sessions.h) that the eviction policies read through the
 * index (kv_index.sessions, .owner), and telling the policies what changed
 * (kv_evict_ops.hinted, .session).
 *
 * Scope: every hint names a namespace; a block is given only to a session
 * of its own namespace, and sessions are found by (namespace, id), so one
 * namespace's hints reach no other namespace's blocks. The table's shares
 * (sessions.h) are tenants: a namespace's sessions count against its
 * owner's share (kv_core_ns_owner; the daemon gives every namespace its
 * tenant when tenants are configured), or against a share of its own when
 * it has no owner, so one tenant's new sessions make the table forget
 * only its own once it holds its part.
 */
#include <errno.h>

#include "base/hint.h"
#include "tiers/core_int.h"

void kv_core_set_now(kv_core *c, uint64_t now_ms) { kv_sessions_set_now(&c->sess, now_ms); }

/* A namespace hints may name: registered, not dormant. */
static int ns_ok(kv_core *c, uint32_t ns) { return kv_core__ns_get(c, ns) != NULL; }

/* The share of the session table (sessions.h) namespace ns's sessions
 * count against: its owner's (the daemon's tenant) when it has one, else
 * its own. ns is registered. */
static uint32_t share_of(kv_core *c, uint32_t ns) {
  int o = c->ns[ns].owner;
  return o >= 0 ? (uint32_t)o : KV_CORE_OWNERS_MAX + ns;
}

/* Every policy instance that ranks by sessions hears that the session in
 * `slot` changed. */
static void tell_session(kv_core *c, uint32_t slot) {
  enum { MAXPOL = KV_ARENA_MAX_CLASSES * 64 };
  static kv_evict *pol[MAXPOL]; /* the loop's thread only */
  for (int t = 0; t < KV_NTIERS; t++) {
    uint32_t n = kv_core__tier_policies(c, (kv_tier)t, pol, MAXPOL);
    for (uint32_t i = 0; i < n; i++)
      if (pol[i]->ops->session) pol[i]->ops->session(pol[i], slot);
  }
}

int kv_core_hint_session(kv_core *c, uint32_t ns, uint64_t session, kv_block *b,
                         uint32_t retain_s) {
  if (!session || !b || b->ns != ns || !ns_ok(c, ns)) return -EINVAL;
  if (b->state != KV_BS_READY && b->state != KV_BS_WRITING) return -EINVAL;
  uint32_t old = b->id < c->ix.nowner ? c->ix.owner[b->id] : KV_SESS_NONE, slot;
  int rc = kv_sessions_hint_block(&c->sess, &c->ix, ns, share_of(c, ns), session, b,
                                  retain_s, &slot);
  if (rc < 0) return rc;
  if (rc) tell_session(c, slot);
  for (int t = 0; t < KV_NTIERS; t++) { /* the policies holding b regroup it */
    if (!(b->inpol & KV_TIER_BIT(t))) continue;
    kv_evict *e = kv_core__policy_of(c, b, (kv_tier)t);
    if (e && e->ops->hinted) e->ops->hinted(e, b, old);
  }
  return 0;
}

int kv_core_hint_finished(kv_core *c, uint32_t ns, uint64_t session, unsigned stop,
                          uint32_t retain_s) {
  if (!session || stop >= KV_STOP_COUNT || !ns_ok(c, ns)) return -EINVAL;
  int64_t slot = kv_sessions_finished(&c->sess, ns, share_of(c, ns), session, stop, retain_s);
  if (slot < 0) return (int)slot;
  tell_session(c, (uint32_t)slot);
  return 0;
}

int kv_core_hint_end(kv_core *c, uint32_t ns, uint64_t session) {
  if (!session) return -EINVAL;
  uint32_t slot = kv_sessions_end(&c->sess, ns, session);
  if (slot != UINT32_MAX) tell_session(c, slot);
  return 0;
}

void kv_core_set_retain_max(kv_core *c, uint32_t retain_max_s) {
  c->sess.retain_max_s = retain_max_s;
}

void kv_core_hint_stats_get(const kv_core *c, kv_core_hint_stats *out) {
  *out = (kv_core_hint_stats){.hints = c->sess.hints,
                              .sessions = c->sess.live,
                              .forgotten = c->sess.forgotten,
                              .now_ms = c->sess.now_ms};
}
