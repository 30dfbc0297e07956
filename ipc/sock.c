/*
 * sock.c - Unix-domain socket helpers (sock.h): the listening socket with
 * its lock and stale-file handling, connect/accept, peer credentials, and
 * sending a frame with an optional fd.
 */
#include "ipc/sock.h"

#include "base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define KV_SEND_IOV_MAX 16

static int mkaddr(struct sockaddr_un *a, const char *path) {
  size_t len = strlen(path);
  if (len == 0) return -EINVAL;
  if (len >= sizeof a->sun_path) return -ENAMETOOLONG;
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  memcpy(a->sun_path, path, len + 1);
  return 0;
}

int kv_sock_wait(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    int timeout = -1;
    if (deadline_ms >= 0) {
      int64_t left = deadline_ms - kv_now_ms();
      if (left <= 0) return -ETIMEDOUT;
      timeout = left > 1000000 ? 1000000 : (int)left;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, timeout);
    if (n > 0) return 0;
    if (n < 0 && errno != EINTR) return -errno;
  }
}

/* Creates dir with mode (exactly: the umask does not narrow it) when it is
 * missing; an existing one must be a directory. */
static int ensure_dir(const char *dir, mode_t mode) {
  if (mkdir(dir, mode) == 0) return chmod(dir, mode) ? -errno : 0;
  if (errno != EEXIST) return -errno;
  struct stat st;
  if (stat(dir, &st)) return -errno;
  return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* Removes the socket file at path if no one accepts on it any more.
 * 0 (absent or removed), -EADDRINUSE (live), -EEXIST (not a socket). */
static int clear_stale(const char *path) {
  struct stat st;
  if (lstat(path, &st)) return errno == ENOENT ? 0 : -errno;
  if (!S_ISSOCK(st.st_mode)) return -EEXIST;
  struct sockaddr_un a;
  int rc = mkaddr(&a, path);
  if (rc) return rc;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return -errno;
  rc = connect(s, (struct sockaddr *)&a, sizeof a);
  int err = errno;
  close(s);
  if (rc == 0 || err == EAGAIN) return -EADDRINUSE; /* accepted, or backlog full */
  if (err == ENOENT) return 0;
  if (err != ECONNREFUSED) return -err;
  if (unlink(path) && errno != ENOENT) return -errno;
  return 0;
}

int kv_listen(kv_listener *l, const char *dir, const char *name, const kv_listen_opts *o) {
  kv_listen_opts d = {0};
  char lockpath[KV_SOCK_PATH_MAX + 8];
  struct sockaddr_un a;
  int fd = -1, lfd = -1, bound = 0, rc;

  if (o) d = *o;
  l->fd = l->lock_fd = -1;
  l->path[0] = '\0';
  if (!dir || !*dir || !name || !*name || strchr(name, '/')) return -EINVAL;
  mode_t smode = d.sock_mode ? d.sock_mode : 0660;
  mode_t dmode = d.dir_mode ? d.dir_mode : 0750;
  int backlog = d.backlog > 0 ? d.backlog : SOMAXCONN;

  int n = snprintf(l->path, sizeof l->path, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= sizeof l->path) {
    rc = -ENAMETOOLONG;
    goto err;
  }
  snprintf(lockpath, sizeof lockpath, "%s.lock", l->path);
  rc = mkaddr(&a, l->path);
  if (rc) goto err;
  rc = ensure_dir(dir, dmode);
  if (rc) goto err;

  lfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lfd < 0) {
    rc = -errno;
    goto err;
  }
  if (flock(lfd, LOCK_EX | LOCK_NB)) {
    rc = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;
    goto err;
  }
  rc = clear_stale(l->path);
  if (rc) goto err;

  fd = socket(AF_UNIX,
              SOCK_STREAM | SOCK_CLOEXEC | ((d.flags & KV_SOCK_NONBLOCK) ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) {
    rc = -errno;
    goto err;
  }
  if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
    rc = -errno;
    goto err;
  }
  bound = 1;
  /* Before listen(): until then a connect() is refused, whatever the mode. */
  if (chmod(l->path, smode) || listen(fd, backlog)) {
    rc = -errno;
    goto err;
  }
  l->fd = fd;
  l->lock_fd = lfd;
  return 0;

err:
  if (bound) unlink(l->path);
  if (fd >= 0) close(fd);
  if (lfd >= 0) close(lfd);
  l->path[0] = '\0';
  return rc;
}

void kv_listener_close(kv_listener *l) {
  if (l->fd >= 0) {
    if (l->path[0]) unlink(l->path); /* still ours: we hold the lock */
    close(l->fd);
    l->fd = -1;
  }
  if (l->lock_fd >= 0) {
    close(l->lock_fd); /* releases the flock */
    l->lock_fd = -1;
  }
  l->path[0] = '\0';
}

int kv_sock_accept(int lfd, int flags) {
  int f = SOCK_CLOEXEC | ((flags & KV_SOCK_NONBLOCK) ? SOCK_NONBLOCK : 0);
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, f);
    if (fd >= 0) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

int kv_sock_set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  int nfl = on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK;
  if (nfl != fl && fcntl(fd, F_SETFL, nfl) < 0) return -errno;
  return 0;
}

int kv_sock_connect(const char *path, int flags) {
  struct sockaddr_un a;
  int rc = mkaddr(&a, path);
  if (rc) return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  while (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    if (errno == EINTR) continue;
    if (errno == EISCONN) break; /* an interrupted connect completed */
    rc = -errno;
    goto err;
  }
  if (flags & KV_SOCK_NONBLOCK) {
    rc = kv_sock_set_nonblock(fd, 1);
    if (rc) goto err;
  }
  return fd;
err:
  close(fd);
  return rc;
}

int kv_sock_pair(int sv[2]) {
  return socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) ? -errno : 0;
}

int kv_sock_peercred(int sock, kv_peercred *out) {
  struct ucred uc;
  socklen_t len = sizeof uc;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len)) return -errno;
  if (len != sizeof uc) return -EPROTO;
  out->pid = uc.pid;
  out->uid = uc.uid;
  out->gid = uc.gid;
  return 0;
}

ssize_t kv_sock_sendmsg_fds(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                            unsigned nfds, int dontwait) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * KV_SOCK_FDS_MAX)];
    struct cmsghdr align;
  } cm;
  struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
  if (nfds > KV_SOCK_FDS_MAX) return -EINVAL;
  for (unsigned i = 0; i < nfds; i++)
    if (fds[i] < 0) return -EINVAL;
  if (nfds) {
    memset(&cm, 0, sizeof cm);
    mh.msg_control = cm.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  int fl = MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0);
  for (;;) {
    ssize_t n = sendmsg(sock, &mh, fl);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

ssize_t kv_sock_sendmsg(int sock, const struct iovec *iov, int iovcnt, int pass_fd, int dontwait) {
  return kv_sock_sendmsg_fds(sock, iov, iovcnt, &pass_fd, pass_fd >= 0 ? 1 : 0, dontwait);
}

int kv_sock_send_frame(int sock, const struct iovec *iov, int iovcnt, int pass_fd, int timeout_ms) {
  return kv_sock_send_frame_fds(sock, iov, iovcnt, &pass_fd, pass_fd >= 0 ? 1 : 0, timeout_ms);
}

int kv_sock_send_frame_fds(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                           unsigned nfds, int timeout_ms) {
  struct iovec v[KV_SEND_IOV_MAX];
  if (iovcnt < 1 || iovcnt > KV_SEND_IOV_MAX) return -EINVAL;
  memcpy(v, iov, sizeof *v * (size_t)iovcnt);
  int64_t deadline = timeout_ms < 0 ? -1 : kv_now_ms() + timeout_ms;
  int i = 0;
  if (nfds > KV_SOCK_FDS_MAX) return -EINVAL;
  while (i < iovcnt && v[i].iov_len == 0) i++;
  if (i == iovcnt) return -EINVAL; /* nothing to carry an fd, nothing to send */
  while (i < iovcnt) {
    ssize_t n = kv_sock_sendmsg_fds(sock, v + i, iovcnt - i, fds, nfds, 1);
    if (n == -EAGAIN) {
      int rc = kv_sock_wait(sock, POLLOUT, deadline);
      if (rc) return rc;
      continue;
    }
    if (n < 0) return (int)n;
    if (n == 0) return -EIO; /* a stream socket that takes nothing */
    nfds = 0;                /* they went with the first byte */
    size_t left = (size_t)n;
    while (i < iovcnt && left >= v[i].iov_len) left -= v[i++].iov_len;
    if (i < iovcnt) {
      v[i].iov_base = (char *)v[i].iov_base + left;
      v[i].iov_len -= left;
    }
    while (i < iovcnt && v[i].iov_len == 0) i++;
  }
  return 0;
}
