/*
 * reader.h - rebuilds whole frames from a stream socket, with the fds that
 * travel with them; blocking or event-loop driven.
 *
 * The reader buffers bytes and yields one frame at a time, using the
 * header's length. A header is checked as soon as its 32 bytes are in
 * (wrong magic, wrong version, a length over the opcode's limit, over the
 * reader's own max_payload or over the owner's check), before any of its
 * payload is buffered, so a peer cannot make the reader allocate more than
 * one legitimate frame.
 * Such an error is sticky: the stream cannot be resynchronised, and every
 * later call returns it; the owner closes the connection.
 *
 * File descriptors (SCM_RIGHTS) are received with MSG_CMSG_CLOEXEC. The
 * sender attaches an fd to the sendmsg() that carries its frame's first
 * byte (ipc/sock.h), and Linux never merges bytes that follow an fd into
 * the same recvmsg(), so an fd belongs to a frame that starts within the
 * bytes of the recvmsg() that brought it. The reader hands it out with
 * that frame when its header has KV_F_FD, and a second fd of the same
 * recvmsg() when it also has KV_F_FD2. Anything else is KV_EBADFD and the
 * fds are closed: a frame with KV_F_FD (KV_F_FD2) but no (second) fd, an fd
 * no frame claims, more than two fds in one recvmsg(), truncated control
 * data (MSG_CTRUNC).
 *
 * Use from an event loop: on readable, kv_reader_fill() (or, with a loop
 * that reads for you, kv_reader_space() + kv_reader_commit()), then
 * kv_reader_next() until it returns 0. Blocking use: kv_reader_recv().
 * One owner at a time; not thread-safe.
 */
#ifndef KV_IPC_READER_H
#define KV_IPC_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/wire.h"

#define KV_READER_FDS 4 /* fds waiting for their frame */

typedef struct kv_frame {
  kv_hdr hdr;       /* parsed and checked as by kv_hdr_parse() */
  const uint8_t *p; /* the whole frame, header included; for kv_msg_decode() */
  size_t len;       /* KV_HDR_SIZE + hdr.len */
  int fd;           /* the fd that came with it (now the caller's), or -1 */
  int fd2;          /* the second fd (KV_F_FD2: the G1 pool), or -1 */
} kv_frame;

/* The owner's own limits on a frame, judged from its header alone (see
 * kv_reader_set_check()): 0 accepts the frame, an error refuses it. */
typedef int (*kv_reader_check_fn)(void *arg, const kv_hdr *h);

typedef struct kv_reader {
  uint8_t *buf;
  size_t cap;
  size_t r, w;              /* unread bytes are buf[r, w) */
  uint64_t pos;             /* stream offset of buf[0] */
  uint32_t max_payload;     /* this reader's payload limit */
  kv_reader_check_fn check; /* the owner's header check, or NULL */
  void *check_arg;
  int err; /* sticky error, 0 if none */
  unsigned nfds;
  struct {
    int fd;
    uint64_t lo, hi; /* stream bytes of the recvmsg() that brought it */
  } fds[KV_READER_FDS];
} kv_reader;

/* Sets up an empty reader (allocates on first use). max_payload caps every
 * frame below the protocol's own limits; 0 means KV_PAYLOAD_MAX_DATA. */
void kv_reader_init(kv_reader *rd, uint32_t max_payload);

/*
 * Sets the owner's check of each frame's header (fn NULL: none). fn runs
 * as soon as a header is whole and has passed kv_hdr_parse() and
 * max_payload, before any room is made for its payload; an error it
 * returns becomes the sticky error, so a frame over a limit that depends
 * on the owner's state (a session, its block size) costs no more memory
 * than the bytes that came with its header. fn may run more than once for
 * one frame and must answer the same each time; the frames before it have
 * all been returned by kv_reader_next() when it runs.
 */
void kv_reader_set_check(kv_reader *rd, kv_reader_check_fn fn, void *arg);

/* Frees the buffer and closes every fd not handed out. Safe twice. */
void kv_reader_free(kv_reader *rd);

/* Bytes buffered and not yet returned as frames. */
static inline size_t kv_reader_pending(const kv_reader *rd) { return rd->w - rd->r; }

/*
 * One recvmsg() from sock (MSG_DONTWAIT when dontwait, else the socket's
 * own mode). Call it when kv_reader_next() returned 0. Returns the bytes
 * read (> 0), 0 at end of stream, -EAGAIN, -errno, or the sticky error
 * (KV_EBADFD for fd trouble, or what kv_reader_next() found). Invalidates
 * the last frame returned.
 */
ssize_t kv_reader_fill(kv_reader *rd, int sock, int dontwait);

/*
 * For loops that read themselves (libuv's alloc_cb/read_cb): a buffer to
 * read into. *p and *len are at least 1 byte, sized for the frame being
 * received. 0, the sticky error, -ENOMEM, or -ENOBUFS when whole frames
 * wait and there is no room (drain with kv_reader_next() first).
 * Invalidates the last frame returned.
 */
int kv_reader_space(kv_reader *rd, void **p, size_t *len);

/* Accounts n bytes the caller wrote at kv_reader_space()'s *p (n <= *len).
 * Bytes fed this way never carry fds. */
void kv_reader_commit(kv_reader *rd, size_t n);

/* Copies n bytes in (tests, replay). 0, the sticky error, -ENOMEM, or
 * -ENOBUFS when more than two maximal frames would be buffered. */
int kv_reader_feed(kv_reader *rd, const void *p, size_t n);

/*
 * The next whole frame. Returns 1 and fills *f (f->p valid until the next
 * call on this reader; f->fd is the caller's to close), 0 when more bytes
 * are needed, or the sticky error: KV_EBADFRAME (bad magic), KV_EBADVERSION,
 * -EMSGSIZE (length over a limit), KV_EBADFD. Only the header is checked:
 * kv_msg_decode(f->p, f->len, ...) checks the rest.
 */
int kv_reader_next(kv_reader *rd, kv_frame *f);

/*
 * Blocking: the next frame from sock, waiting at most timeout_ms in all
 * (-1: no limit), on a blocking or non-blocking socket. Returns 1 (a frame,
 * as kv_reader_next()), 0 (the peer closed the stream between frames),
 * KV_EBADFRAME (it closed in the middle of one), -ETIMEDOUT, -errno, or the
 * sticky error.
 */
int kv_reader_recv(kv_reader *rd, int sock, kv_frame *f, int timeout_ms);

#endif
