/*
 * sock.h - Unix-domain socket helpers: the daemon's listening socket,
 * workers' connections, fd passing (SCM_RIGHTS) and peer credentials.
 *
 * Sockets are SOCK_STREAM (see proto/PROTOCOL.md, "Transport"): a frame may
 * be far larger than a SOCK_SEQPACKET message can be (an inline PUT of up
 * to 64 MiB), so framing is by the header's length, and ipc/reader.h
 * rebuilds frames from the byte stream. An fd that travels with a frame is
 * attached to the sendmsg() that carries the frame's first byte; the reader
 * relies on that to pair fds with frames.
 *
 * Every fd these functions create is close-on-exec. Sends use MSG_NOSIGNAL
 * (a dead peer is -EPIPE, never SIGPIPE). All return 0 (or an fd / a count)
 * on success and -errno on failure.
 */
#ifndef KV_IPC_SOCK_H
#define KV_IPC_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/clock.h"

#define KV_SOCK_PATH_MAX 108 /* sizeof(sockaddr_un.sun_path), NUL included */

#define KV_SOCK_NONBLOCK 0x1 /* flag: the new socket is O_NONBLOCK */

typedef struct kv_listen_opts {
  mode_t sock_mode; /* socket file mode; 0 means 0660 */
  mode_t dir_mode;  /* mode of the directory if it is created; 0 means 0750 */
  int backlog;      /* listen() backlog; 0 means SOMAXCONN */
  int flags;        /* KV_SOCK_NONBLOCK */
} kv_listen_opts;

typedef struct kv_listener {
  int fd;                      /* the listening socket, or -1 */
  int lock_fd;                 /* holds an flock on "<path>.lock", or -1 */
  char path[KV_SOCK_PATH_MAX]; /* the socket file */
} kv_listener;

/*
 * Creates the socket dir/name and listens on it.
 *  - dir is created with dir_mode if missing (its parent must exist); an
 *    existing dir is used as it is (it must be a directory: -ENOTDIR).
 *  - "<name>.lock" in dir is created and flock()ed for the listener's
 *    lifetime; a lock held by another process (a live daemon) is
 *    -EADDRINUSE.
 *  - An existing socket file is probed with connect(): a socket somebody
 *    accepts on is -EADDRINUSE; a refused one (its daemon died) is removed
 *    and replaced. An existing file that is not a socket is -EEXIST (never
 *    removed).
 *  - The socket file gets sock_mode before listen(), so no one can connect
 *    while it has the umask's mode.
 * name must not contain '/'; the path must fit sun_path (-ENAMETOOLONG).
 * o may be NULL (all defaults). On success l is filled and 0 returned; on
 * error nothing is left behind (no fds, no new socket file) and l->fd and
 * l->lock_fd are -1.
 */
int kv_listen(kv_listener *l, const char *dir, const char *name, const kv_listen_opts *o);

/* Closes the listening socket, removes its file and releases the lock
 * (the lock file stays: removing it would race with a starting daemon).
 * Safe on a closed or failed listener, and twice. */
void kv_listener_close(kv_listener *l);

/* Accepts one connection (close-on-exec; flags: KV_SOCK_NONBLOCK).
 * Returns the fd, -EAGAIN on a non-blocking listener with none pending,
 * or -errno. EINTR and ECONNABORTED are retried. */
int kv_sock_accept(int lfd, int flags);

/* Connects to the socket at path (flags: KV_SOCK_NONBLOCK, applied after
 * the connection is made). Returns the fd or -errno (-ENOENT: no socket
 * file, -ECONNREFUSED: no daemon behind it, -EACCES: mode). */
int kv_sock_connect(const char *path, int flags);

/* A connected pair of close-on-exec stream sockets (tests, in-process
 * peers). 0 or -errno. */
int kv_sock_pair(int sv[2]);

/* Sets or clears O_NONBLOCK. 0 or -errno. */
int kv_sock_set_nonblock(int fd, int on);

/* Who is on the other end: the pid, uid and gid the peer had when it
 * connected (SO_PEERCRED). */
typedef struct kv_peercred {
  pid_t pid;
  uid_t uid;
  gid_t gid;
} kv_peercred;

/* Reads the peer's credentials. 0 or -errno. */
int kv_sock_peercred(int sock, kv_peercred *out);

/* Waits with poll() until fd reports one of `events` (or an error or
 * hang-up, which the next call on fd will report), or until deadline_ms (a
 * kv_now_ms() value; -1: no deadline). EINTR is retried. Returns 0,
 * -ETIMEDOUT or -errno. */
int kv_sock_wait(int fd, short events, int64_t deadline_ms);

/*
 * One sendmsg() of the iovec (MSG_NOSIGNAL, plus MSG_DONTWAIT when
 * dontwait), with pass_fd attached as SCM_RIGHTS when pass_fd >= 0.
 * EINTR is retried. Returns the bytes sent (possibly fewer than asked:
 * then the fd, if any, went with them), -EAGAIN (nothing sent, fd not
 * sent), -EPIPE, or -errno. The caller passes pass_fd only with the first
 * byte of a frame.
 */
ssize_t kv_sock_sendmsg(int sock, const struct iovec *iov, int iovcnt, int pass_fd, int dontwait);

/*
 * Sends a whole frame, given as an iovec (header + payload, or a head and
 * a bulk tail from kv_msg_encode_head()), with pass_fd attached to its
 * first byte when >= 0. Works on blocking and non-blocking sockets: it
 * never blocks in sendmsg() but waits with poll() for at most timeout_ms
 * in all (-1: no limit). Returns 0, -ETIMEDOUT (part of the frame may have
 * gone: the stream is then unusable), -EPIPE, -EINVAL (iovcnt out of
 * 1..16), or -errno. pass_fd stays the caller's either way.
 */
int kv_sock_send_frame(int sock, const struct iovec *iov, int iovcnt, int pass_fd, int timeout_ms);

/* As kv_sock_sendmsg / kv_sock_send_frame, with nfds (0..KV_SOCK_FDS_MAX)
 * fds in one SCM_RIGHTS message, in order (a HELLO reply: the G2 arena,
 * then the G1 pool). Negative entries are not allowed (-EINVAL). */
#define KV_SOCK_FDS_MAX 2
ssize_t kv_sock_sendmsg_fds(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                            unsigned nfds, int dontwait);
int kv_sock_send_frame_fds(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                           unsigned nfds, int timeout_ms);

#endif
