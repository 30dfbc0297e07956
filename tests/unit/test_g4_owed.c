/*
 * test_g4_owed.c - G4's backlog of owed writes and its memory of absent
 * keys (daemon/g4_owed.h): bounded, oldest dropped first and counted, a
 * failed write waiting its turn, an absent key forgotten at its expiry or
 * when written, a slot taken over by another key.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "daemon/g4_owed.h"

static kv_key key_of(unsigned v) {
  kv_key k;
  k.len = 8;
  memset(k.b, 0, sizeof k.b);
  memcpy(k.b, &v, sizeof v);
  return k;
}

static const uint8_t D1[32] = {1}, D2[32] = {2};

Test(g4_backlog, fifo_bounded_oldest_dropped_first) {
  kvd_g4_backlog b;
  cr_assert_eq(kvd_g4_backlog_init(&b, 3), 0);
  for (unsigned v = 1; v <= 5; v++) {
    kv_key k = key_of(v);
    kvd_g4_backlog_push(&b, v % 2 ? D1 : D2, v, &k, 0, v * 0x10001u, 0);
  }
  cr_assert_eq(b.n, 3);
  cr_assert_eq(b.added, 5);
  cr_assert_eq(b.dropped, 2, "1 and 2, the oldest");
  kvd_g4_owed e;
  for (unsigned v = 3; v <= 5; v++) {
    cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 0), 1);
    kv_key k = key_of(v);
    cr_assert(e.key.len == k.len && !memcmp(e.key.b, k.b, k.len), "entry %u", v);
    cr_assert_eq(e.core_ns, v);
    cr_assert(!memcmp(e.digest, v % 2 ? D1 : D2, 32));
    cr_assert_eq(e.coding, v * 0x10001u, "entry %u keeps its coding", v);
  }
  cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 0), 0, "empty");
  kvd_g4_backlog_fini(&b);
}

Test(g4_backlog, an_entry_not_due_waits_and_holds_the_rest) {
  kvd_g4_backlog b;
  cr_assert_eq(kvd_g4_backlog_init(&b, 4), 0);
  kv_key k1 = key_of(1), k2 = key_of(2);
  kvd_g4_backlog_push(&b, D1, 0, &k1, 2, 0, 1000);
  kvd_g4_backlog_push(&b, D1, 0, &k2, 0, 0, 0);
  kvd_g4_owed e;
  cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 999), 0, "the head is not due");
  cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 1000), 1);
  cr_assert_eq(e.tries, 2);
  cr_assert_eq(e.due_ms, 1000);
  cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 1000), 1);
  cr_assert_eq(e.key.b[0], 2);
  kvd_g4_backlog_fini(&b);
}

Test(g4_backlog, off_drops_every_push) {
  kvd_g4_backlog b;
  cr_assert_eq(kvd_g4_backlog_init(&b, 0), 0);
  kv_key k = key_of(1);
  kvd_g4_backlog_push(&b, D1, 0, &k, 0, 0, 0);
  kvd_g4_owed e;
  cr_assert_eq(kvd_g4_backlog_pop(&b, &e, 0), 0);
  cr_assert_eq(b.dropped, 1);
  kvd_g4_backlog_fini(&b);
}

Test(g4_absent, remembered_until_expiry_or_written) {
  kvd_g4_absent a;
  cr_assert_eq(kvd_g4_absent_init(&a, 1000, 250), 0);
  cr_assert_eq(a.mask, 1023, "rounded up to a power of two");
  kv_key k1 = key_of(1), k2 = key_of(2);
  uint64_t f1 = kvd_g4_absent_fp(D1, &k1);
  cr_assert_neq(f1, kvd_g4_absent_fp(D2, &k1), "the namespace is in the fingerprint");
  cr_assert_neq(f1, kvd_g4_absent_fp(D1, &k2));
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 0), 0);
  kvd_g4_absent_note(&a, f1, 1000);
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 1000), 1);
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 1249), 1);
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 1250), 0, "expired");
  cr_assert_eq(kvd_g4_absent_recent(&a, kvd_g4_absent_fp(D2, &k1), 1100), 0);
  kvd_g4_absent_note(&a, f1, 2000);
  kvd_g4_absent_forget(&a, f1);
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 2001), 0, "written since");
  /* a key whose slot another takes over is forgotten early: asked again */
  uint64_t other = f1 + 1024; /* same slot */
  kvd_g4_absent_note(&a, f1, 3000);
  kvd_g4_absent_note(&a, other, 3000);
  cr_assert_eq(kvd_g4_absent_recent(&a, f1, 3001), 0);
  cr_assert_eq(kvd_g4_absent_recent(&a, other, 3001), 1);
  kvd_g4_absent_fini(&a);
}

Test(g4_absent, off_remembers_nothing) {
  kvd_g4_absent a;
  cr_assert_eq(kvd_g4_absent_init(&a, 1000, 0), 0);
  kv_key k = key_of(1);
  uint64_t f = kvd_g4_absent_fp(D1, &k);
  kvd_g4_absent_note(&a, f, 0);
  cr_assert_eq(kvd_g4_absent_recent(&a, f, 1), 0);
  kvd_g4_absent_fini(&a);
}
