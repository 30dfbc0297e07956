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

#include "ipc/reader.h"
#include "proto/wire.h"
#include "test_ops_util.h"
#include "tiers/crc32c.h"

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
  r->fd = kv_sock_connect(ops_sock, 0);
  cr_assert_geq(r->fd, 0);
  kv_reader_init(&r->rd, 0);
  r->id = 1;
  kv_msg m = {.op = KV_OP_HELLO};
  m.hello = (kv_hello_req){
    .ver_major = KV_PROTO_MAJOR, .ver_minor = minor, .tenant = {tenant, (uint32_t)strlen(tenant)},
    .layout = {.block_bytes = OPS_BLOCK, .tokens_per_block = 16, .layers = 2, .kv_heads = 2,
               .head_dim = 64, .tp_rank = 0, .tp_size = 1, .dtype = {"bf16", 4}}};
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

static kv_keyvec keyvec1(const kvc_key *k) { return (kv_keyvec){.p = k->b, .n = 1, .klen = k->len}; }

/* ALLOC, fill with `fill`, COMMIT with `crc` (NOCRC: a plain COMMIT, the
 * daemon computes). Returns the slot's offset. */
static uint64_t raw_store(raw *r, uint64_t v, uint8_t fill, long long crc) {
  kvc_key k = ops_key(v);
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
  kvc_key k = ops_key(v);
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
  kvc_key k = ops_key(v);
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
  json_t *o = ops_json(ops_stats, "GET", "/stats", 200);
  char path[64];
  snprintf(path, sizeof path, strcmp(what, "miss") ? "corrupt_reports.%s" : "misses.corrupt", what);
  long long v = ops_num(o, path);
  json_decref(o);
  return v;
}

static void setup(void) { ops_start(NULL, NULL); }
TestSuite(trust, .init = setup, .fini = ops_stop, .timeout = 60);

Test(trust, hello_settles_on_1_2_and_a_1_1_worker_keeps_working) {
  raw old, cur;
  raw_open(&old, "t1", 1);
  raw_open(&cur, "t1", KV_PROTO_MINOR);
  cr_assert_eq(old.minor, 1, "the lower minor");
  cr_assert_eq(cur.minor, 2);
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
  w.map[off + 100] ^= 0x80;                                     /* a worker scribbles */
  kv_load_ent e = raw_load(&rd, 6, KV_OP_LOAD2);
  cr_assert_eq(e.status, 0);
  cr_assert_neq(kv_crc32c(0, rd.map + e.offset, OPS_BLOCK), e.crc);
  cr_assert_eq(raw_release(&rd, 6, KV_REL_CORRUPT), 0);
  cr_assert_eq(reports("confirmed"), 1);
  cr_assert_eq(reports("pending"), 1);
  cr_assert_eq(reports("dropped"), 0, "not under the holder's pin");
  e = raw_load(&late, 6, KV_OP_LOAD2);
  cr_assert_eq(e.status, KV_ECORRUPT, "refused while it waits: %s", kv_strerror(e.status));
  cr_assert_eq(raw_release(&holder, 6, 0), 0);
  cr_assert_eq(reports("pending"), 0);
  cr_assert_eq(reports("dropped"), 1);
  cr_assert_eq(raw_load(&late, 6, KV_OP_LOAD2).status, KV_ENOTFOUND);
  raw_close(&w);
  raw_close(&holder);
  raw_close(&rd);
  raw_close(&late);
}
