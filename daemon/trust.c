/* trust.c - readers' corrupt-block reports and the drops they lead to (see trust.h). */
#include "daemon/trust.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/hex.h"
#include "base/log.h"
#include "daemon/kvd.h"

#define BAD_COPIES ((uint8_t)(KV_TIER_BIT(KV_G1) | KV_TIER_BIT(KV_G2)))

/* b's G2 copy against its committed CRC: 1 fails, 0 holds, -1 no copy to check. */
static int g2_fails(kvd *d, const kv_block *b, uint32_t *now) {
  if (b->state != KV_BS_READY || !(b->tiers & KV_TIER_BIT(KV_G2))) return -1;
  const void *p = kv_core_g2_ptr(d->core, b);
  if (!p) return -1;
  *now = kv_crc32c(0, p, b->size);
  return *now != b->crc;
}

/* Drops b's G2 and G1 copies if nothing holds them. 1 dropped, 0 not yet. */
static int drop(kvd *d, kv_block *b) {
  if (kv_core_drop(d->core, b, BAD_COPIES) != 0) return 0;
  d->trust.dropped++;
  return 1;
}

static int listed(const kvd_trust *t, uint32_t core_ns, const kv_block *b) {
  unsigned len = kv_block_keylen(b);
  for (uint32_t i = 0; i < t->npend; i++) {
    const kvd_suspect *s = &t->pend[i];
    if (s->core_ns == core_ns && s->crc == b->crc && s->key.len == len &&
        !memcmp(s->key.b, b->key, len))
      return 1;
  }
  return 0;
}

static int list_add(kvd_trust *t, const kv_block *b) {
  if (listed(t, b->ns, b)) return 0;
  if (t->npend == t->cap) {
    uint32_t cap = t->cap ? t->cap * 2 : 16;
    if (cap > KVD_TRUST_PENDING_MAX) return -ENOSPC;
    kvd_suspect *p = realloc(t->pend, cap * sizeof *p);
    if (!p) return -ENOMEM;
    t->pend = p;
    t->cap = cap;
  }
  kvd_suspect *s = &t->pend[t->npend++];
  s->core_ns = b->ns;
  s->crc = b->crc;
  kv_key_set(&s->key, b->key, kv_block_keylen(b));
  return 0;
}

int kvd_trust_report(kvd *d, uint64_t sid, kv_block *b) {
  if (kvd_trust_refused(d, b)) return 1; /* confirmed already, waiting for its pins */
  char k[2 * KV_KEY_MAX + 1];
  kv_hex_encode(b->key, kv_block_keylen(b), k);
  uint32_t now = 0;
  int fails = g2_fails(d, b, &now);
  if (fails <= 0) {
    d->trust.rejected++;
    kv_warn("trust", "session %llu reported block %s (namespace %u) corrupt, but %s: kept",
            (unsigned long long)sid, k, (unsigned)b->ns,
            fails == 0 ? "its G2 bytes match their CRC" : "it has no G2 copy the daemon can check");
    return 0;
  }
  d->trust.confirmed++;
  kvd_miss_add(d, KVD_MISS_CORRUPT, 1);
  unsigned ns = b->ns;
  uint32_t crc = b->crc;
  if (drop(d, b)) { /* b may be gone with its last copy */
    kv_warn("trust",
            "block %s (namespace %u), reported by session %llu: its G2 bytes fail their "
            "CRC (committed %08x, now %08x): G2/G1 copies dropped",
            k, ns, (unsigned long long)sid, crc, now);
    return 1;
  }
  int rc = list_add(&d->trust, b);
  if (rc)
    kv_error("trust",
             "block %s (namespace %u) fails its CRC and is still pinned, but cannot wait "
             "for its drop (%s, %u waiting): it stays until a reader reports it again",
             k, (unsigned)b->ns, kv_strerror(rc), d->trust.npend);
  else
    kv_warn("trust",
            "block %s (namespace %u), reported by session %llu: its G2 bytes fail their "
            "CRC (committed %08x, now %08x): refused to LOADs, dropped when its %u pin(s) go",
            k, (unsigned)b->ns, (unsigned long long)sid, b->crc, now, (unsigned)b->pins);
  return 1;
}

int kvd_trust_refused(kvd *d, const kv_block *b) {
  return d->trust.npend && listed(&d->trust, b->ns, b);
}

void kvd_trust_sweep(kvd *d) {
  kvd_trust *t = &d->trust;
  for (uint32_t i = 0; i < t->npend;) {
    kvd_suspect *s = &t->pend[i];
    kv_block *b = kv_index_find(kv_core_index(d->core), s->core_ns, s->key.b, s->key.len);
    int gone = !b || b->state != KV_BS_READY || b->crc != s->crc || !(b->tiers & BAD_COPIES);
    if (gone || drop(d, b)) {
      if (!gone) {
        char k[2 * KV_KEY_MAX + 1];
        kv_hex_encode(s->key.b, s->key.len, k);
        kv_info("trust", "block %s (namespace %u): its last pin went, G2/G1 copies dropped", k,
                (unsigned)s->core_ns);
      }
      *s = t->pend[--t->npend];
      continue;
    }
    i++;
  }
}

void kvd_trust_fini(kvd_trust *t) {
  free(t->pend);
  memset(t, 0, sizeof *t);
}
