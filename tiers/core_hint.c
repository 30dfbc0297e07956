/*
 * core_hint.c - engine hints (core.h, "engine hints"): the checks, and the
 * session table (sessions.h) that the eviction policies read through the
 * index (kv_index.sessions).
 *
 * Scope: every hint names a namespace; a block is given only to a session
 * of its own namespace, and sessions are found by (namespace, id), so one
 * namespace's hints reach no other namespace's blocks.
 */
#include <errno.h>

#include "base/hint.h"
#include "tiers/core_int.h"

void kv_core_set_now(kv_core *c, uint64_t now_ms) { kv_sessions_set_now(&c->sess, now_ms); }

/* A namespace hints may name: registered, not dormant. */
static int ns_ok(kv_core *c, uint32_t ns) { return kv_core__ns_get(c, ns) != NULL; }

int kv_core_hint_session(kv_core *c, uint32_t ns, uint64_t session, kv_block *b,
                         uint32_t retain_s) {
  if (!session || !b || b->ns != ns || !ns_ok(c, ns)) return -EINVAL;
  if (b->state != KV_BS_READY && b->state != KV_BS_WRITING) return -EINVAL;
  return kv_sessions_hint_block(&c->sess, ns, session, b, retain_s);
}

int kv_core_hint_finished(kv_core *c, uint32_t ns, uint64_t session, unsigned stop,
                          uint32_t retain_s) {
  if (!session || stop >= KV_STOP_COUNT || !ns_ok(c, ns)) return -EINVAL;
  return kv_sessions_finished(&c->sess, ns, session, stop, retain_s);
}

int kv_core_hint_end(kv_core *c, uint32_t ns, uint64_t session) {
  if (!session) return -EINVAL;
  kv_sessions_end(&c->sess, ns, session);
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
