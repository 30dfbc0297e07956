/* test_arena.c - the G2 arena: bad sizes, exhaustion, double free, pages
 * moving between size classes, the sealed shared memfd, and running
 * unlocked when mlock is refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/errors.h"
#include "tiers/arena.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

static kv_arena mk(size_t cap, size_t page) {
  kv_arena a;
  kv_arena_opts o = {.capacity = cap, .page_bytes = page, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  return a;
}

Test(arena, rejects_bad_geometry) {
  kv_arena a;
  kv_arena_opts o = {.capacity = 0, .no_lock = 1};
  cr_assert_eq(kv_arena_init(&a, &o), -EINVAL, "zero capacity");
  o.capacity = MIB;
  o.page_bytes = 5000;
  cr_assert_eq(kv_arena_init(&a, &o), -EINVAL, "page not a multiple of 4K");
  o.capacity = 100;
  o.page_bytes = 0;
  cr_assert_eq(kv_arena_init(&a, &o), -EINVAL, "smaller than one page");
  cr_assert_eq(kv_arena_init(&a, NULL), -EINVAL);
}

Test(arena, rejects_zero_and_oversized_blocks) {
  kv_arena a = mk(4 * MIB, MIB);
  cr_assert_eq(kv_arena_class_for(&a, 0), -EINVAL);
  cr_assert_eq(kv_arena_class_for(&a, MIB + 1), KV_ETOOBIG);
  cr_assert_geq(kv_arena_class_for(&a, MIB), 0);
  /* Sizes round up to 4 KiB: 1 byte and 4096 bytes share a class. */
  cr_assert_eq(kv_arena_class_for(&a, 1), kv_arena_class_for(&a, 4096));
  kv_arena_fini(&a);
}

Test(arena, fills_exactly_then_reports_enospc) {
  kv_arena a = mk(4 * MIB, MIB);
  int c = kv_arena_class_for(&a, 256 * KIB);
  uint32_t slots[32];
  int n = 0;
  while (n < 32 && kv_arena_alloc(&a, c, &slots[n]) == 0) n++;
  cr_assert_eq(n, 16);
  uint32_t extra;
  cr_assert_eq(kv_arena_alloc(&a, c, &extra), -ENOSPC);
  cr_assert_eq(a.used_bytes, 4 * MIB);
  /* Slots are distinct, aligned and inside the arena. */
  for (int i = 0; i < n; i++) {
    cr_assert_lt(kv_arena_offset(slots[i]) + 256 * KIB, a.capacity + 1);
    cr_assert_eq(kv_arena_offset(slots[i]) % (256 * KIB), 0);
    for (int j = 0; j < i; j++) cr_assert_neq(slots[i], slots[j]);
  }
  cr_assert_eq(kv_arena_free(&a, slots[3]), 0);
  cr_assert_eq(kv_arena_alloc(&a, c, &extra), 0);
  cr_assert_eq(extra, slots[3]);
  kv_arena_fini(&a);
}

/* Issue 19 item 5: a capacity that is not a whole number of pages was cut
 * down to whole pages (97 MiB of 64 MiB pages held 64 MiB). The arena
 * holds what it was given: here 5 MiB + 8 KiB in 2 MiB pages is two pages
 * and a short one of 1 MiB + 8 KiB, every byte of it in slots. */
Test(arena, holds_the_capacity_it_was_given_in_a_short_last_page) {
  const size_t cap = 5 * MIB + 8 * KIB;
  kv_arena a = mk(cap, 2 * MIB);
  cr_assert_eq(a.capacity, cap, "held %zu of %zu", a.capacity, cap);
  cr_assert_eq(a.configured, cap);
  cr_assert_eq(a.npages, 3);
  struct stat st;
  cr_assert_eq(fstat(a.fd, &st), 0);
  cr_assert_eq((size_t)st.st_size, cap, "the memfd workers map is that size");
  /* 4 KiB blocks: every unit of the arena, none outside it. */
  int small = kv_arena_class_for(&a, 4 * KIB);
  cr_assert_eq(kv_arena_room(&a, small), cap / (4 * KIB));
  uint32_t s, n = 0, max = 0;
  while (kv_arena_alloc(&a, small, &s) == 0) {
    n++;
    if (s > max) max = s;
  }
  cr_assert_eq(n, cap / (4 * KIB));
  cr_assert_eq(kv_arena_offset(max) + 4 * KIB, cap);
  cr_assert_eq(a.used_bytes, cap);
  cr_assert_eq(kv_arena_free(&a, max), 0, "a slot of the short page frees");
  kv_arena_fini(&a);

  /* 512 KiB blocks: 4 + 4 in the whole pages, 2 in the short one (its
   * last 8 KiB hold none); slot numbers past those are refused. */
  a = mk(cap, 2 * MIB);
  int mid = kv_arena_class_for(&a, 512 * KIB);
  cr_assert_eq(kv_arena_room(&a, mid), 10);
  uint32_t slots[16];
  n = 0;
  while (n < 16 && kv_arena_alloc(&a, mid, &slots[n]) == 0) n++;
  cr_assert_eq(n, 10);
  cr_assert_eq(kv_arena_room(&a, mid), 0);
  uint32_t past = (uint32_t)((4 * MIB + 1 * MIB) / KV_ARENA_ALIGN); /* the short page's third */
  cr_assert_eq(kv_arena_slot_class(&a, past), -EINVAL);
  cr_assert_eq(kv_arena_free(&a, past), -EINVAL);
  kv_arena_fini(&a);
}

/* A class whose blocks do not fit the short page never gets it, from the
 * unassigned pages or from another class that emptied it. */
Test(arena, a_class_larger_than_the_short_page_leaves_it_to_others) {
  kv_arena a = mk(2 * MIB + 512 * KIB, 2 * MIB); /* a page and a short one of 512 KiB */
  int big = kv_arena_class_for(&a, 2 * MIB), small = kv_arena_class_for(&a, 256 * KIB);
  cr_assert_eq(kv_arena_room(&a, big), 1);
  uint32_t b, x, s[2];
  cr_assert_eq(kv_arena_alloc(&a, big, &b), 0);
  cr_assert_eq(kv_arena_alloc(&a, big, &x), -ENOSPC, "the short page holds no 2 MiB block");
  cr_assert_eq(kv_arena_alloc(&a, small, &s[0]), 0, "it is left for a class that fits");
  cr_assert_eq(kv_arena_alloc(&a, small, &s[1]), 0);
  cr_assert_eq(kv_arena_alloc(&a, small, &x), -ENOSPC);
  /* Emptied, the short page is still no 2 MiB slot; the big page, freed,
   * goes to the small class. */
  cr_assert_eq(kv_arena_free(&a, s[0]), 0);
  cr_assert_eq(kv_arena_free(&a, s[1]), 0);
  cr_assert_eq(kv_arena_free(&a, b), 0);
  cr_assert_eq(kv_arena_alloc(&a, big, &b), 0);
  cr_assert_eq(kv_arena_alloc(&a, big, &x), -ENOSPC);
  cr_assert_eq(kv_arena_free(&a, b), 0);
  uint32_t got[16], n = 0;
  while (n < 16 && kv_arena_alloc(&a, small, &got[n]) == 0) n++;
  cr_assert_eq(n, 10, "8 in the whole page and 2 in the short one");
  cr_assert_eq(a.used_bytes, a.capacity);
  kv_arena_fini(&a);
}

/* Slots are made of KV_ARENA_ALIGN units: a capacity that is not a multiple
 * of it holds what fits, and says what was asked for. */
Test(arena, a_capacity_off_the_slot_unit_holds_what_fits) {
  kv_arena a = mk(3 * MIB + 100, MIB);
  cr_assert_eq(a.configured, 3 * MIB + 100);
  cr_assert_eq(a.capacity, 3 * MIB);
  cr_assert_eq(a.npages, 3);
  kv_arena_fini(&a);
}

Test(arena, double_free_and_bad_slots_change_nothing) {
  kv_arena a = mk(2 * MIB, MIB);
  int c = kv_arena_class_for(&a, 64 * KIB);
  uint32_t s;
  cr_assert_eq(kv_arena_alloc(&a, c, &s), 0);
  uint64_t used = a.used_bytes;
  cr_assert_eq(kv_arena_free(&a, s + 1), -EINVAL, "inside a slot");
  cr_assert_eq(kv_arena_free(&a, (uint32_t)(a.capacity / KV_ARENA_ALIGN)), -EINVAL, "past the end");
  cr_assert_eq(kv_arena_free(&a, (uint32_t)(MIB / KV_ARENA_ALIGN)), -EINVAL, "unassigned page");
  cr_assert_eq(a.used_bytes, used);
  cr_assert_eq(kv_arena_free(&a, s), 0);
  cr_assert_eq(kv_arena_free(&a, s), -EALREADY);
  cr_assert_eq(a.used_bytes, 0);
  /* After the refused double free the slot is handed out once, not twice. */
  uint32_t x, y;
  cr_assert_eq(kv_arena_alloc(&a, c, &x), 0);
  cr_assert_eq(kv_arena_alloc(&a, c, &y), 0);
  cr_assert_neq(x, y);
  kv_arena_fini(&a);
}

/* A page freed by one class moves to another that has run out; the first
 * class must then never hand out a slot of that page again. */
Test(arena, empty_pages_move_between_classes_without_double_allocation) {
  kv_arena a = mk(4 * MIB, MIB);
  int small = kv_arena_class_for(&a, 128 * KIB), big = kv_arena_class_for(&a, MIB);
  uint32_t s[32];
  int n = 0;
  while (kv_arena_alloc(&a, small, &s[n]) == 0) n++;
  cr_assert_eq(n, 32);
  uint32_t b[4];
  cr_assert_eq(kv_arena_alloc(&a, big, &b[0]), -ENOSPC);
  for (int i = 0; i < 8; i++) kv_arena_free(&a, s[i]); /* empties page 0 (or some page) */
  cr_assert_eq(kv_arena_alloc(&a, big, &b[0]), 0);
  cr_assert_eq(kv_arena_alloc(&a, big, &b[1]), -ENOSPC);
  /* The small class still has no free slot: its stale entries are skipped. */
  uint32_t t;
  cr_assert_eq(kv_arena_alloc(&a, small, &t), -ENOSPC);
  /* Give the page back and forth a few times. */
  for (int round = 0; round < 5; round++) {
    cr_assert_eq(kv_arena_free(&a, b[0]), 0);
    uint32_t got[8];
    for (int i = 0; i < 8; i++) cr_assert_eq(kv_arena_alloc(&a, small, &got[i]), 0);
    cr_assert_eq(kv_arena_alloc(&a, small, &t), -ENOSPC);
    for (int i = 0; i < 8; i++) {
      for (int j = 8; j < 32; j++) cr_assert_neq(got[i], s[j], "slot handed out twice");
      kv_arena_free(&a, got[i]);
    }
    cr_assert_eq(kv_arena_alloc(&a, big, &b[0]), 0);
  }
  cr_assert_eq(a.used_bytes, 24 * 128 * KIB + MIB);
  kv_arena_fini(&a);
}

Test(arena, random_alloc_free_against_a_model) {
  kv_arena a = mk(16 * MIB, MIB);
  int cls[3] = {kv_arena_class_for(&a, 4 * KIB), kv_arena_class_for(&a, 100 * KIB),
                kv_arena_class_for(&a, 512 * KIB)};
  size_t sz[3] = {4 * KIB, 100 * KIB + 2048 /* rounds to 104K */, 512 * KIB};
  (void)sz;
  uint8_t *owner = calloc(a.capacity / KV_ARENA_ALIGN, 1);
  uint32_t held[4096];
  int heldc[4096], nheld = 0;
  srand(7);
  for (int step = 0; step < 100000; step++) {
    if (nheld && (rand() % 3 == 0 || nheld == 4096)) {
      int i = rand() % nheld;
      uint32_t s = held[i];
      uint32_t units = a.cls[heldc[i]].slot_bytes / KV_ARENA_ALIGN;
      for (uint32_t u = 0; u < units; u++) owner[s + u] = 0;
      cr_assert_eq(kv_arena_free(&a, s), 0);
      held[i] = held[--nheld];
      heldc[i] = heldc[nheld];
    } else {
      int c = cls[rand() % 3];
      uint32_t s;
      int rc = kv_arena_alloc(&a, c, &s);
      if (rc == -ENOSPC) continue;
      cr_assert_eq(rc, 0);
      uint32_t units = a.cls[c].slot_bytes / KV_ARENA_ALIGN;
      for (uint32_t u = 0; u < units; u++) {
        cr_assert_eq(owner[s + u], 0, "step %d: overlapping slots", step);
        owner[s + u] = 1;
      }
      held[nheld] = s;
      heldc[nheld++] = c;
    }
  }
  free(owner);
  kv_arena_fini(&a);
}

Test(arena, memory_is_a_sealed_shared_memfd) {
  kv_arena a = mk(2 * MIB, MIB);
  int c = kv_arena_class_for(&a, 4096);
  uint32_t s;
  kv_arena_alloc(&a, c, &s);
  memcpy(kv_arena_ptr(&a, s), "hello", 6);
  /* Another mapping of the fd (as a worker would make) sees the bytes. */
  char *m = mmap(NULL, a.capacity, PROT_READ, MAP_SHARED, a.fd, 0);
  cr_assert_neq(m, MAP_FAILED);
  cr_assert_str_eq(m + kv_arena_offset(s), "hello");
  munmap(m, a.capacity);
  /* Nobody holding the fd can shrink it under the daemon. */
  cr_assert_eq(ftruncate(a.fd, 4096), -1);
  cr_assert_eq(errno, EPERM);
  cr_assert_eq(fcntl(a.fd, F_GET_SEALS) & F_SEAL_SHRINK, F_SEAL_SHRINK);
  kv_arena_fini(&a);
}

static int reg_calls;
static int reg_ok(void *base, size_t len, void *arg) {
  reg_calls++;
  *(size_t *)arg = len;
  return base ? 0 : -EINVAL;
}
static int reg_fail(void *base, size_t len, void *arg) { return -ENODEV; }

Test(arena, register_hook_is_called_and_its_failure_tolerated) {
  size_t seen = 0;
  kv_arena a;
  kv_arena_opts o = {.capacity = MIB, .no_lock = 1, .register_fn = reg_ok, .register_arg = &seen};
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  cr_assert_eq(reg_calls, 1);
  cr_assert_eq(seen, MIB);
  cr_assert_eq(a.registered, 1);
  kv_arena_fini(&a);
  o.register_fn = reg_fail;
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  cr_assert_eq(a.registered, 0);
  kv_arena_fini(&a);
}

/* Drop CAP_IPC_LOCK (root ignores RLIMIT_MEMLOCK otherwise) and lower the
 * limit: the arena must come up unlocked and usable. */
Test(arena, runs_unlocked_when_mlock_is_refused) {
#if defined(__SANITIZE_ADDRESS__)
  cr_skip_test("AddressSanitizer replaces mlock with a no-op that succeeds");
#endif
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  cr_assert_eq(syscall(SYS_capget, &h, d), 0);
  d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  cr_assert_eq(syscall(SYS_capset, &h, d), 0);
  struct rlimit rl = {64 * 1024, 64 * 1024};
  cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
  kv_arena a;
  kv_arena_opts o = {.capacity = 8 * MIB, .page_bytes = MIB};
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  cr_assert_eq(a.locked, 0);
  int c = kv_arena_class_for(&a, MIB);
  uint32_t s;
  cr_assert_eq(kv_arena_alloc(&a, c, &s), 0);
  memset(kv_arena_ptr(&a, s), 0xab, MIB);
  kv_arena_fini(&a);
}

Test(arena, locks_when_allowed) {
#if defined(__SANITIZE_ADDRESS__)
  cr_skip_test("AddressSanitizer replaces mlock with a no-op");
#endif
  struct rlimit rl;
  getrlimit(RLIMIT_MEMLOCK, &rl);
  if (geteuid() != 0 && rl.rlim_cur < 4 * MIB)
    cr_skip_test("not root and RLIMIT_MEMLOCK is %llu bytes: locking cannot succeed here",
                 (unsigned long long)rl.rlim_cur);
  kv_arena a;
  kv_arena_opts o = {.capacity = 2 * MIB, .page_bytes = MIB};
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  cr_assert_eq(a.locked, 1);
  kv_arena_fini(&a);
}

Test(arena, manages_memory_it_does_not_own_without_touching_it) {
  /* G1's device pool: the arena hands out slots of memory this process
   * cannot read or write. PROT_NONE makes any touch a crash. */
  size_t cap = 8u << 20;
  void *mem = mmap(NULL, cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(mem, MAP_FAILED);
  reg_calls = 0;
  kv_arena a;
  kv_arena_opts o = {.capacity = cap, .page_bytes = 1u << 20, .memory = mem, .register_fn = reg_ok};
  cr_assert_eq(kv_arena_init(&a, &o), 0);
  cr_assert_eq(a.fd, -1, "no memfd of its own");
  cr_assert_eq(a.base, mem);
  cr_assert_eq(reg_calls, 0, "nothing to register");
  int cls = kv_arena_class_for(&a, 64u << 10);
  cr_assert_geq(cls, 0);
  uint32_t s, n = 0;
  while (kv_arena_alloc(&a, cls, &s) == 0) {
    cr_assert_leq((uint8_t *)kv_arena_ptr(&a, s) + (64u << 10), (uint8_t *)mem + cap);
    n++;
  }
  cr_assert_eq(n, cap / (64u << 10));
  cr_assert_eq(kv_arena_free(&a, s = 0), 0);
  kv_arena_fini(&a);
  cr_assert_eq(munmap(mem, cap), 0, "the memory is still the caller's");
}
