/* session.c - pins and allocations owned by a connection (see session.h). */
#include "daemon/session.h"

#include <errno.h>
#include <string.h>

#include "base/errors.h"

void kvd_session_init(kvd_session *s, uint64_t id) {
  memset(s, 0, sizeof *s);
  s->id = id;
  s->ns = -1;
  s->g1pool = -1;
  s->peer_fd = -1;
}

void kvd_session_set_share(kvd_session *s, uint64_t tenant_slots, uint32_t percent) {
  if (percent >= 100) {
    s->held_max = 0;
    return;
  }
  uint64_t m = tenant_slots * percent / 100;
  s->held_max = m < 1 ? 1 : m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;
}

/* Blocks this session holds: pinned (each once) and allocated. */
static int over_share(const kvd_session *s) {
  return s->held_max && (uint64_t)s->pins.n + s->allocs.n >= s->held_max;
}

int kvd_session_pin(kv_core *c, kvd_session *s, kv_block *b, uint64_t max_pins) {
  if (max_pins && s->npins >= max_pins) return -EDQUOT;
  uint32_t *n = u32map_get(&s->pins, b->id);
  if (n) {
    if (*n == UINT32_MAX) return -EDQUOT;
    ++*n;
  } else {
    if (over_share(s)) return KV_ESHARE;
    int rc = u32map_add(&s->pins, b->id, 1);
    if (rc) return rc;
    rc = kv_core_pin(c, b);
    if (rc) {
      u32map_del(&s->pins, b->id);
      return rc;
    }
  }
  s->npins++;
  return 0;
}

int kvd_session_unpin(kv_core *c, kvd_session *s, kv_block *b) {
  uint32_t *n = u32map_get(&s->pins, b->id);
  if (!n) return KV_ENOTOWNER;
  if (*n == 1) {
    int rc = kv_core_unpin(c, b);
    if (rc) return rc;
    u32map_del(&s->pins, b->id);
  } else {
    --*n;
  }
  s->npins--;
  return 0;
}

uint64_t kvd_session_pins(const kvd_session *s) { return s->npins; }

int kvd_session_may_alloc(const kvd_session *s, uint32_t max_allocs) {
  if (max_allocs && s->allocs.n >= max_allocs) return -EDQUOT;
  return over_share(s) ? KV_ESHARE : 0;
}

int kvd_session_track_alloc(kvd_session *s, kv_block *b) {
  return u32map_add(&s->allocs, b->id, 1);
}

int kvd_session_commit(kv_core *c, kvd_session *s, kv_block *b, uint32_t crc) {
  if (!u32map_get(&s->allocs, b->id)) return KV_ENOTOWNER;
  int rc = kv_core_commit(c, b, crc);
  if (rc == 0) u32map_del(&s->allocs, b->id);
  return rc;
}

int kvd_session_abort(kv_core *c, kvd_session *s, kv_block *b) {
  if (!u32map_get(&s->allocs, b->id)) return KV_ENOTOWNER;
  int rc = kv_core_abort(c, b);
  if (rc == 0) u32map_del(&s->allocs, b->id);
  return rc;
}

void kvd_session_close(kv_core *c, kvd_session *s, uint64_t *pins, uint64_t *allocs) {
  uint64_t np = 0, na = 0;
  if (s->pins.k) {
    for (uint32_t i = 0; i <= s->pins.mask; i++) {
      if (s->pins.k[i] == U32MAP_EMPTY) continue;
      kv_core_unpin(c, kv_index_at(kv_core_index(c), s->pins.k[i]));
      np += s->pins.v[i];
    }
  }
  if (s->allocs.k) {
    for (uint32_t i = 0; i <= s->allocs.mask; i++) {
      if (s->allocs.k[i] == U32MAP_EMPTY) continue;
      kv_block *b = kv_index_at(kv_core_index(c), s->allocs.k[i]);
      if (b && b->state == KV_BS_WRITING && kv_core_abort(c, b) == 0) na++;
    }
  }
  u32map_free(&s->pins);
  u32map_free(&s->allocs);
  s->npins = 0;
  if (pins) *pins = np;
  if (allocs) *allocs = na;
}
