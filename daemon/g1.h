/*
 * g1.h - the daemon's G1 tier: the devices, their pools, their export to
 * workers.
 *
 * g1.device names up to KV_CFG_G1_DEVICES_MAX devices; a kvd_g1s holds one
 * kvd_g1 per name, in its order (kvd_g1s_* below), and each kvd_g1 one
 * device and its pool. kvd_g1_open (start-up, before the G2 arenas exist)
 * decides from the configuration whether a device's G1 is on:
 *   g1.enable = off  - off.
 *   g1.enable = auto - on when the device answers (g1.backend auto|cuda:
 *                      a CUDA device; sim: the simulation), else off with
 *                      the reason logged once.
 *   g1.enable = on   - as auto, but a device that does not answer fails
 *                      the start.
 * The simulation (cuda/dev.h, KV_DEV_SIM) is used only when g1.backend =
 * sim says so: a plain machine without a GPU runs with G1 off.
 * When on, it holds one pool of g1.capacity bytes on its device and the
 * pool's export (kv_dev_export, encoded once). The core numbers the pools
 * in the order they come up (kvd_g1.core_pool, kv_core_attach_g1).
 *
 * G2 arenas are registered with the device as they are made
 * (kvd_g1_arena_register / kvd_g1_arena_unregister are kv_arena_opts'
 * register_fn / unregister_fn, the kvd_g1 their arg) so G1<->G2 copies are
 * DMA. kvd_g1_arena_unregister must run before kvd_g1_close.
 *
 * The pool's slots: `slots`, an arena over the pool's device memory
 * (kv_arena_opts.memory), which the core hands out (kv_core_attach_g1 with
 * kvd_g1_copy as the mover, the kvd_g1 its arg).
 *
 * Batches: kvd_g1_copy queues the copy (cuda/batch.h) and returns; the
 * copies queued during one turn of the loop - every block of a LOAD, and
 * of every LOAD read in that turn - go to the device as one submission per
 * direction when kvd_g1_flush runs: from a uv_prepare, so before the loop
 * blocks, and from every path that waits for the device.
 *
 * Completions: kvd_g1_start puts the device's completion fd in a uv_poll on
 * the loop; each reaped {tag, status} goes to the dispatch hook (the
 * daemon's: kv_core_g1_done, then the LOADs waiting for room), one per
 * copy, also for a copy the device refused at submit (never from inside
 * kvd_g1_copy). kvd_g1_stop closes the poll and the prepare; kvd_g1_close
 * submits what is queued, waits for copies in flight, reaps them, destroys
 * the pool and closes the device. Every function is a no-op on a kvd_g1
 * that is off. Owner: the loop thread.
 */
#ifndef KV_DAEMON_G1_H
#define KV_DAEMON_G1_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cuda/batch.h"
#include "cuda/dev.h"
#include "daemon/config.h"
#include "tiers/arena.h"

typedef void (*kvd_g1_done_fn)(void *arg, uint64_t tag, int status);

typedef struct kvd_g1 {
  int on;           /* 1 when the pool exists */
  int ordinal;      /* the device, as g1.device names it */
  int core_pool;    /* the core's index of the pool (kv_core_attach_g1); -1: none */
  uint8_t uuid[16]; /* the device's (valid while on) */
  char reason[KV_DEV_REASON_MAX + 128]; /* why G1 is off ("" when on or disabled by config) */
  kv_dev *dev;
  kv_dev_pool *pool;
  kv_arena slots;                   /* the pool's slots (valid while on) */
  kv_dev_export x;                  /* the pool's export (x.fd owned by the pool) */
  uint8_t enc[KV_DEVX_ENCODED_MAX]; /* x encoded (kv_dev_export_encode) */
  int enc_len;
  uint64_t exports[4]; /* exports sent, by KV_DEVX_* kind */
  uint32_t arenas;     /* G2 arenas registered */
  uint64_t reaped;     /* completions reaped */
  kvd_g1_done_fn done; /* dispatch hook for reaped tags, or NULL */
  void *done_arg;
  kv_dev_batcher batch; /* copies queued for the next submission */
  uv_poll_t poll;
  uv_prepare_t prep; /* flushes the batch before the loop blocks */
  int polling;
} kvd_g1;

/* Opens G1 on device `ordinal` per c. 0 (on, or off with g->reason set
 * and logged), or -ENODEV / the device's error when g1.enable = on and it
 * cannot be had. */
int kvd_g1_open(kvd_g1 *g, const kv_config *c, int ordinal);
/* Starts polling the completion fd on loop. 0 or a libuv error. */
int kvd_g1_start(kvd_g1 *g, uv_loop_t *loop);
/* Stops the poll (its close completes on the loop's next run). */
void kvd_g1_stop(kvd_g1 *g);
/* Reaps whatever is done (the poll's callback; callable directly). Returns
 * the count. */
unsigned kvd_g1_reap(kvd_g1 *g);
/* Submits the queued copies (one submission per direction) and delivers
 * any the device refused; repeats while that queued more. */
void kvd_g1_flush(kvd_g1 *g);
/* Waits for copies in flight, destroys the pool, closes the device. */
void kvd_g1_close(kvd_g1 *g);

/* The core's mover (kv_g1_copy_fn): queues one copy for the direction's
 * next submission under tag. 0 or -ENOMEM. arg is the kvd_g1. */
int kvd_g1_copy(void *arg, int to_g1, void *g1, void *g2, uint32_t bytes, uint64_t tag);

/* kv_arena_opts hooks; arg is the kvd_g1. */
int kvd_g1_arena_register(void *base, size_t len, void *arg);
void kvd_g1_arena_unregister(void *base, size_t len, void *arg);

/* The tier-info entry kind (KV_TI_G1_*) and the fd to send with it (-1 for
 * the legacy IPC kind); counts one export. -ENODEV when G1 is off. */
int kvd_g1_export(kvd_g1 *g, uint8_t *kind, int *fd);

/* ---- every device of g1.device ---------------------------------------------- */

typedef struct kvd_g1s {
  unsigned n;  /* devices g1.device names */
  unsigned on; /* of them, with a pool */
  kvd_g1 g[KV_CFG_G1_DEVICES_MAX];
  char reason[KV_DEV_REASON_MAX + 160]; /* why G1 is off ("" while a pool is up) */
  uint64_t selects[2];                  /* G1_SELECT answered [0] with a pool, [1] without */
} kvd_g1s;

/* Opens every device of g1.device (kvd_g1_open each). 0 (with s->on pools
 * up, maybe none: s->reason says why), or, with g1.enable = on, the error
 * of the first device that cannot be had (nothing left open). */
int kvd_g1s_open(kvd_g1s *s, const kv_config *c);
int kvd_g1s_start(kvd_g1s *s, uv_loop_t *loop); /* 0 or the first libuv error */
void kvd_g1s_stop(kvd_g1s *s);
void kvd_g1s_close(kvd_g1s *s);
/* The first device with a pool (what HELLO offers), or NULL. */
kvd_g1 *kvd_g1s_first(kvd_g1s *s);
/* The device with a pool whose uuid is uuid, or NULL. */
kvd_g1 *kvd_g1s_find(kvd_g1s *s, const uint8_t uuid[16]);
/* kv_arena_opts hooks for every device with a pool; arg is the kvd_g1s.
 * Register: all or none (0, or the first device's error). */
int kvd_g1s_arena_register(void *base, size_t len, void *arg);
void kvd_g1s_arena_unregister(void *base, size_t len, void *arg);

#endif
