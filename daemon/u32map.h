/*
 * u32map.h - a small open-addressing map from uint32 to uint32, for the
 * per-connection tables of pins and allocations (key: block id).
 *
 * Linear probing, backward-shift deletion, grows at 3/4 load, never
 * shrinks. UINT32_MAX is reserved (empty marker) and may not be a key.
 * Not thread-safe. Errors: -ENOMEM (the map is then unchanged).
 */
#ifndef KV_DAEMON_U32MAP_H
#define KV_DAEMON_U32MAP_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "tiers/probe.h"

typedef struct u32map {
  uint32_t *k, *v;
  uint32_t mask, n; /* mask + 1 slots when k != NULL */
} u32map;

#define U32MAP_EMPTY UINT32_MAX

static inline uint32_t u32map_hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

static inline void u32map_free(u32map *m) {
  free(m->k);
  free(m->v);
  m->k = m->v = NULL;
  m->mask = m->n = 0;
}

/* Pointer to the value for key, or NULL. */
static inline uint32_t *u32map_get(const u32map *m, uint32_t key) {
  if (!m->k) return NULL;
  for (uint32_t i = u32map_hash(key) & m->mask;; i = (i + 1) & m->mask) {
    if (m->k[i] == key) return &m->v[i];
    if (m->k[i] == U32MAP_EMPTY) return NULL;
  }
}

static inline int u32map_grow(u32map *m) {
  uint32_t cap = m->k ? (m->mask + 1) * 2 : 16;
  uint32_t *k = malloc(cap * sizeof *k), *v = malloc(cap * sizeof *v);
  if (!k || !v) {
    free(k);
    free(v);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < cap; i++) k[i] = U32MAP_EMPTY;
  if (m->k) {
    for (uint32_t i = 0; i <= m->mask; i++) {
      if (m->k[i] == U32MAP_EMPTY) continue;
      uint32_t j = u32map_hash(m->k[i]) & (cap - 1);
      while (k[j] != U32MAP_EMPTY) j = (j + 1) & (cap - 1);
      k[j] = m->k[i];
      v[j] = m->v[i];
    }
  }
  free(m->k);
  free(m->v);
  m->k = k;
  m->v = v;
  m->mask = cap - 1;
  return 0;
}

/* Adds delta to key's value, inserting it with value delta if absent. */
static inline int u32map_add(u32map *m, uint32_t key, uint32_t delta) {
  uint32_t *p = u32map_get(m, key);
  if (p) {
    *p += delta;
    return 0;
  }
  if (!m->k || (m->n + 1) * 4 > (m->mask + 1) * 3) {
    int rc = u32map_grow(m);
    if (rc) return rc;
  }
  uint32_t i = u32map_hash(key) & m->mask;
  while (m->k[i] != U32MAP_EMPTY) i = (i + 1) & m->mask;
  m->k[i] = key;
  m->v[i] = delta;
  m->n++;
  return 0;
}

/* Removes key; 1 if it was there, 0 if not. */
static inline int u32map_del(u32map *m, uint32_t key) {
  if (!m->k) return 0;
  uint32_t i = u32map_hash(key) & m->mask;
  while (m->k[i] != key) {
    if (m->k[i] == U32MAP_EMPTY) return 0;
    i = (i + 1) & m->mask;
  }
  uint32_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & m->mask;
    if (m->k[j] == U32MAP_EMPTY) break;
    uint32_t home = u32map_hash(m->k[j]) & m->mask;
    if (!kv_probe_stays(hole, j, home)) {
      m->k[hole] = m->k[j];
      m->v[hole] = m->v[j];
      hole = j;
    }
  }
  m->k[hole] = U32MAP_EMPTY;
  m->n--;
  return 1;
}

#endif
