/*
 * session.h - what one worker connection holds: its namespace, its pins and
 * its uncommitted allocations.
 *
 * Pins and allocations belong to the connection. kvd_session_close() - run
 * the moment the socket closes, whether the worker said goodbye or was
 * killed - releases every pin and aborts every allocation it still holds,
 * so a dead worker never leaks G2 memory and other workers are unaffected.
 * A session can release only pins it took, and commit or abort only
 * allocations it made (KV_ENOTOWNER otherwise).
 *
 * Pins: the session counts how many times it pinned each block; the core
 * holds one pin per (session, block), so no session can exhaust a block's
 * pin count (a 16-bit count in the core) and make others' LOADs of it fail.
 * Each session has limits (limits.pins_per_session: pins in total, every
 * repeat counted; limits.allocs_per_session: uncommitted allocations):
 * past one, the key's answer is -EDQUOT and nothing changes. And a share
 * (limits.session_share, a percentage): the blocks a session holds -
 * pinned (each block once) or allocated and not yet committed - stay under
 * that share of its tenant's G2 slots of its block size (held_max, set at
 * HELLO), so that one worker cannot pin or allocate every slot of the arena
 * and lock the tenant's other workers out; past it the key's answer is
 * KV_ESHARE and nothing changes.
 */
#ifndef KV_DAEMON_SESSION_H
#define KV_DAEMON_SESSION_H

#include <stdint.h>

#include "daemon/u32map.h"
#include "tiers/core.h"

typedef struct kvd_session {
  uint64_t id;
  int ns;                      /* registry namespace index; -1 before HELLO */
  int g1pool;                  /* the core's index of this session's G1 pool (HELLO: the
                  * first; G1_SELECT: its device's); -1: none */
  int g1_loaded;               /* 1 once a LOAD to G1 came: offsets into g1pool were given */
  u32map pins;                 /* block id -> pins this session holds on it (the core: one) */
  uint64_t npins;              /* the sum of pins' counts */
  u32map allocs;               /* block id -> 1 while this session writes it */
  uint32_t held_max;           /* blocks pinned + allocated at most (the share); 0: no limit */
  int share_logged;            /* its first KV_ESHARE was logged */
  uint32_t peer_uid, peer_gid; /* the worker's credentials at accept (SO_PEERCRED) */
  int32_t peer_pid;
  int peer_fd; /* the connection's socket, for SO_PEERGROUPS at HELLO; -1: none */
} kvd_session;

void kvd_session_init(kvd_session *s, uint64_t id);

/* The session's share, from its tenant's G2 slots for its block size and
 * limits.session_share (percent; 100: no limit). At least one block. */
void kvd_session_set_share(kvd_session *s, uint64_t tenant_slots, uint32_t percent);

/* Pins b for this session: a repeat pin only counts here, the first also
 * pins b in the core. 0, -EDQUOT (the session holds max_pins pins; 0: no
 * limit), KV_ESHARE (a first pin past held_max), -EOVERFLOW (the core's
 * count of sessions pinning b is full) or -ENOMEM; nothing changed on
 * error. */
int kvd_session_pin(kv_core *c, kvd_session *s, kv_block *b, uint64_t max_pins);
/* Drops one of this session's pins on b (the core's with the last).
 * KV_ENOTOWNER if it holds none. */
int kvd_session_unpin(kv_core *c, kvd_session *s, kv_block *b);
/* Pins this session holds, all blocks together, repeats counted. */
uint64_t kvd_session_pins(const kvd_session *s);

/* Whether this session may make one more allocation: 0 when its
 * uncommitted ones are fewer than max_allocs (0: no limit) and what it
 * holds is under held_max; else -EDQUOT or KV_ESHARE. */
int kvd_session_may_alloc(const kvd_session *s, uint32_t max_allocs);
/* Records that this session writes b (after kv_core_alloc). 0 or -ENOMEM. */
int kvd_session_track_alloc(kvd_session *s, kv_block *b);
/* Commits or aborts b for this session: KV_ENOTOWNER unless it allocated
 * it; otherwise kv_core_commit()/kv_core_abort()'s result. */
int kvd_session_commit(kv_core *c, kvd_session *s, kv_block *b, uint32_t crc);
int kvd_session_abort(kv_core *c, kvd_session *s, kv_block *b);

/* Releases every pin and aborts every allocation; frees the tables. The
 * session may be initialised again afterwards. Returns how many pins and
 * allocations were dropped (for the log). */
void kvd_session_close(kv_core *c, kvd_session *s, uint64_t *pins, uint64_t *allocs);

#endif
