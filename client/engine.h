/*
 * engine.h - libkvclient's engine helpers (internal; the public face is
 * the "for engines" part of kvclient.h: kvc_g2_register_cuda, kvc_g2_info,
 * kvc_pages_gather/scatter, kvc_memcpy_batch).
 *
 * A handle's G2 state: its mapping (set by kvc_open) and, once
 * kvc_g2_register_cuda succeeded, the device that holds the registration
 * (a cuda/dev.h kv_dev owned by the handle: CUDA on the calling thread's
 * current device, or SIM with KV_DEV_BACKEND=sim) and the device-side
 * address of the mapping's base. A registration leaves its undoing in
 * `release` (engine.c's, set by kvc_g2_register_cuda once it succeeded):
 * kvc_close calls it, if set, before the mapping goes; it closes that
 * device, which undoes the registration, and clears dev, dbase, release and
 * info.registered, so that client.c never names engine.c's functions.
 */
#ifndef KV_CLIENT_ENGINE_H
#define KV_CLIENT_ENGINE_H

#include <stdint.h>

#include "client/kvclient.h"
#include "cuda/dev.h"

typedef struct kvc__g2 {
  kvc_g2 info;     /* base, bytes: the mapping; registered, reason */
  kv_dev *dev;     /* holds the registration; NULL when not registered */
  uintptr_t dbase; /* device-side address of info.base (registered only) */
  /* Undoes the registration (engine.c); NULL when not registered. */
  void (*release)(struct kvc__g2 *g);
} kvc__g2;

/* The handle's G2 state (client.c). */
kvc__g2 *kvc__g2_of(kvc *c);
/* The handle's G1 state as kvc_g1_info gives it, without the copy. */
const kvc_g1 *kvc__g1_of(const kvc *c);

#endif
