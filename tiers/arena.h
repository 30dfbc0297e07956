/*
 * arena.h - the G2 tier's memory: one pinned host-DRAM arena.
 *
 * An arena is a memfd of `capacity` bytes, mmap'd shared and locked in
 * memory (mlock), so it can be handed to workers by fd (SCM_RIGHTS) and to
 * the GPU for DMA (the `register_fn` hook is where cudaHostRegister goes).
 * Where locking is refused (RLIMIT_MEMLOCK), the arena says so once per
 * process and runs unlocked.
 *
 * The arena holds the capacity it was given, to KV_ARENA_ALIGN (a
 * slot's unit): it is cut into pages of `page_bytes`, the last of which is
 * smaller when the capacity is not a whole number of pages (a 97 MiB
 * arena of 64 MiB pages is a page of 64 MiB and one of 33 MiB). A page
 * belongs to at most one size class at a time and is carved into slots of
 * that class's size (a multiple of KV_ARENA_ALIGN, so slots suit O_DIRECT
 * and registered I/O buffers); the short page holds as many as fit, and
 * none of a class larger than it. Alloc and free are O(1): each class keeps
 * a stack of free slots. A page whose slots are all free can move to
 * another class that has run out, so memory follows the block sizes in use.
 *
 * A slot is named by its offset / KV_ARENA_ALIGN (a uint32: arenas up to
 * 16 TiB). Metadata lives outside the shared mapping: a worker that scribbles
 * over the arena cannot corrupt the allocator. Not thread-safe.
 */
#ifndef KV_TIERS_ARENA_H
#define KV_TIERS_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define KV_ARENA_ALIGN        4096u
#define KV_ARENA_MAX_CLASSES  32
#define KV_ARENA_DEFAULT_PAGE (64u << 20)

typedef struct kv_arena_opts {
  size_t capacity;   /* bytes; rounded down to KV_ARENA_ALIGN; >= KV_ARENA_ALIGN */
  size_t page_bytes; /* 0: KV_ARENA_DEFAULT_PAGE, clamped to capacity */
  const char *name;  /* memfd name, for /proc/<pid>/fd; NULL: "kvcached-g2" */
  int no_lock;       /* 1: do not mlock (tests, tiny arenas) */
  /* Non-NULL: manage slots of this memory instead of making some (G1's
   * device pool, whose addresses this process must not touch): no memfd
   * (fd -1), no mapping, no lock, no register_fn. `memory` is base. */
  void *memory;
  /* Called once after mapping, e.g. to cudaHostRegister the range.
   * A failure is logged and the arena goes on unregistered. */
  int (*register_fn)(void *base, size_t len, void *arg);
  void (*unregister_fn)(void *base, size_t len, void *arg);
  void *register_arg;
} kv_arena_opts;

typedef struct kv_arena_class {
  uint32_t slot_bytes; /* 0: class unused */
  uint32_t slots_per_page;
  uint64_t *free; /* stack of (page generation << 32 | slot) */
  uint32_t nfree, capfree;
  uint32_t nstale;     /* entries of pages that left the class */
  uint32_t pages;      /* pages held */
  uint32_t used;       /* slots allocated */
  uint32_t empty_head; /* a page of this class with no slot in use */
  void *user;          /* owner's per-class data (eviction policy) */
} kv_arena_class;

typedef struct kv_arena {
  int fd;
  uint8_t *base;
  size_t capacity;   /* bytes it holds (and of its memfd): opts.capacity to KV_ARENA_ALIGN */
  size_t configured; /* opts.capacity, as asked for */
  size_t page_bytes;
  size_t last_page_bytes; /* the last page's size: page_bytes, or less */
  uint32_t npages;
  int locked;     /* 1 if mlock succeeded */
  int registered; /* 1 if register_fn succeeded */
  kv_arena_opts opts;
  kv_arena_class cls[KV_ARENA_MAX_CLASSES];
  uint32_t nclasses;
  uint8_t *page_cls;   /* class per page, 0xff when unassigned */
  uint32_t *page_used; /* slots in use per page */
  uint32_t *page_gen;  /* bumped when a page changes class */
  uint32_t *page_link; /* free-page list and per-class empty-page lists */
  uint32_t *page_blink;
  uint32_t free_head; /* unassigned pages */
  uint32_t nfree_pages;
  uint64_t *inuse;     /* bitmap, one bit per KV_ARENA_ALIGN unit */
  uint64_t used_bytes; /* sum of allocated slot sizes */
} kv_arena;

/* Creates the memfd, maps and locks it. 0, -EINVAL (capacity under
 * KV_ARENA_ALIGN, page size not a multiple of it), -E2BIG (more than
 * 16 TiB), or -errno from memfd/mmap/ftruncate. */
int kv_arena_init(kv_arena *a, const kv_arena_opts *o);
void kv_arena_fini(kv_arena *a);

/* The class for blocks of `bytes` (created on first use). Returns the class
 * index, -EINVAL for 0 bytes, KV_ETOOBIG above page_bytes, -ENOSPC when all
 * KV_ARENA_MAX_CLASSES are taken. */
int kv_arena_class_for(kv_arena *a, size_t bytes);

/* Allocates a slot of class `cls`. 0 with *slot set, or -ENOSPC when the
 * class has no free slot and no page can be had; nothing is changed then. */
int kv_arena_alloc(kv_arena *a, int cls, uint32_t *slot);

/* Frees a slot. -EINVAL for a slot that is not the start of a slot of an
 * assigned page, -EALREADY for a slot that is not allocated (double free);
 * nothing is changed on error. */
int kv_arena_free(kv_arena *a, uint32_t slot);

/* Slots of class `cls` that kv_arena_alloc could hand out now without a
 * free: the class's free slots plus those of the unassigned pages. */
uint64_t kv_arena_room(const kv_arena *a, int cls);

/* The class a slot belongs to, or -EINVAL. */
int kv_arena_slot_class(const kv_arena *a, uint32_t slot);

static inline void *kv_arena_ptr(const kv_arena *a, uint32_t slot) {
  return a->base + (size_t)slot * KV_ARENA_ALIGN;
}
static inline uint64_t kv_arena_offset(uint32_t slot) { return (uint64_t)slot * KV_ARENA_ALIGN; }

#endif
