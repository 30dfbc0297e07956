/* test_get_g3.c - GET of a block that is only on G3, in process: the
 * daemon's state (kvd_init) driven through kvd_handle with a sink that
 * keeps the deferred replies, and the G3 store's fault hook. GET used to
 * answer KV_ENOTFOUND for a block LOAD would have brought up; now it brings
 * it up the same way, and a failed read is the read's error, not a hit.
 * Then LOAD and ALLOC waiting for G2 room while demotions are in flight
 * (daemon/defer.h): getting it, or expiring on the deadline, or given up
 * when the session goes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "daemon/kvd.h"
#include "ipc/sock.h"
#include "tests/lib/tmpdir.h"
#include "tiers/g3_internal.h"

#define BLOCK 4096u

static kvd d;
static char dir[64];
static kvd_session sess;

typedef struct test_sink {
  kvd_sink s; /* first: kvd_sink_put frees the whole */
  kv_buf got; /* every deferred frame */
  int frames;
} test_sink;
static test_sink *ts;

static void deliver(kvd_sink *s, const kv_buf *frame) {
  test_sink *t = (test_sink *)s;
  cr_assert_eq(kv_buf_append(&t->got, frame->p, frame->len), 0);
  t->frames++;
}

static int fail_reads(void *arg, int is_write, int is_header, unsigned file, uint64_t off,
                      uint32_t len) {
  return is_write ? 0 : -EIO;
}
static const kv_g3_fault reads_fail = {.io = fail_reads};

static void set(const char *opt, const char *val) {
  char err[256];
  cr_assert_eq(kv_config_set(&d.cfg, opt, val, err, sizeof err), 0, "%s", err);
}

/* Handles req, wanting an immediate reply (decoded into *rep, valid until
 * the next call) or, with deferred, KVD_DEFERRED. */
static kv_buf out;
static void handle(const kv_msg *req, int deferred, kv_msg *rep) {
  int fds[2];
  kv_buf_reset(&out);
  int rc = kvd_handle(&d, &ts->s, req, &out, fds);
  if (deferred) {
    cr_assert_eq(rc, KVD_DEFERRED, "op %u answered at once (%d)", req->op, rc);
    return;
  }
  cr_assert_eq(rc, 0, "op %u: %d", req->op, rc);
  cr_assert_eq(kv_msg_decode(out.p, out.len, rep), 0);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/kvgetg3-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  char g3[96];
  snprintf(g3, sizeof g3, "%s/g3", dir);
  kv_config_defaults(&d.cfg);
  set("g2.capacity", "1M");
  set("g2.page_size", "1M");
  set("g2.lock", "no");
  set("g1.enable", "off");
  set("g3.path", g3);
  set("g3.capacity", "16M");
  set("g3.block_bytes", "4K");
  set("g3.backend", "threads");
  set("log.level", "error");
  kv_log_threshold = KV_LOG_ERROR;
  cr_assert_eq(kvd_init(&d), 0);
  kv_buf_init(&out);
  ts = calloc(1, sizeof *ts);
  ts->s.deliver = deliver;
  ts->s.conn = ts; /* a connection is there */
  ts->s.sess = &sess;
  ts->s.refs = 1;
  kv_buf_init(&ts->got);
  kvd_session_init(&sess, 1);
  kv_msg m = {.op = KV_OP_HELLO, .id = 1}, r;
  m.hello = (kv_hello_req){
      .ver_major = KV_PROTO_MAJOR,
      .tenant = {"t", 1},
      .layout = {.block_bytes = BLOCK, .tokens_per_block = 1, .tp_size = 1, .dtype = {"u8", 2}}};
  handle(&m, 0, &r);
  cr_assert_eq(r.op, KV_OP_HELLO, "HELLO refused: %d", r.status);
}

static void teardown(void) {
  uint64_t pins = 0, allocs = 0;
  kvd_session_close(d.core, &sess, &pins, &allocs);
  kv_buf_free(&ts->got);
  kvd_sink_put(&ts->s);
  kv_buf_free(&out);
  kvd_fini(&d);
  kvt_rmtree(dir);
}

/* Delivers G3 completions until `done` holds (each wait at most 100 ms). */
#define POLL_UNTIL(done)                                         \
  for (int i_ = 0; !(done); i_++) {                              \
    cr_assert_lt(i_, 300, "waited too long for: %s", #done);     \
    struct pollfd p_ = {.fd = kv_g3_fd(d.g3), .events = POLLIN}; \
    poll(&p_, 1, 100);                                           \
    kvd_g3_poll(&d);                                             \
  }

static kv_block *block(uint8_t k) {
  kv_key key;
  kv_key_set(&key, &k, 1);
  uint32_t ns = (uint32_t)kvd_registry_ns(&d.reg, sess.ns)->core_ns;
  return kv_core_find(d.core, ns, &key);
}

/* Stores key k with bytes of value v and moves it to G3 only. */
static void put_on_g3(uint8_t k, uint8_t v) {
  static uint8_t data[BLOCK];
  memset(data, v, sizeof data);
  kv_msg m = {.op = KV_OP_PUT, .id = 2}, r;
  m.put = (kv_put_req){.prio = 1, .key = {&k, 1}, .data = {data, BLOCK}};
  handle(&m, 0, &r);
  cr_assert_eq(r.op, KV_OP_PUT, "PUT refused: %d", r.status);
  cr_assert_geq(kv_core_evict_n(d.core, KV_G2, KV_NS_ANY, UINT64_MAX), 1);
  POLL_UNTIL(block(k) && block(k)->tiers == KV_TIER_BIT(KV_G3));
}

static void get(uint8_t k, kv_msg *rep) {
  kv_msg m = {.op = KV_OP_GET, .id = 3};
  m.get_key = (kv_bytes){&k, 1};
  int frames = ts->frames;
  kv_buf_reset(&ts->got);
  handle(&m, 1, NULL);
  POLL_UNTIL(ts->frames > frames);
  cr_assert_eq(kv_msg_decode(ts->got.p, ts->got.len, rep), 0);
}

TestSuite(get_g3, .init = setup, .fini = teardown, .timeout = 60);

Test(get_g3, a_block_only_on_g3_is_brought_up_and_returned) {
  put_on_g3(7, 0x5a);
  kv_msg r;
  get(7, &r);
  cr_assert_eq(r.op, KV_OP_GET, "GET failed: %d", r.status);
  cr_assert_eq(r.id, 3);
  cr_assert_eq(r.get_rep.tier, KV_G3, "says where it was found");
  cr_assert_eq(r.get_rep.data.len, BLOCK);
  for (uint32_t i = 0; i < BLOCK; i++) cr_assert_eq(r.get_rep.data.p[i], 0x5a);
  cr_assert(block(7)->tiers & KV_TIER_BIT(KV_G2), "left in G2, as LOAD leaves it");
  cr_assert_eq(block(7)->pins, 0, "GET keeps no pin");
  cr_assert_eq(kvd_session_pins(&sess), 0);
  kv_core_stats_t cs;
  kv_core_stats(d.core, &cs);
  cr_assert_eq(cs.hits[KV_G3], 1, "a hit of the tier it was found in");
}

Test(get_g3, a_failed_read_is_an_io_error_not_a_hit) {
  put_on_g3(8, 0x11);
  d.g3->fault = &reads_fail;
  kv_msg r;
  get(8, &r);
  cr_assert_eq(r.op, KV_OP_ERROR);
  cr_assert_eq(r.error.req_op, KV_OP_GET);
  cr_assert_eq(r.status, -EIO, "status %d", r.status);
  cr_assert_eq(d.m.misses[KVD_MISS_IO_ERROR], 1);
  kv_core_stats_t cs;
  kv_core_stats(d.core, &cs);
  cr_assert_eq(cs.hits[KV_G3] + cs.hits[KV_G2], 0);
  cr_assert_eq(kvd_session_pins(&sess), 0, "the pin is dropped with the failure");
  d.g3->fault = NULL;
}

Test(get_g3, a_block_in_g2_is_answered_at_once) {
  uint8_t k = 9, data[BLOCK];
  memset(data, 0x33, sizeof data);
  kv_msg m = {.op = KV_OP_PUT, .id = 2}, r;
  m.put = (kv_put_req){.prio = 1, .key = {&k, 1}, .data = {data, BLOCK}};
  handle(&m, 0, &r);
  kv_msg g = {.op = KV_OP_GET, .id = 4};
  g.get_key = (kv_bytes){&k, 1};
  handle(&g, 0, &r);
  cr_assert_eq(r.op, KV_OP_GET);
  cr_assert_eq(r.get_rep.tier, KV_G2);
  cr_assert_eq(memcmp(r.get_rep.data.p, data, BLOCK), 0);
  cr_assert_eq(kvd_session_pins(&sess), 0);
  uint8_t missing = 10;
  g.get_key = (kv_bytes){&missing, 1};
  handle(&g, 0, &r);
  cr_assert_eq(r.op, KV_OP_ERROR);
  cr_assert_eq(r.status, KV_ENOTFOUND);
}

/* --- waiting for room ---------------------------------------------------------- */

/* PUT of the 4-byte key k: 0 or the ERROR reply's status. */
static int put_key(uint32_t k) {
  static uint8_t data[BLOCK];
  memset(data, (int)k, sizeof data);
  kv_msg m = {.op = KV_OP_PUT, .id = 2}, r;
  m.put = (kv_put_req){.prio = 1, .key = {(const uint8_t *)&k, sizeof k}, .data = {data, BLOCK}};
  handle(&m, 0, &r);
  return r.op == KV_OP_ERROR ? r.status : 0;
}

/* Fills G2 from key `from` on until a PUT finds no room: the victims'
 * demotions are then in flight, and no slot frees before they are
 * delivered (kvd_g3_poll). */
static void fill_g2(uint32_t from) {
  for (uint32_t k = from;; k++) {
    cr_assert_lt(k, from + 10000, "G2 never filled");
    int rc = put_key(k);
    if (rc == -EAGAIN) return;
    cr_assert_eq(rc, 0, "PUT %u: %d", k, rc);
  }
}

#define NEW_KEY 50000u

/* ALLOC of NEW_KEY, or LOAD of the 1-byte key k, both deferred; ts->got
 * is emptied for the reply. */
static void alloc_new(void) {
  uint32_t k = NEW_KEY;
  kv_msg m = {.op = KV_OP_ALLOC, .id = 5};
  m.alloc = (kv_alloc_req){
      .tier = KV_G2, .prio = 1, .keys = {.p = (const uint8_t *)&k, .n = 1, .klen = sizeof k}};
  kv_buf_reset(&ts->got);
  handle(&m, 1, NULL);
}

static void load(uint8_t k) {
  kv_msg m = {.op = KV_OP_LOAD, .id = 6};
  m.batch = (kv_batch_req){.tier = KV_G2, .keys = {.p = &k, .n = 1, .klen = 1}};
  kv_buf_reset(&ts->got);
  handle(&m, 1, NULL);
}

/* The one deferred reply since frames, decoded into *r; its first entry's
 * status. */
static int deferred_reply(int frames, kv_msg *r) {
  cr_assert_eq(ts->frames, frames + 1, "%d deferred replies, not one", ts->frames - frames);
  cr_assert_eq(kv_msg_decode(ts->got.p, ts->got.len, r), 0);
  if (r->op == KV_OP_ALLOC) {
    kv_alloc_ent e;
    kv_allocvec_get(&r->alloc_rep, 0, &e);
    return e.status;
  }
  cr_assert_eq(r->op, KV_OP_LOAD);
  kv_load_ent e;
  kv_loadvec_get(&r->load_rep, 0, &e);
  return e.status;
}

/* The daemon's tick, `ahead` ms past the deadline of what waits now. */
static uint32_t expire(kvd_defer *q, int64_t ahead) {
  uint64_t at = (uint64_t)kv_now_ms() + d.cfg.load_timeout_ms + (uint64_t)ahead;
  return kvd_defer_expire(q, at, d.cfg.load_timeout_ms);
}

TestSuite(waits, .init = setup, .fini = teardown, .timeout = 60);

Test(waits, an_alloc_waits_for_room_then_gets_its_slot) {
  fill_g2(1000);
  int frames = ts->frames;
  alloc_new();
  cr_assert_eq(d.alloc_wait.n, 1, "the ALLOC waits");
  POLL_UNTIL(ts->frames > frames);
  kv_msg r;
  cr_assert_eq(deferred_reply(frames, &r), 0);
  cr_assert_eq(d.alloc_wait.n, 0);
  cr_assert_eq(kvd_session_may_alloc(&sess, 1), -EDQUOT, "the session writes the block");
}

Test(waits, an_alloc_that_waits_past_the_deadline_is_answered_eagain) {
  fill_g2(1000);
  int frames = ts->frames;
  alloc_new();
  cr_assert_eq(expire(&d.alloc_wait, -1000), 0);
  cr_assert_eq(ts->frames, frames, "not before its deadline");
  cr_assert_eq(expire(&d.alloc_wait, 0), 1);
  kv_msg r;
  cr_assert_eq(deferred_reply(frames, &r), -EAGAIN);
  cr_assert_eq(d.alloc_wait.n, 0);
  for (int i = 0; i < 5; i++) { /* room comes: nothing is answered twice */
    struct pollfd p = {.fd = kv_g3_fd(d.g3), .events = POLLIN};
    poll(&p, 1, 50);
    kvd_g3_poll(&d);
  }
  cr_assert_eq(ts->frames, frames + 1);
  cr_assert_eq(kvd_session_may_alloc(&sess, 1), 0, "no slot is taken for it");
}

Test(waits, a_load_waits_for_room_then_brings_its_block_up) {
  put_on_g3(7, 0x77);
  fill_g2(1000);
  int frames = ts->frames;
  load(7);
  cr_assert_eq(d.load_wait.n, 1, "the LOAD waits");
  POLL_UNTIL(ts->frames > frames);
  kv_msg r;
  cr_assert_eq(deferred_reply(frames, &r), 0);
  kv_load_ent e;
  kv_loadvec_get(&r.load_rep, 0, &e);
  cr_assert_eq(e.tier, KV_G2);
  cr_assert_eq(d.load_wait.n, 0);
  cr_assert_eq(kvd_session_pins(&sess), 1, "the LOAD's pin");
}

Test(waits, a_load_that_waits_past_the_deadline_times_out) {
  put_on_g3(7, 0x77);
  fill_g2(1000);
  int frames = ts->frames;
  load(7);
  cr_assert_eq(expire(&d.load_wait, -1000), 0);
  cr_assert_eq(ts->frames, frames, "not before its deadline");
  cr_assert_eq(expire(&d.load_wait, 0), 1);
  kv_msg r;
  cr_assert_eq(deferred_reply(frames, &r), -ETIMEDOUT);
  cr_assert_eq(d.m.misses[KVD_MISS_TIMEOUT], 1);
  cr_assert_eq(kvd_session_pins(&sess), 0, "the pin goes with the timeout");
}

Test(waits, a_wait_whose_session_went_is_given_up_without_a_reply) {
  fill_g2(1000);
  int frames = ts->frames;
  alloc_new();
  ts->s.conn = NULL; /* as the server does when the connection closes */
  ts->s.sess = NULL;
  POLL_UNTIL(d.alloc_wait.n == 0);
  cr_assert_eq(d.alloc_wait.cancelled, 1);
  cr_assert_eq(ts->frames, frames, "nobody to answer");
  cr_assert_eq(kvd_session_may_alloc(&sess, 1), 0, "no slot is taken for it");
}
