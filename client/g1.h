/*
 * g1.h - libkvclient's G1 import (internal; the public face is kvc_g1_info
 * and kvc_g1_ptr in kvclient.h).
 *
 * kvc__g1_import takes the HELLO reply's G1 tier-info entry (kind KV_TI_G1_*
 * and value: kv_dev_export_encode's bytes) and the fd that came with it
 * (KV_F_FD2; -1 for legacy IPC), opens the device the export names (by
 * uuid, with the backend its kind needs) and maps the pool once. On any
 * failure - a value that does not decode, a kind this library cannot map,
 * the pool on a device this process cannot see, no driver - it records the
 * reason in g->reason, leaves g->available 0 and returns the error; the
 * session goes on with G2 alone. The fd is closed either way.
 */
#ifndef KV_CLIENT_G1_H
#define KV_CLIENT_G1_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvclient.h"
#include "cuda/dev.h"

typedef struct kvc__g1 {
  kvc_g1 info;
  kv_dev *dev;
  kv_dev_map *map;
} kvc__g1;

int kvc__g1_import(kvc__g1 *g, uint8_t kind, const uint8_t *val, size_t len, int fd);
void kvc__g1_release(kvc__g1 *g);

#endif
