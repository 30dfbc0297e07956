/* presence.c - the client's view of its presence table (presence.h). */
#include "client/presence.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

int kvc__pres_attach(kvc__pres *p, int fd, uint64_t bytes) {
  kvc__pres_release(p);
  void *map = bytes && bytes <= SIZE_MAX ? mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, fd, 0)
                                         : MAP_FAILED;
  int rc = map == MAP_FAILED ? (bytes ? -errno : -EPROTO) : 0;
  close(fd);
  if (rc) return rc;
  if ((rc = kv_pres_attach(&p->t, map, (size_t)bytes))) {
    munmap(map, (size_t)bytes);
    return rc;
  }
  p->map = map;
  p->bytes = (size_t)bytes;
  return 0;
}

void kvc__pres_release(kvc__pres *p) {
  if (p->map) munmap(p->map, p->bytes);
  p->map = NULL;
  p->bytes = 0;
}

int kvc__pres_lookup(const kvc__pres *p, const kvc_key *keys, uint32_t n, uint8_t *tiers) {
  if (!p->map || n == 0 || n > KVC_BATCH_MAX || !keys) return -EAGAIN;
  uint8_t len = keys[0].len;
  if (len == 0 || len > KVC_KEY_MAX) return -EAGAIN;
  uint32_t hit = 0;
  int run = 1;
  for (uint32_t i = 0; i < n; i++) {
    if (keys[i].len != len) return -EAGAIN;
    int code = kv_pres_find(&p->t, kv_pres_hash(keys[i].b, len));
    if (code < 0) return code;
    if (tiers) tiers[i] = code ? (uint8_t)(code - 1) : KVC_TIER_NONE;
    if (run && code) hit++;
    else run = 0;
  }
  /* Read after the entries: a table retired since may have missed changes. */
  if (kv_pres_retired(&p->t)) return -ESTALE;
  if (hit < n && (kv_pres_flags(&p->t) & (KV_PRES_G4 | KV_PRES_PARTIAL))) return -EAGAIN;
  return (int)hit;
}
