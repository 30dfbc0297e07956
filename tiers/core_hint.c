/*
 * core_hint.c - engine hints (core.h, "engine hints"): argument checks only
 * for now; the session table and the policy that reads it come next.
 */
#include <errno.h>

#include "base/hint.h"
#include "tiers/core_int.h"

void kv_core_set_now(kv_core *c, uint64_t now_ms) {
  (void)c;
  (void)now_ms;
}

int kv_core_hint_session(kv_core *c, uint32_t ns, uint64_t session, kv_block *b, uint32_t retain_s) {
  (void)c;
  (void)retain_s;
  if (!session || !b || b->ns != ns) return -EINVAL;
  return 0;
}

int kv_core_hint_finished(kv_core *c, uint32_t ns, uint64_t session, unsigned stop,
                          uint32_t retain_s) {
  (void)c;
  (void)ns;
  (void)retain_s;
  if (!session || stop >= KV_STOP_COUNT) return -EINVAL;
  return 0;
}

int kv_core_hint_end(kv_core *c, uint32_t ns, uint64_t session) {
  (void)c;
  (void)ns;
  if (!session) return -EINVAL;
  return 0;
}
