/* test_trust.c - committed bytes that a worker changed are never served as
 * data (daemon/OPS.md, "Trust model"). The attacks of issue 16 item 2,
 * against a real kvcached: a worker writes into a committed block through
 * its G2 mapping, or punches a hole in the arena; a reader lies about a
 * good block; a writer commits a wrong CRC; a 1.1 worker that knows none
 * of it. Some speak the protocol by hand (a worker need not use
 * libkvclient), the rest go through libkvclient's verified reads. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>

#include "base/crc32c.h"
#include "ipc/reader.h"
#include "proto/wire.h"
#include "tests/lib/fixture.h"
#include "tests/lib/tmpdir.h"

#define NOCRC (-1ll)

/* A worker that speaks the wire protocol itself: its connection, its
 * mapping of the arena and the arena's fd from HELLO. */
typedef struct raw {
  int fd;
  kv_reader rd;
  uint64_t id;
  int arena;
  uint64_t arena_bytes;
  uint8_t *map;
  uint16_t minor;
} raw;

static void raw_send(raw *r, kv_msg *m) {
  m->id = r->id++;
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_msg_encode(&b, m), 0, "encode %s", kv_op_name(m->op));
  struct iovec iov = {b.p, b.len};
  cr_assert_eq(kv_sock_send_frame(r->fd, &iov, 1, -1, 5000), 0);
  kv_buf_free(&b);
}

/* The reply to the last request, decoded into *m (valid until the next). */
static void raw_recv(raw *r, kv_msg *m, kv_frame *f) {
  cr_assert_gt(kv_reader_recv(&r->rd, r->fd, f, 5000), 0, "no reply");
  cr_assert_eq(kv_msg_decode(f->p, f->len, m), 0);
  cr_assert_eq(m->id, r->id - 1);
  cr_assert_neq(m->op, KV_OP_ERROR, "ERROR reply: %s", kv_strerror(m->status));
}

/* HELLO as protocol 1.`minor`, in ops_open's namespace (same tenant and
 * layout: the same blocks). */
static void raw_open(raw *r, const char *tenant, uint16_t minor) {
  memset(r, 0, sizeof *r);
  r->fd = kv_sock_connect(ops_d.sock, 0);
  cr_assert_geq(r->fd, 0);
  kv_reader_init(&r->rd, 0);
  r->id = 1;
  kv_msg m = {.op = KV_OP_HELLO};
  m.hello = (kv_hello_req){.ver_major = KV_PROTO_MAJOR,
                           .ver_minor = minor,
                           .tenant = {tenant, (uint32_t)strlen(tenant)},
                           .layout = {.block_bytes = OPS_BLOCK,
                                      .tokens_per_block = 16,
                                      .layers = 2,
                                      .kv_heads = 2,
                                      .head_dim = 64,
                                      .tp_rank = 0,
                                      .tp_size = 1,
                                      .dtype = {"bf16", 4}}};
  raw_send(r, &m);
  kv_frame f;
  raw_recv(r, &m, &f);
  cr_assert_eq(m.op, KV_OP_HELLO);
  cr_assert_geq(f.fd, 0, "no arena fd");
  r->arena = f.fd;
  r->arena_bytes = m.hello_rep.arena_bytes;
  r->minor = m.hello_rep.ver_minor;
  r->map = mmap(NULL, r->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->arena, 0);
  cr_assert_neq(r->map, MAP_FAILED);
}

static void raw_close(raw *r) {
  munmap(r->map, r->arena_bytes);
  close(r->arena);
  close(r->fd);
  kv_reader_free(&r->rd);
}

static kv_keyvec keyvec1(const kvc_key *k) {
  return (kv_keyvec){.p = k->b, .n = 1, .klen = k->len};
}

/* ALLOC, fill with `fill`, COMMIT with `crc` (NOCRC: a plain COMMIT, the
 * daemon computes). Returns the slot's offset. */
static uint64_t raw_store(raw *r, uint64_t v, uint8_t fill, long long crc) {
  kvc_key k = KC(v);
  kv_msg m = {.op = KV_OP_ALLOC};
  m.alloc = (kv_alloc_req){.tier = KV_G2, .prio = 128, .keys = keyvec1(&k)};
  raw_send(r, &m);
  kv_frame f;
  raw_recv(r, &m, &f);
  kv_alloc_ent a;
  kv_allocvec_get(&m.alloc_rep, 0, &a);
  cr_assert_eq(a.status, 0, "alloc: %s", kv_strerror(a.status));
  memset(r->map + a.offset, fill, OPS_BLOCK);
  uint32_t c = (uint32_t)crc;
  m = (kv_msg){.op = KV_OP_COMMIT};
  m.batch.keys = keyvec1(&k);
  if (crc != NOCRC) {
    m.batch.flags = KV_COMMIT_CRC;
    m.batch.crcs = (kv_u32vec){.n = 1, .v = &c};
  }
  raw_send(r, &m);
  raw_recv(r, &m, &f);
  cr_assert_eq(kv_statvec_get(&m.statuses, 0), 0, "commit");
  return a.offset;
}

/* LOAD2 (or LOAD, for a 1.1 session) of one key to G2. */
static kv_load_ent raw_load(raw *r, uint64_t v, uint16_t op) {
  kvc_key k = KC(v);
  kv_msg m = {.op = op};
  m.batch = (kv_batch_req){.tier = KV_G2, .keys = keyvec1(&k)};
  raw_send(r, &m);
  kv_frame f;
  raw_recv(r, &m, &f);
  cr_assert_eq(m.op, op);
  kv_load_ent e;
  kv_loadvec_get(&m.load_rep, 0, &e);
  return e;
}

/* RELEASE of one key with `flags` (KV_REL_CORRUPT: a report); its status. */
static int32_t raw_release(raw *r, uint64_t v, uint8_t flags) {
  kvc_key k = KC(v);
  kv_msg m = {.op = KV_OP_RELEASE};
  m.batch = (kv_batch_req){.flags = flags, .keys = keyvec1(&k)};
  raw_send(r, &m);
  kv_frame f;
  raw_recv(r, &m, &f);
  return kv_statvec_get(&m.statuses, 0);
}

static uint32_t fill_crc(uint8_t fill) {
  static uint8_t buf[OPS_BLOCK];
  memset(buf, fill, sizeof buf);
  return kv_crc32c(0, buf, sizeof buf);
}

/* /stats' corrupt_reports.<what>, or misses.corrupt for "miss". */
static long long reports(const char *what) {
  json_t *o = ops_json(ops_d.stats, "GET", "/stats", 200);
  char path[64];
  snprintf(path, sizeof path, strcmp(what, "miss") ? "corrupt_reports.%s" : "misses.corrupt", what);
  long long v = ops_num(o, path);
  json_decref(o);
  return v;
}

static void setup(void) { ops_start(NULL, NULL); }
TestSuite(trust, .init = setup, .fini = ops_stop, .timeout = 60);

Test(trust, hello_settles_on_the_lower_minor_and_a_1_1_worker_keeps_working) {
  raw old, cur;
  raw_open(&old, "t1", 1);
  raw_open(&cur, "t1", KV_PROTO_MINOR);
  cr_assert_eq(old.minor, 1, "the lower minor");
  cr_assert_eq(cur.minor, KV_PROTO_MINOR);
  cr_assert_geq(cur.minor, 2, "CRCs and LOAD2 since 1.2");
  /* a 1.1 worker: plain COMMIT (the daemon checksums), LOAD of 17-byte entries */
  raw_store(&old, 1, 0x31, NOCRC);
  kv_load_ent e = raw_load(&old, 1, KV_OP_LOAD);
  cr_assert_eq(e.status, 0);
  cr_assert_eq(e.crc, 0, "LOAD carries no CRC");
  cr_assert_eq(old.map[e.offset + OPS_BLOCK - 1], 0x31);
  cr_assert_eq(raw_release(&old, 1, 0), 0);
  /* ... and a 1.2 reader gets the CRC the daemon computed for it */
  e = raw_load(&cur, 1, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_eq(e.crc, fill_crc(0x31));
  cr_assert_eq(kv_crc32c(0, cur.map + e.offset, OPS_BLOCK), e.crc);
  cr_assert_eq(raw_release(&cur, 1, 0), 0);
  raw_close(&old);
  raw_close(&cur);
}

Test(trust, the_daemon_keeps_the_writers_crc_without_reading_the_bytes) {
  raw w;
  raw_open(&w, "t1", KV_PROTO_MINOR);
  raw_store(&w, 2, 0x22, 0x12345678); /* not the bytes' CRC: taken as given */
  kv_load_ent e = raw_load(&w, 2, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_eq(e.crc, 0x12345678u);
  cr_assert_eq(raw_release(&w, 2, 0), 0);
  raw_close(&w);
}

/* A reader that reports a good block as corrupt does not get it dropped:
 * the daemon checks its own copy. */
Test(trust, a_lying_reader_cannot_drop_a_good_block) {
  raw w, liar;
  raw_open(&w, "t1", KV_PROTO_MINOR);
  raw_open(&liar, "t1", KV_PROTO_MINOR);
  raw_store(&w, 3, 0x33, fill_crc(0x33));
  kv_load_ent e = raw_load(&liar, 3, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_eq(raw_release(&liar, 3, KV_REL_CORRUPT), 0, "the pin is released as any RELEASE");
  cr_assert_eq(reports("rejected"), 1);
  cr_assert_eq(reports("confirmed"), 0);
  cr_assert_eq(reports("dropped"), 0);
  e = raw_load(&w, 3, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0, "the good block is still served");
  cr_assert_eq(kv_crc32c(0, w.map + e.offset, OPS_BLOCK), e.crc);
  cr_assert_eq(raw_release(&w, 3, 0), 0);
  raw_close(&w);
  raw_close(&liar);
}

/* Only a pin counts: a report of a block the connection never loaded is
 * refused and weighs nothing. */
Test(trust, a_report_needs_a_pin) {
  raw w, other;
  raw_open(&w, "t1", KV_PROTO_MINOR);
  raw_open(&other, "t1", KV_PROTO_MINOR);
  uint64_t off = raw_store(&w, 4, 0x44, fill_crc(0x44));
  w.map[off + 7] ^= 1; /* bad bytes, but this reader holds no pin on them */
  cr_assert_eq(raw_release(&other, 4, KV_REL_CORRUPT), KV_ENOTOWNER);
  cr_assert_eq(reports("confirmed") + reports("rejected"), 0);
  raw_close(&w);
  raw_close(&other);
}

/* A COMMIT with a wrong CRC: the reader rejects the block, reports it, the
 * daemon confirms and drops it, and the key can be stored again. */
Test(trust, a_wrong_crc_at_commit_is_rejected_by_readers_and_dropped) {
  raw w, rd;
  raw_open(&w, "t1", KV_PROTO_MINOR);
  raw_open(&rd, "t1", KV_PROTO_MINOR);
  raw_store(&w, 5, 0x55, fill_crc(0x55) ^ 1);
  kv_load_ent e = raw_load(&rd, 5, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_neq(kv_crc32c(0, rd.map + e.offset, OPS_BLOCK), e.crc, "the reader's check fails");
  cr_assert_eq(raw_release(&rd, 5, KV_REL_CORRUPT), 0);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(reports("dropped"), 1);
  cr_assert_eq(reports("miss"), 1);
  e = raw_load(&rd, 5, KV_OP_LOAD2);
  cr_assert_eq(e.status, KV_ENOTFOUND, "dropped: %s", kv_strerror(e.status));
  raw_store(&w, 5, 0x55, fill_crc(0x55));
  e = raw_load(&rd, 5, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0, "stored again");
  cr_assert_eq(kv_crc32c(0, rd.map + e.offset, OPS_BLOCK), e.crc);
  raw_close(&w);
  raw_close(&rd);
}

/* A confirmed block that others still pin is not freed under them: LOADs
 * get KV_ECORRUPT until the last pin goes, then it is dropped. */
Test(trust, a_confirmed_block_still_pinned_is_refused_then_dropped) {
  raw w, holder, rd, late;
  raw_open(&w, "t1", KV_PROTO_MINOR);
  raw_open(&holder, "t1", KV_PROTO_MINOR);
  raw_open(&rd, "t1", KV_PROTO_MINOR);
  raw_open(&late, "t1", KV_PROTO_MINOR);
  uint64_t off = raw_store(&w, 6, 0x66, fill_crc(0x66));
  cr_assert_eq(raw_load(&holder, 6, KV_OP_LOAD2).status, 0); /* a zero-copy reader's pin */
  w.map[off + 100] ^= 0x80;                                  /* a worker scribbles */
  kv_load_ent e = raw_load(&rd, 6, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_neq(kv_crc32c(0, rd.map + e.offset, OPS_BLOCK), e.crc);
  cr_assert_eq(raw_release(&rd, 6, KV_REL_CORRUPT), 0);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(reports("pending"), 1);
  cr_assert_eq(reports("dropped"), 0, "not under the holder's pin");
  e = raw_load(&late, 6, KV_OP_LOAD2);
  cr_assert_eq(e.status, KV_ECORRUPT, "refused while it waits: %s", kv_strerror(e.status));
  /* the holder finds the bad bytes too: the same block, counted once */
  cr_assert_eq(raw_release(&holder, 6, KV_REL_CORRUPT), 0);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(reports("miss"), 2, "the report and the refused LOAD");
  cr_assert_eq(reports("pending"), 0);
  cr_assert_eq(reports("dropped"), 1);
  cr_assert_eq(raw_load(&late, 6, KV_OP_LOAD2).status, KV_ENOTFOUND);
  raw_close(&w);
  raw_close(&holder);
  raw_close(&rd);
  raw_close(&late);
}

/* --- through libkvclient: kvc_copy_crc + kvc_commit_crc, kvc_read --------------------- */

/* Stores key v filled with `fill` as a 1.2 writer does: one pass that
 * copies in and checksums, and the CRC with the COMMIT. */
static void store_crc(kvc *c, uint64_t v, uint8_t fill) {
  static uint8_t src[OPS_BLOCK];
  memset(src, fill, sizeof src);
  kvc_key k = KC(v), none = {0};
  kvc_block out;
  cr_assert_eq(kvc_alloc(c, KVC_G2, 128, &k, &none, 1, &out), 1, "alloc %llu",
               (unsigned long long)v);
  uint32_t crc = kvc_copy_crc(out.ptr, src, OPS_BLOCK);
  cr_assert_eq(crc, fill_crc(fill));
  int32_t st;
  cr_assert_eq(kvc_commit_crc(c, &k, &crc, 1, &st), 1, "commit: %s", kvc_strerror(st));
}

/* Loads key v (G2) into *b; 1 when usable. */
static int load1(kvc *c, uint64_t v, kvc_block *b) {
  kvc_key k = KC(v);
  return kvc_load(c, KVC_G2, &k, 1, b);
}

static int all_bytes(const uint8_t *p, size_t n, uint8_t want) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != want) return 0;
  return 1;
}

/* Issue 16, item 2, first attack: a worker writes into a committed block
 * through its G2 mapping. The next reader got status 0 and those bytes;
 * now its verified read fails, the block is dropped and counted, and the
 * key can be stored again. */
Test(trust, a_block_scribbled_through_the_mapping_is_never_served) {
  kvc *w = ops_open("t1"), *attacker = ops_open("t1"), *reader = ops_open("t1");
  store_crc(w, 10, 0x5a);
  kvc_block b;
  cr_assert_eq(load1(attacker, 10, &b), 1);
  ((uint8_t *)b.ptr)[1234] ^= 0xff; /* the mapping is writable: nothing stops this */
  kvc_key k = KC(10);
  cr_assert_eq(kvc_release(attacker, &k, 1, NULL), 1);

  static uint8_t dst[OPS_BLOCK];
  cr_assert_eq(load1(reader, 10, &b), 1, "LOAD still answers: the bytes are checked by the reader");
  cr_assert(b.has_crc);
  cr_assert_eq(b.crc, fill_crc(0x5a), "the committed CRC comes with the block");
  int rc = kvc_read(reader, &k, &b, dst);
  cr_assert_eq(rc, KV_ECORRUPT, "the scribbled bytes were served: kvc_read %d", rc);
  cr_assert_eq(b.status, KV_ECORRUPT);
  cr_assert_null(b.ptr);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(reports("dropped"), 1);
  cr_assert_eq(reports("miss"), 1);
  cr_assert_eq(kvc_lookup(reader, &k, 1, NULL), 0, "dropped");

  store_crc(w, 10, 0x5a);
  cr_assert_eq(load1(reader, 10, &b), 1);
  cr_assert_eq(kvc_read(reader, &k, &b, dst), 0, "the block stored again reads back");
  cr_assert(all_bytes(dst, OPS_BLOCK, 0x5a));
  cr_assert_eq(kvc_release(reader, &k, 1, NULL), 1);
  kvc_close(w);
  kvc_close(attacker);
  kvc_close(reader);
}

/* Issue 16, item 2, second attack: a worker punches a hole over the arena
 * with the fd HELLO gave it. Every block read back as zeros with status 0;
 * now every one of them is reported corrupt and dropped, and no zeros are
 * ever handed out as data. */
Test(trust, a_hole_punched_in_the_arena_is_never_served_as_zeros) {
  enum { N = 8 };
  kvc *w = ops_open("t1"), *reader = ops_open("t1");
  kvc_key keys[N];
  for (int i = 0; i < N; i++) {
    store_crc(w, 100 + (uint64_t)i, (uint8_t)(0x11 + i));
    keys[i] = KC(100 + (uint64_t)i);
  }
  raw attacker;
  raw_open(&attacker, "t1", KV_PROTO_MINOR);
  cr_assert_eq(fallocate(attacker.arena, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                         (off_t)attacker.arena_bytes),
               0, "punch: %s", strerror(errno));
  kvc_block b[N];
  cr_assert_eq(kvc_load(reader, KVC_G2, keys, N, b), N);
  static uint8_t dst[OPS_BLOCK];
  for (int i = 0; i < N; i++) {
    int rc = kvc_read(reader, &keys[i], &b[i], dst);
    cr_assert_eq(rc, KV_ECORRUPT, "block %d: kvc_read %d, the zeros were served", i, rc);
  }
  cr_assert_eq(reports("confirmed"), N);
  cr_assert_eq(reports("dropped"), N);
  cr_assert_eq(kvc_lookup(reader, keys, N, NULL), 0);
  raw_close(&attacker);
  kvc_close(w);
  kvc_close(reader);
}

/* kvc_verify checks in place (for readers that use the block where it is). */
Test(trust, kvc_verify_checks_in_place) {
  kvc *w = ops_open("t1"), *reader = ops_open("t1");
  store_crc(w, 30, 0x30);
  store_crc(w, 31, 0x31);
  kvc_key k30 = KC(30), k31 = KC(31);
  kvc_block b;
  cr_assert_eq(load1(reader, 30, &b), 1);
  cr_assert_eq(kvc_verify(reader, &k30, &b), 0);
  cr_assert_eq(b.status, 0, "a good block stays usable");
  cr_assert_eq(kvc_release(reader, &k30, 1, NULL), 1);
  cr_assert_eq(load1(reader, 31, &b), 1);
  ((uint8_t *)b.ptr)[OPS_BLOCK - 1] = 0;
  cr_assert_eq(kvc_verify(reader, &k31, &b), KV_ECORRUPT);
  cr_assert_eq(b.status, KV_ECORRUPT);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(kvc_lookup(reader, &k31, 1, NULL), 0);
  /* what has no CRC to check is refused, not passed */
  kvc_block a;
  kvc_key k32 = KC(32);
  cr_assert_eq(kvc_alloc(w, KVC_G2, 128, &k32, NULL, 1, &a), 1);
  cr_assert_eq(kvc_verify(w, &k32, &a), -EOPNOTSUPP, "an allocation has no committed CRC");
  cr_assert_eq(kvc_read(reader, &k31, &b, a.ptr), -EINVAL, "a block marked corrupt");
  kvc_close(w);
  kvc_close(reader);
}

/* Non-blocking writers: kvc_submit_commit_crc completes as a COMMIT. */
Test(trust, submit_commit_crc_completes_as_a_commit) {
  kvc *w = ops_open("t1");
  kvc_key k = KC(40);
  kvc_block out;
  cr_assert_eq(kvc_alloc(w, KVC_G2, 128, &k, NULL, 1, &out), 1);
  static uint8_t src[OPS_BLOCK];
  memset(src, 0x40, sizeof src);
  uint32_t crc = kvc_copy_crc(out.ptr, src, OPS_BLOCK);
  int32_t st = 1;
  int64_t id = kvc_submit_commit_crc(w, &k, &crc, 1, &st, (void *)7);
  cr_assert_gt(id, 0);
  kvc_completion cp;
  int got = 0;
  for (int i = 0; i < 500 && got == 0; i++) {
    got = kvc_poll(w, &cp, 1);
    if (!got) usleep(2000);
  }
  cr_assert_eq(got, 1);
  cr_assert_eq(cp.op, KVC_OP_COMMIT);
  cr_assert_eq(cp.result, 1);
  cr_assert_eq(cp.user, (void *)7);
  cr_assert_eq(st, 0);
  kvc_block b;
  cr_assert_eq(load1(w, 40, &b), 1);
  cr_assert_eq(b.crc, crc);
  kvc_close(w);
}

/* A copy on the SSD written before the scribble stays and is served again
 * once the bad G2 copy is dropped: its record carries the committed CRC. */
static char g3dir[64];
static void setup_g3(void) {
  snprintf(g3dir, sizeof g3dir, "/tmp/kvtrust-g3-XXXXXX");
  cr_assert_not_null(mkdtemp(g3dir));
  char path[96];
  snprintf(path, sizeof path, "g3.path=%s", g3dir);
  const char *extra[] = {path, "g3.capacity=4M", "g3.block_bytes=64K", "g3.backend=threads", NULL};
  ops_start(NULL, extra);
}
static void stop_g3(void) {
  ops_stop();
  kvt_rmtree(g3dir);
}

Test(trust_g3, a_good_ssd_copy_outlives_a_scribbled_g2_copy, .init = setup_g3, .fini = stop_g3,
     .timeout = 60) {
  kvc *w = ops_open("t1"), *attacker = ops_open("t1"), *reader = ops_open("t1");
  kvc_key k = KC(50);
  store_crc(w, 50, 0x77);
  json_decref(ops_json(ops_d.admin, "POST", "/evict?tier=g2", 200)); /* down to G3 */
  uint8_t t = KVC_TIER_NONE;
  for (int i = 0; i < 250 && t != KVC_G3; i++) {
    kvc_lookup(reader, &k, 1, &t);
    if (t != KVC_G3) usleep(20000);
  }
  cr_assert_eq(t, KVC_G3, "the block never reached G3 alone");
  kvc_block b;
  cr_assert_eq(load1(reader, 50, &b), 1, "brought back up: now in G2 and G3");
  cr_assert_eq(kvc_release(reader, &k, 1, NULL), 1);
  cr_assert_eq(load1(attacker, 50, &b), 1);
  memset(b.ptr, 0, 4096);
  cr_assert_eq(kvc_release(attacker, &k, 1, NULL), 1);

  static uint8_t dst[OPS_BLOCK];
  cr_assert_eq(load1(reader, 50, &b), 1);
  cr_assert_eq(kvc_read(reader, &k, &b, dst), KV_ECORRUPT);
  cr_assert_eq(reports("dropped"), 1);
  cr_assert_eq(kvc_lookup(reader, &k, 1, &t), 1, "the SSD copy stays");
  cr_assert_eq(t, KVC_G3);
  cr_assert_eq(load1(reader, 50, &b), 1, "read up again from G3, verified");
  cr_assert_eq(kvc_read(reader, &k, &b, dst), 0);
  cr_assert(all_bytes(dst, OPS_BLOCK, 0x77), "the committed bytes, from before the scribble");
  kvc_close(w);
  kvc_close(attacker);
  kvc_close(reader);
}

/* G1 on the simulated device is host memory: kvc_read checks it as G2.
 * (On a real GPU the CPU cannot read it: -EOPNOTSUPP, never a pass.) */
static void setup_sim(void) {
  static const char *const sim_on[] = {"g1.enable=on", "g1.backend=sim", "g1.capacity=4M", NULL};
  ops_start(NULL, sim_on);
}

Test(trust_g1, kvc_read_checks_a_sim_g1_block, .init = setup_sim, .fini = ops_stop, .timeout = 60) {
  kvc *w = ops_open("t1"), *reader = ops_open("t1");
  kvc_g1 g;
  cr_assert_eq(kvc_g1_info(reader, &g), 0);
  cr_assert(g.available && g.backend == KVC_G1_SIM, "no simulated G1: %s", g.reason);
  store_crc(w, 60, 0x60);
  kvc_key k = KC(60);
  kvc_block b;
  cr_assert_eq(kvc_load(reader, KVC_G1, &k, 1, &b), 1);
  cr_assert_eq(b.tier, KVC_G1);
  cr_assert(b.has_crc);
  static uint8_t dst[OPS_BLOCK];
  cr_assert_eq(kvc_read(reader, &k, &b, dst), 0);
  cr_assert(all_bytes(dst, OPS_BLOCK, 0x60));
  cr_assert_eq(kvc_release(reader, &k, 1, NULL), 1);
  kvc_close(w);
  kvc_close(reader);
}
