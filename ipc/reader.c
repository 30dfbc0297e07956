/*
 * reader.c - whole frames and their fds from a stream socket (reader.h).
 *
 * Bytes live in buf[r, w); buf[0] is stream offset pos, so a frame that
 * starts at buf[r] starts at stream offset pos + r however often the buffer
 * is compacted. Each received fd is queued with the stream range [lo, hi)
 * of the recvmsg() that brought it, and given to the frame with KV_F_FD
 * that starts in that range.
 */
#include "ipc/reader.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/le.h"
#include "ipc/sock.h"

#define KV_READER_INIT     (64u * 1024) /* first allocation */
#define KV_READER_CHUNK    4096u        /* least room offered to a greedy read */
#define KV_READER_SHRINK   (1u << 20)   /* above this, give memory back when idle */
#define KV_READER_CMSG_FDS 8            /* fds one recvmsg() can take in */

void kv_reader_init(kv_reader *rd, uint32_t max_payload) {
  memset(rd, 0, sizeof *rd);
  rd->max_payload =
      max_payload && max_payload < KV_PAYLOAD_MAX_DATA ? max_payload : KV_PAYLOAD_MAX_DATA;
}

void kv_reader_set_check(kv_reader *rd, kv_reader_check_fn fn, void *arg) {
  rd->check = fn;
  rd->check_arg = arg;
}

void kv_reader_free(kv_reader *rd) {
  free(rd->buf);
  rd->buf = NULL;
  rd->cap = rd->r = rd->w = 0;
  for (unsigned i = 0; i < rd->nfds; i++) close(rd->fds[i].fd);
  rd->nfds = 0;
}

static int fail(kv_reader *rd, int err) {
  if (!rd->err) rd->err = err;
  return rd->err;
}

/* KV_EBADFD, closing every fd queued: none of them can be paired now. */
static int fail_fds(kv_reader *rd) {
  for (unsigned i = 0; i < rd->nfds; i++) close(rd->fds[i].fd);
  rd->nfds = 0;
  return fail(rd, KV_EBADFD);
}

static void compact(kv_reader *rd) {
  if (rd->r == 0) return;
  if (rd->w > rd->r) memmove(rd->buf, rd->buf + rd->r, rd->w - rd->r);
  rd->pos += rd->r;
  rd->w -= rd->r;
  rd->r = 0;
}

/*
 * Checks what has arrived of the frame at r and sets *want to its whole
 * size (KV_HDR_SIZE while the header is incomplete). The magic and version
 * are checked byte by byte as they arrive, the length (and the owner's
 * check) as soon as the header is whole. 0 or the (now sticky) error.
 */
static int peek(kv_reader *rd, size_t *want, kv_hdr *h) {
  static const uint8_t lead[6] = {'K', 'V', 'C', 'D', KV_PROTO_MAJOR & 0xff, KV_PROTO_MAJOR >> 8};
  size_t have = rd->w - rd->r;
  const uint8_t *p = rd->buf + rd->r;
  for (size_t i = 0; i < have && i < sizeof lead; i++)
    if (p[i] != lead[i]) return fail(rd, i < 4 ? KV_EBADFRAME : KV_EBADVERSION);
  if (have < KV_HDR_SIZE) {
    *want = KV_HDR_SIZE;
    return 0;
  }
  int rc = kv_hdr_parse(p, have, h);
  if (rc) return fail(rd, rc);
  if (h->len > rd->max_payload) return fail(rd, -EMSGSIZE);
  if (rd->check && (rc = rd->check(rd->check_arg, h))) return fail(rd, rc);
  *want = KV_HDR_SIZE + (size_t)h->len;
  return 0;
}

static int resize(kv_reader *rd, size_t cap) {
  uint8_t *nb = realloc(rd->buf, cap);
  if (!nb) return -ENOMEM;
  rd->buf = nb;
  rd->cap = cap;
  return 0;
}

int kv_reader_space(kv_reader *rd, void **p, size_t *len) {
  size_t want;
  kv_hdr h;
  if (rd->err) return rd->err;
  compact(rd);
  int rc = peek(rd, &want, &h);
  if (rc) return rc;
  if (rd->w >= want) {
    /* A whole frame waits: read more only into the room there is. */
    if (rd->cap == rd->w) return -ENOBUFS;
  } else {
    size_t target = want > rd->w + KV_READER_CHUNK ? want : rd->w + KV_READER_CHUNK;
    if (target < KV_READER_INIT) target = KV_READER_INIT;
    if (rd->cap < target || (rd->cap > KV_READER_SHRINK && target < rd->cap / 4)) {
      rc = resize(rd, target);
      if (rc && rd->cap < target) return rc; /* a failed shrink is harmless */
    }
  }
  *p = rd->buf + rd->w;
  *len = rd->cap - rd->w;
  return 0;
}

void kv_reader_commit(kv_reader *rd, size_t n) {
  if (n > rd->cap - rd->w) n = rd->cap - rd->w;
  rd->w += n;
}

int kv_reader_feed(kv_reader *rd, const void *p, size_t n) {
  size_t want;
  kv_hdr h;
  if (rd->err) return rd->err;
  compact(rd);
  size_t limit = 2 * ((size_t)KV_HDR_SIZE + rd->max_payload);
  if (n > limit || rd->w > limit - n) return -ENOBUFS;
  if (rd->cap < rd->w + n) {
    size_t cap = rd->cap * 2;
    if (cap < rd->w + n) cap = rd->w + n;
    if (cap < KV_READER_INIT) cap = KV_READER_INIT;
    if (cap > limit) cap = limit;
    int rc = resize(rd, cap);
    if (rc) return rc;
  }
  if (n) memcpy(rd->buf + rd->w, p, n);
  rd->w += n;
  return peek(rd, &want, &h); /* reject a bad header at once */
}

ssize_t kv_reader_fill(kv_reader *rd, int sock, int dontwait) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * KV_READER_CMSG_FDS)];
    struct cmsghdr align;
  } cm;
  void *p;
  size_t len;
  int rc = kv_reader_space(rd, &p, &len);
  if (rc) return rc;

  struct iovec iov = {.iov_base = p, .iov_len = len};
  struct msghdr mh = {
      .msg_iov = &iov,
      .msg_iovlen = 1,
      .msg_control = cm.buf,
      .msg_controllen = sizeof cm.buf,
  };
  ssize_t n;
  do {
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | (dontwait ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;

  int got[KV_READER_CMSG_FDS];
  unsigned ngot = 0, extra = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t j = 0; j < k; j++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + j * sizeof(int), sizeof fd);
      if (ngot < KV_READER_CMSG_FDS) got[ngot++] = fd;
      else close(fd), extra++;
    }
  }
  uint64_t lo = rd->pos + rd->w;
  rd->w += (size_t)n;
  if ((mh.msg_flags & MSG_CTRUNC) || extra || ngot > 2 ||
      (ngot >= 1 && (n == 0 || rd->nfds + ngot > KV_READER_FDS))) {
    for (unsigned j = 0; j < ngot; j++) close(got[j]);
    return fail(rd, KV_EBADFD);
  }
  for (unsigned j = 0; j < ngot; j++) {
    rd->fds[rd->nfds].fd = got[j];
    rd->fds[rd->nfds].lo = lo;
    rd->fds[rd->nfds].hi = lo + (uint64_t)n;
    rd->nfds++;
  }
  return n;
}

static void pop_fd(kv_reader *rd) {
  memmove(&rd->fds[0], &rd->fds[1], sizeof rd->fds[0] * (rd->nfds - 1));
  rd->nfds--;
}

int kv_reader_next(kv_reader *rd, kv_frame *f) {
  size_t want;
  kv_hdr h;
  if (rd->err) return rd->err;
  uint64_t start = rd->pos + rd->r;
  if (rd->nfds && rd->fds[0].hi <= start) {
    /* It came with bytes before the next frame and no frame took it. */
    close(rd->fds[0].fd);
    pop_fd(rd);
    return fail(rd, KV_EBADFD);
  }
  int rc = peek(rd, &want, &h);
  if (rc) return rc;
  if (rd->w - rd->r < want) return 0;

  int fd = -1, fd2 = -1;
  if (h.flags & KV_F_FD) {
    if (!rd->nfds || rd->fds[0].lo > start) return fail(rd, KV_EBADFD);
    /* KV_F_FD2: exactly two fds came together; else exactly one. */
    int two = rd->nfds >= 2 && rd->fds[1].lo == rd->fds[0].lo;
    if (two != ((h.flags & KV_F_FD2) != 0)) return fail_fds(rd);
    fd = rd->fds[0].fd;
    pop_fd(rd);
    if (h.flags & KV_F_FD2) {
      fd2 = rd->fds[0].fd;
      pop_fd(rd);
    }
  }
  f->hdr = h;
  f->p = rd->buf + rd->r;
  f->len = want;
  f->fd = fd;
  f->fd2 = fd2;
  rd->r += want;
  return 1;
}

int kv_reader_recv(kv_reader *rd, int sock, kv_frame *f, int timeout_ms) {
  int64_t deadline = timeout_ms < 0 ? -1 : kv_now_ms() + timeout_ms;
  for (;;) {
    int rc = kv_reader_next(rd, f);
    if (rc) return rc;
    ssize_t n = kv_reader_fill(rd, sock, 1);
    if (n > 0) continue;
    if (n == 0) { /* end of stream */
      if (kv_reader_pending(rd)) return fail(rd, KV_EBADFRAME);
      if (rd->nfds) return fail(rd, KV_EBADFD);
      return 0;
    }
    if (n != -EAGAIN) return (int)n;
    rc = kv_sock_wait(sock, POLLIN, deadline);
    if (rc) return rc;
  }
}
