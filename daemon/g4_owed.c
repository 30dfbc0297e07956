/*
 * g4_owed.c - G4's backlog of owed writes and its memory of absent keys
 * (g4_owed.h).
 */
#include "daemon/g4_owed.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int kvd_g4_backlog_init(kvd_g4_backlog *b, uint32_t cap) {
  memset(b, 0, sizeof *b);
  if (cap && !(b->v = calloc(cap, sizeof *b->v))) return -ENOMEM;
  b->cap = cap;
  return 0;
}

void kvd_g4_backlog_fini(kvd_g4_backlog *b) {
  free(b->v);
  memset(b, 0, sizeof *b);
}

void kvd_g4_backlog_push(kvd_g4_backlog *b, const uint8_t digest[32], uint32_t core_ns,
                         const kv_key *key, uint8_t tries, uint32_t coding, int64_t due_ms) {
  if (!b->cap) {
    b->dropped++;
    return;
  }
  if (b->n == b->cap) { /* full: the oldest goes */
    b->head = (b->head + 1) % b->cap;
    b->n--;
    b->dropped++;
  }
  kvd_g4_owed *e = &b->v[(b->head + b->n) % b->cap];
  memcpy(e->digest, digest, sizeof e->digest);
  e->core_ns = core_ns;
  e->tries = tries;
  e->coding = coding;
  e->due_ms = due_ms;
  e->key = *key;
  b->n++;
  b->added++;
}

int kvd_g4_backlog_pop(kvd_g4_backlog *b, kvd_g4_owed *out, int64_t now_ms) {
  if (!b->n || b->v[b->head].due_ms > now_ms) return 0;
  *out = b->v[b->head];
  b->head = (b->head + 1) % b->cap;
  b->n--;
  return 1;
}

int kvd_g4_absent_init(kvd_g4_absent *a, uint32_t cap, uint32_t ttl_ms) {
  memset(a, 0, sizeof *a);
  if (!cap || !ttl_ms) return 0;
  uint32_t n = 1;
  while (n < cap && n < (1u << 30)) n <<= 1;
  if (!(a->v = calloc(n, sizeof *a->v))) return -ENOMEM;
  a->mask = n - 1;
  a->ttl_ms = ttl_ms;
  return 0;
}

void kvd_g4_absent_fini(kvd_g4_absent *a) {
  free(a->v);
  memset(a, 0, sizeof *a);
}

uint64_t kvd_g4_absent_fp(const uint8_t digest[32], const kv_key *key) {
  uint64_t fp = XXH3_64bits_withSeed(key->b, key->len, XXH3_64bits(digest, 32));
  return fp ? fp : 1; /* 0 marks an empty slot */
}

void kvd_g4_absent_note(kvd_g4_absent *a, uint64_t fp, int64_t now_ms) {
  if (!a->v) return;
  kvd_g4_absent_slot *s = &a->v[fp & a->mask];
  s->fp = fp;
  s->until_ms = now_ms + a->ttl_ms;
}

int kvd_g4_absent_recent(const kvd_g4_absent *a, uint64_t fp, int64_t now_ms) {
  if (!a->v) return 0;
  const kvd_g4_absent_slot *s = &a->v[fp & a->mask];
  return s->fp == fp && now_ms < s->until_ms;
}

void kvd_g4_absent_forget(kvd_g4_absent *a, uint64_t fp) {
  if (!a->v) return;
  kvd_g4_absent_slot *s = &a->v[fp & a->mask];
  if (s->fp == fp) s->fp = 0;
}
