/*
 * presence.h - libkvclient's read-only view of its namespace's presence
 * table (internal; the public face is kvc_lookup, kvc_set_lookup and
 * kvc_lookup_stats in kvclient.h; the table itself: proto/presence.h).
 *
 * kvc__pres_attach maps the table from the PRESENCE reply's fd, read-only
 * (the daemon sealed it: a writable mapping would be refused anyway), and
 * closes the fd. kvc__pres_lookup answers a lookup from it with the
 * meaning a LOOKUP reply has - the length of the leading run of keys a
 * local tier holds, and each key's fastest tier - or says that only the
 * daemon can answer:
 *   -ESTALE  the daemon retired the table (a larger one, or the namespace
 *            went): ask for the new one (PRESENCE) and look again;
 *   -EAGAIN  the table cannot say: a run shorter than the keys where the
 *            daemon would ask G4 for the rest (KV_PRES_G4), or where the
 *            table is partial (KV_PRES_PARTIAL); a writer that kept a
 *            bucket busy past the retries; keys the daemon would refuse
 *            (none, more than KVC_BATCH_MAX, lengths that differ), so that
 *            its error is the caller's.
 * An answer is the table's state at one instant during the call.
 */
#ifndef KV_CLIENT_PRESENCE_H
#define KV_CLIENT_PRESENCE_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvclient.h"
#include "proto/presence.h"

typedef struct kvc__pres {
  void *map; /* NULL: no table mapped */
  size_t bytes;
  kv_pres t;
} kvc__pres;

/* Maps bytes of the table from fd (closed either way). 0, -EPROTO (not a
 * table), or mmap's error; on error p maps nothing. */
int kvc__pres_attach(kvc__pres *p, int fd, uint64_t bytes);
void kvc__pres_release(kvc__pres *p);
int kvc__pres_lookup(const kvc__pres *p, const kvc_key *keys, uint32_t n, uint8_t *tiers);

#endif
