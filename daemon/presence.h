/*
 * presence.h - the daemon's presence tables (proto/presence.h): per
 * namespace a table of what its local tiers hold, in a sealed memfd that
 * the namespace's workers map read-only (PRESENCE, protocol 1.5).
 *
 * A namespace's table is made at its first PRESENCE (from the index: one
 * pass over every record, on the loop), then follows the core through its
 * visibility observer (kv_core_on_visible): a block committed, promoted,
 * demoted, evicted or deleted is written to the table before the loop
 * answers anything else. The daemon is the only writer and never waits for
 * a reader (seqlocks, proto/presence.h).
 *
 * Read-only for workers: the memfd is sealed F_SEAL_FUTURE_WRITE (with
 * SHRINK, GROW and SEAL) once the daemon has its own writable mapping, so a
 * worker's mmap with PROT_WRITE and MAP_SHARED, write(2), ftruncate(2) and
 * an mprotect to writable are refused by the kernel. A worker is given the
 * table of its session's namespace only (what its HELLO opened), so it
 * learns nothing it could not learn by LOOKUP.
 *
 * Sizes: a table starts at about twice the namespace's records (64-byte
 * buckets of 7 entries: 18 bytes per block at half full) and doubles when a
 * key finds no room past half full; the old table is retired (its readers
 * ask again) and closed. A table that cannot place a key while at most half
 * full (keys chosen to collide) is marked KV_PRES_PARTIAL instead: its
 * readers then ask the daemon for what it lacks. A namespace whose last
 * session closes (or that is freed, or joins a TP group) retires its
 * table: there are at most as many tables as namespaces with a session,
 * and their descriptors are among those the connections' budget counts
 * (server.c, worker_budget).
 */
#ifndef KV_DAEMON_PRESENCE_H
#define KV_DAEMON_PRESENCE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/presence.h"
#include "tiers/core.h"

typedef struct kvd_pres_tab {
  int fd; /* the sealed memfd the workers get */
  void *map;
  size_t bytes;
  kv_pres t;
} kvd_pres_tab;

typedef struct kvd_presence {
  kv_core *core;
  kvd_pres_tab **tab; /* by core namespace id; NULL: not published */
  uint32_t ntab;
  uint32_t published;       /* tables in use */
  uint64_t bytes;           /* their bytes */
  uint64_t maps;            /* PRESENCE requests given a table */
  uint64_t grown;           /* tables replaced by a larger one */
  uint64_t partial;         /* tables marked KV_PRES_PARTIAL */
  uint64_t failed;          /* tables that could not be made or grown (memory) */
  uint64_t contradicted;    /* keys a KV_LOAD_LOCAL load found missing */
  uint64_t updates_retired; /* entries written to tables since retired */
} kvd_presence;

/* An empty set of tables following core. */
void kvd_presence_init(kvd_presence *p, kv_core *core);
/* Retires and frees every table. */
void kvd_presence_fini(kvd_presence *p);

/* The table of core namespace ns, made now if it has none (flags: its
 * KV_PRES_G4). 0 with *fd (the daemon's: the caller sends a copy), *bytes
 * and *flags set; -ENOMEM or the memfd's error. */
int kvd_presence_map(kvd_presence *p, uint32_t ns, uint32_t flags, int *fd, uint64_t *bytes,
                     uint32_t *out_flags);

/* The core's visibility observer (kv_visible_fn); arg is the kvd_presence. */
void kvd_presence_visible(void *arg, const kv_block *b);

/* Core namespace ns is gone (its id may be reused): its table is retired. */
void kvd_presence_drop(kvd_presence *p, uint32_t ns);

/* Entries written to every table since the start. */
uint64_t kvd_presence_updates(const kvd_presence *p);

#endif
