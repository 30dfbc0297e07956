/* arena.c - the G2 pinned host-memory arena (see arena.h). */
#include "tiers/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"

#define NOPAGE UINT32_MAX
#define NOCLS  0xff

static atomic_int lock_warned;

static void *zalloc(size_t n, size_t sz) { return calloc(n ? n : 1, sz); }

/* The arena's own memory: a sealed memfd of a->capacity bytes, mapped. */
static int make_memory(kv_arena *a) {
  const kv_arena_opts *o = &a->opts;
  a->fd = memfd_create(o->name ? o->name : "kvcached-g2", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd < 0) return -errno;
  if (ftruncate(a->fd, (off_t)a->capacity) < 0) return -errno;
  /* The size is fixed for the arena's life: a worker holding the fd must not
   * be able to shrink it under the daemon (that would be SIGBUS here). */
  if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) return -errno;
  void *p = mmap(NULL, a->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (p == MAP_FAILED) return -errno;
  a->base = p;
  return 0;
}

int kv_arena_init(kv_arena *a, const kv_arena_opts *o) {
  memset(a, 0, sizeof *a);
  a->fd = -1;
  if (!o) return -EINVAL;
  size_t page = o->page_bytes ? o->page_bytes : KV_ARENA_DEFAULT_PAGE;
  size_t bytes = o->capacity - o->capacity % KV_ARENA_ALIGN; /* what slots can use */
  if (page % KV_ARENA_ALIGN || bytes == 0) return -EINVAL;
  if (page > bytes) page = bytes;
  uint64_t npages = (bytes + page - 1) / page; /* the last one may be short */
  if (npages >= NOPAGE || bytes / KV_ARENA_ALIGN >= UINT32_MAX) return -E2BIG;
  a->opts = *o;
  a->page_bytes = page;
  a->npages = (uint32_t)npages;
  a->capacity = bytes;
  a->configured = o->capacity;
  a->last_page_bytes = bytes - (size_t)(npages - 1) * page;

  int rc;
  if (o->memory) a->base = o->memory;
  else if ((rc = make_memory(a))) goto err;

  size_t units = a->capacity / KV_ARENA_ALIGN;
  a->page_cls = malloc(a->npages);
  a->page_used = zalloc(a->npages, sizeof *a->page_used);
  a->page_gen = zalloc(a->npages, sizeof *a->page_gen);
  a->page_link = malloc(a->npages * sizeof *a->page_link);
  a->page_blink = malloc(a->npages * sizeof *a->page_blink);
  a->inuse = zalloc((units + 63) / 64, sizeof *a->inuse);
  if (!a->page_cls || !a->page_used || !a->page_gen || !a->page_link || !a->page_blink ||
      !a->inuse) {
    rc = -ENOMEM;
    goto err;
  }
  memset(a->page_cls, NOCLS, a->npages);
  for (uint32_t i = 0; i < a->npages; i++) a->page_link[i] = i + 1 < a->npages ? i + 1 : NOPAGE;
  a->free_head = 0;
  a->nfree_pages = a->npages;

  if (o->memory) return 0; /* not ours: nothing to lock or register */
  if (!o->no_lock) {
    if (mlock(a->base, a->capacity) == 0) {
      a->locked = 1;
    } else {
      int e = errno;
      if (atomic_exchange(&lock_warned, 1) == 0)
        kv_warn("g2",
                "cannot lock %zu bytes of G2 memory (%s): running unlocked; "
                "raise RLIMIT_MEMLOCK (LimitMEMLOCK= in systemd) to pin it",
                a->capacity, strerror(e));
    }
  }
  if (o->register_fn) {
    int r = o->register_fn(a->base, a->capacity, o->register_arg);
    if (r == 0) a->registered = 1;
    else kv_warn("g2", "registering G2 arena for DMA failed: %s", kv_strerror(r));
  }
  return 0;
err:
  kv_arena_fini(a);
  return rc;
}

void kv_arena_fini(kv_arena *a) {
  if (a->base && !a->opts.memory) {
    if (a->registered && a->opts.unregister_fn)
      a->opts.unregister_fn(a->base, a->capacity, a->opts.register_arg);
    munmap(a->base, a->capacity);
  }
  if (a->fd >= 0) close(a->fd);
  for (uint32_t c = 0; c < KV_ARENA_MAX_CLASSES; c++) free(a->cls[c].free);
  free(a->page_cls);
  free(a->page_used);
  free(a->page_gen);
  free(a->page_link);
  free(a->page_blink);
  free(a->inuse);
  memset(a, 0, sizeof *a);
  a->fd = -1;
}

int kv_arena_class_for(kv_arena *a, size_t bytes) {
  if (bytes == 0) return -EINVAL;
  size_t sz = (bytes + KV_ARENA_ALIGN - 1) / KV_ARENA_ALIGN * KV_ARENA_ALIGN;
  if (sz > a->page_bytes || sz > UINT32_MAX) return KV_ETOOBIG;
  for (uint32_t c = 0; c < a->nclasses; c++)
    if (a->cls[c].slot_bytes == sz) return (int)c;
  if (a->nclasses == KV_ARENA_MAX_CLASSES) return -ENOSPC;
  kv_arena_class *k = &a->cls[a->nclasses];
  memset(k, 0, sizeof *k);
  k->slot_bytes = (uint32_t)sz;
  k->slots_per_page = (uint32_t)(a->page_bytes / sz);
  k->empty_head = NOPAGE;
  return (int)a->nclasses++;
}

/* --- per-class lists of pages with no slot in use ------------------------ */
static void empty_push(kv_arena *a, kv_arena_class *k, uint32_t pg) {
  a->page_blink[pg] = NOPAGE;
  a->page_link[pg] = k->empty_head;
  if (k->empty_head != NOPAGE) a->page_blink[k->empty_head] = pg;
  k->empty_head = pg;
}
static void empty_unlink(kv_arena *a, kv_arena_class *k, uint32_t pg) {
  uint32_t n = a->page_link[pg], p = a->page_blink[pg];
  if (p != NOPAGE) a->page_link[p] = n;
  else k->empty_head = n;
  if (n != NOPAGE) a->page_blink[n] = p;
}

static inline int bit_get(const uint64_t *m, uint32_t i) { return (m[i >> 6] >> (i & 63)) & 1; }
static inline void bit_set(uint64_t *m, uint32_t i) { m[i >> 6] |= 1ull << (i & 63); }
static inline void bit_clr(uint64_t *m, uint32_t i) { m[i >> 6] &= ~(1ull << (i & 63)); }

static inline uint32_t slot_page(const kv_arena *a, uint32_t slot) {
  return (uint32_t)(kv_arena_offset(slot) / a->page_bytes);
}

/* Slots of class k that page pg holds: fewer (maybe none) in a short last page. */
static inline uint32_t page_slots(const kv_arena *a, const kv_arena_class *k, uint32_t pg) {
  return pg + 1 < a->npages ? k->slots_per_page : (uint32_t)(a->last_page_bytes / k->slot_bytes);
}

/* Drops stack entries whose page has left the class since they were pushed. */
static void compact(kv_arena *a, int cls) {
  kv_arena_class *k = &a->cls[cls];
  uint32_t w = 0;
  for (uint32_t r = 0; r < k->nfree; r++) {
    uint32_t slot = (uint32_t)k->free[r], gen = (uint32_t)(k->free[r] >> 32);
    uint32_t pg = slot_page(a, slot);
    if (a->page_cls[pg] == cls && a->page_gen[pg] == gen) k->free[w++] = k->free[r];
  }
  k->nfree = w;
  k->nstale = 0;
}

/* Gives class `cls` one more page: an unassigned one, else an empty page of
 * another class. 0, -ENOSPC (none to be had) or -ENOMEM. */
static int grow_class(kv_arena *a, int cls) {
  kv_arena_class *k = &a->cls[cls];
  /* Unassigned pages go in order, so the short last page, if it is too
   * small for this class, is the only one left there. */
  uint32_t pg = a->free_head;
  int from = -1;
  if (pg != NOPAGE && !page_slots(a, k, pg)) pg = NOPAGE;
  for (uint32_t c = 0; pg == NOPAGE && c < a->nclasses; c++) {
    if ((int)c == cls) continue;
    /* An empty page of another class; the short one only if a slot fits. */
    for (uint32_t p = a->cls[c].empty_head; p != NOPAGE; p = a->page_link[p]) {
      if (!page_slots(a, k, p)) continue;
      from = (int)c;
      pg = p;
      break;
    }
  }
  if (pg == NOPAGE) return -ENOSPC;
  if (k->nstale > k->pages * k->slots_per_page) compact(a, cls);
  /* Room for every slot of every page held, plus the stale entries: frees
   * then never need to grow the stack. */
  uint32_t need = k->nstale + (k->pages + 1) * k->slots_per_page;
  if (need > k->capfree) {
    uint32_t cap = k->capfree ? k->capfree : 64;
    while (cap < need) cap *= 2;
    uint64_t *f = realloc(k->free, (size_t)cap * sizeof *f);
    if (!f) return -ENOMEM;
    k->free = f;
    k->capfree = cap;
  }
  if (from < 0) {
    a->free_head = a->page_link[pg];
    a->nfree_pages--;
  } else {
    kv_arena_class *o = &a->cls[from];
    empty_unlink(a, o, pg);
    o->pages--;
    o->nstale += page_slots(a, o, pg); /* its free slots now name a foreign page */
  }
  a->page_cls[pg] = (uint8_t)cls;
  uint32_t gen = ++a->page_gen[pg];
  uint32_t first = (uint32_t)(((uint64_t)pg * a->page_bytes) / KV_ARENA_ALIGN);
  uint32_t step = k->slot_bytes / KV_ARENA_ALIGN;
  for (uint32_t i = page_slots(a, k, pg); i-- > 0;)
    k->free[k->nfree++] = ((uint64_t)gen << 32) | (first + i * step);
  k->pages++;
  a->page_used[pg] = 0;
  empty_push(a, k, pg);
  return 0;
}

int kv_arena_alloc(kv_arena *a, int cls, uint32_t *slot) {
  if (cls < 0 || (uint32_t)cls >= a->nclasses) return -EINVAL;
  kv_arena_class *k = &a->cls[cls];
  for (;;) {
    while (k->nfree) {
      uint64_t e = k->free[--k->nfree];
      uint32_t s = (uint32_t)e, pg = slot_page(a, s);
      if (a->page_cls[pg] != cls || a->page_gen[pg] != (uint32_t)(e >> 32)) {
        if (k->nstale) k->nstale--;
        continue;
      }
      if (a->page_used[pg]++ == 0) empty_unlink(a, k, pg);
      bit_set(a->inuse, s);
      k->used++;
      a->used_bytes += k->slot_bytes;
      *slot = s;
      return 0;
    }
    int rc = grow_class(a, cls);
    if (rc) return rc;
  }
}

uint64_t kv_arena_room(const kv_arena *a, int cls) {
  if (cls < 0 || (uint32_t)cls >= a->nclasses) return 0;
  const kv_arena_class *k = &a->cls[cls];
  uint64_t own = k->nfree > k->nstale ? k->nfree - k->nstale : 0;
  if (!a->nfree_pages) return own;
  /* Unassigned pages go in order: the last page is among them. */
  uint32_t last = a->npages - 1;
  return own + (uint64_t)(a->nfree_pages - 1) * k->slots_per_page + page_slots(a, k, last);
}

int kv_arena_slot_class(const kv_arena *a, uint32_t slot) {
  if (kv_arena_offset(slot) >= a->capacity) return -EINVAL;
  uint32_t pg = slot_page(a, slot);
  if (a->page_cls[pg] == NOCLS) return -EINVAL;
  const kv_arena_class *k = &a->cls[a->page_cls[pg]];
  uint64_t in_page = kv_arena_offset(slot) - (uint64_t)pg * a->page_bytes;
  if (in_page % k->slot_bytes || in_page / k->slot_bytes >= page_slots(a, k, pg)) return -EINVAL;
  return a->page_cls[pg];
}

int kv_arena_free(kv_arena *a, uint32_t slot) {
  int cls = kv_arena_slot_class(a, slot);
  if (cls < 0) return cls;
  if (!bit_get(a->inuse, slot)) return -EALREADY;
  kv_arena_class *k = &a->cls[cls];
  uint32_t pg = slot_page(a, slot);
  if (k->nfree == k->capfree) compact(a, cls); /* cannot happen; see grow_class */
  if (k->nfree == k->capfree) return -ENOMEM;
  bit_clr(a->inuse, slot);
  k->free[k->nfree++] = ((uint64_t)a->page_gen[pg] << 32) | slot;
  k->used--;
  a->used_bytes -= k->slot_bytes;
  if (--a->page_used[pg] == 0) empty_push(a, k, pg);
  return 0;
}
