/* test_get_g3.c - GET of a block that is only on G3, in process: the
 * daemon's state (kvd_init) driven through kvd_handle with a sink that
 * keeps the deferred replies, and the G3 store's fault hook. GET used to
 * answer KV_ENOTFOUND for a block LOAD would have brought up; now it brings
 * it up the same way, and a failed read is the read's error, not a hit. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/kvd.h"
#include "base/log.h"
#include "base/errors.h"
#include "tiers/g3_internal.h"
#include "tests/lib/tmpdir.h"

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
  set("g2.capacity", "4M");
  set("g2.page_size", "1M");
  set("g2.lock", "no");
  set("g1.enable", "off");
  set("g3.path", g3);
  set("g3.capacity", "4M");
  set("g3.block_bytes", "64K");
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
  m.hello = (kv_hello_req){.ver_major = KV_PROTO_MAJOR, .tenant = {"t", 1},
                           .layout = {.block_bytes = BLOCK, .tokens_per_block = 1, .tp_size = 1,
                                      .dtype = {"u8", 2}}};
  handle(&m, 0, &r);
  cr_assert_eq(r.op, KV_OP_HELLO, "HELLO refused: %d", r.status);
}

static void teardown(void) {
  uint64_t pins = 0, allocs = 0;
  kvd_session_close(&d.core, &sess, &pins, &allocs);
  kv_buf_free(&ts->got);
  kvd_sink_put(&ts->s);
  kv_buf_free(&out);
  kvd_fini(&d);
  kvt_rmtree(dir);
}

/* Delivers G3 completions until `done` holds (each wait at most 100 ms). */
#define POLL_UNTIL(done)                                                \
  for (int i_ = 0; !(done); i_++) {                                     \
    cr_assert_lt(i_, 300, "waited too long for: %s", #done);            \
    struct pollfd p_ = {.fd = kv_g3_fd(d.g3), .events = POLLIN};        \
    poll(&p_, 1, 100);                                                  \
    kvd_g3_poll(&d);                                                    \
  }

static kv_block *block(uint8_t k) {
  kv_key key;
  kv_key_set(&key, &k, 1);
  uint32_t ns = (uint32_t)kvd_registry_ns(&d.reg, sess.ns)->core_ns;
  return kv_core_find(&d.core, ns, &key);
}

/* Stores key k with bytes of value v and moves it to G3 only. */
static void put_on_g3(uint8_t k, uint8_t v) {
  static uint8_t data[BLOCK];
  memset(data, v, sizeof data);
  kv_msg m = {.op = KV_OP_PUT, .id = 2}, r;
  m.put = (kv_put_req){.prio = 1, .key = {&k, 1}, .data = {data, BLOCK}};
  handle(&m, 0, &r);
  cr_assert_eq(r.op, KV_OP_PUT, "PUT refused: %d", r.status);
  cr_assert_geq(kv_core_evict_n(&d.core, KV_G2, KV_NS_ANY, UINT64_MAX), 1);
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
  cr_assert_eq(d.core.st.hits[KV_G3], 1, "a hit of the tier it was found in");
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
  cr_assert_eq(d.core.st.hits[KV_G3] + d.core.st.hits[KV_G2], 0);
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
