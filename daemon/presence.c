/* presence.c - the daemon's presence tables (presence.h has the contract). */
#include "daemon/presence.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "tiers/index.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

void kvd_presence_init(kvd_presence *p, kv_core *core) {
  *p = (kvd_presence){.core = core};
}

static void tab_free(kvd_presence *p, kvd_pres_tab *t) {
  kv_pres_retire(&t->t);
  p->updates_retired += t->t.h->updates;
  p->bytes -= t->bytes;
  munmap(t->map, t->bytes);
  close(t->fd);
  free(t);
}

void kvd_presence_fini(kvd_presence *p) {
  for (uint32_t i = 0; i < p->ntab; i++)
    if (p->tab[i]) tab_free(p, p->tab[i]);
  free(p->tab);
  p->tab = NULL;
  p->ntab = p->published = 0;
}

/* A new empty table of 2^log2 buckets: a memfd the daemon maps writable,
 * then seals against every other writer. */
static int tab_new(kvd_presence *p, unsigned log2, uint32_t flags, kvd_pres_tab **out) {
  kvd_pres_tab *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  t->bytes = kv_pres_bytes(log2);
  t->fd = memfd_create("kvcached-presence", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int rc = t->fd < 0 ? -errno : 0;
  if (!rc && ftruncate(t->fd, (off_t)t->bytes) < 0) rc = -errno;
  if (!rc) {
    t->map = mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
    if (t->map == MAP_FAILED) {
      t->map = NULL;
      rc = -errno;
    }
  }
  /* After the daemon's own mapping: F_SEAL_FUTURE_WRITE refuses every
   * later writable mapping and write(2), whoever holds the fd. */
  if (!rc && fcntl(t->fd, F_ADD_SEALS,
                   F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
    rc = -errno;
  if (rc) {
    if (t->map) munmap(t->map, t->bytes);
    if (t->fd >= 0) close(t->fd);
    free(t);
    p->failed++;
    return rc;
  }
  kv_pres_format(&t->t, t->map, log2, flags);
  p->bytes += t->bytes;
  *out = t;
  return 0;
}

/* What lookups see of b: its code (1..3), or 0 when it is not found. */
static int code_of(const kv_block *b) {
  return b->state == KV_BS_READY && b->tiers ? __builtin_ctz(b->tiers) + 1 : 0;
}

/* Replaces ns's table by one twice as large, with the same entries. */
static int grow(kvd_presence *p, uint32_t ns) {
  kvd_pres_tab *old = p->tab[ns], *t;
  unsigned log2 = old->t.h->log2 + 1;
  if (log2 > KV_PRES_LOG2_MAX) return -ENOSPC;
  int rc = tab_new(p, log2, kv_pres_flags(&old->t), &t);
  if (rc) return rc;
  if (kv_pres_copy(&t->t, &old->t)) { /* cannot happen at half the load; be safe */
    tab_free(p, t);
    return -ENOSPC;
  }
  p->tab[ns] = t;
  tab_free(p, old); /* retired: its readers ask for the new one */
  p->grown++;
  return 0;
}

/* fp with code in ns's table, which grows (doubles) while a key finds no
 * room past half full. */
static int set_or_grow(kvd_presence *p, uint32_t ns, uint64_t fp, int code) {
  kvd_pres_tab *t;
  uint64_t cap;
  for (;;) {
    t = p->tab[ns];
    if (kv_pres_set(&t->t, fp, code) == 0) return 0;
    cap = (uint64_t)KV_PRES_WAYS << t->t.h->log2;
    if (2 * kv_pres_count(&t->t) < cap || grow(p, ns) != 0) break;
  }
  /* Room ran out at under half full (keys made to collide), or no memory
   * for a larger table: readers ask the daemon for what it lacks. */
  if (!(kv_pres_flags(&t->t) & KV_PRES_PARTIAL)) {
    kv_pres_flag(&t->t, KV_PRES_PARTIAL);
    p->partial++;
    kv_warn("presence", "namespace %u's presence table could not take a key (%llu of %llu "
            "entries used): its workers ask the daemon for what it lacks", ns,
            (unsigned long long)kv_pres_count(&t->t), (unsigned long long)cap);
  }
  return -ENOSPC;
}

static void apply(kvd_presence *p, uint32_t ns, const kv_block *b) {
  uint64_t fp = kv_pres_hash(b->key, kv_block_keylen(b));
  int code = code_of(b);
  if (code) (void)set_or_grow(p, ns, fp, code);
  else (void)kv_pres_del(&p->tab[ns]->t, fp);
}

void kvd_presence_visible(void *arg, const kv_block *b) {
  kvd_presence *p = arg;
  if (b->ns < p->ntab && p->tab[b->ns]) apply(p, b->ns, b);
}

typedef struct fill_ctx {
  kvd_presence *p;
  uint32_t ns;
} fill_ctx;

static int fill_one(kv_block *b, void *arg) {
  fill_ctx *f = arg;
  if (b->ns == f->ns && code_of(b)) apply(f->p, f->ns, b);
  return 0;
}

int kvd_presence_map(kvd_presence *p, uint32_t ns, uint32_t flags, int *fd, uint64_t *bytes,
                     uint32_t *out_flags) {
  if (ns >= p->ntab) {
    uint32_t n = ns + 1 > 2 * p->ntab ? ns + 1 : 2 * p->ntab;
    kvd_pres_tab **tab = realloc(p->tab, n * sizeof *tab);
    if (!tab) return -ENOMEM;
    for (uint32_t i = p->ntab; i < n; i++) tab[i] = NULL;
    p->tab = tab;
    p->ntab = n;
  }
  if (!p->tab[ns]) {
    /* about twice the namespace's records, so that it starts under half full */
    uint64_t want = 2ull * kv_core_ns_blocks(p->core, ns);
    unsigned log2 = KV_PRES_LOG2_MIN;
    while (log2 < KV_PRES_LOG2_MAX && ((uint64_t)KV_PRES_WAYS << log2) < want) log2++;
    kvd_pres_tab *t;
    int rc = tab_new(p, log2, flags, &t);
    if (rc) return rc;
    p->tab[ns] = t;
    p->published++;
    fill_ctx f = {p, ns};
    kv_index_foreach(kv_core_index(p->core), fill_one, &f);
  }
  kvd_pres_tab *t = p->tab[ns];
  *fd = t->fd;
  *bytes = t->bytes;
  *out_flags = kv_pres_flags(&t->t);
  p->maps++;
  return 0;
}

void kvd_presence_drop(kvd_presence *p, uint32_t ns) {
  if (ns >= p->ntab || !p->tab[ns]) return;
  tab_free(p, p->tab[ns]);
  p->tab[ns] = NULL;
  p->published--;
}

uint64_t kvd_presence_updates(const kvd_presence *p) {
  uint64_t n = p->updates_retired;
  for (uint32_t i = 0; i < p->ntab; i++)
    if (p->tab[i]) n += __atomic_load_n(&p->tab[i]->t.h->updates, __ATOMIC_RELAXED);
  return n;
}
