/* ghost.c - fingerprints of keys held recently (see ghost.h). */
#include "daemon/ghost.h"

#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>

int kvd_ghost_init(kvd_ghost *g, uint32_t slots) {
  uint32_t sets = 16;
  while (sets * KVD_GHOST_WAYS < slots && sets < (1u << 28)) sets <<= 1;
  g->fp = calloc((size_t)sets * KVD_GHOST_WAYS, sizeof *g->fp);
  g->next = calloc(sets, 1);
  g->nsets = sets;
  if (!g->fp || !g->next) {
    kvd_ghost_fini(g);
    return -ENOMEM;
  }
  return 0;
}

void kvd_ghost_fini(kvd_ghost *g) {
  free(g->fp);
  free(g->next);
  g->fp = NULL;
  g->next = NULL;
  g->nsets = 0;
}

uint64_t kvd_ghost_fp(uint32_t ns, const uint8_t *key, unsigned len) {
  uint64_t h = XXH3_64bits_withSeed(key, len, ns);
  return h ? h : 1;
}

static uint64_t *set_of(const kvd_ghost *g, uint64_t fp) {
  return &g->fp[(size_t)(fp & (g->nsets - 1)) * KVD_GHOST_WAYS];
}

void kvd_ghost_add(kvd_ghost *g, uint64_t fp) {
  if (!g->nsets) return;
  uint64_t *s = set_of(g, fp);
  for (int i = 0; i < KVD_GHOST_WAYS; i++)
    if (s[i] == fp) return;
  for (int i = 0; i < KVD_GHOST_WAYS; i++)
    if (s[i] == 0) {
      s[i] = fp;
      return;
    }
  uint8_t *n = &g->next[fp & (g->nsets - 1)];
  s[*n] = fp;
  *n = (uint8_t)((*n + 1) % KVD_GHOST_WAYS);
}

int kvd_ghost_has(const kvd_ghost *g, uint64_t fp) {
  if (!g->nsets) return 0;
  const uint64_t *s = set_of(g, fp);
  for (int i = 0; i < KVD_GHOST_WAYS; i++)
    if (s[i] == fp) return 1;
  return 0;
}

void kvd_ghost_forget(kvd_ghost *g, uint64_t fp) {
  if (!g->nsets) return;
  uint64_t *s = set_of(g, fp);
  for (int i = 0; i < KVD_GHOST_WAYS; i++)
    if (s[i] == fp) s[i] = 0;
}
