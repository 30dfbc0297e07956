/*
 * kvd.h - the daemon's state, shared by its loop, its connections and the
 * handlers of each operation. One instance per process; only the loop's
 * thread touches it.
 */
#ifndef KV_DAEMON_KVD_H
#define KV_DAEMON_KVD_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/registry.h"
#include "daemon/session.h"
#include "proto/wire.h"
#include "tiers/core.h"

typedef struct kvd_stats {
  uint64_t sessions_opened, sessions_closed;
  uint64_t frames_in, frames_out, bad_frames;
  uint64_t pins_released_on_close, allocs_aborted_on_close;
  uint64_t ops[KV_OP_COUNT];
} kvd_stats;

typedef struct kvd {
  kv_config cfg;
  kv_core core;
  kvd_registry reg;
  uint64_t next_session_id;
  uint32_t nsessions;
  uint64_t start_ms;
  kvd_stats st;
  /* Scratch for batch handlers, KV_BATCH_MAX entries each. */
  kv_key *keys;
  uint8_t *tiers;
  int32_t *status;
  kv_load_ent *loads;
  kv_alloc_ent *allocs;
} kvd;

/* Builds the core and the registry (tenant arenas) from d->cfg.
 * 0 or an error, logged. */
int kvd_init(kvd *d);
void kvd_fini(kvd *d);

/*
 * Handles one decoded request of session s and appends exactly one reply
 * frame (the op's reply, or an ERROR reply) to out. When the reply carries
 * a descriptor (HELLO: the G2 arena), *fd_out is set to it (the daemon's
 * own fd: the caller sends a copy and does not close it), else -1.
 * Returns 0, or a negative error when the reply could not be encoded (the
 * caller then closes the connection).
 */
int kvd_handle(kvd *d, kvd_session *s, const kv_msg *req, kv_buf *out, int *fd_out);

#endif
