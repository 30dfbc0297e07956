/*
 * test_ipc_reader.c - frames and fds from a stream: bad input first (bad
 * magic or version as soon as the bytes arrive, lengths over a limit
 * rejected before anything is buffered, fds that are unexpected, missing,
 * doubled, truncated or sent late, end of stream inside a frame, sticky
 * errors), then fd passing across a socketpair and across fork, frames
 * split at every byte, interleaved fds in a fast stream, a maximal PUT.
 * An fd the reader must drop is the write end of a pipe: the read end sees
 * end-of-file only once every copy is closed.
 */
#include "ipc/reader.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../fuzz/samples.h"
#include "base/clock.h"
#include "base/le.h"
#include "ipc/sock.h"

/* ---- helpers ---------------------------------------------------------------- */

static int memfd_with(const char *text) {
  int fd = memfd_create("kv-test", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  size_t n = strlen(text);
  cr_assert_eq(write(fd, text, n), (ssize_t)n);
  return fd;
}

static void expect_memfd(int fd, const char *text) {
  char got[64] = {0};
  cr_assert_geq(fd, 0);
  cr_assert_eq(pread(fd, got, sizeof got - 1, 0), (ssize_t)strlen(text));
  cr_assert_str_eq(got, text);
}

/* A HELLO reply that announces the arena fd. */
static void hello_rep(kv_buf *b, uint64_t id) {
  kv_msg m = kv_sample_rep(KV_OP_HELLO, id);
  m.flags |= KV_F_FD;
  m.hello_rep = (kv_hello_rep){.ver_major = 1,
                               .session_id = id,
                               .ns_id = 1,
                               .arena_bytes = 1 << 20,
                               .slot_align = 64,
                               .slot_bytes = 4096};
  cr_assert_eq(kv_msg_encode(b, &m), 0);
}

/* A small frame with no fd. */
static void plain(kv_buf *b, uint64_t id) {
  kv_msg m = kv_sample_rep(KV_OP_PREFETCH, id);
  m.prefetch_queued = (uint32_t)id;
  cr_assert_eq(kv_msg_encode(b, &m), 0);
}

static void send_buf(int sock, const kv_buf *b, int fd) {
  struct iovec iov = {b->p, b->len};
  cr_assert_eq(kv_sock_send_frame(sock, &iov, 1, fd, 5000), 0);
}

/* sendmsg with n fds in one SCM_RIGHTS message. */
static void send_fds(int sock, const void *p, size_t len, const int *fds, int n) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * 16)];
    struct cmsghdr align;
  } cm;
  memset(&cm, 0, sizeof cm);
  struct iovec iov = {(void *)p, len};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cm.buf,
                      .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
  cr_assert_eq(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

/* Every copy of the pipe's write end is closed: the read end is at EOF. */
static void expect_all_closed(int rfd) {
  char c;
  cr_assert_eq(fcntl(rfd, F_SETFL, O_NONBLOCK), 0);
  ssize_t r = read(rfd, &c, 1);
  cr_assert_eq(r, 0, "an fd leaked: read gave %zd (%s)", r, r < 0 ? strerror(errno) : "data");
}

static int pair[2];
static kv_reader rd;

static void setup(void) {
  cr_assert_eq(kv_sock_pair(pair), 0);
  kv_reader_init(&rd, 0);
}

static void teardown(void) {
  kv_reader_free(&rd);
  close(pair[0]);
  close(pair[1]);
}

TestSuite(reader_bad, .init = setup, .fini = teardown);
TestSuite(reader_ok, .init = setup, .fini = teardown);

/* ---- unhappy paths -------------------------------------------------------------- */

Test(reader_bad, wrong_magic_at_the_first_byte) {
  cr_assert_eq(kv_reader_feed(&rd, "G", 1), KV_EBADFRAME);
  kv_frame f;
  cr_assert_eq(kv_reader_next(&rd, &f), KV_EBADFRAME, "sticky");
  cr_assert_eq(kv_reader_feed(&rd, "KVCD", 4), KV_EBADFRAME, "sticky");
  void *p;
  size_t n;
  cr_assert_eq(kv_reader_space(&rd, &p, &n), KV_EBADFRAME, "sticky");
  cr_assert_eq(kv_reader_fill(&rd, pair[0], 1), KV_EBADFRAME, "sticky");
}

Test(reader_bad, http_on_the_socket) {
  const char *req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  cr_assert_eq(write(pair[1], req, strlen(req)), (ssize_t)strlen(req));
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFRAME);
}

Test(reader_bad, wrong_version_as_soon_as_it_arrives) {
  cr_assert_eq(kv_reader_feed(&rd, "KVCD\x01", 5), 0);
  cr_assert_eq(kv_reader_feed(&rd, "\x01", 1), KV_EBADVERSION);
  kv_reader_free(&rd);
  kv_reader_init(&rd, 0);
  cr_assert_eq(kv_reader_feed(&rd, "KVCD\x02\x00", 6), KV_EBADVERSION);
}

Test(reader_bad, oversized_length_rejected_before_buffering) {
  kv_hdr h = {.magic = KV_PROTO_MAGIC,
              .version = KV_PROTO_MAJOR,
              .op = KV_OP_LOOKUP,
              .len = 60u << 20,
              .id = 1};
  uint8_t g[KV_HDR_SIZE];
  kv_hdr_write(g, &h);
  cr_assert_eq(write(pair[1], g, sizeof g), (ssize_t)sizeof g);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), -EMSGSIZE);
  cr_assert_leq(rd.cap, 64 * 1024, "the reader grew to %zu bytes", rd.cap);
  /* the same through feed: refused with the header alone */
  kv_reader_free(&rd);
  kv_reader_init(&rd, 0);
  h.op = KV_OP_PUT;
  h.len = KV_PAYLOAD_MAX_DATA + 1;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_reader_feed(&rd, g, sizeof g), -EMSGSIZE);
  cr_assert_leq(rd.cap, 64 * 1024);
  /* under a reader's own smaller limit */
  kv_reader_free(&rd);
  kv_reader_init(&rd, 1024);
  h.len = 1025;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_reader_feed(&rd, g, sizeof g), -EMSGSIZE);
  kv_reader_free(&rd);
  kv_reader_init(&rd, 1024);
  h.len = 1024;
  kv_hdr_write(g, &h);
  cr_assert_eq(kv_reader_feed(&rd, g, sizeof g), 0);
}

Test(reader_bad, end_of_stream_inside_a_frame) {
  kv_buf b;
  kv_buf_init(&b);
  plain(&b, 1);
  plain(&b, 2);
  cr_assert_eq(write(pair[1], b.p, b.len - 3), (ssize_t)(b.len - 3));
  close(pair[1]);
  pair[1] = -1;
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert_eq(f.hdr.id, 1);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFRAME);
  kv_buf_free(&b);
}

Test(reader_bad, unexpected_fd_is_closed) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  kv_buf b;
  kv_buf_init(&b);
  plain(&b, 1); /* no KV_F_FD, yet an fd comes with it */
  send_buf(pair[1], &b, p[1]);
  kv_buf_reset(&b);
  plain(&b, 2);
  send_buf(pair[1], &b, -1);
  close(p[1]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert_eq(f.fd, -1, "the fd is not handed to a frame that did not announce it");
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  expect_all_closed(p[0]);
  close(p[0]);
  kv_buf_free(&b);
}

Test(reader_bad, unexpected_fd_at_end_of_stream_is_closed) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  kv_buf b;
  kv_buf_init(&b);
  plain(&b, 1);
  send_buf(pair[1], &b, p[1]);
  close(p[1]);
  close(pair[1]);
  pair[1] = -1;
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  expect_all_closed(p[0]);
  kv_buf_free(&b);
}

Test(reader_bad, queued_fds_closed_by_free) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 1);
  send_buf(pair[1], &b, p[1]);
  close(p[1]);
  cr_assert_gt(kv_reader_fill(&rd, pair[0], 1), 0);
  kv_reader_free(&rd); /* the frame was never taken */
  expect_all_closed(p[0]);
  kv_buf_free(&b);
}

Test(reader_bad, two_fds_in_one_message) {
  int p[2], q[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(pipe(q), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 1);
  int fds[2] = {p[1], q[1]};
  send_fds(pair[1], b.p, b.len, fds, 2);
  close(p[1]);
  close(q[1]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  expect_all_closed(p[0]);
  expect_all_closed(q[0]);
  kv_buf_free(&b);
}

/* KV_F_FD2 announces a second fd: a frame that says so and brings one fd,
 * or three fds, is KV_EBADFD with every fd closed. */
static void hello_rep2(kv_buf *b, uint64_t id) {
  kv_msg m = kv_sample_rep(KV_OP_HELLO, id);
  m.flags |= KV_F_FD | KV_F_FD2;
  m.hello_rep = (kv_hello_rep){.ver_major = 1,
                               .session_id = id,
                               .ns_id = 1,
                               .arena_bytes = 1 << 20,
                               .slot_align = 64,
                               .slot_bytes = 4096};
  cr_assert_eq(kv_msg_encode(b, &m), 0);
}

Test(reader_bad, fd2_flag_with_one_fd) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep2(&b, 1);
  send_buf(pair[1], &b, p[1]);
  close(p[1]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  expect_all_closed(p[0]);
  kv_buf_free(&b);
}

Test(reader_bad, three_fds_in_one_message) {
  int p[2], q[2], r[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(pipe(q), 0);
  cr_assert_eq(pipe(r), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep2(&b, 1);
  int fds[3] = {p[1], q[1], r[1]};
  send_fds(pair[1], b.p, b.len, fds, 3);
  close(p[1]);
  close(q[1]);
  close(r[1]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  expect_all_closed(p[0]);
  expect_all_closed(q[0]);
  expect_all_closed(r[0]);
  kv_buf_free(&b);
}

/* The HELLO reply with a G1 pool: two fds in one message, in order. */
Test(reader_ok, two_fds_with_fd2) {
  int p[2], q[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(pipe(q), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep2(&b, 1);
  struct iovec iov = {b.p, b.len};
  int fds[2] = {p[1], q[1]};
  cr_assert_eq(kv_sock_send_frame_fds(pair[1], &iov, 1, fds, 2, 5000), 0);
  close(p[1]);
  close(q[1]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert(f.fd >= 0 && f.fd2 >= 0);
  cr_assert_eq(write(f.fd, "a", 1), 1);
  cr_assert_eq(write(f.fd2, "b", 1), 1);
  char c = 0;
  cr_assert_eq(read(p[0], &c, 1), 1);
  cr_assert_eq(c, 'a', "the arena's fd comes first");
  cr_assert_eq(read(q[0], &c, 1), 1);
  cr_assert_eq(c, 'b');
  close(f.fd);
  close(f.fd2);
  close(p[0]);
  close(q[0]);
  kv_buf_free(&b);
}

Test(reader_bad, control_data_truncated) {
  enum { N = 12 }; /* more than one recvmsg() takes in */
  int r[N], w[N];
  for (int i = 0; i < N; i++) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    r[i] = p[0], w[i] = p[1];
  }
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 1);
  send_fds(pair[1], b.p, b.len, w, N);
  for (int i = 0; i < N; i++) close(w[i]);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  for (int i = 0; i < N; i++) expect_all_closed(r[i]);
  kv_buf_free(&b);
}

Test(reader_bad, fd_flag_without_fd) {
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 1);
  send_buf(pair[1], &b, -1);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  kv_buf_free(&b);
}

Test(reader_bad, fd_sent_after_the_first_byte) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 1);
  cr_assert_eq(write(pair[1], b.p, KV_HDR_SIZE), KV_HDR_SIZE);
  cr_assert_eq(kv_reader_fill(&rd, pair[0], 1), KV_HDR_SIZE);
  kv_frame f;
  cr_assert_eq(kv_reader_next(&rd, &f), 0);
  int fds[1] = {p[1]};
  send_fds(pair[1], b.p + KV_HDR_SIZE, b.len - KV_HDR_SIZE, fds, 1);
  close(p[1]);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), KV_EBADFD);
  kv_reader_free(&rd);
  expect_all_closed(p[0]);
  kv_buf_free(&b);
}

Test(reader_bad, recv_timeout) {
  kv_frame f;
  int64_t t0 = kv_now_ms();
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 50), -ETIMEDOUT);
  cr_assert_geq(kv_now_ms() - t0, 45);
  /* half a frame, then silence */
  kv_buf b;
  kv_buf_init(&b);
  plain(&b, 1);
  cr_assert_eq(write(pair[1], b.p, 10), 10);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 50), -ETIMEDOUT);
  cr_assert_eq(write(pair[1], b.p + 10, b.len - 10), (ssize_t)(b.len - 10));
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 50), 1, "a timeout is not sticky");
  kv_buf_free(&b);
}

Test(reader_bad, feed_refuses_unbounded_buffering) {
  kv_reader_free(&rd);
  kv_reader_init(&rd, 100);
  kv_buf b;
  kv_buf_init(&b);
  for (int i = 0; i < 20; i++) plain(&b, (uint64_t)i + 1);
  /* 20 frames of 36 bytes: more than two maximal (132-byte) frames */
  cr_assert_eq(kv_reader_feed(&rd, b.p, b.len), -ENOBUFS);
  cr_assert_eq(kv_reader_pending(&rd), 0, "nothing taken");
  kv_buf_free(&b);
}

/* ---- happy paths ------------------------------------------------------------------ */

Test(reader_ok, fd_with_hello_reply) {
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 7);
  int mfd = memfd_with("arena-7");
  send_buf(pair[1], &b, mfd);
  close(mfd);
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert_eq(f.hdr.id, 7);
  cr_assert(f.hdr.flags & KV_F_FD);
  cr_assert(fcntl(f.fd, F_GETFD) & FD_CLOEXEC, "received with MSG_CMSG_CLOEXEC");
  expect_memfd(f.fd, "arena-7");
  kv_msg m;
  cr_assert_eq(kv_msg_decode(f.p, f.len, &m), 0);
  cr_assert_eq(m.hello_rep.arena_bytes, 1 << 20);
  close(f.fd);
  kv_buf_free(&b);
}

Test(reader_ok, fd_from_a_forked_daemon) {
  pid_t pid = fork();
  if (pid == 0) {
    kv_buf b;
    kv_buf_init(&b);
    plain(&b, 1);
    hello_rep(&b, 2);
    int mfd = memfd_create("child", MFD_CLOEXEC);
    if (mfd < 0 || write(mfd, "from-child", 10) != 10) _exit(1);
    struct iovec a = {b.p, 36}, c = {b.p + 36, b.len - 36};
    if (b.len <= 36 || kv_sock_send_frame(pair[1], &a, 1, -1, 5000)) _exit(2);
    if (kv_sock_send_frame(pair[1], &c, 1, mfd, 5000)) _exit(3);
    _exit(0);
  }
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 5000), 1);
  cr_assert_eq(f.hdr.id, 1);
  cr_assert_eq(f.fd, -1);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 5000), 1);
  cr_assert_eq(f.hdr.id, 2);
  expect_memfd(f.fd, "from-child");
  close(f.fd);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
}

Test(reader_ok, fd_to_a_forked_worker) {
  kv_buf b;
  kv_buf_init(&b);
  hello_rep(&b, 3);
  pid_t pid = fork();
  if (pid == 0) {
    kv_reader r;
    kv_frame f;
    kv_reader_init(&r, 0);
    if (kv_reader_recv(&r, pair[0], &f, 5000) != 1 || f.fd < 0) _exit(1);
    char got[16] = {0};
    if (pread(f.fd, got, 9, 0) != 9 || strcmp(got, "to-worker")) _exit(2);
    /* the arena is shared memory: write through it for the parent to see */
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);
    if (m == MAP_FAILED) _exit(3);
    memcpy(m, "WORKER", 6);
    _exit(0);
  }
  int mfd = memfd_with("to-worker");
  cr_assert_eq(ftruncate(mfd, 4096), 0);
  send_buf(pair[1], &b, mfd);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
  char got[7] = {0};
  cr_assert_eq(pread(mfd, got, 6, 0), 6);
  cr_assert_str_eq(got, "WORKER");
  close(mfd);
  kv_buf_free(&b);
}

/* The sample corpus, as one stream. */
static void add_sample(const kv_msg *m, const char *what, void *arg) {
  (void)what;
  kv_msg c = *m;
  c.flags &= (uint16_t)~KV_F_FD; /* a fed stream carries no fds */
  if (c.op == KV_OP_PRESENCE && (c.flags & KV_F_REPLY)) return; /* its fd is part of it */
  if (c.op == KV_OP_HELLO && (c.flags & KV_F_REPLY)) {
    c.hello_rep.arena_bytes = 0;
    c.hello_rep.slot_align = 0;
  }
  cr_assert_eq(kv_msg_encode(arg, &c), 0);
}

static void check_stream(kv_reader *r, const kv_buf *all, size_t *off) {
  kv_frame f;
  int rc;
  while ((rc = kv_reader_next(r, &f)) == 1) {
    cr_assert_leq(*off + f.len, all->len);
    cr_assert_eq(memcmp(f.p, all->p + *off, f.len), 0, "frame at %zu differs", *off);
    cr_assert_eq(f.fd, -1);
    kv_msg m;
    cr_assert_eq(kv_msg_decode(f.p, f.len, &m), 0);
    *off += f.len;
  }
  cr_assert_eq(rc, 0, "reader error %s", kv_strerror(rc));
}

Test(reader_ok, split_at_every_byte) {
  kv_buf all;
  kv_buf_init(&all);
  kv_samples(add_sample, &all);
  for (size_t k = 0; k <= all.len; k++) {
    kv_reader r;
    size_t off = 0;
    kv_reader_init(&r, 0);
    cr_assert_eq(kv_reader_feed(&r, all.p, k), 0);
    check_stream(&r, &all, &off);
    cr_assert_eq(kv_reader_feed(&r, all.p + k, all.len - k), 0);
    check_stream(&r, &all, &off);
    cr_assert_eq(off, all.len, "split at %zu", k);
    cr_assert_eq(kv_reader_pending(&r), 0);
    kv_reader_free(&r);
  }
  /* byte by byte */
  size_t off = 0;
  for (size_t k = 0; k < all.len; k++) {
    cr_assert_eq(kv_reader_feed(&rd, all.p + k, 1), 0);
    check_stream(&rd, &all, &off);
  }
  cr_assert_eq(off, all.len);
  kv_buf_free(&all);
}

Test(reader_ok, space_and_commit) {
  kv_buf all;
  kv_buf_init(&all);
  kv_samples(add_sample, &all);
  size_t in = 0, off = 0;
  unsigned seed = 1;
  while (in < all.len) {
    void *p;
    size_t room;
    cr_assert_eq(kv_reader_space(&rd, &p, &room), 0);
    cr_assert_gt(room, 0);
    size_t n = (size_t)(rand_r(&seed) % 97) + 1;
    if (n > room) n = room;
    if (n > all.len - in) n = all.len - in;
    memcpy(p, all.p + in, n);
    kv_reader_commit(&rd, n);
    in += n;
    check_stream(&rd, &all, &off);
  }
  cr_assert_eq(off, all.len);
  kv_buf_free(&all);
}

Test(reader_ok, fast_stream_with_interleaved_fds) {
  enum { N = 600 };
  pid_t pid = fork();
  if (pid == 0) {
    kv_buf b;
    kv_buf_init(&b);
    for (uint64_t id = 1; id <= N; id++) {
      kv_buf_reset(&b);
      int fd = -1;
      if (id % 3 == 0) {
        char text[32];
        snprintf(text, sizeof text, "fd-%llu", (unsigned long long)id);
        fd = memfd_create("s", MFD_CLOEXEC);
        if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) _exit(1);
        hello_rep(&b, id);
      } else {
        plain(&b, id);
      }
      struct iovec iov = {b.p, b.len};
      if (kv_sock_send_frame(pair[1], &iov, 1, fd, 5000)) _exit(2);
      if (fd >= 0) close(fd);
    }
    _exit(0);
  }
  close(pair[1]);
  pair[1] = -1;
  kv_frame f;
  uint64_t want = 1;
  int rc;
  while ((rc = kv_reader_recv(&rd, pair[0], &f, 5000)) == 1) {
    cr_assert_eq(f.hdr.id, want);
    if (want % 3 == 0) {
      char text[32];
      snprintf(text, sizeof text, "fd-%llu", (unsigned long long)want);
      expect_memfd(f.fd, text);
      close(f.fd);
    } else {
      cr_assert_eq(f.fd, -1);
    }
    want++;
  }
  cr_assert_eq(rc, 0, "%s", kv_strerror(rc));
  cr_assert_eq(want, N + 1);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

Test(reader_ok, maximal_put_then_a_small_frame, .timeout = 60) {
  uint8_t *data = malloc(KV_INLINE_MAX);
  cr_assert_not_null(data);
  for (size_t i = 0; i < KV_INLINE_MAX; i += 4096) data[i] = (uint8_t)(i >> 12);
  pid_t pid = fork();
  if (pid == 0) {
    kv_buf head;
    kv_bytes tail;
    kv_buf_init(&head);
    kv_msg m = kv_sample_req(KV_OP_PUT, 5);
    m.put = (kv_put_req){.key = {kv_sample_keys, 32}, .data = {data, KV_INLINE_MAX}};
    if (kv_msg_encode_head(&head, &m, &tail)) _exit(1);
    struct iovec iov[2] = {{head.p, head.len}, {(void *)tail.p, tail.len}};
    if (kv_sock_send_frame(pair[1], iov, 2, -1, 30000)) _exit(2);
    kv_buf_reset(&head);
    plain(&head, 6);
    iov[0] = (struct iovec){head.p, head.len};
    if (kv_sock_send_frame(pair[1], iov, 1, -1, 30000)) _exit(3);
    _exit(0);
  }
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 30000), 1);
  kv_msg m;
  cr_assert_eq(kv_msg_decode(f.p, f.len, &m), 0);
  cr_assert_eq(m.op, KV_OP_PUT);
  cr_assert_eq(m.put.data.len, KV_INLINE_MAX);
  cr_assert_eq(memcmp(m.put.data.p, data, KV_INLINE_MAX), 0);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 30000), 1);
  cr_assert_eq(f.hdr.id, 6);
  /* idle again: the big buffer is given back on the next read */
  void *p;
  size_t room;
  cr_assert_eq(kv_reader_space(&rd, &p, &room), 0);
  cr_assert_leq(rd.cap, 1u << 20, "kept %zu bytes", rd.cap);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
  free(data);
}

Test(reader_ok, end_of_stream_between_frames) {
  kv_buf b;
  kv_buf_init(&b);
  plain(&b, 1);
  send_buf(pair[1], &b, -1);
  close(pair[1]);
  pair[1] = -1;
  kv_frame f;
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 1);
  cr_assert_eq(kv_reader_recv(&rd, pair[0], &f, 1000), 0);
  kv_buf_free(&b);
}

Test(reader_ok, unknown_opcode_is_skippable) {
  /* the reader yields it; the decoder names it; the stream goes on */
  kv_hdr h = {.magic = KV_PROTO_MAGIC, .version = KV_PROTO_MAJOR, .op = 0x0777, .len = 5, .id = 9};
  uint8_t g[KV_HDR_SIZE + 5] = {0};
  kv_hdr_write(g, &h);
  kv_buf b;
  kv_buf_init(&b);
  cr_assert_eq(kv_buf_append(&b, g, sizeof g), 0);
  plain(&b, 10);
  cr_assert_eq(kv_reader_feed(&rd, b.p, b.len), 0);
  kv_frame f;
  kv_msg m;
  cr_assert_eq(kv_reader_next(&rd, &f), 1);
  cr_assert_eq(kv_msg_decode(f.p, f.len, &m), KV_EBADOP);
  cr_assert_eq(m.id, 9);
  cr_assert_eq(kv_reader_next(&rd, &f), 1);
  cr_assert_eq(f.hdr.id, 10);
  kv_buf_free(&b);
}
