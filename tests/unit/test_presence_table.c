/*
 * test_presence_table.c - the presence table (proto/presence.h) and the client's
 * reading of it (client/presence.h): entries, room made by moving entries,
 * a failed insert that changes nothing, copies to a larger table, what a
 * reader refuses to map; and readers racing the writer, as threads (run
 * it under TSan: tests/run.sh --tsan) and as processes sharing a memfd,
 * checking that every answer is the key's state at some instant during
 * the call - never older than the call, never a state the key never had.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/presence.h"
#include "proto/presence.h"

static uint64_t fp_of(uint64_t v) { return kv_pres_hash((const uint8_t *)&v, sizeof v); }

static void *table(unsigned log2, kv_pres *t) {
  void *m = calloc(1, kv_pres_bytes(log2));
  cr_assert(m);
  kv_pres_format(t, m, log2, 0);
  return m;
}

Test(table, set_find_change_delete) {
  kv_pres t;
  void *m = table(6, &t);
  for (uint64_t v = 0; v < 200; v++) cr_assert_eq(kv_pres_set(&t, fp_of(v), 1 + (int)(v % 3)), 0);
  cr_assert_eq(kv_pres_count(&t), 200);
  for (uint64_t v = 0; v < 200; v++) cr_assert_eq(kv_pres_find(&t, fp_of(v)), 1 + (int)(v % 3));
  for (uint64_t v = 200; v < 400; v++) cr_assert_eq(kv_pres_find(&t, fp_of(v)), 0);
  uint64_t before = t.h->updates;
  cr_assert_eq(kv_pres_set(&t, fp_of(7), 2), 0, "the same code again");
  cr_assert_eq(t.h->updates, before, "an unchanged entry is not written");
  cr_assert_eq(kv_pres_set(&t, fp_of(7), 3), 0);
  cr_assert_eq(kv_pres_find(&t, fp_of(7)), 3, "a key's code changes in place");
  cr_assert_eq(kv_pres_count(&t), 200);
  cr_assert_eq(kv_pres_del(&t, fp_of(7)), 0);
  cr_assert_eq(kv_pres_del(&t, fp_of(7)), -ENOENT);
  cr_assert_eq(kv_pres_find(&t, fp_of(7)), 0);
  cr_assert_eq(kv_pres_count(&t), 199);
  free(m);
}

Test(table, fills_past_nine_tenths_and_a_failed_insert_changes_nothing) {
  kv_pres t;
  void *m = table(8, &t);
  uint64_t cap = (uint64_t)KV_PRES_WAYS << 8, v = 0;
  while (kv_pres_set(&t, fp_of(v), 1 + (int)(v % 3)) == 0) v++;
  cr_assert_geq(v * 10, cap * 9, "full at %llu of %llu", (unsigned long long)v,
                (unsigned long long)cap);
  cr_assert_gt(t.h->moves, 0, "room was made by moving entries");
  cr_assert_eq(t.h->moves % 2, 0);
  cr_assert_eq(kv_pres_count(&t), v, "the refused key was not counted");
  for (uint64_t i = 0; i < v; i++)
    cr_assert_eq(kv_pres_find(&t, fp_of(i)), 1 + (int)(i % 3), "key %llu after the moves",
                 (unsigned long long)i);
  cr_assert_eq(kv_pres_find(&t, fp_of(v)), 0, "the refused key is not there");
  /* copied into a table twice as large, every entry is found there */
  kv_pres big;
  void *m2 = table(9, &big);
  cr_assert_eq(kv_pres_copy(&big, &t), 0);
  cr_assert_eq(kv_pres_count(&big), v);
  for (uint64_t i = 0; i < v; i++) cr_assert_eq(kv_pres_find(&big, fp_of(i)), 1 + (int)(i % 3));
  cr_assert_eq(kv_pres_set(&big, fp_of(v), 2), 0, "and the larger one has room");
  free(m);
  free(m2);
}

Test(table, attach_refuses_what_is_not_a_table) {
  kv_pres t, r;
  void *m = table(6, &t);
  size_t n = kv_pres_bytes(6);
  cr_assert_eq(kv_pres_attach(&r, m, n), 0);
  cr_assert_eq(kv_pres_attach(&r, m, n - 64), -EPROTO, "a size the header does not say");
  t.h->log2 = 40;
  cr_assert_eq(kv_pres_attach(&r, m, n), -EPROTO, "buckets beyond the limit");
  t.h->log2 = 6;
  t.h->magic ^= 1;
  cr_assert_eq(kv_pres_attach(&r, m, n), -EPROTO, "another magic");
  cr_assert_eq(kv_pres_attach(&r, m, 8), -EPROTO, "shorter than a header");
  free(m);
}

/* --- the client's answers ------------------------------------------------ */

static kvc_key KK(uint64_t v) {
  kvc_key k = {.len = 8};
  memcpy(k.b, &v, 8);
  return k;
}

Test(client, answers_with_a_lookups_meaning_or_defers) {
  kvc__pres p = {0};
  p.map = table(6, &p.t);
  p.bytes = kv_pres_bytes(6);
  for (uint64_t v = 1; v <= 4; v++) kv_pres_set(&p.t, fp_of(v), v == 3 ? 3 : 2);
  kvc_key k[6] = {KK(1), KK(2), KK(3), KK(9), KK(4), KK(5)};
  uint8_t tiers[6];
  cr_assert_eq(kvc__pres_lookup(&p, k, 6, tiers), 3, "the leading run");
  uint8_t want[6] = {KVC_G2, KVC_G2, KVC_G3, KVC_TIER_NONE, KVC_G2, KVC_TIER_NONE};
  cr_assert_eq(memcmp(tiers, want, 6), 0, "every key's tier, past the run too");
  cr_assert_eq(kvc__pres_lookup(&p, k, 3, NULL), 3);
  /* keys the daemon would refuse: its error is the caller's */
  kvc_key mixed[2] = {KK(1), {.len = 4}};
  cr_assert_eq(kvc__pres_lookup(&p, mixed, 2, tiers), -EAGAIN, "two lengths");
  cr_assert_eq(kvc__pres_lookup(&p, k, 0, tiers), -EAGAIN, "no keys");
  cr_assert_eq(kvc__pres_lookup(&p, k, KVC_BATCH_MAX + 1, tiers), -EAGAIN, "too many");
  /* G4: a short run is the daemon's to answer (G4 may have the rest) */
  kv_pres_flag(&p.t, KV_PRES_G4);
  cr_assert_eq(kvc__pres_lookup(&p, k, 6, tiers), -EAGAIN);
  cr_assert_eq(kvc__pres_lookup(&p, k, 3, tiers), 3, "a whole run needs no G4");
  p.t.h->flags = KV_PRES_PARTIAL;
  cr_assert_eq(kvc__pres_lookup(&p, k, 6, tiers), -EAGAIN, "a partial table's absent");
  cr_assert_eq(kvc__pres_lookup(&p, k, 2, tiers), 2);
  kv_pres_retire(&p.t);
  cr_assert_eq(kvc__pres_lookup(&p, k, 2, tiers), -ESTALE, "a retired table");
  free(p.map);
}

/* --- readers racing the writer --------------------------------------------- */

/* Key j's state after step e of the writer: step s (1, 2, ...) writes key
 * s % NKEYS, its (s / NKEYS)-th time, cycling absent, G1, G2, G3. */
#define NKEYS 400 /* of 448 entries (2^6 buckets): the writer makes room by moving entries */
static int state_at(uint64_t j, uint64_t e) {
  if (e < (j ? j : NKEYS)) return 0; /* not written yet */
  uint64_t s = e - (e % NKEYS + NKEYS - j) % NKEYS; /* the last step <= e that wrote j */
  return (int)((s / NKEYS) % 4);
}

static void writer_step(kv_pres *t, uint64_t s) {
  uint64_t j = s % NKEYS;
  int code = state_at(j, s);
  int rc = code ? kv_pres_set(t, fp_of(j), code) : kv_pres_del(t, fp_of(j));
  cr_assert(rc == 0 || (rc == -ENOENT && !code), "step %llu: %d", (unsigned long long)s, rc);
}

/* What a reader checks: the answer for key j read between epochs e0 and
 * e1 (the writer's completed steps before and after) is j's state after
 * some step in [e0, e1 + 1] (the step in flight at e1 may be visible). */
static int answer_ok(uint64_t j, int got, uint64_t e0, uint64_t e1) {
  if (got < 0) return 1; /* -EAGAIN: the caller would ask the daemon */
  for (uint64_t e = e0; e <= e1 + 1; e++)
    if (state_at(j, e) == got) return 1;
  return 0;
}

typedef struct race {
  kv_pres t;
  uint64_t *epoch; /* steps completed (shared) */
  uint64_t *stop;
  uint64_t checks, bad;
  uint64_t seed;
} race;

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

static void read_until_stopped(race *r) {
  while (!__atomic_load_n(r->stop, __ATOMIC_ACQUIRE)) {
    uint64_t j = rnd(&r->seed) % NKEYS;
    uint64_t e0 = __atomic_load_n(r->epoch, __ATOMIC_ACQUIRE);
    int got = kv_pres_find(&r->t, fp_of(j));
    uint64_t e1 = __atomic_load_n(r->epoch, __ATOMIC_ACQUIRE);
    r->checks++;
    r->bad += !answer_ok(j, got, e0, e1);
  }
}

static void *reader_thread(void *arg) {
  read_until_stopped(arg);
  return NULL;
}

static uint64_t write_for(kv_pres *t, uint64_t *epoch, double seconds) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  uint64_t s = __atomic_load_n(epoch, __ATOMIC_RELAXED);
  for (;;) {
    for (int i = 0; i < 256; i++) {
      writer_step(t, ++s);
      __atomic_store_n(epoch, s, __ATOMIC_RELEASE);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if ((double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9 > seconds) return s;
  }
}

Test(race, threads_never_see_an_answer_older_than_the_call, .timeout = 60) {
  kv_pres t;
  void *m = table(6, &t);
  uint64_t epoch = 0, stop = 0;
  race r[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    r[i] = (race){.t = t, .epoch = &epoch, .stop = &stop, .seed = 0x9e3779b97f4a7c15ull + i};
    cr_assert_eq(pthread_create(&th[i], NULL, reader_thread, &r[i]), 0);
  }
  uint64_t steps = write_for(&t, &epoch, 1.0);
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
  uint64_t checks = 0, bad = 0;
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    checks += r[i].checks;
    bad += r[i].bad;
  }
  cr_log_info("%llu writer steps, %llu moves, %llu answers checked, %llu wrong",
              (unsigned long long)steps, (unsigned long long)t.h->moves / 2,
              (unsigned long long)checks, (unsigned long long)bad);
  cr_assert_gt(steps, 10000);
  cr_assert_gt(t.h->moves, 0, "the writer moved entries while they were read");
  cr_assert_gt(checks, 1000);
  cr_assert_eq(bad, 0, "%llu answers were no state their key had during the call",
               (unsigned long long)bad);
  free(m);
}

Test(race, processes_mapping_a_memfd_never_see_an_answer_older_than_the_call, .timeout = 60) {
  size_t n = kv_pres_bytes(6);
  int fd = memfd_create("test-presence", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)n), 0);
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_neq(m, MAP_FAILED);
  uint64_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(shared, MAP_FAILED);
  kv_pres t;
  kv_pres_format(&t, m, 6, 0);
  pid_t kids[2];
  for (int i = 0; i < 2; i++) {
    kids[i] = fork();
    cr_assert_geq(kids[i], 0);
    if (kids[i] == 0) { /* a reader: its own read-only mapping of the fd */
      void *ro = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
      race r = {.epoch = &shared[0], .stop = &shared[1], .seed = 77 + (uint64_t)i};
      if (ro == MAP_FAILED || kv_pres_attach(&r.t, ro, n)) _exit(3);
      __atomic_fetch_add(&shared[2], 1, __ATOMIC_ACQ_REL);
      read_until_stopped(&r);
      __atomic_fetch_add(&shared[3], r.checks, __ATOMIC_ACQ_REL);
      _exit(r.bad ? 1 : r.checks ? 0 : 2);
    }
  }
  while (__atomic_load_n(&shared[2], __ATOMIC_ACQUIRE) < 2) usleep(1000);
  uint64_t steps = write_for(&t, &shared[0], 1.0);
  __atomic_store_n(&shared[1], 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 2; i++) {
    int st;
    cr_assert_eq(waitpid(kids[i], &st, 0), kids[i]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "reader %d: %s (1: a wrong answer, 2: nothing read, 3: cannot map)", i,
              WIFEXITED(st) ? "exit" : "killed");
  }
  cr_log_info("%llu writer steps, %llu answers checked in 2 processes", (unsigned long long)steps,
              (unsigned long long)shared[3]);
  cr_assert_gt(shared[3], 1000);
  munmap(m, n);
  munmap(shared, 4096);
  close(fd);
}
